"""Every panel, stat, annotation and alert query on a real pipeline run, against numbers
computed from what was sent, not from what the store holds.

DogStatsD lines with ``|T`` client timestamps fix each sample's event time, so the expected
value of every window and every dashboard bucket follows from the lines alone. The run covers
ten minutes of event time (60 windows of 10 s, two hosts), sent in a few seconds to two
receivers (``--receivers 2``, one UDP port shared with SO_REUSEPORT):

    event time   S ............................................ S + 10 min      now - 1 min
    windows      [S, S+10) [S+10, S+20) ...  (per host: 5 counter lines, 20 timer values,
                                              15 set members; host a also 3 gauge values)
    per_10s      allowed_lateness 20m: every window is a straggler within the lateness,
                 stored provisional; three counter windows get one more line afterwards and
                 are corrected once (the annotation).
    strict_10s   allowed_lateness 0s: every sample is late and lands in ``late_events``.

``|T`` stamps whole seconds, the receivers accept them within ``--max-skew 900``. Each
(series, window) is one datagram, so a window reaches the log in one segment and is written
once before its correction. Percentile panels are checked exactly against the HDR quantiles
of the values sent (and within the layout's 1 % of the exact quantiles over the whole
10-minute range and both hosts); t-digest columns against their rank bounds; distinct counts
(the windows' HyperLogLog registers merged in SQL per bucket and over the whole range and both
hosts) within the sketch's 2-sigma bound of the exact count.
"""

from __future__ import annotations

import datetime as dt
import math
import random
import socket
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import numpy as np
import pytest

from streamgauge.configs import PipelineConfig, parse_config
from streamgauge.grafana import alerts, dashboards, queries
from streamgauge.ingest.log import list_receivers, list_segments, read_segment
from streamgauge.sinks.store import run_sql
from streamgauge.sketches.hdr import HdrLayout
from tests.e2e.harness import Daemon, daemon_for, wait_until
from tests.grafana.grafana_macros import expand

CONFIG = """
name: boards
pane: 1s
windows:
  - {name: per_10s, kind: tumbling, size: 10s, watermark_delay: 1s, allowed_lateness: 20m,
     group_by: [host, reason]}
  - {name: strict_10s, kind: tumbling, size: 10s, watermark_delay: 1s, allowed_lateness: 0s,
     metrics: ["api.*", "queue.*"]}
alerts:
  - {name: latency_p99_high, window: per_10s, metric: api.latency, aggregate: p99,
     condition: "> 100", for: 1m}
  - {name: requests_rate_low, window: per_10s, metric: api.requests, aggregate: rate,
     condition: "< 1", for: 1m}
  - {name: users_many, window: per_10s, metric: api.users, aggregate: distinct_count,
     condition: "> 100", for: 1m}
  - {name: depth_high, window: per_10s, metric: queue.depth, aggregate: last,
     condition: "> 50", for: 1m}
"""
WINDOWS = 60  # ten minutes of 10-second windows
WINDOW_S = 10
BUCKET_S = 60  # the dashboard's $__interval: six windows per point
HOSTS = ("a", "b")
CORRECTED = (5, 17, 40)  # counter windows of host a that get one more line afterwards
CORRECTION = 100
#: One datagram of rejects: reason -> lines.
REJECTS = {
    "malformed_line": ["garbage-one", "garbage-two", "garbage-three"],
    "unknown_type": ["api.bad:1|zz", "api.bad:2|zz"],
    "nan_value": ["api.nan:nan|g"],
}
QS = dict(queries.HISTOGRAM_QUANTILES)
HLL_BOUND = 0.03183  # DataSketches' 2-sigma relative error at lgK 12 (the default)


@dataclass
class Sent:
    """What the test sent: (metric, host, window index) -> [(event second, value or member)]."""

    start_s: int
    samples: dict[tuple[str, str, int], list[tuple[int, Any]]] = field(default_factory=dict)
    datagrams: int = 0
    lines: int = 0

    def values(self, metric: str, host: str, windows: range | list[int]) -> list[Any]:
        return [v for k in windows for _, v in self.samples.get((metric, host, k), [])]

    def hosts(self, metric: str) -> tuple[str, ...]:
        return ("a",) if metric == "queue.depth" else HOSTS

    def window_start(self, k: int) -> int:
        return self.start_s + WINDOW_S * k

    def bucket_windows(self, bucket: int) -> range:
        per = BUCKET_S // WINDOW_S
        return range(bucket * per, (bucket + 1) * per)


