"""Sparse HDR histograms of many series as one column structure, merged and read in one call each.

Why: :func:`streamgauge.windows.window_sketches.merge_hdr` adds one window's bucket rows per
Python call (a concatenate and an ``np.unique`` per series). Here the rows of every series of a
batch are one CSR structure (:class:`HdrColumns`: series ``i``'s buckets are
``buckets[offsets[i]:offsets[i + 1]]``, ``counts`` beside them) and :func:`merge_by_owner` adds
all owners' rows in one numba pass; :func:`quantiles` reads every series' quantiles in another.

Merging is exact (counts add per bucket index; the order of the inputs does not matter) and the
result's rows are sorted by bucket, unique, as :func:`streamgauge.sketches.hdr.merge` gives them
(zero totals included, like it). Rows sorted by bucket (as every merge and pane partial writes
them) are merged linearly, pairwise: a window and its batch's partial in one pass
(:func:`merge_into`); an owner with a row out of order goes through a dense scratch instead, with
the same result. Large batches run in chunks of owners on several threads
(:mod:`streamgauge.sketches.kernels`; the same result for any number of threads).

Quantiles are ``HdrLayout.quantile``'s: the package's nearest rank ``max(int(q·100·n/100 +
0.5), 1)`` with its float expression kept verbatim, reported as the highest value equivalent to
the bucket (the lowest for q = 0), over ``value_scale``. The standard V2 encoding of the rows:
:func:`streamgauge.sketches.hdr_encoding.encode_v2`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.kernels import chunk_bounds, compact, merge_capacity, run_chunks

__all__ = [
    "HdrColumns", "concat", "from_lists", "merge_by_owner", "merge_into", "quantiles", "to_lists",
]

IntArray = npt.NDArray[np.int64]
Int32Array = npt.NDArray[np.int32]
FloatArray = npt.NDArray[np.float64]

_F = TypeVar("_F", bound=Callable[..., Any])


def _jit(function: _F) -> _F:
    """numba's ``njit``, typed for mypy (numba ships no annotations)."""
    return cast(_F, numba.njit(cache=True, nogil=True)(function))


@dataclass(frozen=True, eq=False)
class HdrColumns:
    """``n`` sparse HDR histograms as CSR columns: series ``i`` has bucket indices
    ``buckets[offsets[i]:offsets[i + 1]]`` (int32, the layout's counts-array index) and
    ``counts`` beside them (int64). An empty series has no rows."""

    offsets: IntArray
    buckets: Int32Array
    counts: IntArray

    def __post_init__(self) -> None:
        # One dtype and layout per field, writable (another array type: another numba compile).
        for name, dtype in (("offsets", np.int64), ("buckets", np.int32), ("counts", np.int64)):
            object.__setattr__(self, name, np.require(getattr(self, name), dtype, ["C", "W"]))
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0:
            raise ValueError("invalid HdrColumns: offsets must be 1-d, n + 1 long, from 0")
        if not self.offsets[-1] == len(self.buckets) == len(self.counts):
            raise ValueError(
                f"invalid HdrColumns: offsets end at {int(self.offsets[-1])}, "
                f"{len(self.buckets)} buckets, {len(self.counts)} counts"
            )

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def totals(self) -> IntArray:
        """Samples per series."""
        totals: IntArray = _totals(self.offsets, self.counts)
        return totals

    @classmethod
    def empty(cls, n: int) -> HdrColumns:
        return cls(np.zeros(n + 1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int64))


@_jit
def _totals(offsets: Any, counts: Any) -> Any:
    n = len(offsets) - 1
    out = np.zeros(n, np.int64)
    for i in range(n):
        for j in range(offsets[i], offsets[i + 1]):
            out[i] += counts[j]
    return out


def _list_parts(lists: Any) -> tuple[IntArray, Any]:
    """Per-row lengths (0 for NULL) and the values of the non-NULL rows, in order."""
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
    return np.asarray(lengths, np.int64), lists.flatten()


def from_lists(buckets: Any, counts: Any) -> HdrColumns:
    """Columns of the pane partials' ``hdr_bucket`` / ``hdr_count`` list columns
    (``pa.ListArray`` or ``ChunkedArray``; a NULL list is an empty series). Row ``i`` of both
    must have the same length."""
    bucket_lengths, bucket_values = _list_parts(buckets)
    count_lengths, count_values = _list_parts(counts)
    if not np.array_equal(bucket_lengths, count_lengths):
        bad = int(np.flatnonzero(bucket_lengths != count_lengths)[0]) if len(
            bucket_lengths) == len(count_lengths) else -1  # fmt: skip
        raise ValueError(
            f"hdr_bucket and hdr_count lists differ in length (row {bad}; "
            f"{len(bucket_lengths)} and {len(count_lengths)} rows)"
        )
    offsets = np.zeros(len(bucket_lengths) + 1, np.int64)
    np.cumsum(bucket_lengths, out=offsets[1:])
    return HdrColumns(
        offsets,
        np.asarray(bucket_values.to_numpy(zero_copy_only=False), np.int32),
        np.asarray(count_values.to_numpy(zero_copy_only=False), np.int64),
    )


