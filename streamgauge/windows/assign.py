"""Which tumbling or hopping windows a pane partial belongs to, and which of them it is late for.

A window spec (the config object, ``WindowSpec``) compiles into a :class:`PaneAssigner` (its
logic object). It works on a whole micro-batch of partials at once, as Arrow columns, and
never copies a partial into each window: it places the partial in its *pane* (``hop`` wide;
a tumbling window's pane is the window) and says which of the windows holding that pane it is
on time for. ``OpenWindows`` keeps the panes and makes windows of them.

Rules (``docs/architecture.md`` §2):

- event time = ``min(pane_start, heartbeat of the partial's segment)``: a client clock ahead
  of the receiver's counts as "now";
- the windows holding event ``t`` start at ``p - size + hop, ..., p``, ``p`` the start of
  ``t``'s pane (``p = t - (t - offset) mod hop``);
- the partial is late for ``[s, s + size)`` when ``s + size + allowed_lateness <= prior
  heartbeat - watermark_delay``, the prior heartbeat being that of its stream's previous
  segment (a property of the log). Older windows are late first, so the partial is on time
  for the windows starting at ``from_start`` and after (``from_start > p``: for none).

size 6 s, hop 2 s, lateness 1 s, a partial at 3.2 s whose ``prior heartbeat - delay`` is 8 s::

    t (s)      -2    0    2    4    6    8
    panes            | 0  | 2  | 4  | 6  |
    [-2, 4) [==============)               4 + 1 <= 8: late
    [0, 6)       [==============)          6 + 1 <= 8: late
    [2, 8)            [==============)     8 + 1 >  8: on time   from_start = 2
                         ^ 3.2 s (pane 2)
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.configs import WindowSpec

PANE_COLUMNS = (
    "metric", "tags", "metric_type", "pane_ms", "from_start_ms", "count", "sum", "min", "max",
    "last", "last_event_ms", "sketch", "hdr_bucket", "hdr_count", "kll",
)  # fmt: skip
"""The columns of an on-time partial placed in its pane (``Assigned.on_time``); ``kll`` is NULL
unless the config has a ``quantiles: kll`` window."""

LATE_COLUMNS = (
    "metric", "tags", "metric_type", "window_start_ms", "window_end_ms", "receiver",
    "pane_start_ms", "count", "sum", "min", "max", "last", "first_recv_ms", "last_recv_ms",
    "prior_heartbeat_ms",
)  # fmt: skip
"""The columns of a late partial, one row per window it is late for (``Assigned.late``)."""


@dataclass(frozen=True)
class Assigned:
    """A micro-batch's partials of one window spec: placed in panes, or late."""

    on_time: pa.Table
    late: pa.Table


@dataclass
class _Cache:
    """Per distinct string, a decision made once per series lifetime, not per row."""

    kept: dict[str, bool] = field(default_factory=dict)
    projected: dict[str, str] = field(default_factory=dict)


def _glob_pattern(globs: tuple[str, ...]) -> str | None:
    """An RE2 pattern that matches a whole name exactly when ``fnmatchcase`` matches it with
    one of ``globs``; None when a glob has a ``[...]`` set (left to ``fnmatch``)."""
    if any("[" in glob for glob in globs):
        return None
    alternatives = [
        "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in glob)
        for glob in globs
    ]
    return "^(?s:" + "|".join(alternatives) + ")$"


