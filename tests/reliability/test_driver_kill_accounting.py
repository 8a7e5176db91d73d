"""``kill -9`` of the Spark driver under load, receivers kept running: every line sent is in
the store exactly once, or counted as dropped.

`streamgauge ingest` and `streamgauge process` run as separate processes (the multi-host
layout, DESIGN.md §8), so killing the window job does not stop the receivers: a StatsD client
keeps sending throughout, the log keeps growing, and the restarted job resumes from its
checkpoints. Afterwards:

- accounting: counter lines sent = counter samples stored (emitted windows, and the last ones
  still waiting for the watermark in ``window_pending``) + kernel drops + rejects (both
  counted by the receivers and written through the pipeline as self-metrics);
- exactly once: the store equals the reference windower over the durable log (a micro-batch
  committed before the kill and replayed after it is not counted twice).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamgauge.ingest.log import list_receivers, list_segments, read_segment
from tests.e2e.harness import (
    Daemon,
    PacedSender,
    free_udp_port,
    load,
    reference_rows,
    scratch_dir,
    stored_rows,
)

CONFIG = """
name: driverkill
pane: 1s
windows:
  - {name: per_2s, kind: tumbling, size: 2s, watermark_delay: 1s, allowed_lateness: 1s}
"""


class Processes:
    """`streamgauge ingest` and `streamgauge process` on one data directory."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config = root / "driverkill.yaml"
        self.config.write_text(CONFIG)
        self.data_dir = root / "data"
        self.port = free_udp_port()
        self.ingest: subprocess.Popen[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def _spawn(self, *args: str, log: str) -> subprocess.Popen[bytes]:
        with open(self.root / log, "ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "streamgauge", *args, "--config", str(self.config),
                 "--data-dir", str(self.data_dir)],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def start_ingest(self) -> None:
        self.ingest = self._spawn("ingest", "--listen", f"127.0.0.1:{self.port}",
                                  "--receiver", "udp-0", log="ingest.log")  # fmt: skip

    def wait_for_receiver(self, timeout_s: float = 120) -> None:
        """Until the receiver has written its first segment (so its socket is bound)."""
        spool = self.data_dir / "spool"
        deadline = time.monotonic() + timeout_s
        while not (spool.exists() and "udp-0" in list_receivers(spool)
                   and list_segments(spool, "udp-0")):  # fmt: skip
            assert time.monotonic() < deadline, self.log("ingest.log")
            time.sleep(0.2)

    def start_process(self) -> None:
        self.process = self._spawn("process", log="process.log")

    def log(self, name: str) -> str:
        return (self.root / name).read_text(errors="replace")[-4000:]

    def query(self, sql: str) -> list[dict[str, object]]:
        done = subprocess.run(
            [sys.executable, "-m", "streamgauge", "query", "--data-dir", str(self.data_dir),
             "--json", sql],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    def wait_for(self, sql: str, timeout_s: float = 300) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                if self.query(sql)[0]["ok"]:
                    return
            except AssertionError:
                pass  # the store is not up yet (the job starts it)
            time.sleep(0.5)
        raise AssertionError(f"timed out: {sql}\n{self.log('process.log')}")

    def cleanup(self) -> None:
        for proc in (self.process, self.ingest):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        postmaster = self.data_dir / "postgres" / "postmaster.pid"
        if postmaster.exists():  # the store outlives a killed job
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(postmaster.read_text().split()[0]), signal.SIGTERM)


def _log_rows(spool: Path) -> list[dict[str, object]]:
    return [row for receiver in list_receivers(spool) for info in list_segments(spool, receiver)
            for batch in read_segment(info.path) for row in batch.to_pylist()]  # fmt: skip


@pytest.fixture()
def processes() -> Iterator[Processes]:
    root = scratch_dir("streamgauge-driverkill-")
    running = Processes(root)
    try:
        yield running
    finally:
        running.cleanup()


COUNTER_SAMPLES = (  # emitted windows, and the last ones the watermark has not passed yet
    "select coalesce(sum(count), 0) as n from (select count from window_results where metric "
    "like 'e2e.c.%' union all select count from window_pending where metric like 'e2e.c.%') w"
)
DROPPED = (  # the receivers' own counts, through the pipeline (integer sums: exact)
    "select coalesce(sum(sum), 0)::bigint as n from window_results where metric in "
    "('streamgauge.ingest.kernel_drops', 'streamgauge.ingest.rejected')"
)


def test_kill_9_of_the_driver_under_load_loses_nothing_and_counts_nothing_twice(
    processes: Processes,
) -> None:
    processes.start_ingest()
    processes.start_process()
    processes.wait_for_receiver()  # lines sent before it binds would reach nobody, uncounted
    sender = PacedSender(processes.port, lines_per_second=400)
    sender.start()
    processes.wait_for("select count(*) >= 5 as ok from window_results "
                       "where metric like 'e2e.%'")  # fmt: skip
    assert processes.process is not None
    processes.process.kill()  # mid-stream: the receiver keeps writing the log
    processes.process.wait()
    time.sleep(3)
    processes.start_process()
    processes.wait_for("select count(*) >= 1 as ok from sink_batches "
                       "where committed_at > now() - interval '5 seconds'")  # fmt: skip
    time.sleep(2)
    sender.stop()
    assert processes.ingest is not None
    processes.ingest.send_signal(signal.SIGTERM)  # flushes and closes its stream
    assert processes.ingest.wait(timeout=60) == 0, processes.log("ingest.log")
    # Every counter line sent is a stored sample or a counted drop (none expected at 400/s).
    try:
        processes.wait_for(f"select ({COUNTER_SAMPLES}) + ({DROPPED}) = {sender.sent} as ok",
                           timeout_s=120)  # fmt: skip
    except AssertionError:
        in_log = sum(row["count"] for row in _log_rows(processes.data_dir / "spool")
                     if row["metric"].startswith("e2e.c."))  # fmt: skip
        raise AssertionError(
            f"sent {sender.sent}, in the log {in_log}, stored {processes.query(COUNTER_SAMPLES)}"
            f", dropped {processes.query(DROPPED)}"
        ) from None
    assert processes.query(DROPPED) == [{"n": 0}]
    assert processes.process is not None
    processes.process.send_signal(signal.SIGTERM)  # drains what is left in the log
    assert processes.process.wait(timeout=120) == 0, processes.log("process.log")
    [stored] = processes.query(COUNTER_SAMPLES)
    assert stored["n"] == sender.sent > 0

    # Exactly once: the store equals the reference windower over the whole log.
    config = load(processes.config)
    reader = Daemon(processes.config, processes.data_dir, processes.port, processes.root / "q")
    assert stored_rows(reader, config.name) == reference_rows(config, processes.data_dir / "spool")
