"""The embedded PostgreSQL lifecycle, against real servers (no mocks).

Two servers: the session's (``postgres_url``, started once in conftest) for connection tests,
and this module's own cluster (``own``), which the lifecycle tests stop and start. Every test
that starts ``own`` stops it again, so each one begins from "initialised, not running".
"""

from __future__ import annotations

import json
import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from streamgauge.sinks.embedded import (
    CONNECTION_FILENAME,
    EmbeddedPostgres,
    EmbeddedPostgresError,
    read_connection_url,
)
from tests.conftest import stopped_cluster


def _password(url: str) -> str:
    match = re.match(r"postgresql://[^:]+:([^@]+)@", url)
    assert match, "URL has no password"
    return match.group(1)


@pytest.fixture(scope="module")
def own() -> Iterator[EmbeddedPostgres]:
    """An initialised, stopped cluster of this module's own."""
    with stopped_cluster("streamgauge-test-own-") as server:
        yield server


# -- connecting to the session server -------------------------------------------------------


def test_connects_over_tcp_with_scram_password(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        row = conn.execute(
            "SELECT current_user, current_database(), inet_server_addr()::text, system_user,"
            " current_setting('unix_socket_directories'), current_setting('listen_addresses')"
        ).fetchone()
    assert row == (
        "streamgauge",
        "streamgauge",
        "127.0.0.1/32",
        "scram-sha-256:streamgauge",  # system_user names the auth method that let us in
        "",
        "127.0.0.1",
    )


def test_wrong_password_is_refused(postgres_url: str) -> None:
    wrong = postgres_url.replace(_password(postgres_url), "not-the-password")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong, connect_timeout=5)


def test_every_hba_rule_requires_scram(postgres_url: str) -> None:
    with psycopg.connect(postgres_url) as conn:
        methods = {r[0] for r in conn.execute("SELECT auth_method FROM pg_hba_file_rules")}
    assert methods == {"scram-sha-256"}


def test_reader_role_reads_but_cannot_write(postgres_url: str, clean_store: str) -> None:
    # clean_store: the schema exists, so there is a table to read.
    data_dir = _session_data_dir(postgres_url)
    reader = read_connection_url(data_dir, read_only=True)
    assert reader is not None
    with psycopg.connect(reader, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM window_results").fetchone() == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("INSERT INTO pipeline_state VALUES ('c', 'k', 1, now())")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE t (x int)")


def _session_data_dir(url: str) -> Path:
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW data_directory").fetchone()
    assert row is not None
    return Path(str(row[0])).parent


# -- lifecycle on the module's own cluster --------------------------------------------------


def test_connection_file_is_private_and_complete(own: EmbeddedPostgres) -> None:
    path = own.data_dir / CONNECTION_FILENAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    facts = json.loads(path.read_text())
    assert facts["host"] == "127.0.0.1"
    assert facts["user"] == facts["database"] == "streamgauge"
    assert isinstance(facts["port"], int)
    assert len(facts["password"]) >= 24
    assert read_connection_url(own.data_dir) == own.url
    assert read_connection_url(own.data_dir.parent / "never-started") is None


def test_restart_reuses_port_and_password(own: EmbeddedPostgres) -> None:
    before = own.url
    again = EmbeddedPostgres(own.data_dir)  # a new process would do the same
    try:
        url = again.start()
        assert url == before
        assert not again.adopted
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        again.stop()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(before, connect_timeout=2)  # stop() really stopped it


def test_sizing_is_set_on_every_start_and_alter_system_overrides_it(
    own: EmbeddedPostgres,
) -> None:
    def settings(url: str) -> dict[str, tuple[int, str]]:
        """name: (value in bytes or seconds, the file that set it)"""
        with psycopg.connect(url) as conn:
            rows = conn.execute(
                "SELECT name, setting::bigint * CASE unit WHEN '8kB' THEN 8192"
                " WHEN 'MB' THEN 1048576 ELSE 1 END, sourcefile FROM pg_settings"
                " WHERE name IN ('shared_buffers', 'max_wal_size', 'checkpoint_timeout')"
            ).fetchall()
        return {name: (value, Path(source).name) for name, value, source in rows}

    for _ in range(2):  # the block is replaced, not appended again
        with EmbeddedPostgres(own.data_dir) as server:
            found = settings(server.url)
    assert found["max_wal_size"] == (4 * 2**30, "postgresql.conf")
    assert found["checkpoint_timeout"] == (900, "postgresql.conf")
    buffers, source = found["shared_buffers"]
    assert 128 * 2**20 <= buffers <= 2**30 and source == "postgresql.conf"
    conf = (own.cluster_dir / "postgresql.conf").read_text()
    assert conf.count("max_wal_size = '4GB'") == 1
    with (
        EmbeddedPostgres(own.data_dir) as server,
        psycopg.connect(server.url, autocommit=True) as conn,
    ):
        conn.execute("ALTER SYSTEM SET max_wal_size = '2GB'")
    try:
        with EmbeddedPostgres(own.data_dir) as server:
            assert settings(server.url)["max_wal_size"] == (2 * 2**30, "postgresql.auto.conf")
    finally:
        with (
            EmbeddedPostgres(own.data_dir) as server,
            psycopg.connect(server.url, autocommit=True) as conn,
        ):
            conn.execute("ALTER SYSTEM RESET max_wal_size")


