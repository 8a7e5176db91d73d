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
- **Behind the log** (a restart, a fresh checkpoint over the retained log), a batch takes
  ``CATCH_UP_SPAN_MS`` of heartbeats, not everything written meanwhile (``catch_up_bound``;
  ``docs/architecture.md`` D7).

Offsets keep their format: ``seq``/``heartbeat_ms``/``closed`` of the last segment admitted
(a ``QuietLane`` query's add ``busy_until_ms``, below).
Batch reads (``replay``) read the whole log.

**An idle query waits** (``QuietLane``, ``docs/architecture.md`` D6: in a live job, the one
query of each window, whose driver reads each batch's segments itself).
A query with nothing to do would still run a micro-batch on every new segment (an idle
receiver writes one a second): read it, plan, commit its offsets and its store transaction.
``latestOffset`` reads each new segment's footer (``read_contents``: its pane range) and
admits nothing while:

- no new segment has a row (its ``pane_range_ms`` is None: heartbeat only);
- every window of the rows it took is final by the heartbeats it took: it keeps taking every
  segment until the heartbeat reaches the latest such row's pane + ``QuietLane.span_ms``
  (pane + size + ``watermark_delay`` + ``allowed_lateness``), ``busy_until_ms`` in the offset;
- less than ``QuietLane.every_ms`` (30 s) of heartbeat came since its last batch: an idle
  query's watermark in ``pipeline_state`` trails by at most that (``replay`` takes a window
  as final by that watermark).

It notes what it passed over in its checkpoint (``retention.PASSED_OVER_FILE``): the
receivers' ``segment_lag_ms`` counts those segments as done, retention still keeps them.

Timeline, a log of heartbeat-only segments (``·``) with one row, pane 32 s, in the
segment of heartbeat 33 s (``r``; 10 s windows, span 14 s)::

    heartbeat (s)   1 ...... 31 32 33 34 .......... 46 47 ........ 76
    segments        ·        ·  ·  r  ·  .......... ·  ·  ........ ·
    batches         █        █     █  █  .......... █              █
                    first    30 s  the row: every segment          30 s after
                             idle  until 32 + 14 = 46 s            the last

**A busy query waits for a change** (``QuietLane.due``). While its windows are open, a
batch that only merges rows into them changes nothing a reader sees, and each costs Spark's
micro-batch (offsets, planning, commit) and the store's transaction. So the new segments
wait in the log, read from their footers, until a batch would change a result:

- the watermark (heartbeat − ``watermark_delay``) crosses a window's end or an
  ``early_every`` tick (``plan.boundaries_ms``), or that minus ``allowed_lateness`` (a
  window becomes final): the batch that publishes a window starts within a trigger
  interval of the segment that closes it;
- a waiting row may revise a window already published (its pane is before the watermark);
- ``ROWS_PER_BATCH`` rows wait (the closing batch merges them too), or ``every_ms`` of
  heartbeat came, or every receiver has stopped.

A quickstart window of 1 minute, kept open by the receivers' own metrics (a few rows a
minute), runs a batch at its ends and finalities and one per ``every_ms``, not one per
segment; a window at 100k series takes every segment (each holds ``ROWS_PER_BATCH`` rows
and more), as before.

Whether a batch runs never changes what it computes: Spark logs each batch's offsets before
running it, a replayed batch reads the same segments, and a segment skipped now is read by
the next batch (``partitions`` covers every segment between two offsets).
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
from pyspark.sql import SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from streamgauge.ingest.log import (
    DEFAULT_MAX_SKEW_MS,
    SEGMENT_SCHEMA,
    Heartbeat,
    SegmentContents,
    SegmentInfo,
    list_receivers,
    list_segments,
    read_contents,
    read_heartbeat,
    read_segment,
    segment_at,
    segments_after,
)
from streamgauge.ingest.spool_fs import SpoolLike

SOURCE_NAME = "streamgauge_spool"

