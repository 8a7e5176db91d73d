"""A segment's pane partials built from N series (the receiver's segment writer's work), two
versions of the code alternated.

    .venv/bin/python bench/pane_build.py --series 100000 --before /tmp/sg-base
    .venv/bin/python bench/pane_build.py --series 10000 --values 10 --types ms
    .venv/bin/python bench/pane_build.py --series 100000 --values 10 --types ms:1 --kll-k 200

A ``PaneCombiner`` is given, per segment, one pane of ``--series`` series whose types follow
``--types`` (default the mix of issue #35: c 40 %, ms 40 %, g 10 %, s 10 %), each with
``--values`` values. The first segment makes every series through the general lane
(``add``); later ones take the numeric series' values through the fast lane
(``add_fast``, the series known), sets' members through ``add``, as the receive loop does
once the series are known. Timed:
``drain()``, which builds the segment's rows and their sketch columns (t-digests, HDR
buckets, set HLLs; with ``--kll-k`` also the timers' KLL sketches, as for a config with a
``quantiles: kll`` window); per version, the median over ``--segments`` segments after the first
(numba's cache), and the load average before and after. At 100k lines/s over 100k series
every series has one value a pane: the segment writer's work per second is this drain.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from versions import THIS_CHECKOUT, alternated, load_average, run_in

PANE_MS = 1000


def _drains(series: int, values: int, types: str, segments: int, kll_k: int | None
            ) -> list[float]:  # fmt: skip
    """In this process's version: the seconds of each segment's ``drain()``."""
    import numpy as np

    from streamgauge.ingest.combiner import PaneCombiner
    from streamgauge.ingest.protocol import Sample

    shares = [(t, int(p)) for t, p in (part.split(":") for part in types.split(","))]
    kinds = np.repeat([t for t, _ in shares], [p for _, p in shares])
    rng = np.random.default_rng(5)
    combiner = PaneCombiner(PANE_MS, kll_k=kll_k)
    timed = []
    slots = np.zeros(series, np.int64)
    numeric = np.array([str(kinds[i % len(kinds)]) != "s" for i in range(series)])
    for segment in range(segments + 1):
        pane = segment * PANE_MS
        for i in range(series):  # the first segment makes every series; then sets only
            if segment and numeric[i]:
                continue
            kind = str(kinds[i % len(kinds)])
            tags = (("host", f"h{i // 100}"),)
            if kind == "s":
                sample = Sample(f"bench.m{i % 100}", kind, 1.0, 1.0, tags, member=f"u{i}")
            else:
                sample = Sample(f"bench.m{i % 100}", kind, float(rng.lognormal(3, 1)), 1.0, tags)
            slots[i] = combiner.add(sample, pane + 5, pane + 5)
        known = slots[numeric]
        repeated = np.repeat(known, values - 1 if segment == 0 else values)
        if len(repeated):
            combiner.add_fast(repeated, rng.lognormal(3, 1, len(repeated)), pane + 6)
        began = time.perf_counter()
        combiner.drain()
        timed.append(time.perf_counter() - began)
    return timed[1:]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--values", type=int, default=1, help="values per series and pane")
    parser.add_argument("--types", default="c:40,ms:40,g:10,s:10")
    parser.add_argument("--segments", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kll-k", type=int, help="also build KLL sketches of this k")
    parser.add_argument("--before", help="checkout of the version to compare with")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_drains(args.series, args.values, args.types, args.segments,
                                 args.kll_k)))  # fmt: skip
        return
    versions = {"this code": THIS_CHECKOUT}
    if args.before is not None:
        from pathlib import Path

        versions = {"before": Path(args.before).resolve(), **versions}
    load_before = load_average()
    timed: dict[str, list[float]] = {name: [] for name in versions}
    for _, name in alternated(list(versions), args.rounds):
        timed[name] += run_in(versions[name], __file__, "--child", "--series", str(args.series),
                              "--values", str(args.values), "--types", args.types,
                              "--segments", str(args.segments),
                              *(["--kll-k", str(args.kll_k)] if args.kll_k else []))  # fmt: skip
    kll = f", KLL k={args.kll_k}" if args.kll_k else ""
    print(f"pane build: {args.series} series of {args.types}{kll}, {args.values} value(s) each, "
          f"{args.segments} segments x {args.rounds} alternated rounds; load average "
          f"{load_before} before, {load_average()} after")  # fmt: skip
    for name, drains in timed.items():
        print(f"{name:10} drain median {statistics.median(drains):.3f} s  "
              f"(min {min(drains):.3f}, max {max(drains):.3f}, {len(drains)} segments)")


if __name__ == "__main__":
    main()
