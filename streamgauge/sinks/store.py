"""Writes window results to PostgreSQL, one transaction per micro-batch, idempotently.

A Spark micro-batch can be delivered twice (a restart replays the interrupted batch with the
same id) and a window can be emitted several times (every late sample within the allowed
lateness makes a new revision). ``ResultStore.commit_batch`` makes both harmless, in ONE
transaction:

1. claim ``(query_name, batch_id)`` in ``sink_batches``; if it is already there the batch was
   committed before (perhaps by a commit whose acknowledgement was lost), so do nothing;
2. ``COPY`` the Arrow rows (binary) into a per-connection temporary staging table;
3. one ``INSERT ... SELECT ... ON CONFLICT (key) DO UPDATE ... WHERE stored.revision <
   excluded.revision``: a row only ever replaces an older revision of itself, so an older or
   equal revision arriving late changes nothing and says so (``rows_upserted`` counts only the
   rows that changed);
4. mark windows final whose ``window_end + allowed lateness <= watermark``;
5. upsert ``pipeline_state`` (e.g. the watermark) and record the batch's row count.

A published window is a row of ``window_rows`` (its values) and, if it has sketches, a row of
``window_sketches`` (``window_results`` is the view joining them, schema version 15); every
statement that writes or deletes the one does the same to the other. The exception is the
windows a batch publishes for the first time (``fresh``): their rows commit in the batch's
transaction and their sketches in a second one, claimed under ``<query>.sketches``, so a
closing batch's values are visible without waiting for the sketches' bytes.

Times cross the wire as integer epoch milliseconds and become ``timestamptz`` in SQL as
``timestamptz 'epoch' + ms * interval '1 millisecond'``: exact to the microsecond for any ms
below 2**53 / 1000 (the interval multiply is done in float8 but every such product is an
integer below 2**53), whereas ``to_timestamp(ms / 1000.0)`` goes through float seconds.

When PostgreSQL is unreachable (refused, restarting, connection killed) every call retries with
exponential backoff, forever by default, logging each failed attempt without credentials: the
streaming job then stops advancing and the segment log holds the backlog. Errors that retrying
cannot fix (bad data, wrong password, missing database) raise at once.

A ``ResultStore`` holds one connection and is not thread-safe: one per writer.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import threading
import time
import types
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pgpq
import psycopg
import pyarrow as pa
import pyarrow.compute as pc
from psycopg import errors as pgerrors
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict

from streamgauge.clock import Clock, SystemClock
from streamgauge.sinks import schema
from streamgauge.sinks.series_ids import SeriesIds
from streamgauge.sketches import hll_columns
from streamgauge.sketches.hll_registers import hll_registers

_logger = logging.getLogger(__name__)

T = TypeVar("T")

RESULT_SCHEMA = pa.schema(
    [
        pa.field("config_name", pa.string(), nullable=False),
        pa.field("window_name", pa.string(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("tags", pa.string(), nullable=False),  # canonical JSON object text, "{}" if none
        pa.field("metric_type", pa.string(), nullable=False),
        pa.field("window_start_ms", pa.int64(), nullable=False),
        pa.field("window_end_ms", pa.int64(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("sum", pa.float64()),
        pa.field("min", pa.float64()),
        pa.field("max", pa.float64()),
        pa.field("last", pa.float64()),
        pa.field("p50", pa.float64()),
        pa.field("p90", pa.float64()),
        pa.field("p99", pa.float64()),
        pa.field("p999", pa.float64()),
        pa.field("distinct_count", pa.float64()),
        pa.field("sketch", pa.binary()),  # t-digest (ms/h/d) or HLL_8 (s), serialized
        pa.field("hdr_histogram", pa.string()),  # HdrHistogram V2 compressed, base64
        # The same histogram's non-empty buckets (ascending) with their counts, packed
        # (``pack_hdr_buckets``), and the three constants of its layout their bounds follow
        # from (``HDR_COLUMNS``).
        pa.field("hdr_bucket_counts", pa.list_(pa.int64())),
        pa.field("hdr_unit_magnitude", pa.int16()),
        pa.field("hdr_half_count_magnitude", pa.int16()),
        pa.field("hdr_value_scale", pa.float64()),
        pa.field("revision", pa.int64(), nullable=False),
        pa.field("is_final", pa.bool_(), nullable=False),
        pa.field("late_events", pa.int64(), nullable=False),
        pa.field("emitted_at_ms", pa.int64(), nullable=False),
    ]
)
"""The Arrow schema ``commit_batch`` expects (columns may come in any order; types are cast
safely, e.g. int32 → int64 or large_string → string; a lossy cast is refused). The columns in
``OPTIONAL_RESULT_COLUMNS`` may be left out: they are NULL then."""

HDR_COLUMNS = (
    "hdr_bucket_counts", "hdr_unit_magnitude", "hdr_half_count_magnitude", "hdr_value_scale",
)  # fmt: skip
"""A window's HDR buckets as the store keeps them beside its row (schema version 17),
unnested by the ``window_histograms`` view: the non-empty buckets packed with their counts
(``pack_hdr_buckets``; NULL for a window without a histogram) and the layout's unit
magnitude, sub-bucket half count magnitude and value scale, from which SQL computes each
bucket's bounds (``streamgauge_hdr_lower_bound``)."""


