"""Window job throughput and freshness on this machine, beside the previous code in one run.

    .venv/bin/python bench/window_job.py --series 100000 --types ms --seconds 150 --warmup 60
    .venv/bin/python bench/window_job.py --series 100000 --types c:40,ms:40,g:10,s:10
    .venv/bin/python bench/window_job.py --series 100000 --types ms --compare e1f16d3 --pairs 2
    .venv/bin/python bench/window_job.py --kind session --series 10000 --types ms --compare e1f16d3
    .venv/bin/python bench/window_job.py --series 100000 --types ms --minute-window --before DIR
    .venv/bin/python bench/window_job.py --series 100000 --types ms --quantiles kll --before DIR

A writer process appends one segment per second to a live spool, holding one pane partial per
active series (what ingest writes at 1 s panes: timers carry a t-digest and HDR buckets of 10
values, and with ``--quantiles kll`` a KLL sketch of them, sets an HLL of 20 members), with the
receiver's heartbeat; the measured window has ``quantiles: kll`` then. The real window job
(Spark ``local[2]``, the embedded PostgreSQL) processes it. Printed, over the measured span
(after ``--warmup``):

- partial rows/s taken (the rows the job's batches read, between the ends of the first and
  the last batch that published windows: whole window periods) against the rows the writer
  wrote in the same span, and micro-batch duration (the window writer's ``foreachBatch``);
- freshness: from the moment the segment whose heartbeat moves the watermark past a window's
  end is written, to the commit of the transaction that made the window's row visible
  (``track_commit_timestamp`` of a few series' rows, polled every 100 ms by their key);
- sustained: the job took ≥ 97 % of the offered rows and freshness did not grow from the
  first half of the windows to the second;
- CPU: cores used by this process and its children (the driver's JVM, Python workers,
  PostgreSQL; not the writer's process) over the span, and the machine's load average.

``--before CHECKOUT`` runs this same bench on the code of another checkout (a ``git worktree``
of an earlier commit of this design) and on this code alternately, ``--pairs`` times each.
``--compare REV`` runs the bench of commit ``REV`` (its ``bench/windows.py``, in a git worktree
of that commit, with its own code on ``PYTHONPATH``) and this one alternately, ``--pairs``
times each, on the same arguments (``--types`` must then be one type; timers and sets go
through REV's sketch and sets lanes, counters with ``--sets separate``, its fastest), and
prints both sides' medians in one table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import queue
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.streaming.query import StreamingQuery

from streamgauge.clock import SystemClock
from streamgauge.configs import parse_config
from streamgauge.ingest.log import SEGMENT_SCHEMA, Heartbeat, SegmentWriter
from streamgauge.ingest.pane_sketches import PaneSketches
from streamgauge.sinks.embedded import EmbeddedPostgres
from streamgauge.sinks.store import ResultStore
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.windows import pane_writer
from streamgauge.windows.job import start_window_queries
from streamgauge.windows.session import build_spark_session

WINDOWS = {
    "tumbling": "{name: w, kind: tumbling, size: SIZE, watermark_delay: 1s, allowed_lateness: 2s}",
    "hopping": "{name: w, kind: hopping, size: SIZE, hop: HOP, watermark_delay: 1s, "
    "allowed_lateness: 2s}",
    "sliding": "{name: w, kind: sliding, size: SIZE, watermark_delay: 1s, allowed_lateness: 2s}",
    "session": "{name: w, kind: session, gap: 3s, key: user, watermark_delay: 1s, "
    "allowed_lateness: 2s}",
}
MINUTE_WINDOW = ("{name: m, kind: tumbling, size: 1m, watermark_delay: 2s, "
                 "allowed_lateness: 30s}")
"""``--minute-window``: the quickstart's ``per_1m`` beside the measured window ``w``, over the
same metrics: what a config's second window costs."""
SESSION_ON_S, SESSION_CYCLE_S = 5, 10
"""With ``--kind session`` a series sends in 5 seconds of every 10 (staggered by series), so
its sessions close (gap 3 s) and new ones open all the time."""
HERE = Path(__file__).resolve().parent


