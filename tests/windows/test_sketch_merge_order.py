"""The sketch lane merges a window's partials in one order whatever order Spark hands them in,
so a replayed micro-batch writes the same digest bytes and sums."""

from __future__ import annotations

import numpy as np
import pandas as pd

from streamgauge.ingest.pane_sketches import PaneSketches
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.windows.sketch_windows import SketchWindow, distinct_count, merge_rows

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
        merge_rows(window, rows.sample(frac=1.0, random_state=seed), PARAMS.tdigest_k,
                   metric_type="ms", lg_k=PARAMS.hll_lg_k)  # fmt: skip
        merged.append(
            (window.digest, window.scalars.sum, window.buckets.tolist(), window.counts.tolist())
        )
    assert all(m == merged[0] for m in merged[1:])


def test_shuffled_set_partials_union_to_the_same_hll() -> None:
    """A set window in the sketch lane (``sets: with_timers``): the pane HLLs' union, whatever
    their order, is one image, with the distinct count of all members."""
    sketches = PaneSketches(PARAMS)
    keys = [(("users", "s", "{}"), i * 1000) for i in range(30)]
    for i, key in enumerate(keys):  # 20 members per pane, 10 new: 310 distinct in all
        for j in range(i * 10, i * 10 + 20):
            sketches.add_member(key, f"u{j}")
    sketch, _, _, _ = sketches.columns(keys)
    rows = pd.DataFrame({
        "count": [20] * 30, "sum": [np.nan] * 30, "min": [np.nan] * 30, "max": [np.nan] * 30,
        "last": [np.nan] * 30, "last_event_ms": [i * 1000 for i in range(30)],
        "sketch": sketch.to_pylist(), "hdr_bucket": [None] * 30, "hdr_count": [None] * 30,
    })  # fmt: skip
    images = set()
    for seed in range(5):
        window = SketchWindow(0, 30_000)
        merge_rows(window, rows.sample(frac=1.0, random_state=seed), PARAMS.tdigest_k,
                   metric_type="s", lg_k=PARAMS.hll_lg_k)  # fmt: skip
        images.add(window.digest)
        assert window.scalars.count == 600
    [image] = images
    assert distinct_count(image) == 310.0  # exact: HLL's small-set mode at lgK 12
