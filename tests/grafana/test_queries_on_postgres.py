"""Every panel, variable, annotation and alert query, macros expanded as Grafana does, run on the
real store after ``ResultStore.commit_batch`` wrote the windows: the numbers, not just no error.

The data (config ``shop``, window ``per_10s`` = 10 s, lateness 5 s, ``T`` = 2024-01-01 00:00 UTC)::

    window      [T, T+10)          [T+10, T+20)              [T+20, T+30)
    host a      rev 1: n=2 sum 30  rev 1: n=3 sum 60, then   rev 2: n=1 sum 7
                p99 19 last 20     rev 2 (straggler): n=4    p99 7, distinct 42
                                   sum 160 p99 99 last 100   provisional
    host b      rev 1: n=1 sum 5   rev 1: n=1 sum 8
    self-metrics in [T, T+10): datagrams 100, lines 150, samples 140, rejected{reason} 4

Batch 2 carries watermark T+15 s: [T, T+10) is final (finalizing sets its rows' revision to
2), [T+10, T+20) and [T+20, T+30) are still provisional.

HDR buckets (in the window rows, built with ``HdrLayout`` as the window job writes them; read
through ``window_histograms``) hold the samples of each revision: host a ``[T, T+10)`` 10, 20;
``[T+10, T+20)`` 10, 20, 30, then 10, 20, 30, 100; host b 5 and 8. Host a's ``[T+20, T+30)``
has none, so an alert falls back to its p99 column.
"""

# ruff: noqa: E501  (tables of cases and rows read best one per line)

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hdrh.histogram import HdrHistogram

from streamgauge.clock import ManualClock
from streamgauge.configs import AGGREGATES, Aggregate, PipelineConfig
from streamgauge.grafana import alerts, dashboards, queries
from streamgauge.sinks.store import (
    RESULT_SCHEMA,
    Finalization,
    ResultStore,
    RetryPolicy,
    pack_hdr_buckets,
    run_sql,
)
from streamgauge.sketches.hdr import HdrLayout
from tests.grafana.grafana_macros import expand

T_MS = 1_704_067_200_000  # 2024-01-01T00:00:00Z
T = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
A = '{"host": "a"}'
B = '{"host": "b"}'


def _row(
    metric: str, tags: dict[str, str], start_s: int, revision: int, **values: Any
) -> dict[str, Any]:
    row: dict[str, Any] = {name: None for name in RESULT_SCHEMA.names}
    row.update(
        config_name="shop",
        window_name="per_10s",
        metric=metric,
        tags=json.dumps(tags, sort_keys=True),
        metric_type="ms",
        window_start_ms=T_MS + start_s * 1000,
        window_end_ms=T_MS + (start_s + 10) * 1000,
        revision=revision,
        is_final=False,
        late_events=0,
        emitted_at_ms=T_MS + (start_s + 11) * 1000,
    )
    row.update(values)
    return row


def _table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=RESULT_SCHEMA)


LAYOUT = HdrLayout(lowest=1, highest=3_600_000_000, significant_digits=2, value_scale=1000.0)
#: Raw samples of the latest revision of each api.latency window: (host, start second) -> values.
SAMPLES: dict[tuple[str, int], list[float]] = {
    ("a", 0): [10.0, 20.0],
    ("b", 0): [5.0],
    ("a", 10): [10.0, 20.0, 30.0, 100.0],
    ("b", 10): [8.0],
}


def _buckets(host: str, start_s: int, *, samples: int | None = None) -> dict[str, Any]:
    """A window row's HDR columns: the buckets of the first ``samples`` of its ``SAMPLES``."""
    hist = LAYOUT.histogram(SAMPLES[(host, start_s)][:samples])
    reference = HdrHistogram(LAYOUT.lowest, LAYOUT.highest, LAYOUT.significant_digits)
    return {
        "hdr_bucket_counts": pack_hdr_buckets(hist.indices, hist.counts).tolist(),
        "hdr_unit_magnitude": reference.unit_magnitude,
        "hdr_half_count_magnitude": reference.sub_bucket_half_count_magnitude,
        "hdr_value_scale": LAYOUT.value_scale,
    }  # fmt: skip


