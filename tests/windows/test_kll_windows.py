"""A ``quantiles: kll`` window through the job: one query, p50/p90 from the merged KLL, no p99.

Seeded timer values go through the real combiner (with pane KLLs, as a receiver of a config
with a kll window builds them) into segments of two receivers over four panes, plus a counter
and a set; then a segment whose timer partial is late for the window. The job runs once; the
stored p50/p90 must be within KLL's rank bound of the exact quantiles of what was sent and be
the stored sketch's own (as Python's and Spark's DataSketches read it), p99/p999 NULL, the HDR
histogram every timer window has, the late partial in ``late_events``. ``replay`` then
recomputes the window with the late partial included, the same way.

    event time (s)  0    1    2    3    4 ...  10
    window          [      per_4s       )
    segments        timers, a counter, a set   heartbeat 10 s
    late segment    one timer partial @ 1 s    heartbeat 11 s (the window closed at 4 s)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import numpy as np
from pyspark.sql import SparkSession

from streamgauge.clock import ManualClock
from streamgauge.configs import PipelineConfig, parse_config
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import Heartbeat, SegmentWriter
from streamgauge.ingest.protocol import Sample
from streamgauge.sinks.store import ResultStore, run_sql
from streamgauge.sketches.kll import deserialize_kll
from streamgauge.windows.plan import JobPaths, WindowPlan
from streamgauge.windows.replay import replay
from tests.windows.jobrun import run_job_once

T0 = 1_700_000_000_000
CONFIG = parse_config(
    """
name: klltest
pane: 1s
windows:
  - {name: per_4s, kind: tumbling, size: 4s, watermark_delay: 0s, quantiles: kll}
""",
    "test",
)


def _segment(spool: Path, receiver: str, samples: list[tuple[Sample, int]], beat_ms: int) -> None:
    combiner = PaneCombiner(1000, CONFIG.sketches, kll_k=CONFIG.kll_k)
    for sample, at_ms in samples:
        combiner.add(sample, T0 + at_ms, T0 + at_ms)
    SegmentWriter(spool, receiver).append(combiner.drain(), Heartbeat(T0 + beat_ms, True))


def _window(url: str) -> dict[str, dict[str, Any]]:
    columns, rows = run_sql(
        url,
        "select metric, metric_type, count, sum, min, max, p50, p90, p99, p999, distinct_count, "
        "sketch, hdr_histogram, revision, is_final from window_results "
        "where config_name = 'klltest' and window_start = to_timestamp(%s / 1000.0)",
        [T0],
    )
    return {cast(str, row[0]): dict(zip(columns, row, strict=True)) for row in rows}  # metric


def _rank(ordered: np.ndarray, value: float) -> float:
    return float(np.searchsorted(ordered, value, side="right")) / len(ordered)


def _assert_kll_timer(row: dict[str, Any], values: np.ndarray, config: PipelineConfig) -> None:
    ordered = np.sort(values)
    assert (row["metric_type"], row["count"]) == ("ms", len(values))
    assert (row["min"], row["max"]) == (ordered[0], ordered[-1])
    assert abs(row["sum"] - values.sum()) < 1e-6
    bound = config.sketches.kll_rank_error + 1 / len(values)
    for column, q in (("p50", 0.5), ("p90", 0.9)):
        assert abs(_rank(ordered, row[column]) - q) <= bound, (column, row[column])
    assert (row["p99"], row["p999"]) == (None, None)
    assert row["hdr_histogram"] is not None
    sketch = deserialize_kll(bytes(row["sketch"]))  # the merged KLL, readable in Python
    assert (sketch.n, sketch.k) == (len(values), 200)
    assert (row["p50"], row["p90"]) == (sketch.get_quantile(0.5, True),
                                        sketch.get_quantile(0.9, True))  # inclusive, as Spark


def _spark_reads(spark: SparkSession, blob: bytes) -> tuple[int, float, float]:
    """n, p50 and p90 of a KLL image as Spark's own KLL functions read it."""
    frame = spark.createDataFrame([(bytearray(blob),)], "kll binary")
    row = frame.selectExpr(
        "kll_sketch_get_n_double(kll)", "kll_sketch_get_quantile_double(kll, 0.5)",
        "kll_sketch_get_quantile_double(kll, 0.9)",
    ).first()  # fmt: skip
    assert row is not None
    return int(row[0]), float(row[1]), float(row[2])


