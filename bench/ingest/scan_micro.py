"""Per-line cost of the fast path's split (``FastPath.split``) and of its compiled pass
(``fastpath._scan``) alone, in-process, without sockets.

    PYTHONPATH=. python bench/ingest/scan_micro.py [--series 10000] [--repeat 15]

(``PYTHONPATH=.``: a script's own directory is what Python puts first on ``sys.path``; without
it ``streamgauge`` is whichever one the environment has installed. The first line printed is
the ``fastpath.py`` measured.)

A receiver (``Receiver``, a ``PaneCombiner``, a ``FastPath``) is built as the daemon builds
one, and every series goes through the general parser once (``_ingest_datagrams``): the fast
path only knows the keys the general parser accepted. Then ``--buffers`` wake-ups are built,
each ``--datagrams`` datagrams of ``--per`` random lines of those series joined as the receive
loop joins them, and timed: ``split`` over all of them, ``--repeat`` times, and the same for
``_scan`` called with the arrays ``split`` passes it, in this thread's CPU time (the machine's
other load preempts it less than it would the wall clock). Prints the median ns per line of each
(and the spread), and the fraction of lines the split sends down the fast path (sets never
take it: their value is a member, not a number; the fraction of the others is printed too).

The series: names like ``app.svc3.metric.1234``, 45 % timers (``ms``), 25 % counters (a fifth
of them ``|@0.5``), 25 % gauges, 5 % sets; two thirds with ``|#host:...`` tags. Values are
plain decimals (``42``, ``42.5``), never negative (a negative gauge is a delta: general path).

The machine is shared: compare two commits by alternating runs (A/B/A/B...), not by one each.
"""

from __future__ import annotations

import argparse
import inspect
import random
import socket
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np

from streamgauge.clock import ManualClock
from streamgauge.ingest import fastpath
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.guard import CardinalityLimits
from streamgauge.ingest.log import SegmentWriter
from streamgauge.ingest.receiver import Receiver

T0 = 1_700_000_000_000


class _Dispatcher(Protocol):
    """What a numba-compiled function (``numba.njit``) has besides being callable."""

    py_func: Callable[..., Any]  # the Python function it compiles


def series_keys(count: int, rng: random.Random) -> list[tuple[bytes, bytes]]:
    """(name, rest) per series: a line is ``name + b":" + value + rest``."""
    keys = []
    for i in range(count):
        name = b"app.svc%d.metric.%d" % (i % 7, i)
        draw = rng.random()
        if draw < 0.45:
            rest = b"|ms"
        elif draw < 0.70:
            rest = b"|c|@0.5" if rng.random() < 0.2 else b"|c"
        elif draw < 0.95:
            rest = b"|g"
        else:
            rest = b"|s"
        if rng.random() < 2 / 3:
            rest += b"|#host:h%d" % (i % 50) + (b",env:prod" if i % 3 == 0 else b"")
        keys.append((name, rest))
    return keys


def value(rng: random.Random) -> bytes:
    if rng.random() < 0.5:
        return b"%d" % rng.randrange(0, 5000)
    return b"%d.%d" % (rng.randrange(0, 1000), rng.randrange(0, 10))


def line(key: tuple[bytes, bytes], rng: random.Random) -> bytes:
    return key[0] + b":" + value(rng) + key[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--per", type=int, default=20, help="lines per datagram")
    parser.add_argument("--datagrams", type=int, default=256, help="datagrams per buffer")
    parser.add_argument("--buffers", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    keys = series_keys(args.series, rng)

    spool = Path(tempfile.mkdtemp(prefix="sg-scan-micro-"))
    clock = ManualClock(T0)
    limits = CardinalityLimits(max_series=0, max_series_per_metric=0)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        receiver = Receiver(
            sock, SegmentWriter(spool, "udp-0", fsync=False), PaneCombiner(1000), clock,
            cardinality=limits, proc_net=spool / "no-proc",
        )
        # Every series once through the general parser (it remembers the keys), 20 a datagram.
        warm = [line(key, rng) for key in keys]
        receiver._ingest_datagrams(
            [b"\n".join(warm[i : i + args.per]) for i in range(0, len(warm), args.per)],
            clock.now_ms(),
        )
        fast = receiver._fast
        assert fast is not None
        buffers = []
        for _ in range(args.buffers):
            datagrams = [
                b"\n".join(line(rng.choice(keys), rng) for _ in range(args.per))
                for _ in range(args.datagrams)
            ]
            buffers.append(b"\n".join([*datagrams, b""]))
        n_lines = sum(buffer.count(b"\n") for buffer in buffers)
        recv_ms = clock.now_ms()

        splits = [fast.split(buffer, recv_ms) for buffer in buffers]
        n_fast = sum(len(split.fast) for split in splits)
        n_sets = sum(buffer.count(b"|s") for buffer in buffers)

        def time_split() -> float:
            started = time.thread_time_ns()
            for buffer in buffers:
                fast.split(buffer, recv_ms)
            return (time.thread_time_ns() - started) / n_lines

        # _scan's arguments as split passes them, by parameter name: the same script measures
        # commits whose _scan takes other arrays.
        combiner = receiver._combiner
        state: dict[str, Any] = {
            "max_line_bytes": fast._max_line_bytes, "seen_after": recv_ms - fast._ttl_ms,
            **{name: getattr(combiner, name)
               for name in ("slot_type", "slot_gen", "admitted", "seen_ms")},
            **{name[1:]: value for name, value in vars(fast).items()
               if name.startswith(("_key_", "_table", "_shift"))},
        }  # fmt: skip
        scan = cast(_Dispatcher, fastpath._scan)  # numba's, typed as the function it compiles
        names = list(inspect.signature(scan.py_func).parameters)[2:]
        calls = [
            (np.frombuffer(buffer, dtype=np.uint8), buffer.count(b"\n"),
             *(state[name] for name in names))
            for buffer in buffers
        ]  # fmt: skip

        def time_scan() -> float:
            started = time.thread_time_ns()
            for call in calls:
                fastpath._scan(*call)
            return (time.thread_time_ns() - started) / n_lines

        split_ns, scan_ns = [], []
        for _ in range(args.repeat):
            split_ns.append(time_split())
            scan_ns.append(time_scan())
    print(fastpath.__file__)
    print(f"{args.series} series, {len(buffers)} buffers x {args.datagrams} datagrams x "
          f"{args.per} lines ({n_lines} lines, {len(fast)} keys), {args.repeat} repeats")
    print(f"fast-path fraction: {n_fast / n_lines:.4f} of all lines, "
          f"{n_fast / (n_lines - n_sets):.4f} of non-set lines")
    for label, samples in (("split", split_ns), ("_scan", scan_ns)):
        print(f"{label}: median {statistics.median(samples):.1f} ns/line "
              f"(min {min(samples):.1f}, max {max(samples):.1f})")


if __name__ == "__main__":
    main()
