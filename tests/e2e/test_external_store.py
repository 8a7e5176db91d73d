"""`streamgauge run --postgres-url URL`: results go to an existing PostgreSQL, no embedded one."""

from __future__ import annotations

import time

import statsd

from streamgauge.sinks.embedded import EmbeddedPostgres
from tests.e2e.harness import Daemon, free_udp_port, scratch_dir

CONFIG = """
name: external
windows:
  - {name: per_2s, kind: tumbling, size: 2s, watermark_delay: 1s, allowed_lateness: 1s,
     metrics: ["ext.*"]}
"""


def test_run_writes_to_an_external_postgres_and_starts_none_of_its_own() -> None:
    root = scratch_dir("streamgauge-external-")
    external = EmbeddedPostgres(root / "external-server")  # stands in for "any PostgreSQL"
    (root / "external-server").mkdir()
    url = external.start()
    config = root / "external.yaml"
    config.write_text(CONFIG)
    daemon = Daemon(config, root / "data", free_udp_port(), root / "daemon.log",
                    extra_args=("--postgres-url", url))  # fmt: skip
    try:
        daemon.start()
        assert daemon.info["postgres_url"] == url
        client = statsd.StatsClient("127.0.0.1", daemon.port)
        for _ in range(5):
            client.incr("ext.hits")
        deadline = time.monotonic() + 60
        rows: list[dict[str, object]] = []
        while time.monotonic() < deadline and not rows:
            rows = daemon.query(
                "select sum(count)::bigint as n from window_results where metric = 'ext.hits' "
                "having sum(count) = 5"
            )
            time.sleep(0.5)
        assert rows == [{"n": 5}], daemon.log_tail()
        assert daemon.stop() == 0, daemon.log_tail()
        assert not (daemon.data_dir / "postgres").exists()  # no embedded server was created
        out = daemon.cli("query", "--postgres-url", url, "select count(*) from window_results")
        assert out.splitlines()[1] != "0"
    finally:
        external.stop()
        daemon.cleanup(root)