def hdr(values: list[float], q: float) -> float:
    """What the histogram of ``values`` reports for quantile ``q``."""
    return LAYOUT.quantile(LAYOUT.bucket_indices(values), np.ones(len(values), np.int64), q)


@pytest.fixture(scope="module")
def store_url(postgres_url: str) -> Iterator[str]:
    # Module-scoped data on the session server: the same TRUNCATE as ``clean_store``, then the
    # two micro-batches, written once for all the queries below.
    with ResultStore(postgres_url, retry=RetryPolicy(max_attempts=3)) as store:
        store.ensure_schema()
    run_sql(
        postgres_url, "TRUNCATE window_rows, window_sketches, window_pending, sink_batches, pipeline_state"
    )
    batch1 = [
        _row("api.latency", {"host": "a"}, 0, 1, count=2, sum=30.0, min=10.0, max=20.0, last=20.0, p99=19.0, **_buckets("a", 0)),
        _row("api.latency", {"host": "b"}, 0, 1, count=1, sum=5.0, min=5.0, max=5.0, last=5.0, **_buckets("b", 0)),
        _row("api.latency", {"host": "a"}, 10, 1, count=3, sum=60.0, min=10.0, max=30.0, last=30.0, p99=29.0, **_buckets("a", 10, samples=3)),
        _row("api.latency", {"host": "b"}, 10, 1, count=1, sum=8.0, min=8.0, max=8.0, last=8.0, **_buckets("b", 10)),
        _row("streamgauge.ingest.datagrams", {}, 0, 1, metric_type="c", count=10, sum=100.0),
        _row("streamgauge.ingest.lines", {}, 0, 1, metric_type="c", count=10, sum=150.0),
        _row("streamgauge.ingest.samples", {}, 0, 1, metric_type="c", count=10, sum=140.0),
        _row("streamgauge.ingest.rejected", {"reason": "invalid_value"}, 0, 1, metric_type="c", count=4, sum=4.0),
        _row("streamgauge.ingest.kernel_drops", {"listen": "udp://:8125"}, 0, 1, metric_type="c", count=1, sum=17.0),
    ]  # fmt: skip
    batch2 = [
        _row("api.latency", {"host": "a"}, 10, 2, count=4, sum=160.0, min=10.0, max=100.0, last=100.0, p99=99.0, **_buckets("a", 10)),
        _row("api.latency", {"host": "a"}, 20, 2, count=1, sum=7.0, min=7.0, max=7.0, last=7.0, p99=7.0, distinct_count=42.0),
    ]  # fmt: skip
    clock = ManualClock(T_MS + 12_000)
    with ResultStore(postgres_url, retry=RetryPolicy(max_attempts=3), clock=clock) as store:
        store.commit_batch("shop/per_10s", 1, _table(batch1), [], revision=1)
        clock.set(T_MS + 27_000)
        store.commit_batch(
            "shop/per_10s",
            2,
            _table(batch2),
            [Finalization("shop", "per_10s", T_MS + 15_000, 5_000)],
            revision=2,
            state={("shop", "watermark_ms:per_10s"): T_MS + 15_000},
        )
    run_sql(postgres_url, "TRUNCATE pipeline_metrics")
    errors = [  # seconds after T, labels, failed attempts
        (3, '{"config": "shop", "reason": "OperationalError"}', 2.0),
        (5, '{"config": "shop", "reason": "OperationalError"}', 1.0),
        (12, '{"config": "other", "reason": "OperationalError"}', 9.0),  # another config's
        (14, '{"reason": "AdminShutdown"}', 1.0),  # no config label: the daemon's, shown
    ]
    for second, labels, value in errors:
        run_sql(
            postgres_url,
            "INSERT INTO pipeline_metrics (ts, name, labels, value) VALUES (%s, %s, %s, %s)",
            (T + dt.timedelta(seconds=second), queries.STORE_ERRORS_METRIC, labels, value),
        )
    run_sql(postgres_url, "TRUNCATE late_events")
    late = [  # window start after T, samples: [T+40, T+50) has no result row at all
        (0, 3), (0, 2), (40, 5),
    ]  # fmt: skip
    for start, count in late:
        begin = T + dt.timedelta(seconds=start)
        run_sql(
            postgres_url,
            "INSERT INTO late_events (config_name, window_name, metric, window_start,"
            " window_end, metric_type, receiver, pane_start, count, sum, min, max, last,"
            " first_recv, last_recv, closed_by, query_name, batch_id, recorded_at)"
            " VALUES ('shop', 'per_10s', 'api.latency', %s, %s, 'ms', 'udp-0', %s, %s,"
            " 1, 1, 1, 1, %s, %s, %s, 'q', 1, %s)",
            (begin, begin + dt.timedelta(seconds=10), begin, count, *[begin] * 4),
        )
    yield postgres_url
    run_sql(
        postgres_url,
        "TRUNCATE window_rows, window_sketches, window_pending, sink_batches, pipeline_state,"
        " pipeline_metrics, late_events",
    )


