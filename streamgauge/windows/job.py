"""The Spark job: the streaming queries of a config's windows, partials → windows → store.

``docs/architecture.md`` §3–§5. The queries are those of the config's ``WindowPlan``
(``plan.py``). Every query reads the segment log through the spool source, whose offsets (per
receiver: last segment and its heartbeat) Spark logs before each batch, so the job is
exactly-once over the log. ``revision`` is the batch id + 1 plus the checkpoint's
base (``results.revision_base``); the watermark is ``W = min over open receivers(heartbeat)
- watermark_delay`` from the batch's offsets; a window ``[start, end)`` is final once
``end + allowed_lateness <= W``.

- **Tumbling, hopping, sliding and session windows** (``pane_writer``): one stateless query
  per window whose ``foreachBatch`` reads the batch's segments itself and holds the open
  windows in the driver (``open_windows``, ``open_sessions``; the logic objects
  ``pane_logic``, ``sliding_logic``, ``session_logic``); every metric type takes that one
  path. While no segment brings rows and every window seen is final, the query runs no batch
  (``QuietLane``, its span from the plan: ``plan.quiet_span_ms``).
- **``quantiles: kll`` windows** aggregate every type natively, the pane partials' KLL
  sketches with Spark's ``kll_merge_agg_double`` (p50 and p90 from the merge; p99/p999 NULL:
  KLL's ±1.33 % rank error makes a p99 anywhere in p97.7..p100), their late rows in the same
  query (``kll_lane_with_late_rows``).

``early_every`` (tumbling, hopping, sliding): while the watermark has not passed a window's
end, the store publishes its pending row as an *early* row at each tick ``start + k *
early_every`` the watermark reaches, when a value changed since the last one
(``store._EARLY``). Window ``[0, 10)``, every 2 s::

      W     2     4     6     8     10          10 + lateness
            e     e     e     e     on-time     final          (e: early, if changed)
"""

from __future__ import annotations

import fnmatch
import logging
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from streamgauge.clock import Clock
from streamgauge.configs import PipelineConfig, WindowSpec
from streamgauge.ingest.pane_sketches import SKETCHED_TYPES
from streamgauge.ingest.spool_fs import SpoolLike
from streamgauge.retention import PASSED_OVER_FILE
from streamgauge.sinks.store import (
    Finalization,
    ResultStore,
)
from streamgauge.windows.pane_writer import PaneWindowsWriter
from streamgauge.windows.plan import TRIGGER_INTERVAL, QueryPlan, WindowPlan
from streamgauge.windows.results import REVISION_BASE_FILE as REVISION_BASE_FILE
from streamgauge.windows.results import revision_base as revision_base
from streamgauge.windows.results import to_late_rows as to_late_rows
from streamgauge.windows.results import to_result_rows as to_result_rows
from streamgauge.windows.source import (
    QuietLane,
    batch_heartbeats,
    receivers_heartbeat_ms,
    register_source_for_query,
)

log = logging.getLogger(__name__)


def is_sketched() -> Column:
    """Rows of timers, histograms and distributions (the types with t-digests and KLLs)."""
    return F.col("metric_type").isin(list(SKETCHED_TYPES))


def metric_filter(globs: tuple[str, ...]) -> Column:
    """Globs → one Java regex (``fnmatch.translate`` emits syntax Java's regex also accepts)."""
    if "*" in globs:
        return F.lit(True)
    pattern = "|".join(f"(?:{fnmatch.translate(g)})" for g in globs)
    return F.col("metric").rlike(pattern)


def series_tags(group_by: tuple[str, ...]) -> Column:
    """Keep only the tag keys in ``group_by``; ingest writes sorted-key JSON, and
    ``map_filter`` keeps that order, so equal tag sets give equal strings."""
    if not group_by:
        return F.lit("{}")
    tags = F.from_json(F.col("tags"), "map<string,string>")
    kept = F.map_filter(tags, lambda key, _value: key.isin(list(group_by)))
    return F.to_json(kept)


