"""Timer, histogram and distribution windows: partials with sketches, merged by a stateful operator.

Why a separate operator: Spark merges counts, sums and HyperLogLogs natively
(``hll_union_agg``), but it has no t-digest, and a grouped-aggregate pandas UDF is refused in a
streaming aggregation ("Streaming aggregation doesn't support group aggregate pandas UDF").
Collecting the pane digests of a window into a list would keep every pane's digest in Spark's
state until the window is evicted (a 1 h window of 1 s panes: 3,600 digests per series). So the
``ms``/``h``/``d`` rows of a window query take this path instead: ``applyInPandasWithState``
keyed by (metric, tags), whose state per series is its open windows, each a running aggregate:

====================  ==========================================================
count, sum, min, max  added / compared as the native lane does
last                  value of the latest event (``last_event_ms``)
t-digest              ``tdigest_double(k)`` merged from the pane digests
HDR buckets           sparse (index, count) rows, counts added per index
====================  ==========================================================

The state is bounded by the open windows (those Spark's watermark has not passed), each a
digest of at most ~``k`` centroids and at most a few hundred HDR buckets, whatever the number
of panes. Per micro-batch the operator emits, per changed window, the merged values, p50/p90/
p99/p999 from the t-digest (strong in the tails; the HDR rows answer mid-range quantiles with a
bounded relative error), the serialized digest, the HdrHistogram standard encoding and the
bucket rows the store writes into ``window_histograms``.

A tumbling window's sets take this path too with ``sets: with_timers``
(``checkpoints.splits_sets``): their pane HLLs are
unioned per window with DataSketches at the config's lgK, kept where a timer keeps its digest,
and the row gets ``distinct_count`` (rounded as Spark's ``hll_sketch_estimate`` rounds) and the
HLL image in ``sketch``, as the session and sliding operators give a set. Its counters and
gauges then aggregate natively without an HLL buffer in every group's state.

The other lane (counters and gauges; a hopping window's sets too) is the native aggregation in
``job.py``; the two lanes are separate streaming queries over the same source and share the
late-events query, and the store scopes emission and finality to each lane's metric types.

State blob, per window (a list of records; an array field in a state schema crashed the
Python worker, a blob works — DESIGN.md §9)::

    <qqqddddqII>  start, end, count, sum, min, max, last, last_event_ms, len(digest), buckets
    digest bytes (a set's: its HLL image), int32 bucket indices, int64 bucket counts
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from streamgauge.sketches.accuracy import SketchParams
from streamgauge.sketches.hdr import HdrLayout, merge
from streamgauge.sketches.hll import estimate, serialize_hll, union_hll
from streamgauge.sketches.tdigest import deserialize_tdigest, new_tdigest, quantiles
from streamgauge.windows.aggregates import Scalars, output_frame, read_batch, total_order

QUANTILES = (0.5, 0.9, 0.99, 0.999)
QUANTILE_COLUMNS = ("p50", "p90", "p99", "p999")

_HEADER = struct.Struct("<qqqddddqII")

STATE_DDL = "metric_type string, windows binary"

OUTPUT_DDL = (
    "metric string, tags string, metric_type string, window_start_ms bigint, "
    "window_end_ms bigint, count bigint, sum double, min double, max double, last double, "
    "p50 double, p90 double, p99 double, p999 double, distinct_count double, sketch binary, "
    "hdr_histogram string, hdr_buckets binary"
)
OUTPUT_COLUMNS = tuple(part.split()[0] for part in OUTPUT_DDL.split(", "))

INPUT_COLUMNS = (
    "metric", "tags", "metric_type", "window_start_ms", "window_end_ms", "count", "sum", "min",
    "max", "last", "last_event_ms", "sketch", "hdr_bucket", "hdr_count",
)  # fmt: skip


@dataclass(slots=True)
class SketchWindow:
    """One window's running aggregate."""

    start: int
    end: int
    scalars: Scalars = field(default_factory=Scalars)
    digest: bytes = b""
    buckets: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))


def pack_windows(windows: list[SketchWindow]) -> bytes:
    parts: list[bytes] = []
    for w in windows:
        parts.append(_HEADER.pack(w.start, w.end, *w.scalars.record(), len(w.digest),
                                  len(w.buckets)))  # fmt: skip
        parts.append(pack_digest_and_buckets(w.digest, w.buckets, w.counts))
    return b"".join(parts)


def pack_digest_and_buckets(digest: bytes, buckets: np.ndarray, counts: np.ndarray) -> bytes:
    """A digest and HDR buckets as state bytes (their lengths go in the caller's header)."""
    return digest + buckets.astype("<i4").tobytes() + counts.astype("<i8").tobytes()


def unpack_digest_and_buckets(
    data: bytes, offset: int, n_digest: int, n_buckets: int
) -> tuple[bytes, np.ndarray, np.ndarray, int]:
    """``pack_digest_and_buckets``' bytes at ``offset``, and the offset after them."""
    digest = data[offset : offset + n_digest]
    offset += n_digest
    buckets = np.frombuffer(data, "<i4", n_buckets, offset).astype(np.int32)
    offset += 4 * n_buckets
    counts = np.frombuffer(data, "<i8", n_buckets, offset).astype(np.int64)
    return digest, buckets, counts, offset + 8 * n_buckets


