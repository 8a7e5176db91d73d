"""HLL register arrays of many DataSketches images, decoded in one compiled call per lgK.

The store keeps a set window's registers only where SQL cannot read them from the image
(``sinks/store._with_hll_registers``; ``docs/architecture.md`` D11): :func:`packed_hll_mode`
finds those images, :func:`own_registers` decodes them, and :func:`check_images` reads every
other image without keeping its registers, so a bad one is refused before any I/O. A window's
image and distinct count come from DataSketches' own union (``sketches/hll_unions.py``).

Decoding (:func:`from_images`) reads the images' bytes in numba: LIST and SET modes (coupons,
compact or updatable) and HLL_8 in HLL mode; the rare HLL_4/HLL_6 HLL-mode image goes through
``hll_registers`` (the library converts it). Every image must have ``lgK >= lg_k``, except
LIST/SET images, whose coupons keep 26 bits of slot and so place exactly at any ``lg_k``; a
finer image is folded to ``lg_k`` (slot ``j`` takes the max of slots ``j mod 2^lg_k``), as
``hll_union(lg_k)`` does. A coarser HLL-mode image cannot be refined: ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from streamgauge.sketches.digest_columns import binary_parts
from streamgauge.sketches.hll import MAX_LG_K, MIN_LG_K
from streamgauge.sketches.hll_registers import MAX_REGISTER, fold_registers, hll_registers

__all__ = ["HllColumns", "check_images", "from_images", "own_registers", "packed_hll_mode"]

Registers = npt.NDArray[np.uint8]
FloatArray = npt.NDArray[np.float64]

_F = TypeVar("_F", bound=Callable[..., Any])

_FAMILY = 7
_SERIAL_VERSION = 1
_EMPTY_FLAG = 4
_LIST, _SET, _HLL = 0, 1, 2
_HLL_8 = 2
_HLL_PREAMBLE_BYTES = 40
_KEY_MASK_26 = (1 << 26) - 1

# status per image
_OK = 0
_CONVERT = 1  # HLL_4 / HLL_6 in HLL mode: through the library
_BAD = 2
_COARSER = 3


def _jit(function: _F) -> _F:
    """numba's ``njit``, typed for mypy (numba ships no annotations)."""
    return cast(_F, numba.njit(cache=True, nogil=True)(function))


@dataclass(frozen=True, eq=False)
class HllColumns:
    """``n`` HLL register arrays at one ``lg_k``: row ``i`` of ``registers`` (uint8, shape
    ``(n, 2^lg_k)``) is series ``i``'s; an all-zero row is an empty set."""

    registers: Registers
    lg_k: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "registers", np.require(self.registers, np.uint8, ["C", "W"]))
        if not MIN_LG_K <= self.lg_k <= MAX_LG_K:
            raise ValueError(f"lg_k={self.lg_k} is outside {MIN_LG_K}..{MAX_LG_K}")
        if self.registers.ndim != 2 or self.registers.shape[1] != 1 << self.lg_k:
            raise ValueError(
                f"registers have shape {self.registers.shape}, expected (n, {1 << self.lg_k})"
            )

    def __len__(self) -> int:
        return int(self.registers.shape[0])

    @classmethod
    def empty(cls, n: int, lg_k: int) -> HllColumns:
        """``n`` empty sets."""
        return cls(np.zeros((n, 1 << lg_k), np.uint8), lg_k)


