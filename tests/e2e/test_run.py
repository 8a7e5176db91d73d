"""The whole pipeline as a user runs it: `streamgauge run` in a subprocess, the reference
`statsd` client sending real UDP datagrams, results read back with `streamgauge query`.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest
import statsd

from streamgauge.ingest.priority import DEFAULT_WORKER_NICE, job_nice
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hll import union_hll
from tests.e2e.harness import daemon_for

CONFIG = """
name: e2e
pane: 1s
windows:
  - name: per_2s
    kind: tumbling
    size: 2s
    watermark_delay: 1s
    allowed_lateness: 1s
    metrics: ["e2e.*"]
"""
FINAL_TIMEOUT_S = 120


@dataclass
class Daemon:
    process: subprocess.Popen[bytes]
    data_dir: Path
    info: dict[str, Any]
    log_path: Path

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "streamgauge", *args],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def query(self, sql: str) -> list[dict[str, Any]]:
        out = self.cli("query", "--data-dir", str(self.data_dir), "--json", sql)
        return [json.loads(line) for line in out.splitlines()]


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    """One daemon for the module's tests, which read it in any order (a start costs ~10 s)."""
    with started_daemon() as daemon:
        yield daemon


@contextlib.contextmanager
def started_daemon() -> Iterator[Daemon]:
    """`streamgauge run` on CONFIG, started (``harness.daemon_for``: killed and cleaned up
    after the block), seen through this module's ``Daemon``."""
    with daemon_for(CONFIG, "e2e") as running:
        running.start()
        assert running.process is not None
        yield Daemon(running.process, running.data_dir, running.info, running.log_path)


