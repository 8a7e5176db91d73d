"""`streamgauge run --master spark://…` on a standalone cluster: a master and two workers on
127.0.0.1 (1 core, 1 GiB each), started from the pyspark wheel.

The daemon's Python workers (on the executors, and the driver's own planning workers) run an
interpreter that cannot import streamgauge from site-packages (``python -S`` with only the
third-party packages on its path), so the run only works if the daemon ships its own code
(``session.package_zip``). The store must then hold exactly what the reference windower
computes from the durable log, as for a ``local[*]`` run.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow
import pytest

from tests.e2e.harness import (
    PacedSender,
    daemon_for,
    load,
    reference_rows,
    stored_rows,
    wait_until,
)
from tests.reliability.cluster import cluster_env, standalone_cluster

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


@pytest.mark.timeout(300)
def test_run_on_a_standalone_cluster_equals_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with standalone_cluster() as cluster, daemon_for(
        CONFIG, "cluster", "--master", cluster.url, "--trigger", "1 second"
    ) as daemon:
        env = cluster_env()
        env["PYSPARK_PYTHON"] = str(_interpreter_without_streamgauge(cluster.root))
        for name in ("SPARK_HOME", "SPARK_LOCAL_IP", "PYSPARK_PYTHON"):
            monkeypatch.setenv(name, env[name])
        monkeypatch.delenv("PYTHONPATH", raising=False)
        monkeypatch.chdir(cluster.root)  # not the repository: its ./streamgauge would be importable
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
