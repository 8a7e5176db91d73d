"""The register arrays the store writes beside N set windows' HLL images, two ways, in one run.

    .venv/bin/python bench/set_registers.py --series 100000

Every set window's row carries ``hll_registers``, its sketch's 2^lgK registers, which SQL
unions and estimates for any range (``sinks/store._with_hll_registers``). Timed on the same
images, alternated, medians of ``--repeats``: **compiled**, the store's one call per lgK
(``hll_columns.from_images``), and **per image**, ``hll_registers`` called once per window
(what the store did before), checked to give the same bytes. Images: DataSketches HLL_8 sets
of ``--distinct`` values each (one size per run; a few values stay in LIST or SET mode, a few
thousand reach HLL mode), at ``--lg-k``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import pyarrow as pa

from streamgauge.sinks.store import _with_hll_registers
from streamgauge.sketches.hll import build_hll, serialize_hll
from streamgauge.sketches.hll_registers import hll_registers


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--distinct", default="10,100,5000", help="values per set, per case")
    parser.add_argument("--lg-k", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    print(f"set registers: {args.series} set windows, lgK {args.lg_k}, medians of "
          f"{args.repeats}; load average {os.getloadavg()[0]:.2f} before")  # fmt: skip
    print(f"{'values per set':>15} {'image bytes':>12} {'compiled':>10} {'per image':>10}")
    for distinct in (int(d) for d in args.distinct.split(",")):
        images = [serialize_hll(build_hll(rng.integers(0, 2**62, distinct), args.lg_k))
                  for _ in range(64)]  # fmt: skip
        sketches = pa.array([images[i % 64] for i in range(args.series)], pa.binary())
        table = pa.table({"metric_type": pa.array(["s"] * args.series), "sketch": sketches})
        _with_hll_registers(table.slice(0, 10))  # numba's cache loaded
        timings: dict[str, list[float]] = {"compiled": [], "per image": []}
        for _ in range(args.repeats):
            began = time.perf_counter()
            compiled = _with_hll_registers(table).column("hll_registers")
            timings["compiled"].append(time.perf_counter() - began)
            began = time.perf_counter()
            each = [hll_registers(blob).tobytes() for blob in sketches.to_pylist()]
            timings["per image"].append(time.perf_counter() - began)
        assert compiled.to_pylist() == each
        size = statistics.median(len(image) for image in images)
        print(f"{distinct:>15} {size:>12.0f} "
              + " ".join(f"{statistics.median(t):>9.3f}s" for t in timings.values()))  # fmt: skip
    print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
