"""t-digests of many series as one column structure, merged and read in compiled passes.

Why: merging pane digests one ``tdigest_double.merge`` call per blob costs a Python round trip,
a deserialization and a compress per partial, which stalls a micro-batch at a few thousand
series. Here every digest of a batch lives in one CSR structure (:class:`DigestColumns`:
centroids of series ``i`` are ``means[offsets[i]:offsets[i + 1]]``) and each operation is one
numba call over all series: decode (:func:`from_serialized`), merge by owner
(:func:`merge_by_owner`), quantiles (:func:`quantiles`), encode (:func:`to_serialized`).

**Format** (Apache DataSketches ``tdigest_double``, little-endian, as datasketches-cpp 5.2
reads and writes it)::

    byte 0     preamble longs: 1 (empty or single value) or 2
    byte 1     serial version 1
    byte 2     family 20
    bytes 3-4  k (uint16)
    byte 5     flags: 1 empty, 2 single value, 4 reverse merge
    bytes 6-7  unused
    single value: + 1 double
    otherwise:    + uint32 num_centroids, uint32 num_buffered, double min, double max,
                  num_centroids x (double mean, uint64 weight), num_buffered x double

Every such blob is a multiple of 8 bytes, so the decoder reads whole 64-bit words: straight
from Arrow's data buffer when the blobs sit on 8-byte boundaries (the usual case), else from a
padded aligned copy. Python's ``tdigest_double.serialize`` always compresses first (no buffered
values); buffered values written by other writers become weight-1 centroids here, merged into
the centroid order (on equal means before the centroids, as datasketches' compress orders them).

**Merge** (:func:`merge_by_owner`) is datasketches' own compress (``tdigest_impl.hpp``
``tdigest::merge(buffer, weight)``), run once per owner over all of its inputs' centroids:

- stable sort by mean, reversed when the merge runs in reverse (datasketches alternates the
  direction of successive compresses, recorded in the *reverse merge* flag, so that the bias of
  greedy merging does not always favour the same end);
- the greedy pass with the K_2 scale function datasketches uses: with ``W`` the total weight,
  ``normalizer = 2k / (4 ln(W / 2k) + 24)``, a centroid absorbs the next one while the combined
  weight is ``<= W * min(f(q0), f(q2))``, ``f(q) = q (1 - q) / normalizer``, ``q0``/``q2`` the
  normalized weight before the centroid and after the combined one; the second item never joins
  the first. Equal float operations in the same order: for an owner of two digests ``a, b`` the
  result is the bytes of datasketches' ``a.merge(b)`` (the first input plays datasketches' ``this``:
  its flag chooses the direction, its centroids go last before the stable sort).
- k is the columns' k: ``tdigest_double(k)`` semantics.

With ``W`` small nothing merges: at ``q = 1/2`` two unit centroids join only once
``W (4 ln(W / 2k) + 24) >= 16k`` (``W`` about 160 at k = 200), so an owner of fewer values keeps
every value as its own centroid, exactly (datasketches' merge compresses too, with the same
result). One pass over all inputs is *at least* as accurate as datasketches' sequential merges
(one compress per partial): it compresses each value once instead of once per partial.

An owner with exactly one non-empty input gets that digest unchanged (bytes equal; a compress
of an already compressed digest can only lose accuracy); datasketches' ``empty.merge(d)`` would
re-compress it. Owners without inputs, or only empty ones, are empty.

The sorted runs are merged, not sorted again: the other inputs' runs pairwise into one, and
that with the first input as the compress reads them. When no two centroids can join (the two
smallest weights together above the compress's ceiling: every window below ~160 values at
k = 200) the compress's output is the merged order itself, written straight out.

**Quantiles** (:func:`quantiles`) invert datasketches' ``get_rank`` (re-implemented in numba with
the same float operations, its unnormalized left-tail branch included) with the result of the
bisection of :func:`streamgauge.sketches.tdigest.quantiles`, so they equal that scalar path on
the serialized digest, bit for bit while the weights are integers (see ``tdigest.py`` for why
``get_quantile`` is not used). Where the rank function is monotonic the bisection's result
follows from its threshold, the smallest double of rank ``>= q``, found by exact inversion
(``_inverted``): a binary search over the centroids' ranks, then, inside the bracket where the
rank is one linear expression, that expression solved and its last ulps settled with the same
float operations; about a dozen cheap evaluations instead of ~60 rank evaluations.

**Weights** are float64 so that sampled values can be weighted by ``1 / rate``; serialization
rounds each to the nearest integer, at least 1 (a zero weight is refused by newer readers), so
quantiles of fractional-weight columns differ from those of their serialized form by that
rounding.

Deterministic: every function is a pure function of its inputs in their given order (a replayed
batch gives identical bytes). Large batches run in chunks of rows on several threads
(:mod:`streamgauge.sketches.kernels`), each row computed as in one pass: the same bytes for any
number of threads. Large outputs are allocated by numpy (huge pages: cheaper to touch first than
numba's own allocations). Compiled with ``cache=True``: the first process compiles (seconds,
``bench/sketch_columns.py`` prints it), later ones load the machine code from numba's cache.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from streamgauge.sketches.kernels import (
    chunk_bounds,
    compact,
    copy_runs,
    merge_capacity,
    run_chunks,
)
from streamgauge.sketches.tdigest import DEFAULT_K

__all__ = [
    "DigestColumns",
    "concat",
    "gather",
    "from_serialized",
    "merge_by_owner",
    "merge_into",
    "quantiles",
    "take",
    "to_serialized",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

_F = TypeVar("_F", bound=Callable[..., Any])

_FAMILY = 20
_SERIAL_VERSION = 1
_FLAG_EMPTY = 1
_FLAG_SINGLE = 2
_FLAG_REVERSE = 4
_MAX_K = 0xFFFF
_MIN_K = 10
# Same as tdigest._BISECTION_STEPS: the quantiles must follow the scalar path's midpoints.
_BISECTION_STEPS = 80
_INT32_MAX = 2**31 - 1

# Decode status per blob (0: valid).
_OK = 0
_TOO_SHORT = 1
_NOT_TDIGEST = 2
_BAD_PREAMBLE = 3
_NOT_FINITE = 4
_ZERO_WEIGHT = 5
_MISALIGNED = 6
_PROBLEMS = {
    _TOO_SHORT: "shorter than its header announces",
    _NOT_TDIGEST: "not a DataSketches t-digest (family 20, serial version 1)",
    _BAD_PREAMBLE: "preamble longs disagree with the flags",
    _NOT_FINITE: "a NaN or infinite min, max, mean or value",
    _ZERO_WEIGHT: "a centroid of weight 0",
    _MISALIGNED: "not a whole number of 8-byte words",
}


_FIELD_TYPES = (
    ("offsets", np.int64), ("means", np.float64), ("weights", np.float64), ("mins", np.float64),
    ("maxs", np.float64), ("reverse_merge", np.bool_),
)  # fmt: skip


def _jit(function: _F) -> _F:
    """numba's ``njit``, typed for mypy (numba ships no annotations). ``nogil``: a caller may
    run batches on threads."""
    return cast(_F, numba.njit(cache=True, nogil=True)(function))


@dataclass(frozen=True, eq=False)
class DigestColumns:
    """``n`` t-digests as CSR columns.

    Series ``i``'s centroids are ``means[offsets[i]:offsets[i + 1]]`` with ``weights`` beside
    them, sorted by mean (ties in a stable order). An empty series has no centroids, ``min``
    ``+inf`` and ``max`` ``-inf`` (datasketches' own empty values). ``reverse_merge`` is the
    datasketches flag: the direction of the series' next compress. ``k`` is the compression of
    every series.
    """

    offsets: IntArray
    means: FloatArray
    weights: FloatArray
    mins: FloatArray
    maxs: FloatArray
    reverse_merge: BoolArray
    k: int = DEFAULT_K

    def __post_init__(self) -> None:
        # One dtype and layout per field, writable: each distinct array type would be another
        # numba compile (seconds), so arrays are coerced here (copied only when they differ).
        for name, dtype in _FIELD_TYPES:
            object.__setattr__(self, name, np.require(getattr(self, name), dtype, ["C", "W"]))
        n = len(self.mins)
        problems = []
        if self.offsets.ndim != 1 or len(self.offsets) != n + 1:
            problems.append(f"offsets has shape {self.offsets.shape}, expected ({n + 1},)")
        elif self.offsets[0] != 0 or self.offsets[-1] != len(self.means):
            problems.append(f"offsets must run from 0 to len(means) = {len(self.means)}")
        if len(self.weights) != len(self.means):
            problems.append(f"{len(self.weights)} weights for {len(self.means)} means")
        if len(self.maxs) != n or len(self.reverse_merge) != n:
            problems.append(
                f"mins, maxs, reverse_merge have {n}, {len(self.maxs)}, "
                f"{len(self.reverse_merge)} rows"
            )
        if not _MIN_K <= self.k <= _MAX_K:
            problems.append(f"k={self.k} is outside {_MIN_K}..{_MAX_K}")
        if problems:
            raise ValueError("invalid DigestColumns: " + "; ".join(problems))

    def __len__(self) -> int:
        return len(self.mins)

    @property
    def sizes(self) -> IntArray:
        """Centroids per series."""
        sizes: IntArray = np.diff(self.offsets)
        return sizes

    @property
    def total_weights(self) -> FloatArray:
        """Total weight (number of values, when unweighted) per series; 0 for an empty one."""
        totals: FloatArray = _total_weights(self.offsets, self.weights)
        return totals

    @classmethod
    def empty(cls, n: int, k: int = DEFAULT_K) -> DigestColumns:
        """``n`` empty digests of compression ``k``."""
        return cls(
            np.zeros(n + 1, np.int64), np.zeros(0), np.zeros(0), np.full(n, np.inf),
            np.full(n, -np.inf), np.zeros(n, np.bool_), k,
        )  # fmt: skip


# -- decode -------------------------------------------------------------------------------


@_jit
def _merge_runs(src_m: Any, src_w: Any, dst_m: Any, dst_w: Any, bounds: Any, n_runs: Any
                ) -> Any:  # fmt: skip
    """Stable bottom-up merge of the sorted runs ``bounds[r] .. bounds[r + 1]`` of ``src``
    (on equal means the earlier run first: the permutation a stable sort of the whole gives).
    Returns the arrays holding the result."""
    while n_runs > 1:
        merged = 0
        for r in range(0, n_runs, 2):
            a = bounds[r]
            if r + 1 < n_runs:
                mid = bounds[r + 1]
                end = bounds[r + 2]
                b = mid
                t = a
                while a < mid and b < end:
                    # branch-free (selects): the comparison is a coin flip on random data
                    take_b = src_m[b] < src_m[a]
                    p = b if take_b else a
                    dst_m[t] = src_m[p]
                    dst_w[t] = src_w[p]
                    b += take_b
                    a += 1 - take_b
                    t += 1
                while a < mid:
                    dst_m[t] = src_m[a]
                    dst_w[t] = src_w[a]
                    a += 1
                    t += 1
                while b < end:
                    dst_m[t] = src_m[b]
                    dst_w[t] = src_w[b]
                    b += 1
                    t += 1
            else:
                end = bounds[r + 1]
                dst_m[a:end] = src_m[a:end]
                dst_w[a:end] = src_w[a:end]
            bounds[merged] = bounds[r]
            merged += 1
        bounds[merged] = bounds[n_runs]
        n_runs = merged
        src_m, dst_m = dst_m, src_m
        src_w, dst_w = dst_w, src_w
    return src_m, src_w


@_jit
def _scan(words: Any, starts: Any, n_words: Any, valid: Any, out_k: Any, out_n: Any) -> Any:
    """Validate each blob's header and count its centroids plus buffered values."""
    n = len(starts)
    status = np.zeros(n, np.int64)
    for i in range(n):
        out_k[i] = -1
        out_n[i] = 0
        if not valid[i]:
            continue
        size = n_words[i]
        if size < 1:
            status[i] = _TOO_SHORT
            continue
        head = words[starts[i]]
        preamble = head & 0xFF
        serial = (head >> 8) & 0xFF
        family = (head >> 16) & 0xFF
        flags = (head >> 40) & 0xFF
        if family != _FAMILY or serial != _SERIAL_VERSION:
            status[i] = _NOT_TDIGEST
            continue
        out_k[i] = (head >> 24) & 0xFFFF
        short = (flags & (_FLAG_EMPTY | _FLAG_SINGLE)) != 0
        if preamble != (1 if short else 2):
            status[i] = _BAD_PREAMBLE
            continue
        if flags & _FLAG_EMPTY:
            continue
        if flags & _FLAG_SINGLE:
            if size < 2:
                status[i] = _TOO_SHORT
            else:
                out_n[i] = 1
            continue
        if size < 4:
            status[i] = _TOO_SHORT
            continue
        counts = words[starts[i] + 1]
        n_centroids = counts & 0xFFFFFFFF
        n_buffered = (counts >> 32) & 0xFFFFFFFF
        if size < 4 + 2 * n_centroids + n_buffered:
            status[i] = _TOO_SHORT
            continue
        out_n[i] = n_centroids + n_buffered
    return status


@_jit
def _decode(
    words: Any, floats: Any, starts: Any, valid: Any, offsets: Any,
    means: Any, weights: Any, mins: Any, maxs: Any, reverse: Any,
) -> Any:  # fmt: skip
    """Fill the columns (offsets from ``_scan``'s counts); returns a status per blob."""
    n = len(starts)
    status = np.zeros(n, np.int64)
    for i in range(n):
        mins[i] = np.inf
        maxs[i] = -np.inf
        reverse[i] = False
        if not valid[i]:
            continue
        s = starts[i]
        flags = (words[s] >> 40) & 0xFF
        reverse[i] = (flags & _FLAG_REVERSE) != 0
        if flags & _FLAG_EMPTY:
            continue
        o = offsets[i]
        if flags & _FLAG_SINGLE:
            value = floats[s + 1]
            if not np.isfinite(value):
                status[i] = _NOT_FINITE
            means[o] = value
            weights[o] = 1.0
            mins[i] = value
            maxs[i] = value
            continue
        counts = words[s + 1]
        n_centroids = counts & 0xFFFFFFFF
        n_buffered = (counts >> 32) & 0xFFFFFFFF
        mins[i] = floats[s + 2]
        maxs[i] = floats[s + 3]
        if not (np.isfinite(mins[i]) and np.isfinite(maxs[i])):
            status[i] = _NOT_FINITE
        c0 = s + 4
        b0 = c0 + 2 * n_centroids
        if n_buffered == 0:
            for j in range(n_centroids):
                means[o + j] = floats[c0 + 2 * j]
                weights[o + j] = float(words[c0 + 2 * j + 1])
        else:
            # Buffered values as unit centroids, merged into the centroid order: before
            # centroids of an equal mean, as datasketches' compress stable-sorts them.
            buffered = floats[b0 : b0 + n_buffered].copy()
            ones = np.ones(n_buffered, np.float64)
            unit_runs = np.arange(n_buffered + 1)
            buffered, _ = _merge_runs(buffered, ones, np.empty(n_buffered), np.empty(n_buffered),
                                      unit_runs, n_buffered)  # fmt: skip
            a = 0
            b = 0
            for j in range(n_centroids + n_buffered):
                if b < n_buffered and (a >= n_centroids or buffered[b] <= floats[c0 + 2 * a]):
                    means[o + j] = buffered[b]
                    weights[o + j] = 1.0
                    b += 1
                else:
                    means[o + j] = floats[c0 + 2 * a]
                    weights[o + j] = float(words[c0 + 2 * a + 1])
                    a += 1
        for j in range(o, o + n_centroids + n_buffered):
            if not np.isfinite(means[j]):
                status[i] = _NOT_FINITE
            elif weights[j] == 0.0:
                status[i] = _ZERO_WEIGHT
    return status


@_jit
def _pad_copy(data: Any, starts: Any, lengths: Any, valid: Any, dest: Any, out: Any) -> None:
    """Copy each valid blob to ``out`` at byte ``dest[i]`` (8-aligned, zero-padded)."""
    for i in range(len(starts)):
        if valid[i]:
            out[dest[i] : dest[i] + lengths[i]] = data[starts[i] : starts[i] + lengths[i]]


def binary_parts(array: Any) -> tuple[npt.NDArray[np.uint8], IntArray, BoolArray, int]:
    """An Arrow ``binary``/``large_binary`` array's data bytes (zero copy), its n + 1 byte
    offsets into them (int64), its validity, and the data buffer's address."""
    if pa.types.is_binary(array.type):
        offset_type: Any = np.int32
    elif pa.types.is_large_binary(array.type):
        offset_type = np.int64
    else:
        raise TypeError(f"expected a binary or large_binary array, got {array.type}")
    n = len(array)
    buffers = array.buffers()
    itemsize = np.dtype(offset_type).itemsize
    offsets = np.frombuffer(buffers[1], offset_type, n + 1, array.offset * itemsize)
    data_buffer = buffers[2]
    data = (
        np.frombuffer(data_buffer, np.uint8)
        if data_buffer is not None and data_buffer.size
        else np.zeros(0, np.uint8)
    )
    valid = (
        np.ones(n, np.bool_)
        if array.null_count == 0
        else np.asarray(array.is_valid().to_numpy(zero_copy_only=False), np.bool_)
    )
    address = data_buffer.address if data_buffer is not None else 0
    return data, offsets.astype(np.int64), valid, int(address)


def _decode_chunk(array: Any, k: int | None) -> tuple[DigestColumns, IntArray, IntArray]:
    data, offsets, valid, address = binary_parts(array)
    n = len(valid)
    starts = offsets[:-1]
    lengths = np.diff(offsets)
    lengths = np.where(valid, lengths, 0)
    aligned = address % 8 == 0 and not np.any((starts[valid] % 8) != 0)
    if aligned and data.size:
        usable = data.size // 8 * 8
        words = data[:usable].view(np.int64)
        word_starts = starts // 8
    else:
        padded = (lengths + 7) // 8 * 8
        dest = np.zeros(n, np.int64)
        np.cumsum(padded[:-1], out=dest[1:])
        out = np.zeros(max(int(padded.sum()), 8), np.uint8)
        _pad_copy(data, starts, lengths, valid, dest, out)
        words = out.view(np.int64)
        word_starts = dest // 8
    # Read-only views either way: one array type for the kernels (a read-only array is
    # another numba type, so another compile).
    words = words.view()
    words.flags.writeable = False
    n_words = lengths // 8
    floats = words.view(np.float64)
    blob_k = np.zeros(n, np.int64)
    counts = np.zeros(n, np.int64)
    status = _scan(words, word_starts, n_words, valid, blob_k, counts)
    status = np.where((lengths % 8 != 0) & valid & (status == _OK), _MISALIGNED, status)
    _raise_on(status)
    column_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=column_offsets[1:])
    total = int(column_offsets[-1])
    means = np.empty(total, np.float64)
    weights = np.empty(total, np.float64)
    mins = np.empty(n, np.float64)
    maxs = np.empty(n, np.float64)
    reverse = np.empty(n, np.bool_)
    status = _decode(words, floats, word_starts, valid, column_offsets, means, weights, mins, maxs,
                     reverse)  # fmt: skip
    _raise_on(status)
    cols = DigestColumns(column_offsets, means, weights, mins, maxs, reverse, k or DEFAULT_K)
    return cols, blob_k, np.flatnonzero(valid)