def assign_windows(source: DataFrame, window: WindowSpec, suffix: str = "") -> DataFrame:
    """Add ``window_start_ms``/``window_end_ms``/``tags``/``late`` (+ ``suffix``) per window.

    Event time is the pane start, capped at the segment's heartbeat: a client timestamp from
    the future (within the ingest skew) counts as "now" rather than dragging the watermark
    ahead of the receivers. A row is **late** for a window when that window was already final
    before the row's segment was written: ``window_end + allowed_lateness <= prior_heartbeat -
    watermark_delay``. Timeline (size 10 s, delay 1 s, lateness 5 s)::

        [0 s ............ 10 s)~~~~~ lateness ~~~~~|
                                  prior heartbeat - 1 s >= 15 s  →  late

    Hopping windows (size 10 s, hop 5 s): an instant belongs to size/hop windows, and a row
    is judged late or on time for each of them separately::

        t = 12 s      [5 s ........... 15 s)
                           [10 s .......... 20 s)

    Here each partial is copied into its size/hop windows (one output row per window): what
    ``quantiles: kll`` windows use. The other windows place a partial once in its hop-wide
    pane (``assign.PaneAssigner``: the same per-window late rule, computed once per
    partial).
    """
    if window.kind not in ("tumbling", "hopping"):
        raise ValueError(f"window {window.name!r}: only tumbling and hopping windows take "
                         f"quantiles: kll, not {window.kind}")
    assert window.size_ms is not None
    size, offset = window.size_ms, window.offset_ms
    step = window.hop_ms if window.kind == "hopping" and window.hop_ms else size
    event_ms = F.least(F.col("pane_start_ms"), F.col("segment_heartbeat_ms"))
    latest_start = event_ms - F.pmod(event_ms - F.lit(offset), F.lit(step))
    if step == size:
        start = latest_start
    else:
        starts = F.sequence(latest_start - F.lit(size - step), latest_start, F.lit(step))
        start = F.explode(starts)
    assigned = source.withColumn(f"window_start_ms{suffix}", start)
    start_col = F.col(f"window_start_ms{suffix}")
    closes_at = start_col + F.lit(size + window.allowed_lateness_ms)
    late = (closes_at <= F.col("prior_heartbeat_ms") - F.lit(window.watermark_delay_ms)) & (
        metric_filter(window.metrics)
    )
    return (
        assigned.withColumn(f"window_end_ms{suffix}", start_col + F.lit(size))
        .withColumn(f"tags{suffix}", series_tags(window.group_by))
        .withColumn(f"late{suffix}", late)
    )


def _on_time(source: DataFrame, window: WindowSpec) -> DataFrame:
    """The window's on-time partials, each with its window, under Spark's watermark (a
    ``quantiles: kll`` window's state): Spark evicts a window once ``window_end <= max(window
    end seen) - (delay + lateness + size)``."""
    assert window.size_ms is not None
    horizon_ms = window.watermark_delay_ms + window.allowed_lateness_ms + window.size_ms
    return (
        assign_windows(source, window)
        .where(metric_filter(window.metrics) & ~F.col("late"))
        .withColumn("window_end_ts", F.timestamp_millis("window_end_ms"))
        .withWatermark("window_end_ts", f"{horizon_ms} milliseconds")
    )


_LATE_COLUMNS = (
    "metric", "tags", "metric_type", "window_start_ms", "window_end_ms", "receiver",
    "pane_start_ms", "count", "sum", "min", "max", "last", "first_recv_ms", "last_recv_ms",
    "prior_heartbeat_ms",
)  # fmt: skip


def aggregate_windows(assigned: DataFrame, kll_k: int | None = None) -> DataFrame:
    """Merge partials per (window, metric, tags): the one definition streaming and replay use.

    ``assigned`` has ``window_end_ts`` (timestamp), ``window_start_ms`` and ``tags`` columns
    (see ``assign_windows``). ``kll_k`` (a ``quantiles: kll`` window): timers, histograms and
    distributions are merged here too, their pane KLLs by ``kll_merge_agg_double(kll, k)``;
    p50/p90 come from the merge and ``sketch`` holds it. Without it (every other window) the
    plan is exactly what it was before KLL existed, so running checkpoints stay valid.
    """
    extra: list[Column] = []
    if kll_k is not None:
        # k passed explicitly: without it the merge adopts the first input's k.
        extra.append(
            F.kll_merge_agg_double(F.when(is_sketched(), F.col("kll")), F.lit(kll_k)).alias("kll")
        )
    grouped = assigned.groupBy("window_end_ts", "window_start_ms", "metric", "tags").agg(
        *_merged_scalars(),
        # Sets: union of the pane HLLs (Spark reads the HLL_8 images ingest writes).
        F.hll_union_agg(
            F.when(F.col("metric_type") == "s", F.col("sketch")), F.lit(True)
        ).alias("sketch"),
        *extra,
    )
    if kll_k is not None:
        return _with_kll_quantiles(grouped)
    return _window_rows(
        grouped, _set_distinct_count(), F.when(_is_set(), F.col("sketch")).alias("sketch")
    )


