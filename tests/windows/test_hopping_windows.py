"""Hopping windows by pane merge (``hopping_windows``): the per-window lateness rule survives
the pane, and the operator's state round-trips.

The transcripts (``hopping*.yaml``) run the whole job; here the column arithmetic that replaces
the copied rows is checked against the reference windower's rule over a grid of event times
and prior heartbeats, in real Spark.
"""

from __future__ import annotations

import itertools

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from streamgauge.configs import parse_config
from streamgauge.ingest.pane_sketches import PaneSketches
from streamgauge.sinks.store import ASSEMBLED_SCHEMA
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.sketches.hll import build_hll, estimate, serialize_hll
from streamgauge.windows.hopping_windows import Aggregate, pack, set_values_of_panes, unpack
from streamgauge.windows.job import pane_and_first_start
from streamgauge.windows.reference import windows_containing
from streamgauge.windows.window_sketches import SketchMerger

T0 = 1_700_000_000_000


WINDOW = parse_config(
    "name: hop\npane: 1s\nwindows: [{name: h, kind: hopping, size: 6s, hop: 2s, "
    "watermark_delay: 1s, allowed_lateness: 3s}]\n",
    "hop",
).windows[0]


def test_first_on_time_start_is_the_reference_rule(spark: SparkSession) -> None:
    # Event times across three hops (some capped by their segment's heartbeat), prior
    # heartbeats from long before them to well after every window holding them closed.
    grid = list(itertools.product(range(0, 6000, 500), (-300, 1000), range(0, 16000, 250)))
    rows = [(T0 + t, T0 + t + beat, T0 + prior) for t, beat, prior in grid]
    frame = spark.createDataFrame(
        rows, "pane_start_ms bigint, segment_heartbeat_ms bigint, prior_heartbeat_ms bigint"
    )
    pane, from_start = pane_and_first_start(WINDOW)
    got = frame.select(pane.alias("pane"), from_start.alias("from_start")).collect()
    partly_late = 0
    for (t, beat, prior), row in zip(grid, got, strict=True):
        event = T0 + min(t, t + beat)
        starts = [s for s, _ in windows_containing(WINDOW, event)]
        on_time = [s for s in starts if s + 6000 + 3000 > T0 + prior - 1000]  # reference rule
        assert row["pane"] == max(starts)
        if on_time:
            assert on_time == list(range(row["from_start"], row["pane"] + 1, 2000))
            partly_late += len(on_time) < len(starts)
        else:
            assert row["from_start"] > row["pane"]
    assert partly_late > 20  # the grid does cross the interesting cases


def test_state_round_trips_values_and_sketches() -> None:
    params = compile_accuracy()
    merger = SketchMerger(params)
    sketches = PaneSketches(params)
    key = (("lat", "ms", "{}"), T0)
    sketches.add_values(key, np.array([1.5, 2.0, 40.0]))
    [[digest], [buckets], [counts], *_] = [c.to_pylist() for c in sketches.columns([key])]
    first = Aggregate(3, 43.5, 1.5, 40.0, 40.0, T0 + 900)
    merger.add(first.sketches, "ms", digest, buckets, counts)
    windows = {T0: first, T0 + 2000: Aggregate(1, 7.0, 7.0, 7.0, 7.0, T0 + 2100)}
    back = unpack(pack(windows, merger), merger)
    assert sorted(back) == [T0, T0 + 2000]
    assert (back[T0].count, back[T0].sum, back[T0].min, back[T0].max) == (3, 43.5, 1.5, 40.0)
    assert back[T0].sketches.same_as(first.sketches)
    assert back[T0 + 2000].last_event_ms == T0 + 2100
    assert pa.array(back[T0].sketches.counts).to_pylist() == first.sketches.counts.tolist()


def test_set_windows_of_panes_are_the_union_of_their_pane_hlls() -> None:
    """Members x, y in one pane, y, z in the other: 3 distinct (the union's estimate, rounded
    as Spark's ``hll_sketch_estimate``); a counter window gets no sketch."""
    lg_k = compile_accuracy().hll_lg_k
    first, second = (serialize_hll(build_hll(m, lg_k)) for m in (["x", "y"], ["y", "z"]))
    assembled = pa.Table.from_pylist(
        [
            {"metric": "seen", "tags": "{}", "metric_type": "s", "window_start_ms": 0,
             "window_end_ms": 4000, "count": 4, "sum": None, "min": None, "max": None,
             "last": None, "set_sketches": [first, second]},
            {"metric": "hits", "tags": "{}", "metric_type": "c", "window_start_ms": 0,
             "window_end_ms": 4000, "count": 2, "sum": 5.0, "min": None, "max": None,
             "last": None, "set_sketches": []},
        ],  # fmt: skip
        schema=ASSEMBLED_SCHEMA,
    )
    values = set_values_of_panes(assembled, lg_k)
    assert "set_sketches" not in values.column_names
    assert values.column("distinct_count").to_pylist() == [3.0, None]
    [sketch, none] = values.column("sketch").to_pylist()
    assert none is None and estimate(sketch).estimate == pytest.approx(3.0, abs=0.01)
    assert values.column("count").to_pylist() == [4, 2]
