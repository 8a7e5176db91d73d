"""DataSketches' HLL union of many windows' images in compiled code, byte for byte.

Why: a set window's sketch is the union of its panes' HLL images, and its distinct count is
that union's estimate. With one ``hll_union`` per window in Python, 100k set series cost a
second per close (``docs/performance.md``, "Sets at 100k series"). :func:`union_images`
gives, for every owner (window) at once, the bytes ``hll_union(lg_k)`` fed that owner's
images in order writes (``get_result(HLL_8)``, ``serialize_compact()``) and the estimate
DataSketches reads from them, in a compiled call per chunk of owners on the kernels' threads
(``sketches/kernels.py``). So the stored sketch, its registers and ``distinct_count`` are
what they were, and Spark's ``hll_sketch_estimate`` of the stored image still rounds to the
stored count.

The union is order-sensitive in DataSketches (its HIP estimate accumulates as coupons arrive,
a coupon hash set's layout depends on insertion order), so this is a transcription of the
library's state machine (``HllUnion-internal.hpp``, ``CouponList``, ``CouponHashSet``,
``Hll8Array``, ``HllArray``; the same in Java), not a reimplementation of HLL:

- the gadget starts an empty LIST; an empty input is skipped;
- a LIST/SET input is copied into an empty gadget, else its coupons are fed one at a time in
  its own iteration order (a compact SET is first re-hashed as the library deserializes it);
  a LIST promotes to a SET when full (8 coupons), a SET grows at 3/4 full and promotes to
  HLL at ``2^(lgK-3)`` slots, with the HIP accumulator set to the coupon estimate;
- an HLL input is copied into an empty gadget; into a LIST/SET gadget it is copied and the
  gadget's coupons are fed into the copy; into an HLL gadget its registers are maxed in and
  the result is marked out of order (its estimate then is DataSketches' composite estimator,
  computed from registers rebuilt in slot order when the result is taken).

What the kernel does not transcribe goes through the library, for that window only, with the
same result: an image at another lgK (a fold), HLL_4/HLL_6 HLL-mode images, anything
malformed (the library then raises as before), and the composite estimate of an out-of-order
HLL result (its interpolation table is 18 x 257 constants); ``tests/sketches/test_hll_unions.py``
compares every path with the library's bytes and estimates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa
from numba.typed import List as TypedList

from streamgauge.sketches import kernels
from streamgauge.sketches.digest_columns import binary_parts
from streamgauge.sketches.hll import MAX_LG_K, MIN_LG_K, estimate, serialize_hll, union_hll
from streamgauge.sketches.kernels import jit as _jit

__all__ = ["HllUnions", "ImageRows", "union_images", "union_rows"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_F = TypeVar("_F", bound=Callable[..., Any])

# Image layout (DataSketches HllUtil.hpp, hll_constants).
_LIST, _SET, _HLL = 0, 1, 2
_HLL_8 = 2
_LIST_PREINTS, _SET_PREINTS, _HLL_PREINTS = 2, 3, 10
_EMPTY_FLAG, _COMPACT_FLAG, _OOO_FLAG, _FULL_SIZE_FLAG = 4, 8, 16, 32
_LIST_START, _SET_START, _HLL_START = 8, 12, 40
_KEY_MASK_26 = (1 << 26) - 1
_LG_INIT_LIST, _LG_INIT_SET = 3, 5

# Coupon-mode estimate: CubicInterpolation-internal.hpp's xArrComputed / yArrComputed.
_COUPON_X = np.array([
    0.0, 1.0, 20.0, 400.0, 8000.0, 160000.0, 300000.0, 600000.0, 900000.0, 1200000.0,
    1500000.0, 1800000.0, 2100000.0, 2400000.0, 2700000.0, 3000000.0, 3300000.0, 3600000.0,
    3900000.0, 4200000.0, 4500000.0, 4800000.0, 5100000.0, 5400000.0, 5700000.0, 6000000.0,
    6300000.0, 6600000.0, 6900000.0, 7200000.0, 7500000.0, 7800000.0, 8100000.0, 8400000.0,
    8700000.0, 9000000.0, 9300000.0, 9600000.0, 9900000.0, 10200000.0,
])  # fmt: skip
_COUPON_Y = np.array([
    0.0000000000000000, 1.0000000000000000, 20.0000009437402611, 400.0003963713384110,
    8000.1589294602090376, 160063.6067763759638183, 300223.7071597663452849,
    600895.5933856170158833, 902016.8065120954997838, 1203588.4983199508860707,
    1505611.8245524743106216, 1808087.9449319066479802, 2111018.0231759352609515,
    2414403.2270142501220107, 2718244.7282051891088486, 3022543.7025524540804327,
    3327301.3299219091422856, 3632518.7942584538832307, 3938197.2836029687896371,
    4244337.9901093561202288, 4550942.1100616492331028, 4858010.8438911894336343,
    5165545.3961938973516226, 5473546.9757476449012756, 5782016.7955296505242586,
    6090956.0727340159937739, 6400366.0287892958149314, 6710247.8893762007355690,
    7020602.8844453142955899, 7331432.2482349723577499, 7642737.2192891482263803,
    7954519.0404754765331745, 8266778.9590033423155546, 8579518.2264420464634895,
    8892738.0987390466034412, 9206439.8362383283674717, 9520624.7036988288164139,
    9835293.9703129194676876, 10150448.9097250290215015, 10466090.8000503256917000,
])  # fmt: skip

# Gadget state: ints and floats, mutated in place by the kernel's helpers.
_MODE, _LG_ARR, _COUNT, _OOO, _CUR_MIN, _NUM_AT_CUR_MIN, _REBUILD, _FULL_SIZE, _DIRTY = range(9)
"""``_DIRTY``: how many leading slots of the coupon table may be non-zero (cleared per owner)."""
_HIP, _KXQ0, _KXQ1 = range(3)

# What became of each owner.
_DONE = 0
_LIBRARY = 1  # an input the kernel does not transcribe: the whole window through the library
_COMPOSITE = 2  # the bytes are the kernel's; the estimate is the library's composite one
_NONE = 3  # no image: NULL


def _inlined(function: _F) -> _F:
    """``kernels.jit``, inlined into its callers: a call passing arrays costs reference counting
    per array, which at a call per coupon was most of the kernel's time."""
    return cast(_F, numba.njit(cache=True, nogil=True, inline="always")(function))


