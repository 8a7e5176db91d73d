"""Grafana provisioning files for a config, and the checks of what Grafana would refuse.

``export_provisioning(config, out_dir, settings)`` writes, under ``out_dir`` (mount it as
``/etc/grafana/provisioning``)::

    datasources/streamgauge.yaml         the PostgreSQL data source (no password in it)
    dashboards/streamgauge.yaml          a file provider pointing at the JSON below
    dashboards/streamgauge/<uid>.json    the results and pipeline-health dashboards
    alerting/streamgauge.yaml            the rule groups from ``alerts:``

The password is never written: the data source reads ``$STREAMGAUGE_PG_READER_PASSWORD``,
which Grafana expands from its environment when it loads provisioning files.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from streamgauge.configs import PipelineConfig
from streamgauge.grafana import alerts, dashboards, queries
from streamgauge.grafana.uids import (
    DATASOURCE_NAME,
    DATASOURCE_UID,
    FOLDER_TITLE,
    FOLDER_UID,
    UID_MAX_LENGTH,
)

PASSWORD_ENV = "STREAMGAUGE_PG_READER_PASSWORD"
#: Where the provider of dashboards/streamgauge.yaml looks, inside the Grafana container.
CONTAINER_DASHBOARD_DIR = "/etc/grafana/provisioning/dashboards/streamgauge"


@dataclass(frozen=True)
class DatasourceSettings:
    """Where Grafana reaches the store. The password is not a field: files use the env var,
    ``push`` takes it as an argument."""

    host: str = "127.0.0.1"
    port: int = 5432
    database: str = "streamgauge"
    user: str = "streamgauge_reader"
    sslmode: str = "disable"

    def datasource(self, password: str | None = None) -> dict[str, Any]:
        """The data source as Grafana's API and provisioning files both spell it."""
        out: dict[str, Any] = {
            "name": DATASOURCE_NAME,
            "uid": DATASOURCE_UID,
            "type": queries.DATASOURCE_TYPE,
            "access": "proxy",
            "url": f"{self.host}:{self.port}",
            "user": self.user,
            "isDefault": False,
            "jsonData": {
                "database": self.database,
                "sslmode": self.sslmode,
                "postgresVersion": 1500,  # the highest choice Grafana 11 offers; the store is 18
                "timescaledb": False,
                "maxOpenConns": 10,
            },
        }
        if password is not None:
            out["secureJsonData"] = {"password": password}
        return out


def datasource_file(settings: DatasourceSettings) -> dict[str, Any]:
    ds = settings.datasource(password=f"${PASSWORD_ENV}")
    ds["editable"] = False
    return {"apiVersion": 1, "datasources": [ds]}


def dashboards_provider_file(path: str = CONTAINER_DASHBOARD_DIR) -> dict[str, Any]:
    return {
        "apiVersion": 1,
        "providers": [
            {
                "name": "streamgauge",
                "orgId": 1,
                "folder": FOLDER_TITLE,
                "folderUid": FOLDER_UID,
                "type": "file",
                "disableDeletion": False,
                "allowUiUpdates": False,
                "updateIntervalSeconds": 30,
                "options": {"path": path, "foldersFromFilesStructure": False},
            }
        ],
    }


def all_dashboards(
    config: PipelineConfig, datasource_uid: str = DATASOURCE_UID
) -> list[dict[str, Any]]:
    return [
        dashboards.results_dashboard(config, datasource_uid),
        dashboards.health_dashboard(config, datasource_uid),
    ]


def _yaml(data: object) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)


def render_files(
    config: PipelineConfig,
    settings: DatasourceSettings,
    *,
    dashboard_dir: str = CONTAINER_DASHBOARD_DIR,
) -> dict[str, str]:
    """Relative path -> text of every provisioning file, without touching the disk."""
    files = {
        "datasources/streamgauge.yaml": _yaml(datasource_file(settings)),
        "dashboards/streamgauge.yaml": _yaml(dashboards_provider_file(dashboard_dir)),
        "alerting/streamgauge.yaml": _yaml(alerts.file_provisioning(config, DATASOURCE_UID)),
    }
    for board in all_dashboards(config):
        files[f"dashboards/streamgauge/{board['uid']}.json"] = dashboards.dashboard_json(board)
    return files


class GrafanaRejects(ValueError):
    """Generated output that Grafana would refuse; the message lists every reason."""


def export_provisioning(
    config: PipelineConfig,
    out_dir: str | os.PathLike[str],
    datasource_settings: DatasourceSettings,
    *,
    dashboard_dir: str = CONTAINER_DASHBOARD_DIR,
) -> list[Path]:
    """Write the provisioning tree; returns the files written. Checked before anything is
    written, and each file is replaced atomically (a Grafana polling the directory never reads
    half a file)."""
    files = render_files(config, datasource_settings, dashboard_dir=dashboard_dir)
    problems = list(provisioning_problems(files))
    if problems:
        raise GrafanaRejects("; ".join(problems))
    root = Path(out_dir)
    written = []
    for relative, text in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
        written.append(path)
    return written


# --- what Grafana refuses ----------------------------------------------------------------------

_UID = re.compile(rf"[A-Za-z0-9_-]{{1,{UID_MAX_LENGTH}}}")
# Prometheus model.ParseDuration, which Grafana uses for "for" and "interval".
_PROM_DURATION = re.compile(r"(\d+y)?(\d+w)?(\d+d)?(\d+h)?(\d+m)?(\d+s)?(\d+ms)?")
_PROM_UNITS_MS = {"y": 31_536_000_000, "w": 604_800_000, "d": 86_400_000, "h": 3_600_000,
                  "m": 60_000, "s": 1_000, "ms": 1}  # fmt: skip


