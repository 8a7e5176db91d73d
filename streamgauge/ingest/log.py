"""The segment log: the durable contract between ingest and the Spark job.

Layout: ``<spool>/<receiver>/<sequence:012d>.arrow``, one ordered stream per receiver. Each
segment is an Arrow IPC file of pane partials (``SEGMENT_SCHEMA``). A reader never sees a torn
segment: a file with the final name is complete. In a local directory a segment is written
under a temporary name, fsynced, then renamed; a crash leaves at most a ``.tmp`` file, which was
never part of the log and is removed when the receiver restarts. On an object store
(``--spool s3://…``) it is uploaded to its final key in one request, which appears whole or not
at all (``spool_fs``: the storage side of every function here).

Every segment carries, in its schema metadata, the receiver's **heartbeat**: "no event earlier
than ``heartbeat_ms`` will come from this receiver any more" (and ``closed`` when the receiver
shut down cleanly). The job's watermark is derived from these, so windows close while input is
idle.
"""

from __future__ import annotations

import collections
import errno
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.ingest.spool_fs import Spool, SpoolLike, SpoolPath, resolve_spool
from streamgauge.redaction import redact_secrets_in

#: One row per (metric, type, tags, pane): what ingest has already combined.
SEGMENT_SCHEMA = pa.schema(
    [
        pa.field("metric", pa.string()),
        pa.field("metric_type", pa.string()),
        pa.field("tags", pa.string()),  # canonical JSON object, sorted keys
        pa.field("pane_start_ms", pa.int64()),
        # samples received; ms/h/d: the values they stand for (protocol.sample_weight: a
        # value sent at @0.5 counts 2), which the sketches below weigh the same
        pa.field("count", pa.int64()),
        pa.field("sum", pa.float64()),  # counters: scaled by 1/sample rate; ms/h/d: weighted
        pa.field("min", pa.float64()),
        pa.field("max", pa.float64()),
        pa.field("last", pa.float64()),  # gauges: value after the pane
        pa.field("last_event_ms", pa.int64()),
        pa.field("first_recv_ms", pa.int64()),
        pa.field("last_recv_ms", pa.int64()),
        # Sketches of the pane's values (streamgauge.sketches), NULL where the type has none:
        # ms/h/d: a serialized t-digest; s: a serialized HLL_8 of the members.
        pa.field("sketch", pa.binary()),
        # ms/h/d: the HDR histogram as sparse rows (sorted bucket indices, counts).
        pa.field("hdr_bucket", pa.list_(pa.int32())),
        pa.field("hdr_count", pa.list_(pa.int64())),
        # ms/h/d, when a window of the config has quantiles: kll: a serialized KLL doubles
        # sketch of the values (the window job merges them, sketches.kll_columns); NULL otherwise.
        pa.field("kll", pa.binary()),
    ]
)


def conform_segment(batch: pa.RecordBatch) -> pa.RecordBatch:
    """A batch in today's ``SEGMENT_SCHEMA``: segments written before a column existed get it
    as NULLs, so a spool survives an upgrade (columns are only ever appended, nullable)."""
    if batch.schema.names == SEGMENT_SCHEMA.names:
        return batch
    columns = [
        batch.column(field.name) if field.name in batch.schema.names
        else pa.nulls(batch.num_rows, field.type)
        for field in SEGMENT_SCHEMA
    ]  # fmt: skip
    return pa.RecordBatch.from_arrays(columns, schema=SEGMENT_SCHEMA)

#: How far past the receive clock a sample's ``|T`` may lie and still be its event time (a
#: receiver's ``max_skew_ms`` default): so a row's pane may start up to this long after the
#: heartbeat of the segment it is in.
DEFAULT_MAX_SKEW_MS = 10 * 60_000

_SEGMENT_NAME = re.compile(r"^(\d{12})\.arrow$")
_RECEIVER_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    receiver: str
    sequence: int
    #: A ``Path`` on a local spool (as before object stores); a key on an object store.
    path: SpoolPath
    #: The spool it is in: how to open it (``read_heartbeat``, ``read_segment`` take the info).
    spool: Spool = field(compare=False, repr=False, kw_only=True)

    def exists(self) -> bool:
        return self.spool.exists(self.path)


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What a segment says about its receiver's progress."""

    heartbeat_ms: int
    closed: bool