@dataclass(frozen=True)
class ImageRows:
    """Rows ``rows`` of the binary column ``images`` (HLL images), row ``rows[i]`` going to
    owner ``owner[i]``."""

    images: pa.Array
    rows: IntArray
    owner: IntArray


@dataclass(frozen=True)
class HllUnions:
    """Per owner: the union's compact image (NULL: the owner had no image) and the estimate
    DataSketches reads from it (NaN where NULL)."""

    images: pa.Array
    estimates: FloatArray

    @classmethod
    def none(cls, n: int) -> HllUnions:
        """``n`` owners without a set."""
        return cls(pa.nulls(n, pa.binary()), np.full(n, np.nan))


@_jit
def _cubic(x0: Any, y0: Any, x1: Any, y1: Any, x2: Any, y2: Any, x3: Any, y3: Any,
           x: Any) -> Any:  # fmt: skip
    l0_numer = (x - x1) * (x - x2) * (x - x3)
    l1_numer = (x - x0) * (x - x2) * (x - x3)
    l2_numer = (x - x0) * (x - x1) * (x - x3)
    l3_numer = (x - x0) * (x - x1) * (x - x2)
    l0_denom = (x0 - x1) * (x0 - x2) * (x0 - x3)
    l1_denom = (x1 - x0) * (x1 - x2) * (x1 - x3)
    l2_denom = (x2 - x0) * (x2 - x1) * (x2 - x3)
    l3_denom = (x3 - x0) * (x3 - x1) * (x3 - x2)
    term0 = y0 * l0_numer / l0_denom
    term1 = y1 * l1_numer / l1_denom
    term2 = y2 * l2_numer / l2_denom
    term3 = y3 * l3_numer / l3_denom
    return term0 + term1 + term2 + term3


