"""``hll_unions.union_images`` against DataSketches' own ``hll_union``, byte for byte.

Each case feeds images of one family to many owners at once, in a random order per owner, and
checks every owner's image equals ``serialize_hll(union_hll(its images, lg_k))`` and its
estimate equals the library's estimate of that image: the union is order-sensitive in the
library (HIP accumulates as coupons arrive; a hash set's layout follows insertion), so equal
bytes mean the kernel took the library's path, not an equivalent one.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pytest
from datasketches import hll_sketch, hll_union, tgt_hll_type

from streamgauge.sketches import kernels
from streamgauge.sketches.hll import estimate, serialize_hll, union_hll
from streamgauge.sketches.hll_unions import ImageRows, union_images, union_rows

Image = Callable[[np.random.Generator, int], bytes]


def _sketch(rng: np.random.Generator, lg_k: int, members: int, shared: bool = False,
            tgt: tgt_hll_type = tgt_hll_type.HLL_8) -> hll_sketch:  # fmt: skip
    sketch = hll_sketch(lg_k, tgt)
    # shared: members from a small common range, so owners' images overlap
    first = int(rng.integers(0, 40)) if shared else int(rng.integers(0, 2**40))
    for member in range(first, first + members):
        sketch.update(member)
    return sketch


def compact(sizes: list[int], shared: bool = False) -> Image:
    def image(rng: np.random.Generator, lg_k: int) -> bytes:
        return serialize_hll(_sketch(rng, lg_k, int(rng.choice(sizes)), shared))

    return image


def updatable(sizes: list[int]) -> Image:
    def image(rng: np.random.Generator, lg_k: int) -> bytes:
        return bytes(_sketch(rng, lg_k, int(rng.choice(sizes))).serialize_updatable())

    return image


def out_of_order(sizes: list[int]) -> Image:
    """A union's result: HLL mode carries the out-of-order flag, no HIP accumulator."""

    def image(rng: np.random.Generator, lg_k: int) -> bytes:
        union = hll_union(lg_k)
        for _ in range(2):
            union.update(_sketch(rng, lg_k, int(rng.choice(sizes))))
        return serialize_hll(union.get_result(tgt_hll_type.HLL_8))

    return image


def mixed(*families: Image) -> Image:
    def image(rng: np.random.Generator, lg_k: int) -> bytes:
        return families[int(rng.integers(len(families)))](rng, lg_k)

    return image


def other_lg_k_or_type(rng: np.random.Generator, lg_k: int) -> bytes:
    """Images the kernel leaves to the library: a finer lgK (folded), HLL_4 / HLL_6."""
    if rng.random() < 0.5:
        return serialize_hll(_sketch(rng, lg_k + 1, int(rng.choice([3, 50, 2000]))))
    tgt = tgt_hll_type.HLL_4 if rng.random() < 0.5 else tgt_hll_type.HLL_6
    return serialize_hll(_sketch(rng, lg_k, int(rng.choice([3, 2000])), tgt=tgt))


COUPONS = [1, 3, 7, 8, 9, 20, 60]
CASES: dict[str, tuple[Image, int]] = {
    # name: (image family, images per owner on average)
    "lists and sets that stay sets": (compact([1, 2, 5, 7]), 4),
    "sets whose union promotes to HLL as coupons arrive (HIP)": (compact(COUPONS), 14),
    "members shared between images (duplicate coupons)": (compact([5, 20, 60], True), 8),
    "HLL-mode images: copied, then merged out of order": (compact([500, 3000]), 3),
    "HLL images after coupons and coupons after HLL": (compact([4, 60, 900, 5000]), 6),
    "updatable images, Spark's form": (updatable([0, 3, 9, 60, 900]), 5),
    "out-of-order images": (mixed(out_of_order([40, 700]), compact([5, 60])), 5),
    "empty images beside others": (compact([0, 0, 4, 700]), 5),
    "images at another lgK or type, through the library": (
        mixed(other_lg_k_or_type, compact([4, 60, 900])), 4),
}  # fmt: skip


