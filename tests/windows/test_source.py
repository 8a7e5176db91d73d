"""The spool source's offsets: fast receivers wait for the slowest open one (no Spark needed).

Heartbeats in seconds; ``|`` marks a stream's newest segment, ``c`` a closed one::

    fast   1 2 3 4 5 6 7 8|
    slow   1 2 3|               → fast admitted up to 3, slow up to 3
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from streamgauge.ingest.log import (
    SEGMENT_SCHEMA,
    Heartbeat,
    SegmentContents,
    SegmentWriter,
    read_contents,
    read_segment,
)
from streamgauge.ingest.spool_fs import LocalSpool
from streamgauge.windows.source import (
    UNKNOWN_ROWS_AHEAD_MS,
    QuietLane,
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
    # The other per-type lanes (source.LANE_TYPES): counters and gauges; sets with the sketches.
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


def _contents_written_before_footers_said(path: Path) -> None:
    """Rewrite a segment as receivers wrote it before ``metric_types`` / ``pane_range_ms``."""
    with pa.OSFile(str(path)) as source:  # copied: the file is overwritten below
        table = pa.ipc.open_file(source).read_all()
    old = {k: v for k, v in (table.schema.metadata or {}).items()
           if k in (b"heartbeat_ms", b"closed")}  # fmt: skip
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(
        sink, table.schema.with_metadata(old)
    ) as writer:
        writer.write_table(table.replace_schema_metadata(old))


def test_a_segment_footer_says_which_rows_it_holds_and_wants_agrees_with_apply(
    tmp_path: Path,
) -> None:
    """``RowFilter.wants`` (from the footer) keeps a segment exactly when ``apply`` (on the
    rows) keeps a row of it, for every lane; a segment from before the footer said so is read."""
    writer = SegmentWriter(tmp_path, "udp-0", fsync=False)
    segments = [
        ([_partial("c", 8), _partial("g", 9)], 10),
        ([_partial("ms", 19), _partial("c", 12)], 20),
        ([_partial("c", 29), _partial("s", 14)], 30),  # a set straggler: may be late at 20-3
        ([], 40),  # heartbeat only
    ]
    infos = []
    for rows, beat in segments:
        batch = pa.RecordBatch.from_pylist(rows, schema=SEGMENT_SCHEMA)
        infos.append(writer.append(batch, Heartbeat(beat * 1000, False)))
    contents = [read_contents(info)[0] for info in infos]
    assert contents[1] == SegmentContents(frozenset({"ms", "c"}), (12_000, 19_000))
    assert contents[3] == SegmentContents(frozenset(), None)
    assert read_contents(infos[0])[1] == Heartbeat(10_000, False)
    for info, expected in zip(infos, contents, strict=True):
        _contents_written_before_footers_said(info.path)  # type: ignore[arg-type]
        assert read_contents(info)[0] == expected
    filters = [RowFilter(lane) for lane in ("all", "native", "plain", "sketch", "sketch_sets",
                                            "none")]  # fmt: skip
    filters += [RowFilter("sketch", 3000), RowFilter("none", 3000), RowFilter("none", 9000)]
    for rows_filter in filters:
        prior = 0
        for info, found in zip(infos, contents, strict=True):
            heartbeat = read_contents(info)[1].heartbeat_ms
            kept = sum(rows_filter.apply(b, heartbeat, prior).num_rows for b in read_segment(info))
            assert rows_filter.wants(found, heartbeat, prior) == (kept > 0), (rows_filter, info)
            prior = heartbeat


class _Spark:
    """Drives a reader as Spark's micro-batch loop does: a new batch whenever ``latestOffset``
    returns an offset other than the one the last batch ended at."""

    def __init__(self, spool: Path, rows: RowFilter, quiet: QuietLane) -> None:
        self.reader = SpoolStreamReader(spool, 64, rows, quiet)
        self.start: dict[str, object] = self.reader.initialOffset()

    def trigger(self) -> bool:
        end = self.reader.latestOffset(self.start, None)
        if end == self.start:
            return False
        self.start = json.loads(json.dumps(end))  # as logged in the checkpoint
        return True


def _segment(writer: SegmentWriter, beat_s: float, *panes: tuple[str, float]) -> None:
    rows = [_partial(t, 0) | {"metric": f"m.{t}", "pane_start_ms": int(p * 1000)}
            for t, p in panes]  # fmt: skip
    writer.append(pa.RecordBatch.from_pylist(rows, schema=SEGMENT_SCHEMA),
                  Heartbeat(int(beat_s * 1000), False))  # fmt: skip


def test_a_quiet_lane_runs_a_batch_only_when_it_has_something_to_do(tmp_path: Path) -> None:
    """A query of a 10 s window reading the sketched types (``RowFilter("sketch")``, late
    margin 3 s; span: pane 1 + size 10 + delay 1 + lateness 2 = 14 s), idle batches every 30 s
    of heartbeat, over a log of counters.

    Its windows must close and become final on time, so once it has taken a timer it takes
    every segment until the heartbeat passes that timer's pane + 14 s; a counter that may
    be late is for it too."""
    writer = SegmentWriter(tmp_path, "udp-0", fsync=False)
    quiet = QuietLane(span_ms=14_000, every_ms=30_000, passed_over=str(tmp_path / "passed_over"))
    spark = _Spark(tmp_path, RowFilter("sketch", 3000), quiet)

    def step(beat_s: float, *panes: tuple[str, float]) -> bool:
        _segment(writer, beat_s, *panes)
        return spark.trigger()

    assert step(1, ("c", 0))  # the first batch: nothing taken yet, nothing known
    assert not spark.trigger()  # a trigger with no new segment: the same offset, bound kept
    assert [step(s, ("c", s - 1)) for s in range(2, 31)] == [False] * 29  # counters only
    assert step(31, ("c", 30))  # 30 s of heartbeat since the last batch: the watermark moves
    assert not step(32, ("c", 31))
    assert step(33, ("c", 32), ("ms", 32))  # a timer: its window [30, 40) is open
    assert not spark.trigger() and spark.start["busy_until_ms"] == 46_000
    # Every heartbeat until 32 + 14 = 46 s, when [30, 40) is final (46 - 1 >= 40 + 2 + 1 pane).
    assert [step(s, ("c", s - 1)) for s in range(34, 47)] == [True] * 13
    assert not step(47, ("c", 46))
    assert step(48, ("c", 47), ("c", 40))  # a counter 40 s < 47 - 3 s: may be late
    # The footer gives one pane range for the segment, so its latest pane (47 s) counts as
    # the lane's: busy until 47 + 14 = 61 s (a batch or two too many, never one too few).
    assert [step(s, ("c", s - 1)) for s in range(49, 62)] == [True] * 13
    assert [step(s) for s in range(62, 91)] == [False] * 29  # idle input: heartbeats only
    # What it passed over is noted for segment_lag_ms (retention.PASSED_OVER_FILE).
    noted = json.loads((tmp_path / "passed_over").read_text())["receivers"]["udp-0"]
    assert (noted["seq"], noted["heartbeat_ms"]) == (89, 90_000)
    assert step(91)  # 30 s after the batch at 61 s


def test_a_restarted_quiet_lane_without_a_bound_in_its_offset_waits_the_longest_a_row_may(
    tmp_path: Path,
) -> None:
    """An offset from before ``busy_until_ms`` existed: a row taken before it may lie up to the
    receivers' default skew after its heartbeat, so the lane takes every segment until then."""
    writer = SegmentWriter(tmp_path, "udp-0", fsync=False)
    _segment(writer, 100, ("c", 99))
    spark = _Spark(tmp_path, RowFilter("sketch"), QuietLane(span_ms=14_000, every_ms=30_000))
    assert spark.trigger()
    spark.start = {"receivers": spark.start["receivers"]}  # type: ignore[dict-item]
    _segment(writer, 101, ("c", 100))
    assert spark.trigger()
    assert spark.start["busy_until_ms"] == 100_000 + UNKNOWN_ROWS_AHEAD_MS + 14_000
    for quiet in (QuietLane(14_000, 5_000), QuietLane(0, 9_000, str(tmp_path / "p"))):
        assert QuietLane.from_options(quiet.options()) == quiet
    assert QuietLane.from_options(RowFilter("sketch").options()) is None


