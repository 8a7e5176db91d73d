"""HLL distinct counts: the published bound over many seeded trials, unions, Spark interop."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from streamgauge.sketches import hll

BOUND = 0.03183  # DataSketches' 2-sigma bound at lgK 12, the figure it usually quotes


def _members(trial: int, n: int) -> np.ndarray:
    """n distinct ints, disjoint between trials (so the truth is exactly n, no collisions)."""
    return np.arange(n, dtype=np.int64) + trial * 10_000_000_000


def _binomial_tail_limit(trials: int, p_fail: float, alpha: float = 0.001) -> int:
    """Largest miss count a coverage of exactly 1 - p_fail still produces with prob >= alpha."""
    tail, limit = 1.0, trials
    for misses in range(trials + 1):
        if tail < alpha:
            limit = misses - 1
            break
        tail -= math.comb(trials, misses) * p_fail**misses * (1 - p_fail) ** (trials - misses)
    return limit


# Trials: 500 at n=10^2 and 10^4, 40 at n=10^6 (0.1 s per million updates is the floor: the
# library has no array update, so 10^6 x 500 would take a minute). One sketch uses the HIP
# estimator, RSE ~0.83/64 = 1.3 %, so 3.183 % is ~2.45 sigma and ~98.6 % of trials land inside
# (measured: 100 %, 99.8 %, 96.7 % over 60 trials at 10^6). With 500 trials the observed fraction
# is itself within ~0.5 % of the truth, so ">= 95 % observed" is asserted as is. With 40 trials it
# is not (2 misses in 40 happen 1 time in 7 at 97 % coverage), so there the assertion is that the
# misses are consistent with >= 95 % coverage (one-sided binomial, 0.1 %): it still fails a sketch
# whose coverage has fallen to 1 sigma (68 %) or below ~85 %.
@pytest.mark.parametrize(("n", "trials"), [(100, 500), (10_000, 500), (1_000_000, 40)])
def test_one_sketch_within_published_bound(n: int, trials: int) -> None:
    errors = np.array(
        [hll.estimate(hll.build_hll(_members(t, n))).estimate / n - 1 for t in range(trials)]
    )
    misses = int(np.count_nonzero(np.abs(errors) > BOUND))
    if trials >= 200:
        assert misses <= 0.05 * trials, (misses, trials)
    else:
        assert misses <= _binomial_tail_limit(trials, 0.05), (misses, trials)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 50, 100])
def test_exact_in_exact_range(n: int) -> None:
    sketch = hll.build_hll(_members(3, n))
    assert round(hll.estimate(sketch).estimate) == n
    halves = [hll.serialize_hll(hll.build_hll(_members(3, n)[: n // 2 + 1]))] if n else []
    halves.append(hll.serialize_hll(hll.build_hll(_members(3, n)[n // 2 :])))
    assert round(hll.estimate(hll.union_hll(halves)).estimate) == n


# Union of 3 receivers, each owning a third of the members plus a random 15 % of the others
# (overlap). A union uses the composite estimator (RSE 1.04/64 = 1.6 %): 3.183 % is then ~1.96
# sigma, i.e. coverage ~95 % *exactly*, so a strict ">= 95 % observed" would pass or fail by
# seed. Assert instead that the misses are consistent with >= 95 % coverage (binomial, 0.1 %).
@pytest.mark.parametrize(("n", "trials"), [(10_000, 400), (1_000_000, 12)])
def test_union_of_receivers_within_same_bound(n: int, trials: int) -> None:
    rng = np.random.default_rng(n)
    misses = 0
    for t in range(trials):
        members = _members(t, n)
        owner = rng.integers(0, 3, n)
        parts = [
            hll.serialize_hll(hll.build_hll(members[(owner == r) | (rng.random(n) < 0.15)]))
            for r in range(3)
        ]
        misses += abs(hll.estimate(hll.union_hll(parts)).estimate / n - 1) > BOUND
    assert misses <= _binomial_tail_limit(trials, 0.05), (misses, trials)


def test_union_is_order_free_and_idempotent() -> None:
    parts = [hll.serialize_hll(hll.build_hll(_members(0, 20_000)[i::4])) for i in range(4)]
    a = hll.estimate(hll.union_hll(parts)).estimate
    b = hll.estimate(hll.union_hll(reversed(parts + parts))).estimate
    assert a == b


def test_strings_bounds_and_errors() -> None:
    sketch = hll.build_hll([f"user-{i}" for i in range(5000)])
    est = hll.estimate(hll.serialize_hll(sketch))
    assert est.lower_bound <= 5000 <= est.upper_bound
    assert est.lower_bound < est.estimate < est.upper_bound
    assert hll.deserialize_hll(hll.serialize_hll(sketch)).tgt_type == hll.HLL_TYPE
    with pytest.raises(ValueError, match="lg_k=22 is invalid"):
        hll.new_hll(22)
    with pytest.raises(ValueError, match="not floats"):
        hll.build_hll(np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="not a serialized HLL sketch"):
        hll.deserialize_hll(b"nonsense")
    with pytest.raises(ValueError, match="num_std_devs=4"):
        hll.estimate(sketch, num_std_devs=4)


def test_spark_reads_ours_and_we_read_sparks(spark: SparkSession) -> None:
    ours_int = hll.serialize_hll(hll.build_hll(range(5000)))
    ours_str = hll.serialize_hll(hll.build_hll(f"user-{i}" for i in range(3000)))
    # Built in the JVM (no Python rows to ship): ids 0..4999, members user-0..user-2999.
    df = spark.range(5000).select(
        "id", F.concat(F.lit("user-"), (F.col("id") % 3000).cast("string")).alias("member")
    )
    # One query (each Spark job costs seconds here): Spark's sketches, and its estimates of ours,
    # of its own, and of the union of ours with its own.
    estimates = {}
    for kind, ours in (("int", ours_int), ("str", ours_str)):
        estimates[f"{kind}_ours"] = F.hll_sketch_estimate(F.lit(ours))
        estimates[f"{kind}_theirs"] = F.hll_sketch_estimate(f"{kind}_sketch")
        estimates[f"{kind}_union"] = F.hll_sketch_estimate(
            F.hll_union(F.lit(ours), f"{kind}_sketch")
        )
    row = (
        df.agg(
            F.hll_sketch_agg("id", 12).alias("int_sketch"),
            F.hll_sketch_agg("member", 12).alias("str_sketch"),
        )
        .select("int_sketch", "str_sketch", *(c.alias(name) for name, c in estimates.items()))
        .first()
    )
    assert row is not None
    spark_int, spark_str = bytes(row["int_sketch"]), bytes(row["str_sketch"])
    got = {
        kind: {key: row[f"{kind}_{key}"] for key in ("ours", "theirs", "union")}
        for kind in ("int", "str")
    }

    # Python -> Spark: Spark estimates our blobs as we do, and unions them with its own sketch
    # of the same members without double counting (same hashing of ints and strings).
    assert got["int"]["ours"] == round(hll.estimate(ours_int).estimate)
    assert got["str"]["ours"] == round(hll.estimate(ours_str).estimate)
    for kind in ("int", "str"):
        assert got[kind]["union"] == got[kind]["theirs"]

    # Spark -> Python: Spark writes HLL_8 (the type we write), lgK 12, and we read its estimate.
    for blob, truth, kind in ((spark_int, 5000, "int"), (spark_str, 3000, "str")):
        sketch = hll.deserialize_hll(blob)
        assert (sketch.tgt_type, sketch.lg_config_k) == (hll.HLL_TYPE, 12)
        assert round(hll.estimate(sketch).estimate) == got[kind]["theirs"]
        assert abs(hll.estimate(sketch).estimate / truth - 1) <= BOUND
        # ... and our union of Spark's sketch with ours is Spark's own estimate again.
        mine = ours_int if kind == "int" else ours_str
        union = hll.estimate(hll.union_hll([blob, mine])).estimate
        assert round(union) == got[kind]["theirs"]
