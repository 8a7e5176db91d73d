"""Schema migrations and the idempotent result store, against a real PostgreSQL (no mocks).

Timeline of the windows used below (one-minute tumbling windows, times in minutes)::

    0         1         2         3         4
    |---w0----|---w1----|---w2----|---w3----|
                                     ^ watermark 3:30, lateness 0:30
    w0, w1, w2 end + lateness <= 3:30 → final;  w3 ends 4:00 → still provisional
"""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
from collections.abc import Iterator
from typing import Any, cast

import numpy as np
import psycopg
import pyarrow as pa
import pytest

from streamgauge.clock import ManualClock
from streamgauge.sinks.embedded import EmbeddedPostgres
from streamgauge.sinks.schema import SCHEMA_VERSION, SchemaVersionError, ensure_schema
from streamgauge.sinks.store import (
    RESULT_COLUMNS,
    RESULT_SCHEMA,
    BatchOutcome,
    Finalization,
    ResultStore,
    ResultStoreUnavailable,
    RetryPolicy,
    pack_hdr_buckets,
    run_sql,
)
from tests.conftest import stopped_cluster

MINUTE = 60_000
T0 = 1_700_000_000_123  # deliberately not a whole second: milliseconds must survive
NOW = 1_800_000_000_000


def row(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "config_name": "web",
        "window_name": "1m",
        "metric": "api.latency",
        "tags": '{"host":"a"}',
        "metric_type": "ms",
        "window_start_ms": T0,
        "window_end_ms": T0 + MINUTE,
        "count": 3,
        "sum": 6.0,
        "min": 1.0,
        "max": 3.0,
        "last": 2.0,
        "p50": 2.0,
        "p90": 3.0,
        "p99": 3.0,
        "p999": 3.0,
        "distinct_count": None,
        "sketch": None,
        "hdr_histogram": None,
        "hdr_bucket_counts": None,
        "hdr_unit_magnitude": None,
        "hdr_half_count_magnitude": None,
        "hdr_value_scale": None,
        "revision": 1,
        "is_final": False,
        "late_events": 0,
        "emitted_at_ms": NOW,
    }
    base.update(overrides)
    return base


def table(*rows: dict[str, Any]) -> pa.Table:
    if not rows:
        return RESULT_SCHEMA.empty_table()
    return pa.Table.from_pylist(list(rows)).select(list(RESULT_COLUMNS))


def window(i: int, **overrides: Any) -> dict[str, Any]:
    return row(window_start_ms=T0 + i * MINUTE, window_end_ms=T0 + (i + 1) * MINUTE, **overrides)


def stored(url: str, where: str = "true") -> list[dict[str, Any]]:
    columns, rows = run_sql(
        url,
        "SELECT metric, tags, (extract(epoch FROM window_start) * 1000)::bigint AS start_ms,"
        " (extract(epoch FROM window_end) * 1000)::bigint AS end_ms, count, sum, revision,"
        " is_final, (extract(epoch FROM emitted_at) * 1000)::bigint AS emitted_ms"
        f" FROM window_results WHERE {where} ORDER BY window_start, metric",
    )
    return [dict(zip(columns, r, strict=True)) for r in rows]


@pytest.fixture
def store(clean_store: str) -> Iterator[ResultStore]:
    with ResultStore(clean_store, clock=ManualClock(NOW), retry=RetryPolicy(max_attempts=2)) as s:
        yield s


# -- schema ---------------------------------------------------------------------------------


def test_ensure_schema_twice_is_a_no_op(clean_store: str) -> None:
    before = run_sql(clean_store, "SELECT version, applied_at FROM schema_migrations")[1]
    with ResultStore(clean_store) as store:
        store.ensure_schema()
        store.ensure_schema()
    after = run_sql(clean_store, "SELECT version, applied_at FROM schema_migrations")[1]
    assert after == before
    assert [v for v, _ in after] == list(range(1, SCHEMA_VERSION + 1))


def test_every_result_column_is_commented(clean_store: str) -> None:
    _, rows = run_sql(
        clean_store,
        "SELECT c.relname, a.attname FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid"
        " WHERE c.relname IN ('window_results', 'sink_batches', 'pipeline_state')"
        " AND a.attnum > 0 AND NOT a.attisdropped AND col_description(c.oid, a.attnum) IS NULL",
    )
    assert rows == []


@pytest.fixture
def fresh_database(postgres_url: str) -> Iterator[str]:
    run_sql(postgres_url, "DROP DATABASE IF EXISTS sg_fresh WITH (FORCE)")
    run_sql(postgres_url, "CREATE DATABASE sg_fresh")
    yield postgres_url.rsplit("/", 1)[0] + "/sg_fresh"
    run_sql(postgres_url, "DROP DATABASE sg_fresh WITH (FORCE)")


def test_concurrent_ensure_schema_on_an_empty_database(fresh_database: str) -> None:
    barrier = threading.Barrier(4)
    errors: list[BaseException] = []

    def migrate() -> None:
        try:
            with psycopg.connect(fresh_database, autocommit=True) as conn:
                barrier.wait()
                ensure_schema(conn)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=migrate) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    _, rows = run_sql(fresh_database, "SELECT version FROM schema_migrations ORDER BY 1")
    assert rows == [(v,) for v in range(1, SCHEMA_VERSION + 1)]


def test_a_newer_schema_is_refused(fresh_database: str) -> None:
    with psycopg.connect(fresh_database, autocommit=True) as conn:
        ensure_schema(conn)
        conn.execute("INSERT INTO schema_migrations VALUES (%s, now())", (SCHEMA_VERSION + 1,))
        with pytest.raises(SchemaVersionError, match="upgrade streamgauge"):
            ensure_schema(conn)


# -- upserts and revisions ------------------------------------------------------------------


def test_upsert_inserts(store: ResultStore, clean_store: str) -> None:
    out = store.commit_batch("q", 0, table(window(0), window(1, metric="b")), [], revision=1)
    assert out == BatchOutcome(already_committed=False, rows_upserted=2, rows_finalized=0)
    rows = stored(clean_store)
    assert [(r["metric"], r["start_ms"], r["count"], r["revision"]) for r in rows] == [
        ("api.latency", T0, 3, 1),
        ("b", T0 + MINUTE, 3, 1),
    ]
    _, batches = run_sql(clean_store, "SELECT query_name, batch_id, rows_written FROM sink_batches")
    assert batches == [("q", 0, 2)]


def test_higher_revision_replaces(store: ResultStore, clean_store: str) -> None:
    store.commit_batch("q", 0, table(row(count=3, revision=1)), [], revision=1)
    out = store.commit_batch("q", 1, table(row(count=5, sum=9.5, revision=2)), [], revision=2)
    assert out.rows_upserted == 1
    [r] = stored(clean_store)
    assert (r["count"], r["sum"], r["revision"]) == (5, 9.5, 2)


