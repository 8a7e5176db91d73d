"""The segment log: atomic segments, ordered streams, heartbeats, crash leftovers."""

from __future__ import annotations

import errno
import threading
from pathlib import Path

import pyarrow as pa
import pytest

from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import (
    REFUSED_DISK_FULL,
    REFUSED_SPOOL_QUOTA,
    SEGMENT_SCHEMA,
    Heartbeat,
    SegmentInfo,
    SegmentQueue,
    SegmentWriter,
    SpoolUsage,
    list_receivers,
    list_segments,
    read_heartbeat,
    read_segment,
    segments_after,
    spool_bytes,
)
from streamgauge.ingest.protocol import parse_line
from streamgauge.ingest.spool_fs import LocalSpool


def _batch(lines: list[bytes], event_ms: int) -> pa.RecordBatch:
    combiner = PaneCombiner(1000)
    for line in lines:
        samples = parse_line(line)
        assert isinstance(samples, list)
        for sample in samples:
            combiner.add(sample, event_ms, event_ms)
    return combiner.drain()


def test_segments_are_numbered_in_order_and_read_back(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, "udp-0")
    first = writer.append(_batch([b"a:1|c"], 1_000), Heartbeat(1_500, closed=False))
    second = writer.append(_batch([b"b:2|g"], 2_000), Heartbeat(2_500, closed=True))
    assert (first.sequence, second.sequence) == (0, 1)
    assert Path(first.path).name == "000000000000.arrow"
    assert list_receivers(tmp_path) == ["udp-0"]
    assert [s.sequence for s in list_segments(tmp_path, "udp-0")] == [0, 1]
    assert [s.sequence for s in list_segments(tmp_path, "udp-0", after=0)] == [1]
    assert [s.sequence for s in list_segments(tmp_path, "udp-0", after=-1, upto=0)] == [0]
    assert read_heartbeat(first) == Heartbeat(1_500, False)
    assert read_heartbeat(second) == Heartbeat(2_500, True)
    (batch,) = list(read_segment(second))
    assert batch.schema == SEGMENT_SCHEMA
    assert batch.to_pylist()[0]["metric"] == "b"
    assert batch.to_pylist()[0]["last"] == 2.0


def test_a_restarted_writer_continues_the_sequence_and_drops_torn_temporaries(
    tmp_path: Path,
) -> None:
    writer = SegmentWriter(tmp_path, "udp-0")
    writer.append(_batch([b"a:1|c"], 1_000), Heartbeat(1_000, False))
    torn = tmp_path / "udp-0" / ".000000000001.arrow.tmp"
    torn.write_bytes(b"half a segment")
    restarted = SegmentWriter(tmp_path, "udp-0")
    assert not torn.exists()
    assert restarted.next_sequence == 1
    info = restarted.append(_batch([b"a:1|c"], 2_000), Heartbeat(2_000, False))
    assert info.sequence == 1
    # readers never list temporaries: only complete, renamed segments
    assert [s.sequence for s in list_segments(tmp_path, "udp-0")] == [0, 1]