def type_batch(names: pa.Array, metric_type: str, rng: np.random.Generator,
               kll_k: int | None = None) -> pa.RecordBatch:  # fmt: skip
    """One pane partial per name, at pane 0 (``moved_to_pane`` places it); ``kll_k``: timers
    carry a KLL sketch of that k too."""
    n = len(names)
    times = np.zeros(n, np.int64)
    count = np.ones(n, np.int64)
    values = rng.integers(1, 100, n).astype(np.float64)
    sketch_columns = [pa.nulls(n, SEGMENT_SCHEMA.field(name).type)
                      for name in SEGMENT_SCHEMA.names[-4:]]  # fmt: skip
    if metric_type in ("ms", "s"):
        sketches = PaneSketches(compile_accuracy(), kll_k)
        keys = [((name, metric_type, "{}"), 0) for name in names.to_pylist()]
        if metric_type == "ms":
            samples = rng.lognormal(3.0, 0.8, (n, 10)).round(3)
            for key, row in zip(keys, samples, strict=True):
                sketches.add_values(key, row, np.ones(len(row), np.int64))
            count[:] = 10
            values = samples.sum(axis=1)
        else:
            for key, row in zip(keys, rng.integers(0, 10_000, (n, 20)).tolist(), strict=True):
                for member in row:
                    sketches.add_member(key, f"u{member}")
            count[:] = 20
        sketch_columns = list(sketches.columns(keys))
    columns = [
        names, pa.repeat(pa.scalar(metric_type), n), pa.repeat(pa.scalar("{}"), n),
        pa.array(times), pa.array(count), pa.array(values), pa.array(values),
        pa.array(values), pa.array(values), pa.array(times + 500), pa.array(times + 500),
        pa.array(times + 500),
    ]  # fmt: skip
    return pa.RecordBatch.from_arrays([*columns, *sketch_columns], schema=SEGMENT_SCHEMA)


def moved_to_pane(batch: pa.RecordBatch, pane_ms: int) -> pa.RecordBatch:
    columns = list(batch.columns)
    for name in ("pane_start_ms", "last_event_ms", "first_recv_ms", "last_recv_ms"):
        index = batch.schema.get_field_index(name)
        columns[index] = pc.add(columns[index], pane_ms)
    return pa.RecordBatch.from_arrays(columns, schema=batch.schema)


def parse_types(text: str, series: int) -> dict[str, int]:
    """``ms`` or ``c:40,ms:40,g:10,s:10`` → series per type."""
    parts = [part.partition(":") for part in text.split(",")]
    shares = {name: float(share or 100) for name, _, share in parts}
    total = sum(shares.values())
    return {name: int(series * share / total) for name, share in shares.items()}