def run(
    url: str,
    sql: str,
    *,
    seconds: tuple[int, int] = (0, 30),
    interval_ms: int = 10_000,
    window: str = "per_10s",
    metric: str = "api.latency",
) -> list[tuple[Any, ...]]:
    text = expand(
        sql,
        time_from=T + dt.timedelta(seconds=seconds[0]),
        time_to=T + dt.timedelta(seconds=seconds[1]),
        interval_ms=interval_ms,
        variables={"window": window, "metric": metric},
    )
    return [tuple(_plain(v) for v in row) for row in run_sql(url, text)[1]]


def _plain(value: Any) -> Any:
    """Numbers as floats (Decimal/int/float alike), so expectations read as written."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


E = T.timestamp()  # the epoch seconds of T, as $__timeGroupAlias returns time


def test_count_per_window(store_url: str, config: PipelineConfig) -> None:
    rows = run(store_url, queries.aggregate_sql(config, "count", provisional=False))
    assert rows == [
        (E, f"api.latency {A}", 2.0),
        (E, f"api.latency {B}", 1.0),
        (E + 10, f"api.latency {A}", 4.0),  # the corrected revision, not the first
        (E + 10, f"api.latency {B}", 1.0),
        (E + 20, f"api.latency {A}", 1.0),
    ]


def test_buckets_of_two_windows_combine_per_aggregate(
    store_url: str, config: PipelineConfig
) -> None:
    def a_at(aggregate: Aggregate, bucket: float) -> float | None:
        rows = run(
            store_url,
            queries.aggregate_sql(config, aggregate, provisional=False),
            interval_ms=20_000,
        )
        return {(t, s): v for t, s, v in rows}.get((bucket, f"api.latency {A}"))

    assert a_at("count", E) == 6.0  # 2 + 4
    assert a_at("sum", E) == 190.0
    assert a_at("min", E) == 10.0
    assert a_at("max", E) == 100.0
    assert a_at("last", E) == 100.0  # the later window's
    assert a_at("p99", E) == 99.0  # the largest window's: percentiles do not average
    assert a_at("rate", E) == 190.0 / 20  # total sum over total window seconds
    assert a_at("distinct_count", E + 20) == 42.0
    assert a_at("p50", E) is None  # NULL in this build: no point, not a zero


def test_provisional_query_keeps_only_buckets_with_a_non_final_window(
    store_url: str, config: PipelineConfig
) -> None:
    for aggregate in AGGREGATES:
        rows = run(store_url, queries.aggregate_sql(config, aggregate, provisional=True))
        assert [(t, s) for t, s, _ in rows] == [
            (E + 10, f"api.latency {A} (provisional)"),
            (E + 10, f"api.latency {B} (provisional)"),
            (E + 20, f"api.latency {A} (provisional)"),
        ]
    # A 20 s bucket holding the final [T, T+10) and the provisional [T+10, T+20) is provisional.
    rows = run(
        store_url, queries.aggregate_sql(config, "sum", provisional=True), interval_ms=20_000
    )
    assert rows == [
        (E, f"api.latency {A} (provisional)", 190.0),
        (E, f"api.latency {B} (provisional)", 13.0),
        (E + 20, f"api.latency {A} (provisional)", 7.0),
    ]


def test_time_filter_is_inclusive_and_on_window_start(
    store_url: str, config: PipelineConfig
) -> None:
    rows = run(
        store_url, queries.aggregate_sql(config, "count", provisional=False), seconds=(10, 20)
    )
    assert [t for t, _, _ in rows] == [E + 10, E + 10, E + 20]


def test_stats(store_url: str, config: PipelineConfig) -> None:
    assert run(store_url, queries.stat_samples_sql(config)) == [(9.0,)]
    assert run(store_url, queries.stat_windows_sql(config)) == [(2.0, 3.0, 0.0)]
    assert run(store_url, queries.stat_distinct_sql(config)) == [(42.0,)]
    assert run(store_url, queries.stat_samples_sql(config), window="per_1m") == [(0.0,)]


def test_metric_variable_lists_the_windows_metrics(store_url: str, config: PipelineConfig) -> None:
    assert run(store_url, queries.metric_variable_sql(config)) == [
        ("api.latency",),
        ("streamgauge.ingest.datagrams",),
        ("streamgauge.ingest.kernel_drops",),
        ("streamgauge.ingest.lines",),
        ("streamgauge.ingest.rejected",),
        ("streamgauge.ingest.samples",),
    ]
    assert run(store_url, queries.metric_variable_sql(config), window="per_1m") == []


def test_metric_variable_lists_only_metrics_with_windows_in_the_time_range(
    store_url: str, config: PipelineConfig
) -> None:
    """Only api.latency has a window ending in [T + 21 s, T + 30 s] ([20 s, 30 s)); nothing
    ends in [T + 40 s, T + 60 s]."""
    assert run(store_url, queries.metric_variable_sql(config), seconds=(21, 30)) == [
        ("api.latency",)
    ]
    assert run(store_url, queries.metric_variable_sql(config), seconds=(40, 60)) == []


def test_corrections_annotation_marks_the_corrected_window_even_once_final(
    store_url: str, config: PipelineConfig
) -> None:
    rows = run(store_url, queries.corrections_annotation_sql(config))
    assert len(rows) == 1
    time, timeend, text, tags = rows[0]
    assert (time, timeend, tags) == (
        T + dt.timedelta(seconds=10),
        T + dt.timedelta(seconds=20),
        "correction",
    )
    assert text == f"api.latency {A}: corrected 1x, revision 2, count 4"


def test_health_queries(store_url: str, config: PipelineConfig) -> None:
    assert run(store_url, queries.ingest_rate_sql(config)) == [
        (E, "datagrams", 10.0),
        (E, "lines", 15.0),
        (E, "samples", 14.0),
    ]
    assert run(store_url, queries.rejects_sql(config)) == [(E, "invalid_value", 4.0)]
    assert run(store_url, queries.kernel_drops_sql(config)) == [(E, "udp://:8125", 17.0)]
    assert run(store_url, queries.store_errors_sql(config)) == [
        (E, "OperationalError", 3.0),
        (E + 10, "AdminShutdown", 1.0),
    ]
    # Late samples per bucket of their window, from the late_events table: [T+40, T+50) has
    # no window_results row (every sample of it was late) and is counted all the same.
    assert run(store_url, queries.late_events_sql(config), seconds=(0, 50)) == [
        (E, "late events", 5.0),
        (E + 40, "late events", 5.0),
    ]
    assert run(store_url, queries.corrections_sql(config)) == [
        (E, 0.0, 0.0),
        (E + 10, 1.0, 2.0),
        (E + 20, 0.0, 1.0),
    ]
    ((window, lag, age),) = run(store_url, queries.watermark_lag_sql(config))
    assert (window, lag) == ("per_10s", 12.0)  # committed at T+27 s with watermark T+15 s
    assert age > 0  # now() is long after 2024


def _evaluate(
    rows: list[tuple[Any, ...]], reducer: str, op: str, threshold: float
) -> dict[tuple[Any, ...], tuple[float, bool]]:
    """Grafana's B (reduce, dropNN) and C (math ``$B op x``) per series of query A."""
    series: dict[tuple[Any, ...], list[float]] = {}
    for _time, *labels, value in rows:
        if value is not None:
            series.setdefault(tuple(labels), []).append(value)
    compare: Any = {">": float.__gt__, ">=": float.__ge__, "<": float.__lt__, "<=": float.__le__,
               "==": float.__eq__, "!=": float.__ne__}[op]  # fmt: skip
    pick: Any = {"max": max, "min": min, "last": lambda v: v[-1]}[reducer]
    return {labels: (pick(v), compare(float(pick(v)), threshold)) for labels, v in series.items()}


