"""Grafana unified-alerting rule groups from the config's ``alerts:``, built with the SDK.

One rule group per (config, window), evaluated every ``evaluation_interval_ms`` (a new window
end per tick, rounded up to Grafana's 10 s scheduler). Each rule is three queries:

``A`` the window values of the series that ENDED within the look-back (SQL, ``alert_sql``);
``B`` reduce per series: ``max`` for ``>``/``>=``, ``min`` for ``<``/``<=`` (the worst window
in the look-back), ``last`` for ``==``/``!=`` (the latest window); NULLs dropped;
``C`` the condition, a math expression ``$B > 250`` (math covers all six operators; the
threshold expression has no ``>=`` or ``==`` in Grafana 11).

The look-back is ``size + watermark_delay + allowed_lateness + interval``: a window is revised
until the watermark (event time − delay) passes ``end + allowed_lateness``, so every revision,
including the last correction, is seen by at least one evaluation.

Two shapes of the same rules: the provisioning API's (``folderUID``, ``ruleGroup``, seconds)
for ``push``, and the file-provisioning YAML's (``groups: [{folder, interval: "10s", ...}]``)
for ``export``. In files, Grafana expands ``$VAR`` in labels but not in ``model`` or
annotations (``pkg/services/provisioning/alerting/rules_types.go``: the model is read Raw), so
``$__timeFilter`` and ``$B`` are written as they are and ``$`` in labels is doubled.
"""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from grafana_foundation_sdk.builders import alerting, expr
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.alerting import RelativeTimeRange
from grafana_foundation_sdk.models.dashboard import DataSourceRef

from streamgauge.configs import AlertSpec, PipelineConfig, format_duration_ms
from streamgauge.grafana import queries
from streamgauge.grafana.uids import FOLDER_TITLE, FOLDER_UID, alert_rule_uid, rule_group_name

_EXPR = "__expr__"  # Grafana's server-side expressions "data source"
_REDUCERS = {">": "max", ">=": "max", "<": "min", "<=": "min", "==": "last", "!=": "last"}
ORG_ID = 1


def lookback_seconds(config: PipelineConfig, alert: AlertSpec) -> int:
    """How far back query A reads, in whole seconds (rounded up)."""
    window = config.window(alert.window)
    total_ms = (
        (window.size_ms or 0)
        + window.watermark_delay_ms
        + window.allowed_lateness_ms
        + config.evaluation_interval_ms(alert.window)
    )
    return -(-total_ms // 1000)


def _rule(config: PipelineConfig, alert: AlertSpec, datasource_uid: str) -> alerting.Rule:
    sql = queries.alert_sql(config, alert)
    query_a = (
        alerting.Query("A")
        .datasource_uid(datasource_uid)
        .relative_time_range(RelativeTimeRange(from_val=lookback_seconds(config, alert), to=0))
        .model(
            queries.PostgresQueryBuilder(
                queries.PostgresQuery("A", sql, "time_series", datasource_uid)
            )
        )
    )
    reduce_b = (
        alerting.Query("B")
        .datasource_uid(_EXPR)
        .model(
            expr.TypeReduce()
            .datasource(DataSourceRef(type_val=_EXPR, uid=_EXPR))
            .ref_id("B")
            .expression("A")
            .reducer(_REDUCERS[alert.op])  # type: ignore[arg-type]
            .settings(expr.ExprTypeReduceSettings().mode("dropNN"))
        )
    )
    condition_c = (
        alerting.Query("C")
        .datasource_uid(_EXPR)
        .model(
            expr.TypeMath()
            .datasource(DataSourceRef(type_val=_EXPR, uid=_EXPR))
            .ref_id("C")
            .expression(f"$B {alert.condition}")
        )
    )
    labels = {
        "streamgauge_config": config.name,
        "streamgauge_window": alert.window,
        **dict(alert.labels),
    }
    annotations = {
        "description": (
            f"{alert.aggregate} of {alert.metric} in window {alert.window} {alert.condition}"
            + (f" (tags {dict(alert.tags)})" if alert.tags else "")
        ),
        **dict(alert.annotations),
    }
    return (
        alerting.Rule(alert.name)
        .uid(alert_rule_uid(config.name, alert.name))
        .condition("C")
        .queries([query_a, reduce_b, condition_c])
        .for_val(format_duration_ms(alert.for_ms))
        .no_data_state("OK")  # no samples in a window is no breach (a window exists only with data)
        .exec_err_state("Error")
        .labels(labels)
        .annotations(annotations)
        .folder_uid(FOLDER_UID)
        .rule_group(rule_group_name(config.name, alert.window))
        .org_id(ORG_ID)
        .is_paused(False)
    )


def rule_groups(config: PipelineConfig, datasource_uid: str) -> list[dict[str, Any]]:
    """The provisioning API's rule groups (``PUT .../folder/{uid}/rule-groups/{group}`` bodies)."""
    by_window: dict[str, list[AlertSpec]] = defaultdict(list)
    for alert in config.alerts:
        by_window[alert.window].append(alert)
    groups = []
    for window in config.windows:  # config order: stable output
        alerts = by_window.get(window.name)
        if not alerts:
            continue
        group = (
            alerting.RuleGroup(rule_group_name(config.name, window.name))
            .folder_uid(FOLDER_UID)
            .interval(config.evaluation_interval_ms(window.name) // 1000)
            .rules([_rule(config, alert, datasource_uid) for alert in alerts])
        )
        groups.append(json.loads(json.dumps(group.build(), cls=JSONEncoder)))
    return groups


def _escape_env(text: str) -> str:
    """Grafana's provisioning reads ``$$`` as a literal ``$`` in the fields it interpolates."""
    return text.replace("$", "$$")


def file_provisioning(config: PipelineConfig, datasource_uid: str) -> dict[str, Any]:
    """The same groups in Grafana's alerting file-provisioning format (``apiVersion: 1``)."""
    groups = []
    for group in rule_groups(config, datasource_uid):
        rules = []
        for rule in group["rules"]:
            rules.append(
                {
                    "uid": rule["uid"],
                    "title": rule["title"],
                    "condition": rule["condition"],
                    "data": rule["data"],
                    "noDataState": rule["noDataState"],
                    "execErrState": rule["execErrState"],
                    "for": rule["for"],
                    "annotations": rule.get("annotations", {}),
                    "labels": {k: _escape_env(v) for k, v in rule.get("labels", {}).items()},
                    "isPaused": rule.get("isPaused", False),
                }
            )
        groups.append(
            {
                "orgId": ORG_ID,
                "name": group["title"],
                "folder": FOLDER_TITLE,
                "interval": f"{group['interval']}s",
                "rules": rules,
            }
        )
    return {"apiVersion": 1, "groups": groups}
