"""The receiver on real sockets (UDP v4/v6, TCP, Unix datagram), fed by the reference `statsd`
and DogStatsD clients, mostly on a manual clock."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import statsd
from datadog.dogstatsd.base import DogStatsd

from streamgauge.clock import ManualClock, SystemClock
from streamgauge.ingest import read_ahead as read_ahead_module
from streamgauge.ingest import sources
from streamgauge.ingest import transports as transports_module
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.guard import CardinalityLimits
from streamgauge.ingest.log import (
    SegmentQueue,
    SegmentWriter,
    list_segments,
    read_heartbeat,
    read_segment,
)
from streamgauge.ingest.read_ahead import CompiledReadAhead, PythonReadAhead
from streamgauge.ingest.receiver import Receiver, UdpReceiver, bind_udp
from streamgauge.ingest.transports import Chunk, bind_tcp, bind_unixgram
from streamgauge.retention import PASSED_OVER_FILE, safe_sequences

T0 = 1_700_000_000_000


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
    assert read_heartbeat(segment).heartbeat_ms == 1_700_000_000_300
    rows = {r["metric"]: r for b in read_segment(segment) for r in b.to_pylist()}
    assert rows["api.requests"]["sum"] == 10.0
    assert rows["api.requests"]["count"] == 10
    assert rows["queue.depth"]["last"] == 7.0
    assert (rows["api.latency"]["min"], rows["api.latency"]["max"]) == (12.0, 30.0)
    # what was not aggregated is counted, by reason, and fed back as self-metrics
    assert receiver.stats.rejected == {"malformed_line": 1, "unknown_type": 1}
    assert rows["streamgauge.ingest.datagrams"]["sum"] == 14.0
    assert rows["streamgauge.ingest.lines"]["sum"] == 15.0
    assert rows["streamgauge.ingest.samples"]["sum"] == 13.0
    assert receiver.stats.lines == receiver.stats.accounted()
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
    beats = [read_heartbeat(s).heartbeat_ms for s in list_segments(tmp_path, "r")]
    assert beats == [10_000, 11_000]
    sock.close()


def _rows(spool: Path, receiver: str = "udp-0") -> list[dict[str, Any]]:
    return [
        row
        for segment in list_segments(spool, receiver)
        for batch in read_segment(segment)
        for row in batch.to_pylist()
    ]


def _totals(rows: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """Per (metric, tags): count, sum, min, max over all panes; last of the latest pane."""
    totals: dict[tuple[str, str], dict[str, float]] = {}
    for row in sorted(rows, key=lambda r: (r["pane_start_ms"], r["last_event_ms"])):
        entry = totals.setdefault(
            (row["metric"], row["tags"]),
            {"count": 0, "sum": 0.0, "min": float("inf"), "max": float("-inf")},
        )
        entry["count"] += row["count"]
        entry["sum"] += row["sum"]
        entry["min"] = min(entry["min"], row["min"])
        entry["max"] = max(entry["max"], row["max"])
        entry["last"] = row["last"]
    return totals


def _manual_receiver(
    tmp_path: Path, sock: socket.socket, **options: Any
) -> tuple[Receiver, ManualClock]:
    clock = ManualClock(T0)
    receiver = Receiver(
        sock, SegmentWriter(tmp_path, "udp-0"), PaneCombiner(1000), clock, **options
    )
    return receiver, clock


def _send_and_roll(receiver: Receiver, clock: ManualClock, port: int, lines: list[bytes]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for line in lines:
            sender.sendto(line, ("127.0.0.1", port))
    target = receiver.stats.datagrams + len(lines)
    deadline = time.monotonic() + 5
    while receiver.stats.datagrams < target and time.monotonic() < deadline:
        receiver.receive_available()
        time.sleep(0.005)
    clock.advance(300)
    receiver.roll(clock.now_ms())


def test_client_timestamps_within_the_skew_are_event_time_others_use_the_receive_time(
    tmp_path: Path,
) -> None:
    """
    recv clock:        T0 (1_700_000_000_000)
    |T T0-60 s     →   pane T0-60 s  (within ±120 s)
    |T T0+90 s     →   pane T0+90 s
    |T T0-1 h      →   pane T0, counted timestamp_out_of_range
    heartbeat      =   T0 + 300 (receive clock): not held back by the old timestamp
    """
    sock = bind_udp("127.0.0.1", 0)
    receiver, clock = _manual_receiver(tmp_path, sock, max_skew_ms=120_000)
    seconds = T0 // 1000
    _send_and_roll(receiver, clock, sock.getsockname()[1], [
        b"old.ok:1|c|T%d" % (seconds - 60),
        b"future.ok:5|g|T%d" % (seconds + 90),
        b"too.old:2|c|T%d" % (seconds - 3600),
        b"no.ts:3|c",
    ])
    rows = {r["metric"]: r for r in _rows(tmp_path)}
    assert rows["old.ok"]["pane_start_ms"] == T0 - 60_000
    assert rows["future.ok"]["pane_start_ms"] == T0 + 90_000
    assert rows["too.old"]["pane_start_ms"] == T0
    assert rows["too.old"]["first_recv_ms"] == T0
    assert rows["no.ts"]["pane_start_ms"] == T0
    assert receiver.stats.adjusted == {"timestamp_out_of_range": 1}
    assert receiver.stats.rejected == {}
    assert receiver.stats.lines == receiver.stats.metric_lines == 4 == receiver.stats.accounted()
    (segment,) = list_segments(tmp_path, "udp-0")
    assert read_heartbeat(segment).heartbeat_ms == T0 + 300
    assert rows["streamgauge.ingest.adjusted"]["tags"] == '{"reason":"timestamp_out_of_range"}'
    assert receiver.stats.reject_sample[-1]["reason"] == "timestamp_out_of_range"
    sock.close()


def test_new_series_over_the_limit_fold_into_one_visible_overflow_series(tmp_path: Path) -> None:
    sock = bind_udp("127.0.0.1", 0)
    receiver, clock = _manual_receiver(
        tmp_path, sock, cardinality=CardinalityLimits(max_series=100, max_series_per_metric=3)
    )
    lines = [b"req:1|c|#user:u%d" % i for i in range(10)] + [b"req:1|c|#user:u0", b"other:1|c"]
    _send_and_roll(receiver, clock, sock.getsockname()[1], lines)
    totals = _totals(_rows(tmp_path))
    kept = {tags for metric, tags in totals if metric == "req"}
    assert kept == {'{"user":"u0"}', '{"user":"u1"}', '{"user":"u2"}',
                    '{"streamgauge_overflow":"true"}'}
    assert totals[("req", '{"streamgauge_overflow":"true"}')]["sum"] == 7.0
    assert totals[("req", '{"user":"u0"}')]["sum"] == 2.0  # an admitted series stays admitted
    assert totals[("other", "{}")]["sum"] == 1.0
    assert sum(t["sum"] for (m, _), t in totals.items() if m == "req") == 11.0  # nothing lost
    assert receiver.stats.adjusted == {"cardinality_limited": 7}
    assert totals[("streamgauge.ingest.adjusted", '{"reason":"cardinality_limited"}')]["sum"] == 7
    assert totals[("streamgauge.ingest.series_active", '{"receiver":"udp-0"}')]["last"] == 4
    assert receiver.stats.lines == receiver.stats.accounted() == 12
    sock.close()


def test_kernel_drops_of_our_socket_become_self_metrics(tmp_path: Path) -> None:
    sock = bind_udp("127.0.0.1", 0)
    proc = tmp_path / "proc"
    proc.mkdir()
    inode = __import__("os").fstat(sock.fileno()).st_ino
    row = "  1: 0100007F:1FBD 00000000:0000 07 00000000:00000000 00:00000000 00000000 0 0 "
    header = "sl local rem st q tr retr uid timeout inode ref pointer drops\n"
    snmp_header = "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors\n"
    (proc / "snmp").write_text(snmp_header + "Udp: 1 0 0 1 10\n")
    receiver, clock = _manual_receiver(tmp_path / "spool", sock, stats_path=tmp_path / "s.json",
                                       proc_net=proc)
    (proc / "udp").write_text(header + row + f"{inode} 2 0 12\n")
    (proc / "snmp").write_text(snmp_header + "Udp: 1 0 0 1 25\n")
    _send_and_roll(receiver, clock, sock.getsockname()[1], [b"a:1|c"])
    totals = _totals(_rows(tmp_path / "spool"))
    where = f"udp://127.0.0.1:{sock.getsockname()[1]}"
    tags = json.dumps({"listen": where}, separators=(",", ":"))
    assert totals[("streamgauge.ingest.kernel_drops", tags)]["sum"] == 12
    assert totals[("streamgauge.ingest.udp_rcvbuf_errors", "{}")]["sum"] == 15
    stats = json.loads((tmp_path / "s.json").read_text())
    assert stats["kernel_drops"] == {where: 12}
    assert stats["udp_rcvbuf_errors"] == 15
    sock.close()


def _run_in_thread(receiver: Receiver) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()
    thread = threading.Thread(target=receiver.run, args=(stop,), daemon=True)
    thread.start()
    return thread, stop


def _wait_for(condition: Any, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_one_receiver_serves_udp4_udp6_tcp_and_a_unix_socket(tmp_path: Path) -> None:
    udp4 = bind_udp("127.0.0.1", 0)
    try:
        udp6 = bind_udp("::1", 0)
    except OSError:
        pytest.skip("no IPv6 loopback")
    tcp = bind_tcp("127.0.0.1", 0)
    unix_path = tmp_path / "sg.sock"
    unix = bind_unixgram(unix_path)
    receiver = Receiver(
        [udp4, udp6, tcp, unix], SegmentWriter(tmp_path / "spool", "udp-0"),
        PaneCombiner(1000), SystemClock(), roll_ms=50,
    )
    assert receiver.listening[1] == f"udp://[::1]:{udp6.getsockname()[1]}"
    thread, stop = _run_in_thread(receiver)

    statsd.StatsClient("127.0.0.1", udp4.getsockname()[1]).incr("via.udp4", 2)
    statsd.StatsClient("::1", udp6.getsockname()[1], ipv6=True).incr("via.udp6", 3)
    tcp_client = statsd.TCPStatsClient("127.0.0.1", tcp.getsockname()[1])
    for _ in range(50):
        tcp_client.incr("via.tcp.client")
    tcp_client.close()
    # Many connections, lines split across writes, a last line without its newline.
    raw_connections = [socket.create_connection(tcp.getsockname()) for _ in range(5)]
    for conn in raw_connections:
        conn.sendall(b"via.tcp.raw:1|c\nvia.tcp.r")
    for conn in raw_connections:
        time.sleep(0.01)
        conn.sendall(b"aw:1|c\nvia.tcp.raw:1|c")
        conn.close()
    DogStatsd(socket_path=str(unix_path), disable_telemetry=True,
              origin_detection_enabled=False).increment("via.unix", 4)

    _wait_for(lambda: receiver.stats.lines >= 1 + 1 + 50 + 15 + 1)
    stop.set()
    thread.join(10)
    totals = _totals(_rows(tmp_path / "spool"))
    assert totals[("via.udp4", "{}")]["sum"] == 2
    assert totals[("via.udp6", "{}")]["sum"] == 3
    assert totals[("via.tcp.client", "{}")]["sum"] == 50
    assert totals[("via.tcp.raw", "{}")]["sum"] == 15
    assert totals[("via.unix", "{}")]["sum"] == 4
    assert receiver.stats.tcp_connections == 6
    assert receiver.stats.rejected == {}
    assert receiver.stats.lines == receiver.stats.accounted() == 68
    for sock in (udp4, udp6, tcp, unix):
        sock.close()


@pytest.mark.parametrize("reader", ["compiled", "python", "loop", "loop-one-by-one"])
def test_a_unix_datagram_over_64_kib_keeps_its_whole_lines_and_counts_the_cut_one(
    tmp_path: Path, reader: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A Unix datagram socket takes datagrams longer than a read slot (64 KiB); the kernel
    cuts them there. The whole lines before the cut are aggregated; the line the cut went
    through is a ``line_too_long`` reject, never a shorter line (here: a shorter tag)."""
    if reader == "python":
        monkeypatch.setattr(transports_module, "recvmmsg_available", lambda: False)
    unix_path = tmp_path / "sg.sock"
    unix = bind_unixgram(unix_path)
    receiver = Receiver(
        unix, SegmentWriter(tmp_path / "spool", "udp-0"), PaneCombiner(1000), SystemClock(),
        roll_ms=50, read_ahead_bytes=0 if reader.startswith("loop") else 8 << 20,
        recvmmsg=reader != "loop-one-by-one",
    )
    whole = b"t.whole:1|c\n" * 5459 + b"t.pad:1|c\n"  # 65,518 bytes
    # cut at 65,536: "t.cut:1|c|#tag:yyy" would be a valid line with a shorter tag
    datagram = whole + b"t.cut:1|c|#tag:" + b"y" * 100
    assert 65536 - len(whole) - len(b"t.cut:1|c|#tag:") == 3
    thread, stop = _run_in_thread(receiver)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sender:
        sender.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
        sender.sendto(datagram, str(unix_path))
        sender.sendto(b"t.after:1|c", str(unix_path))
    _wait_for(lambda: receiver.stats.datagrams == 2)
    stop.set()
    thread.join(10)
    totals = _totals(_rows(tmp_path / "spool"))
    assert totals[("t.whole", "{}")]["sum"] == 5459
    assert totals[("t.pad", "{}")]["sum"] == totals[("t.after", "{}")]["sum"] == 1
    assert not any(metric == "t.cut" for metric, _ in totals)
    assert receiver.stats.rejected == {"line_too_long": 1}
    assert receiver.stats.lines == receiver.stats.accounted() == 5459 + 3
    assert receiver.stats.reject_sample[-1]["line"].startswith("<datagram over 64 KiB")
    unix.close()


