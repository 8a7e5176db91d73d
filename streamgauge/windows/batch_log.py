"""The partials of a micro-batch, read by the driver from the segments its offsets name.

``docs/architecture.md`` §3, decision D1: Spark logs a batch's end offsets (per receiver, the
last segment sequence and its heartbeat) before it runs the batch; the segments between the
previous batch's offsets and these are exactly the batch's input. They are read here as
Arrow IPC, with the stream columns the job's rules need (``receiver``,
``segment_heartbeat_ms``, ``prior_heartbeat_ms``: the same rows the spool source gives
Spark), so no row crosses into the JVM.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from streamgauge.ingest.log import SEGMENT_SCHEMA, read_heartbeat, segment_at
from streamgauge.ingest.spool_fs import SpoolLike
from streamgauge.windows.source import SpoolStreamReader, batch_heartbeats
from streamgauge.windows.window_rows import ints_of

Receivers = dict[str, dict[str, Any]]

_SEGMENTS_PER_READ = 64


def batch_offsets(checkpoint: Path, batch_id: int) -> tuple[Receivers, Receivers]:
    """The offsets a batch starts after and ends at, as Spark logged them."""
    end = batch_heartbeats(checkpoint, batch_id)
    if batch_id == 0 or not (checkpoint / "offsets" / str(batch_id - 1)).exists():
        return {}, end
    return batch_heartbeats(checkpoint, batch_id - 1), end


def read_partials(spool: SpoolLike, start: Receivers, end: Receivers) -> pa.Table:
    """Every row of the segments after ``start`` up to ``end``, stream by stream in log
    order."""
    reader = SpoolStreamReader(spool, _SEGMENTS_PER_READ)
    batches = [
        batch
        for partition in reader.partitions({"receivers": start}, {"receivers": end})
        for batch in reader.read(partition)
    ]
    if not batches:
        return empty_partials()
    return pa.Table.from_batches(batches).combine_chunks()


def partials_since(
    spool: SpoolLike, end: Receivers, from_heartbeat_ms: int | None
) -> Iterator[pa.Table]:
    """The rows of every stream's segments up to ``end`` whose heartbeat is at least
    ``from_heartbeat_ms`` (None: all), in log order per stream: what a restarted job reads
    again to rebuild its open windows (decision D4)."""
    for receiver, position in sorted(end.items()):
        last = int(position["seq"])
        first = last + 1
        while first > 0 and from_heartbeat_ms is not None:
            segment = segment_at(spool, receiver, first - 1)
            if not segment.exists() or read_heartbeat(segment).heartbeat_ms < from_heartbeat_ms:
                break
            first -= 1
        if from_heartbeat_ms is None:
            first = 0
        if first > last:
            continue
        after = first - 1
        start = {} if after < 0 else {receiver: {"seq": after}}
        yield read_partials(spool, start, {receiver: position})


def empty_partials() -> pa.Table:
    """No rows, with the source's columns."""
    schema = SEGMENT_SCHEMA.append(pa.field("receiver", pa.string()))
    schema = schema.append(pa.field("segment_heartbeat_ms", pa.int64()))
    return schema.append(pa.field("prior_heartbeat_ms", pa.int64())).empty_table()


def segment_ranges(rows: pa.Table) -> list[tuple[int, int]]:
    """Row ranges of the segments a batch's partials come from, in order (a segment's rows
    share receiver and heartbeats)."""
    n = rows.num_rows
    if n == 0:
        return []
    receiver = np.asarray(rows.column("receiver").combine_chunks().dictionary_encode().indices)
    beat = ints_of(rows, "segment_heartbeat_ms")
    prior = ints_of(rows, "prior_heartbeat_ms")
    change = np.flatnonzero(
        (receiver[1:] != receiver[:-1]) | (beat[1:] != beat[:-1]) | (prior[1:] != prior[:-1])
    ) + 1
    bounds = np.concatenate([[0], change, [n]])
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True))