def test_alert_queries_see_the_corrected_window_until_it_is_final(
    store_url: str, config: PipelineConfig
) -> None:
    # Evaluate at the last moment [T+10, T+20) can still change, plus one interval: end 20 s +
    # delay 1 s + lateness 5 s + 10 s. The look-back must still reach its end.
    now = 36
    groups = {g["title"]: g for g in alerts.rule_groups(config, "ds")}
    rules = {r["title"]: r for g in groups.values() for r in g["rules"]}

    p99 = rules["api_p99_high"]
    query_a = p99["data"][0]
    lookback = query_a["relativeTimeRange"]["from"]
    assert lookback == 10 + 1 + 5 + 10
    rows = run(store_url, query_a["model"]["rawSql"], seconds=(now - lookback, now))
    # $__timeFilter is BETWEEN: both ends inclusive, so [T, T+10) ending at T+10 is in too.
    # p99 comes from the window's histogram where it has one (not the t-digest column's 19
    # and 99), else from the column (7.0: [T+20, T+30) has no bucket rows).
    corrected = hdr([10.0, 20.0, 30.0, 100.0], 0.99)
    assert rows == [
        (T + dt.timedelta(seconds=10), "a", hdr([10.0, 20.0], 0.99)),
        (T + dt.timedelta(seconds=20), "a", corrected),  # the corrected revision's
        (T + dt.timedelta(seconds=30), "a", 7.0),
    ]
    assert 100.0 <= corrected <= 100.0 * (1 + LAYOUT.relative_error)
    assert p99["data"][1]["model"]["reducer"] == "max"
    assert p99["data"][2]["model"]["expression"] == "$B > 50"
    assert _evaluate(rows, "max", ">", 50) == {("a",): (corrected, True)}

    rate = rules["api_rate_low"]
    rows = run(store_url, rate["data"][0]["model"]["rawSql"], seconds=(now - lookback, now))
    assert rate["data"][1]["model"]["reducer"] == "min"
    assert _evaluate(rows, "min", "<=", 1) == {("a",): (0.7, True), ("b",): (0.5, True)}

    # per_1m has no rows at all: query A is empty, the rule is OK (noDataState), not firing.
    rejecting = rules["rejecting"]
    assert rejecting["noDataState"] == "OK"
    rows = run(store_url, rejecting["data"][0]["model"]["rawSql"], seconds=(0, 3600))
    assert rows == []