@dataclass(frozen=True)
class SeriesSelector:
    """Which partials a window spec takes (its metric globs) and the series each belongs to
    (its tags projected on the spec's series keys); both decided once per distinct string."""

    metrics: tuple[str, ...]
    group_by: tuple[str, ...]
    _cache: _Cache = field(default_factory=_Cache, compare=False, repr=False)

    def wanted(self, metric: pa.ChunkedArray) -> pa.Array:
        """Whether each row's metric matches the spec's globs: in one regex pass over the
        batch's distinct names when the globs use only ``*`` and ``?``, else decided once per
        name in Python (``fnmatch``'s ``[...]`` sets)."""
        if "*" in self.metrics:
            return pa.array(np.ones(len(metric), dtype=bool))
        encoded = metric.combine_chunks().dictionary_encode()
        pattern = _glob_pattern(self.metrics)
        if pattern is not None:
            decided = pc.match_substring_regex(encoded.dictionary, pattern)
            return pc.take(decided, encoded.indices)
        names = encoded.dictionary.to_pylist()
        kept = self._cache.kept
        for name in names:
            if name not in kept:
                kept[name] = any(fnmatch.fnmatchcase(name, glob) for glob in self.metrics)
        decision = np.array([kept[name] for name in names], dtype=bool)
        return pa.array(decision[encoded.indices.to_numpy(zero_copy_only=False)])

    def project(self, tags: pa.ChunkedArray) -> pa.Array:
        """The tags with only the ``group_by`` keys, in the sorted order ingest wrote them
        (projected once per distinct tag set)."""
        if not self.group_by:
            return pa.repeat(pa.scalar("{}", pa.string()), len(tags))
        encoded = tags.combine_chunks().dictionary_encode()
        values = encoded.dictionary.to_pylist()
        projected = self._cache.projected
        for value in values:
            if value not in projected:
                kept = {k: v for k, v in json.loads(value).items() if k in self.group_by}
                projected[value] = json.dumps(kept, separators=(",", ":"))
        dictionary = pa.array([projected[value] for value in values], pa.string())
        return pc.take(dictionary, encoded.indices)


