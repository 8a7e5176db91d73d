"""Receive-thread CPU per line when clients send names with another type than they have (a
type flood: every such line is a ``type_conflict`` reject), beside ordinary lines.

    python bench/ingest/type_flood.py [--repeat 9] [--series 10000]

In-process, no sockets: 10k series of mixed types (bench/ingest/sender.c's lines) are made
known, then each wake-up's buffer (256 datagrams of 20 lines) is handed to the receive loop's
``_ingest_buffer`` and timed with the thread's CPU clock. Buffers: ordinary lines; every line
with its type swapped (counter ↔ gauge, timer/distribution → counter); one line in ten
swapped. Prints the median ns per line over ``--repeat`` passes of 20 buffers each, and how
many lines were rejected, so a run of the code before (``PYTHONPATH=<its worktree>``) can be
put beside it. A script, not a test.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from streamgauge.clock import SystemClock
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.guard import CardinalityLimits
from streamgauge.ingest.log import SegmentQueue, SegmentWriter
from streamgauge.ingest.receiver import Receiver
from streamgauge.ingest.transports import bind_udp

TYPES = ("c", "ms", "g", "d")
SWAPPED = {"c": "g", "g": "c", "ms": "c", "d": "c"}
PER_DATAGRAM = 20
DATAGRAMS_PER_WAKEUP = 256


def line(index: int, swapped: bool) -> bytes:
    kind = TYPES[index % 4]
    if swapped:
        kind = SWAPPED[kind]
    return b"bench.m%d:%d|%s|#host:h%d" % (index % 100, index % 97, kind.encode(), index // 100)


def buffers(series: int, swap_every: int) -> list[bytes]:
    """Wake-up buffers covering every series once; line i swapped if i % swap_every == 0
    (0: none swapped)."""
    lines = [line(i, swap_every > 0 and i % swap_every == 0) for i in range(series)]
    datagrams = [b"\n".join(lines[i : i + PER_DATAGRAM]) for i in range(0, series, PER_DATAGRAM)]
    wakeups = range(0, len(datagrams), DATAGRAMS_PER_WAKEUP)
    return [b"\n".join([*datagrams[i : i + DATAGRAMS_PER_WAKEUP], b""]) for i in wakeups]


def measure(series: int, swap_every: int, repeat: int) -> tuple[float, float]:
    """(median ns per line, share of lines rejected as type conflicts)."""
    sock = bind_udp("127.0.0.1", 0, 1 << 20)
    queue = SegmentQueue(SegmentWriter(Path(tempfile.mkdtemp(prefix="sg-flood-")), "udp-0"),
                         depth=4)  # fmt: skip
    receiver = Receiver(
        sock, queue, PaneCombiner(1000), SystemClock(),
        cardinality=CardinalityLimits(max_series=0, max_series_per_metric=0),
    )  # fmt: skip
    for buffer in buffers(series, 0):  # every series known, with its own type
        receiver._ingest_buffer(buffer, receiver.now_ms())  # noqa: SLF001
    work = buffers(series, swap_every)
    lines = sum(buffer.count(b"\n") for buffer in work)
    samples = []
    for _ in range(repeat):
        rejected_before = receiver.stats.rejected["type_conflict"]
        started = time.thread_time()
        for buffer in work:
            receiver._ingest_buffer(buffer, receiver.now_ms())  # noqa: SLF001
        samples.append((time.thread_time() - started) / lines)
        share = (receiver.stats.rejected["type_conflict"] - rejected_before) / lines
        receiver.roll(receiver.now_ms())
    receiver.close()
    sock.close()
    return statistics.median(samples) * 1e9, share


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--series", type=int, default=10_000)
    args = parser.parse_args()
    print(f"medians of {args.repeat}; {args.series} series, {PER_DATAGRAM} lines per datagram, "
          f"{DATAGRAMS_PER_WAKEUP} datagrams per wake-up; receive-thread CPU")
    print("buffer                      ns/line  type_conflict share")
    for name, swap_every in (("ordinary lines", 0), ("every line another type", 1),
                             ("one line in ten", 10)):
        ns, share = measure(args.series, swap_every, args.repeat)
        print(f"{name:<26}  {ns:>7.0f}  {share:>18.1%}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
