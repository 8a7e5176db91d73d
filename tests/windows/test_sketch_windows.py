"""Sketches through the window job: percentiles, histograms and distinct counts in the store.

Seeded values go through the real combiner into segments of two receivers and several panes;
the Spark job (one query per window, every metric type on one path) writes PostgreSQL. Every stored
number is checked against what was sent: p50..p999 within the t-digest's rank error, the
``window_histograms`` rows against the HDR histogram of all values (exactly), the stored
HdrHistogram encoding decodes to the same buckets, distinct counts exact below the HLL's
exact-mode size and within its bound above.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pyspark.sql import SparkSession

from streamgauge.clock import ManualClock
from streamgauge.configs import parse_config
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import Heartbeat, SegmentWriter
from streamgauge.ingest.protocol import Sample
from streamgauge.sinks.store import run_sql
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hll import estimate
from streamgauge.sketches.tdigest import deserialize_tdigest
from streamgauge.windows.plan import JobPaths
from tests.windows.jobrun import run_job_once

T0 = 1_700_000_000_000
CONFIG = """
name: sketchtest
pane: 1s
windows:
  - name: per_4s
    kind: tumbling
    size: 4s
    watermark_delay: 0s
    allowed_lateness: 0s
"""
LAYOUT = HdrLayout.from_params(compile_accuracy())


def _write(spool: Path, receiver: str, samples: list[tuple[Sample, int]], beat_ms: int) -> None:
    combiner = PaneCombiner(1000)
    for sample, at_ms in samples:
        combiner.add(sample, T0 + at_ms, T0 + at_ms)
    SegmentWriter(spool, receiver).append(combiner.drain(), Heartbeat(T0 + beat_ms, True))


def _run(spark: SparkSession, tmp_path: Path, url: str) -> None:
    paths = JobPaths(spool=tmp_path / "spool", checkpoints=tmp_path / "checkpoints")
    run_job_once(spark, parse_config(CONFIG, "test"), paths, url, ManualClock(T0))


def _results(url: str) -> dict[tuple[Any, Any], dict[str, Any]]:
    columns, rows = run_sql(
        url,
        "select metric, (extract(epoch from window_start) * 1000)::bigint - %s as start_ms, "
        "metric_type, count, sum, min, max, p50, p90, p99, p999, distinct_count, sketch, "
        "hdr_histogram, revision, is_final from window_results where config_name = 'sketchtest'",
        [T0],
    )
    found = [dict(zip(columns, row, strict=True)) for row in rows]
    return {(r["metric"], r["start_ms"]): r for r in found}


def _buckets(url: str, metric: str, start_ms: int) -> tuple[list[Any], list[Any], list[Any]]:
    _, rows = run_sql(
        url,
        "select bucket, count, upper_bound from window_histograms where config_name = "
        "'sketchtest' and metric = %s and window_start = to_timestamp(%s / 1000.0) "
        "order by bucket",
        [metric, T0 + start_ms],
    )
    return [r[0] for r in rows], [r[1] for r in rows], [r[2] for r in rows]


def _java_tdigest(spark: SparkSession, blob: bytes) -> Any:
    """``blob`` as DataSketches' Java ``TDigestDouble.heapify`` reads it (py4j proxy)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    memory = jvm.org.apache.datasketches.memory.Memory.wrap(bytearray(blob))
    return jvm.org.apache.datasketches.tdigest.TDigestDouble.heapify(memory)


