"""Soak: `streamgauge run` under a steady load for minutes; memory, lag and exactness.

    python bench/soak.py --minutes 10 --rate 20000 --series 100000 [--receivers 1]
                         [--types c] [--per-datagram 20] [--sample-every 10]

Starts `streamgauge run` (scratch data directory, its own UDP port, embedded PostgreSQL,
Spark ``local[*]``) on a config with one tumbling window (``--window 10s``), and drives it
with the C load generator of the ingest bench (bench/ingest/sender.c, compiled here) at
``--rate`` lines/s, ``--per-datagram`` lines per datagram, over ``--series`` distinct series
``bench.m<i%100>{host:h<i/100>}`` whose types cycle through ``--types`` (default ``c``;
``c,ms,g,d`` is the ingest bench's mix), for ``--minutes``. The sender walks the series in
order, so a second of load touches min(rate, series) series: that is the number of partial
rows per second the window job must carry (one per series and 1 s pane per receiver).
The receivers run with ``--max-series`` at twice the series count, so the cardinality guard
is on but folds nothing.

Every ``--sample-every`` seconds it records, from /proc and the store:

- RSS of every process of the daemon, by role: the `run` process, each ingest child, the
  Spark JVM, Spark's Python workers (summed, with their count), PostgreSQL (the postmaster
  and its backends: PSS summed, since every backend maps the same shared buffers);
- segment lag per streaming query: the age of the oldest segment (by its heartbeat) the
  query has not committed, from its checkpoint, the maximum over the streams; and the
  receivers' own ``segment_lag_ms`` self-metric (which follows the slowest query);
- watermark lag per window (``pipeline_state``), micro-batches committed and rows written
  per query since the last sample (``sink_batches``).

At the end it stops the sender, lets the job drain (until every window's watermark passes
the last sample's window end plus its lateness and every query has committed every segment),
stops the daemon and checks, all against measured counts:

- ingest lost nothing it did not count: lines received = lines sent - kernel drops x lines per
  datagram, and samples in the log = metric lines received - rejects;
- the store holds the log exactly once: per metric type, sum of ``count`` (and of ``sum`` for
  counters) over ``window_results`` = the same totals over the segment log; nothing left
  pending (``window_latest``); counters' stored sum = what the sender sent (computed from its
  cycle) when there were no kernel drops;
- a sample of ``--check-series`` series: the stored windows equal the reference windower
  (streamgauge.windows.reference) over those series' partials in the log.

Printed: the RSS table over time and per process first/last/max, the least-squares slope
(MB/min) over the second half of the run, and the slope of its floor there (the least RSS of
each minute); the lag table; one verdict line per check: RSS flat (second-half floor slope
below ``--rss-slope-mb-min``), lag not growing (second-half slope of the slowest query's lag
below ``--lag-slope-s-min`` seconds per minute), exact.

The floor, not every sample: the driver's RSS rises by a few hundred MB while it encodes a
close's sketches and falls after, so a sample's value depends on where in the window it
falls, and a few samples at a peak tilt a line through all of them either way (the same code
measured +17 and -15 MB/min). A leak raises the floor. Samples are 7 s apart by default, not
a divisor of a window's length, so each minute's samples fall across a close's phases.
A script, not a test. Run it on a machine whose load you know: it reports what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.configs import load_config
from streamgauge.ingest.log import list_receivers, list_segments, read_heartbeat, read_segment
from streamgauge.ingest.spool_fs import SpoolPath
from streamgauge.retention import committed_sequences
from streamgauge.sinks.store import run_sql
from streamgauge.windows.reference import PanePartial, ReferenceWindower, Segment

HERE = Path(__file__).resolve().parent
CONFIG = """name: soak
pane: 1s
windows:
  - name: w
    kind: tumbling
    size: {window}
    watermark_delay: 1s
    allowed_lateness: 2s
    group_by: [host]
