"""The Spark window job on a hand-written segment log, writing to the real PostgreSQL.

Timeline (pane 1 s, tumbling 2 s, watermark_delay 1 s, lateness 1 s); a window appears once
the watermark W passes its end and is final once W passes end + lateness::

    event time (s)   0    1    2    3    4    5    6
    windows          [ w0  )[ w1  )[ w2  )[ w3  )
    segment 0        a@0.2 a@1.5 g=5@0.5        heartbeat 2.0
    segment 1        a@2.1 t=10@2.2 t=30@3.9    heartbeat 4.0 (W = 3.0: w0 final)
    segment 2        a@3.5 (straggler into w1)  heartbeat 6.0, closed (W = 5.0: w1 final)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from streamgauge.clock import ManualClock
from streamgauge.configs import parse_config
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import Heartbeat, SegmentWriter
from streamgauge.ingest.protocol import parse_line
from streamgauge.sinks.store import run_sql
from streamgauge.windows.plan import JobPaths
from tests.windows.jobrun import run_job_once

T0 = 1_700_000_000_000
CONFIG = """
name: jobtest
pane: 1s
windows:
  - name: per_2s
    kind: tumbling
    size: 2s
    watermark_delay: 1s
    allowed_lateness: 1s
    metrics: ["a", "g", "t"]
"""


def _segment(writer: SegmentWriter, events: list[tuple[bytes, int]], beat_ms: int, *,
             closed: bool = False) -> None:
    combiner = PaneCombiner(1000)
    for line, at_ms in events:
        samples = parse_line(line)
        assert isinstance(samples, list)
        for sample in samples:
            combiner.add(sample, T0 + at_ms, T0 + at_ms)
    writer.append(combiner.drain(), Heartbeat(T0 + beat_ms, closed))


def _run(spark: SparkSession, tmp_path: Path, url: str) -> None:
    paths = JobPaths(spool=tmp_path / "spool", checkpoints=tmp_path / "checkpoints")
    run_job_once(spark, parse_config(CONFIG, "test"), paths, url, ManualClock(T0))


def _rows(url: str) -> dict[tuple[str, int], dict[str, Any]]:
    columns, rows = run_sql(
        url,
        "select metric, (extract(epoch from window_start) * 1000)::bigint - %s as start_ms, "
        "count, sum, min, max, last, revision, is_final from window_results "
        "where config_name = 'jobtest'",
        [T0],
    )
    found: list[dict[str, Any]] = [dict(zip(columns, row, strict=True)) for row in rows]
    return {(r["metric"], r["start_ms"]): r for r in found}


def test_partials_become_windows_revised_by_stragglers_and_finalised_by_heartbeats(
    spark: SparkSession, tmp_path: Path, clean_store: str
) -> None:
    url = clean_store
    writer = SegmentWriter(tmp_path / "spool", "udp-0")
    _segment(writer, [(b"a:1|c", 200), (b"a:2|c|@0.5", 1_500), (b"g:5|g", 500)], 2_000)
    _segment(writer, [(b"a:1|c", 2_100), (b"t:10|ms", 2_200), (b"t:30|ms", 3_900)], 4_000)
    _run(spark, tmp_path, url)
    first = _rows(url)
    assert first[("a", 0)]["sum"] == 5.0 and first[("a", 0)]["count"] == 2
    assert first[("a", 0)]["is_final"] is True  # W = 4.0 - 1 = 3.0 >= end 2.0 + lateness 1.0
    assert first[("g", 0)]["last"] == 5.0 and first[("g", 0)]["sum"] is None
    # W = 3.0 has not passed the end of w1 [2, 4): not published; it waits among the job's
    # open windows, which the next run rebuilds from the log.
    assert ("a", 2000) not in first and ("t", 2000) not in first

    # A straggler for w1 arrives within its lateness, then the receiver closes.
    _segment(writer, [(b"a:4|c", 3_500)], 6_000, closed=True)
    _run(spark, tmp_path, url)
    second = _rows(url)
    assert second[("a", 2000)]["sum"] == 5.0 and second[("a", 2000)]["count"] == 2
    assert second[("a", 2000)]["is_final"] is True
    assert second[("t", 2000)]["min"] == 10.0 and second[("t", 2000)]["max"] == 30.0
    assert second[("t", 2000)]["is_final"] is True
    assert second[("a", 0)] == first[("a", 0)]  # untouched windows keep their revision

    # Nothing new in the log: running again changes nothing (exactly-once over the log).
    _run(spark, tmp_path, url)
    assert _rows(url) == second
    _, state = run_sql(
        url, "select key, value_ms from pipeline_state where config_name = 'jobtest'"
        " and key like 'watermark%' order by 1"
    )  # one query of the window, every type: one watermark
    assert state == [("watermark_ms:per_2s", T0 + 5_000)]
    offsets = sorted((tmp_path / "checkpoints" / "jobtest").glob("per_2s-*/offsets/*"),
                     key=lambda p: int(p.name))
    assert json.loads(offsets[-1].read_text().splitlines()[-1])["receivers"]["udp-0"]["closed"]