def _raise_on(status: IntArray) -> None:
    bad = np.flatnonzero(status)
    if bad.size:
        first = int(bad[0])
        raise ValueError(
            f"{bad.size} blob(s) are not valid t-digests; row {first}: "
            f"{_PROBLEMS.get(int(status[first]), 'invalid')}"
        )


def from_serialized(blobs: Any, k: int | None = None) -> DigestColumns:
    """Columns of serialized ``tdigest_double`` blobs (``pa.BinaryArray``, ``LargeBinaryArray``
    or a ``ChunkedArray`` of them); a NULL blob is an empty series.

    ``k``: the compression of the result (merges use it). ``None``: the blobs' own k, which must
    then be the same in every non-NULL blob (``DEFAULT_K`` if there is none). Raises
    ``ValueError`` naming the first invalid row.
    """
    chunks = list(blobs.chunks) if isinstance(blobs, pa.ChunkedArray) else [blobs]
    if not chunks:
        return DigestColumns.empty(0, k or DEFAULT_K)
    parts: list[DigestColumns] = []
    seen_k: set[int] = set()
    for chunk in chunks:
        cols, blob_k, valid_rows = _decode_chunk(chunk, k)
        seen_k.update(np.unique(blob_k[valid_rows]).tolist())
        parts.append(cols)
    if k is None:
        if len(seen_k) > 1:
            raise ValueError(
                f"blobs of different k {sorted(seen_k)}: pass k= to merge them at one k"
            )
        k = seen_k.pop() if seen_k else DEFAULT_K
    merged = concat(parts, k) if len(parts) > 1 else parts[0]
    if merged.k != k:
        merged = DigestColumns(merged.offsets, merged.means, merged.weights, merged.mins,
                               merged.maxs, merged.reverse_merge, k)  # fmt: skip
    return merged


