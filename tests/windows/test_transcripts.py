"""Every transcript through both engines: the reference windower and the Spark job.

The Spark side writes the transcript's segments as a real segment log, runs the real window
queries (``availableNow``) into the real PostgreSQL, and the stored final state must equal
the reference's and the transcript's expectations. ``test_batching_does_not_change_the_result``
runs one transcript a segment at a time, one micro-batch per segment, to show the final
state does not depend on how Spark cuts batches. A transcript listing ``emits`` (early
emission, ``early_every``) runs that way too, and each batch's written rows are compared.
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any, TypedDict, cast

import pytest
from pyspark.sql import SparkSession

from streamgauge.clock import ManualClock
from streamgauge.configs import PipelineConfig
from streamgauge.sinks.store import ResultStore, run_sql
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.tdigest import deserialize_tdigest
from streamgauge.windows.plan import JobPaths
from streamgauge.windows.reference import ReferenceWindower, StoredWindow, WindowKey
from streamgauge.windows.replay import parse_time_ms, replay
from tests.windows.jobrun import run_job_once
from tests.windows.transcript import (
    T0,
    StateKey,
    Transcript,
    TranscriptError,
    canonical_tags,
    expected_rows,
    expected_sketches,
    expected_state,
    load_transcript,
)

HERE = Path(__file__).parent / "transcripts"
VALID = sorted(HERE.glob("*.yaml"))
INVALID = sorted((HERE / "invalid").glob("*.yaml"))


State = tuple[dict[StateKey, dict[str, Any]], list[Any]]


def _load(path: Path) -> Transcript:
    return load_transcript(path.read_text(), path.name)


def reference_windower(transcript: Transcript) -> ReferenceWindower:
    windower = ReferenceWindower(
        transcript.config, track_emissions=transcript.expected_emits is not None
    )
    windower.feed_all(transcript.segments)
    return windower


def _reference_rows(rows: dict[WindowKey, StoredWindow]) -> dict[StateKey, dict[str, Any]]:
    return {
        (name, metric, canonical_tags(tags), start - T0): {
            "type": w.metric_type, "count": w.count, "sum": w.sum, "min": w.min, "max": w.max,
            "last": w.last, "final": w.is_final, "late_events": w.late_events,
            "end": end - T0, "early": None if w.early_as_of is None else w.early_as_of - T0,
        }
        for (name, metric, tags, start, end), w in rows.items()
    }  # fmt: skip


def reference_emissions(transcript: Transcript) -> list[dict[StateKey, dict[str, Any]]]:
    """The rows each segment's micro-batch writes, per the reference."""
    return [_reference_rows(rows) for rows in reference_windower(transcript).emissions]


def reference_state(transcript: Transcript, *, after_replay: bool = False) -> State:
    """The reference's stored state (``after_replay``: as after `streamgauge replay`)."""
    windower = reference_windower(transcript)
    state = _reference_rows(windower.stored(after_replay=after_replay))
    late = sorted(
        (x.window_name, x.metric, canonical_tags(x.tags), x.window_start_ms - T0, x.count)
        for x in windower.late
    )
    return state, late


