"""Generated provisioning files: golden copies, and the checks of what Grafana would refuse.

Regenerate the goldens after an intended change with ``STREAMGAUGE_UPDATE_GOLDEN=1``, then
review the diff of ``tests/data/grafana/`` like code.
"""

# ruff: noqa: E501  (tables of cases and rows read best one per line)

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from streamgauge.configs import PipelineConfig, load_config
from streamgauge.grafana import (
    PASSWORD_ENV,
    DatasourceSettings,
    GrafanaRejects,
    export_provisioning,
    provisioning_problems,
    render_files,
)
from streamgauge.grafana.alerts import file_provisioning, lookback_seconds, rule_groups
from streamgauge.grafana.provisioning import alerting_problems, dashboard_problems
from streamgauge.grafana.uids import DATASOURCE_UID, UID_MAX_LENGTH, stable_uid

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "grafana"
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
UPDATE = os.environ.get("STREAMGAUGE_UPDATE_GOLDEN") == "1"


def test_export_matches_the_golden_files(tmp_path: Path, config: PipelineConfig) -> None:
    written = export_provisioning(config, tmp_path, DatasourceSettings(port=54321))
    relative = sorted(str(p.relative_to(tmp_path)) for p in written)
    assert relative == [
        "alerting/streamgauge.yaml",
        "dashboards/streamgauge.yaml",
        "dashboards/streamgauge/sg-shop-c0ee6b0a.json",
        "dashboards/streamgauge/sgh-shop-ebc516a3.json",
        "datasources/streamgauge.yaml",
    ]
    for name in relative:
        golden = GOLDEN / "shop" / name
        actual = (tmp_path / name).read_text()
        if UPDATE:
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(actual)
        assert golden.exists(), f"no golden file {golden}; run with STREAMGAUGE_UPDATE_GOLDEN=1"
        assert actual == golden.read_text(), f"{name} differs from {golden}"


def test_shipped_configs_export_cleanly() -> None:
    for name in ("quickstart.yaml", "reference.yaml"):
        files = render_files(load_config(CONFIGS / name), DatasourceSettings())
        assert list(provisioning_problems(files)) == []


def test_the_password_is_never_written(tmp_path: Path, config: PipelineConfig) -> None:
    export_provisioning(config, tmp_path, DatasourceSettings())
    datasources = yaml.safe_load((tmp_path / "datasources/streamgauge.yaml").read_text())
    (ds,) = datasources["datasources"]
    assert ds["secureJsonData"] == {"password": f"${PASSWORD_ENV}"}
    assert (ds["uid"], ds["user"], ds["type"]) == (
        DATASOURCE_UID,
        "streamgauge_reader",
        "grafana-postgresql-datasource",
    )


def test_uids_are_stable_short_and_distinct() -> None:
    long = "x" * 63
    uids = {stable_uid("sga", long, "a"), stable_uid("sga", long, "b"), stable_uid("sg", long)}
    assert len(uids) == 3
    assert all(len(uid) <= UID_MAX_LENGTH for uid in uids)
    assert stable_uid("sg", "shop") == stable_uid("sg", "shop") == "sg-shop-c0ee6b0a"


def test_rule_groups_timing(config: PipelineConfig) -> None:
    groups = {g["title"]: g for g in rule_groups(config, DATASOURCE_UID)}
    assert {t: g["interval"] for t, g in groups.items()} == {"shop.per_10s": 10, "shop.per_1m": 60}
    (rejecting,) = groups["shop.per_1m"]["rules"]
    # 1m + 1s delay + 30s lateness + 60s interval: a corrected window is evaluated again.
    assert rejecting["data"][0]["relativeTimeRange"] == {"from": 151, "to": 0}
    for alert in config.alerts:
        window = config.window(alert.window)
        assert lookback_seconds(config, alert) * 1000 >= (
            (window.size_ms or 0)
            + window.watermark_delay_ms
            + window.allowed_lateness_ms
            + config.evaluation_interval_ms(alert.window)
        )


