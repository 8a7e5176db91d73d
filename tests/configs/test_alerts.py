"""The ``alerts:`` section: shape, every mistake at once with its path, and derived timing."""

# ruff: noqa: E501  (tables of cases and rows read best one per line)

from __future__ import annotations

import textwrap

import pytest
import yaml

from streamgauge.configs import (
    AlertSpec,
    ConfigError,
    evaluation_interval_ms,
    parse_condition,
    parse_config,
)

WINDOWS = """\
windows:
  - {name: per_10s, kind: tumbling, size: 10s, allowed_lateness: 5s, group_by: [host]}
  - {name: per_15s, kind: tumbling, size: 15s, metrics: ["api.*"]}
  - {name: hop, kind: hopping, size: 1m, hop: 30s}
  - {name: sessions, kind: session, gap: 30s, key: user}
"""


def config_with(alerts: str) -> str:
    return WINDOWS + "alerts:\n" + textwrap.indent(textwrap.dedent(alerts), "  ")


def issues_of(alerts: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        parse_config(config_with(alerts), "test.yaml")
    return [(issue.path, issue.message) for issue in caught.value.issues]


def test_the_issue_example_loads() -> None:
    config = parse_config(
        config_with(
            """\
            - name: api_p99_high
              window: per_10s
              metric: api.latency
              aggregate: p99
              condition: "> 250"
              for: 1m
              tags: {host: a}
              labels: {severity: page}
              annotations: {summary: "API p99 above 250 ms"}
            """
        ),
        "x.yaml",
    )
    assert config.alerts == (
        AlertSpec(
            name="api_p99_high",
            window="per_10s",
            metric="api.latency",
            aggregate="p99",
            op=">",
            threshold=250,
            for_ms=60_000,
            tags=(("host", "a"),),
            labels=(("severity", "page"),),
            annotations=(("summary", "API p99 above 250 ms"),),
        ),
    )
    printed = yaml.safe_dump(config.to_canonical_dict(), sort_keys=False)
    assert parse_config(printed, "<validate>") == config
    assert config.to_canonical_dict()["alerts"] == [
        {
            "name": "api_p99_high",
            "window": "per_10s",
            "metric": "api.latency",
            "aggregate": "p99",
            "condition": "> 250",
            "for": "1m",
            "tags": {"host": "a"},
            "labels": {"severity": "page"},
            "annotations": {"summary": "API p99 above 250 ms"},
        }
    ]


def test_no_alerts_key_means_no_alerts_and_prints_none() -> None:
    config = parse_config(WINDOWS, "x.yaml")
    assert config.alerts == ()
    assert "alerts" not in config.to_canonical_dict()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("> 250", (">", 250.0)),
        (">= 1", (">=", 1.0)),
        ("< 0.5", ("<", 0.5)),
        ("== 0", ("==", 0.0)),
        ("!=-1.5e3", ("!=", -1500.0)),
        ("  <=  .25 ", ("<=", 0.25)),
    ],
)
def test_conditions(text: str, expected: tuple[str, float]) -> None:
    assert parse_condition(text) == expected


@pytest.mark.parametrize("text", ["", "250", "=> 1", "> ", "> abc", "> 1e999", "> nan", ">> 1"])
def test_bad_conditions(text: str) -> None:
    with pytest.raises(ValueError):
        parse_condition(text)


@pytest.mark.parametrize(
    ("kind", "size", "hop", "expected"),
    [
        ("tumbling", 10_000, None, 10_000),
        ("tumbling", 15_000, None, 20_000),
        ("tumbling", 2_500, None, 10_000),
        ("tumbling", 60_000, None, 60_000),
        ("hopping", 60_000, 30_000, 30_000),
        ("hopping", 60_000, 5_000, 10_000),
    ],
)
def test_evaluation_interval_is_the_window_step_rounded_up_to_10s(
    kind: str, size: int, hop: int | None, expected: int
) -> None:
    assert evaluation_interval_ms(kind, size, hop) == expected  # type: ignore[arg-type]