def stored_state(url: str, config: PipelineConfig) -> State:
    columns, rows = run_sql(
        url,
        "select window_name, metric, tags, "
        "(extract(epoch from window_start) * 1000)::bigint - %s as start, "
        "(extract(epoch from window_end) * 1000)::bigint - %s as end, metric_type, count, "
        "sum, min, max, last, is_final, late_events, "
        "(extract(epoch from early_as_of) * 1000)::bigint - %s as early "
        "from window_results where config_name = %s",
        [T0, T0, T0, config.name],
    )
    state: dict[StateKey, dict[str, Any]] = {}
    for row in rows:
        r: dict[str, Any] = dict(zip(columns, row, strict=True))  # one SQL row, by column
        key = (r["window_name"], r["metric"], canonical_tags(r["tags"]), r["start"])
        # Two rows with one start: a session stored twice (a superseded one not retracted).
        assert key not in state, f"two windows start at {key}: {state[key]['end']}, {r['end']}"
        state[key] = {
            "end": r["end"],
            "type": r["metric_type"], "count": r["count"], "sum": r["sum"], "min": r["min"],
            "max": r["max"], "last": r["last"], "final": r["is_final"],
            "late_events": r["late_events"], "early": r["early"],
        }  # fmt: skip
    _, late_rows = run_sql(
        url,
        "select window_name, metric, tags, "
        "(extract(epoch from window_start) * 1000)::bigint - %s, count "
        "from late_events where config_name = %s",
        [T0, config.name],
    )
    typed = cast(list[tuple[str, str, object, int, int]], late_rows)  # text, text, jsonb, bigints
    late = sorted((w, m, canonical_tags(t), int(s), int(c)) for w, m, t, s, c in typed)
    return state, late


_SKETCH_COLUMNS = ("p50", "p90", "p99", "p999", "distinct_count", "sketch", "hdr_histogram")
_QUANTILES = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}


def reference_sketches(
    transcript: Transcript, *, after_replay: bool = False
) -> dict[StateKey, dict[str, Any]]:
    """The reference's sketch columns and ``window_histograms`` rows per stored window."""
    windower = ReferenceWindower(transcript.config)
    windower.feed_all(transcript.segments)
    return {
        (name, metric, canonical_tags(tags), start - T0): {
            **{column: getattr(w, column) for column in _SKETCH_COLUMNS},
            "histogram": list(w.histogram),
            "type": w.metric_type,
        }
        for (name, metric, tags, start, _end), w in windower.stored(
            after_replay=after_replay).items()
    }


def stored_sketches(url: str, config: PipelineConfig) -> dict[StateKey, dict[str, Any]]:
    """The same from PostgreSQL; fails if a bucket row belongs to no stored window (a
    retracted session's, say): every histogram row must describe a window that exists."""
    columns, rows = run_sql(
        url,
        f"select window_name, metric, tags, (extract(epoch from window_start) * 1000)::bigint"
        f" - %s as start, {', '.join(_SKETCH_COLUMNS)} from window_results"
        " where config_name = %s",
        [T0, config.name],
    )
    state: dict[StateKey, dict[str, Any]] = {}
    for row in rows:
        r: dict[str, Any] = dict(zip(columns, row, strict=True))  # one SQL row, by column
        key = (r["window_name"], r["metric"], canonical_tags(r["tags"]), r["start"])
        sketch = None if r["sketch"] is None else bytes(r["sketch"])
        state[key] = {**{c: r[c] for c in _SKETCH_COLUMNS}, "sketch": sketch, "histogram": []}
    _, buckets = run_sql(
        url,
        "select h.window_name, h.metric, h.tags, "
        "(extract(epoch from h.window_start) * 1000)::bigint - %s, h.bucket, h.count, "
        "w.window_name is not null or p.window_name is not null "
        "from window_histograms h "
        "left join window_results w using (config_name, window_name, metric, tags, "
        "window_start, window_end) "
        "left join window_pending p using (config_name, window_name, metric, tags, "
        "window_start, window_end) "
        "where h.config_name = %s order by 1, 2, 3, 4, 5",
        [T0, config.name],
    )
    for name, metric, tags, start, bucket, count, exists in buckets:
        assert exists, f"stale bucket rows of {name} {metric} {tags} at {start}"
        key = (str(name), str(metric), canonical_tags(tags), int(str(start)))
        if key in state:  # else pending: not compared
            state[key]["histogram"].append((bucket, count))
    return state