@pytest.mark.parametrize("late_revision", [1, 2], ids=["lower", "equal"])
def test_lower_or_equal_revision_changes_nothing(
    store: ResultStore, clean_store: str, late_revision: int
) -> None:
    store.commit_batch("q", 0, table(row(count=5, revision=2)), [], revision=2)
    out = store.commit_batch(
        "q", 1, table(row(count=99, revision=late_revision)), [], revision=late_revision
    )
    assert out == BatchOutcome(already_committed=False, rows_upserted=0, rows_finalized=0)
    [r] = stored(clean_store)
    assert (r["count"], r["revision"]) == (5, 2)


def test_replayed_batch_id_changes_nothing(store: ResultStore, clean_store: str) -> None:
    store.commit_batch("q", 7, table(row(count=3, revision=1)), [], revision=1)
    replay = store.commit_batch("q", 7, table(row(count=99, revision=9)), [], revision=9)
    assert replay == BatchOutcome(already_committed=True, rows_upserted=0, rows_finalized=0)
    [r] = stored(clean_store)
    assert (r["count"], r["revision"]) == (3, 1)
    # The same batch id of another query is a different batch.
    other = store.commit_batch("other", 7, table(row(count=4, revision=10)), [], revision=10)
    assert not other.already_committed


def test_timestamps_are_exact_to_the_millisecond(store: ResultStore, clean_store: str) -> None:
    store.commit_batch("q", 0, table(row(emitted_at_ms=T0 + 7)), [], revision=1)
    [r] = stored(clean_store)
    assert (r["start_ms"], r["end_ms"], r["emitted_ms"]) == (T0, T0 + MINUTE, T0 + 7)
    _, [(text,)] = run_sql(clean_store, "SELECT window_start::text FROM window_results")
    assert text == "2023-11-14 22:13:20.123+00"  # the session time zone is UTC by default


def test_tags_match_regardless_of_key_order(store: ResultStore, clean_store: str) -> None:
    store.commit_batch("q", 0, table(row(tags='{"a":"1","b":"2"}', revision=1)), [], revision=1)
    out = store.commit_batch(
        "q", 1, table(row(tags='{"b": "2", "a": "1"}', count=8, revision=2)), [], revision=2
    )
    assert out.rows_upserted == 1
    [r] = stored(clean_store)
    assert (r["tags"], r["count"]) == ({"a": "1", "b": "2"}, 8)


def test_state_is_upserted_with_the_batch(store: ResultStore, clean_store: str) -> None:
    no_columns = pa.table({})  # "nothing to write" needs no schema
    store.commit_batch("q", 0, no_columns, [], revision=1, state={("web", "watermark"): T0})
    store.commit_batch("q", 1, table(), [], revision=2, state={("web", "watermark"): T0 + 5})
    _, rows = run_sql(clean_store, "SELECT config_name, key, value_ms FROM pipeline_state")
    assert rows == [("web", "watermark", T0 + 5)]


# -- finalization ---------------------------------------------------------------------------