@dataclass(frozen=True)
class PaneAssigner:
    """The assignment rules of one tumbling or hopping window spec (module docstring)."""

    size_ms: int
    hop_ms: int
    offset_ms: int
    watermark_delay_ms: int
    allowed_lateness_ms: int
    select: SeriesSelector

    @classmethod
    def of(cls, window: WindowSpec) -> PaneAssigner:
        if window.kind not in ("tumbling", "hopping") or window.size_ms is None:
            raise ValueError(
                f"window {window.name!r}: a pane assigner places tumbling and hopping windows, "
                f"not {window.kind}"
            )
        hop = window.hop_ms if window.kind == "hopping" and window.hop_ms else window.size_ms
        return cls(
            window.size_ms, hop, window.offset_ms, window.watermark_delay_ms,
            window.allowed_lateness_ms, SeriesSelector(tuple(window.metrics),
                                                        tuple(window.group_by)),
        )  # fmt: skip

    @classmethod
    def sliding(cls, window: WindowSpec, pane_ms: int) -> PaneAssigner:
        """A sliding window's (``kind: sliding``) candidate windows: every ``size``-wide window
        starting on a pane; ``SlidingWindowLogic`` keeps those its series' panes define."""
        if window.kind != "sliding" or window.size_ms is None:
            raise ValueError(f"window {window.name!r} is not a sliding window")
        return cls(
            window.size_ms, pane_ms, 0, window.watermark_delay_ms, window.allowed_lateness_ms,
            SeriesSelector(tuple(window.metrics), tuple(window.group_by)),
        )  # fmt: skip

    @property
    def panes_per_window(self) -> int:
        return self.size_ms // self.hop_ms

    def pane_of(self, event_ms: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The start of each event's pane."""
        pane: npt.NDArray[np.int64] = event_ms - np.mod(event_ms - self.offset_ms, self.hop_ms)
        return pane

    def assign(self, partials: pa.Table, final_through_ms: int | None = None) -> Assigned:
        """``partials`` (segment rows with ``receiver``, ``segment_heartbeat_ms`` and
        ``prior_heartbeat_ms``) of the spec's metrics, placed in panes or late.

        ``final_through_ms``: the watermark the job already committed. A window final by it
        stays final whatever the log says of the partial's own stream (a receiver's first
        segment has no prior heartbeat): the partial is late for it too, and its
        ``prior_heartbeat_ms`` (the late row's ``closed_by_ms``) says what closed it.
        """
        wanted = self.select.wanted(partials.column("metric"))
        rows = partials if pc.all(wanted).as_py() else partials.filter(wanted)
        event = np.minimum(
            _int64(rows.column("pane_start_ms")), _int64(rows.column("segment_heartbeat_ms"))
        )
        pane = self.pane_of(event)
        oldest = pane - (self.size_ms - self.hop_ms)
        closed_by = _int64(rows.column("prior_heartbeat_ms"))
        if final_through_ms is not None:
            closed_by = np.maximum(closed_by, final_through_ms + self.watermark_delay_ms)
            rows = rows.set_column(
                rows.schema.get_field_index("prior_heartbeat_ms"), "prior_heartbeat_ms",
                pa.array(closed_by, pa.int64()),
            )  # fmt: skip
        # Windows starting at or before ``threshold`` were final before the segment was written.
        threshold = closed_by - self.watermark_delay_ms - self.size_ms - self.allowed_lateness_ms
        late_windows = np.clip(
            np.floor_divide(threshold - oldest, self.hop_ms) + 1, 0, self.panes_per_window
        )
        from_start = oldest + late_windows * self.hop_ms
        tags = self.select.project(rows.column("tags"))
        on_time = late_windows < self.panes_per_window
        placed = pa.table(
            {
                "metric": rows.column("metric"),
                "tags": tags,
                "metric_type": rows.column("metric_type"),
                "pane_ms": pa.array(pane, pa.int64()),
                "from_start_ms": pa.array(from_start, pa.int64()),
                **{name: rows.column(name) for name in PANE_COLUMNS[5:]},
            }
        )
        if not on_time.all():  # a batch's rows are on time but for stragglers: no copy then
            placed = placed.filter(pa.array(on_time))
        return Assigned(placed, self._late_rows(rows, tags, oldest, late_windows))

    def _late_rows(
        self, rows: pa.Table, tags: pa.ChunkedArray | pa.Array, oldest: np.ndarray,
        late_windows: np.ndarray,
    ) -> pa.Table:  # fmt: skip
        """One row per (late partial, window it is late for), oldest window first."""
        index = np.repeat(np.arange(rows.num_rows), late_windows)
        first = np.cumsum(late_windows) - late_windows
        nth = np.arange(index.size) - np.repeat(first, late_windows)
        start = oldest[index] + nth * self.hop_ms
        take = pa.array(index, pa.int64())
        late = late_table(rows.take(take), start, start + self.size_ms, pc.take(tags, take))
        # Which windows of the partial's pane were on time (``from_start_ms``, above the pane:
        # none), for a sliding window's choice of late rows.
        pane = oldest + (self.size_ms - self.hop_ms)
        late = late.append_column("event_pane_ms", pa.array(pane[index], pa.int64()))
        return late.append_column(
            "from_start_ms", pa.array((oldest + late_windows * self.hop_ms)[index], pa.int64())
        )




def late_table(
    rows: pa.Table, starts: np.ndarray, ends: np.ndarray, tags: pa.Array | pa.ChunkedArray
) -> pa.Table:
    """A late row (``LATE_COLUMNS``) per partial of ``rows`` (segment rows with their stream
    columns, ``prior_heartbeat_ms`` the heartbeat that closed the window), for the window
    ``[starts[i], ends[i])``, with the projected ``tags``."""
    if rows.num_rows == 0:
        return no_late_rows()
    columns = {name: rows.column(name) for name in LATE_COLUMNS
               if name not in ("tags", "window_start_ms", "window_end_ms")}  # fmt: skip
    columns["tags"] = tags
    columns["window_start_ms"] = pa.array(starts, pa.int64())
    columns["window_end_ms"] = pa.array(ends, pa.int64())
    return pa.table({name: columns[name] for name in LATE_COLUMNS})


def no_late_rows() -> pa.Table:
    return pa.table({name: pa.array([], _LATE_TYPES[name]) for name in LATE_COLUMNS})


def _int64(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    array = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=np.int64)


_LATE_TYPES = {
    "metric": pa.string(), "tags": pa.string(), "metric_type": pa.string(),
    "window_start_ms": pa.int64(), "window_end_ms": pa.int64(), "receiver": pa.string(),
    "pane_start_ms": pa.int64(), "count": pa.int64(), "sum": pa.float64(),
    "min": pa.float64(), "max": pa.float64(), "last": pa.float64(),
    "first_recv_ms": pa.int64(), "last_recv_ms": pa.int64(), "prior_heartbeat_ms": pa.int64(),
}  # fmt: skip