def _workload(start_s: int) -> tuple[Sent, list[str]]:
    rng = random.Random(20261122)
    pool = [f"user-{i}" for i in range(300)]
    sent = Sent(start_s)
    datagrams = []

    def add(metric: str, host: str, k: int, kind: str, points: list[tuple[int, Any]]) -> None:
        sent.samples[(metric, host, k)] = points
        datagrams.append(
            "\n".join(f"{metric}:{v}|{kind}|#host:{host}|T{t}" for t, v in points)
        )

    for k in range(WINDOWS):
        t0 = sent.window_start(k)
        for host in HOSTS:
            add("api.requests", host, k, "c",
                [(t0 + rng.randrange(WINDOW_S), rng.randint(1, 20)) for _ in range(5)])
            add("api.latency", host, k, "ms",
                [(t0 + rng.randrange(WINDOW_S), round(rng.lognormvariate(3.0, 0.8), 3))
                 for _ in range(20)])
            add("api.users", host, k, "s",
                [(t0 + rng.randrange(WINDOW_S), pool[rng.randrange(len(pool))])
                 for _ in range(15)])  # fmt: skip
        add("queue.depth", "a", k, "g",  # distinct seconds, not in time order
            [(t0 + s, rng.randint(0, 100)) for s in rng.sample(range(WINDOW_S), 3)])
    datagrams.append("\n".join(line for lines in REJECTS.values() for line in lines))
    return sent, datagrams


def _send(port: int, datagrams: list[str], sent: Sent) -> None:
    """From eight source ports in turn: SO_REUSEPORT hashes them over both receivers."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(8)]
    try:
        for i, datagram in enumerate(datagrams):
            sockets[i % len(sockets)].sendto(datagram.encode(), ("127.0.0.1", port))
            sent.datagrams += 1
            sent.lines += datagram.count("\n") + 1
            if i % 20 == 19:
                time.sleep(0.005)
    finally:
        for sock in sockets:
            sock.close()


def _receivers_with(prefix: str, spool: Path) -> list[str]:
    """The receiver streams of the log holding partials of metrics named ``prefix...``."""
    return sorted(
        receiver for receiver in list_receivers(spool)
        if any(name.startswith(prefix) for info in list_segments(spool, receiver)
               for batch in read_segment(info)
               for name in batch.column("metric").to_pylist())
    )  # fmt: skip


@dataclass
class Board:
    """Runs generated SQL on the daemon's store the way Grafana would."""

    daemon: Daemon
    config: PipelineConfig
    checked: set[str] = field(default_factory=set)

    def run(self, sql: str, *, start: float, end: float, interval_s: int, window: str = "per_10s",
            metric: str = "") -> list[tuple[Any, ...]]:  # fmt: skip
        self.checked.add(sql)
        text = expand(
            sql,
            time_from=dt.datetime.fromtimestamp(start, dt.UTC),
            time_to=dt.datetime.fromtimestamp(end, dt.UTC),
            interval_ms=interval_s * 1000,
            variables={"window": window, "metric": metric},
        )
        return [tuple(_plain(v) for v in row)
                for row in run_sql(self.daemon.info["postgres_url"], text)[1]]  # fmt: skip


def _plain(value: Any) -> Any:
    if isinstance(value, bool | str | dt.datetime) or value is None:
        return value
    return float(value)


def _series(metric: str, host: str) -> str:
    return f'{metric} {{"host": "{host}"}}'


def _hdr(layout: HdrLayout, values: list[float], q: float) -> float:
    histogram = layout.histogram(np.array(values, dtype=np.float64))
    return layout.quantile(histogram.indices, histogram.counts, q)


