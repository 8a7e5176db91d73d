"""What the window operators share: a window's scalar aggregates, and a group's micro-batch.

:class:`Scalars` is the count/sum/min/max/last of a window or pane (``last`` is the value of
the latest event, ``last_event_ms``), merged the same way by the hopping, session and sliding
operators. ``hopping_windows.Aggregate`` is one plus its sketches; the session, sliding and
sketch-lane records put their key (start, end or pane time) first and hold one. Every state
record packs these six values contiguously, in :meth:`Scalars.record` order, and a fresh one
packs as ``0, 0.0, +inf, -inf, 0.0, -1``: running checkpoints hold those bytes.

``reference.py`` keeps its own copy on purpose: it is the independent oracle of the tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Self

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
    batch = pd.concat(list(frames), ignore_index=True)
    types = batch["metric_type"].tolist()
    return batch, min([*types, metric_type] if metric_type else types)