@dataclass(frozen=True, slots=True)
class SegmentContents:
    """Which rows a segment holds, in brief: read from its footer, so a reader can tell
    whether a segment has anything for it without reading the rows (``read_contents``)."""

    metric_types: frozenset[str]
    #: The smallest and largest ``pane_start_ms`` of its rows; None: no rows (heartbeat only).
    pane_range_ms: tuple[int, int] | None
    #: How many rows; None: not said (a segment written before the footer carried it).
    rows: int | None = None


def contents_of(batch: pa.RecordBatch | pa.Table) -> SegmentContents:
    """What ``batch`` (segment rows) holds: its metric types and the range of its panes."""
    if batch.num_rows == 0:
        return SegmentContents(frozenset(), None, 0)
    types = pc.unique(batch.column("metric_type")).to_pylist()
    panes = pc.min_max(batch.column("pane_start_ms")).as_py()
    return SegmentContents(
        frozenset(t for t in types if t is not None), (int(panes["min"]), int(panes["max"])),
        batch.num_rows,
    )  # fmt: skip


def _contents_metadata(contents: SegmentContents) -> dict[bytes, bytes]:
    panes = contents.pane_range_ms
    return {
        b"metric_types": ",".join(sorted(contents.metric_types)).encode(),
        b"pane_range_ms": b"" if panes is None else f"{panes[0]},{panes[1]}".encode(),
        **({} if contents.rows is None else {b"rows": str(contents.rows).encode()}),
    }


def validate_receiver_name(name: str) -> str:
    if not _RECEIVER_NAME.fullmatch(name):
        raise ValueError(
            f"receiver name {name!r} must use only letters, digits, '_', '.', '-': "
            "it becomes a directory name in the spool"
        )
    return name


class SegmentWriter:
    """Appends segments to one receiver's stream; the only writer of that stream."""

    def __init__(self, spool: SpoolLike | Spool, receiver: str, *, fsync: bool = True) -> None:
        self._spool = resolve_spool(spool)
        self._receiver = validate_receiver_name(receiver)
        self._fsync = fsync
        # A temporary file from a crash was never renamed, so never part of the log.
        self._spool.prepare(self._receiver)
        existing = list_segments(self._spool, receiver)
        self._next_sequence = existing[-1].sequence + 1 if existing else 0
        self.last_bytes = 0  # size of the last segment written

    @property
    def receiver(self) -> str:
        return self._receiver

    @property
    def spool(self) -> Spool:
        return self._spool

    @property
    def next_sequence(self) -> int:
        return self._next_sequence

    def append(self, batch: pa.RecordBatch, heartbeat: Heartbeat) -> SegmentInfo:
        """Write one segment atomically and return where it is."""
        if batch.schema != SEGMENT_SCHEMA:
            batch = pa.RecordBatch.from_arrays(batch.columns, schema=SEGMENT_SCHEMA)
        sequence = self._next_sequence
        metadata = {
            b"heartbeat_ms": str(heartbeat.heartbeat_ms).encode(),
            b"closed": b"1" if heartbeat.closed else b"0",
            **_contents_metadata(contents_of(batch)),
        }
        schema = SEGMENT_SCHEMA.with_metadata(metadata)

        def encode(sink: pa.NativeFile) -> None:
            with pa.ipc.new_file(sink, schema) as writer:
                writer.write_batch(batch.replace_schema_metadata(metadata))

        # A failed write (a full disk) leaves nothing under the final name and does not use
        # up the sequence number, so the stream stays gapless.
        path, self.last_bytes = self._spool.write_with(
            self._receiver, segment_name(sequence), encode, fsync=self._fsync
        )
        self._next_sequence = sequence + 1
        return SegmentInfo(self._receiver, sequence, path, spool=self._spool)


def segment_name(sequence: int) -> str:
    return f"{sequence:012d}.arrow"


def list_receivers(spool: SpoolLike | Spool) -> list[str]:
    names = resolve_spool(spool).list_dirs()
    return sorted(name for name in names if _RECEIVER_NAME.fullmatch(name))


def list_segments(
    spool: SpoolLike | Spool, receiver: str, after: int = -1, upto: int | None = None
) -> list[SegmentInfo]:
    """Complete segments of one stream with ``after < sequence <= upto``, in order.

    Lists the whole stream: a reader that follows it uses ``segments_after``."""
    where = resolve_spool(spool)
    found: list[SegmentInfo] = []
    for name in where.list_names(receiver):
        match = _SEGMENT_NAME.match(name)
        if match is None:
            continue
        sequence = int(match.group(1))
        if sequence > after and (upto is None or sequence <= upto):
            found.append(SegmentInfo(receiver, sequence, where.path(receiver, name), spool=where))
    found.sort(key=lambda s: s.sequence)
    return found