def same_histogram(transcript: Transcript, got: str | None, expected: str | None) -> bool:
    """Whether two HdrHistogram V2 encodings hold the same histogram (two encoders may
    compress the same counts differently)."""
    if got is None or expected is None:
        return got is expected
    layout = HdrLayout.from_params(transcript.config.sketches)
    ours, theirs = layout.decode(got), layout.decode(expected)
    return bool((ours[0] == theirs[0]).all() and (ours[1] == theirs[1]).all()) and len(
        ours[0]) == len(theirs[0])  # fmt: skip


def check_quantiles(
    expected_sketch: bytes, got_sketch: bytes, got: dict[str, Any], rank_error: float, key: Any,
    quantiles: dict[str, float] = _QUANTILES,
) -> None:
    """A window's stored digest holds the expected digest's weight, and each stored quantile's
    rank in the expected digest is within the rank error of its ``q`` (digests merged in
    another order differ, their quantiles by at most that)."""
    digest = deserialize_tdigest(expected_sketch)
    weight = digest.get_total_weight()
    assert deserialize_tdigest(got_sketch).get_total_weight() == weight, key
    for column, q in quantiles.items():
        rank = digest.get_rank(got[column])
        assert abs(rank - q) <= rank_error + 1 / weight, (key, column, got[column], rank)


def check_sketches(
    transcript: Transcript,
    stored: dict[StateKey, dict[str, Any]],
    reference: dict[StateKey, dict[str, Any]],
    *,
    after_replay: bool = False,
) -> None:
    """Spark's sketch columns against the reference's (and the transcript's expectations).

    - Always exact: ``window_histograms`` rows, the HdrHistogram encoding and distinct counts
      (HDR counts add per bucket, HLL unions take the maximum per register: order-free).
    - Quantiles: the job merges a batch's partials per window at once (and a merge of
      sessions by start), the reference one partial at a time, so the digests differ in merge
      order: each stored quantile's rank in the reference's digest is within the digest's rank
      error of its ``q``, and both digests hold the same weight.
    """
    assert set(stored) == set(reference)
    rank_error = transcript.config.sketches.quantile_rank_error
    for key, ref in reference.items():
        got = stored[key]
        assert got["histogram"] == ref["histogram"], key
        assert same_histogram(transcript, got["hdr_histogram"], ref["hdr_histogram"]), key
        assert got["distinct_count"] == ref["distinct_count"], key
        if ref["p50"] is None:
            assert got["p50"] is None, key
            continue
        check_quantiles(ref["sketch"], got["sketch"], got, rank_error, key)
    for key, fields in expected_sketches(transcript, after_replay=after_replay).items():
        assert {name: reference[key][name] for name in fields} == fields, key


def run_spark(spark: SparkSession, url: str, spool: Path, config: PipelineConfig) -> None:
    paths = JobPaths(spool=spool, checkpoints=spool.parent / "checkpoints")
    run_job_once(spark, config, paths, url, ManualClock(T0))


def check_expectations(
    transcript: Transcript, state: dict[StateKey, dict[str, Any]], *, after_replay: bool = False
) -> None:
    expected = expected_state(transcript, after_replay=after_replay)
    check_rows(expected, state, "after replay" if after_replay else "windows")


def check_rows(
    expected: dict[StateKey, dict[str, Any]], state: dict[StateKey, dict[str, Any]], what: str
) -> None:
    assert set(state) == set(expected), f"{what} differ from the transcript's expectations"
    for key, fields in expected.items():
        actual = {name: state[key][name] for name in fields}
        assert actual == fields, (what, key)


def check_emissions(
    transcript: Transcript, emissions: list[dict[StateKey, dict[str, Any]]]
) -> None:
    """Each segment's batch wrote exactly the rows its ``emits`` lists."""
    assert transcript.expected_emits is not None
    assert len(emissions) == len(transcript.expected_emits)
    for index, (rows, expected) in enumerate(
        zip(emissions, transcript.expected_emits, strict=True)
    ):
        check_rows(expected_rows(expected), rows, f"segments[{index}].emits")