def test_a_graceful_stop_ends_tcp_connections_and_keeps_their_last_line(tmp_path: Path) -> None:
    tcp = bind_tcp("127.0.0.1", 0)
    receiver = Receiver(tcp, SegmentWriter(tmp_path, "udp-0"), PaneCombiner(1000),
                        SystemClock(), roll_ms=50)
    thread, stop = _run_in_thread(receiver)
    conn = socket.create_connection(tcp.getsockname())
    conn.sendall(b"open:1|c\nopen:1|c")  # the client is still connected at shutdown
    _wait_for(lambda: receiver.stats.lines >= 1)
    stop.set()
    thread.join(10)
    assert _totals(_rows(tmp_path))[("open", "{}")]["sum"] == 2
    conn.close()
    tcp.close()


def test_dogstatsd_client_every_type_and_timestamps(tmp_path: Path) -> None:
    sock = bind_udp("127.0.0.1", 0)
    port = sock.getsockname()[1]
    clock = ManualClock(SystemClock().now_ms())
    receiver = Receiver(sock, SegmentWriter(tmp_path, "udp-0"), PaneCombiner(1000), clock)
    client = DogStatsd("127.0.0.1", port, disable_telemetry=True, origin_detection_enabled=False)
    tags = ["env:test", "team"]
    client.increment("dd.count", 3, tags=tags)
    client.decrement("dd.count", 1, tags=tags)
    client.gauge("dd.gauge", 42, tags=tags)
    client.histogram("dd.hist", 7)
    client.histogram("dd.hist", 9)
    client.distribution("dd.dist", 1.5)
    client.timing("dd.timing", 250)
    client.set("dd.set", "user-1")
    client.event("Deploy", "version 2\nrolled out", alert_type="success", tags=tags)
    client.service_check("dd.check", DogStatsd.WARNING, message="slow | disk")
    ts = clock.now_ms() // 1000 - 30
    client.gauge_with_timestamp("dd.gauge.ts", 5, ts)
    client.count_with_timestamp("dd.count.ts", 6, ts)
    client.count_with_timestamp("dd.count.ancient", 1, 1_000_000_000)  # 2001: out of skew
    client.close_socket()
    expected_lines = 13
    _wait_for(lambda: (receiver.receive_available(), receiver.stats.lines)[1] >= expected_lines)
    clock.advance(300)
    receiver.roll(clock.now_ms())

    totals = _totals(_rows(tmp_path))
    dd_tags = '{"env":"test","team":""}'
    assert totals[("dd.count", dd_tags)]["sum"] == 2
    assert totals[("dd.gauge", dd_tags)]["last"] == 42
    hist = totals[("dd.hist", "{}")]
    assert (hist["count"], hist["sum"], hist["min"], hist["max"]) == (2, 16, 7, 9)
    assert totals[("dd.dist", "{}")]["sum"] == 1.5
    assert totals[("dd.timing", "{}")]["sum"] == 250
    assert totals[("dd.gauge.ts", "{}")]["last"] == 5
    assert totals[("dd.count.ts", "{}")]["sum"] == 6
    assert totals[("dd.count.ancient", "{}")]["sum"] == 1
    rows = {r["metric"]: r for r in _rows(tmp_path)}
    assert rows["dd.count.ts"]["pane_start_ms"] == ts * 1000
    assert rows["dd.count.ancient"]["pane_start_ms"] > ts * 1000  # receive time instead
    stats = receiver.stats
    assert (stats.events, stats.service_checks) == (1, 1)
    assert stats.rejected == {}
    assert totals[("dd.set", "{}")]["count"] == 1
    assert stats.adjusted == {"timestamp_out_of_range": 1}
    assert stats.lines == stats.accounted() == expected_lines
    assert totals[("streamgauge.ingest.events", "{}")]["sum"] == 1
    assert totals[("streamgauge.ingest.service_checks", "{}")]["sum"] == 1
    sock.close()


