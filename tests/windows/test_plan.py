"""A config compiles into one plan: a query per window, with its name, checkpoint, idle span
and boundaries, which the job, retention, the receivers and `status` all read."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamgauge.configs import parse_config
from streamgauge.windows.plan import JobPaths, WindowPlan

CONFIG = """
name: shop
pane: 1s
windows:
  - {name: t10, kind: tumbling, size: 10s, watermark_delay: 1s, allowed_lateness: 2s}
  - {name: h10, kind: hopping, size: 10s, hop: 5s, watermark_delay: 1s, allowed_lateness: 2s}
  - {name: s10, kind: sliding, size: 10s, watermark_delay: 1s, allowed_lateness: 2s}
  - {name: sess, kind: session, gap: 3s, key: user, watermark_delay: 1s, allowed_lateness: 2s}
  - {name: k10, kind: tumbling, size: 10s, quantiles: kll}
  - {name: e60, kind: tumbling, size: 60s, offset: 15s, early_every: 20s, watermark_delay: 2s,
     allowed_lateness: 0s}
"""

#   window  idle span = pane + reach + delay + lateness (reach: size; session: gap;
#           sliding: size + a pane; delay and lateness by default 1 s and 0 s)
#                                                 boundaries (stride, phase): where the
#           watermark changes the results (ends, early ticks; any pane)
EXPECTED = {
    "t10": (1_000 + 10_000 + 1_000 + 2_000, (10_000, 0)),
    "h10": (1_000 + 10_000 + 1_000 + 2_000, (5_000, 0)),
    "s10": (1_000 + 11_000 + 1_000 + 2_000, (1_000, 0)),
    "sess": (1_000 + 3_000 + 1_000 + 2_000, (1_000, 0)),
    "k10": (1_000 + 10_000 + 1_000 + 0, (10_000, 0)),
    "e60": (1_000 + 60_000 + 2_000 + 0, (20_000, 15_000)),
}


@pytest.fixture
def plan(tmp_path: Path) -> WindowPlan:
    paths = JobPaths(spool=tmp_path / "spool", checkpoints=tmp_path / "checkpoints")
    return WindowPlan.of(parse_config(CONFIG, "shop"), paths)


@pytest.mark.parametrize("window", EXPECTED)
def test_each_window_is_one_query(plan: WindowPlan, window: str) -> None:
    query = plan.query(window)
    assert (query.quiet_span_ms, query.boundaries_ms) == EXPECTED[window]
    assert (query.name, query.late_name) == (f"shop.{window}", f"shop.{window}.late")
    assert query.checkpoint.parent == plan.paths.checkpoints / "shop"
    assert query.checkpoint.name.startswith(f"{window}-")


def test_checkpoints_are_one_per_window_and_follow_the_window_s_shape(
    plan: WindowPlan, tmp_path: Path
) -> None:
    assert plan.checkpoints == [q.checkpoint for q in plan.queries]
    assert len(set(plan.checkpoints)) == len(EXPECTED)
    resized = WindowPlan.of(parse_config(CONFIG.replace("size: 10s, watermark", "size: 20s, "
                                                        "watermark", 1), "shop"), plan.paths)
    assert resized.query("t10").checkpoint != plan.query("t10").checkpoint  # a fresh one
    assert resized.query("h10").checkpoint == plan.query("h10").checkpoint
    # the sketch a window merges is part of its shape: its state starts afresh
    tdigest = WindowPlan.of(parse_config(CONFIG.replace(", quantiles: kll", ""), "shop"),
                            plan.paths)  # fmt: skip
    assert tdigest.query("k10").checkpoint != plan.query("k10").checkpoint
    with pytest.raises(KeyError, match="no window 'nope'"):
        plan.query("nope")
