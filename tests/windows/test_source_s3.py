"""The window job over a spool on an object store: Spark's Python workers read the segments
from S3 (a real S3 API server), the results equal the transcript's, retention deletes on S3
what every query committed, and the job resumes over what is left with the same results."""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import SparkSession

from streamgauge.clock import ManualClock
from streamgauge.ingest.log import list_segments
from streamgauge.retention import committed_sequences, prune_spool
from streamgauge.windows.plan import JobPaths, WindowPlan
from tests.s3_server import S3Server
from tests.windows.jobrun import run_job_once
from tests.windows.test_transcripts import HERE, _load, check_expectations, stored_state
from tests.windows.transcript import T0

DAY_MS = 86_400_000


def test_the_job_reads_an_s3_spool_and_retention_prunes_it(
    spark: SparkSession, clean_store: str, s3_server: S3Server, tmp_path: Path
) -> None:
    transcript = _load(HERE / "tumbling_basic.yaml")
    uri = s3_server.uri()
    transcript.write_spool(uri)  # type: ignore[arg-type]  # a location, not only a Path
    paths = JobPaths(spool=uri, checkpoints=tmp_path / "checkpoints")

    run_job_once(spark, transcript.config, paths, clean_store, ManualClock(T0))
    state, _ = stored_state(clean_store, transcript.config)
    check_expectations(transcript, state)
    checkpoints = WindowPlan.of(transcript.config, paths).checkpoints
    assert [committed_sequences(c) for c in checkpoints] == [{"r0": 2}]  # one query

    report = prune_spool(uri, checkpoints, DAY_MS, ManualClock(T0 + 2 * DAY_MS))
    assert report.deleted == 2 and report.bytes_freed > 0
    assert [s.sequence for s in list_segments(uri, "r0")] == [2]  # the committed one stays
    run_job_once(spark, transcript.config, paths, clean_store, ManualClock(T0))
    assert stored_state(clean_store, transcript.config)[0] == state
