"""A window query's position against the log, as `status` and the status line show it: the
segments it has yet to read, those it read since the daemon started, its recent commit rate
and the time left. The log is written by the real segment writer; the checkpoint holds what
Spark's holds for these readers (``commits/<n>`` and ``offsets/<n>``, the commit's time)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
import pytest

from streamgauge.ingest.log import SEGMENT_SCHEMA, Heartbeat, SegmentWriter
from streamgauge.operator.catch_up import backlog, catch_up_now, last_sequences
from streamgauge.operator.status_table import render
from streamgauge.operator.terminal import catch_up_text

T0_S = 1_700_000_000


def _log(spool: Path, segments: dict[str, int]) -> None:
    for stream, count in segments.items():
        writer = SegmentWriter(spool, stream, fsync=False)
        for i in range(count):  # heartbeat segments: no rows, a receiver's progress
            empty = pa.RecordBatch.from_pylist([], SEGMENT_SCHEMA)
            writer.append(empty, Heartbeat(T0_S * 1000 + i * 250, False))


def _commits(checkpoint: Path, commits: Sequence[tuple[float, dict[str, int]]]) -> None:
    """Batch ``n`` committed at second ``at`` having read each stream up to ``seq``."""
    (checkpoint / "commits").mkdir(parents=True, exist_ok=True)
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    for batch, (at, through) in enumerate(commits):
        offsets = {"receivers": {name: {"seq": seq} for name, seq in through.items()}}
        (checkpoint / "offsets" / str(batch)).write_text("v1\n{}\n" + json.dumps(offsets) + "\n")
        commit = checkpoint / "commits" / str(batch)
        commit.write_text("v1\n{}\n")
        os.utime(commit, (T0_S + at, T0_S + at))


#   log: udp-0 seq 0..199, udp-1 seq 0..99 (300 segments)
#   case          commits (second: through)                started from     to do  done  per s
CASES = {
    "restarted behind": (
        [(0, {"udp-0": 49, "udp-1": 24}), (5, {"udp-0": 59, "udp-1": 29}),
         (10, {"udp-0": 69, "udp-1": 34})],
        {"udp-0": 49, "udp-1": 24}, 195, 30, 3.0),  # fmt: skip
    "keeping up": (
        [(0, {"udp-0": 189, "udp-1": 94}), (12, {"udp-0": 197, "udp-1": 98})],
        {"udp-0": 189, "udp-1": 94}, 3, 12, 1.0),  # fmt: skip
    "nothing committed yet": ([], {}, 300, 0, None),
}


@pytest.mark.parametrize("case", CASES)
def test_the_segments_to_read_those_read_since_start_and_the_rate(
    tmp_path: Path, case: str
) -> None:
    commits, started, to_do, done, per_s = CASES[case]
    spool, checkpoint = tmp_path / "spool", tmp_path / "checkpoints" / "w"
    _log(spool, {"udp-0": 200, "udp-1": 100})
    _commits(checkpoint, commits)
    assert last_sequences(spool) == {"udp-0": 199, "udp-1": 99}
    (late,) = backlog({"per_10s": checkpoint}, last_sequences(spool), {"per_10s": started})
    assert (late.window, late.to_do, late.done, late.per_s) == ("per_10s", to_do, done, per_s)
    assert late.catching_up == (case == "restarted behind")  # 65 s left at 3/s; 3 s left
    if per_s is not None:
        assert late.left_s == pytest.approx(to_do / per_s)


def test_status_shows_what_each_query_has_to_read_and_a_catch_up_s_progress(
    tmp_path: Path,
) -> None:
    spool, checkpoint = tmp_path / "spool", tmp_path / "checkpoints" / "w"
    _log(spool, {"udp-0": 200, "udp-1": 100})
    commits, started, *_ = CASES["restarted behind"]
    _commits(checkpoint, commits)
    (document,) = catch_up_now(spool, {"per_10s": checkpoint}, {"per_10s": started})
    assert catch_up_text(document) == "catch-up per_10s: 30/225 segments, 3/s, 1m05s left"
    window = {
        "config_name": "cfg", "window_name": "per_10s", "watermark_ms": T0_S * 1000,
        "watermark_lag_ms": 65_000, "windows_pending": 0, "windows_emitted": 12,
        "last_published_end": None, "late_samples": 0,
    }  # fmt: skip
    text = render({"data_dir": str(tmp_path), "windows": [window], "catch_up": [document]},
                  now_ms=T0_S * 1000)  # fmt: skip
    table = text.split("windows\n", 1)[1].splitlines()
    assert table[0].split()[-4:] == ["LATE", "LOG", "TO", "READ"]
    assert table[1].split()[-2:] == ["195", "segments"]
    assert table[2] == "  catch-up per_10s: 30/225 segments, 3/s, 1m05s left"