# -- encode -------------------------------------------------------------------------------


@_jit
def _rounded(weight: Any) -> Any:
    """A weight as serialized: the nearest integer (half to even), at least 1."""
    w = np.rint(weight)
    return np.int64(w) if w >= 1.0 else 1


@_jit
def _encode_rows(offsets: Any, means: Any, weights: Any, mins: Any, maxs: Any, reverse: Any,
                 k: Any, word_starts: Any, words: Any, floats: Any, first: Any, last: Any
                 ) -> None:  # fmt: skip
    """Series ``first .. last - 1``, each at its word offset in ``words`` (``floats``: the same
    memory as doubles)."""
    base = _SERIAL_VERSION << 8 | _FAMILY << 16 | k << 24
    for i in range(first, last):
        s = word_starts[i]
        o = offsets[i]
        c = offsets[i + 1] - o
        flags = _FLAG_REVERSE if reverse[i] else 0
        if c == 0:
            words[s] = base | 1 | (flags | _FLAG_EMPTY) << 40
        elif c == 1 and _rounded(weights[o]) == 1:
            words[s] = base | 1 | (flags | _FLAG_SINGLE) << 40
            floats[s + 1] = means[o]
        else:
            words[s] = base | 2 | flags << 40
            words[s + 1] = c
            floats[s + 2] = mins[i]
            floats[s + 3] = maxs[i]
            for j in range(c):
                floats[s + 4 + 2 * j] = means[o + j]
                words[s + 5 + 2 * j] = _rounded(weights[o + j])


