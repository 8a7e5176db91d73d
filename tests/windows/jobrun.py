"""Run the real window job once over a spool, as the Spark tests need it."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from streamgauge.clock import Clock
from streamgauge.configs import PipelineConfig
from streamgauge.sinks.store import ResultStore
from streamgauge.windows.job import JobPaths, start_window_queries


def run_job_once(
    spark: SparkSession, config: PipelineConfig, paths: JobPaths, url: str, clock: Clock
) -> list[StreamingQuery]:
    """Every query of ``config`` processes what is in the spool now and stops; a failed query
    fails the test. Returns the queries (their progress tells what Spark did)."""
    queries = start_window_queries(
        spark, config, paths, lambda: ResultStore(url), clock, trigger_interval=None
    )
    for query in queries:
        query.awaitTermination(180)
        assert query.exception() is None
    return queries
