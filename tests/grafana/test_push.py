"""``push`` against a local HTTP server that records requests and answers like Grafana's API.

The fake keeps what is written and returns it the way Grafana does: dashboards wrapped in
``{"dashboard", "meta"}`` with ``id``/``version`` added, data sources with ``id`` and without
the password, rule groups with fields Grafana adds (``id``, ``updated``, ``intervalMs``...).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

import pytest

from streamgauge.configs import PipelineConfig, parse_config
from streamgauge.grafana import push
from streamgauge.grafana.commands import register
from streamgauge.grafana.uids import DATASOURCE_UID, FOLDER_UID
from tests.grafana.conftest import CONFIG_TEXT

TOKEN = "glsa_test_token_123"


class FakeGrafana:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.folders: dict[str, dict[str, Any]] = {}
        self.datasources: dict[str, dict[str, Any]] = {}
        self.dashboards: dict[str, dict[str, Any]] = {}
        self.rule_groups: dict[tuple[str, str], dict[str, Any]] = {}

    def handle(self, method: str, path: str, headers: dict[str, str], body: Any) -> tuple[int, Any]:
        self.requests.append({"method": method, "path": path, "headers": headers, "body": body})
        if headers.get("authorization") != f"Bearer {TOKEN}":
            return 401, {"message": "Unauthorized"}
        if m := re.fullmatch(r"/api/folders/([^/]+)", path):
            folder = self.folders.get(m[1])
            if method == "GET":
                return (200, folder) if folder else (404, {"message": "folder not found"})
        if path == "/api/folders" and method == "POST":
            self.folders[body["uid"]] = {"id": len(self.folders) + 1, **body}
            return 200, self.folders[body["uid"]]
        if m := re.fullmatch(r"/api/datasources/uid/([^/]+)", path):
            if method == "GET":
                ds = self.datasources.get(m[1])
                return (200, ds) if ds else (404, {"message": "Data source not found"})
            if method == "PUT":
                return self._store_datasource(body)
        if path == "/api/datasources" and method == "POST":
            return self._store_datasource(body)
        if m := re.fullmatch(r"/api/dashboards/uid/([^/]+)", path):
            entry = self.dashboards.get(m[1])
            return (200, entry) if entry else (404, {"message": "Dashboard not found"})
        if path == "/api/dashboards/db" and method == "POST":
            board = copy.deepcopy(body["dashboard"])
            old = self.dashboards.get(board["uid"])
            board.update(id=7, version=(old["dashboard"]["version"] + 1) if old else 1)
            self.dashboards[board["uid"]] = {
                "dashboard": board,
                "meta": {"folderUid": body["folderUid"]},
            }
            return 200, {"status": "success", "uid": board["uid"], "version": board["version"]}
        if m := re.fullmatch(r"/api/v1/provisioning/folder/([^/]+)/rule-groups/([^/]+)", path):
            key = (m[1], m[2])
            if method == "GET":
                group = self.rule_groups.get(key)
                return (200, group) if group else (404, {"message": "rule group does not exist"})
            if method == "PUT":
                stored = copy.deepcopy(body)
                for number, rule in enumerate(stored["rules"], start=1):
                    rule.update(id=number, updated="2024-01-01T00:00:00Z", provenance="")
                    for query in rule["data"]:
                        query["model"].setdefault("intervalMs", 1000)
                        query["model"].setdefault("maxDataPoints", 43200)
                self.rule_groups[key] = stored
                return 200, stored
        return 404, {"message": f"no route {method} {path}"}

    def _store_datasource(self, body: dict[str, Any]) -> tuple[int, Any]:
        stored = {k: v for k, v in body.items() if k != "secureJsonData"}
        stored.update(id=1, orgId=1, version=1, readOnly=False)
        stored["secureJsonFields"] = {"password": True} if "secureJsonData" in body else {}
        self.datasources[body["uid"]] = stored
        return 200, {"datasource": stored, "id": 1, "message": "Datasource added"}

    def writes(self, start: int = 0) -> list[tuple[str, str]]:
        return [(r["method"], r["path"]) for r in self.requests[start:] if r["method"] != "GET"]


@pytest.fixture
def grafana() -> Iterator[tuple[FakeGrafana, str]]:
    fake = FakeGrafana()

    class Handler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            headers = {k.lower(): v for k, v in self.headers.items()}
            status, answer = fake.handle(
                self.command, unquote(urlparse(self.path).path), headers, body
            )
            data = json.dumps(answer).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _serve

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_first_push_creates_everything_and_second_changes_nothing(
    grafana: tuple[FakeGrafana, str], config: PipelineConfig
) -> None:
    fake, url = grafana
    report = push(config, url, TOKEN, datasource_password="s3cret")
    assert report.actions == [
        ("folder", FOLDER_UID, "created"),
        ("datasource", DATASOURCE_UID, "created"),
        ("dashboard", "sg-shop-c0ee6b0a", "created"),
        ("dashboard", "sgh-shop-ebc516a3", "created"),
        ("rule-group", "shop.per_10s", "created"),
        ("rule-group", "shop.per_1m", "created"),
    ]
    assert fake.writes() == [
        ("POST", "/api/folders"),
        ("POST", "/api/datasources"),
        ("POST", "/api/dashboards/db"),
        ("POST", "/api/dashboards/db"),
        ("PUT", "/api/v1/provisioning/folder/streamgauge/rule-groups/shop.per_10s"),
        ("PUT", "/api/v1/provisioning/folder/streamgauge/rule-groups/shop.per_1m"),
    ]
    by_path = {(r["method"], r["path"]): r for r in fake.requests}
    assert by_path[("POST", "/api/folders")]["body"] == {
        "title": "streamgauge",
        "uid": "streamgauge",
    }
    ds_body = by_path[("POST", "/api/datasources")]["body"]
    assert ds_body["secureJsonData"] == {"password": "s3cret"}
    assert (ds_body["uid"], ds_body["user"], ds_body["type"]) == (
        DATASOURCE_UID, "streamgauge_reader", "grafana-postgresql-datasource",
    )  # fmt: skip
    dash_body = by_path[("POST", "/api/dashboards/db")]["body"]
    assert (dash_body["folderUid"], dash_body["overwrite"]) == (FOLDER_UID, True)
    rules = by_path[("PUT", "/api/v1/provisioning/folder/streamgauge/rule-groups/shop.per_10s")]
    assert rules["headers"]["x-disable-provenance"] == "true"
    assert rules["body"]["interval"] == 10
    assert [r["title"] for r in rules["body"]["rules"]] == ["api_p99_high", "api_rate_low"]
    assert all(r["headers"]["authorization"] == f"Bearer {TOKEN}" for r in fake.requests)

    before = len(fake.requests)
    again = push(config, url, TOKEN, datasource_password="s3cret")
    assert not again.changed
    assert fake.writes(before) == []
    assert {r["method"] for r in fake.requests[before:]} == {"GET"}


def test_a_changed_alert_updates_only_its_rule_group(
    grafana: tuple[FakeGrafana, str], config: PipelineConfig
) -> None:
    fake, url = grafana
    push(config, url, TOKEN)
    changed = parse_config(
        CONFIG_TEXT.replace('condition: "> 50"', 'condition: "> 80"'), "shop.yaml"
    )
    before = len(fake.requests)
    report = push(changed, url, TOKEN)
    assert [a for a in report.actions if a[2] != "unchanged"] == [
        ("rule-group", "shop.per_10s", "updated")
    ]
    assert fake.writes(before) == [
        ("PUT", "/api/v1/provisioning/folder/streamgauge/rule-groups/shop.per_10s")
    ]
    stored = fake.rule_groups[("streamgauge", "shop.per_10s")]
    assert stored["rules"][0]["data"][2]["model"]["expression"] == "$B > 80"


def test_cli_push_reads_the_token_from_a_file_and_never_prints_it(
    grafana: tuple[FakeGrafana, str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    fake, url = grafana
    config_file = tmp_path / "shop.yaml"
    config_file.write_text(CONFIG_TEXT)
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    monkeypatch.delenv("GRAFANA_TOKEN", raising=False)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["grafana", "push", "--url", url, "--config", str(config_file), "--token-file",
         str(token_file), "--data-dir", str(tmp_path / "none")]
    )  # fmt: skip
    assert args.handler(args) == 0
    out, err = capsys.readouterr()
    assert "rule-group\tshop.per_1m\tcreated" in out
    assert TOKEN not in out + err

    monkeypatch.setenv("GRAFANA_TOKEN", "wrong")
    args = parser.parse_args(["grafana", "push", "--url", url, "--config", str(config_file)])
    assert args.handler(args) == 1
    out, err = capsys.readouterr()
    assert "Grafana refused" in err and "wrong" not in out + err


def test_cli_export(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config_file = tmp_path / "shop.yaml"
    config_file.write_text(CONFIG_TEXT)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "postgres.json").write_text(
        json.dumps({"host": "127.0.0.1", "port": 6000, "database": "streamgauge",
                    "reader_user": "streamgauge_reader", "reader_password": "pw-not-to-leak"})
    )  # fmt: skip
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["grafana", "export", str(tmp_path / "out"), "--config", str(config_file), "--data-dir",
         str(tmp_path / "data"), "--pg-host", "host.docker.internal"]
    )  # fmt: skip
    assert args.handler(args) == 0
    text = (tmp_path / "out/datasources/streamgauge.yaml").read_text()
    assert "url: host.docker.internal:6000" in text
    assert "pw-not-to-leak" not in "".join(p.read_text() for p in (tmp_path / "out").rglob("*.*"))

    (tmp_path / "bad.yaml").write_text("windows: []\n")
    args = parser.parse_args(
        ["grafana", "export", str(tmp_path / "o2"), "--config", str(tmp_path / "bad.yaml")]
    )
    assert args.handler(args) == 1
    assert "no windows" in capsys.readouterr().err
