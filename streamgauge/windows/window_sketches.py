"""The sketches of a session or sliding window (or of a pane it is built from), in operator state.

Session and sliding windows merge pane partials one at a time in a Python stateful operator
(``session_windows``, ``sliding_windows``) and in the reference windower; both hold, beside the
count/sum/min/max/last of a window, a :class:`Sketches` value and merge it with
:class:`SketchMerger`, which is ``sketch_windows``' merge code (t-digest, HDR buckets) plus an
HLL union for sets:

==============  ===========================================================================
``digest``      ``ms h d``: serialized ``tdigest_double(k)``, the pane digests merged in order
``buckets``     ``ms h d``: sparse HDR rows (int32 index, int64 count), counts added per index
``hll``         ``s``: compact HLL_8 image, the union of the pane HLLs at ``lg_k``
``complete``    False when restored from a state written before sketches were kept: its
                sketch columns are NULL rather than describing only part of the window
==============  ===========================================================================

Every merge is one partial (or one other window) at a time and the value is kept serialized
between merges, so a window's bytes are a function of the sequence of partials merged into it,
not of where Spark cut the micro-batches: a replayed batch gives the same bytes, and so does the
reference windower when it merges in the same order.

Packed form: a state blob starts with ``STATE_VERSION`` and the HDR layout's fingerprint
(8 bytes: bucket *indices* mean values only under one layout, and the session and sliding
checkpoints are not named after it as the sketch lane's are), then per window its fixed-size
record and its sketches::

    <?III>  complete, len(digest), number of HDR buckets, len(hll)
    digest bytes, int32 bucket indices, int64 bucket counts, hll bytes

A blob of another layout (``sketches:`` accuracy changed under a running checkpoint) reads
with its windows marked incomplete and their buckets dropped, never merged with indices of the
new layout.

Size per window, measured at the default accuracy (k = 200, lgK 12, HDR at 2 significant
digits over 0.1 ms .. 1 h; ``tests/windows/test_window_sketches.py`` holds the bounds): 13 bytes
of header; a digest of up to ~4.7 KB (1.6 KB for one pane of 100 values, 3.8 KB after 100 such
panes, 4.4 KB after 1000: it keeps ~k centroids whatever it has merged); 12 bytes per non-empty
HDR bucket, which is what the values span (~800 buckets for lognormal latencies over three
decades, at most 3,328 = 40 KB if they span the whole range); an HLL of 8 + 4 bytes per member
while small, at most 4.1 KB. A lognormal timer session: 2.8 KB after one partial, 13.5 KB after
100, 16.9 KB after 1000; a set session: at most 4.2 KB. Bounded per window, whatever the number
of partials, but ~100 times the 56 bytes of its count/sum/min/max/last record.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamgauge.ingest.pane_sketches import SKETCHED_TYPES
from streamgauge.sketches.accuracy import SketchParams
from streamgauge.sketches.hdr import HdrLayout, merge
from streamgauge.sketches.hll import estimate, serialize_hll, union_hll
from streamgauge.sketches.tdigest import deserialize_tdigest, new_tdigest, quantiles

QUANTILES = (0.5, 0.9, 0.99, 0.999)


QUANTILE_COLUMNS = ("p50", "p90", "p99", "p999")


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


def digest_quantiles(digest: bytes) -> list[float | None]:
    """p50/p90/p99/p999 (``QUANTILES``) of a serialized digest; NULLs without one (a window
    whose partials came without digests: an old log)."""
    tdigest = deserialize_tdigest(digest) if digest else None
    if tdigest is None or tdigest.is_empty():
        return [None] * len(QUANTILES)
    return [float(v) for v in quantiles(tdigest, QUANTILES)]



_HEADER = struct.Struct("<?III")

OUTPUT_COLUMNS = (*QUANTILE_COLUMNS, "distinct_count", "sketch", "hdr_histogram", "hdr_buckets")
"""The columns :meth:`SketchMerger.columns` gives a window row, in this order."""

OUTPUT_DDL = (
    "p50 double, p90 double, p99 double, p999 double, distinct_count double, sketch binary, "
    "hdr_histogram string, hdr_buckets binary"
)

STATE_VERSION = struct.pack("<q", -2)
"""First 8 bytes of a state blob that holds sketches. Older blobs are fixed-size records whose
first field is an event time (epoch ms, never negative), so the two are told apart exactly."""


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
    complete: bool = True

    def pack(self) -> bytes:
        return b"".join((
            _HEADER.pack(self.complete, len(self.digest), len(self.buckets), len(self.hll)),
            pack_digest_and_buckets(self.digest, self.buckets, self.counts), self.hll,
        ))  # fmt: skip

    @classmethod
    def unpack_from(cls, data: bytes, offset: int) -> tuple[Sketches, int]:
        """The sketches packed at ``offset`` of ``data``, and the offset after them."""
        complete, n_digest, n_buckets, n_hll = _HEADER.unpack_from(data, offset)
        digest, buckets, counts, offset = unpack_digest_and_buckets(
            data, offset + _HEADER.size, n_digest, n_buckets
        )
        hll = data[offset : offset + n_hll]
        return cls(digest, buckets, counts, hll, bool(complete)), offset + n_hll

    def same_as(self, other: Sketches) -> bool:
        return (
            (self.digest, self.hll, self.complete) == (other.digest, other.hll, other.complete)
            and np.array_equal(self.buckets, other.buckets)
            and np.array_equal(self.counts, other.counts)
        )


def layout_fingerprint(params: SketchParams) -> bytes:
    """8 bytes naming the HDR layout (what a bucket index means)."""
    layout = [params.hdr_lowest, params.hdr_highest, params.hdr_significant_digits,
              params.value_scale]  # fmt: skip
    return hashlib.sha256(json.dumps(layout).encode()).digest()[:8]


def pack_records(records: Sequence[tuple[bytes, Sketches]], fingerprint: bytes) -> bytes:
    """A state blob: the version marker, the layout's fingerprint, then per record its fixed
    part and its sketches."""
    parts = (fixed + sketches.pack() for fixed, sketches in records)
    return b"".join([STATE_VERSION, fingerprint, *parts])


def unpack_records(
    blob: bytes, record: struct.Struct, fingerprint: bytes
) -> list[tuple[tuple[Any, ...], Sketches]]:
    """Inverse of :func:`pack_records`. A blob without the version marker (written before
    sketches were kept) is a run of fixed records: their sketches are marked incomplete; so are
    those of a blob written under another HDR layout (their buckets are dropped)."""
    data = bytes(blob)
    if not data.startswith(STATE_VERSION):
        return [(fields, Sketches(complete=False)) for fields in record.iter_unpack(data)]
    offset = len(STATE_VERSION) + len(fingerprint)
    same_layout = data[len(STATE_VERSION) : offset] == fingerprint
    found = []
    while offset < len(data):
        fields = record.unpack_from(data, offset)
        sketches, offset = Sketches.unpack_from(data, offset + record.size)
        if not same_layout:
            sketches = Sketches(sketches.digest, hll=sketches.hll, complete=False)
        found.append((fields, sketches))
    return found


class SketchMerger:
    """Merges :class:`Sketches` at the config's accuracy and turns them into row columns."""

    def __init__(self, params: SketchParams) -> None:
        self.k = params.tdigest_k
        self.lg_k = params.hll_lg_k
        self.layout = HdrLayout.from_params(params)
        self.fingerprint = layout_fingerprint(params)

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
        sketches.complete = sketches.complete and other.complete

    def _union(self, hll: bytes, other: bytes) -> bytes:
        return merge_hll(hll, [other], self.lg_k)

    def columns(self, sketches: Sketches, metric_type: str) -> tuple[Any, ...]:
        """``OUTPUT_COLUMNS`` of a window of ``metric_type``: quantiles, HdrHistogram encoding
        and bucket rows for ``ms h d``, the distinct count (rounded like Spark's
        ``hll_sketch_estimate``, so every window kind stores the same numbers) for ``s``."""
        none: tuple[Any, ...] = (None,) * len(OUTPUT_COLUMNS)
        if not sketches.complete:
            return none
        if metric_type == "s" and sketches.hll:
            return (*none[:4], distinct_count(sketches.hll), sketches.hll, None, None)
        if metric_type in SKETCHED_TYPES:
            encoded = (
                self.layout.encode(sketches.buckets, sketches.counts)
                if len(sketches.buckets) else None
            )  # fmt: skip
            return (
                *digest_quantiles(sketches.digest), None, sketches.digest or None, encoded,
                pack_buckets(sketches.buckets, sketches.counts),
            )  # fmt: skip
        return none
