"""The spool source's offsets: fast receivers wait for the slowest open one (no Spark needed).

Heartbeats in seconds; ``|`` marks a stream's newest segment, ``c`` a closed one::

    fast   1 2 3 4 5 6 7 8|
    slow   1 2 3|               → fast admitted up to 3, slow up to 3
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from streamgauge.ingest.log import SEGMENT_SCHEMA, Heartbeat, SegmentWriter
from streamgauge.windows.source import SpoolBatchReader, SpoolStreamReader, admission_bounds


def _write(spool: Path, receiver: str, beats: list[int], *, closed_last: bool = False) -> None:
    writer = SegmentWriter(spool, receiver, fsync=False)
    empty = pa.RecordBatch.from_pylist([], schema=SEGMENT_SCHEMA)
    for index, beat in enumerate(beats):
        closed = closed_last and index == len(beats) - 1
        writer.append(empty, Heartbeat(beat * 1000, closed))


def _positions(offset: dict[str, dict[str, dict[str, object]]]) -> dict[str, tuple[object, ...]]:
    return {name: (p["seq"], p["heartbeat_ms"], p["closed"])
            for name, p in offset["receivers"].items()}  # fmt: skip


def _latest(spool: Path, start: dict[str, object] | None = None) -> dict[str, tuple[object, ...]]:
    reader = SpoolStreamReader(spool, max_segments_per_partition=64)
    return _positions(reader.latestOffset(start or reader.initialOffset(), None))


def test_a_fast_receiver_waits_for_the_slowest_open_one(tmp_path: Path) -> None:
    _write(tmp_path, "fast", [1, 2, 3, 4, 5, 6, 7, 8])
    _write(tmp_path, "slow", [1, 2, 3])
    assert _latest(tmp_path) == {"fast": (2, 3000, False), "slow": (2, 3000, False)}
    _write(tmp_path, "slow", [6])
    reader = SpoolStreamReader(tmp_path, max_segments_per_partition=64)
    start = reader.latestOffset(reader.initialOffset(), None)
    assert _positions(start)["fast"] == (5, 6000, False)
    # Resuming from a checkpointed offset admits the same way.
    assert _latest(tmp_path, start) == _positions(start)


def test_a_closed_receiver_holds_nobody_back_but_cannot_race_ahead(tmp_path: Path) -> None:
    _write(tmp_path, "fast", [1, 2, 3, 4, 5, 6, 7, 8])
    _write(tmp_path, "done", [1, 2], closed_last=True)
    assert _latest(tmp_path) == {"fast": (7, 8000, False), "done": (1, 2000, True)}
    _write(tmp_path, "slow", [4])  # an open laggard holds both, the closed one included
    _write(tmp_path, "late", [9, 10], closed_last=True)
    assert _latest(tmp_path) == {
        "fast": (3, 4000, False), "done": (1, 2000, True), "slow": (0, 4000, False),
    }  # fmt: skip


def test_every_stream_closed_admits_everything(tmp_path: Path) -> None:
    _write(tmp_path, "a", [1, 2, 9], closed_last=True)
    _write(tmp_path, "b", [1, 20], closed_last=True)
    assert _latest(tmp_path) == {"a": (2, 9000, True), "b": (1, 20000, True)}


def test_an_empty_stream_holds_nobody_back_and_a_crashed_one_holds_everyone(
    tmp_path: Path,
) -> None:
    _write(tmp_path, "fast", [1, 2, 3, 4, 5])
    SegmentWriter(tmp_path, "starting", fsync=False)  # directory only: promised nothing yet
    assert _latest(tmp_path) == {"fast": (4, 5000, False)}
    _write(tmp_path, "crashed", [2])  # open, never closed, never writes again
    assert _latest(tmp_path)["fast"] == (1, 2000, False)


def test_a_single_receiver_is_never_held_back_even_when_its_clock_stepped_back(
    tmp_path: Path,
) -> None:
    _write(tmp_path, "udp-0", [5, 6, 3, 4])
    assert _latest(tmp_path) == {"udp-0": (3, 4000, False)}
    assert admission_bounds({"udp-0": Heartbeat(4000, False)}) == {"udp-0": None}


def test_batch_reads_see_the_whole_log(tmp_path: Path) -> None:
    _write(tmp_path, "fast", [1, 2, 3, 4, 5, 6])
    _write(tmp_path, "slow", [1])
    parts = SpoolBatchReader(tmp_path).partitions()
    assert sorted((p.receiver, len(p.sequences)) for p in parts) == [("fast", 6), ("slow", 1)]  # type: ignore[attr-defined]
