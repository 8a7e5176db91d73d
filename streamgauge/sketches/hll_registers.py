"""Dense HLL register arrays from DataSketches HLL images, and Ertl's estimator over them.

PostgreSQL has no HLL type, so the store keeps beside every set window's DataSketches image
(``window_results.sketch``) its **register array**: 2^lgK bytes, register ``i`` the largest
value any member hashed to slot ``i`` produced (0: none). Register arrays union by per-byte
max (SQL ``streamgauge_hll_union``) and are estimated from the histogram of their values (SQL
``streamgauge_hll_estimate``). :func:`hll_registers` builds the array; :func:`estimate_registers`
is the estimator the SQL implements, in numpy, so tests compare the two.

How DataSketches fills registers (``HllUtil::coupon``, the same in the Java library Spark uses)::

    hash = murmur3_128(member, seed 9001)            two 64-bit words h0, h1
    slot  = h0 & (2^lgK - 1)                         (a "coupon" keeps 26 bits: h0 & 0x3FFFFFF)
    value = min(nlz(h1), 62) + 1                     1..63
    coupon = value << 26 | (h0 & 0x3FFFFFF)          what LIST and SET modes store

The slot and the value come from *different* hash words, so the value's distribution does not
depend on lgK: P(value = k) = 2^-k for k <= 62 and P(value = 63) = 2^-62. In Ertl's notation
that is q = 62 for every lgK (not the q = 64 - p of an HLL that splits one 64-bit hash). It also
makes lowering lgK exact: the register of slot ``j`` at lgK' < lgK is the max of the registers of
slots ``j, j + 2^lgK', ...`` (:func:`fold_registers`), which is what DataSketches' union does.

Images (``preInts`` byte 0, ``lgK`` byte 3, flags byte 5, list count byte 6, mode byte 7: bits
0-1 the current mode LIST/SET/HLL, bits 2-3 the target type HLL_4/6/8):

- LIST (preInts 2) and SET (preInts 3) hold coupons (uint32 little-endian) after the preamble,
  compact (only the coupons) or updatable (a hash table, empty slots 0): decoded here.
- HLL mode, HLL_8 (preInts 10): the 2^lgK registers are bytes 40.. of the image, compact or
  updatable alike.
- HLL mode, HLL_4 or HLL_6: converted by the library itself (``hll_union`` → ``HLL_8``), which
  resolves HLL_4's offset registers and its exception table; the registers are then read as
  above.

**Estimator.** Otmar Ertl, "New cardinality estimation algorithms for HyperLogLog sketches"
(2017), the improved raw estimator (his eq. for ``n̂``, algorithm 6): with ``C[k]`` the number of
registers equal to ``k`` and m = 2^lgK,

    z = m·τ(1 − C[q+1]/m);  for k = q .. 1: z = (z + C[k]) / 2;  z += m·σ(C[0]/m)
    n̂ = α∞·m² / z,  α∞ = 1 / (2 ln 2)

σ and τ are series summed until they stop changing in float64. No empirical bias tables: it is
unbiased from 0 to far beyond 2^40 members and its RSE is ≈ 1.04/√m, the same as the composite
estimator DataSketches gives a union (and worse than the 0.83/√m of a single-stream sketch's HIP
estimate, which no union has). For small counts it behaves like linear counting: essentially
exact while members rarely share a slot.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from datasketches import hll_sketch, hll_union, tgt_hll_type

__all__ = [
    "Q",
    "MAX_REGISTER",
    "estimate_registers",
    "fold_registers",
    "hll_registers",
    "register_histogram",
]

Q = 62
"""Ertl's q for DataSketches: register values are 0..q+1 = 0..63 whatever the lgK."""

MAX_REGISTER = Q + 1

Registers = np.ndarray[Any, np.dtype[np.uint8]]

_LIST, _SET, _HLL = 0, 1, 2
_HLL_4, _HLL_6, _HLL_8 = 0, 1, 2
_EMPTY_FLAG = 4
_HLL_PREAMBLE_BYTES = 40
_KEY_MASK_26 = (1 << 26) - 1
_MIN_LG_K, _MAX_LG_K = 4, 21


def _refuse(blob: bytes, reason: str) -> ValueError:
    return ValueError(f"not a DataSketches HLL image ({len(blob)} bytes): {reason}")


