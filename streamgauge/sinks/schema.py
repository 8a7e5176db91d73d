"""The result store's tables, as an ordered list of migrations.

``MIGRATIONS[i]`` brings the schema from version ``i`` to ``i + 1``; a migration, once released,
is never edited (a change is a new migration appended to the list), because a database records
only the version numbers it has applied. ``ensure_schema`` applies the missing ones, in order, in
one transaction, under a transaction-level advisory lock: two processes starting at once (the
daemon and ``streamgauge query``, or two test workers) serialise on the lock, and the second
finds nothing left to do. Without the lock both would race on ``CREATE TABLE IF NOT EXISTS``,
which is not safe under concurrency (it can fail with a unique violation on ``pg_type``).

Every column carries a ``COMMENT ON COLUMN`` so ``\\d+ window_results`` in psql explains it; the
README documents the same columns.
"""

from __future__ import annotations

from typing import Any

import psycopg

# Any 64-bit constant works; this is the first 8 bytes of sha256("streamgauge.schema").
_MIGRATION_LOCK_KEY = 0x2B1F_5E0A_77C3_49D1

_MIGRATION_1 = """
CREATE TABLE window_results (
    config_name    text             NOT NULL,
    window_name    text             NOT NULL,
    metric         text             NOT NULL,
    tags           jsonb            NOT NULL DEFAULT '{}',
    window_start   timestamptz      NOT NULL,
    window_end     timestamptz      NOT NULL,
    metric_type    text             NOT NULL,
    count          bigint           NOT NULL,
    sum            double precision,
    min            double precision,
    max            double precision,
    last           double precision,
    p50            double precision,
    p90            double precision,
    p99            double precision,
    distinct_count double precision,
    revision       bigint           NOT NULL,
    is_final       boolean          NOT NULL DEFAULT false,
    late_events    bigint           NOT NULL DEFAULT 0,
    emitted_at     timestamptz      NOT NULL,
    PRIMARY KEY (config_name, window_name, metric, tags, window_start, window_end),
    CONSTRAINT window_results_metric_type_check
        CHECK (metric_type IN ('c', 'g', 'ms', 'h', 'd', 's')),
    CONSTRAINT window_results_window_check CHECK (window_start < window_end),
    CONSTRAINT window_results_tags_check CHECK (jsonb_typeof(tags) = 'object')
);

-- Grafana's range scans: "windows ending inside the dashboard's time range".
CREATE INDEX window_results_window_end_idx ON window_results (window_end);

-- Finalization scans only the windows still open, per config/window, up to a watermark; a
-- partial index keeps that cheap as final rows accumulate (they leave the index for good).
CREATE INDEX window_results_open_idx ON window_results (config_name, window_name, window_end)
    WHERE NOT is_final;

COMMENT ON TABLE window_results IS
    'One row per (config, window definition, metric, tag set, window interval): the latest '
    'revision of that window''s aggregates. Windows are half-open: [window_start, window_end).';
COMMENT ON COLUMN window_results.config_name IS
    'Name of the YAML window config that produced the row.';
COMMENT ON COLUMN window_results.window_name IS
    'Name of the window definition inside that config.';
COMMENT ON COLUMN window_results.metric IS
    'StatsD metric name after the config''s mapping rules.';
COMMENT ON COLUMN window_results.tags IS
    'Tag set as a JSON object of string values; {} when untagged. jsonb, so key order is '
    'irrelevant to equality and to the primary key.';
COMMENT ON COLUMN window_results.window_start IS
    'Inclusive start of the window (event time, millisecond precision).';
COMMENT ON COLUMN window_results.window_end IS
    'Exclusive end of the window (event time, millisecond precision).';
COMMENT ON COLUMN window_results.metric_type IS
    'StatsD type: c counter, g gauge, ms timer, h histogram, d distribution, s set.';
COMMENT ON COLUMN window_results.count IS
    'Number of samples aggregated into the window.';
COMMENT ON COLUMN window_results.sum IS
    'Sum of sample values; NULL where the type has none (sets).';
COMMENT ON COLUMN window_results.min IS 'Smallest sample value; NULL for sets.';
COMMENT ON COLUMN window_results.max IS 'Largest sample value; NULL for sets.';
COMMENT ON COLUMN window_results.last IS
    'Value of the sample with the latest event time (gauges: the gauge''s value).';
COMMENT ON COLUMN window_results.p50 IS
    'Estimated median (timers, histograms, distributions); NULL otherwise.';
COMMENT ON COLUMN window_results.p90 IS 'Estimated 90th percentile; NULL where not computed.';
COMMENT ON COLUMN window_results.p99 IS 'Estimated 99th percentile; NULL where not computed.';
COMMENT ON COLUMN window_results.distinct_count IS
    'Estimated number of distinct values (sets, HyperLogLog); NULL otherwise.';
COMMENT ON COLUMN window_results.revision IS
    'Revision of the micro-batch that last wrote the row; strictly increasing. An upsert only '
    'replaces a row with a higher revision, so replays and late retries change nothing.';
COMMENT ON COLUMN window_results.is_final IS
    'True once the watermark has passed window_end + allowed lateness: the values will not '
    'change again. False rows are provisional.';
COMMENT ON COLUMN window_results.late_events IS
    'Samples for this window that arrived behind the watermark plus allowed lateness and were '
    'not applied: counted here, never silently dropped.';
COMMENT ON COLUMN window_results.emitted_at IS
    'Processing time at which this revision was written (or the row was finalized).';

CREATE TABLE sink_batches (
    query_name   text        NOT NULL,
    batch_id     bigint      NOT NULL,
    committed_at timestamptz NOT NULL,
    rows_written bigint      NOT NULL,
    PRIMARY KEY (query_name, batch_id)
);
COMMENT ON TABLE sink_batches IS
    'Micro-batches already committed, per streaming query: a replayed batch id is a no-op.';
COMMENT ON COLUMN sink_batches.query_name IS 'Name of the Spark streaming query that wrote.';
COMMENT ON COLUMN sink_batches.batch_id IS 'Spark micro-batch id (foreachBatch batch_id).';
COMMENT ON COLUMN sink_batches.committed_at IS 'Processing time of the commit.';
COMMENT ON COLUMN sink_batches.rows_written IS
    'window_results rows inserted or replaced, plus rows finalized, by this batch.';

CREATE TABLE pipeline_state (
    config_name text        NOT NULL,
    key         text        NOT NULL,
    value_ms    bigint      NOT NULL,
    updated_at  timestamptz NOT NULL,
    PRIMARY KEY (config_name, key)
);
COMMENT ON TABLE pipeline_state IS
    'Small per-config state committed atomically with the results, e.g. the watermark.';
COMMENT ON COLUMN pipeline_state.config_name IS 'Name of the YAML window config.';
COMMENT ON COLUMN pipeline_state.key IS 'What the value is, e.g. ''watermark''.';
COMMENT ON COLUMN pipeline_state.value_ms IS 'The value, an integer epoch-millisecond time.';
COMMENT ON COLUMN pipeline_state.updated_at IS 'Processing time of the last write.';
"""

