"""Sketch costs at default parameters: build/merge cost per sample and per pane, bytes per series.

    python bench/sketches.py                 # the cost table (medians over --repeats runs)
    python bench/sketches.py --tdigest-table # re-measure the k -> rank-error table in accuracy.py

Not a test: numbers depend on the machine. A "pane" is one series' partial for one pane
(``--pane-samples`` samples); a "window" merges ``--panes`` of them, as the Spark job will.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from streamgauge.sketches import hdr, hll, tdigest
from streamgauge.sketches.accuracy import compile_accuracy


def _median_seconds(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cost_table(pane_samples: int, panes: int, repeats: int, seed: int) -> list[tuple[str, ...]]:
    rng = np.random.default_rng(seed)
    params = compile_accuracy()
    latencies = [rng.lognormal(3.0, 1.0, pane_samples) for _ in range(panes)]
    members = [rng.integers(0, 5 * pane_samples, pane_samples) for _ in range(panes)]
    layout = hdr.HdrLayout.from_params(params)
    rows: list[tuple[str, ...]] = []

    def row(
        name: str,
        build: Callable[[], list[Any]],
        merge: Callable[[list[Any]], Any],
        size: Callable[[Any], int],
    ) -> None:
        built: list[Any] = []

        def do_build() -> None:
            built[:] = build()

        t_build = _median_seconds(do_build, repeats)
        t_merge = _median_seconds(lambda: merge(built), repeats)
        merged = merge(built)
        pane_bytes = statistics.median(size(b) for b in built)
        rows.append(
            (
                name,
                f"{t_build / (panes * pane_samples) * 1e9:.0f}",
                f"{t_build / panes * 1e6:.0f}",
                f"{t_merge / panes * 1e6:.1f}",
                f"{pane_bytes:.0f}",
                f"{size(merged):.0f}",
            )
        )

    row(
        f"HLL_8 lgK {params.hll_lg_k} (ints)",
        lambda: [hll.serialize_hll(hll.build_hll(m, params.hll_lg_k)) for m in members],
        lambda blobs: hll.serialize_hll(hll.union_hll(blobs, params.hll_lg_k)),
        len,
    )
    row(
        f"t-digest k {params.tdigest_k}",
        lambda: [
            tdigest.serialize_tdigest(tdigest.build_tdigest(x, params.tdigest_k)) for x in latencies
        ],
        lambda blobs: tdigest.serialize_tdigest(tdigest.merge_tdigests(blobs, params.tdigest_k)),
        lambda b: len(b),
    )

    def hdr_build() -> list[Any]:
        return [layout.histogram(x) for x in latencies]

    def hdr_merge(parts: list[Any]) -> Any:
        idx = np.concatenate([p.indices for p in parts])
        cnt = np.concatenate([p.counts for p in parts])
        return hdr.merge(idx, cnt)

    def hdr_size(part: Any) -> int:
        # As rows: (bucket index int32, count int64) per non-empty bucket.
        return 12 * len(part[0])

    row(f"HDR {params.hdr_significant_digits} digits (rows)", hdr_build, hdr_merge, hdr_size)
    row(
        f"HDR {params.hdr_significant_digits} digits (encoded)",
        lambda: [layout.encode(*layout.histogram(x)[:2]) for x in latencies],
        lambda blobs: layout.encode(
            *hdr.merge(
                np.concatenate([layout.decode(b)[0] for b in blobs]),
                np.concatenate([layout.decode(b)[1] for b in blobs]),
            )
        ),
        lambda b: len(b),
    )
    return rows


def tdigest_table(
    ks: list[int], n: int, seeds: int
) -> list[tuple[int, float, float, float, float]]:
    """Max rank error of :func:`tdigest.quantiles`, per k, over the test distributions.

    Mid-range = q in 0.50..0.90 step 0.01: worst over uniform, lognormal, sorted lognormal and
    overlapping bimodal ("smooth"), and separately over the gapped bimodal; tails over all. Each
    distribution as one digest and as 60 merged pane digests.
    """
    mid = np.round(np.arange(0.50, 0.9001, 0.01), 2)
    out = []
    for k in ks:
        worst_mid = worst_gap = worst_99 = worst_999 = 0.0
        for seed in range(seeds):
            for name, data in _distributions(np.random.default_rng(seed), n).items():
                ordered = np.sort(data)
                one = tdigest.build_tdigest(data, k)
                panes = [
                    tdigest.serialize_tdigest(tdigest.build_tdigest(p, k))
                    for p in np.array_split(data, 60)
                ]
                merged = tdigest.merge_tdigests(panes, k)
                for digest in (one, merged):
                    err = rank_errors(ordered, tdigest.quantiles(digest, mid), mid)
                    tails = rank_errors(
                        ordered, tdigest.quantiles(digest, [0.99, 0.999]), np.array([0.99, 0.999])
                    )
                    if name == "bimodal_gap":
                        worst_gap = max(worst_gap, float(err.max()))
                    else:
                        worst_mid = max(worst_mid, float(err.max()))
                    worst_99 = max(worst_99, float(tails[0]))
                    worst_999 = max(worst_999, float(tails[1]))
        out.append((k, worst_mid, worst_gap, worst_99, worst_999))
    return out


def rank_errors(ordered: np.ndarray, estimates: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Distance from each q to the interval of true normalized ranks its estimate occupies."""
    n = len(ordered)
    below = np.searchsorted(ordered, estimates, side="left") / n
    at_or_below = np.searchsorted(ordered, estimates, side="right") / n
    errors: np.ndarray = np.maximum(0.0, np.maximum(below - qs, qs - at_or_below))
    return errors


def _distributions(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    lognormal = rng.lognormal(3.0, 1.0, n)
    fast = rng.lognormal(np.log(2.0), 0.4, n * 7 // 10)
    slow = rng.lognormal(np.log(40.0), 0.5, n - n * 7 // 10)
    gap = np.concatenate([rng.normal(10.0, 1.0, n // 2), rng.normal(100.0, 5.0, n - n // 2)])
    return {
        "uniform": rng.uniform(0.0, 100.0, n),
        "lognormal": lognormal,
        "sorted": np.sort(lognormal),
        "bimodal": rng.permutation(np.concatenate([fast, slow])),
        "bimodal_gap": rng.permutation(gap),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pane-samples", type=int, default=10_000)
    parser.add_argument("--panes", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tdigest-table", action="store_true")
    parser.add_argument("--n", type=int, default=200_000, help="samples per distribution (table)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds per distribution (table)")
    args = parser.parse_args()
    if args.tdigest_table:
        print(f"{'k':>6} {'mid smooth':>11} {'mid gap':>9} {'q=0.99':>9} {'q=0.999':>9}")
        for k in (50, 100, 200, 300, 400, 600, 1000, 1500, 2000, 3000):
            for _, m, g, a, b in tdigest_table([k], args.n, args.seeds):
                print(f"{k:>6} {m:>11.4f} {g:>9.4f} {a:>9.5f} {b:>9.5f}", flush=True)
        return
    print(
        f"{args.panes} panes x {args.pane_samples} samples per series, median of "
        f"{args.repeats} runs"
    )
    header = (
        "sketch",
        "build ns/sample",
        "build µs/pane",
        "merge µs/pane",
        "bytes/pane",
        "bytes/window",
    )
    rows = cost_table(args.pane_samples, args.panes, args.repeats, args.seed)
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        print(
            "  ".join(
                c.rjust(w) if i else c.ljust(w)
                for i, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )


if __name__ == "__main__":
    main()
