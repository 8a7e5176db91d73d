"""Cost of the ``hdr_histogram`` column: :func:`encode_v2` against one encoder call per window.

    python bench/hdr_encoding.py                     # 100k windows, 100 and 32 values each
    python bench/hdr_encoding.py --rows 20000 --sample 1000

Windows are sparse HDR histograms at the default layout of ``--values`` lognormal(3, 1) ms
samples each (100 values fill ~92 buckets, 32 values ~31). Per data set it times, on all rows:
``encode_v2`` (fixed-Huffman deflate, the default) and ``encode_v2(compress=False)`` (stored
blocks); ``v2_payloads`` plus one ``zlib.compress`` and base64 per row in Python (what zlib
proper would cost); and ``HdrLayout.encode`` per row on the first ``--sample`` rows only
(~50 µs each), scaled to all rows — the table says so. Bytes are the mean base64 text per
window. The first ``encode_v2`` call in the process is timed apart (compilation, or loading
numba's cache). Not a test: numbers depend on the machine and its load, printed beside them.
"""

from __future__ import annotations

import argparse
import base64
import os
import struct
import time
import zlib
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa

from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hdr_encoding import COMPRESSION_COOKIE, encode_v2, v2_payloads


def windows(
    layout: HdrLayout, rows: int, values: int, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR columns (offsets, buckets, counts) of ``rows`` histograms of ``values`` samples."""
    rng = np.random.default_rng(seed)
    idx = layout.bucket_indices(rng.lognormal(3.0, 1.0, rows * values)).reshape(rows, values)
    keys, counts = np.unique(
        np.arange(rows, dtype=np.int64)[:, None] * layout.counts_len + idx, return_counts=True
    )
    offsets = np.searchsorted(keys // layout.counts_len, np.arange(rows + 1)).astype(np.int64)
    return offsets, keys % layout.counts_len, counts.astype(np.int64)


def zlib_per_row(layout: HdrLayout, offsets: Any, buckets: Any, counts: Any) -> pa.Array:
    """The same text with ``zlib.compress`` (level 6) per row: payloads built in one pass."""
    payload_offsets, data = v2_payloads(layout, offsets, buckets, counts)
    raw = data.tobytes()
    out: list[str | None] = []
    for i in range(len(payload_offsets) - 1):
        lo, hi = int(payload_offsets[i]), int(payload_offsets[i + 1])
        if hi == lo:
            out.append(None)
            continue
        packed = zlib.compress(raw[lo:hi])
        header = struct.pack(">II", COMPRESSION_COOKIE, len(packed))
        out.append(base64.b64encode(header + packed).decode("ascii"))
    return pa.array(out, pa.string())


def per_row(layout: HdrLayout, offsets: Any, buckets: Any, counts: Any) -> list[str]:
    return [
        layout.encode(buckets[offsets[i] : offsets[i + 1]], counts[offsets[i] : offsets[i + 1]])
        for i in range(len(offsets) - 1)
    ]


def timed(fn: Callable[[], Any]) -> tuple[tuple[float, float], Any]:
    """(wall, CPU) seconds of ``fn()`` and its result: on a shared machine CPU time is the
    steadier of the two."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return (time.perf_counter() - wall, time.process_time() - cpu), result


def mean_bytes(texts: Any) -> float:
    if isinstance(texts, pa.Array):
        texts = texts.to_pylist()
    return float(np.mean([len(t) for t in texts]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--values", type=int, nargs="+", default=[100, 32])
    parser.add_argument("--sample", type=int, default=2000, help="rows for HdrLayout.encode")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    layout = HdrLayout.from_params(compile_accuracy())
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    tiny = windows(layout, 3, 10, args.seed)
    first, _ = timed(lambda: encode_v2(layout, *tiny))
    first_stored, _ = timed(lambda: encode_v2(layout, *tiny, compress=False))
    print(f"first encode_v2 call (compile or cache load): {first[0]:.2f} s wall, "
          f"{first[1]:.2f} s CPU; compress=False after it: {first_stored[0]:.3f} s")  # fmt: skip
    print(f"{args.rows} windows, default layout {layout}")
    header = f"{'values':>6} {'buckets':>7}  {'encoder':<44} {'wall s':>7} {'CPU s':>7} "
    print(header + f"{'CPU µs/window':>13} {'bytes/window':>12}")
    for values in args.values:
        cols = windows(layout, args.rows, values, args.seed)
        buckets = len(cols[1]) / args.rows
        t_fixed, fixed = timed(partial(encode_v2, layout, *cols))
        t_stored, stored = timed(partial(encode_v2, layout, *cols, compress=False))
        t_zlib, zlibbed = timed(partial(zlib_per_row, layout, *cols))
        n = min(args.sample, args.rows)
        t_package, package = timed(partial(per_row, layout, cols[0][: n + 1], *cols[1:]))
        scaled = (t_package[0] * args.rows / n, t_package[1] * args.rows / n)
        if package != fixed.slice(0, n).to_pylist():
            decoded = [layout.decode(s) for s in fixed.slice(0, n).to_pylist()]
            theirs = [layout.decode(s) for s in package]
            assert all(
                np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
                for a, b in zip(decoded, theirs, strict=True)
            ), "encode_v2 and HdrLayout.encode decode differently"
        rows = [
            ("encode_v2 (fixed Huffman)", t_fixed, mean_bytes(fixed)),
            ("encode_v2(compress=False) (stored)", t_stored, mean_bytes(stored)),
            ("v2_payloads + zlib.compress per row", t_zlib, mean_bytes(zlibbed)),
            (f"HdrLayout.encode per row ({n} rows, scaled)", scaled, mean_bytes(package)),
        ]
        for name, (wall, cpu), size in rows:
            print(
                f"{values:>6} {buckets:>7.1f}  {name:<44} {wall:>7.3f} {cpu:>7.3f} "
                f"{cpu / args.rows * 1e6:>13.2f} {size:>12.1f}"
            )
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
