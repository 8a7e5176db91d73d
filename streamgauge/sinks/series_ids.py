"""The store's number of each series whose windows a writer stores (``window_series``).

A window's row and sketches are keyed by its series' ``series_id`` and its bounds (schema
version 18): an entry of that key is 24 bytes where the names' key (config, window, metric,
tags) was several times that, and inserting a close's 100k entries into it was most of the
close's ``COPY`` (``docs/performance.md``, "A window's series numbered once"). The rows a
writer hands the store name their series; :class:`SeriesIds` gives them their ids. The series
a writer stored recently are looked up in one hashed ``index_in`` per table; the others are
numbered by the store, in the batch's transaction, with one statement for all of them.

A transaction may roll back, and the ids it numbered with it: what it resolved is remembered
only once it commits (the store's retry loop calls :meth:`SeriesIds.discard` before each
attempt and :meth:`SeriesIds.remember` after one that returned). Retention deletes the series
no window refers to any more, after bumping ``window_series_generation``; each transaction that uses
remembered ids holds that row ``FOR SHARE`` until it commits, and forgets them all when the
generation changed, so it never writes the id of a series deleted under it. A series this
writer has not stored for ``forget_after_ms`` leaves its memory (the store still knows it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import psycopg
import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.clock import Clock

IntArray = npt.NDArray[np.int64]

_SEPARATOR = "\x1f"
"""Between a series' metric and its tags in its lookup key. Tags are JSON text, which holds
no raw control character, so the last separator of a key splits it: one key per series."""

_NUMBER = """
INSERT INTO window_series (config_name, window_name, metric, tags)
SELECT %(config)s, %(window)s, u.metric, u.tags::jsonb
FROM unnest(%(metrics)s::text[], %(tags)s::text[]) AS u(metric, tags)
ON CONFLICT DO NOTHING
"""
_GENERATION = "SELECT generation FROM window_series_generation FOR SHARE"
_READ = """
SELECT u.i - 1, s.series_id
FROM unnest(%(metrics)s::text[], %(tags)s::text[]) WITH ORDINALITY AS u(metric, tags, i)
JOIN window_series s
  ON (s.config_name, s.window_name, s.metric, s.tags)
   = (%(config)s, %(window)s, u.metric, u.tags::jsonb)
"""


@dataclass
class _Known:
    """The series of one window definition a writer stored recently."""

    keys: pa.Array
    ids: IntArray
    used_ms: IntArray


@dataclass(frozen=True)
class Resolved:
    """What one :meth:`SeriesIds.with_ids` call found and numbered, for
    :meth:`SeriesIds.remember`."""

    definition: tuple[str, str]
    used: IntArray
    """Positions in the definition's known series that the call used."""
    new_keys: pa.Array
    new_ids: IntArray