def segments_after(spool: SpoolLike | Spool, receiver: str, after: int) -> list[SegmentInfo]:
    """The complete segments of one stream after sequence ``after``, in order, found by
    asking for ``after + 1``, ``after + 2``... until one is not there: a stream is gapless
    (``SegmentWriter``), and retention only removes segments every query has read, so the
    cost is one lookup per new segment, where ``list_segments`` lists the whole stream
    (a day of 250 ms segments is 345k files). ``after`` < 0: the stream is listed once."""
    if after < 0:
        return list_segments(spool, receiver)
    where = resolve_spool(spool)
    found: list[SegmentInfo] = []
    while (segment := segment_at(where, receiver, after + 1 + len(found))).exists():
        found.append(segment)
    return found


def segment_at(spool: SpoolLike | Spool, receiver: str, sequence: int) -> SegmentInfo:
    """Where segment ``sequence`` of a stream is (whether or not it exists)."""
    where = resolve_spool(spool)
    return SegmentInfo(
        receiver, sequence, where.path(receiver, segment_name(sequence)), spool=where
    )


def segment_path(spool: SpoolLike | Spool, receiver: str, sequence: int) -> SpoolPath:
    """Where segment ``sequence`` of a stream is: a ``Path`` on a local spool."""
    return segment_at(spool, receiver, sequence).path


def _open(segment: SegmentInfo | Path) -> pa.NativeFile:
    """A local ``Path`` (as tests and tools pass ``SegmentInfo.path``) or a segment of any spool."""
    if isinstance(segment, SegmentInfo):
        return segment.spool.open(segment.path)
    return pa.memory_map(str(segment))


def read_heartbeat(segment: SegmentInfo | Path) -> Heartbeat:
    """Read only the schema metadata of a segment (cheap: the footer, no row data)."""
    with _open(segment) as source:
        return _heartbeat_in(pa.ipc.open_file(source).schema.metadata or {})


def _heartbeat_in(metadata: dict[bytes, bytes]) -> Heartbeat:
    return Heartbeat(int(metadata.get(b"heartbeat_ms", b"0")), metadata.get(b"closed") == b"1")


def read_contents(segment: SegmentInfo | Path) -> tuple[SegmentContents, Heartbeat]:
    """A segment's ``SegmentContents`` and heartbeat, from its footer; a segment written
    before the footer said so (no ``metric_types``) has its two columns read instead."""
    with _open(segment) as source:
        reader = pa.ipc.open_file(source)
        metadata = reader.schema.metadata or {}
        heartbeat = _heartbeat_in(metadata)
        if b"metric_types" in metadata:
            types = metadata[b"metric_types"].decode()
            panes = metadata.get(b"pane_range_ms", b"").decode()
            low, _, high = panes.partition(",")
            rows = metadata.get(b"rows")
            return SegmentContents(
                frozenset(types.split(",")) if types else frozenset(),
                (int(low), int(high)) if panes else None,
                None if rows is None else int(rows),
            ), heartbeat
        # Every column is mapped; locally only the pages contents_of touches are read, but
        # from an object store the whole segment is fetched (once: the source keeps the answer).
        rows = reader.read_all()
    return contents_of(rows), heartbeat


def read_segment(segment: SegmentInfo | Path) -> Iterator[pa.RecordBatch]:
    with _open(segment) as source:
        reader = pa.ipc.open_file(source)
        for index in range(reader.num_record_batches):
            yield conform_segment(reader.get_batch(index).replace_schema_metadata(None))


def describe_spool(spool: SpoolLike | Spool) -> dict[str, dict[str, int | bool | None]]:
    """Per receiver: segment count, last sequence and heartbeat; for `streamgauge status`."""
    summary: dict[str, dict[str, int | bool | None]] = {}
    for receiver in list_receivers(spool):
        segments = list_segments(spool, receiver)
        heartbeat = read_heartbeat(segments[-1]) if segments else None
        summary[receiver] = {
            "segments": len(segments),
            "last_sequence": segments[-1].sequence if segments else None,
            "heartbeat_ms": heartbeat.heartbeat_ms if heartbeat else None,
            "closed": heartbeat.closed if heartbeat else None,
        }
    return summary


