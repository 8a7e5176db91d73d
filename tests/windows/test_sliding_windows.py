"""Sliding windows: the Spark operator against the reference windower.

Two levels:

- the ``applyInPandasWithState`` function itself, driven by a small stand-in for Spark's
  ``GroupState`` and micro-batch loop (Spark's watermark, its dropping of rows behind it, the
  event-time timeout), on seeded random logs: after every batch the operator's windows must
  be the reference's, and Spark must never have dropped a row (the horizon argument of
  ``sliding_horizon_ms``);
- the real queries (``slid_partials`` + ``SessionBatchWriter``, ``sliding_late_partials`` +
  ``LateBatchWriter``) on every sliding transcript, into PostgreSQL, built here the way
  ``job.start_window_queries`` builds the other kinds (until job.py starts sliding windows).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from streamgauge.clock import ManualClock
from streamgauge.configs import PipelineConfig, WindowSpec
from streamgauge.sinks.store import ResultStore, run_sql
from streamgauge.sketches.accuracy import SketchParams, compile_accuracy
from streamgauge.windows.job import (
    JobPaths,
    LateBatchWriter,
    SessionBatchWriter,
    checkpoint_dir,
    late_query_name,
    query_name,
)
from streamgauge.windows.reference import ReferenceWindower, project_tags
from streamgauge.windows.sliding_windows import (
    OUTPUT_COLUMNS,
    slid_partials,
    sliding_horizon_ms,
    sliding_late_partials,
    sliding_state_function,
)
from streamgauge.windows.source import SOURCE_NAME
from streamgauge.windows.window_sketches import OUTPUT_COLUMNS as SKETCH_COLUMNS
from tests.windows.test_transcripts import (
    HERE,
    check_expectations,
    check_sketches,
    reference_sketches,
    reference_state,
    stored_sketches,
    stored_state,
)
from tests.windows.transcript import T0, Transcript, load_transcript

SLIDING = sorted(HERE.glob("sliding_*.yaml"))


# -- the operator function, without Spark ----------------------------------------------------


@dataclass
class FakeGroupState:
    """What the function uses of ``pyspark.sql.streaming.state.GroupState``."""

    watermark_ms: int
    value: tuple[Any, ...] | None = None
    timed_out: bool = False
    timeout_ms: int | None = None

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple[Any, ...]:
        assert self.value is not None
        return self.value

    @property
    def hasTimedOut(self) -> bool:  # noqa: N802 (Spark's name)
        return self.timed_out

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value

    def remove(self) -> None:
        self.value = None
        self.timeout_ms = None

    def getCurrentWatermarkMs(self) -> int:  # noqa: N802 (Spark's name)
        return self.watermark_ms

    def setTimeoutTimestamp(self, timestamp_ms: int) -> None:  # noqa: N802 (Spark's name)
        assert timestamp_ms > self.watermark_ms, "Spark refuses a timeout behind the watermark"
        self.timeout_ms = timestamp_ms


@dataclass
class OperatorRun:
    """Spark's micro-batch loop around the state function, one batch per segment."""

    window: WindowSpec
    pane_ms: int
    params: SketchParams = field(default_factory=compile_accuracy)
    states: dict[tuple[str, str], tuple[Any, ...]] = field(default_factory=dict)
    timeouts: dict[tuple[str, str], int] = field(default_factory=dict)
    windows: dict[tuple[str, str, int], tuple[Any, ...]] = field(default_factory=dict)
    late: list[tuple[str, str, int, int]] = field(default_factory=list)
    max_event_ms: int = 0
    dropped_by_spark: int = 0
    late_entirely: int = 0  # rows of sliding_late_partials
    late_for_final_windows: int = 0  # "late" rows of the operator
    timeouts_fired: int = 0

    def batch(self, receiver: str, heartbeat_ms: int, prior_ms: int, rows: list[Any]) -> None:
        window = self.window
        assert window.size_ms is not None
        watermark = max(0, self.max_event_ms - sliding_horizon_ms(window, self.pane_ms))
        function = sliding_state_function(window, self.pane_ms, self.params)
        by_key: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for partial in rows:
            if not window.matches(partial.metric):
                continue
            t = min(partial.pane_start_ms, heartbeat_ms)
            tags = project_tags(partial.tags, window.group_by)
            closes_at = t + window.size_ms + window.allowed_lateness_ms
            if closes_at <= prior_ms - window.watermark_delay_ms:
                # sliding_late_partials: recorded with the left window's bounds
                start = t + self.pane_ms - window.size_ms
                self.late.append((partial.metric, tags, start, partial.count))
                self.late_entirely += 1
                continue
            if t < watermark:
                self.dropped_by_spark += 1
                continue
            row = {
                "metric": partial.metric, "tags": tags, "metric_type": partial.metric_type,
                "event_ms": t, "event_ts": None, "count": partial.count, "sum": partial.sum,
                "min": partial.min, "max": partial.max, "last": partial.last,
                "last_event_ms": partial.last_event_ms, "first_recv_ms": partial.first_recv_ms,
                "last_recv_ms": partial.last_recv_ms, "receiver": receiver,
                "pane_start_ms": partial.pane_start_ms, "segment_heartbeat_ms": heartbeat_ms,
                "prior_heartbeat_ms": prior_ms, "sketch": partial.sketch,
                "hdr_bucket": partial.hdr_bucket, "hdr_count": partial.hdr_count,
            }  # fmt: skip
            by_key.setdefault((partial.metric, tags), []).append(row)
            self.max_event_ms = max(self.max_event_ms, t)
        timed_out = {k for k, at in self.timeouts.items() if at <= watermark} - set(by_key)
        self.timeouts_fired += len(timed_out)
        for key in sorted(set(by_key) | timed_out):
            state = FakeGroupState(watermark, self.states.get(key), key in timed_out)
            frames: Iterator[pd.DataFrame] = iter(
                [pd.DataFrame(by_key[key])] if key in by_key else []
            )
            for out in function(key, frames, state):
                assert list(out.columns) == list(OUTPUT_COLUMNS)
                for row in out.itertuples(index=False):
                    if row.change == "upsert":
                        self.windows[(row.metric, row.tags, row.window_start_ms)] = (
                            row.window_end_ms, row.count, row.sum, row.min, row.max, row.last,
                            *(getattr(row, c) for c in SKETCH_COLUMNS),
                        )  # fmt: skip
                    else:
                        assert row.change == "late", row.change  # never "retract"
                        self.late.append((row.metric, row.tags, row.window_start_ms, row.count))
                        self.late_for_final_windows += 1
            if state.value is None:
                self.states.pop(key, None)
                self.timeouts.pop(key, None)
            else:
                self.states[key] = state.value
                assert state.timeout_ms is not None
                self.timeouts[key] = state.timeout_ms