def test_statsd_client_every_type_in_pipelines_matches_what_it_sent(tmp_path: Path) -> None:
    sock = bind_udp("127.0.0.1", 0)
    receiver, clock = _manual_receiver(tmp_path, sock)
    client = statsd.StatsClient("127.0.0.1", sock.getsockname()[1])
    sent: collections.Counter[str] = collections.Counter()
    with client.pipeline() as pipe:  # several lines per datagram
        for i in range(200):
            pipe.incr("sd.count", 2)
            pipe.timing("sd.timer", i)
            sent["lines"] += 2
    client.decr("sd.count", 5)
    client.gauge("sd.gauge", 10)
    client.gauge("sd.gauge", 4, delta=True)
    client.gauge("sd.gauge", -1, delta=True)
    client.set("sd.set", "x")
    sent["lines"] += 5
    _wait_for(lambda: (receiver.receive_available(), receiver.stats.lines)[1] >= sent["lines"])
    clock.advance(300)
    receiver.roll(clock.now_ms())
    totals = _totals(_rows(tmp_path))
    assert totals[("sd.count", "{}")]["sum"] == 400 - 5
    timer = totals[("sd.timer", "{}")]
    assert (timer["count"], timer["sum"], timer["min"], timer["max"]) == (200, 19900, 0, 199)
    assert totals[("sd.gauge", "{}")]["last"] == 13
    assert receiver.stats.rejected == {}
    assert totals[("sd.set", "{}")]["count"] == 1
    assert receiver.stats.datagrams < receiver.stats.lines
    assert receiver.stats.lines == receiver.stats.accounted() == sent["lines"]
    sock.close()


