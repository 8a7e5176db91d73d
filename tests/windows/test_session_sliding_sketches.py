"""Sketches through session and sliding windows: percentiles, histograms and distinct counts.

Seeded timer values and set members go through the real combiner into segments; the real
window queries (``job.start_window_queries``) write PostgreSQL. Checked against what was sent:
p99/p999 within the t-digest's rank error of the exact values, ``window_histograms`` rows equal
to the HDR histogram of the window's values (and the stored HdrHistogram encoding decodes to
them), distinct counts within 3.183 % (the unioned HLL's 2-sigma bound at lgK 12), and, for a
session merged by a straggler, no bucket rows left for the two sessions it retracted.
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
from streamgauge.sinks.store import run_sql
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.windows.plan import JobPaths
from tests.windows.jobrun import run_job_once

T0 = 1_700_000_000_000
RANK_ERRORS = {"p99": (0.99, 0.001), "p999": (0.999, 0.0002)}  # as test_sketch_windows
DISTINCT_ERROR = 0.03183  # 2 sigma of a unioned HLL at lgK 12 (sketches.accuracy)
USER = (("user", "u1"),)


def _segment(
    writer: SegmentWriter, samples: list[tuple[Sample, int]], beat_ms: int, *, closed: bool
) -> None:
    combiner = PaneCombiner(1000)
    for sample, at_ms in samples:
        combiner.add(sample, T0 + at_ms, T0 + at_ms)
    writer.append(combiner.drain(), Heartbeat(T0 + beat_ms, closed))


def _timers(values: np.ndarray, at_ms: np.ndarray) -> list[tuple[Sample, int]]:
    return [(Sample("lat", "ms", float(v), 1.0, USER), int(at))
            for v, at in zip(values, at_ms, strict=True)]  # fmt: skip


def _members(names: list[str], at_ms: np.ndarray) -> list[tuple[Sample, int]]:
    return [(Sample("seen", "s", 1.0, 1.0, USER, member=name), int(at))
            for name, at in zip(names, at_ms, strict=True)]  # fmt: skip


def _rows(url: str, config: PipelineConfig) -> dict[tuple[str, int, int], dict[str, Any]]:
    columns, rows = run_sql(
        url,
        "select metric, (extract(epoch from window_start) * 1000)::bigint - %s as s, "
        "(extract(epoch from window_end) * 1000)::bigint - %s as e, count, p99, p999, "
        "distinct_count, hdr_histogram, is_final from window_results where config_name = %s",
        [T0, T0, config.name],
    )
    found: list[dict[str, Any]] = [dict(zip(columns, row, strict=True)) for row in rows]
    return {(r["metric"], r["s"], r["e"]): r for r in found}


def _histograms(url: str, config: PipelineConfig) -> dict[tuple[int, int], list[tuple[int, int]]]:
    _, rows = run_sql(
        url,
        "select (extract(epoch from window_start) * 1000)::bigint - %s, "
        "(extract(epoch from window_end) * 1000)::bigint - %s, bucket, count "
        "from window_histograms where config_name = %s order by 1, 2, 3",
        [T0, T0, config.name],
    )
    found: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for start, end, bucket, count in cast(list[tuple[int, int, int, int]], rows):  # all integers
        found.setdefault((int(str(start)), int(str(end))), []).append((int(bucket), int(count)))
    return found


def _check_window(
    row: dict[str, Any], buckets: list[tuple[int, int]], values: np.ndarray, layout: HdrLayout
) -> None:
    """Quantiles within the rank error, bucket rows and encoding equal to the exact HDR."""
    assert row["count"] == len(values)
    ordered = np.sort(values)
    for column, (q, rank_error) in RANK_ERRORS.items():
        rank = np.searchsorted(ordered, row[column], side="right") / len(ordered)
        assert abs(rank - q) <= rank_error + 1 / len(ordered), (column, row[column], rank)
    expected = layout.histogram(values)
    assert buckets == list(zip(expected.indices.tolist(), expected.counts.tolist(), strict=True))
    decoded = layout.decode(row["hdr_histogram"])
    assert list(zip(decoded[0].tolist(), decoded[1].tolist(), strict=True)) == buckets


SESSION_CONFIG = """
name: sessketch
pane: 1s
windows:
  - {name: by_user, kind: session, gap: 3s, key: user, watermark_delay: 0s,
     allowed_lateness: 10s}