@_jit
def _coupon_estimate(count: Any, xs: Any, ys: Any) -> Any:
    """``CouponList::getEstimate``: the coupon count through the cubic table, at least it."""
    x = float(count)
    n = len(xs)
    if x == xs[n - 1]:
        est = ys[n - 1]
    else:
        lo = 0
        hi = n - 1
        while lo + 1 != hi:  # recursiveFindStraddle
            m = lo + (hi - lo) // 2
            if xs[m] <= x:
                lo = m
            else:
                hi = m
        offset = lo
        if offset == 0:
            o = 0
        elif offset == n - 2:
            o = offset - 2
        else:
            o = offset - 1
        est = _cubic(xs[o], ys[o], xs[o + 1], ys[o + 1], xs[o + 2], ys[o + 2], xs[o + 3],
                     ys[o + 3], x)  # fmt: skip
    return max(est, x)


@_inlined
def _u32(data: Any, p: Any) -> Any:
    return (np.int64(data[p]) | np.int64(data[p + 1]) << 8 | np.int64(data[p + 2]) << 16
            | np.int64(data[p + 3]) << 24)  # fmt: skip


@_jit
def _f64(data: Any, p: Any) -> Any:
    word = np.zeros(1, np.uint64)
    for b in range(8):
        word[0] |= np.uint64(data[p + b]) << np.uint64(8 * b)
    return word.view(np.float64)[0]


@_jit
def _put_u32(out: Any, p: Any, value: Any) -> None:
    for b in range(4):
        out[p + b] = (value >> (8 * b)) & 0xFF


@_jit
def _put_f64(out: Any, p: Any, value: Any) -> None:
    word = np.zeros(1, np.float64)
    word[0] = value
    raw = word.view(np.uint8)
    for b in range(8):
        out[p + b] = raw[b]


@_inlined
def _find(table: Any, lg_arr: Any, coupon: Any) -> Any:
    """CouponHashSet's ``find``: the slot holding ``coupon``, or ``~slot`` of the empty one
    its probe sequence reaches first."""
    mask = (1 << lg_arr) - 1
    probe = coupon & mask
    start = probe
    while True:
        at = table[probe]
        if at == 0:
            return ~probe
        if at == coupon:
            return probe
        probe = (probe + (((coupon & _KEY_MASK_26) >> lg_arr) | 1)) & mask
        if probe == start:
            return -(1 << 40)  # full: a table the library would not have built


@_inlined
def _set_insert(table: Any, st: Any, coupon: Any, max_lg_arr: Any) -> Any:
    """A coupon into a SET (``st``'s table): 1 inserted, 0 a duplicate, 2 the set must
    promote to HLL (inserted, at its largest size), -1 a table the library cannot have."""
    index = _find(table, st[_LG_ARR], coupon)
    if index == -(1 << 40):
        return -1
    if index >= 0:
        return 0
    table[~index] = coupon
    st[_COUNT] += 1
    size = 1 << st[_LG_ARR]
    st[_DIRTY] = max(st[_DIRTY], size)
    if 4 * st[_COUNT] > 3 * size:
        if st[_LG_ARR] == max_lg_arr:
            return 2
        grown = np.zeros(2 * size, np.int64)
        for i in range(size):
            if table[i] != 0:
                found = _find(grown, st[_LG_ARR] + 1, table[i])
                grown[~found] = table[i]
        st[_LG_ARR] += 1
        table[: 2 * size] = grown
        st[_DIRTY] = max(st[_DIRTY], 2 * size)
    return 1


@_inlined
def _hll_coupon(registers: Any, st: Any, fs: Any, coupon: Any, k: Any) -> None:
    """``Hll8Array::internalCouponUpdate`` with ``hipAndKxQIncrementalUpdate``."""
    slot = (coupon & _KEY_MASK_26) & (k - 1)
    new = coupon >> 26
    cur = np.int64(registers[slot])
    if new > cur:
        registers[slot] = new
        if not st[_OOO]:
            fs[_HIP] += float(k) / (fs[_KXQ0] + fs[_KXQ1])
        if cur < 32:
            fs[_KXQ0] -= 2.0 ** -cur
        else:
            fs[_KXQ1] -= 2.0 ** -cur
        if new < 32:
            fs[_KXQ0] += 2.0 ** -new
        else:
            fs[_KXQ1] += 2.0 ** -new
        if cur == 0:
            st[_NUM_AT_CUR_MIN] -= 1


