"""Sketches in session and sliding state (``window_sketches``), without Spark.

- the packed state round-trips, and a blob written before sketches were kept still reads
  (its windows' sketch columns are NULL, never a partial picture);
- state size per session is bounded whatever the number of partials merged (measured here);
- the operators are deterministic: the same rows in another order (Spark's shuffle does not
  fix the order of a group's rows) give the same output rows and the same state bytes.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import numpy as np
import pandas as pd
import pytest

from streamgauge.configs import parse_config
from streamgauge.ingest.pane_sketches import PaneSketches
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.windows.aggregates import Scalars
from streamgauge.windows.session_windows import (
    Session,
    pack_sessions,
    session_state_function,
    unpack_sessions,
)
from streamgauge.windows.sliding_windows import sliding_state_function
from streamgauge.windows.window_sketches import OUTPUT_COLUMNS, Sketches, SketchMerger
from tests.windows.test_sliding_windows import FakeGroupState

PARAMS = compile_accuracy()
MERGER = SketchMerger(PARAMS)


def _pane_columns(kind: str, panes: int, per_pane: int, seed: int) -> list[tuple[Any, ...]]:
    """(sketch, hdr_bucket, hdr_count) of ``panes`` partials, as ingest writes them."""
    rng = np.random.default_rng(seed)
    sketches = PaneSketches(PARAMS)
    keys = [(("lat", kind, "{}"), i * 1000) for i in range(panes)]
    for key in keys:
        if kind == "s":
            for member in rng.integers(0, 10**9, per_pane):
                sketches.add_member(key, f"m{member}")
        else:
            sketches.add_values(key, rng.lognormal(3.0, 0.8, per_pane))
    sketch, bucket, count, _kll = sketches.columns(keys)
    return list(zip(sketch.to_pylist(), bucket.to_pylist(), count.to_pylist(), strict=True))


def _session(kind: str, panes: int, per_pane: int) -> Session:
    session = Session(0, 1000, Scalars(count=panes * per_pane))
    for sketch, bucket, count in _pane_columns(kind, panes, per_pane, seed=panes):
        MERGER.add(session.sketches, kind, sketch, bucket, count)
    return session


def test_state_round_trips_and_keeps_its_columns() -> None:
    sessions = [
        _session("ms", 20, 100), _session("s", 20, 50), Session(5000, 9000, Scalars(count=3))
    ]
    restored = unpack_sessions(pack_sessions(sessions, MERGER), MERGER)
    assert [s.values() for s in restored] == [s.values() for s in sessions]
    for before, after in zip(sessions, restored, strict=True):
        assert after.sketches.same_as(before.sketches)
        assert MERGER.columns(after.sketches, "ms") == MERGER.columns(before.sketches, "ms")


def test_state_of_another_hdr_layout_reads_without_its_buckets() -> None:
    """``sketches:`` accuracy changed under a running checkpoint: the old indices would mean
    other values, so they are dropped and the session's sketch columns are NULL."""
    blob = pack_sessions([_session("ms", 3, 100)], MERGER)
    other = SketchMerger(compile_accuracy(quantile_error=0.001))
    assert other.fingerprint != MERGER.fingerprint
    (session,) = unpack_sessions(blob, other)
    assert not session.sketches.complete and len(session.sketches.buckets) == 0
    assert other.columns(session.sketches, "ms") == (None,) * len(OUTPUT_COLUMNS)


def test_state_written_before_sketches_reads_with_null_sketch_columns() -> None:
    """The old blob: fixed records only. Such a session's percentiles would describe only
    the partials after the upgrade, so they stay NULL; merging keeps the mark."""
    old = struct.Struct("<qqqddddq").pack(1_700_000_000_000, 1_700_000_004_000, 2, 3.0, 1.0,
                                          2.0, 2.0, 1_700_000_000_500)  # fmt: skip
    (session,) = unpack_sessions(old, MERGER)
    assert (session.start, session.scalars.count, session.sketches.complete) == (
        1_700_000_000_000, 2, False
    )  # fmt: skip
    grown = _session("ms", 1, 10)
    grown.absorb(session, MERGER)
    assert MERGER.columns(grown.sketches, "ms") == (None,) * len(OUTPUT_COLUMNS)
    assert not unpack_sessions(pack_sessions([grown], MERGER), MERGER)[0].sketches.complete


