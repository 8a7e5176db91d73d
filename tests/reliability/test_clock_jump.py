"""A receiver whose clock jumps backwards (NTP stepping the wall clock, a VM restored, a host
rebooted on a bad RTC) never writes a heartbeat older than one it already wrote, and keeps
aggregating every sample.

A heartbeat promises "no event earlier than t from this receiver"; the window job's watermark
is the minimum over the receivers' heartbeats and a partial older than its stream's previous
heartbeat is late. So, with the clock stepped back 30 s at t = T0 + 2 s::

    wall clock   T0 ─ T0+1 ─ T0+2 ┐ T0-28 ─ … ─ T0+2 ─ T0+3
                                  └ jump back 30 s
    receive clock  T0 ─ T0+1 ─ T0+2 ─ T0+2 ─ … ─ T0+2 ─ T0+3    (held until the wall clock
    heartbeats     T0   T0+1   T0+2   T0+2   …   T0+2   T0+3     catches up)
    samples during the hold: stamped T0+2 (pane T0+2), aggregated, not late

The same holds across a restart: a receiver started on a clock behind its stream's last
heartbeat continues from that heartbeat instead of promising less than its predecessor did.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from streamgauge.clock import ManualClock
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import SegmentWriter, list_segments, read_heartbeat, read_segment
from streamgauge.ingest.receiver import SELF_METRIC_PREFIX, Receiver

T0 = 1_700_000_000_000
JUMP_MS = 30_000


def _receiver(spool: Path, sock: socket.socket, clock: ManualClock) -> Receiver:
    return Receiver(
        sock, SegmentWriter(spool, "udp-0", fsync=False), PaneCombiner(1000), clock,
        roll_ms=250, heartbeat_interval_ms=1000, proc_net=spool / "no-proc",
    )


def _heartbeats(spool: Path) -> list[int]:
    return [read_heartbeat(s).heartbeat_ms for s in list_segments(spool, "udp-0")]


def _data_rows(spool: Path) -> list[dict[str, Any]]:
    return [
        row
        for segment in list_segments(spool, "udp-0")
        for batch in read_segment(segment)
        for row in batch.to_pylist()
        if not row["metric"].startswith(SELF_METRIC_PREFIX)
    ]


def _tick(receiver: Receiver, clock: ManualClock, ms: int, sent: list[int], *, data: bool
          ) -> None:
    """``ms`` of wall-clock time in 250 ms steps: a datagram (if ``data``) and a roll each."""
    for _ in range(ms // 250):
        clock.advance(250)
        if data:
            # a counter, a timer, a gauge delta and a client timestamp on the wall clock
            seconds = clock.now_ms() // 1000
            receiver._ingest_datagrams(
                [b"hits:1|c\nlat:5|ms\ndepth:+1|g\nts:1|c|T%d" % seconds], receiver.now_ms()
            )
            sent[0] += 1
        receiver.roll(receiver.now_ms())


def _check_stream(spool: Path, sent: int, *, gauge: bool = True) -> None:
    beats = _heartbeats(spool)
    assert beats == sorted(beats), "a heartbeat went backwards"
    rows = _data_rows(spool)
    for metric in ("hits", "lat", "depth", "ts"):
        assert sum(r["count"] for r in rows if r["metric"] == metric) == sent, metric
    assert sum(r["sum"] for r in rows if r["metric"] == "hits") == sent
    # gauge deltas applied in order: the last value is the number of +1s (a restarted
    # process starts its gauges afresh: not checked there)
    if not gauge:
        return
    (last,) = [r["last"] for r in rows if r["metric"] == "depth"
               and r["last_event_ms"] == max(x["last_event_ms"] for x in rows
                                             if x["metric"] == "depth")]
    assert last == sent
    _check_nothing_late(spool)


def _check_nothing_late(spool: Path) -> None:
    # no partial is older than the heartbeat of the segment before it: none is late
    prior = 0
    for segment in list_segments(spool, "udp-0"):
        for batch in read_segment(segment):
            for row in batch.to_pylist():
                if row["metric"] != "ts":  # |T may legitimately be in the past
                    assert row["pane_start_ms"] >= prior - prior % 1000, row
        prior = read_heartbeat(segment).heartbeat_ms


def test_a_clock_jumping_back_holds_the_heartbeat_and_aggregates_every_sample(
    tmp_path: Path,
) -> None:
    clock = ManualClock(T0)
    sent = [0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        receiver = _receiver(tmp_path, sock, clock)
        _tick(receiver, clock, 2000, sent, data=True)
        clock.set(clock.now_ms() - JUMP_MS)
        _tick(receiver, clock, 5000, sent, data=True)  # under load: data segments
        _tick(receiver, clock, 5000, sent, data=False)  # idle: heartbeat-only segments
        _tick(receiver, clock, JUMP_MS, sent, data=True)  # past the old high-water mark
        receiver.roll(receiver.now_ms(), closed=True)
        stats = receiver.stats
        assert stats.lines == stats.metric_lines == 4 * sent[0] == stats.accounted()
        assert stats.rejected == {}
    _check_stream(tmp_path, sent[0])
    beats = _heartbeats(tmp_path)
    assert beats[-1] == T0 + 2000 - JUMP_MS + 5000 + 5000 + JUMP_MS
    # while the wall clock was behind, the receive clock held at the high-water mark
    assert beats.count(T0 + 2000) > 1
    held = [r for r in _data_rows(tmp_path) if r["metric"] == "hits"
            and r["pane_start_ms"] == T0 + 2000]
    assert sum(r["count"] for r in held) > 20  # 10 s of held samples (+ the one before)
    # a |T on the wall clock, 30 s behind the receive clock, is within the skew: event time
    assert min(r["pane_start_ms"] for r in _data_rows(tmp_path) if r["metric"] == "ts") < T0


def test_a_restart_on_a_clock_behind_the_streams_last_heartbeat_does_not_go_back(
    tmp_path: Path,
) -> None:
    clock = ManualClock(T0)
    sent = [0]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        first = _receiver(tmp_path, sock, clock)
        _tick(first, clock, 3000, sent, data=True)  # then killed: no closing segment
        clock.set(clock.now_ms() - JUMP_MS)  # the host comes back with its clock behind
        second = _receiver(tmp_path, sock, clock)
        assert second.now_ms() == T0 + 3000
        _tick(second, clock, 3000, sent, data=True)
        _tick(second, clock, JUMP_MS + 1000, sent, data=False)
        second.roll(second.now_ms(), closed=True)
    _check_stream(tmp_path, sent[0], gauge=False)
    _check_nothing_late(tmp_path)
    assert _heartbeats(tmp_path)[-1] == T0 + 3000 - JUMP_MS + 3000 + JUMP_MS + 1000
