"""The daemon's supervision: the Spark half as one object, retention, signals, shutdown.

`streamgauge run` and `streamgauge process` (in ``cli.py``) assemble these: the store, the
ingest children, a ``WindowJob``; ``supervise`` watches them until a signal or a failure;
``shutdown`` stops them in data-path order so that what was received reaches the store.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from streamgauge.clock import Clock, SystemClock
from streamgauge.ingest.log import SPOOL_RESCAN_MS, spool_bytes
from streamgauge.ingest.spool_fs import resolve_spool
from streamgauge.operator.jvm_logs import JvmLogs
from streamgauge.retention import QUOTA_HIGH_WATER, prune_spool
from streamgauge.sinks.query_stores import QueryStores
from streamgauge.sinks.store import ResultStore, RetryPolicy
from streamgauge.windows.job import start_window_queries
from streamgauge.windows.pane_writer import PaneWindowsWriter
from streamgauge.windows.plan import WindowPlan
from streamgauge.windows.session import build_spark_session

log = logging.getLogger("streamgauge")


class StopRequested:
    """Turns SIGINT/SIGTERM into a flag the supervising loop polls."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self.install()

    def install(self) -> None:
        """(Re)install the handlers: creating a SparkContext replaces SIGINT's with its own."""
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        self.signal = signum

    def __bool__(self) -> bool:
        return self.signal is not None


class WindowJob:
    """The Spark half of the daemon: session, one query per window, clean shutdown."""

    def __init__(
        self, plan: WindowPlan, url: str, *, master: str, trigger: str, retain_log_ms: int,
        retain_results_ms: int, spool_quota_bytes: int = 0, clock: Clock | None = None,
        jvm_logs: JvmLogs | None = None,
    ) -> None:  # fmt: skip
        """``plan``: the config's queries over its spool and checkpoints (the caller reads
        the same plan for ``run.json``). ``jvm_logs``: where Spark's and the JVM's output goes
        (None: the terminal)."""
        clock = clock or SystemClock()
        store = ResultStore(url)
        store.ensure_schema()
        store.close()
        self.spark = build_spark_session(master, jvm_logs=jvm_logs)
        resolve_spool(plan.paths.spool).create()
        self._janitor = Janitor(plan, url, retain_log_ms, retain_results_ms, clock,
                                spool_quota_bytes)  # fmt: skip
        self._clock = clock

        self._stores = QueryStores(url)

        self._pane_writers: list[PaneWindowsWriter] = []

        def start() -> list[Any]:  # StreamingQuery
            self._pane_writers.clear()
            return start_window_queries(
                self.spark, plan, self._stores, clock, trigger_interval=trigger,
                pane_writers=self._pane_writers,
            )  # fmt: skip

        self._start_queries = start
        self._restarts = RestartBudget(clock)
        self.queries = start()

    @property
    def ui_url(self) -> str | None:
        return self.spark.sparkContext.uiWebUrl

    def failure(self) -> str | None:
        """None while the job runs (restarting its queries after a failure, within the
        budget); the reason once a query failed more often than the budget allows."""
        self._janitor.maybe_run()
        for query in self.queries:
            if not query.isActive:
                error = query.exception()
                reason = f"query {query.name} stopped: {error or 'no error reported'}"
                if not self._restarts.take():
                    return f"{reason} ({self._restarts.describe()}, giving up)"
                log.warning("%s; restarting every window query from its checkpoint (%s)",
                            reason.splitlines()[0], self._restarts.describe())  # fmt: skip
                self._restart_queries()
                return None
        return None

    def _restart_queries(self) -> None:
        """Stop what still runs and start every query again from its checkpoint.

        Exactly-once holds across this as across a daemon restart: the checkpoints hold the
        source offsets and ``sink_batches`` skips a micro-batch already committed. Restarting
        all queries (not just the failed one) keeps one way of starting them.
        """
        for query in self.queries:
            try:
                if query.isActive:
                    wait_between_batches(query, timeout_s=30)
                    query.stop()
            except Exception as error:  # noqa: BLE001 - start the queries again regardless
                log.warning("stopping %s before the restart: %s", query.name, error)
        self._stores.close_all()  # the stopped queries' connections (query_stores.py)
        self.queries = self._start_queries()

    def stop(self, *, drain: bool) -> None:
        """Process what is in the spool (if draining), then stop each query between batches.

        ``StreamingQuery.stop`` cancels a running micro-batch; that batch would be replayed at
        the next start (exactly-once), but stopping between batches keeps shutdown clean.
        """
        problems: list[str] = []
        for query in self.queries:
            try:
                if drain and query.isActive:
                    query.processAllAvailable()
                wait_between_batches(query, timeout_s=30)
                query.stop()
            except Exception as error:  # noqa: BLE001 - stop the other queries regardless
                problems.append(f"{query.name}: {str(error).splitlines()[0]}")
        if drain:
            for writer in self._pane_writers:
                try:
                    parked = writer.park()
                    if parked:  # the stop line says what window_pending holds in all
                        log.info("%s: %d open windows parked in window_pending", writer.name,
                                 parked)  # fmt: skip
                except Exception as error:  # noqa: BLE001 - the next start rebuilds them anyway
                    problems.append(f"{writer.name}: parking open windows: {error}")
        self._stores.close_all()
        self.spark.stop()
        if problems:
            raise RuntimeError("; ".join(problems))