"""
PARTIAL_FIELDS = [
    "metric", "metric_type", "tags", "pane_start_ms", "count", "sum", "min", "max", "last",
    "last_event_ms", "first_recv_ms", "last_recv_ms",
]  # fmt: skip
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- processes -----------------------------------------------------------------------------------


def _proc_table() -> dict[int, tuple[int, str, str]]:
    """pid -> (ppid, comm, cmdline) of every process."""
    table = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            cmdline = Path(f"/proc/{entry.name}/cmdline").read_bytes().replace(b"\0", b" ")
        except OSError:
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        table[int(entry.name)] = (ppid, comm, cmdline.decode(errors="replace"))
    return table


def _descendants(root: int, table: dict[int, tuple[int, str, str]]) -> list[int]:
    children = defaultdict(list)
    for pid, (ppid, _, _) in table.items():
        children[ppid].append(pid)
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        if pid in table:
            found.append(pid)
        todo.extend(children.get(pid, ()))
    return found


def _memory_kb(pid: int, key: str) -> int:
    """VmRSS from status, or Pss from smaps_rollup (0 if the process is gone)."""
    path = f"/proc/{pid}/status" if key == "VmRSS" else f"/proc/{pid}/smaps_rollup"
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def classify(daemon_pid: int, postmaster_pid: int | None) -> dict[str, list[int]]:
    """The daemon's processes by role (see the module docstring)."""
    table = _proc_table()
    roles: dict[str, list[int]] = defaultdict(list)
    for pid in _descendants(daemon_pid, table):
        _, comm, cmdline = table[pid]
        if pid == daemon_pid:
            roles["run"].append(pid)
        elif " ingest " in cmdline and "--receiver" in cmdline:
            name = cmdline.split("--receiver", 1)[1].split()[0]
            roles[f"ingest {name}"].append(pid)
        elif comm == "java":
            roles["spark jvm"].append(pid)
        elif "pyspark" in cmdline or "python" in comm:
            roles["spark python"].append(pid)
        elif comm.startswith("postgres"):
            roles["postgres"].append(pid)
        else:
            roles[f"other {comm}"].append(pid)
    if postmaster_pid is not None:
        for pid in _descendants(postmaster_pid, table):
            if pid not in roles["postgres"]:
                roles["postgres"].append(pid)
    return roles


def role_memory_mb(roles: dict[str, list[int]]) -> dict[str, float]:
    memory = {}
    for role, pids in roles.items():
        key = "Pss" if role == "postgres" else "VmRSS"  # backends share shared_buffers
        memory[role] = sum(_memory_kb(pid, key) for pid in pids) / 1024
    return memory


# -- the daemon and the sender -------------------------------------------------------------------


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Run:
    root: Path
    port: int
    receivers: int
    series: int
    process: subprocess.Popen[bytes] | None = None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def data(self) -> Path:
        return self.root / "data"

    def start(self, window: str, extra: list[str]) -> None:
        config = self.root / "soak.yaml"
        config.write_text(CONFIG.format(window=window))
        self.config = load_config(config)
        log = open(self.root / "daemon.log", "ab")  # noqa: SIM115 (kept open for the child)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "streamgauge", "run", "--config", str(config),
             "--data-dir", str(self.data), "--listen", f"127.0.0.1:{self.port}",
             "--receivers", str(self.receivers), "--max-series", str(2 * self.series + 1000),
             "--max-series-per-metric", str(2 * self.series + 1000), *extra],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        run_file = self.data / "run.json"
        deadline = time.monotonic() + 300
        while not run_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the daemon did not start:\n{self.log_tail()}")
            time.sleep(0.5)
        self.info = json.loads(run_file.read_text())

    def log_tail(self, chars: int = 4000) -> str:
        return (self.root / "daemon.log").read_text(errors="replace")[-chars:]

    def postmaster(self) -> int | None:
        path = self.data / "postgres" / "postmaster.pid"
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int(path.read_text().split()[0])
        return None

    def sql(self, text: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return run_sql(self.info["postgres_url"], text, params)[1]

    def ingest_stats(self) -> dict[str, dict[str, Any]]:
        stats = {}
        for path in sorted((self.data / "ingest").glob("*.json")):
            with contextlib.suppress(OSError, ValueError):
                stats[path.stem] = json.loads(path.read_text())
        return stats

    def stop(self) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=300)

    def cleanup(self, keep: bool) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        postmaster = self.postmaster()
        if postmaster is not None:  # the server outlives a killed daemon
            with contextlib.suppress(ProcessLookupError):
                os.kill(postmaster, signal.SIGTERM)
        if not keep:
            shutil.rmtree(self.root, ignore_errors=True)


