"""Migration 4 on the real PostgreSQL: sketch columns, window_histograms, window_latest,
pipeline_metrics; applied over a database holding version-3 rows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg
import pytest
from hdrh.histogram import HdrHistogram

from streamgauge.sinks.schema import MIGRATIONS, SCHEMA_VERSION, ensure_schema
from streamgauge.sinks.store import run_sql
from streamgauge.sketches.hdr import HdrLayout

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


def _migrate(conn: psycopg.Connection[Any], upto: int) -> None:
    """Apply the migrations after the database's version up to ``upto`` (not the latest: a
    test of migration N reads the tables as N left them)."""
    row = conn.execute("SELECT max(version) FROM schema_migrations").fetchone()
    for version in range(int(row[0]) + 1 if row else 1, upto + 1):
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
                if t in ("window_histograms", "pipeline_metrics")}  # fmt: skip
    assert ("window_latest", "status") not in undocumented
    assert ("window_latest", "early_as_of") not in undocumented
    _, functions = run_sql(
        database,
        "SELECT p.proname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = 'public' AND p.proname LIKE 'streamgauge%%'"
        " AND obj_description(p.oid, 'pg_proc') IS NULL",
    )
    assert functions == [("streamgauge_hdr_merge_rows",)]  # an internal final function


def test_a_windows_bucket_and_count_arrays_are_of_one_length(database: str) -> None:
    """Written through window_results as two arrays, they are packed (schema version 17), and
    arrays of unequal lengths are refused; read back, they are the arrays written."""
    with psycopg.connect(database, autocommit=True) as conn:
        ensure_schema(conn)
        insert = (
            "INSERT INTO window_results (config_name, window_name, metric, window_start,"
            " window_end, metric_type, count, revision, emitted_at, hdr_buckets,"
            " hdr_counts) VALUES ('c', 'w', %s, '2024-01-01', '2024-01-01 00:00:10', 'ms',"
            " 3, 1, now(), %s, %s)"
        )
        with pytest.raises(psycopg.errors.CheckViolation, match="hdr_check"):
            conn.execute(insert, ("m", [1, 2], [3]))
        conn.execute(insert, ("m", [7, 2_000_000], [1, 2**40 - 1]))
        conn.execute(insert, ("n", None, None))
        stored = conn.execute(
            "SELECT metric, hdr_buckets, hdr_counts, hdr_bucket_counts FROM window_results"
            " ORDER BY metric").fetchall()  # fmt: skip
        assert stored == [
            ("m", [7, 2_000_000], [1, 2**40 - 1], [7 << 40 | 1, 2_000_000 << 40 | 2**40 - 1]),
            ("n", None, None, None),
        ]


LAYOUTS = {  # metric: the layout its windows were written with
    "api.latency": HdrLayout(1, 3_600_000_000, 2, 1000.0),
    "db.latency": HdrLayout(1, 3_600_000, 3, 100.0),
    "queue.age": HdrLayout(1, 10**12, 1, 0.01),
}


def test_version_twelve_moves_version_eleven_bucket_rows_into_their_windows(
    database: str,
) -> None:
    """Migration 12 over a version-11 store: each window's bucket rows become its row's arrays
    (the layout recognised from their bounds), in window_results and window_pending, and the
    window_histograms view gives back the rows the table held of the published windows; the
    SQL over it answers as before."""
    _apply(database, 11)
    rng = np.random.default_rng(12)
    window = "INSERT INTO {} (config_name, window_name, metric, window_start, window_end,"
    window += " metric_type, count, revision, emitted_at) VALUES ('c', 'w', %s, %s, %s, 'ms',"
    window += " %s, %s, now())"
    bucket = (
        "INSERT INTO window_histograms (config_name, window_name, metric, window_start,"
        " window_end, bucket, lower_bound, upper_bound, count, revision)"
        " VALUES ('c', 'w', %s, %s, %s, %s, %s, %s, %s, %s)"
    )
    expected: dict[tuple[str, str], tuple[list[int], list[int]]] = {}
    with psycopg.connect(database, autocommit=True) as conn:
        for i, (metric, layout) in enumerate(LAYOUTS.items()):
            for table, start in (("window_results", f"2024-01-01 00:00:{i}0"),
                                 ("window_pending", f"2024-01-01 00:01:{i}0")):  # fmt: skip
                values = np.exp(rng.normal(3, 2, 500))
                if metric == "queue.age":
                    values = np.concatenate([values, [0.0, 10.0**9]])
                found = layout.histogram(values)
                expected[(metric, start)] = (found.indices.tolist(), found.counts.tolist())
                end = f"{start[:-1]}9"
                conn.execute(window.format(table), (metric, start, end, len(values), 3))
                lower, upper = layout.bounds(found.indices)
                conn.execute("BEGIN")
                for b, lo, up, n in zip(found.indices.tolist(), lower.tolist(), upper.tolist(),
                                        found.counts.tolist(), strict=True):  # fmt: skip
                    conn.execute(bucket, (metric, start, end, b, lo, up, n, 3))
                conn.execute("COMMIT")
        # A window with only the bucket of 0 (any layout gives it bounds 0), and bucket rows
        # of a window whose row is gone (dropped by the migration).
        conn.execute(window.format("window_results"),
                     ("zero", "2024-01-01", "2024-01-01 00:00:09", 2, 3))  # fmt: skip
        conn.execute(bucket, ("zero", "2024-01-01", "2024-01-01 00:00:09", 0, 0.0, 0.0, 2, 3))
        conn.execute(bucket, ("gone", "2024-01-01", "2024-01-01 00:00:09", 7, 7.0, 7.0, 1, 3))
        published = (
            "metric <> 'gone' AND (metric, window_start) IN"
            " (SELECT metric, window_start FROM window_results)"
        )
        read = (
            "SELECT metric, window_start, bucket, lower_bound, upper_bound, count, revision"
            f" FROM window_histograms WHERE {published} ORDER BY 1, 2, 3"
        )
        quantiles = (
            "SELECT metric, streamgauge_hdr_quantiles(streamgauge_histogram(h),"
            f" '{{0, 0.5, 0.99, 1}}') FROM window_histograms h WHERE {published}"
            " GROUP BY metric ORDER BY metric"
        )
        before, quantiles_before = conn.execute(read).fetchall(), conn.execute(quantiles).fetchall()
        ensure_schema(conn)
        assert conn.execute(read).fetchall() == before
        assert conn.execute(quantiles).fetchall() == quantiles_before
        assert conn.execute(
            "SELECT count(*) FROM window_histograms WHERE NOT (" + published + ")"
        ).fetchone() == (0,)  # a pending window's buckets are in its row only
        stored = conn.execute(
            "SELECT metric, to_char(window_start, 'YYYY-MM-DD HH24:MI:SS'), hdr_buckets,"
            " hdr_counts, hdr_unit_magnitude, hdr_half_count_magnitude, hdr_value_scale"
            " FROM window_results UNION ALL SELECT metric,"
            " to_char(window_start, 'YYYY-MM-DD HH24:MI:SS'),"
            " streamgauge_hdr_buckets(hdr_bucket_counts),"
            " streamgauge_hdr_counts(hdr_bucket_counts),"
            " hdr_unit_magnitude, hdr_half_count_magnitude, hdr_value_scale FROM window_pending"
        ).fetchall()
        assert conn.execute(
            "SELECT relkind FROM pg_class WHERE relname = 'window_histograms'").fetchone() == ("v",)
    for metric, start, buckets, counts, unit, half, scale in stored:
        if metric == "zero":
            assert (buckets, counts) == ([0], [2])
            continue
        assert (buckets, counts) == expected[(metric, start)]
        layout = LAYOUTS[metric]
        reference = HdrHistogram(layout.lowest, layout.highest, layout.significant_digits)
        assert (unit, half, scale) == (
            reference.unit_magnitude, reference.sub_bucket_half_count_magnitude,
            layout.value_scale,
        )  # fmt: skip


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
        " WHERE relname IN ('window_pending', 'window_rows') ORDER BY relname",
    )  # window_rows: window_results' table since version 15
    assert options == [("window_pending", ["fillfactor=50"]), ("window_rows", ["fillfactor=50"])]
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


def test_version_fifteen_moves_the_sketches_beside_the_rows(database: str) -> None:
    """Migration 15 over version-14 rows: window_results becomes a view of window_rows and
    window_sketches that shows every row as it was, sketches and buckets included; the
    sketches are stored once, for the windows that have any; window_histograms still
    unnests the buckets; and a write through the view lands in the two tables."""
    _apply(database, 14)
    insert = (
        "INSERT INTO window_results (config_name, window_name, metric, window_start, window_end,"
        " metric_type, count, revision, emitted_at, sketch, hdr_buckets, hdr_counts,"
        " hdr_unit_magnitude, hdr_half_count_magnitude, hdr_value_scale) VALUES ('c', 'w', %s,"
        " '2024-01-01', '2024-01-01 00:00:10', %s, 3, 1, now(), %s, %s, %s, %s, %s, %s)"
    )
    before = "SELECT * FROM window_results ORDER BY metric"
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(insert, ("t", "ms", b"digest", [1000, 1001], [2, 1], 0, 7, 1000.0))
        conn.execute(insert, ("n", "c", None, None, None, None, None, None))
        rows_14 = conn.execute(before).fetchall()
        _migrate(conn, 15)
        columns_14 = len(rows_14[0])  # a later version adds columns after them
        assert [row[:columns_14] for row in conn.execute(before).fetchall()] == rows_14
        assert conn.execute("SELECT relkind FROM pg_class WHERE relname = 'window_results'"
                            ).fetchone() == ("v",)  # fmt: skip
        assert conn.execute("SELECT metric, sketch FROM window_sketches").fetchall() == [
            ("t", b"digest")]  # fmt: skip
        assert conn.execute(
            "SELECT bucket, count FROM window_histograms ORDER BY bucket").fetchall() == [
            (1000, 2), (1001, 1)]  # fmt: skip
        conn.execute("INSERT INTO window_results (config_name, window_name, metric, window_start,"
                     " window_end, metric_type, count, revision, emitted_at, sketch) VALUES"
                     " ('c', 'w', 'u', '2024-01-01', '2024-01-01 00:00:10', 's', 1, 1, now(),"
                     " '\\x01')")  # fmt: skip
        assert conn.execute(
            "SELECT r.tags, r.corrections, r.is_final, k.sketch FROM window_rows r"
            " JOIN window_sketches k USING (config_name, window_name, metric, tags,"
            " window_start, window_end) WHERE r.metric = 'u'").fetchall() == [
            ({}, 0, False, b"\x01")]  # fmt: skip  (the table's defaults through the view)
        conn.execute("DELETE FROM window_results WHERE metric IN ('t', 'u')")
        assert conn.execute("SELECT count(*) FROM window_sketches").fetchone() == (0,)


def test_version_sixteen_keeps_a_timer_window_s_sketches_in_its_row(database: str) -> None:
    """Migration 16: a timer window's sketches (a 1.5 kB t-digest, its HdrHistogram encoding,
    90 buckets: over the 2 kB at which PostgreSQL TOASTs a row) stay in the row, neither
    compressed nor moved to the TOAST table, before and after a finalization's rewrite."""
    _apply(database, 15)
    with psycopg.connect(database, autocommit=True) as conn:
        _migrate(conn, 16)
        digest = np.random.default_rng(1).random(192).tobytes()  # 1,536 bytes of doubles
        conn.execute(
            "INSERT INTO window_results (config_name, window_name, metric, window_start,"
            " window_end, metric_type, count, revision, emitted_at, sketch, hdr_histogram,"
            " hdr_buckets, hdr_counts) VALUES ('c', 'w', 't', '2024-01-01',"
            " '2024-01-01 00:00:10', 'ms', 90, 1, now(), %s, %s, %s, %s)",
            (digest, "H" * 180, list(range(1000, 1090)), [1] * 90),
        )  # fmt: skip
        conn.execute("UPDATE window_results SET is_final = true")
        size, stored = conn.execute(
            "SELECT pg_column_size(k.*), pg_column_size(k.sketch) FROM window_sketches k"
        ).fetchone()  # type: ignore[misc]
        assert size > 2_400 and stored >= len(digest)  # whole, and not compressed
        toast = conn.execute(
            "SELECT reltoastrelid::regclass::text FROM pg_class WHERE relname = 'window_sketches'"
        ).fetchone()[0]  # type: ignore[index]
        assert conn.execute(f"SELECT count(*) FROM {toast}").fetchone() == (0,)
        comment = conn.execute(
            "SELECT col_description('client_completeness'::regclass, a.attnum) FROM pg_attribute"
            " a WHERE a.attrelid = 'client_completeness'::regclass AND a.attname = 'source'"
        ).fetchone()[0]  # type: ignore[index]
        assert "unixgram pid N" in comment


