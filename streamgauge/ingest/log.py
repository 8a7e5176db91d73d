"""The segment log: the durable contract between ingest and the Spark job.

Layout: ``<spool>/<receiver>/<sequence:012d>.arrow``, one ordered stream per receiver. Each
segment is an Arrow IPC file of pane partials (``SEGMENT_SCHEMA``) written under a temporary
name, fsynced, then renamed, so a reader never sees a torn segment: a file with the final
name is complete. A crash leaves at most a ``.tmp`` file, which was never part of the log and
is removed when the receiver restarts.

Every segment carries, in its schema metadata, the receiver's **heartbeat**: "no event earlier
than ``heartbeat_ms`` will come from this receiver any more" (and ``closed`` when the receiver
shut down cleanly). The job's watermark is derived from these, so windows close while input is
idle.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

#: One row per (metric, type, tags, pane): what ingest has already combined.
SEGMENT_SCHEMA = pa.schema(
    [
        pa.field("metric", pa.string()),
        pa.field("metric_type", pa.string()),
        pa.field("tags", pa.string()),  # canonical JSON object, sorted keys
        pa.field("pane_start_ms", pa.int64()),
        pa.field("count", pa.int64()),  # samples received (not scaled)
        pa.field("sum", pa.float64()),  # counters: scaled by 1/sample rate
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

_SEGMENT_NAME = re.compile(r"^(\d{12})\.arrow$")
_RECEIVER_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    receiver: str
    sequence: int
    path: Path


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """What a segment says about its receiver's progress."""

    heartbeat_ms: int
    closed: bool


def validate_receiver_name(name: str) -> str:
    if not _RECEIVER_NAME.fullmatch(name):
        raise ValueError(
            f"receiver name {name!r} must use only letters, digits, '_', '.', '-': "
            "it becomes a directory name in the spool"
        )
    return name


class SegmentWriter:
    """Appends segments to one receiver's stream; the only writer of that stream."""

    def __init__(self, spool: Path, receiver: str, *, fsync: bool = True) -> None:
        self._dir = spool / validate_receiver_name(receiver)
        self._dir.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync
        for leftover in self._dir.glob("*.tmp"):
            # A temporary file from a crash was never renamed, so never part of the log.
            leftover.unlink()
        existing = list_segments(spool, receiver)
        self._next_sequence = existing[-1].sequence + 1 if existing else 0

    @property
    def receiver(self) -> str:
        return self._dir.name

    @property
    def next_sequence(self) -> int:
        return self._next_sequence

    def append(self, batch: pa.RecordBatch, heartbeat: Heartbeat) -> SegmentInfo:
        """Write one segment atomically and return where it is."""
        if batch.schema != SEGMENT_SCHEMA:
            batch = pa.RecordBatch.from_arrays(batch.columns, schema=SEGMENT_SCHEMA)
        sequence = self._next_sequence
        final = self._dir / f"{sequence:012d}.arrow"
        temporary = self._dir / f".{sequence:012d}.arrow.tmp"
        metadata = {
            b"heartbeat_ms": str(heartbeat.heartbeat_ms).encode(),
            b"closed": b"1" if heartbeat.closed else b"0",
        }
        schema = SEGMENT_SCHEMA.with_metadata(metadata)
        with open(temporary, "wb") as sink:
            with pa.ipc.new_file(sink, schema) as writer:
                writer.write_batch(batch.replace_schema_metadata(metadata))
            sink.flush()
            if self._fsync:
                os.fsync(sink.fileno())
        os.rename(temporary, final)
        if self._fsync:
            _fsync_directory(self._dir)
        self._next_sequence = sequence + 1
        return SegmentInfo(self._dir.name, sequence, final)


def _fsync_directory(path: Path) -> None:
    """Make the rename itself durable (POSIX: a rename is persisted by syncing the directory)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def list_receivers(spool: Path) -> list[str]:
    if not spool.exists():
        return []
    names = (p.name for p in spool.iterdir() if p.is_dir())
    return sorted(name for name in names if _RECEIVER_NAME.fullmatch(name))


def list_segments(
    spool: Path, receiver: str, after: int = -1, upto: int | None = None
) -> list[SegmentInfo]:
    """Complete segments of one stream with ``after < sequence <= upto``, in order."""
    directory = spool / receiver
    if not directory.exists():
        return []
    found: list[SegmentInfo] = []
    for entry in os.scandir(directory):
        match = _SEGMENT_NAME.match(entry.name)
        if match is None:
            continue
        sequence = int(match.group(1))
        if sequence > after and (upto is None or sequence <= upto):
            found.append(SegmentInfo(receiver, sequence, Path(entry.path)))
    found.sort(key=lambda s: s.sequence)
    return found


def read_heartbeat(path: Path) -> Heartbeat:
    """Read only the schema metadata of a segment (cheap: the footer, no row data)."""
    with pa.memory_map(str(path)) as source:
        metadata = pa.ipc.open_file(source).schema.metadata or {}
    return Heartbeat(int(metadata.get(b"heartbeat_ms", b"0")), metadata.get(b"closed") == b"1")


def read_segment(path: Path) -> Iterator[pa.RecordBatch]:
    with pa.memory_map(str(path)) as source:
        reader = pa.ipc.open_file(source)
        for index in range(reader.num_record_batches):
            yield conform_segment(reader.get_batch(index).replace_schema_metadata(None))


def describe_spool(spool: Path) -> dict[str, dict[str, int | bool | None]]:
    """Per receiver: segment count, last sequence and heartbeat; for `streamgauge status`."""
    summary: dict[str, dict[str, int | bool | None]] = {}
    for receiver in list_receivers(spool):
        segments = list_segments(spool, receiver)
        heartbeat = read_heartbeat(segments[-1].path) if segments else None
        summary[receiver] = {
            "segments": len(segments),
            "last_sequence": segments[-1].sequence if segments else None,
            "heartbeat_ms": heartbeat.heartbeat_ms if heartbeat else None,
            "closed": heartbeat.closed if heartbeat else None,
        }
    return summary
