"""Migration 4 on the real PostgreSQL: sketch columns, window_histograms, window_latest,
pipeline_metrics; applied over a database holding version-3 rows."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from streamgauge.sinks.schema import MIGRATIONS, SCHEMA_VERSION, ensure_schema
from streamgauge.sinks.store import run_sql

NEW_RESULT_COLUMNS = {"p999": "double precision", "sketch": "bytea", "hdr_histogram": "text"}


@pytest.fixture
def database(postgres_url: str) -> Iterator[str]:
    run_sql(postgres_url, "DROP DATABASE IF EXISTS sg_schema WITH (FORCE)")
    run_sql(postgres_url, "CREATE DATABASE sg_schema")
    yield postgres_url.rsplit("/", 1)[0] + "/sg_schema"
    run_sql(postgres_url, "DROP DATABASE sg_schema WITH (FORCE)")


def _apply(url: str, upto: int) -> None:
    """Apply migrations 1..upto the way ensure_schema does (the state of an older release)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE schema_migrations (version int PRIMARY KEY, applied_at timestamptz"
            " NOT NULL DEFAULT now())"
        )
        for version in range(1, upto + 1):
            conn.execute(MIGRATIONS[version - 1].encode())
            conn.execute("INSERT INTO schema_migrations (version) VALUES (%s)", (version,))


def test_version_four_over_version_three_rows(database: str) -> None:
    assert SCHEMA_VERSION >= 4
    _apply(database, 3)
    run_sql(
        database,
        "INSERT INTO window_results (config_name, window_name, metric, window_start,"
        " window_end, metric_type, count, revision, emitted_at) VALUES ('c', 'w', 'm',"
        " '2024-01-01', '2024-01-01 00:00:10', 'ms', 3, 1, now())",
    )
    with psycopg.connect(database, autocommit=True) as conn:
        ensure_schema(conn)
    _, rows = run_sql(database, "SELECT count, p999, sketch, hdr_histogram FROM window_results")
    assert rows == [(3, None, None, None)]  # old rows kept; the new columns are NULL
    for table in ("window_results", "window_pending"):
        _, cols = run_sql(
            database,
            "SELECT column_name, data_type, is_nullable FROM information_schema.columns"
            " WHERE table_name = %s AND column_name = ANY(%s)",
            (table, list(NEW_RESULT_COLUMNS)),
        )
        assert {c: (t, n) for c, t, n in cols} == {
            c: (t, "YES") for c, t in NEW_RESULT_COLUMNS.items()
        }


