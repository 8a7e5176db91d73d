"""Column HLL registers: decoding equals ``hll_registers``; checks and the store's picks."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from datasketches import hll_sketch, tgt_hll_type

from streamgauge.sketches import hll_columns as hlc
from streamgauge.sketches.hll_registers import fold_registers, hll_registers

# 0: empty; 5: LIST; 100, 300: SET; 1000 and up: HLL (at lgK 12).
SIZES = (0, 1, 5, 100, 300, 1000, 20_000)


def _image(n: int, lg_k: int, seed: int, tgt: tgt_hll_type = tgt_hll_type.HLL_8,
           compact: bool = True) -> bytes:  # fmt: skip
    sketch = hll_sketch(lg_k, tgt)
    for member in np.random.default_rng(seed).integers(0, 2**62, n).tolist():
        sketch.update(member)
    return bytes(sketch.serialize_compact() if compact else sketch.serialize_updatable())


@pytest.mark.parametrize("lg_k", [10, 12])
def test_decoding_equals_hll_registers_for_every_mode_and_type(lg_k: int) -> None:
    images: list[bytes | None] = [None]
    for n in SIZES:
        for tgt in (tgt_hll_type.HLL_4, tgt_hll_type.HLL_6, tgt_hll_type.HLL_8):
            for compact in (True, False):
                images.append(_image(n, lg_k, n + 7, tgt, compact))
    cols = hlc.from_images(pa.array(images, pa.binary()), lg_k)
    assert cols.registers.shape == (len(images), 1 << lg_k)
    assert not cols.registers[0].any()
    for row, image in enumerate(images[1:], start=1):
        assert image is not None
        np.testing.assert_array_equal(cols.registers[row], hll_registers(image))


def test_finer_images_fold_and_coarser_coupons_place_exactly() -> None:
    fine = _image(20_000, 14, 1)  # HLL mode at lgK 14 -> folded to 12
    coarse_list = _image(5, 8, 2)  # LIST mode at lgK 8: its coupons keep 26 bits of slot
    cols = hlc.from_images(pa.array([fine, coarse_list], pa.binary()), 12)
    np.testing.assert_array_equal(cols.registers[0], fold_registers(hll_registers(fine), 12))
    np.testing.assert_array_equal(cols.registers[1], hll_registers(_image(5, 12, 2)))
    with pytest.raises(ValueError, match="row 1: an HLL-mode image coarser than lgK 12"):
        hlc.from_images(pa.array([fine, _image(20_000, 10, 3)], pa.binary()), 12)
    with pytest.raises(ValueError, match="row 0: not a DataSketches HLL image"):
        hlc.from_images(pa.array([b"\x02\x01\x14\x0c\x00\x00\x00\x00"], pa.binary()), 12)


def test_check_images_refuses_what_from_images_refuses() -> None:
    good = [_image(n, lg_k, n) for n in SIZES for lg_k in (10, 12)]
    hlc.check_images(pa.array(good, pa.binary()))
    for bad in (b"\x02\x01\x14\x0c\x00\x00\x00\x00", b"short"):
        with pytest.raises(ValueError):
            hlc.check_images(pa.array([*good, bad], pa.binary()))


@pytest.mark.parametrize("compact", [True, False])
def test_packed_hll_mode_is_hll_4_and_hll_6_in_hll_mode(compact: bool) -> None:
    images, expected = [], []
    for n in (0, 5, 300, 20_000):  # empty, LIST, SET, HLL mode at lgK 12
        for tgt in (tgt_hll_type.HLL_4, tgt_hll_type.HLL_6, tgt_hll_type.HLL_8):
            images.append(_image(n, 12, n, tgt, compact))
            expected.append(n == 20_000 and tgt != tgt_hll_type.HLL_8)
    assert hlc.packed_hll_mode(pa.array(images, pa.binary())).tolist() == expected