def test_segments_written_on_the_writer_thread_keep_order_and_a_stop_flushes_them(
    tmp_path: Path,
) -> None:
    sock = bind_udp("127.0.0.1", 0)
    queue = SegmentQueue(SegmentWriter(tmp_path, "udp-0", fsync=False), depth=2)
    receiver = Receiver(sock, queue, PaneCombiner(1000), SystemClock(), roll_ms=20)
    thread, stop = _run_in_thread(receiver)
    port = sock.getsockname()[1]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for i in range(300):
            sender.sendto(b"w.count:1|c\nw.timer:%d|ms" % i, ("127.0.0.1", port))
            if i % 50 == 0:
                time.sleep(0.03)  # spread over several rolls
    _wait_for(lambda: receiver.stats.datagrams == 300)
    stop.set()
    thread.join(10)
    assert not thread.is_alive()
    segments = list_segments(tmp_path, "udp-0")
    beats = [read_heartbeat(s) for s in segments]
    assert len(segments) == receiver.stats.segments > 1
    assert [b.heartbeat_ms for b in beats] == sorted(b.heartbeat_ms for b in beats)
    assert [b.closed for b in beats] == [False] * (len(beats) - 1) + [True]
    totals = _totals(_rows(tmp_path))
    assert totals[("w.count", "{}")]["count"] == totals[("w.timer", "{}")]["count"] == 300
    # many datagrams per system call (recvmmsg) where the platform has it
    assert receiver.stats.syscalls <= receiver.stats.datagrams + receiver.stats.segments * 2
    sock.close()