def library_union(images: list[bytes], lg_k: int) -> tuple[bytes, float]:
    blob = serialize_hll(union_hll(images, lg_k))
    return blob, estimate(blob).estimate


@pytest.mark.parametrize("lg_k", [4, 7, 8, 11])
@pytest.mark.parametrize("case", list(CASES))
def test_each_owner_s_union_is_the_library_s_bytes_and_estimate(
    case: str, lg_k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # owners in chunks, as on several threads (kernels.run_chunks), at lgK 11
    monkeypatch.setattr(kernels, "FORCE_CHUNKS", 3 if lg_k == 11 else None)
    family, per_owner = CASES[case]
    rng = np.random.default_rng(zlib.crc32(f"{case} {lg_k}".encode()))
    owners = 12
    images = [family(rng, lg_k) for _ in range(owners * per_owner)]
    owner = rng.integers(0, owners, len(images))
    got = union_images(pa.array(images, pa.binary()), owner, owners + 1, lg_k)

    assert len(got.images) == len(got.estimates) == owners + 1
    for g in range(owners):
        mine = [images[i] for i in np.flatnonzero(owner == g)]
        if not mine:
            continue
        want_image, want_estimate = library_union(mine, lg_k)
        assert got.images[g].as_py() == want_image, (case, g)
        assert got.estimates[g] == want_estimate, (case, g)
    # the last owner has no image
    assert got.images[owners].as_py() is None and np.isnan(got.estimates[owners])


def test_null_images_are_skipped_and_an_owner_of_only_nulls_has_no_union() -> None:
    rng = np.random.default_rng(3)
    a, b = compact([5])(rng, 12), compact([900])(rng, 12)
    got = union_images(pa.array([a, None, b, None], pa.binary()), [0, 0, 0, 1], 2, 12)
    assert got.images[0].as_py() == library_union([a, b], 12)[0]
    assert got.images[1].as_py() is None and np.isnan(got.estimates[1])


def test_an_owner_of_empty_sketches_has_the_library_s_empty_union() -> None:
    empty = serialize_hll(hll_sketch(12, tgt_hll_type.HLL_8))
    got = union_images(pa.array([empty, empty], pa.binary()), [0, 0], 1, 12)
    assert (got.images[0].as_py(), got.estimates[0]) == library_union([empty, empty], 12)


@pytest.mark.parametrize(
    "bad, owner, n_owners, message",
    [
        ([b"not an hll image"], [0], 1, "not a serialized HLL sketch"),
        ([b"\x02\x01\x07\x0c\x03\x08\x01\x08"], [0], 1, "not a serialized HLL sketch"),
        ([b"x"], [1], 1, "owners must be in 0..0"),
        ([b"x", b"y"], [0], 1, "owner has shape"),
    ],
)
def test_bad_input_is_refused(bad: list[bytes], owner: list[int], n_owners: int,
                              message: str) -> None:  # fmt: skip
    with pytest.raises(ValueError, match=message):
        union_images(pa.array(bad, pa.binary()), owner, n_owners, 12)


def test_rows_of_several_columns_union_in_the_order_of_parts_and_rows() -> None:
    """``union_rows`` reads each column where it is: the same as ``union_images`` of the rows
    taken and concatenated in order (parts, then rows within each)."""
    rng = np.random.default_rng(11)
    family = compact([3, 60, 900])
    columns = [pa.array([family(rng, 12) if rng.random() < 0.9 else None for _ in range(30)],
                        pa.binary()) for _ in range(3)]  # fmt: skip
    parts = []
    for column in columns:
        rows = np.sort(rng.choice(len(column), 20, replace=False))
        parts.append(ImageRows(column, rows, rng.integers(0, 6, rows.size)))
    got = union_rows(parts, 6, 12)
    taken = pa.concat_arrays([p.images.take(pa.array(p.rows)) for p in parts])
    expected = union_images(taken, np.concatenate([p.owner for p in parts]), 6, 12)
    assert got.images.equals(expected.images)
    np.testing.assert_array_equal(got.estimates, expected.estimates)
    assert union_rows([], 2, 12).images.null_count == 2