def test_a_follower_finds_new_segments_one_lookup_each_without_listing_the_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``segments_after`` asks for ``after + 1``, ``after + 2``... (a stream is gapless): a day
    of 250 ms segments is 345k files, which ``list_segments`` lists whole (2.1 s at 100k)."""
    writer = SegmentWriter(tmp_path, "udp-0", fsync=False)
    for beat in range(1, 6):
        writer.append(_batch([b"a:1|c"], beat * 1000), Heartbeat(beat * 1000, False))
    listed = [s.sequence for s in list_segments(tmp_path, "udp-0")]
    assert [s.sequence for s in segments_after(tmp_path, "udp-0", -1)] == listed  # listed once
    (tmp_path / "udp-0" / "000000000000.arrow").unlink()  # retention took what all have read
    assert [s.sequence for s in segments_after(tmp_path, "udp-0", -1)] == [1, 2, 3, 4]

    def no_listing(*_: object) -> list[str]:
        raise AssertionError("a follower must not list the stream")

    monkeypatch.setattr(LocalSpool, "list_names", no_listing)
    monkeypatch.setattr(LocalSpool, "list_files", no_listing)
    assert [s.sequence for s in segments_after(tmp_path, "udp-0", 2)] == [3, 4]
    assert segments_after(tmp_path, "udp-0", 4) == []
    writer.append(_batch([b"a:1|c"], 6_000), Heartbeat(6_000, False))
    (found,) = segments_after(tmp_path, "udp-0", 4)
    assert (found.sequence, read_heartbeat(found)) == (5, Heartbeat(6_000, False))


def test_heartbeat_only_segments_have_no_rows(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, "idle")
    info = writer.append(PaneCombiner(1000).drain(), Heartbeat(9_000, False))
    assert sum(b.num_rows for b in read_segment(info)) == 0
    assert read_heartbeat(info).heartbeat_ms == 9_000


# -- SegmentQueue: writes off the receive thread, backpressure, quota ----------------------------


class _GatedWriter(SegmentWriter):
    """A writer whose appends wait for ``gate``: a slow disk, on demand."""

    def __init__(self, spool: Path, receiver: str) -> None:
        super().__init__(spool, receiver, fsync=False)
        self.gate = threading.Event()
        self.started = threading.Semaphore(0)

    def append(self, batch: pa.RecordBatch, heartbeat: Heartbeat) -> SegmentInfo:
        self.started.release()
        assert self.gate.wait(10)
        return super().append(batch, heartbeat)


def _beats(spool: Path, receiver: str) -> list[int]:
    return [read_heartbeat(s).heartbeat_ms for s in list_segments(spool, receiver)]


def test_the_writer_thread_keeps_append_order_and_close_writes_everything(
    tmp_path: Path,
) -> None:
    queue = SegmentQueue(SegmentWriter(tmp_path, "udp-0", fsync=False), depth=3)
    for t in range(1, 11):
        queue.append(_batch([b"a:%d|c" % t], t * 1_000), Heartbeat(t * 1_000, t == 10))
    queue.close()
    assert _beats(tmp_path, "udp-0") == [t * 1_000 for t in range(1, 11)]
    assert read_heartbeat(list_segments(tmp_path, "udp-0")[-1]).closed
    counts = queue.take_counts()
    assert counts.segments_written == 10 and counts.bytes_written > 0


def test_a_full_queue_makes_the_caller_wait_and_is_counted(tmp_path: Path) -> None:
    writer = _GatedWriter(tmp_path, "udp-0")
    queue = SegmentQueue(writer, depth=1)
    queue.append(_batch([b"a:1|c"], 1_000), Heartbeat(1_000, False))
    assert writer.started.acquire(timeout=10)  # the writer holds the first one
    second = threading.Thread(
        target=queue.append, args=(_batch([b"a:2|c"], 2_000), Heartbeat(2_000, False))
    )
    second.start()
    second.join(0.2)
    assert second.is_alive()  # backpressure: waits for the writer instead of dropping
    writer.gate.set()
    second.join(10)
    queue.close()
    assert _beats(tmp_path, "udp-0") == [1_000, 2_000]
    counts = queue.take_counts()
    assert counts.backpressure == 1 and counts.blocked_ms >= 0
    assert queue.take_counts().backpressure == 0  # taken once


def test_a_failing_writer_surfaces_in_the_caller(tmp_path: Path) -> None:
    class Broken(SegmentWriter):
        def append(self, batch: pa.RecordBatch, heartbeat: Heartbeat) -> SegmentInfo:
            raise PermissionError(13, "Permission denied")

    queue = SegmentQueue(Broken(tmp_path, "udp-0", fsync=False), depth=2)
    queue.append(_batch([b"a:1|c"], 1_000), Heartbeat(1_000, False))
    with pytest.raises(RuntimeError, match="segment writer of udp-0 failed"):
        queue.flush()
    with pytest.raises(RuntimeError):  # the receive loop stops instead of running on
        queue.append(_batch([b"a:1|c"], 2_000), Heartbeat(2_000, False))
    with pytest.raises(RuntimeError):
        queue.close()


def _with_self_metrics(event_ms: int) -> pa.RecordBatch:
    return _batch(
        [b"app.requests:5|c", b"app.latency:3|ms", b"streamgauge.ingest.lines:2|c"], event_ms
    )


def test_over_the_quota_data_is_refused_and_counted_self_metrics_and_heartbeat_kept(
    tmp_path: Path,
) -> None:
    ticks = [0]
    usage = SpoolUsage(tmp_path, rescan_ms=1_000, monotonic_ms=lambda: ticks[0])
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "000000000000.arrow").write_bytes(b"x" * 50_000)
    queue = SegmentQueue(
        SegmentWriter(tmp_path, "udp-0", fsync=False), depth=0, quota_bytes=40_000, usage=usage
    )
    queue.append(_with_self_metrics(1_000), Heartbeat(1_500, False))
    (segment,) = list_segments(tmp_path, "udp-0")
    rows = [row for batch in read_segment(segment) for row in batch.to_pylist()]
    assert [row["metric"] for row in rows] == ["streamgauge.ingest.lines"]
    # windows keep closing
    assert read_heartbeat(segment) == Heartbeat(1_500, False)
    counts = queue.take_counts()
    assert counts.refused_partials == {REFUSED_SPOOL_QUOTA: 2}
    assert counts.refused_samples == {REFUSED_SPOOL_QUOTA: 2}

    # retention frees space: writing resumes at the next rescan of the spool
    (tmp_path / "other" / "000000000000.arrow").unlink()
    queue.append(_with_self_metrics(2_000), Heartbeat(2_500, False))
    assert queue.take_counts().refused_partials == {REFUSED_SPOOL_QUOTA: 2}  # not rescanned yet
    ticks[0] = 1_000
    queue.append(_with_self_metrics(3_000), Heartbeat(3_500, False))
    assert not queue.take_counts().refused_partials
    last = list_segments(tmp_path, "udp-0")[-1]
    assert {
        row["metric"] for b in read_segment(last) for row in b.to_pylist()
    } == {
        "app.requests", "app.latency", "streamgauge.ingest.lines",
    }  # fmt: skip
    assert _beats(tmp_path, "udp-0") == [1_500, 2_500, 3_500]


def test_a_full_disk_refuses_the_data_carries_the_own_rows_and_keeps_the_stream_gapless(
    tmp_path: Path,
) -> None:
    class FullDisk(SegmentWriter):
        full = True

        def append(self, batch: pa.RecordBatch, heartbeat: Heartbeat) -> SegmentInfo:
            if self.full:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().append(batch, heartbeat)

    writer = FullDisk(tmp_path, "udp-0", fsync=False)
    queue = SegmentQueue(writer, depth=0)
    queue.append(_with_self_metrics(1_000), Heartbeat(1_500, False))
    assert queue.take_counts().refused_samples == {REFUSED_DISK_FULL: 2}  # 5|c and 3|ms
    writer.full = False
    queue.append(_with_self_metrics(2_000), Heartbeat(2_500, False))
    [segment] = list_segments(tmp_path, "udp-0")
    assert segment.sequence == 0
    rows = [row for batch in read_segment(segment) for row in batch.to_pylist()]
    own = [(r["pane_start_ms"], r["sum"]) for r in rows if r["metric"].startswith("streamgauge.")]
    assert own == [(1_000, 2.0), (2_000, 2.0)]  # the refused segment's own row carried over


def test_spool_usage_counts_every_stream_and_its_own_writes_between_scans(
    tmp_path: Path,
) -> None:
    (tmp_path / "udp-1").mkdir()
    (tmp_path / "udp-1" / "000000000000.arrow").write_bytes(b"x" * 100)
    (tmp_path / "udp-1" / ".000000000001.arrow.tmp").write_bytes(b"x" * 10)
    ticks = [0]
    usage = SpoolUsage(tmp_path, rescan_ms=5_000, monotonic_ms=lambda: ticks[0])
    assert usage.used() == spool_bytes(tmp_path) == 110
    usage.add(40)
    (tmp_path / "udp-1" / "000000000000.arrow").unlink()
    assert usage.used() == 150  # between scans: its own writes only
    ticks[0] = 5_000
    assert usage.used() == 10


def test_a_write_error_removes_the_temporary_and_reuses_the_sequence(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, "udp-0", fsync=False)
    bad = pa.RecordBatch.from_pylist([{"metric": "a"}])  # not a segment's columns
    with pytest.raises((ValueError, pa.ArrowException)):
        writer.append(bad, Heartbeat(1_000, False))
    assert not list((tmp_path / "udp-0").iterdir())
    assert writer.append(_batch([b"a:1|c"], 1_000), Heartbeat(1_000, False)).sequence == 0


def test_a_segment_written_before_the_kll_column_reads_back_with_nulls(tmp_path: Path) -> None:
    """Segment columns are only ever appended: a spool written before ``kll`` existed still
    reads, in today's schema (Spark's source reads it through the same ``read_segment``)."""
    today = _batch([b"t:5|ms", b"a:1|c"], 1_000)
    older_schema = pa.schema([f for f in SEGMENT_SCHEMA if f.name != "kll"])
    older = pa.RecordBatch.from_arrays(
        [today.column(f.name) for f in older_schema], schema=older_schema
    )
    path = tmp_path / "000000000000.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, older_schema) as writer:
        writer.write_batch(older)
    (batch,) = list(read_segment(path))
    assert batch.schema == SEGMENT_SCHEMA
    assert batch.column("kll").to_pylist() == [None, None]
    assert batch.column("metric").to_pylist() == today.column("metric").to_pylist()