def test_kll_window_stores_p50_p90_within_the_rank_bound_and_no_p99(
    spark: SparkSession, tmp_path: Path, clean_store: str
) -> None:
    rng = np.random.default_rng(20261123)
    latencies = rng.lognormal(3.0, 0.8, 6000).round(3)
    at_ms = rng.integers(0, 4000, len(latencies))
    receiver_of = rng.integers(0, 2, len(latencies))
    per_receiver: dict[int, list[tuple[Sample, int]]] = {0: [], 1: []}
    for value, at, receiver in zip(latencies, at_ms, receiver_of, strict=True):
        per_receiver[int(receiver)].append((Sample("api.latency", "ms", float(value), 1.0, ()),
                                            int(at)))  # fmt: skip
    for i in range(40):
        per_receiver[i % 2].append((Sample("hits", "c", 1.0, 1.0, ()), i * 100))
        per_receiver[i % 2].append((Sample("users", "s", 1.0, 1.0, (), member=f"u{i % 7}"), i))
    spool = tmp_path / "spool"
    for receiver, samples in per_receiver.items():
        _segment(spool, f"udp-{receiver}", samples, beat_ms=10_000)
    late_values = rng.lognormal(5.0, 0.5, 500).round(3)  # well above: it moves the quantiles
    late = [(Sample("api.latency", "ms", float(v), 1.0, ()), 1_000) for v in late_values]
    _segment(spool, "udp-0", late, beat_ms=11_000)

    paths = JobPaths(spool=spool, checkpoints=tmp_path / "checkpoints")
    queries = run_job_once(spark, CONFIG, paths, clean_store, ManualClock(T0))
    assert [q.name for q in queries] == ["klltest.per_4s"]  # one query, no late query
    assert [p.name for p in WindowPlan.of(CONFIG, paths).checkpoints] == [
        p.name for p in (tmp_path / "checkpoints" / "klltest").iterdir()
    ]

    window = _window(clean_store)
    timer = window["api.latency"]
    assert timer["is_final"]
    _assert_kll_timer(timer, latencies, CONFIG)
    assert _spark_reads(spark, bytes(timer["sketch"])) == (len(latencies), timer["p50"],
                                                           timer["p90"])  # fmt: skip
    hits, users = window["hits"], window["users"]
    assert (hits["count"], hits["sum"], hits["p50"], hits["sketch"]) == (40, 40.0, None, None)
    assert (users["count"], users["distinct_count"], users["p50"]) == (40, 7, None)
    _, histograms = run_sql(clean_store, "select metric, sum(count) from window_histograms "
                            "group by metric")  # fmt: skip
    assert histograms == [("api.latency", len(latencies))]
    _, late_rows = run_sql(
        clean_store, "select metric, count, query_name from late_events where config_name = "
        "'klltest'",
    )  # fmt: skip
    assert late_rows == [("api.latency", 500, "klltest.per_4s.late")]
    _, state = run_sql(clean_store, "select key from pipeline_state where config_name = 'klltest'"
                       " and key like 'watermark%'")  # fmt: skip
    assert state == [("watermark_ms:per_4s",)]  # one query: one watermark

    with ResultStore(clean_store) as store:
        [report] = replay(CONFIG, spool, store, ManualClock(T0), from_ms=T0, to_ms=T0 + 4000)
    assert (report.windows_corrected, report.late_partials_applied) == (1, 1)
    corrected = _window(clean_store)["api.latency"]
    assert corrected["revision"] > timer["revision"]
    _assert_kll_timer(corrected, np.concatenate([latencies, late_values]), CONFIG)
