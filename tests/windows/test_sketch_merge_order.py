"""The sketch lane merges a window's partials in one order whatever order Spark hands them in,
so a replayed micro-batch writes the same digest bytes and sums."""

from __future__ import annotations

import numpy as np
import pandas as pd

from streamgauge.ingest.pane_sketches import PaneSketches
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.windows.sketch_windows import SketchWindow, merge_rows

PARAMS = compile_accuracy()


def _partials(n: int) -> pd.DataFrame:
    rng = np.random.default_rng(7)
    sketches = PaneSketches(PARAMS)
    keys = [(("lat", "ms", "{}"), i * 1000) for i in range(n)]
    values = [rng.lognormal(3.0, 0.8, 50) for _ in keys]
    for key, pane_values in zip(keys, values, strict=True):
        sketches.add_values(key, pane_values)
    sketch, bucket, count, _kll = sketches.columns(keys)
    return pd.DataFrame({
        "count": [len(v) for v in values], "sum": [float(v.sum()) for v in values],
        "min": [float(v.min()) for v in values], "max": [float(v.max()) for v in values],
        "last": [float(v[-1]) for v in values], "last_event_ms": [i * 1000 for i in range(n)],
        "sketch": sketch.to_pylist(), "hdr_bucket": bucket.to_pylist(),
        "hdr_count": count.to_pylist(),
    })  # fmt: skip


def test_shuffled_partials_merge_to_the_same_bytes() -> None:
    rows = _partials(30)
    merged = []
    for seed in range(5):
        window = SketchWindow(0, 30_000)
        merge_rows(window, rows.sample(frac=1.0, random_state=seed), PARAMS.tdigest_k)
        merged.append(
            (window.digest, window.scalars.sum, window.buckets.tolist(), window.counts.tolist())
        )
    assert all(m == merged[0] for m in merged[1:])
