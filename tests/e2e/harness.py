"""What the whole-pipeline tests share: the daemon as a subprocess, a paced StatsD sender, and
the check that the store holds exactly what the reference windower computes from the log.

Comparing against the segment log (rather than against what was sent) is the exactly-once
check: whatever reached the durable log must be in the store once, whatever happened to the
processes in between.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import statsd

from streamgauge.configs import PipelineConfig, load_config
from streamgauge.ingest.log import list_receivers, list_segments, read_heartbeat, read_segment
from streamgauge.windows.reference import PanePartial, ReferenceWindower, Segment

_PARTIAL_FIELDS = frozenset(f.name for f in fields(PanePartial))

START_TIMEOUT_S = 240


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scratch_dir(prefix: str) -> Path:
    # Not pytest's tmp_path: as root, every pytest session resets /tmp/pytest-of-root to 0700,
    # which locks the embedded PostgreSQL's system user out of its own cluster.
    return Path(tempfile.mkdtemp(prefix=prefix))


@dataclass
class Daemon:
    """`streamgauge run` in a subprocess, on a given config, data directory and UDP port."""

    config_path: Path
    data_dir: Path
    port: int
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    info: dict[str, Any] = field(default_factory=dict)
    extra_args: tuple[str, ...] = ()

    def start(self) -> None:
        (self.data_dir / "run.json").unlink(missing_ok=True)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "streamgauge", "run", "--config", str(self.config_path),
                 "--data-dir", str(self.data_dir), "--listen", f"127.0.0.1:{self.port}",
                 *self.extra_args],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        run_file = self.data_dir / "run.json"
        while not run_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise AssertionError(f"daemon did not start:\n{self.log_tail()}")
            time.sleep(0.2)
        self.info = json.loads(run_file.read_text())

    def log_tail(self, chars: int = 5000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self, timeout_s: float = 120) -> int:
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=timeout_s)

    def kill9(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "streamgauge", *args],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    def query(self, sql: str) -> list[dict[str, Any]]:
        out = self.cli("query", "--data-dir", str(self.data_dir), "--json", sql)
        return [json.loads(line) for line in out.splitlines()]

    def cleanup(self, root: Path) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        stop_leftover_server(self.data_dir)
        shutil.rmtree(root, ignore_errors=True)


def stop_leftover_server(data_dir: Path) -> None:
    """Stop the embedded PostgreSQL of ``data_dir`` if it still runs: the server outlives a
    daemon (or a job) killed outright."""
    postmaster = data_dir / "postgres" / "postmaster.pid"
    if postmaster.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(postmaster.read_text().split()[0]), signal.SIGTERM)


class PacedSender(threading.Thread):
    """Sends integer-valued counters and timers with the `statsd` client until stopped.

    Integer values keep every sum exact whatever order Spark adds them in. One line per
    datagram (a kernel drop is one line). First ``burst`` counter lines as fast as it goes
    over ``burst_series`` names ``<prefix>.b.<n>``; then, paced, ``<prefix>.c.<n>`` over 7
    names and (with ``timers``) a timer ``<prefix>.t`` with every fifth. ``sent`` counts the
    counter lines.
    """

    def __init__(
        self,
        port: int,
        lines_per_second: int = 400,
        *,
        prefix: str = "e2e",
        timers: bool = True,
        burst: int = 0,
        burst_series: int = 1,
    ) -> None:
        super().__init__(daemon=True)
        self._client = statsd.StatsClient("127.0.0.1", port)
        self._interval_s = 1 / lines_per_second
        self._halt = threading.Event()
        self._prefix, self._timers = prefix, timers
        self._burst, self._burst_series = burst, burst_series
        self.sent = 0

    def run(self) -> None:
        for i in range(self._burst):
            self._client.incr(f"{self._prefix}.b.{i % self._burst_series}")
            self.sent += 1
        i = self._burst
        while not self._halt.is_set():
            try:
                self._client.incr(f"{self._prefix}.c.{i % 7}")
                if self._timers and i % 5 == 0:
                    self._client.timing(f"{self._prefix}.t", i % 97)
                self.sent += 1
            except OSError:
                pass  # nothing listens during a restart: those never reached the log
            i += 1
            time.sleep(self._interval_s)

    def stop(self) -> None:
        self._halt.set()
        self.join()


@contextlib.contextmanager
def daemon_for(config_text: str, name: str, *extra_args: str) -> Iterator[Daemon]:
    """A daemon (not yet started) for a config, in a scratch directory removed afterwards."""
    root = scratch_dir(f"streamgauge-{name}-")
    config = root / f"{name}.yaml"
    config.write_text(config_text)
    daemon = Daemon(config, root / "data", free_udp_port(), root / "daemon.log",
                    extra_args=tuple(extra_args))  # fmt: skip
    try:
        yield daemon
    finally:
        daemon.cleanup(root)


def wait_until(daemon: Daemon, sql: str, timeout_s: float = 90) -> None:
    """Poll the store until ``sql`` returns a row whose column ``ok`` is true."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if daemon.query(sql)[0]["ok"]:
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for: {sql}\n{daemon.log_tail()}")


def segments_from_spool(spool: Path) -> list[Segment]:
    """The durable log as the reference windower consumes it, stream by stream, in order."""
    segments = []
    for receiver in list_receivers(spool):
        for info in list_segments(spool, receiver):
            heartbeat = read_heartbeat(info)
            partials = tuple(
                PanePartial(**{k: v for k, v in row.items() if k in _PARTIAL_FIELDS})
                for batch in read_segment(info) for row in batch.to_pylist()
            )  # the sketch columns are not part of the reference windower's partial
            segments.append(Segment(receiver, heartbeat.heartbeat_ms, heartbeat.closed, partials))
    return segments


def reference_rows(config: PipelineConfig, spool: Path) -> dict[tuple[Any, ...], dict[str, Any]]:
    windower = ReferenceWindower(config)
    windower.feed_all(segments_from_spool(spool))
    return {
        (name, metric, _canonical(tags), start): {
            "count": w.count, "sum": w.sum, "min": w.min, "max": w.max, "last": w.last,
            "is_final": w.is_final, "late_events": w.late_events,
        }
        for (name, metric, tags, start, _end), w in windower.stored().items()
    }  # fmt: skip


def stored_rows(daemon: Daemon, config_name: str) -> dict[tuple[Any, ...], dict[str, Any]]:
    rows = daemon.query(
        "select window_name, metric, tags, "
        "(extract(epoch from window_start) * 1000)::bigint as start, count, sum, min, max, "
        f"last, is_final, late_events from window_results where config_name = '{config_name}'"
    )
    return {
        (r["window_name"], r["metric"], _canonical(r["tags"]), r["start"]): {
            k: r[k] for k in ("count", "sum", "min", "max", "last", "is_final", "late_events")
        }
        for r in rows
    }


def _canonical(tags: Any) -> str:
    if isinstance(tags, str):
        tags = json.loads(tags)
    return json.dumps(tags, sort_keys=True, separators=(",", ":"))


def load(path: Path) -> PipelineConfig:
    return load_config(path)
