"""The Spark job: the streaming queries of a config's windows, partials → windows → store.

``docs/architecture.md`` §3–§5. The queries are those of the config's ``WindowPlan``
(``plan.py``). Every query reads the segment log through the spool source, whose offsets (per
receiver: last segment and its heartbeat) Spark logs before each batch, so the job is
exactly-once over the log. ``revision`` is the batch id + 1 plus the checkpoint's
base (``results.revision_base``); the watermark is ``W = min over open receivers(heartbeat)
- watermark_delay`` from the batch's offsets; a window ``[start, end)`` is final once
``end + allowed_lateness <= W``.

Every window (tumbling, hopping, sliding, session; every metric type, t-digest or KLL
percentiles) is one stateless query whose ``foreachBatch`` (``pane_writer``) reads the
batch's segments itself and holds the open windows in the driver (``open_windows``,
``open_sessions``; the logic objects ``pane_logic``, ``sliding_logic``, ``session_logic``).
While no segment brings rows and every window seen is final, the query runs no batch
(``QuietLane``, its span from the plan: ``plan.quiet_span_ms``).

``early_every`` (tumbling, hopping, sliding): while the watermark has not passed a window's
end, the store publishes its pending row as an *early* row at each tick ``start + k *
early_every`` the watermark reaches, when a value changed since the last one
(``store._EARLY``). Window ``[0, 10)``, every 2 s::

      W     2     4     6     8     10          10 + lateness
            e     e     e     e     on-time     final          (e: early, if changed)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from streamgauge.clock import Clock
from streamgauge.retention import PASSED_OVER_FILE
from streamgauge.sinks.store import ResultStore
from streamgauge.windows.pane_writer import PaneWindowsWriter
from streamgauge.windows.plan import TRIGGER_INTERVAL, WindowPlan
from streamgauge.windows.source import QuietLane, register_source_for_query


def start_window_queries(
    spark: SparkSession,
    plan: WindowPlan,
    store_factory: Callable[[], ResultStore],
    clock: Clock,
    *,
    trigger_interval: str | None = TRIGGER_INTERVAL,
    pane_writers: list[PaneWindowsWriter] | None = None,
) -> list[StreamingQuery]:
    """Start the streaming query of every window of ``plan``; all share the session.

    Each query gets its own store connection: Spark may run two queries' ``foreachBatch``
    at once, and one connection's transactions must not interleave. ``trigger_interval=None``
    processes what is in the spool now and stops (Spark's ``availableNow``).
    ``pane_writers``: given, the driver-held windows' writers are added to it (a clean stop
    parks their open windows, ``PaneWindowsWriter.park``).
    """
    queries: list[StreamingQuery] = []
    for query in plan.queries:
        pane_writer = PaneWindowsWriter(plan, query, store_factory(), clock)
        if pane_writers is not None:
            pane_writers.append(pane_writer)
        # A batch runs only when it changes what a reader sees or its rows have piled up
        # (live only: availableNow takes the whole log).
        quiet = None
        if trigger_interval is not None:
            window = query.window
            quiet = QuietLane(
                query.quiet_span_ms, passed_over=str(query.checkpoint / PASSED_OVER_FILE),
                boundaries_ms=query.boundaries_ms, delay_ms=window.watermark_delay_ms,
                lateness_ms=window.allowed_lateness_ms,
            )  # fmt: skip
        source = _read_spool(spark, plan, query.name, quiet)
        queries.append(_start(source, query.name, query.checkpoint, pane_writer,
                              trigger_interval))  # fmt: skip
    return queries


def _read_spool(
    spark: SparkSession, plan: WindowPlan, query: str, quiet: QuietLane | None = None
) -> DataFrame:
    """The log as a stream of all its rows, read through ``query``'s own registration of the
    source (see `register_source_for_query` for the Spark race that one shared one loses);
    with ``quiet``, batches only when it has something to do."""
    source = register_source_for_query(spark, query)
    reader = spark.readStream.format(source).option("path", str(plan.paths.spool))
    return reader.options(**(quiet.options() if quiet else {})).load()


def _start(
    frame: DataFrame,
    name: str,
    checkpoint: Path,
    writer: Callable[[DataFrame, int], None],
    trigger_interval: str | None,
) -> StreamingQuery:
    checkpoint.mkdir(parents=True, exist_ok=True)
    stream = (
        frame.writeStream.queryName(name)
        .outputMode("append")
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(writer)
    )
    if trigger_interval is None:
        query = stream.trigger(availableNow=True).start()
    else:
        query = stream.trigger(processingTime=trigger_interval).start()
    _await_sources(query)
    return query


_SOURCE_START_TIMEOUT_S = 120.0


def _await_sources(query: StreamingQuery) -> None:
    """Wait until ``query`` has started its source before the next query starts.

    Each query starts a Python process on the driver for the spool source, and Spark gives a
    new Python process a fixed 10 s to connect back (``PythonWorkerFactory``, not
    configurable). Several queries starting at once on a loaded 2-core machine can miss it
    ("Python worker failed to connect back"); one at a time, each start gets the CPU.
    """
    deadline = time.monotonic() + _SOURCE_START_TIMEOUT_S
    while query.isActive and time.monotonic() < deadline:
        if query.status["message"] != "Initializing sources":
            return
        time.sleep(0.05)
