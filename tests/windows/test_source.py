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
    CATCH_UP_SPAN_MS,
    ROWS_PER_BATCH,
    UNKNOWN_ROWS_AHEAD_MS,
    QuietLane,
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
    _write(tmp_path, "b", [1, 8], closed_last=True)
    assert _latest(tmp_path) == {"a": (2, 9000, True), "b": (1, 8000, True)}


def _batches(spool: Path) -> list[dict[str, tuple[object, ...]]]:
    """The offsets of successive batches until the reader has admitted everything."""
    reader = SpoolStreamReader(spool, max_segments_per_partition=64)
    start, ends = reader.initialOffset(), []
    while (end := reader.latestOffset(start, None)) != start:
        ends.append(_positions(end))
        start = end
    return ends


def test_a_reader_behind_the_log_catches_up_in_batches_of_bounded_span(tmp_path: Path) -> None:
    """
    a:  1 2 3 … 70 |  down an hour  | 3671 3672           (a segment a second)
    b:  1 2 3 … 70 |                | 3671 3672 (closed)
    batches of 30 s from the oldest new segment: [1, 31]  [32, 62]  [63, 70]  [3671, 3672]
    """
    beats = list(range(1, 71))
    _write(tmp_path, "a", [*beats, 3671, 3672])
    _write(tmp_path, "b", [*beats, 3671, 3672], closed_last=True)
    assert CATCH_UP_SPAN_MS == 30_000
    assert _batches(tmp_path) == [
        {"a": (30, 31_000, False), "b": (30, 31_000, False)},
        {"a": (61, 62_000, False), "b": (61, 62_000, False)},
        {"a": (69, 70_000, False), "b": (69, 70_000, False)},  # the gap starts a new one
        {"a": (71, 3_672_000, False), "b": (71, 3_672_000, True)},
    ]


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


def _read_all(spool: Path) -> list[tuple[str, int, int]]:
    """(metric, segment heartbeat, prior heartbeat) of every row a stream reader hands over."""
    reader = SpoolStreamReader(spool, max_segments_per_partition=1)
    end = reader.latestOffset(reader.initialOffset(), None)
    return sorted(
        row
        for partition in reader.partitions(reader.initialOffset(), end)
        for batch in reader.read(partition)
        for row in zip(
            batch.column("metric").to_pylist(),
            batch.column("segment_heartbeat_ms").to_pylist(),
            batch.column("prior_heartbeat_ms").to_pylist(),
            strict=True,
        )
    )


def test_a_reader_hands_every_row_with_its_segment_s_heartbeats(tmp_path: Path) -> None:
    """Every row of every type, late or not, each with the heartbeat of its segment and of the
    stream's previous one (the job judges lateness from that); a heartbeat-only segment adds
    no row but moves the next one's prior heartbeat."""
    writer = SegmentWriter(tmp_path, "udp-0", fsync=False)
    types = ("c", "g", "s", "ms", "h", "d")
    first = [_partial(t, pane) for t in types for pane in (8, 9)]
    second = [_partial(t, pane) for t in types for pane in (29, 9, 6)]
    for rows, beat in ((first, 10), ([], 20), (second, 30)):
        batch = pa.RecordBatch.from_pylist(rows, schema=SEGMENT_SCHEMA)
        writer.append(batch, Heartbeat(beat * 1000, False))
    expected = [(str(r["metric"]), 10_000, 0) for r in first]
    expected += [(str(r["metric"]), 30_000, 20_000) for r in second]
    assert _read_all(tmp_path) == sorted(expected)


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


