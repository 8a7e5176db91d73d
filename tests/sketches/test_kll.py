"""KLL for ``quantiles: kll`` windows: k from the target, the rank bound after merging, the format.

Statistical and frozen (STYLE 10): many seeded trials of pane sketches built by the real ingest
code (``PaneSketches``), merged across panes and receivers as Spark merges them, against
DataSketches' published a-priori bound; and a blob of each side (Python, Spark) kept in test
data, so a format change on either side fails here.
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest

from streamgauge.ingest.pane_sketches import PaneSketches
from streamgauge.sketches.accuracy import DEFAULT_KLL_K, compile_accuracy, kll_error
from streamgauge.sketches.kll import deserialize_kll, merge_kll, new_kll, serialize_kll

DATA = Path(__file__).resolve().parent.parent / "data" / "sketches"
QUANTILES = (0.5, 0.9)


def test_default_k_is_the_librarys_and_sparks() -> None:
    params = compile_accuracy()
    assert (params.kll_k, DEFAULT_KLL_K) == (200, 200)
    assert params.kll_rank_error == pytest.approx(0.01329, abs=1e-5)  # k 200: ±1.33 %


@pytest.mark.parametrize(
    ("quantile_error", "k"), [(0.05, 52), (0.02, 132), (0.01, 269), (0.001, 2863)]
)
def test_quantile_error_picks_the_smallest_sufficient_kll_k(quantile_error: float, k: int) -> None:
    params = compile_accuracy(quantile_error=quantile_error)
    assert params.kll_k == k
    assert kll_error(k) <= quantile_error < kll_error(k - 1)
    assert params.kll_rank_error == kll_error(k)


def _rank(ordered: np.ndarray, value: float) -> float:
    return float(np.searchsorted(ordered, value, side="right")) / len(ordered)


def _pane_klls(values: np.ndarray, rng: np.random.Generator, k: int) -> list[bytes | None]:
    """The ``kll`` column of the partials 2 receivers x 10 panes would write for ``values``."""
    receiver = rng.integers(0, 2, len(values))
    pane = rng.integers(0, 10, len(values))
    blobs: list[bytes | None] = []
    for r in range(2):
        sketches = PaneSketches(compile_accuracy(), kll_k=k)
        keys = [(("api.latency", "ms", "{}"), p * 1000) for p in range(10)]
        for p, key in enumerate(keys):
            sketches.add_values(key, values[(receiver == r) & (pane == p)])
        *_, kll = sketches.columns(keys)
        blobs += kll.to_pylist()
    return blobs


@pytest.mark.parametrize("distribution", ["uniform", "lognormal"])
def test_merged_pane_sketches_meet_the_rank_bound_at_p50_and_p90(distribution: str) -> None:
    """100 seeded trials of 20 000 values: the merge of 20 pane sketches (the stored window
    sketch) and one sketch of all values, each within ±kll_error(200) in rank at p50/p90.
    The bound holds with 99 % confidence per quantile, so at most 2 % of answers may exceed
    it; every one must stay within 1.5x of it."""
    k, trials, n = 200, 100, 20_000
    bound = kll_error(k)
    errors: dict[str, list[float]] = {"merged": [], "single": []}
    for seed in range(trials):
        rng = np.random.default_rng([20261122, seed])
        if distribution == "uniform":
            values = rng.uniform(0.0, 1000.0, n)
        else:
            values = rng.lognormal(3.0, 0.8, n)
        ordered = np.sort(values)
        merged = merge_kll(_pane_klls(values, rng, k), k)
        assert merged.n == n and merged.k == k
        single = new_kll(k)
        single.update(values)
        for name, sketch in (("merged", merged), ("single", single)):
            for q in QUANTILES:
                errors[name].append(abs(_rank(ordered, sketch.get_quantile(q)) - q))
    for name, found in errors.items():
        over = sum(e > bound + 1 / n for e in found) / len(found)
        print(f"KLL k {k}, {distribution}, {name}: {len(found)} answers (p50, p90 x {trials} "
              f"trials), rank error max {max(found):.4f} mean {np.mean(found):.4f}, "
              f"over ±{bound:.4f}: {over:.1%}")  # fmt: skip
        assert over <= 0.02, (name, over)
        assert max(found) <= 1.5 * bound, (name, max(found))


def test_pane_sketches_carry_kll_only_when_asked() -> None:
    key = (("t", "ms", "{}"), 0)
    without = PaneSketches(compile_accuracy())
    without.add_values(key, np.array([1.0, 2.0, 3.0]))
    assert without.columns([key])[3].to_pylist() == [None]
    with_kll = PaneSketches(compile_accuracy(), kll_k=64)
    with_kll.add_values(key, np.array([1.0, 2.0, 3.0]))
    with_kll.add_member((("u", "s", "{}"), 0), "alice")
    klls = with_kll.columns([key, (("u", "s", "{}"), 0)])[3].to_pylist()
    assert klls[1] is None  # sets get an HLL, no KLL
    sketch = deserialize_kll(klls[0])
    assert (sketch.n, sketch.k, sketch.get_min_value(), sketch.get_max_value()) == (3, 64, 1, 3)


def _golden_values() -> np.ndarray:
    """tests/sketches/test_golden.py's 10 000 values (integer arithmetic only)."""
    i = np.arange(10_000, dtype=np.int64)
    values: np.ndarray = ((i * 7919) % 10_007) / 100.0 + (i % 7 == 0) * 250.0
    return values


@pytest.mark.parametrize("side", ["python", "spark"])
def test_frozen_kll_blobs_of_both_sides_still_read(side: str) -> None:
    """KLL compaction is randomised, so bytes cannot be compared; what must not change is that
    a stored blob reads back as the same sketch. ``spark``: written by Spark 4.3.0's
    ``kll_sketch_agg_double(v, 200)``, ``python``: by datasketches 5.2.0."""
    blob = base64.b64decode((DATA / f"kll_k200_10000_{side}.b64").read_text())
    sketch = deserialize_kll(blob)
    values = np.sort(_golden_values())
    assert (sketch.n, sketch.k) == (10_000, 200)
    assert (sketch.get_min_value(), sketch.get_max_value()) == (values[0], values[-1])
    for q in QUANTILES:
        assert abs(_rank(values, sketch.get_quantile(q)) - q) <= kll_error(200)
    again = deserialize_kll(serialize_kll(sketch))
    assert again.get_quantiles(list(QUANTILES)) == sketch.get_quantiles(list(QUANTILES))