def first_heartbeats(spool: SpoolLike | Spool) -> dict[str, int]:
    """Per receiver with segments, the heartbeat of its oldest one still in the spool.

    A query on a new checkpoint reads every stream from there: what a late row of an older
    checkpoint was recorded from is read again if its segment came after that one.
    """
    first: dict[str, int] = {}
    for receiver in list_receivers(spool):
        segments = list_segments(spool, receiver)
        if segments:
            first[receiver] = read_heartbeat(segments[0]).heartbeat_ms
    return first


# -- writing off the receive thread, within a disk quota -----------------------------------------

_log = logging.getLogger(__name__)

#: Rows of the receiver's own metrics (``streamgauge.ingest.*``) are written even when the
#: quota refuses a segment's data: a few rows per roll, so the refusal reaches the store.
SELF_METRIC_PREFIX = "streamgauge.ingest."  # a receiver's own rows (not streamgauge.overflow.*)
#: Reasons a segment's partials were refused, as counted in ``WriterCounts.refused_*``.
REFUSED_SPOOL_QUOTA = "spool_quota"  # the spool holds --spool-quota bytes or more
REFUSED_DISK_FULL = "disk_full"  # the file system said ENOSPC / EDQUOT
REFUSED_SPOOL_UNAVAILABLE = "spool_unavailable"  # the object store did not take the segment
#: Waits before the retries of a segment the object store did not take (then it is refused).
UNAVAILABLE_RETRY_S = (0.5, 1.0, 2.0, 4.0)
#: The receiver's own rows carried from unwritten segments into the next (a few per roll).
CARRY_MAX_ROWS = 50_000
DEFAULT_WRITE_QUEUE_DEPTH = 4
SPOOL_RESCAN_MS = 5_000


@dataclass(slots=True)
class WriterCounts:
    """What the segment queue did since the last ``take_counts`` (for self-metrics)."""

    #: partials (rows) and samples (their ``count``) not written, by reason
    refused_partials: collections.Counter[str] = field(default_factory=collections.Counter)
    refused_samples: collections.Counter[str] = field(default_factory=collections.Counter)
    backpressure: int = 0  # appends that found the queue full and waited for the writer
    blocked_ms: int = 0  # how long those appends waited, in total
    segments_written: int = 0
    bytes_written: int = 0


class SpoolUsage:
    """Bytes held by the spool (every receiver's stream, temporaries included).

    A scan stats every file, so it runs at most every ``rescan_ms``; in between, the segments
    written through ``add`` are counted as they happen. Other processes' writes and the
    janitor's deletions show up at the next scan: the quota is enforced within one rescan
    interval of the truth, and a receiver resumes at most that long after space frees.
    """

    def __init__(
        self,
        spool: SpoolLike | Spool,
        rescan_ms: int = SPOOL_RESCAN_MS,
        monotonic_ms: Callable[[], int] = lambda: time.monotonic_ns() // 1_000_000,
    ) -> None:
        self._spool = spool
        self._rescan_ms = rescan_ms
        self._monotonic_ms = monotonic_ms
        self._bytes = 0
        self._next_scan_ms: int | None = None

    def used(self) -> int:
        now = self._monotonic_ms()
        if self._next_scan_ms is None or now >= self._next_scan_ms:
            self._bytes = spool_bytes(self._spool)
            self._next_scan_ms = now + self._rescan_ms
        return self._bytes

    def add(self, written: int) -> None:
        self._bytes += written


def spool_bytes(spool: SpoolLike | Spool) -> int:
    """Total size of the files in the spool's stream directories."""
    where = resolve_spool(spool)
    return sum(where.directory_bytes(receiver) for receiver in list_receivers(where))


class BatchBuilder(Protocol):
    """A segment's rows not built yet (``combiner.PaneDrain``): the writer thread builds them,
    so the receive loop does not."""

    def build(self) -> pa.RecordBatch: ...


