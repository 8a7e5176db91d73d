"""A catch-up after a restart, as the operator sees it: the real daemon started on a data dir
whose log holds minutes of segments its window query has not read, read through its terminal
(a pty) and its ``status`` command while the job works through them, and the store afterwards.

The backlog is written by the real receiver (``Receiver`` on a UDP socket, writing with the
``SegmentWriter`` the ``ingest`` children use) on a manual clock that ran before "now": stream
``udp-0`` of a daemon that took traffic and stopped cleanly (its last segment ``closed``)
before its window job read any of it. The restarted daemon's own receiver ``udp-0`` resumes
that stream, as after any restart, with heartbeats on the wall clock; nothing else writes it
(the backlog's receiver is closed before the daemon starts).
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamgauge.clock import ManualClock, SystemClock
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import SegmentWriter, list_segments
from streamgauge.ingest.receiver import Receiver
from streamgauge.ingest.transports import bind_udp
from streamgauge.operator.catch_up import CATCHING_UP_S
from streamgauge.windows.source import CATCH_UP_SPAN_MS
from tests.e2e.harness import scratch_dir
from tests.operator.pty_daemon import daemon_on

CONFIG = """
name: catchup
pane: 1s
windows:
  - {name: per_10s, kind: tumbling, size: 10s, watermark_delay: 1s, allowed_lateness: 1s,
     metrics: ["*"], group_by: [shard]}
