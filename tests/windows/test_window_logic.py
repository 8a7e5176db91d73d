"""The driver-held window logic (``PaneWindowLogic``, ``SessionWindowLogic``) against the
reference windower.

Every transcript whose windows are all tumbling, hopping or session windows runs through the
logic one segment per batch, as the job runs it, with a minimal stand-in for the store's
upsert (the highest revision of a window wins; a retracted session goes; final by the last
watermark; late partials counted per window).
The stored values, finality, late counts and late partials must equal the reference's. The
same transcripts run through the real job and PostgreSQL in ``test_transcripts.py``.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from streamgauge.windows.pane_logic import Step
from streamgauge.windows.pane_writer import window_logic
from streamgauge.windows.reference import ReferenceWindower
from streamgauge.windows.source import receivers_heartbeat_ms
from tests.windows.test_transcripts import (
    check_quantiles,
    reference_sketches,
    reference_state,
    same_histogram,
)
from tests.windows.transcript import (
    T0,
    Transcript,
    _partials_batch,
    canonical_tags,
    load_transcript,
)

HERE = Path(__file__).parent / "transcripts"
DRIVER_KINDS = ("tumbling", "hopping", "session", "sliding")


def _pane_transcripts() -> list[Path]:
    found = []
    for path in sorted(HERE.glob("*.yaml")):
        transcript = load_transcript(path.read_text(), path.name)
        if all(w.kind in DRIVER_KINDS for w in transcript.config.windows):
            found.append(path)
    return found


TRANSCRIPTS = _pane_transcripts()


def _segment_rows(partials: Any, receiver: str, heartbeat: int, prior: int) -> pa.Table:
    batch = _partials_batch(partials)
    n = batch.num_rows
    return pa.Table.from_batches([batch]).append_column(
        "receiver", pa.array([receiver] * n, pa.string())
    ).append_column(
        "segment_heartbeat_ms", pa.array([heartbeat] * n, pa.int64())
    ).append_column("prior_heartbeat_ms", pa.array([prior] * n, pa.int64()))


def publish(
    name: str, step: Step, watermark: int | None, stored: dict[Any, dict[str, Any]],
    pending: dict[Any, dict[str, Any]],
) -> None:  # fmt: skip
    """The store's commit of a step: retractions, rows the watermark passed into ``stored``,
    the others into ``pending`` (``hold_after``), pending rows the watermark passed promoted
    unless the batch published their window itself (``_PROMOTE``)."""
    for row in step.retracted.to_pylist() if step.retracted is not None else []:
        key = (name, row["metric"], canonical_tags(row["tags"]), row["window_start_ms"] - T0)
        stored.pop(key, None)
        pending.pop(key, None)
    now = set()
    for row in step.publish.table.to_pylist():
        key = (name, row["metric"], canonical_tags(row["tags"]), row["window_start_ms"] - T0)
        if watermark is None or row["window_end_ms"] > watermark:
            pending[key] = row
            continue
        now.add(key)
        pending.pop(key, None)
        stored[key] = {**row, "late_events": stored.get(key, {}).get("late_events", 0)}
    for key, row in list(pending.items()):
        if key[0] == name and watermark is not None and row["window_end_ms"] <= watermark:
            del pending[key]
            if key not in now:
                stored[key] = {**row, "late_events": stored.get(key, {}).get("late_events", 0)}


def run_logic(transcript: Transcript) -> tuple[dict[Any, dict[str, Any]], list[Any]]:
    """The store's final state, and the late partials, after one batch per segment."""
    config = transcript.config
    logics = {w.name: window_logic(w, config.sketches, config.pane_ms) for w in config.windows}
    offsets: dict[str, dict[str, Any]] = {}
    stored: dict[Any, dict[str, Any]] = {}
    pending: dict[Any, dict[str, Any]] = {}
    late_rows: list[Any] = []
    for segment in transcript.segments:
        prior = offsets.get(segment.receiver, {}).get("heartbeat_ms", 0)
        offsets[segment.receiver] = {"heartbeat_ms": segment.heartbeat_ms,
                                     "closed": segment.closed}  # fmt: skip
        rows = _segment_rows(segment.partials, segment.receiver, segment.heartbeat_ms, prior)
        heartbeat = receivers_heartbeat_ms(offsets)
        for name, logic in logics.items():
            window = config.window(name)
            watermark = None if heartbeat is None else heartbeat - window.watermark_delay_ms
            if watermark is not None and logic.watermark_ms is not None:
                watermark = max(watermark, logic.watermark_ms)
            step = logic.step(rows, watermark)
            for row in step.late.to_pylist():
                late_rows.append((name, row["metric"], canonical_tags(row["tags"]),
                                  row["window_start_ms"] - T0, row["count"],
                                  row["window_end_ms"]))  # fmt: skip
            publish(name, step, watermark, stored, pending)
    for name, metric, tags, start, count, end in late_rows:
        held = stored.get((name, metric, tags, start))
        if held is not None and held["window_end_ms"] == end:
            held["late_events"] += count  # counted against the window's exact bounds
    for (name, *_rest), row in stored.items():
        window = config.window(name)
        final_before = logics[name].watermark_ms
        row["final"] = final_before is not None and (
            row["window_end_ms"] + window.allowed_lateness_ms <= final_before)
    return stored, sorted(row[:5] for row in late_rows)


