"""Column sketch kernels (``streamgauge.sketches.digest_columns`` / ``hdr_columns`` /
``hdr_encoding``): the window job's publish and per-batch steps, before/after and per thread
count, and merges beside the per-series path (``window_sketches.merge_digest`` / ``merge_hdr``,
one Python call per series).

    python bench/sketch_columns.py                        # 100k windows
    python bench/sketch_columns.py --baseline /tmp/sketch_baseline --threads 1,2
    python bench/sketch_columns.py --series 20000 --no-jit --no-throughput

**Publish and batch** (the freshness budget): ``--series`` windows of ``--values`` lognormal
values (every value its own centroid below ~160 values at k=200; ~90 HDR buckets at 100):

- publish: p50/p90/p99/p999 (``quantiles``), the serialized digests (``to_serialized``), the
  HDR V2 text (``encode_v2``, compressed and stored blocks);
- batch: one pane partial of ``--values // 10`` values merged into each window of
  ``--values - --values // 10`` (``merge_into``, digests and HDR).

Each step is timed with the modules of ``--baseline DIR`` (copies of ``digest_columns.py``,
``hdr_columns.py``, ``hdr_encoding.py`` from before a change: "before") and with the current
ones at each of ``--threads`` (``kernels.set_threads``), all in this process on the same
inputs, and checked to give the same results (HDR text: the same payloads; the compressor may
differ). Figures are medians of ``--repeats`` runs, wall and CPU seconds (CPU: all threads;
on a shared machine wall time depends on the load, printed before and after; CPU time less).

**Throughput** (``--no-throughput`` skips it): ``--series`` windows x ``--partials`` pane
partials of ``--values // 10`` values, decoded and merged (cold: new windows, ``merge_by_owner``;
warm: windows already holding a 20k-value digest, ~235 centroids, ``merge_into``), HDR rows
merged, and ``--hll-series`` HLL set windows unioned with their estimates
(``hll_unions.union_images``), beside the per-series path timed on ``--baseline-series``
series.

``--jit`` (default on) times numba's compile: a first call of every kernel (on all rows and
on chunks) in a fresh process with an empty cache directory, and the same in a second process
that finds the cache.
"""

from __future__ import annotations

import argparse
import base64
import importlib.util
import os
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasketches import tdigest_double

from streamgauge.sketches import digest_columns as dc
from streamgauge.sketches import hdr_columns as hc
from streamgauge.sketches import hdr_encoding as he
from streamgauge.sketches import kernels
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hll import build_hll, serialize_hll
from streamgauge.sketches.hll_unions import union_images
from streamgauge.windows.window_sketches import (
    QUANTILES,
    distinct_count,
    merge_digest,
    merge_hdr,
    merge_hll,
)

_JIT_PROBE = """
import time
start = time.perf_counter()
import numpy as np, pyarrow as pa
from datasketches import tdigest_double
from streamgauge.sketches import digest_columns as dc, hdr_columns as hc, kernels
from streamgauge.sketches import kernels
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hdr_encoding import encode_v2
from streamgauge.sketches.hll import build_hll, serialize_hll
from streamgauge.sketches.hll_unions import union_images
imported = time.perf_counter()
layout = HdrLayout.from_params(compile_accuracy())
d = tdigest_double(200); d.update(np.arange(50.0))
cols = dc.from_serialized(pa.array([bytes(d.serialize())] * 4))
h = hc.from_lists(pa.array([[1, 2]] * 4, pa.list_(pa.int32())),
                  pa.array([[1, 1]] * 4, pa.list_(pa.int64())))
for chunks in (None, 2):  # one call over all rows, then chunks
    kernels.FORCE_CHUNKS = chunks
    merged = dc.merge_by_owner(cols, np.zeros(4, np.int64), 2)
    dc.quantiles(merged, [0.5]); dc.to_serialized(merged); dc.merge_into(merged, cols, [0] * 4)
    hm = hc.merge_by_owner(h, [0, 0, 1, 1], 2); hc.merge_into(hm, h, [0, 1, 0, 1])
    encode_v2(layout, hm.offsets, hm.buckets, hm.counts)
hc.quantiles(layout, hm, [0.5]); hm.totals
union_images(pa.array([serialize_hll(build_hll([1, 2], 12))]), [0], 1, 12)
print(f"{imported - start:.2f} {time.perf_counter() - imported:.2f}")
"""


