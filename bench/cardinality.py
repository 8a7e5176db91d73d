"""A cardinality explosion against one real receiver: N distinct series in one simulated minute.

    python bench/cardinality.py                           # 1 M series, tags shape, default limits
    python bench/cardinality.py --shape names --series 200000
    python bench/cardinality.py --max-series 10000 --per-metric 2000

Drives a ``Receiver`` on a loopback UDP socket (20 lines per datagram, sent in chunks and
drained, so the kernel drops nothing) on a manual clock that covers the whole run in
``--minutes`` of receive time, rolling a segment every chunk. Prints, every 5 % of the run:
series sent so far, series kept apart (``series_active``), lines folded into overflow
(``cardinality_limited``), combiner slots and fast-path keys held, the receiver's RSS
(``VmRSS``) and the segments' size; then a summary checking the limits and the accounting.

Shapes: ``tags`` — one series per ``user`` tag value, half on one hot metric, the rest over
nine (the realistic explosion: an ID in a tag); ``names`` — one metric name per series (an ID
in the name). Not a test: RSS and times depend on the machine.
"""

from __future__ import annotations

import argparse
import resource
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import cast

from streamgauge.clock import ManualClock
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.guard import CardinalityLimits
from streamgauge.ingest.log import SegmentWriter, list_segments, read_segment
from streamgauge.ingest.receiver import SELF_METRIC_PREFIX, Receiver
from streamgauge.ingest.transports import bind_udp

T0 = 1_700_000_000_000
LINES_PER_DATAGRAM = 20
OVERFLOW = '{"streamgauge_overflow":"true"}'


def tags_line(i: int) -> bytes:
    if i % 2 == 0:
        return b"hot:1|c|#user:u%d" % i
    if i % 10 == 5:
        return b"lat:5|ms|#user:u%d" % i
    return b"m%d:1|c|#user:u%d" % (i % 10, i)


def names_line(i: int) -> bytes:
    return b"name%d:1|c" % i


SHAPES: dict[str, Callable[[int], bytes]] = {"tags": tags_line, "names": names_line}


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def spool_mib(spool: Path) -> float:
    return sum(p.stat().st_size for p in spool.rglob("*.arrow")) / (1 << 20)


def run(series: int, shape: str, limits: CardinalityLimits, chunk_datagrams: int,
        minutes: float, spool: Path) -> int:
    line = SHAPES[shape]
    sock = bind_udp("127.0.0.1", 0)
    port = sock.getsockname()[1]
    clock = ManualClock(T0)
    receiver = Receiver(sock, SegmentWriter(spool, "udp-0", fsync=False), PaneCombiner(1000),
                        clock, cardinality=limits, read_ahead_bytes=0)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    chunk = chunk_datagrams * LINES_PER_DATAGRAM
    chunks = -(-series // chunk)
    step_ms = max(1, int(minutes * 60_000) // chunks)
    report_every = max(1, chunks // 20)
    print(f"# {series} series ({shape}) in {minutes:g} simulated minute(s), limits "
          f"max_series={limits.max_series} max_series_per_metric={limits.max_series_per_metric}"
          f" ttl={limits.ttl_ms} ms; {chunk} lines per chunk, a roll every {step_ms} ms")
    print(f"{'sent':>9} {'recv_s':>7} {'apart':>7} {'limited':>9} {'slots':>7} {'keys':>7} "
          f"{'rss_MiB':>8} {'spool_MiB':>9} {'wall_s':>7}")
    started = time.perf_counter()
    max_active = max_slots = 0
    for n in range(chunks):
        first = n * chunk
        lines = [line(i) for i in range(first, min(first + chunk, series))]
        target = receiver.stats.datagrams
        for j in range(0, len(lines), LINES_PER_DATAGRAM):
            sender.sendto(b"\n".join(lines[j : j + LINES_PER_DATAGRAM]), ("127.0.0.1", port))
            target += 1
        deadline = time.monotonic() + 10
        while receiver.stats.datagrams < target and time.monotonic() < deadline:
            receiver.receive_available()
        clock.advance(step_ms)
        receiver.roll(receiver.now_ms())
        max_active = max(max_active, receiver.stats.series_active)
        max_slots = max(max_slots, receiver._combiner.slots_used)
        if (n + 1) % report_every == 0 or n + 1 == chunks:
            stats = receiver.stats
            print(f"{first + len(lines):>9} {(clock.now_ms() - T0) / 1000:>7.1f} "
                  f"{stats.series_active:>7} {stats.adjusted['cardinality_limited']:>9} "
                  f"{receiver._combiner.slots_used:>7} {len(receiver._fast or ()):>7} "
                  f"{rss_mib():>8.1f} {spool_mib(spool):>9.1f} "
                  f"{time.perf_counter() - started:>7.1f}", flush=True)
    receiver.roll(receiver.now_ms(), closed=True)
    elapsed = time.perf_counter() - started
    sender.close()
    sock.close()

    stats = receiver.stats
    apart: set[tuple[str, str]] = set()
    overflow_series: set[str] = set()
    logged = overflow_samples = 0
    for segment in list_segments(spool, "udp-0"):
        for batch in read_segment(cast(Path, segment.path)):  # a local spool: LocalSpool.path
            for row in batch.to_pylist():
                if row["metric"].startswith(SELF_METRIC_PREFIX):
                    continue
                logged += row["count"]
                if row["tags"] == OVERFLOW:
                    overflow_series.add(row["metric"])
                    overflow_samples += row["count"]
                else:
                    apart.add((row["metric"], row["tags"]))
    limited = stats.adjusted["cardinality_limited"]
    drops = sum(stats.kernel_drops.values())
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    within = not limits.max_series or max_active <= limits.max_series
    print(f"# lines sent {series}, received {stats.lines}, aggregated {stats.metric_lines}, "
          f"in the log {logged}; kernel drops {drops} datagrams")
    print(f"# series kept apart: {len(apart)} (peak active {max_active}, within the limit: "
          f"{within}); overflow: {limited} lines counted cardinality_limited, {overflow_samples}"
          f" samples in {len(overflow_series)} overflow series")
    print(f"# state held: peak combiner slots {max_slots}, fast-path keys "
          f"{len(receiver._fast or ())}; peak RSS {peak_rss:.0f} MiB; "
          f"{series / elapsed:,.0f} lines/s over {elapsed:.1f} s")
    accounted = stats.lines == stats.accounted() == series == logged and limited == overflow_samples
    bounded = max_slots <= (limits.max_series or series) + 64
    print(f"# accounting exact: {accounted}; state bounded by the limits: {bounded}")
    return 0 if accounted and within and bounded else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    defaults = CardinalityLimits()
    parser.add_argument("--series", type=int, default=1_000_000)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tags")
    parser.add_argument("--max-series", type=int, default=defaults.max_series)
    parser.add_argument("--per-metric", type=int, default=defaults.max_series_per_metric)
    parser.add_argument("--ttl-ms", type=int, default=defaults.ttl_ms)
    parser.add_argument("--minutes", type=float, default=1.0)
    parser.add_argument("--chunk-datagrams", type=int, default=200)
    args = parser.parse_args(argv)
    limits = CardinalityLimits(args.max_series, args.per_metric, args.ttl_ms)
    with tempfile.TemporaryDirectory(prefix="sg-cardinality-") as spool:
        return run(args.series, args.shape, limits, args.chunk_datagrams, args.minutes,
                   Path(spool))


if __name__ == "__main__":
    sys.exit(main())
