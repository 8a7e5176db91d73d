"""The receiver process's garbage-collector schedule (collector.py): start-up frozen, full
collections only when the receiver runs them, on its own clock."""

from __future__ import annotations

import gc
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamgauge.clock import ManualClock
from streamgauge.ingest.collector import (
    NEVER,
    SWITCH_INTERVAL_S,
    FullCollections,
    settle_after_startup,
)
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import SegmentWriter, list_segments, read_segment
from streamgauge.ingest.receiver import UdpReceiver, bind_udp

T0 = 1_700_000_000_000


class _Stopwatch:
    """``monotonic_ns`` that a fake collection advances by ``pause_ms``."""

    def __init__(self, pause_ms: int) -> None:
        self.now_ns = 0
        self.pause_ms = pause_ms
        self.collected = 0

    def collect(self) -> int:
        self.collected += 1
        self.now_ns += self.pause_ms * 1_000_000
        return 0

    def monotonic_ns(self) -> int:
        return self.now_ns


@pytest.fixture()
def restored_gc() -> Iterator[None]:
    """settle_after_startup changes process-wide state: give pytest's back afterwards."""
    threshold, interval = gc.get_threshold(), sys.getswitchinterval()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
        sys.setswitchinterval(interval)


def test_settling_freezes_start_up_and_leaves_full_collections_to_the_receiver(
    restored_gc: None,
) -> None:
    kept = [[index] for index in range(1000)]  # containers the collector tracks
    frozen = settle_after_startup()
    # (not == get_freeze_count() later: frozen objects still die, e.g. on pytest's threads)
    assert frozen >= len(kept)
    assert not any(obj is kept for obj in gc.get_objects())  # out of the collector's reach
    assert gc.get_threshold()[2] == NEVER
    assert gc.get_threshold()[:2] == (700, 10)  # the young generations keep theirs
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)


def test_a_full_collection_runs_once_every_interval_and_its_pause_is_counted() -> None:
    watch = _Stopwatch(pause_ms=7)
    schedule = FullCollections(1000, collect=watch.collect, monotonic_ns=watch.monotonic_ns)
    pauses = [schedule.maybe_collect(T0 + at) for at in (0, 250, 999, 1000, 1500, 2100)]
    assert pauses == [None, None, None, 7, None, 7]
    assert watch.collected == 2


def test_the_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every_ms must be positive"):
        FullCollections(0)


def test_the_receiver_collects_after_its_rolls_and_reports_it(tmp_path: Path) -> None:
    sock = bind_udp("127.0.0.1", 0)
    clock = ManualClock(T0)
    watch = _Stopwatch(pause_ms=3)
    receiver = UdpReceiver(
        sock, SegmentWriter(tmp_path, "udp-0"), PaneCombiner(1000), clock,
        stats_path=tmp_path / "stats.json",
        full_collections=FullCollections(2000, watch.collect, watch.monotonic_ns),
    )  # fmt: skip
    for _ in range(9):  # a roll (and a heartbeat segment) every second, 0 s .. 8 s
        receiver.roll(clock.now_ms())
        clock.advance(1000)
    assert watch.collected == 4  # at 2, 4, 6 and 8 s
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert (stats["full_collections"], stats["full_collection_ms"]) == (4, 12)
    # ... and as self-metrics, each with the roll after it (8 s has none yet)
    rows = [row for segment in list_segments(tmp_path, "udp-0")
            for batch in read_segment(segment)
            for row in batch.to_pylist()]  # fmt: skip
    totals = {name: sum(row["sum"] for row in rows if row["metric"] == name)
              for name in ("streamgauge.ingest.full_collections",
                           "streamgauge.ingest.full_collection_ms")}  # fmt: skip
    assert totals == {"streamgauge.ingest.full_collections": 3,
                      "streamgauge.ingest.full_collection_ms": 9}  # fmt: skip
    sock.close()