def _rank_bounds(values: list[float], q: float) -> tuple[float, float]:
    """The values a t-digest quantile may take: ranks within q ± (0.001 + 1/n), the test's
    tolerance for one small window (t-digest keeps up to ``k`` values as they are)."""
    ordered = sorted(values)
    n = len(ordered)
    tolerance = 0.001 + 1 / n
    lo = max(0, math.floor((q - tolerance) * n) - 1)
    hi = min(n - 1, math.ceil((q + tolerance) * n))
    return ordered[lo], ordered[hi]


@pytest.fixture(scope="module")
def run_data() -> Iterator[tuple[Daemon, Sent, float]]:
    with daemon_for(CONFIG, "boards", "--max-skew", "900", "--receivers", "2") as daemon:
        daemon.start()
        start_s = math.ceil((time.time() - 720) / BUCKET_S) * BUCKET_S
        sent, datagrams = _workload(start_s)
        sending_started = time.time()
        _send(daemon.port, datagrams, sent)
        totals = {m: sum(len(p) for (mm, _, _), p in sent.samples.items() if mm == m)
                  for m in ("api.requests", "api.latency", "api.users", "queue.depth")}  # fmt: skip
        for metric, total in totals.items():
            wait_until(
                daemon,
                f"select coalesce(sum(count), 0) = {total} as ok from window_results "
                f"where window_name = 'per_10s' and metric = '{metric}'",
                timeout_s=240,
            )
        # Now the corrections: one more counter line in three windows already written once.
        corrections = []
        for k in CORRECTED:
            t = sent.window_start(k) + 3
            sent.samples[("api.requests", "a", k)].append((t, CORRECTION))
            corrections.append(f"api.requests:{CORRECTION}|c|#host:a|T{t}")
        _send(daemon.port, corrections, sent)
        wait_until(
            daemon,
            "select coalesce(sum(count), 0) = "
            f"{totals['api.requests'] + len(CORRECTED)} as ok from window_results "
            "where window_name = 'per_10s' and metric = 'api.requests'",
        )
        samples = sum(totals.values()) + len(CORRECTED)
        wait_until(
            daemon,
            f"select coalesce(sum(count), 0) = {samples} as ok from late_events "
            "where window_name = 'strict_10s'",
        )
        wait_until(  # the receivers' own counters of the sending, through the same pipeline
            daemon,
            f"select coalesce(sum(sum), 0) = {sent.datagrams} as ok from window_results "
            "where window_name = 'per_10s' and metric = 'streamgauge.ingest.datagrams'",
        )
        assert _receivers_with("api.", daemon.data_dir / "spool") == ["udp-0", "udp-1"]
        yield daemon, sent, sending_started


@pytest.fixture(scope="module")
def board(run_data: tuple[Daemon, Sent, float]) -> Board:
    return Board(run_data[0], parse_config(CONFIG, "boards"))


class _TimeRange(TypedDict):
    """``Board.run``'s time range, passed as keyword arguments."""

    start: float
    end: float
    interval_s: int


def _data_range(sent: Sent) -> dict[str, Any]:
    return {"start": sent.start_s, "end": sent.start_s + WINDOWS * WINDOW_S - 1,
            "interval_s": BUCKET_S}  # fmt: skip


