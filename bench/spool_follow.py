"""What a stream reader pays per trigger to find new segments, as the log it keeps grows.

    .venv/bin/python bench/spool_follow.py --segments 1000,10000,100000

A receiver writes a segment every 250 ms (345k a day; ``--retain-log`` keeps 3 days), and
every window query's source looks for new segments at every trigger (0.5 s). Per log size,
with 10 new segments after the reader's offset, medians of ``--repeat`` rounds:

- **listing the stream** (``list_segments`` after the offset): what the source did until
  2026-11-24, and what retention still does once a minute;
- **asking for each next sequence** (``segments_after``: a stream is gapless);
- **the reader's whole step**: ``latestOffset`` + ``partitions`` of ``SpoolStreamReader``.

The segments are hard links to a few files (the footers are read, not the rows), on a local
spool under ``--dir`` (default: the system's temporary directory).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

from streamgauge.ingest.log import (
    SEGMENT_SCHEMA,
    Heartbeat,
    SegmentWriter,
    list_segments,
    segment_name,
    segments_after,
)
from streamgauge.windows.source import SpoolStreamReader

NEW = 10
LINKS_PER_FILE = 50_000  # below the file system's link limit (65k on ext4)


def build_stream(root: Path, segments: int) -> None:
    """``segments`` segments of receiver ``udp-0``, heartbeats 1 s apart at the end."""
    writer = SegmentWriter(root, "udp-0", fsync=False)
    empty = pa.RecordBatch.from_pylist([], schema=SEGMENT_SCHEMA)
    stream = root / "udp-0"
    source: Path | None = None
    for sequence in range(segments):
        if sequence >= segments - NEW - 1 or sequence % LINKS_PER_FILE == 0:
            writer._next_sequence = sequence  # noqa: SLF001 (a bench: place it directly)
            source = writer.append(empty, Heartbeat(1_000 * (sequence + 1), False)).path  # type: ignore[assignment]
        else:
            assert source is not None
            os.link(source, stream / segment_name(sequence))


def timed(step: Callable[[], object], repeat: int) -> float:
    seconds = []
    for _ in range(repeat):
        began = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def measure(root: Path, segments: int, repeat: int) -> tuple[float, float, float]:
    """(listing, asking, the reader's step) in seconds, over a stream of ``segments``."""
    build_stream(root, segments)
    after = segments - NEW - 1
    listing = timed(lambda: list_segments(root, "udp-0", after=after), repeat)
    asking = timed(lambda: segments_after(root, "udp-0", after), repeat)
    reader = SpoolStreamReader(root, 64)
    start = {"receivers": {"udp-0": {"seq": after, "heartbeat_ms": 1_000 * (after + 1),
                                     "closed": False}}}  # fmt: skip
    whole = timed(lambda: reader.partitions(start, reader.latestOffset(start, None)), repeat)
    assert len(segments_after(root, "udp-0", after)) == NEW
    return listing, asking, whole


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", default="1000,10000,100000")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    print(f"finding {NEW} new segments of one stream, medians of {args.repeat} (ms)")
    print(f"{'segments kept':>14} {'listing':>10} {'asking':>10} {'reader step':>12} {'ratio':>8}")
    for segments in (int(n) for n in args.segments.split(",")):
        root = Path(tempfile.mkdtemp(prefix="spool-follow-", dir=args.dir))
        try:
            listing, asking, whole = measure(root, segments, args.repeat)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        print(f"{segments:>14} {listing * 1e3:>10.1f} {asking * 1e3:>10.2f} {whole * 1e3:>12.2f} "
              f"{listing / asking:>7.0f}x")  # fmt: skip


if __name__ == "__main__":
    main()