def test_over_the_spool_quota_data_is_refused_counted_and_its_count_reaches_the_log(
    tmp_path: Path,
) -> None:
    sock = bind_udp("127.0.0.1", 0)
    spool = tmp_path / "spool"
    queue = SegmentQueue(SegmentWriter(spool, "udp-0", fsync=False), depth=0, quota_bytes=1)
    clock = ManualClock(T0)
    receiver = Receiver(sock, queue, PaneCombiner(1000), clock, stats_path=tmp_path / "s.json")
    port = sock.getsockname()[1]
    _send_and_roll(receiver, clock, port, [b"q.count:1|c\nq.count:2|c", b"q.gauge:5|g"])
    rows = _rows(spool)
    assert rows and all(r["metric"].startswith("streamgauge.ingest.") for r in rows)
    assert receiver.stats.refused_samples == {"spool_quota": 3}
    assert receiver.stats.refused_partials == {"spool_quota": 2}
    _send_and_roll(receiver, clock, port, [b"q.count:1|c"])  # reports the first refusal
    totals = _totals(_rows(spool))
    quota = json.dumps({"reason": "spool_quota"}, separators=(",", ":"))
    assert totals[("streamgauge.ingest.refused", quota)]["sum"] == 3
    assert totals[("streamgauge.ingest.refused_partials", quota)]["sum"] == 2
    assert ("q.count", "{}") not in totals
    assert receiver.stats.lines == receiver.stats.accounted()  # received and accounted
    assert json.loads((tmp_path / "s.json").read_text())["refused_samples"]["spool_quota"] >= 3
    sock.close()


@pytest.mark.parametrize("depth", [0, 4])
def test_what_the_spool_quota_refuses_at_shutdown_is_still_counted_in_the_log(
    tmp_path: Path, depth: int
) -> None:
    """Stopped while refusing: the last data, refused on its way into the closing segment or
    still queued for the writer, is counted in the log too, not only in the stats file."""
    sock = bind_udp("127.0.0.1", 0)
    spool = tmp_path / "spool"
    queue = SegmentQueue(SegmentWriter(spool, "udp-0", fsync=False), depth=depth, quota_bytes=1)
    clock = ManualClock(T0)
    receiver = Receiver(sock, queue, PaneCombiner(1000), clock, stats_path=tmp_path / "s.json")
    port = sock.getsockname()[1]
    _send_and_roll(receiver, clock, port, [b"q.count:1|c\nq.count:2|c"])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        sender.sendto(b"q.count:1|c\nq.gauge:5|g", ("127.0.0.1", port))
    _wait_for(lambda: receiver.receive_available() or receiver.stats.datagrams == 2)
    clock.advance(10)
    receiver.close()  # no roll in between: the closing one takes the last lines
    quota = json.dumps({"reason": "spool_quota"}, separators=(",", ":"))
    totals = _totals(_rows(spool))
    assert receiver.stats.refused_samples == {"spool_quota": 4}
    assert totals[("streamgauge.ingest.refused", quota)]["sum"] == 4
    assert totals[("streamgauge.ingest.refused_partials", quota)]["sum"] == 3
    assert [read_heartbeat(s).closed for s in list_segments(spool, "udp-0")][-1]
    sock.close()


def _commit(checkpoint: Path, batch: int, receivers: dict[str, int]) -> None:
    """What a Spark checkpoint holds for the retention and lag readers: commits/<n>, and
    offsets/<n> whose last line names each receiver's last sequence."""
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    (checkpoint / "commits" / str(batch)).write_text("v1\n{}\n")
    offsets = {"receivers": {name: {"seq": seq} for name, seq in receivers.items()}}
    (checkpoint / "offsets" / str(batch)).write_text("v1\n{}\n" + json.dumps(offsets) + "\n")


