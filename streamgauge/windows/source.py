"""A PySpark streaming data source over the segment log (``format("streamgauge_spool")``).

Offset = per receiver, the last segment sequence included, plus that segment's heartbeat::

    {"receivers": {"udp-0": {"seq": 41, "heartbeat_ms": 1763765000250, "closed": false}}}

Spark writes each batch's end offset to its checkpoint (``offsets/<batch id>``) before running
the batch, so the job is exactly-once over the log, and the sink reads the heartbeats of the
batch it is writing from there (``batch_heartbeats``): a deterministic watermark per batch.

Rows are yielded as Arrow record batches (no per-row Python objects), with three columns
added to the segment's own: ``receiver``, ``segment_heartbeat_ms`` (the heartbeat written with
the row's segment) and ``prior_heartbeat_ms`` (the heartbeat of the stream's previous segment,
0 for the first). The job judges lateness from ``prior_heartbeat_ms``: a property of the log,
not of how Spark happened to cut micro-batches, so the same row is late or on time in every
run, replay or restart.

**Receivers far apart: the source holds the fast ones back.** Our watermark ``W`` follows the
slowest open receiver (``receivers_heartbeat_ms``), but Spark's own event-time watermark, which
bounds the aggregation state, follows the newest event it has been handed. If a fast
receiver's segments reached Spark while a slow one lagged, Spark would move its watermark past
windows the slow receiver still feeds on time: it drops those rows, or evicts the window's
state and later overwrites the stored row with a fresh, partial one. So ``latestOffset``
admits a segment only if its heartbeat is at most the newest heartbeat of every *other* open
receiver (slack 0); the rest waits in the durable spool, still unread::

    heartbeat (s)    0    2    4    6    8   10   12   14   16   18   20
    fast  (open)     ██████████████████████████████████████████████████|20
    slow  (open)     ███████████████|6
    handed to Spark  fast ≤ 6, slow ≤ 6   (fast 6 → 20 waits in the spool)
    W = 6 - delay;   Spark's watermark ≤ 6 + size - (delay + lateness + size)

Why no slack: a window ``[s, e)`` of the slow receiver is still on time while ``e +
lateness > heartbeat - delay``, and Spark evicts it once ``e <= newest event + size - (delay
+ lateness + size)``. With the newest event at most the slowest open heartbeat, the two never
meet; any slack above 0 lets Spark evict windows ending within that slack. Holding back
delays nothing that would otherwise be shown: a window appears only once ``W`` (the slow
receiver's heartbeat minus ``watermark_delay``) passes its end, and by then the fast
receiver has written its rows for that window in segments stamped before the slow heartbeat,
as long as ``watermark_delay`` covers one segment's span (a segment every 250 ms). ``W``
itself may trail the slowest heartbeat by up to one segment of the fast stream (the last
segment admitted is at or below the bound).

- A receiver **closed** cleanly holds nobody back (its own segments are still admitted only up
  to the others' heartbeats, so its data cannot race ahead either). When every receiver is
  closed, everything is admitted.
- A receiver that is **open but has no segment yet** (an empty stream directory) holds nobody
  back: it has promised nothing. A receiver writes its first segment, heartbeat-only if idle,
  within a second of starting, with heartbeat "now", so it joins at the front; an empty
  directory left by an aborted start would otherwise stall the job for good.
- A receiver that **crashed** (its last segment is not ``closed``) keeps its last heartbeat:
  it holds ``W`` (nothing becomes final, as before) and now also holds every other stream's
  newer segments in the spool, so pending windows stop updating too. Nothing is lost; restart
  the receiver under the same ``--receiver`` name (its stream resumes, its next heartbeat is
  "now" and releases the others) or start and stop it once so it writes a ``closed`` segment.
  Retention never removes segments no query has committed past.
- A single receiver is never held back by itself.

Offsets keep their format: ``seq``/``heartbeat_ms``/``closed`` of the last segment admitted.
Batch reads (``replay``) read the whole log.

**Each query reads only the rows it can use** (``RowFilter``, the ``lane`` and
``lateMarginMs`` options). Every query scans the log for itself, and handing a row from the
Python worker to the JVM (Arrow to ``UnsafeRow``) is a large part of a batch's cost; a
tumbling window's two lanes used to take every row each, three times in all (the sketch
lane's query scans twice: lane and late rows). Now the native lane takes counters, gauges and
sets, the sketch lane timers, histograms and distributions, and a query that records late
rows also every row that *may* be late: a row is late for a window only if that window closed
before the row's segment was written, and every window holding the row ends after its event
time, so ``event < prior_heartbeat - (watermark_delay + allowed_lateness)`` keeps a superset
(the job's own late rule then decides). Spark's watermark of a lane now follows that lane's
own rows: it can only be lower than before, so it drops nothing more; it frees state later
while a lane's types are idle.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from streamgauge.ingest.log import (
    SEGMENT_SCHEMA,
    Heartbeat,
    SegmentInfo,
    list_receivers,
    list_segments,
    read_heartbeat,
    read_segment,
    segment_at,
)
from streamgauge.ingest.pane_sketches import SKETCHED_TYPES
from streamgauge.ingest.spool_fs import SpoolLike

SOURCE_NAME = "streamgauge_spool"

#: The metric types of each ``lane`` option value besides ``all`` and ``none``: which a query
#: reads whole (``native`` and ``sketch``; ``plain`` and ``sketch_sets``: the lanes of a
#: tumbling window with ``sets: with_timers``, ``job.sketch_lane_types``).
LANE_TYPES: dict[str, tuple[str, ...]] = {
    "native": ("c", "g", "s"),
    "plain": ("c", "g"),
    "sketch": SKETCHED_TYPES,
    "sketch_sets": (*SKETCHED_TYPES, "s"),
}
LANES = ("all", *LANE_TYPES, "none")
_LANE_VALUES = {lane: pa.array(types, pa.string()) for lane, types in LANE_TYPES.items()}


def register_source_for_query(spark: SparkSession, query_name: str) -> str:
    """Register the spool source under a name of ``query_name``'s own; return that name.

    Why not one registration for every query: Spark 4.3's streaming source runner
    (``PythonStreamingSourceRunner``, checked with javap) adds ``SPARK_LOCAL_DIRS`` and
    friends to the *registered* function's environment map on the driver, without a
    copy, when a query starts. The reader tasks of every other query carry that same
    map, so a query starting while another one ships a catch-up batch (a restart after
    ``kill -9``, with a backlog in the log) can serialize a HashMap mid-insert, and the
    executor fails with ``java.io.OptionalDataException`` on every retry. One
    registration per query gives each its own map. The name is a pure function of the
    query name, so a restart registers the same one.
    """
    suffix = re.sub(r"[^0-9A-Za-z]+", "_", query_name).strip("_").lower()
    name = f"{SOURCE_NAME}__{suffix}"
    per_query = type(
        f"SpoolDataSourceFor_{suffix}", (SpoolDataSource,), {"registered_name": name}
    )
    spark.dataSource.register(per_query)
    return name


#: The Spark schema of the source: SEGMENT_SCHEMA, plus the receiver the row came from.
SOURCE_DDL = (
    "metric string, metric_type string, tags string, pane_start_ms bigint, count bigint, "
    "sum double, min double, max double, last double, last_event_ms bigint, "
    "first_recv_ms bigint, last_recv_ms bigint, "
    "sketch binary, hdr_bucket array<int>, hdr_count array<bigint>, kll binary, "
    "receiver string, segment_heartbeat_ms bigint, prior_heartbeat_ms bigint"
)
_ADDED_COLUMNS = 3


@dataclass(frozen=True)
class RowFilter:
    """Which rows a query is handed (see the module docstring): the metric types of ``lane``
    (``all``, ``LANE_TYPES``' keys, ``none``), plus, with
    ``late_margin_ms`` (the window's ``watermark_delay + allowed_lateness``), every row that
    may be late."""

    lane: str = "all"
    late_margin_ms: int | None = None

    def __post_init__(self) -> None:
        if self.lane not in LANES:
            raise ValueError(f"lane must be one of {', '.join(LANES)}, got {self.lane!r}")

    @classmethod
    def from_options(cls, options: Any) -> RowFilter:
        margin = options.get("lateMarginMs")
        return cls(str(options.get("lane", "all")), None if margin is None else int(margin))

    def options(self) -> dict[str, str]:
        margin = {} if self.late_margin_ms is None else {"lateMarginMs": str(self.late_margin_ms)}
        return {"lane": self.lane, **margin}

    def apply(
        self, batch: pa.RecordBatch, heartbeat_ms: int, prior_heartbeat_ms: int
    ) -> pa.RecordBatch:
        """``batch`` (a segment's rows, whose heartbeat is ``heartbeat_ms`` and whose
        stream's previous one ``prior_heartbeat_ms``) without the rows this query cannot use:
        before the stream columns are added, so dropped rows never get them."""
        if self.lane == "all":
            return batch
        keep: pa.Array | None = None
        if self.lane in LANE_TYPES:
            keep = pc.is_in(batch.column("metric_type"), value_set=_LANE_VALUES[self.lane])
        if self.late_margin_ms is not None:
            event = pc.min_element_wise(
                batch.column("pane_start_ms"), pa.scalar(heartbeat_ms, pa.int64())
            )
            maybe_late = pc.less(event, prior_heartbeat_ms - self.late_margin_ms)
            keep = maybe_late if keep is None else pc.or_(keep, maybe_late)
        if keep is None:
            return batch.slice(0, 0)
        return batch.filter(keep)


class SegmentPartition(InputPartition):
    """A contiguous run of one receiver's segments; picklable (the spool as its location
    string, resolved again in the worker that reads it: a path, or a ``pyarrow.fs`` URI).

    ``prior_heartbeat_ms`` is the heartbeat of the segment before the first one of the run.
    """

    def __init__(
        self, spool: str, receiver: str, sequences: list[int], prior_heartbeat_ms: int
    ) -> None:
        super().__init__((receiver, sequences, prior_heartbeat_ms))
        self.spool = spool
        self.receiver = receiver
        self.sequences = sequences
        self.prior_heartbeat_ms = prior_heartbeat_ms


class SpoolStreamReader(DataSourceStreamReader):
    def __init__(
        self, spool: SpoolLike, max_segments_per_partition: int, rows: RowFilter | None = None
    ) -> None:
        self._spool = spool
        self._max_segments_per_partition = max_segments_per_partition
        self._rows = rows or RowFilter()

    def initialOffset(self) -> dict[str, Any]:
        return {"receivers": {}}

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:  # noqa: N802
        """Admit new segments, holding back those ahead of the slowest open receiver."""
        return self._offset(start, hold_back=True)

    def commit(self, end: dict[str, Any]) -> None:
        """Retention of committed segments is owned by the ingest tier, not by the reader."""

    def _offset(self, start: dict[str, Any], *, hold_back: bool) -> dict[str, Any]:
        known: dict[str, Any] = dict(start.get("receivers", {}))
        pending: dict[str, list[SegmentInfo]] = {}
        newest: dict[str, Heartbeat] = {
            name: Heartbeat(int(p["heartbeat_ms"]), bool(p.get("closed")))
            for name, p in known.items()
        }
        for receiver in list_receivers(self._spool):
            previous = known.get(receiver, {"seq": -1})
            segments = list_segments(self._spool, receiver, after=previous["seq"])
            if segments:
                pending[receiver] = segments
                newest[receiver] = read_heartbeat(segments[-1])
        bounds = admission_bounds(newest) if hold_back else {}
        for receiver, segments in pending.items():
            admitted = _admitted(segments, newest[receiver], bounds.get(receiver))
            if admitted is not None:
                segment, heartbeat = admitted
                known[receiver] = {
                    "seq": segment.sequence,
                    "heartbeat_ms": heartbeat.heartbeat_ms,
                    "closed": heartbeat.closed,
                }
        return {"receivers": known}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begun = start.get("receivers", {})
        parts: list[InputPartition] = []
        for receiver, position in sorted(end.get("receivers", {}).items()):
            after = begun.get(receiver, {"seq": -1})["seq"]
            segments = list_segments(self._spool, receiver, after=after - 1, upto=position["seq"])
            prior = 0
            if segments and segments[0].sequence == after:
                prior = read_heartbeat(segments.pop(0)).heartbeat_ms
            step = self._max_segments_per_partition
            for index in range(0, len(segments), step):
                run = segments[index : index + step]
                sequences = [s.sequence for s in run]
                parts.append(SegmentPartition(os.fspath(self._spool), receiver, sequences, prior))
                prior = read_heartbeat(run[-1]).heartbeat_ms
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SegmentPartition)
        prior = partition.prior_heartbeat_ms
        for sequence in partition.sequences:
            segment = segment_at(partition.spool, partition.receiver, sequence)
            heartbeat = read_heartbeat(segment).heartbeat_ms
            for batch in read_segment(segment):
                kept = self._rows.apply(batch, heartbeat, prior)
                if kept.num_rows:
                    yield _with_stream_columns(kept, partition.receiver, heartbeat, prior)
            prior = heartbeat


class SpoolBatchReader(DataSourceReader):
    """Every complete segment of every stream, with the same columns as the stream reader."""

    def __init__(self, spool: SpoolLike) -> None:
        self._stream = SpoolStreamReader(spool, max_segments_per_partition=64)

    def partitions(self) -> Sequence[InputPartition]:
        stream = self._stream
        return stream.partitions(stream.initialOffset(), stream._offset({}, hold_back=False))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._stream.read(partition)


def _with_stream_columns(
    batch: pa.RecordBatch, receiver: str, heartbeat_ms: int, prior_heartbeat_ms: int
) -> pa.RecordBatch:
    n = batch.num_rows
    added = [
        pa.array([receiver] * n, pa.string()),
        pa.array([heartbeat_ms] * n, pa.int64()),
        pa.array([prior_heartbeat_ms] * n, pa.int64()),
    ]
    names = [*batch.schema.names, "receiver", "segment_heartbeat_ms", "prior_heartbeat_ms"]
    return pa.RecordBatch.from_arrays([*batch.columns, *added], names=names)


def admission_bounds(newest: dict[str, Heartbeat]) -> dict[str, int | None]:
    """Per receiver, the highest heartbeat a segment of it may carry to be handed to Spark:
    the newest heartbeat of the slowest *other* open receiver (None: no bound).

    ``newest`` is each stream's newest segment in the spool (admitted or not). Closed streams
    bound nobody; a stream never bounds itself (a receiver whose clock stepped back must not
    wait for itself).
    """
    bounds: dict[str, int | None] = {}
    for receiver in newest:
        others = [hb.heartbeat_ms for name, hb in newest.items()
                  if name != receiver and not hb.closed]  # fmt: skip
        bounds[receiver] = min(others) if others else None
    return bounds


def _admitted(
    segments: list[SegmentInfo], newest: Heartbeat, bound: int | None
) -> tuple[SegmentInfo, Heartbeat] | None:
    """The last segment of the longest prefix of ``segments`` whose heartbeats are all within
    ``bound``, with its heartbeat (None: not even the first).

    Reads the footers of the segments it admits and of the first one it holds: each segment
    is admitted once, so a held-back backlog costs one footer per trigger, not one per segment.
    """
    if bound is None:
        return segments[-1], newest
    admitted: tuple[SegmentInfo, Heartbeat] | None = None
    for segment in segments:
        heartbeat = newest if segment is segments[-1] else read_heartbeat(segment)
        if heartbeat.heartbeat_ms > bound:
            break
        admitted = segment, heartbeat
    return admitted


class SpoolDataSource(DataSource):
    """``spark.readStream.format("streamgauge_spool").option("path", SPOOL).load()``;
    ``SPOOL`` is a directory or a ``pyarrow.fs`` URI (``s3://bucket/prefix?…``)."""

    #: The short name Spark knows this class by; per-query subclasses change it.
    registered_name: ClassVar[str] = SOURCE_NAME

    @classmethod
    def name(cls) -> str:
        return cls.registered_name

    def schema(self) -> str:
        return SOURCE_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        """Batch reads (``spark.read``) see the whole retained log: `streamgauge replay`."""
        return SpoolBatchReader(str(self.options["path"]))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        spool = str(self.options["path"])
        per_partition = int(self.options.get("maxSegmentsPerPartition", "64"))
        return SpoolStreamReader(spool, per_partition, RowFilter.from_options(self.options))


def batch_heartbeats(checkpoint: Path, batch_id: int) -> dict[str, dict[str, Any]]:
    """The per-receiver offsets Spark logged for ``batch_id`` (written before the batch ran).

    The offset log format is ``v1``, a metadata line, then one JSON line per source.
    """
    lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
    offset = json.loads(lines[-1])
    receivers: dict[str, dict[str, Any]] = offset.get("receivers", {})
    return receivers


def receivers_heartbeat_ms(receivers: dict[str, dict[str, Any]]) -> int | None:
    """The time before which no receiver will send more events: the minimum over open streams.

    A slow receiver holds the watermark back so its data is not declared late; a cleanly
    closed one no longer does. With every stream closed, all data is in: the latest heartbeat.
    """
    open_streams = [int(r["heartbeat_ms"]) for r in receivers.values() if not r.get("closed")]
    if open_streams:
        return min(open_streams)
    closed = [int(r["heartbeat_ms"]) for r in receivers.values()]
    return max(closed) if closed else None


assert [f.name for f in SEGMENT_SCHEMA] == [
    part.split()[0] for part in SOURCE_DDL.split(", ")
][:-_ADDED_COLUMNS], "SOURCE_DDL must list SEGMENT_SCHEMA's columns in order"