def build_sender(workdir: Path) -> Path:
    binary = workdir / "sender"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(HERE / "ingest" / "sender.c")],
                   check=True)  # fmt: skip
    return binary


def expected_sent(
    series: int, per: int, types: list[str], datagrams: int
) -> dict[str, tuple[int, float]]:
    """Per type, (lines, sum of values) of the first ``datagrams`` datagrams the sender sends
    (it cycles through ceil(series / per) datagrams; line j of datagram d is series
    (d * per + j) % series, value series % 97, type types[series % len(types)])."""
    ndgrams = -(-series // per)

    def tally(upto: int) -> dict[str, list[float]]:
        totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
        for d in range(upto):
            for j in range(per):
                i = (d * per + j) % series
                entry = totals[types[i % len(types)]]
                entry[0] += 1
                entry[1] += i % 97
        return totals

    cycles, rest = divmod(datagrams, ndgrams)
    whole, part = tally(ndgrams), tally(rest)
    return {
        t: (int(cycles * whole[t][0] + part[t][0]), cycles * whole[t][1] + part[t][1])
        for t in set(whole) | set(part)
    }


# -- lag -----------------------------------------------------------------------------------------


def _local(path: SpoolPath) -> Path:
    """A segment's path in the run's spool, a local directory (``LocalSpool.path``: a Path)."""
    return cast(Path, path)


def query_lags_ms(run: Run, now_ms: int) -> dict[str, int]:
    """Per streaming query (checkpoint directory): the age of the oldest segment it has not
    committed, by that segment's heartbeat, the maximum over the streams (0: all read)."""
    spool = run.data / "spool"
    lags = {}
    checkpoints = run.data / "checkpoints" / run.config.name
    for checkpoint in sorted(p for p in checkpoints.glob("*") if p.is_dir()):
        try:
            committed = committed_sequences(checkpoint) or {}
        except (OSError, ValueError, KeyError):
            continue  # a commit being written right now
        worst = 0
        for receiver in list_receivers(spool):
            after = committed.get(receiver, -1)
            pending = list_segments(spool, receiver, after=after, upto=after + 1)
            if not pending:
                continue
            with contextlib.suppress(OSError, pa.ArrowException):
                worst = max(worst, now_ms - read_heartbeat(_local(pending[0].path)).heartbeat_ms)
        lags[_short(checkpoint.name)] = worst
    return lags


def _short(checkpoint_name: str) -> str:
    """``w-<digest>`` -> ``w``: the query, not its digest."""
    parts = checkpoint_name.split(".")
    parts[0] = parts[0].rsplit("-", 1)[0]
    return ".".join(part.split("-", 1)[0] for part in parts)


# -- sampling ------------------------------------------------------------------------------------


@dataclass
class Sample:
    t_s: float
    memory_mb: dict[str, float]
    counts: dict[str, int]
    cpu_s: dict[str, float]
    query_lag_ms: dict[str, int]
    receiver_lag_ms: dict[str, int]
    watermark_lag_ms: dict[str, int]
    batches: dict[str, tuple[int, int]]  # query -> (batches, rows written) since the start
    lines: int
    kernel_drops: int


def take_sample(run: Run, started: float) -> Sample:
    now_ms = time.time_ns() // 1_000_000
    roles = classify(run.info["pid"], run.postmaster())
    stats = run.ingest_stats()
    watermarks = {
        str(key).split(":", 1)[1]: now_ms - int(value)
        for key, value in run.sql(
            "select key, value_ms from pipeline_state where key like 'watermark_ms:%'")
    }  # fmt: skip
    batches = {
        str(name): (int(n), int(rows))
        for name, n, rows in run.sql(
            "select query_name, count(*), coalesce(sum(rows_written), 0) from sink_batches "
            "group by 1")
    }  # fmt: skip
    return Sample(
        t_s=time.monotonic() - started,
        memory_mb=role_memory_mb(roles),
        counts={role: len(pids) for role, pids in roles.items()},
        cpu_s={role: sum(_cpu_s(pid) for pid in pids) for role, pids in roles.items()},
        query_lag_ms=query_lags_ms(run, now_ms),
        receiver_lag_ms={name: int(s.get("segment_lag_ms", 0)) for name, s in stats.items()},
        watermark_lag_ms=watermarks,
        batches=batches,
        lines=sum(int(s["lines"]) for s in stats.values()),
        kernel_drops=sum(sum(s.get("kernel_drops", {}).values()) for s in stats.values()),
    )


def floor_per_min(points: list[tuple[float, float]], block_s: float = 60.0
                  ) -> list[tuple[float, float]]:  # fmt: skip
    """The least value of each ``block_s`` of (seconds, value) points, at the block's middle."""
    if not points:
        return []
    start = points[0][0]
    blocks: dict[int, list[float]] = {}
    for t, v in points:
        blocks.setdefault(int((t - start) // block_s), []).append(v)
    return [(start + (b + 0.5) * block_s, min(vs)) for b, vs in sorted(blocks.items())]


def slope_per_min(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute."""
    if len(points) < 3:
        return float("nan")
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 60 * sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else 0.0


# -- exactness -----------------------------------------------------------------------------------


def log_totals(spool: Path) -> tuple[dict[str, tuple[int, float]], int, float]:
    """Per type, (samples, sum) of the bench series in the whole log; partial rows; seconds
    of event time the bench partials span."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    rows, first, last = 0, None, None
    for receiver in list_receivers(spool):
        for info in list_segments(spool, receiver):
            for batch in read_segment(_local(info.path)):
                table = pa.Table.from_batches([batch]).select(
                    ["metric", "metric_type", "pane_start_ms", "count", "sum"])
                table = table.filter(pc.starts_with(table["metric"], "bench."))
                if table.num_rows == 0:
                    continue
                rows += table.num_rows
                panes = table["pane_start_ms"]
                lo, hi = pc.min(panes).as_py(), pc.max(panes).as_py()
                first = lo if first is None else min(first, lo)
                last = hi if last is None else max(last, hi)
                grouped = table.group_by("metric_type").aggregate(
                    [("count", "sum"), ("sum", "sum")])
                for t, n, s in zip(*(grouped[c].to_pylist() for c in
                                     ("metric_type", "count_sum", "sum_sum")), strict=True):
                    totals[t][0] += n
                    totals[t][1] += s
    span = ((last - first) / 1000 + 1) if first is not None and last is not None else 0.0
    return {t: (int(v[0]), v[1]) for t, v in totals.items()}, rows, span


def reference_for(run: Run, wanted: set[tuple[str, str]]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """The reference windower over the log, restricted to the ``wanted`` (metric, tags)."""
    spool = run.data / "spool"
    windower = ReferenceWindower(run.config)
    metrics = pa.array(sorted({m for m, _ in wanted}))
    for receiver in list_receivers(spool):
        for info in list_segments(spool, receiver):
            heartbeat = read_heartbeat(_local(info.path))
            partials = []
            for batch in read_segment(_local(info.path)):
                table = pa.Table.from_batches([batch]).select(PARTIAL_FIELDS)
                table = table.filter(pc.is_in(table["metric"], value_set=metrics))
                for row in table.to_pylist():
                    if (row["metric"], row["tags"]) in wanted:
                        partials.append(PanePartial(**row))
            windower.feed(Segment(receiver, heartbeat.heartbeat_ms, heartbeat.closed,
                                  tuple(partials)))  # fmt: skip
    return {
        (metric, _canonical(tags), start): (w.count, w.sum, w.min, w.max, w.last, w.is_final,
                                            w.late_events)
        for (_, metric, tags, start, _end), w in windower.stored().items()
    }  # fmt: skip


def _canonical(tags: Any) -> str:
    if isinstance(tags, str):
        tags = json.loads(tags)
    return json.dumps(tags, sort_keys=True, separators=(",", ":"))


def stored_for(run: Run, wanted: set[tuple[str, str]]) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    metrics = sorted({m for m, _ in wanted})
    _, rows = run_sql(
        run.info["postgres_url"],
        "select metric, tags::text, (extract(epoch from window_start) * 1000)::bigint, count, "
        "sum, min, max, last, is_final, late_events from window_results "
        "where config_name = 'soak' and metric = any(%s)", (metrics,))
    stored = {}
    for metric, tags, start, *values in rows:
        if (metric, _canonical(tags)) in wanted:
            stored[(metric, _canonical(tags), int(str(start)))] = tuple(values)
    return stored


# -- report --------------------------------------------------------------------------------------


def _rows(samples: list[Sample], every_s: float) -> list[Sample]:
    """The samples printed: the first at or after each multiple of ``every_s``, and the last."""
    if every_s <= 0:
        return samples
    rows, due = [], 0.0
    for s in samples:
        if s.t_s >= due:
            rows.append(s)
            due = (s.t_s // every_s + 1) * every_s
    return rows if rows[-1] is samples[-1] else [*rows, samples[-1]]


def print_tables(samples: list[Sample], args: argparse.Namespace) -> dict[str, bool]:
    verdicts = {}
    printed = _rows(samples, args.table_every)
    # short-lived helpers (a `readlink` of Spark's launcher) are left out
    roles = sorted({r for s in samples for r, mb in s.memory_mb.items()
                    if not r.startswith("other") or mb >= 1}, key=_role_order)
    print("\nRSS by process, MB (postgres: PSS summed over the postmaster and its backends; "
          "spark python: summed over the workers alive, count in brackets)")
    header = "   t(s)  " + "".join(f"{r[:14]:>15}" for r in roles)
    print(header)
    for s in printed:
        cells = []
        for r in roles:
            value = s.memory_mb.get(r)
            text = "-" if value is None else f"{value:.0f}"
            if r in ("spark python", "postgres") and r in s.counts:
                text += f" ({s.counts[r]})"
            cells.append(f"{text:>15}")
        print(f"{s.t_s:7.0f}  " + "".join(cells))
    half = samples[-1].t_s / 2
    print(f"\n{'process':<16}{'first':>8}{'last':>8}{'max':>8}{'slope all':>11}"
          f"{'slope 2nd half':>16}{'floor 2nd half':>16}  (MB, MB/min)   CPU s (share of a core)")
    flat = True
    duration = samples[-1].t_s - samples[0].t_s
    for r in roles:
        points = [(s.t_s, s.memory_mb[r]) for s in samples if r in s.memory_mb]
        second = [p for p in points if p[0] >= half]
        slope2 = slope_per_min(second)
        floor2 = slope_per_min(floor_per_min(second))
        cpu = samples[-1].cpu_s.get(r, 0) - samples[0].cpu_s.get(r, 0)
        print(f"{r:<16}{points[0][1]:>8.0f}{points[-1][1]:>8.0f}{max(p[1] for p in points):>8.0f}"
              f"{slope_per_min(points):>11.2f}{slope2:>16.2f}{floor2:>16.2f}"
              f"                 {cpu:7.0f} ({cpu / max(duration, 1):.0%})")
        if floor2 == floor2 and floor2 >= args.rss_slope_mb_min:
            flat = False
    verdicts["rss flat"] = flat

    queries = sorted({q for s in samples for q in s.query_lag_ms})
    receivers = sorted({q for s in samples for q in s.receiver_lag_ms})
    windows = sorted({q for s in samples for q in s.watermark_lag_ms})
    names = sorted({q for s in samples for q in s.batches})
    print("\nlag over time, seconds: per query, the oldest segment it has not committed; "
          "receivers' segment_lag_ms; watermark lag per window; batches/rows written per "
          "query in the interval")
    print("   t(s)  " + "".join(f"{'lag ' + q:>16}" for q in queries)
          + "".join(f"{'rcv ' + r:>12}" for r in receivers)
          + "".join(f"{'wm ' + w:>9}" for w in windows)
          + "".join(f"  {n.split('.', 1)[1] if '.' in n else n:>18}" for n in names))
    previous = samples[0]
    for s in printed:
        batch_cells = []
        for n in names:
            b, rows = s.batches.get(n, (0, 0))
            b0, rows0 = previous.batches.get(n, (0, 0))
            batch_cells.append(f"  {f'{b - b0} / {rows - rows0}':>18}")
        print(f"{s.t_s:7.0f}  "
              + "".join(f"{s.query_lag_ms.get(q, 0) / 1000:>16.1f}" for q in queries)
              + "".join(f"{s.receiver_lag_ms.get(r, 0) / 1000:>12.1f}" for r in receivers)
              + "".join(f"{s.watermark_lag_ms.get(w, 0) / 1000:>9.1f}" for w in windows)
              + "".join(batch_cells))
        previous = s
    growing = False
    for q in queries:
        second = [(s.t_s, s.query_lag_ms.get(q, 0) / 1000) for s in samples if s.t_s >= half]
        slope = slope_per_min(second)
        lags = [v for _, v in second]
        print(f"query {q}: lag 2nd half median {statistics.median(lags):.1f} s, max "
              f"{max(lags):.1f} s, slope {slope:+.2f} s/min")
        if slope == slope and slope >= args.lag_slope_s_min:
            growing = True
    verdicts["lag not growing"] = not growing
    return verdicts


def _role_order(role: str) -> tuple[int, str]:
    order = ("run", "ingest", "spark jvm", "spark python", "postgres")
    for index, prefix in enumerate(order):
        if role.startswith(prefix):
            return index, role
    return len(order), role


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--rate", type=int, default=20_000, help="lines/s")
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--per-datagram", type=int, default=20)
    parser.add_argument("--types", default="c", help="type cycle, e.g. c or c,ms,g,d")
    parser.add_argument("--receivers", type=int, default=1)
    parser.add_argument("--window", default="10s", help="tumbling window size")
    parser.add_argument("--sample-every", type=float, default=7,
                        help="seconds between samples (module docstring: not a divisor of "
                        "the window)")
    parser.add_argument("--table-every", type=float, default=0,
                        help="print one table row per this many seconds (default: every "
                        "sample); slopes and verdicts always use every sample")
    parser.add_argument("--check-series", type=int, default=40,
                        help="series compared against the reference windower")
    parser.add_argument("--rss-slope-mb-min", type=float, default=2.0)
    parser.add_argument("--lag-slope-s-min", type=float, default=1.0)
    parser.add_argument("--drain-timeout", type=float, default=600)
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--master", help="Spark master (default: the daemon's local[*])")
    args = parser.parse_args()
    types = args.types.split(",")
    if args.series % args.per_datagram:
        parser.error("--series must be a multiple of --per-datagram (each cycle sends every "
                     "series once)")

    root = Path(tempfile.mkdtemp(prefix="sg-soak-"))
    run = Run(root, free_udp_port(), args.receivers, args.series)
    sender_bin = build_sender(root)
    sockets = 1 if args.receivers == 1 else 4 * args.receivers
    print(f"soak: {args.minutes:g} min at {args.rate} lines/s, {args.per_datagram} lines/"
          f"datagram, {args.series} series of types {','.join(types)}, {args.receivers} "
          f"receiver(s), tumbling {args.window}; scratch {root}; machine: {os.cpu_count()} "
          f"cores, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    samples: list[Sample] = []
    verdicts: dict[str, bool] = {}
    try:
        launched = time.monotonic()
        run.start(args.window, ["--master", args.master] if args.master else [])
        print(f"daemon up in {time.monotonic() - launched:.1f} s: {run.info['udp']}", flush=True)
        # the load starts once every query (one per window) has committed a micro-batch (Spark
        # is warm)
        queries = len(run.config.windows)
        while len(run.sql("select distinct query_name from sink_batches")) < queries:
            if time.monotonic() - launched > 300:
                raise SystemExit(f"no micro-batch committed:\n{run.log_tail()}")
            time.sleep(1)
        print(f"first micro-batches committed {time.monotonic() - launched:.1f} s after "
              "launch; load starts", flush=True)
        started = time.monotonic()
        load_started_epoch = time.time()
        seconds = args.minutes * 60
        sender = subprocess.Popen(
            [str(sender_bin), "127.0.0.1", str(run.port), str(args.rate),
             str(args.per_datagram), str(seconds), str(args.series), str(sockets),
             ",".join(types)], stdout=subprocess.PIPE, text=True)  # fmt: skip
        sender_cpu = 0.0
        while sender.poll() is None:
            samples.append(take_sample(run, started))
            sender_cpu = _cpu_s(sender.pid) or sender_cpu
            s = samples[-1]
            print(f"  t={s.t_s:5.0f}s lines={s.lines} drops={s.kernel_drops} lag(s)="
                  + ",".join(f"{q}:{v / 1000:.1f}" for q, v in s.query_lag_ms.items())
                  + f" rss(MB)={sum(s.memory_mb.values()):.0f} load="
                  f"{os.getloadavg()[0]:.1f}", flush=True)
            deadline = time.monotonic() + args.sample_every
            while sender.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        out, _ = sender.communicate()
        sent_lines, sent_dgrams, sent_s = (float(x) for x in out.split())
        samples.append(take_sample(run, started))
        load_end = os.getloadavg()
        stop_ms = time.time_ns() // 1_000_000
        print(f"sender: {sent_lines:.0f} lines in {sent_dgrams:.0f} datagrams over "
              f"{sent_s:.1f} s ({sent_lines / sent_s:.0f} lines/s)", flush=True)

        # drain: every window's watermark past the last window's end + lateness, then every
        # query has committed every segment written so far
        spec = run.config.windows[0]
        need_ms = stop_ms + (spec.size_ms or 0) + (spec.allowed_lateness_ms or 0) + (
            spec.watermark_delay_ms or 0)
        drain_started = time.monotonic()
        while time.monotonic() - drain_started < args.drain_timeout:
            now_ms = time.time_ns() // 1_000_000
            watermarks = [int(str(v)) for (v,) in run.sql(
                "select value_ms from pipeline_state where key like 'watermark_ms:%'")]
            lags = query_lags_ms(run, now_ms)
            if watermarks and min(watermarks) >= need_ms + 1000 and max(lags.values()) < 3000:
                break
            time.sleep(2)
        drain_s = time.monotonic() - drain_started
        print(f"drained in {drain_s:.0f} s", flush=True)
        pending = run.sql("select count(*) from window_latest where config_name = 'soak' "
                          "and metric like 'bench.%' and status = 'pending'")[0][0]
        stored = {
            t: (int(n), float(s or 0))
            for t, n, s in run.sql(
                "select metric_type, sum(count), sum(sum) from window_results "
                "where config_name = 'soak' and metric like 'bench.%' group by 1")
        }  # fmt: skip
        duplicates = run.sql(
            "select count(*) from (select 1 from window_results where config_name = 'soak' "
            "group by window_name, metric, tags, window_start having count(*) > 1) d")[0][0]
        store_rows = run.sql("select count(*) from window_results where config_name = 'soak' "
                             "and metric like 'bench.%'")[0][0]
        commits = run.sql(
            "select query_name, count(*), sum(rows_written), "
            "extract(epoch from max(committed_at) - min(committed_at)) from sink_batches "
            "where committed_at >= to_timestamp(%s) group by 1", (load_started_epoch,))
        rng = random.Random(7)
        picks = rng.sample(range(args.series), min(args.check_series, args.series))
        wanted = {(f"bench.m{i % 100}", _canonical({"host": f"h{i // 100}"})) for i in picks}
        stored_sample = stored_for(run, wanted)
        code = run.stop()
        print(f"daemon stopped (exit {code})", flush=True)
        stats = run.ingest_stats()

        verdicts.update(print_tables(samples, args))
        print(f"\nload average at the end of the load: "
              f"{' '.join(f'{x:.1f}' for x in load_end)}; sender CPU {sender_cpu:.0f} s")

        # exactness
        logged, log_rows, span_s = log_totals(run.data / "spool")
        received = sum(int(s["lines"]) for s in stats.values())
        metric_lines = sum(int(s["metric_lines"]) for s in stats.values())
        rejected = sum(sum(s["rejected"].values()) for s in stats.values())
        drops = sum(sum(s.get("kernel_drops", {}).values()) for s in stats.values())
        refused = sum(sum(s.get("refused_samples", {}).values()) for s in stats.values())
        adjusted = {k: v for s in stats.values() for k, v in s.get("adjusted", {}).items()}
        expected = expected_sent(args.series, args.per_datagram, types, int(sent_dgrams))
        print(f"\nsent {sent_lines:.0f} lines; receivers: {received} lines, {metric_lines} "
              f"metric lines, rejected {rejected}, kernel drops {drops} datagrams, refused "
              f"{refused}, adjusted {adjusted}")
        print(f"log: {log_rows} bench partial rows over {span_s:.0f} s of panes = "
              f"{log_rows / max(span_s, 1):.0f} partial rows/s; store: {store_rows} "
              f"window rows")
        for name, n, rows, seconds_ in commits:
            print(f"store commits, {name}: {n} batches, {rows} rows written over {seconds_:.0f}"
                  f" s = {float(rows) / max(float(seconds_), 1):.0f} rows/s, one batch per "
                  f"{float(seconds_) / max(n - 1, 1):.2f} s")
        print(f"{'type':<6}{'sent':>14}{'in log':>14}{'stored':>14}{'sent sum':>16}"
              f"{'log sum':>16}{'stored sum':>16}")
        for t in sorted(set(expected) | set(logged) | set(stored)):
            e, lg, st = expected.get(t, (0, 0.0)), logged.get(t, (0, 0.0)), stored.get(t, (0, 0))
            print(f"{t:<6}{e[0]:>14}{lg[0]:>14}{st[0]:>14}{e[1]:>16.0f}{lg[1]:>16.0f}"
                  f"{st[1]:>16.0f}")
        lost = sent_lines - drops * args.per_datagram - received
        verdicts["ingest: received = sent - kernel drops"] = lost == 0
        in_log = sum(v[0] for v in logged.values())
        samples_in = sum(int(s["samples"]) for s in stats.values())
        verdicts["log: samples in the log = samples received - refused"] = (
            in_log == samples_in - refused)
        verdicts["store = log (counts per type, counter sums), nothing pending, no duplicate"] = (
            all(stored.get(t, (0, 0))[0] == v[0] for t, v in logged.items())
            and all(stored.get(t, (0, 0.0))[1] == v[1] for t, v in logged.items() if t == "c")
            and pending == 0 and duplicates == 0)
        if drops == 0 and rejected == 0 and refused == 0:
            verdicts["counters stored = sent (count and sum)"] = (
                stored.get("c", (0, 0.0)) == (expected["c"][0], float(expected["c"][1]))
                if "c" in expected else True)
        reference = reference_for(run, wanted)
        same = reference == stored_sample
        print(f"reference windower over the log, {len(wanted)} series: {len(reference)} "
              f"windows; stored: {len(stored_sample)}; "
              f"{'identical' if same else 'DIFFERENT'}")
        if not same:
            diff = sorted(set(reference.items()) ^ set(stored_sample.items()))[:6]
            print("  first differences:", *diff, sep="\n    ")
        verdicts[f"store = reference windower ({len(wanted)} series)"] = same
    except BaseException:
        print(run.log_tail(), file=sys.stderr)
        raise
    finally:
        run.cleanup(args.keep)
    print()
    for name, ok in verdicts.items():
        print(f"{'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(verdicts.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
