"""KLL quantile sketches of many series as one column structure, merged and read in compiled passes.

The KLL twin of :mod:`streamgauge.sketches.digest_columns`: every sketch of a batch lives in one
CSR structure (:class:`KllColumns`: the retained items of sketch ``i`` are
``items[offsets[i]:offsets[i + 1]]``, each with its level beside it) and each operation is one
numba call over all sketches: decode (:func:`from_serialized`), merge by owner
(:func:`merge_by_owner`, :func:`merge_into`), quantiles (:func:`quantiles`), encode
(:func:`to_serialized`). No Python call per sketch.

**Format** (Apache DataSketches ``kll_doubles_sketch``, the compact image that datasketches-cpp
and datasketches-java both write and read; little-endian)::

    byte 0      preamble ints: 2 (empty or single item) or 5
    byte 1      serial version: 1 (empty or several items), 2 (single item); 3 is the
                updatable image, which only direct (off-heap) Java sketches write, not read here
    byte 2      family 15
    byte 3      flags: 1 empty, 2 level zero sorted, 4 single item
    bytes 4-5   k (uint16)
    byte 6      m, always 8
    byte 7      unused
    empty:        nothing more (8 bytes)
    single item:  + 1 double (16 bytes; n = 1)
    otherwise:    + bytes 8-15 n (uint64), 16-17 min k (uint16), 18 num levels L, 19 unused,
                  L x uint32 level starts, double min, double max, the retained items

Levels are stored as DataSketches keeps them in memory: one buffer of ``capacity(k, L)``
slots (:func:`_total_capacity`) with the items packed at its top, level 0 first. The image
holds the first L start indices of that buffer (``levels[0]`` = the free slots below the
items), the last one, ``capacity``, being implied; level ``h`` is items ``levels[h] -
levels[0] .. levels[h + 1] - levels[0]``, each of weight ``2**h``. So the level counts are only
defined together with k: a reader recomputes ``capacity(k, L)`` from the header. Levels above
0 are sorted; level 0 is in update order (DataSketches inserts downwards, so the last value
added comes first) unless the *level zero sorted* flag says otherwise. Levels may be empty (a
sketch of 100 000 values has some), but the top one never is in images DataSketches writes.

The columns keep the items in image order, so decoding and encoding an image gives back its
bytes, with two fields not kept: *min k* is written as the columns' k and the *level zero
sorted* flag as 0 (what DataSketches writes for a sketch built by updates or merges and not
queried since; a reader sorts level 0 itself when it needs to). The number of levels written
is the top item's level + 1, raised when the retained items would not fit ``capacity(k, L)``
(an image whose top levels were empty); columns no number of levels can hold at their k are
refused. Empty: the 8-byte form; ``n = 1``: the single-item form.

**Merge** (:func:`merge_by_owner`): per owner, the general compress DataSketches runs when it
merges a sketch with several levels (``kll_helper::general_compress``,
``KllDoublesHelper.generalDoublesCompress``), run once over all of the owner's inputs:

- the inputs' items level by level: level 0 their level 0 concatenated in input order
  (unsorted), each higher level the sorted merge of theirs; n summed, min and max combined;
  L = the inputs' highest level count;
- levels bottom-up, with the running item count and the total capacity ``capacity(k, L)``:
  a level moves over unchanged while the count is below the capacity or the level holds fewer
  items than its own capacity ``max(m, k (2/3)^depth)`` (``depth`` = levels above it, rounded
  as DataSketches' ``int_cap_aux`` does); otherwise it is compacted: with an odd population its
  first item stays behind, the rest (level 0 sorted first) keeps every other item, either the
  even or the odd ones, which then merge into the level above at twice the weight. Compacting
  the top level adds a level, which raises the total capacity and lowers every level's own
  capacity. It ends after the top level.

So inputs that fit together (fewer items than ``capacity(k, L)``, e.g. every owner of a few
small panes) merge exactly: all items kept at their level. Every level is compacted at most
once per merge, where DataSketches' merge of the same sketches one by one compacts level 0
whenever it fills: the same space bound (the compress is DataSketches' own), with fewer
compactions, the only source of rank error. :func:`merge_into` is the same merge with the
state's sketch as each owner's first input.

**Deterministic**: the coin that picks even or odd items is a hash of the owner's total n and
the level compacted, instead of DataSketches' random bit; everything else is a pure function
of the inputs in their given order, so a replayed batch gives identical bytes (equal values
in any order give equal bytes). An owner with exactly one non-empty input gets it unchanged
when its items fit ``capacity(k, L)`` (always, unless it was decoded from a larger k: then it
is compressed as above); owners without inputs, or only empty ones, are empty (n = 0, min and
max NaN).

**Quantiles** (:func:`quantiles`): DataSketches' sorted view: all retained items sorted by
value with weight ``2**level``, cumulative weights, and for rank ``q`` the first item whose
cumulative weight is ``>= ceil(q * W)`` (inclusive, the default here, as Java's and C++'s
``get_quantile(q)`` and Spark's ``kll_sketch_get_quantile_double``) or ``> floor(q * W)``
(``inclusive=False``, the default of the Python binding's ``get_quantile``); the last item if
none is. ``q = 0`` gives the smallest retained item, not the min (DataSketches C++ does the
same; Java substitutes min and max at the two ends and rounds ``q * n`` to 7 decimals first, so
its tails can differ by one item).

Large batches run in chunks of rows on several threads (:mod:`streamgauge.sketches.kernels`),
each row computed as in one pass: the same bytes for any number of threads. Compiled with
``cache=True``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from streamgauge.sketches.accuracy import DEFAULT_KLL_K, MAX_KLL_K, MIN_KLL_K
from streamgauge.sketches.digest_columns import binary_parts
from streamgauge.sketches.kernels import (
    chunk_bounds,
    compact,
    copy_runs,
    merge_capacity,
    run_chunks,
)
from streamgauge.sketches.kernels import jit as _jit

__all__ = [
    "KllColumns",
    "concat",
    "from_serialized",
    "gather",
    "merge_by_owner",
    "merge_into",
    "quantiles",
    "take",
    "to_serialized",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
LevelArray = npt.NDArray[np.uint8]

_FAMILY = 15
_SERIAL_FULL = 1  # empty, or more than one item
_SERIAL_SINGLE = 2
_SERIAL_UPDATABLE = 3
_PREAMBLE_SHORT = 2
_PREAMBLE_FULL = 5
_FLAG_EMPTY = 1
_FLAG_SINGLE = 4
_M = 8
_MAX_LEVELS = 61  # DataSketches' bound (depth <= 60 in its capacity function)
_DATA_START = 20
_EMPTY_BYTES = 8
_SINGLE_BYTES = 16
_POWERS_OF_THREE = np.array([3**i for i in range(31)], np.int64)
_INT32_MAX = 2**31 - 1

# Decode status per blob (0: valid).
_OK = 0
_TOO_SHORT = 1
_NOT_KLL = 2
_UPDATABLE = 3
_BAD_PREAMBLE = 4
_BAD_M = 5
_BAD_K = 6
_BAD_LEVELS = 7
_WRONG_SIZE = 8
_NAN = 9
_WRONG_N = 10
_UNSORTED = 11
_PROBLEMS = {
    _TOO_SHORT: "shorter than its header announces",
    _NOT_KLL: "not a DataSketches KLL sketch (family 15)",
    _UPDATABLE: "an updatable image (serial version 3), not the compact one",
    _BAD_PREAMBLE: "preamble ints and serial version disagree with the flags",
    _BAD_M: "m is not 8",
    _BAD_K: f"k is outside {MIN_KLL_K}..{MAX_KLL_K}",
    _BAD_LEVELS: "level starts out of order or beyond the capacity of k (or not 1..61 levels)",
    _WRONG_SIZE: "longer than its header announces",
    _NAN: "a NaN item, min or max (or min above max)",
    _WRONG_N: "n is not the total weight of its items",
    _UNSORTED: "a level above 0 is not sorted",
}

_FIELD_TYPES = (
    ("offsets", np.int64), ("items", np.float64), ("levels", np.uint8), ("n", np.int64),
    ("mins", np.float64), ("maxs", np.float64),
)  # fmt: skip


@dataclass(frozen=True, eq=False)
class KllColumns:
    """``len(n)`` KLL sketches as CSR columns.

    Sketch ``i``'s retained items are ``items[offsets[i]:offsets[i + 1]]``, ``levels`` beside
    them (item weight ``2**level``), ordered by level ascending; the items of each level above
    0 sorted ascending, level 0 in any order. ``n`` is each sketch's total weight (values
    seen; 0 = empty), ``mins``/``maxs`` the values' extremes (NaN when empty). ``k`` is the
    sketch size of every sketch: merges compact to it and images carry it.
    """

    offsets: IntArray
    items: FloatArray
    levels: LevelArray
    n: IntArray
    mins: FloatArray
    maxs: FloatArray
    k: int = DEFAULT_KLL_K

    def __post_init__(self) -> None:
        # One dtype and layout per field: each distinct array type would be another numba
        # compile, so arrays are coerced here (copied only when they differ).
        for name, dtype in _FIELD_TYPES:
            object.__setattr__(self, name, np.require(getattr(self, name), dtype, ["C", "W"]))
        count = len(self.n)
        problems = []
        if self.offsets.ndim != 1 or len(self.offsets) != count + 1:
            problems.append(f"offsets has shape {self.offsets.shape}, expected ({count + 1},)")
        elif self.offsets[0] != 0 or self.offsets[-1] != len(self.items):
            problems.append(f"offsets must run from 0 to len(items) = {len(self.items)}")
        if len(self.levels) != len(self.items):
            problems.append(f"{len(self.levels)} levels for {len(self.items)} items")
        if len(self.mins) != count or len(self.maxs) != count:
            problems.append(f"n, mins, maxs have {count}, {len(self.mins)}, {len(self.maxs)} rows")
        if len(self.levels) and int(self.levels.max()) >= _MAX_LEVELS:
            problems.append(f"a level above {_MAX_LEVELS - 1}")
        if not MIN_KLL_K <= self.k <= MAX_KLL_K:
            problems.append(f"k={self.k} is outside {MIN_KLL_K}..{MAX_KLL_K}")
        if problems:
            raise ValueError("invalid KllColumns: " + "; ".join(problems))

    def __len__(self) -> int:
        return len(self.n)

    @property
    def sizes(self) -> IntArray:
        """Values per sketch (``n``): ``sizes > 0`` marks the non-empty ones."""
        return self.n

    @property
    def retained(self) -> IntArray:
        """Retained items per sketch."""
        retained: IntArray = np.diff(self.offsets)
        return retained

    @classmethod
    def empty(cls, n: int, k: int = DEFAULT_KLL_K) -> KllColumns:
        """``n`` empty sketches of size ``k``."""
        return cls(
            np.zeros(n + 1, np.int64), np.zeros(0), np.zeros(0, np.uint8), np.zeros(n, np.int64),
            np.full(n, np.nan), np.full(n, np.nan), k,
        )  # fmt: skip


# -- capacities ---------------------------------------------------------------------------


@_jit
def _int_cap_aux_aux(k: Any, depth: Any) -> Any:
    """``round(k * (2/3)**depth)``, in integers: 2k scaled then halved, rounding up."""
    twice = (np.int64(k) * 2) << depth
    return ((twice // _POWERS_OF_THREE[depth]) + 1) >> 1


@_jit
def _level_capacity(k: Any, num_levels: Any, height: Any) -> Any:
    """Items level ``height`` of a ``num_levels``-level sketch holds before it is compacted."""
    depth = num_levels - height - 1
    if depth <= 30:
        cap = _int_cap_aux_aux(k, depth)
    else:
        half = depth // 2
        cap = _int_cap_aux_aux(_int_cap_aux_aux(k, half), depth - half)
    return max(np.int64(_M), cap)


@_jit
def _total_capacity(k: Any, num_levels: Any) -> Any:
    """The item buffer of a ``num_levels``-level sketch (the implied last level start)."""
    total = np.int64(0)
    for h in range(num_levels):
        total += _level_capacity(k, num_levels, h)
    return total


@_jit
def _coin(n: Any, level: Any) -> Any:
    """0 or 1: keep the even or the odd items of a compacted level (splitmix64 of n, level)."""
    z = np.uint64(n) + np.uint64(level + 1) * np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z >> np.uint64(63))


# -- decode -------------------------------------------------------------------------------


@_jit
def _read_uint(data: Any, p: Any, size: Any) -> Any:
    """``size`` bytes at ``p``, little-endian, as int64 (callers keep it below 2**63)."""
    value = np.int64(0)
    for b in range(size):
        value |= np.int64(data[p + b]) << (8 * b)
    return value


@_jit
def _scan(data: Any, starts: Any, lengths: Any, valid: Any, out_k: Any, out_count: Any) -> Any:
    """Validate each blob's header; its k and its number of retained items."""
    count = len(starts)
    status = np.zeros(count, np.int64)
    for i in range(count):
        out_k[i] = -1
        out_count[i] = 0
        if not valid[i]:
            continue
        s = starts[i]
        size = lengths[i]
        if size < _EMPTY_BYTES:
            status[i] = _TOO_SHORT
            continue
        preamble = data[s]
        serial = data[s + 1]
        flags = data[s + 3]
        k = _read_uint(data, s + 4, 2)
        if data[s + 2] != _FAMILY:
            status[i] = _NOT_KLL
            continue
        if serial == _SERIAL_UPDATABLE:
            status[i] = _UPDATABLE
            continue
        if data[s + 6] != _M:
            status[i] = _BAD_M
            continue
        if k < MIN_KLL_K or k > MAX_KLL_K:
            status[i] = _BAD_K
            continue
        out_k[i] = k
        empty = (flags & _FLAG_EMPTY) != 0
        single = (flags & _FLAG_SINGLE) != 0
        if empty:
            # (bytes after an empty header are ignored, as DataSketches' readers do)
            if single or preamble != _PREAMBLE_SHORT or serial != _SERIAL_FULL:
                status[i] = _BAD_PREAMBLE
            continue
        if single:
            if preamble != _PREAMBLE_SHORT or serial != _SERIAL_SINGLE:
                status[i] = _BAD_PREAMBLE
            elif size < _SINGLE_BYTES:
                status[i] = _TOO_SHORT
            elif size > _SINGLE_BYTES:
                status[i] = _WRONG_SIZE
            else:
                out_count[i] = 1
            continue
        if preamble != _PREAMBLE_FULL or serial != _SERIAL_FULL:
            status[i] = _BAD_PREAMBLE
            continue
        if size < _DATA_START:
            status[i] = _TOO_SHORT
            continue
        num_levels = np.int64(data[s + 18])
        if num_levels < 1 or num_levels > _MAX_LEVELS:
            status[i] = _BAD_LEVELS
            continue
        if size < _DATA_START + 4 * num_levels:
            status[i] = _TOO_SHORT
            continue
        capacity = _total_capacity(k, num_levels)
        first = _read_uint(data, s + _DATA_START, 4)
        previous = first
        for h in range(1, num_levels + 1):
            start = _read_uint(data, s + _DATA_START + 4 * h, 4) if h < num_levels else capacity
            if start < previous:
                status[i] = _BAD_LEVELS
            previous = start
        if status[i] != _OK:
            continue
        retained = capacity - first
        expected = _DATA_START + 4 * num_levels + 8 * (2 + retained)
        if size < expected:
            status[i] = _TOO_SHORT
        elif size > expected:
            status[i] = _WRONG_SIZE
        else:
            out_count[i] = retained
    return status


