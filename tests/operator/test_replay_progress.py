"""replay's progress line: which window of how many it is on and, once one is done, the time
left at the pace so far."""

from __future__ import annotations

import io
import re
import time

from streamgauge.operator.progress import WindowProgress


def test_the_line_names_the_window_and_the_time_left() -> None:
    started = time.monotonic()
    progress = WindowProgress("replay", io.StringIO())
    assert re.fullmatch(r"replay: \d+ms \| starting", progress.describe())
    progress.window(0, 3, "per_10s")
    assert re.fullmatch(r"replay: \d+ms \| window 1/3 per_10s", progress.describe())
    time.sleep(0.3)
    first_took = time.monotonic() - started  # two windows left at that pace
    progress.window(1, 3, "per_1m")
    line = progress.describe()
    left = re.search(r"window 2/3 per_1m, about (\d+)ms left", line)
    assert left is not None, line
    assert 2 * first_took - 0.2 <= int(left.group(1)) / 1000 <= 2 * first_took