def _merged_scalars() -> list[Column]:
    """Partials' scalars merged by Spark's own aggregates: the type, counts and sums added,
    extremes compared, ``last`` the value of the latest event."""
    return [
        F.min("metric_type").alias("metric_type"),
        F.sum("count").alias("count"),
        F.sum("sum").alias("sum"),
        F.min("min").alias("min"),
        F.max("max").alias("max"),
        F.max_by("last", "last_event_ms").alias("last"),
    ]


def _window_rows(grouped: DataFrame, *values: Column | str) -> DataFrame:
    """A window aggregation's output row: key, the plain aggregates, then ``values``."""
    return grouped.select(
        "metric", "tags", "metric_type", "window_start_ms",
        F.unix_millis("window_end_ts").alias("window_end_ms"),
        "count", "sum", "min", "max", "last", *values,
    )  # fmt: skip


def _is_set() -> Column:
    return F.col("metric_type") == "s"


def _set_distinct_count() -> Column:
    """``hll_union_agg`` of no sets is an empty HLL, not NULL: only sets keep theirs (a
    counter's ``distinct_count`` is NULL, not 0). Applied after the aggregation: the state
    schema, and so running checkpoints, do not change."""
    return F.when(_is_set(), F.hll_sketch_estimate("sketch").cast("double")).alias(
        "distinct_count"
    )


#: The percentiles a ``quantiles: kll`` window stores (``configs.model.KLL_UNSTORED``: not more).
KLL_QUANTILES = (("p50", 0.5), ("p90", 0.9))


def _with_kll_quantiles(grouped: DataFrame) -> DataFrame:
    """``aggregate_windows``' output for a kll window: p50/p90 from the merged KLL.

    A group without any KLL (a counter, or timers from segments written before ingest built
    KLLs) merges to an *empty* sketch, whose quantile fails the query
    (``KLL_INVALID_INPUT_SKETCH_BUFFER``): such rows get NULL percentiles and no sketch.
    """
    has_kll = F.coalesce(F.kll_sketch_get_n_double("kll"), F.lit(0)) > 0
    ranks = F.array(*(F.lit(q) for _, q in KLL_QUANTILES))
    quantiles = F.when(has_kll, F.kll_sketch_get_quantile_double("kll", ranks))
    return _window_rows(
        grouped,
        *(quantiles[i].alias(name) for i, (name, _) in enumerate(KLL_QUANTILES)),
        _set_distinct_count(),
        # Sets keep their HLL; timers/histograms/distributions get the merged KLL.
        F.when(_is_set(), F.col("sketch")).when(has_kll, F.col("kll")).alias("sketch"),
    )


def kll_lane_with_late_rows(source: DataFrame, window: WindowSpec, kll_k: int) -> DataFrame:
    """A ``quantiles: kll`` window as one query: every type merged natively (``change`` =
    ``upsert``) and the window's late partials (``late``): one query, no late-rows query of
    its own."""
    lane = aggregate_windows(_on_time(source, window), kll_k).withColumn(
        "change", F.lit("upsert")
    )
    late = late_partials(source, window).select(*_LATE_COLUMNS).withColumn(
        "change", F.lit("late")
    )
    return lane.unionByName(late, allowMissingColumns=True)


def late_partials(source: DataFrame, window: WindowSpec) -> DataFrame:
    """Rows that are late for a ``quantiles: kll`` window (stateless, so nothing is dropped
    on the way); they ride in its one query (``kll_lane_with_late_rows``)."""
    return assign_windows(source, window).where(
        # A partial can only be late if it is older than the heartbeat before its segment.
        (F.col("pane_start_ms") < F.col("prior_heartbeat_ms")) & F.col("late")
    )


_KLL_RESULT_COLUMNS = (
    "metric", "tags", "metric_type", "window_start_ms", "window_end_ms", "count", "sum", "min",
    "max", "last", *(name for name, _ in KLL_QUANTILES), "distinct_count", "sketch",
)  # fmt: skip