class SeriesIds:
    """The ids of the series a writer stores windows of (module docstring). One per
    ``ResultStore``: not thread-safe, like it."""

    def __init__(self, clock: Clock, forget_after_ms: int = 3_600_000) -> None:
        self._clock = clock
        self._forget_after_ms = forget_after_ms
        self._known: dict[tuple[str, str], _Known] = {}
        self._forgotten_at_ms = clock.now_ms()
        self._generation: int | None = None
        self._pending: list[Resolved] = []
        """What the current transaction's calls resolved, in order."""

    def with_ids(self, cur: psycopg.Cursor[Any], table: pa.Table) -> pa.Table:
        """``table`` (columns ``config_name``, ``window_name``, ``metric``, ``tags``) with a
        ``series_id`` column; numbers new series in ``cur``'s transaction, kept for
        :meth:`remember` once that transaction commits."""
        if not self._pending:  # the transaction's first call
            row = cur.execute(_GENERATION).fetchone()
            generation = None if row is None else int(row[0])
            if generation != self._generation:
                self._known.clear()
                self._generation = generation
        ids = np.empty(table.num_rows, np.int64)
        definitions = table.group_by(["config_name", "window_name"]).aggregate([])
        for config, window in zip(definitions["config_name"].to_pylist(),
                                  definitions["window_name"].to_pylist(), strict=True):  # fmt: skip
            if definitions.num_rows == 1:
                rows = np.arange(table.num_rows)
                part = table
            else:
                mask = pc.and_(pc.equal(table["config_name"], config),
                               pc.equal(table["window_name"], window))  # fmt: skip
                rows = np.flatnonzero(mask.to_numpy(zero_copy_only=False))
                part = table.take(pa.array(rows, pa.int64()))
            ids[rows], done = self._ids_of(cur, (config, window), part)
            self._pending.append(done)
        return table.append_column("series_id", pa.array(ids, pa.int64()))

    def _ids_of(
        self, cur: psycopg.Cursor[Any], definition: tuple[str, str], part: pa.Table
    ) -> tuple[IntArray, Resolved]:
        keys = pc.binary_join_element_wise(part["metric"], part["tags"], _SEPARATOR)
        keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
        known = self._known.get(definition)
        if known is None:
            at = np.full(len(keys), -1, np.int64)
        else:
            found = pc.index_in(keys, value_set=known.keys)
            at = np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), np.int64)
        ids = np.empty(len(keys), np.int64)
        hit = at >= 0
        if known is not None:
            ids[hit] = known.ids[at[hit]]
        missing = np.flatnonzero(~hit)
        new_keys = pa.array([], pa.string())
        new_ids = np.zeros(0, np.int64)
        if missing.size:
            missed = keys.take(pa.array(missing, pa.int64()))
            new_keys = missed.unique()
            first = np.asarray(pc.index_in(new_keys, value_set=missed).to_numpy(), np.int64)
            firsts = pa.array(missing[first], pa.int64())
            params = {
                "config": definition[0], "window": definition[1],
                "metrics": part["metric"].take(firsts).to_pylist(),
                "tags": part["tags"].take(firsts).to_pylist(),
            }  # fmt: skip
            cur.execute(_NUMBER, params)
            cur.execute(_READ, params)
            found = np.array(cur.fetchall(), np.int64).reshape(-1, 2)
            new_ids = np.full(len(new_keys), -1, np.int64)
            new_ids[found[:, 0]] = found[:, 1]
            placed = np.asarray(pc.index_in(missed, value_set=new_keys).to_numpy(), np.int64)
            ids[missing] = new_ids[placed]
        return ids, Resolved(definition, np.unique(at[hit]), new_keys, new_ids)

    def discard(self) -> None:
        """Forget what the calls since the last :meth:`remember` resolved: their transaction
        rolled back, or has not started."""
        self._pending.clear()

    def remember(self) -> None:
        """Keep what the committed transaction's calls resolved (in the order they made them)."""
        now_ms = self._clock.now_ms()
        resolved, self._pending = self._pending, []
        for done in resolved:
            known = self._known.get(done.definition)
            if known is None:
                known = _Known(pa.array([], pa.string()), np.zeros(0, np.int64),
                               np.zeros(0, np.int64))  # fmt: skip
                self._known[done.definition] = known
            known.used_ms[done.used] = now_ms
            if len(done.new_keys):
                known.keys = pa.concat_arrays([known.keys, done.new_keys])
                known.ids = np.concatenate([known.ids, done.new_ids])
                known.used_ms = np.concatenate(
                    [known.used_ms, np.full(len(done.new_ids), now_ms, np.int64)]
                )
        if now_ms - self._forgotten_at_ms >= self._forget_after_ms // 4:
            self._forget(now_ms)

    def _forget(self, now_ms: int) -> None:
        self._forgotten_at_ms = now_ms
        for definition, known in list(self._known.items()):
            keep = np.flatnonzero(known.used_ms >= now_ms - self._forget_after_ms)
            if keep.size == 0:
                del self._known[definition]
            elif keep.size < len(known.ids):
                known.keys = known.keys.take(pa.array(keep, pa.int64()))
                known.ids, known.used_ms = known.ids[keep], known.used_ms[keep]
