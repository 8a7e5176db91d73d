"""The spool quota on the retention side: over the quota, committed segments go first, oldest
first, whatever their age; unread ones are never deleted for it (streamgauge/retention.py)."""

from __future__ import annotations

from pathlib import Path

from streamgauge.clock import ManualClock
from streamgauge.ingest.log import Heartbeat, SegmentWriter, list_segments, spool_bytes
from streamgauge.retention import QUOTA_HIGH_WATER, QUOTA_LOW_WATER, prune_spool
from tests.ingest.test_log import _batch
from tests.ingest.test_receiver import _commit

T0 = 1_700_000_000_000
DAY_MS = 86_400_000


def _spool(tmp_path: Path) -> tuple[Path, int]:
    """Two streams of five segments, heartbeats interleaved in time; the size of one."""
    spool = tmp_path / "spool"
    for index in range(5):
        for receiver, offset in (("udp-0", 0), ("udp-1", 500)):
            t = T0 + index * 1_000 + offset
            SegmentWriter(spool, receiver, fsync=False).append(
                _batch([b"a:1|c"], t), Heartbeat(t, False)
            )
    return spool, spool_bytes(spool) // 10


def test_over_the_quota_the_oldest_committed_segments_go_first(tmp_path: Path) -> None:
    spool, one = _spool(tmp_path)
    checkpoint = tmp_path / "checkpoints" / "cfg" / "w"
    _commit(checkpoint, 3, {"udp-0": 4, "udp-1": 2})  # udp-1: 3 and 4 not committed yet
    clock = ManualClock(T0 + 10_000)
    # without a quota, nothing this young goes
    assert prune_spool(spool, [checkpoint], DAY_MS, clock).deleted == 0
    quota = 7 * one
    report = prune_spool(spool, [checkpoint], DAY_MS, clock, quota_bytes=quota)
    assert spool_bytes(spool) <= QUOTA_LOW_WATER * quota
    assert report.deleted == 4 and report.bytes_freed == spool_bytes(spool) // 6 * 4
    # by heartbeat: udp-0/0, udp-1/0, udp-0/1, udp-1/1
    assert [s.sequence for s in list_segments(spool, "udp-0")] == [2, 3, 4]
    assert [s.sequence for s in list_segments(spool, "udp-1")] == [2, 3, 4]


def test_the_quota_never_deletes_what_the_job_has_not_committed(tmp_path: Path) -> None:
    spool, one = _spool(tmp_path)
    checkpoint = tmp_path / "checkpoints" / "cfg" / "w"
    _commit(checkpoint, 0, {"udp-0": 1})  # udp-1 not read at all
    report = prune_spool(spool, [checkpoint], DAY_MS, ManualClock(T0), quota_bytes=one)
    assert report.deleted == 1  # udp-0/0 only: below its committed sequence 1
    assert [s.sequence for s in list_segments(spool, "udp-0")] == [1, 2, 3, 4]
    assert len(list_segments(spool, "udp-1")) == 5
    # and with no checkpoint at all, nothing
    assert prune_spool(spool, [], DAY_MS, ManualClock(T0), quota_bytes=one).deleted == 0


def test_the_quota_pass_starts_below_the_quota_so_receivers_keep_room(tmp_path: Path) -> None:
    spool, one = _spool(tmp_path)
    checkpoint = tmp_path / "checkpoints" / "cfg" / "w"
    _commit(checkpoint, 3, {"udp-0": 4, "udp-1": 4})
    used = spool_bytes(spool)
    clock = ManualClock(T0 + 10_000)
    # at the high-water mark (95 %), nothing goes yet
    assert prune_spool(spool, [checkpoint], DAY_MS, clock,
                       quota_bytes=int(used / QUOTA_HIGH_WATER) + 1).deleted == 0  # fmt: skip
    # above it and still under the quota (97 %): down to the low-water mark, before any
    # receiver has to refuse data
    quota = int(used / 0.97)
    assert used < quota
    report = prune_spool(spool, [checkpoint], DAY_MS, clock, quota_bytes=quota)
    assert report.deleted == 1 and spool_bytes(spool) <= QUOTA_LOW_WATER * quota
    assert [s.sequence for s in list_segments(spool, "udp-0")] == [1, 2, 3, 4]
