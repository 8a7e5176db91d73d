"""The spool source's offsets: fast receivers wait for the slowest open one (no Spark needed).

Heartbeats in seconds; ``|`` marks a stream's newest segment, ``c`` a closed one::

    fast   1 2 3 4 5 6 7 8|
    slow   1 2 3|               → fast admitted up to 3, slow up to 3
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from streamgauge.ingest.log import SEGMENT_SCHEMA, Heartbeat, SegmentWriter
from streamgauge.windows.source import (
    RowFilter,
    SpoolBatchReader,
    SpoolStreamReader,
    admission_bounds,
)


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


def _partial(metric_type: str, pane_s: int) -> dict[str, object]:
    ms = pane_s * 1000
    return {
        "metric": f"m.{metric_type}.{pane_s}", "metric_type": metric_type, "tags": "{}",
        "pane_start_ms": ms, "count": 1, "sum": 1.0, "min": 1.0, "max": 1.0, "last": 1.0,
        "last_event_ms": ms, "first_recv_ms": ms, "last_recv_ms": ms,
    }  # fmt: skip


def _read_all(spool: Path, rows: RowFilter) -> list[str]:
    reader = SpoolStreamReader(spool, max_segments_per_partition=64, rows=rows)
    end = reader.latestOffset(reader.initialOffset(), None)
    return sorted(
        metric
        for partition in reader.partitions(reader.initialOffset(), end)
        for batch in reader.read(partition)
        for metric in batch.column("metric").to_pylist()
    )


def test_each_lane_reads_its_own_types_and_every_row_that_may_be_late(tmp_path: Path) -> None:
    """Segment 1 (heartbeat 10 s) holds panes 8 and 9 s; segment 2 (heartbeat 20 s, prior
    heartbeat 10 s) holds an on-time pane 19 s and stragglers from 9 and 6 s. With
    ``watermark_delay + allowed_lateness`` = 3 s a row may be late only if its event time is
    before 10 - 3 = 7 s: the 6 s straggler. The 9 s one is on time for every window
    (``[s, e)`` holding 9 s has ``e >= 10 > 7``)."""
    writer = SegmentWriter(tmp_path, "udp-0", fsync=False)
    types = ("c", "g", "s", "ms", "h", "d")
    first = [_partial(t, pane) for t in types for pane in (8, 9)]
    second = [_partial(t, pane) for t in types for pane in (19, 9, 6)]
    for rows, beat in ((first, 10), (second, 20)):
        batch = pa.RecordBatch.from_pylist(rows, schema=SEGMENT_SCHEMA)
        writer.append(batch, Heartbeat(beat * 1000, False))
    everything = sorted(str(r["metric"]) for r in first + second)
    native = sorted(m for m in everything if m.split(".")[1] in ("c", "g", "s"))
    sketched = sorted(m for m in everything if m.split(".")[1] in ("ms", "h", "d"))
    maybe_late = sorted(f"m.{t}.6" for t in types)

    assert _read_all(tmp_path, RowFilter()) == everything
    assert _read_all(tmp_path, RowFilter("native")) == native
    # A tumbling window's lanes (job.splits_sets): counters and gauges; sets with the sketches.
    sets = [m for m in native if ".s." in m]
    assert _read_all(tmp_path, RowFilter("plain")) == [m for m in native if m not in sets]
    assert _read_all(tmp_path, RowFilter("sketch_sets")) == sorted(sketched + sets)
    assert _read_all(tmp_path, RowFilter("sketch")) == sketched
    late_native = [m for m in maybe_late if m in native]
    assert _read_all(tmp_path, RowFilter("sketch", 3000)) == sorted(sketched + late_native)
    assert _read_all(tmp_path, RowFilter("none", 3000)) == maybe_late
    # A margin of 1 s: 9 s is not before 10 - 1 either; 6 s is.
    assert _read_all(tmp_path, RowFilter("none", 1000)) == maybe_late
    assert _read_all(tmp_path, RowFilter("none", 4000)) == []
    # The options round-trip (Spark hands them to the reader as strings).
    assert RowFilter.from_options(RowFilter("sketch", 3000).options()) == RowFilter("sketch", 3000)
    with pytest.raises(ValueError, match="lane must be one of"):
        RowFilter("timers")