def test_a_segment_footer_says_which_rows_it_holds_even_from_before_it_said_so(
    tmp_path: Path,
) -> None:
    """A segment's footer gives its metric types and pane range (what a ``QuietLane`` reads
    instead of the rows): no pane range exactly when the reader hands no row of it. A segment
    written before the footer said so gives the same, from its rows."""
    writer = SegmentWriter(tmp_path, "udp-0", fsync=False)
    segments = [
        ([_partial("c", 8), _partial("g", 9)], 10),
        ([_partial("ms", 19), _partial("c", 12)], 20),
        ([], 30),  # heartbeat only
    ]
    infos = []
    for rows, beat in segments:
        batch = pa.RecordBatch.from_pylist(rows, schema=SEGMENT_SCHEMA)
        infos.append(writer.append(batch, Heartbeat(beat * 1000, False)))
    contents = [read_contents(info)[0] for info in infos]
    assert contents[0] == SegmentContents(frozenset({"c", "g"}), (8_000, 9_000), 2)
    assert contents[1] == SegmentContents(frozenset({"ms", "c"}), (12_000, 19_000), 2)
    assert contents[2] == SegmentContents(frozenset(), None, 0)
    assert read_contents(infos[0])[1] == Heartbeat(10_000, False)
    with_rows = {beat for _, beat, _ in _read_all(tmp_path)}
    assert with_rows == {
        beat * 1000 for (_, beat), found in zip(segments, contents, strict=True)
        if found.pane_range_ms is not None
    }  # fmt: skip
    for info, expected, (rows, _) in zip(infos, contents, segments, strict=True):
        _contents_written_before_footers_said(info.path)  # type: ignore[arg-type]
        assert read_contents(info)[0] == expected
        assert sum(batch.num_rows for batch in read_segment(info)) == len(rows)


class _Spark:
    """Drives a reader as Spark's micro-batch loop does: a new batch whenever ``latestOffset``
    returns an offset other than the one the last batch ended at."""

    def __init__(self, spool: Path, quiet: QuietLane) -> None:
        self.reader = SpoolStreamReader(spool, 64, quiet)
        self.start: dict[str, object] = self.reader.initialOffset()

    def trigger(self) -> bool:
        end = self.reader.latestOffset(self.start, None)
        if end == self.start:
            return False
        self.start = json.loads(json.dumps(end))  # as logged in the checkpoint
        return True

    def busy_until_ms(self) -> object:
        return self.start.get("busy_until_ms")


def _segment(writer: SegmentWriter, beat_s: float, *panes: tuple[str, float]) -> None:
    rows = [_partial(t, 0) | {"metric": f"m.{t}", "pane_start_ms": int(p * 1000)}
            for t, p in panes]  # fmt: skip
    writer.append(pa.RecordBatch.from_pylist(rows, schema=SEGMENT_SCHEMA),
                  Heartbeat(int(beat_s * 1000), False))  # fmt: skip


def test_a_quiet_lane_runs_a_batch_only_when_it_has_something_to_do(tmp_path: Path) -> None:
    """A query of a 10 s window (span: pane 1 + size 10 + delay 1 + lateness 2 = 14 s), idle
    batches every 30 s of heartbeat, over a log of heartbeat-only segments with a few rows.

    Its windows must close and become final on time, so once it has taken a row it takes
    every segment until the heartbeat passes that row's pane + 14 s; a row of any type, late
    or not, counts."""
    writer = SegmentWriter(tmp_path, "udp-0", fsync=False)
    quiet = QuietLane(span_ms=14_000, every_ms=30_000, passed_over=str(tmp_path / "passed_over"))
    spark = _Spark(tmp_path, quiet)

    def step(beat_s: float, *panes: tuple[str, float]) -> bool:
        _segment(writer, beat_s, *panes)
        return spark.trigger()

    assert step(1)  # the first batch: nothing taken yet, nothing known
    assert not spark.trigger()  # a trigger with no new segment: the same offset, bound kept
    assert [step(s) for s in range(2, 31)] == [False] * 29  # heartbeats only
    assert step(31)  # 30 s of heartbeat since the last batch: the watermark moves
    assert not step(32)
    assert step(33, ("ms", 32))  # a timer: its window [30, 40) is open
    assert not spark.trigger() and spark.busy_until_ms() == 46_000
    # Every heartbeat until 32 + 14 = 46 s, when [30, 40) is final (46 - 1 >= 40 + 2 + 1 pane).
    assert [step(s) for s in range(34, 47)] == [True] * 13
    assert not step(47)
    assert step(48, ("c", 47), ("c", 20))  # a counter, and a straggler from 20 s
    # The footer gives one pane range for the segment, so its latest pane (47 s) counts:
    # busy until 47 + 14 = 61 s.
    assert spark.busy_until_ms() == 61_000
    assert [step(s) for s in range(49, 62)] == [True] * 13
    assert [step(s) for s in range(62, 91)] == [False] * 29
    # What it passed over is noted for segment_lag_ms (retention.PASSED_OVER_FILE).
    noted = json.loads((tmp_path / "passed_over").read_text())["receivers"]["udp-0"]
    assert (noted["seq"], noted["heartbeat_ms"]) == (89, 90_000)
    assert step(91)  # 30 s after the batch at 61 s
    assert step(92, ("s", 91))  # a row: a batch at once, though idle 1 s