def _write_segments(spool: Path, types: dict[str, int], seconds: int, sessions: bool,
                    kll_k: int | None, records: Any) -> None:  # fmt: skip
    """The writer's process: one segment a second; after each, (heartbeat ms, wall ms when
    written, rows) on ``records``, then None."""
    rng = np.random.default_rng(7)
    batches = [
        type_batch(pa.array([f"bench.{t}{i}" for i in range(n)], pa.string()), t, rng, kll_k)
        for t, n in types.items() if n
    ]  # fmt: skip
    panes_all = pa.Table.from_batches(batches).combine_chunks().to_batches()[0]
    writer = SegmentWriter(spool, "r0", fsync=False)
    records.put("ready")
    for _ in range(seconds):
        now = time.time_ns() // 1_000_000
        panes = panes_all
        if sessions:
            phase = (np.arange(panes.num_rows) + now // 1000) % SESSION_CYCLE_S
            panes = panes.filter(pa.array(phase < SESSION_ON_S))
        writer.append(moved_to_pane(panes, now - now % 1000), Heartbeat(now, False))
        records.put((now, time.time_ns() // 1_000_000, panes.num_rows))
        time.sleep(max(0.0, 1 - (time.time_ns() // 1_000_000 - now) / 1000))
    records.put(None)


class Writer:
    """One segment per second, written by a process of its own (as the receivers write the
    log): the job's driver shares no interpreter with it, so the offered rate does not bend
    to the job's load. Records when each heartbeat was written (wall ms) and how many rows.
    Its CPU is left out of the job's cores (``pid``)."""

    def __init__(
        self, spool: Path, types: dict[str, int], seconds: int, sessions: bool = False,
        kll_k: int | None = None,
    ) -> None:  # fmt: skip
        context = multiprocessing.get_context("spawn")
        self._records: Any = context.Queue()
        self._process = context.Process(
            target=_write_segments,
            args=(spool, types, seconds, sessions, kll_k, self._records),
            daemon=True,
        )  # fmt: skip
        self._collector = threading.Thread(target=self._collect, daemon=True)
        self.heartbeats: list[tuple[int, int]] = []  # (heartbeat ms, wall ms when written)
        self.written: list[tuple[int, int]] = []  # (wall ms when written, rows)

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def start(self) -> None:
        """Start writing, once the writer's payload is built (its first segment is now)."""
        self._process.start()
        if self._records.get(timeout=300) != "ready":
            raise RuntimeError("the bench's segment writer did not start")
        self._collector.start()

    def is_alive(self) -> bool:
        return self._collector.is_alive()

    def _collect(self) -> None:
        """Until the writer says it is done, or its process ended without saying so (an
        error: the bench's poll then stops instead of waiting for ever)."""
        while True:
            try:
                record = self._records.get(timeout=1)
            except queue.Empty:
                if self._process.is_alive():
                    continue
                return
            if record is None:
                return
            beat, wall, rows = record
            self.heartbeats.append((beat, wall))
            self.written.append((wall, rows))


class _Counts(threading.local):
    """Per thread (a query's batches run on a thread of their own): rows read and published."""

    value = 0
    published = 0


class Batches:
    """The window writer's batches: (wall ms at the start, seconds, rows read, windows
    published)."""

    done: list[tuple[int, float, int, int]] = []
    _rows = _Counts()

    @classmethod
    def install(cls) -> None:
        # The names the writer's code calls are its module's own (imported there from other
        # modules, whichever a version has them in): read and replaced in its namespace.
        names = vars(pane_writer)
        read = names["read_partials"]
        rows_of = names["to_result_rows"]
        call = pane_writer.PaneWindowsWriter.__call__

        def counted(*args: Any) -> pa.Table:
            table = read(*args)
            cls._rows.value = table.num_rows
            return table

        def published(changed: pa.Table, *args: Any, **kwargs: Any) -> pa.Table:
            cls._rows.published += changed.num_rows
            return rows_of(changed, *args, **kwargs)

        def timed(self: Any, _batch: Any, batch_id: int) -> None:
            if getattr(self, "name", "bench.w") != "bench.w":
                call(self, _batch, batch_id)  # the minute window's query
                return
            wall, started = time.time_ns() // 1_000_000, time.perf_counter()
            cls._rows.value = cls._rows.published = 0
            call(self, _batch, batch_id)
            cls.done.append(
                (wall, time.perf_counter() - started, cls._rows.value, cls._rows.published)
            )

        names["read_partials"] = counted
        names["to_result_rows"] = published
        pane_writer.PaneWindowsWriter.__call__ = timed  # type: ignore[method-assign]

    @classmethod
    def taken_and_offered(cls, measured_from_ms: int, written: list[tuple[int, int]]
                          ) -> tuple[float, float]:  # fmt: skip
        """Rows per second the job took and the writer wrote, between the ends of the first
        and the last measured batch that published windows: whole window periods, so a close
        that takes seconds counts the same at both ends (a span ending inside one would
        undercount), and what was offered in the same span (the writer may write late on a
        busy machine)."""
        batches = [b for b in cls.done if b[0] >= measured_from_ms]
        ends = [i for i, b in enumerate(batches) if b[3]]
        first, last = (ends[0], ends[-1]) if len(ends) > 1 else (0, len(batches) - 1)
        if last <= first:
            return 0.0, 0.0
        start_ms = batches[first][0] + batches[first][1] * 1000
        end_ms = batches[last][0] + batches[last][1] * 1000
        span_s = (end_ms - start_ms) / 1000
        if span_s <= 0:
            return 0.0, 0.0
        taken = sum(b[2] for b in batches[first + 1 : last + 1])
        offered = sum(rows for wall, rows in written if start_ms < wall <= end_ms)
        return taken / span_s, offered / span_s


def freshness(
    url: str, writer: Writer, delays_ms: dict[str, int], measured_from_ms: int,
    probes: dict[str, list[str]],
) -> dict[str, dict[str, list[float]]]:
    """Per window (``delays_ms``: name → its ``watermark_delay``), seconds from the watermark
    passing each window's end to the commit of its row (``rows``), and to the commit of its
    sketches (``sketches``; the same where the row holds them: before schema version 15, or a
    counter's window). Read from the commit timestamps of the rows of ``probes`` (per table,
    a few series spread over the load): by the key's index, so the poll costs the job next to
    nothing (a scan of every window's rows ten times a second would take a core)."""
    seen: dict[tuple[str, str], dict[int, int]] = {
        (w, what): {} for w in delays_ms for what in ("rows", "sketches")
    }
    newest = dict.fromkeys(seen, 0)
    with psycopg.connect(url, autocommit=True) as poll:
        split, numbered = poll.execute(
            "select to_regclass('window_sketches') is not null,"
            " to_regclass('window_series') is not null").fetchone() or (False, False)
        tables = {"rows": "window_rows", "sketches": "window_sketches"} if split \
            else {"rows": "window_results", "sketches": "window_results"}  # fmt: skip
        # From schema version 18 the tables name their series by number (window_series).
        names, join = ("s", " join window_series s on s.series_id = r.series_id") if numbered \
            else ("r", "")  # fmt: skip
        while writer.is_alive():
            for (window, what), ends in seen.items():
                if not probes[what]:
                    continue
                rows = poll.execute(
                    "select (extract(epoch from r.window_end) * 1000)::bigint, "
                    "(extract(epoch from min(pg_xact_commit_timestamp(r.xmin))) * 1000)::bigint "
                    f"from {tables[what]} r{join} where {names}.config_name = 'bench' "
                    f"and {names}.window_name = %s and {names}.metric = any(%s) "
                    "and r.window_end > to_timestamp(%s / 1000.0) group by 1",
                    (window, probes[what], newest[(window, what)]),
                ).fetchall()  # fmt: skip
                now = time.time_ns() // 1_000_000
                for end, committed in rows:
                    ends.setdefault(int(end), now if committed is None else int(committed))
                    newest[(window, what)] = max(newest[(window, what)], int(end))
            time.sleep(0.1)
    lags: dict[str, dict[str, list[float]]] = {w: {"rows": [], "sketches": []} for w in delays_ms}
    for (window, what), ends in seen.items():
        for end, at in sorted(ends.items()):
            passed = [wall for beat, wall in writer.heartbeats
                      if beat - delays_ms[window] >= end]  # fmt: skip
            if passed and passed[0] >= measured_from_ms:
                lags[window][what].append((at - passed[0]) / 1000)
    return lags


SKETCHED_TYPES = ("ms", "h", "d", "s")
PROBES_PER_TYPE = 16


def probe_series(types: dict[str, int]) -> dict[str, list[str]]:
    """The series whose rows ``freshness`` reads, per table: a few of every type, spread over
    its series (``Writer``'s names; sessions are staggered by series)."""
    per_type = {
        t: [f"bench.{t}{i}" for i in range(0, n, max(1, n // PROBES_PER_TYPE))][:PROBES_PER_TYPE]
        for t, n in types.items() if n
    }  # fmt: skip
    return {
        "rows": [name for names in per_type.values() for name in names],
        "sketches": [name for t, names in per_type.items() if t in SKETCHED_TYPES
                     for name in names],  # fmt: skip
    }


def cpu_seconds(leave_out: int | None = None) -> float:
    """CPU seconds of this process and its children, less the process ``leave_out``."""
    me = psutil.Process()
    total: float = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        if child.pid == leave_out:
            continue
        with contextlib.suppress(psutil.NoSuchProcess):
            total += sum(child.cpu_times()[:2])
    return total


def _plan(config: Any, spool: Path, checkpoints: Path) -> tuple[Any, ...]:
    """What ``start_window_queries`` takes before the store factory: the config's
    ``WindowPlan``, or, on the code of a checkout from before the plan (``--before``), the
    config and its paths."""
    try:
        from streamgauge.windows.plan import JobPaths, WindowPlan
    except ImportError:
        from streamgauge.windows.job import JobPaths  # type: ignore[attr-defined,no-redef]

        return config, JobPaths(spool=spool, checkpoints=checkpoints)
    return (WindowPlan.of(config, JobPaths(spool=spool, checkpoints=checkpoints)),)


def run_here(args: argparse.Namespace) -> dict[str, Any]:
    """One run of this code; its figures."""
    root = Path(tempfile.mkdtemp(prefix="streamgauge-bench-job-"))
    server = EmbeddedPostgres(root, port=None)
    url = server.start()
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute("ALTER SYSTEM SET track_commit_timestamp = on")
    server.stop()
    url = server.start()
    try:
        ResultStore(url).ensure_schema()
        shape = WINDOWS[args.kind].replace("SIZE", args.size).replace("HOP", args.hop)
        if args.quantiles == "kll":
            shape = shape.replace("}", ", quantiles: kll}")
        shapes = f"{shape}, {MINUTE_WINDOW}" if args.minute_window else shape
        config = parse_config(f"name: bench\npane: 1s\nwindows: [{shapes}]\n", "bench")
        Batches.install()
        spark = build_spark_session("local[2]", app_name="bench-window-job")
        spool = root / "spool"
        spool.mkdir()
        # What it takes depends on the checkout's version (``_plan``): not this one's signature.
        start_queries: Callable[..., list[StreamingQuery]] = start_window_queries
        queries = start_queries(
            spark, *_plan(config, spool, root / "checkpoints"), lambda: ResultStore(url),
            SystemClock(), **({} if args.trigger is None else {"trigger_interval": args.trigger}),
        )  # fmt: skip
        types = parse_types(args.types, args.series)
        writer = Writer(spool, types, args.seconds, sessions=args.kind == "session",
                        kll_k=config.kll_k)  # fmt: skip
        writer.start()
        measured_from = time.time_ns() // 1_000_000 + args.warmup * 1000
        time.sleep(args.warmup)
        cpu_from = cpu_seconds(leave_out=writer.pid)
        measured = freshness(
            url, writer, {w.name: w.watermark_delay_ms for w in config.windows}, measured_from,
            probe_series(types),
        )
        lags, sketch_lags = measured["w"]["rows"], measured["w"]["sketches"]
        cpu = cpu_seconds(leave_out=writer.pid) - cpu_from
        span_s = (time.time_ns() // 1_000_000 - measured_from) / 1000
        load = os.getloadavg()
        failed = [str(q.exception()) for q in queries if q.exception() is not None]
        for query in queries:
            query.stop()
        spark.stop()
        batches = [b for b in Batches.done if b[0] >= measured_from]
        half = len(lags) // 2
        taken, offered = Batches.taken_and_offered(measured_from, writer.written)
        result = {
            "offered": offered,
            "taken": taken,
            "batch_s": [b[1] for b in batches],
            "freshness_s": lags,
            "sketch_freshness_s": sketch_lags,
            "minute_freshness_s": measured.get("m", {}).get("rows", []),
            "cores": cpu / max(span_s, 1e-9),
            "load": load[0],
            "failed": failed,
            "growing": bool(lags) and statistics.median(lags[half:])
            > statistics.median(lags[: max(half, 1)]) + 1.0,
        }
        result["sustained"] = (not failed and bool(lags) and not result["growing"]
                               and result["taken"] >= 0.97 * result["offered"])  # fmt: skip
        return result
    finally:
        try:
            server.stop()
        finally:  # a run can leave gigabytes of log and store behind
            shutil.rmtree(root, ignore_errors=True)


def run_previous(revision: str, args: argparse.Namespace) -> dict[str, Any]:
    """One run of ``revision``'s own bench (``bench/windows.py``) on the same load."""
    tree = Path(tempfile.gettempdir()) / f"streamgauge-bench-{revision}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(HERE.parent), "worktree", "add", "--detach", str(tree),
                        revision], check=True, capture_output=True)  # fmt: skip
    [metric_type] = parse_types(args.types, args.series)
    command = [
        sys.executable, "windows.py", "--series", str(args.series), "--type", metric_type,
        "--seconds", str(args.seconds), "--warmup", str(args.warmup), "--kind", args.kind,
        "--size", args.size, "--hop", args.hop, "--trigger", args.trigger or "0.5 seconds",
    ]  # fmt: skip
    if metric_type == "c" and args.kind == "tumbling":
        command += ["--sets", "separate"]
    if args.kind == "session":
        command += ["--duty", f"{SESSION_ON_S}/{SESSION_CYCLE_S}"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(command, cwd=tree / "bench", env=env, capture_output=True, text=True,
                         timeout=args.seconds + 900).stdout  # fmt: skip

    def figure(label: str) -> list[float]:
        match = re.search(rf"{re.escape(label)}\s+([\d.]+)\s+([\d.]+)", out)
        return [float(match.group(1)), float(match.group(2))] if match else []

    sustained = re.search(r"sustained: (\w+)(?: \(took ([\d,]+) partial rows/s)?", out)
    fresh = re.search(r"freshness of each window, in order \(s\): ([\d. ]*);", out)
    return {
        "offered": args.series,
        "taken": float(sustained.group(2).replace(",", "")) if sustained and sustained.group(2)
        else 0.0,
        "batch_median_p99": figure("micro-batch duration (s)"),
        "freshness_s": [float(v) for v in fresh.group(1).split()] if fresh else [],
        "sustained": sustained is not None and sustained.group(1) == "True",
        "load": os.getloadavg()[0],
    }  # fmt: skip


def run_this_bench(
    args: argparse.Namespace, options: tuple[str, ...], tree: Path | None = None
) -> dict[str, Any]:
    """One run of this bench in a child process, on the same arguments less ``options`` (the
    alternation's own), on ``tree``'s code (``PYTHONPATH``; None: this checkout's)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--json",
               *[a for a in sys.argv[1:] if a not in options]]  # fmt: skip
    # Always a PYTHONPATH: the installed package may be another checkout's (editable).
    env = {**os.environ, "PYTHONPATH": str(tree or HERE.parent)}
    out = subprocess.run(command, capture_output=True, text=True, env=env).stdout
    line = next((x for x in out.splitlines() if x.startswith("RESULT ")), None)
    return json.loads(line[7:]) if line else {
        "offered": args.series, "taken": 0.0, "freshness_s": [], "sustained": False,
        "load": os.getloadavg()[0]}  # fmt: skip


def print_alternated(args: argparse.Namespace, other: str,
                     rows: list[tuple[str, dict[str, Any]]]) -> None:  # fmt: skip
    print(f"window job: {args.kind} {args.size}{' + 1 m' if args.minute_window else ''}, "
          f"{args.series} series of {args.types} at 1 s "
          f"panes, {args.seconds} s ({args.warmup} s warm-up left out), local[2], alternated "
          f"{other} / this code, {args.pairs} pair(s)")  # fmt: skip
    for label, result in rows:
        print_result(label, result)


def run_beside(args: argparse.Namespace) -> None:
    """This bench on ``--before``'s code and on this code, alternately, ``--pairs`` times."""
    options = ("--before", str(args.before), "--pairs", str(args.pairs))
    trees = {"before": args.before.resolve(), "this code": HERE.parent.resolve()}
    rows = [(label, run_this_bench(args, options, tree))
            for _ in range(args.pairs) for label, tree in trees.items()]  # fmt: skip
    print_alternated(args, str(args.before), rows)


def _p(values: list[float], q: float) -> str:
    return f"{float(np.percentile(values, q)):.2f}" if values else "n/a"


def print_result(label: str, r: dict[str, Any]) -> None:
    batch = r.get("batch_s") or []
    previous = " / ".join(f"{v:.2f}" for v in r.get("batch_median_p99", []))
    batch_fig = f"{_p(batch, 50)} / {_p(batch, 99)}" if batch else previous or "n/a"
    cores = f"{r['cores']:.2f}" if "cores" in r else "n/a"
    print(f"{label:<10} sustained {str(r['sustained']):<5} taken {r['taken']:>9,.0f}/s of "
          f"{r['offered']:,.0f}  batch p50/p99 {batch_fig:<12} freshness p50/p99 "
          f"{_p(r['freshness_s'], 50)} / {_p(r['freshness_s'], 99)} s  ({len(r['freshness_s'])} "
          f"windows)  cores {cores}  load {r['load']:.1f}")  # fmt: skip
    sketches = r.get("sketch_freshness_s")
    if sketches:
        print(f"{'':<10} sketches visible p50/p99 {_p(sketches, 50)} / {_p(sketches, 99)} s")
    minute = r.get("minute_freshness_s")
    if minute:
        print(f"{'':<10} 1 m window: rows visible {', '.join(f'{v:.2f}' for v in minute)} s")
    if r.get("failed"):
        print(f"{'':<10} failed: {r['failed'][0][:200]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--types", default="c", help="ms, or a mix: c:40,ms:40,g:10,s:10")
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--warmup", type=int, default=45,
                        help="seconds left out at the start (JVM and numba warm-up)")
    parser.add_argument("--kind", choices=sorted(WINDOWS), default="tumbling")
    parser.add_argument("--size", default="10s")
    parser.add_argument("--hop", default="5s")
    parser.add_argument("--minute-window", action="store_true",
                        help="a second window beside the measured one: tumbling 1 m, delay 2 s, "
                        "lateness 30 s (the quickstart's per_1m)")  # fmt: skip
    parser.add_argument("--quantiles", choices=("tdigest", "kll"), default="tdigest",
                        help="the measured window's quantiles: (tumbling, hopping)")
    parser.add_argument("--trigger", help="the job's trigger interval (default: each version's "
                        "own)")  # fmt: skip
    parser.add_argument("--compare", metavar="REV", help="alternate with REV's bench/windows.py")
    parser.add_argument("--before", type=Path, metavar="CHECKOUT",
                        help="alternate with this bench run on CHECKOUT's code (PYTHONPATH)")
    parser.add_argument("--pairs", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON line (for --compare)")
    args = parser.parse_args()
    if args.before is not None:
        run_beside(args)
        return
    if args.compare is None:
        result = run_here(args)
        if args.json:
            print("RESULT " + json.dumps(result))
        else:
            print(f"window job: {args.kind} {args.size}{' + 1 m' if args.minute_window else ''}, "
                  f"{args.series} series of {args.types} "
                  f"at 1 s panes, {args.seconds} s ({args.warmup} s warm-up left out), "
                  f"local[2], trigger {args.trigger or 'as each version sets it'}")  # fmt: skip
            print_result("this code", result)
        return
    if len(parse_types(args.types, args.series)) != 1:
        parser.error("--compare needs --types of one type (the previous bench has no mix)")
    rows: list[tuple[str, dict[str, Any]]] = []
    options = ("--compare", args.compare, "--pairs", str(args.pairs))
    for _ in range(args.pairs):
        rows.append((args.compare, run_previous(args.compare, args)))
        rows.append(("this code", run_this_bench(args, options)))
    print_alternated(args, args.compare, rows)


if __name__ == "__main__":
    main()