def _revisions(url: str, config: PipelineConfig) -> dict[StateKey, int]:
    _, rows = run_sql(
        url,
        "select window_name, metric, tags, "
        "(extract(epoch from window_start) * 1000)::bigint - %s, revision "
        "from window_results where config_name = %s",
        [T0, config.name],
    )
    return {(str(w), str(m), canonical_tags(t), int(str(s))): int(str(r))
            for w, m, t, s, r in rows}  # fmt: skip


def append_segment(transcript: Transcript, count: int, spool: Path, staging: Path) -> None:
    """Add the transcript's ``count``-th segment to the live ``spool``, as a receiver would."""
    partial = Transcript(
        transcript.name, transcript.config, transcript.segments[:count],
        transcript.expected_windows, transcript.expected_late,
    )  # fmt: skip
    partial.write_spool(staging)
    for source in sorted(staging.rglob("*.arrow")):
        target = spool / source.parent.name / source.name
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read_bytes())


def run_spark_per_segment(
    spark: SparkSession, url: str, tmp_path: Path, transcript: Transcript
) -> list[dict[StateKey, dict[str, Any]]]:
    """One micro-batch per segment; the rows each one wrote (new or higher revision)."""
    spool = tmp_path / "spool"
    emissions = []
    before: dict[StateKey, int] = {}
    for count in range(1, len(transcript.segments) + 1):
        append_segment(transcript, count, spool, tmp_path / f"staging-{count}")
        run_spark(spark, url, spool, transcript.config)
        after = _revisions(url, transcript.config)
        state, _ = stored_state(url, transcript.config)
        emissions.append({k: state[k] for k, r in after.items() if before.get(k) != r})
        before = after
    return emissions


@pytest.mark.parametrize("path", VALID, ids=[p.stem for p in VALID])
def test_reference_windower_meets_the_transcript(path: Path) -> None:
    transcript = _load(path)
    state, late = reference_state(transcript)
    check_expectations(transcript, state)
    if transcript.expected_emits is not None:
        check_emissions(transcript, reference_emissions(transcript))
    sketches = reference_sketches(transcript)
    for key, fields in expected_sketches(transcript).items():
        assert {name: sketches[key][name] for name in fields} == fields, key
    if transcript.expected_late is not None:
        expected_late = sorted(
            (x["window"], x["metric"], canonical_tags(x.get("tags")), x["start"], x["count"])
            for x in transcript.expected_late
        )
        assert late == expected_late
    if transcript.expected_after_replay is not None:
        replayed, replayed_late = reference_state(transcript, after_replay=True)
        check_expectations(transcript, replayed, after_replay=True)
        assert replayed_late == late  # replay applies late partials, never removes them
        sketches = reference_sketches(transcript, after_replay=True)
        for key, fields in expected_sketches(transcript, after_replay=True).items():
            assert {name: sketches[key][name] for name in fields} == fields, key


@pytest.mark.parametrize("path", VALID, ids=[p.stem for p in VALID])
def test_spark_job_stores_what_the_reference_computes(
    path: Path, spark: SparkSession, clean_store: str, tmp_path: Path
) -> None:
    transcript = _load(path)
    if transcript.expected_emits is not None:  # early rows depend on the batches' watermarks
        emissions = run_spark_per_segment(spark, clean_store, tmp_path, transcript)
        assert emissions == reference_emissions(transcript)
        check_emissions(transcript, emissions)
    else:
        transcript.write_spool(tmp_path / "spool")
        try:
            run_spark(spark, clean_store, tmp_path / "spool", transcript.config)
        except NotImplementedError as error:  # sliding, until job.py starts it
            pytest.skip(f"{error}; tests/windows/test_sliding_windows.py runs it on Spark")
    stored, stored_late = stored_state(clean_store, transcript.config)
    reference, reference_late = reference_state(transcript)
    assert stored == reference
    assert stored_late == reference_late
    check_expectations(transcript, stored)
    check_sketches(
        transcript, stored_sketches(clean_store, transcript.config), reference_sketches(transcript)
    )
    if transcript.expected_after_replay is not None:
        check_replay(clean_store, tmp_path / "spool", transcript)


