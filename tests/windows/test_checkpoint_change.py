"""A changed window definition gets a new checkpoint; its results must still reach the store.

Spark numbers a new checkpoint's micro-batches from 0 again, under the same query name. The
store must not take them for batches it already committed (they would be skipped), and their
rows must carry revisions above the stored ones (or lose the keep-the-highest upsert).
"""

from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql import SparkSession

from streamgauge.clock import ManualClock
from streamgauge.configs import parse_config
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import Heartbeat, SegmentWriter
from streamgauge.ingest.protocol import Sample
from streamgauge.sinks.store import run_sql
from streamgauge.windows.job import REVISION_BASE_FILE, JobPaths, checkpoint_dir
from tests.windows.jobrun import run_job_once

T0 = 1_700_000_000_000
CONFIG = """
name: upgrade
pane: 1s
windows:
  - {{name: per_4s, kind: tumbling, size: 4s, watermark_delay: {delay}, allowed_lateness: 0s}}
"""


def _segment(spool: Path, at_ms: int, value: float, beat_ms: int) -> None:
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
    return {(m, start): (count, revision) for m, start, count, revision in rows}


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
    # The new window is there (before the fix its batch was skipped as "already committed"),
    # and every row the new checkpoint wrote is above everything stored before it.
    assert {key: count for key, (count, _) in second.items()} == {
        ("c.requests", 0): 1, ("t.latency", 0): 1, ("c.requests", 4_000): 1,
        ("t.latency", 4_000): 1,
    }  # fmt: skip
    highest_before = max(revision for _, revision in first.values())
    assert all(second[key][1] > highest_before for key in second if key[1] == 4_000)
    marker = checkpoint_dir(paths, after, after.windows[0]) / REVISION_BASE_FILE
    # (each lane reads the stored maximum when its own checkpoint first commits, so the lane
    # that starts second may start above the first lane's new rows too)
    assert json.loads(marker.read_text())["revision_base"] >= highest_before

    # Run again with nothing new: the same checkpoint, the same base, nothing changes.
    run_job_once(spark, after, paths, clean_store, ManualClock(T0))
    assert _rows(clean_store) == second