def to_lists(cols: HdrColumns) -> tuple[Any, Any]:
    """``hdr_bucket`` (list<int32>) and ``hdr_count`` (list<int64>) arrays of the columns (an
    empty series: an empty list)."""
    if cols.offsets[-1] > 2**31 - 1:
        offsets: Any = pa.array(cols.offsets)
        kind: Any = pa.LargeListArray
    else:
        offsets, kind = pa.array(cols.offsets.astype(np.int32)), pa.ListArray
    return (
        kind.from_arrays(offsets, pa.array(cols.buckets, pa.int32())),
        kind.from_arrays(offsets, pa.array(cols.counts, pa.int64())),
    )


@_jit
def _ascending(buckets: Any, lo: Any, hi: Any) -> Any:
    """Whether ``buckets[lo:hi]`` is non-decreasing."""
    for j in range(lo + 1, hi):  # noqa: SIM110 (numba compiles no generator expression)
        if buckets[j] < buckets[j - 1]:
            return False
    return True


@_jit
def _merge_pair(a_b: Any, a_c: Any, a: Any, a_end: Any, b_b: Any, b_c: Any, b: Any, b_end: Any,
                out_b: Any, out_c: Any, w: Any) -> Any:  # fmt: skip
    """Sorted rows ``a`` and ``b`` merged at ``out[w]``, counts of equal buckets added (also
    within a row: the output is unique); its end."""
    first = w
    while a < a_end or b < b_end:
        if b >= b_end or (a < a_end and a_b[a] <= b_b[b]):
            key = a_b[a]
            count = a_c[a]
            a += 1
        else:
            key = b_b[b]
            count = b_c[b]
            b += 1
        if w > first and out_b[w - 1] == key:
            out_c[w - 1] += count
        else:
            out_b[w] = key
            out_c[w] = count
            w += 1
    return w


@_jit
def _merge_rows(a_offsets: Any, a_buckets: Any, a_counts: Any, heads: Any, offsets: Any,
                buckets: Any, counts: Any, order: Any, b_first: Any, b_last: Any, width: Any,
                capacity: Any, first: Any, last: Any, start: Any, out_offsets: Any,
                out_buckets: Any, out_counts: Any) -> Any:  # fmt: skip
    """Owners ``first .. last - 1``, one after another from ``out_buckets[start]`` on (owner
    ``g``'s end at ``out_offsets[g + 1]``); returns the end of the last.

    Owner ``g``'s inputs: row ``heads[g]`` of the ``a_`` columns (-1: none), then rows
    ``order[b_first[g]:b_last[g]]``. Sorted rows (as every merge and pane partial writes them)
    are merged pairwise, in one linear pass for a window and its batch partial; a row out of
    order sends its owner through a dense scratch of ``width`` slots instead (counts summed
    per bucket, the buckets touched sorted), same result."""
    largest = 0
    for g in range(first, last):
        largest = max(largest, capacity[g + 1] - capacity[g])
    acc_b = np.empty(largest, np.int32)
    acc_c = np.empty(largest, np.int64)
    tmp_b = np.empty(largest, np.int32)
    tmp_c = np.empty(largest, np.int64)
    dense = np.zeros(0, np.int64)
    seen = np.zeros(0, np.bool_)
    w = start
    for g in range(first, last):
        h = heads[g]
        a_lo = a_offsets[h] if h >= 0 else 0
        a_hi = a_offsets[h + 1] if h >= 0 else 0
        in_order = _ascending(a_buckets, a_lo, a_hi)
        for r in range(b_first[g], b_last[g]):
            i = order[r]
            in_order = in_order and _ascending(buckets, offsets[i], offsets[i + 1])
        if in_order:
            # Pairwise: the window's row (or nothing) with the first other row, the result
            # with the next, ...; the last pair straight into the output.
            n_others = b_last[g] - b_first[g]
            if n_others == 0:
                w = _merge_pair(a_buckets, a_counts, a_lo, a_hi, a_buckets, a_counts, 0, 0,
                                out_buckets, out_counts, w)  # fmt: skip
            elif n_others == 1:
                i = order[b_first[g]]
                w = _merge_pair(a_buckets, a_counts, a_lo, a_hi, buckets, counts, offsets[i],
                                offsets[i + 1], out_buckets, out_counts, w)  # fmt: skip
            else:
                i = order[b_first[g]]
                n_acc = _merge_pair(a_buckets, a_counts, a_lo, a_hi, buckets, counts,
                                    offsets[i], offsets[i + 1], acc_b, acc_c, 0)  # fmt: skip
                for r in range(b_first[g] + 1, b_last[g] - 1):
                    i = order[r]
                    n_acc = _merge_pair(acc_b, acc_c, 0, n_acc, buckets, counts, offsets[i],
                                        offsets[i + 1], tmp_b, tmp_c, 0)  # fmt: skip
                    acc_b, tmp_b = tmp_b, acc_b
                    acc_c, tmp_c = tmp_c, acc_c
                i = order[b_last[g] - 1]
                w = _merge_pair(acc_b, acc_c, 0, n_acc, buckets, counts, offsets[i],
                                offsets[i + 1], out_buckets, out_counts, w)  # fmt: skip
            out_offsets[g + 1] = w
            continue
        if len(dense) == 0:
            dense = np.zeros(width, np.int64)
            seen = np.zeros(width, np.bool_)
        n_touched = 0
        for r in range(b_first[g] - 1, b_last[g]):
            if r < b_first[g]:
                src_b = a_buckets
                src_c = a_counts
                lo = a_lo
                hi = a_hi
            else:
                i = order[r]
                src_b = buckets
                src_c = counts
                lo = offsets[i]
                hi = offsets[i + 1]
            for j in range(lo, hi):
                b = src_b[j]
                if not seen[b]:
                    seen[b] = True
                    acc_b[n_touched] = b
                    n_touched += 1
                dense[b] += src_c[j]
        keys = np.sort(acc_b[:n_touched])
        for t in range(n_touched):
            b = keys[t]
            out_buckets[w] = b
            out_counts[w] = dense[b]
            dense[b] = 0
            seen[b] = False
            w += 1
        out_offsets[g + 1] = w
    return w


