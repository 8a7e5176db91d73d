"""The Spark job: one streaming query per window of a config, partials → windows → store.

For each window spec::

    spool source ─▶ event_time = pane start ─▶ withWatermark(delay + lateness)
        ─▶ filter metrics ─▶ group by (window, metric, tags ∩ group_by) ─▶ merge partials
        ─▶ update output mode ─▶ foreachBatch: revision, is_final ─▶ ResultStore.commit_batch

Emission and revisions (this slice; corrections and replay deepen it):

- Spark's update mode emits a window whenever a micro-batch changes it, so a window's row
  appears early and is revised as data arrives. ``revision`` is the micro-batch id + 1: strictly
  increasing per window and the same when Spark replays a batch after a crash, so the store's
  keep-the-highest-revision upsert makes replays change nothing.
- The watermark of a batch is derived from the receivers' heartbeats recorded in the batch's
  offset (``batch_heartbeats``): ``W = min over open receivers(heartbeat) - watermark_delay``.
  A window ``[start, end)`` is final once ``end + allowed_lateness <= W``; the store marks such
  rows final in the same transaction.
- Spark's own watermark (``delay + lateness`` behind the newest pane) only bounds its state:
  it evicts a window once no straggler may still change it.

Known limit, left for the windows issue: Spark's watermark follows the newest receiver, ours
the slowest; with several receivers far apart, Spark may evict a window a lagging receiver
still feeds.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from streamgauge.clock import Clock
from streamgauge.configs import PipelineConfig, WindowSpec
from streamgauge.sinks.store import Finalization, ResultStore
from streamgauge.windows.source import SOURCE_NAME, batch_heartbeats, receivers_heartbeat_ms

log = logging.getLogger(__name__)

_QUANTILE_COLUMNS = ("p50", "p90", "p99", "distinct_count")


@dataclass(frozen=True)
class JobPaths:
    spool: Path
    checkpoints: Path


def checkpoint_dir(paths: JobPaths, config: PipelineConfig, window: WindowSpec) -> Path:
    """Checkpoint per (config, window definition).

    Spark's state layout is tied to the query's shape; a changed size or lateness under the
    same name gets a fresh checkpoint (and rebuilds from the retained log) instead of a
    start-up failure on incompatible state.
    """
    fingerprint = json.dumps(
        [config.pane_ms, window.kind, window.size_ms, window.offset_ms, window.watermark_delay_ms,
         window.allowed_lateness_ms, list(window.metrics), list(window.group_by)]
    )
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:10]
    return paths.checkpoints / config.name / f"{window.name}-{digest}"


def query_name(config: PipelineConfig, window: WindowSpec) -> str:
    return f"{config.name}.{window.name}"


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


def windowed_partials(source: DataFrame, window: WindowSpec) -> DataFrame:
    """Merge pane partials into the windows of ``window`` (tumbling in this slice)."""
    if window.kind != "tumbling":
        raise NotImplementedError(
            f"window {window.name!r}: kind {window.kind!r} is not implemented yet; "
            "only tumbling windows run in this build"
        )
    assert window.size_ms is not None
    horizon_ms = window.watermark_delay_ms + window.allowed_lateness_ms
    events = source.withColumn("event_time", F.timestamp_millis("pane_start_ms")).withWatermark(
        "event_time", f"{horizon_ms} milliseconds"
    )
    bucket = F.window(
        "event_time", f"{window.size_ms} milliseconds", startTime=f"{window.offset_ms} milliseconds"
    )
    grouped = (
        events.where(metric_filter(window.metrics))
        .withColumn("series_tags", series_tags(window.group_by))
        .groupBy(bucket.alias("w"), F.col("metric"), F.col("series_tags"))
        .agg(
            F.min("metric_type").alias("metric_type"),
            F.sum("count").alias("count"),
            F.sum("sum").alias("sum"),
            F.min("min").alias("min"),
            F.max("max").alias("max"),
            F.max_by("last", "last_event_ms").alias("last"),
        )
    )
    return grouped.select(
        "metric",
        F.col("series_tags").alias("tags"),
        "metric_type",
        F.unix_millis(F.col("w.start")).alias("window_start_ms"),
        F.unix_millis(F.col("w.end")).alias("window_end_ms"),
        "count",
        "sum",
        "min",
        "max",
        "last",
    )


def to_result_rows(
    changed: pa.Table,
    config: PipelineConfig,
    window: WindowSpec,
    *,
    revision: int,
    watermark_ms: int | None,
    emitted_at_ms: int,
) -> pa.Table:
    """Add the identity, revision and finality columns the store expects (vectorised)."""
    n = changed.num_rows
    mtype = changed.column("metric_type")
    is_counter = pc.equal(mtype, "c")
    is_gauge = pc.equal(mtype, "g")
    null_f64 = pa.nulls(n, pa.float64())
    # Aggregates that mean nothing for a type stay NULL rather than showing a number.
    total = pc.if_else(is_gauge, null_f64, changed.column("sum"))
    minimum = pc.if_else(is_counter, null_f64, changed.column("min"))
    maximum = pc.if_else(is_counter, null_f64, changed.column("max"))
    last = pc.if_else(is_gauge, changed.column("last"), null_f64)
    if watermark_ms is None:
        final = pa.array([False] * n, pa.bool_())
    else:
        closes_at = pc.add(changed.column("window_end_ms"), window.allowed_lateness_ms)
        final = pc.less_equal(closes_at, watermark_ms)
    columns: dict[str, pa.Array | pa.ChunkedArray] = {
        "config_name": pa.array([config.name] * n, pa.string()),
        "window_name": pa.array([window.name] * n, pa.string()),
        "metric": changed.column("metric"),
        "tags": changed.column("tags"),
        "metric_type": mtype,
        "window_start_ms": changed.column("window_start_ms"),
        "window_end_ms": changed.column("window_end_ms"),
        "count": changed.column("count"),
        "sum": total,
        "min": minimum,
        "max": maximum,
        "last": last,
    }
    for name in _QUANTILE_COLUMNS:
        columns[name] = null_f64
    columns["revision"] = pa.array([revision] * n, pa.int64())
    columns["is_final"] = final
    columns["late_events"] = pa.array([0] * n, pa.int64())
    columns["emitted_at_ms"] = pa.array([emitted_at_ms] * n, pa.int64())
    return pa.table(columns)


class WindowBatchWriter:
    """The ``foreachBatch`` function of one window query: runs on the driver."""

    def __init__(
        self,
        config: PipelineConfig,
        window: WindowSpec,
        store: ResultStore,
        checkpoint: Path,
        clock: Clock,
    ) -> None:
        self._config = config
        self._window = window
        self._store = store
        self._checkpoint = checkpoint
        self._clock = clock
        self._name = query_name(config, window)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        heartbeat_ms = receivers_heartbeat_ms(batch_heartbeats(self._checkpoint, batch_id))
        watermark_ms = (
            None if heartbeat_ms is None else heartbeat_ms - self._window.watermark_delay_ms
        )
        revision = batch_id + 1
        rows = to_result_rows(
            batch.toArrow(),
            self._config,
            self._window,
            revision=revision,
            watermark_ms=watermark_ms,
            emitted_at_ms=self._clock.now_ms(),
        )
        finalizations = []
        state: dict[tuple[str, str], int] = {}
        if watermark_ms is not None:
            finalizations.append(
                Finalization(
                    self._config.name,
                    self._window.name,
                    watermark_ms,
                    self._window.allowed_lateness_ms,
                )
            )
            state[(self._config.name, f"watermark_ms:{self._window.name}")] = watermark_ms
        outcome = self._store.commit_batch(
            self._name, batch_id, rows, finalizations, revision=revision, state=state
        )
        log.debug("%s batch %d: %s", self._name, batch_id, outcome)


def start_window_queries(
    spark: SparkSession,
    config: PipelineConfig,
    paths: JobPaths,
    store_factory: Callable[[], ResultStore],
    clock: Clock,
    *,
    trigger_interval: str | None = "0.5 seconds",
) -> list[StreamingQuery]:
    """Start one streaming query per window; all share the session and the source format.

    Each query gets its own store connection: Spark may run two queries' ``foreachBatch``
    at once, and one connection's transactions must not interleave. ``trigger_interval=None``
    processes what is in the spool now and stops (Spark's ``availableNow``).
    """
    queries: list[StreamingQuery] = []
    for window in config.windows:
        source = spark.readStream.format(SOURCE_NAME).option("path", str(paths.spool)).load()
        checkpoint = checkpoint_dir(paths, config, window)
        checkpoint.mkdir(parents=True, exist_ok=True)
        writer = WindowBatchWriter(config, window, store_factory(), checkpoint, clock)
        stream = (
            windowed_partials(source, window)
            .writeStream.queryName(query_name(config, window))
            .outputMode("update")
            .option("checkpointLocation", str(checkpoint))
            .foreachBatch(writer)
        )
        if trigger_interval is None:
            stream = stream.trigger(availableNow=True)
        else:
            stream = stream.trigger(processingTime=trigger_interval)
        queries.append(stream.start())
    return queries