class SegmentQueue:
    """Writes a receiver's segments on a writer thread, in order, within a disk quota.

    The receive loop detaches its combiner's partials and ``append``s them with their
    heartbeat; the writer thread builds each batch (``BatchBuilder``) and writes the segments
    (temporary name, fsync, rename) in the order they were appended, so the loop goes back to
    its socket instead of waiting for either. A heartbeat stays true: every batch appended
    later holds only data received later, and is written later under a higher sequence
    number.

    ``depth`` batches may be queued (the one being written included). An append that finds
    the queue full waits for the writer — backpressure: the socket buffer takes the input
    meanwhile — and is counted with the time it waited; nothing is dropped. ``depth=0``
    writes in the caller's thread (tests and tools that read the log right after a roll).

    ``quota_bytes`` (0 = none): while the spool holds that much or more, a segment's partials
    are refused and counted (``spool_quota``), except the receiver's own ``streamgauge.*``
    rows; the segment is still written with them and its heartbeat, so windows keep closing
    and the refusal itself reaches the store. A file system that is full refuses the whole
    segment (``disk_full``). Writing resumes when retention frees space.

    An object store that fails a segment (unreachable, erroring) gets it again after each of
    ``unavailable_retry_s``; if it still fails, the segment is refused and counted
    (``spool_unavailable``) and the next one is tried once, until one is taken. A local
    spool's other errors stop the receiver: there is nothing to wait for.
    """

    def __init__(
        self,
        writer: SegmentWriter,
        *,
        depth: int = DEFAULT_WRITE_QUEUE_DEPTH,
        quota_bytes: int = 0,
        usage: SpoolUsage | None = None,
        unavailable_retry_s: tuple[float, ...] = UNAVAILABLE_RETRY_S,
    ) -> None:
        if depth < 0:
            raise ValueError(f"segment queue depth must be >= 0, got {depth}")
        if quota_bytes < 0:
            raise ValueError(f"spool quota must be >= 0 bytes (0 = none), got {quota_bytes}")
        self._writer = writer
        self._depth = depth
        self._quota = quota_bytes
        self._usage = usage if usage is not None else SpoolUsage(writer.spool)
        self._cond = threading.Condition()
        self._pending: collections.deque[tuple[pa.RecordBatch | BatchBuilder, Heartbeat]] = (
            collections.deque())
        self._counts = WriterCounts()
        self._error: BaseException | None = None
        self._closing = False
        self._refusing: str | None = None  # the reason, while refusing (for the log)
        self._unavailable_retry_s = unavailable_retry_s
        self._unavailable = False  # the object store failed the last segment: no retries
        self._carried: pa.RecordBatch | None = None  # own rows of a segment not written
        self._thread: threading.Thread | None = None
        if depth > 0:
            self._thread = threading.Thread(
                target=self._run, name=f"segment-writer-{writer.receiver}", daemon=True
            )
            self._thread.start()

    @property
    def receiver(self) -> str:
        return self._writer.receiver

    @property
    def thread_id(self) -> int | None:
        """The writer thread's native id (None: ``depth`` 0, segments written in ``append``)."""
        return None if self._thread is None else self._thread.native_id

    @property
    def writer(self) -> SegmentWriter:
        return self._writer

    def append(self, batch: pa.RecordBatch | BatchBuilder, heartbeat: Heartbeat) -> None:
        """Queue one segment (its batch, or what builds it on the writer thread); waits
        (counted) while ``depth`` are queued already. Raises what made the writer thread
        fail, if it did."""
        if self._thread is None:
            self._write(batch, heartbeat)
            return
        with self._cond:
            self._raise_failure()
            if self._closing:
                raise RuntimeError(f"segment queue of {self.receiver} is closed")
            if len(self._pending) >= self._depth:
                started = time.monotonic_ns()
                self._counts.backpressure += 1
                while len(self._pending) >= self._depth and self._error is None:
                    self._cond.wait()
                self._counts.blocked_ms += (time.monotonic_ns() - started) // 1_000_000
                self._raise_failure()
            self._pending.append((batch, heartbeat))
            self._cond.notify_all()

    def flush(self) -> None:
        """Wait until every appended segment is written."""
        with self._cond:
            while self._pending and self._error is None:
                self._cond.wait()
            self._raise_failure()

    def close(self) -> None:
        """Write what is queued, then stop the writer thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
        with self._cond:
            self._raise_failure()

    def take_counts(self) -> WriterCounts:
        with self._cond:
            counts, self._counts = self._counts, WriterCounts()
        return counts

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"segment writer of {self.receiver} failed") from self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closing:
                    self._cond.wait()
                if not self._pending:
                    return  # closing, and everything is written
                batch, heartbeat = self._pending[0]
            try:
                self._write(batch, heartbeat)
            except BaseException as error:  # reported to the receive loop by its next call
                with self._cond:
                    self._error = error
                    self._cond.notify_all()
                return
            with self._cond:
                self._pending.popleft()
                self._cond.notify_all()

    def _write(self, pending: pa.RecordBatch | BatchBuilder, heartbeat: Heartbeat) -> None:
        batch = pending if isinstance(pending, pa.RecordBatch) else pending.build()
        if self._carried is not None:
            batch = pa.concat_batches([self._carried, batch.cast(self._carried.schema)])
            self._carried = None
        refused_now = False
        if self._quota and self._usage.used() + batch.nbytes > self._quota:
            refused_now = True
            own = pc.starts_with(batch.column("metric"), SELF_METRIC_PREFIX)
            self._refuse(batch.filter(pc.invert(own)), REFUSED_SPOOL_QUOTA)
            batch = batch.filter(own)
        try:
            self._append_retrying(batch, heartbeat)
        except OSError as error:
            if error.errno in (errno.ENOSPC, errno.EDQUOT):
                # The disk filled up under us (other files, or no --spool-quota): refuse and
                # count, the stream stays gapless, the next segment carries a later heartbeat.
                self._refuse_keeping_own_rows(batch, REFUSED_DISK_FULL)
                return
            if self._writer.spool.renames:
                raise  # a local file system failing otherwise: stop, do not guess
            if not self._unavailable:  # logged when it starts, not every roll
                spool = self._writer.spool
                reason = redact_secrets_in(str(error).splitlines()[0], spool.location)
                _log.warning("%s: the spool %s did not take a segment: %s", self.receiver,
                             spool, reason)  # fmt: skip
            self._unavailable = True
            self._refuse_keeping_own_rows(batch, REFUSED_SPOOL_UNAVAILABLE)
            return
        self._unavailable = False
        written = self._writer.last_bytes
        self._usage.add(written)
        if self._refusing is not None and batch.num_rows and not refused_now:
            _log.warning("%s: writing new data again", self.receiver)
            self._refusing = None
        with self._cond:
            self._counts.segments_written += 1
            self._counts.bytes_written += written

    def _append_retrying(self, batch: pa.RecordBatch, heartbeat: Heartbeat) -> None:
        """Write one segment; on an object store that fails it, retry after each wait of
        ``unavailable_retry_s`` (the queue fills meanwhile: backpressure, counted), unless the
        store failed the previous segment too (then once: a long outage must not hold every
        roll for the whole schedule). A local spool is not retried: its errors are final."""
        waits = () if self._writer.spool.renames or self._unavailable else self._unavailable_retry_s
        for wait_s in waits:
            try:
                self._writer.append(batch, heartbeat)
                return
            except OSError as error:
                if error.errno in (errno.ENOSPC, errno.EDQUOT):
                    raise
                time.sleep(wait_s)
        self._writer.append(batch, heartbeat)

    def _refuse_keeping_own_rows(self, batch: pa.RecordBatch, reason: str) -> None:
        """Refuse a segment that could not be written, but carry the receiver's own rows
        (its counts, the refusals among them) into the next one, up to ``CARRY_MAX_ROWS``,
        so that the store learns what was refused once writing resumes. They are not late
        there: the heartbeat of the refused segment was never written either."""
        own = pc.starts_with(batch.column("metric"), SELF_METRIC_PREFIX)
        self._refuse(batch.filter(pc.invert(own)), reason)
        own_rows = batch.filter(own)
        dropped = max(0, own_rows.num_rows - CARRY_MAX_ROWS)  # the oldest go, counted
        self._refuse(own_rows.slice(0, dropped), reason)
        kept = own_rows.slice(dropped)
        self._carried = kept if kept.num_rows else None

    def _refuse(self, refused: pa.RecordBatch, reason: str) -> None:
        if not refused.num_rows:
            return
        samples = pc.sum(refused.column("count")).as_py() or 0
        with self._cond:
            self._counts.refused_partials[reason] += refused.num_rows
            self._counts.refused_samples[reason] += samples
        if reason != self._refusing:  # logged when it starts, not every roll
            _log.warning("%s: refusing new data (%s): counted as streamgauge.ingest.refused",
                         self.receiver, reason)
            self._refusing = reason