def _owner_order(owner: npt.ArrayLike, n_inputs: int, n_owners: int) -> tuple[IntArray, IntArray]:
    """Inputs grouped by owner (in their given order) and where each owner's group starts."""
    owners = np.asarray(owner, dtype=np.int64)
    if owners.shape != (n_inputs,):
        raise ValueError(f"owner has shape {owners.shape}, expected ({n_inputs},)")
    if owners.size and (owners.min() < 0 or owners.max() >= n_owners):
        raise ValueError(f"owners must be in 0..{n_owners - 1}")
    order = np.argsort(owners, kind="stable")
    starts = np.searchsorted(owners[order], np.arange(n_owners + 1), "left").astype(np.int64)
    return order, starts


def _merged(head_cols: HdrColumns, heads: IntArray, cols: HdrColumns, order: IntArray,
            b_first: IntArray, b_last: IntArray) -> HdrColumns:  # fmt: skip
    width = 1
    for part in (head_cols, cols):
        if part.buckets.size:
            low, high = int(part.buckets.min()), int(part.buckets.max())
            if low < 0:
                raise ValueError(f"negative bucket index {low}")
            width = max(width, high + 1)
    n_owners = len(heads)
    capacity = merge_capacity(head_cols.offsets, heads, cols.offsets, order, b_first, b_last)
    # Allocated by numpy (huge pages for large arrays: cheaper to touch first than numba's).
    out_offsets = np.zeros(n_owners + 1, np.int64)
    out_buckets = np.empty(capacity[-1], np.int32)
    out_counts = np.empty(capacity[-1], np.int64)
    args = (head_cols.offsets, head_cols.buckets, head_cols.counts, heads, cols.offsets,
            cols.buckets, cols.counts, order, b_first, b_last, width, capacity)  # fmt: skip
    chunks = chunk_bounds(capacity)
    if chunks is None:
        end = _merge_rows(*args, 0, n_owners, 0, out_offsets, out_buckets, out_counts)
    else:
        # Chunk c's owners from their first capacity slot on; then the chunks moved together.
        ends = run_chunks(lambda c: _merge_rows(
            *args, chunks[c], chunks[c + 1], capacity[chunks[c]], out_offsets, out_buckets,
            out_counts,
        ), len(chunks) - 1)  # fmt: skip
        end = compact(chunks, capacity[chunks[:-1]], ends, out_offsets, out_buckets,
                      out_counts)  # fmt: skip
    # Views: the untouched tail was never written, so holds no memory.
    return HdrColumns(out_offsets, out_buckets[:end], out_counts[:end])


