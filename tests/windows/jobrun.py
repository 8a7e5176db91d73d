"""Run the real window job once over a spool, as the Spark tests need it."""

from __future__ import annotations

from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from streamgauge.clock import Clock
from streamgauge.configs import PipelineConfig
from streamgauge.sinks.query_stores import QueryStores
from streamgauge.windows.job import start_window_queries
from streamgauge.windows.plan import JobPaths, WindowPlan

#: Spark gives a new driver-side Python process a fixed 10 s to connect back
#: (``PythonWorkerFactory``, not configurable); on a loaded 2-core machine a start can miss it.
#: The daemon restarts its queries from their checkpoints then (``daemon.RestartBudget``), and
#: so do the tests: what the checkpoints committed stays committed, so the result is the same.
TRANSIENT_FAILURE = "Python worker failed to connect back"
ATTEMPTS = 3


def run_job_once(
    spark: SparkSession, config: PipelineConfig, paths: JobPaths, url: str, clock: Clock
) -> list[StreamingQuery]:
    """Every query of ``config`` processes what is in the spool now and stops; a failed query
    fails the test (after ``ATTEMPTS`` starts, if it only missed the connect-back). Returns
    the queries of the last start (their progress tells what Spark did)."""
    stores = QueryStores(url)
    for attempt in range(1, ATTEMPTS + 1):
        queries = start_window_queries(spark, WindowPlan.of(config, paths), stores, clock,
                                       trigger_interval=None)  # fmt: skip
        for query in queries:
            query.awaitTermination(180)
        stores.close_all()  # or the test run's PostgreSQL runs out of clients (query_stores)
        failures = [str(q.exception()) for q in queries if q.exception() is not None]
        if not failures:
            return queries
        if attempt == ATTEMPTS or not all(TRANSIENT_FAILURE in f for f in failures):
            raise AssertionError(failures[0])
    raise AssertionError("unreachable")