def test_a_reader_following_the_log_never_lists_a_stream_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing a stream is O(its segments), seconds per trigger and query at 100k segments (a
    receiver's ~7 hours). After the first offset the reader asks for each next sequence."""
    writer = SegmentWriter(tmp_path, "udp-0", fsync=False)
    empty = pa.RecordBatch.from_pylist([], schema=SEGMENT_SCHEMA)
    for beat in (1, 2, 3):
        writer.append(empty, Heartbeat(beat * 1000, False))
    reader = SpoolStreamReader(tmp_path, 2, RowFilter("native"), QuietLane(0, every_ms=1000))
    first = reader.latestOffset(reader.initialOffset(), None)

    def no_listing(*_: object) -> list[str]:
        raise AssertionError("a follower must not list the stream")

    monkeypatch.setattr(LocalSpool, "list_names", no_listing)
    monkeypatch.setattr(LocalSpool, "list_files", no_listing)
    for beat in (4, 5, 6):
        writer.append(empty, Heartbeat(beat * 1000, False))
    second = reader.latestOffset(first, None)
    assert _positions(second) == {"udp-0": (5, 6000, False)}
    parts = reader.partitions(first, second)
    assert [(p.sequences, p.prior_heartbeat_ms) for p in parts] == [([3, 4], 3000), ([5], 5000)]  # type: ignore[attr-defined]
