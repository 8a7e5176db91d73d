"""Window job throughput and result freshness on this machine (issue: Event-time windows).

    .venv/bin/python bench/windows.py --series 10000 --seconds 60 --kind tumbling
    .venv/bin/python bench/windows.py --series 10000 --seconds 60 --type ms   # sketch lane
    .venv/bin/python bench/windows.py --series 10000 --seconds 60 --kind hopping --size 10s --hop 1s

A writer appends one segment per second to a live spool, holding one pane partial per active
series (what ingest writes at 1 s panes), with a heartbeat. The real window job (Spark
``local[2]``, the embedded PostgreSQL) processes it. Printed, as medians and p99 over the run:

- partial rows per second through the job (Spark's own progress: input rows / batch time)
  and micro-batch duration;
- freshness: from the moment the segment whose heartbeat moves the watermark past a window's
  end is written, to the moment that window's row is visible in ``window_results``: the
  commit time of the transaction that wrote it (``track_commit_timestamp``, read by a poll
  every 100 ms);
- sustained: whether the query took the offered partial rows per second over the run (the
  batches after the first, over the wall time from the first's end to the last's, at least
  97 %) and freshness did not grow from the first half of the windows to the second: a
  micro-batch job keeps up with batches longer than a second as long as each carries that
  much more input;
- each query's executor task time and CPU (Spark's UI), an idle lane's included.

``--kind session`` needs series that pause: ``--duty 5/10`` has each series send in 5 of
every 10 seconds (staggered), so its sessions (gap 3 s) close and are evicted.

``--type``: the series' metric type. ``c`` (default) runs through the native lane (Spark's own
aggregates); ``s`` too, with an HLL_8 of 20 members per partial unioned by ``hll_union_agg``;
``ms`` through the sketch lane (t-digest + HDR buckets of 10 values per partial, merged by the
stateful operator). Same series count, same rows: the ratio is the sketch lane's cost.

``--sets with_timers`` (tumbling): the window's ``sets: with_timers``, so its native lane
aggregates counters and gauges without an HLL per group and its sets go through the sketch
lane (``--type s`` is then measured there). The lane's store commits and the ``toArrow`` of
each batch with rows are timed apart, so a batch's driver time splits into Spark (``toArrow``),
the store, and the code between them; so are the closed windows a held lane publishes before
its batch's Spark jobs or between batches (``publish_released``). The last line lists each
measured window's freshness in order.

``--sets separate`` (tumbling): the window's ``sets: separate``, so its native lane aggregates
counters and gauges without an HLL per group and its sets merge natively in a third query
(``bench.w.sets``), which waits while the log has no set. ``--also-sets N`` adds N set series
(an HLL_8 of 20 members per partial) to every segment beside the ``--series`` of ``--type``:
the price of a third query when sets do arrive. Freshness is then that of the ``--type``
windows (a set row of the same end does not count)::

    .venv/bin/python bench/windows.py --series 100000 --also-sets 10000 --sets separate \
        --seconds 150 --warmup 75

``--compare-kll`` (with ``--type ms``, tumbling or hopping): the config gets a second window,
``wk``, identical but for ``quantiles: kll``, and the partials also carry pane KLLs (as
receivers write them when a window uses kll). Both windows run in the same job on the same
load, so the machine's noise hits both; the t-digest sketch lane (query ``bench.w.sketches``)
and the kll window's one query (``bench.wk``) are printed side by side, with their ratio.

``--catch-up``: instead of a live writer, ``--seconds`` one-second segments are written first
(pane ``i``, heartbeat at its end) and the job processes them with ``availableNow``; printed are
the lane query's rows per second of batch time and the wall time to drain the log. On a busy
shared machine live batches stretch and freshness means little; a drained log compares code
paths (e.g. hopping by pane merge vs. copied rows, run alternately) far more steadily::

    .venv/bin/python bench/windows.py --catch-up --series 2000 --seconds 30 --kind hopping \
        --hop 1s --type ms

``--trace``: per measured window, what happened around its closing (segments written,
the lane's Spark jobs, its commits, the publications ahead of a batch, and the writer's
debug log of its copies ahead: why one was not started, dropped, prepared; in ms from the
closing segment). ``--pg KEY=VALUE`` (repeatable): a server setting for the bench's own
PostgreSQL cluster, to try one against its default::

    .venv/bin/python bench/windows.py --series 100000 --seconds 150 --warmup 75 \
        --sets separate --trace --pg wal_buffers=64MB

``--warmup S``: leave the first ``S`` seconds out of every figure (batches started, windows
whose watermark passed, commits). A fresh driver JVM spends its first minutes compiling
Spark's code (40 s in, the JIT compiler threads used more CPU than the tasks), so a short run
measures the warm-up; the daemon runs for days::

    .venv/bin/python bench/windows.py --series 10000 --seconds 210 --warmup 90

Targets (issue): 100k active series at 1 s panes sustained; p50 freshness <= 1 s::

    .venv/bin/python bench/windows.py --series 100000 --seconds 180 --warmup 90
"""

