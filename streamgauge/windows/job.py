"""The Spark job: one streaming query per window of a config, partials → windows → store.

For each window spec::

    spool source ─▶ event_time = pane start ─▶ withWatermark(delay + lateness)
        ─▶ filter metrics ─▶ group by (window, metric, tags ∩ group_by) ─▶ merge partials
        ─▶ update output mode ─▶ foreachBatch: revision, is_final ─▶ ResultStore.commit_batch

Emission and revisions (this slice; corrections and replay deepen it):

- Spark's update mode emits a window whenever a micro-batch changes it. Until the watermark
  passes the window's end the store holds that row in ``window_pending`` (a tumbling window's
  native lane without ``early_every`` holds it itself, ``HoldingBatchWriter``); the batch whose
  watermark passes the end moves it to ``window_results`` (provisional), later changes are
  corrections (``corrections`` counts them). ``revision`` is the micro-batch id + 1 plus the
  checkpoint's base (``revision_base``: 0 on a fresh data dir, above every stored revision
  when a changed window definition starts a new checkpoint): strictly increasing per window
  and the same when Spark replays a batch after a crash, so the store's
  keep-the-highest-revision upsert makes replays change nothing.
- The watermark of a batch is derived from the receivers' heartbeats recorded in the batch's
  offset (``batch_heartbeats``): ``W = min over open receivers(heartbeat) - watermark_delay``.
  A window ``[start, end)`` is final once ``end + allowed_lateness <= W``; the store marks such
  rows final in the same transaction.
- ``early_every`` (tumbling, hopping, sliding): while the watermark has not passed a window's
  end, the store also publishes the window's pending row to ``window_results`` as an *early*
  row (``early_as_of`` = the tick ``start + k * early_every`` the watermark reached), at most
  once per tick and only when a value changed since the last early row (``store._EARLY``).
  It is decided from the batch's watermark alone, in the store, so it needs no Spark state
  (changing it keeps the checkpoint), fires while input is idle (heartbeats move the
  watermark) and a replayed batch makes the same decision. Window ``[0, 10)``, every 2 s::

      W     2     4     6     8     10          10 + lateness
            e     e     e     e     on-time     final          (e: early, if changed)

- Spark's own watermark (``delay + lateness`` behind the newest pane) only bounds its state:
  it evicts a window once no straggler may still change it.

Spark's watermark follows the newest event it has seen, ours the slowest receiver; the spool
source keeps the two together by holding back a fast receiver's segments until the slowest open
receiver's heartbeat reaches them (``source.py``), so Spark never evicts a window a lagging
receiver still feeds.

Lanes: a tumbling or hopping window runs two streaming queries over the same source. The
native lane (counters, gauges, sets) merges partials with Spark's own aggregates, HLLs with
``hll_union_agg``; the sketch lane (timers, histograms, distributions) merges t-digests and
HDR buckets in a stateful operator (``sketch_windows``: Spark has no t-digest aggregate).
Each lane commits its own rows under its own query name and watermark, and the store scopes
emission and finality to the lane's metric types. Each lane's source hands it only its own
types (plus, to the query that records late rows, every row that may be late): ``RowFilter``
in ``source.py``. A counter now crosses from the Python reader into the JVM once per window
instead of three times, a timer twice (the sketch lane's two branches each scan the source).
A hopping window's sketch lane merges each partial once into its hop-wide pane and the pane
into its size/hop windows (``hopping_windows``) instead of copying the partial into every
window; its native lane aggregates panes only (``hopping_pane_aggregates``) and the store
makes each window of its panes when it publishes it (``PaneBatchWriter``). A tumbling window
with ``sets: with_timers`` (``splits_sets``) aggregates only counters and gauges natively, with
plain sums and extremes (``plain_lane_partials``), and its sketch lane merges the sets' HLLs
beside the digests: no HLL buffer in a counter's state, and still two queries. With
``sets: separate`` (``sets_query``) its sets run Spark's own aggregation in a third query
(``set_lane_partials``, query ``<window>.sets``), which waits while the log has no set for
it (``QuietLane``): counters as fast as with ``with_timers``, sets as fast as natively, for
the price of a third query when both arrive. With either, and no ``early_every``, the
counters' lane keeps no Spark state at all (``adds_in_driver``): each micro-batch is merged
per window in a batch job of its own (``plain_batch_windows``) and the job's holding adds the
sums (``AddingBatchWriter``, ``held_windows.AddedWindows``). Session and sliding
windows run one query of their own operator for every type, which merges the sketches too
(``window_sketches``: percentiles, histograms and distinct counts as in the two lanes).

A ``quantiles: kll`` window has no sketch lane: its native lane takes every type, merges the
pane partials' KLL sketches with Spark's ``kll_merge_agg_double`` and reads p50 and p90 from
the merge (p99/p999 NULL, no histogram rows: KLL's ±1.33 % rank error makes a p99 anywhere in
p97.7..p100). Its late rows ride in that one query (``kll_lane_with_late_rows``), so the
window is one streaming query instead of two.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery

from streamgauge.clock import Clock
from streamgauge.configs import PipelineConfig, WindowSpec
from streamgauge.ingest.log import first_heartbeats
from streamgauge.ingest.pane_sketches import SKETCHED_TYPES
from streamgauge.ingest.spool_fs import SpoolLike
from streamgauge.retention import PASSED_OVER_FILE
from streamgauge.sinks.store import (
    RESULT_SCHEMA,
    BatchOutcome,
    Finalization,
    HeldSnapshot,
    LateRowsReread,
    PaneBatch,
    PreparedRelease,
    ResultStore,
)
from streamgauge.sketches.accuracy import SketchParams, compile_accuracy
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.windows import hopping_windows, sketch_windows

# The checkpoint paths live in a Spark-free module (the receivers need them); re-exported.
from streamgauge.windows.checkpoints import JobPaths as JobPaths
from streamgauge.windows.checkpoints import adds_in_driver as adds_in_driver
from streamgauge.windows.checkpoints import all_checkpoints as all_checkpoints
from streamgauge.windows.checkpoints import checkpoint_dir as checkpoint_dir
from streamgauge.windows.checkpoints import sets_checkpoint as sets_checkpoint
from streamgauge.windows.checkpoints import sets_query as sets_query
from streamgauge.windows.checkpoints import sketch_checkpoint as sketch_checkpoint
from streamgauge.windows.checkpoints import sketch_params as sketch_params
from streamgauge.windows.checkpoints import splits_sets as splits_sets
from streamgauge.windows.held_windows import AddedWindows, HeldWindows
from streamgauge.windows.release_watch import ReleaseWatcher
from streamgauge.windows.session_windows import (
    OUTPUT_DDL,
    STATE_DDL,
    session_horizon_ms,
    session_state_function,
)
from streamgauge.windows.sliding_windows import slid_partials, sliding_late_partials
from streamgauge.windows.source import (
    LANE_TYPES,
    QuietLane,
    RowFilter,
    admitted_offset,
    batch_event_floor_ms,
    batch_heartbeats,
    event_floor_ms,
    receivers_heartbeat_ms,
    register_source_for_query,
)

log = logging.getLogger(__name__)

_QUANTILE_COLUMNS = ("p50", "p90", "p99", "p999", "distinct_count")
NO_WATERMARK_MS = 0
"""Before any heartbeat: every window is held (all event times are after the epoch)."""


REVISION_BASE_FILE = "streamgauge-revision-base.json"


@dataclass(frozen=True)
class LateRowsOrigin:
    """What a writer that records a window's late rows reads them from: the spool, and the
    generation of the window's checkpoints that records them (``store.LateRowsReread``)."""

    spool: SpoolLike
    generation: str


def revision_base(
    checkpoint: Path,
    store: ResultStore,
    config: PipelineConfig,
    window: WindowSpec,
    query_names: Sequence[str],
    *,
    forget_panes: bool = False,
    forget_held: bool = False,
    late_rows: LateRowsOrigin | None = None,
) -> int:
    """What a checkpoint's revisions start from: ``revision = base + batch id + 1``.

    Fixed once per checkpoint (a file beside Spark's own), so a replayed micro-batch gets the
    same revision as the first time. A new checkpoint (a changed window definition, or a
    deleted checkpoint directory) starts above every revision stored for the window, and its
    batch ids are forgotten in ``sink_batches`` (``ResultStore.start_checkpoint``), as are
    the late rows it will record again if it records the window's (``late_rows``). A
    checkpoint that committed batches before bases existed keeps base 0, as it was numbered.
    """
    marker = checkpoint / REVISION_BASE_FILE
    if marker.exists():
        return int(json.loads(marker.read_text())["revision_base"])
    commits = checkpoint / "commits"
    if commits.is_dir() and any(commits.iterdir()):
        base = 0
    else:
        reread = None
        if late_rows is not None:
            reread = LateRowsReread(
                late_rows.generation, first_heartbeats(late_rows.spool), query_name(config, window)
            )
        base = store.start_checkpoint(
            config.name, window.name, query_names, forget_panes=forget_panes,
            forget_held=forget_held, late_reread=reread,
        )  # fmt: skip
    checkpoint.mkdir(parents=True, exist_ok=True)
    temporary = marker.with_suffix(".tmp")
    with open(temporary, "w") as handle:
        json.dump({"revision_base": base, "query_names": list(query_names)}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, marker)
    return base


def query_name(config: PipelineConfig, window: WindowSpec) -> str:
    return f"{config.name}.{window.name}"


def sketch_query_name(config: PipelineConfig, window: WindowSpec) -> str:
    return f"{query_name(config, window)}.sketches"


def sets_query_name(config: PipelineConfig, window: WindowSpec) -> str:
    """The query of a window's sets with ``sets: separate`` (``sets_query``)."""
    return f"{query_name(config, window)}.sets"


def native_lane_rows(window: WindowSpec) -> str:
    """The ``RowFilter`` lane of a tumbling/hopping window's native lane query: with
    ``sets: with_timers`` a tumbling window's sets merge in its sketch lane (``splits_sets``),
    with ``sets: separate`` in a query of their own (``sets_query``)."""
    return "plain" if splits_sets(window) or sets_query(window) else "native"


def sketch_lane_rows(window: WindowSpec) -> str:
    """The ``RowFilter`` lane of ``window``'s sketch lane query (``sketch_windows``; a hopping
    window's: ``hopping_windows``)."""
    return "sketch_sets" if splits_sets(window) else "sketch"