class WindowBatchWriter:
    """The ``foreachBatch`` of a query whose Spark operator merges the windows (session,
    sliding and ``quantiles: kll`` windows): runs on the driver, hands the store every window
    a batch changed; the store holds those not past the watermark in ``window_pending``."""

    def __init__(
        self,
        config: PipelineConfig,
        query: QueryPlan,
        store: ResultStore,
        clock: Clock,
        *,
        late_rows_spool: SpoolLike | None = None,
    ) -> None:
        """``late_rows_spool``: the spool, given if the query records the window's late
        rows."""
        window = query.window
        self._config = config
        self._window = window
        self._store = store
        self._checkpoint = query.checkpoint
        self._clock = clock
        self._late_rows_spool = late_rows_spool
        self._name = query.name
        self._late_name = query.late_name
        self._state_key = f"watermark_ms:{window.name}"
        self._watermark_floor: int | None = None
        self._revision_base: int | None = None
        store.error_labels = {"config": config.name, "query": self._name}

    def revision(self, batch_id: int) -> int:
        """The batch's revision: strictly increasing across batches and checkpoints."""
        if self._revision_base is None:
            self._revision_base = revision_base(
                self._checkpoint, self._store, self._config, self._window, [self._name],
                late_rows_spool=self._late_rows_spool,
            )  # fmt: skip
        return self._revision_base + batch_id + 1

    def watermark_ms(self, batch_id: int) -> int | None:
        """The batch's watermark: its receivers' heartbeats less the delay, never below one
        already committed (a receiver joining with an older heartbeat lowers the minimum; a
        window already published must not go back to pending)."""
        if self._watermark_floor is None:
            self._watermark_floor = self._store.read_state(self._config.name, self._state_key)
        heartbeat_ms = receivers_heartbeat_ms(batch_heartbeats(self._checkpoint, batch_id))
        if heartbeat_ms is None:
            return self._watermark_floor
        watermark = heartbeat_ms - self._window.watermark_delay_ms
        if self._watermark_floor is not None:
            watermark = max(watermark, self._watermark_floor)
        self._watermark_floor = watermark
        return watermark

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self._commit(batch.toArrow(), batch_id)

    def _commit(
        self,
        changed: pa.Table,
        batch_id: int,
        *,
        retractions: pa.Table | None = None,
        late: pa.Table | None = None,
    ) -> None:
        watermark_ms = self.watermark_ms(batch_id)
        revision = self.revision(batch_id)
        rows = to_result_rows(
            changed, self._config, self._window, revision=revision, watermark_ms=watermark_ms,
            emitted_at_ms=self._clock.now_ms(),
        )  # fmt: skip
        key = (self._config.name, self._window.name)
        finalizations = []
        state: dict[tuple[str, str], int] = {}
        if watermark_ms is not None:
            finalizations.append(Finalization(
                self._config.name, self._window.name, watermark_ms,
                self._window.allowed_lateness_ms,
            ))  # fmt: skip
            state[(self._config.name, self._state_key)] = watermark_ms
        # Until the watermark passes a window's end, its row waits in window_pending, and the
        # store publishes it early every early_every of watermark progress.
        early = {} if self._window.early_every_ms is None else {key: self._window.early_every_ms}
        outcome = self._store.commit_batch(
            self._name, batch_id, rows, finalizations, revision=revision, state=state,
            lock_name=self._name, hold_after={key: watermark_ms or 0}, retractions=retractions,
            late=late, late_query_name=self._late_name, early_every=early,
        )  # fmt: skip
        log.debug("%s batch %d: %s", self._name, batch_id, outcome)


class KllBatchWriter(WindowBatchWriter):
    """``foreachBatch`` of a ``quantiles: kll`` window: its only query, every metric type,
    upserts and late partials in one commit; no HDR buckets."""

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        table = batch.toArrow()
        change = table.column("change")
        late = table.filter(pc.equal(change, "late"))
        changed = table.filter(pc.equal(change, "upsert")).select(list(_KLL_RESULT_COLUMNS))
        late_rows = to_late_rows(late, self._config, self._window) if late.num_rows else None
        self._commit(changed, batch_id, late=late_rows)
        if late_rows is not None:
            log.warning(
                "%s batch %d: %d late partial(s) recorded in late_events",
                self._name, batch_id, late_rows.num_rows,
            )  # fmt: skip