@_jit
def _encode(offsets: Any, means: Any, weights: Any, mins: Any, maxs: Any, reverse: Any, k: Any,
            word_starts: Any, words: Any, floats: Any) -> None:  # fmt: skip
    _encode_rows(offsets, means, weights, mins, maxs, reverse, k, word_starts, words, floats, 0,
                 len(mins))  # fmt: skip


def to_serialized(cols: DigestColumns) -> Any:
    """The DataSketches bytes of every series (``tdigest_double.deserialize`` reads them): an
    empty series in the 8-byte form, a single unit centroid in the single-value form, others
    with all centroids and no buffered values. Weights are rounded to integers (at least 1).

    One pass into one buffer: a ``pa.BinaryArray`` (``pa.LargeBinaryArray`` above 2 GiB).
    """
    sizes = cols.sizes
    single = np.zeros(len(cols), np.bool_)
    ones = np.flatnonzero(sizes == 1)
    rounded = np.rint(cols.weights[cols.offsets[ones]])
    single[ones] = rounded <= 1.0  # as _rounded: at least 1
    n_words = np.where(sizes == 0, 1, np.where(single, 2, 4 + 2 * sizes))
    word_offsets = np.zeros(len(cols) + 1, np.int64)
    np.cumsum(n_words, out=word_offsets[1:])
    words = np.empty(int(word_offsets[-1]), np.int64)
    args = (cols.offsets, cols.means, cols.weights, cols.mins, cols.maxs, cols.reverse_merge,
            cols.k, word_offsets[:-1], words, words.view(np.float64))  # fmt: skip
    chunks = chunk_bounds(cols.offsets)
    if chunks is None:
        _encode(*args)
    else:
        run_chunks(lambda c: _encode_rows(*args, chunks[c], chunks[c + 1]), len(chunks) - 1)
    byte_offsets = word_offsets * 8
    if byte_offsets[-1] > _INT32_MAX:
        arrow_type, offsets_buffer = pa.large_binary(), pa.py_buffer(byte_offsets)
    else:
        arrow_type, offsets_buffer = pa.binary(), pa.py_buffer(byte_offsets.astype(np.int32))
    return pa.Array.from_buffers(
        arrow_type, len(cols), [None, offsets_buffer, pa.py_buffer(words.view(np.uint8))]
    )


# -- merge --------------------------------------------------------------------------------


@_jit
def _total_weights(offsets: Any, weights: Any) -> Any:
    n = len(offsets) - 1
    out = np.zeros(n, np.float64)
    for i in range(n):
        total = 0.0
        for j in range(offsets[i], offsets[i + 1]):
            total += weights[j]
        out[i] = total
    return out


@_jit
def _sorted_run(means: Any, lo: Any, hi: Any) -> Any:
    for j in range(lo + 1, hi):  # noqa: SIM110 (numba compiles no generator expression)
        if means[j] < means[j - 1]:
            return False
    return True


@_jit
def _merge_two(b_m: Any, b_w: Any, b: Any, b_end: Any, a_m: Any, a_w: Any, a: Any, a_end: Any,
               out_m: Any, out_w: Any, w: Any) -> Any:  # fmt: skip
    """The stable merge of sorted runs ``b`` (first) and ``a`` at ``out[w]``; its end."""
    while b < b_end and a < a_end:
        # branches, not selects: a window's own run holds most centroids, so they predict well
        if b_m[b] <= a_m[a]:
            out_m[w] = b_m[b]
            out_w[w] = b_w[b]
            b += 1
        else:
            out_m[w] = a_m[a]
            out_w[w] = a_w[a]
            a += 1
        w += 1
    while b < b_end:
        out_m[w] = b_m[b]
        out_w[w] = b_w[b]
        b += 1
        w += 1
    while a < a_end:
        out_m[w] = a_m[a]
        out_w[w] = a_w[a]
        a += 1
        w += 1
    return w


