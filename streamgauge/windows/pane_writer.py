"""The ``foreachBatch`` of a window's query (tumbling, hopping, session): read, step, publish.

Per micro-batch (``docs/architecture.md`` §3–§5):

1. the segments between the previous batch's offsets and this one's are read as Arrow
   (``batch_log``; the batch's DataFrame is never collected, so no row enters the JVM);
2. the window's logic (``PaneWindowLogic``, ``SessionWindowLogic``) places them in its open
   windows and says which windows to publish, which stored ones they replace, and which
   partials are late;
3. the store takes them in one transaction with the batch's id (a batch Spark runs again
   after a crash changes nothing), its revision, its watermark and the finalization.

The open windows live only in this process. A new writer (a start, or a restart after a
failure) rebuilds them from the log before its first batch: the segments from the heartbeat
the last committed batch stored (``resume_from_ms``: those that may hold partials of windows
not final at its watermark; decision D4).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.clock import Clock
from streamgauge.configs import WindowSpec
from streamgauge.sinks.store import Finalization, ResultStore, with_encodings
from streamgauge.sketches.accuracy import SketchParams
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.windows.batch_log import batch_offsets, partials_since, read_partials
from streamgauge.windows.pane_logic import PaneWindowLogic, Step
from streamgauge.windows.plan import QueryPlan, WindowPlan
from streamgauge.windows.results import (
    revision_base,
    to_late_rows,
    to_result_rows,
    with_hdr_buckets,
)
from streamgauge.windows.session_logic import SessionWindowLogic
from streamgauge.windows.sliding_logic import SlidingWindowLogic
from streamgauge.windows.source import every_receiver_closed, receivers_heartbeat_ms
from streamgauge.windows.window_rows import Windows

log = logging.getLogger(__name__)

NO_WATERMARK_MS = 0
"""Before any heartbeat: every window is held (all event times are after the epoch)."""


class WindowLogic(Protocol):
    """A window spec's logic object: its open windows across batches and their triggers."""

    watermark_ms: int | None

    def step(self, partials: pa.Table, watermark_ms: int | None) -> Step: ...

    def rebuild(self, partials: Iterable[pa.Table], watermark_ms: int | None) -> None: ...

    def resume_from_ms(self) -> int | None: ...

    def unpublished(self, watermark_ms: int) -> Windows: ...


def window_logic(window: WindowSpec, params: SketchParams, pane_ms: int) -> WindowLogic:
    """The logic object a window spec compiles into (``pane_ms``: the config's pane)."""
    if window.kind == "session":
        return SessionWindowLogic(window, params)
    if window.kind == "sliding":
        return SlidingWindowLogic(window, params, pane_ms)
    return PaneWindowLogic(window, params)