def unpack_windows(blob: bytes) -> list[SketchWindow]:
    data = bytes(blob)
    windows, offset = [], 0
    while offset < len(data):
        start, end, count, total, lo, hi, last, last_ms, n_digest, n_buckets = (
            _HEADER.unpack_from(data, offset)
        )
        digest, buckets, counts, offset = unpack_digest_and_buckets(
            data, offset + _HEADER.size, n_digest, n_buckets
        )
        windows.append(SketchWindow(start, end, Scalars(count, total, lo, hi, last, last_ms),
                                    digest, buckets, counts))  # fmt: skip
    return windows


def pack_buckets(buckets: np.ndarray, counts: np.ndarray) -> bytes:
    """Sparse HDR rows as one binary value: n int32 indices, then n int64 counts."""
    return buckets.astype("<i4").tobytes() + counts.astype("<i8").tobytes()


def unpack_buckets(blob: bytes) -> tuple[np.ndarray, np.ndarray]:
    n = len(blob) // 12
    return (
        np.frombuffer(blob, "<i4", n, 0).astype(np.int64),
        np.frombuffer(blob, "<i8", n, 4 * n).astype(np.int64),
    )


def merge_digest(digest: bytes, blobs: Iterable[bytes | None], k: int) -> bytes:
    """``digest`` (serialized; ``b""`` for none yet) with the serialized pane digests ``blobs``
    merged in, in order, serialized again (NULL blobs skipped). The one t-digest merge of every
    window kind: a function of its inputs, so a replayed batch gives the same bytes."""
    merged = deserialize_tdigest(digest) if digest else new_tdigest(k)
    for blob in blobs:
        if blob is not None:
            merged.merge(deserialize_tdigest(blob))
    return bytes(merged.serialize())


def merge_hdr(
    buckets: np.ndarray,
    counts: np.ndarray,
    index_lists: Iterable[Any],
    count_lists: Iterable[Any],
) -> tuple[np.ndarray, np.ndarray]:
    """Sparse HDR rows (int32 indices, int64 counts) with the partials' lists added (NULL lists
    skipped): counts add per bucket index, so the order of the partials does not matter."""
    parts_i = [buckets.astype(np.int64)]
    parts_c = [counts]
    for index_list, count_list in zip(index_lists, count_lists, strict=True):
        if index_list is not None:
            parts_i.append(np.asarray(index_list, dtype=np.int64))
            parts_c.append(np.asarray(count_list, dtype=np.int64))
    merged, summed = merge(np.concatenate(parts_i), np.concatenate(parts_c))
    return merged.astype(np.int32), summed


#: A total order of a window's partials within one call (ties: identical rows, whose merge
#: order does not matter). Spark's shuffle does not fix the order of a group's rows, and
#: floating-point sums and t-digest merges depend on it: a replayed micro-batch (or replay)
#: must give the same bytes.
MERGE_ORDER = ("last_event_ms", "count", "sum", "min", "max", "last")


def _in_merge_order(rows: pd.DataFrame) -> pd.DataFrame:
    if len(rows) < 2:
        return rows
    return rows.iloc[total_order(rows, MERGE_ORDER)]


def merge_hll(hll: bytes, blobs: Iterable[bytes | None], lg_k: int) -> bytes:
    """``hll`` (a serialized HLL; ``b""`` for none yet) unioned with the pane HLLs ``blobs``
    (NULL skipped) at ``lg_k``, serialized: a set window's sketch."""
    images = [bytes(blob) for blob in blobs if blob is not None]
    if not images:
        return hll
    return serialize_hll(union_hll([hll, *images] if hll else images, lg_k))


def distinct_count(hll: bytes) -> float | None:
    """A set window's distinct count, rounded as Spark's ``hll_sketch_estimate`` rounds (the
    native lanes' and other window kinds' numbers are the same)."""
    return float(math.floor(estimate(hll).estimate + 0.5)) if hll else None


def merge_rows(
    window: SketchWindow, rows: pd.DataFrame, k: int, *, metric_type: str, lg_k: int
) -> None:
    """Fold pane partials (``INPUT_COLUMNS`` rows of this window) into ``window``, in
    ``MERGE_ORDER``: a set's HLLs (``metric_type`` ``s``, unioned at ``lg_k``), otherwise
    t-digests and HDR buckets."""
    rows = _in_merge_order(rows)
    scalars = window.scalars
    scalars.count += int(rows["count"].sum())
    scalars.sum += float(rows["sum"].sum())
    scalars.min = min(scalars.min, float(rows["min"].min()))
    scalars.max = max(scalars.max, float(rows["max"].max()))
    # Not ``merge_scalars``: on a tie of ``last_event_ms`` the rows' ``last`` wins here.
    newest = int(rows["last_event_ms"].values.argmax())
    if int(rows["last_event_ms"].iloc[newest]) >= scalars.last_event_ms:
        scalars.last = float(rows["last"].iloc[newest])
        scalars.last_event_ms = int(rows["last_event_ms"].iloc[newest])
    if metric_type == "s":
        window.digest = merge_hll(window.digest, rows["sketch"], lg_k)
        return
    window.digest = merge_digest(window.digest, rows["sketch"], k)
    window.buckets, window.counts = merge_hdr(
        window.buckets, window.counts, rows["hdr_bucket"], rows["hdr_count"]
    )