def test_every_column_of_every_table_and_view_is_commented(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        ensure_schema(conn)
    _, rows = run_sql(
        database,
        "SELECT c.relname, a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
        " JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE n.nspname = 'public' AND c.relkind IN ('r', 'v')"
        " AND c.relname <> 'schema_migrations'"
        " AND a.attnum > 0 AND NOT a.attisdropped AND col_description(c.oid, a.attnum) IS NULL"
        " ORDER BY 1, 2",
    )
    # window_pending inherited its first columns' comments (LIKE ... INCLUDING ALL) but not
    # corrections, which migration 3 added to window_results only; id is late_events' serial.
    # window_latest's columns other than status read as the columns they come from.
    undocumented = {(t, c) for t, c in rows}
    assert ("window_pending", "p999") not in undocumented
    assert not {(t, c) for t, c in undocumented
                if t in ("window_histograms", "pipeline_metrics", "window_held")}  # fmt: skip
    # window_held_rows' columns read as window_results' but for the two its holding sets.
    assert not {("window_held_rows", "revision"), ("window_held_rows", "emitted_at")} & undocumented
    assert ("window_latest", "status") not in undocumented
    assert ("window_latest", "early_as_of") not in undocumented
    _, functions = run_sql(
        database,
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'public' AND p.proname LIKE 'streamgauge%%'"
        " AND obj_description(p.oid, 'pg_proc') IS NULL",
    )
    assert functions == [("streamgauge_hdr_merge_rows",)]  # an internal final function


def test_window_histograms_refuses_empty_buckets_and_bad_bounds(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        ensure_schema(conn)
        insert = (
            "INSERT INTO window_histograms (config_name, window_name, metric, window_start,"
            " window_end, bucket, lower_bound, upper_bound, count, revision)"
            " VALUES ('c', 'w', 'm', '2024-01-01', '2024-01-01 00:00:10', 7, %s, %s, %s, 1)"
        )
        with pytest.raises(psycopg.errors.CheckViolation, match="count_check"):
            conn.execute(insert, (1.0, 1.5, 0))
        with pytest.raises(psycopg.errors.CheckViolation, match="bounds_check"):
            conn.execute(insert, (2.0, 1.5, 1))
        conn.execute(insert, (1.0, 1.5, 4))
        with pytest.raises(psycopg.errors.UniqueViolation):  # one row per window and bucket
            conn.execute(insert, (1.0, 1.5, 5))
        _, indexes = run_sql(
            database,
            "SELECT indexdef FROM pg_indexes WHERE tablename = 'window_histograms' ORDER BY 1",
        )
        defs = " | ".join(str(d) for (d,) in indexes)
        assert "(window_end)" in defs
        assert "(config_name, window_name, metric, window_end)" in defs


def test_window_latest_labels_final_provisional_and_pending(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        ensure_schema(conn)
    values = (
        "(config_name, window_name, metric, window_start, window_end, metric_type, count,"
        " revision, is_final, emitted_at) VALUES"
    )
    run_sql(
        database,
        f"INSERT INTO window_results {values}"
        " ('c', 'w', 'm', '2024-01-01 00:00:00', '2024-01-01 00:00:10', 'ms', 1, 3, true, now()),"
        " ('c', 'w', 'm', '2024-01-01 00:00:10', '2024-01-01 00:00:20', 'ms', 2, 4, false, now())",
    )
    run_sql(
        database,
        f"INSERT INTO window_pending {values}"
        " ('c', 'w', 'm', '2024-01-01 00:00:20', '2024-01-01 00:00:30', 'ms', 5, 5, false, now())",
    )
    _, rows = run_sql(
        database, "SELECT count, revision, status FROM window_latest ORDER BY window_start"
    )
    assert rows == [(1, 3, "final"), (2, 4, "provisional"), (5, 5, "pending")]


def test_window_latest_labels_early_rows_and_prefers_them_on_a_revision_tie(
    database: str,
) -> None:
    """Migration 6: an open window published early is in both tables; the view shows the
    early row unless the pending one is newer."""
    with psycopg.connect(database, autocommit=True) as conn:
        ensure_schema(conn)
    values = (
        "(config_name, window_name, metric, window_start, window_end, metric_type, count,"
        " revision, is_final, emitted_at{}) VALUES"
    )
    run_sql(
        database,
        f"INSERT INTO window_results {values.format(', early_as_of')}"
        " ('c', 'w', 'a', '2024-01-01 00:00:00', '2024-01-01 00:00:10', 'c', 1, 4, false, now(),"
        "  '2024-01-01 00:00:02'),"
        " ('c', 'w', 'b', '2024-01-01 00:00:00', '2024-01-01 00:00:10', 'c', 2, 4, false, now(),"
        "  '2024-01-01 00:00:02')",
    )
    run_sql(
        database,
        f"INSERT INTO window_pending {values.format('')}"
        " ('c', 'w', 'a', '2024-01-01 00:00:00', '2024-01-01 00:00:10', 'c', 1, 4, false, now()),"
        " ('c', 'w', 'b', '2024-01-01 00:00:00', '2024-01-01 00:00:10', 'c', 3, 5, false, now())",
    )
    _, rows = run_sql(
        database,
        "SELECT metric, count, revision, status, early_as_of IS NOT NULL FROM window_latest"
        " ORDER BY metric",
    )
    assert rows == [("a", 1, 4, "early", True), ("b", 3, 5, "pending", False)]


def test_pipeline_metrics_one_row_per_name_labels_and_time(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        ensure_schema(conn)
        insert = "INSERT INTO pipeline_metrics (ts, name, labels, value) VALUES (%s, %s, %s, %s)"
        conn.execute(insert, ("2024-01-01", "streamgauge.store.errors", "{}", 1.0))
        conn.execute(insert, ("2024-01-01", "streamgauge.store.errors", '{"kind": "x"}', 2.0))
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute(insert, ("2024-01-01", "streamgauge.store.errors", "{}", 3.0))
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute(insert, ("2024-01-01", "streamgauge.store.errors", "[]", 3.0))


def test_version_seven_leaves_room_on_window_pending_pages(database: str) -> None:
    """Migration 7 over version-6 rows: window_pending (rewritten every batch) keeps half of
    each page free for HOT updates; the rows stay. (window_results too, from migration 10.)"""
    _apply(database, 6)
    run_sql(
        database,
        "INSERT INTO window_pending (config_name, window_name, metric, window_start,"
        " window_end, metric_type, count, revision, emitted_at) VALUES ('c', 'w', 'm',"
        " '2024-01-01', '2024-01-01 00:00:10', 'c', 3, 1, now())",
    )
    with psycopg.connect(database, autocommit=True) as conn:
        ensure_schema(conn)
    _, options = run_sql(
        database,
        "SELECT relname, reloptions FROM pg_class"
        " WHERE relname IN ('window_pending', 'window_results') ORDER BY relname",
    )
    assert options == [("window_pending", ["fillfactor=50"]), ("window_results", ["fillfactor=50"])]
    _, rows = run_sql(database, "SELECT count FROM window_pending")
    assert rows == [(3,)]


def test_version_ten_lists_the_open_ends_of_version_nine_rows(database: str) -> None:
    """Migration 10 over version-9 rows: the ends of the rows not final yet are listed in
    window_open_ends (the finalization reads them instead of the partial index it drops), and
    from then on its triggers list the ends of every provisional row written."""
    _apply(database, 9)
    insert = (
        "INSERT INTO window_results (config_name, window_name, metric, window_start, window_end,"
        " metric_type, count, revision, is_final, emitted_at) VALUES ('c', 'w', %s,"
        " '2024-01-01', %s, %s, 1, 1, %s, now())"
    )
    with psycopg.connect(database, autocommit=True) as conn:
        for metric, end, mtype, final in (("a", "2024-01-01 00:00:10", "c", False),
                                          ("b", "2024-01-01 00:00:10", "c", False),
                                          ("t", "2024-01-01 00:00:10", "ms", True),
                                          ("a", "2024-01-01 00:00:20", "c", True)):  # fmt: skip
            conn.execute(insert, (metric, end, mtype, final))
        ensure_schema(conn)
        listed = "SELECT metric_type, window_end::text FROM window_open_ends ORDER BY 1, 2"
        assert conn.execute(listed).fetchall() == [("c", "2024-01-01 00:00:10+00")]
        assert conn.execute(
            "SELECT to_regclass('window_results_open_idx') IS NULL").fetchone() == (True,)
        conn.execute(insert, ("t", "2024-01-01 00:00:30", "ms", False))
        conn.execute("UPDATE window_results SET is_final = false WHERE metric = 'a'"
                     " AND window_end = '2024-01-01 00:00:20'")  # fmt: skip
        assert conn.execute(listed).fetchall() == [
            ("c", "2024-01-01 00:00:10+00"), ("c", "2024-01-01 00:00:20+00"),
            ("ms", "2024-01-01 00:00:30+00")]  # fmt: skip