def native_lane_types(window: WindowSpec) -> tuple[str, ...]:
    """The metric types of ``window``'s native lane: what its source hands it."""
    return LANE_TYPES[native_lane_rows(window)]


def sketch_lane_types(window: WindowSpec) -> tuple[str, ...]:
    """The metric types of ``window``'s sketch lane: what its source hands it (late rows
    aside)."""
    return LANE_TYPES[sketch_lane_rows(window)]


def is_sketched() -> Column:
    """Rows of the sketch lane (timers, histograms, distributions)."""
    return F.col("metric_type").isin(list(SKETCHED_TYPES))


def metric_filter(globs: tuple[str, ...]) -> Column:
    """Globs → one Java regex (``fnmatch.translate`` emits syntax Java's regex also accepts)."""
    if "*" in globs:
        return F.lit(True)
    pattern = "|".join(f"(?:{fnmatch.translate(g)})" for g in globs)
    return F.col("metric").rlike(pattern)


def series_keys(window: WindowSpec) -> tuple[str, ...]:
    """The tag keys that identify a series of ``window``: ``group_by``, plus a session's
    ``key`` (a series without that tag is one series of its own, not dropped)."""
    if window.kind == "session" and window.key and window.key not in window.group_by:
        return (*window.group_by, window.key)
    return window.group_by


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
    ``late_partials``, ``replay`` and ``quantiles: kll`` windows use. A hopping window's two
    lanes merge hop-wide panes instead (``hopping_partials``, ``hopping_pane_aggregates``,
    ``pane_and_first_start``: the same per-window late rule, computed once per partial).

    Session windows (``gap``): the row's own possible session ``[t, t + gap)``, with the
    same late rule on that end (see ``session_windows``, which merges them per series)::

        t = 4 s, gap 3 s      [4 s ..... 7 s)~~ lateness ~~|  <= prior heartbeat - delay: late
    """
    if window.kind == "session":
        assert window.gap_ms is not None
        event = F.least(F.col("pane_start_ms"), F.col("segment_heartbeat_ms"))
        closes_at = event + F.lit(window.gap_ms + window.allowed_lateness_ms)
        late = (closes_at <= F.col("prior_heartbeat_ms") - F.lit(window.watermark_delay_ms)) & (
            metric_filter(window.metrics)
        )
        return (
            source.withColumn(f"window_start_ms{suffix}", event)
            .withColumn(f"window_end_ms{suffix}", event + F.lit(window.gap_ms))
            .withColumn(f"tags{suffix}", series_tags(series_keys(window)))
            .withColumn(f"late{suffix}", late)
        )
    if window.kind not in ("tumbling", "hopping"):
        raise NotImplementedError(
            f"window {window.name!r}: kind {window.kind!r} is not implemented yet; "
            "tumbling, hopping and session windows run in this build"
        )
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


def windowed_partials(source: DataFrame, window: WindowSpec) -> DataFrame:
    """Merge on-time pane partials of counters, gauges and sets into the windows of
    ``window``.

    Late rows are removed here and recorded by the late rows of the sketch lane's query
    instead (``sketch_lane_with_late_rows``), so Spark's own
    watermark never has to drop anything: it only bounds state. Spark evicts a window once
    ``window_end <= max(window_end seen) - (delay + lateness + size)``; the extra ``size``
    covers a window end running up to one window ahead of the newest event.
    """
    return aggregate_windows(_on_time(source, window).where(~is_sketched()))


def plain_lane_partials(source: DataFrame, window: WindowSpec) -> DataFrame:
    """``windowed_partials`` of counters and gauges alone (``sets: with_timers`` or
    ``separate``): Spark's own sums and extremes and nothing else in the state."""
    on_time = _on_time(source, window).where(F.col("metric_type").isin(list(LANE_TYPES["plain"])))
    grouped = on_time.groupBy("window_end_ts", "window_start_ms", "metric", "tags").agg(
        *_merged_scalars()
    )
    # The columns aggregate_windows gives a counter: a held window's row is the same either way.
    return _window_rows(
        grouped,
        F.lit(None).cast("double").alias("distinct_count"),
        F.lit(None).cast("binary").alias("sketch"),
    )


def plain_lane_rows(source: DataFrame, window: WindowSpec) -> DataFrame:
    """The on-time partials of counters and gauges, each with its window: the stream of a
    lane that keeps no Spark state (``adds_in_driver``). Each micro-batch is merged per
    window by ``plain_batch_windows`` and added to the job's holding (``AddingBatchWriter``)."""
    on_time = _on_time_rows(source, window)
    return on_time.where(F.col("metric_type").isin(list(LANE_TYPES["plain"])))


def plain_batch_windows(batch: DataFrame) -> DataFrame:
    """One micro-batch of ``plain_lane_rows`` merged per window, as ``plain_lane_partials``
    merges the whole stream, plus each window's latest event time (``last_event_ms``), by
    which the holding picks the ``last`` of two sums."""
    grouped = batch.groupBy("window_end_ts", "window_start_ms", "metric", "tags").agg(
        *_merged_scalars(), F.max("last_event_ms").alias("last_event_ms")
    )
    return _window_rows(
        grouped,
        F.lit(None).cast("double").alias("distinct_count"),
        F.lit(None).cast("binary").alias("sketch"),
        "last_event_ms",
    )


def set_lane_partials(source: DataFrame, window: WindowSpec) -> DataFrame:
    """``windowed_partials`` of sets alone (``sets: separate``, ``sets_query``): the native
    aggregation, HLL union included, in a query of their own."""
    sets = _on_time(source, window).where(F.col("metric_type").isin(list(LANE_TYPES["sets"])))
    return aggregate_windows(sets)


def _on_time_rows(source: DataFrame, window: WindowSpec) -> DataFrame:
    """The window's on-time partials, each with its window and ``window_end_ts``."""
    return (
        assign_windows(source, window)
        .where(metric_filter(window.metrics) & ~F.col("late"))
        .withColumn("window_end_ts", F.timestamp_millis("window_end_ms"))
    )


def _on_time(source: DataFrame, window: WindowSpec) -> DataFrame:
    """``_on_time_rows`` under Spark's watermark, for a lane that keeps Spark state."""
    assert window.size_ms is not None
    horizon_ms = window.watermark_delay_ms + window.allowed_lateness_ms + window.size_ms
    return _on_time_rows(source, window).withWatermark(
        "window_end_ts", f"{horizon_ms} milliseconds"
    )


_LATE_COLUMNS = (
    "metric", "tags", "metric_type", "window_start_ms", "window_end_ms", "receiver",
    "pane_start_ms", "count", "sum", "min", "max", "last", "first_recv_ms", "last_recv_ms",
    "prior_heartbeat_ms",
)  # fmt: skip


def sketch_lane_with_late_rows(
    source: DataFrame, window: WindowSpec, params: SketchParams
) -> DataFrame:
    """The sketch lane and the window's late partials, as one query (``change`` tells them
    apart: ``upsert`` / ``late``).

    One streaming query fewer per window: every query re-reads the spool, plans and commits
    its own offsets each micro-batch, and a third query per window made a counters-only
    batch about twice as slow (bench/windows.py). The late rows are stateless, so they can
    ride in the stateful lane's output; both branches read the same source in one batch.
    """
    lane = sketched_window_partials(source, window, params).withColumn(
        "change", F.lit("upsert")
    )
    late = late_partials(source, window).select(*_LATE_COLUMNS).withColumn(
        "change", F.lit("late")
    )
    return lane.unionByName(late, allowMissingColumns=True)


def sketched_window_partials(
    source: DataFrame, window: WindowSpec, params: SketchParams
) -> DataFrame:
    """The sketch lane of ``window``: on-time timer/histogram/distribution partials merged
    per window by the stateful operator of ``sketch_windows`` (same watermark horizon as the
    native lane, so it evicts the same windows at the same time)."""
    if window.kind == "hopping" and window.hop_ms:
        return hopping_partials(source, window, params)
    # Only what the operator reads (and the event-time column the watermark is defined on):
    # every column shipped to Python costs Arrow conversion per group.
    on_time = (
        _on_time(source, window)
        .where(F.col("metric_type").isin(list(sketch_lane_types(window))))
        .select(*sketch_windows.INPUT_COLUMNS, "window_end_ts")
    )
    return on_time.groupBy("metric", "tags").applyInPandasWithState(
        sketch_windows.sketch_state_function(params),
        sketch_windows.OUTPUT_DDL,
        sketch_windows.STATE_DDL,
        "Update",
        "EventTimeTimeout",
    )


def pane_and_first_start(window: WindowSpec) -> tuple[Column, Column]:
    """A partial's hop-wide pane and the first start of the windows holding it that it is on
    time for (``> pane``: late for all of them), from the columns ``assign_windows`` reads.

    The windows holding pane ``p`` start at ``p - size + hop, ..., p``; the partial is late for
    ``[s, s + size)`` when ``s + size + lateness <= W'`` (``W'`` = prior heartbeat - delay),
    so the late ones are the first ``floor((W' - size - lateness - oldest) / hop) + 1``.
    """
    assert window.size_ms is not None and window.hop_ms is not None
    size, hop, lateness = window.size_ms, window.hop_ms, window.allowed_lateness_ms
    event_ms = F.least(F.col("pane_start_ms"), F.col("segment_heartbeat_ms"))
    pane = event_ms - F.pmod(event_ms - F.lit(window.offset_ms), F.lit(hop))
    oldest = pane - F.lit(size - hop)
    behind = (F.col("prior_heartbeat_ms") - F.lit(window.watermark_delay_ms + size + lateness)
              - oldest + F.lit(hop))  # fmt: skip
    late_windows = F.greatest(F.lit(0), (behind - F.pmod(behind, F.lit(hop))) / F.lit(hop))
    return pane, oldest + late_windows.cast("long") * F.lit(hop)


