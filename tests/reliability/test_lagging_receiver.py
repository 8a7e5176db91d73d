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

import pyarrow as pa
import pytest
from pyspark.sql import SparkSession

from streamgauge.clock import ManualClock
from streamgauge.configs import parse_config
from streamgauge.ingest.log import SEGMENT_SCHEMA, Heartbeat, SegmentWriter
from streamgauge.sinks.store import ResultStore, run_sql
from streamgauge.windows.job import JobPaths, start_window_queries
from streamgauge.windows.reference import PanePartial, ReferenceWindower, Segment

T0 = 1_700_000_000_000
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
StoreKey = tuple[str, str, int]


class Spool:
    """Writes segments with chosen heartbeats and keeps what it wrote for the reference."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.writers: dict[str, SegmentWriter] = {}
        self.written: list[Segment] = []

    def segment(self, receiver: str, beat_s: int, values: dict[str, float], *,
                closed: bool = False) -> None:  # fmt: skip
        """One segment at heartbeat ``beat_s``: per metric, one partial in the pane before."""
        pane_ms = T0 + (beat_s - 1) * 1000
        partials = tuple(
            PanePartial(metric, "c" if metric.startswith("c") else "ms", "{}", pane_ms, 1,
                        value, value, value, value, pane_ms, pane_ms, pane_ms)
            for metric, value in sorted(values.items())
        )  # fmt: skip
        writer = self.writers.get(receiver) or SegmentWriter(self.path, receiver, fsync=False)
        self.writers[receiver] = writer
        writer.append(_batch(partials), Heartbeat(T0 + beat_s * 1000, closed))
        self.written.append(Segment(receiver, T0 + beat_s * 1000, closed, partials))

    def open_heartbeat_ms(self) -> int:
        newest: dict[str, Segment] = {}
        for segment in self.written:
            newest[segment.receiver] = segment
        beats = [s.heartbeat_ms for s in newest.values() if not s.closed]
        return min(beats) if beats else max(s.heartbeat_ms for s in newest.values())


def _batch(partials: tuple[PanePartial, ...]) -> pa.RecordBatch:
    rows = [p.__getattribute__ for p in partials]
    columns = [
        pa.array([row(f.name) for row in rows], f.type) if f.name in PanePartial.__slots__
        else pa.nulls(len(rows), f.type)
        for f in SEGMENT_SCHEMA
    ]  # fmt: skip
    return pa.RecordBatch.from_arrays(columns, schema=SEGMENT_SCHEMA)


def _run_job(spark: SparkSession, tmp_path: Path, spool: Path, url: str) -> int:
    """Process what the source admits and stop; the rows Spark dropped as behind its watermark."""
    paths = JobPaths(spool=spool, checkpoints=tmp_path / "checkpoints")
    dropped = 0
    for query in start_window_queries(
        spark, CONFIG, paths, lambda: ResultStore(url), ManualClock(T0), trigger_interval=None
    ):
        query.awaitTermination(120)
        assert query.exception() is None
        for progress in query.recentProgress:
            for operator in progress.stateOperators:
                dropped += operator.numRowsDroppedByWatermark
    return dropped


def _stored(url: str) -> dict[StoreKey, dict[str, Any]]:
    columns, rows = run_sql(
        url,
        "select metric, (extract(epoch from window_start) * 1000)::bigint as start_ms, "
        "(extract(epoch from window_end) * 1000)::bigint as end_ms, count, sum, min, max, "
        "is_final from window_results where config_name = 'lagging'",
    )
    found: list[dict[str, Any]] = [dict(zip(columns, row, strict=True)) for row in rows]
    return {("per_2s", r["metric"], r["start_ms"]): r for r in found}


def _expected(spool: Spool) -> dict[StoreKey, dict[str, Any]]:
    windower = ReferenceWindower(CONFIG)
    windower.feed_all(spool.written)
    return {
        (name, metric, start): {"end_ms": end, "count": w.count, "sum": w.sum, "min": w.min,
                                "max": w.max, "is_final": w.is_final}
        for (name, metric, _tags, start, end), w in windower.stored().items()
    }  # fmt: skip


def _check_nothing_closed_early(url: str, spool: Spool) -> dict[StoreKey, dict[str, Any]]:
    """Every emitted window has been passed by the slowest open receiver; returns the finals."""
    watermark = spool.open_heartbeat_ms() - DELAY_MS
    stored = _stored(url)
    for key, row in stored.items():
        assert row["end_ms"] <= watermark, f"{key} emitted before W={watermark} passed its end"
        if row["is_final"]:
            assert row["end_ms"] + LATENESS_MS <= watermark, f"{key} final too early"
    return {key: row for key, row in stored.items() if row["is_final"]}


def _values(row: dict[str, Any]) -> dict[str, Any]:
    return {k: row[k] for k in ("end_ms", "count", "sum", "min", "max", "is_final")}


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
    expected = _expected(spool)
    stored = {key: _values(row) for key, row in _stored(url).items()}
    assert stored == expected
    assert all(row["is_final"] for row in stored.values()) and len(stored) == 2 * 11
    for earlier in finals:  # a final window never changes afterwards
        for key, row in earlier.items():
            assert _values(row) == expected[key], key
    offsets = sorted((tmp_path / "checkpoints" / "lagging").glob("per_2s-*/offsets/*"))
    last = json.loads(offsets[-1].read_text().splitlines()[-1])["receivers"]
    assert {name: position["closed"] for name, position in last.items()} == {
        "fast": True, "slow": True,
    }  # fmt: skip
