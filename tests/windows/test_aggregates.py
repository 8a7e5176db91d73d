"""The scalar aggregates every window operator shares (``windows/aggregates.py``), and the state
bytes of the records built on them: those must not change, running checkpoints hold them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
from hypothesis import example, given
from hypothesis import strategies as st

from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.windows import session_windows, sliding_windows
from streamgauge.windows.aggregates import (
    Scalars,
    output_frame,
    read_batch,
    rows_in_order,
    total_order,
)
from streamgauge.windows.window_sketches import Sketches, SketchMerger

T0 = 1_700_000_000_000
SCALARS = (3, 43.5, 1.5, 40.0, 2.25, T0 + 900)


def test_merge_adds_counts_and_sums_and_compares_min_and_max() -> None:
    merged = Scalars(*SCALARS)
    merged.merge_scalars(Scalars(2, 6.5, 0.5, 6.0, 6.0, T0 + 100))
    assert merged.record() == (5, 50.0, 0.5, 40.0, 2.25, T0 + 900)
    assert merged.output_values() == (5, 50.0, 0.5, 40.0, 2.25)


def test_last_is_that_of_the_latest_event_and_ours_on_a_tie() -> None:
    merged = Scalars(*SCALARS)
    merged.merge_scalars(Scalars(1, 7.0, 7.0, 7.0, 7.0, T0 + 901))
    assert (merged.last, merged.last_event_ms) == (7.0, T0 + 901)
    merged.merge_scalars(Scalars(1, 8.0, 8.0, 8.0, 8.0, T0 + 901))  # a tie: ours stays
    assert (merged.last, merged.last_event_ms) == (7.0, T0 + 901)
    merged.merge_scalars(Scalars(1, 9.0, 9.0, 9.0, 9.0, T0))  # earlier: ours stays
    assert merged.record() == (6, 67.5, 1.5, 40.0, 7.0, T0 + 901)


def test_an_empty_one_merges_into_the_other_values() -> None:
    assert Scalars().record() == (0, 0.0, float("inf"), float("-inf"), 0.0, -1)
    empty = Scalars()
    empty.merge_scalars(Scalars(*SCALARS))
    assert empty.record() == SCALARS


def test_of_row_reads_a_partial_row() -> None:
    frame = pd.DataFrame({"count": [3], "sum": [43.5], "min": [1.5], "max": [40.0],
                          "last": [2.25], "last_event_ms": [T0 + 900]})  # fmt: skip
    [row] = frame.itertuples(index=False)
    assert Scalars.of_row(row).record() == SCALARS


def test_read_batch_concatenates_and_takes_the_least_metric_type() -> None:
    frames = [pd.DataFrame({"metric_type": ["ms", "h"], "x": [1, 2]}),
              pd.DataFrame({"metric_type": ["ms"], "x": [3]})]  # fmt: skip
    batch, metric_type = read_batch(iter(frames), None)
    assert batch["x"].tolist() == [1, 2, 3] and list(batch.index) == [0, 1, 2]
    assert metric_type == "h"
    assert read_batch(iter(frames), "d")[1] == "d"
    assert read_batch(iter(frames), "ms")[1] == "h"


# Expected state blobs: computed once by running the code of main before aggregates.py existed
# (commit bebf21b, where each record declared its own count..last_event_ms), on exactly the
# windows built below; hard-coded so any change to the packed bytes fails here.
SESSION = bytes.fromhex(
    "feffffffffffffff6c61796f757430310068e5cf8b010000887be5cf8b010000030000000000000000000000"
    "00c04540000000000000f83f00000000000044400000000000000240846be5cf8b0100000106000000020000"
    "0003000000646967657374030000000700000005000000000000000100000000000000686c6c288be5cf8b01"
    "0000e096e5cf8b01000000000000000000000000000000000000000000000000f07f000000000000f0ff0000"
    "000000000000ffffffffffffffff01000000000000000000000000"
)
SLIDING = bytes.fromhex(
    "feffffffffffffff6c61796f757430310068e5cf8b01000003000000000000000000000000c0454000000000"
    "0000f83f00000000000044400000000000000240846be5cf8b01000001060000000200000003000000646967"
    "657374030000000700000005000000000000000100000000000000686c6ce86be5cf8b010000000000000000"
    "00000000000000000000000000000000f07f000000000000f0ff0000000000000000ffffffffffffffff0100"
    "0000000000000000000000"
)


def _merger() -> SketchMerger:
    merger = SketchMerger(compile_accuracy())
    merger.fingerprint = b"layout01"  # fixed: the blobs must not depend on default accuracy
    return merger


def _sketches() -> Sketches:
    # Packed as they are (no merge), so any bytes do.
    return Sketches(b"digest", np.array([3, 7], np.int32), np.array([5, 1], np.int64), b"hll")


def test_session_state_bytes_are_unchanged() -> None:
    merger = _merger()
    sessions = [session_windows.Session(T0, T0 + 5000, Scalars(*SCALARS), _sketches()),
                session_windows.Session(T0 + 9000, T0 + 12000)]  # fmt: skip
    blob = session_windows.pack_sessions(sessions, merger)
    assert blob == SESSION
    back = session_windows.unpack_sessions(blob, merger)
    assert [s.values() for s in back] == [s.values() for s in sessions]


def test_sliding_state_bytes_are_unchanged() -> None:
    merger = _merger()
    records = {T0: sliding_windows.Partial(T0, Scalars(*SCALARS), _sketches()),
               T0 + 1000: sliding_windows.Partial(T0 + 1000)}  # fmt: skip
    blob = sliding_windows.pack(records, merger)
    assert blob == SLIDING
    back = sliding_windows.unpack(blob, merger)
    assert [p.values() for p in back.values()] == [p.values() for p in records.values()]


# --- a group's rows in a total order, and an operator's output frame ---------------------------

_KEYS = ("prior_heartbeat_ms", "receiver", "sum", "last")


def _pandas_order(batch: pd.DataFrame, keys: tuple[str, ...]) -> list[int]:
    """The order the operators took from pandas before ``total_order``: a stable sort by the
    keys, then the sketch bytes (None as empty), missing values last."""
    keyed = batch.reset_index(drop=True).assign(
        _sketch_key=batch["sketch"].map(lambda b: b"" if b is None else bytes(b))
    )
    return keyed.sort_values([*keys, "_sketch_key"], kind="stable").index.tolist()


_small_floats = st.one_of(st.sampled_from([0.0, -0.0, 1.5, float("nan")]), st.floats(-3, 3))


@st.composite
def _groups(draw: st.DrawFn) -> pd.DataFrame:
    n = draw(st.integers(0, 7))
    column = st.lists  # one value per row
    return pd.DataFrame(
        {
            "prior_heartbeat_ms": draw(column(st.sampled_from([T0, T0 + 1000]), min_size=n,
                                              max_size=n)),
            "receiver": draw(column(st.sampled_from(["r0", "r1", None]), min_size=n, max_size=n)),
            "sum": draw(column(_small_floats, min_size=n, max_size=n)),
            "last": draw(column(_small_floats, min_size=n, max_size=n)),
            "sketch": draw(column(st.sampled_from([None, b"", b"a", b"ab", b"b"]), min_size=n,
                                  max_size=n)),
            "position": list(range(n)),
        }
    )  # fmt: skip


@given(_groups())
@example(pd.DataFrame({"prior_heartbeat_ms": [T0, T0], "receiver": ["r1", "r0"],
                       "sum": [float("nan"), 1.0], "last": [0.0, -0.0],
                       "sketch": [b"b", None], "position": [0, 1]}))  # fmt: skip
def test_total_order_is_the_order_pandas_gave(batch: pd.DataFrame) -> None:
    """NaN and None last in each key, -0.0 equal to 0.0, ties by sketch bytes, then stable."""
    assert total_order(batch, _KEYS) == _pandas_order(batch, _KEYS)


def test_rows_in_order_are_the_rows_itertuples_gives_in_that_order() -> None:
    batch = pd.DataFrame(
        {"prior_heartbeat_ms": np.array([T0 + 1000, T0, T0], dtype=np.int64),
         "receiver": ["r0", "r1", "r0"], "sum": [1.0, float("nan"), 2.5],
         "last": [1.0, 2.0, 3.0], "sketch": [b"x", None, b""], "position": [0, 1, 2]}
    )  # fmt: skip
    rows = rows_in_order(batch, _KEYS)
    assert [row.position for row in rows] == _pandas_order(batch, _KEYS) == [2, 1, 0]
    expected = list(batch.iloc[[2, 1, 0]].itertuples(index=False))
    for row, pandas_row in zip(rows, expected, strict=True):
        assert row._fields == pandas_row._fields
        assert [type(v) for v in row] == [type(v) for v in pandas_row]  # int, str, float...
        assert repr(row[:]) == repr(pandas_row[:])  # the same values, NaN included
    assert [row.position for row in rows_in_order(batch.iloc[:1], _KEYS)] == [0]


def test_output_frame_holds_what_the_rows_hold_arrays_included() -> None:
    """Arrays stay one cell each (numpy must not broadcast them), None stays None, and Arrow
    converts every column to the declared type, as Spark's writer does."""
    columns = ("change", "count", "sum", "hdr_buckets")
    rows = [("upsert", 3, 1.5, np.array([1, 2], dtype=np.int32)), ("late", 1, None, None)]
    frame = output_frame(rows, columns)
    assert list(frame.columns) == list(columns) and len(frame) == 2
    assert frame["hdr_buckets"][0].tolist() == [1, 2] and frame["hdr_buckets"][1] is None
    types = pa.schema([("change", pa.string()), ("count", pa.int64()), ("sum", pa.float64()),
                       ("hdr_buckets", pa.list_(pa.int32()))])  # fmt: skip
    table = pa.Table.from_pandas(frame, schema=types, preserve_index=False)
    assert table.to_pylist() == [
        {"change": "upsert", "count": 3, "sum": 1.5, "hdr_buckets": [1, 2]},
        {"change": "late", "count": 1, "sum": None, "hdr_buckets": None},
    ]
    assert len(output_frame([], columns)) == 0
