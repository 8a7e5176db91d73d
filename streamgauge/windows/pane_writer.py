"""The ``foreachBatch`` of a tumbling or hopping window's query: read, step, publish.

Per micro-batch (``docs/architecture.md`` §3–§5):

1. the segments between the previous batch's offsets and this one's are read as Arrow
   (``batch_log``; the batch's DataFrame is never collected, so no row enters the JVM);
2. the window's logic (``PaneWindowLogic``) places them in its open windows and says which
   windows to publish and which partials are late;
3. the store takes them in one transaction with the batch's id (a batch Spark runs again
   after a crash changes nothing), its revision, its watermark and the finalization.

The open windows live only in this process. A new writer (a start, or a restart after a
failure) rebuilds them from the log before its first batch: the segments that may hold
partials of windows not final at the watermark the store committed last (decision D4).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.clock import Clock
from streamgauge.configs import PipelineConfig, WindowSpec
from streamgauge.ingest.spool_fs import SpoolLike
from streamgauge.sinks.store import Finalization, ResultStore
from streamgauge.sketches.accuracy import SketchParams
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.windows.batch_log import batch_offsets, partials_since, read_partials
from streamgauge.windows.pane_logic import PaneWindowLogic
from streamgauge.windows.results import (
    LateRowsOrigin,
    histogram_rows,
    late_query_name,
    query_name,
    revision_base,
    to_late_rows,
    to_result_rows,
)
from streamgauge.windows.source import receivers_heartbeat_ms

log = logging.getLogger(__name__)

NO_WATERMARK_MS = 0
"""Before any heartbeat: every window is held (all event times are after the epoch)."""


class PaneWindowsWriter:
    """``foreachBatch`` of one tumbling or hopping window (module docstring)."""

    def __init__(
        self,
        config: PipelineConfig,
        window: WindowSpec,
        store: ResultStore,
        checkpoint: Path,
        clock: Clock,
        spool: SpoolLike,
        params: SketchParams,
    ) -> None:
        self._config = config
        self._window = window
        self._store = store
        self._checkpoint = checkpoint
        self._clock = clock
        self._spool = spool
        self._params = params
        self._layout = HdrLayout.from_params(params)
        self.name = query_name(config, window)
        self._state_key = f"watermark_ms:{window.name}"
        self._logic: PaneWindowLogic | None = None
        self._revision_base: int | None = None
        self._last_revision: int | None = None
        self._parked = False
        """The open windows are in ``window_pending`` as they are now (no row came since)."""
        store.error_labels = {"config": config.name, "query": self.name}

    def revision(self, batch_id: int) -> int:
        """Strictly increasing across batches and checkpoints; the same when a batch runs
        again (``results.revision_base``)."""
        if self._revision_base is None:
            # A new checkpoint also forgets what the first design kept in the store for the
            # window (its held snapshot and panes): the log rebuilds the open windows here.
            self._revision_base = revision_base(
                self._checkpoint, self._store, self._config, self._window, [self.name],
                forget_panes=True, forget_held=True,
                late_rows=LateRowsOrigin(self._spool, self._checkpoint.name),
            )  # fmt: skip
        return self._revision_base + batch_id + 1

    def __call__(self, _batch: Any, batch_id: int) -> None:
        try:
            self._run(batch_id)
        except BaseException:
            self._logic = None  # rebuilt from the log before the batch runs again
            raise

    def _run(self, batch_id: int) -> None:
        revision = self.revision(batch_id)
        start, end = batch_offsets(self._checkpoint, batch_id)
        committed = self._store.read_state(self._config.name, self._state_key)
        logic = self._logic or self._rebuilt(start, committed)
        partials = read_partials(self._spool, start, end)
        heartbeat = receivers_heartbeat_ms(end)
        watermark = None if heartbeat is None else heartbeat - self._window.watermark_delay_ms
        if committed is not None:  # never back: a receiver joining late has older heartbeats
            watermark = committed if watermark is None else max(watermark, committed)
        previous = logic.watermark_ms
        step = logic.step(partials, watermark)
        config, window = self._config, self._window
        rows = to_result_rows(
            step.publish.table, config, window, revision=revision, watermark_ms=watermark,
            emitted_at_ms=self._clock.now_ms(),
        )  # fmt: skip
        rows, fresh = self._split_fresh(rows, previous, watermark)
        histograms = histogram_rows(
            step.publish.table, step.publish.hdr, config, window, revision=revision,
            layout=self._layout,
        )  # fmt: skip
        every_stream_closed = bool(end) and all(p.get("closed") for p in end.values())
        if partials.num_rows and not every_stream_closed:
            self._parked = False
        elif not self._parked and watermark is not None:
            # The input went quiet, or every receiver stopped: the store holds the open windows
            # too (``window_pending``, ``park``), so a reader sees every sample the log gave
            # the job; once per lull.
            parked = self._open_rows(logic, revision, watermark)
            if parked is not None:
                rows = pa.concat_tables([rows, parked[0]])
                histograms = pa.concat_tables([histograms, parked[1]])
            self._parked = True
        late = to_late_rows(step.late, config, window) if step.late.num_rows else None
        key = (config.name, window.name)
        finalizations = []
        state: dict[tuple[str, str], int] = {}
        if watermark is not None:
            finalizations.append(
                Finalization(config.name, window.name, watermark, window.allowed_lateness_ms)
            )
            state[(config.name, self._state_key)] = watermark
        early = {} if window.early_every_ms is None else {key: window.early_every_ms}
        outcome = self._store.commit_batch(
            self.name, batch_id, rows, finalizations, revision=revision, state=state,
            lock_name=self.name, hold_after={key: watermark or NO_WATERMARK_MS},
            late=late, late_query_name=late_query_name(config, window), histograms=histograms,
            early_every=early, fresh=fresh,
        )  # fmt: skip
        self._logic = logic
        self._last_revision = revision
        if late is not None:
            log.warning("%s batch %d: %d late partial(s) recorded in late_events",
                        self.name, batch_id, late.num_rows)  # fmt: skip
        log.debug("%s batch %d: %s", self.name, batch_id, outcome)

    def park(self) -> int:
        """Write the windows still open into ``window_pending``, at the last batch's
        revision; returns how many. For a clean stop: the store then holds every sample the
        log gave the job (the accounting a reader can check), and the next start, which
        rebuilds them from the log, publishes them as usual (``store._PROMOTE`` drops the
        parked row when the watermark passes its end). Parking again changes nothing."""
        logic, revision = self._logic, self._last_revision
        if self._parked or logic is None or revision is None or logic.watermark_ms is None:
            return 0
        parked = self._open_rows(logic, revision, logic.watermark_ms)
        if parked is None:
            return 0
        rows, histograms = parked
        config, window = self._config, self._window
        self._store.commit_batch(
            f"{self.name}.parked", revision, rows, [], revision=revision, lock_name=self.name,
            hold_after={(config.name, window.name): logic.watermark_ms}, histograms=histograms,
        )  # fmt: skip
        self._parked = True
        return int(rows.num_rows)

    def _open_rows(
        self, logic: PaneWindowLogic, revision: int, watermark: int
    ) -> tuple[pa.Table, pa.Table] | None:
        """The windows the watermark has not passed, as result and histogram rows (None:
        none)."""
        latest = max((pane for pane, _ in logic.open.panes()), default=None)
        if latest is None:
            return None
        size = logic.open.assigner.size_ms
        windows = logic.open.windows(dict.fromkeys(logic.open.window_starts(watermark,
                                                                            latest + size)))
        if not windows.num_rows:
            return None
        config, window = self._config, self._window
        rows = to_result_rows(
            windows.table, config, window, revision=revision, watermark_ms=watermark,
            emitted_at_ms=self._clock.now_ms(),
        )  # fmt: skip
        histograms = histogram_rows(
            windows.table, windows.hdr, config, window, revision=revision, layout=self._layout
        )
        return rows, histograms

    def _split_fresh(
        self, rows: pa.Table, previous: int | None, watermark: int | None
    ) -> tuple[pa.Table, pa.Table | None]:
        """The rows for the store's upsert, and the windows published for the first time
        (their end passed by this batch's watermark, not the previous one's), which the store
        copies straight into ``window_results`` (``commit_batch(fresh=...)``): at 100k series
        most of a batch that closes a window. A window with ``early_every`` has rows stored
        before its end, so all of its rows take the upsert."""
        if watermark is None or self._window.early_every_ms is not None or not rows.num_rows:
            return rows, None
        ends = rows.column("window_end_ms")
        first = pc.less_equal(ends, watermark)
        if previous is not None:
            first = pc.and_(first, pc.greater(ends, previous))
        fresh = rows.filter(first)
        if not fresh.num_rows:
            return rows, None
        return rows.filter(pc.invert(first)), fresh

    def _rebuilt(self, start: dict[str, dict[str, Any]], committed: int | None) -> PaneWindowLogic:
        """The open windows as of the batch before this one (``PaneWindowLogic.rebuild``)."""
        logic = PaneWindowLogic(self._window, self._params)
        if start:
            logic.rebuild(
                partials_since(self._spool, start, logic.rebuild_from_ms(committed)), committed
            )
            log.info("%s: %d open pane rows rebuilt from the log", self.name,
                     logic.open.num_rows)  # fmt: skip
        return logic