def _on_time_in_panes(source: DataFrame, window: WindowSpec, lane: Column) -> DataFrame:
    """The partials of ``lane`` on time for at least one window of hopping ``window``, each
    with its pane (``pane_ms``), the first window start it is on time for
    (``from_start_ms``) and the event-time column both hopping lanes' watermark is on."""
    assert window.size_ms is not None
    size = window.size_ms
    horizon_ms = window.watermark_delay_ms + window.allowed_lateness_ms + size
    pane, from_start = pane_and_first_start(window)
    return (
        source.withColumn("pane_ms", pane)
        .withColumn("from_start_ms", from_start)
        .withColumn("tags", series_tags(window.group_by))
        .where(
            metric_filter(window.metrics) & lane & (F.col("from_start_ms") <= F.col("pane_ms"))
        )
        # The newest window end the partial reaches: the copied rows' watermark, unchanged.
        .withColumn("reach_ts", F.timestamp_millis(F.col("pane_ms") + F.lit(size)))
        .withWatermark("reach_ts", f"{horizon_ms} milliseconds")
    )


def hopping_partials(source: DataFrame, window: WindowSpec, params: SketchParams) -> DataFrame:
    """Pane merge of a hopping window's sketch lane (timers, histograms, distributions:
    ``hopping_windows``): each partial once, keyed by series, with its pane (``pane_ms``) and
    the first window start it is on time for (``from_start_ms``); the operator merges it once
    into its pane and the pane into the windows.

    A partial late for every window it lies in (``from_start > pane``) is left to
    ``late_partials``, whose rows are unchanged (``pane_and_first_start``).
    """
    on_time = _on_time_in_panes(source, window, is_sketched()).select(
        *hopping_windows.INPUT_COLUMNS, "reach_ts"
    )
    return on_time.groupBy("metric", "tags").applyInPandasWithState(
        hopping_windows.hopping_state_function(window, params),
        hopping_windows.OUTPUT_DDL,
        hopping_windows.STATE_DDL,
        "Update",
        "EventTimeTimeout",
    )


def hopping_pane_aggregates(source: DataFrame, window: WindowSpec) -> DataFrame:
    """The counters', gauges' and sets' lane of a hopping window: each partial merged once
    into its hop-wide pane by Spark's own aggregates, not copied into size/hop windows.

    Grouped by series, pane and the first window start the partial is on time for
    (``pane_and_first_start``): a straggler on time only for a pane's newer windows lands in
    its own ``(pane, from_start)`` row, which the older windows leave out. The output (update
    mode) is each changed pane whole; the store keeps the panes (``window_panes``) and merges
    a window of its size/hop panes when it publishes it (``PaneBatchWriter``). Spark's state
    per series is one row per pane instead of size/hop rows per window, and each micro-batch
    writes one row per series and pane instead of size/hop open windows. Same watermark as the
    sketch lane's panes (``hopping_partials``), so both evict together.
    """
    on_time = _on_time_in_panes(source, window, ~is_sketched())
    panes = on_time.groupBy("reach_ts", "pane_ms", "from_start_ms", "metric", "tags").agg(
        *_merged_scalars(),
        F.max("last_event_ms").alias("last_event_ms"),
        F.hll_union_agg(F.when(_is_set(), F.col("sketch")), F.lit(True)).alias("sketch"),
    )
    return panes.select(
        "metric", "tags", "pane_ms", "from_start_ms", "metric_type", "count", "sum", "min",
        "max", "last", "last_event_ms", F.when(_is_set(), F.col("sketch")).alias("sketch"),
    )  # fmt: skip


def uses_pane_lane(window: WindowSpec) -> bool:
    """A hopping window whose counters, gauges and sets go through ``hopping_pane_aggregates``
    (a ``quantiles: kll`` window keeps its one query of copied rows)."""
    return window.kind == "hopping" and bool(window.hop_ms) and not window.uses_kll


_SESSION_INPUT = (
    "metric", "tags", "metric_type", "event_ms", "event_ts", "count", "sum", "min", "max", "last",
    "last_event_ms", "first_recv_ms", "last_recv_ms", "receiver", "pane_start_ms",
    "segment_heartbeat_ms", "prior_heartbeat_ms", "sketch", "hdr_bucket", "hdr_count",
)  # fmt: skip


def sessionized_partials(
    source: DataFrame, window: WindowSpec, params: SketchParams | None = None
) -> DataFrame:
    """On-time partials of ``window`` → session changes per series (``session_windows``).

    Output rows have a ``change`` column: ``upsert`` (a session created or changed, with its
    quantiles, distinct count and sketches: ``window_sketches``), ``retract`` (a session
    superseded by a longer or merged one) or ``late`` (a partial that reaches into a session
    already final). ``params``: the config's sketch accuracy (the defaults when None).
    """
    on_time = (
        assign_windows(source, window)
        .where(metric_filter(window.metrics) & ~F.col("late"))
        .withColumnRenamed("window_start_ms", "event_ms")
        .withColumn("event_ts", F.timestamp_millis("event_ms"))
        .withWatermark("event_ts", f"{session_horizon_ms(window)} milliseconds")
        .select(*_SESSION_INPUT)
    )
    return on_time.groupBy("metric", "tags").applyInPandasWithState(
        session_state_function(window, params or compile_accuracy()),
        OUTPUT_DDL,
        STATE_DDL,
        "Update",
        "EventTimeTimeout",
    )


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
    ``upsert``) and the window's late partials (``late``), as the sketch lane carries them for
    t-digest windows (``sketch_lane_with_late_rows``): no third query, no sketch lane."""
    lane = aggregate_windows(_on_time(source, window), kll_k).withColumn(
        "change", F.lit("upsert")
    )
    late = late_partials(source, window).select(*_LATE_COLUMNS).withColumn(
        "change", F.lit("late")
    )
    return lane.unionByName(late, allowMissingColumns=True)


def late_partials(source: DataFrame, window: WindowSpec) -> DataFrame:
    """Rows that are late for ``window``: a stateless query, so nothing is dropped on the way.

    Tumbling/hopping windows carry these rows in the sketch lane's query (``quantiles: kll``
    windows: in their one query); session and sliding windows run them as a query of their
    own. Either way the checkpoint sits beside the window's own (or is it): both restart
    together when the window's definition changes.
    """
    return assign_windows(source, window).where(
        # A partial can only be late if it is older than the heartbeat before its segment.
        (F.col("pane_start_ms") < F.col("prior_heartbeat_ms")) & F.col("late")
    )


def to_late_rows(late: pa.Table, config: PipelineConfig, window: WindowSpec) -> pa.Table:
    """The late partials in the store's ``LATE_SCHEMA`` shape (vectorised)."""
    n = late.num_rows
    if n == 0:
        return pa.table({})
    return pa.table(
        {
            "config_name": pa.array([config.name] * n, pa.string()),
            "window_name": pa.array([window.name] * n, pa.string()),
            **{
                name: late.column(name)
                for name in (
                    "metric", "tags", "metric_type", "window_start_ms", "window_end_ms",
                    "receiver", "pane_start_ms", "count", "sum", "min", "max", "last",
                    "first_recv_ms", "last_recv_ms",
                )
            },  # fmt: skip
            "closed_by_ms": late.column("prior_heartbeat_ms"),
        }
    )


class LateBatchWriter:
    """The ``foreachBatch`` function of a window's late-events query."""

    def __init__(
        self,
        config: PipelineConfig,
        window: WindowSpec,
        store: ResultStore,
        checkpoint: Path | None = None,
        *,
        late_rows: LateRowsOrigin | None = None,
    ) -> None:
        self._config = config
        self._window = window
        self._store = store
        self._checkpoint = checkpoint
        self._late_rows = late_rows
        self.name = late_query_name(config, window)
        store.error_labels = {"config": config.name, "query": self.name}

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        if self._checkpoint is not None:  # a fresh checkpoint forgets the old batch ids
            revision_base(self._checkpoint, self._store, self._config, self._window, [self.name],
                          late_rows=self._late_rows)  # fmt: skip
            self._checkpoint = None
        rows = to_late_rows(batch.toArrow(), self._config, self._window)
        lock_name = query_name(self._config, self._window)  # the window query's
        outcome = self._store.commit_late_batch(self.name, batch_id, rows, lock_name)
        if outcome.rows_upserted:
            log.warning(
                "%s batch %d: %d late partial(s) recorded in late_events",
                self.name, batch_id, outcome.rows_upserted,
            )  # fmt: skip


def late_query_name(config: PipelineConfig, window: WindowSpec) -> str:
    return f"{query_name(config, window)}.late"


def tumbling_end_ms(window: WindowSpec, event_ms: int) -> int:
    """The end of the tumbling window holding ``event_ms`` (half-open: an event at an end
    opens the next window)."""
    assert window.kind == "tumbling" and window.size_ms is not None
    return event_ms - (event_ms - window.offset_ms) % window.size_ms + window.size_ms


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
    is_set = pc.equal(mtype, "s")
    null_f64 = pa.nulls(n, pa.float64())
    # Aggregates that mean nothing for a type stay NULL rather than showing a number.
    total = pc.if_else(pc.or_(is_gauge, is_set), null_f64, changed.column("sum"))
    minimum = pc.if_else(pc.or_(is_counter, is_set), null_f64, changed.column("min"))
    maximum = pc.if_else(pc.or_(is_counter, is_set), null_f64, changed.column("max"))
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
    names = set(changed.column_names)
    for name in _QUANTILE_COLUMNS:
        columns[name] = changed.column(name) if name in names else null_f64
    columns["sketch"] = (
        changed.column("sketch") if "sketch" in names else pa.nulls(n, pa.binary())
    )
    columns["hdr_histogram"] = (
        changed.column("hdr_histogram") if "hdr_histogram" in names else pa.nulls(n, pa.string())
    )
    columns["revision"] = pa.array([revision] * n, pa.int64())
    columns["is_final"] = final
    columns["late_events"] = pa.array([0] * n, pa.int64())
    columns["emitted_at_ms"] = pa.array([emitted_at_ms] * n, pa.int64())
    return pa.table(columns)



_KLL_RESULT_COLUMNS = (
    "metric", "tags", "metric_type", "window_start_ms", "window_end_ms", "count", "sum", "min",
    "max", "last", *(name for name, _ in KLL_QUANTILES), "distinct_count", "sketch",
)  # fmt: skip


SETS_WATERMARK_PREFIX = "watermark_ms.sets"
"""Of a sets query's watermark key in ``pipeline_state`` (``<prefix>:<window>``)."""


