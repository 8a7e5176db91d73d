"""The open windows of one tumbling or hopping window spec: the one place they live.

``docs/architecture.md`` §4. The job's driver holds, per window spec, the on-time pane
partials of every window not final yet (``PaneAssigner`` placed them), merged per
(series, pane, first on-time window) into a table of ``window_rows.AggregateRows`` (columns,
merged by one compiled call per batch whatever the number of series). A series is an
integer (:class:`SeriesIndex`), so no string is hashed past the batch's first look-up.

A tumbling window is one pane: its table *is* the window, published without a merge. A
hopping window is made of ``size / hop`` panes when it is published (:meth:`OpenWindows.windows`,
one merge per owner, ``window_rows.WindowBuilder``).

A pane leaves once every window holding it is final (:meth:`OpenWindows.evict`). Merging is a
pure function of the partials in their order (batch order, then log order within a batch), so
a batch run again after a crash gives the same values and the same sketch bytes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.sketches.accuracy import SketchParams
from streamgauge.sketches.hll_unions import HllUnions
from streamgauge.sketches.quantile_kernels import QuantileKernel
from streamgauge.windows.assign import PaneAssigner
from streamgauge.windows.window_rows import (
    AggregateRows,
    Merged,
    Partials,
    WindowBuilder,
    Windows,
    array_of,
    ints_of,
)

IntArray = npt.NDArray[np.int64]
Exists = Callable[[int, IntArray], npt.NDArray[np.bool_]]
"""Whether the window starting at a time exists for each of some series (sliding windows)."""


class SeriesIndex:
    """A stable integer per series (metric and projected tags) of one window spec."""

    def __init__(self) -> None:
        self._keys = pa.array([], pa.string())
        self.metric = pa.array([], pa.string())
        self.tags = pa.array([], pa.string())

    def __len__(self) -> int:
        return len(self._keys)

    def ids(self, metric: pa.Array, tags: pa.Array) -> IntArray:
        """The series of each row, new series numbered after the known ones."""
        keys = series_keys(metric, tags)
        found = pc.index_in(keys, value_set=self._keys)
        known = np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), np.int64)
        new_rows = np.flatnonzero(known < 0)
        if new_rows.size:
            fresh = pc.take(keys, pa.array(new_rows, pa.int64()))
            unique = fresh.unique()
            first = np.asarray(pc.index_in(unique, value_set=fresh).to_numpy(), np.int64)
            take = pa.array(new_rows[first], pa.int64())
            base = len(self._keys)
            self._keys = pa.concat_arrays([self._keys, unique])
            self.metric = pa.concat_arrays([self.metric, array_of(metric).take(take)])
            self.tags = pa.concat_arrays([self.tags, array_of(tags).take(take)])
            placed = np.asarray(pc.index_in(fresh, value_set=unique).to_numpy(), np.int64)
            known[new_rows] = base + placed
        return known

    def keys_of(self, series: IntArray) -> pa.Array:
        return self._keys.take(pa.array(series, pa.int64()))

    def retain(self, alive: IntArray) -> IntArray:
        """Keep only the series ``alive`` (sorted unique ids), renumbered ``0..``; returns the
        new id of every old one (-1: gone)."""
        remap = np.full(len(self._keys), -1, np.int64)
        remap[alive] = np.arange(len(alive))
        take = pa.array(alive, pa.int64())
        self._keys, self.metric, self.tags = (
            self._keys.take(take),
            self.metric.take(take),
            self.tags.take(take),
        )
        return remap


class OpenWindows:
    """The panes of one tumbling or hopping window spec's open windows (module docstring)."""

    def __init__(self, assigner: PaneAssigner, params: SketchParams, quantiles: QuantileKernel
                 ) -> None:  # fmt: skip
        """``quantiles``: the kernel of the window's quantile sketch."""
        self.assigner = assigner
        self._quantiles = quantiles
        self.series = SeriesIndex()
        self._build = WindowBuilder(self.series, params, quantiles)
        self._tables: dict[tuple[int, int], AggregateRows] = {}
        """By (pane start, first on-time window start)."""

    @property
    def num_rows(self) -> int:
        """Pane rows held: a series has one per pane (and per first on-time window)."""
        return sum(table.num_rows for table in self._tables.values())

    def panes(self) -> list[tuple[int, int]]:
        """The (pane start, first on-time window start) of every pane table held."""
        return sorted(self._tables)

    @property
    def earliest_pane_ms(self) -> int | None:
        return min((pane for pane, _ in self._tables), default=None)

    def absorb(self, placed: pa.Table) -> None:
        """Add a batch's on-time partials (``Assigned.on_time``), in their order."""
        if placed.num_rows == 0:
            return
        series = self.series.ids(placed.column("metric"), placed.column("tags"))
        pane = ints_of(placed, "pane_ms")
        from_start = ints_of(placed, "from_start_ms")
        for p, f in sorted(set(zip(pane.tolist(), from_start.tolist(), strict=True))):
            rows = np.flatnonzero((pane == p) & (from_start == f))
            table = self._tables.setdefault((p, f), AggregateRows(self._quantiles))
            table.absorb(table.rows_of(series[rows]), Partials.of(placed, rows, self._quantiles))

    def starts_touched(
        self, placed: pa.Table, wanted: Callable[[int], bool]
    ) -> dict[int, pa.Array]:
        """Per window start for which ``wanted(start)``, the series (``metric\\x1ftags``)
        whose window ``placed`` (a batch's on-time rows) changed: what a batch must publish
        again if those windows were published already. The series keys are built only when
        some start is wanted (a straggler's batch), not for every batch."""
        if placed.num_rows == 0:
            return {}
        a = self.assigner
        pane = ints_of(placed, "pane_ms")
        first = np.maximum(ints_of(placed, "from_start_ms"), pane - a.size_ms + a.hop_ms)
        starts = np.unique(np.concatenate(
            [first + j * a.hop_ms for j in range(a.panes_per_window)]
        )).tolist()  # fmt: skip
        starts = [start for start in starts if wanted(int(start))]
        if not starts:
            return {}
        keys = series_keys(placed.column("metric"), placed.column("tags"))
        touched: dict[int, pa.Array] = {}
        for start in starts:
            inside = (first <= start) & (pane >= start) & (pane < start + a.size_ms)
            if inside.any():
                touched[int(start)] = pc.unique(keys.filter(pa.array(inside)))
        return touched

    def window_starts(self, ends_after_ms: int | None, ends_through_ms: int) -> list[int]:
        """Starts of the windows with data whose end is in ``(ends_after, ends_through]``."""
        earliest = self.earliest_pane_ms
        if earliest is None:
            return []
        a = self.assigner
        low = earliest - a.size_ms + a.hop_ms
        if ends_after_ms is not None:
            low = max(low, ends_after_ms - a.size_ms + 1)
        first = low + int(np.mod(a.offset_ms - low, a.hop_ms))
        return list(range(first, ends_through_ms - a.size_ms + 1, a.hop_ms))

    def series_in(self, pane_ms: int, from_start_through_ms: int | None = None) -> IntArray:
        """The series with a partial in pane ``pane_ms`` (on time for the window starting at
        ``from_start_through_ms``, if given)."""
        held = [t.series for (p, f), t in self._tables.items() if p == pane_ms
                and (from_start_through_ms is None or f <= from_start_through_ms)]  # fmt: skip
        return np.unique(np.concatenate(held)) if held else np.zeros(0, np.int64)

    def windows(self, starts: dict[int, pa.Array | None], exists: Exists | None = None) -> Windows:
        """The windows starting at each of ``starts``, of every series with data in them
        (``None``) or of the series listed (``metric\\x1ftags`` keys); with ``exists``, only
        the series for which it says the window exists."""
        parts: list[Windows] = []
        size = self.assigner.size_ms
        for start, listed in sorted(starts.items()):
            tables = [t for (p, f), t in sorted(self._tables.items())
                      if start <= p < start + size and f <= start and t.num_rows]  # fmt: skip
            if tables:
                window = self._window(start, tables, listed, exists)
                if window.num_rows:
                    parts.append(window)
        if not parts:
            return self._build.none()
        if len(parts) == 1:
            return parts[0]
        return Windows.concat(parts)

    def evict(self, final_before_ms: int) -> None:
        """Forget the panes whose every window is final (ends at or before
        ``final_before_ms``): the newest window holding pane ``p`` ends at ``p + size``;
        and the series no pane holds any more."""
        size = self.assigner.size_ms
        gone = [key for key in self._tables if key[0] + size <= final_before_ms]
        for key in gone:
            del self._tables[key]
        if not gone or not len(self.series):
            return
        held = [t.series for t in self._tables.values()]
        alive = np.unique(np.concatenate(held)) if held else np.zeros(0, np.int64)
        if len(alive) == len(self.series):
            return
        remap = self.series.retain(alive)
        for table in self._tables.values():
            table.keep(np.ones(table.num_rows, bool), remap)

    def _window(
        self, start: int, tables: list[AggregateRows], listed: pa.Array | None,
        exists: Exists | None,
    ) -> Windows:  # fmt: skip
        """One window start's rows, merged from its pane tables."""
        picked = []
        for table in tables:
            rows = np.arange(table.num_rows)
            if listed is not None:
                keys = self.series.keys_of(table.series)
                rows = np.flatnonzero(
                    np.asarray(
                        pc.is_in(keys, value_set=listed).to_numpy(zero_copy_only=False), bool
                    )
                )
            if exists is not None and rows.size:
                rows = rows[exists(start, table.series[rows])]
            if rows.size:
                picked.append((table, rows))
        if not picked:
            return self._build.none()
        if len(picked) == 1 and not picked[0][0].hll_rows:
            table, rows = picked[0]
            merged = Merged.of_rows(table, rows)
            hll = HllUnions.none(len(rows))
        else:
            merged, hll = self._build.merged(picked)
        return self._build.rows(start, start + self.assigner.size_ms, merged, hll)


def series_keys(metric: pa.Array | pa.ChunkedArray, tags: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Each row's series key (``metric\x1ftags``), as ``SeriesIndex`` and ``windows``'
    ``listed`` keys spell it."""
    joined = pc.binary_join_element_wise(metric, tags, "\x1f")
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined
