"""A Spark standalone cluster on 127.0.0.1 from the pyspark wheel: one master, N workers.

``spark-class`` execs the JVM, so each process id is the daemon's own; every daemon gets a
session (process group) of its own, so its executors go down with it even on ``kill -9``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyspark

from tests.e2e.harness import scratch_dir

START_TIMEOUT_S = 90


def free_tcp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def cluster_env() -> dict[str, str]:
    """Environment for the cluster's daemons and for a driver that joins it: loopback only,
    no PYTHONPATH (a Python worker must not find streamgauge but through what is shipped)."""
    return {
        **{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
        "SPARK_HOME": str(Path(pyspark.__file__).parent),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_DAEMON_MEMORY": "256m",
    }


@dataclass
class StandaloneCluster:
    root: Path
    workers: int = 2
    port: int = field(default_factory=free_tcp_port)
    ui_port: int = field(default_factory=free_tcp_port)
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json", timeout=5) as reply:
            found: dict[str, Any] = json.load(reply)
            return found

    def start(self) -> None:
        self._spawn("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))  # fmt: skip
        for index in range(self.workers):
            self._spawn(
                f"worker-{index}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1",
                "--cores", "1", "--memory", "1g", "--webui-port", str(free_tcp_port()),
                "--work-dir", str(self.root / f"worker-{index}"), self.url,
            )  # fmt: skip
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                if self.status().get("aliveworkers") == self.workers:
                    return
            for process in self.processes:
                if process.poll() is not None:
                    raise AssertionError(f"a cluster daemon exited:\n{self.logs()}")
            time.sleep(0.5)
        raise AssertionError(f"cluster did not come up:\n{self.logs()}")

    def _spawn(self, name: str, main_class: str, *args: str) -> None:
        spark_class = Path(pyspark.__file__).parent / "bin" / "spark-class"
        with open(self.root / f"{name}.log", "ab") as log:
            self.processes.append(
                subprocess.Popen(
                    [str(spark_class), main_class, *args], stdout=log, stderr=subprocess.STDOUT,
                    env=cluster_env(), cwd=self.root, start_new_session=True,
                )  # fmt: skip
            )

    def logs(self, chars: int = 3000) -> str:
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-chars:]}"
            for path in sorted(self.root.glob("*.log"))
        )

    def stop(self) -> None:
        """Workers first (their executors with them), then the master; SIGKILL after 20 s."""
        for process in reversed(self.processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            # Executors share the worker's process group and may outlive its JVM.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)


@contextlib.contextmanager
def standalone_cluster(workers: int = 2) -> Iterator[StandaloneCluster]:
    """A running cluster in a scratch directory; stopped and removed afterwards, also on error."""
    cluster = StandaloneCluster(scratch_dir("streamgauge-spark-cluster-"), workers)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
