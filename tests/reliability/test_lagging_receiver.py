"""Two receivers writing one spool, one of them far behind the other.

The watermark is the slowest open receiver's heartbeat (minus ``watermark_delay``), so the
lagging receiver's data is never late; and Spark's own state, which follows the newest event
it has seen, must not run ahead of it either (the spool source holds the fast stream back, see
``streamgauge.windows.source``). Tumbling 2 s, delay 1 s, lateness 1 s::

    t (s)     0    2    4    6    8   10   12   14   16   18   20   22
    fast      ██████████████████████████████████████████████████|20    closed at 25
    slow      ██████████|4                                         step 1: 16 s behind
    slow      ██████████████████████████████|12                    step 2
    slow      █████████████████████████████████████████████████████|21   closed at 25

At every step only windows the slow receiver has passed may be in ``window_results`` (and
only those it passed by ``allowed_lateness`` may be final); a final window never changes
afterwards; and the end state equals the reference windower over the whole log.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession

from streamgauge.clock import ManualClock
from streamgauge.configs import parse_config
from streamgauge.sinks.store import run_sql
from streamgauge.windows.plan import JobPaths
from tests.reliability.segments import STORED_SQL, T0, Spool, keyed
from tests.windows.jobrun import run_job_once

CONFIG = parse_config(
    """
name: lagging
pane: 1s
windows:
  - name: per_2s
    kind: tumbling
    size: 2s
    watermark_delay: 1s
    allowed_lateness: 1s
""",
    "lagging",
)
DELAY_MS, LATENESS_MS = 1_000, 1_000
StoreKey = tuple[Any, ...]


def _run_job(spark: SparkSession, tmp_path: Path, spool: Path, url: str) -> int:
    """Process what the source admits and stop; the rows Spark dropped as behind its watermark."""
    paths = JobPaths(spool=spool, checkpoints=tmp_path / "checkpoints")
    dropped = 0
    for query in run_job_once(spark, CONFIG, paths, url, ManualClock(T0)):
        for progress in query.recentProgress:
            for operator in progress.stateOperators:
                dropped += operator.numRowsDroppedByWatermark
    return dropped


def _stored(url: str) -> dict[StoreKey, dict[str, Any]]:
    columns, rows = run_sql(url, STORED_SQL, ["lagging"])
    return keyed([dict(zip(columns, row, strict=True)) for row in rows])


def _check_nothing_closed_early(url: str, spool: Spool) -> dict[StoreKey, dict[str, Any]]:
    """Every emitted window has been passed by the slowest open receiver; returns the finals."""
    watermark = spool.open_heartbeat_ms() - DELAY_MS
    stored = _stored(url)
    for key, row in stored.items():
        assert row["end_ms"] <= watermark, f"{key} emitted before W={watermark} passed its end"
        if row["is_final"]:
            assert row["end_ms"] + LATENESS_MS <= watermark, f"{key} final too early"
    return {key: row for key, row in stored.items() if row["is_final"]}


@pytest.mark.timeout(300)
def test_watermark_follows_the_lagging_receiver_and_no_window_closes_early(
    spark: SparkSession, tmp_path: Path, clean_store: str
) -> None:
    url = clean_store
    spool = Spool(tmp_path / "spool")
    for beat in range(1, 21):
        spool.segment("fast", beat, {"c.req": 1, "t.lat": beat % 7})
    for beat in range(1, 5):
        spool.segment("slow", beat, {"c.req": 10, "t.lat": 100 + beat})
    dropped = _run_job(spark, tmp_path, spool.path, url)
    finals = [_check_nothing_closed_early(url, spool)]

    # The slow receiver catches up part of the way: every one of its rows is on time.
    for beat in range(5, 13):
        spool.segment("slow", beat, {"c.req": 10, "t.lat": 100 + beat})
    dropped += _run_job(spark, tmp_path, spool.path, url)
    finals.append(_check_nothing_closed_early(url, spool))

    # It catches up completely; both shut down cleanly (heartbeat-only closing segments).
    for beat in range(13, 22):
        spool.segment("slow", beat, {"c.req": 10, "t.lat": 100 + beat})
    spool.segment("slow", 25, {}, closed=True)
    spool.segment("fast", 25, {}, closed=True)
    dropped += _run_job(spark, tmp_path, spool.path, url)

    assert dropped == 0, "Spark dropped on-time rows behind its own watermark"
    expected = spool.expected(CONFIG)
    stored = _stored(url)
    assert stored == expected
    assert all(row["is_final"] for row in stored.values()) and len(stored) == 2 * 11
    for earlier in finals:  # a final window never changes afterwards
        for key, row in earlier.items():
            assert row == expected[key], key
    offsets = sorted((tmp_path / "checkpoints" / "lagging").glob("per_2s-*/offsets/*"),
                     key=lambda p: int(p.name))
    last = json.loads(offsets[-1].read_text().splitlines()[-1])["receivers"]
    assert {name: position["closed"] for name, position in last.items()} == {
        "fast": True, "slow": True,
    }  # fmt: skip
