"""Retention on a real segment log and real Spark checkpoints (streamgauge/retention.py)."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from streamgauge.clock import ManualClock
from streamgauge.daemon import Janitor
from streamgauge.ingest.log import list_segments
from streamgauge.retention import committed_sequences, prune_spool, safe_sequences
from streamgauge.sinks.store import ResultStore, run_sql
from streamgauge.windows.plan import JobPaths, WindowPlan
from tests.windows.test_transcripts import HERE, _load, run_spark, stored_state
from tests.windows.transcript import T0

DAY_MS = 86_400_000


def test_only_old_segments_every_query_committed_past_are_deleted(
    spark: SparkSession, clean_store: str, tmp_path: Path
) -> None:
    transcript = _load(HERE / "tumbling_basic.yaml")
    spool = tmp_path / "spool"
    transcript.write_spool(spool)
    paths = JobPaths(spool=spool, checkpoints=tmp_path / "checkpoints")
    checkpoints = WindowPlan.of(transcript.config, paths).checkpoints

    assert safe_sequences(checkpoints) == {}  # nothing committed: nothing may go
    assert prune_spool(spool, checkpoints, 0, ManualClock(T0 + DAY_MS)).deleted == 0

    run_spark(spark, clean_store, spool, transcript.config)
    before = stored_state(clean_store, transcript.config)
    assert [committed_sequences(c) for c in checkpoints] == [{"r0": 2}]  # one query

    young = prune_spool(spool, checkpoints, DAY_MS, ManualClock(T0 + 10_000))
    assert young.deleted == 0  # committed, but younger than the retention age
    report = prune_spool(spool, checkpoints, DAY_MS, ManualClock(T0 + 2 * DAY_MS))
    assert report.deleted == 2 and report.bytes_freed > 0
    assert [s.sequence for s in list_segments(spool, "r0")] == [2]  # the committed one stays

    run_spark(spark, clean_store, spool, transcript.config)  # resumes without the old files
    assert stored_state(clean_store, transcript.config) == before


def test_results_older_than_the_retention_age_are_deleted(
    spark: SparkSession, clean_store: str, tmp_path: Path
) -> None:
    transcript = _load(HERE / "stragglers_beyond_lateness.yaml")
    transcript.write_spool(tmp_path / "spool")
    run_spark(spark, clean_store, tmp_path / "spool", transcript.config)
    with ResultStore(clean_store) as store:
        deleted = store.prune(T0 + 5_000)  # windows ending before 5 s: [0,2) and [2,4)
    assert deleted["window_results"] == 2 and deleted["late_events"] == 1
    _, left = run_sql(
        clean_store,
        "select (extract(epoch from window_start) * 1000)::bigint - %s from window_results",
        [T0],
    )
    assert left == [(4000,)]


def test_the_janitor_runs_on_the_clock_it_is_given(
    spark: SparkSession, clean_store: str, tmp_path: Path
) -> None:
    """Once a minute of the injected clock, not of the machine's: nothing before, then the
    committed segments older than the log's retention and the results older than theirs."""
    transcript = _load(HERE / "tumbling_basic.yaml")
    spool = tmp_path / "spool"
    transcript.write_spool(spool)
    paths = JobPaths(spool=spool, checkpoints=tmp_path / "checkpoints")
    run_spark(spark, clean_store, spool, transcript.config)
    clock = ManualClock(T0 + 2 * DAY_MS)
    janitor = Janitor(WindowPlan.of(transcript.config, paths), clean_store, DAY_MS, DAY_MS, clock)

    janitor.maybe_run()
    clock.advance(Janitor.INTERVAL_MS - 1)
    janitor.maybe_run()
    assert [s.sequence for s in list_segments(spool, "r0")] == [0, 1, 2]
    assert run_sql(clean_store, "select count(*) from window_results")[1] != [(0,)]

    clock.advance(1)
    janitor.maybe_run()
    assert [s.sequence for s in list_segments(spool, "r0")] == [2]  # the committed one stays
    assert run_sql(clean_store, "select count(*) from window_results")[1] == [(0,)]
