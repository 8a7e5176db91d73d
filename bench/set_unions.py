"""A close's set windows made of their panes' HLL images, two ways, in one run.

    .venv/bin/python bench/set_unions.py --series 100000

N set series, each with ``--panes`` pane images (DataSketches HLL_8, lgK 12, ``--members``
members a pane from 10,000, as ``bench/window_job.py`` writes them), are unioned per window,
and each union's distinct count taken. Timed on the same images, alternated, medians of
``--repeats``, from the panes' image columns (one per pane, as the job holds them) to every
window's image and count: **kernel**, ``hll_unions.union_rows`` (what
``window_rows.WindowBuilder.merged`` calls: the images read where they are, a compiled call
per chunk of windows, on one thread and on ``kernels.threads()``, the cores this process may
use), and **per window**, the columns concatenated and listed, then one
``window_sketches.merge_hll`` and one ``distinct_count`` a window (what it did before),
checked to give the same bytes and counts. ``same`` panes: a series' pane images are equal
(the job bench's writer repeats one segment), ``different``: drawn afresh.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import pyarrow as pa

from streamgauge.sketches import kernels
from streamgauge.sketches.hll import build_hll, serialize_hll
from streamgauge.sketches.hll_unions import ImageRows, union_images, union_rows
from streamgauge.windows.window_sketches import distinct_count, merge_hll


def _images(rng: np.random.Generator, n: int, members: int) -> list[bytes]:
    return [serialize_hll(build_hll([f"u{m}" for m in rng.integers(0, 10_000, members)], 12))
            for _ in range(n)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--panes", type=int, default=10)
    parser.add_argument("--members", default="3,20", help="members a pane, per case")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    print(f"set unions: {args.series} set windows of {args.panes} pane images (lgK 12), "
          f"medians of {args.repeats} alternated; load average {os.getloadavg()[0]:.2f} before")
    cores = kernels.threads()
    print(f"{'members a pane':>15} {'panes':>10} {'kernel, 1 thread':>17} "
          f"{f'{cores} threads':>10} {'per window':>11}")
    owner = np.tile(np.arange(args.series), args.panes)
    for members in (int(m) for m in args.members.split(",")):
        for panes in ("same", "different"):
            first = _images(rng, args.series, members)
            images = (first * args.panes if panes == "same"
                      else first + _images(rng, args.series * (args.panes - 1), members))
            series = np.arange(args.series, dtype=np.int64)
            panes_of = [pa.array(images[p * args.series:(p + 1) * args.series], pa.binary())
                        for p in range(args.panes)]  # fmt: skip
            union_images(panes_of[0].slice(0, 10), np.zeros(10, np.int64), 1, 12)  # the cache
            timings: dict[str, list[float]] = {"1 thread": [], "threads": [], "per window": []}
            for _ in range(args.repeats):
                for name, count in (("1 thread", 1), ("threads", cores)):
                    kernels.set_threads(count)
                    began = time.perf_counter()
                    unions = union_rows([ImageRows(pane, series, series) for pane in panes_of],
                                        args.series, 12)  # fmt: skip
                    counts = np.floor(unions.estimates + 0.5)
                    timings[name].append(time.perf_counter() - began)
                kernels.set_threads(cores)
                began = time.perf_counter()
                column = pa.concat_arrays(panes_of)
                by_window = column.take(pa.array(np.argsort(owner, kind="stable"))).to_pylist()
                each = [merge_hll(b"", by_window[g * args.panes:(g + 1) * args.panes], 12)
                        for g in range(args.series)]  # fmt: skip
                each_counts = [distinct_count(blob) for blob in each]
                timings["per window"].append(time.perf_counter() - began)
            assert unions.images.to_pylist() == each and counts.tolist() == each_counts
            print(f"{members:>15} {panes:>10} {statistics.median(timings['1 thread']):>16.3f}s "
                  f"{statistics.median(timings['threads']):>9.3f}s "
                  f"{statistics.median(timings['per window']):>10.3f}s")
    print(f"load average {os.getloadavg()[0]:.2f} after")


if __name__ == "__main__":
    main()