_VERSIONS = """
select window_name, metric, tags::text,
       (extract(epoch from window_start) * 1000)::bigint - %s,
       (extract(epoch from window_end) * 1000)::bigint - %s, revision, corrections, count, sum,
       p50, distinct_count
from window_results where config_name = %s
"""


def versions(url: str, config: PipelineConfig) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """(window, metric, tags, start, end) → (revision, corrections, values...) per row."""
    _, rows = run_sql(url, _VERSIONS, [T0, T0, config.name])
    # text, text, text, then bigints: start, end, revision, corrections; then the values
    typed = cast(list[tuple[str, str, str, int, int, int, int, *tuple[object, ...]]], rows)
    return {(w, m, canonical_tags(t), int(s), int(e)): (int(r), int(c), *values)
            for w, m, t, s, e, r, c, *values in typed}  # fmt: skip


class _ReplayRange(TypedDict):
    """``replay``'s time range, passed as keyword arguments."""

    from_ms: int
    to_ms: int


def check_replay(url: str, spool: Path, transcript: Transcript) -> None:
    """`streamgauge replay` over all time after the streaming run: the store then equals the
    reference's ``after_replay`` state (sketch columns and bucket rows included, no stale
    bucket rows, no overlapping sessions), every late partial is marked applied, and:

    - a changed row keeps its key: revision and ``corrections`` one up;
    - a row with a new key that covers stored rows (a session extended or merged by a late
      partial) supersedes them: they are gone, its revision is above all of theirs and its
      ``corrections`` one above the most any had;
    - a row with a new key covering nothing (a window only late partials define) is an
      insert: ``corrections`` 0;
    - replaying again changes nothing.
    """
    config = transcript.config
    before = versions(url, config)
    everything: _ReplayRange = {"from_ms": T0 - 3_600_000, "to_ms": T0 + 3_600_000}
    with ResultStore(url) as store:
        report = replay(config, spool, store, ManualClock(T0 + 60_000), **everything)
        stored, stored_late = stored_state(url, config)
        expected, expected_late = reference_state(transcript, after_replay=True)
        assert stored == expected
        assert stored_late == expected_late
        check_expectations(transcript, stored, after_replay=True)
        check_sketches(transcript, stored_sketches(url, config),
                       reference_sketches(transcript, after_replay=True), after_replay=True)
        assert overlapping_sessions(url, config) == []
        _, [(applied, total)] = run_sql(
            url, "select count(replayed_at), count(*) from late_events where config_name = %s",
            [config.name],
        )  # fmt: skip
        assert applied == total == sum(r.late_partials_applied for r in report)
        after = versions(url, config)
        for key, (revision, corrections, *values) in after.items():
            covered = [k for k in before if k[:3] == key[:3] and key[3] <= k[3] and k[4] <= key[4]]
            if covered == [key] and list(before[key][2:]) == values:
                assert (revision, corrections) == before[key][:2], key  # unchanged
            elif covered:  # a correction of every row it covers, which are gone but itself
                assert not [k for k in covered if k != key and k in after], key
                assert revision == max(before[k][0] for k in covered) + 1, key
                assert corrections == max(before[k][1] for k in covered) + 1, key
            else:  # a window that did not exist: an insert, not a correction
                assert (revision, corrections) == (1, 0), key
        again = replay(config, spool, store, ManualClock(T0 + 70_000), **everything)
        assert [(r.windows_corrected, r.windows_retracted, r.late_partials_applied)
                for r in again] == [(0, 0, 0)] * len(again)  # fmt: skip
        assert versions(url, config) == after