def start_window_queries(
    spark: SparkSession,
    plan: WindowPlan,
    store_factory: Callable[[], ResultStore],
    clock: Clock,
    *,
    trigger_interval: str | None = TRIGGER_INTERVAL,
    pane_writers: list[PaneWindowsWriter] | None = None,
) -> list[StreamingQuery]:
    """Start the streaming query of every window of ``plan``; all share the session.

    Each query gets its own store connection: Spark may run two queries' ``foreachBatch``
    at once, and one connection's transactions must not interleave. ``trigger_interval=None``
    processes what is in the spool now and stops (Spark's ``availableNow``).
    ``pane_writers``: given, the driver-held windows' writers are added to it (a clean stop
    parks their open windows, ``PaneWindowsWriter.park``).
    """
    queries: list[StreamingQuery] = []
    for query in plan.queries:
        if query.lane == "kll":
            # Its late rows ride in its one query (kll_lane_with_late_rows), recorded under
            # its checkpoint (results.checkpoint_generation).
            writer = KllBatchWriter(
                plan.config, query, store_factory(), clock,
                late_rows_spool=plan.paths.spool,
            )  # fmt: skip
            log = _read_spool(spark, plan, query.name)
            changes = kll_lane_with_late_rows(log, query.window, plan.sketches.kll_k)
            queries.append(_start(changes, query.name, query.checkpoint, writer,
                                  trigger_interval, output_mode="update"))  # fmt: skip
            continue
        pane_writer = PaneWindowsWriter(plan, query, store_factory(), clock)
        if pane_writers is not None:
            pane_writers.append(pane_writer)
        # A batch runs only when it changes what a reader sees or its rows have piled up
        # (live only: availableNow takes the whole log).
        quiet = None
        if trigger_interval is not None and query.quiet_span_ms is not None:
            window = query.window
            quiet = QuietLane(
                query.quiet_span_ms, passed_over=str(query.checkpoint / PASSED_OVER_FILE),
                boundaries_ms=query.boundaries_ms, delay_ms=window.watermark_delay_ms,
                lateness_ms=window.allowed_lateness_ms,
            )  # fmt: skip
        source = _read_spool(spark, plan, query.name, quiet)
        queries.append(_start(source, query.name, query.checkpoint, pane_writer,
                              trigger_interval, output_mode="append"))  # fmt: skip
    return queries


def _read_spool(
    spark: SparkSession, plan: WindowPlan, query: str, quiet: QuietLane | None = None
) -> DataFrame:
    """The log as a stream of all its rows, read through ``query``'s own registration of the
    source (see `register_source_for_query` for the Spark race that one shared one loses);
    with ``quiet``, batches only when it has something to do."""
    source = register_source_for_query(spark, query)
    reader = spark.readStream.format(source).option("path", str(plan.paths.spool))
    return reader.options(**(quiet.options() if quiet else {})).load()


def _start(
    frame: DataFrame,
    name: str,
    checkpoint: Path,
    writer: Callable[[DataFrame, int], None],
    trigger_interval: str | None,
    *,
    output_mode: str,
) -> StreamingQuery:
    checkpoint.mkdir(parents=True, exist_ok=True)
    stream = (
        frame.writeStream.queryName(name)
        .outputMode(output_mode)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(writer)
    )
    if trigger_interval is None:
        query = stream.trigger(availableNow=True).start()
    else:
        query = stream.trigger(processingTime=trigger_interval).start()
    _await_sources(query)
    return query


_SOURCE_START_TIMEOUT_S = 120.0


def _await_sources(query: StreamingQuery) -> None:
    """Wait until ``query`` has started its source before the next query starts.

    Each query starts a Python process on the driver for the spool source, and Spark gives a
    new Python process a fixed 10 s to connect back (``PythonWorkerFactory``, not
    configurable). Several queries starting at once on a loaded 2-core machine can miss it
    ("Python worker failed to connect back"); one at a time, each start gets the CPU.
    """
    deadline = time.monotonic() + _SOURCE_START_TIMEOUT_S
    while query.isActive and time.monotonic() < deadline:
        if query.status["message"] != "Initializing sources":
            return
        time.sleep(0.05)