@_jit
def _promote_to_hll(table: Any, registers: Any, st: Any, fs: Any, k: Any, xs: Any,
                    ys: Any) -> None:  # fmt: skip
    """``promoteListOrSetToHll``: the gadget's coupons, in table order, into new registers;
    the HIP accumulator then takes the coupon estimate."""
    size = 1 << st[_LG_ARR]
    hip = _coupon_estimate(st[_COUNT], xs, ys)
    registers[:] = 0
    st[_MODE] = _HLL
    st[_OOO] = 0
    st[_CUR_MIN] = 0
    st[_NUM_AT_CUR_MIN] = k
    st[_REBUILD] = 0
    st[_FULL_SIZE] = 0
    fs[_HIP] = 0.0
    fs[_KXQ0] = float(k)
    fs[_KXQ1] = 0.0
    for i in range(size):
        if table[i] != 0:
            _hll_coupon(registers, st, fs, table[i], k)
    fs[_HIP] = hip


@_inlined
def _coupon_update(table: Any, registers: Any, st: Any, fs: Any, coupon: Any, lg_k: Any,
                   xs: Any, ys: Any) -> Any:  # fmt: skip
    """The gadget's ``couponUpdate`` in whatever mode it is; False: a state the library
    cannot reach."""
    k = 1 << lg_k
    if st[_MODE] == _HLL:
        _hll_coupon(registers, st, fs, coupon, k)
        return True
    if st[_MODE] == _LIST:
        for i in range(1 << _LG_INIT_LIST):
            if table[i] == 0:
                table[i] = coupon
                st[_COUNT] += 1
                st[_DIRTY] = max(st[_DIRTY], 1 << _LG_INIT_LIST)
                if st[_COUNT] == 1 << _LG_INIT_LIST:
                    if lg_k < 8:
                        _promote_to_hll(table, registers, st, fs, k, xs, ys)
                        return True
                    listed = table[: 1 << _LG_INIT_LIST].copy()
                    table[: 1 << _LG_INIT_LIST] = 0
                    st[_MODE] = _SET
                    st[_LG_ARR] = _LG_INIT_SET
                    st[_COUNT] = 0
                    st[_OOO] = 0
                    for c in listed:
                        if _set_insert(table, st, c, lg_k - 3) < 0:
                            return False
                return True
            if table[i] == coupon:
                return True
        return False
    inserted = _set_insert(table, st, coupon, lg_k - 3)
    if inserted == 2:
        _promote_to_hll(table, registers, st, fs, k, xs, ys)
    return inserted >= 0