def random_transcript(seed: int) -> Transcript:
    rng = random.Random(seed)
    size = rng.choice([1, 2, 3, 5])
    delay, lateness = rng.choice([0, 1, 2]), rng.choice([0, 1, 3])
    config = (
        "pane: 1s\nwindows:\n"
        f"  - {{name: s, kind: sliding, size: {size}s, watermark_delay: {delay}s, "
        f"allowed_lateness: {lateness}s, group_by: [host]}}\n"
    )
    lines = [f"name: random_{seed}", "config: |", *("  " + x for x in config.splitlines())]
    lines.append("segments:")
    heartbeat = 0
    count = rng.randint(3, 24)
    for index in range(count):
        heartbeat += rng.choice([0, 300, 700, 1000, 2500])
        samples = []
        for _ in range(rng.randint(0, 5)):
            back = rng.choice([0, 400, 1500, 3000, 6000, 9000])
            at = max(0, heartbeat - rng.randint(0, back))
            # host y goes quiet halfway: its state must be freed by the event-time timeout
            host = rng.choice(["x", "y"]) if index < count // 2 else "x"
            metric, kind = rng.choice([("a", "c"), ("t", "ms"), ("u", "s")])
            value = f"m{rng.randint(1, 30)}" if kind == "s" else rng.randint(1, 50)
            samples.append(f'{{at: {at}, line: "{metric}:{value}|{kind}|#host:{host}"}}')
        lines.append(
            f"  - {{receiver: r0, heartbeat: {heartbeat}, samples: [{', '.join(samples)}]}}"
        )
    return load_transcript("\n".join(lines) + "\n", f"random_{seed}")


@pytest.mark.parametrize("seed", range(60))
def test_operator_matches_the_reference_batch_by_batch(seed: int) -> None:
    transcript = random_transcript(seed)
    window = transcript.config.windows[0]
    assert window.size_ms is not None
    run = OperatorRun(window, transcript.config.pane_ms)
    reference = ReferenceWindower(transcript.config)
    prior: dict[str, int] = {}
    for segment in transcript.segments:
        run.batch(segment.receiver, segment.heartbeat_ms, prior.get(segment.receiver, 0),
                  list(segment.partials))  # fmt: skip
        prior[segment.receiver] = segment.heartbeat_ms
        reference.feed(segment)
        # Every window the reference holds and the operator still could change must agree;
        # windows the operator evicted are final and were last emitted with these values.
        # Sketch columns too, exactly: one batch per segment merges in the reference's order.
        expected = {
            (metric, tags, start): (start + window.size_ms, w.count, w.sum, w.min, w.max, w.last,
                                    *reference.merger.columns(w.sketches, w.metric_type))
            for (_, metric, tags), by_start in reference.sliding.items()
            for start, w in by_start.items()
        }  # fmt: skip
        assert run.windows == expected
        assert sorted(run.late) == sorted(
            (x.metric, x.tags, x.window_start_ms, x.count) for x in reference.late
        )
    assert run.dropped_by_spark == 0


