"""`streamgauge replay`: recompute final windows from the segment log and publish corrections.

The streaming job never changes a final window: partials that arrive after it are recorded in
``late_events``. Replay reads the whole retained log in one Spark batch job, with the same
window assignment and aggregation code as the streaming job but **without** the lateness
cut, so late partials are included, and writes every window that changed with the next
revision (``ResultStore.publish_corrections``).

Session windows are not replayed yet: their late partials stay in ``late_events`` (and are
counted on the session they reached), and replay skips them with a warning. Recomputing a
session means re-running the merge over the whole series, and a correction may merge
stored sessions, so it needs retractions too; that is the next step.

A ``quantiles: kll`` window is recomputed like its streaming query: one native aggregation of
every type, p50/p90 from the merged KLL (``aggregate_windows(..., kll_k)``), no histogram rows.

Only final windows are replayed (``window_end + allowed_lateness <= watermark`` of the
window's query, as stored in ``pipeline_state``): open windows still belong to the streaming
job, whose revisions must keep increasing.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamgauge.clock import Clock
from streamgauge.configs import PipelineConfig
from streamgauge.sinks.store import ResultStore
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.windows.job import (
    aggregate_windows,
    assign_windows,
    is_sketched,
    metric_filter,
    query_name,
    sketch_params,
    to_histogram_rows,
    to_result_rows,
)
from streamgauge.windows.sketch_windows import OUTPUT_DDL as SKETCH_OUTPUT_DDL
from streamgauge.windows.sketch_windows import merge_windows_batch
from streamgauge.windows.source import SOURCE_NAME

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayedWindow:
    window_name: str
    watermark_ms: int | None
    windows_recomputed: int
    windows_corrected: int
    late_partials_applied: int
    skipped: str = ""


def parse_time_ms(text: str) -> int:
    """ISO-8601 with a UTC offset (``2026-11-21T10:00:00Z``) or epoch seconds → epoch ms."""
    stripped = text.strip()
    try:
        seconds = float(stripped)
    except ValueError:
        pass
    else:
        return round(seconds * 1000)
    try:
        parsed = dt.datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is neither ISO-8601 (2026-11-21T10:00:00Z) nor epoch seconds"
        ) from None
    if parsed.tzinfo is None:
        raise ValueError(f"{text!r} has no UTC offset: write it with Z or +00:00")
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (parsed - epoch) // dt.timedelta(milliseconds=1)


def replay(
    spark: SparkSession,
    config: PipelineConfig,
    spool: Path,
    store: ResultStore,
    clock: Clock,
    *,
    from_ms: int,
    to_ms: int,
) -> list[ReplayedWindow]:
    """Recompute the final windows of ``config`` overlapping ``[from_ms, to_ms)``."""
    if to_ms <= from_ms:
        raise ValueError(f"--to ({to_ms} ms) must be after --from ({from_ms} ms)")
    log_rows = spark.read.format(SOURCE_NAME).option("path", str(spool)).load()
    report = []
    for window in config.windows:
        if window.kind in ("session", "sliding"):
            log.warning(
                "replay: window %r is a %s window; replaying %s windows is not implemented "
                "yet, its late partials stay in late_events", window.name, window.kind,
                window.kind,
            )  # fmt: skip
            skipped = f"{window.kind} windows are not replayed yet"
            report.append(ReplayedWindow(window.name, None, 0, 0, 0, skipped=skipped))
            continue
        # Both lanes' watermarks: a window is final for replay only once final in each (a
        # quantiles: kll window has one query; a sketch lane's state left from before it
        # became one must not hold it back).
        prefixes = ["watermark_ms"] + ([] if window.uses_kll else ["watermark_ms.sketches"])
        lanes = [store.read_state(config.name, f"{prefix}:{window.name}")
                 for prefix in prefixes]  # fmt: skip
        known = [w for w in lanes if w is not None]
        watermark_ms = min(known) if known else None
        if watermark_ms is None:
            report.append(ReplayedWindow(window.name, None, 0, 0, 0))
            continue
        assigned = assign_windows(log_rows, window).where(
            metric_filter(window.metrics)
            & (F.col("window_start_ms") < F.lit(to_ms))
            & (F.col("window_end_ms") > F.lit(from_ms))
            & (F.col("window_end_ms") + F.lit(window.allowed_lateness_ms) <= F.lit(watermark_ms))
        )
        params = sketch_params(config)
        if window.uses_kll:  # every type in one aggregation, as the streaming query does
            rows = to_result_rows(
                aggregate_windows(
                    assigned.withColumn("window_end_ts", F.timestamp_millis("window_end_ms")),
                    params.kll_k,
                ).toArrow(),
                config, window, revision=1, watermark_ms=watermark_ms,
                emitted_at_ms=clock.now_ms(),
            )  # fmt: skip
            outcome = store.publish_corrections(rows, lock_name=query_name(config, window))
            report.append(
                ReplayedWindow(
                    window.name, watermark_ms, rows.num_rows, outcome.rows_upserted,
                    outcome.rows_finalized,
                )
            )  # fmt: skip
            continue
        native = aggregate_windows(
            assigned.where(~is_sketched())
            .withColumn("window_end_ts", F.timestamp_millis("window_end_ms"))
        ).toArrow()
        sketched = (
            assigned.where(is_sketched())
            .groupBy("window_start_ms", "window_end_ms", "metric", "tags")
            .applyInPandas(merge_windows_batch(params), SKETCH_OUTPUT_DDL)
            .toArrow()
        )
        histograms = to_histogram_rows(
            sketched, config, window, revision=0, layout=HdrLayout.from_params(params)
        )
        rows = pa.concat_tables(
            [to_result_rows(changed, config, window, revision=1, watermark_ms=watermark_ms,
                            emitted_at_ms=clock.now_ms())
             for changed in (native, sketched.drop_columns(["hdr_buckets"]))],
            promote_options="permissive",
        )  # fmt: skip
        outcome = store.publish_corrections(
            rows, lock_name=query_name(config, window), histograms=histograms
        )
        report.append(
            ReplayedWindow(
                window.name, watermark_ms, rows.num_rows, outcome.rows_upserted,
                outcome.rows_finalized,
            )
        )  # fmt: skip
    return report
