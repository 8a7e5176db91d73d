"""Open windows held by the window job until the watermark passes their end.

Spark's update mode hands ``foreachBatch`` every window a micro-batch changed. At 1 s panes
that is every open window of every active series, every batch. Writing each of them to
``window_pending`` (a keyed upsert under the window's identity) was the largest part of a
batch at 100k series: 1.31 s of store time per batch, paid again by the next, longer batch
(issue #4, README "What p50 ≤ 1 s at 100k series would take here").

A lane whose open windows are only read when they close (no ``early_every``) keeps them here
instead: the batch merges its changed windows in (a window's row from Spark is its whole value
as of the batch, so the newer row replaces the older), hands the store only the windows the
watermark has passed (``release``), and the rest stays held. When none of a batch's rows can
fall in the windows its watermark passes, the writer releases them before Spark runs the batch
(``HoldingBatchWriter._release_ahead``), in a transaction that also marks them published in
the stored holding;
mostly sooner, as soon as the log shows it (``release_before_next_batch``, ``ReleaseWatcher``).

Durability is a snapshot: the held windows as one Arrow IPC stream (``to_snapshot``), written
by the store in the batch's own transaction (``window_held``, one row per query). A restarted
job loads it (``from_stored``) and Spark resumes after the last batch it committed; a batch
Spark replays (committed to the store, not to Spark's commit log) merges the same changes into
the snapshot that already has them, which changes nothing. So a crash neither loses an open
window's latest value nor counts it twice.

``AddedWindows`` is the holding of a lane whose Spark query keeps no state
(``job.plain_batch_windows``): a batch hands over only its own rows' sums per window, which
are added to the held ones. Such a holding also keeps the windows it published until Spark's
own state would have evicted them, so a straggler's sums add to the whole window.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.sinks.pg_arrays import PgArray, pg_array
from streamgauge.sinks.store import HELD_ARRAYS, StoredHolding

_KEY_COLUMNS = ("metric", "tags", "window_start_ms", "window_end_ms")
"""A window's identity within a query: Spark's grouping keys (``job.aggregate_windows``)."""
_SEPARATOR = "\x1f"  # unit separator: in neither metric names nor canonical JSON tags


def _window_keys(table: pa.Table) -> pa.Array | pa.ChunkedArray:
    """One string per row naming its window, for hashing (``is_in``)."""
    parts = [
        table.column(name) if table.schema.field(name).type == pa.string()
        else pc.cast(table.column(name), pa.string())
        for name in _KEY_COLUMNS
    ]  # fmt: skip
    return pc.binary_join_element_wise(*parts, _SEPARATOR)


@dataclass(frozen=True)
class HeldWindows:
    """The open windows of one query, as Spark last emitted them (immutable: a batch builds
    the next holding and keeps it only once the store committed the batch)."""

    table: pa.Table | None = None

    @property
    def num_windows(self) -> int:
        return 0 if self.table is None else self.table.num_rows

    @property
    def samples(self) -> int:
        """The samples the held windows count (what accounting adds to the stored rows)."""
        if self.table is None or self.table.num_rows == 0:
            return 0
        return int(pc.sum(self.table.column("count")).as_py() or 0)

    @property
    def published_before_ms(self) -> int | None:
        """Its windows ending at or before this are published, not held (None: none)."""
        return None

    @property
    def earliest_end_ms(self) -> int | None:
        """The earliest end of a held window (None: nothing held)."""
        if self.table is None or self.table.num_rows == 0:
            return None
        return int(pc.min(self.table.column("window_end_ms")).as_py())

    def merged(self, changed: pa.Table) -> HeldWindows:
        """The holding after a batch that changed ``changed`` (one row per window)."""
        if changed.num_rows == 0:
            return self
        if self.table is None or self.table.num_rows == 0:
            return HeldWindows(changed.combine_chunks())
        unchanged = self.table.filter(
            pc.invert(pc.is_in(_window_keys(self.table), value_set=_window_keys(changed)))
        )
        return HeldWindows(
            pa.concat_tables([unchanged, changed.select(unchanged.column_names)])
            .combine_chunks()
        )

    def release(self, watermark_ms: int) -> tuple[pa.Table | None, HeldWindows]:
        """The windows whose end the watermark passed (to publish), and the holding without
        them. None: nothing is held."""
        if self.table is None:
            return None, self
        passed = pc.less_equal(self.table.column("window_end_ms"), watermark_ms)
        return self.table.filter(passed), HeldWindows(self.table.filter(pc.invert(passed)))

    def of_types(self, metric_types: tuple[str, ...] | None) -> HeldWindows:
        """The holding without windows of other metric types (None: all kept).

        A holding stored before its query's lane narrowed (a tumbling window switched to
        ``sets: with_timers``, ``checkpoints.splits_sets``) still has the sets the sketch
        lane now rebuilds from the log under its new checkpoint; released by both, the two
        rows would race on revision.
        """
        if self.table is None or metric_types is None:
            return self
        keep = pc.is_in(self.table.column("metric_type"), pa.array(metric_types, pa.string()))
        return HeldWindows(self.table.filter(keep))

    def sql_arrays(self) -> dict[str, PgArray]:
        """The held windows' values as ``window_held``'s arrays (``HELD_ARRAYS``)."""
        table = self.table
        n = 0 if table is None else table.num_rows
        return {
            array: pg_array(
                table.column(column) if table is not None and column in table.column_names
                else pa.nulls(n, pa.float64()),
                sql_type,
            )
            for array, (column, sql_type) in HELD_ARRAYS.items()
        }

    def to_snapshot(self) -> bytes:
        """The holding as an Arrow IPC stream (zstd-compressed: sets' HLL images and the
        repeated metric names and tags shrink several-fold)."""
        table = self.table if self.table is not None else pa.table({})
        sink = pa.BufferOutputStream()
        options = pa.ipc.IpcWriteOptions(compression="zstd")
        with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
            writer.write_table(table)
        return bytes(sink.getvalue())

    @classmethod
    def from_stored(cls, stored: StoredHolding | None) -> HeldWindows:
        """The holding a query's ``window_held`` row keeps (``ResultStore.read_held``): its
        snapshot without the windows published since it was written."""
        if stored is None:
            return cls()
        holding = cls.from_snapshot(stored.snapshot)
        if stored.released_before_ms is None:
            return holding
        return holding.release(stored.released_before_ms)[1]

    @classmethod
    def from_snapshot(cls, snapshot: bytes | None) -> HeldWindows:
        """The holding a snapshot stored (none: nothing held)."""
        if snapshot is None:
            return cls()
        table = pa.ipc.open_stream(pa.py_buffer(snapshot)).read_all()
        return cls(table if table.num_columns else None)


_ADDED_AGGREGATES = (
    ("metric_type", "min"), ("count", "sum"), ("sum", "sum"), ("min", "min"), ("max", "max"),
    ("last", "last"), ("last_event_ms", "max"),
)  # fmt: skip
"""How two partial sums of one window add up: ``job._merged_scalars``, as pyarrow
aggregates (``last``: of rows sorted by ``last_event_ms``, so the latest event's value; NULL
but for gauges)."""


@dataclass(frozen=True)
class AddedWindows(HeldWindows):
    """The windows of a lane whose batches bring sums, not whole windows (``added``).

    Why: at 100k counter series, Spark's state for the native lane cost ~0.4 s of a 1.3 s
    micro-batch (its updates, removals and commit: 100k keys a batch), and the holding here
    already has every open window. A stateless lane hands over each batch's sums per window
    (``job.plain_batch_windows``), and this holding adds them up.

    Published windows stay until Spark's state would have evicted them
    (``window_end <= latest end - horizon``), so a straggler's sums add to
    the whole window and it is published again, as Spark's update output did. They are not
    held any more: ``released_before_ms`` marks them, the counts, arrays and
    ``window_held_rows`` leave them out.
    """

    released_before_ms: int | None = None
    """The windows ending at or before this were published (None: none yet)."""
    horizon_ms: int = 0
    """``watermark_delay + allowed_lateness + size``: how far behind the latest window end
    a window is dropped (``job._on_time``'s Spark watermark, which no longer runs)."""

    @property
    def published_before_ms(self) -> int | None:
        return self.released_before_ms

    def _unreleased(self) -> pa.Table | None:
        if self.table is None or self.released_before_ms is None:
            return self.table
        return self.table.filter(
            pc.greater(self.table.column("window_end_ms"), self.released_before_ms)
        )

    @property
    def num_windows(self) -> int:
        return HeldWindows(self._unreleased()).num_windows

    @property
    def samples(self) -> int:
        return HeldWindows(self._unreleased()).samples

    @property
    def earliest_end_ms(self) -> int | None:
        return HeldWindows(self._unreleased()).earliest_end_ms

    def _dropped_through(self) -> int | None:
        """Published windows ending at or before this are dropped (None: none): Spark's
        state evicted a window ``horizon`` behind the latest window end it had seen."""
        if self.table is None or self.table.num_rows == 0 or self.released_before_ms is None:
            return None
        latest_end_ms = int(pc.max(self.table.column("window_end_ms")).as_py())
        return min(latest_end_ms - self.horizon_ms, self.released_before_ms)

    def dropped(self, changed: pa.Table) -> pa.Table:
        """The windows of ``changed`` this holding dropped already: sums it cannot add to a
        whole window (Spark's own watermark dropped such rows before)."""
        through = self._dropped_through()
        if through is None or changed.num_rows == 0:
            return changed.slice(0, 0)
        older = changed.filter(pc.less_equal(changed.column("window_end_ms"), through))
        if older.num_rows == 0:
            return older  # the usual batch: no key to compare
        assert self.table is not None
        return older.filter(pc.invert(_is_in(older, self.table)))

    def merged(self, changed: pa.Table, dropped: pa.Table | None = None) -> AddedWindows:
        """The holding with ``changed``'s sums added (one row per window; ``dropped`` left
        out: ``self.dropped(changed)``, computed here unless the caller has it).

        Only the held windows of the ends ``changed`` has are merged (a batch brings one or
        two ends; the holding has two or three per series), and rows are sorted by event
        time only when a gauge needs its ``last``: at 100k series that is ~0.1 s, not 0.2.
        """
        if changed.num_rows == 0:
            return self
        if dropped is None:
            dropped = self.dropped(changed)
        kept = changed.filter(pc.invert(_is_in(changed, dropped))) if dropped.num_rows else changed
        if self.table is None or self.table.num_rows == 0:
            return replace(self, table=kept.combine_chunks())
        kept = kept.select(self.table.column_names)
        ends = pc.unique(kept.column("window_end_ms"))
        touched = pc.is_in(self.table.column("window_end_ms"), value_set=ends)
        rows = pa.concat_tables([self.table.filter(touched), kept])
        has_gauges = pc.any(pc.equal(rows.column("metric_type"), "g")).as_py()
        if has_gauges:
            rows = rows.sort_by([("last_event_ms", "ascending")])
        aggregates = [(column, "max" if how == "last" and not has_gauges else how)
                      for column, how in _ADDED_AGGREGATES]  # fmt: skip
        added = rows.group_by(list(_KEY_COLUMNS), use_threads=not has_gauges).aggregate(
            aggregates
        )
        names = {f"{column}_{how}": column for column, how in aggregates}
        added = added.rename_columns([names.get(name, name) for name in added.column_names])
        for field in rows.schema:  # distinct_count, sketch: NULL on this lane
            if field.name not in added.column_names:
                added = added.append_column(field, pa.nulls(added.num_rows, field.type))
        untouched = self.table.filter(pc.invert(touched))
        table = pa.concat_tables([untouched, added.select(rows.column_names).cast(rows.schema)])
        return replace(self, table=table.combine_chunks())

    def release(self, watermark_ms: int) -> tuple[pa.Table | None, AddedWindows]:
        """The windows the watermark passed that were not published yet, and the holding
        with them marked published (and without the published windows now past the
        horizon)."""
        if self.table is None:
            return None, self
        ends = self.table.column("window_end_ms")
        passed = pc.less_equal(ends, watermark_ms)
        if self.released_before_ms is not None:
            passed = pc.and_(passed, pc.greater(ends, self.released_before_ms))
        released_before = max(watermark_ms, self.released_before_ms or watermark_ms)
        marked = replace(self, released_before_ms=released_before)
        through = marked._dropped_through()
        if through is not None:
            marked = replace(marked, table=self.table.filter(pc.greater(ends, through)))
        return self.table.filter(passed), marked

    def published_again(self, changed: pa.Table) -> pa.Table | None:
        """The published windows of the holding ``changed`` touched: to publish again, with
        their straggler's sums added (None: none)."""
        if self.table is None or self.released_before_ms is None or changed.num_rows == 0:
            return None
        if pc.min(changed.column("window_end_ms")).as_py() > self.released_before_ms:
            return None  # the usual batch: only windows not published yet
        published = self.table.filter(
            pc.less_equal(self.table.column("window_end_ms"), self.released_before_ms)
        )
        return published.filter(_is_in(published, changed))

    def of_types(self, metric_types: tuple[str, ...] | None) -> AddedWindows:
        narrowed = super().of_types(metric_types)
        return replace(self, table=narrowed.table)

    def sql_arrays(self) -> dict[str, PgArray]:
        return HeldWindows(self._unreleased()).sql_arrays()

    @classmethod
    def of_stored(cls, stored: StoredHolding | None, horizon_ms: int) -> AddedWindows:
        """The holding a query's ``window_held`` row keeps (``ResultStore.read_held``)."""
        if stored is None:
            return cls(horizon_ms=horizon_ms)
        table = HeldWindows.from_snapshot(stored.snapshot).table
        return cls(table, released_before_ms=stored.released_before_ms, horizon_ms=horizon_ms)


def _is_in(table: pa.Table, others: pa.Table) -> pa.Array | pa.ChunkedArray:
    """Per row of ``table``: whether ``others`` has its window."""
    return pc.is_in(_window_keys(table), value_set=_window_keys(others))