def test_random_logs_reach_the_interesting_cases() -> None:
    """The seeds above exercise both kinds of late partial and the eviction of idle series."""
    totals = [0, 0, 0]
    for seed in range(60):
        transcript = random_transcript(seed)
        run = OperatorRun(transcript.config.windows[0], transcript.config.pane_ms)
        prior = 0
        for segment in transcript.segments:
            run.batch(segment.receiver, segment.heartbeat_ms, prior, list(segment.partials))
            prior = segment.heartbeat_ms
        totals[0] += run.late_entirely
        totals[1] += run.late_for_final_windows
        totals[2] += run.timeouts_fired
    assert all(total >= 10 for total in totals), totals  # entirely late, late, timeouts


# -- the Spark queries ---------------------------------------------------------------------


def start_sliding_queries(
    spark: SparkSession, config: PipelineConfig, paths: JobPaths, url: str
) -> list[StreamingQuery]:
    """What ``job.start_window_queries`` does for a sliding window (availableNow)."""
    queries = []
    for window in config.windows:
        assert window.kind == "sliding"
        checkpoint = checkpoint_dir(paths, config, window)
        late_checkpoint = checkpoint.with_name(checkpoint.name + ".late")
        writer = SessionBatchWriter(config, window, ResultStore(url), checkpoint, ManualClock(T0))
        plans = [
            (slid_partials(_spool(spark, paths), window, pane_ms=config.pane_ms),
             query_name(config, window), checkpoint, writer, "update"),
            (sliding_late_partials(_spool(spark, paths), window, pane_ms=config.pane_ms),
             late_query_name(config, window), late_checkpoint,
             LateBatchWriter(config, window, ResultStore(url)), "append"),
        ]  # fmt: skip
        for frame, name, location, sink, mode in plans:
            location.mkdir(parents=True, exist_ok=True)
            stream = (
                frame.writeStream.queryName(name)
                .outputMode(mode)
                .option("checkpointLocation", str(location))
                .foreachBatch(sink)
                .trigger(availableNow=True)
            )
            queries.append(stream.start())
    return queries


def _spool(spark: SparkSession, paths: JobPaths) -> Any:
    return spark.readStream.format(SOURCE_NAME).option("path", str(paths.spool)).load()


def run_sliding(spark: SparkSession, url: str, spool: Path, config: PipelineConfig) -> None:
    paths = JobPaths(spool=spool, checkpoints=spool.parent / "checkpoints")
    for query in start_sliding_queries(spark, config, paths, url):
        query.awaitTermination(180)
        assert query.exception() is None, query.exception()


@pytest.mark.parametrize("path", SLIDING, ids=[p.stem for p in SLIDING])
def test_spark_sliding_windows_store_what_the_reference_computes(
    path: Path, spark: SparkSession, clean_store: str, tmp_path: Path
) -> None:
    transcript = load_transcript(path.read_text(), path.name)
    transcript.write_spool(tmp_path / "spool")
    run_sliding(spark, clean_store, tmp_path / "spool", transcript.config)
    stored, stored_late = stored_state(clean_store, transcript.config)
    reference, reference_late = reference_state(transcript)
    assert stored == reference
    assert stored_late == reference_late
    check_expectations(transcript, stored)
    check_sketches(
        transcript, stored_sketches(clean_store, transcript.config), reference_sketches(transcript)
    )


def test_spark_sliding_batch_by_batch(
    spark: SparkSession, clean_store: str, tmp_path: Path
) -> None:
    """sliding_stragglers one micro-batch per segment: the same final state, and the window
    the straggler corrects was revised after it first appeared."""
    transcript = load_transcript((HERE / "sliding_stragglers.yaml").read_text(), "stragglers")
    spool = tmp_path / "spool"
    for count in range(1, len(transcript.segments) + 1):
        staging = tmp_path / f"staging-{count}"
        Transcript(transcript.name, transcript.config, transcript.segments[:count],
                   (), None).write_spool(staging)  # fmt: skip
        for source in sorted(staging.rglob("*.arrow")):
            target = spool / source.parent.name / source.name
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(source.read_bytes())
        run_sliding(spark, clean_store, spool, transcript.config)
    assert stored_state(clean_store, transcript.config) == reference_state(transcript)
    check_sketches(
        transcript, stored_sketches(clean_store, transcript.config), reference_sketches(transcript)
    )
    _, rows = run_sql(
        clean_store,
        "select (extract(epoch from window_start) * 1000)::bigint - %s, revision "
        "from window_results where config_name = %s order by 1",
        [T0, transcript.config.name],
    )
    revisions = {int(str(start)): int(str(revision)) for start, revision in rows}
    assert revisions[4000] > revisions[-2000]  # [4 s, 7 s) corrected by the straggler
