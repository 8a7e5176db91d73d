"""CPU cost of the receive path per datagram and per line, and the receive thread's time per
roll, measured in-process with the thread's own CPU clock.

    python bench/ingest/cpu.py [--repeat 5] [--series 10000]

The load benchmark (bench/ingest.py) needs the machine to itself: loss depends on whether the
receiver gets a core when the socket buffer fills. This one does not: the socket buffer is
filled first (64 MiB, SO_RCVBUFFORCE, so nothing is dropped), then the receiver drains it
while ``time.thread_time`` counts only its own CPU. For each shape (1 and 20 lines per
datagram) and reader (recvmmsg, one recv per datagram) it prints the median over
``--repeat`` fills of ns per datagram and per line; then, per roll of the whole batch, the
receive thread's wall time with the segments built and written inline (the old loop) and
handed to the writer thread (``SegmentQueue``), what ``detach`` costs (the combiner's partials
handed over: on the receive thread), what ``build`` costs (the Arrow batch and the pane
sketches: on the writer thread unless inline) and what the hand-over costs (inline: build +
Arrow IPC write + fsync + rename; thread: a queue put). Last, ``recvmmsg alone``: the same fills
drained by ``recvmmsg`` with nothing done with the data, the kernel's share of a datagram
(the floor under every other row). A script, not a test.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from streamgauge.clock import SystemClock
from streamgauge.ingest.combiner import PaneCombiner, PaneDrain
from streamgauge.ingest.guard import CardinalityLimits
from streamgauge.ingest.log import SegmentQueue, SegmentWriter
from streamgauge.ingest.receiver import Receiver
from streamgauge.ingest.transports import DATAGRAM_SLOTS, DatagramReader, bind_udp

TYPES = ("c", "ms", "g", "d")


def datagrams(series: int, per: int) -> list[bytes]:
    """The load generator's lines (bench/ingest/sender.c), ``per`` to a datagram."""
    lines = [
        b"bench.m%d:%d|%s|#host:h%d" % (i % 100, i % 97, TYPES[i % 4].encode(), i // 100)
        for i in range(series)
    ]
    return [b"\n".join(lines[i : i + per]) for i in range(0, series, per)]


def fill(sock: socket.socket, payloads: list[bytes], count: int) -> None:
    target = sock.getsockname()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        for index in range(count):
            sender.sendto(payloads[index % len(payloads)], target)


def measure(args: argparse.Namespace, per: int, recvmmsg: bool, queued: bool) -> dict[str, Any]:
    spool = Path(tempfile.mkdtemp(prefix="sg-cpu-"))
    sock = bind_udp("127.0.0.1", 0, 64 << 20)
    queue = SegmentQueue(SegmentWriter(spool, "udp-0"), depth=4 if queued else 0)
    append = queue.append
    appended: list[float] = []

    def timed_append(*arguments: Any) -> None:
        started = time.perf_counter()
        append(*arguments)
        appended.append(time.perf_counter() - started)

    queue.append = timed_append  # type: ignore[method-assign,assignment]
    receiver = Receiver(
        sock, queue, PaneCombiner(1000),
        SystemClock(), cardinality=CardinalityLimits(max_series=0, max_series_per_metric=0),
        recvmmsg=recvmmsg,
    )  # fmt: skip
    combiner: Any = receiver._combiner  # noqa: SLF001 - timing detach needs the instance
    detach = combiner.detach
    detached: list[float] = []

    def timed_detach() -> Any:
        started = time.perf_counter()
        drained = detach()
        detached.append(time.perf_counter() - started)
        return drained

    combiner.detach = timed_detach
    built: list[float] = []
    build = PaneDrain.build

    def timed_build(self: PaneDrain) -> Any:  # on whichever thread builds it
        started = time.perf_counter()
        batch = build(self)
        built.append(time.perf_counter() - started)
        return batch

    PaneDrain.build = timed_build  # type: ignore[method-assign]
    payloads = datagrams(args.series, per)
    fill(sock, datagrams(args.series, 1), args.series)  # warm-up: every series known
    while receiver.receive_available():
        pass
    receiver.roll(receiver.now_ms())
    count = 60_000 if per == 1 else 8_000
    cpu, rolls, roll_cpu, with_roll = [], [], [], []
    for _ in range(args.repeat):
        fill(sock, payloads, count)
        before, received = time.thread_time(), receiver.stats.datagrams
        while receiver.receive_available():
            pass
        taken = time.thread_time() - before
        datagram_count = receiver.stats.datagrams - received
        cpu.append(taken / datagram_count)
        started, started_cpu = time.perf_counter(), time.thread_time()
        receiver.roll(receiver.now_ms() + 1000)  # heartbeat due: always a segment
        rolls.append(time.perf_counter() - started)
        roll_cpu.append(time.thread_time() - started_cpu)
        with_roll.append((taken + roll_cpu[-1]) / datagram_count)
    receiver.close()
    sock.close()
    PaneDrain.build = build  # type: ignore[method-assign]
    return {
        "ns_per_datagram": statistics.median(cpu) * 1e9,
        "ns_per_line": statistics.median(cpu) * 1e9 / per,
        "syscalls_per_datagram": receiver.stats.syscalls / receiver.stats.datagrams,
        "ns_per_line_roll": statistics.median(with_roll) * 1e9 / per,
        "roll_ms": statistics.median(rolls) * 1e3,
        "roll_cpu_ms": statistics.median(roll_cpu) * 1e3,
        "detach_ms": statistics.median(detached[1:]) * 1e3,
        "build_ms": statistics.median(built[1:]) * 1e3,
        "append_ms": statistics.median(appended[1:-1]) * 1e3,
    }


def kernel_floor(args: argparse.Namespace, per: int) -> float:
    """ns of thread CPU per datagram for ``recvmmsg`` alone (256 per call, through ctypes,
    nothing done with the data): what the kernel charges the receive thread before any
    parsing, the floor under every row above."""
    sock = bind_udp("127.0.0.1", 0, 64 << 20)
    reader = DatagramReader()
    payloads = datagrams(args.series, per)
    count = 60_000 if per == 1 else 8_000
    samples = []
    for _ in range(args.repeat):
        fill(sock, payloads, count)
        before, received = time.thread_time(), 0
        while batch := reader.read(sock, DATAGRAM_SLOTS):
            received += len(batch)
        samples.append((time.thread_time() - before) / received)
    sock.close()
    return statistics.median(samples) * 1e9


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--series", type=int, default=10_000)
    args = parser.parse_args()
    print(f"medians of {args.repeat}; receive thread CPU per datagram/line (+roll: with the "
          "roll's receive-thread CPU spread over the lines); wall time per roll of the receive "
          "thread (its CPU), of detach (receive thread), of build (writer thread unless inline), "
          "and of handing the segment over (append)")
    print("lines/dgram  reader    segments  ns/dgram  ns/line  ns/line+roll  syscalls/dgram  "
          "roll_ms  roll_cpu_ms  detach_ms  build_ms  append_ms")
    for per in (20, 1):
        for recvmmsg, queued in ((False, False), (True, False), (True, True)):
            m = measure(args, per, recvmmsg, queued)
            print(f"{per:>11}  {'recvmmsg' if recvmmsg else 'recv':<8}  "
                  f"{'thread' if queued else 'inline':<8}  {m['ns_per_datagram']:>8.0f}  "
                  f"{m['ns_per_line']:>7.0f}  {m['ns_per_line_roll']:>12.0f}  "
                  f"{m['syscalls_per_datagram']:>14.3f}  {m['roll_ms']:>7.1f}  "
                  f"{m['roll_cpu_ms']:>11.1f}  {m['detach_ms']:>9.2f}  {m['build_ms']:>8.1f}  "
                  f"{m['append_ms']:>9.2f}",
                  flush=True)
    for per in (20, 1):
        floor = kernel_floor(args, per)
        print(f"{per:>11}  recvmmsg  alone     {floor:>8.0f}  {floor / per:>7.0f}  "
              "(the kernel's share: recvmmsg with nothing done with the datagrams)", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