def test_segment_lag_is_the_age_of_the_oldest_segment_the_job_has_not_committed(
    tmp_path: Path,
) -> None:
    sock = bind_udp("127.0.0.1", 0)
    live = tmp_path / "checkpoints" / "cfg" / "w-1234"
    receiver, clock = _manual_receiver(tmp_path / "spool", sock, checkpoints=[live])
    for _ in range(3):  # heartbeat segments 0, 1, 2 at T0, T0+1 s, T0+2 s
        receiver.roll(clock.now_ms())
        clock.advance(1_000)
    assert receiver.stats.segment_lag_ms == 0  # polled at T0, before segment 0 existed
    clock.set(T0 + 10_000)  # nothing read yet: segment 0 is the oldest unread
    receiver.roll(clock.now_ms())  # and writes segment 3
    assert receiver.stats.segment_lag_ms == 10_000
    # a stale checkpoint of an older config stays at sequence 0; the live query read up to 2
    _commit(live.with_name("old-window"), 0, {"udp-0": 0})
    _commit(live, 7, {"udp-0": 2, "udp-9": 5})
    clock.set(T0 + 15_000)
    _send_and_roll(receiver, clock, sock.getsockname()[1], [b"a:1|c"])  # at T0 + 15.3 s
    assert receiver.stats.segment_lag_ms == 5_300  # segment 3's age
    rows = [r for r in _rows(tmp_path / "spool") if r["metric"].endswith("segment_lag_ms")]
    # The gauge rides with the roll's counters: the datagram's here. An earlier roll writes one
    # too if the namespace's RcvbufErrors moved meanwhile (other processes' sockets count there).
    assert (rows[-1]["last"], rows[-1]["tags"]) == (5_300, '{"receiver":"udp-0"}')
    assert {r["last"] for r in rows[:-1]} <= {0, 10_000}
    _commit(live, 8, {"udp-0": 4})  # read everything written
    clock.set(T0 + 20_300)
    receiver.roll(clock.now_ms())
    assert receiver.stats.segment_lag_ms == 0
    sock.close()


def test_segment_lag_follows_the_slowest_query_of_the_running_config(tmp_path: Path) -> None:
    """Two queries of the running config (``native`` and ``sketches`` here: any two, such as a
    session window's query and its late query) commit separately: a segment is unread until
    both committed it, so the lag is the age of the segment after the smaller offset, not the
    furthest-ahead query's."""
    sock = bind_udp("127.0.0.1", 0)
    root = tmp_path / "checkpoints" / "cfg"
    native, sketches = root / "w-1234", root / "w-1234.sketches-abcd"
    receiver, clock = _manual_receiver(
        tmp_path / "spool", sock, checkpoints=[native, sketches]
    )
    for _ in range(6):  # heartbeat segments 0..5 at T0, T0+1 s, ..., T0+5 s
        receiver.roll(clock.now_ms())
        clock.advance(1_000)
    _commit(native, 3, {"udp-0": 4})  # the first query read segments 0..4
    clock.set(T0 + 30_000)
    receiver.roll(clock.now_ms())  # writes segment 6
    assert receiver.stats.segment_lag_ms == 30_000  # the second read nothing: segment 0
    _commit(sketches, 2, {"udp-0": 1})  # the second read 0..1: segment 2 is its oldest
    _commit(root / "old-window", 9, {"udp-0": 6})  # an older config's: not one of the queries
    clock.set(T0 + 35_000)
    receiver.roll(clock.now_ms())
    assert receiver.stats.segment_lag_ms == 33_000  # segment 2 (T0 + 2 s), not 5 (T0 + 5 s)
    _commit(sketches, 3, {"udp-0": 4})  # both at 4 now: segment 5 is the oldest unread
    clock.set(T0 + 40_000)
    receiver.roll(clock.now_ms())
    assert receiver.stats.segment_lag_ms == 35_000
    # The first query read 5..7; the second, idle (windows.source.QuietLane), passed over
    # the same segments without a batch: nothing for it in them, so they are not its lag.
    _commit(native, 4, {"udp-0": 7})
    (sketches / PASSED_OVER_FILE).write_text(json.dumps({"receivers": {"udp-0": {"seq": 7}}}))
    clock.set(T0 + 45_000)
    receiver.roll(clock.now_ms())  # writes segment 9 (T0 + 45 s): segment 8 is the oldest
    assert receiver.stats.segment_lag_ms == 5_000
    assert safe_sequences([native, sketches]) == {"udp-0": 4}  # what retention may delete
    sock.close()


@pytest.mark.parametrize("kind", [CompiledReadAhead, PythonReadAhead])
def test_read_ahead_threads_hand_datagrams_over_in_order_and_wait_when_full(
    kind: type[CompiledReadAhead | PythonReadAhead],
) -> None:
    sock = bind_udp("127.0.0.1", 0)
    sock.setblocking(False)
    # Python: one buffer, then it waits for take(); compiled: a ring of four 64 KiB datagrams
    read_ahead = kind([sock], limit_bytes=1)
    read_ahead.start()
    port = sock.getsockname()[1]
    taken: list[bytes] = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for i in range(50):
            sender.sendto(b"r:%d|c" % i, ("127.0.0.1", port))
            time.sleep(0.001)

    def all_taken() -> bool:
        taken.extend(chunk.buffer for chunk in read_ahead.take())
        return b"".join(taken).count(b"\n") == 50

    _wait_for(all_taken)
    read_ahead.stop()
    read_ahead.close()
    assert b"".join(taken) == b"".join(b"r:%d|c\n" % i for i in range(50))
    if kind is PythonReadAhead:  # the compiled one's waits: see the tests below
        assert read_ahead.full_waits >= 1
    sock.close()


_SENDER_KEY: list[int] = []  # the key of _queue's last sender


