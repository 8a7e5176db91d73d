"""Sketches end to end with two receivers (`streamgauge run --receivers 2`, SO_REUSEPORT).

Four reference clients (four source ports, so the kernel spreads them over both receivers)
send the same latency distribution and overlapping set members. Every sample of the run falls
in one 1-minute window (sending waits for a minute with room left). Checked against the exact
answers from the values really sent:

- the 1-minute window: p99/p999 within the t-digest's rank error, distinct count of the
  overlapping members (unioned across receivers and panes) within the HLL bound;
- a range merged in SQL: the 10-second windows' histogram rows merged by
  ``streamgauge_hdr_quantiles`` equal the HDR quantiles of all values, and lie within the
  layout's 1 % of the exact quantiles; the dashboard's percentile panel query (Grafana macros
  expanded) returns the same numbers; the generated alert rules' queries return the window's
  HDR p99 and distinct count, and every panel query of both dashboards runs on these rows.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Iterator

import numpy as np
import pytest
import statsd

from streamgauge.configs import parse_config
from streamgauge.grafana import alerts, dashboards, queries
from streamgauge.sinks.store import run_sql
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.sketches.hdr import HdrLayout
from tests.e2e.harness import Daemon, daemon_for, wait_until
from tests.grafana.grafana_macros import expand

CONFIG = """
name: sketches2
pane: 1s
windows:
  - {name: per_1m, kind: tumbling, size: 1m, watermark_delay: 1s, allowed_lateness: 0s}
  - {name: per_10s, kind: tumbling, size: 10s, watermark_delay: 1s, allowed_lateness: 0s}
alerts:
  - {name: latency_p99_high, window: per_1m, metric: api.latency, aggregate: p99,
     condition: "> 1", for: 1m}
  - {name: users_many, window: per_1m, metric: api.users, aggregate: distinct_count,
     condition: "> 10", for: 1m}
