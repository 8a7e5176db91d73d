"""The cardinality guard: active series by recent activity, overflow when over a limit."""

from __future__ import annotations

import pytest

from streamgauge.ingest.guard import CardinalityGuard, CardinalityLimits


def _series(metric: str, value: str) -> tuple[str, str, tuple[tuple[str, str], ...]]:
    return (metric, "c", (("k", value),))


def test_the_docstring_timeline() -> None:
    """
    t=0  a → admitted, t=1 b → admitted, t=2 c → overflow,
    t=9  a → refreshed, t=12 c → admitted (b idle since 1, expired at 11)
    """
    expired: list[object] = []
    guard = CardinalityGuard(CardinalityLimits(max_series=2, ttl_ms=10), expired.append)
    a, b, c = _series("m", "a"), _series("m", "b"), _series("m", "c")
    assert guard.admit(a, 0) and guard.admit(b, 1)
    assert not guard.admit(c, 2)
    assert guard.admit(a, 9)
    assert guard.admit(c, 12)
    assert expired == [b]
    assert guard.active == 2


def test_the_per_metric_limit_leaves_other_metrics_alone() -> None:
    guard = CardinalityGuard(CardinalityLimits(max_series=0, max_series_per_metric=3))
    admitted = [guard.admit(_series("noisy", str(i)), 0) for i in range(5)]
    assert admitted == [True, True, True, False, False]
    assert guard.admit(_series("quiet", "x"), 0)
    assert guard.admit(_series("noisy", "0"), 1)  # an established series keeps its slot


def test_zero_disables_both_limits() -> None:
    guard = CardinalityGuard(CardinalityLimits(max_series=0, max_series_per_metric=0))
    assert all(guard.admit(_series("m", str(i)), 0) for i in range(1000))


def test_limits_are_validated_with_every_problem_named() -> None:
    with pytest.raises(ValueError, match="max_series must be >= 0.*ttl_ms must be positive"):
        CardinalityLimits(max_series=-1, ttl_ms=0)


def test_refresh_many_is_refresh_in_order() -> None:
    """The fast path's bulk report: the same order and times as one ``refresh`` per series,
    series that are not active (or freed slots, None) ignored."""
    one, many = CardinalityGuard(), CardinalityGuard()
    series = [("m", "c", (("host", str(i)),)) for i in range(4)]
    for guard in (one, many):
        for index, s in enumerate(series[:3]):
            assert guard.admit(s, 1_000 + index)
    for s, seen in ((series[1], 2_000), (series[3], 2_001), (series[0], 2_002)):
        one.refresh(s, seen)
    many.refresh_many([series[1], series[3], None, series[0]], [2_000, 2_001, 2_001, 2_002])
    assert list(many._last_seen.items()) == list(one._last_seen.items()) == [
        (series[2], 1_002), (series[1], 2_000), (series[0], 2_002)]
