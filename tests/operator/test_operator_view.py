"""The operator's view of one real daemon on a terminal: what ``run`` prints, ``status``,
``top`` and ``query`` while it runs, and a Ctrl-C stop.

One daemon for the module (a start costs ~10 s of a shared machine), given traffic until
its windows are published before any test reads it, so the tests read it in any order; the
Ctrl-C stop has a daemon of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.harness import scratch_dir
from tests.operator.pty_daemon import (
    JVM_MARKERS,
    STATUS_LINE,
    PtyDaemon,
    Screen,
    daemon_on,
    run_on_terminal,
)

CONFIG = """
name: operator
pane: 1s
windows:
  - {name: per_2s, kind: tumbling, size: 2s, watermark_delay: 1s, allowed_lateness: 1s,
     metrics: ["*"]}
"""
#: op.users gets more tag values than the per-metric limit: the guard folds the rest into
#: the metric's overflow series, which ``top`` must show against the limit.
PER_METRIC_LIMIT = 20
USERS = 60


@contextlib.contextmanager
def pty_daemon(prefix: str, *extra: str) -> Iterator[PtyDaemon]:
    """A daemon on a terminal of its own, started; killed and cleaned up after the block."""
    root = scratch_dir(prefix)
    config = root / "operator.yaml"
    config.write_text(CONFIG)
    try:
        with daemon_on(config, root / "data", *extra) as daemon:
            yield daemon
    finally:
        shutil.rmtree(root, ignore_errors=True)


PUBLISHED_METRICS = ("select count(distinct metric) as metrics from window_results "
                     "where metric like 'op.%'")  # fmt: skip


def published_traffic(daemon: PtyDaemon) -> None:
    """``traffic`` until a window of each of its three metrics is published."""
    deadline = time.monotonic() + 90
    traffic(daemon.port, 3)
    while True:
        out = streamgauge("query", "--json", "--data-dir", daemon.info["data_dir"],
                          PUBLISHED_METRICS).stdout  # fmt: skip
        if json.loads(out.splitlines()[0])["metrics"] == 3:
            return
        assert time.monotonic() < deadline, f"no window of every metric: {out}"
        traffic(daemon.port, 1)


@pytest.fixture(scope="module")
def daemon() -> Iterator[PtyDaemon]:
    with pty_daemon("streamgauge-operator-",
                    "--max-series-per-metric", str(PER_METRIC_LIMIT)) as daemon:  # fmt: skip
        published_traffic(daemon)
        yield daemon


def send(port: int, lines: list[str]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for start in range(0, len(lines), 20):
            sock.sendto("\n".join(lines[start : start + 20]).encode(), ("127.0.0.1", port))


def traffic(port: int, seconds: float) -> None:
    """~300 lines/s for ``seconds``: a counter over USERS tag values, a timer, a bad line."""
    deadline = time.monotonic() + seconds
    i = 0
    while time.monotonic() < deadline:
        batch = [f"op.users:1|c|#user:u{(i + k) % USERS}" for k in range(25)]
        batch += [f"op.latency:{i % 50}|ms", "op.depth:3|g", "not a statsd line"]
        send(port, batch)
        i += 25
        time.sleep(0.1)


def streamgauge(*args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "streamgauge", *args],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done


def test_the_banner_says_where_everything_is(daemon: PtyDaemon) -> None:
    text = daemon.screen.wait_for(r"look\s+streamgauge status").string
    data_dir = daemon.info["data_dir"]
    assert f"udp {daemon.info['udp']}" in text
    assert f"spark ui   {daemon.info['spark_ui']}" in text
    assert f"logs       {data_dir}/logs" in text
    assert f"streamgauge send 'api.requests:1|c' --to {daemon.info['udp']}" in text
    assert f"streamgauge query --data-dir {data_dir}" in text
    password = daemon.info["postgres_url"].split("@")[0].split(":")[-1]
    assert password not in text and "postgresql://streamgauge:***@" in text


def test_the_status_line_shows_data_flowing_and_windows_published(daemon: PtyDaemon) -> None:
    traffic(daemon.port, 4)
    deadline = time.monotonic() + 60
    flowing = published = None
    while time.monotonic() < deadline and not (flowing and published):
        traffic(daemon.port, 1)
        for drawn in daemon.screen.status_lines():
            found = STATUS_LINE.search(drawn)
            if found is None:  # "store unavailable: ..." while the store starts
                continue
            if found["rate"] not in ("…", "0"):
                flowing = found
            if found["published"] and int(found["published"].replace(",", "")) > 0:
                published = found
    assert flowing, daemon.screen.text[-3000:]
    assert int(flowing["rejects"].replace(",", "")) > 0  # "not a statsd line"
    assert int(flowing["series"]) > 0
    assert published, daemon.screen.text[-3000:]
    assert re.fullmatch(r"per_2s \d+(\.\d)?m?s", published["lags"]), published["lags"]


#: How the daemon surfaces one Spark error: one line of its own naming the log file.
SURFACED_ERROR = re.compile(r"\d\d:\d\d:\d\d  spark ERROR [^\r\n]*\(details: [^\r\n]*\)")


def test_nothing_from_spark_or_the_jvm_reaches_the_terminal(daemon: PtyDaemon) -> None:
    text = SURFACED_ERROR.sub("", daemon.screen.text)  # the error test's line, if it ran
    leaked = [marker for marker in JVM_MARKERS if marker in text]
    assert not leaked, f"{leaked} on the terminal:\n{text[-3000:]}"
    logs = Path(daemon.info["data_dir"]) / "logs"
    # ... it went to the log files instead: the JVM's start-up (Spark's own log4j lines are
    # there too, at WARN and above, when Spark has something to say)
    assert (logs / "spark.log").exists()
    assert (logs / "jvm.log").exists()
    assert "log4j2.configurationFile" not in text


def test_a_spark_error_shows_as_one_line_naming_the_log(daemon: PtyDaemon) -> None:
    # What log4j2 writes for an ERROR event (jvm_logs: one line, no stack trace), appended
    # the way the JVM appends it; the daemon follows the file.
    errors = Path(daemon.info["data_dir"]) / "logs" / "spark-errors.log"
    with open(errors, "a") as log:
        log.write("2026-11-27 10:00:00 ERROR Executor: Exception in task 0.0 in stage 1.0\n")
    logs = Path(daemon.info["data_dir"]) / "logs"
    shown = daemon.screen.wait_for(r"spark ERROR Executor: .*\n", timeout_s=20)[0]
    assert shown.rstrip().endswith(f"(details: {logs / 'spark.log'})")
    assert len(SURFACED_ERROR.findall(daemon.screen.text)) == 1


def test_status_is_a_table_for_a_person(daemon: PtyDaemon) -> None:
    out = streamgauge("status", "--data-dir", daemon.info["data_dir"]).stdout
    assert f"udp          {daemon.info['udp']}" in out
    # the daemon's own status line, as it last drew it: data flows
    assert STATUS_LINE.search(out.split("\nnow ", 1)[1].splitlines()[0])
    receivers = out.split("receivers (since start)\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert receivers[0].split() == ["RECEIVER", "LINES", "SAMPLES", "REJECTED", "SERIES",
                                    "LIMIT", "OVERFLOWED", "KERNEL", "DROPS", "REFUSED",
                                    "STORE", "LAG"]  # fmt: skip
    assert receivers[1].split()[0] == "udp-0" and int(receivers[1].split()[1].replace(",", ""))
    windows = out.split("windows\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert windows[1].split()[0] == "operator.per_2s"
    assert "malformed_line" in out and "'not a statsd line'" in out


def test_status_json_keeps_the_document(daemon: PtyDaemon) -> None:
    document = json.loads(streamgauge("status", "--json", "--data-dir",
                                      daemon.info["data_dir"]).stdout)  # fmt: skip
    assert set(document) == {"data_dir", "windows", "running", "spool", "ingest", "status_line",
                             "catch_up"}
    (position,) = document["catch_up"]  # the query keeps up: a few segments to read, no more
    assert position["window"] == "per_2s" and not position["catching_up"], position
    assert position["segments_done"] > 0 and position["segments_per_s"] > 0, position
    (window,) = document["windows"]
    assert window["window_name"] == "per_2s" and window["windows_emitted"] > 0
    assert {"watermark_ms", "watermark_lag_ms", "windows_pending", "late_samples"} <= set(window)
    assert "***" in document["running"]["postgres_url"]
    assert document["ingest"]["udp-0"]["lines"] > 0


def test_status_loads_neither_spark_nor_grafana(daemon: PtyDaemon) -> None:
    # What made it take seconds on a busy machine: what it imports, not what it reads.
    heavy = ("pyspark", "grafana_client", "pydantic", "pandas")
    probe = ("import sys; from streamgauge.cli import main; "
             f"main(['status', '--data-dir', {daemon.info['data_dir']!r}]); "
             f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}), "
             "file=sys.stderr)")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert done.stderr.strip().splitlines()[-1] == "[]", done.stderr


def test_status_watch_redraws_until_ctrl_c(daemon: PtyDaemon, tmp_path: Path) -> None:
    # -X faulthandler: a SIGABRT writes every thread's stack to stderr (a file, which outlives
    # the process, unlike what a dying process leaves in a pty), should Ctrl-C not end it
    stderr = tmp_path / "stderr"
    with stderr.open("wb") as errors:
        master, process = run_on_terminal([
            sys.executable, "-X", "faulthandler", "-m", "streamgauge", "status", "--data-dir",
            daemon.info["data_dir"], "--watch", "0.5"], stderr=errors.fileno())  # fmt: skip
    screen = Screen(master)
    screen.start()
    screen.wait_for(r"(?s)every 0.5 s, Ctrl-C to stop.*every 0.5 s, Ctrl-C to stop", 30)
    os.write(master, b"\x03")
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.send_signal(signal.SIGABRT)
        process.wait(timeout=10)
        pytest.fail(
            f"status --watch did not end on Ctrl-C (SIGINT in this test process: "
            f"{signal.getsignal(signal.SIGINT)!r}); its stacks:\n{stderr.read_text()[-6000:]}"
        )
    assert process.returncode == 0
    # the second drawing has lines/s: the difference of two readings
    second = screen.text.replace("\r\n", "\n").split("\x1b[H\x1b[2J")[2]
    header, receiver = second.split("receivers (since start)\n", 1)[1].splitlines()[:2]
    assert header.split()[-1] == "LINES/S"
    assert re.fullmatch(r"[\d,]+", receiver.split()[-1]), second


@contextlib.contextmanager
def traffic_meanwhile(port: int) -> Iterator[None]:
    """``traffic`` in a thread until the block ends: what ``top`` reads is what arrives now."""
    halt = threading.Event()

    def send_until_halted() -> None:
        while not halt.is_set():
            traffic(port, 0.5)

    sender = threading.Thread(target=send_until_halted, daemon=True)
    sender.start()
    try:
        yield
    finally:
        halt.set()
        sender.join()


def test_top_finds_the_heavy_metric_and_its_overflow(daemon: PtyDaemon) -> None:
    with traffic_meanwhile(daemon.port):
        time.sleep(5)
        report = json.loads(streamgauge("top", "--json", "--seconds", "4", "--data-dir",
                                        daemon.info["data_dir"]).stdout)  # fmt: skip
        table = streamgauge("top", "--seconds", "4", "--limit", "3",
                            "--data-dir", daemon.info["data_dir"]).stdout  # fmt: skip
    heaviest = report["metrics"][0]
    assert heaviest["metric"] == "op.users" and heaviest["metric_type"] == "c"
    assert heaviest["samples_per_s"] > 50
    # 20 series kept apart, the other 40 users folded into the metric's overflow series
    assert heaviest["series"] == PER_METRIC_LIMIT + 1
    assert heaviest["tag_values"] == {"user": PER_METRIC_LIMIT, "streamgauge_overflow": 1}
    assert heaviest["overflow_samples_per_s"] > 0
    assert report["receivers"]["max_series_per_metric"] == PER_METRIC_LIMIT
    assert report["receivers"]["cardinality_limited"] > 0
    assert report["series"][0]["tags"] == {"streamgauge_overflow": "true"}

    rows = table.split("\n\n")[1].splitlines()
    assert rows[0].split()[:7] == ["METRIC", "TYPE", "SAMPLES/S", "PARTIALS/S", "SERIES",
                                   "OF", str(PER_METRIC_LIMIT)]  # fmt: skip
    assert rows[1].split()[0] == "op.users" and rows[1].split()[4] == "21"
    assert "user 20" in rows[1] and len(rows) == 4


def test_query_aligns_on_a_terminal_and_tabs_when_piped(daemon: PtyDaemon) -> None:
    sql = ("select metric, count(*) as windows from window_results "
           "where metric like 'op.%' group by 1 order by 1")  # fmt: skip
    piped = streamgauge("query", "--data-dir", daemon.info["data_dir"], sql).stdout
    header, *rows = piped.splitlines()
    assert header == "metric\twindows"
    assert [row.split("\t")[0] for row in rows] == ["op.depth", "op.latency", "op.users"]

    master, process = run_on_terminal([sys.executable, "-m", "streamgauge", "query",
                                       "--data-dir", daemon.info["data_dir"], sql])  # fmt: skip
    screen = Screen(master)
    screen.start()
    assert process.wait(timeout=60) == 0
    screen.join(timeout=10)
    lines = screen.text.replace("\r\n", "\n").strip().splitlines()
    assert re.fullmatch(r"metric +windows", lines[0])
    assert len({len(line) for line in lines[1:4]} | {len(lines[0])}) == 1  # aligned columns
    assert lines[-1] == "(3 rows)"


def test_ctrl_c_stops_cleanly_saying_what_was_flushed() -> None:
    with pty_daemon("streamgauge-operator-stop-") as daemon:
        published_traffic(daemon)
        before = len(daemon.screen.text)
        daemon.ctrl_c()
        assert daemon.process.wait(timeout=120) == 0
        daemon.screen.join(timeout=10)
        after = daemon.screen.text[before:]
        assert re.search(r"stopped: the receivers took [\d,]+ lines \([\d,]+ samples, [\d,]+ "
                         r"rejected\) and flushed them to the log in [\d,]+ segments; the store "
                         r"holds windows: per_2s [\d,]+", after), after  # fmt: skip
        assert "embedded PostgreSQL" in after and "stopped" in after
        leaked = [marker for marker in JVM_MARKERS if marker in after]
        assert not leaked, f"{leaked} on the terminal at the stop:\n{after}"
        assert not (Path(daemon.info["data_dir"]) / "run.json").exists()