@_jit
def _source_coupons(data: Any, s: Any, size: Any, lg_k: Any, source: Any, sst: Any) -> Any:
    """A LIST/SET image's coupons as the library holds them once deserialized: ``source``
    (its array or hash table, ``2^sst[_LG_ARR]`` slots) and ``sst``'s count and flags.
    False: an image the kernel leaves to the library."""
    flags = data[s + 5]
    mode = data[s + 7] & 3
    compact = (flags & _COMPACT_FLAG) != 0
    empty = (flags & _EMPTY_FLAG) != 0
    source[: sst[_DIRTY]] = 0
    sst[_DIRTY] = 0
    sst[_MODE] = mode
    sst[_OOO] = 1 if flags & _OOO_FLAG else 0
    sst[_COUNT] = 0
    if mode == _LIST:
        if data[s] != _LIST_PREINTS:
            return False
        count = np.int64(data[s + 6])
        in_array = count if compact else 1 << _LG_INIT_LIST
        if count >= 1 << _LG_INIT_LIST or size < _LIST_START + 4 * in_array:
            return False
        if empty:
            return count == 0
        sst[_LG_ARR] = _LG_INIT_LIST
        for c in range(count):
            coupon = _u32(data, s + _LIST_START + 4 * c)
            if coupon == 0:
                return False
            source[c] = coupon
        sst[_COUNT] = count
        sst[_DIRTY] = 1 << _LG_INIT_LIST
        return True
    if data[s] != _SET_PREINTS or lg_k <= 7 or size < _SET_START:
        return False
    count = _u32(data, s + 8)
    if empty:
        return count == 0
    if compact:
        if size < _SET_START + 4 * count:
            return False
        sst[_LG_ARR] = _LG_INIT_SET
        for c in range(count):
            coupon = _u32(data, s + _SET_START + 4 * c)
            if coupon == 0 or _set_insert(source, sst, coupon, lg_k - 3) != 1:
                return False
        return True
    lg_arr = np.int64(data[s + 4])
    if lg_arr < _LG_INIT_SET:  # computeLgArrInts(SET, count, lgK)
        ceiling = 1
        while ceiling < count:
            ceiling *= 2
        if 4 * count > 3 * ceiling:
            ceiling *= 2
        lg_arr = np.int64(_LG_INIT_SET)
        while (1 << lg_arr) < ceiling:
            lg_arr += 1
    if lg_arr > lg_k - 3 or size < _SET_START + 4 * (1 << lg_arr):
        return False
    found = 0
    sst[_DIRTY] = 1 << lg_arr
    for c in range(1 << lg_arr):
        coupon = _u32(data, s + _SET_START + 4 * c)
        source[c] = coupon
        found += coupon != 0
    if found != count:
        return False
    sst[_LG_ARR] = lg_arr
    sst[_COUNT] = count
    return True


@_jit
def _union_one(datas: Any, bufs: Any, starts: Any, lengths: Any, lg_k: Any, table: Any,
               registers: Any, source: Any, st: Any, fs: Any, sst: Any, xs: Any,
               ys: Any) -> Any:  # fmt: skip
    """One owner's images (``datas[bufs[i]][starts[i]:][:lengths[i]]``, in order) into the
    gadget; False: an input the kernel leaves to the library."""
    k = 1 << lg_k
    table[: st[_DIRTY]] = 0
    st[:] = 0
    fs[:] = 0.0
    st[_MODE] = _LIST
    st[_LG_ARR] = _LG_INIT_LIST
    for i in range(len(starts)):
        data = datas[bufs[i]]
        s = starts[i]
        size = lengths[i]
        if size < 8 or data[s + 1] != 1 or data[s + 2] != 7 or np.int64(data[s + 3]) != lg_k:
            return False
        mode = data[s + 7] & 3
        if mode < _HLL:  # LIST or SET
            if not _source_coupons(data, s, size, lg_k, source, sst):
                return False
            if sst[_COUNT] == 0:
                continue  # an empty sketch: the union skips it
            if st[_MODE] != _HLL and st[_COUNT] == 0:
                # copyAs(HLL_8) of the input: its array or table as it is
                extent = sst[_DIRTY]
                table[: st[_DIRTY]] = 0
                table[:extent] = source[:extent]
                st[_DIRTY] = extent
                st[_MODE] = sst[_MODE]
                st[_LG_ARR] = sst[_LG_ARR]
                st[_COUNT] = sst[_COUNT]
                st[_OOO] = sst[_OOO]
                continue
            for c in range(1 << sst[_LG_ARR]):
                if source[c] != 0 and not _coupon_update(table, registers, st, fs, source[c],
                                                         lg_k, xs, ys):  # fmt: skip
                    return False
            continue
        tgt_type = (data[s + 7] >> 2) & 3
        if (mode != _HLL or data[s] != _HLL_PREINTS or tgt_type != _HLL_8
                or size < _HLL_START + k or _u32(data, s + 36) != 0):  # fmt: skip
            return False
        body = data[s + _HLL_START : s + _HLL_START + k]
        if body.max() > 63:
            return False
        flags = data[s + 5]
        ooo = (flags & _OOO_FLAG) != 0
        cur_min = np.int64(data[s + 6])
        num_at_cur_min = _u32(data, s + 32)
        if cur_min == 0 and num_at_cur_min == k:
            continue  # an empty sketch
        if st[_MODE] == _HLL:  # mergeHll
            for j in range(k):
                if body[j] > registers[j]:
                    registers[j] = body[j]
            st[_OOO] = 1
            st[_REBUILD] = 1
            fs[_HIP] = 0.0
            continue
        gadget_count = st[_COUNT]
        held = table[: 1 << st[_LG_ARR]].copy()
        # copy of the input (HllArray::newHll: the HIP accumulator only when in order)
        registers[:] = body
        st[_MODE] = _HLL
        st[_OOO] = 1 if ooo else 0
        st[_CUR_MIN] = cur_min
        st[_NUM_AT_CUR_MIN] = num_at_cur_min
        st[_REBUILD] = 0
        st[_FULL_SIZE] = 1 if flags & _FULL_SIZE_FLAG else 0
        fs[_HIP] = 0.0 if ooo else _f64(data, s + 8)
        fs[_KXQ0] = _f64(data, s + 16)
        fs[_KXQ1] = _f64(data, s + 24)
        if gadget_count:  # mergeList: the gadget's coupons into the copy
            for c in held:
                if c != 0:
                    _hll_coupon(registers, st, fs, c, k)
    return True