def prom_duration_ms(text: str) -> int:
    """Parse like Prometheus' ``model.ParseDuration`` ("0" allowed; empty refused)."""
    if text == "0":
        return 0
    match = _PROM_DURATION.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"not a duration: {text!r}")
    total = 0
    for part in match.groups():
        if part:
            number, unit = re.fullmatch(r"(\d+)([a-z]+)", part).groups()  # type: ignore[union-attr]
            total += int(number) * _PROM_UNITS_MS[unit]
    return total


def _walk(node: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    yield path, node
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, f"{path}[{index}]")


def dashboard_problems(board: dict[str, Any], datasource_uids: set[str]) -> Iterator[str]:
    where = f"dashboard {board.get('uid')!r}"
    if not _UID.fullmatch(str(board.get("uid", ""))):
        yield f"{where}: uid must be 1-{UID_MAX_LENGTH} characters of [A-Za-z0-9_-]"
    if not board.get("title"):
        yield f"{where}: empty title"
    for path, node in _walk(board):
        if isinstance(node, dict) and path.endswith("datasource"):
            uid = node.get("uid")
            if uid not in datasource_uids:
                yield f"{where}: {path} names data source {uid!r}, which is not provisioned"
        if isinstance(node, dict) and "rawSql" in node and not str(node["rawSql"]).strip():
            yield f"{where}: {path} has an empty query"
        if path.endswith(".interval") and isinstance(node, str):
            try:
                prom_duration_ms(node)
            except ValueError:
                yield f"{where}: {path} is not a duration: {node!r}"
    ids = [p.get("id") for p in board.get("panels", []) if "id" in p]
    if len(ids) != len(set(ids)):
        yield f"{where}: duplicate panel ids"


def alerting_problems(document: dict[str, Any], datasource_uids: set[str]) -> Iterator[str]:
    if document.get("apiVersion") != 1:
        yield "alerting: apiVersion must be 1"
    rule_uids: set[str] = set()
    for group in document.get("groups", []):
        where = f"rule group {group.get('name')!r}"
        if not str(group.get("name", "")).strip():
            yield f"{where}: rule group has no name set"
        if not str(group.get("folder", "")).strip():
            yield f"{where}: rule group has no folder set"
        try:
            interval = prom_duration_ms(str(group.get("interval", "")))
        except ValueError:
            yield f"{where}: interval {group.get('interval')!r} is not a duration"
        else:
            if interval <= 0 or interval % 10_000:
                yield (
                    f"{where}: interval {group.get('interval')!r} is not a positive multiple of "
                    "the scheduler's base interval 10s"
                )
        for rule in group.get("rules", []):
            title = rule.get("title")
            rwhere = f"{where}, rule {title!r}"
            if not title:
                yield f"{rwhere}: rule has no title set"
            uid = str(rule.get("uid", ""))
            if not _UID.fullmatch(uid):
                yield f"{rwhere}: uid {uid!r} is empty or not 1-{UID_MAX_LENGTH} of [A-Za-z0-9_-]"
            if uid in rule_uids:
                yield f"{rwhere}: duplicate uid {uid!r}"
            rule_uids.add(uid)
            if not isinstance(rule.get("for"), str) or not rule["for"]:
                yield f"{rwhere}: 'for' must be a non-empty duration such as 0s or 1m"
            else:
                try:
                    prom_duration_ms(rule["for"])
                except ValueError:
                    yield f"{rwhere}: 'for' {rule['for']!r} is not a duration"
            if rule.get("noDataState") not in ("Alerting", "NoData", "OK"):
                yield f"{rwhere}: noDataState {rule.get('noDataState')!r}"
            if rule.get("execErrState") not in ("Alerting", "Error", "OK"):
                yield f"{rwhere}: execErrState {rule.get('execErrState')!r}"
            ref_ids = [q.get("refId") for q in rule.get("data", [])]
            if not ref_ids:
                yield f"{rwhere}: no data set"
            if rule.get("condition") not in ref_ids:
                yield f"{rwhere}: condition {rule.get('condition')!r} is not a query refId"
            for query in rule.get("data", []):
                ds = query.get("datasourceUid")
                if ds != "__expr__" and ds not in datasource_uids:
                    yield (
                        f"{rwhere}: query {query.get('refId')} names data source {ds!r}, "
                        "which is not provisioned"
                    )
                if ds != "__expr__":
                    span = query.get("relativeTimeRange", {})
                    if not isinstance(span.get("from"), int) or span["from"] <= span.get("to", 0):
                        yield f"{rwhere}: query {query.get('refId')} has an empty time range"
            for key in rule.get("labels", {}):
                if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                    yield f"{rwhere}: label name {key!r} is invalid"


def datasource_problems(document: dict[str, Any]) -> Iterator[str]:
    for ds in document.get("datasources", []):
        if not _UID.fullmatch(str(ds.get("uid", ""))):
            yield f"data source {ds.get('name')!r}: uid missing or invalid"
        password = ds.get("secureJsonData", {}).get("password", "")
        if password and not password.startswith("$"):
            yield f"data source {ds.get('name')!r}: password written in clear; use ${PASSWORD_ENV}"


def provisioning_problems(files: dict[str, str]) -> Iterator[str]:
    """Everything in a rendered provisioning tree that Grafana 11.6 would refuse or misread."""
    ds_doc = yaml.safe_load(files["datasources/streamgauge.yaml"])
    yield from datasource_problems(ds_doc)
    uids = {str(ds.get("uid")) for ds in ds_doc.get("datasources", [])}
    for name, text in files.items():
        if name.endswith(".json"):
            yield from dashboard_problems(json.loads(text), uids)
    yield from alerting_problems(yaml.safe_load(files["alerting/streamgauge.yaml"]), uids)