_NULLS = {"c": ("min", "max", "last"), "g": ("sum",), "s": ("sum", "min", "max", "last")}
_NULLS |= {t: ("last",) for t in ("ms", "h", "d")}


def check_stored(transcript: Transcript) -> None:
    """The logic's stored rows and late partials equal the reference's."""
    stored, late = run_logic(transcript)
    expected, expected_late = reference_state(transcript)
    # An open window's early row is the store's doing (``_EARLY``), not the logic's.
    expected = {key: row for key, row in expected.items() if row["early"] is None}
    assert set(stored) == set(expected)
    for key, ref in expected.items():
        got = stored[key]
        values = {"type": got["metric_type"], "count": got["count"], "sum": got["sum"],
                  "min": got["min"], "max": got["max"], "last": got["last"],
                  "final": got["final"], "late_events": got["late_events"],
                  "end": got["window_end_ms"] - T0}  # fmt: skip
        for name in _NULLS.get(got["metric_type"], ()):
            values[name] = None
        assert values == {k: v for k, v in ref.items() if k != "early"}, key
    assert late == expected_late


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[p.stem for p in TRANSCRIPTS])
def test_logic_stores_what_the_reference_stores(path: Path) -> None:
    check_stored(load_transcript(path.read_text(), path.name))


def random_transcript(seed: int, kind: str) -> Transcript:
    """A seeded log of one receiver: heartbeats that stall or jump, partials up to 9 s behind
    them (stragglers, late ones), three metric types, two hosts of which one goes quiet."""
    rng = random.Random(seed)
    delay, lateness = rng.choice([0, 1, 2]), rng.choice([0, 1, 3])
    if kind == "session":
        shape = f"gap: {rng.choice([1, 2, 3])}s, key: host"
    else:
        shape = f"size: {rng.choice([1, 2, 3, 5])}s, group_by: [host]"
    config = (
        "pane: 1s\nwindows:\n"
        f"  - {{name: s, kind: {kind}, {shape}, watermark_delay: {delay}s, "
        f"allowed_lateness: {lateness}s}}\n"
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
            host = rng.choice(["x", "y"]) if index < count // 2 else "x"
            metric, type_ = rng.choice([("a", "c"), ("t", "ms"), ("u", "s")])
            value = f"m{rng.randint(1, 30)}" if type_ == "s" else rng.randint(1, 50)
            samples.append(f'{{at: {at}, line: "{metric}:{value}|{type_}|#host:{host}"}}')
        lines.append(
            f"  - {{receiver: r0, heartbeat: {heartbeat}, samples: [{', '.join(samples)}]}}"
        )
    return load_transcript("\n".join(lines) + "\n", f"random_{seed}")


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("kind", ["sliding", "session"])
def test_random_logs_store_what_the_reference_stores(kind: str, seed: int) -> None:
    check_stored(random_transcript(seed, kind))


@pytest.mark.parametrize("kind", ["sliding", "session"])
def test_random_logs_reach_late_partials_and_corrections(kind: str) -> None:
    """The seeds above hold late partials and windows published more than once."""
    late = corrected = 0
    for seed in range(40):
        transcript = random_transcript(seed, kind)
        late += len(reference_state(transcript)[1])
        windower = ReferenceWindower(transcript.config)
        windower.track_emissions = True
        windower.feed_all(transcript.segments)
        emitted = [key for batch in windower.emissions for key in batch]
        corrected += len(emitted) - len(set(emitted))
    assert late >= 20 and corrected >= 20, (late, corrected)


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[p.stem for p in TRANSCRIPTS])
def test_logic_sketches_agree_with_the_reference(path: Path) -> None:
    transcript = load_transcript(path.read_text(), path.name)
    stored, _ = run_logic(transcript)
    rank_error = transcript.config.sketches.quantile_rank_error
    open_windows, _ = reference_state(transcript)
    for key, ref in reference_sketches(transcript).items():
        if open_windows[key]["early"] is not None:
            continue  # an open window's early row: the store's (``_EARLY``)
        got = stored[key]
        assert same_histogram(transcript, got["hdr_histogram"], ref["hdr_histogram"]), key
        if ref["type"] == "s":
            assert got["distinct_count"] == ref["distinct_count"], key
        if ref["p50"] is None:
            assert got["p50"] is None, key
            continue
        check_quantiles(ref["sketch"], got["sketch"], got, rank_error, key)