@_jit
def _bound(datas: Any, bufs: Any, starts: Any, lengths: Any, lg_k: Any) -> Any:
    """Bytes enough for one owner's result: its coupons as a SET, or an HLL_8 image if they
    are enough to promote it (or an input is in HLL mode)."""
    k = 1 << lg_k
    coupons = 0
    for i in range(len(starts)):
        if lengths[i] < 8 or datas[bufs[i]][starts[i] + 7] & 3 == _HLL:
            return _HLL_START + k
        coupons += (lengths[i] - _LIST_START) // 4
    promotes = coupons >= 8 if lg_k < 8 else 4 * coupons > 3 << (lg_k - 3)
    return max(_HLL_START + k, _SET_START + 4 * coupons) if promotes else _SET_START + 4 * coupons


@_jit
def _write(out: Any, p: Any, table: Any, registers: Any, st: Any, fs: Any, lg_k: Any,
           xs: Any, ys: Any) -> Any:  # fmt: skip
    """The gadget's ``get_result(HLL_8).serialize_compact()`` at ``out[p:]``: (its length,
    its estimate; NaN for the composite estimate, left to the library)."""
    k = 1 << lg_k
    mode = st[_MODE]
    out[p + 1] = 1
    out[p + 2] = 7
    out[p + 3] = lg_k
    out[p + 7] = mode | (_HLL_8 << 2)
    if mode != _HLL:
        count = st[_COUNT]
        flags = _COMPACT_FLAG | (_EMPTY_FLAG if count == 0 else 0) | (_OOO_FLAG if st[_OOO] else 0)
        out[p + 4] = st[_LG_ARR]
        out[p + 5] = flags
        start = _LIST_START
        if mode == _LIST:
            out[p] = _LIST_PREINTS
            out[p + 6] = count
        else:
            out[p] = _SET_PREINTS
            out[p + 6] = 0
            _put_u32(out, p + 8, count)
            start = _SET_START
        q = p + start
        for c in range(1 << st[_LG_ARR]):
            if table[c] != 0:
                _put_u32(out, q, table[c])
                q += 4
        return q - p, _coupon_estimate(count, xs, ys)
    if st[_REBUILD]:  # convertToHll8: kxq rebuilt in slot order, zeros counted
        fs[_KXQ0] = float(k)
        fs[_KXQ1] = 0.0
        zeros = k
        for j in range(k):
            v = np.int64(registers[j])
            if v > 0:
                zeros -= 1
                fs[_KXQ0] -= 1.0
                if v < 32:
                    fs[_KXQ0] += 2.0 ** -v
                else:
                    fs[_KXQ1] += 2.0 ** -v
        st[_CUR_MIN] = 0
        st[_NUM_AT_CUR_MIN] = zeros
    empty = st[_CUR_MIN] == 0 and st[_NUM_AT_CUR_MIN] == k
    out[p] = _HLL_PREINTS
    out[p + 4] = 0
    out[p + 5] = (_COMPACT_FLAG | (_EMPTY_FLAG if empty else 0) | (_OOO_FLAG if st[_OOO] else 0)
                  | (_FULL_SIZE_FLAG if st[_FULL_SIZE] else 0))  # fmt: skip
    out[p + 6] = st[_CUR_MIN]
    _put_f64(out, p + 8, fs[_HIP])
    _put_f64(out, p + 16, fs[_KXQ0])
    _put_f64(out, p + 24, fs[_KXQ1])
    _put_u32(out, p + 32, st[_NUM_AT_CUR_MIN])
    _put_u32(out, p + 36, 0)
    out[p + _HLL_START : p + _HLL_START + k] = registers
    return _HLL_START + k, np.nan if st[_OOO] else fs[_HIP]


