"""Column t-digests against real datasketches: bytes, rank function, merge accuracy, quantiles."""

from __future__ import annotations

import itertools
import struct

import numpy as np
import pyarrow as pa
import pytest
from datasketches import tdigest_double

from streamgauge.sketches import digest_columns as dc
from streamgauge.sketches import kernels, tdigest

QS = (0.5, 0.9, 0.99, 0.999)


def _digest(values: np.ndarray, k: int = 200) -> tdigest_double:
    digest = tdigest_double(k)
    if len(values):
        digest.update(np.ascontiguousarray(values, dtype=np.float64))
    return digest


def _blob(values: np.ndarray, k: int = 200) -> bytes:
    return bytes(_digest(values, k).serialize())


def _rank_errors(ordered: np.ndarray, estimates: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Distance from q to the interval of true ranks the estimate occupies (test_tdigest's)."""
    below = np.searchsorted(ordered, estimates, "left") / len(ordered)
    at_or_below = np.searchsorted(ordered, estimates, "right") / len(ordered)
    errors: np.ndarray = np.maximum(0.0, np.maximum(below - qs, qs - at_or_below))
    return errors


def _probe_points(digest: tdigest_double) -> np.ndarray:
    lo, hi = digest.get_min_value(), digest.get_max_value()
    inside = np.linspace(lo, hi, 257)
    return np.concatenate([[lo - 1.0, lo, hi, hi + 1.0], inside, np.nextafter(inside, np.inf)])


def _assert_same_digest(ours: bytes, theirs: bytes) -> None:
    a, b = tdigest.deserialize_tdigest(ours), tdigest.deserialize_tdigest(theirs)
    assert a.is_empty() == b.is_empty()
    if a.is_empty():
        return
    assert a.get_total_weight() == b.get_total_weight()
    assert (a.get_min_value(), a.get_max_value()) == (b.get_min_value(), b.get_max_value())
    points = _probe_points(b)
    assert [a.get_rank(float(v)) for v in points] == [b.get_rank(float(v)) for v in points]


# -- decode / encode ----------------------------------------------------------------------


@pytest.mark.parametrize("size", [0, 1, 2, 10, 1_000, 20_000])
def test_round_trip_is_byte_exact(size: int) -> None:
    rng = np.random.default_rng(size)
    blob = _blob(rng.lognormal(3.0, 1.0, size))
    cols = dc.from_serialized(pa.array([blob, None, blob], pa.binary()))
    assert cols.sizes.tolist()[1] == 0
    out = dc.to_serialized(cols).to_pylist()
    assert out[0] == blob and out[2] == blob
    assert out[1] == _blob(np.zeros(0))  # NULL: an empty digest
    _assert_same_digest(out[0], blob)
    assert cols.total_weights.tolist() == [size, 0, size]
    if size:
        assert np.all(np.diff(cols.means[: cols.offsets[1]]) >= 0)


def test_sliced_chunked_and_misaligned_inputs() -> None:
    rng = np.random.default_rng(3)
    blobs = [_blob(rng.lognormal(3.0, 1.0, n)) for n in (5, 0, 1, 300, 7)]
    whole = dc.to_serialized(dc.from_serialized(pa.array(blobs, pa.binary()))).to_pylist()
    assert whole == blobs
    # a slice, a chunked array, and blobs that start off an 8-byte boundary in the data buffer
    sliced = pa.array(blobs, pa.binary()).slice(1, 3)
    assert dc.to_serialized(dc.from_serialized(sliced)).to_pylist() == blobs[1:4]
    chunked = pa.chunked_array([pa.array(blobs[:2], pa.binary()), pa.array(blobs[2:], pa.binary())])
    assert dc.to_serialized(dc.from_serialized(chunked)).to_pylist() == blobs
    data = b"xyz" + b"".join(blobs)
    offsets = np.cumsum([3] + [len(b) for b in blobs]).astype(np.int32)
    offsets = np.concatenate([[3], offsets[1:]]).astype(np.int32)
    shifted = pa.Array.from_buffers(
        pa.binary(), len(blobs), [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    assert shifted.to_pylist() == blobs
    assert dc.to_serialized(dc.from_serialized(shifted)).to_pylist() == blobs
    large = pa.array(blobs, pa.large_binary())
    assert dc.to_serialized(dc.from_serialized(large)).to_pylist() == blobs


def _with_buffer(centroids: list[tuple[float, int]], buffered: list[float], k: int = 200) -> bytes:
    """A blob with buffered values, as writers that serialize their buffer produce."""
    means = [m for m, _ in centroids] + buffered
    head = struct.pack("<BBBHBH", 2, 1, 20, k, 0, 0)
    body = struct.pack("<IIdd", len(centroids), len(buffered), min(means), max(means))
    body += b"".join(struct.pack("<dQ", m, w) for m, w in centroids)
    return head + body + struct.pack(f"<{len(buffered)}d", *buffered)


def test_buffered_values_become_unit_centroids_in_order() -> None:
    blob = _with_buffer([(1.0, 1), (5.0, 3), (9.0, 1)], [7.0, 5.0, 0.5])
    cols = dc.from_serialized(pa.array([blob], pa.binary()))
    assert cols.means.tolist() == [0.5, 1.0, 5.0, 5.0, 7.0, 9.0]
    assert cols.weights.tolist() == [1.0, 1.0, 1.0, 3.0, 1.0, 1.0]  # buffered before equal means
    assert (cols.mins[0], cols.maxs[0]) == (0.5, 9.0)
    theirs = tdigest.deserialize_tdigest(blob)  # datasketches compresses; too few to merge
    ours = tdigest.deserialize_tdigest(dc.to_serialized(cols).to_pylist()[0])
    assert ours.get_total_weight() == theirs.get_total_weight() == 8
    points = np.linspace(0.0, 10.0, 101)
    assert [ours.get_rank(v) for v in points] == [theirs.get_rank(v) for v in points]


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (b"\x02\x01\x14", "row 1: shorter than"),
        (b"\x01\x01\x07\xc8\x00\x01\x00\x00", "row 1: not a DataSketches t-digest"),
        (b"\x02\x01\x14\xc8\x00\x01\x00\x00", "row 1: preamble longs disagree"),
        (b"\x01\x01\x14\xc8\x00\x02\x00\x00", "row 1: shorter than"),
        (struct.pack("<BBBHBHd", 1, 1, 20, 200, 2, 0, float("nan")), "row 1: a NaN"),
        (_with_buffer([(1.0, 0), (2.0, 1)], []), "row 1: a centroid of weight 0"),
        (_blob(np.arange(3.0))[:-8], "row 1: shorter than"),
        (_blob(np.arange(3.0)) + b"\x00", "row 1: not a whole number"),
    ],
)
def test_invalid_blobs_name_the_row(blob: bytes, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        dc.from_serialized(pa.array([_blob(np.ones(2)), blob], pa.binary()))


def test_k_must_agree_unless_given() -> None:
    blobs = pa.array([_blob(np.arange(5.0), 100), _blob(np.arange(5.0), 200)], pa.binary())
    with pytest.raises(ValueError, match=r"different k \[100, 200\]"):
        dc.from_serialized(blobs)
    assert dc.from_serialized(blobs, k=300).k == 300
    assert dc.from_serialized(pa.array([None, _blob(np.ones(3), 50)], pa.binary())).k == 50
    out = dc.to_serialized(dc.from_serialized(blobs, k=300)).to_pylist()
    assert [tdigest.deserialize_tdigest(b).k for b in out] == [300, 300]


def test_fractional_weights_serialize_rounded() -> None:
    cols = dc.DigestColumns(
        np.array([0, 3, 4, 5]), np.array([1.0, 2.0, 3.0, 4.0, 5.0]),
        np.array([0.4, 2.5, 3.6, 1.2, 2.7]), np.array([1.0, 4.0, 5.0]),
        np.array([3.0, 4.0, 5.0]), np.zeros(3, np.bool_),
    )  # fmt: skip
    out = [tdigest.deserialize_tdigest(b) for b in dc.to_serialized(cols).to_pylist()]
    # 0.4 -> 1 (never 0), 2.5 -> 2 (half to even), 3.6 -> 4; a unit centroid: the short form
    assert [d.get_total_weight() for d in out] == [7, 1, 3]
    assert len(dc.to_serialized(cols).to_pylist()[1]) == 16
    assert dc.quantiles(cols, [0.0, 1.0])[0].tolist() == [1.0, 3.0]


# -- merge --------------------------------------------------------------------------------


def _panes(rng: np.random.Generator, n_panes: int, per_pane: int) -> tuple[list[bytes], np.ndarray]:
    values = rng.lognormal(3.0, 1.0, (n_panes, per_pane))
    return [_blob(row) for row in values], values.ravel()


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_merged_panes_meet_the_tail_bounds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    blobs, values = _panes(rng, 2000, 10)
    ordered = np.sort(values)
    cols = dc.from_serialized(pa.array(blobs, pa.binary()))
    one = dc.merge_by_owner(cols, np.zeros(len(blobs), np.int64), 1)
    # merge of shards: 7 shards of interleaved panes, then the shards
    shards = dc.merge_by_owner(cols, np.arange(len(blobs)) % 7, 7)
    of_shards = dc.merge_by_owner(shards, np.zeros(7, np.int64), 1)
    for merged in (one, of_shards):
        assert merged.total_weights.tolist() == [20_000.0]
        assert (merged.mins[0], merged.maxs[0]) == (ordered[0], ordered[-1])
        estimates = dc.quantiles(merged, QS)[0]
        errors = _rank_errors(ordered, estimates, np.array(QS))
        assert errors[2] <= 0.001 and errors[3] <= 0.0002
        assert errors[0] <= 0.015 and errors[1] <= 0.015
        # the same numbers as the scalar path on the serialized digest
        blob = dc.to_serialized(merged).to_pylist()[0]
        scalar = tdigest.quantiles(tdigest.deserialize_tdigest(blob), QS)
        assert estimates.tolist() == scalar.tolist()


def test_two_inputs_give_datasketches_own_merge_bytes() -> None:
    """``a.merge(b)`` of datasketches, bit for bit, in both merge directions and with ties."""
    rng = np.random.default_rng(5)
    cases = [
        (rng.lognormal(3.0, 1.0, 5_000), rng.lognormal(3.0, 1.0, 7_000)),
        (rng.integers(0, 20, 3_000).astype(float), rng.integers(0, 20, 4_000).astype(float)),
        (rng.normal(0.0, 1.0, 40), rng.normal(0.0, 1.0, 300)),
        (rng.uniform(0.0, 1.0, 3), rng.uniform(0.0, 1.0, 2)),
    ]
    for a_values, b_values in cases:
        for flip in (False, True):
            a, b = _digest(a_values), _digest(b_values)
            if flip:  # a digest whose next compress runs the other way
                a.merge(_digest(a_values[:1]))
            a_blob, b_blob = bytes(a.serialize()), bytes(b.serialize())
            a.merge(b)
            cols = dc.from_serialized(pa.array([a_blob, b_blob], pa.binary()))
            ours = dc.to_serialized(dc.merge_by_owner(cols, np.array([0, 0]), 1))
            assert ours.to_pylist()[0] == bytes(a.serialize())


def test_many_owners_at_once_equal_each_alone_and_are_deterministic() -> None:
    rng = np.random.default_rng(11)
    n_owners = 40
    blobs: list[bytes | None] = []
    owners: list[int] = []
    values: dict[int, list[np.ndarray]] = {g: [] for g in range(n_owners)}
    for _ in range(600):
        g = int(rng.integers(0, n_owners - 1))  # the last owner gets nothing
        size = int(rng.choice([0, 1, 10, 10, 10, 200, 3_000]))
        pane = rng.lognormal(rng.uniform(0, 4), 1.0, size)
        blobs.append(_blob(pane) if size or rng.random() < 0.5 else None)
        owners.append(g)
        values[g].append(pane)
    owner = np.array(owners)
    cols = dc.from_serialized(pa.array(blobs, pa.binary()))
    merged = dc.merge_by_owner(cols, owner, n_owners)
    together = dc.to_serialized(merged).to_pylist()
    assert together == dc.to_serialized(dc.merge_by_owner(cols, owner, n_owners)).to_pylist()
    assert together[-1] == _blob(np.zeros(0))
    ours_q = dc.quantiles(merged, QS)
    for g in range(n_owners - 1):
        rows = np.flatnonzero(owner == g)
        alone = dc.merge_by_owner(dc.take(cols, rows), np.zeros(len(rows), np.int64), 1)
        assert dc.to_serialized(alone).to_pylist()[0] == together[g]
        # datasketches' own sequential merge: within the same accuracy bounds of the truth
        theirs = tdigest.merge_tdigests(b for b in (blobs[i] for i in rows) if b is not None)
        ordered = np.sort(np.concatenate(values[g]))
        assert theirs.get_total_weight() == merged.total_weights[g] == len(ordered)
        if len(ordered) < 1_000:
            continue
        for estimates in (ours_q[g], tdigest.quantiles(theirs, QS)):
            errors = _rank_errors(ordered, estimates, np.array(QS))
            assert errors[2] <= 0.001 and errors[3] <= 0.0002 and errors[0] <= 0.015


def test_order_of_other_owners_does_not_matter() -> None:
    rng = np.random.default_rng(2)
    blobs = [_blob(rng.lognormal(3, 1, 50)) for _ in range(60)]
    owner = np.arange(60) % 6
    cols = dc.from_serialized(pa.array(blobs, pa.binary()))
    base = dc.to_serialized(dc.merge_by_owner(cols, owner, 6)).to_pylist()
    # interleave the owners differently, keeping each owner's own order
    perm = rng.permutation(60)
    for g in range(6):
        slots = np.flatnonzero(owner[perm] == g)
        perm[slots] = np.sort(perm[slots])
    moved = dc.to_serialized(dc.merge_by_owner(dc.take(cols, perm), owner[perm], 6)).to_pylist()
    assert moved == base


def test_small_owners_keep_every_value() -> None:
    """Below ~160 values at k=200 the K_2 bound lets no two values share a centroid."""
    rng = np.random.default_rng(9)
    values = rng.lognormal(3.0, 1.0, (15, 10))
    cols = dc.from_serialized(pa.array([_blob(row) for row in values], pa.binary()))
    merged = dc.merge_by_owner(cols, np.zeros(15, np.int64), 1)
    assert merged.means.tolist() == np.sort(values.ravel()).tolist()
    assert set(merged.weights.tolist()) == {1.0}


def test_single_input_passes_through_and_empty_owner() -> None:
    rng = np.random.default_rng(4)
    blob = _blob(rng.lognormal(3, 1, 5_000))
    cols = dc.from_serialized(pa.array([None, blob, _blob(np.zeros(0))], pa.binary()))
    out = dc.to_serialized(dc.merge_by_owner(cols, np.array([0, 0, 0]), 3)).to_pylist()
    assert out[0] == blob
    assert out[1] == out[2] == _blob(np.zeros(0))
    with pytest.raises(ValueError, match="owners must be in 0..2"):
        dc.merge_by_owner(cols, np.array([0, 3, 0]), 3)
    with pytest.raises(ValueError, match="owner has shape"):
        dc.merge_by_owner(cols, np.array([0, 0]), 3)


# -- quantiles ----------------------------------------------------------------------------


def test_quantiles_equal_the_scalar_path() -> None:
    rng = np.random.default_rng(21)
    qs = np.sort(np.concatenate([[0.0, 1e-6, 1.0], np.linspace(0.001, 0.999, 97), list(QS)]))
    sizes = [1, 2, 3, 10, 100, 159, 161, 1_000, 20_000]
    data = [rng.lognormal(3.0, 1.0, n) for n in sizes]
    data += [rng.integers(0, 5, 500).astype(float), np.full(300, 7.0), rng.normal(0, 1, 2_000),
             rng.uniform(-1e-3, 1e6, 5_000)]  # fmt: skip
    # unit centroids with equal means (values in whole milliseconds), values near 0
    data += [np.round(rng.lognormal(3.0, 1.0, n)) for n in (20, 100, 150)]
    data += [rng.normal(0.0, 1e-300, 100), np.r_[-1e300, rng.normal(0, 1, 50), 1e300]]
    blobs = [_blob(values) for values in data]
    for values in data[-4:]:  # merged digests, compressed in the reverse direction
        digest = _digest(values)
        digest.merge(_digest(rng.lognormal(3.0, 1.0, 3_000)))
        blobs.append(bytes(digest.serialize()))
    cols = dc.from_serialized(pa.array([*blobs, None], pa.binary()))
    ours = dc.quantiles(cols, qs)
    assert np.isnan(ours[-1]).all()
    for row, blob in enumerate(blobs):
        theirs = tdigest.quantiles(tdigest.deserialize_tdigest(blob), qs)
        np.testing.assert_array_equal(ours[row], theirs)  # bit for bit
        assert np.all(np.diff(ours[row]) >= 0)
    with pytest.raises(ValueError, match="q=1.5 is outside"):
        dc.quantiles(cols, [0.5, 1.5])


def _bisection(cols: dc.DigestColumns, i: int, q: float) -> float:
    """``tdigest._quantile``'s bisection on series ``i``, with the kernels' ``_rank``."""
    lo_c, hi_c = int(cols.offsets[i]), int(cols.offsets[i + 1])
    cum = np.r_[0.0, np.cumsum(cols.weights[lo_c:hi_c])]
    total, lo, hi = cum[-1], cols.mins[i], cols.maxs[i]

    def rank(value: float) -> float:
        r, _, _ = dc._rank(cols.means, cols.weights, cum, lo_c, hi_c, total, cols.mins[i],
                           cols.maxs[i], value, lo_c, hi_c)  # fmt: skip
        return float(r)

    if q <= 0.0 or rank(lo) >= q:
        return float(lo)
    if q >= 1.0:
        return float(hi)
    for _ in range(80):
        mid = lo + (hi - lo) / 2.0
        if mid <= lo or mid >= hi:
            break
        if rank(mid) >= q:
            hi = mid
        else:
            lo = mid
    return float(hi)


def test_quantiles_of_any_columns_equal_the_bisection() -> None:
    """Fractional weights, equal means, a max above the last mean, a min below the first (not
    the inverted path): the bisection's numbers in every case."""
    rng = np.random.default_rng(22)
    qs = np.array([0.0, 1e-9, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0])
    sizes = rng.integers(1, 60, 120)
    offsets = np.r_[0, np.cumsum(sizes)]
    means = np.round(rng.lognormal(2.0, 1.0, offsets[-1]), rng.integers(0, 3))
    for a, b in itertools.pairwise(offsets):
        means[a:b].sort()
    weights = np.where(rng.uniform(size=len(means)) < 0.5, 1.0, rng.uniform(0.2, 6.0, len(means)))
    spans = list(itertools.pairwise(offsets))
    mins = np.array([means[a:b].min() for a, b in spans]) - (rng.uniform(size=120) < 0.1)
    maxs = np.array([means[a:b].max() for a, b in spans]) + 3.0 * (rng.uniform(size=120) < 0.3)
    cols = dc.DigestColumns(offsets, means, weights, mins, maxs, np.zeros(120, np.bool_))
    ours = dc.quantiles(cols, qs)
    for i in range(120):
        assert ours[i].tolist() == [_bisection(cols, i, float(q)) for q in qs], i


def test_take_and_concat() -> None:
    rng = np.random.default_rng(8)
    blobs = [_blob(rng.lognormal(3, 1, n)) for n in (3, 0, 50, 1)]
    cols = dc.from_serialized(pa.array(blobs, pa.binary()))
    picked = dc.take(cols, [2, 0, 2])
    assert dc.to_serialized(picked).to_pylist() == [blobs[2], blobs[0], blobs[2]]
    joined = dc.concat([cols, picked])
    assert dc.to_serialized(joined).to_pylist() == blobs + [blobs[2], blobs[0], blobs[2]]
    assert len(dc.concat([])) == 0


def test_gather_takes_rows_of_several_parts_in_order() -> None:
    """Rows of several parts in one copy: the columns of those rows' own digests."""
    rng = np.random.default_rng(12)
    blobs = [[_blob(rng.lognormal(3, 1, n)) if n >= 0 else None for n in sizes]
             for sizes in ([3, 0, 50, -1, 1], [400, 7], [2])]  # fmt: skip
    parts = [dc.from_serialized(pa.array(part, pa.binary())) for part in blobs]
    picks = [[4, 0, 2, 2, 3], [], [0]]
    gathered = dc.gather(list(zip(parts, picks, strict=True)), k=300)
    picked = [blobs[p][r] for p, rows in enumerate(picks) for r in rows]
    expected = dc.from_serialized(pa.array(picked, pa.binary()), k=300)
    for name in ("offsets", "means", "weights", "mins", "maxs", "reverse_merge"):
        assert getattr(gathered, name).tolist() == getattr(expected, name).tolist(), name
    assert gathered.k == 300 and len(dc.gather([])) == 0
    assert dc.to_serialized(dc.take(parts[1], [1, 0])).to_pylist() == blobs[1][::-1]


def test_unsorted_input_merges_as_if_stably_sorted_first() -> None:
    """Columns not sorted by mean (no datasketches digest is) take the full stable sort."""
    rng = np.random.default_rng(6)
    sizes = [300, 40, 40, 0, 200]
    means = np.round(rng.lognormal(3.0, 1.0, sum(sizes)), 1)  # rounded: equal means too
    weights = rng.integers(1, 4, len(means)).astype(float)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    spans = list(itertools.pairwise(offsets))
    mins = np.array([means[a:b].min() if b > a else np.inf for a, b in spans])
    maxs = np.array([means[a:b].max() if b > a else -np.inf for a, b in spans])
    flags = np.array([True, False, True, False, False])
    shuffled = dc.DigestColumns(offsets, means, weights, mins, maxs, flags)
    order = np.concatenate([a + np.argsort(means[a:b], kind="stable") for a, b in spans])
    ordered = dc.DigestColumns(offsets, means[order], weights[order], mins, maxs, flags)
    owner = np.array([0, 0, 1, 1, 1])
    for first in (0, 2):  # the shuffled series as the running digest, then as a partial
        perm = np.r_[first, [i for i in range(5) if i != first]]
        a = dc.merge_by_owner(dc.take(shuffled, perm), owner, 2)
        b = dc.merge_by_owner(dc.take(ordered, perm), owner, 2)
        assert dc.to_serialized(a).to_pylist() == dc.to_serialized(b).to_pylist()


def test_merge_into_state_equals_merge_by_owner_of_both() -> None:
    rng = np.random.default_rng(12)
    state_blobs: list[bytes | None] = [_blob(rng.lognormal(3, 1, n)) for n in (5_000, 0, 1, 400)]
    state_blobs += [None, _blob(rng.lognormal(3, 1, 20_000))]
    pane_blobs = [_blob(rng.lognormal(3, 1, 10)) for _ in range(30)]
    owner = rng.integers(0, 5, 30)  # the last window gets no partial
    state = dc.from_serialized(pa.array(state_blobs, pa.binary()))
    panes = dc.from_serialized(pa.array(pane_blobs, pa.binary()))
    merged = dc.to_serialized(dc.merge_into(state, panes, owner)).to_pylist()
    both = dc.merge_by_owner(dc.concat([state, panes]), np.r_[np.arange(6), owner], 6)
    assert merged == dc.to_serialized(both).to_pylist()
    assert merged[5] == state_blobs[5]
    assert dc.merge_into(state, dc.DigestColumns.empty(0), []).means.tolist() == (
        state.means.tolist()
    )
    assert len(dc.merge_by_owner(dc.DigestColumns.empty(0), [], 3)) == 3


# -- threads ------------------------------------------------------------------------------


def _mixed_columns(rng: np.random.Generator, n: int, per: int) -> dc.DigestColumns:
    """``n`` digests: empty ones, unit centroids, ties, large compressed ones."""
    blobs: list[bytes | None] = []
    for i in range(n):
        kind = i % 5
        if kind == 0:
            blobs.append(None)
        elif kind == 1:
            blobs.append(_blob(np.round(rng.lognormal(3.0, 1.0, per))))
        elif kind == 2:
            blobs.append(_blob(rng.lognormal(3.0, 1.0, 5_000)))
        else:
            blobs.append(_blob(rng.lognormal(3.0, 1.0, int(rng.integers(1, 2 * per)))))
    return dc.from_serialized(pa.array(blobs, pa.binary()))


def _same(a: dc.DigestColumns, b: dc.DigestColumns) -> None:
    for name in ("offsets", "means", "weights", "mins", "maxs", "reverse_merge"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))


@pytest.mark.parametrize("chunks", [2, 3, 8])
def test_chunked_kernels_equal_the_serial_ones(monkeypatch: pytest.MonkeyPatch,
                                               chunks: int) -> None:  # fmt: skip
    """The multi-threaded kernels (rows split into chunks, merged chunks moved together)
    give the serial kernels' arrays and bytes."""
    rng = np.random.default_rng(chunks)
    state = _mixed_columns(rng, 60, 100)
    panes = dc.from_serialized(pa.array([_blob(rng.lognormal(3, 1, 10)) for _ in range(150)],
                                        pa.binary()))  # fmt: skip
    owner = rng.integers(0, 60, 150)
    serial = (dc.merge_into(state, panes, owner), dc.merge_by_owner(panes, owner % 7, 9))
    serial_q = [dc.quantiles(cols, QS) for cols in (state, *serial)]
    serial_bytes = [dc.to_serialized(cols) for cols in (state, *serial)]
    monkeypatch.setattr(kernels, "FORCE_CHUNKS", chunks)
    chunked = (dc.merge_into(state, panes, owner), dc.merge_by_owner(panes, owner % 7, 9))
    for a, b in zip(serial, chunked, strict=True):
        _same(a, b)
    for cols, q, blobs in zip((state, *serial), serial_q, serial_bytes, strict=True):
        np.testing.assert_array_equal(dc.quantiles(cols, QS), q)
        assert dc.to_serialized(cols).equals(blobs)


def test_results_do_not_depend_on_the_thread_count() -> None:
    rng = np.random.default_rng(31)
    state = _mixed_columns(rng, 3_000, 100)
    panes = dc.from_serialized(pa.array([_blob(rng.lognormal(3, 1, 10)) for _ in range(3_000)],
                                        pa.binary()))  # fmt: skip
    owner = rng.integers(0, 3_000, 3_000)
    results = []
    before = kernels.threads()
    try:
        for count in (1, 2, 3):
            kernels.set_threads(count)
            merged = dc.merge_into(state, panes, owner)
            results.append((merged, dc.quantiles(merged, QS), dc.to_serialized(merged)))
    finally:
        kernels.set_threads(before)
    for merged, q, blobs in results[1:]:
        _same(merged, results[0][0])
        np.testing.assert_array_equal(q, results[0][1])
        assert blobs.equals(results[0][2])
