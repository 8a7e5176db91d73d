"""Accounting around a ``kill -9`` of a receiver under load.

``tests/ingest/test_process.py`` proves the log survives the kill (no torn segment, the
sequence continues, nothing re-counted) and that a graceful stop loses nothing. This adds the
ledger, with bad lines in the load so that rejects take part:

- the killed process's log is self-consistent: the self-metrics it wrote say exactly what
  its data rows hold (lines = aggregated + rejected, per segment prefix — a crash cuts between
  segments, never inside one's accounting);
- what died with it is only what it had not yet written: sent = in the log + kernel drops
  (counted) + lost in the crash, lost ≥ 0 (reported: what the process held unwritten, its
  socket buffer, what was sent after the kill; a kill cannot be accounted more precisely);
- the restarted process under load, stopped gracefully: sent = aggregated + rejected +
  kernel drops × lines per datagram, exactly, in its stats and in the log's self-metrics;
- heartbeats never go back across the restart, and no segment is counted twice.
"""

from __future__ import annotations

import collections
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from streamgauge.ingest.log import list_segments, read_heartbeat, read_segment

CONFIG = """
name: accounting_test
pane: 1s
windows:
  - name: per_2s
    kind: tumbling
    size: 2s
    metrics: ["*"]
"""
GOOD_PER_DATAGRAM = 19
BAD_LINE = b"not a statsd line"
PREFIX = "streamgauge.ingest."


class Sender(threading.Thread):
    """``<name>:1|c`` × 19 and one bad line per datagram, fast, until halted."""

    def __init__(self, port: int, name: str) -> None:
        super().__init__(daemon=True)
        self.port, self.name, self.datagrams = port, name, 0
        self.halt = threading.Event()

    def run(self) -> None:
        datagram = b"\n".join([self.name.encode() + b":1|c"] * GOOD_PER_DATAGRAM + [BAD_LINE])
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            while not self.halt.is_set():
                sock.sendto(datagram, ("127.0.0.1", self.port))
                self.datagrams += 1
                if self.datagrams % 200 == 0:
                    time.sleep(0.002)


def _start(config: Path, data_dir: Path, port: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "streamgauge", "ingest", "--config", str(config),
         "--data-dir", str(data_dir), "--listen", f"udp://127.0.0.1:{port}"],
        stderr=subprocess.PIPE,
    )


def _wait(condition: Any, process: subprocess.Popen[bytes], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        if process.poll() is not None:
            assert process.stderr is not None
            pytest.fail(f"ingest exited {process.returncode}: {process.stderr.read().decode()}")
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _ledger(
    spool: Path, after: int = -1
) -> tuple[collections.Counter[str], float, float, float]:
    """(samples per data metric, self-metric lines, rejected, kernel drops) over the segments
    after sequence ``after``."""
    data: collections.Counter[str] = collections.Counter()
    lines = rejected = drops = 0.0
    for segment in list_segments(spool, "udp-0", after=after):
        for batch in read_segment(segment):
            for row in batch.to_pylist():
                if row["metric"] == PREFIX + "lines":
                    lines += row["sum"]
                elif row["metric"] == PREFIX + "rejected":
                    assert row["tags"] == '{"reason":"malformed_line"}'
                    rejected += row["sum"]
                elif row["metric"] == PREFIX + "kernel_drops":
                    drops += row["sum"]
                elif not row["metric"].startswith(PREFIX):
                    data[row["metric"]] += row["count"]
    return data, lines, rejected, drops


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_kill_9_under_load_every_line_is_in_the_log_counted_or_lost_with_the_process(
    tmp_path: Path,
) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    data_dir = tmp_path / "data"
    spool = data_dir / "spool"
    port = _free_port()

    first = _start(config, data_dir, port)
    _wait(lambda: list_segments(spool, "udp-0"), first, "no heartbeat segment")
    sender = Sender(port, "before")
    sender.start()
    _wait(lambda: _ledger(spool)[0]["before"] >= 50_000, first, "no load in the log")
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    sender.halt.set()
    sender.join()

    before = list_segments(spool, "udp-0")
    data, lines, rejected, dropped = _ledger(spool)
    # the log of the killed process accounts for itself: every line it says it received is
    # in it, aggregated or rejected, and the ratio is the datagrams' (19 good : 1 bad)
    assert lines == data["before"] + rejected
    assert data["before"] == GOOD_PER_DATAGRAM * rejected
    sent_before = sender.datagrams * (GOOD_PER_DATAGRAM + 1)
    lost_in_crash = sent_before - lines - dropped * (GOOD_PER_DATAGRAM + 1)
    assert 0 <= lost_in_crash < sent_before
    print(f"kill -9: sent {sent_before} lines, {lines:.0f} in the log, {dropped:.0f} datagrams "
          f"dropped by the kernel (counted), {lost_in_crash:.0f} lost with the process "
          "(received and not yet written, in its socket buffer, or sent after the kill)")

    second = _start(config, data_dir, port)
    stats_path = data_dir / "ingest" / "udp-0.json"
    stats_path.unlink(missing_ok=True)
    _wait(stats_path.exists, second, "the restarted receiver wrote no stats")
    sender = Sender(port, "after")
    sender.start()
    _wait(lambda: _ledger(spool, before[-1].sequence)[0]["after"] >= 50_000, second,
          "no load after the restart")
    sender.halt.set()
    sender.join()
    second.send_signal(signal.SIGTERM)
    assert second.wait(30) == 0

    after = list_segments(spool, "udp-0")
    assert [s.sequence for s in after] == list(range(len(after)))
    beats = [read_heartbeat(s).heartbeat_ms for s in after]
    assert beats == sorted(beats)
    assert _ledger(spool, -1)[0]["before"] == data["before"]  # nothing counted twice
    stats = json.loads(stats_path.read_text())
    drops = sum(stats["kernel_drops"].values())
    sent_after = sender.datagrams * (GOOD_PER_DATAGRAM + 1)
    rejects = sum(stats["rejected"].values())
    # exact: sent = aggregated + rejected + dropped by the kernel (whole datagrams)
    assert sent_after == stats["lines"] + drops * (GOOD_PER_DATAGRAM + 1)
    assert stats["lines"] == stats["metric_lines"] + rejects
    assert stats["rejected"] == {"malformed_line": sender.datagrams - drops}
    assert stats["refused_samples"] == {} and stats["adjusted"] == {}
    data_after, lines_after, rejected_after, dropped_after = _ledger(spool, before[-1].sequence)
    assert data_after["after"] == stats["metric_lines"]
    assert (lines_after, rejected_after, dropped_after) == (stats["lines"], rejects, drops)
    print(f"restart: sent {sent_after} lines = {stats['metric_lines']} aggregated + "
          f"{rejects} rejected + {drops} datagrams dropped by the kernel")
