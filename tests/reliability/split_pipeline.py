"""`streamgauge ingest` and `streamgauge process` as separate processes on one data directory
(the layout of receivers on other hosts, ``docs/scale-out.md``), for fault tests that stop one
half and not the other."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamgauge.ingest.log import list_receivers, list_segments
from tests.e2e.harness import free_udp_port, stop_leftover_server

RECEIVER = "udp-0"


class SplitPipeline:
    """One receiver (``RECEIVER``) and one window job; ``extra`` flags go to both."""

    def __init__(self, root: Path, config_text: str, *extra: str) -> None:
        self.root = root
        self.config = root / "pipeline.yaml"
        self.config.write_text(config_text)
        self.data_dir = root / "data"
        self.spool = self.data_dir / "spool"
        self.port = free_udp_port()
        self._extra = extra
        self.ingest: subprocess.Popen[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None

    def _spawn(self, *args: str, log: str) -> subprocess.Popen[bytes]:
        with open(self.root / log, "ab") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "streamgauge", *args, "--config", str(self.config),
                 "--data-dir", str(self.data_dir), *self._extra],
                stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def start_ingest(self) -> None:
        self.ingest = self._spawn("ingest", "--listen", f"127.0.0.1:{self.port}",
                                  "--receiver", RECEIVER, log="ingest.log")  # fmt: skip

    def start_process(self) -> None:
        self.process = self._spawn("process", log="process.log")

    def wait_for_receiver(self, timeout_s: float = 120) -> None:
        """Until the receiver has written its first segment (so its socket is bound): lines
        sent before that would reach nobody, uncounted."""
        self.wait(lambda: self.spool.is_dir() and RECEIVER in list_receivers(self.spool)
                  and bool(list_segments(self.spool, RECEIVER)),
                  "the receiver's first segment", timeout_s)  # fmt: skip

    def log(self, name: str, chars: int = 4000) -> str:
        path = self.root / name
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    def stats(self) -> dict[str, Any]:
        """The receiver's cumulative counts (rewritten at every roll); {} before the first."""
        path = self.data_dir / "ingest" / f"{RECEIVER}.json"
        try:
            return dict(json.loads(path.read_text()))
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def wait(self, condition: Callable[[], Any], what: str, timeout_s: float = 120) -> None:
        """Until ``condition()``; fails early, with the logs, if the receiver has died."""
        deadline = time.monotonic() + timeout_s
        while not condition():
            assert self.ingest is not None and self.ingest.poll() is None, self.log("ingest.log")
            assert time.monotonic() < deadline, (
                f"timed out: {what}\n{self.log('ingest.log')}\n{self.log('process.log')}")
            time.sleep(0.2)

    def query(self, sql: str) -> list[dict[str, Any]]:
        done = subprocess.run(
            [sys.executable, "-m", "streamgauge", "query", "--data-dir", str(self.data_dir),
             "--json", sql],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return [json.loads(line) for line in done.stdout.splitlines()]

    def wait_for(self, sql: str, timeout_s: float = 300) -> None:
        """Until the query's one row has a true ``ok`` column."""
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
        stop_leftover_server(self.data_dir)
