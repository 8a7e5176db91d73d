"""``client_completeness``, the health dashboard's completeness panel and a completeness alert,
run on the real store after ``ResultStore.commit_batch`` wrote the clients' window rows.

Config ``fleet``, window ``clients_1m`` (group_by source, client, reason), ``T`` = 2024-01-01:

    window        udp://10.0.0.1:5000 (py, telemetry)          udp://10.0.0.2:6000 (plain)
    [T, T+1m)     sent 100, arrived 80; packets 101 / 81;       datagrams 50, lines 50
                  client drops queue 3; first report left out
    [T+1m, T+2m)  sent 50, arrived 50; packets 51 / 51          datagrams 40, lines 40, 2 rejected
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from streamgauge.configs import PipelineConfig, parse_config
from streamgauge.grafana import dashboards, queries
from streamgauge.sinks.store import RESULT_SCHEMA, ResultStore, RetryPolicy, run_sql
from tests.grafana.grafana_macros import expand

T_MS = 1_704_067_200_000
T = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
PY = {"source": "udp://10.0.0.1:5000", "client": "py"}
PLAIN = {"source": "udp://10.0.0.2:6000"}
CONFIG = """
name: fleet
windows:
  - {name: clients_1m, kind: tumbling, size: 1m, metrics: ["streamgauge.ingest.client.*"],
     group_by: [source, client, reason]}
alerts:
  - {name: client_completeness_low, window: clients_1m, aggregate: completeness,
     metric: streamgauge.ingest.client.metrics_received, condition: "< 0.99", for: 2m}
"""
#: (window minute, tags, counter, value)
ROWS = [
    (0, PY, "datagrams", 82), (0, PY, "lines", 92), (0, PY, "reports", 1),
    (0, PY, "reports_unaligned", 1), (0, PY, "metrics_sent", 100), (0, PY, "metrics_received", 80),
    (0, PY, "packets_sent", 101), (0, PY, "packets_received", 81),
    (0, {**PY, "reason": "queue"}, "packets_dropped", 3),
    (1, PY, "datagrams", 51), (1, PY, "lines", 61), (1, PY, "reports", 1),
    (1, PY, "metrics_sent", 50), (1, PY, "metrics_received", 50),
    (1, PY, "packets_sent", 51), (1, PY, "packets_received", 51),
    (0, PLAIN, "datagrams", 50), (0, PLAIN, "lines", 50),
    (1, PLAIN, "datagrams", 40), (1, PLAIN, "lines", 40),
    (1, {**PLAIN, "reason": "invalid_value"}, "rejected", 2),
]  # fmt: skip


def _row(minute: int, tags: dict[str, str], counter: str, value: float) -> dict[str, Any]:
    row: dict[str, Any] = {name: None for name in RESULT_SCHEMA.names}
    row.update(
        config_name="fleet", window_name="clients_1m",
        metric=f"streamgauge.ingest.client.{counter}",
        tags=json.dumps(tags, sort_keys=True), metric_type="c",
        window_start_ms=T_MS + minute * 60_000, window_end_ms=T_MS + (minute + 1) * 60_000,
        revision=1, is_final=False, late_events=0, emitted_at_ms=T_MS + (minute + 1) * 60_000,
        count=1, sum=float(value),
    )  # fmt: skip
    return row


TRUNCATE = "TRUNCATE window_rows, window_sketches, window_pending, sink_batches, pipeline_state"


@pytest.fixture(scope="module")
def config() -> PipelineConfig:
    return parse_config(CONFIG, "fleet.yaml")


@pytest.fixture(scope="module")
def store_url(postgres_url: str) -> Iterator[str]:
    with ResultStore(postgres_url, retry=RetryPolicy(max_attempts=3)) as store:
        store.ensure_schema()
    run_sql(postgres_url, TRUNCATE)
    table = pa.Table.from_pylist([_row(*r) for r in ROWS], schema=RESULT_SCHEMA)
    with ResultStore(postgres_url, retry=RetryPolicy(max_attempts=3)) as store:
        store.commit_batch("fleet/clients_1m", 1, table, [], revision=1)
    yield postgres_url
    run_sql(postgres_url, TRUNCATE)


def _run(url: str, sql: str) -> list[tuple[Any, ...]]:
    text = expand(sql, time_from=T, time_to=T + dt.timedelta(minutes=2), interval_ms=60_000,
                  variables={"window": "clients_1m"})  # fmt: skip
    return [tuple(float(v) if isinstance(v, int | float | decimal.Decimal)
                  and not isinstance(v, bool) else v
                  for v in row) for row in run_sql(url, text)[1]]  # fmt: skip


def test_one_row_per_client_and_window_unknown_without_telemetry(store_url: str) -> None:
    _, rows = run_sql(store_url, """
        SELECT extract(epoch FROM window_start - '2024-01-01'::timestamptz)::int / 60, source,
               client, datagrams, lines, rejected, reports, reports_unaligned, metrics_sent,
               metrics_received, client_dropped_queue, completeness, packet_completeness
        FROM client_completeness ORDER BY 1, 2""")  # fmt: skip
    assert [tuple(r) for r in rows] == [
        (0, "udp://10.0.0.1:5000", "py", 82, 92, None, 1, 1, 100.0, 80.0, 3.0, 0.8, 81 / 101),
        (0, "udp://10.0.0.2:6000", None, 50, 50, None, 0, 0, None, None, None, None, None),
        (1, "udp://10.0.0.1:5000", "py", 51, 61, None, 1, 0, 50.0, 50.0, None, 1.0, 1.0),
        (1, "udp://10.0.0.2:6000", None, 40, 40, 2, 0, 0, None, None, None, None, None),
    ]


def test_panel_shows_clients_with_telemetry_only(store_url: str, config: PipelineConfig) -> None:
    board = dashboards.health_dashboard(config, "ds")
    panel = next(p for p in board["panels"] if p["title"].startswith("Client completeness"))
    assert panel["targets"][0]["rawSql"] == queries.client_completeness_sql(config)
    t = T.timestamp()  # $__timeGroupAlias: epoch seconds
    assert _run(store_url, queries.client_completeness_sql(config)) == [
        (t, "udp://10.0.0.1:5000 (py)", 0.8),
        (t + 60, "udp://10.0.0.1:5000 (py)", 1.0),
    ]


def test_alert_reads_each_clients_completeness(store_url: str, config: PipelineConfig) -> None:
    (alert,) = config.alerts
    assert _run(store_url, queries.alert_sql(config, alert)) == [
        (T + dt.timedelta(minutes=1), "udp://10.0.0.1:5000", "py", 0.8),
        (T + dt.timedelta(minutes=2), "udp://10.0.0.1:5000", "py", 1.0),
    ]