def hll_registers(blob: bytes | bytearray | memoryview) -> Registers:
    """The 2^lgK registers of a serialized DataSketches HLL sketch (uint8, a fresh array).

    Any image DataSketches writes: LIST, SET or HLL mode; HLL_4, HLL_6 or HLL_8; compact or
    updatable (Spark's ``hll_sketch_agg`` / ``hll_union_agg`` and Python's ``datasketches``
    alike). An empty sketch gives all zeros. Raises ``ValueError`` on anything else.
    """
    data = bytes(blob)
    if len(data) < 8:
        raise _refuse(data, "shorter than the 8-byte preamble")
    pre_ints, ser_ver, family, lg_k, _lg_arr, flags, list_count, mode_byte = data[:8]
    if family != 7 or ser_ver != 1:
        raise _refuse(data, f"family {family} / serial version {ser_ver}, expected 7 / 1")
    if not _MIN_LG_K <= lg_k <= _MAX_LG_K:
        raise _refuse(data, f"lgK {lg_k} outside {_MIN_LG_K}..{_MAX_LG_K}")
    k = 1 << lg_k
    mode, tgt_type = mode_byte & 3, (mode_byte >> 2) & 3
    registers = np.zeros(k, dtype=np.uint8)
    if flags & _EMPTY_FLAG:
        return registers
    if mode in (_LIST, _SET):
        if mode == _LIST:
            start, count = 8, list_count
        else:
            start, count = 12, int.from_bytes(data[8:12], "little")
        # Compact images hold `count` coupons; updatable ones the whole table, 0 = empty slot.
        body = data[start:]
        if len(body) % 4 or len(body) // 4 < count:
            raise _refuse(data, f"{count} coupons announced, {len(body)} bytes of them")
        coupons = np.frombuffer(body, dtype="<u4")
        coupons = coupons[coupons != 0]
        if len(coupons) != count:
            raise _refuse(data, f"{count} coupons announced, {len(coupons)} found")
        values = (coupons >> 26).astype(np.uint8)
        if values.size and (values.min() < 1 or values.max() > MAX_REGISTER):
            raise _refuse(data, "a coupon value outside 1..63")
        np.maximum.at(registers, (coupons & _KEY_MASK_26) & (k - 1), values)
        return registers
    if mode != _HLL or pre_ints != 10:
        raise _refuse(data, f"mode {mode} with {pre_ints} preamble ints")
    if tgt_type != _HLL_8:
        data = _as_hll_8(data, lg_k)
    body = data[_HLL_PREAMBLE_BYTES : _HLL_PREAMBLE_BYTES + k]
    if len(body) != k:
        raise _refuse(data, f"HLL_8 body of {len(body)} bytes, expected {k}")
    registers[:] = np.frombuffer(body, dtype=np.uint8)
    if registers.max() > MAX_REGISTER:
        raise _refuse(data, "a register above 63")
    return registers


def _as_hll_8(data: bytes, lg_k: int) -> bytes:
    """The HLL_8 image of an HLL_4/HLL_6 HLL-mode image, converted by DataSketches."""
    try:
        sketch = hll_sketch.deserialize(data)
    except (RuntimeError, ValueError) as exc:
        raise _refuse(data, str(exc)) from exc
    union = hll_union(lg_k)
    union.update(sketch)
    converted = bytes(union.get_result(tgt_hll_type.HLL_8).serialize_updatable())
    if converted[7] & 3 != _HLL or (converted[7] >> 2) & 3 != _HLL_8:
        raise _refuse(data, "DataSketches did not convert it to an HLL_8 array")
    return converted


def fold_registers(registers: Registers, lg_k: int) -> Registers:
    """The registers at a smaller ``lg_k``: slot ``j`` takes the max of slots ``j mod 2^lg_k``.

    Exact (DataSketches' slot is the low lgK bits of the first hash word, the value comes from
    the second), and what ``hll_union(lg_k)`` does to a finer sketch.
    """
    k = 1 << lg_k
    if registers.size < k or registers.size % k:
        raise ValueError(f"cannot fold {registers.size} registers to 2^{lg_k}")
    folded: Registers = registers.reshape(-1, k).max(axis=0)
    return folded


def register_histogram(registers: Registers) -> np.ndarray[Any, np.dtype[np.int64]]:
    """``C[k]``: how many registers hold the value k, for k = 0..63."""
    counts: np.ndarray[Any, np.dtype[np.int64]] = np.bincount(
        registers, minlength=MAX_REGISTER + 1
    ).astype(np.int64)
    return counts


def _sigma(x: float) -> float:
    if x == 1.0:
        return math.inf
    y, z = 1.0, x
    while True:
        x *= x
        previous = z
        z += x * y
        y += y
        if z == previous:
            return z


def _tau(x: float) -> float:
    if x in (0.0, 1.0):
        return 0.0
    y, z = 1.0, 1.0 - x
    while True:
        x = math.sqrt(x)
        previous = z
        y *= 0.5
        z -= (1.0 - x) ** 2 * y
        if z == previous:
            return z / 3.0


def estimate_registers(registers: Registers) -> float:
    """Ertl's improved raw estimate of the number of distinct members (0.0 when empty)."""
    counts = register_histogram(registers)
    m = float(registers.size)
    if counts[0] == registers.size:
        return 0.0
    z = m * _tau(1.0 - counts[Q + 1] / m)
    for k in range(Q, 0, -1):
        z = 0.5 * (z + float(counts[k]))
    z += m * _sigma(counts[0] / m)
    return float(m * m / (2.0 * math.log(2.0)) / z)
