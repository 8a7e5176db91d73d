"""The result store's tables, as an ordered list of migrations.

``MIGRATIONS[i]`` brings the schema from version ``i`` to ``i + 1``; a migration's statements,
once released, are never edited (a change is a new migration appended to the list), because a
database records only the version numbers it has applied (its ``--`` comments outside function
bodies reach no database). ``ensure_schema`` applies the missing ones, in order, in
one transaction, under a transaction-level advisory lock: two processes starting at once (the
daemon and ``streamgauge query``, or two test workers) serialise on the lock, and the second
finds nothing left to do. Without the lock both would race on ``CREATE TABLE IF NOT EXISTS``,
which is not safe under concurrency (it can fail with a unique violation on ``pg_type``).

Every column carries a ``COMMENT ON COLUMN`` so ``\\d+ window_results`` in psql explains it;
``docs/store.md`` documents the same columns.

A migration's ``--`` comments say why it was made: the tables it describes may since have been
dropped by a later one. Its ``COMMENT ON`` texts are part of the database; changing one takes a
new migration.
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

_MIGRATION_4 = """
-- Sketches beside every window row: p999, the serialised sketch, the HDR histogram in
-- HdrHistogram's standard encoding. window_pending was created LIKE window_results, so it
-- gets the same columns.
ALTER TABLE window_results ADD COLUMN p999 double precision;
ALTER TABLE window_results ADD COLUMN sketch bytea;
ALTER TABLE window_results ADD COLUMN hdr_histogram text;
ALTER TABLE window_pending ADD COLUMN p999 double precision;
ALTER TABLE window_pending ADD COLUMN sketch bytea;
ALTER TABLE window_pending ADD COLUMN hdr_histogram text;
COMMENT ON COLUMN window_results.p999 IS
    'Estimated 99.9th percentile (t-digest); NULL where not computed.';
COMMENT ON COLUMN window_results.sketch IS
    'The window''s serialised sketch, so coarser rollups and replay merge exactly: a '
    'DataSketches tdigest_double for timers, histograms and distributions (ms, h, d), an '
    'HLL_8 sketch for sets (s); NULL for counters and gauges.';
COMMENT ON COLUMN window_results.hdr_histogram IS
    'The window''s HDR histogram in HdrHistogram''s standard compressed V2 encoding, base64 '
    '(Java/C/Go/Rust/Python HdrHistogram decode and merge it); its integer-to-double '
    'conversion ratio is 1/value_scale. NULL for types without a histogram.';
COMMENT ON COLUMN window_pending.p999 IS
    'Estimated 99.9th percentile (t-digest); NULL where not computed.';
COMMENT ON COLUMN window_pending.sketch IS
    'Serialised sketch: tdigest_double (ms, h, d) or HLL_8 (s); NULL otherwise.';
COMMENT ON COLUMN window_pending.hdr_histogram IS
    'HDR histogram, standard compressed V2 encoding, base64; NULL where none.';

CREATE TABLE window_histograms (
    config_name  text             NOT NULL,
    window_name  text             NOT NULL,
    metric       text             NOT NULL,
    tags         jsonb            NOT NULL DEFAULT '{}',
    window_start timestamptz      NOT NULL,
    window_end   timestamptz      NOT NULL,
    bucket       integer          NOT NULL,
    lower_bound  double precision NOT NULL,
    upper_bound  double precision NOT NULL,
    count        bigint           NOT NULL,
    revision     bigint           NOT NULL,
    PRIMARY KEY (config_name, window_name, metric, tags, window_start, window_end, bucket),
    CONSTRAINT window_histograms_count_check CHECK (count > 0),
    CONSTRAINT window_histograms_bounds_check CHECK (lower_bound <= upper_bound),
    CONSTRAINT window_histograms_window_check CHECK (window_start < window_end)
);
CREATE INDEX window_histograms_window_end_idx ON window_histograms (window_end);
CREATE INDEX window_histograms_series_end_idx
    ON window_histograms (config_name, window_name, metric, window_end);

COMMENT ON TABLE window_histograms IS
    'HDR histogram of each window of a timer, histogram or distribution, one row per non-empty '
    'bucket. Buckets have fixed bounds per config, so histograms of any windows and tag groups '
    'merge by adding count per bucket (GROUP BY bucket, or the streamgauge_histogram '
    'aggregate): the correct way to get a percentile over a range; averaging percentiles is '
    'not. A window''s rows are replaced as a set when its window_results row gets a higher '
    'revision, so they describe its latest revision.';
COMMENT ON COLUMN window_histograms.config_name IS 'Name of the YAML window config.';
COMMENT ON COLUMN window_histograms.window_name IS 'Window definition inside that config.';
COMMENT ON COLUMN window_histograms.metric IS 'Metric name after the config''s mapping rules.';
COMMENT ON COLUMN window_histograms.tags IS 'Tag set (jsonb object), as in window_results.';
COMMENT ON COLUMN window_histograms.window_start IS 'Inclusive start of the window.';
COMMENT ON COLUMN window_histograms.window_end IS 'Exclusive end of the window.';
COMMENT ON COLUMN window_histograms.bucket IS
    'Bucket index: the index of HdrHistogram''s counts array (hdrhistogram package layout, '
    'fixed per config by its lowest, highest, significant digits and value scale).';
COMMENT ON COLUMN window_histograms.lower_bound IS
    'Lowest value recorded in the bucket, in the metric''s units (e.g. ms).';
COMMENT ON COLUMN window_histograms.upper_bound IS
    'Highest value equivalent to the bucket, in the metric''s units: what HdrHistogram '
    'reports as a quantile that falls in this bucket.';
COMMENT ON COLUMN window_histograms.count IS
    'Samples in the bucket (> 0: empty buckets have no row).';
COMMENT ON COLUMN window_histograms.revision IS
    'Revision of the window_results row these buckets were written with.';

-- The latest revision of every window, emitted or not. window_results already keeps only the
-- highest revision per window (the upsert refuses older ones); window_pending holds windows
-- the watermark has not passed. A window is in one of them at a time; DISTINCT ON makes the
-- view total even if a writer ever broke that (the higher revision wins).
CREATE VIEW window_latest AS
SELECT DISTINCT ON (config_name, window_name, metric, tags, window_start, window_end)
    config_name, window_name, metric, tags, window_start, window_end, metric_type, count, sum,
    min, max, last, p50, p90, p99, p999, distinct_count, revision, is_final, late_events,
    corrections, emitted_at, status
FROM (
    SELECT r.config_name, r.window_name, r.metric, r.tags, r.window_start, r.window_end,
           r.metric_type, r.count, r.sum, r.min, r.max, r.last, r.p50, r.p90, r.p99, r.p999,
           r.distinct_count, r.revision, r.is_final, r.late_events, r.corrections,
           r.emitted_at, CASE WHEN r.is_final THEN 'final' ELSE 'provisional' END AS status
    FROM window_results r
    UNION ALL
    SELECT p.config_name, p.window_name, p.metric, p.tags, p.window_start, p.window_end,
           p.metric_type, p.count, p.sum, p.min, p.max, p.last, p.p50, p.p90, p.p99, p.p999,
           p.distinct_count, p.revision, false, p.late_events, 0::bigint, p.emitted_at,
           'pending'
    FROM window_pending p
) w
ORDER BY config_name, window_name, metric, tags, window_start, window_end, revision DESC;
COMMENT ON VIEW window_latest IS
    'The latest revision of every window: window_results (status final or provisional) and '
    'window_pending (status pending: the watermark has not passed its end yet).';
COMMENT ON COLUMN window_latest.status IS
    'final (will not change), provisional (emitted, may still be corrected) or pending (not '
    'emitted yet).';

-- Histogram arithmetic: histograms add, percentiles never average.
CREATE TYPE streamgauge_hdr_bin AS (
    bucket      integer,
    lower_bound double precision,
    upper_bound double precision,
    count       bigint
);
COMMENT ON TYPE streamgauge_hdr_bin IS
    'One bucket of an HDR histogram (window_histograms columns); a histogram is an array.';