def test_alert_queries_skip_early_rows(store_url: str, config: PipelineConfig) -> None:
    """An early row (early_every: the running value of a window the watermark has not passed)
    whose end already lies in the look-back is not evaluated: its count is partial."""
    rate = next(r for g in alerts.rule_groups(config, "ds") for r in g["rules"]
                if r["title"] == "api_rate_low")  # fmt: skip
    sql = rate["data"][0]["model"]["rawSql"]
    run_sql(
        store_url,
        "INSERT INTO window_results (config_name, window_name, metric, tags, window_start,"
        " window_end, metric_type, count, sum, revision, is_final, emitted_at, early_as_of)"
        " VALUES ('shop', 'per_10s', 'api.latency', '{\"host\": \"b\"}', %s, %s, 'ms', 1,"
        " 1.0, 3, false, now(), %s)",
        [T + dt.timedelta(seconds=20), T + dt.timedelta(seconds=30),
         T + dt.timedelta(seconds=28)],
    )  # fmt: skip
    try:
        rows = run(store_url, sql, seconds=(10, 36))
        early_window_end = T + dt.timedelta(seconds=30)
        assert (early_window_end, "b", 0.1) not in rows
        assert [r for r in rows if r[1] == "b"] == [
            (T + dt.timedelta(seconds=10), "b", 0.5),
            (T + dt.timedelta(seconds=20), "b", 0.8),
        ]
        assert (early_window_end, "b", 0.1) in run(
            store_url, sql.replace("AND early_as_of IS NULL", ""), seconds=(10, 36)
        )  # the filter is what keeps it out
    finally:
        run_sql(store_url, "DELETE FROM window_results WHERE early_as_of IS NOT NULL")


