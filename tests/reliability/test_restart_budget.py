"""The window job restarts failed queries a bounded number of times per period."""

from __future__ import annotations

from streamgauge.clock import ManualClock
from streamgauge.daemon import RestartBudget


def test_restarts_are_allowed_up_to_the_limit_within_the_period_then_again_after_it() -> None:
    clock = ManualClock(1_000_000)
    budget = RestartBudget(clock, limit=3, period_ms=60_000)
    assert [budget.take() for _ in range(3)] == [True, True, True]
    assert budget.take() is False
    assert budget.describe() == "restart 3 of 3 allowed in 60 s"
    clock.set(1_000_000 + 59_999)
    assert budget.take() is False  # the first restart is still inside the period
    clock.set(1_000_000 + 60_000)
    assert budget.take() is True  # all three have aged out; this is one of one
    assert budget.describe() == "restart 1 of 3 allowed in 60 s"
