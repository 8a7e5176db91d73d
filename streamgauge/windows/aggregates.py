"""What the window operators share: a window's scalar aggregates, and a group's micro-batch.

:class:`Scalars` is the count/sum/min/max/last of a window or pane (``last`` is the value of
the latest event, ``last_event_ms``), merged the same way by the session and sliding
operators, whose state records put their key (start, end or pane time) first and hold
one. Every state
record packs these six values contiguously, in :meth:`Scalars.record` order, and a fresh one
packs as ``0, 0.0, +inf, -inf, 0.0, -1``: running checkpoints hold those bytes.

``reference.py`` keeps its own copy on purpose: it is the independent oracle of the tests.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import pandas as pd


@dataclass(slots=True)
class Scalars:
    """Merged scalar values of a window or pane; the defaults are those of an empty one."""

    count: int = 0
    sum: float = 0.0
    min: float = float("inf")
    max: float = float("-inf")
    last: float = 0.0
    last_event_ms: int = -1

    @classmethod
    def of_row(cls, row: Any) -> Self:
        """One partial's values, from an ``itertuples`` row of the operator's input."""
        return cls(int(row.count), float(row.sum), float(row.min), float(row.max),
                   float(row.last), int(row.last_event_ms))  # fmt: skip

    def merge_scalars(self, other: Scalars) -> None:
        """Counts and sums add, min/max compare; ``last`` is that of the later event (ours on
        a tie)."""
        self.count += other.count
        self.sum += other.sum
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        if other.last_event_ms > self.last_event_ms:
            self.last, self.last_event_ms = other.last, other.last_event_ms

    def record(self) -> tuple[int, float, float, float, float, int]:
        """The six values in state record order."""
        return (self.count, self.sum, self.min, self.max, self.last, self.last_event_ms)

    def output_values(self) -> tuple[int, float, float, float, float]:
        """count, sum, min, max, last: the values of a window row (every ``OUTPUT_DDL``)."""
        return (self.count, self.sum, self.min, self.max, self.last)


def read_batch(
    frames: Iterator[pd.DataFrame], metric_type: str | None
) -> tuple[pd.DataFrame, str]:
    """A group's micro-batch (``applyInPandasWithState``'s ``frames``) as one frame, and the
    series' metric type: the least of the batch's and ``metric_type`` (the state's; None
    before its first batch)."""
    parts = list(frames)
    # Spark's frames come with a fresh RangeIndex each: one frame needs no concatenating (a
    # pandas concat costs ~0.3 ms, for the one frame a live batch usually holds).
    batch = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
    types = batch["metric_type"].tolist()
    return batch, min([*types, metric_type] if metric_type else types)


def total_order(batch: pd.DataFrame, keys: Sequence[str]) -> list[int]:
    """Positions of ``batch``'s rows ordered by ``keys``, then by the ``sketch`` bytes (None as
    empty): a total order of what a call merges, whatever order Spark's shuffle gave the rows.

    The order ``batch.sort_values([*keys, sketch bytes], kind="stable")`` gives (each key's
    missing values, None or NaN, last; ties keep their positions), computed on Python values:
    pandas factorizes every key column first, ~4 ms per call for the few rows a live
    micro-batch holds per series, half of a sliding window's time per series.
    """
    values = batch[[*keys, "sketch"]].to_numpy(dtype=object).tolist()
    return sorted(range(len(values)), key=lambda position: _order_key(values[position]))


def _order_key(values: Sequence[Any]) -> tuple[Any, ...]:
    """``total_order``'s key of one row: its key values, missing ones last, then the sketch
    bytes (the last value; None as empty)."""
    *key_values, sketch = values
    return (*map(_missing_last, key_values), b"" if sketch is None else bytes(sketch))


def _missing_last(value: Any) -> tuple[int, Any]:
    if value is None or (isinstance(value, float) and value != value):
        return (1, 0)
    return (0, value)


def rows_in_order(batch: pd.DataFrame, keys: Sequence[str]) -> list[Any]:
    """``batch``'s rows as named tuples (what ``itertuples(index=False)`` yields) in
    ``total_order``; a single row as it is."""
    columns = tuple(str(name) for name in batch.columns)
    row_type = _row_type(columns)
    # One conversion of the whole frame (Python ints, floats, bytes...: what itertuples
    # yields), not one per column; the order is computed on those same values.
    rows = [row_type._make(row) for row in batch.to_numpy(dtype=object).tolist()]
    if len(rows) < 2:
        return rows
    at = [columns.index(name) for name in (*keys, "sketch")]
    return sorted(rows, key=lambda row: _order_key([row[i] for i in at]))


@functools.lru_cache(maxsize=16)
def _row_type(columns: tuple[str, ...]) -> Any:
    """One named-tuple class per column set: ``itertuples`` builds a new one every call
    (~1 ms, a quarter of a sliding window's time per series and batch)."""
    return collections.namedtuple("Row", columns, rename=True)


def output_frame(rows: Sequence[tuple[Any, ...]], columns: Sequence[str]) -> pd.DataFrame:
    """An operator's output rows as the frame Spark takes from it: one object column per
    output column, converted to the declared types by Spark's Arrow writer.

    ``pd.DataFrame(rows, columns=...)`` infers a dtype for every column first, ~0.6 ms for the
    dozen rows of a live call; filling one object block takes a third of that. Filled cell by
    cell: a row holding an array (HDR buckets) must not be broadcast by numpy.
    """
    block = np.empty((len(rows), len(columns)), dtype=object)
    for i, row in enumerate(rows):
        for j, value in enumerate(row):
            block[i, j] = value
    return pd.DataFrame(block, columns=list(columns), copy=False)