_OVERLAPPING = """
select a.window_name, a.metric, a.tags::text, a.window_start, a.window_end, b.window_start,
       b.window_end
from (select {cols} from window_results union all select {cols} from window_pending) a
join (select {cols} from window_results union all select {cols} from window_pending) b
  using (config_name, window_name, metric, tags)
where config_name = %s
  and (a.window_start, a.window_end) < (b.window_start, b.window_end)
  and a.window_start < b.window_end and b.window_start < a.window_end
""".format(cols="config_name, window_name, metric, tags, window_start, window_end")


def overlapping_sessions(url: str, config: PipelineConfig) -> list[tuple[Any, ...]]:
    """Pairs of stored rows of one series that overlap (pending or emitted): for session
    windows there must be none after any commit."""
    sessions = [w.name for w in config.windows if w.kind == "session"]
    _, rows = run_sql(url, _OVERLAPPING, [config.name])
    return [row for row in rows if row[0] in sessions]


@pytest.mark.parametrize(
    "name",
    ["stragglers_beyond_lateness", "session_straggler_merges", "session_straggler_extends",
     "session_beyond_lateness", "session_sketches", "hopping_pane_stragglers",
     "session_merge_as_receiver_closes"],
)  # fmt: skip
def test_batching_does_not_change_the_result(
    name: str, spark: SparkSession, clean_store: str, tmp_path: Path
) -> None:
    """One micro-batch per segment; for sessions, every commit that grows or merges one
    must retract the rows it supersedes, bucket rows included (checked after each batch)."""
    transcript = _load(HERE / f"{name}.yaml")
    spool = tmp_path / "spool"
    for count in range(1, len(transcript.segments) + 1):
        append_segment(transcript, count, spool, tmp_path / f"staging-{count}")
        run_spark(spark, clean_store, spool, transcript.config)
        assert overlapping_sessions(clean_store, transcript.config) == [], count
        stored_sketches(clean_store, transcript.config)  # fails on stale bucket rows
    stored, stored_late = stored_state(clean_store, transcript.config)
    assert (stored, stored_late) == reference_state(transcript)
    check_sketches(
        transcript, stored_sketches(clean_store, transcript.config), reference_sketches(transcript)
    )
    _, revisions = run_sql(
        clean_store,
        "select max(revision) from window_results where config_name = %s",
        [transcript.config.name],
    )
    assert cast(int, revisions[0][0]) > 1  # windows were revised across several micro-batches


@pytest.mark.parametrize("path", INVALID, ids=[p.stem for p in INVALID])
def test_invalid_transcripts_are_refused(path: Path) -> None:
    text = path.read_text()
    match = re.search(r"# expect-error: (.+)", text)
    assert match, f"{path.name} must say which error it expects"
    with pytest.raises(TranscriptError) as error:
        load_transcript(text, path.name)
    assert match.group(1).strip() in str(error.value)


