"""Column HDR histograms: merges equal ``hdr.merge`` per owner, quantiles ``HdrLayout.quantile``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from streamgauge.sketches import compile_accuracy, kernels
from streamgauge.sketches import hdr_columns as hc
from streamgauge.sketches.hdr import HdrLayout, merge

DEFAULT = HdrLayout.from_params(compile_accuracy())
LAYOUTS = [DEFAULT, HdrLayout(1, 10_000, 1, 1.0), HdrLayout(1000, 100_000_000, 2, 1.0),
           HdrLayout(1, 3_600_000_000, 3, 1000.0)]  # fmt: skip
QS = [0.0, 1e-9, 0.25, 0.5, 0.9, 0.99, 0.999, 0.9999, 1.0]


Partial = tuple[np.ndarray, np.ndarray]


def _partials(layout: HdrLayout, rng: np.random.Generator, n: int) -> list[Partial]:
    """Pane histograms as the pane partials carry them (sorted unique buckets); some empty."""
    out = []
    for _ in range(n):
        size = int(rng.choice([0, 1, 5, 10, 200]))
        values = rng.lognormal(rng.uniform(0, 6), 1.5, size) * rng.choice([0.001, 1.0, 100.0])
        hist = layout.histogram(values)
        out.append((hist.indices, hist.counts))
    return out


def _lists(partials: list[Partial]) -> tuple[pa.Array, pa.Array]:
    buckets = [b.astype(np.int32) if len(b) else None for b, _ in partials]
    counts = [c if len(c) else None for _, c in partials]
    return pa.array(buckets, pa.list_(pa.int32())), pa.array(counts, pa.list_(pa.int64()))


@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
def test_merge_and_quantiles_equal_the_scalar_functions(layout: HdrLayout) -> None:
    rng = np.random.default_rng(layout.significant_digits + layout.lowest)
    partials = _partials(layout, rng, 400)
    n_owners = 31  # the last owner gets nothing
    owner = rng.integers(0, n_owners - 1, len(partials))
    merged = hc.merge_by_owner(hc.from_lists(*_lists(partials)), owner, n_owners)
    assert len(merged) == n_owners
    ours = hc.quantiles(layout, merged, QS)
    for g in range(n_owners):
        rows = np.flatnonzero(owner == g)
        buckets = merged.buckets[merged.offsets[g] : merged.offsets[g + 1]]
        counts = merged.counts[merged.offsets[g] : merged.offsets[g + 1]]
        if rows.size == 0 or sum(len(partials[i][0]) for i in rows) == 0:
            assert buckets.size == 0 and np.isnan(ours[g]).all()
            continue
        idx, cnt = merge(np.concatenate([partials[i][0] for i in rows]),
                         np.concatenate([partials[i][1] for i in rows]))  # fmt: skip
        np.testing.assert_array_equal(buckets, idx)
        np.testing.assert_array_equal(counts, cnt)
        expected = [layout.quantile(idx, cnt, q) for q in QS]
        np.testing.assert_array_equal(ours[g], expected)
    assert merged.totals.sum() == sum(int(c.sum()) for _, c in partials)


def test_merge_does_not_depend_on_input_order() -> None:
    rng = np.random.default_rng(1)
    cols = hc.from_lists(*_lists(_partials(DEFAULT, rng, 200)))
    owner = rng.integers(0, 10, len(cols))
    base = hc.merge_by_owner(cols, owner, 10)
    perm = rng.permutation(len(cols))
    buckets, counts = hc.to_lists(cols)
    shuffled = hc.from_lists(buckets.take(pa.array(perm)), counts.take(pa.array(perm)))
    other = hc.merge_by_owner(shuffled, owner[perm], 10)
    for a, b in zip((base.offsets, base.buckets, base.counts),
                    (other.offsets, other.buckets, other.counts), strict=True):  # fmt: skip
        np.testing.assert_array_equal(a, b)


def test_lists_nulls_slices_and_round_trip() -> None:
    rng = np.random.default_rng(2)
    partials = _partials(DEFAULT, rng, 30)
    buckets, counts = _lists(partials)
    cols = hc.from_lists(buckets.slice(5, 20), counts.slice(5, 20))
    assert len(cols) == 20
    for row in range(20):
        b, c = partials[5 + row]
        np.testing.assert_array_equal(cols.buckets[cols.offsets[row] : cols.offsets[row + 1]], b)
        np.testing.assert_array_equal(cols.counts[cols.offsets[row] : cols.offsets[row + 1]], c)
    out_b, out_c = hc.to_lists(cols)
    again = hc.from_lists(out_b, out_c)
    np.testing.assert_array_equal(again.buckets, cols.buckets)
    chunked = hc.from_lists(pa.chunked_array([buckets[:10], buckets[10:]]),
                            pa.chunked_array([counts[:10], counts[10:]]))  # fmt: skip
    np.testing.assert_array_equal(chunked.counts, hc.from_lists(buckets, counts).counts)
    joined = hc.concat([cols, again])
    assert len(joined) == 40 and joined.totals.sum() == 2 * cols.totals.sum()


def test_errors() -> None:
    buckets = pa.array([[1, 2], [3]], pa.list_(pa.int32()))
    with pytest.raises(ValueError, match="differ in length"):
        hc.from_lists(buckets, pa.array([[1, 2], [3, 4]], pa.list_(pa.int64())))
    cols = hc.from_lists(buckets, pa.array([[1, 2], [3]], pa.list_(pa.int64())))
    with pytest.raises(ValueError, match="owners must be in 0..0"):
        hc.merge_by_owner(cols, [0, 1], 1)
    unsorted = hc.from_lists(pa.array([[5, 2]], pa.list_(pa.int32())),
                             pa.array([[1, 1]], pa.list_(pa.int64())))  # fmt: skip
    with pytest.raises(ValueError, match="series 0: bucket rows not sorted"):
        hc.quantiles(DEFAULT, unsorted, [0.5])
    fixed = hc.merge_by_owner(unsorted, [0], 1)
    assert fixed.buckets.tolist() == [2, 5]
    outside = hc.from_lists(pa.array([[DEFAULT.counts_len]], pa.list_(pa.int32())),
                            pa.array([[1]], pa.list_(pa.int64())))  # fmt: skip
    with pytest.raises(ValueError, match="outside"):
        hc.quantiles(DEFAULT, outside, [0.5])
    with pytest.raises(ValueError, match="q=-0.1 is outside"):
        hc.quantiles(DEFAULT, cols, [-0.1])


def test_merge_into_state() -> None:
    rng = np.random.default_rng(3)
    state = hc.merge_by_owner(hc.from_lists(*_lists(_partials(DEFAULT, rng, 40))),
                              rng.integers(0, 8, 40), 8)  # fmt: skip
    partials = hc.from_lists(*_lists(_partials(DEFAULT, rng, 25)))
    owner = rng.integers(0, 7, 25)
    into = hc.merge_into(state, partials, owner)
    both = hc.merge_by_owner(hc.concat([state, partials]), np.r_[np.arange(8), owner], 8)
    np.testing.assert_array_equal(into.offsets, both.offsets)
    np.testing.assert_array_equal(into.buckets, both.buckets)
    np.testing.assert_array_equal(into.counts, both.counts)
    last = slice(state.offsets[7], state.offsets[8])
    np.testing.assert_array_equal(into.buckets[into.offsets[7] :], state.buckets[last])


def _rows(rng: np.random.Generator, n: int, longest: int, shuffled: float) -> hc.HdrColumns:
    """Rows of random buckets, some empty, some zero counts: sorted and unique, but a
    ``shuffled`` share out of order and some sorted with repeated buckets (the merge sorts
    and adds those)."""
    rows = []
    for _ in range(n):
        buckets = rng.integers(0, DEFAULT.counts_len, int(rng.integers(0, longest)))
        draw = rng.uniform()
        if draw >= shuffled:
            buckets = np.sort(buckets) if draw < shuffled + 0.2 else np.unique(buckets)
        rows.append(buckets)
    offsets = np.r_[0, np.cumsum([len(b) for b in rows])]
    all_buckets = np.concatenate(rows).astype(np.int32)
    return hc.HdrColumns(offsets, all_buckets, rng.integers(0, 4, len(all_buckets)))


def _expected(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return merge(np.concatenate([b for b, _ in parts]), np.concatenate([c for _, c in parts]))


@pytest.mark.parametrize("chunks", [None, 2, 5])
def test_merges_of_unsorted_and_repeated_rows(monkeypatch: pytest.MonkeyPatch,
                                              chunks: int | None) -> None:  # fmt: skip
    """Sorted rows take the linear merge, others the dense scratch; split into chunks or
    not, every owner's rows are ``hdr.merge``'s."""
    monkeypatch.setattr(kernels, "FORCE_CHUNKS", chunks)
    rng = np.random.default_rng(40)
    state = _rows(rng, 50, 120, 0.1)
    partials = _rows(rng, 200, 15, 0.2)
    owner = rng.integers(0, 49, 200)  # the last window gets nothing
    into = hc.merge_into(state, partials, owner)
    by_owner = hc.merge_by_owner(partials, owner % 11, 12)

    def row(cols: hc.HdrColumns, i: int | np.integer[Any]) -> tuple[np.ndarray, np.ndarray]:
        lo, hi = cols.offsets[i], cols.offsets[i + 1]
        return cols.buckets[lo:hi], cols.counts[lo:hi]

    for g in range(50):
        parts = [row(state, g)] + [row(partials, i) for i in np.flatnonzero(owner == g)]
        buckets, counts = _expected([p for p in parts if len(p[0])])
        np.testing.assert_array_equal(row(into, g)[0], buckets)
        np.testing.assert_array_equal(row(into, g)[1], counts)
    for g in range(12):
        parts = [row(partials, i) for i in np.flatnonzero(owner % 11 == g)]
        buckets, counts = _expected([p for p in parts if len(p[0])])
        np.testing.assert_array_equal(row(by_owner, g)[0], buckets)
        np.testing.assert_array_equal(row(by_owner, g)[1], counts)