def pack_hdr_buckets(buckets: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """HDR bucket indices and their counts (same length) as ``hdr_bucket_counts`` holds them:
    ``bucket << HDR_COUNT_BITS | count``, int64. A count too large for its bits is refused
    rather than stored wrong."""
    counts = np.asarray(counts, np.int64)
    if counts.size and int(counts.max()) >> schema.HDR_COUNT_BITS:
        raise ValueError(
            f"an HDR bucket holds {int(counts.max())} samples, more than the store's "
            f"{schema.HDR_COUNT_BITS}-bit count of a bucket"
        )
    packed: np.ndarray = (np.asarray(buckets, np.int64) << schema.HDR_COUNT_BITS) | counts
    return packed


OPTIONAL_RESULT_COLUMNS = frozenset({"p999", "sketch", "hdr_histogram", *HDR_COLUMNS})
"""Added with the sketches (schema versions 4, 12 and 17); writers that produce none need not
name them."""

_SERIES_ID = pa.field("series_id", pa.int64())
_STAGED_SCHEMA = RESULT_SCHEMA.append(pa.field("hll_registers", pa.binary())).append(_SERIES_ID)
"""What is staged: the results plus what the store derives from them, the register array of
a set row's HLL where SQL cannot read it from the image (schema versions 5 and 19;
:func:`_with_hll_registers`) and the number of its series (schema version 18;
:mod:`streamgauge.sinks.series_ids`)."""

RESULT_COLUMNS: tuple[str, ...] = tuple(RESULT_SCHEMA.names)

_PG_TYPES = {
    pa.string(): "text",
    pa.binary(): "bytea",
    pa.int16(): "int2",
    pa.int32(): "int4",
    pa.int64(): "int8",
    pa.float64(): "float8",
    pa.bool_(): "bool",
    pa.list_(pa.int32()): "int4[]",
    pa.list_(pa.int64()): "int8[]",
}
def _staging_ddl(table: str, schema: pa.Schema) -> str:
    """A per-connection temporary table shaped like ``schema``, emptied at every commit.

    ON COMMIT DELETE ROWS: a staging table holds one transaction's rows (a rollback discards
    them anyway), so the table itself lives as long as the connection.
    """
    columns = ", ".join(f"{f.name} {_PG_TYPES[f.type]}" for f in schema)
    return f"CREATE TEMPORARY TABLE IF NOT EXISTS {table} ({columns}) ON COMMIT DELETE ROWS"


_STAGING = "sg_results_staging"
_STAGING_DDL = _staging_ddl(_STAGING, _STAGED_SCHEMA)

_KEY = "config_name, window_name, metric, tags, window_start, window_end"
"""A window's key in the tables that name its series: window_pending, late_events."""
_ROW_KEY = "series_id, window_start, window_end"
"""A window's key in window_rows and window_sketches (schema version 18)."""
_ROW_NAMES = "config_name, window_name, series_id, window_start, window_end"
"""What a window_rows row holds of its window's identity."""
_VALUES = (
    "metric_type", "count", "sum", "min", "max", "last", "p50", "p90", "p99", "p999",
    "distinct_count",
)  # fmt: skip
"""What a reader sees as the window's value: a change here is a correction."""
_ENCODINGS = ("sketch", "hdr_histogram", "hll_registers", *HDR_COLUMNS)
"""Serialized forms of the same values (they change exactly when the values do)."""
_VALUE_COLUMNS = (*_VALUES, *_ENCODINGS, "revision", "is_final", "late_events", "emitted_at")
"""A ``window_pending`` row's columns besides the key."""
_ROW_COLUMNS = (*_VALUES, "revision", "is_final", "late_events", "emitted_at")
"""A ``window_rows`` row's columns besides the key: a published window without its sketches,
which ``window_sketches`` holds (``window_results`` joins the two; schema version 15)."""


def _ms_to_ts(expr: str) -> str:
    return f"(timestamptz 'epoch' + {expr} * interval '1 millisecond')"


def _window_key(alias: str) -> str:
    """A window's key row in a table of that shape (``window_results``, ``late_events``...)."""
    return (f"({alias}.config_name, {alias}.window_name, {alias}.metric, {alias}.tags, "
            f"{alias}.window_start, {alias}.window_end)")  # fmt: skip


def _row_key(alias: str) -> str:
    """A window's key row in window_rows or window_sketches (or a row of their key columns)."""
    return f"({alias}.series_id, {alias}.window_start, {alias}.window_end)"


def _staged_row_key(alias: str) -> str:
    """The same key row from a staging table (times as epoch ms)."""
    return (f"({alias}.series_id, {_ms_to_ts(f'{alias}.window_start_ms')}, "
            f"{_ms_to_ts(f'{alias}.window_end_ms')})")  # fmt: skip


def _staged_window_key(alias: str) -> str:
    """The same key row from a staging table (tags as JSON text, times as epoch ms)."""
    return (f"({alias}.config_name, {alias}.window_name, {alias}.metric, {alias}.tags::jsonb, "
            f"{_ms_to_ts(f'{alias}.window_start_ms')}, {_ms_to_ts(f'{alias}.window_end_ms')})")


def _late_samples_of(window_key: str, also: str | None = None) -> str:
    """The samples ``late_events`` holds for the window whose key row is ``window_key`` (in
    its rows that meet ``also``): a window's ``late_events`` column, always derived from them."""
    where = f"{_window_key('l')} = {window_key}" + ("" if also is None else f" AND {also}")
    return f"(SELECT coalesce(sum(l.count), 0) FROM late_events l WHERE {where})"


# late_events is not taken from the batch: it is derived from the late_events table, so a
# window row written after its late partials were recorded (the two queries commit
# independently) still shows them, and a new revision never resets the count.
_LATE_SAMPLES_OF_STAGED = _late_samples_of(_staged_window_key("s"))

_VALUES_CHANGED = (
    f"({', '.join(f'window_rows.{c}' for c in _VALUES)}) IS DISTINCT FROM "
    f"({', '.join(f'excluded.{c}' for c in _VALUES)})"
)  # the values, not their encodings, revision, finality or emission
_STAGED_VALUES = ", ".join(f"s.{c}" for c in (*_VALUES, *_ENCODINGS))
_STAGED_ROW_VALUES = ", ".join(f"s.{c}" for c in _VALUES)
_HAS_SKETCH = (
    "(s.sketch IS NOT NULL OR s.hll_registers IS NOT NULL OR s.hdr_bucket_counts IS NOT NULL)"
)


def _with_sketches(write: str, source: str, source_key: str, returning: str = "") -> str:
    """``write`` (a statement writing ``window_rows``) with the sketches of the rows it wrote:
    from ``source`` (a FROM item aliased ``s``, whose key row is ``source_key``) into
    ``window_sketches``, in the same statement. A row the statement did not write (an older
    revision) keeps its sketches too. The statement returns the number of rows it wrote.
    ``returning``: the target's alias, when the write names one (an UPDATE ... FROM)."""
    keys = ", ".join(f"{returning}.{c}" if returning else c for c in _ROW_KEY.split(", "))
    return f"""
WITH written AS ({write.strip()}
RETURNING {keys}),
sketched AS (
INSERT INTO window_sketches ({_ROW_KEY}, {", ".join(_ENCODINGS)})
SELECT w.series_id, w.window_start, w.window_end, {", ".join(f"s.{c}" for c in _ENCODINGS)}
FROM written w JOIN {source} ON {_row_key("w")} = {source_key}
WHERE {_HAS_SKETCH}
ON CONFLICT ({_ROW_KEY}) DO UPDATE SET {", ".join(f"{c} = excluded.{c}" for c in _ENCODINGS)})
SELECT count(*) FROM written"""


def _without_sketches(delete: str) -> str:
    """``delete`` (a DELETE from ``window_rows`` aliased ``w``) with the deleted rows'
    sketches; the statement returns the number of rows deleted."""
    return f"""
WITH gone AS ({delete.strip()}
RETURNING {", ".join(f"w.{c}" for c in _ROW_KEY.split(", "))}),
unsketched AS (
DELETE FROM window_sketches k USING gone g WHERE {_row_key("k")} = {_row_key("g")})
SELECT count(*) FROM gone"""


#: ``prune``'s statements: what it deletes from each table, by the time column that ages it
#: (``window_results``: a window's row and its sketches).
_PRUNE = {
    table: f"DELETE FROM {table} w WHERE w.{column} < {_ms_to_ts('%(before)s')}"
    for table, column in (
        ("window_rows", "window_end"),
        ("window_pending", "window_end"),
        ("pipeline_metrics", "ts"),
        ("late_events", "window_end"),
        ("sink_batches", "committed_at"),
        # Ends listed for rows since deleted (a retracted session, a pruned window).
        ("window_open_ends", "window_end"),
    )
}
_PRUNE = {"window_results": _without_sketches(_PRUNE.pop("window_rows")), **_PRUNE}


# The series no window refers to any more, once their windows are pruned: found without a
# lock, then deleted in a short transaction that bumps window_series_generation first (the
# writers that remember series ids wait for it, then forget them: sinks/series_ids.py).
_UNUSED_SERIES = """
SELECT s.series_id FROM window_series s
WHERE NOT EXISTS (SELECT 1 FROM window_rows r WHERE r.series_id = s.series_id)
  AND NOT EXISTS (SELECT 1 FROM window_pending p
                  WHERE (p.config_name, p.window_name, p.metric, p.tags)
                      = (s.config_name, s.window_name, s.metric, s.tags))
"""
# Two statements: the DELETE's snapshot must be taken after the UPDATE waited for the
# writers holding the generation, so it sees the rows they committed.
_BUMP_SERIES_GENERATION = "UPDATE window_series_generation SET generation = generation + 1"
_DELETE_UNUSED_SERIES = f"""
DELETE FROM window_series s
WHERE s.series_id = ANY(%(ids)s) AND {_UNUSED_SERIES.split("WHERE", 1)[1].strip()}
"""


def _upsert_sql(table: str, where: str | None, staging: str = _STAGING) -> str:
    """The upsert from ``staging`` into ``table`` (``window_rows`` with the sketches, or
    ``window_pending``) keeping the highest revision, of the staged rows ``where`` says (it
    may test the batch's hold, ``h``); ``None``: every staged row."""
    published = table == "window_rows"
    # A window emitted early (early_as_of set) and changed by the time the watermark passes
    # its end is not corrected: its on-time row is the first complete one.
    corrections = (
        ", corrections = window_rows.corrections + (CASE WHEN "
        f"window_rows.early_as_of IS NULL AND {_VALUES_CHANGED} THEN 1 ELSE 0 END), "
        "early_as_of = NULL"
        if published
        else ""
    )
    selected = (
        ""
        if where is None
        else f"\nLEFT JOIN {_HOLD} h USING (config_name, window_name)\nWHERE {where}"
    )
    columns = _ROW_COLUMNS if published else _VALUE_COLUMNS
    key, names = (
        (_ROW_KEY, "s.config_name, s.window_name, s.series_id")
        if published
        else (_KEY, "s.config_name, s.window_name, s.metric, s.tags::jsonb")
    )
    upsert = f"""
INSERT INTO {table} ({_ROW_NAMES if published else _KEY}, {", ".join(columns)})
SELECT {names}, {_ms_to_ts("s.window_start_ms")}, {_ms_to_ts("s.window_end_ms")},
       {_STAGED_ROW_VALUES if published else _STAGED_VALUES}, s.revision, s.is_final,
       {_LATE_SAMPLES_OF_STAGED}, {_ms_to_ts("s.emitted_at_ms")}
FROM {staging} s{selected}
ON CONFLICT ({key}) DO UPDATE SET
    {", ".join(f"{c} = excluded.{c}" for c in columns)}{corrections}
WHERE {table}.revision < excluded.revision
"""
    return _with_sketches(upsert, f"{staging} s", _staged_row_key("s")) if published else upsert


# Which windows are held back until the watermark passes their end, per (config, window),
# how often an open one is published early (early_every_ms; NULL: never), and which of them
# this batch's finalization makes final (final_before_ms: window_end at or before it; NULL:
# none).
_HOLD = "sg_hold"
_HOLD_DDL = f"""
CREATE TEMPORARY TABLE IF NOT EXISTS {_HOLD} (
    config_name text, window_name text, watermark_ms int8, early_every_ms int8,
    final_before_ms int8
) ON COMMIT DELETE ROWS
"""
_HOLD_INSERT = f"INSERT INTO {_HOLD} VALUES (%s, %s, %s, %s, %s)"
_UPSERT = _upsert_sql(
    "window_rows", "h.watermark_ms IS NULL OR s.window_end_ms <= h.watermark_ms"
)
_UPSERT_PENDING = _upsert_sql("window_pending", "s.window_end_ms > h.watermark_ms")

# Windows published for the first time (``commit_batch(fresh=...)``: an open window the
# watermark has just passed). None is in window_results yet, so a plain COPY into it does
# (``ResultStore._insert_fresh``): with no conflict check and no staging copy it is
# measurably cheaper than the upsert (``bench/store_floor.py``: "closing, held windows
# (fresh)" against "closed rows direct"). The staging table and _UPSERT_FRESH are for the
# rows a window stored after all sends back to the upsert.
_FRESH_STAGING = "sg_fresh_staging"
_FRESH_STAGING_DDL = _staging_ddl(_FRESH_STAGING, _STAGED_SCHEMA)
_FRESH_COLUMNS = (*_ROW_NAMES.split(", "), *_ROW_COLUMNS)
"""What a fresh window's ``COPY`` writes: every column of window_rows it sets."""
_FRESH_SKETCH_COLUMNS = (*_ROW_KEY.split(", "), *_ENCODINGS)
"""What the ``COPY`` of fresh windows' sketches writes into window_sketches."""
_SKETCHED_COLUMNS = (
    "config_name", "window_name", "metric", "tags", "series_id", "window_start_ms",
    "window_end_ms", *_ENCODINGS,
)  # fmt: skip
"""The staged columns the fresh windows' sketches are written from."""
_TIMESTAMP_COLUMNS = frozenset({"window_start", "window_end", "emitted_at"})
_UPSERT_FRESH = _upsert_sql("window_rows", None, staging=_FRESH_STAGING)
# The fresh windows' sketches, after their rows committed: a window whose row was stored
# before (by another run of the batch, or replay) keeps the sketches stored with it.
_FRESH_SKETCHES_STAGING = "sg_fresh_sketches_staging"
_FRESH_SKETCHES_STAGING_DDL = _staging_ddl(_FRESH_SKETCHES_STAGING, _STAGED_SCHEMA)
_INSERT_FRESH_SKETCHES = f"""
INSERT INTO window_sketches ({_ROW_KEY}, {", ".join(_ENCODINGS)})
SELECT s.series_id, {_ms_to_ts("s.window_start_ms")}, {_ms_to_ts("s.window_end_ms")},
       {", ".join(f"s.{c}" for c in _ENCODINGS)}
FROM {_FRESH_SKETCHES_STAGING} s
WHERE {_HAS_SKETCH}
ON CONFLICT ({_ROW_KEY}) DO NOTHING
"""
# A fresh window can still have late samples, recorded before its first row: by the same
# batch (``commit_batch(late=...)`` runs first), or by another query of the window that ran
# ahead. late_events is derived from them, so it is set for the windows of the batch's range
# that have any (one scan of late_events' window index, not one per row).
_LATE_SAMPLES_ON_FRESH = f"""
UPDATE window_rows w SET late_events = l.samples
FROM (SELECT ws.series_id, l.window_start, l.window_end, sum(l.count) AS samples
      FROM late_events l
      JOIN unnest(%(configs)s::text[], %(windows)s::text[]) AS d(config_name, window_name)
          USING (config_name, window_name)
      JOIN window_series ws USING (config_name, window_name, metric, tags)
      WHERE l.window_end BETWEEN {_ms_to_ts("%(first_end_ms)s")} AND {_ms_to_ts("%(last_end_ms)s")}
      GROUP BY 1, 2, 3) l
WHERE {_row_key("w")} = {_row_key("l")} AND w.late_events IS DISTINCT FROM l.samples
"""
# After a refused fresh insert: up to where the window's rows are stored already, so the
# caller stops offering windows as fresh until its watermark is past them.
_STORED_UNTIL = f"""
SELECT (extract(epoch FROM max(r.window_end)) * 1000)::bigint FROM window_rows r
WHERE (r.config_name, r.window_name) IN (SELECT DISTINCT config_name, window_name
                                         FROM {_FRESH_STAGING})
"""

# The batch whose watermark passes a pending window's end emits it, with the batch revision.
# A window the same batch's watermark also passes by the allowed lateness is inserted final:
# _FINALIZE, later in the transaction, would set exactly that (same revision, same emitted_at)
# by rewriting the row just inserted, index entries and all. When the batches are long
# (100k series: ~6 s of watermark per batch against 2 s of lateness) that is most windows.
_PROMOTE_ROWS = f"""
INSERT INTO window_rows ({_ROW_NAMES}, {", ".join(_ROW_COLUMNS)})
SELECT {_ROW_NAMES}, {", ".join(_VALUES)}, %(revision)s, final, late_events,
       {_ms_to_ts("%(now_ms)s")}
FROM moved_rows
ON CONFLICT ({_ROW_KEY}) DO UPDATE SET
    {", ".join(f"{c} = excluded.{c}" for c in _ROW_COLUMNS)}, early_as_of = NULL
WHERE window_rows.revision < excluded.revision"""
_PROMOTE_WRITES = _with_sketches(_PROMOTE_ROWS, "moved_rows s", _row_key("s"))
_PROMOTE = f"""
WITH moved AS (
    DELETE FROM window_pending p USING {_HOLD} h
    WHERE p.config_name = h.config_name AND p.window_name = h.window_name
      AND p.window_end <= {_ms_to_ts("h.watermark_ms")}
    RETURNING p.*, coalesce(p.window_end <= {_ms_to_ts("h.final_before_ms")}, false) AS final
),
moved_rows AS (
    SELECT m.*, ws.series_id FROM moved m
    JOIN window_series ws USING (config_name, window_name, metric, tags)
),
{_PROMOTE_WRITES.strip().removeprefix("WITH ")}
"""

# Early emission (a window's early_every): a window the watermark W has not passed, whose
# start lies at least early_every behind W, is published from window_pending as an early row
# stamped with its latest tick, start + k * early_every <= W. It replaces an earlier early
# row only at a later tick and only if a value changed, so there is at most one early row per
# tick and none repeating a value. Window [0 s, 10 s), early_every 2 s:
#
#     W:       1.5    2.3    3.1     4.0     5.2    7.9     10.0
#     tick:     -     2      2       4       4      6        -
#     emits:    -     early  -       early   -      early    on-time (_PROMOTE)
#                     (2)    (same   (4, if  (same  (6, if
#                            tick)   changed) tick) changed)
#
# Event time, so the same heartbeats give the same rows on every run; the on-time row, the
# stragglers' revisions and finality are untouched (early_as_of is reset by the upserts,
# _PROMOTE and _FINALIZE). window_pending keeps the row: it still receives the window's
# changes, and _PROMOTE moves it when W passes the end.
# An early row replaces the stored one only at a later tick and only if a value changed.
_EARLY_REPLACES = f"""ON CONFLICT ({_ROW_KEY}) DO UPDATE SET
    {", ".join(f"{c} = excluded.{c}" for c in _ROW_COLUMNS)}, early_as_of = excluded.early_as_of
WHERE window_rows.early_as_of < excluded.early_as_of
  AND window_rows.revision < excluded.revision
  AND {_VALUES_CHANGED}
"""
# window_pending names its windows' series; joined with their numbers:
_PENDING_ROWS = """(SELECT p.*, ws.series_id FROM window_pending p
 JOIN window_series ws USING (config_name, window_name, metric, tags))"""
_EARLY = _with_sketches(f"""
INSERT INTO window_rows ({_ROW_NAMES}, {", ".join(_ROW_COLUMNS)}, early_as_of)
SELECT {", ".join(f"p.{c}" for c in _ROW_NAMES.split(", "))},
       {", ".join(f"p.{c}" for c in _VALUES)},
       %(revision)s, false, p.late_events, {_ms_to_ts("%(now_ms)s")}, {_ms_to_ts("tick.ms")}
FROM {_PENDING_ROWS} p
JOIN {_HOLD} h ON p.config_name = h.config_name AND p.window_name = h.window_name
CROSS JOIN LATERAL (
    SELECT (extract(epoch FROM p.window_start) * 1000)::int8 AS ms) start
CROSS JOIN LATERAL (
    SELECT start.ms + (h.watermark_ms - start.ms) / h.early_every_ms * h.early_every_ms
        AS ms) tick
WHERE h.early_every_ms IS NOT NULL
  AND p.window_end > {_ms_to_ts("h.watermark_ms")}
  AND h.watermark_ms - start.ms >= h.early_every_ms
{_EARLY_REPLACES}""", f"{_PENDING_ROWS} s", _row_key("s"))

# Corrections from `streamgauge replay`: a recomputed final window replaces the stored one
# with the next revision, only where a value changed (so replaying twice changes nothing).
_CORRECTED = _VALUES
_PUBLISH_CORRECTIONS = _with_sketches(f"""
INSERT INTO window_rows ({_ROW_NAMES}, {", ".join(_ROW_COLUMNS)})
SELECT config_name, window_name, series_id,
       {_ms_to_ts("window_start_ms")}, {_ms_to_ts("window_end_ms")},
       {", ".join(_VALUES)},
       1, true, {_LATE_SAMPLES_OF_STAGED}, {_ms_to_ts("emitted_at_ms")}
FROM {_STAGING} s
ON CONFLICT ({_ROW_KEY}) DO UPDATE SET
    {", ".join(f"{c} = excluded.{c}" for c in _CORRECTED)},
    revision = window_rows.revision + 1, is_final = true,
    corrections = window_rows.corrections + 1,
    late_events = excluded.late_events, emitted_at = excluded.emitted_at
WHERE ({", ".join(f"window_rows.{c}" for c in _CORRECTED)})
    IS DISTINCT FROM ({", ".join(f"excluded.{c}" for c in _CORRECTED)})
""", f"{_STAGING} s", _staged_row_key("s"))

_MARK_LATE_REPLAYED = f"""
UPDATE late_events l SET replayed_at = {_ms_to_ts("%(now_ms)s")}
FROM {_STAGING} s
WHERE l.replayed_at IS NULL
  AND {_window_key("l")} = {_staged_window_key("s")}
"""

# Replay of session windows (``publish_corrections(supersede=True)``): a recomputed session
# replaces every stored row of its series that it contains (the sessions a late partial
# extended or bridged), in one transaction. Stored rows of a series never overlap and each
# lies inside exactly one recomputed session (the recomputation sees a superset of its
# partials), so "contained" finds exactly the superseded ones and never a neighbour.
_REPLAY_PRIOR = "sg_replay_prior"
_REPLAY_PRIOR_DDL = f"""
CREATE TEMPORARY TABLE IF NOT EXISTS {_REPLAY_PRIOR} (
    config_name text, window_name text, metric text, tags text, window_start_ms int8,
    window_end_ms int8, revision int8, corrections int8, superseded int8
) ON COMMIT DELETE ROWS
"""
_STAGED_KEY_COLUMNS = "config_name, window_name, metric, tags, window_start_ms, window_end_ms"
_WITHIN_STAGED = f"""w.window_start >= {_ms_to_ts("s.window_start_ms")}
  AND w.window_end <= {_ms_to_ts("s.window_end_ms")}"""
_CONTAINED_IN_STAGED = f"w.series_id = s.series_id AND {_WITHIN_STAGED}"
"""A row of window_rows (or of its key columns) aliased ``w`` inside the staged window."""
_PENDING_CONTAINED_IN_STAGED = f"""w.config_name = s.config_name AND w.window_name = s.window_name
  AND w.metric = s.metric AND w.tags = s.tags::jsonb AND {_WITHIN_STAGED}"""
_SAME_KEY_AS_STAGED = f"{_row_key('w')} = {_staged_row_key('s')}"

# Per staged session: the highest revision and corrections among the stored rows it covers
# (its own key included), and how many of them it supersedes (other keys, or still pending).
_FIND_SUPERSEDED = f"""
INSERT INTO {_REPLAY_PRIOR}
SELECT {", ".join(f"s.{c}" for c in _STAGED_KEY_COLUMNS.split(", "))},
       max(w.revision), max(w.corrections),
       count(*) FILTER (WHERE w.pending OR NOT ({_SAME_KEY_AS_STAGED}))
FROM {_STAGING} s JOIN (
    SELECT {_ROW_KEY}, revision, corrections, false AS pending FROM window_rows
    UNION ALL
    SELECT {_ROW_KEY}, revision, 0, true FROM {_PENDING_ROWS} p
) w ON {_CONTAINED_IN_STAGED}
GROUP BY {", ".join(f"s.{c}" for c in _STAGED_KEY_COLUMNS.split(", "))}
"""

_DELETE_SUPERSEDED = {
    "window_rows": _without_sketches(f"""
DELETE FROM window_rows w USING {_STAGING} s
WHERE {_CONTAINED_IN_STAGED} AND NOT ({_SAME_KEY_AS_STAGED})"""),
    "window_pending": f"""
DELETE FROM window_pending w USING {_STAGING} s WHERE {_PENDING_CONTAINED_IN_STAGED}""",
}

# A stored session with the recomputed one's key: corrected when its values changed or when
# it now also stands for superseded rows; revision and corrections go above all it covers.
_UPDATE_SUPERSEDING = _with_sketches(f"""
UPDATE window_rows w SET
    ({", ".join(_VALUES)}) = ({_STAGED_ROW_VALUES}),
    revision = p.revision + 1, is_final = true, corrections = p.corrections + 1,
    late_events = {_LATE_SAMPLES_OF_STAGED}, emitted_at = {_ms_to_ts("s.emitted_at_ms")}
FROM {_STAGING} s JOIN {_REPLAY_PRIOR} p USING ({_STAGED_KEY_COLUMNS})
WHERE {_SAME_KEY_AS_STAGED}
  AND (p.superseded > 0
       OR ({", ".join(f"w.{c}" for c in _VALUES)}) IS DISTINCT FROM
          ({", ".join(f"s.{c}" for c in _VALUES)}))
""", f"{_STAGING} s", _staged_row_key("s"), returning="w")

# A recomputed session with a new key: a correction of the rows it supersedes (revision and
# corrections above theirs), or an insert (revision 1, corrections 0) where it covers none.
_INSERT_SUPERSEDING = _with_sketches(f"""
INSERT INTO window_rows ({_ROW_NAMES}, {", ".join(_ROW_COLUMNS)}, corrections)
SELECT s.config_name, s.window_name, s.series_id, {_ms_to_ts("s.window_start_ms")},
       {_ms_to_ts("s.window_end_ms")}, {_STAGED_ROW_VALUES},
       coalesce(p.revision, 0) + 1, true, {_LATE_SAMPLES_OF_STAGED},
       {_ms_to_ts("s.emitted_at_ms")},
       CASE WHEN p.revision IS NULL THEN 0 ELSE p.corrections + 1 END
FROM {_STAGING} s LEFT JOIN {_REPLAY_PRIOR} p USING ({_STAGED_KEY_COLUMNS})
WHERE NOT EXISTS (SELECT 1 FROM window_rows w WHERE {_SAME_KEY_AS_STAGED})
""", f"{_STAGING} s", _staged_row_key("s"))

_MARK_LATE_IDS_REPLAYED = f"""
UPDATE late_events SET replayed_at = {_ms_to_ts("%(now_ms)s")}
WHERE id = ANY(%(ids)s) AND replayed_at IS NULL
"""


@dataclass(frozen=True)
class LateRecord:
    """A row of ``late_events`` as replay needs it: which series, when, and its id."""

    id: int
    metric: str
    tags: str
    """Canonical JSON text (sorted keys, no spaces), whatever order jsonb keeps them in."""
    pane_start_ms: int
    count: int


_READ_LATE = """
SELECT id, metric, tags, (extract(epoch from pane_start) * 1000)::bigint, count
FROM late_events WHERE config_name = %s AND window_name = %s ORDER BY id
"""


# The window query and its late-events query write the same rows; one lock per window
# definition serialises their transactions, so neither misses the other's rows.
_LOCK_WINDOW = "SELECT pg_advisory_xact_lock(hashtext(%s))"

# See LateRowsReread. A row's ``closed_by`` is the heartbeat of the segment before its own.
_FORGOTTEN_LATE = f"""
l.config_name = %(c)s AND l.window_name = %(w)s AND EXISTS (
    SELECT 1 FROM unnest(%(receivers)s::text[], %(first_ms)s::bigint[]) AS f(receiver, ms)
    WHERE f.receiver = l.receiver AND l.closed_by >= {_ms_to_ts("f.ms")})"""
# The windows' counts first (from the rows that stay), then the rows: one transaction.
_RECOUNT_WITHOUT_FORGOTTEN_LATE = f"""
UPDATE window_rows w SET late_events = l.kept
FROM (SELECT ws.series_id, l.window_start, l.window_end,
             coalesce(sum(l.count) FILTER (WHERE NOT ({_FORGOTTEN_LATE})), 0) AS kept
      FROM late_events l JOIN window_series ws USING (config_name, window_name, metric, tags)
      WHERE l.config_name = %(c)s AND l.window_name = %(w)s
      GROUP BY 1, 2, 3
      HAVING bool_or({_FORGOTTEN_LATE})) l
WHERE {_row_key("w")} = {_row_key("l")}
"""
_FORGET_LATE = f"DELETE FROM late_events l WHERE {_FORGOTTEN_LATE}"
# Once per generation, whichever of its queries starts first (they share the window's lock).
_CLAIM_LATE_GENERATION = f"""
INSERT INTO pipeline_state (config_name, key, value_ms, updated_at)
VALUES (%(c)s, 'late_rows_generation:' || %(w)s || ':' || %(generation)s, 0,
        {_ms_to_ts("%(now_ms)s")})
ON CONFLICT DO NOTHING
"""

# "window_end + lateness <= watermark", written as "window_end <= watermark - lateness": the
# ends still open up to there are listed in window_open_ends (kept by triggers, schema
# migration 10), and their rows are found by window_end. Updating is_final, revision,
# emitted_at and early_as_of touches no indexed column, so the row's new version stays on
# its page (HOT).
# "revision <= batch revision", not "<": rows upserted by this same batch carry the batch's
# revision, and a window emitted provisionally in the batch whose watermark passes it must be
# final when the batch commits, not one batch later. A row of a newer revision is still never
# touched (its end stays listed: _FORGET_FINAL_ENDS), and a replayed batch never gets this
# far (sink_batches).
_ENDS_TO_FINALIZE = f"""
e.config_name = %(config_name)s AND e.window_name = %(window_name)s
  AND e.window_end <= {_ms_to_ts("%(final_before_ms)s")}"""
_FINALIZE = f"""
UPDATE window_rows w
SET is_final = true, revision = %(revision)s, emitted_at = {_ms_to_ts("%(now_ms)s")},
    early_as_of = NULL
FROM window_open_ends e
WHERE {_ENDS_TO_FINALIZE}
  AND w.config_name = e.config_name AND w.window_name = e.window_name
  AND w.metric_type = e.metric_type AND w.window_end = e.window_end
  AND NOT w.is_final
  AND w.revision <= %(revision)s
"""
# Then the ends with no provisional row left leave the list.
_FORGET_FINAL_ENDS = f"""
DELETE FROM window_open_ends e
WHERE {_ENDS_TO_FINALIZE}
  AND NOT EXISTS (
    SELECT 1 FROM window_rows w
    WHERE w.config_name = e.config_name AND w.window_name = e.window_name
      AND w.metric_type = e.metric_type AND w.window_end = e.window_end AND NOT w.is_final)
"""

_CLAIM_BATCH = f"""
INSERT INTO sink_batches (query_name, batch_id, committed_at, rows_written)
VALUES (%s, %s, {_ms_to_ts("%s")}, 0)
ON CONFLICT (query_name, batch_id) DO NOTHING
"""

_RECORD_ERRORS = f"""
INSERT INTO pipeline_metrics (ts, name, labels, value)
VALUES ({_ms_to_ts("%s")}, 'streamgauge.store.errors', %s::jsonb, %s)
ON CONFLICT (name, labels, ts) DO UPDATE SET value = pipeline_metrics.value + excluded.value
"""

_UPSERT_STATE = f"""
INSERT INTO pipeline_state (config_name, key, value_ms, updated_at)
VALUES (%s, %s, %s, {_ms_to_ts("%s")})
ON CONFLICT (config_name, key) DO UPDATE
SET value_ms = excluded.value_ms, updated_at = excluded.updated_at
"""

LATE_SCHEMA = pa.schema(
    [
        pa.field("config_name", pa.string(), nullable=False),
        pa.field("window_name", pa.string(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("tags", pa.string(), nullable=False),
        pa.field("metric_type", pa.string(), nullable=False),
        pa.field("window_start_ms", pa.int64(), nullable=False),
        pa.field("window_end_ms", pa.int64(), nullable=False),
        pa.field("receiver", pa.string(), nullable=False),
        pa.field("pane_start_ms", pa.int64(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("sum", pa.float64(), nullable=False),
        pa.field("min", pa.float64(), nullable=False),
        pa.field("max", pa.float64(), nullable=False),
        pa.field("last", pa.float64(), nullable=False),
        pa.field("first_recv_ms", pa.int64(), nullable=False),
        pa.field("last_recv_ms", pa.int64(), nullable=False),
        pa.field("closed_by_ms", pa.int64(), nullable=False),
    ]
)
"""The Arrow schema ``commit_late_batch`` expects: one row per late pane partial and window."""

_LATE_STAGING = "sg_late_staging"
_LATE_STAGING_DDL = _staging_ddl(_LATE_STAGING, LATE_SCHEMA.append(_SERIES_ID))

_INSERT_LATE = f"""
INSERT INTO late_events (config_name, window_name, metric, tags, window_start, window_end,
    metric_type, receiver, pane_start, count, sum, min, max, last, first_recv, last_recv,
    closed_by, query_name, batch_id, recorded_at)
SELECT config_name, window_name, metric, tags::jsonb,
       {_ms_to_ts("window_start_ms")}, {_ms_to_ts("window_end_ms")}, metric_type, receiver,
       {_ms_to_ts("pane_start_ms")}, count, sum, min, max, last,
       {_ms_to_ts("first_recv_ms")}, {_ms_to_ts("last_recv_ms")}, {_ms_to_ts("closed_by_ms")},
       %(query_name)s, %(batch_id)s, {_ms_to_ts("%(now_ms)s")}
FROM {_LATE_STAGING}
"""

# The late samples are also counted on the window's own row, so a dashboard reading only
# window_results sees that a final value is missing something (until `replay` applies it).
# Recomputed from the table (not incremented), like the upsert does: one definition.
_COUNT_LATE_ON_WINDOWS = f"""
UPDATE window_rows w SET late_events = {_late_samples_of(_window_key("s"))}
FROM (SELECT DISTINCT config_name, window_name, metric, tags::jsonb AS tags, series_id,
             {_ms_to_ts("window_start_ms")} AS window_start,
             {_ms_to_ts("window_end_ms")} AS window_end
      FROM {_LATE_STAGING}) s
WHERE {_row_key("w")} = {_row_key("s")}
"""


_WINDOW_KEY_FIELDS = [
    pa.field("config_name", pa.string(), nullable=False),
    pa.field("window_name", pa.string(), nullable=False),
    pa.field("metric", pa.string(), nullable=False),
    pa.field("tags", pa.string(), nullable=False),
    pa.field("window_start_ms", pa.int64(), nullable=False),
    pa.field("window_end_ms", pa.int64(), nullable=False),
]
RETRACTION_SCHEMA = pa.schema(_WINDOW_KEY_FIELDS)
"""The Arrow schema of ``commit_batch(retractions=...)``: windows superseded by this batch
(a session that grew or merged), deleted from ``window_results`` and ``window_pending`` (their
buckets with them)."""

_RETRACT_STAGING = "sg_retract_staging"
_RETRACT_STAGING_DDL = _staging_ddl(_RETRACT_STAGING, RETRACTION_SCHEMA.append(_SERIES_ID))

# Only rows older than the batch: a newer revision of a window is never touched (the same
# rule as the upsert), and a replayed batch never gets this far (sink_batches).
_RETRACT = f"""
DELETE FROM {{table}} w USING {_RETRACT_STAGING} r
WHERE {{key}} AND w.revision < %(revision)s
"""
_RETRACT_FROM = {
    "window_rows": _without_sketches(_RETRACT.format(
        table="window_rows", key=f"{_row_key('w')} = {_staged_row_key('r')}")),
    "window_pending": _RETRACT.format(
        table="window_pending", key=f"{_window_key('w')} = {_staged_window_key('r')}"),
}


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff: ``initial_s``, doubling (``multiplier``), capped at ``max_s``.

    ``max_attempts=None`` retries forever: the daemon's choice, because giving up would either
    lose the batch or crash the job, while waiting only delays it (the segment log keeps the
    input). No jitter: there is one writer per store, nothing to de-synchronise.
    """

    initial_s: float = 0.5
    max_s: float = 30.0
    max_attempts: int | None = None
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        problems = []
        if self.initial_s <= 0:
            problems.append(f"initial_s must be > 0, got {self.initial_s}")
        if self.max_s < self.initial_s:
            problems.append(f"max_s ({self.max_s}) must be >= initial_s ({self.initial_s})")
        if self.max_attempts is not None and self.max_attempts < 1:
            problems.append(f"max_attempts must be >= 1 or None, got {self.max_attempts}")
        if self.multiplier < 1:
            problems.append(f"multiplier must be >= 1, got {self.multiplier}")
        if problems:
            message = "invalid RetryPolicy: " + "; ".join(problems)
            raise ValueError(message)

    def delay_s(self, failed_attempts: int) -> float:
        """Seconds to wait after the ``failed_attempts``-th consecutive failure (1-based)."""
        return float(min(self.max_s, self.initial_s * self.multiplier ** (failed_attempts - 1)))


DEFAULT_RETRY = RetryPolicy()
_SYSTEM_CLOCK = SystemClock()
_NO_STATE: Mapping[tuple[str, str], int] = types.MappingProxyType({})


@dataclass(frozen=True)
class LateRowsReread:
    """A new checkpoint of a query that records a window's late rows reads the retained log
    again, and records its late partials anew, under the new definition (a partial may be late
    now and was not, or the other way round). The rows older checkpoints recorded from the
    segments read again are the new checkpoint's to replace: kept, a straggler was counted
    twice in its window's ``late_events``.

    Each stream is read again from its oldest segment in the spool (heartbeat ``H``; pruning
    waits for a new checkpoint's first commit, so it is still there when the batch runs), and
    from the segment after it on a row can be found late (the oldest has no heartbeat before
    it: nothing in it is late, it is folded into its windows). A row's ``closed_by`` is the
    heartbeat of the segment before its own, so the rows with ``closed_by >= H`` come from
    segments read again and go; rows from segments already pruned stay.

    ``generation`` names the checkpoint (Spark's id of it: a directory deleted and made
    again is a new one): its rows are forgotten once, so a first batch that runs again does
    not delete what the first run recorded.
    """

    generation: str  # ``results.checkpoint_generation``: new with every checkpoint
    first_heartbeats: Mapping[str, int]  # per receiver (``log.first_heartbeats``)
    lock_name: str  # the lock the window's late batches take (``commit_batch``'s lock_name)


@dataclass(frozen=True)
class Finalization:
    """Every non-final window of this config/window whose end + lateness <= watermark is final.

    ``[---)`` a window, ``~~~`` its allowed lateness, ``W`` the watermark::

        [-------)~~~~~~~|         W     final: end + lateness < watermark
                  [-------)~~~~~~~W     final: end + lateness == watermark
                      [-------)~~~W~~~| provisional: late samples may still come
    """

    config_name: str
    window_name: str
    watermark_ms: int
    allowed_lateness_ms: int

    @property
    def final_before_ms(self) -> int:
        """Windows ending at or before this are final (``_FINALIZE``; ``_PROMOTE`` moves
        them in final)."""
        return self.watermark_ms - self.allowed_lateness_ms


@dataclass(frozen=True)
class BatchOutcome:
    """What a ``commit_batch`` did; ``already_committed`` means the batch id was seen before."""

    already_committed: bool
    rows_upserted: int
    rows_finalized: int
    rows_retracted: int = 0
    late_recorded: int = 0
    rows_early: int = 0
    """Of ``rows_upserted``: windows published early (``early_every``)."""
    fresh_stored_until_ms: int | None = None
    """Set when a window of ``fresh`` was stored already: the latest ``window_end`` stored
    for the batch's windows (the caller offers no window up to it as fresh again)."""


def sketches_query_name(query_name: str) -> str:
    """The name under which the sketches of a batch's fresh windows are claimed."""
    return f"{query_name}.sketches"


class ResultStoreUnavailable(RuntimeError):
    """The store stayed unreachable for ``RetryPolicy.max_attempts`` attempts."""


def describe_url(url: str) -> str:
    """``user@host:port/dbname`` of a connection URL: safe to log (no password)."""
    try:
        params = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable PostgreSQL URL>"
    return (
        f"{params.get('user', '')}@{params.get('host', '')}:{params.get('port', 5432)}"
        f"/{params.get('dbname', '')}"
    )


# Connection failures carry no SQLSTATE (libpq reports them as text); these phrases, in the
# server's English messages, mean retrying cannot help. Other locales fall back to retrying.
_PERMANENT_CONNECT_FAILURES = (
    "password authentication failed",
    "no pg_hba.conf entry",
    "does not exist",  # database "x" / role "x" does not exist
    "password is required",
)


def _is_transient(exc: BaseException) -> bool:
    """Whether waiting and reconnecting can fix ``exc``."""
    if not isinstance(exc, psycopg.OperationalError):
        return False  # bad data, bad SQL, constraint violations: a retry would fail the same way
    sqlstate = exc.sqlstate or ""
    if sqlstate.startswith("54"):  # program_limit_exceeded, e.g. an index row too big: data
        return False
    if sqlstate.startswith("28") or sqlstate == "3D000":  # bad credentials, no such database
        return False
    if exc.sqlstate is None:  # a connection failure, described only in text
        message = str(exc)
        return not any(phrase in message for phrase in _PERMANENT_CONNECT_FAILURES)
    return True


def _late_samples_params(table: pa.Table) -> dict[str, Any]:
    """``_LATE_SAMPLES_ON_FRESH``'s parameters for windows first stored from ``table``
    (with rows): their configs and windows, and the span of their ends."""
    windows = table.group_by(["config_name", "window_name"]).aggregate([])
    ends = pc.min_max(table["window_end_ms"])
    return {
        "configs": windows["config_name"].to_pylist(),
        "windows": windows["window_name"].to_pylist(),
        "first_end_ms": ends["min"].as_py(), "last_end_ms": ends["max"].as_py(),
    }  # fmt: skip


class ResultStore:
    """The PostgreSQL result store of one writer (see the module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        retry: RetryPolicy = DEFAULT_RETRY,
        sleep: Callable[[float], None] = time.sleep,
        clock: Clock = _SYSTEM_CLOCK,
    ) -> None:
        # Connecting is lazy (and retried): constructing a store never blocks or fails on I/O.
        self._url = url
        self._target = describe_url(url)
        self._retry = retry
        self._sleep = sleep
        self._clock = clock
        self._conn: psycopg.Connection[Any] | None = None
        #: Held through each attempt of a call: ``retire`` (another thread) waits for it
        #: rather than closing the connection under it.
        self._in_use = threading.RLock()
        self._retired = False
        #: Failed attempts (by reason) not yet written to ``pipeline_metrics``: a store that
        #: is down cannot take them, so the next successful ``commit_batch`` writes them.
        self._unrecorded_errors: collections.Counter[str] = collections.Counter()
        self._recorded: collections.Counter[str] = collections.Counter()
        #: Labels of those rows besides ``reason`` (the writer sets ``config`` and ``query``).
        self.error_labels: dict[str, str] = {}
        self._series = SeriesIds(clock)

    # -- public API -------------------------------------------------------------------------

    def ensure_schema(self) -> None:
        """Create or migrate the tables (idempotent; see :mod:`streamgauge.sinks.schema`)."""
        self._with_retry("ensure the schema", schema.ensure_schema)

    def commit_batch(
        self,
        query_name: str,
        batch_id: int,
        results: pa.Table,
        finalizations: Sequence[Finalization],
        revision: int,
        state: Mapping[tuple[str, str], int] = _NO_STATE,
        lock_name: str | None = None,
        hold_after: Mapping[tuple[str, str], int] = _NO_STATE,
        retractions: pa.Table | None = None,
        late: pa.Table | None = None,
        late_query_name: str | None = None,
        early_every: Mapping[tuple[str, str], int] = _NO_STATE,
        fresh: pa.Table | None = None,
        fresh_encodings: Callable[[], pa.Table] | None = None,
    ) -> BatchOutcome:
        """Write one micro-batch atomically; a no-op if ``(query_name, batch_id)`` was committed.

        ``revision`` is the batch's revision number, strictly increasing across batches; the
        rows carry their own ``revision`` column (normally the same number). ``state`` maps
        ``(config_name, key)`` to an integer (e.g. ``("web", "watermark") → epoch ms``) stored in
        ``pipeline_state`` in the same transaction, so state never runs ahead of results.

        ``retractions`` (``RETRACTION_SCHEMA``): windows this batch supersedes (a session that
        grew or merged), deleted from ``window_results`` and ``window_pending`` (their HDR
        buckets with them) before the upsert, so no reader ever sees both the old and the new
        session. ``late`` (``LATE_SCHEMA``): late partials the window query found itself (a
        partial reaching into a final session), recorded in ``late_events`` under
        ``late_query_name``.

        ``hold_after`` maps ``(config_name, window_name)`` to the batch's watermark: that
        window's rows ending after it wait in ``window_pending`` (those it passed are
        published, with the pending rows it passed); rows of windows not in it are published
        as they come.

        ``early_every`` maps ``(config_name, window_name)`` of a held window (``hold_after``)
        to its ``early_every`` in ms: its open windows are published early (``early_as_of``,
        see ``_EARLY``) once the watermark is that far past their start.

        ``fresh`` (``RESULT_SCHEMA``, like ``results``): windows the caller publishes for the
        first time, each past the batch's watermark, inserted as they are (``_insert_fresh``).
        If one is stored after all they take the general upsert, and the outcome's
        ``fresh_stored_until_ms`` says up to where the window's rows are stored.
        ``fresh_encodings``: the fresh windows' sketch encodings (``with_encodings``), asked
        for only once their rows are committed, for the second transaction (``fresh`` then
        carries none): encoding a closing batch's sketches takes about as long as storing its
        rows, and the rows need not wait for it.
        """
        table = _with_hll_registers(_conform(results))
        retracted_rows = None if retractions is None else _conform(retractions, RETRACTION_SCHEMA)
        late_rows = None if late is None else _conform(late, LATE_SCHEMA)
        fresh_rows = None if fresh is None else _with_hll_registers(_conform(fresh))
        final_before = _final_before(finalizations)

        def work(conn: psycopg.Connection[Any]) -> BatchOutcome:
            now_ms = self._clock.now_ms()
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(_LOCK_WINDOW, (lock_name or query_name,))
                self._record_errors(cur, now_ms)
                cur.execute(_CLAIM_BATCH, (query_name, batch_id, now_ms))
                if cur.rowcount == 0:
                    return BatchOutcome(already_committed=True, rows_upserted=0, rows_finalized=0)
                numbered = functools.partial(self._series.with_ids, cur)
                cur.execute(_HOLD_DDL)
                if hold_after:
                    cur.executemany(
                        _HOLD_INSERT,
                        [(cfg, win, int(ms), early_every.get((cfg, win)),
                          final_before.get((cfg, win)))
                         for (cfg, win), ms in hold_after.items()],  # fmt: skip
                    )
                retracted = 0
                if retracted_rows is not None and retracted_rows.num_rows:
                    _copy_into(cur, _RETRACT_STAGING_DDL, _RETRACT_STAGING,
                               numbered(retracted_rows))  # fmt: skip
                    for target, statement in _RETRACT_FROM.items():
                        cur.execute(statement, {"revision": revision})
                        retracted += _written(cur, target == "window_rows")
                recorded = 0
                if late_rows is not None and late_rows.num_rows:
                    _copy_into(cur, _LATE_STAGING_DDL, _LATE_STAGING, numbered(late_rows))
                    params = {"query_name": late_query_name or query_name,
                              "batch_id": batch_id, "now_ms": now_ms}  # fmt: skip
                    cur.execute(_INSERT_LATE, params)
                    recorded = max(cur.rowcount, 0)
                    cur.execute(_COUNT_LATE_ON_WINDOWS)
                early = 0
                upserted = self._upsert(cur, numbered(table)) if table.num_rows else 0
                stored_until = None
                if fresh_rows is not None and fresh_rows.num_rows:
                    inserted, stored_until = self._insert_fresh(conn, cur, numbered(fresh_rows))
                    upserted += inserted
                if hold_after:
                    cur.execute(_PROMOTE, {"revision": revision, "now_ms": now_ms})
                    upserted += _written(cur)
                    if early_every:
                        cur.execute(_EARLY, {"revision": revision, "now_ms": now_ms})
                        early = _written(cur)
                        upserted += early
                finalized = 0
                for fin in finalizations:
                    params = {
                        "revision": revision,
                        "now_ms": now_ms,
                        "config_name": fin.config_name,
                        "window_name": fin.window_name,
                        "final_before_ms": fin.final_before_ms,
                    }
                    cur.execute(_FINALIZE, params)
                    finalized += max(cur.rowcount, 0)
                    cur.execute(_FORGET_FINAL_ENDS, params)
                if state:
                    cur.executemany(
                        _UPSERT_STATE,
                        [(cfg, key, int(value), now_ms) for (cfg, key), value in state.items()],
                    )
                cur.execute(
                    "UPDATE sink_batches SET rows_written = %s"
                    " WHERE query_name = %s AND batch_id = %s",
                    (upserted + finalized + retracted, query_name, batch_id),
                )
            return BatchOutcome(
                already_committed=False, rows_upserted=upserted, rows_finalized=finalized,
                rows_retracted=retracted, late_recorded=recorded, rows_early=early,
                fresh_stored_until_ms=stored_until,
            )  # fmt: skip

        outcome = self._with_retry(f"commit batch {batch_id} of {query_name!r}", work)
        self._unrecorded_errors -= self._recorded  # the transaction that wrote them committed
        self._recorded = collections.Counter()
        if fresh is not None and fresh_rows is not None and fresh_rows.num_rows:
            if fresh_encodings is not None:
                fresh_rows = _with_hll_registers(_conform(with_encodings(fresh, fresh_encodings())))
            self._commit_fresh_sketches(query_name, batch_id, fresh_rows, lock_name)
        return outcome

    def _commit_fresh_sketches(
        self, query_name: str, batch_id: int, fresh: pa.Table, lock_name: str | None
    ) -> None:
        """The sketches of the windows ``commit_batch`` published fresh, in a transaction of
        their own after the one that made the windows' rows visible: most of the bytes of a
        closing batch are sketches (a timer window of 100 values: its row ~0.2 kB, its
        sketches ~1.9 kB), and the rows need not wait for them. Claimed under
        ``<query_name>.sketches``, so a batch run again after a crash between the two writes
        what is missing, once."""
        sketched = fresh.select([c for c in _SKETCHED_COLUMNS if c != "series_id"])
        has = pc.or_(pc.or_(pc.is_valid(sketched["sketch"]),
                            pc.is_valid(sketched["hll_registers"])),
                     pc.is_valid(sketched["hdr_bucket_counts"]))  # fmt: skip
        if not pc.any(has).as_py():
            return
        if not pc.all(has).as_py():  # counters and gauges beside: no row of theirs
            sketched = sketched.filter(has)

        def work(conn: psycopg.Connection[Any]) -> None:
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(_LOCK_WINDOW, (lock_name or query_name,))
                claim = (sketches_query_name(query_name), batch_id, self._clock.now_ms())
                cur.execute(_CLAIM_BATCH, claim)
                if cur.rowcount == 0:
                    return
                numbered = self._series.with_ids(cur, sketched)
                try:
                    with conn.transaction():  # a savepoint: only the copy is undone
                        _copy_arrow(cur, "window_sketches",
                                    _as_window_rows(numbered, _FRESH_SKETCH_COLUMNS))  # fmt: skip
                except pgerrors.UniqueViolation:
                    _copy_into(cur, _FRESH_SKETCHES_STAGING_DDL, _FRESH_SKETCHES_STAGING,
                               numbered)  # fmt: skip
                    cur.execute(_INSERT_FRESH_SKETCHES)

        self._with_retry(f"commit the sketches of batch {batch_id} of {query_name!r}", work)

    def commit_late_batch(
        self, query_name: str, batch_id: int, late: pa.Table, lock_name: str | None = None
    ) -> BatchOutcome:
        """Record late partials of one micro-batch (no-op if the batch was committed before).

        Rows go to ``late_events``; their sample counts are added to ``late_events`` of the
        windows they missed, in the same transaction, so a replayed batch cannot count twice.
        """
        table = _conform(late, LATE_SCHEMA)

        def work(conn: psycopg.Connection[Any]) -> BatchOutcome:
            now_ms = self._clock.now_ms()
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(_LOCK_WINDOW, (lock_name or query_name,))
                self._record_errors(cur, now_ms)
                cur.execute(_CLAIM_BATCH, (query_name, batch_id, now_ms))
                if cur.rowcount == 0:
                    return BatchOutcome(already_committed=True, rows_upserted=0, rows_finalized=0)
                written = 0
                if table.num_rows:
                    numbered = self._series.with_ids(cur, table)
                    _copy_into(cur, _LATE_STAGING_DDL, _LATE_STAGING, numbered)
                    params = {"query_name": query_name, "batch_id": batch_id, "now_ms": now_ms}
                    cur.execute(_INSERT_LATE, params)
                    written = max(cur.rowcount, 0)
                    cur.execute(_COUNT_LATE_ON_WINDOWS)
                cur.execute(
                    "UPDATE sink_batches SET rows_written = %s"
                    " WHERE query_name = %s AND batch_id = %s",
                    (written, query_name, batch_id),
                )
            return BatchOutcome(already_committed=False, rows_upserted=written, rows_finalized=0)

        outcome = self._with_retry(f"commit late batch {batch_id} of {query_name!r}", work)
        self._unrecorded_errors -= self._recorded  # the transaction that wrote them committed
        self._recorded = collections.Counter()
        return outcome

    def publish_corrections(
        self,
        results: pa.Table,
        lock_name: str,
        *,
        supersede: bool = False,
        late_ids: Sequence[int] | None = None,
    ) -> BatchOutcome:
        """Replace final windows by recomputed ones (``streamgauge replay``), atomically.

        Each changed window gets the next revision; unchanged ones are left alone; a window
        not stored before is inserted (revision 1, ``corrections`` 0: not a correction). Late
        partials of the recomputed windows are marked ``replayed_at``: those whose window key
        is a recomputed window's or, given ``late_ids``, exactly those ``late_events`` ids.
        ``rows_upserted`` is the number of windows corrected or inserted, ``rows_finalized``
        the late partials marked, ``rows_retracted`` the superseded rows deleted.

        ``supersede`` (session windows): a recomputed window also replaces every stored row of
        its series (metric, tags) that lies inside it, in ``window_results`` and
        ``window_pending``: the sessions a late partial extended or bridged. Its revision is
        one above the highest it replaces and its ``corrections`` one above the most any of
        them had; it is written even when a stored row with its own key holds the same
        values, as long as it supersedes others.
        """
        table = _with_hll_registers(_conform(results))

        def work(conn: psycopg.Connection[Any]) -> BatchOutcome:
            now_ms = self._clock.now_ms()
            with conn.transaction(), conn.cursor() as cur:
                cur.execute(_LOCK_WINDOW, (lock_name,))
                if not table.num_rows:
                    return BatchOutcome(False, 0, 0)
                _copy_into(cur, _STAGING_DDL, _STAGING,
                           self._series.with_ids(cur, table))  # fmt: skip
                retracted = 0
                if supersede:
                    cur.execute(_REPLAY_PRIOR_DDL)
                    cur.execute(_FIND_SUPERSEDED)
                    for target, statement in _DELETE_SUPERSEDED.items():
                        cur.execute(statement)
                        retracted += _written(cur, target == "window_rows")
                    cur.execute(_UPDATE_SUPERSEDING)
                    corrected = _written(cur)
                    cur.execute(_INSERT_SUPERSEDING)
                    corrected += _written(cur)
                else:
                    cur.execute(_PUBLISH_CORRECTIONS)
                    corrected = _written(cur)
                if late_ids is None:
                    cur.execute(_MARK_LATE_REPLAYED, {"now_ms": now_ms})
                else:
                    cur.execute(_MARK_LATE_IDS_REPLAYED, {"now_ms": now_ms, "ids": list(late_ids)})
                applied = max(cur.rowcount, 0)
            return BatchOutcome(False, rows_upserted=corrected, rows_finalized=applied,
                                rows_retracted=retracted)  # fmt: skip

        return self._with_retry(f"publish corrections for {lock_name!r}", work)

    def read_late_partials(self, config_name: str, window_name: str) -> list[LateRecord]:
        """Every ``late_events`` row of one window definition (replayed or not), by id."""

        def work(conn: psycopg.Connection[Any]) -> list[LateRecord]:
            rows = conn.execute(_READ_LATE, (config_name, window_name)).fetchall()
            return [
                LateRecord(int(i), str(metric), canonical_tags_text(tags), int(t), int(n))
                for i, metric, tags, t, n in rows
            ]

        return self._with_retry(f"read late partials of {config_name}/{window_name}", work)

    def prune(self, before_ms: int) -> dict[str, int]:
        """Delete windows that ended before ``before_ms`` (and batch records older than it).

        Returns the rows deleted per table. One transaction, so a dashboard never sees a
        window without its late events or the other way round. Then, when windows went, the
        series no window refers to any more, in a short transaction of their own
        (``_DELETE_UNUSED_SERIES``).
        """

        def work(conn: psycopg.Connection[Any]) -> dict[str, int]:
            deleted = {}
            with conn.transaction(), conn.cursor() as cur:
                for table, statement in _PRUNE.items():
                    cur.execute(statement, {"before": before_ms})
                    deleted[table] = _written(cur, table == "window_results")
            deleted["window_series"] = 0
            if not deleted["window_results"] and not deleted["window_pending"]:
                return deleted
            unused = [row[0] for row in conn.execute(_UNUSED_SERIES).fetchall()]
            if unused:
                with conn.transaction():
                    conn.execute(_BUMP_SERIES_GENERATION)
                    cur = conn.execute(_DELETE_UNUSED_SERIES, {"ids": unused})
                    deleted["window_series"] = max(cur.rowcount, 0)
            return deleted

        return self._with_retry("prune old results", work)

    def start_checkpoint(
        self, config_name: str, window_name: str, query_names: Sequence[str],
        *, late_reread: LateRowsReread | None = None,
    ) -> int:
        """A query starts on a fresh checkpoint: forget its old batch ids, return the highest
        revision stored for the window (its new revisions must start above it).

        Spark numbers a new checkpoint's micro-batches from 0 again. Without this, the new
        batches would be skipped as "already committed" under the same query name, and
        their rows would carry revisions below the stored ones (and lose the upsert).
        ``late_reread`` (the query records the window's late rows): the window's late rows
        from the segments the new checkpoint reads again go, and the counts on its windows
        with them (``LateRowsReread``).
        """

        def work(conn: psycopg.Connection[Any]) -> int:
            with conn.transaction():
                names = [*query_names, *map(sketches_query_name, query_names)]
                conn.execute("DELETE FROM sink_batches WHERE query_name = ANY(%s)", (names,))
                if late_reread is not None:
                    self._forget_late_rows(conn, config_name, window_name, late_reread)
                row = conn.execute(
                    "SELECT greatest("
                    " (SELECT max(r.revision) FROM window_series s"
                    "  JOIN window_rows r ON r.series_id = s.series_id"
                    "  WHERE s.config_name = %(c)s AND s.window_name = %(w)s),"
                    " (SELECT max(revision) FROM window_pending"
                    "  WHERE config_name = %(c)s AND window_name = %(w)s))",
                    {"c": config_name, "w": window_name},
                ).fetchone()
            return 0 if row is None or row[0] is None else int(row[0])

        return self._with_retry(f"start a checkpoint of {config_name}/{window_name}", work)

    def _forget_late_rows(
        self, conn: psycopg.Connection[Any], config_name: str, window_name: str,
        reread: LateRowsReread,
    ) -> None:  # fmt: skip
        conn.execute(_LOCK_WINDOW, (reread.lock_name,))
        params = {
            "c": config_name, "w": window_name, "generation": reread.generation,
            "now_ms": self._clock.now_ms(), "receivers": list(reread.first_heartbeats),
            "first_ms": list(reread.first_heartbeats.values()),
        }  # fmt: skip
        if conn.execute(_CLAIM_LATE_GENERATION, params).rowcount == 0:
            return  # the generation's other query forgot them already
        conn.execute(_RECOUNT_WITHOUT_FORGOTTEN_LATE, params)
        conn.execute(_FORGET_LATE, params)

    def read_state(self, config_name: str, key: str) -> int | None:
        """A value of ``pipeline_state`` (e.g. a window's watermark), or None if never set."""

        def work(conn: psycopg.Connection[Any]) -> int | None:
            row = conn.execute(
                "SELECT value_ms FROM pipeline_state WHERE config_name = %s AND key = %s",
                (config_name, key),
            ).fetchone()
            return None if row is None else int(row[0])

        return self._with_retry(f"read {key!r} of {config_name!r}", work)

    def close(self) -> None:
        """Close the connection; the next call opens another."""
        if self._conn is not None:
            self._conn.close()
        self._conn = None

    def retire(self) -> None:
        """Close the connection for good, once a call under way in another thread (a stopped
        query's writer still finishing its batch) has ended its attempt; a later call raises
        instead of reconnecting, and a call retrying gives up."""
        self._retired = True
        with self._in_use:
            self.close()

    def __enter__(self) -> ResultStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------

    def _record_errors(self, cur: psycopg.Cursor[Any], now_ms: int) -> None:
        """Write the failed attempts counted so far as ``streamgauge.store.errors`` rows, in
        the caller's transaction; they leave the counter only once it commits."""
        pending = +self._unrecorded_errors
        self._recorded = pending
        if not pending:
            return
        cur.executemany(
            _RECORD_ERRORS,
            [(now_ms, json.dumps({**self.error_labels, "reason": reason}, sort_keys=True), count)
             for reason, count in sorted(pending.items())],  # fmt: skip
        )

    def _upsert(self, cur: psycopg.Cursor[Any], table: pa.Table) -> int:
        _copy_into(cur, _STAGING_DDL, _STAGING, table)
        try:
            cur.execute(_UPSERT)
            upserted = _written(cur)
            cur.execute(_UPSERT_PENDING)
        except pgerrors.CardinalityViolation as exc:
            raise ValueError(
                "the batch holds the same window twice (same config_name, window_name, metric, "
                "tags, window_start_ms, window_end_ms): emit one row per window and batch"
            ) from exc
        return upserted

    def _insert_fresh(
        self, conn: psycopg.Connection[Any], cur: psycopg.Cursor[Any], table: pa.Table
    ) -> tuple[int, int | None]:
        """``commit_batch(fresh=...)``: rows inserted, and None, or the stored-until bound
        when a window was stored already and the rows took the upsert instead. ``table``
        has rows (the callers skip an empty one).

        None of the windows is stored yet, so they are copied straight into window_results:
        no ON CONFLICT arbitration, no per-row late_events lookup, and no staging table (the
        figures: the comment above ``_FRESH_STAGING``). It runs in a savepoint; a window
        stored after all (a replay published it, or a new checkpoint catching up re-publishes
        it) makes it fail, and the same rows then take the general upsert (``_UPSERT_FRESH``)
        from a staging table.
        """
        try:
            try:
                with conn.transaction():  # a savepoint: only the copy is undone
                    _copy_arrow(cur, "window_rows", _as_window_rows(table))
            except pgerrors.UniqueViolation:
                _copy_into(cur, _FRESH_STAGING_DDL, _FRESH_STAGING, table)
                cur.execute(_UPSERT_FRESH)
                upserted = _written(cur)
                cur.execute(_STORED_UNTIL)
                row = cur.fetchone()
                return upserted, None if row is None or row[0] is None else int(row[0])
        except pgerrors.CardinalityViolation as exc:
            raise ValueError(
                "the batch holds the same fresh window twice (same config_name, window_name, "
                "metric, tags, window_start_ms, window_end_ms): emit one row per window"
            ) from exc
        cur.execute(_LATE_SAMPLES_ON_FRESH, _late_samples_params(table))
        return table.num_rows, None

    def _connection(self) -> psycopg.Connection[Any]:
        if self._retired:
            raise RuntimeError(f"the result store of {self._target} was retired")
        if self._conn is None or self._conn.closed or self._conn.broken:
            self.close()
            self._conn = psycopg.connect(
                self._url, autocommit=True, connect_timeout=10, application_name="streamgauge"
            )
        return self._conn

    def _with_retry(self, what: str, fn: Callable[[psycopg.Connection[Any]], T]) -> T:
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._in_use:
                    # An attempt's series ids are remembered only once it returns: a failed
                    # one rolled back what it numbered (sinks/series_ids.py).
                    self._series.discard()
                    result = fn(self._connection())
                    self._series.remember()
                    return result
            except psycopg.Error as exc:
                if not _is_transient(exc):
                    raise
                with self._in_use:
                    self.close()  # reconnect next time; a broken connection is not reusable
                self._unrecorded_errors[_error_reason(exc)] += 1
                if self._retry.max_attempts is not None and attempt >= self._retry.max_attempts:
                    raise ResultStoreUnavailable(
                        f"could not {what} on {self._target} after {attempt} attempts: "
                        f"{_first_line(exc)}"
                    ) from exc
                delay = self._retry.delay_s(attempt)
                _logger.warning(
                    "result store %s unavailable (attempt %d to %s: %s); retrying in %.1f s",
                    self._target, attempt, what, _first_line(exc), delay,
                )  # fmt: skip
                self._sleep(delay)


def _final_before(finalizations: Sequence[Finalization]) -> dict[tuple[str, str], int]:
    """Per (config, window): the window end at or before which this batch's finalization
    makes every row final, for ``_PROMOTE`` to insert such rows final (the latest such end
    when several apply)."""
    ends: dict[tuple[str, str], int] = {}
    for fin in finalizations:
        key = (fin.config_name, fin.window_name)
        ends[key] = max(fin.final_before_ms, ends.get(key, fin.final_before_ms))
    return ends


def _copy_into(cur: psycopg.Cursor[Any], ddl: str, staging: str, table: pa.Table) -> None:
    """Binary COPY of an Arrow table into a per-connection temporary staging table."""
    # Every time, not once per connection: the CREATE is transactional, so a rolled-back
    # first batch would take the table with it. IF NOT EXISTS makes this one cheap round trip.
    cur.execute(ddl)
    _copy_arrow(cur, staging, table)


_COPY_CHUNK_BYTES = 16 * 2**20
"""Arrow bytes ``_copy_arrow`` encodes at a time: the server parses a chunk while the next is
encoded, and no buffer of a whole table's encoding is built (a close of 100k timer windows
has ~230 MB of sketches; ``docs/performance.md``, "Sketches packed, copied in chunks")."""


def _copy_arrow(cur: psycopg.Cursor[Any], target: str, table: pa.Table) -> None:
    """Binary COPY of an Arrow table into ``target``'s columns of the same names.

    pgpq encodes the Arrow columns into COPY's binary format in compiled code: turning the
    rows into Python tuples for psycopg's ``write_row`` was about half of a staging COPY's
    time, on the driver's Python thread.
    """
    statement = sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        sql.Identifier(target), sql.SQL(", ").join(map(sql.Identifier, table.schema.names))
    )
    encoder = pgpq.ArrowToPostgresBinaryEncoder(table.schema)
    rows_per_chunk = max(1, _COPY_CHUNK_BYTES * table.num_rows // max(table.nbytes, 1))
    with cur.copy(statement) as copy:
        copy.write(encoder.write_header())
        for batch in table.to_batches(max_chunksize=rows_per_chunk):
            copy.write(encoder.write_batch(batch))
        copy.write(encoder.finish())


def _as_window_rows(table: pa.Table, names: Sequence[str] = _FRESH_COLUMNS) -> pa.Table:
    """Staged rows (``_STAGED_SCHEMA``) as the columns ``names`` of window_rows (or of
    window_sketches), for a COPY into it: epoch milliseconds as UTC timestamps,
    ``late_events`` 0 (the caller derives it)."""
    columns = []
    for name in names:
        if name in _TIMESTAMP_COLUMNS:
            columns.append(table[f"{name}_ms"].cast(pa.timestamp("ms", tz="UTC")))
        elif name == "late_events":
            columns.append(pa.repeat(pa.scalar(0, pa.int64()), table.num_rows))
        else:
            columns.append(table[name])
    return pa.table(columns, names=list(names))


def _written(cur: psycopg.Cursor[Any], counted: bool = True) -> int:
    """Rows a statement wrote: its count row if it returns one (``counted``: a statement of
    ``_with_sketches`` or ``_without_sketches``), its row count otherwise."""
    if not counted:
        return max(cur.rowcount, 0)
    row = cur.fetchone()
    return 0 if row is None else int(row[0])


def canonical_tags_text(tags: Any) -> str:
    """Tags (a dict, or JSON text) as the window job writes them: sorted keys, no spaces,
    non-ASCII kept (Spark's ``to_json``); jsonb reorders keys by length and adds spaces."""
    parsed = json.loads(tags) if isinstance(tags, str) else dict(tags or {})
    return json.dumps(parsed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _error_reason(exc: psycopg.Error) -> str:
    """A stable label for a failed attempt: ``unreachable`` (no connection) or the SQLSTATE."""
    return "unreachable" if exc.sqlstate is None else f"sqlstate_{exc.sqlstate}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


def _conform(results: pa.Table, target: pa.Schema = RESULT_SCHEMA) -> pa.Table:
    """Select and cast the columns of ``target``; every problem reported at once, before I/O."""
    if results.num_columns == 0 and results.num_rows == 0:
        return target.empty_table()  # "no results" (e.g. a finalization-only batch)
    if target is RESULT_SCHEMA:
        for name in OPTIONAL_RESULT_COLUMNS - set(results.column_names):
            results = results.append_column(
                name, pa.nulls(results.num_rows, target.field(name).type)
            )
    names = set(results.column_names)
    problems = []
    missing = [c for c in target.names if c not in names]
    extra = sorted(names - set(target.names))
    if missing:
        problems.append(f"missing columns {missing}")
    if extra:
        problems.append(f"unexpected columns {extra}")
    if not problems:
        for field in target:
            if not field.nullable and results.column(field.name).null_count:
                problems.append(f"column {field.name!r} has nulls but is required")
    if problems:
        message = "results table does not match the expected columns: " + "; ".join(problems)
        raise ValueError(message)
    table = results.select(list(target.names))
    try:
        return table.cast(target)  # safe cast: refuses lossy conversions
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise ValueError(f"results table has a column of the wrong type: {exc}") from exc


def _with_hll_registers(table: pa.Table) -> pa.Table:
    """``table`` (``RESULT_SCHEMA``) plus ``hll_registers``: the dense register array of the
    set rows whose image SQL cannot read (HLL_4 / HLL_6 in HLL mode,
    ``hll_columns.packed_hll_mode``), NULL for every other row: ``window_results`` derives
    a set's registers from its image (schema version 19), so 2^lgK bytes a set window are
    not written for nothing. A set sketch that is not an HLL image raises ``ValueError``
    (before any I/O): it would fail ``hll_union_agg`` too. Checked by one compiled call per
    lgK (``hll_columns.check_images``); a bad image is then looked for one by one, to name
    its row."""
    sketch = table.column("sketch")
    is_set = pc.and_(pc.equal(table.column("metric_type"), "s"), pc.is_valid(sketch))
    rows = np.flatnonzero(np.asarray(pc.fill_null(is_set, False).to_numpy(zero_copy_only=False)))
    column = pa.nulls(table.num_rows, pa.binary())
    if rows.size:
        images = sketch.take(pa.array(rows, pa.int64())).combine_chunks()
        try:
            hll_columns.check_images(images)
        except ValueError:
            for i, blob in zip(rows.tolist(), images.to_pylist(), strict=True):
                try:
                    hll_registers(blob)
                except ValueError as exc:
                    raise ValueError(
                        f"results row {i}: the set's sketch is unreadable: {exc}"
                    ) from exc
            raise
        packed = np.flatnonzero(hll_columns.packed_hll_mode(images))
        if packed.size:
            registers = hll_columns.own_registers(images.take(pa.array(packed, pa.int64())))
            at = np.full(table.num_rows, -1, np.int64)
            at[rows[packed]] = np.arange(packed.size)
            column = registers.take(pa.array(at, pa.int64(), mask=at < 0))
    return table.append_column(_STAGED_SCHEMA.field("hll_registers"), column)


def with_encodings(rows: pa.Table, encodings: pa.Table) -> pa.Table:
    """``rows`` (``RESULT_SCHEMA``) with the columns of ``encodings`` (some of ``sketch``,
    ``hdr_histogram``; row ``i``'s for row ``i``) in place of their own."""
    for name in encodings.column_names:
        at = rows.schema.get_field_index(name)
        rows = rows.set_column(at, encodings.schema.field(name), encodings.column(name))
    return rows


def run_sql(
    url: str, statement: str, params: Sequence[object] = ()
) -> tuple[list[str], list[tuple[object, ...]]]:
    """Run one SQL statement for ``streamgauge query``: column names and rows (empty if none).

    No retries (a person is waiting) and autocommit. Without ``params`` the text is sent as is,
    so a ``%`` in it (``LIKE 'api.%'``) needs no escaping.
    """
    with psycopg.connect(
        url, autocommit=True, connect_timeout=10, application_name="streamgauge query"
    ) as conn:
        text = statement.encode()
        cur = conn.execute(text, params) if params else conn.execute(text)
        if cur.description is None:
            return [], []
        return [col.name for col in cur.description], [tuple(row) for row in cur.fetchall()]