from __future__ import annotations

import argparse
import datetime
import logging
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import sql
from pyspark.sql.streaming.query import StreamingQuery
from spark_stages import (
    KEEP_ALL_JOBS,
    UiSnapshot,
    batch_breakdown,
    print_breakdown,
    task_seconds,
)

from streamgauge.clock import SystemClock
from streamgauge.configs import parse_config
from streamgauge.ingest.log import SEGMENT_SCHEMA, Heartbeat, SegmentWriter
from streamgauge.ingest.pane_sketches import PaneSketches
from streamgauge.sinks.embedded import EmbeddedPostgres
from streamgauge.sinks.store import PreparedRelease, ResultStore, run_sql
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.windows.job import JobPaths, start_window_queries
from streamgauge.windows.session import build_spark_session


class TimedStore(ResultStore):
    """The real store, timing its commits: splits a batch's time into Spark vs. PostgreSQL."""

    commits: list[tuple[int, float, str]] = []  # (wall ms at the start, seconds, query)
    releases: list[tuple[int, float, str]] = []  # publish_released: windows ahead of a batch

    @staticmethod
    def _timed(into: list[tuple[int, float, str]], call, *args, **kwargs):  # type: ignore[no-untyped-def]
        wall = time.time_ns() // 1_000_000
        started = time.perf_counter()
        try:
            return call(*args, **kwargs)
        finally:
            into.append((wall, time.perf_counter() - started, args[0]))

    def commit_batch(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._timed(TimedStore.commits, super().commit_batch, *args, **kwargs)

    def publish_released(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return self._timed(TimedStore.releases, super().publish_released, *args, **kwargs)

    def prepare_release(self, query_name, *, lock_name=None):  # type: ignore[no-untyped-def]
        return TimedPreparedRelease(self._url, query_name, lock_name or query_name)


class TimedPreparedRelease(PreparedRelease):
    """A prepared release timing its copy and its commit (``--trace``: ``copy`` and
    ``prepared``)."""

    copies: list[tuple[int, float, str]] = []
    commits: list[tuple[int, float, str]] = []

    def copy(self, results):  # type: ignore[no-untyped-def]
        return TimedStore._timed(TimedPreparedRelease.copies, self._named(super().copy),
                                 self.query_name, results)  # fmt: skip

    def commit(self, **kwargs):  # type: ignore[no-untyped-def]
        return TimedStore._timed(TimedPreparedRelease.commits, self._named(super().commit),
                                 self.query_name, **kwargs)  # fmt: skip

    @staticmethod
    def _named(call):  # type: ignore[no-untyped-def]
        """``call`` after the query's name, which ``TimedStore._timed`` records."""
        return lambda _name, *args, **kwargs: call(*args, **kwargs)


class WriterLog(logging.Handler):
    """The window writers' debug log (``--trace``): why a copy ahead was not started, and
    when one was prepared or dropped, with the wall ms of each record."""

    records: list[tuple[int, str]] = []

    @classmethod
    def install(cls) -> None:
        job_log = logging.getLogger("streamgauge.windows.job")
        job_log.setLevel(logging.DEBUG)
        job_log.propagate = False  # the debug lines go to the trace, not to stderr
        job_log.addHandler(cls())
        warnings = logging.StreamHandler()
        warnings.setLevel(logging.WARNING)
        job_log.addHandler(warnings)

    def emit(self, record: logging.LogRecord) -> None:
        WriterLog.records.append((int(record.created * 1000), record.getMessage()))


class TimedToArrow:
    """Times ``DataFrame.toArrow`` (a ``foreachBatch`` taking its micro-batch to the driver:
    Spark's jobs plus the Arrow transfer) for the calls that brought rows: splits a batch's
    driver time into Spark, the store, and our own code between them."""

    calls: list[tuple[int, float]] = []  # (wall ms at the start, seconds)

    @classmethod
    def install(cls) -> None:
        from pyspark.sql.classic.dataframe import DataFrame as ClassicDataFrame

        original = ClassicDataFrame.toArrow

        def timed(frame):  # type: ignore[no-untyped-def]
            wall = time.time_ns() // 1_000_000
            started = time.perf_counter()
            table = original(frame)
            if table.num_rows:
                cls.calls.append((wall, time.perf_counter() - started))
            return table

        ClassicDataFrame.toArrow = timed  # type: ignore[method-assign]


WINDOWS = {
    "tumbling": "{name: w, kind: tumbling, size: SIZE, watermark_delay: 1s, allowed_lateness: 2s}",
    "hopping": "{name: w, kind: hopping, size: SIZE, hop: HOP, watermark_delay: 1s, "
    "allowed_lateness: 2s}",
    "sliding": "{name: w, kind: sliding, size: SIZE, watermark_delay: 1s, allowed_lateness: 2s}",
    # key: user; the bench's series carry no tags, so each metric is one series of sessions
    "session": "{name: w, kind: session, gap: 3s, key: user, watermark_delay: 1s, "
    "allowed_lateness: 2s}",
}


def pane_batch(
    names: pa.Array,
    pane_start_ms: int,
    rng: np.random.Generator,
    metric_type: str,
    kll_k: int | None = None,
) -> pa.RecordBatch:
    n = len(names)
    values = rng.integers(1, 100, n).astype(np.float64)
    times = np.full(n, pane_start_ms, dtype=np.int64)
    count = np.ones(n, dtype=np.int64)
    if metric_type == "c":
        # No sketch columns: NULLs, built without a Python object per series (this runs in
        # the driver's process and holds the GIL the foreachBatch callbacks need).
        sketch_fields = SEGMENT_SCHEMA.names[-4:]
        nulls = [pa.nulls(n, SEGMENT_SCHEMA.field(name).type) for name in sketch_fields]
        return pa.RecordBatch.from_arrays(
            _scalar_columns(names, metric_type, times, count, values) + nulls,
            schema=SEGMENT_SCHEMA,
        )
    sketches = PaneSketches(compile_accuracy(), kll_k)
    keys = [((name, metric_type, "{}"), pane_start_ms) for name in names.to_pylist()]
    if metric_type == "ms":
        samples = rng.lognormal(3.0, 0.8, (n, 10)).round(3)
        for key, row in zip(keys, samples, strict=True):
            sketches.add_values(key, row)
        count[:] = 10
        values = samples.sum(axis=1)
    elif metric_type == "s":
        members = rng.integers(0, 10_000, (n, 20))
        for key, row in zip(keys, members.tolist(), strict=True):
            for member in row:
                sketches.add_member(key, f"u{member}")
        count[:] = 20
    columns = _scalar_columns(names, metric_type, times, count, values)
    return pa.RecordBatch.from_arrays([*columns, *sketches.columns(keys)], schema=SEGMENT_SCHEMA)


def _scalar_columns(
    names: pa.Array, metric_type: str, times: np.ndarray, count: np.ndarray, values: np.ndarray
) -> list[pa.Array]:
    """A pane batch's columns before the four sketch columns."""
    n = len(names)
    return [
        names,
        pa.repeat(pa.scalar(metric_type), n),
        pa.repeat(pa.scalar("{}"), n),
        pa.array(times),
        pa.array(count),
        pa.array(values),
        pa.array(values),
        pa.array(values),
        pa.array(values),
        pa.array(times + 500),
        pa.array(times + 500),
        pa.array(times + 500),
    ]


class Writer(threading.Thread):
    """One segment per second; records when each heartbeat was written (wall ms)."""

    def __init__(
        self, spool: Path, series: int, seconds: int, metric_type: str, kll_k: int | None = None,
        duty: tuple[int, int] | None = None, also_sets: int = 0,
    ) -> None:
        super().__init__(daemon=True)
        # --also-sets: built once (20 HLL members per series is ~0.2 s of Python a second,
        # in the driver's process) and moved to each second's pane.
        self.sets = None if also_sets == 0 else pane_batch(
            pa.array([f"bench.s{i}" for i in range(also_sets)], pa.string()), 0,
            np.random.default_rng(11), "s", kll_k,
        )  # fmt: skip
        self.metric_type = metric_type
        self.kll_k = kll_k
        self.names = pa.array([f"bench.m{i}" for i in range(series)], pa.string())
        self.duty = duty
        self.writer = SegmentWriter(spool, "r0", fsync=False)
        self.seconds = seconds
        self.heartbeats: list[tuple[int, int]] = []  # (heartbeat ms, wall ms when written)
        self.measured_from_ms = 0  # wall ms: what happened before is warm-up (see --warmup)

    def run(self) -> None:
        rng = np.random.default_rng(7)
        for _ in range(self.seconds):
            now = time.time_ns() // 1_000_000
            pane = now - now % 1000
            names = active_names(self.names, pane, self.duty)
            batch = pane_batch(names, pane, rng, self.metric_type, self.kll_k)
            if self.sets is not None:
                batch = pa.Table.from_batches([batch, moved_to_pane(self.sets, pane)])
                batch = batch.combine_chunks().to_batches()[0]
            self.writer.append(batch, Heartbeat(now, False))
            self.heartbeats.append((now, time.time_ns() // 1_000_000))
            time.sleep(max(0.0, 1 - (time.time_ns() // 1_000_000 - now) / 1000))


def moved_to_pane(batch: pa.RecordBatch, pane_ms: int) -> pa.RecordBatch:
    """``batch`` (built for pane 0) with its times in the pane starting at ``pane_ms``."""
    columns = list(batch.columns)
    for name in ("pane_start_ms", "last_event_ms", "first_recv_ms", "last_recv_ms"):
        index = batch.schema.get_field_index(name)
        columns[index] = pc.add(columns[index], pane_ms)
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def active_names(names: pa.Array, pane_ms: int, duty: tuple[int, int] | None) -> pa.Array:
    """The series sending in the pane starting at ``pane_ms``: all of them, or with ``duty``
    ``(active, period)`` series ``i`` in ``active`` seconds of every ``period``, from its own
    offset ``i % period``: sessions that close (the pause is longer than a gap) on a staggered
    schedule, so some end every second."""
    if duty is None:
        return names
    active, period = duty
    phase = (pane_ms // 1000 + np.arange(len(names))) % period
    return names.filter(pa.array(phase < active))


def freshness(
    url: str, writer: Writer, delay_ms: int, seconds: int, metric_type: str
) -> tuple[list[float], dict[int, int]]:
    """Poll for newly visible windows of ``metric_type``; seconds from watermark passing
    end to visibility."""
    first_seen: dict[int, int] = {}
    deadline = time.monotonic() + seconds + 30
    newest = 0
    # One connection for the whole poll: connecting every 100 ms cost this process (the
    # driver's, whose GIL the foreachBatch callbacks need) more CPU than the queries.
    poll = psycopg.connect(url, autocommit=True)
    while time.monotonic() < deadline and writer.is_alive() or time.monotonic() < deadline - 25:
        # Only ends newer than the newest seen (an index range scan on window_end): the
        # table grows by every series each window, and a full scan every 100 ms would load
        # the store the job writes to.
        # A window's rows are committed together; the commit time is when they became
        # visible, not the poll that first sees them (up to 100 ms later). Read at first
        # sight, before the finalization rewrites the rows (seconds later).
        rows = poll.execute(
            "select (extract(epoch from window_end) * 1000)::bigint, "
            "(extract(epoch from min(pg_xact_commit_timestamp(xmin))) * 1000)::bigint "
            f"from window_results where window_end > to_timestamp({newest} / 1000.0) "
            "and metric_type = %s group by 1",
            [metric_type],
        ).fetchall()  # fmt: skip
        now = time.time_ns() // 1_000_000
        for end, committed in rows:
            first_seen.setdefault(int(end), now if committed is None else int(committed))
            newest = max(newest, int(end))
        time.sleep(0.1)
    poll.close()
    lags = []
    for end, seen in sorted(first_seen.items()):
        passed = [wall for beat, wall in writer.heartbeats if beat - delay_ms >= end]
        if passed and passed[0] >= writer.measured_from_ms:
            lags.append((seen - passed[0]) / 1000)
    return lags, first_seen


def print_trace(writer: Writer, first_seen: dict[int, int], delay_ms: int, lane: str) -> None:
    """Per measured window, what happened from 2.5 s before its closing segment was written
    to its row becoming visible, in ms from that segment: segments written (``seg``), the
    lane's Spark jobs (``spark``: ``toArrow``), its batch commits (``commit``), the
    publications ahead of a batch (``publish``), and the prepared releases' copies
    (``copy``) and commits (``prepared``), each as start+duration."""
    for end, seen in sorted(first_seen.items()):
        passed = [wall for beat, wall in writer.heartbeats if beat - delay_ms >= end]
        if not passed or passed[0] < writer.measured_from_ms:
            continue
        t0 = passed[0]

        def near(start: int) -> bool:
            return t0 - 2500 <= start <= seen  # noqa: B023

        events = [(wall, f"seg {wall - t0:+d}") for _, wall in writer.heartbeats if near(wall)]
        events += [(wall, f"spark {wall - t0:+d}+{dur * 1000:.0f}")
                   for wall, dur in TimedToArrow.calls if near(wall)]  # fmt: skip
        events += [(wall, f"commit {wall - t0:+d}+{dur * 1000:.0f}")
                   for wall, dur, query in TimedStore.commits
                   if query == lane and near(wall)]  # fmt: skip
        events += [(wall, f"publish {wall - t0:+d}+{dur * 1000:.0f}")
                   for wall, dur, query in TimedStore.releases
                   if query == lane and near(wall)]  # fmt: skip
        events += [(wall, f"{what} {wall - t0:+d}+{dur * 1000:.0f}")
                   for what, calls in (("copy", TimedPreparedRelease.copies),
                                       ("prepared", TimedPreparedRelease.commits))
                   for wall, dur, query in calls if query == lane and near(wall)]  # fmt: skip
        events += [(wall, f"[{wall - t0:+d} {message.removeprefix(lane + ': ')}]")
                   for wall, message in WriterLog.records
                   if message.startswith(lane + ":") and (near(wall) or f" {end} " in message)
                   and wall <= seen]  # fmt: skip
        print(f"window ending {end}: visible {seen - t0:+d} ms: "
              + ", ".join(text for _, text in sorted(events)))


def _progress_ms(progress: dict) -> int:  # type: ignore[type-arg]
    """When a micro-batch started (Spark's progress ``timestamp``), as epoch ms."""
    started = datetime.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00"))
    return int(started.timestamp() * 1000)


def print_sustained(
    progress: list[dict], lags: list[float], *, offered_rows_per_s: int  # type: ignore[type-arg]
) -> None:
    """Whether the job keeps up: rows it took per second of wall time against the offered rate,
    and whether freshness grows over the run (a backlog building up).

    A micro-batch job keeps up with batches longer than the input's period, as long as each
    carries that much more input. What it cannot do is take fewer rows per second than are
    offered, over the run: then the backlog, and with it freshness, grows without bound.
    """
    if not progress or not lags:
        print("sustained: n/a (no measured batches or windows)")
        return
    started = _progress_ms(progress[0])
    ended = max(_progress_ms(p) + p["durationMs"]["triggerExecution"] for p in progress)
    # Rows of the batches after the first, over the time from the first's end to the last's:
    # the first may carry rows offered before the measured span began.
    rows = sum(p["numInputRows"] for p in progress[1:])
    span_s = (ended - started - progress[0]["durationMs"]["triggerExecution"]) / 1000
    taken = rows / max(span_s, 1e-9)
    half = len(lags) // 2
    early, late = statistics.median(lags[: max(half, 1)]), statistics.median(lags[half:])
    sustained = taken >= 0.97 * offered_rows_per_s and late <= early + 1.0
    print(f"sustained: {sustained} (took {taken:,.0f} partial rows/s over {span_s:.0f} s of "
          f"{offered_rows_per_s:,} offered; freshness median first half {early:.2f} s, second "
          f"half {late:.2f} s)")


def compare_kll(tdigest: list[dict], kll: list[dict], kll_k: int) -> None:  # type: ignore[type-arg]
    """The t-digest sketch lane and the kll window's query, same run, side by side."""

    def medians(progress: list[dict]) -> tuple[float, float, float, int]:  # type: ignore[type-arg]
        seconds = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
        rates = [p["numInputRows"] / max(p["durationMs"]["triggerExecution"], 1) * 1000
                 for p in progress]  # fmt: skip
        if not progress:
            return float("nan"), float("nan"), float("nan"), 0
        # A lane that falls behind reads bigger batches, which amortise fixed per-batch costs:
        # rows over total batch time compares the work better than batch durations do.
        overall = sum(p["numInputRows"] for p in progress) / max(sum(seconds), 1e-9)
        return statistics.median(seconds), statistics.median(rates), overall, len(progress)

    t_batch, t_rate, t_all, t_n = medians(tdigest)
    k_batch, k_rate, k_all, k_n = medians(kll)
    print(f"same load, same run: t-digest sketch lane (bench.w.sketches, {t_n} batches) vs "
          f"quantiles: kll window (bench.wk, k {kll_k}, {k_n} batches), medians")  # fmt: skip
    print(f"{'measure':<32}{'t-digest lane':>15}{'kll window':>12}{'ratio':>8}")
    print(f"{'micro-batch duration (s)':<32}{t_batch:>15.2f}{k_batch:>12.2f}"
          f"{t_batch / k_batch:>7.1f}x")  # fmt: skip
    print(f"{'partial rows/s per micro-batch':<32}{t_rate:>15.0f}{k_rate:>12.0f}"
          f"{k_rate / t_rate:>7.1f}x")  # fmt: skip
    print(f"{'rows / total batch time':<32}{t_all:>15.0f}{k_all:>12.0f}{k_all / t_all:>7.1f}x")
    print("(the kll window's rows/s counts every row it reads; the sketch lane's query also "
          "reads them all and keeps the timer rows)")


def measured_query(args: argparse.Namespace) -> str:
    """The query of window ``w`` that the bench's metric type goes through."""
    if args.kind in ("tumbling", "hopping") and args.type == "ms":
        return "bench.w.sketches"
    if args.sets == "with_timers" and args.type == "s":
        return "bench.w.sketches"  # the window's sets merge in its sketch lane
    if args.sets == "separate" and args.type == "s":
        return "bench.w.sets"
    return "bench.w"


def catch_up(spark, config, paths, url, args) -> None:  # type: ignore[no-untyped-def]
    """Write ``args.seconds`` segments, then drain them with ``availableNow``."""
    writer = Writer(paths.spool, args.series, args.seconds, args.type, config.kll_k)
    rng = np.random.default_rng(7)
    base = (time.time_ns() // 1_000_000) // 1000 * 1000 - args.seconds * 1000
    for i in range(args.seconds):
        pane = base + i * 1000
        batch = pane_batch(writer.names, pane, rng, args.type, config.kll_k)
        writer.writer.append(batch, Heartbeat(pane + 1000, i == args.seconds - 1))
    started = time.monotonic()
    queries = start_window_queries(
        spark, config, paths, lambda: TimedStore(url), SystemClock(), trigger_interval=None
    )
    for query in queries:
        query.awaitTermination()
    wall = time.monotonic() - started
    lane = measured_query(args)
    for query in queries:
        progress = [p for p in query.recentProgress if p["numInputRows"] > 0]
        rows = sum(p["numInputRows"] for p in progress)
        busy = sum(p["durationMs"]["triggerExecution"] for p in progress) / 1000
        mark = " <- lane measured" if query.name == lane else ""
        print(f"query {query.name}: {len(progress)} batches, {rows} input rows, "
              f"{busy:.1f} s of batch time, {rows / max(busy, 1e-9):.0f} rows/s, "
              f"exception: {query.exception()}{mark}")  # fmt: skip
    _, stored = run_sql(url, "select count(*) from window_results")
    hop = f" hop {args.hop}" if args.kind == "hopping" else ""
    print(f"catch-up: {args.kind} {args.size}{hop}, {args.series} series of type "
          f"{args.type!r} x {args.seconds} panes = {args.series * args.seconds} partials, "
          f"drained in {wall:.1f} s wall, {stored[0][0]} window rows stored")  # fmt: skip
    spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--kind", choices=sorted(WINDOWS), default="tumbling")
    parser.add_argument("--size", default="10s", help="window size (tumbling, hopping, sliding)")
    parser.add_argument("--hop", default="5s", help="hopping windows' hop (size/hop windows "
                        "hold each instant: e.g. --size 60s --hop 1s)")
    parser.add_argument("--type", choices=("c", "ms", "s"), default="c",
                        help="metric type of every series (ms: the sketch lane)")
    parser.add_argument("--duty", default=None, metavar="ACTIVE/PERIOD",
                        help="each series sends in ACTIVE of every PERIOD seconds (staggered "
                        "by series), e.g. 5/10 with --kind session (gap 3s), so that sessions "
                        "close; default: every series every second")
    parser.add_argument("--trigger", default="0.5 seconds",
                        help="the queries' micro-batch interval, as `streamgauge run --trigger` "
                        "(default %(default)s, the daemon's)")
    parser.add_argument("--warmup", type=int, default=0,
                        help="seconds at the start left out of every figure: the JVM is still "
                        "compiling Spark's code for minutes (see README)")
    parser.add_argument("--windows", type=int, default=1,
                        help="windows of this shape in the config (all run; w is measured)")
    parser.add_argument("--catch-up", action="store_true",
                        help="write --seconds segments first, then drain them (availableNow)")
    parser.add_argument("--shuffle-partitions", type=int, default=None,
                        help="state partitions (default: 2 per core)")
    parser.add_argument("--sets", choices=("native", "with_timers", "separate"),
                        default="native",
                        help="the tumbling window's sets: key (where its sets merge)")
    parser.add_argument("--also-sets", type=int, default=0, metavar="N",
                        help="N set series in every segment too (freshness: --type's windows)")
    parser.add_argument("--rocksdb", action="store_true", help="RocksDB state store")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra Spark setting for the job (repeatable)")
    parser.add_argument("--pg", action="append", default=[], metavar="KEY=VALUE",
                        help="a PostgreSQL setting for the bench's own cluster (ALTER SYSTEM, "
                             "applied by its restart), e.g. wal_buffers=64MB")
    parser.add_argument("--trace", action="store_true",
                        help="per measured window: the segments, Spark jobs, commits and "
                             "publications around its closing, in ms from the closing segment")
    parser.add_argument("--compare-kll", action="store_true",
                        help="with --type ms: also run the window with quantiles: kll (window wk) "
                        "on the same load and print both lanes side by side")
    args = parser.parse_args()
    duty = None
    if args.duty:
        active, _, period = args.duty.partition("/")
        duty = (int(active), int(period))
        if not 0 < duty[0] <= duty[1]:
            parser.error("--duty ACTIVE/PERIOD needs 0 < ACTIVE <= PERIOD")
    if args.sets != "native" and args.kind != "tumbling":
        parser.error(f"--sets {args.sets} needs --kind tumbling")
    if args.compare_kll and (args.type != "ms" or args.kind not in ("tumbling", "hopping")):
        parser.error("--compare-kll needs --type ms and --kind tumbling or hopping")

    root = Path(tempfile.mkdtemp(prefix="streamgauge-bench-windows-"))
    server = EmbeddedPostgres(root, port=None)
    url = server.start()
    # freshness() reads the moment each window became visible off its transaction's commit
    # time, which the server records only with this on (a restart applies it).
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET track_commit_timestamp = on")
        for setting in args.pg:  # --pg KEY=VALUE: a server setting to try (ALTER SYSTEM)
            key, value = setting.split("=", 1)
            admin.execute(
                sql.SQL("ALTER SYSTEM SET {} = {}").format(
                    sql.Identifier(key), sql.Literal(value)
                )
            )
    server.stop()
    url = server.start()
    try:
        ResultStore(url).ensure_schema()
        shape = WINDOWS[args.kind].replace("SIZE", args.size).replace("HOP", args.hop)
        if args.sets != "native":
            shape = shape.replace("kind: tumbling,", f"kind: tumbling, sets: {args.sets},")
        # --windows N: N - 1 more windows of the same shape (w2, w3, ...) share the job and the
        # cores; "bench.w" is still the one measured.
        windows = [shape] + [shape.replace("name: w,", f"name: w{i},")
                             for i in range(2, args.windows + 1)]  # fmt: skip
        if args.compare_kll:
            windows.append(shape.replace("name: w,", "name: wk, quantiles: kll,"))
        text = f"name: bench\npane: 1s\nwindows: [{', '.join(windows)}]\n"
        config = parse_config(text, "bench")
        # Keep every batch's progress (Spark keeps the last 100): a long run is measured whole.
        conf = {"spark.sql.streaming.numRecentProgressUpdates": "100000", **KEEP_ALL_JOBS}
        if args.rocksdb:
            conf["spark.sql.streaming.stateStore.providerClass"] = (
                "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
            )
        for setting in args.conf:
            key, _, value = setting.partition("=")
            conf[key] = value
        TimedToArrow.install()
        if args.trace:
            WriterLog.install()
        spark = build_spark_session(
            "local[2]", app_name="bench-windows", shuffle_partitions=args.shuffle_partitions,
            extra_conf=conf,
        )  # fmt: skip
        paths = JobPaths(spool=root / "spool", checkpoints=root / "checkpoints")
        paths.spool.mkdir()
        if args.catch_up:
            catch_up(spark, config, paths, url, args)
            return
        queries = start_window_queries(
            spark, config, paths, lambda: TimedStore(url), SystemClock(),
            trigger_interval=args.trigger,
        )  # fmt: skip
        writer = Writer(paths.spool, args.series, args.seconds, args.type, config.kll_k, duty,
                        args.also_sets)  # fmt: skip
        writer.measured_from_ms = time.time_ns() // 1_000_000 + args.warmup * 1000
        writer.start()
        lags, first_seen = freshness(
            url, writer, config.windows[0].watermark_delay_ms, args.seconds, args.type
        )
        writer.join()
        lane = measured_query(args)
        [measured] = [q for q in queries if q.name == lane]

        def measured_batches(query: StreamingQuery) -> list[dict]:  # type: ignore[type-arg]
            return [p for p in query.recentProgress if p["numInputRows"] > 0
                    and _progress_ms(p) >= writer.measured_from_ms]  # fmt: skip

        progress = measured_batches(measured)
        kll_progress = [p for q in queries if q.name == "bench.wk"
                        for p in measured_batches(q)]  # fmt: skip
        commits = [seconds for wall, seconds, query in TimedStore.commits
                   if wall >= writer.measured_from_ms and query == lane]  # fmt: skip
        releases = [seconds for wall, seconds, query in TimedStore.releases
                    if wall >= writer.measured_from_ms and query == lane]  # fmt: skip
        to_arrow = [seconds for wall, seconds in TimedToArrow.calls
                    if wall >= writer.measured_from_ms]  # fmt: skip
        for query in queries:
            batches = query.recentProgress
            print(f"query {query.name}: {len(batches)} progress reports, "
                  f"{sum(p['numInputRows'] for p in batches)} input rows, "
                  f"exception: {query.exception()}")
        ui = UiSnapshot.read(spark.sparkContext.uiWebUrl or "", spark.sparkContext.applicationId)
        measured_s = (time.time_ns() // 1_000_000 - writer.measured_from_ms) / 1000
        stages = batch_breakdown(ui, lane, writer.measured_from_ms)
        tasks = task_seconds(ui, writer.measured_from_ms)
        for query in queries:
            query.stop()
        spark.stop()
        rates = [p["numInputRows"] / max(p["durationMs"]["triggerExecution"], 1) * 1000
                 for p in progress]  # fmt: skip
        durations = [p["durationMs"]["triggerExecution"] / 1000 for p in progress]
        # one partial per sending series per second
        rows_per_s = args.series if duty is None else args.series * duty[0] // duty[1]
        hop = f" hop {args.hop}" if args.kind == "hopping" else ""
        described = "gap 3s" if args.kind == "session" else f"{args.size}{hop}"
        duty_note = "" if duty is None else f", each sending {duty[0]} s of every {duty[1]} s"
        print(f"window job, {args.kind} {described}, {args.series} series{duty_note} of type "
              f"{args.type!r} "
              f"{f'and {args.also_sets} set series ' if args.also_sets else ''}"
              f"(query {lane}, sets: {args.sets}) at 1 s panes "
              f"({rows_per_s} partial rows/s offered), {args.seconds} s (first {args.warmup} s "
              f"left out), local[2], trigger {args.trigger}, "
              f"shuffle partitions {spark.conf.get('spark.sql.shuffle.partitions')}, "
              f"{'RocksDB' if args.rocksdb else 'HDFS'} state store")  # fmt: skip
        print(f"{'measure':<44}{'median':>10}{'p99':>10}")
        for name, values in (
            ("partial rows/s per micro-batch (lane query)", rates),
            ("micro-batch duration (s)", durations),
            ("freshness: watermark passes end -> row (s)", lags),
            ("store commit per batch, lane query (s)", commits),
            ("windows published ahead of a batch (s)", releases),
            ("toArrow of a batch with rows (s)", to_arrow),
        ):
            if values:
                p99 = float(np.percentile(values, 99))
                print(f"{name:<44}{statistics.median(values):>10.2f}{p99:>10.2f}")
            else:
                print(f"{name:<44}{'n/a':>10}{'n/a':>10}")
        phases: dict[str, list[float]] = {}
        for p in progress:
            for phase, ms in p["durationMs"].items():
                phases.setdefault(phase, []).append(ms / 1000)
            # Inside addBatch: the state store's own timings, summed over the query's
            # stateful operators (Spark's StateOperatorProgress).
            for phase in ("allUpdatesTimeMs", "allRemovalsTimeMs", "commitTimeMs"):
                ms = sum(op.get(phase, 0) for op in p.get("stateOperators", []))
                phases.setdefault(f"state.{phase[:-6]}", []).append(ms / 1000)
        print("where a micro-batch's time goes (median s):", ", ".join(
            f"{phase} {statistics.median(v):.2f}" for phase, v in sorted(phases.items())
        ))
        print_breakdown(stages)
        for name, (run_s, cpu_s) in sorted(tasks.items()):
            print(f"tasks of {name}: {run_s:.1f} s run, {cpu_s:.1f} s CPU in {measured_s:.0f} s "
                  f"({cpu_s / max(measured_s, 1e-9):.2f} cores)")
        print_sustained(progress, lags, offered_rows_per_s=rows_per_s)
        print(f"freshness of each window, in order (s): {' '.join(f'{v:.2f}' for v in lags)}; "
              f"{len(releases)} publications ahead of a batch in the same span")
        if args.trace:
            print_trace(writer, first_seen, config.windows[0].watermark_delay_ms, lane)
        if args.compare_kll:
            compare_kll(progress, kll_progress, config.sketches.kll_k)
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
