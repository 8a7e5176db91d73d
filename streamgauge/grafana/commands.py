"""``streamgauge grafana export DIR`` and ``streamgauge grafana push --url URL``.

``register(subparsers)`` adds the ``grafana`` command to the CLI's subparsers; each handler
returns an exit code. The Grafana token comes from ``GRAFANA_TOKEN`` or ``--token-file`` (never
from the YAML, never printed); the data source password from ``$STREAMGAUGE_PG_READER_PASSWORD``
or the embedded store's ``<data-dir>/postgres.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

DEFAULT_CONFIG = "configs/quickstart.yaml"
DEFAULT_DATA_DIR = "streamgauge-data"


def register(subparsers: Any) -> None:
    grafana = subparsers.add_parser("grafana", help="Grafana dashboards and alert rules")
    commands = grafana.add_subparsers(dest="grafana_command", required=True)

    export = commands.add_parser("export", help="write Grafana provisioning files into DIR")
    export.add_argument("dir", type=Path, help="mount it as /etc/grafana/provisioning")
    export.add_argument("--config", default=DEFAULT_CONFIG, help="window config YAML")
    export.add_argument(
        "--data-dir",
        type=Path,
        help="take the embedded store's host, port and database from DIR/postgres.json",
    )
    export.add_argument("--pg-host", help="host Grafana reaches PostgreSQL at (default 127.0.0.1)")
    export.add_argument("--pg-port", type=int, help="its port (default: data dir's, else 5432)")
    export.set_defaults(handler=cmd_export)

    push = commands.add_parser("push", help="create or update everything in a running Grafana")
    push.add_argument("--url", required=True, help="Grafana base URL, e.g. http://127.0.0.1:3000")
    push.add_argument("--config", default=DEFAULT_CONFIG, help="window config YAML")
    push.add_argument(
        "--token-file", type=Path, help="file holding the token (else $GRAFANA_TOKEN)"
    )
    push.add_argument("--data-dir", type=Path, default=Path(DEFAULT_DATA_DIR))
    push.add_argument("--pg-host", help="host Grafana reaches PostgreSQL at (default 127.0.0.1)")
    push.add_argument("--pg-port", type=int)
    push.set_defaults(handler=cmd_push)


def _settings(args: argparse.Namespace) -> tuple[Any, str | None]:
    """Data source settings and the reader password known from the data dir (if any)."""
    from streamgauge.grafana.provisioning import DatasourceSettings

    values: dict[str, Any] = {}
    password = None
    data_dir = getattr(args, "data_dir", None)
    connection = Path(data_dir) / "postgres.json" if data_dir else None
    if connection is not None and connection.is_file():
        info = json.loads(connection.read_text(encoding="utf-8"))
        values.update(
            host=str(info.get("host", "127.0.0.1")),
            port=int(info["port"]),
            database=str(info.get("database", "streamgauge")),
            user=str(info.get("reader_user", "streamgauge_reader")),
        )
        password = info.get("reader_password") or None
    if args.pg_host:
        values["host"] = args.pg_host
    if args.pg_port:
        values["port"] = args.pg_port
    return DatasourceSettings(**values), password


def _load(path: str) -> Any:
    from streamgauge.configs import ConfigError, load_config

    try:
        return load_config(path)
    except ConfigError as error:
        print(error, file=sys.stderr)
        return None


def cmd_export(args: argparse.Namespace) -> int:
    from streamgauge.grafana.provisioning import PASSWORD_ENV, GrafanaRejects, export_provisioning

    config = _load(args.config)
    if config is None:
        return 1
    settings, _ = _settings(args)
    try:
        written = export_provisioning(config, args.dir, settings)
    except GrafanaRejects as error:
        print(f"streamgauge: Grafana would refuse the generated files: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    print(
        f"data source password: not written; Grafana reads ${PASSWORD_ENV} from its environment",
        file=sys.stderr,
    )
    return 0


def read_token(token_file: Path | None) -> str | None:
    """``--token-file`` wins over ``GRAFANA_TOKEN``; surrounding whitespace is dropped."""
    if token_file is not None:
        return token_file.read_text(encoding="utf-8").strip() or None
    return os.environ.get("GRAFANA_TOKEN", "").strip() or None


def cmd_push(args: argparse.Namespace) -> int:
    from grafana_client.client import GrafanaException

    from streamgauge.grafana.provisioning import PASSWORD_ENV
    from streamgauge.grafana.push import push

    config = _load(args.config)
    if config is None:
        return 1
    try:
        token = read_token(args.token_file)
    except OSError as exc:
        print(f"streamgauge: cannot read the token file: {exc.strerror}", file=sys.stderr)
        return 1
    settings, password = _settings(args)
    password = os.environ.get(PASSWORD_ENV) or password
    try:
        report = push(
            config, args.url, token, datasource_settings=settings, datasource_password=password
        )
    except GrafanaException as exc:
        # The message is Grafana's answer (status and body), which never echoes the token.
        print(f"streamgauge: Grafana refused: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"streamgauge: cannot reach Grafana at {args.url}: {exc}", file=sys.stderr)
        return 1
    for kind, uid, action in report.actions:
        print(f"{kind}\t{uid}\t{action}")
    return 0
