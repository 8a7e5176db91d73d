"""Sketches merged one partial at a time: the reference windower's, and the shared helpers.

The reference windower (``windows/reference.py``) holds, beside the count/sum/min/max/last of
a window, a :class:`Sketches` value and merges it with :class:`SketchMerger`, one pane partial
(or one other window) at a time, with DataSketches' own merge: the definition the job's column
kernels (``window_rows``, ``sketches/digest_columns.py``) must agree with.

==============  ===========================================================================
``digest``      ``ms h d``: serialized ``tdigest_double(k)``, the pane digests merged in order
``buckets``     ``ms h d``: sparse HDR rows (int32 index, int64 count), counts added per index
``hll``         ``s``: compact HLL_8 image, the union of the pane HLLs at ``lg_k``
==============  ===========================================================================

Also here: the quantiles every window stores (``QUANTILES``), the HLL union and distinct
count every kind uses.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamgauge.ingest.pane_sketches import SKETCHED_TYPES
from streamgauge.sketches.accuracy import PERCENTILES, SketchParams
from streamgauge.sketches.hdr import HdrLayout, merge
from streamgauge.sketches.hll import estimate, serialize_hll, union_hll
from streamgauge.sketches.tdigest import deserialize_tdigest, new_tdigest, quantiles

QUANTILES = tuple(PERCENTILES.values())
QUANTILE_COLUMNS = tuple(PERCENTILES)


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


def merge_hll(hll: bytes, blobs: Iterable[bytes | None], lg_k: int) -> bytes:
    """``hll`` (a serialized HLL; ``b""`` for none yet) unioned with the pane HLLs ``blobs``
    (NULL skipped) at ``lg_k``, serialized: a set window's sketch."""
    images = [bytes(blob) for blob in blobs if blob is not None]
    if not images:
        return hll
    return serialize_hll(union_hll([hll, *images] if hll else images, lg_k))


def distinct_count(hll: bytes) -> float | None:
    """A set window's distinct count, rounded as Spark's ``hll_sketch_estimate`` rounds (so
    the number equals what Spark SQL reads from the stored image)."""
    return float(math.floor(estimate(hll).estimate + 0.5)) if hll else None


def digest_quantiles(digest: bytes) -> list[float | None]:
    """p50/p90/p99/p999 (``QUANTILES``) of a serialized digest; NULLs without one (a window
    whose partials came without digests: an old log)."""
    tdigest = deserialize_tdigest(digest) if digest else None
    if tdigest is None or tdigest.is_empty():
        return [None] * len(QUANTILES)
    return [float(v) for v in quantiles(tdigest, QUANTILES)]



OUTPUT_COLUMNS = (*QUANTILE_COLUMNS, "distinct_count", "sketch", "hdr_histogram")
"""The columns :meth:`SketchMerger.columns` gives a window row, in this order."""

def _no_buckets() -> np.ndarray:
    return np.zeros(0, np.int32)


def _no_counts() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass(slots=True)
class Sketches:
    """A window's (or pane's) sketches; empty until a sketched partial is merged."""

    digest: bytes = b""
    buckets: np.ndarray = field(default_factory=_no_buckets)
    counts: np.ndarray = field(default_factory=_no_counts)
    hll: bytes = b""


class SketchMerger:
    """Merges :class:`Sketches` at the config's accuracy and turns them into row columns."""

    def __init__(self, params: SketchParams) -> None:
        self.k = params.tdigest_k
        self.lg_k = params.hll_lg_k
        self.layout = HdrLayout.from_params(params)

    def add(
        self,
        sketches: Sketches,
        metric_type: str,
        sketch: bytes | None,
        hdr_bucket: Any,
        hdr_count: Any,
    ) -> None:
        """Merge one pane partial's sketch columns (``SEGMENT_SCHEMA``) into ``sketches``."""
        if sketch is not None and metric_type == "s":
            sketches.hll = self._union(sketches.hll, bytes(sketch))
        elif metric_type in SKETCHED_TYPES:
            if sketch is not None:
                sketches.digest = merge_digest(sketches.digest, [bytes(sketch)], self.k)
            if hdr_bucket is not None:
                sketches.buckets, sketches.counts = merge_hdr(
                    sketches.buckets, sketches.counts, [hdr_bucket], [hdr_count]
                )

    def absorb(self, sketches: Sketches, other: Sketches) -> None:
        """Merge another window's (or pane's) sketches into ``sketches``."""
        if other.digest:
            sketches.digest = merge_digest(sketches.digest, [other.digest], self.k)
        if len(other.buckets):
            sketches.buckets, sketches.counts = merge_hdr(
                sketches.buckets, sketches.counts, [other.buckets], [other.counts]
            )
        if other.hll:
            sketches.hll = self._union(sketches.hll, other.hll)

    def _union(self, hll: bytes, other: bytes) -> bytes:
        return merge_hll(hll, [other], self.lg_k)

    def columns(self, sketches: Sketches, metric_type: str) -> tuple[Any, ...]:
        """``OUTPUT_COLUMNS`` of a window of ``metric_type``: quantiles and HdrHistogram
        encoding for ``ms h d``, the distinct count (rounded like Spark's
        ``hll_sketch_estimate``, so every window kind stores the same numbers) for ``s``."""
        none: tuple[Any, ...] = (None,) * len(OUTPUT_COLUMNS)
        if metric_type == "s" and sketches.hll:
            return (*none[:4], distinct_count(sketches.hll), sketches.hll, None)
        if metric_type in SKETCHED_TYPES:
            encoded = (
                self.layout.encode(sketches.buckets, sketches.counts)
                if len(sketches.buckets) else None
            )  # fmt: skip
            return (
                *digest_quantiles(sketches.digest), None, sketches.digest or None, encoded,
            )  # fmt: skip
        return none