def test_every_generated_query_runs(store_url: str, config: PipelineConfig) -> None:
    """Nothing generated is left unexecuted: each rawSql of both dashboards and all rules."""
    boards = [dashboards.results_dashboard(config, "ds"), dashboards.health_dashboard(config, "ds")]
    sqls = []
    for board in boards:
        for panel in board["panels"]:
            sqls += [t["rawSql"] for t in panel.get("targets", [])]
        sqls += [
            a["target"]["rawSql"] for a in board["annotations"].get("list", []) if "target" in a
        ]
        sqls += [v["query"] for v in board["templating"]["list"] if v["type"] == "query"]
    for group in alerts.rule_groups(config, "ds"):
        sqls += [
            q["model"]["rawSql"]
            for r in group["rules"]
            for q in r["data"]
            if "rawSql" in q["model"]
        ]
    assert len(sqls) == 2 * 11 + 3 + 1 + 2 + 1 + 1 + 1 + 8 + 3  # 8 health panels
    for sql in sqls:
        run(store_url, sql)


# --- percentiles from histograms ------------------------------------------------------------

QS = (0.5, 0.9, 0.99, 0.999)
LABELS = ("p50", "p90", "p99", "p999")


def _expected_percentiles(
    buckets: dict[float, dict[str, list[float]]], suffix: str = ""
) -> list[tuple[Any, ...]]:
    out = []
    for t, by_host in buckets.items():
        for label, q in zip(LABELS, QS, strict=True):
            for host, values in by_host.items():
                series = f'{label} api.latency {{"host": "{host}"}}{suffix}'
                out.append((t, series, hdr(values, q)))
    return sorted(out)


