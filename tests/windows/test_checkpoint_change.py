"""A changed window definition gets a new checkpoint; its results must still reach the store.

Spark numbers a new checkpoint's micro-batches from 0 again, under the same query name. The
store must not take them for batches it already committed (they would be skipped), and their
rows must carry revisions above the stored ones (or lose the keep-the-highest upsert).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import cast

import pytest
from pyspark.sql import SparkSession

from streamgauge.clock import ManualClock
from streamgauge.configs import parse_config
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import Heartbeat, SegmentWriter
from streamgauge.ingest.protocol import Sample
from streamgauge.ingest.spool_fs import SpoolLike
from streamgauge.sinks.store import run_sql
from streamgauge.windows.plan import JobPaths, checkpoint_dir
from streamgauge.windows.results import REVISION_BASE_FILE
from tests.windows.jobrun import run_job_once

T0 = 1_700_000_000_000
CONFIG = """
name: upgrade
pane: 1s
windows:
  - {{name: per_4s, kind: tumbling, size: 4s, watermark_delay: {delay}, allowed_lateness: 0s}}
"""


def _segment(spool: SpoolLike, at_ms: int, value: float, beat_ms: int) -> None:
    combiner = PaneCombiner(1000)
    for metric, kind in (("c.requests", "c"), ("t.latency", "ms")):
        combiner.add(Sample(metric, kind, value, 1.0, ()), T0 + at_ms, T0 + at_ms)
    SegmentWriter(spool, "udp-0").append(combiner.drain(), Heartbeat(T0 + beat_ms, True))


def _rows(url: str) -> dict[tuple[str, int], tuple[int, int]]:
    _, rows = run_sql(
        url,
        "select metric, (extract(epoch from window_start) * 1000)::bigint - %s, count, revision"
        " from window_results where config_name = 'upgrade'",
        [T0],
    )
    typed = cast(list[tuple[str, int, int, int]], rows)  # text, bigint, bigint, bigint
    return {(m, start): (count, revision) for m, start, count, revision in typed}


def test_a_new_checkpoint_writes_above_the_stored_revisions_and_is_not_skipped(
    spark: SparkSession, tmp_path: Path, clean_store: str
) -> None:
    paths = JobPaths(spool=tmp_path / "spool", checkpoints=tmp_path / "checkpoints")
    before = parse_config(CONFIG.format(delay="0s"), "upgrade")
    _segment(paths.spool, 1_000, 1.0, 5_000)
    run_job_once(spark, before, paths, clean_store, ManualClock(T0))
    first = _rows(clean_store)
    assert {key: count for key, (count, _) in first.items()} == {
        ("c.requests", 0): 1, ("t.latency", 0): 1,
    }  # fmt: skip

    after = parse_config(CONFIG.format(delay="1s"), "upgrade")  # same name, new checkpoint
    assert checkpoint_dir(paths, after, after.windows[0]) != checkpoint_dir(
        paths, before, before.windows[0]
    )
    _segment(paths.spool, 5_000, 2.0, 10_000)
    run_job_once(spark, after, paths, clean_store, ManualClock(T0))
    second = _rows(clean_store)
    # The new window is there (its batch was not skipped as "already committed" under the
    # same query name), and every row the new checkpoint wrote is above everything stored
    # before it.
    assert {key: count for key, (count, _) in second.items()} == {
        ("c.requests", 0): 1, ("t.latency", 0): 1, ("c.requests", 4_000): 1,
        ("t.latency", 4_000): 1,
    }  # fmt: skip
    highest_before = max(revision for _, revision in first.values())
    assert all(second[key][1] > highest_before for key in second if key[1] == 4_000)
    marker = checkpoint_dir(paths, after, after.windows[0]) / REVISION_BASE_FILE
    # (each query reads the stored maximum when its own checkpoint first commits, so a query
    # of the window that starts second may start above the first one's new rows too)
    assert json.loads(marker.read_text())["revision_base"] >= highest_before

    # Run again with nothing new: the same checkpoint, the same base, nothing changes.
    run_job_once(spark, after, paths, clean_store, ManualClock(T0))
    assert _rows(clean_store) == second


HOPPING = """
name: upgrade
pane: 1s
windows:
  - {{name: per_4s_by_2s, kind: hopping, size: 4s, hop: 2s, watermark_delay: {delay},
      allowed_lateness: 0s}}