def _timed(fn: Callable[[], Any], repeats: int) -> tuple[float, float, Any]:
    """Median wall and CPU seconds of ``repeats`` calls (after one untimed call) and a
    result."""
    result = fn()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        result = fn()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus), result


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def _module(name: str, path: Path) -> ModuleType:
    """``path`` imported as module ``name`` (numba caches its kernels beside it, by name)."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _digests(values: np.ndarray) -> dc.DigestColumns:
    """Digests of each row of ``values`` as datasketches writes them for so few values (every
    value its own unit centroid, sorted; reverse-merge flag set by serialize's compress),
    built vectorized; checked against datasketches below."""
    rows, per_row = values.shape
    ordered = np.sort(values, axis=1)
    return dc.DigestColumns(
        np.arange(rows + 1, dtype=np.int64) * per_row, ordered.ravel(),
        np.ones(rows * per_row), ordered[:, 0].copy(), ordered[:, -1].copy(),
        np.ones(rows, np.bool_),
    )  # fmt: skip


def _hdr(layout: HdrLayout, values: np.ndarray) -> hc.HdrColumns:
    """HDR rows (sorted unique buckets) of each row of ``values``, built vectorized."""
    rows, per_row = values.shape
    idx = layout.bucket_indices(values.ravel())
    key = np.repeat(np.arange(rows, dtype=np.int64), per_row) * layout.counts_len + idx
    unique, counts = np.unique(key, return_counts=True)
    offsets = np.zeros(rows + 1, np.int64)
    np.cumsum(np.bincount(unique // layout.counts_len, minlength=rows), out=offsets[1:])
    return hc.HdrColumns(offsets, (unique % layout.counts_len).astype(np.int32),
                         counts.astype(np.int64))  # fmt: skip


def _jit_times() -> list[str]:
    lines = []
    with tempfile.TemporaryDirectory(prefix="numba-cache-") as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        for label in ("first process (empty cache)", "second process (cache=True)"):
            out = subprocess.run([sys.executable, "-c", _JIT_PROBE], env=env, check=True,
                                 capture_output=True, text=True).stdout.split()  # fmt: skip
            lines.append(f"  {label:30s} imports {out[0]} s, first calls {out[1]} s")
    return lines


def _same_text(a: pa.Array, b: pa.Array) -> bool:
    """Whether two ``encode_v2`` outputs hold the same histograms (the same payloads)."""
    if a.null_count != b.null_count or len(a) != len(b):
        return False
    step = max(1, len(a) // 2000)
    for x, y in zip(a.to_pylist()[::step], b.to_pylist()[::step], strict=True):
        if (x is None) != (y is None):
            return False
        if x is not None and zlib.decompress(base64.b64decode(x)[8:]) != zlib.decompress(
            base64.b64decode(y)[8:]
        ):
            return False
    return True


def _same_columns(a: Any, b: Any, names: tuple[str, ...]) -> bool:
    return all(np.array_equal(getattr(a, n), getattr(b, n), equal_nan=True) for n in names)


_DIGEST_FIELDS = ("offsets", "means", "weights", "mins", "maxs", "reverse_merge")
_HDR_FIELDS = ("offsets", "buckets", "counts")


def publish_and_batch(args: argparse.Namespace, threads: list[int]) -> None:
    n, v = args.series, args.values
    new = max(1, v // 10)
    rng = np.random.default_rng(args.seed)
    layout = HdrLayout.from_params(compile_accuracy())
    window_values = rng.lognormal(3.0, 1.0, (n, v))
    windows = _digests(window_values)
    for row in range(min(50, n)):  # the vectorized digests are datasketches' own
        digest = tdigest_double(200)
        digest.update(window_values[row])
        assert bytes(digest.serialize()) == dc.to_serialized(dc.take(windows, [row]))[0].as_py()
    hdr = _hdr(layout, window_values)
    held = _digests(window_values[:, new:])  # what the window held before the last batch
    partials = _digests(window_values[:, :new])
    held_hdr = _hdr(layout, window_values[:, new:])
    partial_hdr = _hdr(layout, window_values[:, :new])
    owner = np.arange(n, dtype=np.int64)

    baseline = None
    if args.baseline:
        where = Path(args.baseline)
        baseline = {
            "dc": _module("baseline_digest_columns", where / "digest_columns.py"),
            "hc": _module("baseline_hdr_columns", where / "hdr_columns.py"),
            "he": _module("baseline_hdr_encoding", where / "hdr_encoding.py"),
        }

    def steps(m: dict[str, Any]) -> list[tuple[str, str, Callable[[], Any]]]:
        return [
            ("publish", "quantiles x4", lambda: m["dc"].quantiles(windows, QUANTILES)),
            ("publish", "serialize digests", lambda: m["dc"].to_serialized(windows)),
            ("publish", "encode_v2 (compressed)",
             lambda: m["he"].encode_v2(layout, hdr.offsets, hdr.buckets, hdr.counts)),
            ("publish", "encode_v2 (stored)",
             lambda: m["he"].encode_v2(layout, hdr.offsets, hdr.buckets, hdr.counts,
                                       compress=False)),
            ("batch", "digest merge_into", lambda: m["dc"].merge_into(held, partials, owner)),
            ("batch", "HDR merge_into", lambda: m["hc"].merge_into(held_hdr, partial_hdr, owner)),
        ]  # fmt: skip

    current = {"dc": dc, "hc": hc, "he": he}
    columns: list[tuple[str, dict[str, Any], int]] = []
    if baseline:
        columns.append(("before", baseline, 1))
    columns += [(f"after, {t} thr", current, t) for t in threads]
    print(f"\npublish and batch: {n:,} windows of {v} values ({windows.sizes.mean():.0f} "
          f"centroids, {np.diff(hdr.offsets).mean():.0f} HDR buckets); batch: {new} new values "
          f"per window into {v - new}; medians of {args.repeats}, seconds wall / CPU")  # fmt: skip
    header = f"  {'step':30s}" + "".join(f"{label:>20s}" for label, _, _ in columns)
    print(header)
    results: dict[str, list[tuple[float, float]]] = {}
    outputs: dict[str, list[Any]] = {}
    before = kernels.threads()
    try:
        for _, modules, count in columns:
            kernels.set_threads(count)
            for _, name, fn in steps(modules):
                wall, cpu, out = _timed(fn, args.repeats)
                results.setdefault(name, []).append((wall, cpu))
                outputs.setdefault(name, []).append(out)
    finally:
        kernels.set_threads(before)
    kinds = {name: kind for kind, name, _ in steps(current)}
    for name, timings in results.items():
        print(f"  {name:30s}" + "".join(f"{w:10.3f} /{c:7.3f}  " for w, c in timings))
    for kind, label in (("publish", "publish total (compressed)"), ("batch", "batch total")):
        names = [n for n, k in kinds.items() if k == kind and n != "encode_v2 (stored)"]
        sums = [(sum(results[n][i][0] for n in names), sum(results[n][i][1] for n in names))
                for i in range(len(columns))]  # fmt: skip
        print(f"  {label:30s}" + "".join(f"{w:10.3f} /{c:7.3f}  " for w, c in sums))
    # the same results everywhere (HDR text: the same payloads)
    for name, outs in outputs.items():
        first = outs[0]
        for out in outs[1:]:
            if name.startswith("encode_v2"):
                same = _same_text(first, out)
            elif name == "quantiles x4":
                same = np.array_equal(first, out, equal_nan=True)
            elif name == "serialize digests":
                same = first.equals(out)
            elif name == "digest merge_into":
                same = _same_columns(first, out, _DIGEST_FIELDS)
            else:
                same = _same_columns(first, out, _HDR_FIELDS)
            assert same, f"{name}: results differ between columns"
    sizes = {name: [pc.sum(pc.binary_length(o)).as_py() / n for o in outs]
             for name, outs in outputs.items() if "encode" in name}  # fmt: skip
    print("  (every column gave the same results; mean HDR text per window, first column / "
          "last: " + ", ".join(f"{k.split()[1]} {b[0]:.1f} / {b[-1]:.1f} B"
                               for k, b in sizes.items()) + ")")  # fmt: skip


def throughput(args: argparse.Namespace) -> None:
    n, p, reps = args.series, args.partials, args.repeats
    v = max(1, args.values // 10)
    rng = np.random.default_rng(args.seed + 1)
    layout = HdrLayout.from_params(compile_accuracy())
    values = rng.lognormal(3.0, 1.0, (n * p, v))
    pane_blobs = dc.to_serialized(_digests(values))
    owner = np.repeat(np.arange(n, dtype=np.int64), p)  # a window's partials, in pane order
    pool = []
    for _ in range(64):
        digest = tdigest_double(200)
        digest.update(rng.lognormal(3.0, 1.0, 20_000))
        pool.append(bytes(digest.serialize()))
    running = dc.take(dc.from_serialized(pa.array(pool)), rng.integers(0, 64, n))
    hdr_buckets, hdr_counts = hc.to_lists(_hdr(layout, values))
    partials = n * p
    m = args.baseline_series
    print(f"\nthroughput: {n:,} windows x {p} partials x {v} values ({partials:,} partials); "
          f"per-series path on {m:,} windows; {kernels.threads()} threads; "
          f"medians of {reps}")  # fmt: skip
    rows: list[tuple[str, float, float]] = []  # name, engine partials/s, per-series partials/s

    t_decode, _, panes = _timed(lambda: dc.from_serialized(pane_blobs), reps)
    t_merge, _, merged = _timed(lambda: dc.merge_by_owner(panes, owner, n), reps)
    blob_list = pane_blobs[: m * p].to_pylist()
    t_base, _, _ = _timed(lambda: [merge_digest(b"", blob_list[s * p : (s + 1) * p], 200)
                                   for s in range(m)], reps)  # fmt: skip
    print(f"  t-digest cold: decode {t_decode:.3f} s + merge {t_merge:.3f} s; "
          f"{merged.sizes.mean():.0f} centroids per window")
    rows.append(("t-digest cold (decode + merge)", partials / (t_decode + t_merge),
                 m * p / t_base))  # fmt: skip

    t_into, _, warm = _timed(lambda: dc.merge_into(running, panes, owner), reps)
    running_blobs = dc.to_serialized(dc.take(running, np.arange(m))).to_pylist()
    t_warm_base, _, _ = _timed(lambda: [merge_digest(running_blobs[s],
                                                     blob_list[s * p:(s + 1) * p], 200)
                                        for s in range(m)], reps)  # fmt: skip
    print(f"  t-digest warm: decode {t_decode:.3f} s + merge_into {t_into:.3f} s; "
          f"{warm.sizes.mean():.0f} centroids per window")
    rows.append(("t-digest warm (decode + merge)", partials / (t_decode + t_into),
                 m * p / t_warm_base))  # fmt: skip

    t_hdr, _, _ = _timed(lambda: hc.merge_by_owner(hc.from_lists(hdr_buckets, hdr_counts), owner,
                                                   n), reps)  # fmt: skip
    b_lists = [np.asarray(x) for x in hdr_buckets[: m * p].to_numpy(zero_copy_only=False)]
    c_lists = [np.asarray(x) for x in hdr_counts[: m * p].to_numpy(zero_copy_only=False)]
    empty_b, empty_c = np.zeros(0, np.int32), np.zeros(0, np.int64)
    t_hdr_base, _, _ = _timed(lambda: [merge_hdr(empty_b, empty_c, b_lists[s * p:(s + 1) * p],
                                                 c_lists[s * p:(s + 1) * p]) for s in range(m)],
                              reps)  # fmt: skip
    rows.append(("HDR (lists -> merged rows)", partials / t_hdr, m * p / t_hdr_base))

    lg_k = compile_accuracy().hll_lg_k
    n_sets = args.hll_series
    members = rng.integers(0, 2**40, (n_sets * p, v))
    images = pa.array([serialize_hll(build_hll(row, lg_k)) for row in members], pa.binary())
    set_owner = np.repeat(np.arange(n_sets, dtype=np.int64), p)
    t_hll, _, _ = _timed(lambda: union_images(images, set_owner, n_sets, lg_k), reps)
    m_sets = min(m, n_sets)
    image_list = images[: m_sets * p].to_pylist()
    t_hll_base, _, _ = _timed(lambda: [distinct_count(merge_hll(b"", image_list[s * p:(s + 1) * p],
                                                                lg_k)) for s in range(m_sets)],
                              reps)  # fmt: skip
    rows.append((f"HLL lgK {lg_k} ({n_sets:,} sets; + estimate)", n_sets * p / t_hll,
                 m_sets * p / t_hll_base))  # fmt: skip

    print(f"  {'partials merged per second':38s} {'columns':>12s} {'per series':>12s} {'x':>6s}")
    for name, ours, theirs in rows:
        print(f"  {name:38s} {ours:12,.0f} {theirs:12,.0f} {ours / theirs:6.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--values", type=int, default=100, help="per window (publish)")
    parser.add_argument("--partials", type=int, default=10, help="per window (throughput)")
    parser.add_argument("--baseline", help="directory of the modules before a change")
    parser.add_argument("--threads", default=None,
                        help="comma-separated thread counts (default: 1 and all)")
    parser.add_argument("--baseline-series", type=int, default=3_000)
    parser.add_argument("--hll-series", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-jit", dest="jit", action="store_false")
    parser.add_argument("--no-throughput", dest="throughput", action="store_false")
    args = parser.parse_args()
    most = kernels.threads()
    threads = ([int(t) for t in args.threads.split(",")] if args.threads
               else sorted({1, most}))  # fmt: skip
    print(f"load average before: {_load()}  (cores: {os.cpu_count()}, kernel threads: {most})")
    if args.jit:
        print("numba compile (digest, hdr, encoding and hll kernels, serial and threaded):")
        print("\n".join(_jit_times()))
    publish_and_batch(args, threads)
    if args.throughput:
        throughput(args)
    print(f"\nload average after: {_load()}")


if __name__ == "__main__":
    main()