class WindowBatchWriter:
    """The ``foreachBatch`` function of one window query: runs on the driver.

    ``lane_types`` scopes emission and finality to the metric types this query writes
    (tumbling/hopping windows run a native and a sketch lane, each with its own watermark);
    None (sessions) covers every row of the window.
    """

    lane_types: tuple[str, ...] | None
    keeps_panes = False
    """The query's panes live in ``window_panes`` (``PaneBatchWriter``): a fresh checkpoint
    forgets them."""
    forgets_held = False
    """The query's holding adds the batches' sums (``AddingBatchWriter``): a fresh
    checkpoint, which reads the log again, forgets it."""

    def __init__(
        self,
        config: PipelineConfig,
        window: WindowSpec,
        store: ResultStore,
        checkpoint: Path,
        clock: Clock,
        *,
        late_rows: LateRowsOrigin | None = None,
        sets: bool = False,
        spool: SpoolLike | None = None,
    ) -> None:
        """``late_rows``: given if the query records the window's late rows. ``sets``: the
        query is the window's sets query (``sets_query``), with its own name, watermark and
        metric type. ``spool``: the log the query reads, whose segment footers tell a holding
        writer which windows a batch can change (``HoldingBatchWriter._release_ahead``;
        None: every window waits for its batch)."""
        self._spool = spool
        self._config = config
        self._window = window
        self._store = store
        self._checkpoint = checkpoint
        self._clock = clock
        self._late_rows = late_rows
        self._name = query_name(config, window)
        self._state_key = f"watermark_ms:{window.name}"
        self.lane_types = self.lane_types_of(window)
        if sets:
            self._name = sets_query_name(config, window)
            self._state_key = f"{SETS_WATERMARK_PREFIX}:{window.name}"
            self.lane_types = LANE_TYPES["sets"]
        self._watermark_floor: int | None = None
        self._revision_base: int | None = None
        self._offsets: dict[int, dict[str, dict[str, Any]]] = {}  # ``_offsets_of``
        #: The open windows held after the last committed batch (``HoldingBatchWriter``;
        #: None until loaded, and always for the writers that hold none).
        self._held: HeldWindows | None = None
        store.error_labels = {"config": config.name, "query": self._name}

    @staticmethod
    def lane_types_of(window: WindowSpec) -> tuple[str, ...] | None:
        """``lane_types`` of the window's query: here its native lane's (None: every type)."""
        return native_lane_types(window)

    def revision(self, batch_id: int) -> int:
        """The batch's revision: strictly increasing across batches and checkpoints."""
        return self._base() + batch_id + 1

    def _base(self) -> int:
        """The checkpoint's ``revision_base`` (on a new checkpoint, set up first)."""
        if self._revision_base is None:
            self._revision_base = revision_base(
                self._checkpoint, self._store, self._config, self._window, [self._name],
                forget_panes=self.keeps_panes, forget_held=self.forgets_held,
                late_rows=self._late_rows,
            )
        return self._revision_base

    def progress_ms(self, batch_id: int) -> int | None:
        """The batch's own watermark: its receivers' heartbeats less the delay (None before
        any heartbeat), not yet raised to one already committed."""
        heartbeat_ms = receivers_heartbeat_ms(self._offsets_of(batch_id))
        return None if heartbeat_ms is None else heartbeat_ms - self._window.watermark_delay_ms

    def _offsets_of(self, batch_id: int) -> dict[str, dict[str, Any]]:
        """The receivers' offsets Spark logged for ``batch_id`` (``batch_heartbeats``), read
        once: a batch's offsets never change, and a batch asks for its own and its
        predecessor's several times (watermark, release, commit)."""
        if batch_id not in self._offsets:
            if len(self._offsets) >= 4:
                del self._offsets[min(self._offsets)]
            self._offsets[batch_id] = batch_heartbeats(self._checkpoint, batch_id)
        return self._offsets[batch_id]

    def _result_rows(
        self, windows: pa.Table, batch_id: int, watermark_ms: int | None, emitted_at_ms: int
    ) -> pa.Table:
        """``to_result_rows`` of this query's windows at batch ``batch_id``'s revision."""
        return to_result_rows(
            windows, self._config, self._window, revision=self.revision(batch_id),
            watermark_ms=watermark_ms, emitted_at_ms=emitted_at_ms,
        )  # fmt: skip

    def watermark_ms(self, progress_ms: int | None) -> int | None:
        """The watermark of a batch whose own is ``progress_ms``, never below one already
        committed.

        A receiver stream that appears with an older heartbeat lowers the minimum over
        receivers; a window already emitted (or final) must not go back to pending.
        """
        if self._watermark_floor is None:
            self._watermark_floor = self._store.read_state(self._config.name, self._state_key)
        if progress_ms is None:
            return self._watermark_floor
        watermark = progress_ms
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
        histograms: pa.Table | None = None,
        panes: pa.Table | None = None,
    ) -> None:
        progress_ms = self.progress_ms(batch_id)
        watermark_ms = self.watermark_ms(progress_ms)
        revision = self.revision(batch_id)
        emitted_at_ms = self._clock.now_ms()

        def result_rows(windows: pa.Table) -> pa.Table:
            return self._result_rows(windows, batch_id, watermark_ms, emitted_at_ms)

        pane_batch = None if panes is None else self._pane_batch(panes, progress_ms, result_rows)
        publish, holding = self._held_after(
            changed, NO_WATERMARK_MS if watermark_ms is None else watermark_ms
        )
        rows = result_rows(publish) if pane_batch is None else RESULT_SCHEMA.empty_table()
        rows, fresh = self._split_fresh(rows)
        held = None if holding is None else self._snapshot(holding)
        # Looked for last, after the snapshot (~0.1 s at 100k windows): a closing segment
        # often lands while the batch builds it.
        closed_rows, holding, closed_through_ms = self._closed_by_log(batch_id, holding)
        if closed_through_ms is not None:
            assert holding is not None
            held = self._snapshot(holding)
        if closed_rows is not None:
            # Past the batch's watermark, so offered as fresh whatever was published before:
            # the upsert would keep them pending, and a fresh insert a stored window refuses
            # takes the upsert into window_results (``ResultStore._insert_fresh``).
            fresh = closed_rows if fresh is None else pa.concat_tables(
                [fresh, closed_rows.select(fresh.column_names)], promote_options="default"
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
                    self.lane_types,
                )
            )
            state[(self._config.name, self._state_key)] = watermark_ms
        # Until the watermark passes a window's end, its row waits in window_pending.
        hold = {(self._config.name, self._window.name): NO_WATERMARK_MS
                if watermark_ms is None else watermark_ms}  # fmt: skip
        # ... and while it does not, the store publishes it early every early_every of
        # watermark progress (event time: the same heartbeats give the same early rows).
        early = {} if self._window.early_every_ms is None else {
            (self._config.name, self._window.name): self._window.early_every_ms}  # fmt: skip
        outcome = self._store.commit_batch(
            self._name, batch_id, rows, finalizations, revision=revision, state=state,
            lock_name=query_name(self._config, self._window),  # one lock per window: both lanes
            hold_after=hold, retractions=retractions, late=late,
            late_query_name=late_query_name(self._config, self._window),
            lane_types=self.lane_types, histograms=histograms, early_every=early,
            panes=pane_batch, held=held, fresh=fresh,
        )  # fmt: skip
        if holding is not None:
            self._held = holding  # only now: a batch the store refused is run again
        if closed_through_ms is not None:
            watermark_ms = max(closed_through_ms, watermark_ms or closed_through_ms)
        self._committed(outcome, watermark_ms)
        log.debug("%s batch %d: %s", self._name, batch_id, outcome)

    def _snapshot(self, holding: HeldWindows) -> HeldSnapshot:
        """``holding`` as the store keeps it (``window_held``)."""
        return HeldSnapshot(
            self._config.name, self._window.name, holding.num_windows, holding.samples,
            holding.to_snapshot(), holding.sql_arrays(), holding.published_before_ms,
        )  # fmt: skip

    def _split_fresh(self, rows: pa.Table) -> tuple[pa.Table, pa.Table | None]:
        """``rows`` for the store's general upsert, and the windows it may insert as
        published for the first time (``commit_batch(fresh=...)``; None: none)."""
        return rows, None

    def _committed(self, outcome: BatchOutcome, watermark_ms: int | None) -> None:
        """After the store took a batch committed under ``watermark_ms`` (or a later one its
        commit published windows up to: ``_closed_by_log``)."""

    def _closed_by_log(
        self, batch_id: int, holding: HeldWindows | None
    ) -> tuple[pa.Table | None, HeldWindows | None, int | None]:
        """Held windows the batch's commit publishes too, beyond its own watermark, as result
        rows (None: none, or published already); the holding without them; and the watermark
        they are published under (None, holding, None: none)."""
        return None, holding, None

    def _held_after(
        self, changed: pa.Table, watermark_ms: int
    ) -> tuple[pa.Table, HeldWindows | None]:
        """The windows of ``changed`` to hand the store, and the open windows held after the
        batch if they are to be written (None: this writer holds none, the store keeps them
        in ``window_pending``; or the batch left its holding as it was)."""
        return changed, None

    def _pane_batch(
        self, panes: pa.Table, progress_ms: int | None,
        result_rows: Callable[[pa.Table], pa.Table],
    ) -> PaneBatch:
        raise NotImplementedError(f"{type(self).__name__} keeps no panes")


_PREPARED_COPY_WAIT_S = 5.0
"""The longest a publication waits for its windows' copy still under way (~0.65 s at 100k
series here); past it, the copy is cancelled and the windows written as usual."""


@dataclass
class _Preparing:
    """Held windows in a ``PreparedRelease`` (``HoldingBatchWriter.prepare_next_release``)."""

    end_ms: int
    """They end here: the holding's earliest end."""
    batch_id: int
    """Their rows carry this batch's revision."""
    windows: int
    release: PreparedRelease
    copied: bool = False
    """The copy is done (until then, only ``cancel`` may touch its connection)."""
    dropped: bool = False
    """To roll back: its windows are published another way, or a batch changed one."""
    guard: threading.Lock = field(default_factory=threading.Lock)
    """Guards ``copied`` and ``dropped``, never held while waiting on PostgreSQL: the
    thread that copies decides under it alone (not the writer's lock, which a batch may
    hold while its own write waits for this transaction) whether to keep the copy."""
    done: threading.Event = field(default_factory=threading.Event)
    """Set once the copy is kept or rolled back."""


