"""Retention: the segment log and the result store do not grow forever.

**Segment log.** A segment may be deleted only when it is older than the retention age
*and* every window query of the running config has committed a micro-batch that read past it
(``commits/<n>`` in the query's checkpoint, whose ``offsets/<n>`` names the last sequence per
receiver). The newest committed segment of each stream is always kept: the source reads its
heartbeat as the "prior heartbeat" of the next segment, which decides lateness. Retained
segments are what `streamgauge replay` can recompute from.

**Spool quota.** With ``quota_bytes``, a spool still above ``QUOTA_HIGH_WATER`` of it after
the age pass loses its oldest *committed* segments first, whatever their age, down to
``QUOTA_LOW_WATER`` of the quota. Pruning before the quota itself is reached keeps room for
the receivers, which refuse data over the quota: they refuse only when what the job has not
read fills it, not while committed segments wait for the next round. What the job has not
read is never deleted for the quota: the receivers refuse new data instead
(``streamgauge.ingest.refused{reason=spool_quota}``).

**Results.** Windows that ended before the retention age are deleted from
``window_results``, ``window_pending`` (their sketches with them) and ``late_events``, and old
``sink_batches`` records with them (a batch that old can no longer be replayed by Spark: its
segments are gone too); then the series no window refers to any more (``window_series``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from streamgauge.clock import Clock
from streamgauge.ingest.log import (
    SegmentInfo,
    list_receivers,
    list_segments,
    read_heartbeat,
    spool_bytes,
)
from streamgauge.ingest.spool_fs import Spool, SpoolLike, resolve_spool

log = logging.getLogger(__name__)

QUOTA_HIGH_WATER = 0.95  # the quota pass starts above this share of the quota...
QUOTA_LOW_WATER = 0.9  # ...and deletes down to this one


@dataclass(frozen=True)
class SpoolPruneReport:
    deleted: int
    kept_uncommitted: int
    bytes_freed: int


def committed_sequences(checkpoint: Path) -> dict[str, int] | None:
    """Per receiver, the last segment sequence a query has committed; None if nothing yet."""
    commits = checkpoint / "commits"
    if not commits.is_dir():
        return None
    batches = [int(p.name) for p in commits.iterdir() if p.name.isdigit()]
    if not batches:
        return None
    return offset_sequences(checkpoint / "offsets" / str(max(batches)))


def offset_sequences(offsets: Path) -> dict[str, int]:
    """Per receiver, the last sequence a batch's end offset names (``offsets/<n>``: ``v1``, a
    metadata line, then the source's offset as JSON)."""
    receivers = json.loads(offsets.read_text().splitlines()[-1]).get("receivers", {})
    return {name: int(position["seq"]) for name, position in receivers.items()}


#: A file in a quiet query's checkpoint (``windows.source.QuietLane``): per receiver, the last
#: segment whose footer it read and found nothing in to do yet (idle, or no batch due),
#: without running a batch, in the offsets' shape. Not a commit: retention keeps those
#: segments (the query's next batch reads them); ``segment_lag_ms`` and ``status`` count them
#: as done, so a lane waiting by design is not lag.
PASSED_OVER_FILE = "passed_over"


def done_sequences(checkpoint: Path) -> dict[str, int] | None:
    """Per receiver, the last sequence a query has committed or passed over (idle, quiet)."""
    committed = committed_sequences(checkpoint)
    if committed is None:
        return None
    try:
        passed = json.loads((checkpoint / PASSED_OVER_FILE).read_text()).get("receivers", {})
    except FileNotFoundError:
        return committed
    for name, position in passed.items():
        committed[name] = max(committed.get(name, -1), int(position["seq"]))
    return committed


def safe_sequences(checkpoints: Iterable[Path]) -> dict[str, int]:
    """Per receiver, the highest sequence every query has committed (the minimum over them).

    A receiver a query has not read at all is absent: nothing of it may be deleted.
    """
    safe: dict[str, int] | None = None
    for checkpoint in checkpoints:
        committed = committed_sequences(checkpoint)
        if committed is None:
            return {}
        if safe is None:
            safe = dict(committed)
        else:
            safe = {r: min(seq, committed[r]) for r, seq in safe.items() if r in committed}
    return safe or {}


def prune_spool(
    spool: SpoolLike | Spool,
    checkpoints: Iterable[Path],
    older_than_ms: int,
    clock: Clock,
    *,
    quota_bytes: int = 0,
) -> SpoolPruneReport:
    """Delete segments older than ``older_than_ms`` that every query has committed past; then,
    with ``quota_bytes``, more committed segments, oldest first, while above
    ``QUOTA_HIGH_WATER`` of the quota, down to ``QUOTA_LOW_WATER`` of it."""
    spool = resolve_spool(spool)
    cutoff = clock.now_ms() - older_than_ms
    safe = safe_sequences(checkpoints)
    deleted = kept = freed = 0
    deletable: list[tuple[int, SegmentInfo]] = []  # (heartbeat, segment) kept only for age
    for receiver in list_receivers(spool):
        limit = safe.get(receiver)
        for segment in list_segments(spool, receiver):
            # Strictly below the committed sequence: the committed one itself stays (its
            # heartbeat is the next segment's prior heartbeat).
            if limit is None or segment.sequence >= limit:
                kept += 1
                continue
            heartbeat_ms = read_heartbeat(segment).heartbeat_ms
            if heartbeat_ms >= cutoff:
                if not quota_bytes:
                    break  # sequences are in time order: the rest are younger still
                deletable.append((heartbeat_ms, segment))
                continue
            freed += _delete(segment)
            deleted += 1
    if quota_bytes and deletable:
        used = spool_bytes(spool)
        if used > quota_bytes * QUOTA_HIGH_WATER:
            target = int(quota_bytes * QUOTA_LOW_WATER)
            deletable.sort(key=lambda entry: (entry[0], entry[1].receiver, entry[1].sequence))
            # Oldest first, and per stream in sequence order (the sort keeps it), so a stream
            # never has a hole: what is left is always its newest segments.
            for _, segment in deletable:
                if used <= target:
                    break
                size = _delete(segment)
                used -= size
                freed += size
                deleted += 1
            log.info("retention: spool near its quota of %d bytes, now %d", quota_bytes, used)
    if deleted:
        log.info("retention: deleted %d segment(s), %d bytes", deleted, freed)
    return SpoolPruneReport(deleted, kept, freed)


def _delete(segment: SegmentInfo) -> int:
    """Delete a segment; its size in bytes (0 if someone else deleted it first)."""
    return segment.spool.delete(segment.path)
