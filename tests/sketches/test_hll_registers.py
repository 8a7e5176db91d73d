"""Register arrays from every kind of DataSketches HLL image, and Ertl's estimator over them.

The library is the reference: the same members give the same registers whatever the mode (LIST,
SET, HLL), type (HLL_4/6/8) and serialization (compact/updatable); folding to a smaller lgK is
what ``hll_union`` does; the estimate agrees with the library's on many seeded sketches.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import numpy as np
import pytest
from datasketches import hll_sketch, hll_union, tgt_hll_type

from streamgauge.sketches.hll import build_hll, serialize_hll
from streamgauge.sketches.hll_registers import (
    estimate_registers,
    fold_registers,
    hll_registers,
    register_histogram,
)

DATA = Path(__file__).resolve().parent.parent / "data" / "sketches"
TYPES = (tgt_hll_type.HLL_4, tgt_hll_type.HLL_6, tgt_hll_type.HLL_8)
# 0: empty; 5: LIST; 100, 300: SET; 1000 and up: HLL (lgK 12 leaves SET mode at 384 coupons).
SIZES = (0, 1, 5, 8, 9, 100, 300, 1000, 20_000)


def _sketch(members: list[int] | list[str], lg_k: int, tgt: tgt_hll_type) -> hll_sketch:
    sketch = hll_sketch(lg_k, tgt)
    for member in members:
        sketch.update(member)
    return sketch


@pytest.mark.parametrize("n", SIZES)
def test_every_mode_type_and_serialization_gives_the_same_registers(n: int) -> None:
    members = [f"user-{i}" for i in range(n)]
    images = [
        bytes(image)
        for tgt in TYPES
        for sketch in [_sketch(members, 12, tgt)]
        for image in (sketch.serialize_compact(), sketch.serialize_updatable())
    ]
    first, *others = (hll_registers(image) for image in images)
    assert first.dtype == np.uint8 and first.size == 4096
    assert int(np.count_nonzero(first)) <= n
    for other in others:
        np.testing.assert_array_equal(other, first)
    if n == 0:
        assert not first.any()


@pytest.mark.parametrize("n", [5, 300, 20_000])
def test_registers_after_a_union_and_folding_match_the_library(n: int) -> None:
    rng = np.random.default_rng(n)
    a = rng.integers(0, 2**62, n).tolist()
    b = rng.integers(0, 2**62, n).tolist()
    sketch_a, sketch_b = _sketch(a, 12, tgt_hll_type.HLL_4), _sketch(b, 12, tgt_hll_type.HLL_8)
    union = hll_union(12)
    union.update(sketch_a)
    union.update(sketch_b)
    merged = hll_registers(union.get_result(tgt_hll_type.HLL_8).serialize_compact())
    regs_a = hll_registers(sketch_a.serialize_compact())
    regs_b = hll_registers(sketch_b.serialize_updatable())
    np.testing.assert_array_equal(merged, np.maximum(regs_a, regs_b))
    for lg_k in (4, 10):
        coarse = hll_union(lg_k)
        coarse.update(sketch_a)
        folded = hll_registers(coarse.get_result(tgt_hll_type.HLL_8).serialize_compact())
        np.testing.assert_array_equal(folded, fold_registers(regs_a, lg_k))


def test_the_estimate_agrees_with_the_librarys_on_many_sketches() -> None:
    """200 seeded sketches per size: Ertl on the registers vs DataSketches on the same sketch.

    Once in HLL mode both estimate from the same registers with different estimators (the
    library's HIP or composite), so they differ by estimation noise, not by a bias: the mean
    relative difference is ~0 and each is within the 2-sigma union bound of the truth.
    """
    for n in (1_000, 10_000):
        rng = np.random.default_rng([n, 7])
        ours, library = [], []
        for _ in range(200):
            sketch = build_hll(rng.integers(0, 2**62, n))
            union = hll_union(12)
            union.update(sketch)
            ours.append(estimate_registers(hll_registers(serialize_hll(sketch))))
            library.append(union.get_result(tgt_hll_type.HLL_8).get_estimate())  # composite
        rel_ours = np.array(ours) / n - 1
        rel_library = np.array(library) / n - 1
        assert abs(rel_ours.mean()) < 0.004, n  # unbiased: 200 trials, sd of mean ~0.0012
        assert abs((rel_ours - rel_library).mean()) < 0.004, n
        assert np.mean(np.abs(rel_ours) <= 0.03183) >= 0.95, n
        assert np.std(rel_ours) < 0.0175, n  # RSE 1.04/64 = 0.01625


def test_small_sets_are_counted_like_linear_counting() -> None:
    """Few members: the estimate is linear counting, m ln(m / empty registers), so it is exact
    until two members share a register (at n = 50 in 4096 registers that happens with
    probability 26 %, and each shared register costs about one member)."""
    for n in (1, 2, 10, 50, 100, 300):
        regs = hll_registers(serialize_hll(build_hll(range(n))))
        empty = int(np.count_nonzero(regs == 0))
        assert estimate_registers(regs) == pytest.approx(4096 * np.log(4096 / empty), rel=1e-3)
        assert abs(estimate_registers(regs) - n) <= 0.025 * n + 1, n
    assert round(estimate_registers(hll_registers(serialize_hll(build_hll(range(10)))))) == 10
    assert estimate_registers(np.zeros(4096, np.uint8)) == 0.0


def test_golden_images_decode_to_frozen_registers() -> None:
    """The frozen sketches of test_golden: a change in decoding or in the format fails here."""
    expected = {
        "hll_lgk12_5000_strings.b64": (4936.832601735389, "c816cb71bf983cb4"),
        # 100 members in 97 registers: three shared a slot, so the estimate is 98.2, not 100.
        "hll_lgk12_100_ints.b64": (98.16453612070063, "305c3f924079302e"),
    }
    for name, (estimate, digest_prefix) in expected.items():
        regs = hll_registers(base64.b64decode((DATA / name).read_text().strip()))
        assert estimate_registers(regs) == pytest.approx(estimate, rel=1e-9), name
        assert hashlib.sha256(regs.tobytes()).hexdigest().startswith(digest_prefix), name
        assert register_histogram(regs).sum() == 4096


@pytest.mark.parametrize(
    ("blob", "reason"),
    [
        (b"", "shorter than"),
        (b"\x02\x01\x07\x0c", "shorter than"),
        (bytes([2, 1, 3, 12, 3, 8, 0, 8]), "family 3"),  # a theta sketch's family byte
        (bytes([2, 1, 7, 30, 3, 8, 0, 8]), "lgK 30"),
        (bytes([2, 1, 7, 12, 3, 8, 2, 8]) + (5).to_bytes(4, "little"), "2 coupons announced"),
        (bytes([10, 1, 7, 12, 0, 8, 0, 10]) + bytes(40), "HLL_8 body"),
    ],
)
def test_what_is_not_an_hll_image_is_refused(blob: bytes, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        hll_registers(blob)