def test_version_seventeen_packs_a_window_s_buckets_with_their_counts(database: str) -> None:
    """Migration 17 over version-16 windows, published and pending: window_results shows the
    same buckets and counts (and the packed array beside them), window_histograms the same
    rows, the pending row its packed buckets; the view keeps its column comments; and the
    sketches row of a timer window of 90 buckets shrinks by their 90 counts' arrays."""
    _apply(database, 16)
    insert = (
        "INSERT INTO {} (config_name, window_name, metric, window_start, window_end,"
        " metric_type, count, revision, emitted_at, hdr_buckets, hdr_counts,"
        " hdr_unit_magnitude, hdr_half_count_magnitude, hdr_value_scale) VALUES ('c', 'w', %s,"
        " '2024-01-01', '2024-01-01 00:00:10', 'ms', 3, 1, now(), %s, %s, 0, 7, 1000.0)"
    )
    buckets, counts = list(range(1000, 1090)), [1] * 89 + [2**33]
    read = "SELECT * FROM window_results ORDER BY metric"
    histograms = "SELECT * FROM window_histograms ORDER BY metric, bucket"
    size = "SELECT pg_column_size(k.*) FROM window_sketches k WHERE metric = 't'"
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(insert.format("window_results"), ("t", buckets, counts))
        conn.execute(insert.format("window_results"), ("n", None, None))
        conn.execute(insert.format("window_pending"), ("p", [5, 9], [3, 4]))
        rows_16, histograms_16 = conn.execute(read).fetchall(), conn.execute(histograms).fetchall()
        size_16 = conn.execute(size).fetchone()[0]  # type: ignore[index]
        _migrate(conn, 17)
        rows_17 = conn.execute(read).fetchall()
        assert [row[:-1] for row in rows_17] == rows_16
        assert [row[-1] for row in rows_17] == [
            None, [b << 40 | c for b, c in zip(buckets, counts, strict=True)]]  # fmt: skip
        assert conn.execute(histograms).fetchall() == histograms_16
        assert conn.execute(
            "SELECT streamgauge_hdr_buckets(hdr_bucket_counts),"
            " streamgauge_hdr_counts(hdr_bucket_counts) FROM window_pending").fetchall() == [
            ([5, 9], [3, 4])]  # fmt: skip
        # A row written now (an older one keeps its dropped arrays' bytes until rewritten).
        conn.execute(insert.format("window_results"), ("t2", buckets, counts))
        assert conn.execute(size.replace("'t'", "'t2'")).fetchone()[0] <= (  # type: ignore[index]
            size_16 - 90 * 4)
        comment = conn.execute(
            "SELECT col_description('window_results'::regclass, a.attnum) FROM pg_attribute a"
            " WHERE a.attrelid = 'window_results'::regclass AND a.attname = 'hdr_buckets'"
        ).fetchone()[0]  # type: ignore[index]
        assert "non-empty buckets" in comment