@_jit
def _merge_owner_rows(
    a_offsets: Any, a_means: Any, a_weights: Any, a_mins: Any, a_maxs: Any, a_reverse: Any,
    heads: Any, offsets: Any, means: Any, weights: Any, mins: Any, maxs: Any, reverse: Any,
    order: Any, b_first: Any, b_last: Any, k: Any, capacity: Any, first: Any, last: Any,
    start: Any, out_offsets: Any, out_means: Any, out_weights: Any, out_mins: Any,
    out_maxs: Any, out_reverse: Any,
) -> Any:  # fmt: skip
    """datasketches' compress of each owner's inputs (module docstring), for owners ``first ..
    last - 1`` one at a time, written one after another from ``out_means[start]`` on (owner
    ``g``'s end at ``out_offsets[g + 1]``); returns the end of the last.

    Owner ``g``'s first input is row ``heads[g]`` of the ``a_`` columns (-1: none), the
    others rows ``order[b_first[g]:b_last[g]]`` of the unprefixed columns. The sequence
    compressed is the stable sort of [others..., first input], built without sorting it whole:
    the others (usually a few small panes) are merged into a scratch run and the first input
    (usually the running digest, the bulk of the centroids) is read in place; the compress loop
    takes the next centroid from whichever comes first (on equal means the others' going
    forward, the first input's going backwards: the stable order, reversed). Unsorted input (not
    written by datasketches or this module) takes a full stable sort instead, same result.
    """
    largest = 0
    most_inputs = 0
    for g in range(first, last):
        largest = max(largest, capacity[g + 1] - capacity[g])
        most_inputs = max(most_inputs, b_last[g] - b_first[g])
    gather_m = np.empty(largest, np.float64)
    gather_w = np.empty(largest, np.float64)
    spare_m = np.empty(largest, np.float64)
    spare_w = np.empty(largest, np.float64)
    bounds = np.empty(most_inputs + 1, np.int64)
    compression = 2.0 * k
    w = start
    for g in range(first, last):
        h = heads[g]
        a_lo = a_offsets[h] if h >= 0 else 0
        a_hi = a_offsets[h + 1] if h >= 0 else 0
        non_empty = 0
        only = -1
        lo = np.inf
        hi = -np.inf
        if a_hi > a_lo:
            non_empty = 1
            lo = a_mins[h]
            hi = a_maxs[h]
        for r in range(b_first[g], b_last[g]):
            i = order[r]
            if offsets[i + 1] > offsets[i]:
                non_empty += 1
                only = i
                lo = min(lo, mins[i])
                hi = max(hi, maxs[i])
        if non_empty == 0:
            out_offsets[g + 1] = w
            out_mins[g] = np.inf
            out_maxs[g] = -np.inf
            out_reverse[g] = False
            continue
        if non_empty == 1:
            if a_hi > a_lo:
                out_means[w : w + a_hi - a_lo] = a_means[a_lo:a_hi]
                out_weights[w : w + a_hi - a_lo] = a_weights[a_lo:a_hi]
                w += a_hi - a_lo
                out_reverse[g] = a_reverse[h]
            else:
                size = offsets[only + 1] - offsets[only]
                out_means[w : w + size] = means[offsets[only] : offsets[only + 1]]
                out_weights[w : w + size] = weights[offsets[only] : offsets[only + 1]]
                w += size
                out_reverse[g] = reverse[only]
            out_offsets[g + 1] = w
            out_mins[g] = lo
            out_maxs[g] = hi
            continue
        in_order = True  # (the first input's order is checked with its weights, below)
        # The others, each a sorted run, gathered in order.
        n_b = 0
        n_runs = 0
        for r in range(b_first[g], b_last[g]):
            i = order[r]
            if offsets[i + 1] == offsets[i]:
                continue
            if not _sorted_run(means, offsets[i], offsets[i + 1]):
                in_order = False
            bounds[n_runs] = n_b
            n_runs += 1
            for j in range(offsets[i], offsets[i + 1]):
                gather_m[n_b] = means[j]
                gather_w[n_b] = weights[j]
                n_b += 1
        bounds[n_runs] = n_b
        total = 0.0
        least = np.inf  # the two smallest weights: least <= second
        second = np.inf
        for j in range(n_b):
            x_w = gather_w[j]
            total += x_w
            second = min(second, max(least, x_w))
            least = min(least, x_w)
        previous = -np.inf
        for j in range(a_lo, a_hi):
            x_w = a_weights[j]
            total += x_w
            second = min(second, max(least, x_w))
            least = min(least, x_w)
            x_m = a_means[j]
            in_order &= not x_m < previous  # as _sorted_run
            previous = x_m
        if in_order:
            b_m, b_w = _merge_runs(gather_m, gather_w, spare_m, spare_w, bounds, n_runs)
        else:
            # Everything, first input last, through one stable sort; then no first input.
            for j in range(a_lo, a_hi):
                gather_m[n_b] = a_means[j]
                gather_w[n_b] = a_weights[j]
                n_b += 1
            unit_runs = np.arange(n_b + 1)
            b_m, b_w = _merge_runs(gather_m, gather_w, spare_m, spare_w, unit_runs, n_b)
            a_hi = a_lo
        size = n_b + a_hi - a_lo
        backwards = a_reverse[h] if h >= 0 else False
        normalizer = compression / (4.0 * math.log(total / compression) + 24.0)
        # q (1 - q) <= 1/4: no proposal above this can pass (a margin for rounding), so the
        # exact test below is skipped for them with the same outcome.
        ceiling = total * (0.25 / normalizer) * (1.0 + 1e-9)
        start = w
        if size <= 2 or least + second > ceiling:
            # No centroid can join another (the second never joins the first; later, every
            # proposal is two centroids' weights, at least the two smallest): the compress
            # outputs the stable order itself, in either direction. Written directly.
            w = _merge_two(b_m, b_w, 0, n_b, a_means, a_weights, a_lo, a_hi, out_means,
                           out_weights, w)  # fmt: skip
            out_offsets[g + 1] = w
            out_mins[g] = min(lo, out_means[start])
            out_maxs[g] = max(hi, out_means[w - 1])
            out_reverse[g] = not backwards
            continue
        if backwards:
            ia = a_hi - 1
            ib = n_b - 1
        else:
            ia = a_lo
            ib = 0
        weight_so_far = 0.0
        cur_mean = 0.0
        cur_weight = 0.0
        for t in range(size):
            # the next centroid of the stable order (reversed when backwards)
            if backwards:
                if ia >= a_lo and (ib < 0 or a_means[ia] >= b_m[ib]):
                    x_m = a_means[ia]
                    x_w = a_weights[ia]
                    ia -= 1
                else:
                    x_m = b_m[ib]
                    x_w = b_w[ib]
                    ib -= 1
            else:
                if ib < n_b and (ia >= a_hi or b_m[ib] <= a_means[ia]):
                    x_m = b_m[ib]
                    x_w = b_w[ib]
                    ib += 1
                else:
                    x_m = a_means[ia]
                    x_w = a_weights[ia]
                    ia += 1
            if t == 0:
                cur_mean = x_m
                cur_weight = x_w
                continue
            proposed = cur_weight + x_w
            add_this = False
            if t != 1 and proposed <= ceiling:
                q0 = weight_so_far / total
                q2 = (weight_so_far + proposed) / total
                bound = min(q0 * (1.0 - q0) / normalizer, q2 * (1.0 - q2) / normalizer)
                add_this = proposed <= total * bound
            if add_this:
                cur_weight += x_w
                cur_mean += (x_m - cur_mean) * x_w / cur_weight
            else:
                weight_so_far += cur_weight
                out_means[w] = cur_mean
                out_weights[w] = cur_weight
                w += 1
                cur_mean = x_m
                cur_weight = x_w
        out_means[w] = cur_mean
        out_weights[w] = cur_weight
        w += 1
        if backwards:
            left = start
            right = w - 1
            while left < right:
                out_means[left], out_means[right] = out_means[right], out_means[left]
                out_weights[left], out_weights[right] = out_weights[right], out_weights[left]
                left += 1
                right -= 1
        out_offsets[g + 1] = w
        out_mins[g] = min(lo, out_means[start])
        out_maxs[g] = max(hi, out_means[w - 1])
        out_reverse[g] = not backwards
    return w


def _owner_order(owner: npt.ArrayLike, n_inputs: int, n_owners: int) -> tuple[IntArray, IntArray]:
    """Inputs grouped by owner, each owner's in their given order, and where each owner's
    group starts in that order (``n_owners + 1`` entries)."""
    owners = np.asarray(owner, dtype=np.int64)
    if owners.shape != (n_inputs,):
        raise ValueError(f"owner has shape {owners.shape}, expected ({n_inputs},)")
    if owners.size and (owners.min() < 0 or owners.max() >= n_owners):
        raise ValueError(f"owners must be in 0..{n_owners - 1}")
    order = np.argsort(owners, kind="stable")
    starts = np.searchsorted(owners[order], np.arange(n_owners + 1), "left").astype(np.int64)
    return order, starts


def merge_by_owner(cols: DigestColumns, owner: npt.ArrayLike, n_owners: int) -> DigestColumns:
    """One digest per owner ``0 .. n_owners - 1``: the merge of every input series ``i`` with
    ``owner[i]`` equal to it, in their given order (module docstring: the algorithm, how it
    relates to datasketches' own merge, and the one-input and small cases).

    The first input of an owner plays the running digest (its reverse-merge flag picks the
    direction). A pure function of ``cols`` and ``owner``: a replayed batch gives the same
    bytes.
    """
    order, starts = _owner_order(owner, len(cols), n_owners)
    has_input = starts[1:] > starts[:-1]
    heads = np.full(n_owners, -1, np.int64)
    heads[has_input] = order[starts[:-1][has_input]]
    return _merged(cols, heads, cols, order, starts[:-1] + has_input, starts[1:])


def merge_into(state: DigestColumns, partials: DigestColumns, owner: npt.ArrayLike
               ) -> DigestColumns:  # fmt: skip
    """``state`` (one digest per open window) with ``partials`` merged in: row ``g`` of the
    result is :func:`merge_by_owner` of ``[state[g], partials i with owner[i] == g (in order)]``,
    without first copying ``state`` and ``partials`` into one set of columns. A window without
    partials keeps its digest unchanged. ``k`` is the state's."""
    order, starts = _owner_order(owner, len(partials), len(state))
    return _merged(state, np.arange(len(state), dtype=np.int64), partials, order, starts[:-1],
                   starts[1:])  # fmt: skip


def _merged(head_cols: DigestColumns, heads: IntArray, cols: DigestColumns, order: IntArray,
            b_first: IntArray, b_last: IntArray) -> DigestColumns:  # fmt: skip
    n_owners = len(heads)
    capacity = merge_capacity(head_cols.offsets, heads, cols.offsets, order, b_first, b_last)
    # Outputs allocated by numpy, not in the kernel: numpy asks for huge pages for large
    # arrays, which halves the cost of first touching them (numba's allocations get 4 KiB
    # pages, one page fault each).
    outputs = (
        np.zeros(n_owners + 1, np.int64), np.empty(capacity[-1], np.float64),
        np.empty(capacity[-1], np.float64), np.empty(n_owners, np.float64),
        np.empty(n_owners, np.float64), np.empty(n_owners, np.bool_),
    )  # fmt: skip
    args = (
        head_cols.offsets, head_cols.means, head_cols.weights, head_cols.mins, head_cols.maxs,
        head_cols.reverse_merge, heads, cols.offsets, cols.means, cols.weights, cols.mins,
        cols.maxs, cols.reverse_merge, order, b_first, b_last, head_cols.k, capacity,
    )  # fmt: skip
    chunks = chunk_bounds(capacity)
    if chunks is None:
        end = _merge_owner_rows(*args, 0, n_owners, 0, *outputs)
    else:
        # Chunk c's owners from their first capacity slot on; then the chunks moved together.
        ends = run_chunks(lambda c: _merge_owner_rows(
            *args, chunks[c], chunks[c + 1], capacity[chunks[c]], *outputs
        ), len(chunks) - 1)  # fmt: skip
        end = compact(chunks, capacity[chunks[:-1]], ends, *outputs[:3])
    offsets, means, weights, mins, maxs, reverse = outputs
    # Views: the untouched tail of the output arrays was never written, so holds no memory.
    return DigestColumns(offsets, means[:end], weights[:end], mins, maxs, reverse, head_cols.k)