#: How far after its segment's heartbeat a row taken before ``busy_until_ms`` was kept in the
#: offset may lie (the receivers' default ``max_skew_ms``); a larger skew only delays, by up to
#: ``QuietLane.every_ms``, the closing of such a row's window.
UNKNOWN_ROWS_AHEAD_MS = DEFAULT_MAX_SKEW_MS

#: The heartbeats one micro-batch behind the log takes (``catch_up_bound``): ten times and more
#: what a batch that keeps up takes, so a catch-up runs in large batches of a size the driver
#: holds; and as long as an idle query lets pass before it runs a batch
#: (``QuietLane.every_ms``), so that batch is never cut in two.
CATCH_UP_SPAN_MS = 30_000

#: The rows a busy query lets wait for a change (``QuietLane.due``): a closing batch also
#: merges the rows that waited, so this bounds what it adds to the window's freshness (about
#: 0.1 s of the driver's step at 50k timer partials); at 50k series and more every segment
#: is a batch, as without waiting.
ROWS_PER_BATCH = 50_000


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
class QuietLane:
    """A query that runs a micro-batch only when it has something to do (module docstring,
    "An idle query waits"): a new segment with a row, a window of the rows taken not yet
    final, or ``every_ms`` of heartbeat since its last batch.

    ``span_ms``: from a row's pane start to the heartbeat at which every window holding it is
    final (pane + size + ``watermark_delay`` + ``allowed_lateness``): until then the query
    takes every segment, so its windows close and become final on time. ``every_ms``: while
    idle, how much heartbeat progress it still takes in one batch, so its watermark in
    ``pipeline_state`` (which ``replay`` reads) trails by at most that much.
    """

    span_ms: int
    every_ms: int = 30_000
    #: Where it notes the segments it passed over (``retention.PASSED_OVER_FILE`` in its
    #: checkpoint), so ``segment_lag_ms`` does not count them; None: not noted.
    passed_over: str | None = None
    #: ``(stride, phase)`` of the watermarks at which the window's results change
    #: (``plan.boundaries_ms``), with its ``watermark_delay`` and ``allowed_lateness``: while
    #: its windows are open it waits for a batch that changes what a reader sees (``due``).
    #: None: it takes every new segment while its windows are open.
    boundaries_ms: tuple[int, int] | None = None
    delay_ms: int = 0
    lateness_ms: int = 0

    @classmethod
    def from_options(cls, options: Any) -> QuietLane | None:
        span = options.get("quietSpanMs")
        if span is None:
            return None
        every = int(options.get("quietEveryMs", cls.every_ms))
        stride = options.get("quietStrideMs")
        boundaries = None if stride is None else (int(stride), int(options["quietPhaseMs"]))
        return cls(
            int(span), every, options.get("quietPassedOver"), boundaries,
            int(options.get("quietDelayMs", 0)), int(options.get("quietLatenessMs", 0)),
        )  # fmt: skip

    def options(self) -> dict[str, str]:
        noted = {} if self.passed_over is None else {"quietPassedOver": self.passed_over}
        paced = {} if self.boundaries_ms is None else {
            "quietStrideMs": str(self.boundaries_ms[0]),
            "quietPhaseMs": str(self.boundaries_ms[1]),
            "quietDelayMs": str(self.delay_ms), "quietLatenessMs": str(self.lateness_ms),
        }  # fmt: skip
        return {"quietSpanMs": str(self.span_ms), "quietEveryMs": str(self.every_ms), **noted,
                **paced}  # fmt: skip

    def due(self, taken_ms: int, offered_ms: int, pending: Sequence[SegmentContents]) -> bool:
        """Whether a batch of the ``pending`` segments, moving the heartbeat from
        ``taken_ms`` to ``offered_ms``, is worth running now (module docstring, "A busy
        query waits for a change"): the watermark crosses a window's end, an early tick or
        a window's finality; a row may revise a window already published; the rows waiting
        reach ``ROWS_PER_BATCH``; or ``every_ms`` of heartbeat came."""
        if self.boundaries_ms is None or offered_ms >= taken_ms + self.every_ms:
            return True
        stride, phase = self.boundaries_ms
        for lag in (self.delay_ms, self.delay_ms + self.lateness_ms):
            if (offered_ms - lag - phase) // stride > (taken_ms - lag - phase) // stride:
                return True
        watermark = taken_ms - self.delay_ms
        rows = 0
        for contents in pending:
            if contents.rows is None:  # a segment from before footers said: as it comes
                return True
            if contents.pane_range_ms is not None and contents.pane_range_ms[0] < watermark:
                return True  # may revise a published window, or be late
            rows += contents.rows
        return rows >= ROWS_PER_BATCH


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
        self,
        spool: SpoolLike,
        max_segments_per_partition: int,
        quiet: QuietLane | None = None,
    ) -> None:
        self._spool = spool
        self._max_segments_per_partition = max_segments_per_partition
        self._quiet = quiet
        #: (receiver, sequence) -> what the segment holds (``_contents_of``).
        self._contents: dict[tuple[str, int], SegmentContents] = {}
        self._noted: dict[str, Any] | None = None  # the positions last noted as passed over

    def initialOffset(self) -> dict[str, Any]:
        return {"receivers": {}}

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:  # noqa: N802
        """Admit new segments, holding back those ahead of the slowest open receiver; a
        ``QuietLane`` with nothing to do admits none (``_quiet_offset``)."""
        end, whole = admitted_offsets(self._spool, start)
        if self._quiet is None:
            return end
        if end["receivers"] == start.get("receivers", {}):
            return start  # nothing new: the very offset, ``busy_until_ms`` and all (no batch)
        return self._quiet_offset(self._quiet, start, end, whole)

    def _quiet_offset(
        self, quiet: QuietLane, start: dict[str, Any], end: dict[str, Any],
        whole: dict[str, Any],
    ) -> dict[str, Any]:  # fmt: skip
        """``end``, or ``start`` (no batch) while the query has nothing to do: no new row,
        every window it has seen final by the heartbeats already taken, and less
        than ``quiet.every_ms`` of heartbeat progress since its last batch. What it has to do
        is judged on ``whole`` (every admissible segment), past a catch-up batch's ``end``.

        ``busy_until_ms`` (in the offset, so it survives a restart): the heartbeat from which
        every window of the rows taken so far is final. An offset written before it existed
        gives the bound of a row stamped up to ``UNKNOWN_ROWS_AHEAD_MS`` after its heartbeat.
        """
        begun: dict[str, Any] = start.get("receivers", {})
        busy_until = start.get("busy_until_ms")
        if busy_until is None:
            heartbeats = [int(p["heartbeat_ms"]) for p in begun.values()]
            busy_until = max(heartbeats, default=-quiet.span_ms - UNKNOWN_ROWS_AHEAD_MS)
            busy_until += UNKNOWN_ROWS_AHEAD_MS + quiet.span_ms
        wanted = False
        pending: list[SegmentContents] = []
        for receiver, position in whole["receivers"].items():
            after = begun.get(receiver, {"seq": -1})["seq"]
            for segment in segments_between(self._spool, receiver, after, position["seq"]):
                contents = self._contents_of(segment)
                pending.append(contents)
                if contents.pane_range_ms is not None:
                    wanted = True
                    busy_until = max(busy_until, contents.pane_range_ms[1] + quiet.span_ms)
        for key in [k for k in self._contents if k[1] <= begun.get(k[0], {"seq": -1})["seq"]]:
            del self._contents[key]  # committed: never asked about again
        taken = receivers_heartbeat_ms(begun)
        offered = receivers_heartbeat_ms(whole["receivers"])
        if (
            not wanted
            and taken is not None  # a first batch always runs
            and taken >= busy_until  # every window of the rows taken is final
            and offered is not None
            and offered < taken + quiet.every_ms
        ):
            self._note_passed_over(quiet, whole)
            return start
        if (
            end == whole  # keeping up: a catch-up batch always runs
            and taken is not None
            and offered is not None
            and not every_receiver_closed(whole["receivers"])
            and not quiet.due(taken, offered, pending)
        ):
            # The segments wait in the log for a batch that changes something: read, and not
            # lag (retention keeps them; segment_lag_ms and status count them as done).
            self._note_passed_over(quiet, whole)
            return start
        return {**end, "busy_until_ms": busy_until}

    def _note_passed_over(self, quiet: QuietLane, end: dict[str, Any]) -> None:
        """Replace the ``passed_over`` file with ``end``'s positions (write, then rename)."""
        if quiet.passed_over is None or end["receivers"] == self._noted:
            return
        path = Path(quiet.passed_over)
        scratch = path.with_name(path.name + ".tmp")
        scratch.write_text(json.dumps({"receivers": end["receivers"]}))
        os.replace(scratch, path)
        self._noted = end["receivers"]

    def _contents_of(self, segment: SegmentInfo) -> SegmentContents:
        """What ``segment`` holds (from its footer, once per segment)."""
        key = (segment.receiver, segment.sequence)
        if key not in self._contents:
            self._contents[key] = read_contents(segment)[0]
        return self._contents[key]

    def commit(self, end: dict[str, Any]) -> None:
        """Retention of committed segments is owned by the ingest tier, not by the reader."""

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        begun = start.get("receivers", {})
        parts: list[InputPartition] = []
        for receiver, position in sorted(end.get("receivers", {}).items()):
            after = begun.get(receiver, {"seq": -1})["seq"]
            segments = segments_between(self._spool, receiver, after, position["seq"])
            prior = 0
            if after >= 0 and (last_read := segment_at(self._spool, receiver, after)).exists():
                prior = read_heartbeat(last_read).heartbeat_ms
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
                if batch.num_rows:
                    yield _with_stream_columns(batch, partition.receiver, heartbeat, prior)
            prior = heartbeat