def test_replay_applies_late_partials_as_corrections_and_is_idempotent(
    spark: SparkSession, clean_store: str, tmp_path: Path
) -> None:
    transcript = _load(HERE / "stragglers_beyond_lateness.yaml")
    spool = tmp_path / "spool"
    transcript.write_spool(spool)
    run_spark(spark, clean_store, spool, transcript.config)
    before, _ = stored_state(clean_store, transcript.config)
    _, revision_rows = run_sql(
        clean_store,
        "select window_start, revision from window_results where config_name = %s",
        [transcript.config.name],
    )
    revisions_before = dict(cast(list[tuple[datetime, int]], revision_rows))

    store = ResultStore(clean_store)
    report = replay(transcript.config, spool, store, ManualClock(T0 + 60_000),
        from_ms=T0, to_ms=T0 + 60_000,
    )  # fmt: skip
    assert [(r.windows_corrected, r.late_partials_applied) for r in report] == [(1, 1)]

    windower = ReferenceWindower(transcript.config)
    windower.feed_all(transcript.segments)
    expected = {
        (k[0], k[1], canonical_tags(k[2]), k[3] - T0): (w.count, w.sum, w.is_final)
        for k, w in windower.stored(after_replay=True).items()
    }
    after, late = stored_state(clean_store, transcript.config)
    assert {k: (v["count"], v["sum"], v["final"]) for k, v in after.items()} == expected
    assert after[("w", "a", "{}", 0)]["sum"] == 11.0  # 1 on time + 10 late
    assert before[("w", "a", "{}", 0)]["sum"] == 1.0
    _, revision_rows = run_sql(
        clean_store,
        "select window_start, revision from window_results where config_name = %s",
        [transcript.config.name],
    )
    revisions_after = dict(cast(list[tuple[datetime, int]], revision_rows))
    changed = [k for k in revisions_after if revisions_after[k] != revisions_before[k]]
    assert len(changed) == 1  # only the window the late partial belongs to
    assert revisions_after[changed[0]] == revisions_before[changed[0]] + 1
    _, replayed = run_sql(
        clean_store, "select count(*) from late_events where replayed_at is not null"
    )
    assert replayed == [(1,)]

    again = replay(transcript.config, spool, store, ManualClock(T0 + 70_000),
        from_ms=T0, to_ms=T0 + 60_000,
    )  # fmt: skip
    assert [(r.windows_corrected, r.late_partials_applied) for r in again] == [(0, 0)]
    store.close()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1700000000", 1_700_000_000_000),
        ("1700000000.5", 1_700_000_000_500),
        ("2023-11-14T22:13:20Z", 1_700_000_000_000),
        ("2023-11-14T23:13:20.250+01:00", 1_700_000_000_250),
    ],
)
def test_replay_times(text: str, expected: int) -> None:
    assert parse_time_ms(text) == expected


def test_replay_refuses_times_without_an_offset() -> None:
    with pytest.raises(ValueError, match="no UTC offset"):
        parse_time_ms("2023-11-14T22:13:20")


def test_a_merge_retracts_both_sessions_in_the_commit_that_writes_the_merged_one(
    spark: SparkSession, clean_store: str, tmp_path: Path
) -> None:
    """session_straggler_merges, batch by batch: [0, 4) open (held by the job only), then
    shown while [6, 10) is open; then the straggler at 3 s makes them [0, 10), which replaces
    the stored [0, 4) in one commit: written at once, pending until the watermark passes its
    end, so the store never shows both nor loses the samples of [0, 4)."""
    transcript = _load(HERE / "session_straggler_merges.yaml")
    spool = tmp_path / "spool"

    def rows() -> list[tuple[str, int, int]]:
        _, found = run_sql(
            clean_store,
            "select t, (extract(epoch from window_start) * 1000)::bigint - %s, "
            "(extract(epoch from window_end) * 1000)::bigint - %s from ("
            "select 'results' t, window_start, window_end, config_name from window_results "
            "union all "
            "select 'pending' t, window_start, window_end, config_name from window_pending) x "
            "where config_name = %s "
            "order by 1, 2",
            [T0, T0, transcript.config.name],
        )
        return [(str(t), int(str(s)), int(str(e))) for t, s, e in found]

    seen = []
    for count in range(1, 4):
        staging = tmp_path / f"staging-{count}"
        Transcript(transcript.name, transcript.config, transcript.segments[:count],
                   (), None).write_spool(staging)  # fmt: skip
        for source in sorted(staging.rglob("*.arrow")):
            target = spool / source.parent.name / source.name
            if not target.exists():
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(source.read_bytes())
        run_spark(spark, clean_store, spool, transcript.config)
        seen.append(rows())
    assert seen == [
        [],  # heartbeat 1.5 s, W = 0.5 s < 4 s
        [("results", 0, 4000)],
        [("pending", 0, 10000)],  # W = 6.5 s < 10 s
    ]
