"""How long a full garbage collection stops a receiver, before and after start-up's objects are
frozen (``process.freeze_startup_objects``).

    python bench/ingest/gc_pause.py [--repeat 7]

Builds what a receiver process holds after start-up (numba's compiled fast path, loaded from
its cache or compiled, and a combiner), then times ``gc.collect()`` (a full collection: what
the interpreter runs when enough long-lived objects have accumulated) ``--repeat`` times,
freezes, and times it again. The receive thread is stopped for that long while the kernel's
socket buffer fills. A script, not a test.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.fastpath import FastPath
from streamgauge.ingest.process import freeze_startup_objects


def full_collections(repeat: int) -> list[float]:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        gc.collect()
        times.append(time.perf_counter() - started)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    fast = FastPath(PaneCombiner(1000), 4096, 60_000)
    fast.split(b"bench.warm:1|c\n", 1_700_000_000_000)
    tracked = len(gc.get_objects())
    before = full_collections(args.repeat)
    frozen = freeze_startup_objects()
    after = full_collections(args.repeat)
    print(f"receiver after start-up: {tracked} objects tracked")
    before_ms, after_ms = (1000 * statistics.median(t) for t in (before, after))
    print(f"full collection, median of {args.repeat}: {before_ms:.1f} ms before freezing, "
          f"{after_ms:.2f} ms after ({frozen} frozen)")  # fmt: skip


if __name__ == "__main__":
    main()