@_jit
def _union_all(datas: Any, bufs: Any, starts: Any, lengths: Any, bounds: Any, lg_k: Any,
               xs: Any, ys: Any) -> Any:  # fmt: skip
    """Every owner's union: owner ``g``'s images are those ``bounds[g]:bounds[g+1]`` of
    ``bufs/starts/lengths`` (in the arrays of ``datas``). Returns the output bytes, n + 1
    offsets into them, estimates and a status per owner."""
    n = len(bounds) - 1
    k = 1 << lg_k
    capacity = np.zeros(n + 1, np.int64)
    for g in range(n):
        lo, hi = bounds[g], bounds[g + 1]
        capacity[g + 1] = capacity[g] + (
            _bound(datas, bufs[lo:hi], starts[lo:hi], lengths[lo:hi], lg_k) if hi > lo else 0)
    out = np.zeros(capacity[n], np.uint8)
    offsets = np.zeros(n + 1, np.int64)
    estimates = np.full(n, np.nan)
    status = np.full(n, _DONE, np.int64)
    slots = max(1 << max(lg_k - 3, _LG_INIT_SET), 1 << _LG_INIT_LIST)
    table = np.zeros(slots, np.int64)
    source = np.zeros(slots, np.int64)
    registers = np.zeros(k, np.uint8)
    st = np.zeros(9, np.int64)
    sst = np.zeros(9, np.int64)
    fs = np.zeros(3)
    p = 0
    for g in range(n):
        lo, hi = bounds[g], bounds[g + 1]
        if hi == lo:
            status[g] = _NONE
        elif not _union_one(datas, bufs[lo:hi], starts[lo:hi], lengths[lo:hi], lg_k, table,
                            registers, source, st, fs, sst, xs, ys):  # fmt: skip
            status[g] = _LIBRARY
        else:
            length, est = _write(out, p, table, registers, st, fs, lg_k, xs, ys)
            p += length
            estimates[g] = est
            if np.isnan(est):
                status[g] = _COMPOSITE
        offsets[g + 1] = p
    return out[:p], offsets, estimates, status


def union_images(images: pa.Array, owner: npt.ArrayLike, n_owners: int, lg_k: int) -> HllUnions:
    """Per owner ``0 .. n_owners - 1``, what ``hll_union(lg_k)`` makes of the images ``i``
    with ``owner[i]`` equal to it, in their order here: :func:`union_rows` of one array."""
    rows = np.arange(len(images), dtype=np.int64)
    return union_rows([ImageRows(images, rows, np.asarray(owner, np.int64))], n_owners, lg_k)


