"""The sessions of one session window spec: the one place they live, as columns.

``docs/architecture.md`` §4. A series (metric, the ``group_by`` tags and the ``key`` tag) has
sessions: each partial at event time ``t = min(pane_start, segment heartbeat)`` opens
``[t, t + gap)``, and sessions that overlap or touch merge, as Spark's ``session_window``
draws them (events exactly one gap apart are one session). Timeline (gap 3 s), one series::

    t (s)        0    1    2    3    4    5    6    7    8    9   10   11
    events       x         x                   x         x
    sessions     [0 ........ 2 ........ 5)     [6 ........ 8 ........ 11)
                                               6 > 5: a new session

    a straggler at 5 s: [5, 8) touches both (5 <= 5, 6 <= 8): one session [0, 11)

Each session is a row of ``window_rows.AggregateRows`` with its bounds; a batch's partials are
merged into their sessions by one compiled call per segment (a new session starts empty, a
merge of sessions first folds them by start, then the partials in log order).

Lateness, per partial (``W' = prior heartbeat of its segment - watermark_delay``, or the
watermark the job committed if that is later: a final session stays final whichever receiver
brings the partial):

- ``t + gap + allowed_lateness <= W'``: the session it would open is final already: late,
  with the bounds ``[t, t + gap)``;
- it touches a session final by ``W'`` (``end + allowed_lateness <= W'``): late, with that
  session's bounds (the earliest such), and the session stays as it is;
- otherwise it joins (or opens) a session.

Segments are taken one at a time, in log order: a session final by one segment's ``W'`` was
held before that segment (a session a partial opens or extends is not final by that
partial's own ``W'``), so each decision is the same however Spark cuts the batches.

A session is kept until no partial can reach it (``end + gap + allowed_lateness <= W``: a
partial that touches it is late by its own session). What a batch publishes is decided by
``SessionWindowLogic``; this module keeps for each session whether its row is stored and
whether it changed since, and the stored keys a merge or an extension replaces.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from streamgauge.configs import WindowSpec
from streamgauge.sketches.accuracy import SketchParams
from streamgauge.sketches.quantile_kernels import quantile_kernel
from streamgauge.windows.assign import SeriesSelector, late_table, no_late_rows
from streamgauge.windows.batch_log import segment_ranges
from streamgauge.windows.open_windows import SeriesIndex
from streamgauge.windows.window_rows import (
    AggregateRows,
    Partials,
    WindowBuilder,
    Windows,
    array_of,
    ints_of,
)

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

_TIME_BITS = 40
"""Bits of a time offset in a (series, time) sort key: 2**40 ms is about 35 years."""


def session_series_keys(window: WindowSpec) -> tuple[str, ...]:
    """The tags that tell a session window's series apart: ``group_by`` and ``key`` (a series
    without that tag is one series of its own, not dropped)."""
    if window.key and window.key not in window.group_by:
        return (*window.group_by, window.key)
    return tuple(window.group_by)


@dataclass(frozen=True)
class SegmentOutcome:
    """What one segment did to the sessions."""

    late: pa.Table
    """Late partials (``assign.LATE_COLUMNS``), one row each."""
    replaced: pa.Table
    """Stored sessions (``metric``, ``tags``, ``window_start_ms``, ``window_end_ms``) a merge
    or extension replaced: the store deletes them with the batch that writes the new ones."""


class OpenSessions:
    """The sessions of one session window spec (module docstring)."""

    def __init__(self, window: WindowSpec, params: SketchParams) -> None:
        if window.kind != "session" or window.gap_ms is None:
            raise ValueError(f"window {window.name!r}: sessions need kind session and a gap")
        self.gap_ms = window.gap_ms
        self.lateness_ms = window.allowed_lateness_ms
        self.delay_ms = window.watermark_delay_ms
        self.select = SeriesSelector(tuple(window.metrics), session_series_keys(window))
        self._quantiles = quantile_kernel(window.quantiles, params)
        self.series = SeriesIndex()
        self._build = WindowBuilder(self.series, params, self._quantiles)
        self.rows = AggregateRows(self._quantiles)
        self.start = np.zeros(0, np.int64)
        self.end = np.zeros(0, np.int64)
        self.stored = np.zeros(0, np.bool_)
        """Its row is in the store (published, or waiting in ``window_pending``)."""
        self.changed = np.zeros(0, np.bool_)
        """New or changed since its row was last stored."""
        self.rewrite = np.zeros(0, np.bool_)
        """It replaces a stored row: written at once, even before the watermark passes its end
        (the store then still holds every sample the job took)."""

    @property
    def num_rows(self) -> int:
        return self.rows.num_rows

    def absorb(self, partials: pa.Table, final_through_ms: int | None) -> SegmentOutcome:
        """Take a batch's partials (segment rows with ``receiver``, ``segment_heartbeat_ms``
        and ``prior_heartbeat_ms``), segment by segment in their order; ``final_through_ms``:
        the watermark the job committed (None: the log's own rule only)."""
        rows = partials.filter(self.select.wanted(partials.column("metric")))
        late: list[pa.Table] = []
        replaced: list[pa.Table] = []
        for lo, hi in segment_ranges(rows):
            outcome = self._absorb_segment(rows.slice(lo, hi - lo), final_through_ms)
            late.append(outcome.late)
            replaced.append(outcome.replaced)
        if not late:
            return SegmentOutcome(no_late_rows(), _keys(self.series, _NONE, _NONE, _NONE))
        return SegmentOutcome(pa.concat_tables(late), pa.concat_tables(replaced))

    def _absorb_segment(self, seg: pa.Table, final_through_ms: int | None) -> SegmentOutcome:
        gap, lateness = self.gap_ms, self.lateness_ms
        t = np.minimum(ints_of(seg, "pane_start_ms"), ints_of(seg, "segment_heartbeat_ms"))
        closed_by = ints_of(seg, "prior_heartbeat_ms")
        if final_through_ms is not None:
            closed_by = np.maximum(closed_by, final_through_ms + self.delay_ms)
        final_by = closed_by - self.delay_ms
        tags = self.select.project(seg.column("tags"))
        series = self.series.ids(array_of(seg.column("metric")), tags)
        # Held sessions by (series, start); within a series they are disjoint and apart, so
        # their ends are in the same order and the sessions a partial touches are a range.
        order = np.lexsort((self.start, self.rows.series))
        h_series, h_start, h_end = self.rows.series[order], self.start[order], self.end[order]
        base = int(min(h_start.min(initial=int(t.min())), int(t.min())))
        key = _Keys(base)
        lo = np.searchsorted(key.of(h_series, h_end), key.of(series, t), side="left")
        hi = np.searchsorted(key.of(h_series, h_start), key.of(series, t + gap), side="right")
        own_late = t + gap + lateness <= final_by
        late_start, late_end = t.copy(), t + gap
        reaches_final = np.zeros(len(t), np.bool_)
        if len(order):
            # The earliest session it touches is final: it stays as it is.
            first = np.minimum(lo, len(order) - 1)
            reaches_final = ~own_late & (lo < hi) & (h_end[first] + lateness <= final_by)
            late_start[reaches_final] = h_start[first][reaches_final]
            late_end[reaches_final] = h_end[first][reaches_final]
        on_time = ~own_late & ~reaches_final
        late_rows = pa.array(np.flatnonzero(~on_time), pa.int64())
        closing = seg.schema.get_field_index("prior_heartbeat_ms")
        late = late_table(
            seg.set_column(closing, "prior_heartbeat_ms", pa.array(closed_by)).take(late_rows),
            late_start[~on_time], late_end[~on_time], tags.take(late_rows),
        )  # fmt: skip
        kept = np.flatnonzero(on_time)
        if not kept.size:
            return SegmentOutcome(late, _keys(self.series, _NONE, _NONE, _NONE))
        return SegmentOutcome(late, self._merge(seg, kept, series, t, order, lo, hi, key))

    def _merge(
        self, seg: pa.Table, kept: IntArray, series: IntArray, t: IntArray, order: IntArray,
        lo: IntArray, hi: IntArray, key: _Keys,
    ) -> pa.Table:  # fmt: skip
        """Merge the on-time partials ``kept`` into the sessions they touch; the stored keys
        replaced."""
        gap = self.gap_ms
        # The held sessions some kept partial touches (a union of ranges of ``order``).
        marks = np.zeros(len(order) + 1, np.int64)
        np.add.at(marks, lo[kept], 1)
        np.add.at(marks, hi[kept], -1)
        touched = order[np.flatnonzero(np.cumsum(marks)[:-1] > 0)]
        # Intervals: touched sessions, then the partials; runs of overlapping or touching ones
        # of a series become one session each.
        i_series = np.concatenate([self.rows.series[touched], series[kept]])
        i_start = np.concatenate([self.start[touched], t[kept]])
        i_end = np.concatenate([self.end[touched], t[kept] + gap])
        by = np.lexsort((i_start, i_series))
        s_series, s_start, s_end = i_series[by], i_start[by], i_end[by]
        reach = np.maximum.accumulate(key.of(s_series, s_end))
        new_run = np.ones(len(by), np.bool_)
        new_run[1:] = (s_series[1:] != s_series[:-1]) | (
            key.of(s_series[1:], s_start[1:]) > reach[:-1]
        )
        run_of_sorted = np.cumsum(new_run) - 1
        run = np.empty(len(by), np.int64)
        run[by] = run_of_sorted
        n_runs = int(run_of_sorted[-1]) + 1
        run_start = np.full(n_runs, np.iinfo(np.int64).max)
        run_end = np.full(n_runs, np.iinfo(np.int64).min)
        np.minimum.at(run_start, run, i_start)
        np.maximum.at(run_end, run, i_end)
        run_series = np.zeros(n_runs, np.int64)
        run_series[run] = i_series
        held_run = run[: len(touched)]
        held_per_run = np.bincount(held_run, minlength=n_runs)
        run_stored = np.zeros(n_runs, np.bool_)
        np.logical_or.at(run_stored, held_run, self.stored[touched])

        # Every run gets one target row: its one held session, or a new row (empty, or the
        # merge of its held sessions by start).
        target = np.full(n_runs, -1, np.int64)
        single = held_per_run[held_run] == 1
        target[held_run[single]] = touched[single]
        replaced_rows = [touched[~single]]  # sessions merged into a new row go away
        merging = np.flatnonzero(held_per_run >= 2)
        if merging.size:
            members = np.flatnonzero(np.isin(held_run, merging))
            members = members[np.lexsort((self.start[touched[members]], held_run[members]))]
            owner = np.searchsorted(merging, held_run[members])
            merged, hll = self._build.merged(
                [(self.rows, touched[members])], owner, len(merging)
            )
            new_rows = self.rows.add_rows(run_series[merging])
            self.rows.absorb(new_rows, Partials.of_merged(merged, hll.images))
            target[merging] = new_rows
        fresh = np.flatnonzero(target < 0)
        if fresh.size:
            target[fresh] = self.rows.add_rows(run_series[fresh])
        n_new = self.rows.num_rows - len(self.start)
        self.start = np.concatenate([self.start, np.zeros(n_new, np.int64)])
        self.end = np.concatenate([self.end, np.zeros(n_new, np.int64)])
        self.stored = np.concatenate([self.stored, np.zeros(n_new, np.bool_)])
        self.changed = np.concatenate([self.changed, np.zeros(n_new, np.bool_)])
        self.rewrite = np.concatenate([self.rewrite, np.zeros(n_new, np.bool_)])
        # The partials, in log order, into their run's row.
        partial_run = run[len(touched) :]
        self.rows.absorb(target[partial_run], Partials.of(seg, kept, self._quantiles))
        # Bounds: a held session whose bounds move is replaced in the store (a new key).
        moved = (self.start[target] != run_start) | (self.end[target] != run_end)
        replaced_rows.append(target[moved & self.stored[target]])
        gone = np.concatenate(replaced_rows)
        replaced = _keys(self.series, self.rows.series[gone], self.start[gone], self.end[gone],
                         stored=self.stored[gone])  # fmt: skip
        self.start[target] = run_start
        self.end[target] = run_end
        self.stored[target] = self.stored[target] & ~moved
        self.changed[target] = True
        self.rewrite[target] |= run_stored & ~self.stored[target]
        dead = np.zeros(self.num_rows, np.bool_)
        dead[touched[~single]] = True
        if dead.any():
            self._keep(~dead)
        return replaced

    def windows(self, rows: IntArray) -> Windows:
        """The sessions ``rows`` as window rows (``WINDOW_SCHEMA``), in that order."""
        if not rows.size:
            return self._build.none()
        merged, hll = self._build.merged([(self.rows, rows)], np.arange(len(rows)), len(rows))
        return self._build.rows(self.start[rows], self.end[rows], merged, hll)

    def evict(self, watermark_ms: int) -> None:
        """Forget the sessions no partial can reach any more, and the series left without
        one."""
        alive = self.end + self.gap_ms + self.lateness_ms > watermark_ms
        if not alive.all():
            self._keep(alive)

    def _keep(self, alive: BoolArray) -> None:
        rows = np.flatnonzero(alive)
        held = np.unique(self.rows.series[rows])
        remap = self.series.retain(held) if len(held) < len(self.series) else None
        self.rows.keep(alive, remap if remap is not None else np.arange(len(self.series)))
        self.start, self.end = self.start[rows], self.end[rows]
        self.stored, self.changed = self.stored[rows], self.changed[rows]
        self.rewrite = self.rewrite[rows]


_NONE = np.zeros(0, np.int64)


class _Keys:
    """(series, time) as one sortable int64: the series above the time's offset from
    ``base``."""

    def __init__(self, base: int) -> None:
        self.base = base

    def of(self, series: IntArray, time: IntArray) -> IntArray:
        offset = time - self.base
        if offset.size and (offset.min() < 0 or offset.max() >= 1 << _TIME_BITS):
            raise ValueError("session times span more than 2**40 ms")
        keys: IntArray = (series << _TIME_BITS) + offset
        return keys


def _keys(
    index: SeriesIndex, series: IntArray, start: IntArray, end: IntArray,
    stored: BoolArray | None = None,
) -> pa.Table:  # fmt: skip
    """Session keys (``metric``, ``tags``, ``window_start_ms``, ``window_end_ms``) of the
    stored ones among them."""
    keep = np.ones(len(series), np.bool_) if stored is None else stored
    take = pa.array(series[keep], pa.int64())
    return pa.table({
        "metric": index.metric.take(take), "tags": index.tags.take(take),
        "window_start_ms": pa.array(start[keep], pa.int64()),
        "window_end_ms": pa.array(end[keep], pa.int64()),
    })  # fmt: skip