def test_histogram_percentiles_per_tag_group_merge_the_windows_of_a_bucket(
    store_url: str, config: PipelineConfig
) -> None:
    sql = queries.histogram_percentiles_sql(config, provisional=False)
    assert run(store_url, sql) == _expected_percentiles(
        {
            E: {"a": SAMPLES[("a", 0)], "b": SAMPLES[("b", 0)]},
            E + 10: {"a": SAMPLES[("a", 10)], "b": SAMPLES[("b", 10)]},
        }
    )
    # 20 s buckets: one histogram of both windows per host, not the largest window's p99.
    merged_a = SAMPLES[("a", 0)] + SAMPLES[("a", 10)]
    rows = run(store_url, sql, interval_ms=20_000)
    assert rows == _expected_percentiles(
        {E: {"a": merged_a, "b": SAMPLES[("b", 0)] + SAMPLES[("b", 10)]}}
    )
    values = {series: v for _, series, v in rows}
    # nearest rank round(0.5 * 6) = 3 of [10, 10, 20, 20, 30, 100]: 20, within 1 %
    assert 20.0 <= values['p50 api.latency {"host": "a"}'] <= 20.0 * 1.01
    assert values['p50 api.latency {"host": "a"}'] == hdr(merged_a, 0.5)


def test_histogram_percentiles_provisional_buckets(store_url: str, config: PipelineConfig) -> None:
    sql = queries.histogram_percentiles_sql(config, provisional=True)
    # [T, T+10) is final; [T+10, T+20) is not; a 20 s bucket holding both is provisional.
    assert run(store_url, sql) == _expected_percentiles(
        {E + 10: {"a": SAMPLES[("a", 10)], "b": SAMPLES[("b", 10)]}}, " (provisional)"
    )
    assert [s for _, s, _ in run(store_url, sql, interval_ms=20_000)] == [
        f'{label} api.latency {{"host": "{h}"}} (provisional)' for label in LABELS for h in "ab"
    ]


def test_histogram_percentiles_over_the_range_and_all_hosts(
    store_url: str, config: PipelineConfig
) -> None:
    everything = [v for values in SAMPLES.values() for v in values]
    assert run(store_url, queries.histogram_range_percentiles_sql(config)) == [
        tuple(hdr(everything, q) for q in QS)
    ]
    # exact nearest-rank of the 8 raw samples, within the histogram's relative error
    ordered = sorted(everything)
    for q, got in zip(
        QS, run(store_url, queries.histogram_range_percentiles_sql(config))[0], strict=True
    ):
        exact = ordered[max(int(q * 100.0 * len(ordered) / 100 + 0.5), 1) - 1]
        assert abs(got - exact) <= exact * LAYOUT.relative_error
    # only [T+10, T+20): host a's corrected window and host b's
    second = SAMPLES[("a", 10)] + SAMPLES[("b", 10)]
    assert run(store_url, queries.histogram_range_percentiles_sql(config), seconds=(10, 19)) == [
        tuple(hdr(second, q) for q in QS)
    ]
    assert run(store_url, queries.histogram_range_percentiles_sql(config), window="per_1m") == [
        (None, None, None, None)
    ]


def _edge(value: float) -> float:
    """The heatmap row of a sample: the edge of its bucket's highest equivalent value."""
    index = int(LAYOUT.bucket_indices([value])[0])
    upper = (round(LAYOUT.bucket_upper(index) * LAYOUT.value_scale) - 1) / LAYOUT.value_scale
    n = queries.HEATMAP_ROWS_PER_OCTAVE
    return float(2 ** (np.ceil(np.log(upper) / np.log(2) * n - 1e-9) / n))


def test_heatmap_counts_samples_per_time_bucket_and_row(
    store_url: str, config: PipelineConfig
) -> None:
    rows = run(store_url, queries.heatmap_sql(config))
    expected: dict[tuple[float, float], float] = {}
    for (_, start_s), values in SAMPLES.items():
        for v in values:
            key = (E + start_s, _edge(v))
            expected[key] = expected.get(key, 0.0) + 1.0
    assert {(t, float(label)): n for t, label, n in rows} == pytest.approx(expected)
    assert len(rows) == len(expected)
    for values in SAMPLES.values():
        for v in values:
            assert v <= _edge(v) < v * 2 ** (1 / queries.HEATMAP_ROWS_PER_OCTAVE) * 1.01