def test_context_manager_starts_and_stops(own: EmbeddedPostgres) -> None:
    with EmbeddedPostgres(own.data_dir) as server:
        with psycopg.connect(server.url) as conn:
            conn.execute("SELECT 1")
        assert server.start_seconds is not None and server.start_seconds < 10
    assert not (own.cluster_dir / "postmaster.pid").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the cluster to a system user")
def test_as_root_the_server_runs_as_a_system_user(own: EmbeddedPostgres) -> None:
    assert own.cluster_dir.stat().st_uid != 0
    with own:
        pid = int((own.cluster_dir / "postmaster.pid").read_text().split()[0])
        assert os.stat(f"/proc/{pid}").st_uid == own.cluster_dir.stat().st_uid


def test_adopts_a_server_left_running_on_the_same_cluster(own: EmbeddedPostgres) -> None:
    first = EmbeddedPostgres(own.data_dir)
    try:
        url = first.start()
        second = EmbeddedPostgres(own.data_dir)
        assert second.start() == url
        assert second.adopted
    finally:
        first.stop()


def test_refuses_a_running_server_that_does_not_answer_on_our_port(
    own: EmbeddedPostgres,
) -> None:
    path = own.data_dir / CONNECTION_FILENAME
    original = path.read_text()
    first = EmbeddedPostgres(own.data_dir)
    try:
        first.start()
        facts = json.loads(original)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            facts["port"] = sock.getsockname()[1]  # nothing listens there
        path.write_text(json.dumps(facts))
        with pytest.raises(EmbeddedPostgresError, match="already running") as info:
            EmbeddedPostgres(own.data_dir).start()
        assert facts["password"] not in str(info.value)
    finally:
        path.write_text(original)
        first.stop()


def test_stale_pid_file_of_a_dead_process_is_harmless(own: EmbeddedPostgres) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _fake_postmaster_pid(own, dead.pid)
    with EmbeddedPostgres(own.data_dir) as server, psycopg.connect(server.url) as conn:
        conn.execute("SELECT 1")


def test_stale_pid_file_whose_pid_was_reused_is_removed(own: EmbeddedPostgres) -> None:
    _fake_postmaster_pid(own, os.getpid())  # alive, but python, not postgres
    EmbeddedPostgres(own.data_dir).stop()  # must not signal that process (us)
    with EmbeddedPostgres(own.data_dir) as server, psycopg.connect(server.url) as conn:
        conn.execute("SELECT 1")


def _fake_postmaster_pid(own: EmbeddedPostgres, pid: int) -> None:
    """What a crashed postmaster leaves behind (the format of PostgreSQL 18's lock file)."""
    port = json.loads((own.data_dir / CONNECTION_FILENAME).read_text())["port"]
    lines = [str(pid), str(own.cluster_dir), "1700000000", str(port), "", "127.0.0.1", "0 0"]
    path = own.cluster_dir / "postmaster.pid"
    path.write_text("\n".join([*lines, "ready   ", ""]))
    if os.geteuid() == 0:
        st = own.cluster_dir.stat()
        os.chown(path, st.st_uid, st.st_gid)


def test_start_failure_quotes_the_server_log_not_the_password(own: EmbeddedPostgres) -> None:
    port = json.loads((own.data_dir / CONNECTION_FILENAME).read_text())["port"]
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        with pytest.raises(EmbeddedPostgresError) as info:
            EmbeddedPostgres(own.data_dir).start()
    message = str(info.value)
    assert "tail of" in message
    assert "could not bind" in message or "Address already in use" in message
    assert _password(own.url) not in message


def test_password_never_reaches_the_server_log(own: EmbeddedPostgres) -> None:
    log = own.log_path.read_text()
    facts = json.loads((own.data_dir / CONNECTION_FILENAME).read_text())
    assert facts["password"] not in log
    assert facts["reader_password"] not in log


def test_explicit_port_is_used_and_remembered(own: EmbeddedPostgres) -> None:
    path = own.data_dir / CONNECTION_FILENAME
    original = path.read_text()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    try:
        with EmbeddedPostgres(own.data_dir, port=port) as server:
            assert server.port == port
            with psycopg.connect(server.url) as conn:
                assert conn.execute("SHOW port").fetchone() == (str(port),)
        assert json.loads(path.read_text())["port"] == port
    finally:
        path.write_text(original)