def test_finalization_marks_only_windows_past_end_plus_lateness(
    store: ResultStore, clean_store: str
) -> None:
    rows = [window(i) for i in range(4)] + [
        window(0, window_name="5m"),  # another window definition: not named, not touched
        window(0, config_name="db"),  # another config: not touched
    ]
    store.commit_batch("q", 0, table(*rows), [], revision=1)
    watermark = T0 + 3 * MINUTE + MINUTE // 2
    fin = Finalization("web", "1m", watermark_ms=watermark, allowed_lateness_ms=MINUTE // 2)
    out = store.commit_batch("q", 1, table(), [fin], revision=2)
    assert out.rows_finalized == 3
    finals = {
        (r["start_ms"] - T0) // MINUTE: (r["is_final"], r["revision"], r["emitted_ms"])
        for r in stored(clean_store, "config_name = 'web' AND window_name = '1m'")
    }
    assert finals == {
        0: (True, 2, NOW),
        1: (True, 2, NOW),
        2: (True, 2, NOW),  # end 3:00 + 0:30 == watermark 3:30: final (<=)
        3: (False, 1, NOW),
    }
    others = stored(clean_store, "NOT (config_name = 'web' AND window_name = '1m')")
    assert [r["is_final"] for r in others] == [False, False]
    # Finalizing again is a no-op: final rows are not rewritten.
    again = store.commit_batch("q", 2, table(), [fin], revision=3)
    assert again.rows_finalized == 0


def test_finalization_and_upsert_in_one_batch(store: ResultStore, clean_store: str) -> None:
    # The last revision of w0 and its finalization arrive in the same batch: both apply, even
    # though the row carries the batch's own revision.
    store.commit_batch("q", 0, table(window(0, count=1)), [], revision=1)
    fin = Finalization("web", "1m", watermark_ms=T0 + MINUTE, allowed_lateness_ms=0)
    out = store.commit_batch("q", 1, table(window(0, count=2, revision=2)), [fin], revision=2)
    assert (out.rows_upserted, out.rows_finalized) == (1, 1)
    [r] = stored(clean_store)
    assert (r["count"], r["is_final"], r["revision"]) == (2, True, 2)


def test_finalization_never_touches_a_newer_revision(store: ResultStore, clean_store: str) -> None:
    store.commit_batch("q", 0, table(window(0, revision=10)), [], revision=10)
    fin = Finalization("web", "1m", watermark_ms=T0 + MINUTE, allowed_lateness_ms=0)
    assert store.commit_batch("q", 1, table(), [fin], revision=5).rows_finalized == 0
    [r] = stored(clean_store)
    assert (r["is_final"], r["revision"]) == (False, 10)
    # Its end stays listed as open, so a finalization at its revision or above still finds it.
    assert store.commit_batch("q", 2, table(), [fin], revision=11).rows_finalized == 1
    [r] = stored(clean_store)
    assert (r["is_final"], r["revision"]) == (True, 11)
    assert open_ends(clean_store) == []


def open_ends(url: str) -> list[tuple[Any, ...]]:
    """``window_open_ends`` (schema migration 10): (config, window, type, end ms)."""
    return run_sql(
        url,
        "SELECT config_name, window_name, metric_type, (extract(epoch FROM window_end)"
        " * 1000)::bigint FROM window_open_ends ORDER BY 1, 2, 3, 4",
    )[1]


def test_every_provisional_rows_end_is_listed_until_its_finalization(
    store: ResultStore, clean_store: str
) -> None:
    """The finalization finds its rows through ``window_open_ends``, which triggers keep for
    every statement writing ``window_results``: a row inserted provisional (the upsert, a
    promotion from ``window_pending``) lists its (config, window, type, end); a row inserted
    final lists nothing; a finalization clears the ends it made final. Retention forgets ends
    whose rows it deleted."""
    counter = window(0, metric="hits", metric_type="c")
    timer = window(0, metric="api.latency", metric_type="ms")
    final_already = window(1, metric="hits", metric_type="c", is_final=True)
    store.commit_batch("q", 0, table(counter, timer, final_already), [], revision=1)
    end0 = T0 + MINUTE
    assert open_ends(clean_store) == [("web", "1m", "c", end0), ("web", "1m", "ms", end0)]
    # Promoted from window_pending (window 2 held, then passed): listed too.
    hold = {("web", "1m"): T0}
    store.commit_batch("q", 1, table(window(2, metric="hits", metric_type="c", revision=2)), [],
                       revision=2, hold_after=hold)  # fmt: skip
    passed = T0 + 3 * MINUTE
    store.commit_batch("q", 2, table(), [], revision=3, hold_after={("web", "1m"): passed})
    end2 = T0 + 3 * MINUTE
    assert ("web", "1m", "c", end2) in open_ends(clean_store)
    # Retention: window 0's rows go, and their listed ends with them.
    assert store.prune(end0 + 1)["window_open_ends"] == 2
    assert open_ends(clean_store) == [("web", "1m", "c", end2)]
    # The finalization up to window 2: its end leaves the list.
    fin = Finalization("web", "1m", end2, 0)
    assert store.commit_batch("q", 3, table(), [fin], revision=4).rows_finalized == 1
    assert open_ends(clean_store) == []


def test_a_window_the_watermark_passes_by_its_lateness_is_promoted_final_not_rewritten(
    store: ResultStore, clean_store: str
) -> None:
    """A batch whose watermark passes a pending window's end *and* its allowed lateness
    inserts it final, as finalizing it later in the batch would (same revision, same
    emitted_at), without rewriting it: nothing is left for the finalization to do. A window
    only past its end is promoted provisional."""
    pending = table(*(window(i, metric=m, metric_type="c") for i, m in enumerate("abc")))
    store.commit_batch("q", 0, pending, [], revision=1, hold_after={("web", "1m"): T0})
    assert stored(clean_store) == []
    watermark = T0 + 2 * MINUTE + MINUTE // 2  # past the ends of windows 0 and 1
    lateness = MINUTE  # window 0 is past end + lateness, window 1 is not
    out = store.commit_batch(
        "q", 1, table(), [Finalization("web", "1m", watermark, lateness)], revision=2,
        hold_after={("web", "1m"): watermark},
    )
    assert (out.rows_upserted, out.rows_finalized) == (2, 0)
    emitted = {r["metric"]: (r["is_final"], r["revision"], r["emitted_ms"])
               for r in stored(clean_store)}  # fmt: skip
    assert emitted == {"a": (True, 2, NOW), "b": (False, 2, NOW)}
    _, still_pending = run_sql(clean_store, "SELECT metric FROM window_pending")
    assert still_pending == [("c",)]


def hdr(buckets: dict[int, int]) -> dict[str, Any]:
    """A window row's HDR columns holding ``buckets`` (index: count), in the default layout."""
    packed = pack_hdr_buckets(np.array(list(buckets)), np.array(list(buckets.values())))
    return {"hdr_bucket_counts": packed.tolist(),
            "hdr_unit_magnitude": 0, "hdr_half_count_magnitude": 7, "hdr_value_scale": 1000.0}


def stored_buckets(url: str) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    _, rows = run_sql(
        url,
        "SELECT ((extract(epoch FROM window_start) * 1000)::bigint - %s) / %s, bucket, count,"
        " revision FROM window_histograms",
        [T0, MINUTE],
    )
    return {(r[0], r[1]): (r[2], r[3]) for r in rows}


def test_a_windows_buckets_are_replaced_as_a_set_by_a_higher_revision(
    store: ResultStore, clean_store: str
) -> None:
    store.commit_batch("q", 0, table(window(0, **hdr({5: 1, 7: 2})), window(1, **hdr({9: 3}))),
                       [], revision=1)  # fmt: skip
    # Window 0 changes at revision 2: bucket 5 is gone from its new set, bucket 8 is new.
    store.commit_batch("q", 1, table(window(0, revision=2, count=4, **hdr({7: 3, 8: 1}))), [],
                       revision=2)  # fmt: skip
    assert stored_buckets(clean_store) == {(0, 7): (3, 2), (0, 8): (1, 2), (1, 9): (3, 1)}
    # An older set arriving late changes nothing (the same rule as the window rows).
    store.commit_batch("other", 0, table(window(0, revision=1, **hdr({5: 9}))), [], revision=1)
    assert stored_buckets(clean_store) == {(0, 7): (3, 2), (0, 8): (1, 2), (1, 9): (3, 1)}
    # Published for the first time (``fresh``: copied straight in), a window keeps its set.
    store.commit_batch("q", 2, table(), [], revision=3,
                       fresh=table(window(2, revision=3, **hdr({4: 1, 300: 2}))))  # fmt: skip
    assert stored_buckets(clean_store)[(2, 300)] == (2, 3)
    # Retention drops them with their windows.
    store.prune(T0 + MINUTE + 1)
    assert stored_buckets(clean_store) == {(1, 9): (3, 1), (2, 4): (1, 3), (2, 300): (2, 3)}


def test_replay_replaces_a_corrected_windows_buckets_at_its_new_revision(
    store: ResultStore, clean_store: str
) -> None:
    store.commit_batch("q", 0, table(window(0, **hdr({5: 3})), window(1, **hdr({9: 3}))), [],
                       revision=1)  # fmt: skip
    # Window 0 recomputed with one more sample; window 1 recomputed unchanged.
    corrected = table(window(0, count=4, is_final=True, **hdr({5: 3, 6: 1})),
                      window(1, is_final=True, **hdr({9: 3})))  # fmt: skip
    outcome = store.publish_corrections(corrected, lock_name="q")
    assert outcome.rows_upserted == 1
    assert stored_buckets(clean_store) == {(0, 5): (3, 2), (0, 6): (1, 2), (1, 9): (3, 1)}


def session(first: int, last: int, **overrides: Any) -> dict[str, Any]:
    """A session row over minutes ``[first, last)``."""
    return row(window_start_ms=T0 + first * MINUTE, window_end_ms=T0 + last * MINUTE,
               is_final=True, **overrides)  # fmt: skip


def test_replay_supersedes_the_sessions_a_recomputed_session_covers(
    store: ResultStore, clean_store: str
) -> None:
    """Sessions [0, 1) and [2, 3) bridged by a late partial: replay publishes [0, 3), which
    deletes both rows and their buckets in its transaction, at a revision above both; the
    neighbour [4, 5) of the same series is not touched. Replaying again changes nothing."""
    store.commit_batch(
        "q", 0, table(session(0, 1, revision=3, **hdr({5: 1})),
                      session(2, 3, revision=5, **hdr({6: 1})),
                      session(4, 5, revision=2, **hdr({7: 1}))), [], revision=5,
    )  # fmt: skip
    run_sql(clean_store, "UPDATE window_results SET corrections = 1 WHERE revision = 3")
    run_sql(
        clean_store,
        "INSERT INTO late_events (config_name, window_name, metric, tags, window_start,"
        " window_end, metric_type, receiver, pane_start, count, sum, min, max, last, first_recv,"
        " last_recv, closed_by, query_name, batch_id, recorded_at) SELECT 'web', '1m',"
        " 'api.latency', '{\"host\": \"a\"}', s, s + interval '1 minute', 'ms', 'r0', s, 1,"
        " 9, 9, 9, 9, s, s, s, 'q.late', 0, s FROM (SELECT timestamptz 'epoch' + %s *"
        " interval '1 millisecond' AS s) x",
        [T0 + int(1.5 * MINUTE)],
    )
    [late] = store.read_late_partials("web", "1m")
    assert (late.tags, late.pane_start_ms) == ('{"host":"a"}', T0 + int(1.5 * MINUTE))

    merged = table(session(0, 3, count=7, sum=15.0, **hdr({5: 1, 6: 1, 9: 1})))
    outcome = store.publish_corrections(merged, lock_name="q", supersede=True,
                                        late_ids=[late.id])  # fmt: skip
    assert (outcome.rows_upserted, outcome.rows_retracted, outcome.rows_finalized) == (1, 2, 1)
    _, rows = run_sql(
        clean_store,
        "SELECT ((extract(epoch FROM window_start) * 1000)::bigint - %s) / %s,"
        " ((extract(epoch FROM window_end) * 1000)::bigint - %s) / %s, count, revision,"
        " corrections, is_final FROM window_results ORDER BY window_start",
        [T0, MINUTE, T0, MINUTE],
    )
    assert rows == [(0, 3, 7, 6, 2, True), (4, 5, 3, 2, 0, True)]
    # The neighbour keeps its set.
    assert stored_buckets(clean_store) == {(0, 5): (1, 6), (0, 6): (1, 6), (0, 9): (1, 6),
                                           (4, 7): (1, 2)}  # fmt: skip
    _, replayed = run_sql(
        clean_store, "SELECT count(*) FROM late_events WHERE replayed_at IS NOT NULL"
    )
    assert replayed == [(1,)]

    again = store.publish_corrections(merged, lock_name="q", supersede=True,
                                      late_ids=[late.id])  # fmt: skip
    assert (again.rows_upserted, again.rows_retracted, again.rows_finalized) == (0, 0, 0)
    # A recomputed session covering nothing stored is an insert, not a correction.
    new = store.publish_corrections(table(session(7, 8)), lock_name="q", supersede=True,
                                    late_ids=[])  # fmt: skip
    assert (new.rows_upserted, new.rows_retracted) == (1, 0)
    _, [inserted] = run_sql(clean_store, "SELECT revision, corrections FROM window_results"
                            " WHERE window_start = (SELECT max(window_start) FROM window_results)")
    assert inserted == (1, 0)


# -- bad input raises at once ----------------------------------------------------------------


def test_bad_data_raises_without_retrying(clean_store: str) -> None:
    sleeps: list[float] = []
    with ResultStore(clean_store, sleep=sleeps.append) as store:
        with pytest.raises(psycopg.errors.InvalidTextRepresentation):
            store.commit_batch("q", 0, table(row(tags="not json")), [], revision=1)
        # Rolled back: the batch was not recorded, so it can be retried once fixed.
        assert store.commit_batch("q", 0, table(row()), [], revision=1).rows_upserted == 1
    assert sleeps == []


def test_malformed_tables_are_refused_before_any_io() -> None:
    store = ResultStore("postgresql://nobody@127.0.0.1:1/none", retry=RetryPolicy(max_attempts=1))
    with pytest.raises(ValueError, match=r"missing columns \['emitted_at_ms'\]"):
        store.commit_batch("q", 0, table(row()).drop_columns(["emitted_at_ms"]), [], revision=1)
    with pytest.raises(ValueError, match="'count' has nulls"):
        store.commit_batch("q", 0, table(row(count=None)), [], revision=1)


def test_duplicate_window_in_one_batch_is_refused(store: ResultStore) -> None:
    with pytest.raises(ValueError, match="same window twice"):
        store.commit_batch("q", 0, table(row(), row(count=4)), [], revision=1)


def test_wrong_password_is_not_retried(postgres_url: str) -> None:
    password = re.match(r"postgresql://[^:]+:([^@]+)@", postgres_url)
    assert password
    sleeps: list[float] = []
    wrong = postgres_url.replace(password.group(1), "wrong")
    with (
        ResultStore(wrong, sleep=sleeps.append) as store,
        pytest.raises(psycopg.OperationalError, match="password authentication failed"),
    ):
        store.ensure_schema()
    assert sleeps == []


# -- store down: retry with backoff -----------------------------------------------------------


@pytest.fixture(scope="module")
def stopped_server() -> Iterator[EmbeddedPostgres]:
    with stopped_cluster("streamgauge-test-retry-") as server:
        yield server


def test_retries_with_growing_delays_until_the_server_starts(
    stopped_server: EmbeddedPostgres, caplog: pytest.LogCaptureFixture
) -> None:
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:  # the store is down until the 5th attempt
        sleeps.append(seconds)
        if len(sleeps) == 4:
            stopped_server.start()

    policy = RetryPolicy(initial_s=0.5, max_s=2.0)
    caplog.set_level(logging.WARNING, logger="streamgauge.sinks.store")
    try:
        with ResultStore(stopped_server.url, retry=policy, sleep=sleep,
                         clock=ManualClock(NOW)) as store:  # fmt: skip
            store.error_labels = {"config": "web", "query": "q"}
            store.ensure_schema()
            out = store.commit_batch("q", 0, table(row()), [], revision=1)
            # The four failed attempts (of ensure_schema: the store was down) are written by
            # the first commit that succeeds, in its transaction, as a self-metric.
            _, errors = run_sql(stopped_server.url, "SELECT (extract(epoch FROM ts) * 1000)"
                                "::bigint, name, labels, value FROM pipeline_metrics")  # fmt: skip
            assert errors == [(NOW, "streamgauge.store.errors",
                               {"config": "web", "query": "q", "reason": "unreachable"}, 4.0)]
            store.commit_batch("q", 1, table(), [], revision=2)  # written once, not again
            assert run_sql(stopped_server.url, "SELECT count(*) FROM pipeline_metrics")[1] == [
                (1,)
            ]
    finally:
        stopped_server.stop()
    assert sleeps == [0.5, 1.0, 2.0, 2.0]
    assert out.rows_upserted == 1
    failures = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert [f"attempt {i}" in r.getMessage() for i, r in enumerate(failures, 1)] == [True] * 4
    password = json.loads((stopped_server.data_dir / "postgres.json").read_text())["password"]
    assert password not in caplog.text


def test_gives_up_after_max_attempts() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again below: nothing listens
    sleeps: list[float] = []
    url = f"postgresql://u:secret@127.0.0.1:{port}/db"
    store = ResultStore(url, retry=RetryPolicy(max_attempts=3), sleep=sleeps.append)
    with pytest.raises(ResultStoreUnavailable, match="after 3 attempts") as info:
        store.ensure_schema()
    assert sleeps == [0.5, 1.0]
    assert "secret" not in str(info.value)


def test_reconnects_after_the_connection_is_killed(clean_store: str) -> None:
    sleeps: list[float] = []
    with ResultStore(clean_store, sleep=sleeps.append) as store:
        store.commit_batch("q", 0, table(window(0)), [], revision=1)
        run_sql(  # what a server restart or a failover does to an idle connection
            clean_store,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE application_name = 'streamgauge' AND pid <> pg_backend_pid()",
        )
        out = store.commit_batch("q", 1, table(window(1)), [], revision=2)
    assert out.rows_upserted == 1
    assert sleeps == [0.5]
    assert len(stored(clean_store)) == 2


def test_retry_policy_is_validated() -> None:
    with pytest.raises(ValueError, match=r"initial_s must be > 0.*max_attempts must be >= 1"):
        RetryPolicy(initial_s=0, max_attempts=0)


# -- run_sql ------------------------------------------------------------------------------------


def test_run_sql_returns_columns_and_rows(clean_store: str) -> None:
    assert run_sql(clean_store, "SELECT 1 AS a, 'x%' AS b WHERE 'x%' LIKE 'x%'") == (
        ["a", "b"],
        [(1, "x%")],
    )
    assert run_sql(clean_store, "SELECT %s::int AS n", (5,)) == (["n"], [(5,)])
    assert run_sql(clean_store, "SET application_name = 'x'") == ([], [])


def _retraction(start_ms: int, end_ms: int, **overrides: Any) -> dict[str, Any]:
    base = {
        "config_name": "web",
        "window_name": "1m",
        "metric": "api.latency",
        "tags": '{"host":"a"}',
        "window_start_ms": start_ms,
        "window_end_ms": end_ms,
    }
    base.update(overrides)
    return base


def test_retractions_delete_superseded_sessions_in_the_upsert_transaction(
    store: ResultStore, clean_store: str
) -> None:
    """Session [0, 1) shown and [2, 3) pending; a batch merges them into [0, 3)::

        minutes      0    1    2    3
        batch 1      [ a )     [ b )      a in window_results, b in window_pending (W = 2)
        batch 2      [      a+b      )    a and b retracted, a+b pending (W = 2.5)
    """
    run_sql(clean_store, "DELETE FROM window_pending")  # clean_store does not empty it
    hold = {("web", "1m"): T0 + 2 * MINUTE}
    store.commit_batch(
        "q", 1, table(window(0, revision=1), window(2, revision=1)), [], revision=1,
        hold_after=hold,
    )  # fmt: skip
    assert [r["start_ms"] for r in stored(clean_store)] == [T0]
    merged = row(window_start_ms=T0, window_end_ms=T0 + 3 * MINUTE, count=6, revision=2)
    retractions = pa.Table.from_pylist(
        [_retraction(T0, T0 + MINUTE), _retraction(T0 + 2 * MINUTE, T0 + 3 * MINUTE),
         _retraction(T0, T0 + MINUTE, tags='{"host":"b"}')]  # another series: untouched
    )  # fmt: skip
    outcome = store.commit_batch(
        "q", 2, table(merged), [], revision=2, retractions=retractions,
        hold_after={("web", "1m"): T0 + 5 * MINUTE // 2},
    )  # fmt: skip
    assert outcome.rows_retracted == 2
    assert stored(clean_store) == []
    _, pending = run_sql(
        clean_store,
        "SELECT (extract(epoch FROM window_start) * 1000)::bigint,"
        " (extract(epoch FROM window_end) * 1000)::bigint, count FROM window_pending"
        " WHERE config_name = 'web'",
    )
    assert pending == [(T0, T0 + 3 * MINUTE, 6)]
    # The same batch again changes nothing (sink_batches), retractions included.
    again = store.commit_batch("q", 2, table(merged), [], revision=2, retractions=retractions)
    assert again.already_committed


def test_retraction_never_deletes_a_newer_revision(store: ResultStore, clean_store: str) -> None:
    store.commit_batch("q", 5, table(window(0, revision=5)), [], revision=5)
    retractions = pa.Table.from_pylist([_retraction(T0, T0 + MINUTE)])
    outcome = store.commit_batch("q", 3, table(), [], revision=3, retractions=retractions)
    assert outcome.rows_retracted == 0
    assert [r["revision"] for r in stored(clean_store)] == [5]


def test_retractions_delete_the_superseded_sessions_bucket_rows(
    store: ResultStore, clean_store: str
) -> None:
    """Sessions [0, 1) and [1, 2) with bucket rows; a batch merges them into [0, 2) with its
    own: only the merged session's buckets remain (a newer revision's are never deleted)."""
    store.commit_batch("q", 1, table(window(0, revision=1, **hdr({3: 1})),
                                     window(1, revision=1, **hdr({4: 2}))), [],
                       revision=1)  # fmt: skip
    assert set(stored_buckets(clean_store)) == {(0, 3), (1, 4)}
    retractions = pa.Table.from_pylist(
        [_retraction(T0, T0 + MINUTE), _retraction(T0 + MINUTE, T0 + 2 * MINUTE)]
    )
    outcome = store.commit_batch(
        "q", 2, table(row(window_start_ms=T0, window_end_ms=T0 + 2 * MINUTE, revision=2,
                          **hdr({3: 1, 4: 2}))), [],
        revision=2, retractions=retractions,
    )  # fmt: skip
    assert outcome.rows_retracted == 2
    _, rows = run_sql(
        clean_store,
        "SELECT ((extract(epoch FROM window_end) * 1000)::bigint - %s) / %s, bucket, count,"
        " revision FROM window_histograms ORDER BY 2",
        [T0, MINUTE],
    )
    assert rows == [(2, 3, 1, 2), (2, 4, 2, 2)]
    # An older batch's retraction leaves the newer revision's buckets alone.
    older = store.commit_batch("q-other", 7, table(), [], revision=1,
                               retractions=pa.Table.from_pylist(
                                   [_retraction(T0, T0 + 2 * MINUTE)]))  # fmt: skip
    assert not older.already_committed and older.rows_retracted == 0
    assert len(stored_buckets(clean_store)) == 2


def _late(
    closed_by_ms: int, *, receiver: str = "r0", count: int = 1, **overrides: Any
) -> dict[str, Any]:
    return {"config_name": "web", "window_name": "1m", "metric": "api.latency",
            "tags": '{"host":"a"}', "metric_type": "ms", "window_start_ms": T0,
            "window_end_ms": T0 + MINUTE, "receiver": receiver, "pane_start_ms": T0,
            "count": count, "sum": 1.0, "min": 1.0, "max": 1.0, "last": 1.0,
            "first_recv_ms": closed_by_ms, "last_recv_ms": closed_by_ms,
            "closed_by_ms": closed_by_ms, **overrides}  # fmt: skip


def test_late_rows_of_a_window_batch_are_counted_on_their_window(
    store: ResultStore, clean_store: str
) -> None:
    from streamgauge.sinks.store import LATE_SCHEMA

    store.commit_batch("q", 1, table(window(0, is_final=True)), [], revision=1)
    late = pa.Table.from_pylist([_late(NOW, count=4)], schema=LATE_SCHEMA)
    outcome = store.commit_batch("q", 2, table(), [], revision=2, late=late,
                                 late_query_name="q.late")  # fmt: skip
    assert outcome.late_recorded == 1
    _, counted = run_sql(clean_store, "SELECT late_events FROM window_results")
    assert counted == [(4,)]
    _, recorded = run_sql(clean_store, "SELECT query_name, batch_id FROM late_events")
    assert recorded == [("q.late", 2)]


def test_a_new_checkpoint_forgets_the_late_rows_of_the_segments_it_reads_again(
    store: ResultStore, clean_store: str
) -> None:
    """Late rows recorded from segments a new checkpoint reads again (closed by a heartbeat at
    or after its stream's oldest segment's) go, with their count on the window; rows from
    pruned segments, other receivers and other windows stay. Once per generation: the second
    query of the same generation (a session window's .late one) must not delete the rows the
    first one recorded meanwhile."""
    from streamgauge.sinks.store import LATE_SCHEMA, LateRowsReread

    store.commit_batch("q", 1, table(window(0, is_final=True)), [], revision=1)
    oldest_kept = T0 + 10 * MINUTE  # heartbeat of r0's oldest segment still in the spool
    late = pa.Table.from_pylist(
        [
            _late(oldest_kept - 1, count=1),  # from a pruned segment: stays
            _late(oldest_kept, count=2),  # from the segment after the oldest: read again
            _late(oldest_kept + MINUTE, count=4),  # later still: read again
            _late(oldest_kept + MINUTE, receiver="r1", count=8),  # r1 starts later: stays
            _late(oldest_kept, window_name="other", count=16),  # another window: stays
        ],
        schema=LATE_SCHEMA,
    )
    store.commit_late_batch("web.1m.late", 0, late, "web.1m")
    _, counted = run_sql(clean_store, "SELECT late_events FROM window_results")
    assert counted == [(1 + 2 + 4 + 8,)]

    reread = LateRowsReread("1m-abc", {"r0": oldest_kept, "r1": oldest_kept + 2 * MINUTE},
                            "web.1m")  # fmt: skip
    store.start_checkpoint("web", "1m", ["web.1m.late"], late_reread=reread)
    _, kept = run_sql(
        clean_store, "SELECT window_name, receiver, count FROM late_events ORDER BY count"
    )
    assert kept == [("1m", "r0", 1), ("1m", "r1", 8), ("other", "r0", 16)]
    _, counted = run_sql(clean_store, "SELECT late_events FROM window_results")
    assert counted == [(1 + 8,)]

    # The new checkpoint records r0's rows again; its second query then starts.
    store.commit_late_batch(
        "web.1m.late", 0, pa.Table.from_pylist([_late(oldest_kept, count=2)], schema=LATE_SCHEMA),
        "web.1m",
    )  # fmt: skip
    store.start_checkpoint("web", "1m", ["web.1m"], late_reread=reread)
    _, counts = run_sql(clean_store, "SELECT count FROM late_events ORDER BY count")
    assert counts == [(1,), (2,), (8,), (16,)]
    # A later definition is a new generation: it forgets again.
    store.start_checkpoint("web", "1m", ["web.1m"], late_reread=LateRowsReread(
        "1m-def", {"r0": oldest_kept}, "web.1m"))  # fmt: skip
    _, counts = run_sql(clean_store, "SELECT count FROM late_events ORDER BY count")
    assert counts == [(1,), (8,), (16,)]


# -- early emission (a window's early_every) ----------------------------------------------------

SECOND = 1_000


def early_rows(url: str) -> list[tuple[Any, ...]]:
    """window_results as (count, revision, is_final, early_as_of - T0 in s or None,
    corrections), by window start."""
    _, rows = run_sql(
        url,
        "SELECT count, revision, is_final,"
        " ((extract(epoch FROM early_as_of) * 1000)::bigint - %s) / 1000, corrections"
        " FROM window_results ORDER BY window_start, metric",
        [T0],
    )
    return rows


def latest_status(url: str) -> list[tuple[Any, ...]]:
    _, rows = run_sql(url, "SELECT count, revision, status FROM window_latest ORDER BY metric")
    return rows


def test_an_open_window_is_published_early_once_per_tick_and_only_when_changed(
    store: ResultStore, clean_store: str
) -> None:
    """w0 = [0 s, 60 s), early_every 10 s; W is the watermark of each batch::

        batch  0      1      2      3      4      5
        W      5 s    12 s   15 s   21 s   35 s   60 s
        rows   n=1           n=2
        emits  -      early  -      early  -      on-time, final (lateness 0)
                      @10 s  (tick  @20 s  (same
                             10 s)         value)
    """
    hold = {("web", "1m"): 0}
    early = {("web", "1m"): 10 * SECOND}

    def commit(batch: int, watermark_s: int, *rows: dict[str, Any]) -> BatchOutcome:
        at = T0 + watermark_s * SECOND
        fin = Finalization("web", "1m", at, 0)
        return store.commit_batch(
            "q", batch, table(*rows), [fin], revision=batch + 1,
            hold_after={k: at for k in hold}, early_every=early,
        )  # fmt: skip

    assert commit(0, 5, window(0, count=1, revision=1)).rows_early == 0
    assert early_rows(clean_store) == []  # W - start < early_every: no tick yet
    assert commit(1, 12).rows_early == 1
    assert early_rows(clean_store) == [(1, 2, False, 10, 0)]
    assert latest_status(clean_store) == [(1, 2, "early")]
    assert commit(2, 15, window(0, count=2, revision=3)).rows_early == 0  # tick 10 s again
    assert early_rows(clean_store) == [(1, 2, False, 10, 0)]
    assert latest_status(clean_store) == [(2, 3, "pending")]  # changed since published
    assert commit(3, 21).rows_early == 1
    assert early_rows(clean_store) == [(2, 4, False, 20, 0)]
    assert commit(4, 35).rows_early == 0  # tick 30 s, but nothing changed since 20 s
    assert early_rows(clean_store) == [(2, 4, False, 20, 0)]
    out = commit(5, 60)
    assert (out.rows_early, out.rows_upserted, out.rows_finalized) == (0, 1, 0)
    # On time and final (moved in final: nothing left to finalize): early_as_of cleared, no
    # correction counted, the pending row moved.
    assert early_rows(clean_store) == [(2, 6, True, None, 0)]
    assert latest_status(clean_store) == [(2, 6, "final")]
    assert run_sql(clean_store, "SELECT count(*) FROM window_pending")[1] == [(0,)]
    # A replayed batch changes nothing (sink_batches), early rows included.
    assert commit(3, 21).already_committed


def test_a_change_between_the_last_early_row_and_the_end_is_not_a_correction(
    store: ResultStore, clean_store: str
) -> None:
    """The batch that passes the end also changes the window: the upsert replaces the early
    row (early_as_of cleared, corrections 0); a straggler after that is a correction."""
    early = {("web", "1m"): 10 * SECOND}
    at = T0 + 30 * SECOND
    store.commit_batch("q", 0, table(window(0, count=1)), [], revision=1,
                       hold_after={("web", "1m"): at}, early_every=early)  # fmt: skip
    assert early_rows(clean_store) == [(1, 1, False, 30, 0)]
    end = T0 + MINUTE
    store.commit_batch("q", 1, table(window(0, count=5, revision=2)), [], revision=2,
                       hold_after={("web", "1m"): end}, early_every=early)  # fmt: skip
    assert early_rows(clean_store) == [(5, 2, False, None, 0)]
    store.commit_batch("q", 2, table(window(0, count=6, revision=3)), [], revision=3,
                       hold_after={("web", "1m"): end + SECOND}, early_every=early)  # fmt: skip
    assert early_rows(clean_store) == [(6, 3, False, None, 1)]


def test_early_rows_are_scoped_to_the_configured_window(
    store: ResultStore, clean_store: str
) -> None:
    """A window with early_every publishes its open windows early; another window of the same
    config, without it, does not."""
    at = T0 + 20 * SECOND
    counter = window(0, metric="hits", metric_type="c")
    other = window(0, metric="hits", metric_type="c", window_name="5m")
    store.commit_batch("other", 0, table(other), [], revision=1,
                       hold_after={("web", "5m"): at})  # fmt: skip
    out = store.commit_batch(
        "q", 0, table(counter), [], revision=1, hold_after={("web", "1m"): at},
        early_every={("web", "1m"): 10 * SECOND},
    )  # fmt: skip
    assert out.rows_early == 1
    _, rows = run_sql(clean_store, "SELECT window_name, metric FROM window_results")
    assert rows == [("1m", "hits")]


def test_a_final_row_cannot_be_early(store: ResultStore, clean_store: str) -> None:
    store.commit_batch("q", 0, table(window(0)), [], revision=1)
    with pytest.raises(psycopg.errors.CheckViolation, match="window_results_early_check"):
        run_sql(clean_store, "UPDATE window_results SET is_final = true, early_as_of = now()")


# -- fresh windows (an open window published for the first time) -------------------------------


def test_fresh_windows_are_inserted_with_the_late_samples_recorded_before_them(
    store: ResultStore, clean_store: str
) -> None:
    """``commit_batch(fresh=...)`` inserts windows no row holds yet, beside the batch's
    ordinary upserts. A late partial another query recorded before the window's first row
    (it ran ahead) still counts on it: ``late_events`` is derived from the table."""
    from streamgauge.sinks.store import LATE_SCHEMA

    store.commit_late_batch(
        "web.1m.late", 0, pa.Table.from_pylist([_late(T0 + 2 * MINUTE, count=5)],
                                               schema=LATE_SCHEMA), "web.1m",
    )  # fmt: skip
    store.commit_batch("q", 0, table(window(1, metric="old")), [], revision=1)
    fresh = table(window(0, metric="api.latency", revision=2), window(1, revision=2))
    correction = table(window(1, metric="old", count=9, revision=2))
    out = store.commit_batch("q", 1, correction, [], revision=2, fresh=fresh)
    assert out.rows_upserted == 3 and out.fresh_stored_until_ms is None
    _, rows = run_sql(
        clean_store, "SELECT metric, (extract(epoch FROM window_start) * 1000)::bigint - %s,"
        " count, revision, late_events, corrections FROM window_results ORDER BY 1, 2", [T0],
    )  # fmt: skip
    assert rows == [("api.latency", 0, 3, 2, 5, 0), ("api.latency", MINUTE, 3, 2, 0, 0),
                    ("old", MINUTE, 9, 2, 0, 1)]  # fmt: skip
    assert store.commit_batch("q", 1, table(), [], revision=2, fresh=fresh).already_committed


def test_a_fresh_window_is_stored_as_the_upsert_stores_it(
    store: ResultStore, clean_store: str
) -> None:
    """Fresh windows are copied straight into window_results (Arrow to COPY's binary format),
    not through the staged upsert: every column must come out the same, tags as jsonb
    (several keys, non-ASCII), times to the millisecond, the set's sketch and its registers."""
    from streamgauge.sketches.hll import build_hll, serialize_hll

    sketch = serialize_hll(build_hll(["u1", "u2", "u3"]))
    rows = [
        row(tags='{"host":"a","région":"été"}', window_start_ms=T0 + 7,
            emitted_at_ms=NOW + 3, revision=2),
        window(1, metric="users", metric_type="s", sum=None, min=None, max=None, last=None,
               p50=None, p90=None, p99=None, distinct_count=3.0, sketch=sketch, is_final=True,
               revision=2),
        window(2, tags="{}", count=1, revision=2),
    ]  # fmt: skip
    store.commit_batch("upserted", 0, table(*rows), [], revision=2)
    store.commit_batch("fresh", 0, table(), [], revision=2,
                       fresh=table(*[{**r, "config_name": "fresh"} for r in rows]))  # fmt: skip
    _, by_config = run_sql(
        clean_store, "SELECT config_name, to_jsonb(r) - 'config_name' FROM window_results r"
        " ORDER BY metric, window_start",
    )  # fmt: skip
    jsonb_by_config = cast(list[tuple[str, dict[str, Any]]], by_config)  # text, jsonb
    upserted = [r for c, r in jsonb_by_config if c == "web"]
    fresh = [r for c, r in jsonb_by_config if c == "fresh"]
    assert len(upserted) == 3 and fresh == upserted
    assert upserted[0]["tags"] == {"host": "a", "région": "été"}
    assert upserted[2]["hll_registers"] is not None


def test_a_fresh_window_stored_already_takes_the_upsert_and_says_how_far_rows_are_stored(
    store: ResultStore, clean_store: str
) -> None:
    """A window offered as fresh that a row holds after all (a replay published it, or an
    older checkpoint did) fails the plain insert; the batch's fresh rows then take the upsert
    (keep the highest revision), and the outcome gives the latest stored window end so the
    caller stops offering windows up to it as fresh."""
    store.commit_batch("replay", 0, table(window(0, count=7, revision=5), window(3, revision=5)),
                       [], revision=5)  # fmt: skip
    fresh = table(window(0, count=1, revision=2), window(1, count=2, revision=2))
    out = store.commit_batch("q", 0, table(), [], revision=2, fresh=fresh)
    assert out.fresh_stored_until_ms == T0 + 4 * MINUTE
    counts = {(r["start_ms"] - T0) // MINUTE: (r["count"], r["revision"])
              for r in stored(clean_store)}  # fmt: skip
    assert counts == {0: (7, 5), 1: (2, 2), 3: (3, 5)}  # the newer revision kept
    with pytest.raises(ValueError, match="twice"):
        store.commit_batch("q", 1, table(), [], revision=3,
                           fresh=table(window(5, revision=3), window(5, revision=3)))  # fmt: skip


def test_fresh_windows_rows_commit_before_their_sketches_and_a_rerun_writes_those_once(
    store: ResultStore, clean_store: str
) -> None:
    """A batch publishing windows for the first time commits their rows, then their sketches
    in a transaction of its own. When that second transaction fails (here PostgreSQL refuses
    it: a trigger on window_sketches raises), the rows are visible without sketches and the
    batch fails; the same batch run again writes the sketches, once, and the rows stay as
    they were (no second revision, nothing counted twice)."""
    from streamgauge.sketches.hll import build_hll, serialize_hll

    sketch = serialize_hll(build_hll(["u1", "u2"]))
    fresh = table(
        window(0, sketch=b"\x01digest", hdr_histogram="HISTFAAAAB"),
        window(1, metric="users", metric_type="s", sum=None, min=None, max=None, last=None,
               p50=None, p90=None, p99=None, distinct_count=2.0, sketch=sketch),
        window(2, metric="requests", metric_type="c"),  # no sketch: no sketch row
    )  # fmt: skip
    run_sql(clean_store, """
        CREATE FUNCTION test_refuse_sketches() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'sketches refused'; END $$;
        CREATE TRIGGER test_refuse_sketches BEFORE INSERT ON window_sketches
            FOR EACH STATEMENT EXECUTE FUNCTION test_refuse_sketches();
    """)  # fmt: skip
    try:
        with pytest.raises(psycopg.Error, match="sketches refused"):
            store.commit_batch("q", 0, table(), [], revision=2, fresh=fresh)
        _, visible = run_sql(
            clean_store, "SELECT metric, count, sketch IS NULL FROM window_results ORDER BY 1"
        )
        assert visible == [("api.latency", 3, True), ("requests", 3, True), ("users", 3, True)]
    finally:
        run_sql(clean_store, "DROP TRIGGER test_refuse_sketches ON window_sketches;"
                             "DROP FUNCTION test_refuse_sketches()")  # fmt: skip
    again = store.commit_batch("q", 0, table(), [], revision=2, fresh=fresh)
    assert again.already_committed  # the rows' transaction: not written twice
    store.commit_batch("q", 0, table(), [], revision=2, fresh=fresh)  # a third run: nothing
    _, rows = run_sql(
        clean_store,
        "SELECT metric, revision, sketch, hdr_histogram, hll_registers IS NOT NULL"
        " FROM window_results ORDER BY 1",
    )
    assert rows == [
        ("api.latency", 1, b"\x01digest", "HISTFAAAAB", False),
        ("requests", 1, None, None, False),
        ("users", 1, sketch, None, True),
    ]
    _, counts = run_sql(clean_store, "SELECT (SELECT count(*) FROM window_rows),"
                                     " (SELECT count(*) FROM window_sketches)")  # fmt: skip
    assert counts == [(3, 2)]


def test_fresh_encodings_are_made_once_the_rows_are_visible(
    store: ResultStore, clean_store: str
) -> None:
    """``commit_batch(fresh_encodings=...)``: the fresh windows' rows carry no encodings; the
    store asks for them only after the rows' transaction committed (a reader already sees the
    rows, and no sketch yet), and stores them, a set's registers derived from its image, with
    their rows."""
    from streamgauge.sketches.hll import build_hll, serialize_hll

    image = serialize_hll(build_hll(["u1", "u2", "u3"]))
    fresh = table(
        window(0),
        window(1, metric="users", metric_type="s", sum=None, min=None, max=None, last=None,
               p50=None, p90=None, p99=None, distinct_count=3.0),
        window(2, metric="requests", metric_type="c"),
    )  # fmt: skip
    seen_when_asked: list[Any] = []

    def encodings() -> pa.Table:
        seen_when_asked.extend(run_sql(
            clean_store, "SELECT metric, sketch IS NULL FROM window_results ORDER BY 1")[1])
        return pa.table({
            "sketch": pa.array([b"\x01digest", image, None], pa.binary()),
            "hdr_histogram": pa.array(["HISTFAAAAB", None, None], pa.string()),
        })  # fmt: skip

    store.commit_batch("q", 0, table(), [], revision=2, fresh=fresh, fresh_encodings=encodings)
    assert seen_when_asked == [("api.latency", True), ("requests", True), ("users", True)]
    _, rows = run_sql(
        clean_store,
        "SELECT metric, sketch, hdr_histogram, hll_registers IS NOT NULL, distinct_count"
        " FROM window_results ORDER BY 1",
    )
    assert rows == [
        ("api.latency", b"\x01digest", "HISTFAAAAB", False, None),
        ("requests", None, None, False, None),
        ("users", image, None, True, 3.0),
    ]


def test_a_retracted_or_pruned_window_takes_its_sketches_with_it(
    store: ResultStore, clean_store: str
) -> None:
    """Sketches live beside the window's row: a retraction (a session that grew) and
    retention delete both, so no sketch outlives its window."""
    store.commit_batch("q", 0, table(), [], revision=1, fresh=table(
        window(0, sketch=b"a"), window(1, sketch=b"b"), window(5, sketch=b"c")))  # fmt: skip
    gone = pa.Table.from_pylist([_retraction(T0, T0 + MINUTE)])
    out = store.commit_batch("q", 1, table(), [], revision=2, retractions=gone)
    assert out.rows_retracted == 1
    assert store.prune(T0 + 3 * MINUTE)["window_results"] == 1
    _, left = run_sql(
        clean_store,
        "SELECT (extract(epoch FROM k.window_start) * 1000)::bigint, k.sketch"
        " FROM window_sketches k",
    )
    assert left == [(T0 + 5 * MINUTE, b"c")]


def test_retention_deletes_a_series_no_window_refers_to_and_a_writer_numbers_it_again(
    store: ResultStore, clean_store: str
) -> None:
    """A series whose windows retention deleted leaves ``window_series``; the writer that
    remembered its id numbers it again when it comes back, so its new windows show in
    ``window_results`` (an id remembered across the deletion would name no series). A series
    with a window left, or a pending one, stays."""
    host = {name: json.dumps({"host": name}, separators=(",", ":")) for name in "abc"}
    store.commit_batch("q", 0, table(), [], revision=1, fresh=table(
        window(0, tags=host["a"]), window(0, tags=host["b"]), window(1, tags=host["a"])))
    store.commit_batch("q", 1, table(window(9, tags=host["c"])), [], revision=2,
                       hold_after={("web", "1m"): T0})  # fmt: skip  (c: pending only)
    series = "SELECT count(*) FROM window_series WHERE config_name = 'web'"
    assert run_sql(clean_store, series)[1] == [(3,)]
    deleted = store.prune(T0 + MINUTE + 1)
    assert (deleted["window_results"], deleted["window_series"]) == (2, 1)
    assert run_sql(clean_store, series)[1] == [(2,)]
    store.commit_batch("q", 2, table(), [], revision=3, fresh=table(window(2, tags=host["b"])))
    assert [(r["tags"], r["start_ms"]) for r in stored(clean_store)] == [
        ({"host": "a"}, T0 + MINUTE), ({"host": "b"}, T0 + 2 * MINUTE)]  # fmt: skip
    assert run_sql(clean_store, series)[1] == [(3,)]


def test_a_series_numbered_in_a_batch_that_rolled_back_is_numbered_again(
    store: ResultStore, clean_store: str
) -> None:
    """The ids a refused batch numbered went with its transaction: the writer remembers ids
    only once their transaction commits, so the batch that follows stores its windows under
    ids that exist (shown by window_results)."""
    new = json.dumps({"host": "new"}, separators=(",", ":"))
    with pytest.raises(ValueError, match="same window twice"):
        store.commit_batch("q", 0, table(window(0, tags=new), window(0, tags=new)), [],
                           revision=1)  # fmt: skip
    store.commit_batch("q", 0, table(), [], revision=1, fresh=table(window(0, tags=new)))
    store.commit_batch("q", 1, table(window(1, tags=new)), [], revision=2)
    assert [(r["tags"], r["start_ms"]) for r in stored(clean_store)] == [
        ({"host": "new"}, T0), ({"host": "new"}, T0 + MINUTE)]  # fmt: skip