# -- quantiles ----------------------------------------------------------------------------


@_jit
def _rank(means: Any, weights: Any, cum: Any, lo: Any, hi: Any, total: Any, mn: Any,
          mx: Any, value: Any, a: Any, b: Any) -> Any:  # fmt: skip
    """datasketches' ``get_rank`` on centroids ``lo .. hi - 1`` (``cum[j]``: the weight of
    the first ``j`` of them, summed in order), the same float operations in the same order.

    ``a <= b``: a range known to hold both ``lower_bound(value)`` and ``upper_bound(value)``
    (the binary searches run inside it; ``lo, hi`` when nothing is known). Returns the rank
    and the two bounds (``a, b`` unchanged where they were not searched), so that a caller
    bisecting on the value can narrow the range for the next value."""
    if value < mn:
        return 0.0, a, b
    if value > mx:
        return 1.0, a, b
    if hi - lo == 1:
        return 0.5, a, b
    first_mean = means[lo]
    if value < first_mean:
        if first_mean - mn > 0:
            if value == mn:
                return 0.5 / total, a, b
            # Not divided by the total weight: datasketches' own expression, kept to give its
            # numbers (unreachable for its digests: their first centroid is a unit at min).
            return 1.0 + (value - mn) / (first_mean - mn) * (weights[lo] / 2.0 - 1.0), a, b
        return 0.0, a, b
    last_mean = means[hi - 1]
    if value > last_mean:
        if mx - last_mean > 0:
            if value == mx:
                return 1.0 - 0.5 / total, a, b
            return 1.0 - (
                (1.0 + (mx - value) / (mx - last_mean) * (weights[hi - 1] / 2.0 - 1.0)) / total
            ), a, b
        return 1.0, a, b
    # lower = first centroid with mean >= value, upper = first with mean > value
    left = a
    right = b
    while left < right:
        m = (left + right) >> 1
        if means[m] < value:
            left = m + 1
        else:
            right = m
    lower_bound = left
    right = b
    while left < right:
        m = (left + right) >> 1
        if value < means[m]:
            right = m
        else:
            left = m + 1
    upper_bound = left
    lower = lower_bound
    upper = upper_bound
    if value < means[lower]:
        lower -= 1
    if upper == hi or not (means[upper - 1] < value):
        upper -= 1
    weight_below = cum[lower - lo] + weights[lower] / 2.0
    weight_delta = 0.0
    for j in range(lower, upper):
        weight_delta += weights[j]
    weight_delta -= weights[lower] / 2.0
    weight_delta += weights[upper] / 2.0
    if means[upper] - means[lower] > 0:
        rank = (
            weight_below + weight_delta * (value - means[lower]) / (means[upper] - means[lower])
        ) / total
    else:
        rank = (weight_below + weight_delta / 2.0) / total
    return rank, lower_bound, upper_bound


@_jit
def _reaches(means: Any, weights: Any, cum: Any, lo: Any, hi: Any, total: Any, mn: Any,
             mx: Any, value: Any, q: Any) -> Any:  # fmt: skip
    rank, _, _ = _rank(means, weights, cum, lo, hi, total, mn, mx, value, lo, hi)
    return rank >= q


@_jit
def _point(means: Any, lo: Any, hi: Any, mn: Any, mx: Any, j: Any) -> Any:
    """The breakpoints of the rank function: ``min``, the centroid means, ``max``."""
    if j < 0:
        return mn
    if j >= hi - lo:
        return mx
    return means[lo + j]


@_jit
def _threshold(means: Any, weights: Any, cum: Any, lo: Any, hi: Any, total: Any, mn: Any,
               mx: Any, q: Any) -> Any:  # fmt: skip
    """The smallest double ``x`` in ``[min, max]`` with ``rank(x) >= q`` (``+inf`` if none), for
    a monotonic rank function: the breakpoint bracket by binary search, a linear estimate
    inside it (the rank is linear between breakpoints), then ``_rank`` itself decides the last
    few ulps (gallop to the other side, bisect)."""
    c = hi - lo
    if _reaches(means, weights, cum, lo, hi, total, mn, mx, mn, q):
        return mn
    if not _reaches(means, weights, cum, lo, hi, total, mn, mx, mx, q):
        return np.inf
    a = -1  # rank(point(a)) < q
    b = c  # rank(point(b)) >= q
    while b - a > 1:
        m = (a + b) >> 1
        if _reaches(means, weights, cum, lo, hi, total, mn, mx, _point(means, lo, hi, mn, mx, m),
                    q):  # fmt: skip
            b = m
        else:
            a = m
    low = _point(means, lo, hi, mn, mx, a)
    high = _point(means, lo, hi, mn, mx, b)
    r_low, _, _ = _rank(means, weights, cum, lo, hi, total, mn, mx, low, lo, hi)
    r_high, _, _ = _rank(means, weights, cum, lo, hi, total, mn, mx, high, lo, hi)
    guess = low + (q - r_low) / (r_high - r_low) * (high - low)
    if not guess > low:
        guess = np.nextafter(low, np.inf)
    if not guess < high:
        guess = high
    # Gallop from the guess (a few ulps off: the rank's own rounding) to the other side, in
    # steps doubling from an ulp of the bracket's scale; then bisect what is left.
    step = max(abs(guess) * 2.0**-52, (high - low) * 2.0**-52, 5e-324)
    if _reaches(means, weights, cum, lo, hi, total, mn, mx, guess, q):
        high = guess
        while True:
            probe = high - step
            if probe <= low:
                break
            if _reaches(means, weights, cum, lo, hi, total, mn, mx, probe, q):
                high = probe
                step *= 2.0
            else:
                low = probe
                break
    else:
        low = guess
        while True:
            probe = low + step
            if probe >= high:
                break
            if _reaches(means, weights, cum, lo, hi, total, mn, mx, probe, q):
                high = probe
                break
            low = probe
            step *= 2.0
    while True:
        mid = low + (high - low) / 2.0
        if mid <= low or mid >= high:
            return high
        if _reaches(means, weights, cum, lo, hi, total, mn, mx, mid, q):
            high = mid
        else:
            low = mid


@_jit
def _numerator_target(total: Any, q: Any) -> Any:
    """The smallest double ``y`` with ``y / total >= q`` (``total > 0``). Division rounds
    monotonically, so ``y / total >= q`` exactly when ``y >= `` this: the rank comparisons of
    ``_inverted`` skip their division by the total weight."""
    y = q * total  # within an ulp or two of it
    while not y / total >= q:
        y = np.nextafter(y, np.inf)
    while True:
        below = np.nextafter(y, -np.inf)
        if not below / total >= q:
            return y
        y = below