@_jit
def _decode(data: Any, starts: Any, valid: Any, offsets: Any, items: Any, item_bytes: Any,
            levels: Any, out_n: Any, mins: Any, maxs: Any) -> Any:  # fmt: skip
    """Fill the columns of blobs ``_scan`` passed (``item_bytes``: ``items``' memory as
    bytes, to copy unaligned doubles); returns a status per blob."""
    count = len(starts)
    status = np.zeros(count, np.int64)
    extremes = np.empty(2, np.float64)
    extreme_bytes = extremes.view(np.uint8)
    for i in range(count):
        out_n[i] = 0
        mins[i] = np.nan
        maxs[i] = np.nan
        if not valid[i]:
            continue
        s = starts[i]
        flags = data[s + 3]
        if flags & _FLAG_EMPTY:
            continue
        o = offsets[i]
        if flags & _FLAG_SINGLE:
            item_bytes[8 * o : 8 * o + 8] = data[s + 8 : s + 16]
            levels[o] = 0
            if np.isnan(items[o]):
                status[i] = _NAN
            out_n[i] = 1
            mins[i] = items[o]
            maxs[i] = items[o]
            continue
        retained = offsets[i + 1] - o
        num_levels = np.int64(data[s + 18])
        first = _read_uint(data, s + _DATA_START, 4)
        body = s + _DATA_START + 4 * num_levels
        extreme_bytes[:] = data[body : body + 16]
        item_bytes[8 * o : 8 * (o + retained)] = data[body + 16 : body + 16 + 8 * retained]
        weight = np.int64(0)
        for h in range(num_levels):
            lo = _read_uint(data, s + _DATA_START + 4 * h, 4) - first
            hi = retained
            if h + 1 < num_levels:
                hi = _read_uint(data, s + _DATA_START + 4 * (h + 1), 4) - first
            if hi - lo > (np.int64(1) << (62 - h)):
                status[i] = _WRONG_N  # a weight no 63-bit n can hold
                break
            weight += (hi - lo) << h
            if weight >= np.int64(1) << 56:  # (above any 7-byte n: no overflow below)
                status[i] = _WRONG_N
                break
            for j in range(o + lo, o + hi):
                levels[j] = h
                if np.isnan(items[j]):
                    status[i] = _NAN
                elif h > 0 and j > o + lo and items[j] < items[j - 1]:
                    status[i] = _UNSORTED
        n = _read_uint(data, s + 8, 7)
        if data[s + 15] != 0 or n != weight:
            status[i] = _WRONG_N
        out_n[i] = n
        mins[i] = extremes[0]
        maxs[i] = extremes[1]
        if not extremes[0] <= extremes[1]:  # (NaN included)
            status[i] = _NAN
    return status


