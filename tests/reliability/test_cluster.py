"""`streamgauge run|process --master spark://…` on a standalone cluster: a master and two
workers on 127.0.0.1 (1 core, 1 GiB each), started from the pyspark wheel, shared by the tests
of this module.

The daemon's Python workers (on the executors, and the driver's own planning workers) run an
interpreter that cannot import streamgauge from site-packages (``python -S`` with only the
third-party packages on its path), so the run only works if the daemon ships its own code
(``session.package_zip``). The store must then hold exactly what the reference windower
computes from the durable log, as for a ``local[*]`` run.

``process`` alone reads a hand-written spool of two receivers, one of them lagging: on the
cluster as locally, the windows the slow receiver has not passed stay pending.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow
import pytest

from streamgauge.sinks.store import run_sql
from tests.e2e.harness import (
    Daemon,
    PacedSender,
    daemon_for,
    load,
    reference_rows,
    scratch_dir,
    stored_rows,
    wait_until,
)
from tests.reliability.cluster import StandaloneCluster, cluster_env, standalone_cluster
from tests.reliability.segments import STORED_SQL, Spool, keyed

CONFIG = """
name: cluster
pane: 1s
windows:
  - name: per_2s
    kind: tumbling
    size: 2s
    watermark_delay: 1s
    allowed_lateness: 1s
  - name: hop_4s
    kind: hopping
    size: 4s
    hop: 2s
    watermark_delay: 1s
    allowed_lateness: 1s
"""


def _interpreter_without_streamgauge(root: Path) -> Path:
    """This venv's Python without .pth processing, site-packages ahead of the PYTHONPATH Spark
    gives it (pyspark's compiled modules load faster than its pyspark.zip): pyspark and
    pyarrow, but not the editable install of streamgauge."""
    wrapper = root / "python-no-streamgauge"
    site = Path(pyarrow.__file__).parent.parent
    wrapper.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" exec {sys.executable} -S "$@"\n'
    )
    wrapper.chmod(0o755)
    probe = subprocess.run([str(wrapper), "-c", "import pyarrow, pyspark; import streamgauge"],
                           cwd=root, capture_output=True, text=True, env=cluster_env())  # fmt: skip
    assert "No module named 'streamgauge'" in probe.stderr, probe.stderr
    return wrapper


@pytest.fixture(scope="module")
def cluster() -> Iterator[StandaloneCluster]:
    with standalone_cluster() as running:
        yield running


@pytest.fixture
def cluster_client(cluster: StandaloneCluster, monkeypatch: pytest.MonkeyPatch) -> str:
    """Environment for a daemon joining ``cluster`` (inherited by its subprocess); its URL."""
    env = cluster_env()
    env["PYSPARK_PYTHON"] = str(_interpreter_without_streamgauge(cluster.root))
    for name in ("SPARK_HOME", "SPARK_LOCAL_IP", "PYSPARK_PYTHON"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.chdir(cluster.root)  # not the repository: its ./streamgauge would be importable
    return cluster.url


@pytest.mark.timeout(300)
def test_run_on_a_standalone_cluster_equals_the_reference(
    cluster: StandaloneCluster, cluster_client: str
) -> None:
    arguments = ("--master", cluster_client, "--trigger", "1 second")
    with daemon_for(CONFIG, "cluster", *arguments) as daemon:
        daemon.start()
        sender = PacedSender(daemon.port, lines_per_second=300)
        sender.start()
        started = time.monotonic()
        try:
            wait_until(
                daemon, "select count(*) >= 4 as ok from window_results where is_final", 150
            )
            apps = cluster.status()["activeapps"]
            assert [app["cores"] for app in apps] == [2], apps  # both workers' executors
        finally:
            sender.stop()
        assert daemon.stop() == 0, daemon.log_tail()
        seconds = time.monotonic() - started

        expected = reference_rows(load(daemon.config_path), daemon.data_dir / "spool")
        stored = stored_rows(daemon, "cluster")
        assert stored == expected
        assert len({key[0] for key in stored}) == 2 and sum(r["count"] for r in stored.values())
        batches = daemon.query(
            "select query_name, extract(epoch from committed_at) as at from sink_batches "
            "where query_name in ('cluster.per_2s', 'cluster.hop_4s') order by 1, 2"
        )
        gaps = [b["at"] - a["at"] for a, b in zip(batches, batches[1:], strict=False)
                if a["query_name"] == b["query_name"]]  # fmt: skip
        print(
            f"\ncluster run: {sender.sent} lines sent over {seconds:.0f} s, {len(stored)} windows,"
            f" {len(batches)} window micro-batches, median {statistics.median(gaps):.2f} s apart"
        )


LAGGING = """
name: cluster_lagging
pane: 1s
windows:
  - name: per_2s
    kind: tumbling
    size: 2s
    watermark_delay: 1s
    allowed_lateness: 1s
"""


@pytest.mark.timeout(300)
def test_process_on_a_standalone_cluster_holds_windows_for_the_lagging_receiver(
    cluster_client: str, clean_store: str
) -> None:
    root = scratch_dir("streamgauge-cluster-process-")
    config_path = root / "cluster_lagging.yaml"
    config_path.write_text(LAGGING)
    config = load(config_path)
    spool = Spool(root / "data" / "spool")
    for beat in range(1, 21):
        spool.segment("fast", beat, {"c.req": 1, "t.lat": beat % 7})
    for beat in range(1, 7):
        spool.segment("slow", beat, {"c.req": 10, "t.lat": 100 + beat})
    daemon = Daemon(config_path, root / "data", 0, root / "process.log")
    try:
        with open(daemon.log_path, "ab") as log:
            daemon.process = subprocess.Popen(
                [sys.executable, "-m", "streamgauge", "process", "--config", str(config_path),
                 "--data-dir", str(daemon.data_dir), "--master", cluster_client,
                 "--postgres-url", clean_store, "--trigger", "1 second",
                 # the spool's event times are from 2023: retention must not delete them
                 "--retain-log", "36500d", "--retain-results", "36500d"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        # W = slow's 6 s - 1 s: [0, 2) and [2, 4) final, [4, 6) and later still pending.
        _wait_for_store(daemon, clean_store, spool.expected(config))
        for beat in range(7, 22):
            spool.segment("slow", beat, {"c.req": 10, "t.lat": 100 + beat})
        spool.segment("slow", 25, {}, closed=True)
        spool.segment("fast", 25, {}, closed=True)
        expected = spool.expected(config)
        _wait_for_store(daemon, clean_store, expected)
        assert len(expected) == 2 * 11 and all(row["is_final"] for row in expected.values())
        assert daemon.stop() == 0, daemon.log_tail()
    finally:
        daemon.cleanup(root)


def _wait_for_store(
    daemon: Daemon, url: str, expected: dict[tuple[Any, ...], dict[str, Any]]
) -> None:
    deadline = time.monotonic() + 180
    stored: dict[tuple[Any, ...], dict[str, Any]] = {}
    while time.monotonic() < deadline:
        assert daemon.process is not None and daemon.process.poll() is None, daemon.log_tail()
        columns, rows = run_sql(url, STORED_SQL, ["cluster_lagging"])
        stored = keyed([dict(zip(columns, row, strict=True)) for row in rows])
        if stored == expected:
            return
        time.sleep(1)
    assert stored == expected, daemon.log_tail()
