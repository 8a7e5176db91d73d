"""Column HLL registers: decoding equals ``hll_registers``, union equals DataSketches' own."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from datasketches import hll_sketch, hll_union, tgt_hll_type

from streamgauge.sketches import hll_columns as hlc
from streamgauge.sketches.hll_registers import estimate_registers, fold_registers, hll_registers

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


def test_union_by_owner_equals_the_library_union_and_estimates() -> None:
    rng = np.random.default_rng(5)
    n_owners = 12
    images = [_image(int(rng.choice(SIZES)), 12, seed) for seed in range(150)]
    owner = rng.integers(0, n_owners - 1, len(images))  # the last owner gets nothing
    union = hlc.union_by_owner(hlc.from_images(pa.array(images, pa.binary()), 12), owner,
                               n_owners)  # fmt: skip
    ours = hlc.estimates(union)
    for g in range(n_owners):
        library = hll_union(12)
        for i in np.flatnonzero(owner == g).tolist():
            library.update(hll_sketch.deserialize(images[i]))
        theirs = hll_registers(bytes(library.get_result(tgt_hll_type.HLL_8).serialize_compact()))
        np.testing.assert_array_equal(union.registers[g], theirs)
        assert ours[g] == estimate_registers(theirs)
    assert ours[-1] == 0.0
    with pytest.raises(ValueError, match="owners must be in 0..1"):
        hlc.union_by_owner(union, np.zeros(n_owners, np.int64) + 2, 2)


def test_merge_images_into_state_equals_union_of_registers() -> None:
    rng = np.random.default_rng(8)
    state_images = [_image(int(n), 12, 100 + i) for i, n in enumerate([0, 5, 300, 20_000])]
    state = hlc.from_images(pa.array(state_images, pa.binary()), 12)
    panes = [_image(int(rng.choice(SIZES)), 12, seed) for seed in range(40)]
    panes[3] = _image(2_000, 12, 3, tgt_hll_type.HLL_4)  # through the library's conversion
    owner = rng.integers(0, 3, len(panes))  # the last window gets nothing
    into = hlc.merge_images_into(state, pa.array(panes, pa.binary()), owner)
    registers = hlc.from_images(pa.array(panes, pa.binary()), 12).registers
    for g in range(4):
        expected = np.maximum.reduce([state.registers[g], *registers[owner == g]])
        np.testing.assert_array_equal(into.registers[g], expected)
    np.testing.assert_array_equal(into.registers[3], state.registers[3])
    assert not hlc.HllColumns.empty(2, 12).registers.any()
    with pytest.raises(ValueError, match="owners must be in 0..3"):
        hlc.merge_images_into(state, pa.array(panes[:1], pa.binary()), [4])
