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
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from streamgauge.ingest.log import (
    SEGMENT_SCHEMA,
    list_receivers,
    list_segments,
    read_heartbeat,
    read_segment,
)

SOURCE_NAME = "streamgauge_spool"

#: The Spark schema of the source: SEGMENT_SCHEMA, plus the receiver the row came from.
SOURCE_DDL = (
    "metric string, metric_type string, tags string, pane_start_ms bigint, count bigint, "
    "sum double, min double, max double, last double, last_event_ms bigint, "
    "first_recv_ms bigint, last_recv_ms bigint, "
    "sketch binary, hdr_bucket array<int>, hdr_count array<bigint>, "
    "receiver string, segment_heartbeat_ms bigint, prior_heartbeat_ms bigint"
)
_ADDED_COLUMNS = 3


class SegmentPartition(InputPartition):
    """A contiguous run of one receiver's segments; picklable (paths as strings).

    ``prior_heartbeat_ms`` is the heartbeat of the segment before the first one of the run.
    """

    def __init__(self, receiver: str, paths: list[str], prior_heartbeat_ms: int) -> None:
        super().__init__((receiver, paths, prior_heartbeat_ms))
        self.receiver = receiver
        self.paths = paths
        self.prior_heartbeat_ms = prior_heartbeat_ms


class SpoolStreamReader(DataSourceStreamReader):
    def __init__(self, spool: Path, max_segments_per_partition: int) -> None:
        self._spool = spool
        self._max_segments_per_partition = max_segments_per_partition

    def initialOffset(self) -> dict[str, Any]:
        return {"receivers": {}}

    def latestOffset(self, start: dict[str, Any], limit: Any) -> dict[str, Any]:  # noqa: N802
        known: dict[str, Any] = dict(start.get("receivers", {}))
        for receiver in list_receivers(self._spool):
            previous = known.get(receiver, {"seq": -1})
            segments = list_segments(self._spool, receiver, after=previous["seq"])
            if not segments:
                continue
            newest = segments[-1]
            heartbeat = read_heartbeat(newest.path)
            known[receiver] = {
                "seq": newest.sequence,
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
                prior = read_heartbeat(segments.pop(0).path).heartbeat_ms
            step = self._max_segments_per_partition
            for index in range(0, len(segments), step):
                run = segments[index : index + step]
                parts.append(SegmentPartition(receiver, [str(s.path) for s in run], prior))
                prior = read_heartbeat(run[-1].path).heartbeat_ms
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SegmentPartition)
        prior = partition.prior_heartbeat_ms
        for path in partition.paths:
            heartbeat = read_heartbeat(Path(path)).heartbeat_ms
            for batch in read_segment(Path(path)):
                if batch.num_rows:
                    yield _with_stream_columns(batch, partition.receiver, heartbeat, prior)
            prior = heartbeat


class SpoolBatchReader(DataSourceReader):
    """Every complete segment of every stream, with the same columns as the stream reader."""

    def __init__(self, spool: Path) -> None:
        self._stream = SpoolStreamReader(spool, max_segments_per_partition=64)

    def partitions(self) -> Sequence[InputPartition]:
        stream = self._stream
        return stream.partitions(stream.initialOffset(), stream.latestOffset({}, None))

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

    def commit(self, end: dict[str, Any]) -> None:
        """Retention of committed segments is owned by the ingest tier, not by the reader."""


class SpoolDataSource(DataSource):
    """``spark.readStream.format("streamgauge_spool").option("path", SPOOL).load()``."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> str:
        return SOURCE_DDL

    def reader(self, schema: StructType) -> DataSourceReader:
        """Batch reads (``spark.read``) see the whole retained log: `streamgauge replay`."""
        return SpoolBatchReader(Path(self.options["path"]))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        spool = Path(self.options["path"])
        per_partition = int(self.options.get("maxSegmentsPerPartition", "64"))
        return SpoolStreamReader(spool, per_partition)


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
