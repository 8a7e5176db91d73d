"""``streamgauge run`` with its output in a file (systemd, ``> daemon.log``): the banner, a
plain status line every ``--status-every``, no terminal control codes, nothing from Spark or
the JVM, and on SIGTERM what the stop flushed."""

from __future__ import annotations

import re
import time

from tests.e2e.harness import PacedSender, daemon_for
from tests.operator.pty_daemon import JVM_MARKERS, STATUS_LINE

CONFIG = """
name: plain
pane: 1s
windows:
  - {name: per_2s, kind: tumbling, size: 2s, watermark_delay: 1s, allowed_lateness: 1s,
     metrics: ["e2e.*"]}
"""


def _rate(status_line: str) -> str:
    """The lines/s a status line shows (``status_line`` is one)."""
    match = STATUS_LINE.match(status_line)
    assert match is not None, status_line
    return match["rate"]


def test_plain_status_lines_and_a_quiet_stop_in_a_log_file() -> None:
    with daemon_for(CONFIG, "plain", "--status-every", "1") as daemon:
        daemon.start()
        sender = PacedSender(daemon.port, lines_per_second=200)
        sender.start()
        deadline = time.monotonic() + 60
        try:
            while time.monotonic() < deadline:
                rates = [m["rate"] for m in STATUS_LINE.finditer(daemon.log_tail(200_000))]
                if any(rate not in ("…", "0") for rate in rates):
                    break
                time.sleep(0.5)
        finally:
            sender.stop()
        assert daemon.stop() == 0, daemon.log_tail()
        printed = daemon.log_path.read_text()

    status = re.findall(r"^\d\d:\d\d:\d\d  status: (in .*)$", printed, re.MULTILINE)
    assert len(status) >= 2, printed[-3000:]
    assert all(STATUS_LINE.match(line) for line in status), status
    assert any(_rate(line) not in ("…", "0") for line in status), status
    assert "\x1b" not in printed and "\r" not in printed  # a file gets no terminal codes
    leaked = [marker for marker in JVM_MARKERS if marker in printed]
    assert not leaked, f"{leaked} in the daemon's output:\n{printed[-3000:]}"
    assert re.search(r"stopped: the receivers took [\d,]+ lines", printed), printed[-2000:]