def _decode_chunk(array: Any, first_row: int) -> tuple[KllColumns, IntArray, IntArray]:
    """One Arrow chunk (its rows counted from ``first_row`` in error messages)."""
    data, byte_offsets, valid, _ = binary_parts(array)
    data = data.view()
    data.flags.writeable = False  # one array type for the kernels, whatever Arrow gives
    starts = byte_offsets[:-1]
    lengths = np.where(valid, np.diff(byte_offsets), 0)
    count = len(valid)
    blob_k = np.zeros(count, np.int64)
    retained = np.zeros(count, np.int64)
    _raise_on(_scan(data, starts, lengths, valid, blob_k, retained), first_row)
    offsets = np.zeros(count + 1, np.int64)
    np.cumsum(retained, out=offsets[1:])
    items = np.empty(int(offsets[-1]), np.float64)
    levels = np.empty(len(items), np.uint8)
    n = np.empty(count, np.int64)
    mins = np.empty(count, np.float64)
    maxs = np.empty(count, np.float64)
    _raise_on(_decode(data, starts, valid, offsets, items, items.view(np.uint8), levels, n, mins,
                      maxs), first_row)  # fmt: skip
    cols = KllColumns(offsets, items, levels, n, mins, maxs, DEFAULT_KLL_K)
    return cols, blob_k, np.flatnonzero(valid)