def test_file_format_escapes_dollar_in_labels_only(config: PipelineConfig) -> None:
    document = file_provisioning(config, DATASOURCE_UID)
    rule = document["groups"][0]["rules"][0]
    assert rule["labels"]["team"] == "$$ops"  # Grafana expands $VAR in labels; $$ is a $
    assert "$__timeFilter(window_end)" in rule["data"][0]["model"]["rawSql"]  # model read raw
    assert rule["data"][2]["model"]["expression"] == "$B > 50"
    assert document["groups"][0]["interval"] == "10s"
    assert rule["for"] == "20s"


# --- what Grafana refuses: each check must fire on a broken copy --------------------------------


def _alerting(config: PipelineConfig) -> dict[str, Any]:
    return file_provisioning(config, DATASOURCE_UID)


@pytest.mark.parametrize(
    ("breakage", "message"),
    [
        (lambda d: d["groups"][0].update(interval="15s"), "not a positive multiple of the scheduler's base interval 10s"),
        (lambda d: d["groups"][0].update(interval=""), "is not a duration"),
        (lambda d: d["groups"][0]["rules"][0].update({"for": ""}), "'for' must be a non-empty duration"),
        (lambda d: d["groups"][0]["rules"][0].update({"for": "1.5m"}), "is not a duration"),
        (lambda d: d["groups"][0]["rules"][0]["data"][0].update(datasourceUid="nope"), "names data source 'nope', which is not provisioned"),
        (lambda d: d["groups"][0]["rules"][0].update(uid=""), "uid '' is empty"),
        (lambda d: d["groups"][0]["rules"][1].update(uid=d["groups"][0]["rules"][0]["uid"]), "duplicate uid"),
        (lambda d: d["groups"][0]["rules"][0].update(condition="D"), "condition 'D' is not a query refId"),
        (lambda d: d["groups"][0].update(folder=""), "rule group has no folder set"),
        (lambda d: d["groups"][0]["rules"][0]["data"][0].update(relativeTimeRange={"from": 0, "to": 0}), "empty time range"),
    ],
)  # fmt: skip
def test_alerting_checks_catch_what_grafana_refuses(
    config: PipelineConfig, breakage: Any, message: str
) -> None:
    document = _alerting(config)
    assert list(alerting_problems(document, {DATASOURCE_UID})) == []
    broken = copy.deepcopy(document)
    breakage(broken)
    problems = list(alerting_problems(broken, {DATASOURCE_UID}))
    assert any(message in p for p in problems), problems


def test_dashboard_checks_catch_missing_datasources_and_bad_uids(config: PipelineConfig) -> None:
    files = render_files(config, DatasourceSettings())
    board = json.loads(next(text for name, text in files.items() if name.endswith(".json")))
    assert list(dashboard_problems(board, {DATASOURCE_UID})) == []
    problems = list(dashboard_problems(board, {"other"}))
    assert problems and all("which is not provisioned" in p for p in problems)
    broken = copy.deepcopy(board)
    broken["uid"] = "x" * 41
    broken["panels"][1]["interval"] = ""
    broken["panels"][2]["id"] = broken["panels"][1]["id"]
    problems = list(dashboard_problems(broken, {DATASOURCE_UID}))
    assert any("uid must be 1-40" in p for p in problems)
    assert any(".interval is not a duration" in p for p in problems)
    assert any("duplicate panel ids" in p for p in problems)


def test_export_refuses_to_write_what_grafana_would_refuse(
    tmp_path: Path, config: PipelineConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamgauge.grafana import alerts, provisioning

    def bad_interval(*args: Any, **kwargs: Any) -> dict[str, Any]:
        document = file_provisioning(*args, **kwargs)
        document["groups"][0]["interval"] = "5s"
        return document

    monkeypatch.setattr(alerts, "file_provisioning", bad_interval)
    assert provisioning.alerts is alerts  # type: ignore[attr-defined]
    with pytest.raises(GrafanaRejects, match="multiple of the scheduler's base interval"):
        export_provisioning(config, tmp_path, DatasourceSettings())
    assert not any(tmp_path.iterdir())  # nothing half-written
