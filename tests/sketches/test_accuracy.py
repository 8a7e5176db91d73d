"""Accuracy as the knob: targets compile into sketch parameters, or fail with a clear sentence."""

from __future__ import annotations

import numpy as np
import pytest

from streamgauge.sketches import tdigest
from streamgauge.sketches.accuracy import (
    TDIGEST_RANK_ERROR,
    SketchParams,
    compile_accuracy,
    hll_error,
)


def test_defaults() -> None:
    params = compile_accuracy()
    assert (params.hll_lg_k, params.tdigest_k, params.hdr_significant_digits) == (12, 200, 2)
    assert params.value_scale == 1000.0  # ms -> integer µs
    assert (params.hdr_lowest, params.hdr_highest) == (1, 3_600_000_000)
    assert params.warnings == ()
    # DataSketches' 2-sigma union bounds at lgK 12: 3.183 % on one side, 3.283 % on the other.
    assert params.distinct_error == pytest.approx(0.03283, abs=1e-5)
    assert params == SketchParams(**{**params.__dict__})


@pytest.mark.parametrize(
    ("distinct_error", "lg_k"),
    [(0.5, 5), (0.0329, 12), (0.0325, 13), (0.02, 14), (0.01, 16), (0.0015, 21)],
)
def test_distinct_error_picks_smallest_sufficient_lg_k(distinct_error: float, lg_k: int) -> None:
    params = compile_accuracy(distinct_error=distinct_error)
    assert params.hll_lg_k == lg_k
    assert hll_error(lg_k) <= distinct_error < hll_error(lg_k - 1)


@pytest.mark.parametrize(
    ("quantile_error", "k", "digits"),
    [(0.05, 100, 2), (0.02, 200, 2), (0.01, 400, 2), (0.005, 600, 3), (0.001, 1000, 3)],
)
def test_quantile_error_picks_k_and_digits(quantile_error: float, k: int, digits: int) -> None:
    params = compile_accuracy(quantile_error=quantile_error)
    assert (params.tdigest_k, params.hdr_significant_digits) == (k, digits)
    assert params.quantile_rank_error == TDIGEST_RANK_ERROR[k] <= quantile_error


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"distinct_error": 0.0}, "distinct_error=0.0 is impossible"),
        ({"distinct_error": 1.0}, "distinct_error=1.0 is impossible"),
        ({"distinct_error": -0.1}, "distinct_error=-0.1 is impossible"),
        ({"distinct_error": 0.001}, "needs HLL lgK above 21"),
        ({"distinct_error": float("nan")}, "distinct_error=nan is not a number"),
        ({"quantile_error": 0.0}, "quantile_error=0.0 is impossible"),
        ({"quantile_error": 1.5}, "quantile_error=1.5 is impossible"),
        ({"quantile_error": 0.00005}, "impossible for the t-digest"),
        ({"value_range": (0.0, 10.0)}, "value_range=(0.0, 10.0) is impossible"),
        ({"value_range": (5.0, 1.0)}, "value_range=(5.0, 1.0) is impossible"),
        ({"value_range": (1e-9, 1e12)}, "exceeds 2^62"),
    ],
)
def test_impossible_targets_name_the_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(
        ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("^", r"\^")
    ):
        compile_accuracy(**kwargs)  # type: ignore[arg-type]


def test_expensive_targets_compile_with_warnings() -> None:
    params = compile_accuracy(distinct_error=0.005, quantile_error=0.0001)
    assert params.hll_lg_k == 18 and params.tdigest_k == 2000
    assert params.hdr_significant_digits == 4
    assert len(params.warnings) == 3
    assert "lgK 18" in params.warnings[0] and "256 KiB" in params.warnings[0]
    assert "k 2000" in params.warnings[1]
    assert "4 significant digits" in params.warnings[2]


@pytest.mark.parametrize(
    ("value_range", "digits", "scale"),
    [((0.1, 3_600_000.0), 2, 1000.0), ((1.0, 60_000.0), 2, 100.0), ((0.05, 100.0), 3, 1e5)],
)
def test_value_range_sets_scale(
    value_range: tuple[float, float], digits: int, scale: float
) -> None:
    params = compile_accuracy(quantile_error=10.0**-digits, value_range=value_range)
    assert params.value_scale == scale
    # low lands at >= 10^d scaled units: the relative bound holds from low upward.
    assert value_range[0] * scale >= 10**digits - 1e-9
    assert params.hdr_highest == round(value_range[1] * scale)


def test_compiled_k_meets_quantile_error_mid_range() -> None:
    """quantile_error=0.005 compiles to k=600; check it, on the worst case (a gap at the median),
    as one digest and as 60 merged panes."""
    target = 0.005
    k = compile_accuracy(quantile_error=target).tdigest_k
    rng = np.random.default_rng(11)
    data = rng.permutation(
        np.concatenate([rng.normal(10, 1, 100_000), rng.normal(100, 5, 100_000)])
    )
    ordered = np.sort(data)
    one = tdigest.build_tdigest(data, k)
    merged = tdigest.merge_tdigests(
        (tdigest.serialize_tdigest(tdigest.build_tdigest(p, k)) for p in np.array_split(data, 60)),
        k,
    )
    qs = np.round(np.arange(0.5, 0.9001, 0.01), 2)
    for digest in (one, merged):
        est = tdigest.quantiles(digest, qs)
        below = np.searchsorted(ordered, est, "left") / len(ordered)
        at_or_below = np.searchsorted(ordered, est, "right") / len(ordered)
        assert np.maximum(0, np.maximum(below - qs, qs - at_or_below)).max() <= target