_MIGRATION_2 = """
CREATE TABLE late_events (
    id             bigserial        PRIMARY KEY,
    config_name    text             NOT NULL,
    window_name    text             NOT NULL,
    metric         text             NOT NULL,
    tags           jsonb            NOT NULL DEFAULT '{}',
    window_start   timestamptz      NOT NULL,
    window_end     timestamptz      NOT NULL,
    metric_type    text             NOT NULL,
    receiver       text             NOT NULL,
    pane_start     timestamptz      NOT NULL,
    count          bigint           NOT NULL,
    sum            double precision NOT NULL,
    min            double precision NOT NULL,
    max            double precision NOT NULL,
    last           double precision NOT NULL,
    first_recv     timestamptz      NOT NULL,
    last_recv      timestamptz      NOT NULL,
    closed_by      timestamptz      NOT NULL,
    query_name     text             NOT NULL,
    batch_id       bigint           NOT NULL,
    recorded_at    timestamptz      NOT NULL,
    replayed_at    timestamptz
);
CREATE INDEX late_events_window_idx
    ON late_events (config_name, window_name, window_start, window_end);

COMMENT ON TABLE late_events IS
    'Pane partials that arrived after their window was final (window_end + allowed lateness '
    'already behind the watermark): never applied by the streaming job, never silently '
    'dropped. `streamgauge replay` folds them into corrected windows and sets replayed_at.';
COMMENT ON COLUMN late_events.metric IS 'Metric name of the late partial.';
COMMENT ON COLUMN late_events.tags IS 'Series tags (the window''s group_by keys), jsonb.';
COMMENT ON COLUMN late_events.window_start IS 'Start of the window the partial belongs to.';
COMMENT ON COLUMN late_events.window_end IS 'Exclusive end of that window.';
COMMENT ON COLUMN late_events.receiver IS 'Segment stream (receiver) the partial came from.';
COMMENT ON COLUMN late_events.pane_start IS 'Event time of the partial (start of its pane).';
COMMENT ON COLUMN late_events.count IS 'Samples in the partial.';
COMMENT ON COLUMN late_events.sum IS 'Sum of the partial (counters scaled by 1/sample rate).';
COMMENT ON COLUMN late_events.first_recv IS 'Receive time of the first sample in the partial.';
COMMENT ON COLUMN late_events.last_recv IS 'Receive time of the last sample in the partial.';
COMMENT ON COLUMN late_events.closed_by IS
    'The receiver heartbeat that had already closed the window when the partial arrived.';
COMMENT ON COLUMN late_events.query_name IS 'Streaming query that recorded the row.';
COMMENT ON COLUMN late_events.batch_id IS 'Its micro-batch id (replays are recognised).';
COMMENT ON COLUMN late_events.replayed_at IS
    'When `streamgauge replay` applied the partial to its window; NULL until then.';
"""