def test_version_eighteen_numbers_each_series_once(database: str) -> None:
    """Migration 18 over version-17 windows: each series (config, window, metric, tags) is
    one row of window_series, and window_rows and window_sketches are keyed by its id and the
    window's bounds; window_results, window_histograms, window_latest and
    client_completeness show what they showed; writes through window_results still land in
    both tables, numbering a new series once."""
    _apply(database, 17)
    insert = (
        "INSERT INTO window_results (config_name, window_name, metric, tags, window_start,"
        " window_end, metric_type, count, revision, emitted_at, sketch, hdr_buckets, hdr_counts,"
        " hdr_unit_magnitude, hdr_half_count_magnitude, hdr_value_scale) VALUES ('c', %s, %s,"
        " %s, '2024-01-01', %s, %s, 3, 1, '2024-01-01 00:01', %s, %s, %s, 0, 7, 1000.0)"
    )
    reads = [
        "SELECT * FROM window_results ORDER BY window_name, metric, tags, window_end",
        "SELECT * FROM window_histograms ORDER BY window_name, metric, tags, window_end, bucket",
        "SELECT * FROM window_latest ORDER BY window_name, metric, tags, window_end",
        "SELECT * FROM client_completeness ORDER BY source",
    ]
    with psycopg.connect(database, autocommit=True) as conn:
        for window, metric, tags, end, kind, sketch, buckets in (
            ("w", "t", '{"a": "1"}', "2024-01-01 00:00:10", "ms", b"d1", [1000, 1001]),
            ("w", "t", '{"a": "1"}', "2024-01-01 00:00:20", "ms", b"d2", [1002]),
            ("w", "t", '{"a": "2"}', "2024-01-01 00:00:10", "ms", b"d3", [1000]),
            ("m", "t", '{"a": "1"}', "2024-01-01 00:01:00", "ms", b"d4", [1003]),
            ("w", "streamgauge.ingest.client.lines", '{"source": "udp://x"}',
             "2024-01-01 00:00:10", "c", None, None),
        ):  # fmt: skip
            conn.execute(insert, (window, metric, tags, end, kind, sketch, buckets,
                                  None if buckets is None else [1] * len(buckets)))  # fmt: skip
        conn.execute(
            "INSERT INTO window_pending (config_name, window_name, metric, window_start,"
            " window_end, metric_type, count, revision, emitted_at) VALUES ('c', 'w', 'p',"
            " '2024-01-01 00:00:20', '2024-01-01 00:00:30', 'c', 1, 1, '2024-01-01 00:01')"
        )
        before = [conn.execute(read).fetchall() for read in reads]
        _migrate(conn, 18)
        assert [conn.execute(read).fetchall() for read in reads] == before
        assert conn.execute(
            "SELECT window_name, metric, tags FROM window_series ORDER BY 1, 2, tags::text"
        ).fetchall() == [
            ("m", "t", {"a": "1"}), ("w", "p", {}),
            ("w", "streamgauge.ingest.client.lines", {"source": "udp://x"}),
            ("w", "t", {"a": "1"}), ("w", "t", {"a": "2"})]  # fmt: skip
        keys = (
            "SELECT c.relname, array_agg(a.attname ORDER BY k.i) FROM pg_index x"
            " JOIN pg_class c ON c.oid = x.indrelid"
            " CROSS JOIN unnest(x.indkey) WITH ORDINALITY AS k(attnum, i)"
            " JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = k.attnum"
            " WHERE x.indisprimary AND c.relname IN ('window_rows', 'window_sketches')"
            " GROUP BY c.relname ORDER BY 1"
        )
        assert conn.execute(keys).fetchall() == [
            ("window_rows", ["series_id", "window_start", "window_end"]),
            ("window_sketches", ["series_id", "window_start", "window_end"])]  # fmt: skip
        conn.execute(insert, ("w", "t", '{"a": "3"}', "2024-01-01 00:00:10", "ms", b"d5",
                              [1000], [4]))  # fmt: skip
        conn.execute(insert, ("w", "t", '{"a": "3"}', "2024-01-01 00:00:20", "ms", None,
                              None, None))  # fmt: skip
        assert conn.execute(
            "SELECT count(*) FROM window_series WHERE tags = '{\"a\": \"3\"}'").fetchone() == (1,)
        assert conn.execute(
            "SELECT window_end::text, sketch FROM window_results WHERE tags->>'a' = '3'"
            " ORDER BY 1").fetchall() == [
            ("2024-01-01 00:00:10+00", b"d5"), ("2024-01-01 00:00:20+00", None)]  # fmt: skip
        conn.execute("DELETE FROM window_results WHERE metric = 't'")
        assert conn.execute("SELECT count(*) FROM window_sketches").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM window_rows").fetchone() == (1,)
