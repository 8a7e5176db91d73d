"""The line a clean stop prints: what the receivers flushed and what the store holds, the
open windows in ``window_pending`` among it (a reader must not take them for lost)."""

from __future__ import annotations

from typing import Any

import pytest

from streamgauge.operator.terminal import stop_summary

RECEIVERS = {"udp-0": {"lines": 2_133, "samples": 2_120, "rejected": {"parse": 13},
                       "segments": 59}}  # fmt: skip


def _window(name: str, emitted: int, pending: int | None) -> dict[str, Any]:
    return {"window_name": name, "windows_emitted": emitted, "windows_pending": pending}


@pytest.mark.parametrize(
    ("windows", "store"),
    [
        (
            [_window("per_10s", 8, 0), _window("per_1m", 2, 3)],
            "; the store holds windows: per_10s 8, per_1m 2; open, in window_pending: per_1m 3",
        ),
        ([_window("per_10s", 1_200, 0)], "; the store holds windows: per_10s 1,200"),
        ([_window("per_10s", 8, None)], "; the store holds windows: per_10s 8"),
        ("store unavailable: connection refused", ""),
        ([], ""),
    ],
)
def test_the_stop_line_names_what_the_store_holds(windows: Any, store: str) -> None:
    assert stop_summary(RECEIVERS, windows) == (
        "stopped: the receivers took 2,133 lines (2,120 samples, 13 rejected) and flushed "
        "them to the log in 59 segments" + store
    )