class RestartBudget:
    """How many times the window queries may be restarted: ``limit`` within ``period_ms``.

    A query can fail for a passing reason (on a loaded machine a new Python worker may miss
    Spark's fixed 10 s to connect back); a restart from the checkpoints loses nothing. A
    query that keeps failing is a real fault: the daemon stops with its error instead of
    looping.
    """

    def __init__(self, clock: Clock, limit: int = 5, period_ms: int = 600_000) -> None:
        self._clock = clock
        self._limit = limit
        self._period_ms = period_ms
        self._taken: list[int] = []

    def take(self) -> bool:
        now = self._clock.now_ms()
        self._taken = [t for t in self._taken if now - t < self._period_ms]
        if len(self._taken) >= self._limit:
            return False
        self._taken.append(now)
        return True

    def describe(self) -> str:
        return f"restart {len(self._taken)} of {self._limit} allowed in {self._period_ms // 1000} s"


class Janitor:
    """Retention, run from the supervising loop at most once a minute (see retention.py).

    With a spool quota, the spool's size is also checked every ``QUOTA_CHECK_S`` in between,
    and the spool is pruned as soon as it is above ``QUOTA_HIGH_WATER`` of the quota: the
    receivers refuse data over the quota, so committed segments must go within seconds, not
    at the next round up to a minute later (a size check stats every file: no heartbeats
    read, as cheap as the receivers' own rescans).
    """

    INTERVAL_MS = 60_000
    QUOTA_CHECK_MS = SPOOL_RESCAN_MS

    def __init__(
        self, plan: WindowPlan, url: str, retain_log_ms: int, retain_results_ms: int,
        clock: Clock, spool_quota_bytes: int = 0,
    ) -> None:  # fmt: skip
        self._paths, self._checkpoints, self._url = plan.paths, plan.checkpoints, url
        self._retain_log_ms, self._retain_results_ms = retain_log_ms, retain_results_ms
        self._clock = clock
        # Over the quota, committed segments go oldest first whatever their age (retention.py).
        self._spool_quota_bytes = spool_quota_bytes
        self._next_ms = clock.now_ms() + self.INTERVAL_MS
        self._next_quota_check_ms = clock.now_ms()

    def maybe_run(self) -> None:
        now = self._clock.now_ms()
        if now >= self._next_ms:
            self._next_ms = now + self.INTERVAL_MS
            self._run()
        elif self._spool_quota_bytes and now >= self._next_quota_check_ms:
            self._next_quota_check_ms = now + self.QUOTA_CHECK_MS
            self._enforce_quota()

    def _enforce_quota(self) -> None:
        try:
            if spool_bytes(self._paths.spool) > self._spool_quota_bytes * QUOTA_HIGH_WATER:
                self._prune_spool()
        except Exception as error:  # noqa: BLE001 - retention must never stop the daemon
            log.warning("retention: spool quota check skipped: %s", str(error).splitlines()[0])

    def _run(self) -> None:
        try:
            self._prune_spool()
            with ResultStore(self._url, retry=RetryPolicy(max_attempts=1)) as store:
                store.prune(self._clock.now_ms() - self._retain_results_ms)
        except Exception as error:  # noqa: BLE001 - retention must never stop the daemon
            log.warning("retention skipped this round: %s", str(error).splitlines()[0])

    def _prune_spool(self) -> None:
        """Committed segments past the age, and, over the quota, the oldest committed ones."""
        prune_spool(self._paths.spool, self._checkpoints,
                    self._retain_log_ms, self._clock,
                    quota_bytes=self._spool_quota_bytes)  # fmt: skip


def wait_between_batches(query: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while query.isActive and query.status["isTriggerActive"] and time.monotonic() < deadline:
        time.sleep(0.02)


def terminate_with_parent() -> None:
    """In the ingest child, before exec: SIGTERM when `run` dies, even by SIGKILL (Linux).

    The receiver then drains its socket, writes its closing segment and frees the port for
    the restarted daemon, instead of living on as an orphan that holds the port.
    """
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def supervise(
    stop: StopRequested, job: WindowJob, ingest: subprocess.Popen[bytes] | None
) -> str | None:
    while not stop:
        if ingest is not None and ingest.poll() is not None:
            return f"ingest process exited with status {ingest.returncode}"
        failure = job.failure()
        if failure:
            return failure
        time.sleep(0.2)
    log.info("signal %s: stopping", stop.signal)
    return None


def shutdown(
    ingest: subprocess.Popen[bytes] | None, job: WindowJob | None, server: Any, failure: str | None,
    before_store_stops: Callable[[], None] | None = None,
) -> str | None:
    """Stop in data-path order so what was received reaches the store: receivers flush their
    last segment, the job processes what is in the spool, then the store stops.
    ``before_store_stops`` runs while the store still answers (the terminal's summary)."""
    problem = None
    if ingest is not None and ingest.poll() is None:
        ingest.send_signal(signal.SIGTERM)
        try:
            ingest.wait(timeout=30)
        except subprocess.TimeoutExpired:
            ingest.kill()
            problem = "ingest did not stop within 30 s and was killed"
    if job is not None:
        try:
            job.stop(drain=failure is None)
        except Exception as error:  # noqa: BLE001 - report, then still stop the store
            problem = f"stopping the Spark job failed: {error}"
    if before_store_stops is not None:
        try:
            before_store_stops()
        except Exception as error:  # noqa: BLE001 - a summary must not keep the store running
            log.warning("stop summary: %s", str(error).splitlines()[0])
    if server is not None:
        server.stop()
    return problem


def write_private_json(path: Path, payload: dict[str, Any]) -> None:
    """run.json holds the store password: create it readable by the owner only."""
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(payload, handle, indent=2)
    os.replace(temporary, path)