def _expected_aggregate(sent: Sent, metric: str, aggregate: str) -> dict[tuple[float, str], Any]:
    """Per (bucket time, series): the panel's value from the samples sent, or a (lo, hi) range
    for t-digest percentiles (the largest window percentile of the bucket)."""
    out: dict[tuple[float, str], Any] = {}
    for b in range(WINDOWS * WINDOW_S // BUCKET_S):
        t = float(sent.start_s + b * BUCKET_S)
        windows = sent.bucket_windows(b)
        for host in sent.hosts(metric):
            values = sent.values(metric, host, windows)
            key = (t, _series(metric, host))
            if aggregate == "count":
                out[key] = float(len(values))
            elif aggregate in ("sum", "rate"):
                total = float(sum(values))
                out[key] = total / BUCKET_S if aggregate == "rate" else total
            elif aggregate in ("min", "max"):
                out[key] = float(min(values) if aggregate == "min" else max(values))
            elif aggregate == "last":
                latest = sent.samples[(metric, host, windows[-1])]
                out[key] = float(max(latest)[1])  # the value of the latest event second
            elif aggregate == "distinct_count":  # the windows' HLL registers merged in SQL
                exact = len(set(values))
                out[key] = (exact * (1 - HLL_BOUND), exact * (1 + HLL_BOUND))
            else:
                bounds = [_rank_bounds(sent.values(metric, host, [k]), QS[aggregate])
                          for k in windows]  # fmt: skip
                out[key] = (max(lo for lo, _ in bounds), max(hi for _, hi in bounds))
    return out


#: The aggregates each metric's type gives a meaning to (the others run, see test_every_...).
APPLICABLE = {
    "api.requests": ("count", "sum", "rate"),  # a counter keeps no min/max (NULL)
    "api.latency": ("count", "sum", "rate", "min", "max", "p50", "p90", "p99", "p999"),
    "api.users": ("count", "distinct_count"),  # per bucket: six windows' registers merged
    "queue.depth": ("last", "min", "max"),
}


def test_aggregate_panels_equal_what_was_sent(
    run_data: tuple[Daemon, Sent, float], board: Board
) -> None:
    _, sent, _ = run_data
    for metric, aggregates in APPLICABLE.items():
        for aggregate in aggregates:
            expected = _expected_aggregate(sent, metric, aggregate)
            for provisional in (False, True):  # every window is provisional (lateness 20m)
                sql = queries.aggregate_sql(board.config, aggregate, provisional=provisional)  # type: ignore[arg-type]
                rows = board.run(sql, metric=metric, **_data_range(sent))
                suffix = " (provisional)" if provisional else ""
                got = {(t, name.removesuffix(suffix)): v for t, name, v in rows}
                assert got.keys() == expected.keys(), (metric, aggregate, provisional)
                for key, want in expected.items():
                    if isinstance(want, tuple):
                        assert want[0] <= got[key] <= want[1], (metric, aggregate, key)
                    else:
                        assert got[key] == pytest.approx(want, rel=1e-12), (metric, aggregate, key)


def test_stat_panels_and_the_metric_variable(
    run_data: tuple[Daemon, Sent, float], board: Board
) -> None:
    _, sent, _ = run_data
    for metric in APPLICABLE:
        [(samples,)] = board.run(queries.stat_samples_sql(board.config), metric=metric,
                                 **_data_range(sent))  # fmt: skip
        assert samples == sum(len(sent.values(metric, h, range(WINDOWS))) for h in HOSTS)
        [(final, provisional, early)] = board.run(
            queries.stat_windows_sql(board.config), metric=metric, **_data_range(sent)
        )
        assert (final, provisional, early) == (0, WINDOWS * len(sent.hosts(metric)), 0)
    # Distinct users over the ten minutes and both hosts: 120 windows' registers merged in SQL.
    [(distinct,)] = board.run(queries.stat_distinct_sql(board.config), metric="api.users",
                              **_data_range(sent))  # fmt: skip
    exact = len({u for h in HOSTS for u in sent.values("api.users", h, range(WINDOWS))})
    assert abs(distinct - exact) <= HLL_BOUND * exact

    # The metric list holds the metrics with a window ending in the dashboard's range: the
    # data's ten minutes (|T-stamped, twelve minutes back) have ours only; a range up to now
    # has the daemon's own metrics too (stamped when they were counted).
    names = [name for (name,) in board.run(queries.metric_variable_sql(board.config),
                                           **_data_range(sent))]  # fmt: skip
    assert names == sorted(APPLICABLE)
    until_now = {**_data_range(sent), "end": math.ceil(time.time()) + 60}
    names = [name for (name,) in board.run(queries.metric_variable_sql(board.config),
                                           **until_now)]  # fmt: skip
    ours = [n for n in names if not n.startswith(queries.SELF_METRIC_PREFIX)]
    assert ours == sorted(APPLICABLE) and "streamgauge.ingest.datagrams" in names


def test_corrections_annotation_marks_exactly_the_corrected_windows(
    run_data: tuple[Daemon, Sent, float], board: Board
) -> None:
    _, sent, _ = run_data
    rows = board.run(queries.corrections_annotation_sql(board.config), metric="api.requests",
                     **_data_range(sent))  # fmt: skip
    assert [(r[0].timestamp(), r[1].timestamp()) for r in rows] == [
        (sent.window_start(k), sent.window_start(k) + WINDOW_S) for k in CORRECTED
    ]
    for (_, _, text, tags), k in zip(rows, CORRECTED, strict=True):
        count = len(sent.samples[("api.requests", "a", k)])
        assert text.startswith(f"{_series('api.requests', 'a')}: corrected 1x, revision ")
        assert text.endswith(f", count {count}") and tags == "correction"
    panel = board.run(queries.corrections_sql(board.config), **_data_range(sent))
    per_bucket = {t: (c, p) for t, c, p in panel}
    series = sum(len(sent.hosts(m)) for m in APPLICABLE)
    for b in range(WINDOWS * WINDOW_S // BUCKET_S):
        windows = sent.bucket_windows(b)
        corrected = sum(1 for k in CORRECTED if k in windows)
        assert per_bucket[sent.start_s + b * BUCKET_S] == (corrected, len(windows) * series)


def test_histogram_panels_equal_the_hdr_histogram_of_what_was_sent(
    run_data: tuple[Daemon, Sent, float], board: Board
) -> None:
    _, sent, _ = run_data
    layout = HdrLayout.from_params(board.config.sketches)
    buckets = range(WINDOWS * WINDOW_S // BUCKET_S)
    for provisional in (False, True):
        rows = board.run(queries.histogram_percentiles_sql(board.config, provisional=provisional),
                         metric="api.latency", **_data_range(sent))  # fmt: skip
        suffix = " (provisional)" if provisional else ""
        assert rows == sorted(
            (float(sent.start_s + b * BUCKET_S), f"{label} {_series('api.latency', h)}{suffix}",
             _hdr(layout, sent.values("api.latency", h, sent.bucket_windows(b)), q))
            for b in buckets for h in HOSTS for label, q in QS.items()
        )  # fmt: skip

    # Over the whole ten minutes and both hosts: the exact HDR quantiles, within 1 % of exact.
    everything = [v for h in HOSTS for v in sent.values("api.latency", h, range(WINDOWS))]
    [row] = board.run(queries.histogram_range_percentiles_sql(board.config),
                      metric="api.latency", **_data_range(sent))  # fmt: skip
    assert list(row) == [_hdr(layout, everything, q) for q in QS.values()]
    ordered = np.sort(np.array(everything))
    for value, q in zip(row, QS.values(), strict=True):
        exact = float(np.quantile(ordered, q, method="inverted_cdf"))
        assert abs(value - exact) <= layout.relative_error * exact

    cells: dict[tuple[float, float], float] = defaultdict(float)
    for b in buckets:
        windows = sent.bucket_windows(b)
        values = np.array([v for h in HOSTS for v in sent.values("api.latency", h, windows)])
        _, uppers = layout.bounds(layout.bucket_indices(values))
        for upper in uppers:
            row_edge = 2 ** (math.ceil(math.log(upper) / math.log(2) * 8 - 1e-9) / 8)
            cells[(float(sent.start_s + b * BUCKET_S), round(row_edge, 9))] += 1
    rows = board.run(queries.heatmap_sql(board.config), metric="api.latency", **_data_range(sent))
    assert {(t, round(float(edge), 9)): n for t, edge, n in rows} == dict(cells)


def test_alert_queries_return_each_windows_value(
    run_data: tuple[Daemon, Sent, float], board: Board
) -> None:
    _, sent, _ = run_data
    layout = HdrLayout.from_params(board.config.sketches)
    rules = {r["title"]: r for g in alerts.rule_groups(board.config, "ds") for r in g["rules"]}
    expected_value: dict[str, tuple[str, Callable[[list[Any]], float] | None]] = {
        "latency_p99_high": ("api.latency", lambda v: _hdr(layout, v, 0.99)),
        "requests_rate_low": ("api.requests", lambda v: sum(v) / WINDOW_S),
        "users_many": ("api.users", lambda v: float(len(set(v)))),
        "depth_high": ("queue.depth", None),
    }
    span = _data_range(sent) | {"end": sent.start_s + WINDOWS * WINDOW_S}
    for title, (metric, value_of) in expected_value.items():
        sql = rules[title]["data"][0]["model"]["rawSql"]
        rows = board.run(sql, **span)
        want = []
        for k in range(WINDOWS):
            for host in sent.hosts(metric):
                points = sent.samples[(metric, host, k)]
                value = float(max(points)[1]) if value_of is None else value_of(
                    [v for _, v in points])
                want.append((float(sent.window_start(k) + WINDOW_S), host, None, value))
        got = sorted(((r[0].timestamp(), *r[1:]) for r in rows), key=lambda r: (r[0], r[1]))
        assert [r[:3] for r in got] == [w[:3] for w in want], title
        assert [r[3] for r in got] == pytest.approx([w[3] for w in want], rel=1e-12), title


def test_health_panels_count_what_the_receivers_got(
    run_data: tuple[Daemon, Sent, float], board: Board
) -> None:
    daemon, sent, started = run_data
    live: _TimeRange = {"start": started - 20, "end": time.time() + 5, "interval_s": WINDOW_S}
    totals: dict[str, float] = defaultdict(float)
    for _, name, rate in board.run(queries.ingest_rate_sql(board.config), **live):
        totals[name] += rate * WINDOW_S  # one row per 10 s window: rate x 10 s = its count
    rejected = sum(len(lines) for lines in REJECTS.values())
    assert totals == pytest.approx(
        {"datagrams": sent.datagrams, "lines": sent.lines, "samples": sent.lines - rejected}
    )
    reasons: dict[str, float] = defaultdict(float)
    for _, reason, n in board.run(queries.rejects_sql(board.config), **live):
        reasons[reason] += n
    assert reasons == {reason: len(lines) for reason, lines in REJECTS.items()}
    drops = board.run(queries.kernel_drops_sql(board.config), **live)
    assert sum(n for _, _, n in drops) == 0
    assert board.run(queries.store_errors_sql(board.config), **live) == []
    # no window here keeps the source tag, so no client has a row (its numbers:
    # tests/e2e/test_client_completeness.py, tests/grafana/test_client_completeness_queries.py)
    assert board.run(queries.client_completeness_sql(board.config), **live) == []
    lags = board.run(queries.watermark_lag_sql(board.config), **live)
    assert [w for w, _, _ in lags] == ["per_10s", "strict_10s"]
    for _, lag, age in lags:  # behind by the 1 s delay plus a heartbeat or two, fresh
        assert 0.5 <= lag < 60 and 0 <= age < 60

    late = board.run(queries.late_events_sql(board.config), window="strict_10s",
                     **_data_range(sent))  # fmt: skip
    assert late == [
        (float(sent.start_s + b * BUCKET_S), "late events",
         float(sum(len(sent.values(m, h, sent.bucket_windows(b)))
                   for m in APPLICABLE for h in sent.hosts(m))))
        for b in range(WINDOWS * WINDOW_S // BUCKET_S)
    ]  # fmt: skip


def test_every_generated_query_was_checked(board: Board) -> None:
    """Runs last in this module: each rawSql of both dashboards and all rules has been run
    above with its expected numbers (by text, so a new panel fails here until it is)."""
    generated: set[str] = set()
    for make in (dashboards.results_dashboard, dashboards.health_dashboard):
        board_json = make(board.config, "ds")
        for panel in board_json["panels"]:
            generated |= {t["rawSql"] for t in panel.get("targets", [])}
        generated |= {a["target"]["rawSql"] for a in board_json["annotations"].get("list", [])
                      if "target" in a}  # fmt: skip
        generated |= {v["query"] for v in board_json["templating"]["list"] if v["type"] == "query"}
    for group in alerts.rule_groups(board.config, "ds"):
        generated |= {q["model"]["rawSql"] for r in group["rules"] for q in r["data"]
                      if "rawSql" in q["model"]}  # fmt: skip
    assert generated - board.checked == set()