_MIGRATION_3 = """
-- Windows the watermark has not passed yet: results appear in window_results only once the
-- watermark passes a window's end (provisional), as the config documents.
CREATE TABLE window_pending (LIKE window_results INCLUDING ALL);
COMMENT ON TABLE window_pending IS
    'Windows with data whose end the watermark has not passed yet (not yet emitted). The '
    'micro-batch whose watermark passes a window''s end moves its row to window_results.';

ALTER TABLE window_results ADD COLUMN corrections bigint NOT NULL DEFAULT 0;
COMMENT ON COLUMN window_results.corrections IS
    'How many times the values changed after the window first appeared: stragglers within '
    'the allowed lateness, or `streamgauge replay`. 0 for a window never corrected.';
"""

MIGRATIONS: tuple[str, ...] = (_MIGRATION_1, _MIGRATION_2, _MIGRATION_3)
"""Ordered migration SQL; ``MIGRATIONS[v - 1]`` creates schema version ``v``. Append only."""

SCHEMA_VERSION = len(MIGRATIONS)


class SchemaVersionError(RuntimeError):
    """The database was migrated by a newer streamgauge than this one."""


def ensure_schema(conn: psycopg.Connection[Any]) -> None:
    """Apply the migrations this database lacks; a no-op when it is up to date.

    Runs in one transaction (all missing migrations or none) holding
    ``pg_advisory_xact_lock``, so concurrent callers in other processes wait and then see the
    versions recorded by the first. Pass an autocommit connection (or one outside a
    transaction): inside a caller's transaction this becomes a savepoint and the lock is held
    until the caller commits.
    """
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", (_MIGRATION_LOCK_KEY,))
        cur.execute(
            """
            CREATE TABLE IF NOT EXISTS schema_migrations (
                version    int         PRIMARY KEY,
                applied_at timestamptz NOT NULL DEFAULT now()
            )
            """
        )
        cur.execute("SELECT coalesce(max(version), 0) FROM schema_migrations")
        row = cur.fetchone()
        current = int(row[0]) if row else 0
        if current > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"the database schema is at version {current} but this streamgauge knows "
                f"versions up to {SCHEMA_VERSION}; upgrade streamgauge (or point it at "
                "another database)"
            )
        for version in range(current + 1, SCHEMA_VERSION + 1):
            cur.execute(MIGRATIONS[version - 1].encode())  # bytes: no %-placeholder parsing
            cur.execute(
                "INSERT INTO schema_migrations (version, applied_at) VALUES (%s, now())",
                (version,),
            )


def schema_version(conn: psycopg.Connection[Any]) -> int:
    """The highest applied migration, 0 for an empty database."""
    exists = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(row[0]) if row else 0
