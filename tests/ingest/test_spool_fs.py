"""The segment log on an object store (S3 through pyarrow.fs, against a real S3 API server),
and the same functions on a local path and a ``file://`` URI (temporary name + rename)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from streamgauge.clock import ManualClock
from streamgauge.ingest.log import (
    REFUSED_SPOOL_UNAVAILABLE,
    SEGMENT_SCHEMA,
    Heartbeat,
    SegmentInfo,
    SegmentQueue,
    SegmentWriter,
    describe_spool,
    list_receivers,
    list_segments,
    read_heartbeat,
    read_segment,
    segment_at,
    segments_after,
    spool_bytes,
)
from streamgauge.ingest.spool_fs import LocalSpool, ObjectSpool, resolve_spool
from streamgauge.redaction import redact_location, redact_secrets_in
from streamgauge.retention import prune_spool
from tests.s3_server import BUCKET, SECRET_KEY, S3Server, free_tcp_port, running_s3_server

DAY_MS = 86_400_000


def _batch(metric: str, value: float, pane_ms: int) -> pa.RecordBatch:
    row = {
        "metric": metric, "metric_type": "c", "tags": "{}", "pane_start_ms": pane_ms,
        "count": 1, "sum": value, "min": value, "max": value, "last": value,
        "last_event_ms": pane_ms, "first_recv_ms": pane_ms, "last_recv_ms": pane_ms,
    }  # fmt: skip
    return pa.RecordBatch.from_pylist([row], schema=SEGMENT_SCHEMA)


def _sums(segments: list[SegmentInfo]) -> list[float]:
    return [row["sum"] for s in segments for b in read_segment(s) for row in b.to_pylist()]


def test_the_log_round_trips_on_s3_one_put_per_segment(s3_server: S3Server) -> None:
    uri = s3_server.uri("roundtrip")
    spool = resolve_spool(uri)
    assert isinstance(spool, ObjectSpool) and spool.root == f"{BUCKET}/roundtrip"
    a = SegmentWriter(uri, "host-a.udp-0")
    b = SegmentWriter(uri, "host-b.udp-0")
    for beat in range(1, 4):
        a.append(_batch("m", beat, beat * 1000), Heartbeat(beat * 1000, False))
    b.append(_batch("m", 10, 1000), Heartbeat(1500, True))

    assert list_receivers(uri) == ["host-a.udp-0", "host-b.udp-0"]
    segments = list_segments(uri, "host-a.udp-0")
    assert [s.sequence for s in segments] == [0, 1, 2]
    assert segments[0].path == f"{BUCKET}/roundtrip/host-a.udp-0/000000000000.arrow"
    assert [s.sequence for s in list_segments(uri, "host-a.udp-0", after=0, upto=1)] == [1]
    assert [s.sequence for s in segments_after(uri, "host-a.udp-0", 0)] == [1, 2]
    assert _sums(segments) == [1.0, 2.0, 3.0]
    beats = [read_heartbeat(s) for s in segments]
    assert beats == [Heartbeat(t, False) for t in (1000, 2000, 3000)]
    assert describe_spool(uri) == {
        "host-a.udp-0": {"segments": 3, "last_sequence": 2, "heartbeat_ms": 3000, "closed": False},
        "host-b.udp-0": {"segments": 1, "last_sequence": 0, "heartbeat_ms": 1500, "closed": True},
    }  # fmt: skip
    sizes = [spool.size(s.path) for s in [*segments, *list_segments(uri, "host-b.udp-0")]]
    assert spool_bytes(uri) == sum(sizes) and min(sizes) > 0
    assert segment_at(uri, "host-a.udp-0", 2).exists()
    assert not segment_at(uri, "host-a.udp-0", 3).exists()

    # A restarted writer continues its stream.
    SegmentWriter(uri, "host-a.udp-0").append(_batch("m", 4, 4000), Heartbeat(4000, True))
    assert [s.sequence for s in list_segments(uri, "host-a.udp-0")] == [0, 1, 2, 3]
    # Written to the final key in one request each: no temporary, no copy, no multipart.
    requests = [r for r in s3_server.requests() if "/roundtrip/" in r]
    writes = [r for r in requests if not r.startswith(("GET", "HEAD"))]
    assert writes == [
        f"PUT /{BUCKET}/roundtrip/{name} HTTP/1.1"
        for name in ("host-a.udp-0/000000000000.arrow", "host-a.udp-0/000000000001.arrow",
                     "host-a.udp-0/000000000002.arrow", "host-b.udp-0/000000000000.arrow",
                     "host-a.udp-0/000000000003.arrow")
    ]  # fmt: skip


def test_reading_a_segment_is_two_requests(s3_server: S3Server) -> None:
    """The whole object in one GET (after pyarrow's HEAD), not a ranged GET per IPC read."""
    uri = s3_server.uri()
    SegmentWriter(uri, "udp-0").append(_batch("m", 1, 1000), Heartbeat(1000, False))
    (segment,) = list_segments(uri, "udp-0")
    before = len(s3_server.requests())
    assert read_heartbeat(segment) == Heartbeat(1000, False) and _sums([segment]) == [1.0]
    key = f"/{segment.path} HTTP/1.1"
    assert s3_server.requests()[before:] == [f"{verb} {key}" for verb in ("HEAD", "GET") * 2]


def test_a_segment_queue_writes_in_order_on_s3(s3_server: S3Server) -> None:
    uri = s3_server.uri()
    queue = SegmentQueue(SegmentWriter(uri, "udp-0", fsync=False), depth=2)
    for beat in range(1, 6):
        queue.append(_batch("q", beat, beat * 1000), Heartbeat(beat * 1000, beat == 5))
    queue.close()
    assert queue.take_counts().segments_written == 5
    segments = list_segments(uri, "udp-0")
    assert _sums(segments) == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert read_heartbeat(segments[-1]) == Heartbeat(5000, True)


def _checkpoint(root: Path, receivers: dict[str, int]) -> Path:
    """A query checkpoint as Spark leaves it: ``commits/0`` and ``offsets/0`` (v1 format)."""
    (root / "commits").mkdir(parents=True)
    (root / "offsets").mkdir()
    (root / "commits" / "0").write_text("v1\n{}\n")
    offset = {"receivers": {name: {"seq": seq, "heartbeat_ms": 0, "closed": False}
                            for name, seq in receivers.items()}}  # fmt: skip
    (root / "offsets" / "0").write_text("v1\n{}\n" + json.dumps(offset) + "\n")
    return root


def test_retention_deletes_old_committed_segments_on_s3(
    s3_server: S3Server, tmp_path: Path
) -> None:
    uri = s3_server.uri()
    writer = SegmentWriter(uri, "r0")
    for beat in range(5):
        writer.append(_batch("m", beat, beat * 1000), Heartbeat(beat * 1000, False))
    checkpoints = [_checkpoint(tmp_path / "q1", {"r0": 3}), _checkpoint(tmp_path / "q2", {"r0": 4})]
    sizes = [resolve_spool(uri).size(s.path) for s in list_segments(uri, "r0")]

    young = prune_spool(uri, checkpoints, DAY_MS, ManualClock(10_000))
    assert young.deleted == 0  # committed, but younger than the retention age
    report = prune_spool(uri, checkpoints, DAY_MS, ManualClock(2 * DAY_MS))
    # Below the sequence every query committed (3), the committed one itself kept.
    assert (report.deleted, report.kept_uncommitted, report.bytes_freed) == (3, 2, sum(sizes[:3]))
    assert [s.sequence for s in list_segments(uri, "r0")] == [3, 4]
    # A later writer still continues after the newest segment, not after a deleted one.
    assert SegmentWriter(uri, "r0").next_sequence == 5


def test_a_local_path_and_a_file_uri_rename_into_place(tmp_path: Path) -> None:
    for location in (tmp_path / "plain", f"file://{tmp_path / 'uri'}"):
        spool = resolve_spool(location)
        assert isinstance(spool, LocalSpool) and spool.renames
        writer = SegmentWriter(location, "udp-0")
        (spool.path("udp-0") / ".000000000005.arrow.tmp").write_bytes(b"torn")  # a crash's
        info = writer.append(_batch("m", 7, 1000), Heartbeat(1500, False))
        assert isinstance(info.path, Path) and info.path.name == "000000000000.arrow"
        assert read_heartbeat(info.path) == Heartbeat(1500, False)  # a plain Path still reads
        SegmentWriter(location, "udp-0")  # a restart removes the temporary
        assert sorted(os.listdir(spool.path("udp-0"))) == ["000000000000.arrow"]
        assert _sums(list_segments(location, "udp-0")) == [7.0]


def test_credentials_are_masked_in_the_spool_name_and_in_errors(s3_server: S3Server) -> None:
    uri = s3_server.uri()
    spool = resolve_spool(uri)
    assert SECRET_KEY not in str(spool) and "***" in str(spool)
    with pytest.raises(ValueError, match="no_such_option") as caught:
        resolve_spool(uri + "&no_such_option=1")
    assert SECRET_KEY not in str(caught.value) and "***" in str(caught.value)
    in_query = "s3://bkt/p?access_key=AK&secret_key=SK-1&session_token=TOK-2&region=x"
    assert redact_location(in_query) == (
        "s3://bkt/p?access_key=AK&secret_key=***&session_token=***&region=x"
    )
    assert redact_secrets_in(f"cannot open {in_query}", in_query) == (
        "cannot open s3://bkt/p?access_key=AK&secret_key=***&session_token=***&region=x"
    )


def test_status_describes_an_s3_spool_without_its_credentials(
    s3_server: S3Server, tmp_path: Path
) -> None:
    uri = s3_server.uri()
    SegmentWriter(uri, "host-a").append(_batch("m", 1, 1000), Heartbeat(1000, True))
    done = subprocess.run(
        [sys.executable, "-m", "streamgauge", "status", "--json", "--data-dir", str(tmp_path),
         "--spool", uri],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["spool"] == {
        "host-a": {"segments": 1, "last_sequence": 0, "heartbeat_ms": 1000, "closed": True}
    }
    assert SECRET_KEY not in done.stdout + done.stderr


def test_an_object_store_outage_refuses_and_counts_then_writing_resumes(tmp_path: Path) -> None:
    """The S3 server goes away mid-stream (nothing listens on its port) and comes back empty
    (moto keeps objects in memory): the segments it could not take are refused and counted
    under ``spool_unavailable``, except the receiver's own rows, carried into the next segment
    so the refusal reaches the store; writes resume on the server's return without a gap in
    the sequence numbers."""
    port = free_tcp_port()
    with running_s3_server(tmp_path / "before", port) as server:
        uri = server.uri("outage")
        queue = SegmentQueue(
            SegmentWriter(uri, "udp-0", fsync=False), depth=0, unavailable_retry_s=(0.1, 0.1)
        )
        queue.append(_batch("q", 1, 1000), Heartbeat(1000, False))
        assert [s.sequence for s in list_segments(uri, "udp-0")] == [0]
        assert queue.take_counts().segments_written == 1
    queue.append(_batch("q", 2, 2000), Heartbeat(2000, False))  # retried, then refused
    own = _batch("streamgauge.ingest.lines", 7, 3000)  # the receiver's count: carried over
    queue.append(pa.concat_batches([_batch("q", 3, 3000), own]), Heartbeat(3000, False))
    counts = queue.take_counts()
    assert counts.refused_samples == {REFUSED_SPOOL_UNAVAILABLE: 2}
    assert counts.refused_partials == {REFUSED_SPOOL_UNAVAILABLE: 2}
    assert counts.segments_written == 0
    with running_s3_server(tmp_path / "after", port):
        queue.append(_batch("q", 4, 4000), Heartbeat(4000, True))
        queue.close()
        segments = list_segments(uri, "udp-0")
        assert [s.sequence for s in segments] == [1]  # refusals used no sequence number
        assert _sums(segments) == [7.0, 4.0]  # the own row of the refused segment first
        assert read_heartbeat(segments[0]) == Heartbeat(4000, True)
    assert queue.take_counts().segments_written == 1
