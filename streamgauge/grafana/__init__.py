"""Grafana from the same YAML: a PostgreSQL data source, dashboards and alert rules.

Built with ``grafana-foundation-sdk`` (the Grafana 11.6 build), written as provisioning files
(``export_provisioning``) or sent to a running Grafana (``push``).
"""

from streamgauge.grafana.provisioning import (
    PASSWORD_ENV,
    DatasourceSettings,
    GrafanaRejects,
    export_provisioning,
    provisioning_problems,
    render_files,
)
from streamgauge.grafana.push import PushReport, push

__all__ = [
    "PASSWORD_ENV",
    "DatasourceSettings",
    "GrafanaRejects",
    "PushReport",
    "export_provisioning",
    "provisioning_problems",
    "push",
    "render_files",
]