# Measured here (k = 200, lgK 12, HDR 2 digits over 0.1 ms .. 1 h); see window_sketches.
@pytest.mark.parametrize(
    ("kind", "per_pane", "bound"),
    [("ms", 100, 20_000), ("ms", 1000, 22_000), ("s", 1000, 4_300)],
)
def test_state_per_session_is_bounded(kind: str, per_pane: int, bound: int) -> None:
    """Bytes of one session's state after 1, 10, 100 and 1000 partials: growth stops (the
    digest at ~k centroids, HDR at the buckets the data spans, the HLL at 2^lgK registers)."""
    sizes = [len(pack_sessions([_session(kind, panes, per_pane)], MERGER))
             for panes in (1, 10, 100, 1000)]  # fmt: skip
    assert max(sizes) <= bound, sizes
    assert sizes[3] - sizes[2] < 0.3 * sizes[2], sizes  # 10x the partials: little growth


def _rows(seed: int) -> pd.DataFrame:
    """Partials of one series (projected onto it from three hosts, so several share a pane
    and every log-order column but their values)."""
    rng = np.random.default_rng(seed)
    rows = []
    for pane in range(6):
        for (sketch, bucket, count), host in zip(_pane_columns("ms", 3, 40, seed + pane),
                                                 range(3), strict=True):  # fmt: skip
            rows.append({
                "metric": "lat", "tags": "{}", "metric_type": "ms", "event_ms": pane * 1000,
                "event_ts": None, "count": 40, "sum": float(rng.integers(1, 9)), "min": 1.0,
                "max": 9.0, "last": 1.0, "last_event_ms": pane * 1000 + host,
                "first_recv_ms": pane * 1000, "last_recv_ms": pane * 1000, "receiver": "r0",
                "pane_start_ms": pane * 1000, "segment_heartbeat_ms": 9000,
                "prior_heartbeat_ms": 0, "sketch": sketch, "hdr_bucket": bucket,
                "hdr_count": count,
            })  # fmt: skip
    return pd.DataFrame(rows)


@pytest.mark.parametrize("kind", ["session", "sliding"])
def test_rows_in_another_order_give_the_same_rows_and_state(kind: str) -> None:
    if kind == "session":
        window = parse_config(
            "pane: 1s\nwindows: [{name: w, kind: session, gap: 2s, key: user}]\n", "t"
        ).windows[0]
        function = session_state_function(window, PARAMS)
    else:
        window = parse_config("pane: 1s\nwindows: [{name: w, kind: sliding, size: 3s}]\n",
                              "t").windows[0]  # fmt: skip
        function = sliding_state_function(window, 1000, PARAMS)
    rows = _rows(seed=7)
    outputs = []
    for order in (rows, rows.sample(frac=1.0, random_state=1), rows.iloc[::-1]):
        state = FakeGroupState(watermark_ms=0)
        frames: Iterator[pd.DataFrame] = iter([order.reset_index(drop=True)])
        out = pd.concat(list(function(("lat", "{}"), frames, state)), ignore_index=True)
        outputs.append((out, state.value))
    first_out, first_state = outputs[0]
    assert first_out["p99"].notna().all() and first_out["hdr_buckets"].notna().all()
    for out, state in outputs[1:]:
        pd.testing.assert_frame_equal(out, first_out)
        assert state == first_state


def test_sets_and_timers_columns() -> None:
    timers, members = _session("ms", 5, 200), _session("s", 5, 200)
    p50, p90, p99, p999, distinct, sketch, encoded, buckets = MERGER.columns(
        timers.sketches, "ms"
    )
    assert p50 is not None and p50 <= p90 <= p99 <= p999 and distinct is None
    assert sketch == timers.sketches.digest and encoded and buckets
    columns = MERGER.columns(members.sketches, "s")
    assert columns[:4] == (None,) * 4 and columns[6:] == (None, None)
    assert columns[5] == members.sketches.hll
    assert abs(columns[4] - 1000) <= 0.03183 * 1000 and columns[4] == round(columns[4])
    assert MERGER.columns(Sketches(), "c") == (None,) * len(OUTPUT_COLUMNS)