"""
WINDOW_MS = 10_000
PANE_MS = 1_000
ROLL_MS = 250  # the receivers' defaults: a roll every 250 ms, a segment when it has rows,
HEARTBEAT_MS = 1_000  # and a heartbeat-only one after a second without
METRIC = "catchup.requests"
SHARDS = ("a", "b", "c")
#: Each minute of the backlog: a datagram a second for its first 40 s (three counter series;
#: a segment with their partials after each), then 20 s idle (a heartbeat-only segment a
#: second). Either way a segment a second: every catch-up batch reads about as many.
BUSY_S, MINUTE_S = 40, 60

# How long the catch-up lasts. A batch behind the log takes CATCH_UP_SPAN_MS (30 s) of
# heartbeats, so the backlog is BATCHES batches whatever its rows. At the default trigger
# (0.1 s) the job runs them as fast as the machine does (about 0.15 s a batch measured on the
# 2-core machine): a faster machine could be done before the line has shown. With
# ``--trigger 0.5 seconds`` a batch starts at most every TRIGGER_S, so 50 batches last 25 s
# or more on any machine (24 s measured: 50 commits about 0.5 s apart). The line shows while
# the time left at the measured rate is CATCHING_UP_S (10 s) or more: from the second commit
# until about 10 s before the end, some 13 s of redraws (one a second) and ``status``
# readings. A slower machine only makes it longer; the test took 41 s here, in a 90 s budget.
TRIGGER_S = 0.5
BATCHES = 50
BACKLOG_MINUTES = BATCHES * CATCH_UP_SPAN_MS // (MINUTE_S * 1000)
assert BATCHES * TRIGGER_S >= CATCHING_UP_S + 10, "the line would show for less than ~10 s"

CATCH_UP_LINE = re.compile(
    r"catch-up per_10s: (?P<done>[\d,]+)/(?P<of>[\d,]+) segments, (?P<rate>[\d,]+)/s, "
    r"(?P<left>\S+) left"
)
#: A query that keeps up has this many segments to read, or fewer: those the receiver wrote
#: (one a second, idle) since its last batch or the last it passed over.
KEEPING_UP_SEGMENTS = 5
TIMEOUT_S = 120  # for each wait, on a machine much slower than the one measured


@dataclass
class Backlog:
    """What the receiver was sent: per (window start, shard), the lines and their sum; and
    the segments it wrote."""

    segments: int = 0
    counts: Counter[tuple[int, str]] = field(default_factory=Counter)
    sums: Counter[tuple[int, str]] = field(default_factory=Counter)


def write_backlog(spool: Path, end_ms: int, minutes: int) -> Backlog:
    """``minutes`` of traffic and idle stretches, ending at ``end_ms``, written by the real
    receiver on a manual clock: datagrams on its socket, a roll every ``ROLL_MS``, then its
    clean close."""
    start_ms = end_ms - minutes * MINUTE_S * 1000
    start_ms -= start_ms % WINDOW_MS
    clock = ManualClock(start_ms)
    backlog = Backlog()
    sock = bind_udp("127.0.0.1", 0)
    port = sock.getsockname()[1]
    receiver = Receiver(
        sock, SegmentWriter(spool, "udp-0", fsync=False), PaneCombiner(PANE_MS), clock,
        roll_ms=ROLL_MS, heartbeat_interval_ms=HEARTBEAT_MS, read_ahead_bytes=0,
        proc_net=spool.parent / "no-proc-net",  # the host's UDP drop counters stay out of it
    )  # fmt: skip
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for second in range(minutes * MINUTE_S):
            if second % MINUTE_S < BUSY_S:
                now = clock.now_ms()
                window = now - now % WINDOW_MS
                lines = []
                for index, shard in enumerate(SHARDS):
                    value = 1 + (second + index) % 5
                    lines.append(f"{METRIC}:{value}|c|#shard:{shard}")
                    backlog.counts[window, shard] += 1
                    backlog.sums[window, shard] += value
                target = receiver.stats.datagrams + 1
                sender.sendto("\n".join(lines).encode(), ("127.0.0.1", port))
                deadline = time.monotonic() + 10
                while receiver.stats.datagrams < target:
                    assert time.monotonic() < deadline, "a datagram lost on loopback"
                    receiver.receive_available()
            for _ in range(1000 // ROLL_MS):
                clock.advance(ROLL_MS)
                receiver.roll(receiver.now_ms())
        receiver.close()
    sock.close()
    backlog.segments = len(list_segments(spool, "udp-0"))
    return backlog


def streamgauge(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "streamgauge", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@dataclass
class Readings:
    """What ``status`` said, reading after reading, while the query caught up."""

    positions: list[dict[str, Any]] = field(default_factory=list)  # ``status --json``'s
    table_line: str | None = None  # the catch-up line under ``status``'s windows table


def follow_catch_up(data_dir: Path) -> Readings:
    """``status --json``'s ``catch_up`` entry until the query has read the log (a few
    segments left: those the receiver wrote since its last batch); while it says it is
    catching up, ``status`` as a table too, until that shows the line."""
    readings = Readings()
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        document = json.loads(streamgauge("status", "--json", "--data-dir", str(data_dir)))
        (position,) = document["catch_up"]
        readings.positions.append(position)
        if position["catching_up"] and readings.table_line is None:
            table = streamgauge("status", "--data-dir", str(data_dir))
            # its own line under the windows table (the daemon's status line, "now", has it too)
            windows = table.split("\nwindows\n", 1)[-1]
            shown = [line for line in windows.splitlines() if line.startswith("  catch-up ")]
            readings.table_line = shown[0] if shown else None
        if position["segments_done"] and position["segments_to_do"] <= KEEPING_UP_SEGMENTS:
            return readings
        time.sleep(0.3)
    raise AssertionError(f"the query did not catch up: {readings.positions[-3:]}")


def stored_windows(data_dir: Path) -> dict[tuple[int, str], tuple[int, float, bool, int]]:
    sql = (
        "select (extract(epoch from window_start) * 1000)::bigint as start, "
        "tags->>'shard' as shard, count, sum, is_final, late_events from window_results "
        f"where config_name = 'catchup' and window_name = 'per_10s' and metric = '{METRIC}'"
    )
    out = streamgauge("query", "--json", "--data-dir", str(data_dir), sql)
    rows = [json.loads(line) for line in out.splitlines()]
    return {(r["start"], r["shard"]): (r["count"], r["sum"], r["is_final"], r["late_events"])
            for r in rows}  # fmt: skip


def test_a_restart_behind_the_log_shows_its_catch_up_until_the_backlog_is_stored() -> None:
    """The daemon restarted on 25 minutes of log its window query has not read catches up in
    bounded batches, and says so while it does:

    - its terminal's status line ends with ``catch-up per_10s: N/M segments, R/s, T left``;
    - ``status --json`` has a ``catch_up`` entry with ``catching_up: true``, its segments to
      do going down and its segments done going up, reading after reading; ``status`` shows
      the same line under its windows table.

    Once it has read the log, ``status --json`` no longer says it is catching up, the line is
    gone from the terminal, and the store holds every 10 s window of the backlog, final, none
    late, with the counts and sums the receiver was sent.
    """
    root = scratch_dir("streamgauge-catch-up-")
    try:
        config = root / "catchup.yaml"
        config.write_text(CONFIG)
        data_dir = root / "data"
        backlog = write_backlog(data_dir / "spool", SystemClock().now_ms(), BACKLOG_MINUTES)
        assert backlog.segments >= BACKLOG_MINUTES * MINUTE_S  # a segment a second, at least
        with daemon_on(config, data_dir, "--trigger", f"{TRIGGER_S} seconds") as daemon:
            readings = follow_catch_up(data_dir)
            drawn_before_done = len(daemon.screen.status_lines())

            behind = [p for p in readings.positions if p["catching_up"]]
            assert len(behind) >= 2, readings.positions
            assert behind[-1]["segments_to_do"] < behind[0]["segments_to_do"], behind
            done = [p["segments_done"] for p in readings.positions]
            assert done == sorted(done) and done[-1] >= backlog.segments, done
            assert all(p["segments_per_s"] > 0 and p["left_s"] >= CATCHING_UP_S
                       for p in behind), behind  # fmt: skip
            assert not readings.positions[-1]["catching_up"], readings.positions[-1]
            assert readings.table_line is not None, "status showed no catch-up line"
            assert CATCH_UP_LINE.fullmatch(readings.table_line.strip()), readings.table_line

            lines = daemon.screen.status_lines()
            shown = [found for line in lines if (found := CATCH_UP_LINE.search(line))]
            assert shown, daemon.screen.text[-3000:]
            for found in shown:
                assert int(found["rate"].replace(",", "")) > 0
                assert int(found["done"].replace(",", "")) < int(found["of"].replace(",", ""))
            assert int(shown[0]["of"].replace(",", "")) >= backlog.segments

            # the line goes with the catch-up: redrawn (every second) without it
            deadline = time.monotonic() + TIMEOUT_S
            while len(daemon.screen.status_lines()) < drawn_before_done + 2:
                assert time.monotonic() < deadline, daemon.screen.text[-3000:]
                time.sleep(0.2)
            redrawn = daemon.screen.status_lines()[drawn_before_done:-1]  # complete ones
            assert redrawn and not any("catch-up" in line for line in redrawn), redrawn

            expected = {
                key: (count, float(backlog.sums[key]), True, 0)
                for key, count in backlog.counts.items()
            }
            deadline = time.monotonic() + TIMEOUT_S
            while (stored := stored_windows(data_dir)) != expected:
                if time.monotonic() > deadline:
                    missing = sorted(set(expected) - set(stored))[:5]
                    wrong = [(k, stored[k], v) for k, v in expected.items()
                             if k in stored and stored[k] != v][:5]  # fmt: skip
                    raise AssertionError(
                        f"{len(stored)}/{len(expected)} windows stored; "
                        f"missing {missing}, differing {wrong}"
                    )
                time.sleep(1)
    finally:
        shutil.rmtree(root, ignore_errors=True)