-- Bins merge on (bucket, lower_bound, upper_bound), not on the index alone, and sort by value:
-- if a config's accuracy changes, its layout changes and the same index then means other
-- values. Within one layout this is exactly "add counts per bucket index" (the bounds are a
-- function of the index, and increase with it); across a change, bins of both layouts are
-- kept apart and ordered by value, so a quantile is off by at most the coarser bucket's width
-- instead of being read from the wrong values.
CREATE FUNCTION streamgauge_hdr_merge(bins streamgauge_hdr_bin[])
RETURNS streamgauge_hdr_bin[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(array_agg(ROW(bucket, lower_bound, upper_bound, n)::streamgauge_hdr_bin
                              ORDER BY upper_bound, lower_bound, bucket), '{}')
    FROM (
        SELECT b.bucket, b.lower_bound, b.upper_bound, sum(b.count) AS n
        FROM unnest(bins) AS b
        WHERE b.bucket IS NOT NULL AND b.count IS NOT NULL
        GROUP BY b.bucket, b.lower_bound, b.upper_bound
        HAVING sum(b.count) > 0
    ) merged
$$;
COMMENT ON FUNCTION streamgauge_hdr_merge(streamgauge_hdr_bin[]) IS
    'Adds the counts of bins of the same bucket (index and bounds): the merged histogram, '
    'ordered by value, without empty buckets.';

CREATE FUNCTION streamgauge_hdr_merge_rows(rows window_histograms[])
RETURNS streamgauge_hdr_bin[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT streamgauge_hdr_merge(array_agg(
        ROW(r.bucket, r.lower_bound, r.upper_bound, r.count)::streamgauge_hdr_bin))
    FROM unnest(rows) AS r
$$;

-- sfunc array_append (a C function that appends in place to the aggregate's expanded array):
-- linear in the rows. A PL/pgSQL transition function copies its state on every row, so it is
-- quadratic: already far slower at ten thousand rows.
CREATE AGGREGATE streamgauge_histogram(streamgauge_hdr_bin) (
    SFUNC = array_append,
    STYPE = streamgauge_hdr_bin[],
    FINALFUNC = streamgauge_hdr_merge,
    COMBINEFUNC = array_cat,
    INITCOND = '{}',
    PARALLEL = SAFE
);
COMMENT ON AGGREGATE streamgauge_histogram(streamgauge_hdr_bin) IS
    'The merged HDR histogram of the bins aggregated (counts added per bucket).';

CREATE AGGREGATE streamgauge_histogram(window_histograms) (
    SFUNC = array_append,
    STYPE = window_histograms[],
    FINALFUNC = streamgauge_hdr_merge_rows,
    COMBINEFUNC = array_cat,
    INITCOND = '{}',
    PARALLEL = SAFE
);
COMMENT ON AGGREGATE streamgauge_histogram(window_histograms) IS
    'The merged HDR histogram of the window_histograms rows aggregated: '
    'streamgauge_histogram(h) ... FROM window_histograms h GROUP BY <time bucket>, <tags>.';

CREATE FUNCTION streamgauge_checked_quantile(q double precision)
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
    IF q IS NULL OR NOT (q >= 0 AND q <= 1) THEN  -- NOT (...): NaN fails both comparisons
        RAISE EXCEPTION 'quantile % is not between 0 and 1', coalesce(q::text, 'NULL')
            USING ERRCODE = 'numeric_value_out_of_range';
    END IF;
    RETURN q;
END
$$;
COMMENT ON FUNCTION streamgauge_checked_quantile(double precision) IS
    'q itself if it is in [0, 1]; an error otherwise (as percentile_disc raises).';

-- HdrHistogram.getValueAtPercentile: nearest rank round(q * n), at least 1, with the Python
-- package's float expression (int(percentile * n / 100 + 0.5)), reported as the highest value
-- equivalent to the bucket holding that rank (the lowest for q = 0). The bins need not be
-- merged: walking them in value order, duplicates of a bucket reach each rank where the merged
-- bucket would, so array_agg of raw rows works as well as the aggregate's merged histogram.
-- PL/pgSQL over three parallel arrays: several times faster than the same walk as a window
-- query (measured on hundreds of histograms of 100 bins, 4 quantiles each).
CREATE FUNCTION streamgauge_hdr_quantiles(histogram streamgauge_hdr_bin[], qs double precision[])
RETURNS double precision[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
    counts bigint[];
    uppers double precision[];
    lowers double precision[];
    total  bigint;
    result double precision[] := '{}';
    q      double precision;
    pct    double precision;
    target bigint;
    cum    bigint;
    i      integer;
BEGIN
    IF qs IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT array_agg(b.count ORDER BY b.upper_bound, b.lower_bound, b.bucket),
           array_agg(b.upper_bound ORDER BY b.upper_bound, b.lower_bound, b.bucket),
           array_agg(b.lower_bound ORDER BY b.upper_bound, b.lower_bound, b.bucket),
           coalesce(sum(b.count), 0)
      INTO counts, uppers, lowers, total
      FROM unnest(histogram) AS b
     WHERE b.count > 0 AND b.bucket IS NOT NULL;
    FOREACH q IN ARRAY qs LOOP
        pct := least(streamgauge_checked_quantile(q) * 100.0, 100.0);
        IF total = 0 THEN
            result := result || NULL::double precision;
            CONTINUE;
        END IF;
        target := greatest(floor(pct * total::double precision / 100.0 + 0.5)::bigint, 1);
        cum := 0;
        FOR i IN 1 .. cardinality(counts) LOOP
            cum := cum + counts[i];
            IF cum >= target THEN
                result := result || CASE WHEN pct = 0 THEN lowers[i] ELSE uppers[i] END;
                EXIT;
            END IF;
        END LOOP;
    END LOOP;
    RETURN result;
END
$$;
COMMENT ON FUNCTION streamgauge_hdr_quantiles(streamgauge_hdr_bin[], double precision[]) IS
    'Quantiles qs (each in [0, 1]) of an HDR histogram, as HdrHistogram reports them: the '
    'highest value equivalent to the bucket holding rank round(q * n). NULLs when empty.';

CREATE FUNCTION streamgauge_hdr_quantile(histogram streamgauge_hdr_bin[], q double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (streamgauge_hdr_quantiles(histogram, ARRAY[q]))[1]
$$;
COMMENT ON FUNCTION streamgauge_hdr_quantile(streamgauge_hdr_bin[], double precision) IS
    'One quantile of an HDR histogram: streamgauge_hdr_quantile(streamgauge_histogram(h), 0.99).';

CREATE TABLE pipeline_metrics (
    ts     timestamptz      NOT NULL,
    name   text             NOT NULL,
    labels jsonb            NOT NULL DEFAULT '{}',
    value  double precision NOT NULL,
    PRIMARY KEY (name, labels, ts),
    CONSTRAINT pipeline_metrics_labels_check CHECK (jsonb_typeof(labels) = 'object')
);
CREATE INDEX pipeline_metrics_ts_idx ON pipeline_metrics (ts);
COMMENT ON TABLE pipeline_metrics IS
    'Self-metrics of the daemon that cannot travel as StatsD samples through the pipeline '
    'itself (e.g. result-store errors, measured while the store is unreachable): one row per '
    'metric, label set and sample time. Ingest counters are in window_results under '
    'streamgauge.ingest.*.';
COMMENT ON COLUMN pipeline_metrics.ts IS 'Processing time of the sample.';
COMMENT ON COLUMN pipeline_metrics.name IS 'Metric name, e.g. streamgauge.store.errors.';
COMMENT ON COLUMN pipeline_metrics.labels IS 'Labels (jsonb object of strings); {} if none.';
COMMENT ON COLUMN pipeline_metrics.value IS
    'The value: counters are per-interval increments (sum them over a range), gauges as read.';
"""

_MIGRATION_5 = """
-- Distinct counts over any range in SQL. PostgreSQL has no HLL type (and the schema must run
-- on any server, so no C extension): beside each set window's DataSketches image the store
-- writes its dense register array, which SQL unions (per-register max) and estimates
-- (Ertl's improved raw estimator). See streamgauge/sketches/hll_registers.py for the layout.
ALTER TABLE window_results ADD COLUMN hll_registers bytea;
ALTER TABLE window_pending ADD COLUMN hll_registers bytea;
COMMENT ON COLUMN window_results.hll_registers IS
    'Sets (s): the HyperLogLog registers of the window''s sketch, 2^lgK bytes, byte i the '
    'register of slot i (0..63; DataSketches'' slot and value). Union windows and tag groups '
    'with streamgauge_hll_union(hll_registers), count with streamgauge_hll_estimate(...), or '
    'both at once with streamgauge_hll_distinct(hll_registers): the distinct count over any '
    'range, ±3.2 % at 2 sigma for lgK 12. NULL for other types.';
COMMENT ON COLUMN window_pending.hll_registers IS
    'Sets (s): the sketch''s HyperLogLog registers, 2^lgK bytes; NULL otherwise.';

-- Register arrays are handled as bit strings: one byte per register, values 0..63 (bits 6
-- and 7 clear), so a per-register max is a bit-sliced comparison of the six value bits, done
-- by bit-string operators in C over the whole array at once. Measured on 120 arrays at lgK
-- 12: 46 ms, against 103 ms for max(get_byte(...)) GROUP BY register and 3.1 s for a
-- PL/pgSQL loop over the bytes.
CREATE FUNCTION streamgauge_hll_bits(registers bytea)
RETURNS bit varying
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    n    integer := length(registers);
    bits bit varying;
    mask bit varying;
BEGIN
    -- 2^4 .. 2^21 registers: DataSketches' lgK range.
    IF n < 16 OR n > 2097152 OR n & (n - 1) <> 0 THEN
        RAISE EXCEPTION 'not an HLL register array: % bytes, expected 2^lgK for lgK 4..21', n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    bits := ('x' || encode(registers, 'hex'))::bit varying;
    mask := ('x' || repeat('c0', n))::bit varying;  -- bits 6 and 7 of every register
    IF bits & mask <> mask # mask THEN
        RAISE EXCEPTION 'not an HLL register array: a register above 63'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    RETURN bits;
END
$$;
COMMENT ON FUNCTION streamgauge_hll_bits(bytea) IS
    'A register array as a bit string (8 bits per register), checked: 2^lgK bytes, each <= 63.';

CREATE FUNCTION streamgauge_hll_max(a bit varying, b bit varying)
RETURNS bit varying
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    half bit varying;
    lsb  bit varying;
    gt   bit varying;
    eq   bit varying;
    aj   bit varying;
    bj   bit varying;
    ge   bit varying;
    j    integer;
BEGIN
    -- Different lgK: fold the finer array down (slot j of 2^lgK' takes the max of slots
    -- j, j + 2^lgK', ...: exact, DataSketches' slot is the low lgK bits of a hash word).
    WHILE length(a) > length(b) LOOP
        half := substring(a FROM length(a) / 2 + 1);
        a := streamgauge_hll_max(substring(a FOR length(a) / 2), half);
    END LOOP;
    WHILE length(b) > length(a) LOOP
        half := substring(b FROM length(b) / 2 + 1);
        b := streamgauge_hll_max(substring(b FOR length(b) / 2), half);
    END LOOP;
    lsb := repeat('00000001', length(a) / 8)::bit varying;  -- bit 0 of every register
    gt := a # a;                                            -- zeros
    eq := lsb;
    -- Per register, from bit 5 down: a > b once a has a 1 where b has a 0 and all higher
    -- bits were equal.
    FOR j IN REVERSE 5 .. 0 LOOP
        aj := (a >> j) & lsb;
        bj := (b >> j) & lsb;
        gt := gt | (eq & aj & ~bj);
        eq := eq & ~(aj # bj);
    END LOOP;
    ge := gt | eq;  -- a >= b, in bit 0 of each register; spread over its six value bits:
    ge := ge | (ge << 1) | (ge << 2) | (ge << 3) | (ge << 4) | (ge << 5);
    RETURN (a & ge) | (b & ~ge);
END
$$;
COMMENT ON FUNCTION streamgauge_hll_max(bit varying, bit varying) IS
    'Per-register max of two register arrays as bit strings (the union of two HLLs); a finer '
    'array is folded to the coarser lgK first.';

CREATE FUNCTION streamgauge_hll_union_step(state bit varying, registers bytea)
RETURNS bit varying
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN registers IS NULL THEN state
        WHEN state IS NULL THEN streamgauge_hll_bits(registers)
        ELSE streamgauge_hll_max(state, streamgauge_hll_bits(registers))
    END
$$;
COMMENT ON FUNCTION streamgauge_hll_union_step(bit varying, bytea) IS
    'Transition function of streamgauge_hll_union: folds one register array into the state.';

CREATE FUNCTION streamgauge_hll_union_combine(a bit varying, b bit varying)
RETURNS bit varying
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN a IS NULL THEN b WHEN b IS NULL THEN a ELSE streamgauge_hll_max(a, b) END
$$;
COMMENT ON FUNCTION streamgauge_hll_union_combine(bit varying, bit varying) IS
    'Combine function of streamgauge_hll_union (parallel aggregation).';

-- Back to bytes 64 bits at a time: int8send writes a bigint big-endian, the bit string's order.
CREATE FUNCTION streamgauge_hll_bytes(bits bit varying)
RETURNS bytea
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT string_agg(int8send(substring(bits FROM 64 * i + 1 FOR 64)::bit(64)::bigint),
                      ''::bytea ORDER BY i)
    FROM generate_series(0, length(bits) / 64 - 1) AS i
$$;
COMMENT ON FUNCTION streamgauge_hll_bytes(bit varying) IS
    'A register array back from its bit string (final function of streamgauge_hll_union).';

CREATE AGGREGATE streamgauge_hll_union(bytea) (
    SFUNC = streamgauge_hll_union_step,
    STYPE = bit varying,
    FINALFUNC = streamgauge_hll_bytes,
    COMBINEFUNC = streamgauge_hll_union_combine,
    PARALLEL = SAFE
);
COMMENT ON AGGREGATE streamgauge_hll_union(bytea) IS
    'The union of HLL register arrays (hll_registers): per-register max, at the smallest lgK '
    'among them. NULLs are skipped; NULL when every input is NULL.';

-- Otmar Ertl, "New cardinality estimation algorithms for HyperLogLog sketches" (2017), the
-- improved raw estimator: no empirical bias tables, unbiased from 0 upwards. C[k] counts the
-- registers equal to k; q = 62 whatever the lgK, because DataSketches takes the slot from one
-- 64-bit hash word and the value min(nlz, 62) + 1 from the other (so values run 0..q+1 = 63).
CREATE FUNCTION streamgauge_hll_estimate(registers bytea)
RETURNS double precision
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    q     constant integer := 62;
    m     double precision;
    c     bigint[];  -- c[k + 1] = C[k], k = 0 .. q + 1
    z     double precision;
    x     double precision;
    y     double precision;
    s     double precision;
    prev  double precision;
    k     integer;
BEGIN
    PERFORM streamgauge_hll_bits(registers);  -- the same checks as the union
    -- A fresh, uncompressed copy: get_byte on a stored (TOAST-compressed) value would
    -- decompress it again for every byte (measured 50 ms instead of 2 ms at lgK 12).
    registers := registers || ''::bytea;
    m := length(registers);
    SELECT array_agg(coalesce(h.n, 0) ORDER BY v.k) INTO c
    FROM generate_series(0, q + 1) AS v(k)
    LEFT JOIN (SELECT get_byte(registers, i) AS k, count(*) AS n
               FROM generate_series(0, length(registers) - 1) AS i GROUP BY 1) h USING (k);
    IF c[1] = m THEN
        RETURN 0;  -- every register empty: sigma(1) is infinite
    END IF;
    -- z = m * tau(1 - C[q+1] / m)
    x := 1 - c[q + 2] / m;
    z := 0;
    IF x > 0 AND x < 1 THEN
        y := 1;
        z := 1 - x;
        LOOP
            x := sqrt(x);
            prev := z;
            y := 0.5 * y;
            z := z - (1 - x) ^ 2 * y;
            EXIT WHEN z = prev;
        END LOOP;
        z := z / 3;
    END IF;
    z := m * z;
    FOR k IN REVERSE q .. 1 LOOP
        z := 0.5 * (z + c[k + 1]);
    END LOOP;
    -- z += m * sigma(C[0] / m)
    x := c[1] / m;
    y := 1;
    s := x;
    IF x > 0 THEN
        LOOP
            x := x * x;
            prev := s;
            s := s + x * y;
            y := y + y;
            EXIT WHEN s = prev;
        END LOOP;
    END IF;
    z := z + m * s;
    RETURN m * m / (2 * ln(2)) / z;  -- alpha_inf = 1 / (2 ln 2)
END
$$;
COMMENT ON FUNCTION streamgauge_hll_estimate(bytea) IS
    'Distinct-count estimate of an HLL register array (Ertl''s improved raw estimator): RSE '
    '~1.04/sqrt(2^lgK), ±3.2 % at 2 sigma for lgK 12; 0 when empty.';

CREATE FUNCTION streamgauge_hll_distinct_final(state bit varying)
RETURNS double precision
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT streamgauge_hll_estimate(streamgauge_hll_bytes(state))
$$;
COMMENT ON FUNCTION streamgauge_hll_distinct_final(bit varying) IS
    'Final function of streamgauge_hll_distinct: the estimate of the union.';

CREATE AGGREGATE streamgauge_hll_distinct(bytea) (
    SFUNC = streamgauge_hll_union_step,
    STYPE = bit varying,
    FINALFUNC = streamgauge_hll_distinct_final,
    COMBINEFUNC = streamgauge_hll_union_combine,
    PARALLEL = SAFE
);
COMMENT ON AGGREGATE streamgauge_hll_distinct(bytea) IS
    'Distinct count of the union of HLL register arrays: '
    'streamgauge_hll_estimate(streamgauge_hll_union(hll_registers)) in one aggregate.';
"""

_MIGRATION_6 = """
-- Early emissions (a window's early_every): while a window is still open, the store publishes
-- its running value to window_results, marked by early_as_of. window_pending keeps the
-- window's latest value meanwhile, so an open window can be in both tables.
ALTER TABLE window_results ADD COLUMN early_as_of timestamptz;
COMMENT ON COLUMN window_results.early_as_of IS
    'Set on an EARLY row: the running value of a window the watermark has not passed yet '
    '(the window''s early_every), published when the watermark reached this instant, '
    'window_start + k * early_every. Incomplete: more samples are expected. NULL on every row '
    'emitted when or after the watermark passed window_end (provisional or final). Alerts and '
    'completeness checks should keep to early_as_of IS NULL.';
-- NOT VALID: the rows already stored have NULL, so there is nothing to check, and a large
-- table is not scanned under an exclusive lock; the check applies to every write from now on.
ALTER TABLE window_results ADD CONSTRAINT window_results_early_check
    CHECK (early_as_of IS NULL OR NOT is_final) NOT VALID;

-- The view gains status 'early' and early_as_of (appended: CREATE OR REPLACE VIEW keeps the
-- existing columns). An open window in both tables: the higher revision wins, and on a tie
-- (the batch that updated the pending row also published it early) the published row.
CREATE OR REPLACE VIEW window_latest AS
SELECT DISTINCT ON (config_name, window_name, metric, tags, window_start, window_end)
    config_name, window_name, metric, tags, window_start, window_end, metric_type, count, sum,
    min, max, last, p50, p90, p99, p999, distinct_count, revision, is_final, late_events,
    corrections, emitted_at, status, early_as_of
FROM (
    SELECT r.config_name, r.window_name, r.metric, r.tags, r.window_start, r.window_end,
           r.metric_type, r.count, r.sum, r.min, r.max, r.last, r.p50, r.p90, r.p99, r.p999,
           r.distinct_count, r.revision, r.is_final, r.late_events, r.corrections,
           r.emitted_at,
           CASE WHEN r.is_final THEN 'final'
                WHEN r.early_as_of IS NOT NULL THEN 'early'
                ELSE 'provisional' END AS status,
           r.early_as_of
    FROM window_results r
    UNION ALL
    SELECT p.config_name, p.window_name, p.metric, p.tags, p.window_start, p.window_end,
           p.metric_type, p.count, p.sum, p.min, p.max, p.last, p.p50, p.p90, p.p99, p.p999,
           p.distinct_count, p.revision, false, p.late_events, 0::bigint, p.emitted_at,
           'pending', NULL::timestamptz
    FROM window_pending p
) w
ORDER BY config_name, window_name, metric, tags, window_start, window_end, revision DESC,
         status = 'pending';
COMMENT ON VIEW window_latest IS
    'The latest revision of every window: window_results (status final, provisional or '
    'early) and window_pending (status pending: the watermark has not passed its end yet). An '
    'open window published early and changed since shows its newer pending value.';
COMMENT ON COLUMN window_latest.status IS
    'final (will not change), provisional (emitted once the watermark passed window_end, may '
    'still be corrected), early (a running value published before window_end: incomplete) or '
    'pending (not emitted yet, or changed since its last early emission).';
COMMENT ON COLUMN window_latest.early_as_of IS
    'window_results.early_as_of: set on early rows, NULL otherwise.';
"""

_MIGRATION_7 = """
-- window_pending is rewritten every micro-batch: each open window's row is updated whenever a
-- batch changes it (a 10 s window at 1 s panes: about ten times). With full pages every update
-- puts the new row version on another page and adds an entry to each of the table's indexes;
-- with half of each page free the new version mostly stays on its page with no new index
-- entries (a HOT update: no indexed column changes), which about halves the upsert's time
-- on tens of thousands of open windows per batch. Applies to pages written from now on.
ALTER TABLE window_pending SET (fillfactor = 50);
"""

_MIGRATION_8 = """
-- Hopping windows' counters, gauges and sets are merged by panes: Spark aggregates
-- each partial once into its hop-wide pane, and the store keeps the panes of windows that may
-- still change. A window is made of its size/hop panes when it is published (the watermark
-- passes its end, a straggler changes a published one, or an early tick), instead of Spark
-- copying every partial into size/hop windows and the store rewriting size/hop open rows per
-- series and micro-batch. Internal: rows leave once every window holding the pane is final.
CREATE TABLE window_panes (
    config_name   text   NOT NULL,
    window_name   text   NOT NULL,
    metric        text   NOT NULL,
    tags          text   NOT NULL,  -- canonical JSON text, as the window rows' staging has it
    pane_ms       int8   NOT NULL,  -- pane start (epoch ms); the pane is [pane_ms, pane_ms + hop)
    from_start_ms int8   NOT NULL,  -- the first window start these partials are on time for
    metric_type   text   NOT NULL,
    count         int8   NOT NULL,
    sum           float8,
    min           float8,
    max           float8,
    last          float8,
    last_event_ms int8,
    sketch        bytea,            -- sets: the pane's HLL_8 image
    size_ms       int8   NOT NULL,  -- the window's size and hop: windows [s, s + size_ms) hold
    hop_ms        int8   NOT NULL,  --   panes s, s + hop_ms, ..., s + size_ms - hop_ms
    revision      int8   NOT NULL,  -- the batch that last changed the pane
    emitted_at    timestamptz NOT NULL,
    PRIMARY KEY (config_name, window_name, metric, tags, pane_ms, from_start_ms)
) WITH (fillfactor = 50);
CREATE INDEX window_panes_by_pane ON window_panes (config_name, window_name, pane_ms);
COMMENT ON TABLE window_panes IS
    'Internal: the pane partials of hopping windows that may still change (see streamgauge '
    'windows/job.py, hopping_pane_aggregates). Read window_results, or window_latest for '
    'windows not published yet.';

-- window_latest shows a hopping window's counters, gauges and sets before they are published
-- (status pending) merged from their panes, as it shows window_pending's rows: the revision
-- of the last batch that changed one of its panes, and that batch's time. A set's distinct
-- count is NULL until the window is published (the HLL union is done by the window job).
CREATE OR REPLACE VIEW window_latest AS
SELECT DISTINCT ON (config_name, window_name, metric, tags, window_start, window_end)
    config_name, window_name, metric, tags, window_start, window_end, metric_type, count, sum,
    min, max, last, p50, p90, p99, p999, distinct_count, revision, is_final, late_events,
    corrections, emitted_at, status, early_as_of
FROM (
    SELECT r.config_name, r.window_name, r.metric, r.tags, r.window_start, r.window_end,
           r.metric_type, r.count, r.sum, r.min, r.max, r.last, r.p50, r.p90, r.p99, r.p999,
           r.distinct_count, r.revision, r.is_final, r.late_events, r.corrections,
           r.emitted_at,
           CASE WHEN r.is_final THEN 'final'
                WHEN r.early_as_of IS NOT NULL THEN 'early'
                ELSE 'provisional' END AS status,
           r.early_as_of
    FROM window_results r
    UNION ALL
    SELECT p.config_name, p.window_name, p.metric, p.tags, p.window_start, p.window_end,
           p.metric_type, p.count, p.sum, p.min, p.max, p.last, p.p50, p.p90, p.p99, p.p999,
           p.distinct_count, p.revision, false, p.late_events, 0::bigint, p.emitted_at,
           'pending', NULL::timestamptz
    FROM window_pending p
    UNION ALL
    SELECT w.config_name, w.window_name, w.metric, w.tags::jsonb,
           timestamptz 'epoch' + w.start_ms * interval '1 millisecond',
           timestamptz 'epoch' + (w.start_ms + w.size_ms) * interval '1 millisecond',
           w.metric_type, w.count,
           CASE WHEN w.metric_type = 'c' THEN w.sum END,
           CASE WHEN w.metric_type = 'g' THEN w.min END,
           CASE WHEN w.metric_type = 'g' THEN w.max END,
           CASE WHEN w.metric_type = 'g' THEN w.last END,
           NULL, NULL, NULL, NULL, NULL, w.revision, false, 0::bigint, 0::bigint,
           w.emitted_at, 'pending', NULL::timestamptz
    FROM (
        SELECT p.config_name, p.window_name, p.metric, p.tags, st.ms AS start_ms, p.size_ms,
               min(p.metric_type) AS metric_type, sum(p.count)::int8 AS count,
               sum(p.sum) AS sum, min(p.min) AS min, max(p.max) AS max,
               (array_agg(p.last ORDER BY p.last_event_ms DESC NULLS LAST, p.last DESC))[1]
                   AS last,
               max(p.revision) AS revision, max(p.emitted_at) AS emitted_at
        FROM window_panes p
        CROSS JOIN LATERAL generate_series(
            greatest(p.from_start_ms, p.pane_ms - p.size_ms + p.hop_ms), p.pane_ms, p.hop_ms
        ) AS st(ms)
        GROUP BY p.config_name, p.window_name, p.metric, p.tags, st.ms, p.size_ms
    ) w
) w
ORDER BY config_name, window_name, metric, tags, window_start, window_end, revision DESC,
         status = 'pending';
"""

_MIGRATION_9 = """
-- The open windows of a tumbling window's counters, gauges and sets with no early_every
-- are held by the window job until the watermark passes their end, instead of
-- being upserted into window_pending every micro-batch (at 100k series that upsert was the
-- largest part of each batch). The job's holding is made durable by one row per query,
-- written in the transaction of the batch it follows: a snapshot the job restarts from, and
-- the windows' values as arrays for SQL readers (window_held_rows, window_latest).
CREATE TABLE window_held (
    query_name      text        PRIMARY KEY,
    config_name     text        NOT NULL,
    window_name     text        NOT NULL,
    batch_id        int8        NOT NULL,  -- the micro-batch this is the holding after
    revision        int8        NOT NULL,  -- that batch's revision
    windows         int8        NOT NULL,  -- open windows held
    samples         int8        NOT NULL,  -- samples they count
    snapshot        bytea       NOT NULL,  -- the windows, an Arrow IPC stream (zstd)
    metrics         text[]      NOT NULL,  -- the windows' values, element i of each array
    tags            text[]      NOT NULL,  --   for window i (canonical JSON text)
    metric_types    text[]      NOT NULL,
    window_starts   int8[]      NOT NULL,  -- epoch ms
    window_ends     int8[]      NOT NULL,
    counts          int8[]      NOT NULL,
    sums            float8[]    NOT NULL,
    mins            float8[]    NOT NULL,
    maxs            float8[]    NOT NULL,
    lasts           float8[]    NOT NULL,
    distinct_counts float8[]    NOT NULL,
    written_at      timestamptz NOT NULL
);
-- Compressed by the job already: no second compression by TOAST.
ALTER TABLE window_held ALTER COLUMN snapshot SET STORAGE EXTERNAL;
COMMENT ON TABLE window_held IS
    'Internal: the open windows a window job holds until the watermark passes their end '
    '(counters, gauges and sets of tumbling windows without early_every), one '
    'row per query. Read them in window_held_rows or window_latest (status pending).';

CREATE VIEW window_held_rows AS
SELECT h.config_name, h.window_name, w.metric, w.tags::jsonb AS tags,
       timestamptz 'epoch' + w.start_ms * interval '1 millisecond' AS window_start,
       timestamptz 'epoch' + w.end_ms * interval '1 millisecond' AS window_end,
       w.metric_type, w.count,
       CASE WHEN w.metric_type = 'c' THEN w.sum END AS sum,
       CASE WHEN w.metric_type = 'g' THEN w.min END AS min,
       CASE WHEN w.metric_type = 'g' THEN w.max END AS max,
       CASE WHEN w.metric_type = 'g' THEN w.last END AS last,
       CASE WHEN w.metric_type = 's' THEN w.distinct_count END AS distinct_count,
       h.revision, h.written_at AS emitted_at
FROM window_held h
CROSS JOIN LATERAL unnest(h.metrics, h.tags, h.metric_types, h.window_starts, h.window_ends,
                          h.counts, h.sums, h.mins, h.maxs, h.lasts, h.distinct_counts)
    AS w(metric, tags, metric_type, start_ms, end_ms, count, sum, min, max, last,
         distinct_count);
COMMENT ON COLUMN window_held.query_name IS 'The window query holding the windows.';
COMMENT ON COLUMN window_held.config_name IS 'The config of the window held.';
COMMENT ON COLUMN window_held.window_name IS 'The window (of the config) held.';
COMMENT ON COLUMN window_held.batch_id IS 'The micro-batch this is the holding after.';
COMMENT ON COLUMN window_held.revision IS 'The revision of that micro-batch.';
COMMENT ON COLUMN window_held.windows IS 'How many open windows are held.';
COMMENT ON COLUMN window_held.samples IS 'How many samples the held windows count.';
COMMENT ON COLUMN window_held.snapshot IS
    'The held windows as an Arrow IPC stream (zstd): what the window job restarts from.';
COMMENT ON COLUMN window_held.metrics IS
    'Element i of this and the following arrays is held window i (see window_held_rows).';
COMMENT ON COLUMN window_held.tags IS 'Canonical JSON text of each held window''s tags.';
COMMENT ON COLUMN window_held.metric_types IS 'Each held window''s metric type.';
COMMENT ON COLUMN window_held.window_starts IS 'Each held window''s start, epoch ms.';
COMMENT ON COLUMN window_held.window_ends IS 'Each held window''s end, epoch ms (exclusive).';
COMMENT ON COLUMN window_held.counts IS 'Each held window''s sample count.';
COMMENT ON COLUMN window_held.sums IS 'Each held window''s sum, as Spark merged it.';
COMMENT ON COLUMN window_held.mins IS 'Each held window''s minimum, as Spark merged it.';
COMMENT ON COLUMN window_held.maxs IS 'Each held window''s maximum, as Spark merged it.';
COMMENT ON COLUMN window_held.lasts IS 'Each held window''s latest value, as Spark merged it.';
COMMENT ON COLUMN window_held.distinct_counts IS
    'Each held set window''s distinct-count estimate (NULL for other types).';
COMMENT ON COLUMN window_held.written_at IS 'When the micro-batch wrote this holding.';
COMMENT ON COLUMN window_held_rows.revision IS
    'The revision of the micro-batch that last wrote the holding.';
COMMENT ON COLUMN window_held_rows.emitted_at IS 'When that micro-batch wrote it.';
COMMENT ON VIEW window_held_rows IS
    'The open windows the window jobs hold (window_held), one row each, as window_pending '
    'shows its own: their latest value, the revision of the batch that last wrote the '
    'holding. Published to window_results when the watermark passes window_end.';
"""

_MIGRATION_10 = """
-- Finalization without a partial index. window_results_open_idx (WHERE NOT is_final) made
-- the finalization's UPDATE of is_final non-HOT: every row a window closes was rewritten with
-- a new entry in each index, most of a closing batch's time at 100k windows. The windows' ends
-- still open are listed here instead, by two statement triggers on window_results (every
-- path that writes a row provisional: the closing upsert, promotion, early rows, panes,
-- replay), and the finalization updates the rows of those ends, found by
-- window_results_window_end_idx. At fillfactor 50 that update stays on the row's page and
-- touches no index (HOT), about three times faster, and the closing insert has one index
-- fewer to maintain.
CREATE TABLE window_open_ends (
    config_name text        NOT NULL,
    window_name text        NOT NULL,
    metric_type text        NOT NULL,
    window_end  timestamptz NOT NULL,
    PRIMARY KEY (config_name, window_name, metric_type, window_end)
);
COMMENT ON TABLE window_open_ends IS
    'Internal: the window ends of window_results rows not final yet, per config, window and '
    'metric type (kept by triggers; the finalization reads and clears them).';

CREATE FUNCTION window_results_note_open_ends() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO window_open_ends (config_name, window_name, metric_type, window_end)
    SELECT DISTINCT config_name, window_name, metric_type, window_end
    FROM written_rows WHERE NOT is_final
    ON CONFLICT DO NOTHING;
    RETURN NULL;
END
$$;
CREATE TRIGGER window_results_open_ends_on_insert AFTER INSERT ON window_results
    REFERENCING NEW TABLE AS written_rows
    FOR EACH STATEMENT EXECUTE FUNCTION window_results_note_open_ends();
CREATE TRIGGER window_results_open_ends_on_update AFTER UPDATE ON window_results
    REFERENCING NEW TABLE AS written_rows
    FOR EACH STATEMENT EXECUTE FUNCTION window_results_note_open_ends();

INSERT INTO window_open_ends (config_name, window_name, metric_type, window_end)
SELECT DISTINCT config_name, window_name, metric_type, window_end
FROM window_results WHERE NOT is_final;

DROP INDEX window_results_open_idx;
-- Room on each page for a row's finalized version (new pages only; a table written before
-- fills up to it as old rows are pruned).
ALTER TABLE window_results SET (fillfactor = 50);
"""

_VIEW_8 = _MIGRATION_8[_MIGRATION_8.index("CREATE OR REPLACE VIEW window_latest"):]
_PANES_BRANCH_END = "\n    ) w\n) w\nORDER BY"
assert _VIEW_8.count(_PANES_BRANCH_END) == 1
_WINDOW_LATEST_WITH_HELD = _VIEW_8.replace(_PANES_BRANCH_END, """
    ) w
    UNION ALL
    SELECT h.config_name, h.window_name, h.metric, h.tags, h.window_start, h.window_end,
           h.metric_type, h.count, h.sum, h.min, h.max, h.last, NULL, NULL, NULL, NULL,
           h.distinct_count, h.revision, false, 0::bigint, 0::bigint, h.emitted_at,
           'pending', NULL::timestamptz
    FROM window_held_rows h
) w
ORDER BY""")
"""Migration 8's ``window_latest`` with one more pending branch: the held windows (the
columns, their order and the ordering are unchanged, as CREATE OR REPLACE VIEW requires).
Part of migration 9: built from migration 8's text, so neither text may change."""

_HELD_ROWS_START = _MIGRATION_9.index("CREATE VIEW window_held_rows AS")
_HELD_ROWS_9 = _MIGRATION_9[_HELD_ROWS_START:_MIGRATION_9.index(";", _HELD_ROWS_START)]
_MIGRATION_11 = f"""
-- Windows published ahead of their batch (the window job's publish_released) are marked as
-- published in the holding's row instead of being cut out of it: rewriting the rest of the
-- holding (its snapshot and eleven arrays, the next window's entry per series) put SQL and
-- the Python that encodes it on the path of every closing.
-- The next batch's commit writes its holding whole, without them, and clears the mark.
ALTER TABLE window_held ADD COLUMN released_before_ms int8;
COMMENT ON COLUMN window_held.released_before_ms IS
    'The held windows ending at or before this (epoch ms) were published since the holding '
    'was written: window_held_rows leaves them out, and so does a job restarting from the '
    'snapshot. NULL: none.';
{_HELD_ROWS_9.replace("CREATE VIEW", "CREATE OR REPLACE VIEW")}
WHERE h.released_before_ms IS NULL OR w.end_ms > h.released_before_ms;
"""

_MIGRATION_12 = """
-- A window's HDR buckets in its own row: window_histograms had a row per window, series and
-- bucket (about 90 per timer window), so closing a window of 100k timer series wrote ~9M rows
-- into a table with a wide primary key and two indexes, most of the window job's store time.
-- The row now holds its non-empty buckets as two arrays, with the three constants of its
-- layout the bucket bounds are computed from, and window_histograms is a view that unnests
-- them, with the same columns as the table it replaces.
ALTER TABLE window_results
    ADD COLUMN hdr_buckets int4[], ADD COLUMN hdr_counts int8[],
    ADD COLUMN hdr_unit_magnitude int2, ADD COLUMN hdr_half_count_magnitude int2,
    ADD COLUMN hdr_value_scale float8,
    ADD CONSTRAINT window_results_hdr_check
        CHECK (cardinality(hdr_buckets) = cardinality(hdr_counts));
ALTER TABLE window_pending
    ADD COLUMN hdr_buckets int4[], ADD COLUMN hdr_counts int8[],
    ADD COLUMN hdr_unit_magnitude int2, ADD COLUMN hdr_half_count_magnitude int2,
    ADD COLUMN hdr_value_scale float8,
    ADD CONSTRAINT window_pending_hdr_check
        CHECK (cardinality(hdr_buckets) = cardinality(hdr_counts));
-- Kept in the row, compressed when the row is too large, rather than moved to the TOAST
-- table: copying in 50k rows with two 90-element arrays beside a 1.6 kB sketch took 1.1 s,
-- against 2.3 s with the default (EXTENDED) storage.
ALTER TABLE window_results ALTER COLUMN hdr_buckets SET STORAGE MAIN,
    ALTER COLUMN hdr_counts SET STORAGE MAIN;
ALTER TABLE window_pending ALTER COLUMN hdr_buckets SET STORAGE MAIN,
    ALTER COLUMN hdr_counts SET STORAGE MAIN;
COMMENT ON COLUMN window_results.hdr_buckets IS
    'Timers, histograms, distributions: the indices of the non-empty buckets of the window''s '
    'HDR histogram, ascending (the index of HdrHistogram''s counts array); NULL for types '
    'without one. window_histograms unnests them with their counts and bounds.';
COMMENT ON COLUMN window_results.hdr_counts IS
    'Samples in each bucket of hdr_buckets (same length, element i for bucket i; each > 0).';
COMMENT ON COLUMN window_results.hdr_unit_magnitude IS
    'HdrHistogram''s unit_magnitude of the histogram''s layout (floor(log2(lowest))): with '
    'hdr_half_count_magnitude and hdr_value_scale, what streamgauge_hdr_lower_bound and '
    'streamgauge_hdr_upper_bound compute a bucket''s bounds from.';
COMMENT ON COLUMN window_results.hdr_half_count_magnitude IS
    'HdrHistogram''s sub_bucket_half_count_magnitude of the layout (from its significant '
    'digits: 7 for 2).';
COMMENT ON COLUMN window_results.hdr_value_scale IS
    'The layout''s value scale: a value v is recorded as floor(v * hdr_value_scale).';
COMMENT ON COLUMN window_pending.hdr_buckets IS
    'Non-empty HDR bucket indices, ascending; NULL for types without a histogram.';
COMMENT ON COLUMN window_pending.hdr_counts IS 'Samples in each bucket of hdr_buckets.';
COMMENT ON COLUMN window_pending.hdr_unit_magnitude IS 'The HDR layout''s unit magnitude.';
COMMENT ON COLUMN window_pending.hdr_half_count_magnitude IS
    'The HDR layout''s sub-bucket half count magnitude.';
COMMENT ON COLUMN window_pending.hdr_value_scale IS 'The HDR layout''s value scale.';

-- HdrLayout.bounds (streamgauge/sketches/hdr.py), which is HdrHistogram's
-- get_value_from_index and its bucket width. Plain SQL expressions, so the planner inlines
-- them into the view.
CREATE FUNCTION streamgauge_hdr_lower_bound(
    bucket integer, unit_magnitude integer, half_count_magnitude integer,
    value_scale double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ((CASE WHEN bucket < (1 << half_count_magnitude) THEN bucket
                  ELSE (bucket & ((1 << half_count_magnitude) - 1)) + (1 << half_count_magnitude)
             END)::int8
            << (greatest((bucket >> half_count_magnitude) - 1, 0) + unit_magnitude))::float8
           / value_scale
$$;
COMMENT ON FUNCTION streamgauge_hdr_lower_bound(integer, integer, integer, double precision) IS
    'Lowest value recorded in HDR bucket `bucket` of the layout, in the metric''s units.';
CREATE FUNCTION streamgauge_hdr_upper_bound(
    bucket integer, unit_magnitude integer, half_count_magnitude integer,
    value_scale double precision)
RETURNS double precision
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ((((CASE WHEN bucket < (1 << half_count_magnitude) THEN bucket
                    ELSE (bucket & ((1 << half_count_magnitude) - 1)) + (1 << half_count_magnitude)
               END)::int8 + 1)
             << (greatest((bucket >> half_count_magnitude) - 1, 0) + unit_magnitude)) - 1)::float8
           / value_scale
$$;
COMMENT ON FUNCTION streamgauge_hdr_upper_bound(integer, integer, integer, double precision) IS
    'Highest value equivalent to HDR bucket `bucket` of the layout (what HdrHistogram reports '
    'for a quantile in it), in the metric''s units.';

-- The stored bucket rows move into their windows' rows. A row's layout is recognised from the
-- bounds of its window's first and last buckets: every layout streamgauge writes has lowest 1
-- (unit magnitude 0), 1..5 significant digits (half count magnitude 4, 7, 10, 14 or 17) and
-- a power of ten as its value scale. A window no layout fits keeps its buckets with NULL
-- bounds; bucket rows of a window in neither table (never written so) are dropped.
CREATE TEMPORARY TABLE sg_histogram_sets AS
SELECT config_name, window_name, metric, tags, window_start, window_end,
       array_agg(bucket ORDER BY bucket) AS buckets, array_agg(count ORDER BY bucket) AS counts,
       array_agg(lower_bound ORDER BY bucket) AS lowers,
       array_agg(upper_bound ORDER BY bucket) AS uppers
FROM window_histograms
GROUP BY config_name, window_name, metric, tags, window_start, window_end;

CREATE TEMPORARY TABLE sg_histogram_layouts AS
SELECT DISTINCT ON (config_name, window_name, metric, tags, window_start, window_end)
       config_name, window_name, metric, tags, window_start, window_end, h, scale
FROM (
    SELECT s.*, c.h, coalesce(CASE
               WHEN abs(power(10, round(log(c.raw))) / c.raw - 1) < 1e-9
               THEN power(10, round(log(c.raw))) ELSE c.raw END, 1) AS scale
    FROM sg_histogram_sets s
    CROSS JOIN LATERAL (
        SELECT h, streamgauge_hdr_lower_bound(s.buckets[cardinality(s.buckets)], 0, h, 1)
                  / nullif(s.lowers[cardinality(s.lowers)], 0) AS raw
        FROM unnest('{4, 7, 10, 14, 17}'::int[]) AS h
        WHERE s.buckets[cardinality(s.buckets)] >> h < 60) c  -- past 2^62: no such layout
) s
WHERE (SELECT bool_and(abs(streamgauge_hdr_lower_bound(s.buckets[i], 0, h, scale) - s.lowers[i])
                       <= 1e-12 * abs(s.lowers[i])
                   AND abs(streamgauge_hdr_upper_bound(s.buckets[i], 0, h, scale) - s.uppers[i])
                       <= 1e-12 * abs(s.uppers[i]))
       FROM unnest(ARRAY[1, cardinality(s.buckets)]) AS i)
ORDER BY config_name, window_name, metric, tags, window_start, window_end, h;

UPDATE window_results w
SET hdr_buckets = s.buckets, hdr_counts = s.counts,
    hdr_unit_magnitude = CASE WHEN l.h IS NOT NULL THEN 0 END,
    hdr_half_count_magnitude = l.h, hdr_value_scale = l.scale
FROM sg_histogram_sets s LEFT JOIN sg_histogram_layouts l
    USING (config_name, window_name, metric, tags, window_start, window_end)
WHERE (w.config_name, w.window_name, w.metric, w.tags, w.window_start, w.window_end)
    = (s.config_name, s.window_name, s.metric, s.tags, s.window_start, s.window_end);
UPDATE window_pending w
SET hdr_buckets = s.buckets, hdr_counts = s.counts,
    hdr_unit_magnitude = CASE WHEN l.h IS NOT NULL THEN 0 END,
    hdr_half_count_magnitude = l.h, hdr_value_scale = l.scale
FROM sg_histogram_sets s LEFT JOIN sg_histogram_layouts l
    USING (config_name, window_name, metric, tags, window_start, window_end)
WHERE (w.config_name, w.window_name, w.metric, w.tags, w.window_start, w.window_end)
    = (s.config_name, s.window_name, s.metric, s.tags, s.window_start, s.window_end);
DROP TABLE sg_histogram_sets, sg_histogram_layouts;

-- The aggregate over whole rows is typed by the table's row type: dropped with it, and made
-- again over the view's, which has the same columns.
DROP AGGREGATE streamgauge_histogram(window_histograms);
DROP FUNCTION streamgauge_hdr_merge_rows(window_histograms[]);
DROP TABLE window_histograms;

-- The buckets of the published windows, window_results' rows: those the dashboards and the
-- percentile SQL read (a window still pending has its buckets in its window_pending row).
CREATE VIEW window_histograms AS
SELECT r.config_name, r.window_name, r.metric, r.tags, r.window_start, r.window_end,
       b.bucket,
       streamgauge_hdr_lower_bound(b.bucket, r.hdr_unit_magnitude, r.hdr_half_count_magnitude,
                                   r.hdr_value_scale) AS lower_bound,
       streamgauge_hdr_upper_bound(b.bucket, r.hdr_unit_magnitude, r.hdr_half_count_magnitude,
                                   r.hdr_value_scale) AS upper_bound,
       b.count, r.revision
FROM window_results r
CROSS JOIN LATERAL unnest(r.hdr_buckets, r.hdr_counts) AS b(bucket, count);

COMMENT ON VIEW window_histograms IS
    'HDR histogram of each published window of a timer, histogram or distribution, one row '
    'per non-empty bucket (the hdr_buckets and hdr_counts arrays of its window_results row). '
    'Buckets have fixed bounds per config, so '
    'histograms of any windows and tag groups merge by adding count per bucket (GROUP BY '
    'bucket, or the streamgauge_histogram aggregate): the correct way to get a percentile over '
    'a range; averaging percentiles is not. The rows are those of the window''s latest '
    'revision.';
COMMENT ON COLUMN window_histograms.config_name IS 'Name of the YAML window config.';
COMMENT ON COLUMN window_histograms.window_name IS 'Window definition inside that config.';
COMMENT ON COLUMN window_histograms.metric IS 'Metric name after the config''s mapping rules.';
COMMENT ON COLUMN window_histograms.tags IS 'Tag set (jsonb object), as in window_results.';
COMMENT ON COLUMN window_histograms.window_start IS 'Inclusive start of the window.';
COMMENT ON COLUMN window_histograms.window_end IS 'Exclusive end of the window.';
COMMENT ON COLUMN window_histograms.bucket IS
    'Bucket index: the index of HdrHistogram''s counts array (hdrhistogram package layout, '
    'fixed per config by its lowest, highest, significant digits and value scale).';
COMMENT ON COLUMN window_histograms.lower_bound IS
    'Lowest value recorded in the bucket, in the metric''s units (e.g. ms).';
COMMENT ON COLUMN window_histograms.upper_bound IS
    'Highest value equivalent to the bucket, in the metric''s units: what HdrHistogram '
    'reports as a quantile that falls in this bucket.';
COMMENT ON COLUMN window_histograms.count IS 'Samples in the bucket (> 0).';
COMMENT ON COLUMN window_histograms.revision IS
    'Revision of the window_results row the buckets are stored in.';

CREATE FUNCTION streamgauge_hdr_merge_rows(rows window_histograms[])
RETURNS streamgauge_hdr_bin[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT streamgauge_hdr_merge(array_agg(
        ROW(r.bucket, r.lower_bound, r.upper_bound, r.count)::streamgauge_hdr_bin))
    FROM unnest(rows) AS r
$$;
CREATE AGGREGATE streamgauge_histogram(window_histograms) (
    SFUNC = array_append,
    STYPE = window_histograms[],
    FINALFUNC = streamgauge_hdr_merge_rows,
    COMBINEFUNC = array_cat,
    INITCOND = '{}',
    PARALLEL = SAFE
);
COMMENT ON AGGREGATE streamgauge_histogram(window_histograms) IS
    'The merged HDR histogram of the window_histograms rows aggregated: '
    'streamgauge_histogram(h) ... FROM window_histograms h GROUP BY <time bucket>, <tags>.';
"""

_WINDOW_LATEST_13 = _VIEW_8[: _VIEW_8.index("    UNION ALL\n    SELECT w.config_name")] + """) w
ORDER BY config_name, window_name, metric, tags, window_start, window_end, revision DESC,
         status = 'pending';
"""
_MIGRATION_13 = f"""
-- The window job holds its open windows in memory and rebuilds them from the segment log after
-- a restart (docs/architecture.md D4): nothing writes window_panes or window_held any more.
-- window_latest keeps its columns: published rows, and pending ones.
{_WINDOW_LATEST_13}
DROP VIEW window_held_rows;
DROP TABLE window_held;
DROP TABLE window_panes;
COMMENT ON VIEW window_latest IS
    'The latest row of every window: published (window_results: provisional, early or final) '
    'or pending (window_pending: before the watermark passes its end, or parked by a clean '
    'stop). Windows the job holds in memory between batches are not here.';
"""

_MIGRATION_14 = """
-- Per client and window: what a DogStatsD client said it sent (its telemetry) against what
-- the receivers got from it, from the receivers' streamgauge.ingest.client.* counters
-- (docs/completeness.md). A view: the counters are ordinary window rows already.
CREATE VIEW client_completeness AS
WITH c AS (
    SELECT config_name, window_name, window_start, window_end, tags->>'source' AS source,
           substr(metric, length('streamgauge.ingest.client.') + 1) AS counter,
           tags, sum, is_final
    FROM window_results
    WHERE starts_with(metric, 'streamgauge.ingest.client.') AND tags ? 'source'
      AND early_as_of IS NULL
), s AS (
    SELECT config_name, window_name, window_start, window_end, source,
           max(tags->>'client') AS client,
           max(tags->>'client_version') AS client_version,
           max(tags->>'client_transport') AS client_transport,
           sum(sum) FILTER (WHERE counter = 'datagrams')::bigint AS datagrams,
           sum(sum) FILTER (WHERE counter = 'lines')::bigint AS lines,
           sum(sum) FILTER (WHERE counter = 'rejected')::bigint AS rejected,
           sum(sum) FILTER (WHERE counter = 'kernel_drops')::bigint AS kernel_drops,
           coalesce(sum(sum) FILTER (WHERE counter = 'reports'), 0)::bigint AS reports,
           coalesce(sum(sum) FILTER (WHERE counter = 'reports_unaligned'), 0)::bigint
               AS reports_unaligned,
           sum(sum) FILTER (WHERE counter = 'metrics_sent') AS metrics_sent,
           sum(sum) FILTER (WHERE counter = 'metrics_received') AS metrics_received,
           sum(sum) FILTER (WHERE counter = 'packets_sent') AS packets_sent,
           sum(sum) FILTER (WHERE counter = 'packets_received') AS packets_received,
           sum(sum) FILTER (WHERE counter = 'packets_dropped' AND tags->>'reason' = 'queue')
               AS client_dropped_queue,
           sum(sum) FILTER (WHERE counter = 'packets_dropped' AND tags->>'reason' = 'writer')
               AS client_dropped_writer,
           bool_and(is_final) AS is_final
    FROM c
    GROUP BY config_name, window_name, window_start, window_end, source
)
SELECT s.*,
       CASE WHEN metrics_sent > 0 THEN metrics_received / metrics_sent END AS completeness,
       CASE WHEN packets_sent > 0 THEN packets_received / packets_sent END
           AS packet_completeness
FROM s;

COMMENT ON VIEW client_completeness IS
    'One row per client (sender) and window: what the receivers got from it, and for a '
    'DogStatsD client with telemetry on, what it said it sent over the same telemetry '
    'intervals. Needs a window that keeps the source tag (group_by: [source, ...]) over '
    'streamgauge.ingest.client.*. completeness is NULL (unknown) for a client without '
    'telemetry, never 1.';
COMMENT ON COLUMN client_completeness.source IS
    'The sender: udp://address:port, tcp://peer of a connection, unixgram:///path (every '
    'sender of that socket), or overflow (clients beyond the receiver''s limit).';
COMMENT ON COLUMN client_completeness.client IS
    'The client library, from its telemetry''s client tag (py, go, java, ...); NULL without.';
COMMENT ON COLUMN client_completeness.datagrams IS 'Datagrams received from the client.';
COMMENT ON COLUMN client_completeness.lines IS 'Non-empty lines received from the client.';
COMMENT ON COLUMN client_completeness.rejected IS 'Of them, lines rejected (any reason).';
COMMENT ON COLUMN client_completeness.kernel_drops IS
    'Datagrams the kernel dropped on the receiver''s sockets in the seconds the client sent: '
    'some of them may be the client''s.';
COMMENT ON COLUMN client_completeness.reports IS
    'Telemetry reports of the client whose interval the figures below cover.';
COMMENT ON COLUMN client_completeness.reports_unaligned IS
    'Reports left out: a client''s first one, and one that followed a lost report.';
COMMENT ON COLUMN client_completeness.metrics_sent IS
    'Metrics the client says it sent in those intervals (datadog.dogstatsd.client.metrics).';
COMMENT ON COLUMN client_completeness.metrics_received IS
    'Metric lines that arrived from it in the same intervals (telemetry lines excluded).';
COMMENT ON COLUMN client_completeness.packets_sent IS
    'Packets the client says it sent (datadog.dogstatsd.client.packets_sent); NULL on TCP.';
COMMENT ON COLUMN client_completeness.packets_received IS
    'Datagrams that arrived from it in the same intervals.';
COMMENT ON COLUMN client_completeness.client_dropped_queue IS
    'Packets the client dropped itself, its queue full (packets_dropped_queue).';
COMMENT ON COLUMN client_completeness.client_dropped_writer IS
    'Packets the client failed to write to its socket (packets_dropped_writer).';
COMMENT ON COLUMN client_completeness.completeness IS
    'metrics_received / metrics_sent: the fraction of the client''s metrics that arrived. '
    'NULL (unknown) without telemetry.';
COMMENT ON COLUMN client_completeness.packet_completeness IS
    'packets_received / packets_sent. NULL without telemetry, and on TCP.';
"""

_HISTOGRAMS_VIEW_12 = _MIGRATION_12[_MIGRATION_12.index("CREATE VIEW window_histograms AS"):]
_SKETCH_COLUMNS = (
    "sketch, hdr_histogram, hll_registers, hdr_buckets, hdr_counts, hdr_unit_magnitude, "
    "hdr_half_count_magnitude, hdr_value_scale"
)
_MIGRATION_15 = f"""
-- A window's sketches in a table of their own, beside its row. A timer window's row with its
-- t-digest, HDR arrays and encoding was ~2.6 kB: publishing 100k of them took seconds, and
-- their finalization rewrote each whole. The row without them is ~0.2 kB: the window job
-- commits the rows of a closing window first and their sketches in the next transaction, and
-- the finalization rewrites only the rows. window_results becomes a view joining the two,
-- with the same columns in the same order, so every reader keeps working; window_latest,
-- which reads no sketch, follows the table to its new name.
CREATE TEMPORARY TABLE sg_column_comments AS
SELECT a.attname AS name, col_description(a.attrelid, a.attnum) AS comment
FROM pg_attribute a
WHERE a.attrelid = 'window_results'::regclass AND a.attnum > 0 AND NOT a.attisdropped;
DROP AGGREGATE streamgauge_histogram(window_histograms);
DROP FUNCTION streamgauge_hdr_merge_rows(window_histograms[]);
DROP VIEW window_histograms;
ALTER TABLE window_results RENAME TO window_rows;
CREATE TABLE window_sketches (
    config_name  text        NOT NULL,
    window_name  text        NOT NULL,
    metric       text        NOT NULL,
    tags         jsonb       NOT NULL,
    window_start timestamptz NOT NULL,
    window_end   timestamptz NOT NULL,
    sketch bytea, hdr_histogram text, hll_registers bytea,
    hdr_buckets int4[], hdr_counts int8[], hdr_unit_magnitude int2,
    hdr_half_count_magnitude int2, hdr_value_scale float8,
    PRIMARY KEY (config_name, window_name, metric, tags, window_start, window_end),
    CONSTRAINT window_sketches_hdr_check CHECK (cardinality(hdr_buckets) = cardinality(hdr_counts))
);
ALTER TABLE window_sketches ALTER COLUMN hdr_buckets SET STORAGE MAIN,
    ALTER COLUMN hdr_counts SET STORAGE MAIN;
INSERT INTO window_sketches
SELECT config_name, window_name, metric, tags, window_start, window_end, {_SKETCH_COLUMNS}
FROM window_rows
WHERE sketch IS NOT NULL OR hll_registers IS NOT NULL OR hdr_buckets IS NOT NULL;
ALTER TABLE window_rows DROP COLUMN sketch, DROP COLUMN hdr_histogram,
    DROP COLUMN hll_registers, DROP COLUMN hdr_buckets, DROP COLUMN hdr_counts,
    DROP COLUMN hdr_unit_magnitude, DROP COLUMN hdr_half_count_magnitude,
    DROP COLUMN hdr_value_scale;
COMMENT ON TABLE window_rows IS
    'Internal: the published windows'' values (window_results shows them with their sketches).';
COMMENT ON TABLE window_sketches IS
    'Internal: the sketches of the published windows that have one (window_results shows '
    'them in the window''s row). Written with the row, or, for a window published for the '
    'first time, by the next transaction of the same micro-batch.';

CREATE VIEW window_results AS
SELECT r.config_name, r.window_name, r.metric, r.tags, r.window_start, r.window_end,
       r.metric_type, r.count, r.sum, r.min, r.max, r.last, r.p50, r.p90, r.p99,
       r.distinct_count, r.revision, r.is_final, r.late_events, r.emitted_at, r.corrections,
       r.p999, k.sketch, k.hdr_histogram, k.hll_registers, r.early_as_of, k.hdr_buckets,
       k.hdr_counts, k.hdr_unit_magnitude, k.hdr_half_count_magnitude, k.hdr_value_scale
FROM window_rows r
LEFT JOIN window_sketches k
    ON k.config_name = r.config_name AND k.window_name = r.window_name
   AND k.metric = r.metric AND k.tags = r.tags
   AND k.window_start = r.window_start AND k.window_end = r.window_end;
COMMENT ON VIEW window_results IS
    'One row per published window (metric, tag set, window bounds) at its latest revision: '
    'its values, finality, late samples and sketches. A window published for the first time '
    'shows its sketch columns NULL until the transaction after its row commits (the same '
    'micro-batch, docs/store.md).';
-- Writes through the view (a script, a psql session: the window job writes the tables) go
-- to the two tables, with the table's defaults.
CREATE FUNCTION window_results_write() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM window_sketches k
        WHERE (k.config_name, k.window_name, k.metric, k.tags, k.window_start, k.window_end)
            = (OLD.config_name, OLD.window_name, OLD.metric, OLD.tags, OLD.window_start,
               OLD.window_end);
        DELETE FROM window_rows r
        WHERE (r.config_name, r.window_name, r.metric, r.tags, r.window_start, r.window_end)
            = (OLD.config_name, OLD.window_name, OLD.metric, OLD.tags, OLD.window_start,
               OLD.window_end);
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
    END IF;
    INSERT INTO window_rows (config_name, window_name, metric, tags, window_start, window_end,
        metric_type, count, sum, min, max, last, p50, p90, p99, distinct_count, revision,
        is_final, late_events, emitted_at, corrections, p999, early_as_of)
    VALUES (NEW.config_name, NEW.window_name, NEW.metric, NEW.tags, NEW.window_start,
        NEW.window_end, NEW.metric_type, NEW.count, NEW.sum, NEW.min, NEW.max, NEW.last,
        NEW.p50, NEW.p90, NEW.p99, NEW.distinct_count, NEW.revision, NEW.is_final,
        NEW.late_events, NEW.emitted_at, NEW.corrections, NEW.p999, NEW.early_as_of);
    IF NEW.sketch IS NOT NULL OR NEW.hll_registers IS NOT NULL OR NEW.hdr_buckets IS NOT NULL
       OR NEW.hdr_histogram IS NOT NULL THEN
        INSERT INTO window_sketches (config_name, window_name, metric, tags, window_start,
            window_end, {_SKETCH_COLUMNS})
        VALUES (NEW.config_name, NEW.window_name, NEW.metric, NEW.tags, NEW.window_start,
            NEW.window_end, NEW.sketch, NEW.hdr_histogram, NEW.hll_registers, NEW.hdr_buckets,
            NEW.hdr_counts, NEW.hdr_unit_magnitude, NEW.hdr_half_count_magnitude,
            NEW.hdr_value_scale);
    END IF;
    RETURN NEW;
END
$$;
COMMENT ON FUNCTION window_results_write() IS
    'INSTEAD OF trigger of the window_results view: writes go to window_rows and '
    'window_sketches.';
CREATE TRIGGER window_results_write INSTEAD OF INSERT OR UPDATE OR DELETE ON window_results
    FOR EACH ROW EXECUTE FUNCTION window_results_write();

DO $$
DECLARE c record;
BEGIN
    FOR c IN SELECT a.attname AS name, pg_get_expr(d.adbin, d.adrelid) AS value
             FROM pg_attribute a JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
             WHERE a.attrelid = 'window_rows'::regclass LOOP
        EXECUTE format('ALTER VIEW window_results ALTER COLUMN %I SET DEFAULT %s',
                       c.name, c.value);
    END LOOP;
    FOR c IN SELECT * FROM sg_column_comments LOOP
        EXECUTE format('COMMENT ON COLUMN window_results.%I IS %L', c.name, c.comment);
        IF EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = 'window_sketches'::regclass
                   AND a.attname = c.name) THEN
            EXECUTE format('COMMENT ON COLUMN window_sketches.%I IS %L', c.name, c.comment);
        END IF;
    END LOOP;
END
$$;
DROP TABLE sg_column_comments;
{_HISTOGRAMS_VIEW_12}"""

_MIGRATION_16 = """
-- A timer window's sketches are ~2.4 kB: over the 2 kB at which PostgreSQL starts to TOAST a
-- row, so each was compressed (pglz, which float data resists) and moved out of line, one
-- TOAST row and index entry more per window. Up to a page's 8 kB a row now stays whole.
ALTER TABLE window_sketches SET (toast_tuple_target = 8160);
-- A Unix datagram sender is its process now (SO_PASSCRED), not every sender of the socket.
COMMENT ON COLUMN client_completeness.source IS
    'The sender: udp://address:port, tcp://peer of a connection, unixgram pid N (a process '
    'on a Unix datagram socket; unixgram:///path: every sender of that socket whose '
    'credentials did not come), or overflow (clients beyond the receiver''s limit).';
"""


HDR_COUNT_BITS = 40
"""How the store packs a window's HDR histogram (schema version 17): one int8 per non-empty
bucket, ``bucket << HDR_COUNT_BITS | count``. Bucket indices stay below 2^23 (the largest
layout, 5 significant digits up to 2^62, has about 6M) and a bucket's count below 2^40
(a million samples a second into one bucket of one series for twelve days)."""

_HDR_COUNT_MASK = (1 << HDR_COUNT_BITS) - 1
_MIGRATION_17 = f"""
-- A window's HDR buckets packed in one array, an element per non-empty bucket
-- (bucket << {HDR_COUNT_BITS} | count), in place of the two arrays of buckets and counts: a timer
-- window's sketches row was ~2.9 kB, two to a page, and PostgreSQL reads an array element by
-- element; one array of half the elements and two thirds of the bytes makes a close of 100k
-- timer windows write a third less. window_results shows the buckets and counts as before.
CREATE FUNCTION streamgauge_hdr_pack(buckets int4[], counts int8[])
RETURNS int8[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT array_agg((b::int8 << {HDR_COUNT_BITS}) | c ORDER BY i)
    FROM unnest(buckets, counts) WITH ORDINALITY AS u(b, c, i)
$$;
COMMENT ON FUNCTION streamgauge_hdr_pack(int4[], int8[]) IS
    'HDR buckets and their counts (same length) packed as window_sketches.hdr_bucket_counts '
    'keeps them; NULL for none.';
CREATE FUNCTION streamgauge_hdr_entries(bucket_counts int8[])
RETURNS TABLE (bucket int4, count int8)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (p >> {HDR_COUNT_BITS})::int4, p & {_HDR_COUNT_MASK} FROM unnest(bucket_counts) AS p
$$;
COMMENT ON FUNCTION streamgauge_hdr_entries(int8[]) IS
    'The buckets of a packed HDR histogram (hdr_bucket_counts), a row each: its index and '
    'its count, ascending.';
CREATE FUNCTION streamgauge_hdr_buckets(bucket_counts int8[])
RETURNS int4[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT ARRAY(SELECT (p >> {HDR_COUNT_BITS})::int4
                 FROM unnest(bucket_counts) WITH ORDINALITY AS u(p, i) ORDER BY i)
$$;
COMMENT ON FUNCTION streamgauge_hdr_buckets(int8[]) IS
    'The bucket indices of a packed HDR histogram (hdr_bucket_counts), ascending.';
CREATE FUNCTION streamgauge_hdr_counts(bucket_counts int8[])
RETURNS int8[]
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT ARRAY(SELECT p & {_HDR_COUNT_MASK}
                 FROM unnest(bucket_counts) WITH ORDINALITY AS u(p, i) ORDER BY i)
$$;
COMMENT ON FUNCTION streamgauge_hdr_counts(int8[]) IS
    'The counts of a packed HDR histogram''s buckets (hdr_bucket_counts), in bucket order.';

ALTER TABLE window_sketches ADD COLUMN hdr_bucket_counts int8[];
ALTER TABLE window_sketches ALTER COLUMN hdr_bucket_counts SET STORAGE MAIN;
UPDATE window_sketches SET hdr_bucket_counts = streamgauge_hdr_pack(hdr_buckets, hdr_counts)
WHERE hdr_buckets IS NOT NULL;
ALTER TABLE window_pending ADD COLUMN hdr_bucket_counts int8[];
ALTER TABLE window_pending ALTER COLUMN hdr_bucket_counts SET STORAGE MAIN;
UPDATE window_pending SET hdr_bucket_counts = streamgauge_hdr_pack(hdr_buckets, hdr_counts)
WHERE hdr_buckets IS NOT NULL;

CREATE OR REPLACE VIEW window_results AS
SELECT r.config_name, r.window_name, r.metric, r.tags, r.window_start, r.window_end,
       r.metric_type, r.count, r.sum, r.min, r.max, r.last, r.p50, r.p90, r.p99,
       r.distinct_count, r.revision, r.is_final, r.late_events, r.emitted_at, r.corrections,
       r.p999, k.sketch, k.hdr_histogram, k.hll_registers, r.early_as_of,
       streamgauge_hdr_buckets(k.hdr_bucket_counts) AS hdr_buckets,
       streamgauge_hdr_counts(k.hdr_bucket_counts) AS hdr_counts,
       k.hdr_unit_magnitude, k.hdr_half_count_magnitude, k.hdr_value_scale,
       k.hdr_bucket_counts
FROM window_rows r
LEFT JOIN window_sketches k
    ON k.config_name = r.config_name AND k.window_name = r.window_name
   AND k.metric = r.metric AND k.tags = r.tags
   AND k.window_start = r.window_start AND k.window_end = r.window_end;
COMMENT ON COLUMN window_results.hdr_bucket_counts IS
    'The window''s HDR histogram as the store keeps it: an element per non-empty bucket, '
    'bucket << {HDR_COUNT_BITS} | count, ascending (hdr_buckets and hdr_counts unpack it; '
    'streamgauge_hdr_entries(hdr_bucket_counts) gives a row per bucket). NULL for types '
    'without one.';
COMMENT ON COLUMN window_sketches.hdr_bucket_counts IS
    'Non-empty HDR buckets packed, bucket << {HDR_COUNT_BITS} | count, ascending; NULL where none.';
COMMENT ON COLUMN window_pending.hdr_bucket_counts IS
    'Non-empty HDR buckets packed, bucket << {HDR_COUNT_BITS} | count, ascending; NULL where none.';

CREATE OR REPLACE VIEW window_histograms AS
SELECT r.config_name, r.window_name, r.metric, r.tags, r.window_start, r.window_end,
       b.bucket,
       streamgauge_hdr_lower_bound(b.bucket, k.hdr_unit_magnitude, k.hdr_half_count_magnitude,
                                   k.hdr_value_scale) AS lower_bound,
       streamgauge_hdr_upper_bound(b.bucket, k.hdr_unit_magnitude, k.hdr_half_count_magnitude,
                                   k.hdr_value_scale) AS upper_bound,
       b.count, r.revision
FROM window_rows r
JOIN window_sketches k
    ON k.config_name = r.config_name AND k.window_name = r.window_name
   AND k.metric = r.metric AND k.tags = r.tags
   AND k.window_start = r.window_start AND k.window_end = r.window_end
CROSS JOIN LATERAL streamgauge_hdr_entries(k.hdr_bucket_counts) AS b;

CREATE OR REPLACE FUNCTION window_results_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    packed int8[] := coalesce(NEW.hdr_bucket_counts,
                              streamgauge_hdr_pack(NEW.hdr_buckets, NEW.hdr_counts));
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        DELETE FROM window_sketches k
        WHERE (k.config_name, k.window_name, k.metric, k.tags, k.window_start, k.window_end)
            = (OLD.config_name, OLD.window_name, OLD.metric, OLD.tags, OLD.window_start,
               OLD.window_end);
        DELETE FROM window_rows r
        WHERE (r.config_name, r.window_name, r.metric, r.tags, r.window_start, r.window_end)
            = (OLD.config_name, OLD.window_name, OLD.metric, OLD.tags, OLD.window_start,
               OLD.window_end);
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
    END IF;
    INSERT INTO window_rows (config_name, window_name, metric, tags, window_start, window_end,
        metric_type, count, sum, min, max, last, p50, p90, p99, distinct_count, revision,
        is_final, late_events, emitted_at, corrections, p999, early_as_of)
    VALUES (NEW.config_name, NEW.window_name, NEW.metric, NEW.tags, NEW.window_start,
        NEW.window_end, NEW.metric_type, NEW.count, NEW.sum, NEW.min, NEW.max, NEW.last,
        NEW.p50, NEW.p90, NEW.p99, NEW.distinct_count, NEW.revision, NEW.is_final,
        NEW.late_events, NEW.emitted_at, NEW.corrections, NEW.p999, NEW.early_as_of);
    IF NEW.sketch IS NOT NULL OR NEW.hll_registers IS NOT NULL OR packed IS NOT NULL
       OR NEW.hdr_histogram IS NOT NULL THEN
        INSERT INTO window_sketches (config_name, window_name, metric, tags, window_start,
            window_end, sketch, hdr_histogram, hll_registers, hdr_bucket_counts,
            hdr_unit_magnitude, hdr_half_count_magnitude, hdr_value_scale)
        VALUES (NEW.config_name, NEW.window_name, NEW.metric, NEW.tags, NEW.window_start,
            NEW.window_end, NEW.sketch, NEW.hdr_histogram, NEW.hll_registers, packed,
            NEW.hdr_unit_magnitude, NEW.hdr_half_count_magnitude, NEW.hdr_value_scale);
    END IF;
    RETURN NEW;
END
$$;

-- Buckets and counts of unequal lengths pack to a NULL element: refused, as the two arrays
-- of unequal lengths were.
ALTER TABLE window_sketches DROP CONSTRAINT window_sketches_hdr_check,
    DROP COLUMN hdr_buckets, DROP COLUMN hdr_counts,
    ADD CONSTRAINT window_sketches_hdr_check
        CHECK (array_position(hdr_bucket_counts, NULL) IS NULL);
ALTER TABLE window_pending DROP CONSTRAINT window_pending_hdr_check,
    DROP COLUMN hdr_buckets, DROP COLUMN hdr_counts,
    ADD CONSTRAINT window_pending_hdr_check
        CHECK (array_position(hdr_bucket_counts, NULL) IS NULL);
"""


_COMPLETENESS_START = _MIGRATION_14.index("CREATE VIEW client_completeness AS")
_COMPLETENESS_14 = _MIGRATION_14[
    _COMPLETENESS_START:_MIGRATION_14.index(";", _COMPLETENESS_START)
]


_WINDOW_RESULTS_18 = """CREATE OR REPLACE VIEW window_results AS
SELECT s.config_name, s.window_name, s.metric, s.tags, r.window_start, r.window_end,
       r.metric_type, r.count, r.sum, r.min, r.max, r.last, r.p50, r.p90, r.p99,
       r.distinct_count, r.revision, r.is_final, r.late_events, r.emitted_at, r.corrections,
       r.p999, k.sketch, k.hdr_histogram, {registers}, r.early_as_of,
       streamgauge_hdr_buckets(k.hdr_bucket_counts) AS hdr_buckets,
       streamgauge_hdr_counts(k.hdr_bucket_counts) AS hdr_counts,
       k.hdr_unit_magnitude, k.hdr_half_count_magnitude, k.hdr_value_scale,
       k.hdr_bucket_counts
FROM window_rows r
JOIN window_series s ON s.series_id = r.series_id
LEFT JOIN window_sketches k
    ON k.series_id = r.series_id AND k.window_start = r.window_start
   AND k.window_end = r.window_end;
"""
"""window_results over window_series, window_rows and window_sketches (schema version 18 on);
``{registers}``: the expression of its ``hll_registers`` column."""


_MIGRATION_18 = f"""
-- A window's series (config, window, metric, tags) is a row of window_series, once, and its
-- windows' rows and sketches are keyed by the series' id and their bounds. Keyed by
-- (config_name, window_name, metric, tags jsonb, window_start, window_end), a close of 100k
-- windows inserted 100k entries of that width into each table's primary key, about half of
-- the rows' COPY; keyed by (series_id, window_start, window_end) the entries are 24 bytes.
-- window_results and window_histograms show the same columns as before, the names from
-- window_series. window_rows keeps config_name and window_name: the finalization, the open
-- ends' triggers and retention find rows by them and window_end.
CREATE TABLE window_series (
    series_id   bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    config_name text   NOT NULL,
    window_name text   NOT NULL,
    metric      text   NOT NULL,
    tags        jsonb  NOT NULL,
    UNIQUE (config_name, window_name, metric, tags)
);
COMMENT ON TABLE window_series IS
    'Internal: one row per series of a window definition (config, window, metric, tag set), '
    'numbered; window_rows and window_sketches refer to it by series_id (window_results '
    'shows the names).';
COMMENT ON COLUMN window_series.series_id IS
    'The series'' number, assigned when it is first stored.';
COMMENT ON COLUMN window_series.config_name IS 'The config of the window definition.';
COMMENT ON COLUMN window_series.window_name IS 'The window (of the config).';
COMMENT ON COLUMN window_series.metric IS 'The metric name.';
COMMENT ON COLUMN window_series.tags IS 'The tag set the window groups by.';

-- Retention deletes the series no window refers to any more (ResultStore.prune): a writer
-- remembers the ids of the series it stores, so each of its transactions reads the
-- generation FOR SHARE, and a retention round that deletes series bumps it first.
CREATE TABLE window_series_generation (generation bigint NOT NULL);
INSERT INTO window_series_generation VALUES (0);
COMMENT ON TABLE window_series_generation IS
    'Internal: one row, bumped by the retention round that deletes window_series rows no '
    'window refers to; a writer forgets the series ids it remembers when it changed.';

INSERT INTO window_series (config_name, window_name, metric, tags)
SELECT config_name, window_name, metric, tags FROM window_rows
UNION SELECT config_name, window_name, metric, tags FROM window_sketches
UNION SELECT config_name, window_name, metric, tags FROM window_pending;
ALTER TABLE window_rows ADD COLUMN series_id bigint;
UPDATE window_rows r SET series_id = s.series_id FROM window_series s
WHERE (s.config_name, s.window_name, s.metric, s.tags)
    = (r.config_name, r.window_name, r.metric, r.tags);
ALTER TABLE window_sketches ADD COLUMN series_id bigint;
UPDATE window_sketches k SET series_id = s.series_id FROM window_series s
WHERE (s.config_name, s.window_name, s.metric, s.tags)
    = (k.config_name, k.window_name, k.metric, k.tags);

{_WINDOW_RESULTS_18.format(registers="k.hll_registers")}
CREATE OR REPLACE VIEW window_histograms AS
SELECT s.config_name, s.window_name, s.metric, s.tags, r.window_start, r.window_end,
       b.bucket,
       streamgauge_hdr_lower_bound(b.bucket, k.hdr_unit_magnitude, k.hdr_half_count_magnitude,
                                   k.hdr_value_scale) AS lower_bound,
       streamgauge_hdr_upper_bound(b.bucket, k.hdr_unit_magnitude, k.hdr_half_count_magnitude,
                                   k.hdr_value_scale) AS upper_bound,
       b.count, r.revision
FROM window_rows r
JOIN window_series s ON s.series_id = r.series_id
JOIN window_sketches k
    ON k.series_id = r.series_id AND k.window_start = r.window_start
   AND k.window_end = r.window_end
CROSS JOIN LATERAL streamgauge_hdr_entries(k.hdr_bucket_counts) AS b;

-- window_latest and client_completeness were made when window_results was the table that
-- is now window_rows: made again, the same text reads the view.
{_WINDOW_LATEST_13}
{_COMPLETENESS_14.replace("CREATE VIEW", "CREATE OR REPLACE VIEW")};

-- Dropping a column of the primary key drops the key.
ALTER TABLE window_rows DROP COLUMN metric, DROP COLUMN tags,
    ALTER COLUMN series_id SET NOT NULL,
    ADD PRIMARY KEY (series_id, window_start, window_end);
ALTER TABLE window_sketches DROP COLUMN config_name, DROP COLUMN window_name,
    DROP COLUMN metric, DROP COLUMN tags,
    ALTER COLUMN series_id SET NOT NULL,
    ADD PRIMARY KEY (series_id, window_start, window_end);
COMMENT ON COLUMN window_rows.series_id IS 'The window''s series (window_series).';
COMMENT ON COLUMN window_sketches.series_id IS 'The window''s series (window_series).';

CREATE FUNCTION streamgauge_series_id(config text, window_def text, metric_name text,
                                      tag_set jsonb)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    id bigint;
BEGIN
    SELECT s.series_id INTO id FROM window_series s
    WHERE (s.config_name, s.window_name, s.metric, s.tags)
        = (config, window_def, metric_name, tag_set);
    IF id IS NULL THEN
        INSERT INTO window_series AS s (config_name, window_name, metric, tags)
        VALUES (config, window_def, metric_name, tag_set)
        ON CONFLICT (config_name, window_name, metric, tags) DO UPDATE SET metric = s.metric
        RETURNING s.series_id INTO id;
    END IF;
    RETURN id;
END
$$;
COMMENT ON FUNCTION streamgauge_series_id(text, text, text, jsonb) IS
    'The series_id of a series (window_series), numbering it if it is new.';

CREATE OR REPLACE FUNCTION window_results_write() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    packed int8[] := coalesce(NEW.hdr_bucket_counts,
                              streamgauge_hdr_pack(NEW.hdr_buckets, NEW.hdr_counts));
    old_id bigint;
    new_id bigint;
BEGIN
    IF TG_OP IN ('UPDATE', 'DELETE') THEN
        SELECT s.series_id INTO old_id FROM window_series s
        WHERE (s.config_name, s.window_name, s.metric, s.tags)
            = (OLD.config_name, OLD.window_name, OLD.metric, OLD.tags);
        DELETE FROM window_sketches k
        WHERE (k.series_id, k.window_start, k.window_end)
            = (old_id, OLD.window_start, OLD.window_end);
        DELETE FROM window_rows r
        WHERE (r.series_id, r.window_start, r.window_end)
            = (old_id, OLD.window_start, OLD.window_end);
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
    END IF;
    new_id := streamgauge_series_id(NEW.config_name, NEW.window_name, NEW.metric, NEW.tags);
    INSERT INTO window_rows (config_name, window_name, series_id, window_start, window_end,
        metric_type, count, sum, min, max, last, p50, p90, p99, distinct_count, revision,
        is_final, late_events, emitted_at, corrections, p999, early_as_of)
    VALUES (NEW.config_name, NEW.window_name, new_id, NEW.window_start,
        NEW.window_end, NEW.metric_type, NEW.count, NEW.sum, NEW.min, NEW.max, NEW.last,
        NEW.p50, NEW.p90, NEW.p99, NEW.distinct_count, NEW.revision, NEW.is_final,
        NEW.late_events, NEW.emitted_at, NEW.corrections, NEW.p999, NEW.early_as_of);
    IF NEW.sketch IS NOT NULL OR NEW.hll_registers IS NOT NULL OR packed IS NOT NULL
       OR NEW.hdr_histogram IS NOT NULL THEN
        INSERT INTO window_sketches (series_id, window_start, window_end, sketch,
            hdr_histogram, hll_registers, hdr_bucket_counts, hdr_unit_magnitude,
            hdr_half_count_magnitude, hdr_value_scale)
        VALUES (new_id, NEW.window_start, NEW.window_end, NEW.sketch, NEW.hdr_histogram,
            NEW.hll_registers, packed, NEW.hdr_unit_magnitude, NEW.hdr_half_count_magnitude,
            NEW.hdr_value_scale);
    END IF;
    RETURN NEW;
END
$$;
"""


_MIGRATION_19 = f"""
-- A set window's registers come from its DataSketches image, not a stored copy: 2^lgK bytes
-- (4 kB at lgK 12) for every set window, whatever its cardinality, were most of the bytes a
-- close of 100k small sets wrote. window_results derives hll_registers from the image; the
-- store keeps them only for an image this function cannot read (HLL_4 / HLL_6 in HLL mode,
-- whose registers hide behind an offset and an exception table), and rows stored before
-- this version keep theirs.
CREATE FUNCTION streamgauge_hll_image_registers(image bytea)
RETURNS bytea
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS $$
DECLARE
    lg_k      integer;
    k         integer;
    mode      integer;
    registers bytea;
    coupon    bigint;
    slot      integer;
    value     integer;
    p         integer;
BEGIN
    IF length(image) < 8 OR get_byte(image, 1) <> 1 OR get_byte(image, 2) <> 7
       OR get_byte(image, 3) NOT BETWEEN 4 AND 21 THEN
        RAISE EXCEPTION 'not a DataSketches HLL image (% bytes)', length(image)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    lg_k := get_byte(image, 3);
    k := 1 << lg_k;
    mode := get_byte(image, 7) & 3;
    IF mode = 2 THEN  -- HLL mode: HLL_8 holds one byte per register after the 40-byte preamble
        IF (get_byte(image, 7) >> 2) & 3 <> 2 THEN
            RETURN NULL;
        END IF;
        IF length(image) < 40 + k THEN
            RAISE EXCEPTION 'not a DataSketches HLL image: % bytes, lgK %', length(image), lg_k
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        RETURN substring(image FROM 41 FOR k);
    END IF;
    -- LIST (coupons after 8 bytes) or SET (after 12): uint32 little-endian coupons, 0 an
    -- updatable table's empty slot; register slot = the coupon's low lgK bits, value = its
    -- top 6 bits (at most 3/4 of 2^(lgK-3) coupons before a sketch turns to HLL mode). A
    -- loop of set_byte: faster here than one set-based statement writing the array as hex
    -- (docs/performance.md, "Sets at 100k series").
    -- (PostgreSQL's | and << share one precedence, left to right: hence the parentheses.)
    registers := decode(repeat('00', k), 'hex');
    IF get_byte(image, 5) & 4 <> 0 THEN  -- the empty flag
        RETURN registers;
    END IF;
    p := CASE mode WHEN 0 THEN 8 ELSE 12 END;
    WHILE p + 4 <= length(image) LOOP
        coupon := get_byte(image, p)::bigint | (get_byte(image, p + 1)::bigint << 8)
                  | (get_byte(image, p + 2)::bigint << 16) | (get_byte(image, p + 3)::bigint << 24);
        IF coupon <> 0 THEN
            slot := coupon & (k - 1);
            value := coupon >> 26;
            IF value > get_byte(registers, slot) THEN
                registers := set_byte(registers, slot, value);
            END IF;
        END IF;
        p := p + 4;
    END LOOP;
    RETURN registers;
END
$$;
COMMENT ON FUNCTION streamgauge_hll_image_registers(bytea) IS
    'The 2^lgK HLL registers of a DataSketches HLL image in LIST or SET mode (its coupons) or '
    'HLL mode with HLL_8 registers; NULL for an HLL_4 or HLL_6 image in HLL mode.';

{_WINDOW_RESULTS_18.format(registers=(
    "CASE WHEN r.metric_type = 's'"
    " THEN coalesce(k.hll_registers, streamgauge_hll_image_registers(k.sketch))"
    " END AS hll_registers"))}
COMMENT ON COLUMN window_sketches.hll_registers IS
    'Sets whose image streamgauge_hll_image_registers cannot read (HLL_4 / HLL_6 in HLL mode), '
    'and sets stored before schema version 19: the registers; NULL otherwise (window_results '
    'derives them from the image).';
"""


MIGRATIONS: tuple[str, ...] = (
    _MIGRATION_1, _MIGRATION_2, _MIGRATION_3, _MIGRATION_4, _MIGRATION_5, _MIGRATION_6,
    _MIGRATION_7, _MIGRATION_8, _MIGRATION_9 + _WINDOW_LATEST_WITH_HELD, _MIGRATION_10,
    _MIGRATION_11, _MIGRATION_12, _MIGRATION_13, _MIGRATION_14,
    _MIGRATION_15, _MIGRATION_16, _MIGRATION_17, _MIGRATION_18, _MIGRATION_19,
)
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