def _raise_on(status: IntArray, first_row: int) -> None:
    bad = np.flatnonzero(status)
    if bad.size:
        first = int(bad[0])
        raise ValueError(
            f"{bad.size} blob(s) are not valid KLL doubles sketches; row {first_row + first}: "
            f"{_PROBLEMS.get(int(status[first]), 'invalid')}"
        )


def from_serialized(blobs: pa.Array | pa.ChunkedArray, k: int | None = None) -> KllColumns:
    """Columns of serialized ``kll_doubles_sketch`` images (``pa.BinaryArray``,
    ``LargeBinaryArray`` or a ``ChunkedArray`` of them); a NULL blob is an empty sketch.

    ``k``: the sketch size of the result (merges compact to it). ``None``: the blobs' own k,
    which must then be the same in every non-NULL blob (``DEFAULT_KLL_K`` if there is none).
    A sketch of a larger k whose items do not fit k is compressed to k (a merge of it alone).
    Raises ``ValueError`` naming the first malformed row (counted over all chunks).
    """
    chunks = list(blobs.chunks) if isinstance(blobs, pa.ChunkedArray) else [blobs]
    parts: list[KllColumns] = []
    seen_k: set[int] = set()
    first_row = 0
    for chunk in chunks:
        cols, blob_k, valid_rows = _decode_chunk(chunk, first_row)
        seen_k.update(np.unique(blob_k[valid_rows]).tolist())
        parts.append(cols)
        first_row += len(chunk)
    if k is None:
        if len(seen_k) > 1:
            raise ValueError(
                f"blobs of different k {sorted(seen_k)}: pass k= to merge them at one k"
            )
        k = next(iter(seen_k)) if seen_k else DEFAULT_KLL_K
    if len(parts) == 1:
        cols = parts[0]
        cols = KllColumns(cols.offsets, cols.items, cols.levels, cols.n, cols.mins, cols.maxs, k)
    else:
        cols = concat(parts, k) if parts else KllColumns.empty(0, k)
    if seen_k - {k} and not _fits(cols.offsets, cols.levels, k):
        # sketches of a larger k than the columns': compressed to k (a merge of one input)
        cols = merge_by_owner(cols, np.arange(len(cols)), len(cols))
    return cols


# -- encode -------------------------------------------------------------------------------


@_jit
def _num_levels(offsets: Any, levels: Any, n: Any, k: Any) -> Any:
    """Levels each image states (0 for the empty and single-item forms): the top item's
    level + 1, or more if the items would not fit the capacity of that many (-1 if they fit
    no number of levels)."""
    count = len(n)
    out = np.zeros(count, np.int64)
    for i in range(count):
        lo = offsets[i]
        hi = offsets[i + 1]
        if n[i] == 0 or (n[i] == 1 and hi - lo == 1) or hi == lo:
            continue
        top = np.int64(levels[hi - 1]) + 1
        while top < _MAX_LEVELS and _total_capacity(k, top) < hi - lo:
            top += 1
        out[i] = top if _total_capacity(k, top) >= hi - lo else -1
    return out