def digest_quantiles(digest: bytes) -> list[float | None]:
    """p50/p90/p99/p999 (``QUANTILES``) of a serialized digest; NULLs without one (a window
    whose partials came without digests: an old log)."""
    tdigest = deserialize_tdigest(digest) if digest else None
    if tdigest is None or tdigest.is_empty():
        return [None] * len(QUANTILES)
    return [float(v) for v in quantiles(tdigest, QUANTILES)]


def output_row(
    metric: str, tags: str, metric_type: str, window: SketchWindow, layout: HdrLayout
) -> tuple[Any, ...]:
    """One ``OUTPUT_DDL`` row: the window's values, quantiles and encodings (a set's: its
    distinct count and HLL)."""
    if metric_type == "s":
        return (
            metric, tags, metric_type, window.start, window.end,
            *window.scalars.output_values(), *(None,) * len(QUANTILES),
            distinct_count(window.digest), window.digest or None, None, None,
        )  # fmt: skip
    p = digest_quantiles(window.digest)
    encoded = layout.encode(window.buckets, window.counts) if len(window.buckets) else None
    return (
        metric, tags, metric_type, window.start, window.end, *window.scalars.output_values(),
        *p, None, window.digest or None, encoded, pack_buckets(window.buckets, window.counts),
    )  # fmt: skip


def _by_window(batch: pd.DataFrame) -> Any:
    """``batch``'s rows per window, in window order. A live micro-batch usually brings a
    series one window's rows: then the batch itself, without a pandas groupby (~0.75 ms of a
    ~2.5 ms call for one timer partial, bench/hopping_operator.py's copied rows)."""
    starts = batch["window_start_ms"].to_numpy()
    ends = batch["window_end_ms"].to_numpy()
    if len(starts) and (starts == starts[0]).all() and (ends == ends[0]).all():
        return [((starts[0], ends[0]), batch)]
    return batch.groupby(["window_start_ms", "window_end_ms"])


def sketch_state_function(params: SketchParams) -> Any:
    """The ``applyInPandasWithState`` function of the sketch lane (picklable closure)."""
    k, lg_k = params.tdigest_k, params.hll_lg_k
    layout = HdrLayout.from_params(params)

    def update_windows(
        key: tuple[str, str], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        metric, tags = key
        metric_type: str | None = None
        windows: dict[tuple[int, int], SketchWindow] = {}
        if state.exists:
            metric_type, blob = state.get
            windows = {(w.start, w.end): w for w in unpack_windows(blob)}
        changed: list[tuple[int, int]] = []
        if not state.hasTimedOut:
            batch, metric_type = read_batch(frames, metric_type)
            for (start, end), rows in _by_window(batch):
                bounds = (int(start), int(end))
                window = windows.setdefault(bounds, SketchWindow(*bounds))
                merge_rows(window, rows, k, metric_type=metric_type or "ms", lg_k=lg_k)
                changed.append(bounds)
        out = [output_row(metric, tags, metric_type or "ms", windows[b], layout)
               for b in sorted(changed)]  # fmt: skip
        # Free what Spark's watermark passed: no on-time partial can reach it (job.py horizon).
        watermark = state.getCurrentWatermarkMs()
        kept = [w for w in windows.values() if w.end > watermark]
        if kept:
            state.update((metric_type, pack_windows(kept)))
            state.setTimeoutTimestamp(max(w.end for w in kept))
        else:
            state.remove()
        if out:
            yield output_frame(out, OUTPUT_COLUMNS)

    return update_windows


def merge_windows_batch(params: SketchParams) -> Any:
    """The ``groupBy(...).applyInPandas`` function for batch recomputation (``replay``): the
    same merge as the streaming operator, over all partials of a window at once."""
    k, lg_k = params.tdigest_k, params.hll_lg_k
    layout = HdrLayout.from_params(params)

    def merge_group(rows: pd.DataFrame) -> pd.DataFrame:
        first = rows.iloc[0]
        window = SketchWindow(int(first["window_start_ms"]), int(first["window_end_ms"]))
        metric_type = min(rows["metric_type"].tolist())
        merge_rows(window, rows, k, metric_type=metric_type, lg_k=lg_k)
        row = output_row(str(first["metric"]), str(first["tags"]), metric_type, window, layout)
        return pd.DataFrame([row], columns=list(OUTPUT_COLUMNS))

    return merge_group