@_jit
def _decode(data: Any, starts: Any, lengths: Any, valid: Any, lg_k: Any, rows: Any,
            out: Any) -> Any:  # fmt: skip
    """Each valid image's registers maxed into ``out[rows[i]]``; a status per image."""
    n = len(starts)
    k = 1 << lg_k
    status = np.zeros(n, np.int64)
    for i in range(n):
        if not valid[i]:
            continue
        s = starts[i]
        size = lengths[i]
        if size < 8:
            status[i] = _BAD
            continue
        pre_ints = data[s]
        image_lg_k = np.int64(data[s + 3])
        flags = data[s + 5]
        mode = data[s + 7] & 3
        tgt_type = (data[s + 7] >> 2) & 3
        if data[s + 2] != _FAMILY or data[s + 1] != _SERIAL_VERSION:
            status[i] = _BAD
            continue
        if image_lg_k < MIN_LG_K or image_lg_k > MAX_LG_K:
            status[i] = _BAD
            continue
        if flags & _EMPTY_FLAG:
            continue
        if mode < _HLL:  # LIST or SET
            if mode == _LIST:
                start = 8
                count = np.int64(data[s + 6])
            else:
                if size < 12:
                    status[i] = _BAD
                    continue
                start = 12
                count = (np.int64(data[s + 8]) | np.int64(data[s + 9]) << 8
                         | np.int64(data[s + 10]) << 16 | np.int64(data[s + 11]) << 24)  # fmt: skip
            body = size - start
            if body % 4 or body // 4 < count:
                status[i] = _BAD
                continue
            found = 0
            for c in range(body // 4):
                p = s + start + 4 * c
                coupon = (np.int64(data[p]) | np.int64(data[p + 1]) << 8
                          | np.int64(data[p + 2]) << 16 | np.int64(data[p + 3]) << 24)  # fmt: skip
                if coupon == 0:
                    continue
                found += 1
                value = coupon >> 26
                if value < 1 or value > MAX_REGISTER:
                    status[i] = _BAD
                    break
                slot = (coupon & _KEY_MASK_26) & (k - 1)
                if value > out[rows[i], slot]:
                    out[rows[i], slot] = value
            if status[i] == _OK and found != count:
                status[i] = _BAD
            continue
        if mode != _HLL or pre_ints != 10:
            status[i] = _BAD
            continue
        if tgt_type != _HLL_8:
            status[i] = _CONVERT
            continue
        if image_lg_k < lg_k:
            status[i] = _COARSER
            continue
        image_k = 1 << image_lg_k
        if size < _HLL_PREAMBLE_BYTES + image_k:
            status[i] = _BAD
            continue
        # Branch-free byte maxes (vectorized by LLVM); a finer image folds block by block.
        row = out[rows[i]]
        largest = np.uint8(0)
        for block in range(image_k // k):
            image = data[s + _HLL_PREAMBLE_BYTES + block * k : s + _HLL_PREAMBLE_BYTES
                         + (block + 1) * k]  # fmt: skip
            for j in range(k):
                value = image[j]
                largest = max(largest, value)
                row[j] = max(row[j], value)
        if largest > MAX_REGISTER:
            status[i] = _BAD
    return status


def _decode_into(images: Any, lg_k: int, rows: npt.NDArray[np.int64], out: Registers) -> None:
    """Every image's registers maxed into ``out[rows[i]]`` (``out`` modified in place)."""
    if not MIN_LG_K <= lg_k <= MAX_LG_K:
        raise ValueError(f"lg_k={lg_k} is outside {MIN_LG_K}..{MAX_LG_K}")
    if isinstance(images, pa.ChunkedArray):
        images = images.combine_chunks() if images.num_chunks != 1 else images.chunk(0)
    data, offsets, valid, _ = binary_parts(images)
    data = data.view()
    data.flags.writeable = False  # one array type for the kernel, whatever Arrow handed over
    status = _decode(data, offsets[:-1], np.diff(offsets), valid, lg_k, rows, out)
    for row in np.flatnonzero(status == _CONVERT).tolist():
        converted = hll_registers(images[row].as_py())
        if converted.size < out.shape[1]:
            status[row] = _COARSER
            continue
        np.maximum(out[rows[row]], fold_registers(converted, lg_k), out=out[rows[row]])
        status[row] = _OK
    bad = np.flatnonzero(status)
    if bad.size:
        row = int(bad[0])
        reason = ("an HLL-mode image coarser than lgK " + str(lg_k) if status[row] == _COARSER
                  else "not a DataSketches HLL image")  # fmt: skip
        raise ValueError(f"{bad.size} HLL image(s) unusable; row {row}: {reason}")


def from_images(images: Any, lg_k: int) -> HllColumns:
    """Registers at ``lg_k`` of serialized DataSketches HLL images (``pa.BinaryArray``,
    ``LargeBinaryArray`` or ``ChunkedArray``; NULL: an empty set), one row per image. Raises
    ``ValueError`` naming the first image that is not valid or is coarser than ``lg_k`` in HLL
    mode."""
    registers = np.zeros((len(images), 1 << lg_k), np.uint8)
    _decode_into(images, lg_k, np.arange(len(images), dtype=np.int64), registers)
    return HllColumns(registers, lg_k)


def _by_lg_k(images: pa.Array) -> Iterator[tuple[int, npt.NDArray[np.int64], pa.Array]]:
    """The images grouped by their own lgK: (lgK, their rows, those images). Raises
    ``ValueError`` for an image shorter than its preamble or an lgK DataSketches does not
    have, before anything of 2^lgK bytes is allocated."""
    data, offsets, _, _ = binary_parts(images)
    if np.any(np.diff(offsets) < 8):
        raise ValueError("an HLL image shorter than its preamble")
    lg_ks = data[offsets[:-1] + 3].astype(np.int64)
    for lg_k in np.unique(lg_ks).tolist():
        picked = np.flatnonzero(lg_ks == lg_k)
        if not MIN_LG_K <= lg_k <= MAX_LG_K:
            raise ValueError(f"{picked.size} HLL image(s) unusable: lgK {lg_k}")
        yield lg_k, picked, images if picked.size == len(images) else images.take(
            pa.array(picked))


def own_registers(images: pa.Array) -> pa.ChunkedArray:
    """Each image's 2^lgK registers at its own lgK, the bytes ``hll_registers`` gives, as a
    binary column (in chunks under Arrow's 2 GiB a binary array): one :func:`from_images`
    call per lgK among the images, however many images. ``images``: valid (non-NULL) images
    only. Raises ``ValueError`` as :func:`from_images` does, without naming the image."""
    chunks: list[pa.Array] = []
    order: list[npt.NDArray[np.int64]] = []
    for lg_k, picked, subset in _by_lg_k(images):
        matrix = from_images(subset, lg_k).registers
        width = matrix.shape[1]
        per_chunk = (2**31 - 1) // width
        for first in range(0, matrix.shape[0], per_chunk):
            part = matrix[first : first + per_chunk]
            ends = np.arange(part.shape[0] + 1, dtype=np.int32) * width
            chunks.append(pa.Array.from_buffers(
                pa.binary(), part.shape[0], [None, pa.py_buffer(ends), pa.py_buffer(part)]
            ))  # fmt: skip
        order.append(picked)
    registers = pa.chunked_array(chunks, pa.binary())
    if len(order) == 1:
        return registers
    return registers.take(pa.array(np.argsort(np.concatenate(order), kind="stable")))


def check_images(images: pa.Array) -> None:
    """Raises ``ValueError`` as :func:`from_images` does if an image of ``images`` (valid,
    non-NULL ones only) is not a DataSketches HLL image; each is read at its own lgK into one
    scratch row, so nothing of the size of the registers is kept."""
    for lg_k, _, subset in _by_lg_k(images):
        scratch = np.zeros((1, 1 << lg_k), np.uint8)
        _decode_into(subset, lg_k, np.zeros(len(subset), np.int64), scratch)


def packed_hll_mode(images: pa.Array) -> npt.NDArray[np.bool_]:
    """Per image (valid ones only, at least 8 bytes each): in HLL mode with HLL_4 or HLL_6
    registers, which SQL (``streamgauge_hll_image_registers``) cannot read from the image."""
    data, offsets, _, _ = binary_parts(images)
    mode_byte = data[offsets[:-1] + 7]
    return np.asarray(((mode_byte & 3) == _HLL) & (((mode_byte >> 2) & 3) != _HLL_8))