@_jit
def _fits(offsets: Any, levels: Any, k: Any) -> Any:
    """Whether every sketch's items fit the capacity of its levels at ``k``."""
    for i in range(len(offsets) - 1):
        lo = offsets[i]
        hi = offsets[i + 1]
        if hi > lo and hi - lo > _total_capacity(k, np.int64(levels[hi - 1]) + 1):
            return False
    return True


@_jit
def _write_uint(out: Any, p: Any, value: Any, size: Any) -> None:
    for b in range(size):
        out[p + b] = (value >> (8 * b)) & 0xFF


@_jit
def _encode_rows(offsets: Any, item_bytes: Any, levels: Any, n: Any, min_bytes: Any,
                 max_bytes: Any, k: Any, num_levels: Any, starts: Any, out: Any, first: Any,
                 last: Any) -> None:  # fmt: skip
    """Images of sketches ``first .. last - 1``, each at its byte offset in ``out``."""
    for i in range(first, last):
        s = starts[i]
        o = offsets[i]
        retained = offsets[i + 1] - o
        out[s + 2] = _FAMILY
        _write_uint(out, s + 4, k, 2)
        out[s + 6] = _M
        out[s + 7] = 0
        levels_count = num_levels[i]
        if levels_count == 0:
            out[s] = _PREAMBLE_SHORT
            if n[i] == 0 or retained == 0:
                out[s + 1] = _SERIAL_FULL
                out[s + 3] = _FLAG_EMPTY
            else:
                out[s + 1] = _SERIAL_SINGLE
                out[s + 3] = _FLAG_SINGLE
                out[s + 8 : s + 16] = item_bytes[8 * o : 8 * o + 8]
            continue
        out[s] = _PREAMBLE_FULL
        out[s + 1] = _SERIAL_FULL
        out[s + 3] = 0
        _write_uint(out, s + 8, n[i], 8)
        _write_uint(out, s + 16, k, 2)
        out[s + 18] = levels_count
        out[s + 19] = 0
        start = _total_capacity(k, levels_count) - retained
        j = o
        for h in range(levels_count):
            _write_uint(out, s + _DATA_START + 4 * h, start + (j - o), 4)
            while j < o + retained and levels[j] == h:
                j += 1
        body = s + _DATA_START + 4 * levels_count
        out[body : body + 8] = min_bytes[8 * i : 8 * i + 8]
        out[body + 8 : body + 16] = max_bytes[8 * i : 8 * i + 8]
        out[body + 16 : body + 16 + 8 * retained] = item_bytes[8 * o : 8 * (o + retained)]


def to_serialized(cols: KllColumns) -> pa.BinaryArray:
    """The compact DataSketches image of every sketch (Python's
    ``kll_doubles_sketch.deserialize`` and Java's ``KllDoublesSketch.heapify`` read them):
    empty sketches in the 8-byte form, ``n = 1`` in the single-item form. One pass into one
    buffer: a ``pa.BinaryArray`` (``pa.LargeBinaryArray`` above 2 GiB)."""
    num_levels = _num_levels(cols.offsets, cols.levels, cols.n, cols.k)
    if np.any(num_levels < 0):
        row = int(np.flatnonzero(num_levels < 0)[0])
        raise ValueError(f"sketch {row} retains more items than any KLL sketch of k={cols.k}")
    retained = cols.retained
    single = (num_levels == 0) & (cols.n > 0) & (retained > 0)
    sizes = np.where(
        num_levels > 0, _DATA_START + 4 * num_levels + 8 * (retained + 2),
        np.where(single, _SINGLE_BYTES, _EMPTY_BYTES),
    )  # fmt: skip
    byte_offsets = np.zeros(len(cols) + 1, np.int64)
    np.cumsum(sizes, out=byte_offsets[1:])
    out = np.empty(int(byte_offsets[-1]), np.uint8)
    args = (cols.offsets, cols.items.view(np.uint8), cols.levels, cols.n,
            cols.mins.view(np.uint8), cols.maxs.view(np.uint8), cols.k, num_levels,
            byte_offsets[:-1], out)  # fmt: skip
    # (the kernel itself for one chunk too: one compile serves both paths)
    chunks = chunk_bounds(cols.offsets)
    if chunks is None:
        _encode_rows(*args, 0, len(cols))
    else:
        run_chunks(lambda c: _encode_rows(*args, chunks[c], chunks[c + 1]), len(chunks) - 1)
    if byte_offsets[-1] > _INT32_MAX:
        arrow_type, offsets_buffer = pa.large_binary(), pa.py_buffer(byte_offsets)
    else:
        arrow_type, offsets_buffer = pa.binary(), pa.py_buffer(byte_offsets.astype(np.int32))
    return pa.Array.from_buffers(arrow_type, len(cols), [None, offsets_buffer, pa.py_buffer(out)])


# -- merge --------------------------------------------------------------------------------


@_jit
def _place(items: Any, levels: Any, lo: Any, hi: Any, work: Any, fill: Any) -> None:
    """Items ``lo .. hi - 1`` of one input into their levels' next slots of ``work``."""
    for j in range(lo, hi):
        h = levels[j]
        work[fill[h]] = items[j]
        fill[h] += 1


