"""t-digest accuracy against its targets (rank error ≤ 0.015 mid-range at the default k, far
smaller in the tails), one digest and merged panes (seeded)."""

from __future__ import annotations

import numpy as np
import pytest

from streamgauge.sketches import tdigest

N = 200_000
PANES = 60
MID = np.round(np.arange(0.50, 0.9001, 0.01), 2)


def _rank_errors(ordered: np.ndarray, estimates: np.ndarray, qs: np.ndarray) -> np.ndarray:
    """Distance from q to the interval of true ranks the estimate occupies (0 if inside)."""
    below = np.searchsorted(ordered, estimates, "left") / len(ordered)
    at_or_below = np.searchsorted(ordered, estimates, "right") / len(ordered)
    errors: np.ndarray = np.maximum(0.0, np.maximum(below - qs, qs - at_or_below))
    return errors


def _data(name: str) -> np.ndarray:
    rng = np.random.default_rng(42)
    if name == "uniform":
        return rng.uniform(0.0, 100.0, N)
    if name == "lognormal":
        return rng.lognormal(3.0, 1.0, N)
    if name == "sorted":
        return np.sort(rng.lognormal(3.0, 1.0, N))
    # Latency-like two modes (cache hit / miss), 70/30, overlapping tails.
    fast = rng.lognormal(np.log(2.0), 0.4, N * 7 // 10)
    slow = rng.lognormal(np.log(40.0), 0.5, N - N * 7 // 10)
    return rng.permutation(np.concatenate([fast, slow]))


@pytest.mark.parametrize("name", ["uniform", "lognormal", "bimodal", "sorted"])
def test_k200_rank_error_one_digest_and_merged_panes(name: str) -> None:
    data = _data(name)
    ordered = np.sort(data)
    one = tdigest.build_tdigest(data)
    panes = [
        tdigest.serialize_tdigest(tdigest.build_tdigest(p)) for p in np.array_split(data, PANES)
    ]
    merged = tdigest.merge_tdigests(panes)
    assert merged.get_total_weight() == one.get_total_weight() == N
    for digest in (one, merged):
        tails = _rank_errors(
            ordered, tdigest.quantiles(digest, [0.99, 0.999]), np.array([0.99, 0.999])
        )
        assert tails[0] <= 0.001
        assert tails[1] <= 0.0002
        assert _rank_errors(ordered, tdigest.quantiles(digest, MID), MID).max() <= 0.015


def test_gap_at_the_median_is_the_known_weak_case() -> None:
    """Two modes with nothing between them at q=0.5: mid-range rank error reaches ~0.02 at
    k=200 (measured 0.019; accuracy.TDIGEST_RANK_ERROR), beyond the 0.015 target. Pinned here so
    a change is noticed; the HDR histogram answers these quantiles within 1 % in value."""
    rng = np.random.default_rng(0)
    data = rng.permutation(np.concatenate([rng.normal(10, 1, N // 2), rng.normal(100, 5, N // 2)]))
    digest = tdigest.build_tdigest(data)
    err = _rank_errors(np.sort(data), tdigest.quantiles(digest, MID), MID)
    assert 0.005 < err.max() <= 0.025
    assert err[MID >= 0.6].max() <= 0.015  # away from the gap the target holds


def test_quantiles_are_monotonic_unlike_get_quantile() -> None:
    digest = tdigest.build_tdigest(np.random.default_rng(1).lognormal(3.0, 1.0, 50_000))
    qs = np.linspace(0.0, 1.0, 2001)
    ours = tdigest.quantiles(digest, qs)
    assert np.all(np.diff(ours) >= 0)
    assert ours[0] == digest.get_min_value() and ours[-1] == digest.get_max_value()
    # The library method this replaces (datasketches 5.2): if this starts passing, upstream fixed
    # the interpolation and quantiles() may go back to get_quantile.
    library = np.array([digest.get_quantile(q) for q in qs])
    assert np.any(np.diff(library) < 0)


def test_ranks_and_errors() -> None:
    digest = tdigest.build_tdigest(np.arange(1.0, 1001.0))
    assert tdigest.ranks(digest, [500.5])[0] == pytest.approx(0.5, abs=0.002)
    with pytest.raises(ValueError, match="1 of 3 values are NaN or infinite"):
        tdigest.build_tdigest([1.0, float("nan"), 2.0])
    with pytest.raises(ValueError, match="empty t-digest"):
        tdigest.quantiles(tdigest.new_tdigest(), [0.5])
    with pytest.raises(ValueError, match="q=1.5 is outside"):
        tdigest.quantiles(digest, [1.5])
    with pytest.raises(ValueError, match="k=5 is invalid"):
        tdigest.new_tdigest(5)
    with pytest.raises(ValueError, match="not a serialized t-digest"):
        tdigest.deserialize_tdigest(b"\x00\x01garbage")