def union_rows(parts: Sequence[ImageRows], n_owners: int, lg_k: int) -> HllUnions:
    """Per owner ``0 .. n_owners - 1``, what ``hll_union(lg_k)`` makes of the images going to
    it, in the order of ``parts`` and of their rows (NULL images skipped, as
    ``window_sketches.merge_hll`` skips them): the compact image and DataSketches' estimate
    of it. The images are read where they are (no copy into one array). Raises
    ``ValueError`` as ``hll.deserialize_hll`` does for an image that is not one."""
    if not MIN_LG_K <= lg_k <= MAX_LG_K:
        raise ValueError(f"lg_k={lg_k} is outside {MIN_LG_K}..{MAX_LG_K}")
    datas: Any = TypedList()
    columns: dict[str, list[IntArray]] = {"buf": [], "row": [], "start": [], "length": [],
                                          "owner": []}  # fmt: skip
    for buf, part in enumerate(parts):
        rows = np.asarray(part.rows, np.int64)
        owners = np.asarray(part.owner, np.int64)
        if owners.shape != rows.shape:
            raise ValueError(f"owner has shape {owners.shape}, expected {rows.shape}")
        if owners.size and (owners.min() < 0 or owners.max() >= n_owners):
            raise ValueError(f"owners must be in 0..{n_owners - 1}")
        images = part.images
        if isinstance(images, pa.ChunkedArray):
            images = images.combine_chunks()
        data, offsets, valid, _ = binary_parts(images)
        kept = valid[rows]
        rows, owners = rows[kept], owners[kept]
        data = data.view()
        data.flags.writeable = False  # one array type for the kernel, whatever Arrow gave
        datas.append(data)
        for name, values in (("buf", np.full(rows.size, buf, np.int64)), ("row", rows),
                             ("start", offsets[rows]),
                             ("length", offsets[rows + 1] - offsets[rows]),
                             ("owner", owners)):  # fmt: skip
            columns[name].append(values)
    if not parts or not sum(len(o) for o in columns["owner"]):
        return HllUnions.none(n_owners)
    owner = np.concatenate(columns["owner"])
    order = np.argsort(owner, kind="stable")
    bufs, rows, starts, lengths = (np.concatenate(columns[name])[order]
                                   for name in ("buf", "row", "start", "length"))  # fmt: skip
    bounds = np.searchsorted(owner[order], np.arange(n_owners + 1), side="left")
    # Owners in chunks of about equal bytes, one kernel call each on the kernels' threads.
    read = np.concatenate([[0], np.cumsum(lengths)])[bounds]
    chunks = kernels.chunk_bounds(read)
    chunks = np.array([0, n_owners]) if chunks is None else chunks

    def union_chunk(c: int) -> tuple[Any, ...]:
        lo, hi = bounds[chunks[c]], bounds[chunks[c + 1]]
        return cast(tuple[Any, ...], _union_all(
            datas, bufs[lo:hi], starts[lo:hi], lengths[lo:hi],
            bounds[chunks[c] : chunks[c + 1] + 1] - lo, lg_k, _COUPON_X, _COUPON_Y,
        ))  # fmt: skip

    parts_out = kernels.run_chunks(union_chunk, len(chunks) - 1)
    out = np.concatenate([part[0] for part in parts_out])
    ends = np.cumsum([0] + [len(part[0]) for part in parts_out])
    out_offsets = np.concatenate(
        [[0]] + [part[1][1:] + end for part, end in zip(parts_out, ends[:-1], strict=True)])
    estimates = np.concatenate([part[2] for part in parts_out])
    status = np.concatenate([part[3] for part in parts_out])
    wide = len(out) >= 2**31  # an Arrow binary array holds at most 2 GiB
    result = pa.Array.from_buffers(
        pa.large_binary() if wide else pa.binary(), n_owners,
        [pa.py_buffer(np.packbits(status != _NONE, bitorder="little")),
         pa.py_buffer(out_offsets if wide else out_offsets.astype(np.int32)),
         pa.py_buffer(out)],
    )  # fmt: skip
    estimates = np.asarray(estimates, np.float64)
    by_library = np.flatnonzero(status == _LIBRARY)
    if by_library.size:  # their images replace the kernel's NULLs
        made = pa.array([
            serialize_hll(union_hll([parts[b].images[r].as_py() for b, r in zip(
                bufs[bounds[g]:bounds[g + 1]].tolist(), rows[bounds[g]:bounds[g + 1]].tolist(),
                strict=True)], lg_k))
            for g in by_library.tolist()
        ], result.type)  # fmt: skip
        at = np.arange(n_owners)
        at[by_library] = n_owners + np.arange(by_library.size)
        result = pa.concat_arrays([result, made]).take(pa.array(at))
    for g in np.flatnonzero((status == _LIBRARY) | (status == _COMPOSITE)).tolist():
        estimates[g] = estimate(cast(bytes, result[g].as_py())).estimate
    return HllUnions(result, estimates)
