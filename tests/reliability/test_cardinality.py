"""A cardinality explosion on a real receiver (bad input): 50k distinct series in
one simulated minute over UDP, against ``CardinalityLimits(max_series=5000,
max_series_per_metric=1000)``. ``bench/cardinality.py`` runs the 1 M version and prints RSS.

What must hold: the series kept apart never exceed the limits (overall and per metric); every
line beyond them is folded into its metric's visible overflow series
(``streamgauge_overflow:true``) and counted as ``cardinality_limited``; nothing is lost (the log
holds every sample); the receiver's per-series state (combiner slots, fast-path keys) stays
bounded by the limits, not by the series sent; an admitted series stays admitted.
"""

from __future__ import annotations

import collections
import socket
import time
from pathlib import Path
from typing import Any

from streamgauge.clock import ManualClock
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.guard import CardinalityLimits
from streamgauge.ingest.log import SegmentWriter, list_segments, read_segment
from streamgauge.ingest.receiver import SELF_METRIC_PREFIX, Receiver, bind_udp

T0 = 1_700_000_000_000
LIMITS = CardinalityLimits(max_series=5_000, max_series_per_metric=1_000, ttl_ms=600_000)
SERIES = 50_000
LINES_PER_DATAGRAM = 20
DATAGRAMS_PER_CHUNK = 50  # sent, then drained: well within the socket's receive buffer
OVERFLOW = '{"streamgauge_overflow":"true"}'
#: self-metrics (about a dozen series) on top of the data series
SELF_SERIES = 20
#: a sender's datagrams and lines (streamgauge.ingest.client.*), until it is idle for long
SERIES_PER_SENDER = 2


def _line(i: int) -> bytes:
    """Half the series on one hot metric (its per-metric limit binds first), the rest spread
    over nine others (then the overall limit binds); every tenth a timer."""
    if i % 2 == 0:
        return b"hot:1|c|#user:u%d" % i
    if i % 10 == 5:
        return b"lat:5|ms|#user:u%d" % i
    return b"m%d:1|c|#user:u%d" % (i % 10, i)


def _send_and_drain(receiver: Receiver, port: int, datagrams: list[bytes]) -> None:
    target = receiver.stats.datagrams + len(datagrams)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for datagram in datagrams:
            sender.sendto(datagram, ("127.0.0.1", port))
    deadline = time.monotonic() + 10
    while receiver.stats.datagrams < target:
        assert time.monotonic() < deadline, "datagrams lost on loopback"
        receiver.receive_available()


def _rows(spool: Path) -> list[dict[str, Any]]:
    return [row for segment in list_segments(spool, "udp-0")
            for batch in read_segment(segment) for row in batch.to_pylist()]


def _explode(tmp_path: Path, line: Any, series: int) -> tuple[Receiver, list[int]]:
    sock = bind_udp("127.0.0.1", 0)
    clock = ManualClock(T0)
    receiver = Receiver(
        sock, SegmentWriter(tmp_path, "udp-0", fsync=False), PaneCombiner(1000), clock,
        cardinality=LIMITS, read_ahead_bytes=0,
    )
    port = sock.getsockname()[1]
    chunk = LINES_PER_DATAGRAM * DATAGRAMS_PER_CHUNK
    step_ms = 60_000 * chunk // series  # all of it within one simulated minute
    held = []
    for start in range(0, series, chunk):
        lines = [line(i) for i in range(start, min(start + chunk, series))]
        datagrams = [b"\n".join(lines[j : j + LINES_PER_DATAGRAM])
                     for j in range(0, len(lines), LINES_PER_DATAGRAM)]
        _send_and_drain(receiver, port, datagrams)
        clock.advance(step_ms)
        receiver.roll(receiver.now_ms())
        assert receiver.stats.series_active <= LIMITS.max_series
        held.append(receiver._combiner.slots_used)
    # the first series are still active: they stay apart (not folded into the overflow)
    _send_and_drain(receiver, port, [b"\n".join(line(i) for i in range(LINES_PER_DATAGRAM))])
    receiver.roll(receiver.now_ms(), closed=True)
    sock.close()
    return receiver, held


def test_a_tag_explosion_stays_within_the_limits_and_overflow_is_visible_and_counted(
    tmp_path: Path,
) -> None:
    receiver, held = _explode(tmp_path, _line, SERIES)
    stats = receiver.stats
    sent = SERIES + LINES_PER_DATAGRAM
    assert stats.lines == stats.metric_lines == sent == stats.accounted()
    rows = _rows(tmp_path)
    data = [r for r in rows if not r["metric"].startswith(SELF_METRIC_PREFIX)]
    assert sum(r["count"] for r in data) == sent  # nothing lost
    apart = {(r["metric"], r["tags"]) for r in data if r["tags"] != OVERFLOW}
    overflow = [r for r in data if r["tags"] == OVERFLOW]
    # within the limits: 5000 overall, 1000 for the hot metric
    assert len(apart) == LIMITS.max_series
    per_metric = collections.Counter(metric for metric, _ in apart)
    assert per_metric["hot"] == LIMITS.max_series_per_metric
    assert max(per_metric.values()) <= LIMITS.max_series_per_metric
    # the rest is in each metric's overflow series, counted line by line
    limited = stats.adjusted["cardinality_limited"]
    assert limited == sent - LIMITS.max_series - LINES_PER_DATAGRAM
    assert sum(r["count"] for r in overflow) == limited
    assert {r["metric"] for r in overflow} == {"hot", "lat", *(f"m{k}" for k in (1, 3, 7, 9))}
    logged = sum(r["sum"] for r in rows if r["metric"] == SELF_METRIC_PREFIX + "adjusted"
                 and r["tags"] == '{"reason":"cardinality_limited"}')
    assert logged == limited
    active = [r for r in rows if r["metric"] == SELF_METRIC_PREFIX + "series_active"]
    assert max(r["max"] for r in active) <= LIMITS.max_series
    # bounded state: series slots held by the combiner never exceed the limit plus the
    # overflow and self-metric series, whatever was sent
    # (and each sender's counts, streamgauge.ingest.client.*: a new socket per chunk here)
    senders = len(receiver.clients)
    assert max(held) <= (LIMITS.max_series + len({r["metric"] for r in overflow}) + SELF_SERIES
                         + SERIES_PER_SENDER * senders)
    assert len(receiver._fast or ()) <= LIMITS.max_series


def test_a_name_explosion_stays_within_the_limits(tmp_path: Path) -> None:
    series = 10_000
    receiver, held = _explode(tmp_path, lambda i: b"name%d:1|c" % i, series)
    rows = _rows(tmp_path)
    data = {(r["metric"], r["tags"]) for r in rows
            if not r["metric"].startswith(SELF_METRIC_PREFIX)}
    assert receiver.stats.adjusted["cardinality_limited"] == series - LIMITS.max_series
    assert max(held) <= (LIMITS.max_series + 10 + SELF_SERIES  # what a bound would allow
                         + SERIES_PER_SENDER * len(receiver.clients))
    assert len(data) <= LIMITS.max_series + 10
    # the refused names share one visible overflow series of their type, every line in it
    shared = [r for r in rows if r["metric"] == "streamgauge.overflow.c"]
    assert {r["tags"] for r in shared} == {OVERFLOW}
    assert sum(r["count"] for r in shared) == series - LIMITS.max_series
    assert len(receiver._combiner._types) <= LIMITS.max_series + 10 + SELF_SERIES
