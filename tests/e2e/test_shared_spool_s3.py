"""Two hosts, one spool on an object store (``docs/scale-out.md``, "One spool shared by several
hosts"), with a real S3 API server.

Two ``streamgauge ingest --spool s3://…`` processes (each its own receiver name, data
directory and UDP port, as on two hosts) receive real UDP from the ``statsd`` client and write
into one bucket prefix; ``streamgauge process --spool s3://…`` (Spark local) reads both
streams from S3 in its Python workers and aggregates them into PostgreSQL. Counters are
integers, so the totals are exact: the store holds every line sent, once. The URI carries
credentials, and no process writes them to its log.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import statsd

from streamgauge.ingest.log import describe_spool, list_segments, read_segment
from streamgauge.sinks.store import run_sql
from tests.e2e.harness import free_udp_port, scratch_dir
from tests.s3_server import SECRET_KEY, S3Server

CONFIG = """
name: shared_s3
pane: 1s
windows:
  - {name: per_2s, kind: tumbling, size: 2s, watermark_delay: 1s, allowed_lateness: 0s}
"""
#: (receiver, metric) -> lines sent, each ``metric:1|c``
SENT = {("host-a", "shared.hits"): 300, ("host-b", "shared.hits"): 200,
        ("host-a", "shared.only_a"): 120, ("host-b", "shared.only_b"): 80}  # fmt: skip
TOTALS_SQL = (
    "select metric, sum(sum)::bigint as total, bool_and(is_final) as final "
    "from window_results where config_name = 'shared_s3' and metric like 'shared.%' "
    "group by metric order by metric"
)


def _streamgauge(command: str, log: Path, *args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "AWS_EC2_METADATA_DISABLED": "true"}  # never look beyond 127.0.0.1
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "streamgauge", command, *args],
            stdout=out, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip


def _wait(condition: Callable[[], bool], processes: list[subprocess.Popen[bytes]],
          logs: list[Path], what: Callable[[], str], timeout_s: float) -> None:  # fmt: skip
    deadline = time.monotonic() + timeout_s
    while not condition():
        for process, log in zip(processes, logs, strict=True):
            assert process.poll() is None, f"{log.name} exited:\n{log.read_text()[-4000:]}"
        assert time.monotonic() < deadline, f"timed out: {what()}\n" + "\n".join(
            log.read_text()[-3000:] for log in logs
        )
        time.sleep(0.5)


@pytest.mark.timeout(420)
def test_two_ingest_hosts_write_one_s3_spool_and_process_aggregates_both(
    s3_server: S3Server, clean_store: str
) -> None:
    root = scratch_dir("streamgauge-shared-s3-")
    config = root / "shared_s3.yaml"
    config.write_text(CONFIG)
    uri = s3_server.uri()
    ports = {"host-a": free_udp_port(), "host-b": free_udp_port()}
    logs = {name: root / f"{name}.log" for name in (*ports, "process")}
    processes: dict[str, subprocess.Popen[bytes]] = {}
    try:
        for name, port in ports.items():
            processes[name] = _streamgauge(
                "ingest", logs[name], "--config", str(config), "--data-dir", str(root / name),
                "--spool", uri, "--receiver", name, "--listen", f"127.0.0.1:{port}",
            )  # fmt: skip
        processes["process"] = _streamgauge(
            "process", logs["process"], "--config", str(config),
            "--data-dir", str(root / "process"), "--spool", uri,
            "--postgres-url", clean_store, "--trigger", "1 second",
        )  # fmt: skip
        everyone, every_log = list(processes.values()), list(logs.values())
        _wait(lambda: all(list_segments(uri, name) for name in ports), everyone, every_log,
              lambda: "both receivers' first segments in the bucket", 60)  # fmt: skip

        clients = {name: statsd.StatsClient("127.0.0.1", port) for name, port in ports.items()}
        remaining = dict(SENT)
        while any(remaining.values()):  # interleaved over about two seconds
            for (name, metric), left in remaining.items():
                if left:
                    clients[name].incr(metric)
                    remaining[name, metric] = left - 1
            time.sleep(0.006)
        # Every window with data closes once the heartbeats pass its end plus the delay (2 s
        # window, 1 s delay): the receivers keep beating for that long before they stop.
        closing_ms = int(time.time() * 1000) + 4_000

        def beyond_the_data() -> bool:
            streams = describe_spool(uri)
            return all(int(streams[name]["heartbeat_ms"] or 0) >= closing_ms for name in ports)

        _wait(beyond_the_data, everyone, every_log, lambda: "heartbeats past the data", 60)
        for name in ports:  # a clean stop: everything received is written, the stream closed
            processes[name].send_signal(signal.SIGTERM)
        for name in ports:
            assert processes[name].wait(60) == 0, logs[name].read_text()[-4000:]

        in_log: dict[tuple[str, str], float] = {}
        for name in ports:
            for segment in list_segments(uri, name):
                for row in (r for b in read_segment(segment) for r in b.to_pylist()):
                    if row["metric"].startswith("shared."):
                        key = (name, row["metric"])
                        in_log[key] = in_log.get(key, 0) + row["sum"]
        assert in_log == SENT  # every line reached the shared log, in its sender's stream

        expected = [("shared.hits", 500, True), ("shared.only_a", 120, True),
                    ("shared.only_b", 80, True)]  # fmt: skip

        def stored() -> list[tuple[object, ...]]:
            return list(run_sql(clean_store, TOTALS_SQL)[1])

        _wait(lambda: stored() == expected, [processes["process"]], [logs["process"]],
              lambda: f"the store's totals {stored()} to reach {expected}", 300)  # fmt: skip
        processes["process"].send_signal(signal.SIGTERM)
        assert processes["process"].wait(120) == 0, logs["process"].read_text()[-4000:]
        for name, log in logs.items():
            text = log.read_text(errors="replace")
            assert SECRET_KEY not in text, f"{name} logged the spool's credentials"
        assert "writing to s3://" in logs["host-a"].read_text()  # the redacted location
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        shutil.rmtree(root, ignore_errors=True)