"""


def _counter_segment(
    spool: SpoolLike, at_ms: tuple[int, ...], beat_ms: int, sample: Sample | None = None
) -> None:
    """A segment of counter samples (``sample``, default ``c.requests:1|c``) at ``at_ms``."""
    combiner = PaneCombiner(1000)
    for at in at_ms:
        combiner.add(sample or Sample("c.requests", "c", 1.0, 1.0, ()), T0 + at, T0)
    SegmentWriter(spool, "udp-0").append(combiner.drain(), Heartbeat(T0 + beat_ms, True))


def test_a_new_checkpoint_rebuilds_hopping_panes_from_the_log_alone(
    spark: SparkSession, tmp_path: Path, clean_store: str
) -> None:
    """A hopping window's panes are held by the job between batches (``open_windows``), keyed
    by the first window each partial is on time for, and rebuilt from the log after a
    restart. A new checkpoint re-reads the whole log and must start from no panes: a pane the
    old definition made and the new one does not (a straggler on time under the old
    watermark_delay, late under the new) would otherwise still be merged into its windows,
    beside the straggler's row in late_events."""
    paths = JobPaths(spool=tmp_path / "spool", checkpoints=tmp_path / "checkpoints")
    before = parse_config(HOPPING.format(delay="1s"), "upgrade")
    _counter_segment(paths.spool, (1_000, 3_000), beat_ms=4_000)
    _counter_segment(paths.spool, (5_000, 7_000), beat_ms=8_000)
    # a straggler at 5 s after the heartbeat of 8 s: with a 1 s delay the watermark was 7 s,
    # on time for [4 s, 8 s); with no delay it is 8 s: late for it
    _counter_segment(paths.spool, (5_000,), beat_ms=8_500)
    run_job_once(spark, before, paths, clean_store, ManualClock(T0))
    first = _rows(clean_store)
    # [-2, 2) holds the sample at 1 s, [0, 4) those at 1 and 3 s, ...; [4, 8) is still open
    assert {start: count for (_, start), (count, _) in first.items()} == {
        -2_000: 1, 0: 2, 2_000: 2,
    }  # fmt: skip

    after = parse_config(HOPPING.format(delay="0s"), "upgrade")  # same name, new checkpoint
    _counter_segment(paths.spool, (9_000,), beat_ms=14_000)
    run_job_once(spark, after, paths, clean_store, ManualClock(T0))
    second = _rows(clean_store)
    assert {start: count for (_, start), (count, _) in second.items()} == {
        -2_000: 1, 0: 2, 2_000: 2, 4_000: 2, 6_000: 2, 8_000: 1,
    }  # fmt: skip
    highest_before = max(revision for _, revision in first.values())
    assert all(second[key][1] > highest_before for key in second if key not in first)
    _, late = run_sql(clean_store, "select (extract(epoch from window_start) * 1000)::bigint"
                      " - %s, count from late_events where config_name = 'upgrade'"
                      " order by window_start", [T0])  # fmt: skip
    # The straggler: late for [2 s, 6 s) under both definitions, for [4 s, 8 s) under the new
    # one only. The old run's row for [2 s, 6 s) came from a segment the new checkpoint read
    # again: it is replaced, not kept beside the new one (store.LateRowsReread).
    assert late == [(2_000, 1), (4_000, 1)]
    _, counted = run_sql(clean_store, "select (extract(epoch from window_start) * 1000)::bigint"
                         " - %s, late_events from window_results where late_events > 0"
                         " order by window_start", [T0])  # fmt: skip
    assert counted == [(2_000, 1), (4_000, 1)]


SESSION = """
name: upgrade
pane: 1s
windows:
  - {{name: s, kind: session, gap: 5s, key: user, watermark_delay: {delay},
      allowed_lateness: 1s}}
"""


USER_U1 = Sample("a", "c", 1.0, 1.0, (("user", "u1"),))


@pytest.mark.parametrize("second_delay, delete_checkpoint", [
    ("0s", False),  # a changed definition: a checkpoint of another name
    ("1s", True),  # the same definition, its checkpoint directory deleted: the same name
], ids=["changed definition", "deleted checkpoint"])  # fmt: skip
def test_a_new_session_checkpoint_records_each_late_partial_once(
    spark: SparkSession, tmp_path: Path, clean_store: str, second_delay: str,
    delete_checkpoint: bool,
) -> None:  # fmt: skip
    """A new checkpoint reads the retained log again and records its late partials again. The
    rows recorded before from those segments are replaced once, not kept beside the new ones
    (``store.LateRowsReread``, named by Spark's id of the checkpoint, not its directory's name:
    a directory deleted and made again is a new checkpoint too;
    tests/windows/transcripts/session_beyond_lateness.yaml has the same log)."""
    paths = JobPaths(spool=tmp_path / "spool", checkpoints=tmp_path / "checkpoints")
    _counter_segment(paths.spool, (0,), 1_000, USER_U1)
    _counter_segment(paths.spool, (7_000,), 8_000, USER_U1)
    # Under both definitions: 1.5 s is late in its own session [1 s, 6 s); 3 s reaches the
    # final [0 s, 5 s).
    _counter_segment(paths.spool, (1_500, 3_000), 8_500, USER_U1)
    _counter_segment(paths.spool, (), 20_000, USER_U1)

    def late_rows() -> list[tuple[int, int]]:
        return cast(list[tuple[int, int]], run_sql(
            clean_store, "select (extract(epoch from window_start) * 1000)::bigint"
            " - %s, count from late_events order by 1", [T0])[1])  # fmt: skip

    expected = [(0, 1), (1_000, 1)]
    run_job_once(spark, parse_config(SESSION.format(delay="1s"), "upgrade"), paths, clean_store,
                 ManualClock(T0))  # fmt: skip
    assert late_rows() == expected
    if delete_checkpoint:
        shutil.rmtree(paths.checkpoints)
    run_job_once(spark, parse_config(SESSION.format(delay=second_delay), "upgrade"), paths,
                 clean_store, ManualClock(T0))  # fmt: skip
    assert late_rows() == expected
    _, counted = run_sql(clean_store, "select (extract(epoch from window_start) * 1000)::bigint"
                         " - %s, late_events from window_results order by 1", [T0])  # fmt: skip
    assert counted == [(0, 1), (7_000, 0)]