@_jit
def _breakpoint_reaches(means: Any, weights: Any, cum: Any, lo: Any, hi: Any, total: Any,
                        mx: Any, j: Any, q: Any, target: Any) -> Any:  # fmt: skip
    """``_rank(_point(j)) >= q`` on a regular digest (``_inverted``), without ``_rank``'s binary
    searches and division. At the mean of centroid ``j`` (``min`` is the first one's),
    ``_rank``'s ``lower``/``upper`` are the first and the last centroid ``s``, ``e`` of that
    mean (a run of one, or of equal means), and their means' difference 0, so it computes
    ``(cum[s] + w[s] / 2 + delta / 2) / total``, ``delta`` the weights ``s .. e - 1`` summed
    minus ``w[s] / 2`` plus ``w[e] / 2`` (exactly 0 for a run of one): the same operations
    here, the division by the total as the comparison with ``target``
    (``_numerator_target``). ``max``, when above the last mean, ranks ``1 - 0.5 / total``."""
    c = hi - lo
    if j >= c:
        if mx > means[hi - 1]:
            return 1.0 - 0.5 / total >= q
        j = c - 1
    k = lo + max(j, 0)
    first = k
    while first > lo and means[first - 1] == means[k]:
        first -= 1
    last = k
    while last < hi - 1 and means[last + 1] == means[k]:
        last += 1
    delta = 0.0
    for i in range(first, last):
        delta += weights[i]
    delta -= weights[first] / 2.0
    delta += weights[last] / 2.0
    return cum[first - lo] + weights[first] / 2.0 + delta / 2.0 >= target


@_jit
def _inverted(means: Any, weights: Any, cum: Any, lo: Any, hi: Any, total: Any, mn: Any,
              mx: Any, q: Any, a: Any) -> Any:  # fmt: skip
    """``_threshold`` (the smallest double ``x`` with ``rank(x) >= q``) by inverting the rank
    function, for a *regular* digest: means sorted, the first at ``min``, the last ``<= max``,
    a monotonic rank function. ``a``: a breakpoint known to rank below ``q`` (-1 when none is
    known). Returns ``x`` and its bracket's lower breakpoint (a valid ``a`` for a larger q).

    The breakpoint bracket is found by binary search on the breakpoints' ranks
    (``_breakpoint_reaches``: ``_rank``'s numbers). Strictly inside a bracket ``_rank`` is one
    linear expression of the value (centroids ``lower``, ``upper`` fixed), evaluated here with
    the same operations; each of its rounding steps is monotonic, so it is monotonic too. The
    value where that expression, computed exactly, crosses the rounding boundary below the
    target is within a few ulps of ``x``; galloping from there and a bisection settle the
    last ulps with the expression itself, so ``x`` is exactly ``_threshold``'s."""
    c = hi - lo
    target = _numerator_target(total, q)
    if a < 0 and _breakpoint_reaches(means, weights, cum, lo, hi, total, mx, -1, q, target):
        return mn, -1
    b = c
    if not _breakpoint_reaches(means, weights, cum, lo, hi, total, mx, b, q, target):
        return np.inf, a
    while b - a > 1:
        m = (a + b) >> 1
        k = lo + m  # _breakpoint_reaches written out (a call costs more than this)
        if (m == 0 or means[k - 1] < means[k]) and (m == c - 1 or means[k] < means[k + 1]):
            reached = cum[m] + weights[k] / 2.0 >= target
        else:
            reached = _breakpoint_reaches(means, weights, cum, lo, hi, total, mx, m, q, target)
        if reached:
            b = m
        else:
            a = m
    low = _point(means, lo, hi, mn, mx, a)
    high = _point(means, lo, hi, mn, mx, b)
    if not low < high:
        return high, a
    # Inside (low, high): _rank(v) = (base + delta * (v - m0) / span) / total in the gap
    # between centroids a and a + 1, or the right tail's expression past the last centroid.
    tail = a == c - 1
    base = 0.0
    delta = 0.0
    factor = 0.0
    if tail:
        span = mx - low
        factor = weights[hi - 1] / 2.0 - 1.0
        # 1 - (1 + (mx - v) / span * factor) / total = q, solved for v
        guess = mx - ((1.0 - q) * total - 1.0) * span / factor if factor != 0.0 else high
    else:
        k = lo + a
        base = cum[a] + weights[k] / 2.0
        delta = weights[k]
        delta -= weights[k] / 2.0
        delta += weights[k + 1] / 2.0
        span = high - low
        # base + delta (v - m0) / span reaches the target once it passes the midpoint between
        # the target and the double below it (where the sum starts rounding up to the target)
        edge = target - (target - np.nextafter(target, -np.inf)) / 2.0
        guess = low + (edge - base) * span / delta if delta > 0.0 else high
    if not guess > low:
        guess = np.nextafter(low, np.inf)
    if not guess < high:
        guess = high
    return _gap_search(tail, guess, low, high, mx, span, factor, base, delta, total, q,
                       target), a


@_jit
def _gap_search(tail: Any, guess: Any, low: Any, high: Any, mx: Any, span: Any, factor: Any,
                base: Any, delta: Any, total: Any, q: Any, target: Any) -> Any:  # fmt: skip
    """The smallest double in ``(low, high]`` whose rank reaches ``q``, ``high`` reaching it:
    gallop from ``guess`` to the other side, in steps doubling from an ulp; then bisect what
    is left. The rank inside is ``_rank``'s expression for the gap above centroid ``low``
    (``tail``: past the last centroid), with its operations in its order (its final division
    by the total weight as the comparison with ``target``), written out at each use: a call
    per evaluation would cost more than the evaluation."""
    m0 = low
    step = max(abs(guess) * 2.0**-52, 5e-324)
    v = guess
    if v >= high:
        reached = True
    elif tail:
        reached = 1.0 - ((1.0 + (mx - v) / span * factor) / total) >= q
    else:
        reached = base + delta * (v - m0) / span >= target
    if reached:
        high = guess
        while True:
            v = high - step
            if v <= low:
                break
            if tail:
                reached = 1.0 - ((1.0 + (mx - v) / span * factor) / total) >= q
            else:
                reached = base + delta * (v - m0) / span >= target
            if reached:
                high = v
                step *= 2.0
            else:
                low = v
                break
    else:
        low = guess
        while True:
            v = low + step
            if v >= high:
                break
            if tail:
                reached = 1.0 - ((1.0 + (mx - v) / span * factor) / total) >= q
            else:
                reached = base + delta * (v - m0) / span >= target
            if reached:
                high = v
                break
            low = v
            step *= 2.0
    while True:
        v = low + (high - low) / 2.0
        if v <= low or v >= high:
            return high
        if tail:
            reached = 1.0 - ((1.0 + (mx - v) / span * factor) / total) >= q
        else:
            reached = base + delta * (v - m0) / span >= target
        if reached:
            high = v
        else:
            low = v


@_jit
def _bisection_result(mn: Any, mx: Any, x: Any) -> Any:
    """Where ``tdigest._quantile``'s bisection from ``[mn, mx]`` ends for a monotonic rank
    function of threshold ``x`` (``mn < x``): ``rank(mid) >= q`` exactly when ``mid >= x``.

    Each of its steps halves the interval up to an ulp of the values in it, so it narrows to
    the two doubles around ``x`` (and returns ``x``) within about ``log2(width / ulp(x)) + 4``
    steps; well within its 80 when that logarithm is at most 70 (any range of ~21 decimal
    orders above ``x``'s ulp), which is checked. Otherwise the steps are replayed."""
    ax = abs(x)
    if mx - mn <= (np.nextafter(ax, np.inf) - ax) * 2.0**70:
        return x
    lo = mn
    hi = mx
    for _ in range(_BISECTION_STEPS):
        mid = lo + (hi - lo) / 2.0
        if mid <= lo or mid >= hi:
            break
        if mid >= x:
            hi = mid
        else:
            lo = mid
    return hi