"""
SEND_S = 8.0
MINUTE_S = 60


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with daemon_for(CONFIG, "sketches2", "--receivers", "2") as running:
        running.start()
        yield running


def _wait_for_room_in_the_minute(needed_s: float) -> None:
    left = MINUTE_S - time.time() % MINUTE_S
    if left < needed_s:
        time.sleep(left + 0.5)


def test_two_receivers_percentiles_and_distinct_counts(daemon: Daemon) -> None:
    clients = [statsd.StatsClient("127.0.0.1", daemon.port) for _ in range(4)]
    rng = random.Random(20261122)
    pool = [f"user-{i}" for i in range(2_000)]
    latencies: list[float] = []
    members: set[str] = set()
    _wait_for_room_in_the_minute(SEND_S + 8)
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < SEND_S:
        for client in clients:  # every client: the same distribution, overlapping members
            value = round(rng.lognormvariate(3.0, 0.8), 3)
            member = pool[rng.randrange(len(pool))]
            client.timing("api.latency", value)
            client.set("api.users", member)
            latencies.append(float(f"{value:0.6f}"))  # what the client writes on the wire
            members.add(member)
        i += 1
        if i % 50 == 0:
            time.sleep(0.01)
    sent = len(latencies)

    wait_until(
        daemon,
        "select coalesce(bool_and(is_final), false) and coalesce(sum(count), 0) = "
        f"{sent} as ok from window_results where config_name = 'sketches2' "
        "and window_name = 'per_1m' and metric = 'api.latency'",
        timeout_s=150,
    )
    status = daemon.cli("status", "--json", "--data-dir", str(daemon.data_dir))
    assert '"udp-0"' in status and '"udp-1"' in status

    [minute] = daemon.query(
        "select count, p99, p999, min, max from window_results where config_name = "
        "'sketches2' and window_name = 'per_1m' and metric = 'api.latency'"
    )
    ordered = np.sort(np.array(latencies))
    assert minute["count"] == sent
    assert (minute["min"], minute["max"]) == (ordered[0], ordered[-1])
    for column, q, rank_error in (("p99", 0.99, 0.001), ("p999", 0.999, 0.0002)):
        rank = np.searchsorted(ordered, minute[column], side="right") / sent
        assert abs(rank - q) <= rank_error + 1 / sent, (column, minute[column], rank)

    wait_until(
        daemon,
        "select coalesce(bool_and(is_final), false) as ok from window_results where "
        "config_name = 'sketches2' and window_name = 'per_1m' and metric = 'api.users'",
    )
    [users] = daemon.query(
        "select count, distinct_count from window_results where config_name = 'sketches2' "
        "and window_name = 'per_1m' and metric = 'api.users'"
    )
    assert users["count"] == sent
    assert abs(users["distinct_count"] - len(members)) <= 0.0319 * len(members)

    # A range merged in SQL: the 10-second windows' buckets add up to the whole histogram.
    wait_until(
        daemon,
        "select coalesce(sum(count), 0) = "
        f"{sent} and bool_and(is_final) as ok from window_results where "
        "config_name = 'sketches2' and window_name = 'per_10s' and metric = 'api.latency'",
    )
    qs = (0.5, 0.9, 0.99)
    [merged] = daemon.query(
        "select streamgauge_hdr_quantiles(array_agg((bucket, lower_bound, upper_bound, count)"
        f"::streamgauge_hdr_bin), array{list(qs)}::float8[]) as qs, count(distinct window_start)"
        " as windows from window_histograms where config_name = 'sketches2' "
        "and window_name = 'per_10s' and metric = 'api.latency'"
    )
    layout = HdrLayout.from_params(compile_accuracy())
    histogram = layout.histogram(ordered)
    assert merged["qs"] == [layout.quantile(histogram.indices, histogram.counts, q) for q in qs]
    for value, q in zip(merged["qs"], qs, strict=True):
        exact = float(np.quantile(ordered, q, method="inverted_cdf"))
        assert abs(value - exact) <= 0.01 * exact + 1e-3

    # The dashboard's own panel query (Grafana macros expanded) over the run's time range.
    config = parse_config(CONFIG, "sketches2")
    now = dt.datetime.now(dt.UTC)
    panel_sql = expand(
        queries.histogram_range_percentiles_sql(config),
        time_from=now - dt.timedelta(minutes=10),
        time_to=now,
        interval_ms=10_000,
        variables={"window": "per_10s", "metric": "api.latency"},
    )
    _, [panel] = run_sql(daemon.info["postgres_url"], panel_sql)
    labels = [label for label, _ in queries.HISTOGRAM_QUANTILES]
    assert [float(v) for v in panel] == [  # type: ignore[arg-type]
        layout.quantile(histogram.indices, histogram.counts, q)
        for q in dict(queries.HISTOGRAM_QUANTILES).values()
    ], labels

    def run_generated(sql: str, window: str, metric: str) -> list[tuple[object, ...]]:
        text = expand(sql, time_from=now - dt.timedelta(minutes=10), time_to=now,
                      interval_ms=10_000, variables={"window": window, "metric": metric})
        return run_sql(daemon.info["postgres_url"], text)[1]

    # The alert rules' queries on the pipeline's own rows: the p99 rule reads the 1-minute
    # window's histogram (its p99 is the HDR p99 of everything sent), the set rule its count.
    rules = {r["title"]: r for g in alerts.rule_groups(config, "ds") for r in g["rules"]}
    p99_rows = run_generated(rules["latency_p99_high"]["data"][0]["model"]["rawSql"], "", "")
    assert [row[-1] for row in p99_rows] == [
        layout.quantile(histogram.indices, histogram.counts, 0.99)
    ]
    users_rows = run_generated(rules["users_many"]["data"][0]["model"]["rawSql"], "", "")
    assert [row[-1] for row in users_rows] == [users["distinct_count"]]
    # And every other generated query runs on them too (both dashboards, every panel).
    for board in (dashboards.results_dashboard(config, "ds"),
                  dashboards.health_dashboard(config, "ds")):  # fmt: skip
        for panel_json in board["panels"]:
            for target in panel_json.get("targets", []):
                for window in ("per_1m", "per_10s"):
                    run_generated(target["rawSql"], window, "api.latency")
