"""What one micro-batch of a tumbling or hopping window publishes: the window's logic object.

``WindowSpec`` (config) compiles into a ``PaneAssigner`` and the spec's ``OpenWindows``;
:class:`PaneWindowLogic` runs them per batch and decides what to publish with the triggers of
``docs/architecture.md`` §5:

- **watermark passed**: every window with data whose end the batch's watermark ``W`` passed
  since the last batch (``W_prev < end <= W``), provisional or, if ``end + allowed_lateness
  <= W`` already, final;
- **straggler**: a window published already and not final whose panes the batch changed, for
  the series it changed;
- **early** (``early_every``): every open window the batch changed, which the store holds as
  pending and publishes at its ticks (``store._EARLY``).

Windows final by ``W`` leave ``OpenWindows`` after the batch; a later partial for them is late
(``PaneAssigner.assign``'s ``final_through_ms``). Everything here is a function of the
partials and the watermarks, so a batch run again gives the same rows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from streamgauge.configs import WindowSpec
from streamgauge.sketches.accuracy import SketchParams
from streamgauge.sketches.quantile_kernels import quantile_kernel
from streamgauge.windows.assign import PaneAssigner
from streamgauge.windows.open_windows import OpenWindows
from streamgauge.windows.window_rows import Windows


@dataclass(frozen=True)
class Step:
    """A batch's outcome: the windows to publish and the late partials to record."""

    publish: Windows
    late: pa.Table
    watermark_ms: int | None
    retracted: pa.Table | None = None
    """Stored windows the published ones replace (a session that grew or merged): ``metric``,
    ``tags``, ``window_start_ms``, ``window_end_ms``."""


def passed_starts(
    open_windows: OpenWindows, previous_ms: int | None, watermark_ms: int | None
) -> dict[int, pa.Array | None]:
    """The trigger "watermark passed": the starts of the held windows whose end the batch's
    watermark passed since the previous one's, every series of each (``None``)."""
    if watermark_ms is None:
        return {}
    return dict.fromkeys(open_windows.window_starts(previous_ms, watermark_ms))


def revisable(
    window: WindowSpec, size_ms: int, previous_ms: int | None, passed: dict[int, Any]
) -> Callable[[int], bool]:
    """The triggers "straggler" and "early": whether the batch publishes again the series a
    batch changed in the window starting at a time: one published already (ending by the
    previous watermark), or any held window with ``early_every``; not those ``passed``
    publishes whole anyway."""

    def again(start: int) -> bool:
        if start in passed:
            return False
        published = previous_ms is not None and start + size_ms <= previous_ms
        return published or window.early_every_ms is not None

    return again


class PaneWindowLogic:
    """One tumbling or hopping window spec's windows across batches (module docstring)."""

    def __init__(self, window: WindowSpec, params: SketchParams) -> None:
        self.window = window
        self.open = OpenWindows(PaneAssigner.of(window), params,
            quantile_kernel(window.quantiles, params))
        self.watermark_ms: int | None = None
        """The watermark of the last batch: windows ending at or before it are published."""

    def step(self, partials: pa.Table, watermark_ms: int | None) -> Step:
        """Run one batch: ``partials`` are its segments' rows, ``watermark_ms`` its watermark
        (None: no heartbeat yet; never below the previous one)."""
        assigner = self.open.assigner
        previous = self.watermark_ms
        assigned = assigner.assign(partials, previous)
        self.open.absorb(assigned.on_time)
        starts = passed_starts(self.open, previous, watermark_ms)
        again = revisable(self.window, assigner.size_ms, previous, starts)
        starts.update(self.open.starts_touched(assigned.on_time, again))
        publish = self.open.windows(starts)
        if watermark_ms is not None:
            self.watermark_ms = watermark_ms
            self.open.evict(watermark_ms - self.window.allowed_lateness_ms)
        return Step(publish, assigned.late, watermark_ms)

    def rebuild(self, partials: Iterable[pa.Table], watermark_ms: int | None) -> None:
        """The open windows as they were after the batch that committed ``watermark_ms``,
        from the log's segments that may hold their partials (``docs/architecture.md`` §4):
        nothing is published, no late row recorded again."""
        for table in partials:
            self.open.absorb(self.open.assigner.assign(table, watermark_ms).on_time)
        self.watermark_ms = watermark_ms
        if watermark_ms is not None:
            self.open.evict(watermark_ms - self.window.allowed_lateness_ms)

    def resume_from_ms(self) -> int | None:
        """The earliest heartbeat of a segment that may hold a partial of a window not final
        at the last batch's watermark (None: every segment), what a restart reads again:
        the oldest such window starts after ``W - allowed_lateness - size``, and a partial's
        event time is at most its segment's heartbeat."""
        if self.watermark_ms is None:
            return None
        return self.watermark_ms - self.window.allowed_lateness_ms - self.open.assigner.size_ms

    def unpublished(self, watermark_ms: int) -> Windows:
        """The open windows the watermark has not passed (to park them in the store)."""
        latest = max((pane for pane, _ in self.open.panes()), default=None)
        if latest is None:
            return self.open.windows({})
        size = self.open.assigner.size_ms
        return self.open.windows(
            dict.fromkeys(self.open.window_starts(watermark_ms, latest + size))
        )
