"""What the window job hands the store: result and late rows, names and revisions.

Shared by every writer of the job and by ``replay``: one definition of a stored row's shape
(``store.RESULT_SCHEMA`` with its HDR buckets, ``LATE_SCHEMA``), of a query's name, and of
the revision a checkpoint's batches carry.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hdrh.histogram import HdrHistogram

from streamgauge.configs import PipelineConfig, WindowSpec
from streamgauge.ingest.log import first_heartbeats
from streamgauge.ingest.spool_fs import SpoolLike
from streamgauge.sinks.store import LateRowsReread, ResultStore, pack_hdr_buckets
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hdr_columns import HdrColumns
from streamgauge.windows.plan import query_name

_QUANTILE_COLUMNS = ("p50", "p90", "p99", "p999", "distinct_count")

REVISION_BASE_FILE = "streamgauge-revision-base.json"


def checkpoint_generation(checkpoint: Path) -> str:
    """What the late rows a checkpoint records again are named by (``LateRowsReread``):
    Spark's id of the checkpoint, new whenever its directory is made again (a changed
    definition, or the directory deleted), unlike the directory's name."""
    metadata = checkpoint / "metadata"
    if metadata.exists():
        return str(json.loads(metadata.read_text())["id"])
    return checkpoint.name


def revision_base(
    checkpoint: Path,
    store: ResultStore,
    config: PipelineConfig,
    window: WindowSpec,
    query_names: Sequence[str],
    *,
    late_rows_spool: SpoolLike | None = None,
) -> int:
    """What a checkpoint's revisions start from: ``revision = base + batch id + 1``.

    Fixed once per checkpoint (a file beside Spark's own), so a replayed micro-batch gets the
    same revision as the first time. A new checkpoint (a changed window definition, or a
    deleted checkpoint directory) starts above every revision stored for the window, and its
    batch ids are forgotten in ``sink_batches`` (``ResultStore.start_checkpoint``), as are
    the late rows it will record again if it records the window's (``late_rows_spool``: the
    spool it reads them from). A
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
        if late_rows_spool is not None:
            reread = LateRowsReread(
                checkpoint_generation(checkpoint), first_heartbeats(late_rows_spool),
                query_name(config, window),
            )
        base = store.start_checkpoint(config.name, window.name, query_names, late_reread=reread)
    checkpoint.mkdir(parents=True, exist_ok=True)
    temporary = marker.with_suffix(".tmp")
    with open(temporary, "w") as handle:
        json.dump({"revision_base": base, "query_names": list(query_names)}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, marker)
    return base


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


@functools.lru_cache(maxsize=16)
def _magnitudes(layout: HdrLayout) -> tuple[int, int]:
    """The layout's unit and sub-bucket half count magnitudes, from the package itself (as
    ``HdrLayout`` takes them), for SQL's ``streamgauge_hdr_lower_bound``."""
    ref = HdrHistogram(layout.lowest, layout.highest, layout.significant_digits)
    return int(ref.unit_magnitude), int(ref.sub_bucket_half_count_magnitude)


def with_hdr_buckets(rows: pa.Table, hdr: HdrColumns, layout: HdrLayout) -> pa.Table:
    """``rows`` (``to_result_rows``) with the store's HDR columns (``store.HDR_COLUMNS``), row
    ``i``'s buckets being ``hdr``'s series ``i``: list arrays over the CSR's own buffers, NULL
    (and no layout) for a window without buckets."""
    n = rows.num_rows
    if len(hdr) != n:
        raise ValueError(f"{len(hdr)} histograms for {n} result rows")
    offsets = pa.array(hdr.offsets.astype(np.int32))
    none = pa.array(np.diff(hdr.offsets) == 0)
    unit, half = _magnitudes(layout)

    def per_row(value: float, kind: pa.DataType) -> pa.Array:
        return pc.if_else(none, pa.nulls(n, kind), pa.array(np.full(n, value), kind))

    packed = pa.array(pack_hdr_buckets(hdr.buckets, hdr.counts))
    columns = {
        "hdr_bucket_counts": pa.ListArray.from_arrays(offsets, packed, mask=none),
        "hdr_unit_magnitude": per_row(unit, pa.int16()),
        "hdr_half_count_magnitude": per_row(half, pa.int16()),
        "hdr_value_scale": per_row(layout.value_scale, pa.float64()),
    }
    for name, column in columns.items():
        rows = rows.append_column(name, column)
    return rows
