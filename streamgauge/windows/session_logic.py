"""What one micro-batch of a session window publishes: the window's logic object.

``WindowSpec`` (config, ``kind: session``) compiles into the spec's ``OpenSessions``;
:class:`SessionWindowLogic` runs it per batch with the triggers of ``docs/architecture.md``
§5, as ``PaneWindowLogic`` does for tumbling and hopping windows:

- **watermark passed**: a new or changed session whose end the batch's watermark ``W``
  passed, provisional or, if ``end + allowed_lateness <= W`` already, final;
- **straggler**: a published session a partial extended or merged with another: the new
  session is published and the rows it replaces are retracted in the same commit, so no
  reader sees two overlapping sessions of a series;
- a session that replaces a stored row but ends after ``W`` is written at once (it waits in
  ``window_pending``), so the store keeps holding its samples.

Everything here is a function of the partials and the watermarks: a batch run again gives the
same rows.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pyarrow as pa

from streamgauge.configs import WindowSpec
from streamgauge.sketches.accuracy import SketchParams
from streamgauge.windows.open_sessions import OpenSessions
from streamgauge.windows.pane_logic import Step
from streamgauge.windows.window_rows import Windows


class SessionWindowLogic:
    """One session window spec's sessions across batches (module docstring)."""

    def __init__(self, window: WindowSpec, params: SketchParams) -> None:
        self.window = window
        self.open = OpenSessions(window, params)
        self.watermark_ms: int | None = None
        """The watermark of the last batch: sessions ending at or before it are published."""

    def step(self, partials: pa.Table, watermark_ms: int | None) -> Step:
        """Run one batch: ``partials`` are its segments' rows, ``watermark_ms`` its watermark
        (None: no heartbeat yet; never below the previous one)."""
        outcome = self.open.absorb(partials, self.watermark_ms)
        if watermark_ms is None:
            return Step(self.open.windows(np.zeros(0, np.int64)), outcome.late, None,
                        outcome.replaced)  # fmt: skip
        o = self.open
        due = np.flatnonzero(o.changed & ((o.end <= watermark_ms) | o.rewrite))
        publish = o.windows(due)
        o.stored[due] = True
        o.changed[due] = False
        o.rewrite[due] = False
        self.watermark_ms = watermark_ms
        o.evict(watermark_ms)
        return Step(publish, outcome.late, watermark_ms, outcome.replaced)

    def rebuild(self, partials: Iterable[pa.Table], watermark_ms: int | None) -> None:
        """The sessions as they were after the batch that committed ``watermark_ms``, from
        the log's segments since ``resume_from_ms`` (``docs/architecture.md`` §4): nothing
        is published, no late row recorded again. Every session counts as stored (a clean
        stop parked those still open); the open ones are published when ``W`` passes them.

        The segments are taken with the log's own lateness rule: the watermarks the job
        committed between them are not known any more."""
        for table in partials:
            self.open.absorb(table, None)
        o = self.open
        o.stored[:] = True
        o.changed[:] = watermark_ms is None or o.end > watermark_ms
        o.rewrite[:] = False
        self.watermark_ms = watermark_ms
        if watermark_ms is not None:
            o.evict(watermark_ms)

    def resume_from_ms(self) -> int | None:
        """The earliest heartbeat of a segment a restart must read again (None: every
        segment): a held session's partials have event times from its start on, and a
        partial's event time is at most its segment's heartbeat."""
        if self.open.num_rows:
            return int(self.open.start.min())
        if self.watermark_ms is None:
            return None
        return self.watermark_ms + self.window.watermark_delay_ms + 1

    def unpublished(self, watermark_ms: int) -> Windows:
        """The sessions the watermark has not passed (to park them in the store); they count
        as stored from now on."""
        o = self.open
        rows = np.flatnonzero(o.end > watermark_ms)
        o.stored[rows] = True
        return o.windows(rows)