def _queue(port: int, datagrams: list[bytes]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        sender.bind(("127.0.0.1", 0))
        _SENDER_KEY[:] = [sources.key_of_address(socket.AF_INET, sender.getsockname())]
        for datagram in datagrams:
            sender.sendto(datagram, ("127.0.0.1", port))


def test_compiled_read_ahead_goes_round_its_ring_and_hands_over_whole_chunks() -> None:
    """30 datagrams of 60 kB go several times round the smallest ring (256 KiB), in chunks of
    at most half of it; ``take(100)`` takes one chunk, or several of at most 100 datagrams
    together; every byte arrives once, in order."""
    sock = bind_udp("127.0.0.1", 0)
    big = [b"b%02d:1|c|#" % i + b"x" * 60_000 for i in range(30)]
    small = [b"s:%d|c" % i for i in range(1500)]
    _queue(sock.getsockname()[1], big + small)  # queued before the reader starts
    read_ahead = CompiledReadAhead([sock], limit_bytes=1)
    read_ahead.start()
    taken: list[Chunk] = []

    def all_taken() -> bool:
        now = read_ahead.take(100)
        if len(now) > 1:
            assert sum(chunk.count for chunk in now) <= 100
        taken.extend(now)
        return sum(chunk.count for chunk in taken) == len(big) + len(small)

    _wait_for(all_taken)
    read_ahead.stop()
    read_ahead.close()
    assert b"".join(c.buffer for c in taken) == b"".join(d + b"\n" for d in big + small)
    assert max(len(c.buffer) for c in taken) <= 128 << 10
    assert sum(c.calls for c in taken) >= 1
    # each datagram's length and sender, in the order of the buffers
    assert np.concatenate([c.lengths for c in taken]).tolist() == [len(d) for d in big + small]
    assert set(np.concatenate([c.keys for c in taken]).tolist()) == {_SENDER_KEY[0]}
    sock.close()


def test_compiled_read_ahead_stopped_while_waiting_for_a_chunk_hands_everything_over() -> None:
    sock = bind_udp("127.0.0.1", 0)
    datagrams = [b"w%02d:1|c|#" % i + b"y" * 60_000 for i in range(60)]
    _queue(sock.getsockname()[1], datagrams)
    read_ahead = CompiledReadAhead([sock], limit_bytes=1)
    read_ahead.start()
    _wait_for(lambda: read_ahead.full_waits >= 1)  # both chunks full, none taken
    read_ahead.stop()  # takes the chunks back so that the reader can finish
    taken: list[bytes] = []
    while now := read_ahead.take():
        taken.extend(chunk.buffer for chunk in now)
    read_ahead.close()
    # what was not read before the stop is still queued on the socket, whole
    rest = []
    sock.setblocking(False)
    with contextlib.suppress(BlockingIOError):
        while True:
            rest.append(sock.recv(65536))
    assert b"".join(taken) + b"".join(d + b"\n" for d in rest) == b"".join(
        d + b"\n" for d in datagrams)
    assert taken
    sock.close()


_FAILING_RECVMMSG_C = r"""
#define _GNU_SOURCE
#include <errno.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* recvmmsg(2) as libc's, but the next fail_next calls fail with fail_errno. */
int fail_next = 0;
int fail_errno = 0;
int failed = 0;

int failing_recvmmsg(int fd, struct mmsghdr *vec, unsigned int vlen, int flags,
                     struct timespec *timeout) {
    if (fail_next > 0) {
        fail_next--;
        failed++;
        errno = fail_errno;
        return -1;
    }
    return (int)syscall(SYS_recvmmsg, fd, vec, vlen, flags, timeout);
}
"""


def _failing_recvmmsg(directory: Path) -> ctypes.CDLL:
    """A real ``recvmmsg`` (the system call itself) whose next calls can be made to fail: the
    kernel's ENOMEM cannot be caused on purpose, so it is injected at the call's boundary."""
    source = directory / "failing_recvmmsg.c"
    source.write_text(_FAILING_RECVMMSG_C)
    library = directory / "failing_recvmmsg.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(library), str(source)],
                   check=True, capture_output=True)  # fmt: skip
    return ctypes.CDLL(str(library), use_errno=True)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or shutil.which("gcc") is None,
    reason="recvmmsg and a C compiler: Linux",
)
@pytest.mark.parametrize("compiled", [True, False])
def test_a_read_the_kernel_fails_for_a_moment_is_counted_and_retried(
    tmp_path: Path, compiled: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ENOMEM and ENOBUFS from ``recvmmsg`` say the kernel could not allocate for this read,
    not that the socket is gone: the datagrams stay queued. Each reader (the compiled loop,
    the Python read-ahead) counts the failure, pauses and reads again, rather than ending
    at the first one and leaving everything after to the kernel's drop counter."""
    shim = _failing_recvmmsg(tmp_path)
    failing = shim.failing_recvmmsg
    address = ctypes.cast(failing, ctypes.c_void_p).value
    assert address is not None
    if compiled:
        real = read_ahead_module._libc_addresses

        def with_failing_recvmmsg() -> Any:
            addresses = real()
            addresses[read_ahead_module._RECVMMSG] = address
            return addresses

        monkeypatch.setattr(read_ahead_module, "_libc_addresses", with_failing_recvmmsg)
    else:
        monkeypatch.setattr(transports_module, "recvmmsg_available", lambda: False)
        failing.argtypes = transports_module._RECVMMSG.argtypes
        failing.restype = ctypes.c_int
        monkeypatch.setattr(transports_module, "_RECVMMSG", failing)
    ctypes.c_int.in_dll(shim, "fail_errno").value = errno.ENOMEM
    sock = bind_udp("127.0.0.1", 0)
    receiver = Receiver(sock, SegmentWriter(tmp_path, "udp-0", fsync=False), PaneCombiner(1000),
                        SystemClock(), stats_path=tmp_path / "s.json")
    thread, stop = _run_in_thread(receiver)
    client = statsd.StatsClient(*sock.getsockname())
    client.incr("f.count")
    _wait_for(lambda: receiver.stats.datagrams == 1)
    ctypes.c_int.in_dll(shim, "fail_next").value = 3  # the next three reads fail...
    for _ in range(199):  # ... while these wait in the socket's queue
        client.incr("f.count")
    _wait_for(lambda: receiver.stats.datagrams == 200)
    stop.set()
    thread.join(10)
    assert ctypes.c_int.in_dll(shim, "failed").value == 3
    assert _totals(_rows(tmp_path))[("f.count", "{}")]["count"] == 200
    assert receiver.stats.read_errors == 3
    assert json.loads((tmp_path / "s.json").read_text())["read_errors"] == 3
    sock.close()


@pytest.mark.parametrize("compiled", [True, False])
def test_a_receiver_with_a_full_read_ahead_loses_nothing_and_counts_the_waits(
    tmp_path: Path, compiled: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A receive loop held up 50 ms at every wake-up (as by a roll or a collection) while
    datagrams arrive in two bursts: the Python reader, allowed one buffer, reads the first
    burst and waits for the loop. (Not held up, the loop often took each buffer before the
    reader looked again: 3 of 8 runs at 6be1b79 counted no wait.) The compiled read-ahead's
    smallest ring (256 KiB) does not fill with these 2,000 small datagrams: its waits are
    counted in the tests above."""
    if not compiled:
        monkeypatch.setattr(transports_module, "recvmmsg_available", lambda: False)
    take = Receiver._take_read_ahead

    def held_up_take(self: Receiver) -> int:
        time.sleep(0.05)
        return take(self)

    monkeypatch.setattr(Receiver, "_take_read_ahead", held_up_take)
    sock = bind_udp("127.0.0.1", 0)
    receiver = Receiver(sock, SegmentWriter(tmp_path, "udp-0", fsync=False), PaneCombiner(1000),
                        SystemClock(), read_ahead_bytes=1, stats_path=tmp_path / "s.json")
    thread, stop = _run_in_thread(receiver)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for i in range(2000):
            sender.sendto(b"f.count:1|c\nf.gauge:%d|g" % i, sock.getsockname())
            if i == 999:
                time.sleep(0.1)  # the reader has the first burst by now
    _wait_for(lambda: receiver.stats.datagrams == 2000)
    stop.set()
    thread.join(10)
    totals = _totals(_rows(tmp_path))
    assert totals[("f.count", "{}")]["count"] == 2000
    assert totals[("f.gauge", "{}")]["last"] == 1999  # in order
    if not compiled:
        assert receiver.stats.read_ahead_full > 0
        assert json.loads((tmp_path / "s.json").read_text())["read_ahead_full"] > 0
    sock.close()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice: Linux")
@pytest.mark.parametrize("compiled", [True, False])
def test_the_loop_and_the_segment_writer_run_below_compiled_readers(
    tmp_path: Path, compiled: bool, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``worker_nice``: with compiled readers the loop's thread and the segment writer go 5
    nice steps down, the readers stay where they started (they are started first: a thread
    inherits its creator's nice value, and only a privileged one may lower it again). Python
    readers need the GIL those threads hold: nothing changes."""
    if not compiled:
        monkeypatch.setattr(transports_module, "recvmmsg_available", lambda: False)
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    sock = bind_udp("127.0.0.1", 0)
    queue = SegmentQueue(SegmentWriter(tmp_path, "udp-0", fsync=False), depth=2)
    receiver = Receiver(sock, queue, PaneCombiner(1000), SystemClock(), worker_nice=5)
    thread, stop = _run_in_thread(receiver)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for _ in range(10):
            sender.sendto(b"n.count:1|c", sock.getsockname())
    _wait_for(lambda: receiver.stats.datagrams == 10)
    readers = [t for t in threading.enumerate() if t.name.startswith("read-ahead-udp")]
    nice_of = {
        "loop": os.getpriority(os.PRIO_PROCESS, thread.native_id or 0),
        "writer": os.getpriority(os.PRIO_PROCESS, queue.thread_id or 0),
        "readers": {os.getpriority(os.PRIO_PROCESS, t.native_id or 0) for t in readers},
    }
    stop.set()
    thread.join(10)
    lowered = min(19, base + 5) if compiled else base
    assert nice_of == {"loop": lowered, "writer": lowered, "readers": {base}}
    assert len(readers) == 1
    assert _totals(_rows(tmp_path))[("n.count", "{}")]["count"] == 10
    sock.close()
