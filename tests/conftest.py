"""Shared fixtures: one embedded PostgreSQL and one SparkSession for the whole test session.

Set ``STREAMGAUGE_TEST_POSTGRES_URL`` to run the suite against an existing server instead (its
tables are truncated by ``clean_store``: never point it at a database you care about).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from streamgauge.sinks.embedded import EmbeddedPostgres
from streamgauge.sinks.store import ResultStore, RetryPolicy, run_sql
from streamgauge.windows.session import build_spark_session
from tests.s3_server import S3Server, running_s3_server


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """URL (superuser ``streamgauge``, TCP, password) of a server shared by the session."""
    external = os.environ.get("STREAMGAUGE_TEST_POSTGRES_URL")
    if external:
        yield external
        return
    # Not tmp_path_factory: as root the server runs as another user, who must traverse every
    # ancestor of the cluster, and every pytest session (anyone's, running concurrently) resets
    # /tmp/pytest-of-root to mode 0700, locking that user out of a running cluster (pg_ctl:
    # "could not access directory ... Permission denied"). So: a directory directly in /tmp.
    base = Path(tempfile.mkdtemp(prefix="streamgauge-test-session-"))
    # sync_initdb=False: a throw-away cluster need not survive a power cut (saves ~0.5 s).
    server = EmbeddedPostgres(base / "data", sync_initdb=False)
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@contextlib.contextmanager
def stopped_cluster(prefix: str) -> Iterator[EmbeddedPostgres]:
    """An initialised, stopped cluster of the caller's own, removed afterwards.

    Not under pytest's tmp_path: as root, every pytest session resets /tmp/pytest-of-root to
    0700, which locks the server's system user out of its own cluster.
    """
    base = Path(tempfile.mkdtemp(prefix=prefix))
    server = EmbeddedPostgres(base / "data", sync_initdb=False)
    try:
        server.start()
        server.stop()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def clean_store(postgres_url: str) -> str:
    """The session server's URL, with the schema in place and every result table empty."""
    with ResultStore(postgres_url, retry=RetryPolicy(max_attempts=3)) as store:
        store.ensure_schema()
    run_sql(
        postgres_url,
        "TRUNCATE window_rows, window_sketches, window_pending, "
        "window_open_ends, "
        "sink_batches, pipeline_state, late_events, pipeline_metrics",
    )
    return postgres_url


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One SparkSession for the whole run: a cold start costs seconds."""
    session = build_spark_session("local[2]", app_name="streamgauge-tests", shuffle_partitions=2)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """A real S3 API server (moto, server mode) on 127.0.0.1, for object-store spools."""
    with running_s3_server(tmp_path_factory.mktemp("s3")) as server:
        yield server
