"""What one micro-batch of a sliding window publishes: the window's logic object.

Sliding windows (``kind: sliding``) are Kafka Streams' ``SlidingWindows`` at pane
resolution (``p``, the config's ``pane``): for each pane ``u`` a series has data in, its
**left** window ``[u + p - size, u + p)`` and, if data lies in it, its **right** window
``[u + p, u + p + size)``. Timeline (pane 1 s, size 3 s), one series::

    t (s)         -2  -1  0   1   2   3   4   5   6   7   8   9
    panes                 x       x               x
    left of 0     [...........)                                   {0}
    left of 2             [...........)                           {0, 2}
    right of 0                [...........)                       {2}
    left of 6                             [...........)           {6}
    right of 2: [3, 6) and right of 6: [7, 10) hold no data: no window

Every such window starts on a pane, so the series' windows are among the ``size``-wide
windows hopping by one pane: the logic keeps the panes in ``OpenWindows`` as a hopping
window of hop ``p`` does (``PaneAssigner.sliding``), and publishes a candidate window of a
series only where the series' panes define it (left: data in its last pane, on time for it;
right: data in the pane before it). Its value merges the series' panes inside it that were on
time for it, as Kafka's window holds every record that reached it before it closed.

Lateness (``W'`` = prior heartbeat of the partial's segment less the delay, ``L`` =
allowed_lateness; a window is final when ``end + L <= W'``):

- every window that can hold ``t`` is final (``t + size + L <= W'``): late, recorded once,
  with its left window's bounds;
- otherwise it joins its pane; for each final window holding it that the series' panes
  define, a late row with that window's bounds (the window keeps its value).

Triggers as ``PaneWindowLogic``'s (``docs/architecture.md`` §5); a straggler also publishes
its pane's right window when the watermark passed that one. Panes are kept ``size`` longer
than a hopping window keeps them: a straggler's late rows ask whether a pane up to ``size``
before it defined a window.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.configs import WindowSpec
from streamgauge.sketches.accuracy import SketchParams
from streamgauge.sketches.quantile_kernels import quantile_kernel
from streamgauge.windows.assign import LATE_COLUMNS, PaneAssigner, no_late_rows
from streamgauge.windows.batch_log import segment_ranges
from streamgauge.windows.open_windows import OpenWindows, series_keys
from streamgauge.windows.pane_logic import Step, passed_starts, revisable
from streamgauge.windows.window_rows import Windows, ints_of

IntArray = npt.NDArray[np.int64]


class SlidingWindowLogic:
    """One sliding window spec's windows across batches (module docstring)."""

    def __init__(self, window: WindowSpec, params: SketchParams, pane_ms: int) -> None:
        self.window = window
        self.pane_ms = pane_ms
        self.open = OpenWindows(PaneAssigner.sliding(window, pane_ms), params,
            quantile_kernel(window.quantiles, params))
        self.watermark_ms: int | None = None
        """The watermark of the last batch: windows ending at or before it are published."""

    @property
    def size_ms(self) -> int:
        return self.open.assigner.size_ms

    def step(self, partials: pa.Table, watermark_ms: int | None) -> Step:
        """Run one batch: ``partials`` are its segments' rows, ``watermark_ms`` its watermark
        (None: no heartbeat yet; never below the previous one)."""
        previous = self.watermark_ms
        placed, late = [], []
        # Segment by segment: a late partial's rows depend on the panes before it in the log.
        for lo, hi in segment_ranges(partials):
            assigned = self.open.assigner.assign(partials.slice(lo, hi - lo), previous)
            late.append(self._late_rows(assigned.late, assigned.on_time))
            self.open.absorb(assigned.on_time)
            placed.append(assigned.on_time)
        on_time = pa.concat_tables(placed) if placed else None
        starts = passed_starts(self.open, previous, watermark_ms)
        again = revisable(self.window, self.size_ms, previous, starts)
        if on_time is not None:
            touched = self.open.starts_touched(on_time, again)
            for start, keys in self._right_windows(on_time, again).items():
                held = touched.get(start)
                touched[start] = (keys if held is None
                                  else pc.unique(pa.concat_arrays([held, keys])))  # fmt: skip
            starts.update(touched)
        publish = self.open.windows(starts, self.exists)
        if watermark_ms is not None:
            self.watermark_ms = watermark_ms
            self._evict(watermark_ms)
        return Step(publish, pa.concat_tables(late) if late else no_late_rows(), watermark_ms)

    def rebuild(self, partials: Iterable[pa.Table], watermark_ms: int | None) -> None:
        """The panes as they were after the batch that committed ``watermark_ms`` (as
        ``PaneWindowLogic.rebuild``)."""
        for table in partials:
            self.open.absorb(self.open.assigner.assign(table, watermark_ms).on_time)
        self.watermark_ms = watermark_ms
        if watermark_ms is not None:
            self._evict(watermark_ms)

    def resume_from_ms(self) -> int | None:
        """The earliest heartbeat of a segment holding a pane still kept."""
        if self.watermark_ms is None:
            return None
        return self.watermark_ms - self.window.allowed_lateness_ms - 2 * self.size_ms

    def unpublished(self, watermark_ms: int) -> Windows:
        """The open windows the watermark has not passed (to park them in the store)."""
        latest = max((pane for pane, _ in self.open.panes()), default=None)
        if latest is None:
            return self.open.windows({})
        starts = self.open.window_starts(watermark_ms, latest + self.pane_ms + self.size_ms)
        return self.open.windows(dict.fromkeys(starts), self.exists)

    def _evict(self, watermark_ms: int) -> None:
        self.open.evict(watermark_ms - self.window.allowed_lateness_ms - self.size_ms)

    def exists(self, start: int, series: IntArray) -> npt.NDArray[np.bool_]:
        """Whether the series' panes define the window starting at ``start``: data in its last
        pane, on time for it (its left window), or in the pane before it (its right window;
        the caller only asks for series with data inside)."""
        last = self.open.series_in(start + self.size_ms - self.pane_ms, start)
        before = self.open.series_in(start - self.pane_ms)
        return np.isin(series, last) | np.isin(series, before)

    def _right_windows(
        self, placed: pa.Table, again: Callable[[int], bool]
    ) -> dict[int, pa.Array]:
        """Per right window ``[u + p, u + p + size)`` of a pane ``u`` this batch brought data
        to, already published (or early), the series of that pane: the window may be new."""
        if placed.num_rows == 0:
            return {}
        pane = ints_of(placed, "pane_ms")
        keys = series_keys(placed.column("metric"), placed.column("tags"))
        found: dict[int, pa.Array] = {}
        for u in np.unique(pane).tolist():
            start = int(u) + self.pane_ms
            if again(start):
                found[start] = pc.unique(keys.filter(pa.array(pane == u)))
        return found

    def _late_rows(self, late: pa.Table, placed: pa.Table) -> pa.Table:
        """Of the assigner's late rows of one segment (one per final window holding a
        partial), those of windows the series' panes define, as the segment finds them: the
        panes held before it, and its own on-time partials (``placed``) at or before the late
        partial's pane (the log's order within a segment is by event time); one row, its left
        window, for a partial every window of which is final."""
        if late.num_rows == 0:
            return late.select(list(LATE_COLUMNS))
        p, size = self.pane_ms, self.size_ms
        start = ints_of(late, "window_start_ms")
        pane = ints_of(late, "event_pane_ms")
        entirely = ints_of(late, "from_start_ms") > pane
        keep = entirely & (start == pane + p - size)
        partly = np.flatnonzero(~entirely)
        if partly.size:
            take = pa.array(partly, pa.int64())
            series = self.open.series.ids(late.column("metric").take(take),
                                          late.column("tags").take(take))  # fmt: skip
            s, own = start[partly], pane[partly]
            here = self.open.series.ids(placed.column("metric"), placed.column("tags"))
            here_pane = ints_of(placed, "pane_ms")
            defined = np.zeros(len(partly), np.bool_)
            for u in np.unique(np.concatenate([s + size - p, s - p])).tolist():
                at = ((s + size - p == u) | (s - p == u))
                held = self.open.series_in(int(u))
                before = at & (u <= own)
                defined |= at & np.isin(series, held)
                defined |= before & np.isin(series, here[here_pane == u])
            keep[partly] = defined
        return late.filter(pa.array(keep)).select(list(LATE_COLUMNS))
