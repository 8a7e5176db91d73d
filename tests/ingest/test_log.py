"""The segment log: atomic segments, ordered streams, heartbeats, crash leftovers."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import (
    SEGMENT_SCHEMA,
    Heartbeat,
    SegmentWriter,
    list_receivers,
    list_segments,
    read_heartbeat,
    read_segment,
)
from streamgauge.ingest.protocol import parse_line


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
    assert first.path.name == "000000000000.arrow"
    assert list_receivers(tmp_path) == ["udp-0"]
    assert [s.sequence for s in list_segments(tmp_path, "udp-0")] == [0, 1]
    assert [s.sequence for s in list_segments(tmp_path, "udp-0", after=0)] == [1]
    assert [s.sequence for s in list_segments(tmp_path, "udp-0", after=-1, upto=0)] == [0]
    assert read_heartbeat(first.path) == Heartbeat(1_500, False)
    assert read_heartbeat(second.path) == Heartbeat(2_500, True)
    (batch,) = list(read_segment(second.path))
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


def test_heartbeat_only_segments_have_no_rows(tmp_path: Path) -> None:
    writer = SegmentWriter(tmp_path, "idle")
    info = writer.append(PaneCombiner(1000).drain(), Heartbeat(9_000, False))
    assert sum(b.num_rows for b in read_segment(info.path)) == 0
    assert read_heartbeat(info.path).heartbeat_ms == 9_000
