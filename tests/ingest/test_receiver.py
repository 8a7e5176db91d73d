"""The receiver on a real UDP socket, fed by the reference `statsd` client, on a manual clock."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import statsd

from streamgauge.clock import ManualClock
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import SegmentWriter, list_segments, read_heartbeat, read_segment
from streamgauge.ingest.receiver import UdpReceiver, bind_udp


def _drain_until(receiver: UdpReceiver, datagrams: int, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while receiver.stats.datagrams < datagrams and time.monotonic() < deadline:
        receiver.receive_available()
        time.sleep(0.01)


def test_statsd_client_lines_become_partials_and_rejects_are_counted(tmp_path: Path) -> None:
    sock = bind_udp("127.0.0.1", 0)
    port = sock.getsockname()[1]
    clock = ManualClock(1_700_000_000_000)
    receiver = UdpReceiver(
        sock,
        SegmentWriter(tmp_path, "udp-0"),
        PaneCombiner(1000),
        clock,
        stats_path=tmp_path / "stats.json",
    )
    client = statsd.StatsClient("127.0.0.1", port)
    for _ in range(10):
        client.incr("api.requests")
    client.gauge("queue.depth", 7)
    client.timing("api.latency", 12)
    client.timing("api.latency", 30)
    raw = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    raw.sendto(b"broken line\nx:1|zz", ("127.0.0.1", port))
    _drain_until(receiver, 14)
    clock.advance(300)
    receiver.roll(clock.now_ms())

    (segment,) = list_segments(tmp_path, "udp-0")
    assert read_heartbeat(segment.path).heartbeat_ms == 1_700_000_000_300
    rows = {r["metric"]: r for b in read_segment(segment.path) for r in b.to_pylist()}
    assert rows["api.requests"]["sum"] == 10.0
    assert rows["api.requests"]["count"] == 10
    assert rows["queue.depth"]["last"] == 7.0
    assert (rows["api.latency"]["min"], rows["api.latency"]["max"]) == (12.0, 30.0)
    # what was not aggregated is counted, by reason, and fed back as self-metrics
    assert receiver.stats.rejected == {"malformed_line": 1, "unknown_type": 1}
    assert rows["streamgauge.ingest.datagrams"]["sum"] == 14.0
    assert rows["streamgauge.ingest.lines"]["sum"] == 15.0
    assert rows["streamgauge.ingest.samples"]["sum"] == 13.0
    assert receiver.stats.lines == receiver.stats.samples + sum(receiver.stats.rejected.values())
    assert (tmp_path / "stats.json").exists()
    sock.close()


def test_idle_receiver_writes_heartbeats_and_a_clock_going_back_is_ignored(
    tmp_path: Path,
) -> None:
    sock = bind_udp("127.0.0.1", 0)
    clock = ManualClock(10_000)
    receiver = UdpReceiver(
        sock, SegmentWriter(tmp_path, "r"), PaneCombiner(1000), clock, heartbeat_interval_ms=1000
    )
    receiver.roll(receiver.now_ms())
    clock.set(9_000)  # the wall clock stepped back
    clock_now = receiver.now_ms()
    assert clock_now == 10_000
    clock.set(11_000)
    receiver.roll(receiver.now_ms())
    receiver.roll(receiver.now_ms())  # not due yet: no new segment
    beats = [read_heartbeat(s.path).heartbeat_ms for s in list_segments(tmp_path, "r")]
    assert beats == [10_000, 11_000]
    sock.close()
