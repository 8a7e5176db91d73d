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
"""

from __future__ import annotations

from dataclasses import dataclass

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
