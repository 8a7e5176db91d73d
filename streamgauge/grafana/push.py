"""Create or update the folder, data source, dashboards and alert rule groups in a running
Grafana through ``grafana-client``, changing nothing that is already as it should be.

Idempotent by comparison: every object is read first (by its stable UID) and written only if
it is missing or differs from what this config generates. "Differs" is a subset test: every
field we generate must be present with the same value; fields Grafana adds on its own (ids,
versions, ``intervalMs`` in alert queries, ``updated``) are ignored. A second push of the same
config therefore sends GETs only.

Rule groups go through the provisioning API with ``X-Disable-Provenance: true``, so they stay
editable in the UI (without it Grafana marks them provisioned and locks them). The token comes
from the caller (``GRAFANA_TOKEN`` or a file, never the YAML) and is never logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

from grafana_client.api import GrafanaApi
from grafana_client.client import GrafanaClientError, TokenAuth

from streamgauge.configs import PipelineConfig
from streamgauge.grafana import alerts
from streamgauge.grafana.provisioning import DatasourceSettings, all_dashboards
from streamgauge.grafana.uids import DATASOURCE_UID, FOLDER_TITLE, FOLDER_UID

_logger = logging.getLogger(__name__)

Action = Literal["created", "updated", "unchanged"]


@dataclass
class PushReport:
    """What ``push`` did to each object: ``(kind, uid, action)`` in the order it went."""

    actions: list[tuple[str, str, Action]] = field(default_factory=list)

    def add(self, kind: str, uid: str, action: Action) -> None:
        _logger.info("grafana %s %s: %s", kind, uid, action)
        self.actions.append((kind, uid, action))

    @property
    def changed(self) -> bool:
        return any(action != "unchanged" for _, _, action in self.actions)


def contains(existing: Any, wanted: Any) -> bool:
    """Whether ``existing`` holds everything in ``wanted`` (dicts: a subset; lists: same length,
    item by item; numbers compare by value, so Grafana's ``10.0`` equals our ``10``)."""
    if isinstance(wanted, dict):
        return isinstance(existing, dict) and all(
            key in existing and contains(existing[key], value) for key, value in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(existing, list)
            and len(existing) == len(wanted)
            and all(contains(e, w) for e, w in zip(existing, wanted, strict=True))
        )
    return bool(existing == wanted)


def _get(fetch: Callable[[], Any]) -> Any | None:
    """The object, or None when Grafana answers 404."""
    try:
        return fetch()
    except GrafanaClientError as exc:
        if exc.status_code == 404:
            return None
        raise


def connect(url: str, token: str | None, *, timeout: float = 10.0) -> Any:
    """A client for ``url``; a token is sent as ``Authorization: Bearer`` (service accounts).

    Typed ``Any``: grafana-client ships no annotations for its element methods.
    """
    auth = TokenAuth(token) if token else None  # type: ignore[no-untyped-call]
    return GrafanaApi.from_url(url, credential=auth, timeout=timeout)


def push(
    config: PipelineConfig,
    url: str,
    token: str | None,
    *,
    datasource_settings: DatasourceSettings | None = None,
    datasource_password: str | None = None,
    api: Any = None,
) -> PushReport:
    """Bring the Grafana at ``url`` in line with ``config``; returns what changed.

    ``datasource_password`` is sent in ``secureJsonData`` when the data source is created or
    updated. Grafana never returns it, so a password change alone is not detected: delete the
    data source (or change its settings) to resend it.
    """
    grafana: Any = api or connect(url, token)
    settings = datasource_settings or DatasourceSettings()
    report = PushReport()

    folder = _get(partial(grafana.folder.get_folder, FOLDER_UID))
    if folder is None:
        grafana.folder.create_folder(FOLDER_TITLE, uid=FOLDER_UID)
        report.add("folder", FOLDER_UID, "created")
    elif folder.get("title") != FOLDER_TITLE:
        grafana.folder.update_folder(FOLDER_UID, title=FOLDER_TITLE, overwrite=True)
        report.add("folder", FOLDER_UID, "updated")
    else:
        report.add("folder", FOLDER_UID, "unchanged")

    wanted_ds = settings.datasource()
    existing_ds = _get(partial(grafana.datasource.get_datasource_by_uid, DATASOURCE_UID))
    body = settings.datasource(password=datasource_password) if datasource_password else wanted_ds
    if existing_ds is None:
        grafana.datasource.create_datasource(body)
        report.add("datasource", DATASOURCE_UID, "created")
    elif not contains(existing_ds, wanted_ds):
        grafana.datasource.update_datasource_by_uid(DATASOURCE_UID, body)
        report.add("datasource", DATASOURCE_UID, "updated")
    else:
        report.add("datasource", DATASOURCE_UID, "unchanged")

    for board in all_dashboards(config, DATASOURCE_UID):
        uid = board["uid"]
        existing = _get(partial(grafana.dashboard.get_dashboard, uid))
        if (
            existing is not None
            and contains(existing.get("dashboard"), board)
            and existing.get("meta", {}).get("folderUid") == FOLDER_UID
        ):
            report.add("dashboard", uid, "unchanged")
            continue
        grafana.dashboard.update_dashboard(
            {
                "dashboard": board,
                "folderUid": FOLDER_UID,
                "overwrite": True,
                "message": f"streamgauge grafana push ({config.name})",
            }
        )
        report.add("dashboard", uid, "created" if existing is None else "updated")

    for group in alerts.rule_groups(config, DATASOURCE_UID):
        title = group["title"]
        existing = _get(partial(grafana.alertingprovisioning.get_rule_group, FOLDER_UID, title))
        if existing is not None and contains(existing, group):
            report.add("rule-group", title, "unchanged")
            continue
        grafana.alertingprovisioning.update_rule_group(
            FOLDER_UID, title, group, disable_provenance=True
        )
        report.add("rule-group", title, "created" if existing is None else "updated")
    return report