@_jit
def _compress(work: Any, bounds: Any, num_levels: Any, k: Any, seed: Any, spare_a: Any,
              spare_b: Any, out_items: Any, out_levels: Any, w: Any) -> Any:  # fmt: skip
    """DataSketches' general compress (module docstring) of the levels ``work[bounds[h]:
    bounds[h + 1]]``, ``h < num_levels`` (level 0 in any order, the others sorted), written
    level by level from ``out_items[w]`` on; returns the end.

    A level's content is read from ``work`` when nothing was compacted into it, else from the
    spare array the compaction below merged it into (the two spares alternate)."""
    count = bounds[num_levels]
    target = _total_capacity(k, num_levels)
    current_levels = num_levels
    source = work
    which = 0  # source: 0 work, 1 spare_a, 2 spare_b
    lo = bounds[0]
    hi = bounds[1]
    h = 0
    while True:
        above_lo = 0
        above_hi = 0
        if h + 1 < num_levels:
            above_lo = bounds[h + 1]
            above_hi = bounds[h + 2]
        population = hi - lo
        if count < target or population < _level_capacity(k, current_levels, h):
            out_items[w : w + population] = source[lo:hi]
            out_levels[w : w + population] = h
            w += population
            source = work
            which = 0
            lo = above_lo
            hi = above_hi
        else:
            if population & 1:  # the first item stays behind
                out_items[w] = source[lo]
                out_levels[w] = h
                w += 1
                lo += 1
            half = (hi - lo) // 2
            if h == 0:
                source[lo:hi].sort()
            if which == 1:
                target_array = spare_b
                which = 2
            else:
                target_array = spare_a
                which = 1
            # every other item, from the coin's parity on, merged with the level above
            a = lo + _coin(seed, h)
            b = above_lo
            t = 0
            while a < hi and b < above_hi:
                if source[a] < work[b]:
                    target_array[t] = source[a]
                    a += 2
                else:
                    target_array[t] = work[b]
                    b += 1
                t += 1
            while a < hi:
                target_array[t] = source[a]
                a += 2
                t += 1
            while b < above_hi:
                target_array[t] = work[b]
                b += 1
                t += 1
            count -= half
            if h == current_levels - 1:
                current_levels += 1
                target += _level_capacity(k, current_levels, 0)
            source = target_array
            lo = 0
            hi = t
        if h == current_levels - 1:
            break
        h += 1
    return w


@_jit
def _merge_owner_rows(
    a_offsets: Any, a_items: Any, a_levels: Any, a_n: Any, a_mins: Any, a_maxs: Any, heads: Any,
    offsets: Any, items: Any, levels: Any, n: Any, mins: Any, maxs: Any, order: Any,
    b_first: Any, b_last: Any, k: Any, capacity: Any, first: Any, last: Any, start: Any,
    out_offsets: Any, out_items: Any, out_levels: Any, out_n: Any, out_mins: Any, out_maxs: Any,
) -> Any:  # fmt: skip
    """The merge of each owner's inputs (module docstring), for owners ``first .. last - 1``,
    written one after another from ``out_items[start]`` on (owner ``g``'s end at
    ``out_offsets[g + 1]``); returns the end of the last.

    Owner ``g``'s first input is row ``heads[g]`` of the ``a_`` columns (-1: none), the others
    rows ``order[b_first[g]:b_last[g]]`` of the unprefixed columns, in that order."""
    largest = 0
    for g in range(first, last):
        largest = max(largest, capacity[g + 1] - capacity[g])
    work = np.empty(largest, np.float64)
    spare_a = np.empty(largest, np.float64)
    spare_b = np.empty(largest, np.float64)
    pop = np.zeros(_MAX_LEVELS + 1, np.int64)
    bounds = np.zeros(_MAX_LEVELS + 2, np.int64)
    fill = np.zeros(_MAX_LEVELS + 1, np.int64)
    w = start
    for g in range(first, last):
        h = heads[g]
        non_empty = 0
        only = -1
        total_n = np.int64(0)
        lo_value = np.inf
        hi_value = -np.inf
        if h >= 0 and a_n[h] > 0:
            non_empty = 1
            total_n += a_n[h]
            lo_value = a_mins[h]
            hi_value = a_maxs[h]
        for r in range(b_first[g], b_last[g]):
            i = order[r]
            if n[i] > 0:
                non_empty += 1
                only = i
                total_n += n[i]
                lo_value = min(lo_value, mins[i])
                hi_value = max(hi_value, maxs[i])
        out_n[g] = total_n
        if non_empty == 0:
            out_offsets[g + 1] = w
            out_mins[g] = np.nan
            out_maxs[g] = np.nan
            continue
        out_mins[g] = lo_value
        out_maxs[g] = hi_value
        if non_empty == 1:
            # that sketch unchanged if it fits k (else compressed to k below: from a larger k)
            if only < 0:
                src_items = a_items
                src_levels = a_levels
                lo_i = a_offsets[h]
                hi_i = a_offsets[h + 1]
            else:
                src_items = items
                src_levels = levels
                lo_i = offsets[only]
                hi_i = offsets[only + 1]
            size = hi_i - lo_i
            if size == 0 or size <= _total_capacity(k, np.int64(src_levels[hi_i - 1]) + 1):
                out_items[w : w + size] = src_items[lo_i:hi_i]
                out_levels[w : w + size] = src_levels[lo_i:hi_i]
                w += size
                out_offsets[g + 1] = w
                continue
        # Level populations, then every input's items into its levels' slots, in input order.
        top = 0
        pop[:] = 0
        if h >= 0:
            for j in range(a_offsets[h], a_offsets[h + 1]):
                pop[a_levels[j]] += 1
                top = max(top, a_levels[j])
        for r in range(b_first[g], b_last[g]):
            i = order[r]
            for j in range(offsets[i], offsets[i + 1]):
                pop[levels[j]] += 1
                top = max(top, levels[j])
        num_levels = np.int64(top) + 1
        bounds[0] = 0
        for lvl in range(num_levels):
            bounds[lvl + 1] = bounds[lvl] + pop[lvl]
            fill[lvl] = bounds[lvl]
        if h >= 0:
            _place(a_items, a_levels, a_offsets[h], a_offsets[h + 1], work, fill)
        for r in range(b_first[g], b_last[g]):
            i = order[r]
            _place(items, levels, offsets[i], offsets[i + 1], work, fill)
        for lvl in range(1, num_levels):  # the inputs' sorted runs of a level, as one
            for j in range(bounds[lvl] + 1, bounds[lvl + 1]):
                if work[j] < work[j - 1]:
                    work[bounds[lvl] : bounds[lvl + 1]].sort()
                    break
        total = bounds[num_levels]
        if total < _total_capacity(k, num_levels):
            # fits: general compress moves every level over as it is
            out_items[w : w + total] = work[:total]
            for lvl in range(num_levels):
                out_levels[w + bounds[lvl] : w + bounds[lvl + 1]] = lvl
            w += total
        else:
            w = _compress(work, bounds, num_levels, k, total_n, spare_a, spare_b, out_items,
                          out_levels, w)  # fmt: skip
        out_offsets[g + 1] = w
    return w


