"""What the window job hands the store: result, late and histogram rows, names and revisions.

Shared by every writer of the job and by ``replay``: one definition of a stored row's shape
(``store.RESULT_SCHEMA``, ``LATE_SCHEMA``, ``HISTOGRAM_SCHEMA``), of a query's name, and of
the revision a checkpoint's batches carry.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.configs import PipelineConfig, WindowSpec
from streamgauge.ingest.log import first_heartbeats
from streamgauge.ingest.spool_fs import SpoolLike
from streamgauge.sinks.store import LateRowsReread, ResultStore
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hdr_columns import HdrColumns
from streamgauge.windows.window_sketches import unpack_buckets

_QUANTILE_COLUMNS = ("p50", "p90", "p99", "p999", "distinct_count")

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


def late_query_name(config: PipelineConfig, window: WindowSpec) -> str:
    return f"{query_name(config, window)}.late"


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


def to_histogram_rows(
    changed: pa.Table,
    config: PipelineConfig,
    window: WindowSpec,
    *,
    revision: int,
    layout: HdrLayout,
) -> pa.Table:
    """The ``window_histograms`` rows of the changed windows of an operator whose rows carry
    their buckets packed in ``hdr_buckets`` (``window_sketches.pack_buckets``)."""
    parts = [unpack_buckets(blob or b"") for blob in changed.column("hdr_buckets").to_pylist()]
    sizes = np.array([len(p[0]) for p in parts], np.int64)
    offsets = np.zeros(len(parts) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    empty = np.zeros(0, np.int64)
    hdr = HdrColumns(
        offsets,
        np.concatenate([empty, *(p[0] for p in parts)]).astype(np.int32),
        np.concatenate([empty, *(p[1] for p in parts)]),
    )
    return histogram_rows(changed, hdr, config, window, revision=revision, layout=layout)


def histogram_rows(
    windows: pa.Table,
    hdr: HdrColumns,
    config: PipelineConfig,
    window: WindowSpec,
    *,
    revision: int,
    layout: HdrLayout,
) -> pa.Table:
    """The ``window_histograms`` rows (store ``HISTOGRAM_SCHEMA``) of ``windows``, row ``i``'s
    buckets being ``hdr``'s series ``i`` (vectorised: one row per window and bucket)."""
    sizes = np.diff(hdr.offsets)
    rows = np.repeat(np.arange(len(sizes)), sizes)
    buckets = hdr.buckets.astype(np.int64)
    lower, upper = layout.bounds(buckets)
    take = pa.array(rows, pa.int64())
    n = len(rows)
    return pa.table(
        {
            "config_name": pa.array([config.name] * n, pa.string()),
            "window_name": pa.array([window.name] * n, pa.string()),
            **{name: windows.column(name).take(take)
               for name in ("metric", "tags", "window_start_ms", "window_end_ms")},
            "bucket": pa.array(hdr.buckets.astype(np.int32)),
            "lower_bound": pa.array(lower, pa.float64()),
            "upper_bound": pa.array(upper, pa.float64()),
            "count": pa.array(hdr.counts, pa.int64()),
            "revision": pa.array(np.full(n, revision, np.int64)),
        }
    )  # fmt: skip