@_jit
def _quantile_rows(offsets: Any, means: Any, weights: Any, mins: Any, maxs: Any, qs: Any,
                   out: Any, first: Any, last: Any) -> None:  # fmt: skip
    """``tdigest._quantile``'s bisection result, per series ``first .. last - 1`` and q, into
    ``out`` (NaN for an empty series).

    Where the rank function is monotonic (the first centroid at ``min``, no falling right
    tail, means sorted: every digest datasketches or this module writes), the bisection's path
    is fixed by the threshold ``x`` (the smallest double of rank >= q): ``rank(mid) >= q``
    exactly when ``mid >= x``. So ``x`` is found first, by inverting the rank function
    (``_inverted``; ``_threshold``, a search with ``_rank`` itself, for monotonic but irregular
    columns), and the bisection's end follows from it (``_bisection_result``). Elsewhere the
    bisection runs as written, its centroid search range narrowing with the value interval
    (bounds are monotonic in the value)."""
    largest = 0
    for i in range(first, last):
        largest = max(largest, offsets[i + 1] - offsets[i])
    cum = np.empty(largest + 1, np.float64)
    for i in range(first, last):
        lo_c = offsets[i]
        hi_c = offsets[i + 1]
        if hi_c == lo_c:
            for t in range(len(qs)):
                out[i, t] = np.nan
            continue
        total = 0.0
        cum[0] = 0.0
        in_order = True
        for j in range(lo_c, hi_c):
            total += weights[j]
            cum[j - lo_c + 1] = total
            if j > lo_c and means[j] < means[j - 1]:
                in_order = False
        mn = mins[i]
        mx = maxs[i]
        monotonic = (
            in_order
            and hi_c - lo_c >= 2
            and means[lo_c] <= mn
            and (means[hi_c - 1] >= mx or weights[hi_c - 1] >= 2.0)
        )
        regular = monotonic and means[lo_c] == mn and means[hi_c - 1] <= mx
        known = -1  # a breakpoint ranked below the previous q
        previous_q = np.inf
        for t in range(len(qs)):
            q = qs[t]
            lo = mn
            hi = mx
            if q <= 0.0:
                out[i, t] = lo
                continue
            if monotonic:
                if regular:
                    if q < previous_q:
                        known = -1
                    x, known = _inverted(means, weights, cum, lo_c, hi_c, total, mn, mx, q,
                                         known)  # fmt: skip
                    previous_q = q
                else:
                    x = _threshold(means, weights, cum, lo_c, hi_c, total, mn, mx, q)
                if x <= lo:
                    out[i, t] = lo
                elif q >= 1.0 or x == np.inf:
                    out[i, t] = hi
                else:
                    out[i, t] = _bisection_result(lo, hi, x)
                continue
            a = lo_c
            b = hi_c
            rank, _, _ = _rank(means, weights, cum, lo_c, hi_c, total, mn, mx, lo, a, b)
            if rank >= q:
                out[i, t] = lo
                continue
            if q >= 1.0:
                out[i, t] = hi
                continue
            for _ in range(_BISECTION_STEPS):
                mid = lo + (hi - lo) / 2.0
                if mid <= lo or mid >= hi:
                    break
                rank, lower_bound, upper_bound = _rank(
                    means, weights, cum, lo_c, hi_c, total, mn, mx, mid, a, b
                )
                if rank >= q:
                    hi = mid
                    b = upper_bound if upper_bound < b else b
                else:
                    lo = mid
                    a = lower_bound if lower_bound > a else a
            out[i, t] = hi


@_jit
def _quantiles(offsets: Any, means: Any, weights: Any, mins: Any, maxs: Any, qs: Any) -> Any:
    """``_quantile_rows`` of every series, in one thread."""
    out = np.empty((len(mins), len(qs)), np.float64)
    _quantile_rows(offsets, means, weights, mins, maxs, qs, out, 0, len(mins))
    return out


def quantiles(cols: DigestColumns, qs: Sequence[float] | npt.ArrayLike) -> FloatArray:
    """Values at normalized ranks ``qs`` (each in [0, 1]) of every series, shape
    ``(n, len(qs))``, NaN for an empty series: :func:`streamgauge.sketches.tdigest.quantiles`'
    numbers (module docstring), for all series in one call."""
    q_array = np.atleast_1d(np.asarray(qs, dtype=np.float64))
    bad = q_array[~((q_array >= 0.0) & (q_array <= 1.0))]
    if bad.size:
        raise ValueError(f"quantile q={float(bad[0])!r} is outside [0, 1]")
    chunks = chunk_bounds(cols.offsets)
    if chunks is None:
        result: FloatArray = _quantiles(cols.offsets, cols.means, cols.weights, cols.mins,
                                        cols.maxs, q_array)  # fmt: skip
        return result
    result = np.empty((len(cols), len(q_array)), np.float64)
    run_chunks(lambda c: _quantile_rows(cols.offsets, cols.means, cols.weights, cols.mins,
                                        cols.maxs, q_array, result, chunks[c], chunks[c + 1]),
               len(chunks) - 1)  # fmt: skip
    return result


# -- assembling columns -------------------------------------------------------------------


def concat(parts: Sequence[DigestColumns], k: int | None = None) -> DigestColumns:
    """The series of ``parts`` one after another (e.g. a batch's open windows, then its pane
    partials, ahead of one :func:`merge_by_owner`). ``k``: the result's (default: the first
    part's)."""
    if not parts:
        return DigestColumns.empty(0, k or DEFAULT_K)
    sizes = np.concatenate([p.sizes for p in parts])
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return DigestColumns(
        offsets,
        np.concatenate([p.means for p in parts]),
        np.concatenate([p.weights for p in parts]),
        np.concatenate([p.mins for p in parts]),
        np.concatenate([p.maxs for p in parts]),
        np.concatenate([p.reverse_merge for p in parts]),
        parts[0].k if k is None else k,
    )


def take(cols: DigestColumns, rows: npt.ArrayLike) -> DigestColumns:
    """Series ``rows`` of ``cols``, in that order (e.g. the windows still open)."""
    return gather([(cols, rows)], cols.k)


def gather(parts: Sequence[tuple[DigestColumns, npt.ArrayLike]], k: int | None = None
           ) -> DigestColumns:  # fmt: skip
    """Series ``rows`` of each ``(cols, rows)`` part, the parts one after another:
    :func:`concat` of :func:`take` s with one copy of the centroids (a series' centroids are
    one run, copied whole; an index per centroid would cost more than the copy). ``k``: the
    result's (default: the first part's)."""
    if not parts:
        return DigestColumns.empty(0, k or DEFAULT_K)
    picked = [(cols, np.asarray(rows, dtype=np.int64)) for cols, rows in parts]
    sizes = [cols.sizes[index] for cols, index in picked]
    offsets = np.zeros(sum(len(index) for _, index in picked) + 1, np.int64)
    np.cumsum(np.concatenate(sizes), out=offsets[1:])
    means = np.empty(int(offsets[-1]), np.float64)
    weights = np.empty(int(offsets[-1]), np.float64)
    first = 0
    for (cols, index), size in zip(picked, sizes, strict=True):
        copy_runs(cols.offsets[index], size, offsets[first : first + len(index)], cols.means,
                   cols.weights, means, weights)  # fmt: skip
        first += len(index)
    return DigestColumns(
        offsets, means, weights,
        np.concatenate([cols.mins[index] for cols, index in picked]),
        np.concatenate([cols.maxs[index] for cols, index in picked]),
        np.concatenate([cols.reverse_merge[index] for cols, index in picked]),
        parts[0][0].k if k is None else k,
    )  # fmt: skip