def _owner_order(owner: npt.ArrayLike, n_inputs: int, n_owners: int) -> tuple[IntArray, IntArray]:
    """Inputs grouped by owner, each owner's in their given order, and where each owner's
    group starts in that order (``n_owners + 1`` entries)."""
    owners = np.asarray(owner, dtype=np.int64)
    if owners.shape != (n_inputs,):
        raise ValueError(f"owner has shape {owners.shape}, expected ({n_inputs},)")
    if owners.size and (owners.min() < 0 or owners.max() >= n_owners):
        raise ValueError(f"owners must be in 0..{n_owners - 1}")
    order = np.argsort(owners, kind="stable").astype(np.int64)
    starts = np.searchsorted(owners[order], np.arange(n_owners + 1), "left").astype(np.int64)
    return order, starts


def merge_by_owner(cols: KllColumns, owner: npt.ArrayLike, n_owners: int) -> KllColumns:
    """One sketch per owner ``0 .. n_owners - 1``: the merge (module docstring) of every input
    sketch ``i`` with ``owner[i]`` equal to it, in their given order, at ``cols.k``. A pure
    function of ``cols`` and ``owner``: a replayed batch gives the same bytes."""
    order, starts = _owner_order(owner, len(cols), n_owners)
    heads = np.full(n_owners, -1, np.int64)
    return _merged(cols, heads, cols, order, starts[:-1], starts[1:], cols.k)


def merge_into(state: KllColumns, partials: KllColumns, owner: npt.ArrayLike) -> KllColumns:
    """``state`` (one sketch per owner) with ``partials`` merged in: row ``g`` of the result is
    :func:`merge_by_owner` of ``[state[g], partials i with owner[i] == g (in order)]``, without
    first copying both into one set of columns. A row without partials keeps its sketch
    unchanged. ``k`` is the state's."""
    order, starts = _owner_order(owner, len(partials), len(state))
    heads = np.arange(len(state), dtype=np.int64)
    return _merged(state, heads, partials, order, starts[:-1], starts[1:], state.k)