class RecordingStatsClient(statsd.StatsClient):  # type: ignore[misc]
    """The reference client, unchanged on the wire; it also notes every line it really sent
    (the client drops `@rate` lines at random, so the expectation comes from what it sent)."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.sent: list[str] = []

    def _send(self, data: str) -> None:
        self.sent.extend(data.split("\n"))
        super()._send(data)


@dataclass
class Expected:
    count: int = 0
    total: float = 0.0
    minimum: float = float("inf")
    maximum: float = float("-inf")
    last: float | None = None


def _expectations(lines: list[str]) -> dict[str, Expected]:
    expected: dict[str, Expected] = collections.defaultdict(Expected)
    for line in lines:
        name, rest = line.split(":", 1)
        fields = rest.split("|")
        value = float(fields[0])
        rate = float(fields[2][1:]) if len(fields) > 2 else 1.0
        entry = expected[name]
        entry.count += 1
        if fields[1] == "c":
            entry.total += value / rate
        entry.minimum = min(entry.minimum, value)
        entry.maximum = max(entry.maximum, value)
        entry.last = value
    return expected


def test_run_prints_where_everything_is_and_writes_run_json(daemon: Daemon) -> None:
    info = daemon.info
    assert info["udp"].startswith("127.0.0.1:")
    assert info["postgres_url"].startswith("postgresql://")
    assert info["pid"] == daemon.process.pid
    assert (daemon.data_dir / "run.json").stat().st_mode & 0o077 == 0  # holds a password
    printed = daemon.log_path.read_text()
    assert f"udp {info['udp']}" in printed
    assert "spark ui" in printed
    assert info["postgres_url"].split("@")[0].split(":")[-1] not in printed  # password hidden


def _thread_nices(pid: int) -> list[int]:
    """The nice value of each thread of process ``pid`` (field 19 of its ``stat``)."""
    nices = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError):  # a thread that just ended
            nices.append(int((task / "stat").read_text().rsplit(")", 1)[1].split()[16]))
    return nices


def _name(process: psutil.Process) -> str | None:
    """The process's name, None if it ended meanwhile (Spark's Python workers come and go)."""
    try:
        return str(process.name())
    except psutil.NoSuchProcess:
        return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread nice is Linux's")
def test_the_job_yields_the_cores_to_the_receivers(daemon: Daemon) -> None:
    # A receiver that falls behind loses datagrams; the job catches up from the log. The store
    # serves dashboards and alerts: it keeps its priority.
    receiver = daemon.info["ingest_pids"][0]
    readers = min(_thread_nices(receiver))
    job = job_nice(DEFAULT_WORKER_NICE)
    assert readers == 0 and job > DEFAULT_WORKER_NICE
    assert set(_thread_nices(daemon.process.pid)) - {0} == {job}  # output forwarders stay at 0
    postmaster = int((daemon.data_dir / "postgres" / "postmaster.pid").read_text().split()[0])
    assert _thread_nices(postmaster) == [0]
    jvm = [child for child in psutil.Process(daemon.process.pid).children(recursive=True)
           if _name(child) == "java"]  # fmt: skip
    assert jvm and set(_thread_nices(jvm[0].pid)) == {job}


def _lines_received(daemon: Daemon) -> int:
    status = json.loads(daemon.cli("status", "--json", "--data-dir", str(daemon.data_dir)))
    return int(status.get("ingest", {}).get("udp-0", {}).get("lines", 0))


def test_statsd_traffic_lands_in_final_windows_exactly(daemon: Daemon) -> None:
    host, port = daemon.info["udp"].rsplit(":", 1)
    lines_before = _lines_received(daemon)  # the module's other tests may have sent some
    client = RecordingStatsClient(host, int(port))
    random.seed(20261121)  # the client samples @0.5 lines with `random`
    names = [f"e2e.counter.{i:02d}" for i in range(20)]
    for i in range(10_000):
        name = names[i % 20]
        if i % 3 == 0:
            client.incr(name, 1, rate=0.5)
        else:
            client.incr(name, 1)
        if i % 100 == 0:
            client.timing("e2e.timer", (i % 997) + 0.5)
            client.gauge("e2e.gauge", i // 100)
        if i % 250 == 249:
            time.sleep(0.02)  # stay far from the kernel receive buffer's limit
    daemon.cli("send", "--to", daemon.info["udp"], "e2e.cli:7|c")
    sent = client.sent + ["e2e.cli:7|c"]
    expected = _expectations(sent)

    sent_metrics = ", ".join(f"'{metric}'" for metric in sorted(expected))  # not other tests'
    sql = (
        "select metric, sum(count)::bigint as count, sum(sum) as sum, min(min) as min, "
        "max(max) as max, bool_and(is_final) as final from window_results "
        f"where config_name = 'e2e' and metric in ({sent_metrics}) group by metric order by metric"
    )
    deadline = time.monotonic() + FINAL_TIMEOUT_S
    while True:
        rows = {r["metric"]: r for r in daemon.query(sql)}
        settled = set(rows) == set(expected) and all(
            rows[m]["final"] and rows[m]["count"] == expected[m].count for m in expected
        )
        if settled:
            break
        if time.monotonic() > deadline:
            stats = daemon.cli("status", "--data-dir", str(daemon.data_dir))
            pytest.fail(f"windows not final with all samples: {rows}\n{stats}")
        time.sleep(1)

    for name in names + ["e2e.cli"]:
        assert rows[name]["sum"] == expected[name].total, name
        assert rows[name]["count"] == expected[name].count, name
        assert rows[name]["min"] is None  # counters have no min/max
    assert sum(e.count for n, e in expected.items() if n.startswith("e2e.counter")) > 6_000
    timer = rows["e2e.timer"]
    assert (timer["min"], timer["max"]) == (expected["e2e.timer"].minimum,
                                            expected["e2e.timer"].maximum)
    assert timer["sum"] == pytest.approx(
        sum(float(line.split(":")[1].split("|")[0]) for line in sent
            if line.startswith("e2e.timer")), rel=1e-12)
    last_gauge = daemon.query(
        "select last from window_results where config_name = 'e2e' and metric = 'e2e.gauge' "
        "order by window_start desc limit 1"
    )
    assert last_gauge == [{"last": expected["e2e.gauge"].last}]

    status = json.loads(daemon.cli("status", "--json", "--data-dir", str(daemon.data_dir)))
    (window,) = status["windows"]
    assert (window["config_name"], window["window_name"]) == ("e2e", "per_2s")
    assert window["windows_emitted"] >= 1 and window["late_samples"] == 0
    assert 0 < window["watermark_lag_ms"] < 60_000
    ingest = status["ingest"]["udp-0"]
    assert ingest["rejected"] == {}
    assert ingest["lines"] - lines_before == len(sent)


def test_timer_percentiles_and_set_distinct_counts_reach_the_store(daemon: Daemon) -> None:
    """Timers and sets from the reference client, through receivers, segments, the window job
    and the store: the stored HDR buckets of all windows merge (in SQL) to
    exactly the histogram of what was sent, each window's t-digest percentiles lie within its
    own values, and the union of the windows' HLLs counts exactly the members sent."""
    host, port = daemon.info["udp"].rsplit(":", 1)
    client = RecordingStatsClient(host, int(port))
    rng = random.Random(20261122)
    members = [f"user-{i}" for i in range(300)]
    for i in range(3_000):
        client.timing("e2e.latency", round(rng.lognormvariate(3.0, 0.7), 3))
        client.set("e2e.users", members[rng.randrange(len(members))])
        if i % 250 == 249:
            time.sleep(0.02)
    latencies = [float(line.split(":")[1].split("|")[0]) for line in client.sent
                 if line.startswith("e2e.latency:")]  # fmt: skip
    users = {line.split(":")[1].split("|")[0] for line in client.sent
             if line.startswith("e2e.users:")}  # fmt: skip

    sql = (
        "select metric, sum(count)::bigint as count, bool_and(is_final) as final, "
        "bool_and(p50 <= p90 and p90 <= p99 and p99 <= p999 and min <= p50 and p999 <= max) "
        "as ordered from window_results where config_name = 'e2e' "
        "and metric in ('e2e.latency', 'e2e.users') group by metric"
    )
    deadline = time.monotonic() + FINAL_TIMEOUT_S
    while True:
        rows = {r["metric"]: r for r in daemon.query(sql)}
        want = {"e2e.latency": len(latencies), "e2e.users": 3_000}
        if all(m in rows and rows[m]["final"] and rows[m]["count"] == n
               for m, n in want.items()):  # fmt: skip
            break
        if time.monotonic() > deadline:
            pytest.fail(f"timer/set windows not final with all samples: {rows}")
        time.sleep(1)
    assert rows["e2e.latency"]["ordered"] is True

    layout = HdrLayout.from_params(compile_accuracy())
    merged = daemon.query(
        "select streamgauge_hdr_quantiles(array_agg((bucket, lower_bound, upper_bound, count)"
        "::streamgauge_hdr_bin), array[0.5, 0.9, 0.99]) as qs, sum(count)::bigint as n "
        "from window_histograms where config_name = 'e2e' and metric = 'e2e.latency'"
    )
    assert merged[0]["n"] == len(latencies)
    histogram = layout.histogram(latencies)
    assert merged[0]["qs"] == [
        layout.quantile(histogram.indices, histogram.counts, q) for q in (0.5, 0.9, 0.99)
    ]
    sketches = daemon.query(
        "select encode(sketch, 'base64') as sketch from window_results "
        "where config_name = 'e2e' and metric = 'e2e.users'"
    )
    union = union_hll(base64.b64decode(r["sketch"]) for r in sketches)
    assert round(union.get_estimate()) == len(users)


def test_sigterm_stops_every_part_cleanly() -> None:
    with started_daemon() as daemon:  # its own: the module's daemon serves the other tests
        ingest_pid = daemon.info["ingest_pid"]
        daemon.process.send_signal(signal.SIGTERM)
        assert daemon.process.wait(timeout=120) == 0, daemon.log_path.read_text()[-3000:]
        assert not (daemon.data_dir / "run.json").exists()
        with pytest.raises(ProcessLookupError):
            os.kill(ingest_pid, 0)
        # The embedded PostgreSQL stopped too: its postmaster.pid is gone.
        assert not (daemon.data_dir / "postgres" / "postmaster.pid").exists()