@dataclass(frozen=True)
class _LogAhead:
    """The segment log beyond the last batch committed in this process, from one listing
    (``HoldingBatchWriter._look_ahead``): what the watcher's two rules read."""

    end_ms: int
    """The earliest end of a held window."""
    applied: dict[str, dict[str, Any]]
    """The offsets of the last batch committed in this process."""
    planned: dict[str, dict[str, Any]]
    """The offsets of the last batch Spark planned: the running one's, else ``applied``."""
    running: bool
    """Whether a batch is planned and not committed yet."""
    next_id: int
    """The first batch not planned yet."""
    offered: dict[str, dict[str, Any]]
    """What batch ``next_id`` would take were it planned now (``admitted_offset``)."""

    def planned_after_listing(self) -> bool:
        """Whether the running batch took a segment the listing missed."""
        return _past(self.planned, self.offered)

    def unplanned(self) -> bool:
        """Whether the log holds segments no planned batch took."""
        return _past(self.offered, self.planned)


def _past(receivers: dict[str, dict[str, Any]], than: dict[str, dict[str, Any]]) -> bool:
    """Whether one receiver's position in ``receivers`` is past its position in ``than``."""
    return any(int(p["seq"]) > int(than.get(r, {"seq": -1})["seq"])
               for r, p in receivers.items())  # fmt: skip