def _merged(head_cols: KllColumns, heads: IntArray, cols: KllColumns, order: IntArray,
            b_first: IntArray, b_last: IntArray, k: int) -> KllColumns:  # fmt: skip
    n_owners = len(heads)
    capacity = merge_capacity(head_cols.offsets, heads, cols.offsets, order, b_first, b_last)
    total = int(capacity[-1])
    outputs = (
        np.zeros(n_owners + 1, np.int64), np.empty(total, np.float64), np.empty(total, np.uint8),
        np.empty(n_owners, np.int64), np.empty(n_owners, np.float64),
        np.empty(n_owners, np.float64),
    )  # fmt: skip
    args = (
        head_cols.offsets, head_cols.items, head_cols.levels, head_cols.n, head_cols.mins,
        head_cols.maxs, heads, cols.offsets, cols.items, cols.levels, cols.n, cols.mins,
        cols.maxs, order, b_first, b_last, k, capacity,
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
    offsets, items, levels, n, mins, maxs = outputs
    return KllColumns(offsets, items[:end], levels[:end], n, mins, maxs, k)


# -- quantiles ----------------------------------------------------------------------------


@_jit
def _merge_runs(src_v: Any, src_w: Any, dst_v: Any, dst_w: Any, bounds: Any, n_runs: Any
                ) -> Any:  # fmt: skip
    """Bottom-up merge of the sorted runs ``bounds[r] .. bounds[r + 1]`` of ``src`` (values and
    weights); returns the arrays holding the result."""
    while n_runs > 1:
        merged = 0
        for r in range(0, n_runs, 2):
            a = bounds[r]
            if r + 1 < n_runs:
                middle = bounds[r + 1]
                end = bounds[r + 2]
                b = middle
                t = a
                while a < middle and b < end:
                    if src_v[b] < src_v[a]:
                        dst_v[t] = src_v[b]
                        dst_w[t] = src_w[b]
                        b += 1
                    else:
                        dst_v[t] = src_v[a]
                        dst_w[t] = src_w[a]
                        a += 1
                    t += 1
                dst_v[t : t + middle - a] = src_v[a:middle]
                dst_w[t : t + middle - a] = src_w[a:middle]
                t += middle - a
                dst_v[t : t + end - b] = src_v[b:end]
                dst_w[t : t + end - b] = src_w[b:end]
            else:
                end = bounds[r + 1]
                dst_v[a:end] = src_v[a:end]
                dst_w[a:end] = src_w[a:end]
            bounds[merged] = bounds[r]
            merged += 1
        bounds[merged] = bounds[n_runs]
        n_runs = merged
        src_v, dst_v = dst_v, src_v
        src_w, dst_w = dst_w, src_w
    return src_v, src_w


@_jit
def _quantile_rows(offsets: Any, items: Any, levels: Any, qs: Any, inclusive: Any, out: Any,
                   first: Any, last: Any) -> None:  # fmt: skip
    """DataSketches' ``get_quantile`` of every q for sketches ``first .. last - 1`` into
    ``out`` (NaN for an empty sketch): the sorted view, then a search of its cumulative
    weights."""
    largest = 0
    for i in range(first, last):
        largest = max(largest, offsets[i + 1] - offsets[i])
    values = np.empty(largest, np.float64)
    weights = np.empty(largest, np.int64)
    spare_v = np.empty(largest, np.float64)
    spare_w = np.empty(largest, np.int64)
    bounds = np.empty(largest + 1, np.int64)  # (a run per level; more if levels do not ascend)
    for i in range(first, last):
        lo = offsets[i]
        size = offsets[i + 1] - lo
        if size == 0:
            out[i, :] = np.nan
            continue
        # one sorted run per level (level 0 sorted here)
        n_runs = 0
        j = 0
        while j < size:
            level = levels[lo + j]
            run = j
            weight = np.int64(1) << np.int64(level)
            while j < size and levels[lo + j] == level:
                values[j] = items[lo + j]
                weights[j] = weight
                j += 1
            for t in range(run + 1, j):
                if values[t] < values[t - 1]:
                    values[run:j].sort()
                    break
            bounds[n_runs] = run
            n_runs += 1
        bounds[n_runs] = size
        v, cum = _merge_runs(values, weights, spare_v, spare_w, bounds, n_runs)
        total = np.int64(0)
        for t in range(size):
            total += cum[t]
            cum[t] = total
        for c in range(len(qs)):
            if inclusive:
                wanted = np.int64(math.ceil(qs[c] * np.float64(total)))
            else:
                wanted = np.int64(qs[c] * np.float64(total))
            a = 0
            b = size
            while a < b:  # first cumulative weight >= wanted (inclusive), > wanted (exclusive)
                m = (a + b) >> 1
                if cum[m] < wanted or (not inclusive and cum[m] == wanted):
                    a = m + 1
                else:
                    b = m
            out[i, c] = v[min(a, size - 1)]


def quantiles(
    cols: KllColumns, qs: Sequence[float] | npt.ArrayLike, *, inclusive: bool = True
) -> FloatArray:
    """Values at normalized ranks ``qs`` (each in [0, 1]) of every sketch, shape
    ``(len(cols), len(qs))``, NaN for an empty sketch: DataSketches' ``get_quantile(q,
    inclusive)`` of each (module docstring), for all sketches in one call."""
    q_array = np.atleast_1d(np.asarray(qs, dtype=np.float64))
    bad = q_array[~((q_array >= 0.0) & (q_array <= 1.0))]
    if bad.size:
        raise ValueError(f"quantile q={float(bad[0])!r} is outside [0, 1]")
    flag = bool(inclusive)
    result = np.empty((len(cols), len(q_array)), np.float64)
    chunks = chunk_bounds(cols.offsets)
    if chunks is None:
        _quantile_rows(cols.offsets, cols.items, cols.levels, q_array, flag, result, 0, len(cols))
        return result
    run_chunks(lambda c: _quantile_rows(cols.offsets, cols.items, cols.levels, q_array, flag,
                                        result, chunks[c], chunks[c + 1]),
               len(chunks) - 1)  # fmt: skip
    return result


# -- assembling columns -------------------------------------------------------------------


def concat(parts: Sequence[KllColumns], k: int | None = None) -> KllColumns:
    """The sketches of ``parts`` one after another. ``k``: the result's (default: the first
    part's)."""
    if not parts:
        return KllColumns.empty(0, DEFAULT_KLL_K if k is None else k)
    retained = np.concatenate([p.retained for p in parts])
    offsets = np.zeros(len(retained) + 1, np.int64)
    np.cumsum(retained, out=offsets[1:])
    return KllColumns(
        offsets,
        np.concatenate([p.items for p in parts]),
        np.concatenate([p.levels for p in parts]),
        np.concatenate([p.n for p in parts]),
        np.concatenate([p.mins for p in parts]),
        np.concatenate([p.maxs for p in parts]),
        parts[0].k if k is None else k,
    )


def take(cols: KllColumns, rows: npt.ArrayLike) -> KllColumns:
    """Sketches ``rows`` of ``cols``, in that order."""
    return gather([(cols, rows)], cols.k)


def gather(parts: Sequence[tuple[KllColumns, npt.ArrayLike]], k: int | None = None
           ) -> KllColumns:  # fmt: skip
    """Sketches ``rows`` of each ``(cols, rows)`` part, the parts one after another:
    :func:`concat` of :func:`take` s with one copy of the items. ``k``: the result's (default:
    the first part's)."""
    if not parts:
        return KllColumns.empty(0, DEFAULT_KLL_K if k is None else k)
    picked = [(cols, np.asarray(rows, dtype=np.int64).reshape(-1)) for cols, rows in parts]
    sizes = [cols.retained[index] for cols, index in picked]
    offsets = np.zeros(sum(len(index) for _, index in picked) + 1, np.int64)
    np.cumsum(np.concatenate(sizes), out=offsets[1:])
    items = np.empty(int(offsets[-1]), np.float64)
    levels = np.empty(int(offsets[-1]), np.uint8)
    first = 0
    for (cols, index), size in zip(picked, sizes, strict=True):
        copy_runs(cols.offsets[index], size, offsets[first : first + len(index)], cols.items,
                   cols.levels, items, levels)  # fmt: skip
        first += len(index)
    return KllColumns(
        offsets, items, levels,
        np.concatenate([cols.n[index] for cols, index in picked]),
        np.concatenate([cols.mins[index] for cols, index in picked]),
        np.concatenate([cols.maxs[index] for cols, index in picked]),
        parts[0][0].k if k is None else k,
    )  # fmt: skip