def test_timer_percentiles_histograms_and_set_distinct_counts(
    spark: SparkSession, tmp_path: Path, clean_store: str
) -> None:
    rng = np.random.default_rng(20261122)
    latencies = rng.lognormal(3.0, 0.8, 6000).round(3)  # ms, spread over panes and receivers
    at_ms = rng.integers(0, 4000, len(latencies))
    receiver_of = rng.integers(0, 2, len(latencies))
    users_small = [f"u{i}" for i in rng.integers(0, 50, 800)]  # 50 distinct: exact mode
    users_big = [f"v{i}" for i in range(20_000)]  # beyond exact mode: estimated
    per_receiver: dict[int, list[tuple[Sample, int]]] = {0: [], 1: []}
    for value, at, receiver in zip(latencies, at_ms, receiver_of, strict=True):
        per_receiver[int(receiver)].append((Sample("api.latency", "ms", float(value), 1.0, ()),
                                            int(at)))  # fmt: skip
    for i, user in enumerate(users_small):
        per_receiver[i % 2].append((Sample("users", "s", 1.0, 1.0, (), member=user), i % 4000))
    for i, user in enumerate(users_big):
        per_receiver[i % 2].append((Sample("visitors", "s", 1.0, 1.0, (), member=user), i % 4000))
    per_receiver[0].append((Sample("requests", "c", 3.0, 1.0, ()), 100))
    rare = rng.lognormal(3.0, 0.8, 20).round(3)  # every value its own centroid
    per_receiver[1] += [(Sample("api.rare", "ms", float(v), 1.0, ()), 300 + 100 * i)
                        for i, v in enumerate(rare)]  # fmt: skip
    spool = tmp_path / "spool"
    for receiver, samples in per_receiver.items():
        _write(spool, f"udp-{receiver}", samples, beat_ms=10_000)

    _run(spark, tmp_path, clean_store)
    results = _results(clean_store)

    timer = results[("api.latency", 0)]
    assert timer["is_final"] and timer["metric_type"] == "ms"
    assert (timer["count"], timer["min"], timer["max"]) == (
        len(latencies), latencies.min(), latencies.max()
    )
    assert abs(timer["sum"] - latencies.sum()) < 1e-6
    ordered = np.sort(latencies)
    for column, q, rank_error in (("p50", 0.5, 0.015), ("p90", 0.9, 0.015), ("p99", 0.99, 0.001),
                                  ("p999", 0.999, 0.0002)):  # fmt: skip
        # The stored value's rank among the sent values is within the digest's rank error.
        rank = np.searchsorted(ordered, timer[column], side="right") / len(ordered)
        assert abs(rank - q) <= rank_error + 1 / len(ordered), (column, timer[column], rank)
    digest = deserialize_tdigest(bytes(timer["sketch"]))
    assert digest.get_total_weight() == len(latencies)
    # DataSketches' Java library (the one Spark ships) reads the stored t-digests as the C++
    # one does: a compressed digest, and one of a few values, each its own centroid.
    for metric, count in (("api.latency", len(latencies)), ("api.rare", len(rare))):
        blob = bytes(results[(metric, 0)]["sketch"])
        theirs = _java_tdigest(spark, blob)
        ours = deserialize_tdigest(blob)
        assert theirs.getTotalWeight() == ours.get_total_weight() == count
        for q in (0.01, 0.5, 0.9, 0.99, 0.999):
            assert theirs.getQuantile(q) == pytest.approx(ours.get_quantile(q), rel=1e-12), q

    expected = LAYOUT.histogram(latencies)
    buckets, counts, uppers = _buckets(clean_store, "api.latency", 0)
    assert (buckets, counts) == (expected.indices.tolist(), expected.counts.tolist())
    assert uppers == LAYOUT.bounds(expected.indices)[1].tolist()
    decoded = LAYOUT.decode(timer["hdr_histogram"])
    assert (decoded[0].tolist(), decoded[1].tolist()) == (buckets, counts)
    for q in (0.5, 0.99):  # HDR quantile within its relative error of the exact one
        exact = float(np.quantile(latencies, q, method="inverted_cdf"))
        assert abs(LAYOUT.quantile(buckets, counts, q) - exact) <= 0.01 * exact + 1e-3

    small = results[("users", 0)]
    assert (small["metric_type"], small["count"], small["distinct_count"]) == ("s", 800, 50)
    assert small["sum"] is None and small["p50"] is None
    big = results[("visitors", 0)]
    assert big["count"] == len(users_big)
    assert abs(big["distinct_count"] - len(users_big)) <= 0.0319 * len(users_big)
    # The distinct count is rounded as Spark's hll_sketch_estimate rounds; the stored sketch is
    # the same union.
    assert abs(estimate(bytes(big["sketch"])).estimate - big["distinct_count"]) <= 0.5
    # A counter in the same window has no distinct count and no sketch (not an empty HLL, 0).
    counter = results[("requests", 0)]
    assert (counter["sum"], counter["distinct_count"], counter["sketch"]) == (3.0, None, None)
