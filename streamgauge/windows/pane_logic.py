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

from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from streamgauge.configs import WindowSpec
from streamgauge.sketches.accuracy import SketchParams
from streamgauge.windows.assign import PaneAssigner
from streamgauge.windows.open_windows import OpenWindows, Windows


@dataclass(frozen=True)
class Step:
    """A batch's outcome: the windows to publish and the late partials to record."""

    publish: Windows
    late: pa.Table
    watermark_ms: int | None


class PaneWindowLogic:
    """One tumbling or hopping window spec's windows across batches (module docstring)."""

    def __init__(self, window: WindowSpec, params: SketchParams) -> None:
        self.window = window
        self.open = OpenWindows(PaneAssigner.of(window), params)
        self.watermark_ms: int | None = None
        """The watermark of the last batch: windows ending at or before it are published."""

    def step(self, partials: pa.Table, watermark_ms: int | None) -> Step:
        """Run one batch: ``partials`` are its segments' rows, ``watermark_ms`` its watermark
        (None: no heartbeat yet; never below the previous one)."""
        assigner = self.open.assigner
        previous = self.watermark_ms
        assigned = assigner.assign(partials, previous)
        self.open.absorb(assigned.on_time)
        starts: dict[int, pa.Array | None] = {}
        if watermark_ms is not None:
            starts.update(dict.fromkeys(self.open.window_starts(previous, watermark_ms)))

        def again(start: int) -> bool:
            """Published already (a straggler revises it), or held for early rows."""
            if start in starts:
                return False
            published = previous is not None and start + assigner.size_ms <= previous
            return published or self.window.early_every_ms is not None

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

    def rebuild_from_ms(self, watermark_ms: int | None) -> int | None:
        """The earliest heartbeat of a segment that may hold a partial of a window not final
        at ``watermark_ms`` (None: every segment): the oldest such window starts after
        ``W - allowed_lateness - size``, and a partial's event time is at most its
        segment's heartbeat."""
        if watermark_ms is None:
            return None
        return watermark_ms - self.window.allowed_lateness_ms - self.open.assigner.size_ms
