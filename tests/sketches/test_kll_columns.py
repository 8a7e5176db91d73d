"""Column KLL sketches against real DataSketches: bytes, merge accuracy, quantiles, Java."""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from datasketches import kll_doubles_sketch
from pyspark.sql import SparkSession

from streamgauge.ingest.pane_sketches import _weighted_kll
from streamgauge.sketches import kernels
from streamgauge.sketches import kll_columns as kc
from streamgauge.sketches.accuracy import kll_error

QS = (0.0, 0.01, 0.5, 0.9, 0.99, 1.0)
ERROR_QS = np.array([0.01, 0.05, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99])


def _sketch(values: Any, k: int = 200) -> kll_doubles_sketch:
    sketch = kll_doubles_sketch(k)
    if len(values):
        sketch.update(np.ascontiguousarray(values, dtype=np.float64))
    return sketch


def _blob(values: Any, k: int = 200) -> bytes:
    return bytes(_sketch(values, k).serialize())


def _binary(blobs: Sequence[bytes | None]) -> pa.Array:
    return pa.array(blobs, pa.binary())


def _rank_errors(ordered: np.ndarray, estimates: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Distance from q to the interval of true ranks the estimate occupies."""
    below = np.searchsorted(ordered, estimates, "left") / len(ordered)
    at_or_below = np.searchsorted(ordered, estimates, "right") / len(ordered)
    errors: np.ndarray = np.maximum(0.0, np.maximum(below - qs, qs - at_or_below))
    return errors


def _assert_well_formed(cols: kc.KllColumns) -> None:
    """The columns' contract: levels ascending per sketch, levels above 0 sorted, n the total
    weight, min and max around the items."""
    for i in range(len(cols)):
        lo, hi = cols.offsets[i], cols.offsets[i + 1]
        items, levels = cols.items[lo:hi], cols.levels[lo:hi].astype(np.int64)
        assert np.all(np.diff(levels) >= 0)
        for level in np.unique(levels[levels > 0]):
            assert np.all(np.diff(items[levels == level]) >= 0)
        assert int(np.sum(np.left_shift(1, levels))) == cols.n[i]
        if cols.n[i]:
            assert cols.mins[i] <= items.min() and items.max() <= cols.maxs[i]
        else:
            assert hi == lo and np.isnan(cols.mins[i]) and np.isnan(cols.maxs[i])


def _assert_python_reads(cols: kc.KllColumns, blobs: list[Any]) -> None:
    """Python datasketches reads every image with our n, min, max, retained items and
    quantiles (both search criteria, equal floats)."""
    inclusive = kc.quantiles(cols, QS)
    exclusive = kc.quantiles(cols, QS, inclusive=False)
    for i, blob in enumerate(blobs):
        sketch = kll_doubles_sketch.deserialize(blob)
        assert sketch.n == cols.n[i] and sketch.k == cols.k
        if sketch.is_empty():
            assert np.isnan(inclusive[i]).all() and np.isnan(exclusive[i]).all()
            continue
        assert (sketch.get_min_value(), sketch.get_max_value()) == (cols.mins[i], cols.maxs[i])
        assert sketch.num_retained == cols.retained[i]
        assert [sketch.get_quantile(q, True) for q in QS] == inclusive[i].tolist()
        assert [sketch.get_quantile(q) for q in QS] == exclusive[i].tolist()


def _lognormal_panes(rng: np.random.Generator, owners: int, panes: int, per: int
                     ) -> tuple[np.ndarray, list[bytes], np.ndarray]:  # fmt: skip
    """Values (owners x panes x per), one Python-built pane image each, and the owner of each
    image, the images shuffled so that owners interleave."""
    values = rng.lognormal(3.0, 1.0, (owners, panes, per))
    order = rng.permutation(owners * panes)
    blobs = [_blob(values[i // panes, i % panes]) for i in order]
    return values, blobs, order // panes


# -- decode / encode ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "k"), [(0, 200), (1, 200), (2, 200), (3, 200), (500, 200), (100_000, 200),
                    (5_000, 50), (300, 8)],
)  # fmt: skip
def test_round_trip_is_byte_exact(size: int, k: int) -> None:
    values = np.random.default_rng(size).lognormal(3.0, 1.0, size)
    blob = _blob(values, k)
    cols = kc.from_serialized(_binary([blob, None, blob]))
    assert cols.k == k and cols.n.tolist() == [size, 0, size]
    assert kc.to_serialized(cols).to_pylist() == [blob, _blob([], k), blob]
    _assert_well_formed(cols)
    _assert_python_reads(cols, [blob, _blob([], k), blob])
    if size:
        assert (cols.mins[0], cols.maxs[0]) == (values.min(), values.max())


def test_weighted_partials_round_trip_and_read_like_python() -> None:
    """Ingest's sample-rate partials (doubling merges): several levels from the start."""
    rng = np.random.default_rng(5)
    values = rng.lognormal(3.0, 1.0, 400)
    weights = rng.choice([1, 10, 1000], 400)
    blob = bytes(_weighted_kll(values, weights, 200).serialize())
    cols = kc.from_serialized(_binary([blob]))
    assert cols.n[0] == weights.sum() and cols.levels.max() >= 5
    assert kc.to_serialized(cols).to_pylist() == [blob]
    _assert_well_formed(cols)
    _assert_python_reads(cols, [blob])


def test_format_as_datasketches_writes_it() -> None:
    """Empty 8 bytes, one value 16 bytes, several: 20-byte preamble, level starts in a buffer
    of the capacity, min, max, level 0 first (in reverse update order)."""
    empty, single, three = _blob([]), _blob([1.5]), _blob([3.0, 1.0, 2.0])
    assert empty == bytes.fromhex("02010f01c8000800")
    assert single == bytes.fromhex("02020f04c8000800") + struct.pack("<d", 1.5)
    assert three[:20] == bytes.fromhex("05010f00c8000800") + struct.pack("<QHBB", 3, 200, 1, 0)
    assert struct.unpack("<I5d", three[20:]) == (197, 1.0, 3.0, 2.0, 1.0, 3.0)  # 200 - 3 free
    cols = kc.from_serialized(_binary([empty, single, three]))
    assert cols.items.tolist() == [1.5, 2.0, 1.0, 3.0]
    assert cols.levels.tolist() == [0, 0, 0, 0]


def test_sliced_chunked_and_large_binary_inputs() -> None:
    rng = np.random.default_rng(3)
    blobs = [_blob(rng.lognormal(3.0, 1.0, n)) for n in (5, 0, 1, 3000, 7)]
    sliced = _binary(blobs).slice(1, 3)  # also starts off an 8-byte boundary
    assert kc.to_serialized(kc.from_serialized(sliced)).to_pylist() == blobs[1:4]
    chunked = pa.chunked_array([_binary(blobs[:2]), _binary(blobs[2:])])
    assert kc.to_serialized(kc.from_serialized(chunked)).to_pylist() == blobs
    large = pa.array(blobs, pa.large_binary())
    assert kc.to_serialized(kc.from_serialized(large)).to_pylist() == blobs
    assert len(kc.from_serialized(pa.chunked_array([], pa.binary()))) == 0


def _patched(blob: bytes, at: int, data: bytes) -> bytes:
    return blob[:at] + data + blob[at + len(data) :]


_FULL = _blob(np.random.default_rng(1).lognormal(3.0, 1.0, 5000))
_FULL_LEVELS = _FULL[18]
_FULL_BODY = 20 + 4 * _FULL_LEVELS

_MALFORMED: list[tuple[str, Callable[[], bytes], str]] = [
    ("short header", lambda: _FULL[:7], "shorter"),
    ("truncated", lambda: _FULL[:-8], "shorter"),
    ("trailing bytes", lambda: _FULL + bytes(8), "longer"),
    ("single truncated", lambda: _blob([1.0])[:12], "shorter"),
    ("family", lambda: _patched(_FULL, 2, b"\x14"), "family 15"),
    ("updatable", lambda: _patched(_FULL, 1, b"\x03"), "updatable"),
    ("preamble", lambda: _patched(_FULL, 0, b"\x02"), "preamble"),
    ("single flag on a full image", lambda: _patched(_FULL, 3, b"\x04"), "preamble"),
    ("m", lambda: _patched(_FULL, 6, b"\x04"), "m is not 8"),
    ("k", lambda: _patched(_blob([]), 4, b"\x04\x00"), "k is outside"),
    ("no levels", lambda: _patched(_FULL, 18, b"\x00"), "level starts"),
    ("levels out of order", lambda: _patched(_FULL, 24, b"\x00\x00\x00\x00"), "level starts"),
    ("n", lambda: _patched(_FULL, 8, struct.pack("<Q", 4999)), "total weight"),
    ("NaN item", lambda: _patched(_FULL, _FULL_BODY + 16, struct.pack("<d", np.nan)), "NaN"),
    ("min above max", lambda: _patched(_FULL, _FULL_BODY, struct.pack("<d", 1e300)), "NaN"),
    ("unsorted level", lambda: _patched(_FULL, len(_FULL) - 8, struct.pack("<d", -1.0)),
     "not sorted"),
]  # fmt: skip


@pytest.mark.parametrize(("make", "problem"), [(m, p) for _, m, p in _MALFORMED],
                         ids=[name for name, _, _ in _MALFORMED])  # fmt: skip
def test_malformed_blob_is_refused_naming_its_row(make: Callable[[], bytes], problem: str) -> None:
    good = _blob([1.0, 2.0])
    with pytest.raises(ValueError, match=rf"row 2: .*{problem}"):
        kc.from_serialized(_binary([good, None, make(), good]))
    chunked = pa.chunked_array([_binary([good, good, good]), _binary([None, make()])])
    with pytest.raises(ValueError, match=rf"row 4: .*{problem}"):
        kc.from_serialized(chunked)


def test_k_is_the_blobs_unless_given() -> None:
    blobs = _binary([_blob([1.0, 2.0], 100), None, _blob([3.0], 400)])
    with pytest.raises(ValueError, match=r"different k \[100, 400\]"):
        kc.from_serialized(blobs)
    assert kc.from_serialized(blobs, 200).k == 200
    assert kc.from_serialized(_binary([None]), None).k == 200
    assert kc.from_serialized(_binary([_blob([1.0], 64)])).k == 64
    with pytest.raises(ValueError, match="k=4 is outside"):
        kc.KllColumns.empty(1, 4)


def test_sketches_of_a_larger_k_are_compressed_to_the_columns_k() -> None:
    """A k 1000 sketch of 100 000 values (2 684 items) read at k 200: compressed as a merge of
    it alone, into an image DataSketches reads at k 200; a small one is kept as it is."""
    rng = np.random.default_rng(12)
    values = rng.lognormal(3.0, 1.0, 100_000)
    big, small = _blob(values, 1000), _blob(values[:50], 1000)
    cols = kc.from_serialized(_binary([big, small]), 200)
    assert cols.retained[0] < kll_doubles_sketch.deserialize(big).num_retained
    assert cols.retained[1] == 50 and cols.n.tolist() == [100_000, 50]
    _assert_well_formed(cols)
    blobs = kc.to_serialized(cols).to_pylist()
    _assert_python_reads(cols, blobs)
    assert blobs[1] == _blob(values[:50], 200)
    estimates = kc.quantiles(cols, ERROR_QS)[0]
    assert _rank_errors(np.sort(values), estimates, ERROR_QS).max() <= kll_error(200)
    # columns no KLL sketch of their k can hold are refused, not written
    items = np.arange(3000.0)
    oversized = kc.KllColumns(np.array([0, 3000]), items, np.zeros(3000, np.uint8),
                              np.array([3000]), items[:1], items[-1:], 200)  # fmt: skip
    with pytest.raises(ValueError, match="sketch 0 retains more items than any KLL sketch"):
        kc.to_serialized(oversized)


# -- merge --------------------------------------------------------------------------------


def test_small_merges_keep_every_item_like_datasketches() -> None:
    """Inputs that fit together stay exact at level 0: python's own merge gives the same
    sketch (n, extremes, retained items, quantiles)."""
    rng = np.random.default_rng(11)
    groups = [[10, 10], [3, 0, 1], [1], [0, 0], [], [150, 49], [0, 7]]
    blobs: list[bytes | None] = []
    owner: list[int] = []
    for g, sizes in enumerate(groups):
        for size in sizes:
            blobs.append(_blob(rng.lognormal(3.0, 1.0, size)) if size or g != 3 else None)
            owner.append(g)
    cols = kc.from_serialized(_binary(blobs))
    merged = kc.merge_by_owner(cols, owner, len(groups))
    _assert_well_formed(merged)
    out = kc.to_serialized(merged).to_pylist()
    _assert_python_reads(merged, out)
    for g in range(len(groups)):
        expected = kll_doubles_sketch(200)
        for blob, o in zip(blobs, owner, strict=True):
            if o == g and blob is not None:
                expected.merge(kll_doubles_sketch.deserialize(blob))
        ours = kll_doubles_sketch.deserialize(out[g])
        assert (ours.n, ours.num_retained) == (expected.n, expected.num_retained)
        if not expected.is_empty():
            assert [ours.get_quantile(q, True) for q in QS] == [
                expected.get_quantile(q, True) for q in QS
            ]
    assert merged.retained.tolist() == [20, 4, 1, 0, 0, 199, 7]
    assert set(merged.levels.tolist()) == {0}
    # one non-empty input (beside empty ones): its bytes unchanged
    assert out[2] == blobs[owner.index(2)] and out[6] == blobs[owner.index(6) + 1]
    assert out[3] == out[4] == _blob([])


def test_merged_pane_sketches_stay_within_kll_error() -> None:
    """200 pane sketches of 50 values per owner (k 200), 20 owners interleaved in one call;
    then windows of windows: each owner's panes merged in 4 windows, the windows merged."""
    rng = np.random.default_rng(20260512)
    owners, panes = 20, 200
    values, blobs, owner = _lognormal_panes(rng, owners, panes, 50)
    cols = kc.from_serialized(_binary(list(blobs)))
    bound = kll_error(200)

    def check(merged: kc.KllColumns) -> None:
        _assert_well_formed(merged)
        assert merged.n.tolist() == [panes * 50] * owners
        estimates = kc.quantiles(merged, ERROR_QS)
        for o in range(owners):
            ordered = np.sort(values[o].ravel())
            assert _rank_errors(ordered, estimates[o], ERROR_QS).max() <= bound, o
            assert (merged.mins[o], merged.maxs[o]) == (ordered[0], ordered[-1])
        _assert_python_reads(merged, kc.to_serialized(merged).to_pylist())

    once = kc.merge_by_owner(cols, owner, owners)
    check(once)
    assert once.levels.max() >= 3  # compacted: far fewer items than values
    window = owner * 4 + rng.integers(0, 4, len(owner))
    windows = kc.merge_by_owner(cols, window, owners * 4)
    _assert_well_formed(windows)
    # the windows' images decoded again, merged per owner
    decoded = kc.from_serialized(kc.to_serialized(windows))
    check(kc.merge_by_owner(decoded, np.arange(owners * 4) // 4, owners))


def test_multi_level_inputs_stay_within_kll_error() -> None:
    """Python-built sketches of 100 000 values (9 levels) merged 5 per owner."""
    rng = np.random.default_rng(8)
    owners, per_owner = 4, 5
    values = rng.lognormal(3.0, 1.0, (owners, per_owner, 100_000))
    blobs = [_blob(values[o, i]) for o in range(owners) for i in range(per_owner)]
    cols = kc.from_serialized(_binary(list(blobs)))
    assert cols.levels.max() >= 8
    merged = kc.merge_by_owner(cols, np.repeat(np.arange(owners), per_owner), owners)
    _assert_well_formed(merged)
    estimates = kc.quantiles(merged, ERROR_QS)
    for o in range(owners):
        ordered = np.sort(values[o].ravel())
        assert _rank_errors(ordered, estimates[o], ERROR_QS).max() <= kll_error(200)
    _assert_python_reads(merged, kc.to_serialized(merged).to_pylist())


def _capacity(k: int, num_levels: int, level: int) -> int:
    """DataSketches' level capacity: max(m, round(k (2/3)^depth)), rounded as int_cap_aux."""
    depth = num_levels - level - 1
    power: int = 3**depth  # typeshed gives int ** int as Any: a negative power is a float
    return max(8, ((2 * k << depth) // power + 1) >> 1)


def _reference_compress(k: int, n: int, by_level: list[list[float]]) -> list[list[float]]:
    """DataSketches' general compress, step by step in one buffer as ``kll_helper`` runs it
    (levels shrink in place, halving up into an empty level above or down then merging),
    with the columns' coin for the offset of each compaction."""
    items = [x for level in by_level for x in level]
    in_levels = [0] * (len(by_level) + 64)
    for h, level in enumerate(by_level):
        in_levels[h + 1] = in_levels[h] + len(level)
    out_levels = [0] * len(in_levels)
    levels, count = len(by_level), len(items)
    target = sum(_capacity(k, levels, h) for h in range(levels))
    h = 0
    while True:
        if h == levels - 1:
            in_levels[h + 2] = in_levels[h + 1]
        beg, lim = in_levels[h], in_levels[h + 1]
        pop = lim - beg
        if count < target or pop < _capacity(k, levels, h):
            items[out_levels[h] : out_levels[h] + pop] = items[beg:lim]
            out_levels[h + 1] = out_levels[h] + pop
        else:
            above = in_levels[h + 2] - lim
            odd = pop % 2
            if odd:
                items[out_levels[h]] = items[beg]
            out_levels[h + 1] = out_levels[h] + odd
            start, half = beg + odd, (pop - odd) // 2
            if h == 0:
                items[start:lim] = sorted(items[start:lim])
            coin = int(kc._coin(n, h))  # keep relative positions of this parity
            if above == 0:  # halve up: the kept half ends at the level's end
                items[lim - half : lim] = items[start + coin : lim : 2]
            else:  # halve down, then merge with the level above
                kept = items[start + coin : lim : 2]
                items[start + half : in_levels[h + 2]] = sorted(kept + items[lim : lim + above])
            count -= half
            in_levels[h + 1] -= half
            if h == levels - 1:
                levels += 1
                target += _capacity(k, levels, 0)
        if h == levels - 1:
            break
        h += 1
    return [items[out_levels[h] : out_levels[h + 1]] for h in range(levels)]


@pytest.mark.parametrize("k", [8, 20, 200])
def test_merge_is_datasketches_general_compress(k: int) -> None:
    """Each owner's result equals a step-by-step port of DataSketches' general compress run
    on its inputs' levels (level 0 concatenated in input order, higher levels merged)."""
    rng = np.random.default_rng(k)
    sizes = rng.integers(0, 40 * k, 240) * (rng.random(240) < 0.9)
    cols = kc.from_serialized(_binary([_blob(rng.lognormal(3.0, 1.0, n), k) for n in sizes]))
    owner = rng.integers(0, 40, len(sizes))
    merged = kc.merge_by_owner(cols, owner, 40)
    _assert_well_formed(merged)
    compacted = 0
    for g in range(40):
        inputs = [i for i in np.flatnonzero(owner == g) if cols.n[i]]
        top = max((int(cols.levels[cols.offsets[i + 1] - 1]) for i in inputs), default=0)
        by_level: list[list[float]] = [[] for _ in range(top + 1)]
        for i in inputs:
            lo, hi = cols.offsets[i], cols.offsets[i + 1]
            for x, h in zip(cols.items[lo:hi], cols.levels[lo:hi], strict=True):
                by_level[h].append(float(x))
        by_level[1:] = [sorted(level) for level in by_level[1:]]
        lo, hi = merged.offsets[g], merged.offsets[g + 1]
        ours = [merged.items[lo:hi][merged.levels[lo:hi] == h].tolist() for h in range(64)]
        if len(inputs) < 2:  # one input: unchanged (none: empty)
            assert ours[: len(by_level)] == by_level and not any(ours[len(by_level) :])
            continue
        expected = _reference_compress(k, int(cols.n[inputs].sum()), by_level)
        assert ours[: len(expected)] == expected, g
        assert not any(ours[len(expected) :]), g
        compacted += len(expected) > len(by_level)
    assert compacted >= 10  # the cases tested include compactions that add levels


def test_merge_into_is_merge_by_owner_of_state_then_partials() -> None:
    rng = np.random.default_rng(21)
    state_values, state_blobs, _ = _lognormal_panes(rng, 1, 6, 300)
    state = kc.from_serialized(_binary([*state_blobs, None]))
    _, partial_blobs, _ = _lognormal_panes(rng, 1, 30, 40)
    partials = kc.from_serialized(_binary(list(partial_blobs)))
    owner = rng.integers(0, 6, len(partial_blobs))  # row 6 gets nothing: stays empty
    into = kc.merge_into(state, partials, owner)
    both = kc.concat([state, partials])
    by_owner = kc.merge_by_owner(both, np.concatenate([np.arange(7), owner]), 7)
    assert kc.to_serialized(into).to_pylist() == kc.to_serialized(by_owner).to_pylist()
    assert into.n.tolist() == [300 + 40 * int(np.sum(owner == g)) for g in range(6)] + [0]
    untouched = kc.merge_into(state, partials, np.full(len(partial_blobs), 6))
    assert kc.to_serialized(untouched).to_pylist()[:6] == list(state_blobs)


def test_merges_are_deterministic_and_the_same_in_chunks_and_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(4)
    _, blobs, owner = _lognormal_panes(rng, 30, 40, 60)
    cols = kc.from_serialized(_binary(list(blobs)))
    state = kc.merge_by_owner(cols, owner % 7, 30)

    def run() -> tuple[list[bytes], list[bytes], np.ndarray]:
        merged = kc.merge_by_owner(cols, owner, 30)
        into = kc.merge_into(state, cols, owner)
        return (kc.to_serialized(merged).to_pylist(), kc.to_serialized(into).to_pylist(),
                kc.quantiles(merged, QS))  # fmt: skip

    first = run()
    assert run()[:2] == first[:2]
    monkeypatch.setattr(kernels, "FORCE_CHUNKS", 4)
    before = kernels.threads()
    try:
        for threads in (1, 3):
            kernels.set_threads(threads)
            chunked = run()
            assert chunked[:2] == first[:2]
            np.testing.assert_array_equal(chunked[2], first[2])
    finally:
        kernels.set_threads(before)


def test_owner_validation() -> None:
    cols = kc.KllColumns.empty(3)
    with pytest.raises(ValueError, match="owner has shape"):
        kc.merge_by_owner(cols, [0, 1], 2)
    with pytest.raises(ValueError, match="owners must be in 0..1"):
        kc.merge_by_owner(cols, [0, 1, 2], 2)
    assert kc.merge_by_owner(cols, [1, 1, 1], 2).n.tolist() == [0, 0]


# -- quantiles ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [[7.5], [2.5] * 5, [1.0, 2.0], [3.0, 1.0, 2.0, 2.0, -4.0], list(range(10)), [-0.0, 0.0]],
    ids=["one", "equal", "two", "ties", "ten", "signed-zeros"],
)
def test_quantiles_equal_datasketches_on_edge_cases(values: list[float]) -> None:
    blob = _blob(values)
    cols = kc.from_serialized(_binary([blob, None]))
    _assert_python_reads(cols, [blob, _blob([])])
    assert np.isnan(kc.quantiles(cols, QS)[1]).all()


def test_quantiles_refuse_ranks_outside_the_unit_interval() -> None:
    with pytest.raises(ValueError, match="q=1.5"):
        kc.quantiles(kc.KllColumns.empty(1), [0.5, 1.5])
    assert kc.quantiles(kc.KllColumns.empty(0), QS).shape == (0, len(QS))


# -- assembling ---------------------------------------------------------------------------


def test_take_gather_and_concat_pick_whole_sketches() -> None:
    rng = np.random.default_rng(9)
    blobs = [_blob(rng.lognormal(3.0, 1.0, n)) for n in (4, 0, 2000, 1)]
    cols = kc.from_serialized(_binary(list(blobs)))
    assert kc.to_serialized(kc.take(cols, [2, 0, 2])).to_pylist() == [blobs[2], blobs[0], blobs[2]]
    gathered = kc.gather([(cols, [3]), (cols, []), (cols, [1, 2])], 300)
    assert gathered.k == 300 and gathered.n.tolist() == [1, 0, 2000]
    concatenated = kc.concat([cols, kc.KllColumns.empty(1)])
    assert kc.to_serialized(concatenated).to_pylist() == [*blobs, _blob([])]
    assert len(kc.concat([])) == 0 and len(kc.gather([])) == 0


# -- Java ---------------------------------------------------------------------------------


def _java_kll(spark: SparkSession, blob: bytes) -> Any:
    """``blob`` as DataSketches' Java ``KllDoublesSketch.heapify`` reads it (py4j proxy)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    memory = jvm.org.apache.datasketches.memory.Memory.wrap(bytearray(blob))
    return jvm.org.apache.datasketches.kll.KllDoublesSketch.heapify(memory)


def test_java_reads_merged_images(spark: SparkSession) -> None:
    """Spark's DataSketches (Java 6.2.0) reads merged images: exact, compacted, multi-level
    and single-value ones, with our n, k, extremes, retained items and p50/p90."""
    rng = np.random.default_rng(31)
    _, panes, owner = _lognormal_panes(rng, 3, 200, 50)
    big = [_blob(rng.lognormal(3.0, 1.0, 100_000)) for _ in range(2)]
    small = [_blob(rng.lognormal(3.0, 1.0, 10)) for _ in range(2)]
    blobs = [*panes, *big, *small, _blob([4.25]), None]
    owners = np.concatenate([owner, [3, 3, 4, 4, 5, 6]])
    merged = kc.merge_by_owner(kc.from_serialized(_binary(blobs)), owners, 7)
    ours = kc.quantiles(merged, [0.5, 0.9])
    for i, blob in enumerate(kc.to_serialized(merged).to_pylist()):
        java = _java_kll(spark, blob)
        assert (java.getN(), java.getK(), java.isEmpty()) == (merged.n[i], 200, i == 6)
        if i == 6:
            continue
        assert java.getNumRetained() == merged.retained[i]
        assert (java.getMinItem(), java.getMaxItem()) == (merged.mins[i], merged.maxs[i])
        assert [java.getQuantile(0.5), java.getQuantile(0.9)] == ours[i].tolist(), i