def test_every_mistake_is_reported_at_once_with_its_path() -> None:
    issues = issues_of(
        """\
        - name: Bad-Name
          window: per_10
          metric: "api.*"
          aggregate: p95
          condition: "~ 3"
          for: 15s
          tags: {host: 1}
          labels: {"1x": y}
          expr: foo
        - name: x
          window: per_15s
          metric: db.q
          aggregate: sum
          condition: 250
          for: 25s
          tags: {host: a}
        - name: x
          window: sessions
          metric: m
          aggregate: count
          condition: ">= 1"
        - 5
        - window: per_10s
        """
    )
    assert issues == [
        ("alerts[0].name", "'Bad-Name' is not a valid name; use only lowercase letters, digits and _"),
        ("alerts[0].window", "no window named 'per_10' (windows: per_10s, per_15s, hop, sessions); did you mean per_10s?"),
        ("alerts[0].metric", "'api.*' is a glob; an alert watches one exact metric"),
        ("alerts[0].aggregate", "unknown aggregate 'p95'; one of count, sum, min, max, last, p50, p90, p99, p999, distinct_count, rate, completeness, packet_completeness; did you mean p99?"),
        ("alerts[0].condition", "'~ 3' is not a condition; write an operator and a number, like \"> 250\", \">= 1\", \"< 0.5\" or \"== 0\" (operators: >, >=, <, <=, ==, !=)"),
        ("alerts[0].tags.host", "must be a string, not a number (1)"),
        ("alerts[0].labels.1x", "'1x' is not a label name; letters, digits and _, not starting with a digit or __"),
        ("alerts[0].expr", "unknown key; did you mean condition?"),
        ("alerts[1].metric", "window 'per_15s' does not aggregate 'db.q' (its metrics: api.*); the alert would never see data"),
        ("alerts[1].condition", 'must be a quoted string like "> 250", not a number (250)'),
        ("alerts[1].for", "25s is not a multiple of the evaluation interval 20s of window 'per_15s'; Grafana counts the pending period in evaluations (use 40s)"),
        ("alerts[1].tags.host", "window 'per_15s' does not keep tag 'host' (group_by: none); the filter would match nothing"),
        ("alerts[2].name", "duplicate alert name 'x' (already used by alerts[1])"),
        ("alerts[2].window", "window 'sessions' is a session window; alerts watch tumbling or hopping windows, whose ends fall on a fixed grid"),
        ("alerts[3]", "an alert must be a mapping, not a number (5)"),
        ("alerts[4].name", "required; every alert needs a name; it becomes the rule's title and UID"),
        ("alerts[4].metric", "required; the exact metric name the alert watches"),
        ("alerts[4].aggregate", "required; one of count, sum, min, max, last, p50, p90, p99, p999, distinct_count, rate, completeness, packet_completeness"),
        ("alerts[4].condition", 'required; an operator and a number, like "> 250"'),
    ]  # fmt: skip


def test_alerts_must_be_a_list_and_keys_must_be_known() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(WINDOWS + "alerts: {name: x}\n", "t.yaml")
    assert [(i.path, i.message) for i in caught.value.issues] == [
        ("alerts", "must be a list of alerts (each starting with '- name:'), not a mapping")
    ]


def test_alert_spec_refuses_what_the_loader_refuses() -> None:
    with pytest.raises(ValueError, match="aggregate: unknown aggregate 'p95'"):
        AlertSpec(name="a", window="w", metric="m", aggregate="p95", op=">", threshold=1)  # type: ignore[arg-type]


CLIENT_WINDOWS = """\
windows:
  - {name: clients_1m, kind: tumbling, size: 1m, metrics: ["streamgauge.ingest.client.*"],
     group_by: [source, client, reason]}
  - {name: per_10s, kind: tumbling, size: 10s, group_by: [host]}
alerts:
"""


def client_issues(alert: str) -> list[tuple[str, str]]:
    text = CLIENT_WINDOWS + textwrap.indent(textwrap.dedent(alert), "  ")
    try:
        parse_config(text, "test.yaml")
    except ConfigError as error:
        return [(issue.path, issue.message) for issue in error.issues]
    return []


@pytest.mark.parametrize(
    ("alert", "expected"),
    [
        ("- {name: low, window: clients_1m, metric: streamgauge.ingest.client.metrics_received, aggregate: completeness, condition: '< 0.99', for: 2m}",
         []),
        ("- {name: low, window: clients_1m, metric: streamgauge.ingest.client.packets_received, aggregate: packet_completeness, condition: '< 0.9', tags: {client: py}}",
         []),
        ("- {name: low, window: clients_1m, metric: streamgauge.ingest.client.lines, aggregate: completeness, condition: '< 0.99'}",
         [("alerts[0].metric", "aggregate completeness watches streamgauge.ingest.client.metrics_received (against what the clients said they sent), not 'streamgauge.ingest.client.lines'")]),
        ("- {name: low, window: per_10s, metric: streamgauge.ingest.client.metrics_received, aggregate: completeness, condition: '< 0.99'}",
         [("alerts[0].window", "window 'per_10s' does not keep the source tag; give it group_by: [source, ...] to tell the clients apart")]),
        ("- {name: low, window: clients_1m, metric: streamgauge.ingest.client.metrics_received, aggregate: completeness, condition: '< 0.99', tags: {reason: queue}}",
         [("alerts[0].tags.reason", "a completeness alert filters on source, client, client_version, client_transport, not 'reason'")]),
        ("- {name: low, window: clients_1m, metric: streamgauge.ingest.client.metrics_received, aggregate: completenes, condition: '< 0.99'}",
         [("alerts[0].aggregate", "unknown aggregate 'completenes'; one of count, sum, min, max, last, p50, p90, p99, p999, distinct_count, rate, completeness, packet_completeness; did you mean completeness?")]),
    ],
)
def test_client_completeness_alerts(alert: str, expected: list[tuple[str, str]]) -> None:
    """A completeness alert watches the received side of the fraction, on a window that
    keeps ``source``, filtered on the view's client columns only."""
    assert client_issues(alert) == expected