def merge_by_owner(cols: HdrColumns, owner: npt.ArrayLike, n_owners: int) -> HdrColumns:
    """One histogram per owner ``0 .. n_owners - 1``: the rows of every input series ``i`` with
    ``owner[i]`` equal to it, counts added per bucket, buckets sorted and unique (an owner
    without inputs is empty). Exact, and independent of the order of the inputs."""
    order, starts = _owner_order(owner, len(cols), n_owners)
    return _merged(HdrColumns.empty(0), np.full(n_owners, -1, np.int64), cols, order,
                   starts[:-1], starts[1:])  # fmt: skip


def merge_into(state: HdrColumns, partials: HdrColumns, owner: npt.ArrayLike) -> HdrColumns:
    """``state`` (one histogram per open window) with ``partials`` added: row ``g`` of the
    result holds ``state[g]``'s rows plus those of every partial ``i`` with ``owner[i] == g``
    (a window without partials keeps its rows, unique and sorted), without first copying
    ``state`` and ``partials`` into one set of columns."""
    order, starts = _owner_order(owner, len(partials), len(state))
    return _merged(state, np.arange(len(state), dtype=np.int64), partials, order, starts[:-1],
                   starts[1:])  # fmt: skip


@_jit
def _quantiles(offsets: Any, buckets: Any, counts: Any, qs: Any, counts_len: Any,
               unit_magnitude: Any, half_count_magnitude: Any, half_count: Any,
               value_scale: Any) -> Any:  # fmt: skip
    """``HdrLayout.quantile`` per series; status: 0, or 1 + the first bad row (bucket out of
    range or rows not sorted unique)."""
    n = len(offsets) - 1
    out = np.full((n, len(qs)), np.nan)
    for i in range(n):
        lo = offsets[i]
        hi = offsets[i + 1]
        total = 0
        for j in range(lo, hi):
            if j > lo and buckets[j] <= buckets[j - 1]:
                return out, i + 1
            if buckets[j] < 0 or buckets[j] >= counts_len:
                return out, i + 1
            total += counts[j]
        if total == 0:
            continue
        for t in range(len(qs)):
            percentile = min(qs[t] * 100.0, 100.0)
            target = max(int((percentile * total / 100) + 0.5), 1)
            running = 0
            pos = hi - 1
            for j in range(lo, hi):
                running += counts[j]
                if running >= target:
                    pos = j
                    break
            index = np.int64(buckets[pos])
            bucket = (index >> half_count_magnitude) - 1
            sub_bucket = (index & (half_count - 1)) + half_count
            if bucket < 0:
                sub_bucket -= half_count
                bucket = 0
            lowest = sub_bucket << (bucket + unit_magnitude)
            if percentile == 0.0:
                out[i, t] = lowest / value_scale
            else:
                width = np.int64(1) << (bucket + unit_magnitude)
                out[i, t] = (lowest + width - 1) / value_scale
    return out, 0


def quantiles(layout: HdrLayout, cols: HdrColumns, qs: Sequence[float] | npt.ArrayLike
              ) -> FloatArray:  # fmt: skip
    """``HdrLayout.quantile`` of every series at every ``qs`` (each in [0, 1]), shape
    ``(n, len(qs))``, NaN for an empty series. Rows must be sorted and unique per series (as
    :func:`merge_by_owner` and the pane partials give them); ``ValueError`` otherwise, or for a
    bucket outside the layout."""
    q_array = np.atleast_1d(np.asarray(qs, dtype=np.float64))
    bad = q_array[~((q_array >= 0.0) & (q_array <= 1.0))]
    if bad.size:
        raise ValueError(f"quantile q={float(bad[0])!r} is outside [0, 1]")
    out, status = _quantiles(
        cols.offsets, cols.buckets, cols.counts, q_array, layout.counts_len,
        layout._unit_magnitude, layout._half_count_magnitude, layout._half_count,
        float(layout.value_scale),
    )  # fmt: skip
    if status:
        row = int(status) - 1
        raise ValueError(
            f"series {row}: bucket rows not sorted and unique, or outside "
            f"0..{layout.counts_len - 1}"
        )
    result: FloatArray = out
    return result


def concat(parts: Sequence[HdrColumns]) -> HdrColumns:
    """The series of ``parts`` one after another (open windows, then pane partials)."""
    if not parts:
        return HdrColumns.empty(0)
    sizes = np.concatenate([np.diff(p.offsets) for p in parts])
    offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    return HdrColumns(
        offsets,
        np.concatenate([p.buckets for p in parts]).astype(np.int32, copy=False),
        np.concatenate([p.counts for p in parts]),
    )