class HoldingBatchWriter(WindowBatchWriter):
    """``foreachBatch`` of a native lane with no ``early_every``: open windows are held here,
    not in ``window_pending`` (``held_windows``), and the store gets each window once the
    watermark passes its end (then every straggler's change, as before).

    A window released with its end past the watermark of the last batch the store took
    (``_published_through_ms``) was held until now, so it is in no stored row: the store
    inserts it without the upsert's conflict arbitration (``commit_batch(fresh=...)``). The
    rest, a straggler's change to a window published before, takes the upsert. Until a batch
    is committed in this process (a start, a restart) every window takes the upsert.
    """

    _published_through_ms: int | None = None
    """Every window ending at or before this was published (None: not known yet)."""
    _applied_batch_id: int | None = None
    """The last batch committed in this process (None: none yet): the holding is as it left
    it."""
    _preparing: _Preparing | None = None
    """The held windows being copied, or copied, into a prepared release (None: none)."""
    _not_prepared: tuple[int, str] | None = None
    """The end of the windows the watcher last found it could not copy ahead, and why
    (logged once per end and reason)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Held by a batch's release and commit, and by ``release_before_next_batch``
        #: (another thread): each sees the holding the other left, never half of it.
        self._lock = threading.Lock()

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self._release_ahead(batch_id)
        self._commit(batch.toArrow(), batch_id)

    def _commit(self, changed: pa.Table, batch_id: int, **lanes: Any) -> None:
        with self._lock:
            preparing = self._preparing
            if preparing is not None and (
                (changed.num_rows and pc.min(changed["window_end_ms"]).as_py() <= preparing.end_ms)
                or not self._before_watermark(preparing.end_ms, self._offsets_of(batch_id))
                or batch_id >= preparing.batch_id
            ):  # a row of the batch is in one of its windows, the batch publishes them, or
                # the batch whose revision it has went by without publishing them
                self._drop_prepared()
            super()._commit(changed, batch_id, **lanes)
            self._applied_batch_id = batch_id

    def _closed_by_log(
        self, batch_id: int, holding: HeldWindows | None
    ) -> tuple[pa.Table | None, HeldWindows | None, int | None]:
        """The held windows the log closes already, published by this batch's commit if no
        row of a batch to come can change them: ``release_before_next_batch``'s rule, in the
        batch's own transaction.

        Why: the segment that closes a window often lands while the batch bringing the next
        window's first pane commits. ``release_before_next_batch`` then waits for the lock
        and for that commit (at 100k series ~0.35 s: its holding has both windows), and only
        then writes the windows (~0.7 s). Published here, they go out with that commit, and
        its holding is written without them. Timeline, as in ``release_before_next_batch``::

            segments   [8 s, 9 s)  [9 s, 10 s)  [10 s, 11 s) hb 11 s: W' = 10 s
            batch k    ... takes [9 s, 10 s) ... | commit: [0 s, 10 s) published in it

        Same revision as the watcher's (the batch that takes the closing segment, the next
        one), so a replay publishes the same rows. A replay the store refuses
        (``already_committed``) loads the stored holding again (``_committed``). Windows
        copied ahead (``prepare_next_release``) are committed instead, before the batch's
        own transaction.
        """
        if self._spool is None or holding is None:
            return None, holding, None
        earliest_end_ms = holding.earliest_end_ms
        if earliest_end_ms is None:
            return None, holding, None
        taken = self._offsets_of(batch_id)
        offered = admitted_offset(self._spool, {"receivers": taken})["receivers"]
        if offered == taken or self._before_watermark(earliest_end_ms, offered):
            return None, holding, None
        watermark_ms = self._peek_watermark_ms(offered)
        assert watermark_ms is not None
        if self._rows_may_come(event_floor_ms(self._spool, taken, offered), watermark_ms):
            return None, holding, None  # a row to come may change one: its batch publishes it
        released, after = holding.release(watermark_ms)
        if released is None or released.num_rows == 0:
            return None, holding, None
        if self._commit_prepared(released, after, watermark_ms, batch_id + 1):
            return None, after, watermark_ms
        rows = self._result_rows(released, batch_id + 1, watermark_ms, self._clock.now_ms())
        log.debug("%s batch %d: %d windows the log closes published with it", self._name,
                  batch_id, released.num_rows)  # fmt: skip
        return rows, after, watermark_ms

    def _release_ahead(self, batch_id: int) -> None:
        """Publish the held windows the batch's watermark passes before Spark runs the batch,
        if none of the batch's rows can change them (``ResultStore.publish_released``).

        Why: every window of a tumbling config closes at once, and the batch whose watermark
        passes their end published them only after its Spark jobs (``toArrow``, ~0.9 s at
        100k series) and with its own writes. Their values are the holding's already unless
        the batch has a row in one of them, which its segments' footers rule out
        (``batch_event_floor_ms``): a window ``[s, e)`` with ``e <= W`` gets no row from a
        batch whose earliest event lies in a window ending after ``W``. Timeline, 10 s
        windows, delay 1 s, a segment a second::

            segments     ...  [8 s, 9 s)  [9 s, 10 s) | [10 s, 11 s) hb 11 s: W = 10 s
            batch k                                   | only this one: [0 s, 10 s) closes
                                                        before Spark runs batch k

        A batch that also brings ``[9 s, 10 s)`` publishes them after its jobs, as before.
        Usually the windows are gone by then: ``release_before_next_batch`` published them
        as soon as the segment was in the log.
        """
        if self._spool is None:
            return
        with self._lock:
            watermark_ms = self.watermark_ms(self.progress_ms(batch_id))
            earliest_end_ms = self._holding().earliest_end_ms
            if watermark_ms is None or earliest_end_ms is None or earliest_end_ms > watermark_ms:
                return  # nothing held is due
            floor_ms = batch_event_floor_ms(
                self._spool, self._checkpoint, batch_id, offsets_of=self._offsets_of
            )
            published = self._publish_ahead(watermark_ms, floor_ms, batch_id)
        if published:
            log.debug("%s batch %d: %d windows published ahead", self._name, batch_id, published)

    def between_batches(self) -> int:
        """What ``ReleaseWatcher`` calls a few times a second: publish the windows the log
        closes (``release_before_next_batch``), or else prepare the next ones
        (``prepare_next_release``), from one listing of the log. The windows published."""
        if self._spool is None:
            return 0
        with self._lock:
            ahead = self._look_ahead()
            published = 0 if ahead is None else self._release_closed(ahead)
            started = None if published or ahead is None else self._start_preparing(ahead)
        if started is not None:
            self._copy_prepared(*started)
        return published

    def release_before_next_batch(self) -> int:
        """Publish the held windows the next batch's watermark will pass as soon as the
        segment that moves it is in the log, if no row of that batch or of the one running
        can change them; the windows published (0: none). ``ReleaseWatcher`` calls it a few
        times a second, between batches and while one runs.

        Why: ``_release_ahead`` runs when the batch starts, and a closing segment written
        while a batch runs waited for it to end: up to a whole batch (~1.3 s at 100k series),
        ~0.7 s on average. Timeline, 10 s windows, delay 2 s, each segment's heartbeat at
        its pane's end::

            segments   [8 s, 9 s)  [9 s, 10 s)  [10 s, 11 s)  [11 s, 12 s) hb 12 s: W' = 10 s
            batches    ... k-1 ...|........ k (running) .......|   k+1 (not planned yet)
                                                         ^ [0 s, 10 s) published here, at
                                                           batch k+1's revision: batch k
                                                           has no row in it

        The same with a shorter delay when segments are written a fraction into their pane
        with that moment as heartbeat (as ``bench/windows.py`` writes them): one segment
        lies between a window's last pane and the segment that closes it.

        The revision is that of the batch that will take the segment, the first not planned
        yet, which Spark plans with every segment listed here: the revision its own
        ``_release_ahead`` would have used, so a replay after a crash publishes the same.
        ``W'`` is that batch's watermark as the listed segments make it (the source's
        ``admitted_offset``); a later one is only higher, unless a receiver appears in
        between with an older heartbeat. Then the windows came out early, and a row of the
        new receiver in one of them is published as a correction.
        """
        if self._spool is None:
            return 0
        with self._lock:
            ahead = self._look_ahead()
            return 0 if ahead is None else self._release_closed(ahead)

    def prepare_next_release(self) -> bool:
        """Copy the held windows that close next into a ``PreparedRelease`` once the log
        shows no row to come in them, before the segment that closes them arrives; whether
        it did.

        Why: that copy (~0.65 s at 100k series) was most of a window's freshness, and the
        windows' values are known a second or so before the watermark passes their end:
        their last pane is in, and the log's next segments start after them. Timeline, 10 s
        windows, delay 1 s, segments written a fraction into their pane (``bench/windows.py``)::

            segments  [9 s, 10 s) hb 9.3 s | [10 s, 11 s) hb 10.3 s | [11 s, 11.3 s) hb 11.3 s
            batches   ... k-1 takes it ....|... k takes it ...........| k+1
                                           ^ copied here, uncommitted  ^ W' = 10.3 s:
                                                                         committed (~1 ms)

        The rows carry the revision of the batch expected to take the closing segment,
        which ``release_before_next_batch`` (or ``_release_ahead``) would give them: the
        first batch not planned yet, or the one after it if the log holds segments no batch
        took yet (``_start_preparing``). Whichever path publishes the windows commits the
        copy if it publishes exactly those windows at that revision, provisional
        (``_commit_prepared``); otherwise, or if a batch brings a row in one of them
        (``_commit``), it is rolled back and the windows take the usual path. A guess found
        too low (that batch is planned without the closing segment: more segments came
        first, as a receiver rolling every 250 ms writes them) is rolled back then and the
        windows copied again at a later batch's revision.

        The copy runs without the writer's lock: batches commit meanwhile. None of them
        writes those windows' rows while it runs (a batch that would is the one that drops
        it, which cancels the copy first), so none waits for its uncommitted rows.
        """
        if self._spool is None:
            return False
        with self._lock:
            ahead = self._look_ahead()
            started = None if ahead is None else self._start_preparing(ahead)
        return started is not None and self._copy_prepared(*started)

    def _look_ahead(self) -> _LogAhead | None:
        """The log beyond the last batch committed in this process, listed once (None: no
        batch committed yet, so the holding's batch is unknown; or nothing held). Under the
        writer's lock."""
        assert self._spool is not None
        applied_id = self._applied_batch_id
        if applied_id is None:
            return None
        end_ms = self._holding().earliest_end_ms
        if end_ms is None:
            return None
        applied = self._offsets_of(applied_id)
        # The log is listed before the running batch's offsets are looked for: a batch
        # planned after the listing takes every segment in it.
        offered = admitted_offset(self._spool, {"receivers": applied})["receivers"]
        running = (self._checkpoint / "offsets" / str(applied_id + 1)).exists()
        planned = self._offsets_of(applied_id + 1) if running else applied
        return _LogAhead(end_ms, applied, planned, running, applied_id + 1 + running, offered)

    def _unsettled(self, ahead: _LogAhead) -> str | None:
        """Why neither watcher rule may act on ``ahead`` (None: they may): both open with
        it."""
        if ahead.running and not self._before_watermark(ahead.end_ms, ahead.planned):
            return "the running batch closes them"  # ``_release_ahead``, ``_commit``
        if ahead.planned_after_listing():
            return "a batch was planned while the log was listed"  # the next call sees all
        return None

    def _release_closed(self, ahead: _LogAhead) -> int:
        """``release_before_next_batch`` on one listing; the windows published."""
        if self._unsettled(ahead) is not None:
            return 0
        if ahead.offered == ahead.planned or self._before_watermark(ahead.end_ms, ahead.offered):
            return 0
        watermark_ms = self._peek_watermark_ms(ahead.offered)
        assert watermark_ms is not None and self._spool is not None
        floor_ms = event_floor_ms(self._spool, ahead.applied, ahead.offered)
        published = self._publish_ahead(watermark_ms, floor_ms, ahead.next_id)
        if published:
            log.debug("%s: %d windows published before batch %d", self._name, published,
                      ahead.next_id)  # fmt: skip
        return published

    def _peek_watermark_ms(self, receivers: dict[str, dict[str, Any]]) -> int | None:
        """The watermark of a batch ending at ``receivers`` (``watermark_ms``, without
        raising the committed one)."""
        heartbeat_ms = receivers_heartbeat_ms(receivers)
        if heartbeat_ms is None:
            return self._watermark_floor
        progress_ms = heartbeat_ms - self._window.watermark_delay_ms
        floor_ms = self._watermark_floor
        return progress_ms if floor_ms is None else max(progress_ms, floor_ms)

    def _before_watermark(self, end_ms: int, receivers: dict[str, dict[str, Any]]) -> bool:
        """Whether a window ending at ``end_ms`` is still open in a batch ending at
        ``receivers``."""
        watermark_ms = self._peek_watermark_ms(receivers)
        return watermark_ms is None or end_ms > watermark_ms

    def _rows_may_come(self, floor_ms: int | None, through_ms: int) -> bool:
        """Whether an event at or after ``floor_ms`` (None: any event) may fall in a window
        ending at or before ``through_ms``: the log rule every publication ahead of Spark
        checks (a batch's or the log's footers give the floor, ``event_floor_ms``)."""
        return floor_ms is None or tumbling_end_ms(self._window, floor_ms) <= through_ms

    def _publish_ahead(self, watermark_ms: int, floor_ms: int | None, batch_id: int) -> int:
        """Publish the held windows ``watermark_ms`` passes at batch ``batch_id``'s revision,
        if no event at or after ``floor_ms`` (None: unknown) can fall in one of them; the
        windows published."""
        if self._rows_may_come(floor_ms, watermark_ms):
            return 0  # a row to come may change a window it releases: Spark first
        released, holding = self._holding().release(watermark_ms)
        assert released is not None
        if self._commit_prepared(released, holding, watermark_ms, batch_id):
            self._held = holding
            return int(released.num_rows)
        rows, fresh = self._split_fresh(
            self._result_rows(released, batch_id, watermark_ms, self._clock.now_ms())
        )
        published = self._store.publish_released(
            self._name, rows, fresh, released_before_ms=watermark_ms,
            windows=holding.num_windows, samples=holding.samples,
            lock_name=query_name(self._config, self._window),
        )  # fmt: skip
        self._held = holding
        return published

    def _start_preparing(self, ahead: _LogAhead) -> tuple[_Preparing, pa.Table] | None:
        """``prepare_next_release``'s decision on one listing, under the writer's lock: the
        preparation to copy and its rows (None: none now; the reason is logged when it
        changes)."""
        preparing = self._preparing
        if preparing is not None:
            if preparing.batch_id >= ahead.next_id or not self._before_watermark(
                preparing.end_ms, self._offsets_of(preparing.batch_id)
            ):
                return None  # copying, or copied and waiting for the segment that closes them
            log.debug("%s: prepared release of %d windows ending %d dropped: batch %d was "
                      "planned without the segment that closes them", self._name,
                      preparing.windows, preparing.end_ms, preparing.batch_id)  # fmt: skip
            self._drop_prepared()  # prepared again below at a later batch's revision
        reason = self._not_preparable(ahead)
        windows = None if reason else self._holding().release(ahead.end_ms)[0]
        if windows is None or windows.num_rows == 0:
            reason = reason or "no window ends there"
            if self._not_prepared != (ahead.end_ms, reason):
                log.debug("%s: windows ending %d not prepared yet: %s", self._name,
                          ahead.end_ms, reason)  # fmt: skip
            self._not_prepared = (ahead.end_ms, reason)
            return None
        self._not_prepared = None
        # The batch expected to take the segment that closes them: the first not planned
        # yet, or the one after it if the log holds segments no batch took (they are planned
        # before that segment comes, unless it comes first: then the copy is rolled back).
        batch_id = ahead.next_id + ahead.unplanned()
        rows = self._result_rows(windows, batch_id, None, self._clock.now_ms())
        preparing = _Preparing(
            ahead.end_ms, batch_id, windows.num_rows,
            self._store.prepare_release(
                self._name, lock_name=query_name(self._config, self._window)),
        )  # fmt: skip
        self._preparing = preparing
        return preparing, rows

    def _not_preparable(self, ahead: _LogAhead) -> str | None:
        """Why the windows ending at ``ahead.end_ms`` cannot be copied ahead now (None: they
        can)."""
        unsettled = self._unsettled(ahead)
        if unsettled is not None:
            return unsettled
        if not self._before_watermark(ahead.end_ms, ahead.offered):
            return "the log closes them already"  # ``_release_closed``'s
        assert self._spool is not None
        if self._rows_may_come(event_floor_ms(self._spool, ahead.applied, ahead.offered),
                               ahead.end_ms):  # fmt: skip
            return "a row in one of them may come"
        return None

    def _copy_prepared(self, preparing: _Preparing, rows: pa.Table) -> bool:
        """Copy ``rows`` into ``preparing``'s release, outside the writer's lock; whether the
        copy is kept (dropped meanwhile, or failed: rolled back)."""
        try:
            preparing.release.copy(rows)  # rolled back if it raises
        except Exception as exc:  # a window stored already, cancelled, the store down
            preparing.done.set()
            log.debug("%s: no prepared release: %s", self._name, exc)
            with self._lock:
                if self._preparing is preparing:
                    self._preparing = None
            return False
        with preparing.guard:
            dropped = preparing.dropped
            preparing.copied = not dropped
        if dropped:
            preparing.release.abort()  # dropped while it copied
        preparing.done.set()
        if dropped:
            return False
        log.debug("%s: %d windows ending %d prepared at batch %d's revision", self._name,
                  preparing.windows, preparing.end_ms, preparing.batch_id)  # fmt: skip
        return True

    def _commit_prepared(
        self, released: pa.Table, holding: HeldWindows, watermark_ms: int, batch_id: int
    ) -> bool:
        """Publish ``released`` (at ``batch_id``'s revision, under ``watermark_ms``; the
        holding left is ``holding``) by committing the prepared release, if it has exactly
        those rows; whether it did. Any other preparation is dropped: its windows are about
        to be published another way."""
        preparing = self._preparing
        if preparing is None:
            return False
        if preparing.batch_id == batch_id:
            # Still copying (the closing segment came early): the copy ends sooner than a
            # write of its own would. Its thread needs no lock of ours to finish.
            preparing.done.wait(_PREPARED_COPY_WAIT_S)
        with preparing.guard:
            copied = preparing.copied
        matches = (
            copied and preparing.batch_id == batch_id
            and released.num_rows == preparing.windows
            and pc.max(released["window_end_ms"]).as_py() == preparing.end_ms
            and preparing.end_ms + self._window.allowed_lateness_ms > watermark_ms
        )  # fmt: skip
        if not matches:
            log.debug(
                "%s: prepared release of %d windows ending %d at batch %d's revision (copied:"
                " %s) dropped: %d windows ending up to %d published at batch %d's, watermark"
                " %d", self._name, preparing.windows, preparing.end_ms, preparing.batch_id,
                copied, released.num_rows, pc.max(released["window_end_ms"]).as_py(), batch_id,
                watermark_ms,
            )  # fmt: skip
            self._drop_prepared()
            return False
        self._preparing = None
        try:
            preparing.release.commit(
                released_before_ms=watermark_ms, windows=holding.num_windows,
                samples=holding.samples,
            )  # fmt: skip
        except Exception as exc:  # the usual path publishes them (a no-op if this committed)
            log.warning("%s: the prepared release failed (%s); publishing the windows again",
                        self._name, exc)  # fmt: skip
            return False
        log.debug("%s: %d windows ending %d published from their copy at batch %d's revision",
                  self._name, preparing.windows, preparing.end_ms, batch_id)  # fmt: skip
        return True

    def _drop_prepared(self) -> None:
        """Roll the preparation back (cancel its copy if it runs)."""
        preparing, self._preparing = self._preparing, None
        if preparing is None:
            return
        with preparing.guard:
            preparing.dropped = True
            copied = preparing.copied
        if copied:
            preparing.release.abort()
        else:
            preparing.release.cancel()  # the copying thread rolls back and closes

    def abort_prepared(self) -> None:
        """Roll back a prepared release (the query stopped)."""
        with self._lock:
            self._drop_prepared()

    def _holding(self) -> HeldWindows:
        """The open windows held after the last committed batch (read once from the store)."""
        if self._held is None:
            stored = HeldWindows.from_stored(self._store.read_held(self._name))
            self._held = stored.of_types(self.lane_types)
        return self._held

    def _split_fresh(self, rows: pa.Table) -> tuple[pa.Table, pa.Table | None]:
        through = self._published_through_ms
        if through is None or rows.num_rows == 0:
            return rows, None
        is_fresh = pc.greater(rows.column("window_end_ms"), through)
        return rows.filter(pc.invert(is_fresh)), rows.filter(is_fresh)

    def _committed(self, outcome: BatchOutcome, watermark_ms: int | None) -> None:
        if outcome.already_committed:
            # The stored holding is the batch's as first committed: sums already added
            # (``AddingBatchWriter``), windows already published (``_closed_by_log``).
            self._held = None
        if watermark_ms is None:
            return
        # Rows stored beyond the watermark (a replay, an older checkpoint's) are not offered
        # as fresh again: the insert would only fail over to the upsert once more.
        through = max(watermark_ms, outcome.fresh_stored_until_ms or watermark_ms)
        self._published_through_ms = max(through, self._published_through_ms or through)

    def _held_after(
        self, changed: pa.Table, watermark_ms: int
    ) -> tuple[pa.Table, HeldWindows | None]:
        released, holding = self._holding().merged(changed).release(watermark_ms)
        if released is None or (changed.num_rows == 0 and released.num_rows == 0):
            # Idle input, the watermark short of every held end: the stored holding stands
            # (not rewritten every batch while nothing arrives).
            return changed.slice(0, 0), None
        return released, holding


class AddingBatchWriter(HoldingBatchWriter):
    """``foreachBatch`` of a native lane that keeps no Spark state (``adds_in_driver``): the
    batch's rows are merged per window here (``plain_batch_windows``, a batch job of the
    micro-batch) and added to the holding (``AddedWindows``).

    Exactly once: a batch Spark replays after a crash was committed with its holding, so
    its sums are in the holding the restarted writer loads; the store refuses the batch
    (``already_committed``) and the writer loads that holding again instead of keeping the
    one it added the sums to twice.
    """

    forgets_held = True

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self._release_ahead(batch_id)
        self._commit(plain_batch_windows(batch).toArrow(), batch_id)

    def _holding(self) -> HeldWindows:
        if self._held is None:
            self._base()  # a new checkpoint forgets the stored holding before it is read
            assert self._window.size_ms is not None
            horizon_ms = (self._window.watermark_delay_ms + self._window.allowed_lateness_ms
                          + self._window.size_ms)  # fmt: skip
            stored = AddedWindows.of_stored(self._store.read_held(self._name), horizon_ms)
            self._held = stored.of_types(self.lane_types)
        return self._held

    def _held_after(
        self, changed: pa.Table, watermark_ms: int
    ) -> tuple[pa.Table, HeldWindows | None]:
        holding = self._holding()
        assert isinstance(holding, AddedWindows)
        dropped = holding.dropped(changed)
        if dropped.num_rows:
            log.warning(
                "%s: %d samples in %d windows arrived after the job dropped their windows"
                " (%d ms behind the latest window end); not added",
                self._name, pc.sum(dropped.column("count")).as_py(), dropped.num_rows,
                holding.horizon_ms,
            )  # fmt: skip
        merged = holding.merged(changed, dropped)
        again = merged.published_again(changed)
        released, after = merged.release(watermark_ms)
        if released is None or (changed.num_rows == 0 and released.num_rows == 0):
            return changed.slice(0, 0), None  # idle: the stored holding stands
        if again is not None and again.num_rows:
            released = pa.concat_tables([again, released])
        return released, after



class PaneBatchWriter(WindowBatchWriter):
    """``foreachBatch`` of a hopping window's counters, gauges and sets
    (``hopping_pane_aggregates``): the changed panes go to the store, which publishes the
    windows made of them (``ResultStore.commit_batch(panes=...)``); the HLL union of a set
    window's panes is done here (``hopping_windows.set_values_of_panes``).

    Same query name, watermark state key, revisions and finality as the native lane it
    replaces; the window's late rows still ride in its sketch lane's query.
    """

    keeps_panes = True

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self._commit(pa.table({}), batch_id, panes=batch.toArrow())

    def _pane_batch(
        self, panes: pa.Table, progress_ms: int | None,
        result_rows: Callable[[pa.Table], pa.Table],
    ) -> PaneBatch:
        window = self._window
        assert window.size_ms is not None and window.hop_ms is not None
        n = panes.num_rows
        named = pa.table(
            {
                "config_name": pa.array([self._config.name] * n, pa.string()),
                "window_name": pa.array([window.name] * n, pa.string()),
                **{name: panes.column(name) for name in panes.column_names},
            }
        )
        lg_k = sketch_params(self._config).hll_lg_k
        return PaneBatch(
            panes=named, size_ms=window.size_ms, hop_ms=window.hop_ms,
            allowed_lateness_ms=window.allowed_lateness_ms,
            early_every_ms=window.early_every_ms, config_name=self._config.name,
            window_name=window.name, watermark_key=self._state_key, offset_ms=window.offset_ms,
            # Panes leave by the log's own progress, not the raised watermark: a new
            # checkpoint rebuilding old panes under a stored (later) watermark needs a
            # window's panes until its batches are past them.
            progress_ms=progress_ms,
            to_results=lambda assembled: result_rows(
                hopping_windows.set_values_of_panes(assembled, lg_k)
            ),
        )  # fmt: skip


class SketchBatchWriter(WindowBatchWriter):
    """``foreachBatch`` of a window's sketch lane (timers, histograms, distributions).

    Same commit as the native lane, under its own query name and watermark state key, plus
    the changed windows' HDR bucket rows for ``window_histograms``.
    """

    @staticmethod
    def lane_types_of(window: WindowSpec) -> tuple[str, ...] | None:
        return sketch_lane_types(window)

    def __init__(
        self,
        config: PipelineConfig,
        window: WindowSpec,
        store: ResultStore,
        checkpoint: Path,
        clock: Clock,
        params: SketchParams,
        *,
        late_rows: LateRowsOrigin | None = None,
    ) -> None:
        super().__init__(config, window, store, checkpoint, clock, late_rows=late_rows)
        self._name = sketch_query_name(config, window)
        store.error_labels = {"config": config.name, "query": self._name}
        self._state_key = f"watermark_ms.sketches:{window.name}"
        self._layout = HdrLayout.from_params(params)

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        table = batch.toArrow()
        change = table.column("change")
        late = table.filter(pc.equal(change, "late"))
        changed = table.filter(pc.equal(change, "upsert"))
        changed = changed.select(list(sketch_windows.OUTPUT_COLUMNS))
        histograms = to_histogram_rows(
            changed, self._config, self._window, revision=self.revision(batch_id),
            layout=self._layout,
        )
        late_rows = to_late_rows(late, self._config, self._window) if late.num_rows else None
        self._commit(changed.drop_columns(["hdr_buckets"]), batch_id, histograms=histograms,
                     late=late_rows)  # fmt: skip
        if late_rows is not None:
            log.warning(
                "%s batch %d: %d late partial(s) recorded in late_events",
                self._name, batch_id, late_rows.num_rows,
            )  # fmt: skip


class KllBatchWriter(WindowBatchWriter):
    """``foreachBatch`` of a ``quantiles: kll`` window: its only query, every metric type
    (``lane_types`` None), upserts and late partials in one commit; no histogram rows."""

    @staticmethod
    def lane_types_of(window: WindowSpec) -> tuple[str, ...] | None:
        return None  # one query: every type of the window

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


def to_histogram_rows(
    changed: pa.Table,
    config: PipelineConfig,
    window: WindowSpec,
    *,
    revision: int,
    layout: HdrLayout,
) -> pa.Table:
    """The ``window_histograms`` rows (store ``HISTOGRAM_SCHEMA``) of the changed windows."""
    empty = np.zeros(0, np.int64)
    parts = [sketch_windows.unpack_buckets(blob or b"")
             for blob in changed.column("hdr_buckets").to_pylist()]  # fmt: skip
    rows = np.repeat(np.arange(len(parts)), [len(p[0]) for p in parts])
    buckets = np.concatenate([empty, *(p[0] for p in parts)])
    counts = np.concatenate([empty, *(p[1] for p in parts)])
    lower, upper = layout.bounds(buckets)
    take = pa.array(rows, pa.int64())
    n = len(rows)
    return pa.table(
        {
            "config_name": pa.array([config.name] * n, pa.string()),
            "window_name": pa.array([window.name] * n, pa.string()),
            **{name: changed.column(name).take(take)
               for name in ("metric", "tags", "window_start_ms", "window_end_ms")},
            "bucket": pa.array(buckets.astype(np.int32)),
            "lower_bound": pa.array(lower, pa.float64()),
            "upper_bound": pa.array(upper, pa.float64()),
            "count": pa.array(counts, pa.int64()),
            "revision": pa.array([revision] * n, pa.int64()),
        }
    )  # fmt: skip


class SessionBatchWriter(WindowBatchWriter):
    """``foreachBatch`` of a session (or sliding) query: upserts, retractions and late
    partials, one commit.

    One query covers every metric type of a session window (``lane_types`` None).

    The operator's rows are split by ``change``; retractions of superseded sessions are
    deleted in the same transaction that writes the sessions replacing them, with their
    ``window_histograms`` rows, so the tables never show overlapping sessions of a series nor
    buckets of a session that no longer exists. Upserted windows of timers, histograms and
    distributions bring their bucket rows (``to_histogram_rows``), replaced as a set per window
    like the sketch lane's.
    """

    @staticmethod
    def lane_types_of(window: WindowSpec) -> tuple[str, ...] | None:
        return None  # one query: every type of the window

    def __init__(
        self,
        config: PipelineConfig,
        window: WindowSpec,
        store: ResultStore,
        checkpoint: Path,
        clock: Clock,
        *,
        late_rows: LateRowsOrigin | None = None,
    ) -> None:
        super().__init__(config, window, store, checkpoint, clock, late_rows=late_rows)
        self._layout = HdrLayout.from_params(sketch_params(config))

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        table = batch.toArrow()
        change = table.column("change")
        upserts = table.filter(pc.equal(change, "upsert"))
        retracted = table.filter(pc.equal(change, "retract"))
        late = table.filter(pc.equal(change, "late"))
        retractions = None
        if retracted.num_rows:
            n = retracted.num_rows
            retractions = pa.table(
                {
                    "config_name": pa.array([self._config.name] * n, pa.string()),
                    "window_name": pa.array([self._window.name] * n, pa.string()),
                    **{name: retracted.column(name) for name in
                       ("metric", "tags", "window_start_ms", "window_end_ms")},
                }
            )  # fmt: skip
        late_rows = to_late_rows(late, self._config, self._window) if late.num_rows else None
        histograms = to_histogram_rows(
            upserts, self._config, self._window, revision=self.revision(batch_id),
            layout=self._layout,
        )
        result_columns = ("metric", "tags", "metric_type", "window_start_ms", "window_end_ms",
                          "count", "sum", "min", "max", "last", *_QUANTILE_COLUMNS, "sketch",
                          "hdr_histogram")  # fmt: skip
        self._commit(
            upserts.select(list(result_columns)), batch_id, retractions=retractions,
            late=late_rows, histograms=histograms,
        )  # fmt: skip


def start_window_queries(
    spark: SparkSession,
    config: PipelineConfig,
    paths: JobPaths,
    store_factory: Callable[[], ResultStore],
    clock: Clock,
    *,
    trigger_interval: str | None = "0.5 seconds",
) -> list[StreamingQuery]:
    """Start the streaming queries of every window; all share the session.

    Each query gets its own store connection: Spark may run two queries' ``foreachBatch``
    at once, and one connection's transactions must not interleave. ``trigger_interval=None``
    processes what is in the spool now and stops (Spark's ``availableNow``).
    """
    queries: list[StreamingQuery] = []
    for window in config.windows:
        checkpoint = checkpoint_dir(paths, config, window)
        late_margin_ms = window.watermark_delay_ms + window.allowed_lateness_ms
        lane_rows = RowFilter("all")
        if window.kind in ("tumbling", "hopping") and not window.uses_kll:
            lane_rows = RowFilter(native_lane_rows(window))
        log = _read_spool(spark, paths, query_name(config, window), lane_rows)
        # The queries recording the window's late rows (LateRowsOrigin), one generation per
        # definition: a kll window's only query; a session or sliding window's query and its
        # .late one, both named after the window's checkpoint; otherwise the sketch lane's.
        late_rows = LateRowsOrigin(paths.spool, checkpoint.name)
        if window.kind == "session":
            writer: WindowBatchWriter = SessionBatchWriter(
                config, window, store_factory(), checkpoint, clock, late_rows=late_rows
            )
            changes = sessionized_partials(log, window, sketch_params(config))
        elif window.kind == "sliding":
            writer = SessionBatchWriter(
                config, window, store_factory(), checkpoint, clock, late_rows=late_rows
            )
            changes = slid_partials(
                log, window, pane_ms=config.pane_ms, params=sketch_params(config)
            )
        elif window.uses_kll:
            writer = KllBatchWriter(
                config, window, store_factory(), checkpoint, clock, late_rows=late_rows
            )
            kll_k = sketch_params(config).kll_k
            changes = kll_lane_with_late_rows(log, window, kll_k)
        else:
            if uses_pane_lane(window):
                writer = PaneBatchWriter(config, window, store_factory(), checkpoint, clock)
                changes = hopping_pane_aggregates(log, window)
            else:
                writer = _native_writer(config, window, store_factory(), checkpoint, clock, paths)
                if adds_in_driver(window):
                    changes = plain_lane_rows(log, window)
                elif native_lane_rows(window) == "plain":
                    changes = plain_lane_partials(log, window)
                else:
                    changes = windowed_partials(log, window)
                if sets_query(window):
                    sets_lane = sets_checkpoint(checkpoint)
                    sets_writer = _native_writer(
                        config, window, store_factory(), sets_lane, clock, paths, sets=True
                    )
                    sets_lane_query = _start_sets_query(
                        spark, config, window, paths, sets_lane, sets_writer, trigger_interval
                    )
                    queries.append(_watched(sets_lane_query, sets_writer, trigger_interval))
            params = sketch_params(config)
            lane_checkpoint = sketch_checkpoint(checkpoint, params, window)
            queries.append(
                _start(
                    sketch_lane_with_late_rows(
                        _read_spool(
                            spark,
                            paths,
                            sketch_query_name(config, window),
                            RowFilter(sketch_lane_rows(window), late_margin_ms),
                            # Live only: availableNow takes the whole log, quiet or not.
                            None if trigger_interval is None
                            else quiet_lane(config, window, lane_checkpoint),
                        ),
                        window,
                        params,
                    ),
                    sketch_query_name(config, window),
                    lane_checkpoint,
                    SketchBatchWriter(
                        config, window, store_factory(), lane_checkpoint, clock, params,
                        late_rows=LateRowsOrigin(paths.spool, lane_checkpoint.name),
                    ),
                    trigger_interval,
                    output_mode="update",
                )
            )
        query = _start(
            changes, query_name(config, window), checkpoint, writer, trigger_interval,
            # A stateless lane hands over its rows once (adds_in_driver); the others update.
            output_mode="append" if isinstance(writer, AddingBatchWriter) else "update",
        )  # fmt: skip
        queries.append(_watched(query, writer, trigger_interval))
        if window.kind not in ("session", "sliding"):
            continue  # late rows ride in the sketch lane's query (sketch_lane_with_late_rows)
        late_checkpoint = checkpoint.with_name(checkpoint.name + ".late")  # see all_checkpoints
        late_source = _read_spool(
            spark, paths, late_query_name(config, window), RowFilter("none", late_margin_ms),
            # Stateless, no window of its own to close: a batch only for rows that may be late.
            None if trigger_interval is None else QuietLane(
                span_ms=0, passed_over=str(late_checkpoint / PASSED_OVER_FILE)),
        )  # fmt: skip
        queries.append(
            _start(
                sliding_late_partials(late_source, window, pane_ms=config.pane_ms)
                if window.kind == "sliding"
                else late_partials(late_source, window),
                late_query_name(config, window),
                late_checkpoint,
                LateBatchWriter(config, window, store_factory(), late_checkpoint,
                                late_rows=late_rows),  # fmt: skip
                trigger_interval,
                output_mode="append",
            )
        )
    return queries


def _native_writer(
    config: PipelineConfig,
    window: WindowSpec,
    store: ResultStore,
    checkpoint: Path,
    clock: Clock,
    paths: JobPaths,
    *,
    sets: bool = False,
) -> WindowBatchWriter:
    """The writer of a tumbling window's native (or sets) lane: it holds the open windows,
    unless ``early_every`` publishes them from ``window_pending`` (``_EARLY``)."""
    if window.early_every_ms is not None:
        return WindowBatchWriter(config, window, store, checkpoint, clock, sets=sets)
    if adds_in_driver(window) and not sets:
        return AddingBatchWriter(config, window, store, checkpoint, clock, spool=paths.spool)
    return HoldingBatchWriter(
        config, window, store, checkpoint, clock, spool=paths.spool, sets=sets
    )


def _watched(
    query: StreamingQuery, writer: WindowBatchWriter, trigger_interval: str | None
) -> StreamingQuery:
    """``query``; a live holding writer's gets a ``ReleaseWatcher``, which publishes the
    windows the log closes between its batches (``release_before_next_batch``)."""
    if trigger_interval is not None and isinstance(writer, HoldingBatchWriter):
        ReleaseWatcher(
            query.name, writer.between_batches, lambda: bool(query.isActive),
            on_stop=writer.abort_prepared,
        ).start()
    return query


def _start_sets_query(
    spark: SparkSession,
    config: PipelineConfig,
    window: WindowSpec,
    paths: JobPaths,
    checkpoint: Path,
    writer: WindowBatchWriter,
    trigger_interval: str | None,
) -> StreamingQuery:
    """A ``sets: separate`` window's sets query (its checkpoint: ``sets_checkpoint``): the
    native aggregation of its sets alone, waiting (``QuietLane``) while the log has no set
    for it."""
    name = sets_query_name(config, window)
    log = _read_spool(
        spark, paths, name, RowFilter("sets"),
        None if trigger_interval is None else quiet_lane(config, window, checkpoint),
    )  # fmt: skip
    return _start(
        set_lane_partials(log, window), name, checkpoint, writer, trigger_interval,
        output_mode="update",
    )  # fmt: skip


def _read_spool(
    spark: SparkSession,
    paths: JobPaths,
    query: str,
    rows: RowFilter,
    quiet: QuietLane | None = None,
) -> DataFrame:
    """The log as a stream of the rows ``query`` can use (``RowFilter``), read through
    ``query``'s own registration of the source (see `register_source_for_query` for the
    Spark race that one shared one loses); with ``quiet``, batches only when it has
    something to do."""
    source = register_source_for_query(spark, query)
    reader = spark.readStream.format(source).option("path", str(paths.spool))
    return reader.options(**rows.options(), **(quiet.options() if quiet else {})).load()


def quiet_lane(config: PipelineConfig, window: WindowSpec, checkpoint: Path) -> QuietLane:
    """A tumbling or hopping window's sketch lane, or its sets query (checkpoint
    ``checkpoint``), waits while no segment has rows for it: at 100k counter series the
    sketch lane's idle batches, one a second, made the counters' batches up to twice as long
    (README, "What p50 ≤ 1 s at 100k series would take here")."""
    assert window.size_ms is not None
    span_ms = (config.pane_ms + window.size_ms + window.watermark_delay_ms
               + window.allowed_lateness_ms)  # fmt: skip
    return QuietLane(span_ms, passed_over=str(checkpoint / PASSED_OVER_FILE))


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