class SpoolBatchReader(DataSourceReader):
    """Every complete segment of every stream, with the same columns as the stream reader."""

    def __init__(self, spool: SpoolLike) -> None:
        self._spool = spool
        self._stream = SpoolStreamReader(spool, max_segments_per_partition=64)

    def partitions(self) -> Sequence[InputPartition]:
        stream = self._stream
        everything = admitted_offset(self._spool, {}, hold_back=False)
        return stream.partitions(stream.initialOffset(), everything)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return self._stream.read(partition)


def _with_stream_columns(
    batch: pa.RecordBatch, receiver: str, heartbeat_ms: int, prior_heartbeat_ms: int
) -> pa.RecordBatch:
    n = batch.num_rows
    added = [  # no Python list per row: 100k rows a segment at 100k series
        pa.repeat(pa.scalar(receiver, pa.string()), n),
        pa.repeat(pa.scalar(heartbeat_ms, pa.int64()), n),
        pa.repeat(pa.scalar(prior_heartbeat_ms, pa.int64()), n),
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


def catch_up_bound(
    pending: dict[str, list[SegmentInfo]], newest: dict[str, Heartbeat]
) -> int | None:
    """The highest heartbeat a batch behind the log may take (None: no bound, it keeps up).

    After a restart, or when a fresh checkpoint recomputes from the retained log, the new
    segments can span hours; read as one batch, at 100k series, they would not fit in the
    driver. A batch then takes ``CATCH_UP_SPAN_MS`` of heartbeats from the oldest new
    segment of any stream, all streams alike (so none runs ahead of another), and the job
    catches up batch by batch. The stream holding that oldest segment always gets it, so each
    batch moves on even across a gap in the heartbeats (the daemon was down)."""
    firsts = [read_heartbeat(segments[0]).heartbeat_ms if len(segments) > 1
              else newest[receiver].heartbeat_ms
              for receiver, segments in pending.items()]  # fmt: skip
    floor = min(firsts)
    if max(newest[receiver].heartbeat_ms for receiver in pending) - floor <= CATCH_UP_SPAN_MS:
        return None
    return floor + CATCH_UP_SPAN_MS


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
        return SpoolStreamReader(spool, per_partition, QuietLane.from_options(self.options))


def admitted_offset(
    spool: SpoolLike, start: dict[str, Any], *, hold_back: bool = True
) -> dict[str, Any]:
    """The offset after ``start`` that admits every new segment (``hold_back``: except those
    ahead of the slowest open receiver, ``admission_bounds``, and those past a catch-up
    batch's span, ``catch_up_bound``): what the source's ``latestOffset`` offers
    (``hold_back=False``: every segment, what ``replay`` reads).
    """
    return admitted_offsets(spool, start, hold_back=hold_back)[0]


def admitted_offsets(
    spool: SpoolLike, start: dict[str, Any], *, hold_back: bool = True
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``admitted_offset``, and the offset without the catch-up span (the same when the
    reader keeps up), from one listing of the log."""
    known: dict[str, Any] = dict(start.get("receivers", {}))
    pending: dict[str, list[SegmentInfo]] = {}
    newest: dict[str, Heartbeat] = {
        name: Heartbeat(int(p["heartbeat_ms"]), bool(p.get("closed")))
        for name, p in known.items()
    }
    for receiver in list_receivers(spool):
        previous = known.get(receiver, {"seq": -1})
        segments = segments_after(spool, receiver, previous["seq"])
        if segments:
            pending[receiver] = segments
            newest[receiver] = read_heartbeat(segments[-1])
    bounds = admission_bounds(newest) if hold_back else {}
    whole = _admit(known, pending, newest, bounds)
    cap = catch_up_bound(pending, newest) if hold_back and pending else None
    if cap is None:
        return whole, whole
    capped: dict[str, int | None] = {}
    for receiver in pending:
        bound = bounds.get(receiver)
        capped[receiver] = cap if bound is None else min(cap, bound)
    return _admit(known, pending, newest, capped), whole


def _admit(
    known: dict[str, Any], pending: dict[str, list[SegmentInfo]],
    newest: dict[str, Heartbeat], bounds: dict[str, int | None],
) -> dict[str, Any]:  # fmt: skip
    """The offset that moves each receiver of ``known`` to its last segment within its
    bound."""
    admitted_to = dict(known)
    for receiver, segments in pending.items():
        admitted = _admitted(segments, newest[receiver], bounds.get(receiver))
        if admitted is not None:
            segment, heartbeat = admitted
            admitted_to[receiver] = {
                "seq": segment.sequence,
                "heartbeat_ms": heartbeat.heartbeat_ms,
                "closed": heartbeat.closed,
            }
    return {"receivers": admitted_to}


def batch_heartbeats(checkpoint: Path, batch_id: int) -> dict[str, dict[str, Any]]:
    """The per-receiver offsets Spark logged for ``batch_id`` (written before the batch ran).

    The offset log format is ``v1``, a metadata line, then one JSON line per source.
    """
    lines = (checkpoint / "offsets" / str(batch_id)).read_text().splitlines()
    offset = json.loads(lines[-1])
    receivers: dict[str, dict[str, Any]] = offset.get("receivers", {})
    return receivers


def segments_between(spool: SpoolLike, receiver: str, after: int, upto: int) -> list[SegmentInfo]:
    """Segments ``after < sequence <= upto`` of a stream an offset admitted: every one of
    them is there (admitted, not yet committed), so no listing unless ``after`` < 0."""
    if after < 0:
        return list_segments(spool, receiver, after, upto)
    return [segment_at(spool, receiver, seq) for seq in range(after + 1, upto + 1)]


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


def every_receiver_closed(receivers: dict[str, dict[str, Any]]) -> bool:
    """Whether there are receivers and every one has stopped cleanly (its last segment
    ``closed``): all the data is in."""
    return bool(receivers) and all(r.get("closed") for r in receivers.values())


assert [f.name for f in SEGMENT_SCHEMA] == [
    part.split()[0] for part in SOURCE_DDL.split(", ")
][:-_ADDED_COLUMNS], "SOURCE_DDL must list SEGMENT_SCHEMA's columns in order"
