"""Stable Grafana UIDs derived from config, window and alert names.

Grafana UIDs are at most 40 characters of ``[A-Za-z0-9_-]``; names here may be 63 characters
long, so a UID is a readable prefix plus 8 hex digits of a SHA-256 over the full parts: the
same names always give the same UID (a push updates in place), different names never share
one in practice, and a truncated prefix cannot make two UIDs collide.
"""

from __future__ import annotations

import hashlib

UID_MAX_LENGTH = 40
FOLDER_UID = "streamgauge"
FOLDER_TITLE = "streamgauge"
DATASOURCE_UID = "streamgauge-postgres"
DATASOURCE_NAME = "streamgauge"


def stable_uid(kind: str, *parts: str) -> str:
    digest = hashlib.sha256("\0".join((kind, *parts)).encode()).hexdigest()[:8]
    readable = "-".join((kind, *parts)).replace("_", "-")
    return f"{readable[: UID_MAX_LENGTH - 9]}-{digest}"


def dashboard_uid(config_name: str) -> str:
    return stable_uid("sg", config_name)


def health_dashboard_uid(config_name: str) -> str:
    return stable_uid("sgh", config_name)


def alert_rule_uid(config_name: str, alert_name: str) -> str:
    return stable_uid("sga", config_name, alert_name)


def rule_group_name(config_name: str, window_name: str) -> str:
    """One rule group per (config, window): all its rules share the window's interval."""
    return f"{config_name}.{window_name}"  # "." keeps it a plain URL path segment