def _run_with_restart(transcript: Transcript, restart_after: int) -> dict[Any, Any]:
    """``run_logic``'s published rows, the logic replaced after ``restart_after`` segments by
    one rebuilt from the log (the logic's ``rebuild``), as a restarted job does."""
    config = transcript.config
    logics = {w.name: window_logic(w, config.sketches, config.pane_ms) for w in config.windows}
    offsets: dict[str, dict[str, Any]] = {}
    tables: list[pa.Table] = []
    stored: dict[Any, dict[str, Any]] = {}
    pending: dict[Any, dict[str, Any]] = {}
    for index, segment in enumerate(transcript.segments):
        if index == restart_after:
            for name, old in list(logics.items()):
                fresh = window_logic(config.window(name), config.sketches, config.pane_ms)
                since = old.resume_from_ms()
                kept = [t.filter(pc.greater_equal(t.column("segment_heartbeat_ms"),
                                                          since if since is not None else 0))
                        for t in tables]  # fmt: skip
                fresh.rebuild(kept, old.watermark_ms)
                logics[name] = fresh
        prior = offsets.get(segment.receiver, {}).get("heartbeat_ms", 0)
        offsets[segment.receiver] = {"heartbeat_ms": segment.heartbeat_ms,
                                     "closed": segment.closed}  # fmt: skip
        rows = _segment_rows(segment.partials, segment.receiver, segment.heartbeat_ms, prior)
        tables.append(rows)
        heartbeat = receivers_heartbeat_ms(offsets)
        for name, logic in logics.items():
            window = config.window(name)
            watermark = None if heartbeat is None else heartbeat - window.watermark_delay_ms
            if watermark is not None and logic.watermark_ms is not None:
                watermark = max(watermark, logic.watermark_ms)
            publish(name, logic.step(rows, watermark), watermark, stored, pending)
    return {
        key: (row["count"], row["sum"], row["min"], row["max"], row["last"], row["p50"],
              row["distinct_count"])
        for key, row in stored.items()
    }  # fmt: skip


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[p.stem for p in TRANSCRIPTS])
def test_a_restart_rebuilds_the_open_windows_from_the_log(path: Path) -> None:
    """Replacing the logic after any segment by one rebuilt from the segments the log holds
    since ``resume_from_ms`` publishes the same windows with the same values."""
    transcript = load_transcript(path.read_text(), path.name)
    straight = _run_with_restart(transcript, restart_after=-1)
    for restart_after in range(1, len(transcript.segments)):
        assert _run_with_restart(transcript, restart_after) == straight, restart_after


def joins_behind(transcript: Transcript) -> bool:
    """Whether a receiver's first segment comes after a segment of another receiver with a
    later heartbeat."""
    newest = None
    seen: set[str] = set()
    for segment in transcript.segments:
        if segment.receiver not in seen and newest is not None and newest > segment.heartbeat_ms:
            return True
        seen.add(segment.receiver)
        newest = max(newest or segment.heartbeat_ms, segment.heartbeat_ms)
    return False


@pytest.mark.parametrize("path", TRANSCRIPTS, ids=[p.stem for p in TRANSCRIPTS])
def test_one_batch_of_the_whole_log_publishes_the_same_windows(path: Path) -> None:
    """The whole log in one batch (a restart's catch-up, ``availableNow``): a window whose
    partials and closing come in the same batch is published before it leaves, with the
    values one batch per segment gives."""
    transcript = load_transcript(path.read_text(), path.name)
    if joins_behind(transcript):
        pytest.skip("a receiver joins behind another: whether its first segment is late "
                    "follows the watermark committed before its batch (a final window stays "
                    "final), so one batch differs by design")  # fmt: skip
    config = transcript.config
    offsets: dict[str, dict[str, Any]] = {}
    tables = []
    for segment in transcript.segments:
        prior = offsets.get(segment.receiver, {}).get("heartbeat_ms", 0)
        offsets[segment.receiver] = {"heartbeat_ms": segment.heartbeat_ms,
                                     "closed": segment.closed}  # fmt: skip
        tables.append(_segment_rows(segment.partials, segment.receiver, segment.heartbeat_ms,
                                    prior))  # fmt: skip
    heartbeat = receivers_heartbeat_ms(offsets)
    assert heartbeat is not None
    per_segment = _run_with_restart(transcript, restart_after=-1)
    for window in config.windows:
        logic = window_logic(window, config.sketches, config.pane_ms)
        watermark = heartbeat - window.watermark_delay_ms
        step = logic.step(pa.concat_tables(tables), watermark)
        got = {(window.name, r["metric"], canonical_tags(r["tags"]),
                r["window_start_ms"] - T0): r["count"]
               for r in step.publish.table.to_pylist()
               if r["window_end_ms"] <= watermark}  # fmt: skip
        expected = {key: values[0] for key, values in per_segment.items() if key[0] == window.name}
        assert got == expected
