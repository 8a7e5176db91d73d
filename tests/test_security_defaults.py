"""Security defaults (issue: scale-out and stress): what listens where, and SQL with parameters.

The other defaults have their own tests: the Unix socket's mode (tests/ingest/test_transports.py),
the store password kept out of logs and the server log (tests/sinks/test_embedded.py), the
Grafana password and token never written or printed (tests/grafana/), receiver names confined
to one path component (tests/ingest/test_log.py).
"""

from __future__ import annotations

import ast
import ipaddress
from pathlib import Path
from urllib.parse import urlparse

from pyspark.sql import SparkSession

import streamgauge
from streamgauge.cli import DEFAULT_LISTEN, build_parser
from streamgauge.ingest.transports import parse_listen_spec

PACKAGE = Path(streamgauge.__file__).resolve().parent

#: Calls that send their first argument to PostgreSQL as query text.
SQL_CALLS = frozenset({"execute", "executemany", "copy", "stream"})


def _listening_addresses(port: int) -> set[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    """Local addresses of the TCP sockets listening on ``port``, from /proc/net/tcp{,6}."""
    found: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = set()
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if int(hex_port, 16) != port or fields[3] != "0A":  # 0A: LISTEN
                continue
            assert len(address) == width
            # The kernel prints each 32-bit word in host (little-endian) order.
            raw = b"".join(
                bytes.fromhex(address[i : i + 8])[::-1] for i in range(0, width, 8)
            )
            ip = ipaddress.ip_address(raw)
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            found.add(ip)
    return found


def test_the_spark_ui_of_a_local_job_listens_on_loopback_only(spark: SparkSession) -> None:
    url = spark.sparkContext.uiWebUrl
    assert url is not None
    port = urlparse(url).port
    assert port is not None
    addresses = _listening_addresses(port)
    assert addresses, f"nothing listens on the UI port {port}"
    assert all(address.is_loopback for address in addresses), addresses


def test_receivers_listen_on_loopback_unless_told_otherwise() -> None:
    spec = parse_listen_spec(DEFAULT_LISTEN)
    assert ipaddress.ip_address(spec.host).is_loopback
    parser = build_parser()
    for command in (["run"], ["ingest"]):
        args = parser.parse_args(command)
        assert args.listen is None  # None means DEFAULT_LISTEN, checked above


def _formats_text(node: ast.expr) -> bool:
    """True if ``node`` builds text from values at run time (f-string, ``%``, ``.format``,
    ``+``) rather than being a literal, a name or psycopg's ``sql`` composition."""
    if isinstance(node, ast.JoinedStr):
        return any(isinstance(part, ast.FormattedValue) for part in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod | ast.Add):
        return True
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        receiver = node.func.value
        is_sql_composition = isinstance(receiver, ast.Call) and (
            isinstance(receiver.func, ast.Attribute) and receiver.func.attr == "SQL"
        )
        return node.func.attr == "format" and not is_sql_composition
    return False


def test_every_query_the_daemon_sends_takes_values_as_parameters() -> None:
    """No query text is built from values: values travel as parameters, identifiers through
    ``psycopg.sql``. (Grafana's panel SQL is text by nature; its literals are quoted in one
    place, ``streamgauge.grafana.queries``, and checked by the Grafana tests.)"""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in SQL_CALLS
                and node.args
                and _formats_text(node.args[0])
            ):
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert offenders == []