def test_a_busy_lane_waits_for_a_batch_that_changes_what_a_reader_sees(tmp_path: Path) -> None:
    """A query of a tumbling 10 s window (``watermark_delay`` 1 s, ``allowed_lateness`` 2 s:
    boundaries every 10 s) over a receiver writing a segment every 250 ms, each with a row of
    the pane it is in. Its windows stay open, yet the rows wait in the log until a batch
    changes what a reader sees: the watermark passes a window's end (heartbeat 11 s, 21 s)
    or its finality (13 s, 23 s); a row that may revise a published window; or
    ``ROWS_PER_BATCH`` rows waiting."""
    (tmp_path / "spool").mkdir()
    writer = SegmentWriter(tmp_path / "spool", "udp-0", fsync=False)
    quiet = QuietLane(span_ms=14_000, every_ms=30_000, passed_over=str(tmp_path / "passed_over"),
                      boundaries_ms=(10_000, 0), delay_ms=1_000, lateness_ms=2_000)  # fmt: skip
    assert QuietLane.from_options(quiet.options()) == quiet
    spark = _Spark(tmp_path / "spool", quiet)
    batches = []
    for quarter in range(16, 100):  # heartbeats 4 s to 24.75 s
        beat = quarter / 4
        _segment(writer, beat, ("c", float(int(beat - 0.25))))
        if spark.trigger():
            batches.append(beat)
    assert batches == [4.0, 11.0, 13.0, 21.0, 23.0]
    # The rows waiting are noted as passed over: the lane is not behind (segment_lag_ms).
    noted = json.loads((tmp_path / "passed_over").read_text())["receivers"]["udp-0"]
    assert (noted["seq"], noted["heartbeat_ms"]) == (83, 24_750)
    _segment(writer, 25.0, ("c", 24.0))
    assert not spark.trigger()
    _segment(writer, 25.25, ("c", 15.0))  # a straggler for [10, 20), published at 21 s
    assert spark.trigger()
    rows = ROWS_PER_BATCH // 3 + 1
    many = pa.RecordBatch.from_pylist([_partial("c", 25)] * rows, schema=SEGMENT_SCHEMA)
    waited = []
    for beat in (25.5, 25.75, 26.0):
        writer.append(many, Heartbeat(int(beat * 1000), False))
        waited.append(spark.trigger())
    assert waited == [False, False, True]  # 3 x (ROWS_PER_BATCH / 3 + 1) rows waiting


def test_a_restarted_quiet_lane_without_a_bound_in_its_offset_waits_the_longest_a_row_may(
    tmp_path: Path,
) -> None:
    """An offset from before ``busy_until_ms`` existed: a row taken before it may lie up to the
    receivers' default skew after its heartbeat, so the lane takes every segment until then."""
    writer = SegmentWriter(tmp_path, "udp-0", fsync=False)
    _segment(writer, 100, ("c", 99))
    spark = _Spark(tmp_path, QuietLane(span_ms=14_000, every_ms=30_000))
    assert spark.trigger()
    spark.start = {"receivers": spark.start["receivers"]}
    _segment(writer, 101, ("c", 100))
    assert spark.trigger()
    assert spark.start["busy_until_ms"] == 100_000 + UNKNOWN_ROWS_AHEAD_MS + 14_000
    for quiet in (QuietLane(14_000, 5_000), QuietLane(0, 9_000, str(tmp_path / "p"))):
        assert QuietLane.from_options(quiet.options()) == quiet
    assert QuietLane.from_options({"path": str(tmp_path)}) is None


def test_a_reader_following_the_log_never_lists_a_stream_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Listing a stream is O(its segments), seconds per trigger and query at 100k segments (a
    receiver's ~7 hours). After the first offset the reader asks for each next sequence."""
    writer = SegmentWriter(tmp_path, "udp-0", fsync=False)
    empty = pa.RecordBatch.from_pylist([], schema=SEGMENT_SCHEMA)
    for beat in (1, 2, 3):
        writer.append(empty, Heartbeat(beat * 1000, False))
    reader = SpoolStreamReader(tmp_path, 2, QuietLane(0, every_ms=1000))
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