class PaneWindowsWriter:
    """``foreachBatch`` of one tumbling or hopping window (module docstring)."""

    def __init__(
        self, plan: WindowPlan, query: QueryPlan, store: ResultStore, clock: Clock
    ) -> None:
        config = plan.config
        window = query.window
        self._config = config
        self._window = window
        self._store = store
        self._checkpoint = query.checkpoint
        self._clock = clock
        self._spool = plan.paths.spool
        self._params = plan.sketches
        self._layout = HdrLayout.from_params(plan.sketches)
        self.name = query.name
        self._late_name = query.late_name
        self._state_key = f"watermark_ms:{window.name}"
        self._resume_key = f"resume_from_ms:{window.name}"
        self._logic: WindowLogic | None = None
        self._revision_base: int | None = None
        self._last_revision: int | None = None
        self._parked = False
        """The open windows are in ``window_pending`` as they are now (no row came since)."""
        store.error_labels = {"config": config.name, "query": self.name}

    def revision(self, batch_id: int) -> int:
        """Strictly increasing across batches and checkpoints; the same when a batch runs
        again (``results.revision_base``)."""
        if self._revision_base is None:
            self._revision_base = revision_base(
                self._checkpoint, self._store, self._config, self._window, [self.name],
                late_rows_spool=self._spool,
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
            step.publish.values, config, window, revision=revision, watermark_ms=watermark,
            emitted_at_ms=self._clock.now_ms(),
        )  # fmt: skip
        rows = with_hdr_buckets(rows, step.publish.hdr, self._layout)
        rows, fresh, fresh_encodings = self._split_fresh(rows, step.publish, previous, watermark)
        every_stream_closed = every_receiver_closed(end)
        retractions = None
        if step.retracted is not None and step.retracted.num_rows:
            n = step.retracted.num_rows
            retractions = pa.table({
                "config_name": pa.array([config.name] * n, pa.string()),
                "window_name": pa.array([window.name] * n, pa.string()),
                **{name: step.retracted.column(name) for name in step.retracted.column_names},
            })  # fmt: skip
        if partials.num_rows and not every_stream_closed:
            self._parked = False
        elif not self._parked and watermark is not None:
            # The input went quiet, or every receiver stopped: the store holds the open windows
            # too (``window_pending``, ``park``), so a reader sees every sample the log gave
            # the job; once per lull.
            parked = self._open_rows(logic, revision, watermark)
            if parked is not None:
                # Every open window, the ones this step wrote before their end (a merged
                # session, an early row) among them: each once in the commit.
                passed = pc.less_equal(rows.column("window_end_ms"), watermark)
                rows = pa.concat_tables([rows.filter(passed), parked])
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
        resume = logic.resume_from_ms()
        if resume is not None:
            state[(config.name, self._resume_key)] = resume
        early = {} if window.early_every_ms is None else {key: window.early_every_ms}
        outcome = self._store.commit_batch(
            self.name, batch_id, rows, finalizations, revision=revision, state=state,
            lock_name=self.name, hold_after={key: watermark or NO_WATERMARK_MS},
            late=late, late_query_name=self._late_name,
            early_every=early, fresh=fresh, fresh_encodings=fresh_encodings,
            retractions=retractions,
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
        config, window = self._config, self._window
        self._store.commit_batch(
            f"{self.name}.parked", revision, parked, [], revision=revision, lock_name=self.name,
            hold_after={(config.name, window.name): logic.watermark_ms},
        )  # fmt: skip
        self._parked = True
        return int(parked.num_rows)

    def _open_rows(
        self, logic: WindowLogic, revision: int, watermark: int
    ) -> pa.Table | None:
        """The windows the watermark has not passed, as result rows (None: none)."""
        windows = logic.unpublished(watermark)
        if not windows.num_rows:
            return None
        config, window = self._config, self._window
        rows = to_result_rows(
            windows.values, config, window, revision=revision, watermark_ms=watermark,
            emitted_at_ms=self._clock.now_ms(),
        )  # fmt: skip
        return with_hdr_buckets(with_encodings(rows, windows.encodings), windows.hdr, self._layout)

    def _split_fresh(
        self, rows: pa.Table, windows: Windows, previous: int | None, watermark: int | None
    ) -> tuple[pa.Table, pa.Table | None, Callable[[], pa.Table] | None]:
        """``rows`` (``windows``' values as result rows) split: the rows for the store's
        upsert, with their encodings; the windows published for the first time (their end
        passed by this batch's watermark, not the previous one's), which the store copies
        straight into ``window_results`` (``commit_batch(fresh=...)``): at 100k series most
        of a batch that closes a window; and their encodings, made only once the store asks
        for them (after their rows are committed). A window with ``early_every`` has rows
        stored before its end, so all of its rows take the upsert."""
        if watermark is None or self._window.early_every_ms is not None or not rows.num_rows:
            return with_encodings(rows, windows.encodings), None, None
        ends = rows.column("window_end_ms")
        first = pc.less_equal(ends, watermark)
        if previous is not None:
            first = pc.and_(first, pc.greater(ends, previous))
        if pc.all(first).as_py():  # a closing batch: no copy of 100k rows and sketches
            return rows.slice(0, 0), rows, lambda: windows.encodings
        if not pc.any(first).as_py():
            return with_encodings(rows, windows.encodings), None, None
        again = pc.invert(first)
        upsert = with_encodings(rows.filter(again), windows.encodings.filter(again))
        return upsert, rows.filter(first), lambda: windows.encodings.filter(first)

    def _rebuilt(self, start: dict[str, dict[str, Any]], committed: int | None) -> WindowLogic:
        """The open windows as of the batch before this one (the logic's ``rebuild``)."""
        logic = window_logic(self._window, self._params, self._config.pane_ms)
        if start:
            resume = self._store.read_state(self._config.name, self._resume_key)
            logic.rebuild(partials_since(self._spool, start, resume), committed)
            log.info("%s: open windows rebuilt from the log (segments from heartbeat %s)",
                     self.name, resume)  # fmt: skip
        return logic