"""


def test_session_percentiles_histograms_distinct_counts_and_retracted_buckets(
    spark: SparkSession, tmp_path: Path, clean_store: str
) -> None:
    """Sessions [0, 5) and [6, 11) of user u1, then a straggler at 4 s merges them::

        t (s)    0   1   2   3   4   5   6   7   8   9  10  11
        run 1    x   x   x                x   x   x            [0, 5) emitted, [6, 11) open
        run 2                    s                              one session [0, 11)
    """
    config = parse_config(SESSION_CONFIG, "test")
    layout = HdrLayout.from_params(config.sketches)
    rng = np.random.default_rng(20261123)
    values = rng.lognormal(3.0, 0.8, 3000).round(3)
    at_ms = np.concatenate([rng.integers(0, 3000, 1400), rng.integers(6000, 9000, 1400),
                            rng.integers(4000, 5000, 200)])  # fmt: skip
    members = [f"m{i}" for i in rng.integers(0, 12_000, 9000)]
    member_at = np.concatenate([rng.integers(0, 3000, 4400), rng.integers(6000, 9000, 4400),
                                rng.integers(4000, 5000, 200)])  # fmt: skip
    late_values, late_members = at_ms // 1000 == 4, member_at // 1000 == 4
    spool = tmp_path / "spool"
    paths = JobPaths(spool=spool, checkpoints=tmp_path / "checkpoints")
    writer = SegmentWriter(spool, "udp-0")
    on_time = _timers(values[~late_values], at_ms[~late_values]) + _members(
        [m for m, late in zip(members, late_members, strict=True) if not late],
        member_at[~late_members],
    )
    _segment(writer, on_time, beat_ms=9000, closed=False)
    run_job_once(spark, config, paths, clean_store, ManualClock(T0))

    first = _rows(clean_store, config)
    assert set(first) == {("lat", 0, 5000), ("seen", 0, 5000)}  # [6, 11) still open
    assert set(_histograms(clean_store, config)) == {(0, 5000)}  # [6, 11): held by the job
    _check_window(first[("lat", 0, 5000)], _histograms(clean_store, config)[(0, 5000)],
                  values[at_ms < 3000], layout)  # fmt: skip

    stragglers = _timers(values[late_values], at_ms[late_values]) + _members(
        [m for m, late in zip(members, late_members, strict=True) if late],
        member_at[late_members],
    )
    _segment(writer, stragglers, beat_ms=9500, closed=False)
    _segment(writer, [], beat_ms=30_000, closed=True)
    run_job_once(spark, config, paths, clean_store, ManualClock(T0))

    rows = _rows(clean_store, config)
    assert set(rows) == {("lat", 0, 11_000), ("seen", 0, 11_000)}
    assert all(row["is_final"] for row in rows.values())
    histograms = _histograms(clean_store, config)
    assert set(histograms) == {(0, 11_000)}  # none left for the retracted [0, 5) and [6, 11)
    _check_window(rows[("lat", 0, 11_000)], histograms[(0, 11_000)], values, layout)
    distinct = len(set(members))
    assert abs(rows[("seen", 0, 11_000)]["distinct_count"] - distinct) <= DISTINCT_ERROR * distinct


SLIDING_CONFIG = """
name: slidesketch
pane: 1s
windows:
  - {name: last_3s, kind: sliding, size: 3s, watermark_delay: 0s, allowed_lateness: 0s}
"""


def test_sliding_percentiles_histograms_and_distinct_counts(
    spark: SparkSession, tmp_path: Path, clean_store: str
) -> None:
    """Data in panes 0..5 s; every window the panes define ([-2, 1) .. [6, 9)) holds the
    values of the panes inside it: its quantiles, buckets and distinct count are checked."""
    config = parse_config(SLIDING_CONFIG, "test")
    layout = HdrLayout.from_params(config.sketches)
    rng = np.random.default_rng(20261124)
    values = rng.lognormal(2.0, 1.0, 3000).round(3)
    at_ms = rng.integers(0, 6000, len(values))
    members = [f"m{i}" for i in rng.integers(0, 20_000, 12_000)]
    member_at = rng.integers(0, 6000, len(members))
    spool = tmp_path / "spool"
    _segment(SegmentWriter(spool, "udp-0"), _timers(values, at_ms) + _members(members, member_at),
             beat_ms=20_000, closed=True)  # fmt: skip
    run_job_once(spark, config, JobPaths(spool, tmp_path / "checkpoints"), clean_store,
                 ManualClock(T0))  # fmt: skip

    rows = _rows(clean_store, config)
    starts = range(-2000, 6000, 1000)  # left windows of panes 0..5, right ones of 0..4
    assert set(rows) == {(m, s, s + 3000) for m in ("lat", "seen") for s in starts}
    histograms = _histograms(clean_store, config)
    assert set(histograms) == {(s, s + 3000) for s in starts}
    for start in starts:
        inside = (at_ms >= start) & (at_ms < start + 3000)
        _check_window(rows[("lat", start, start + 3000)], histograms[(start, start + 3000)],
                      values[inside], layout)  # fmt: skip
        held = {m for m, at in zip(members, member_at, strict=True) if start <= at < start + 3000}
        distinct = rows[("seen", start, start + 3000)]["distinct_count"]
        assert abs(distinct - len(held)) <= DISTINCT_ERROR * len(held), (start, distinct)
