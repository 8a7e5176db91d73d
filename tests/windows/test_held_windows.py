"""Open windows held by the window job (``held_windows``): the merge and release a batch
makes, and the holding's row in the real PostgreSQL, read back by the job (the snapshot) and
by SQL readers (``window_held_rows``, ``window_latest``)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa

from streamgauge.clock import ManualClock
from streamgauge.configs import parse_config
from streamgauge.sinks.store import (
    RESULT_SCHEMA,
    BatchOutcome,
    HeldSnapshot,
    ResultStore,
    run_sql,
)
from streamgauge.windows.held_windows import HeldWindows
from streamgauge.windows.job import HoldingBatchWriter
from streamgauge.windows.source import batch_event_floor_ms
from tests.reliability.segments import Spool

T0 = 1_700_000_000_000
CONFIG = """
name: held
pane: 1s
windows:
  - {name: w, kind: tumbling, size: 10s, watermark_delay: 1s, allowed_lateness: 1s}
"""


def _windows(*rows: tuple[str, str, int, int, float | None]) -> pa.Table:
    """Native-lane rows (metric, tags, start s, count, sum) of 10 s windows, as Spark emits."""
    return pa.table(
        {
            "metric": pa.array([r[0] for r in rows], pa.string()),
            "tags": pa.array([r[1] for r in rows], pa.string()),
            "metric_type": pa.array(["c"] * len(rows), pa.string()),
            "window_start_ms": pa.array([T0 + r[2] * 1000 for r in rows], pa.int64()),
            "window_end_ms": pa.array([T0 + r[2] * 1000 + 10_000 for r in rows], pa.int64()),
            "count": pa.array([r[3] for r in rows], pa.int64()),
            "sum": pa.array([r[4] for r in rows], pa.float64()),
            "min": pa.nulls(len(rows), pa.float64()),
            "max": pa.nulls(len(rows), pa.float64()),
            "last": pa.nulls(len(rows), pa.float64()),
            "distinct_count": pa.nulls(len(rows), pa.float64()),
            "sketch": pa.nulls(len(rows), pa.binary()),
        }
    )


def _by_window(table: pa.Table | None) -> dict[tuple[str, str, int], tuple[int, float | None]]:
    if table is None:
        return {}
    return {
        (row["metric"], row["tags"], (row["window_start_ms"] - T0) // 1000): (
            row["count"], row["sum"])
        for row in table.to_pylist()
    }  # fmt: skip


def test_a_batch_replaces_the_windows_it_changed_and_releases_those_the_watermark_passed() -> None:
    """Spark's row for a window is its whole value as of the batch: the newer one replaces
    the held one, windows of another series or start are kept, and release takes exactly the
    windows whose end is at or before the watermark (half-open: [0, 10) ends at 10)."""
    held = HeldWindows().merged(_windows(("a", "{}", 0, 1, 1.0), ("b", "{}", 0, 2, 2.0)))
    held = held.merged(_windows(("a", "{}", 0, 3, 6.0), ("a", "{}", 10, 1, 1.0)))
    assert _by_window(held.table) == {
        ("a", "{}", 0): (3, 6.0), ("b", "{}", 0): (2, 2.0), ("a", "{}", 10): (1, 1.0),
    }  # fmt: skip
    assert held.samples == 6 and held.num_windows == 3

    released, rest = held.release(T0 + 9_999)
    assert _by_window(released) == {} and rest == held
    released, rest = held.release(T0 + 10_000)
    assert _by_window(released) == {("a", "{}", 0): (3, 6.0), ("b", "{}", 0): (2, 2.0)}
    assert _by_window(rest.table) == {("a", "{}", 10): (1, 1.0)}
    assert held.merged(_windows()) is held  # a batch that changed nothing


def test_the_snapshot_restores_the_holding_exactly() -> None:
    held = HeldWindows().merged(_windows(("a", '{"k": "v"}', 0, 1, None), ("b", "{}", 10, 2, 2.5)))
    restored = HeldWindows.from_snapshot(held.to_snapshot())
    assert restored.table is not None and restored.table.equals(held.table)
    assert HeldWindows.from_snapshot(None).table is None
    assert HeldWindows.from_snapshot(HeldWindows().to_snapshot()).num_windows == 0


def test_the_holding_is_stored_with_its_batch_and_readable_in_sql(clean_store: str) -> None:
    """Awkward tags (quotes, backslashes, commas, braces, non-ASCII) and NULL values survive
    the array literals; a later batch's holding replaces the earlier one; a replayed batch
    (already committed) writes nothing."""
    tags = '{"path": "C:\\\\x, {y} \\"z\\"", "city": "Zürich"}'
    held = HeldWindows().merged(_windows(("a", tags, 0, 4, None), ("NULL", "{}", 10, 2, 2.5)))
    store = ResultStore(clean_store, clock=ManualClock(T0))
    try:
        def commit(batch_id: int, holding: HeldWindows) -> bool:
            snapshot = HeldSnapshot("cfg", "w", holding.num_windows, holding.samples,
                                    holding.to_snapshot(), holding.sql_arrays())  # fmt: skip
            outcome = store.commit_batch("cfg.w", batch_id, RESULT_SCHEMA.empty_table(), [],
                                         revision=batch_id + 1, held=snapshot)  # fmt: skip
            return not outcome.already_committed

        assert commit(0, held)
        restored = HeldWindows.from_stored(store.read_held("cfg.w"))
        assert restored.table is not None and restored.table.equals(held.table)
        _, rows = run_sql(
            clean_store,
            "select metric, tags, (extract(epoch from window_start) * 1000)::bigint - %s, count,"
            " sum, min, revision from window_held_rows order by metric",
            [T0],
        )
        assert rows == [("NULL", {}, 10_000, 2, 2.5, None, 1),
                        ("a", {"path": 'C:\\x, {y} "z"', "city": "Zürich"}, 0, 4, None, None, 1)]
        _, latest = run_sql(
            clean_store, "select metric, status, count from window_latest"
            " where config_name = 'cfg' order by metric",
        )  # fmt: skip
        assert latest == [("NULL", "pending", 2), ("a", "pending", 4)]
        assert run_sql(clean_store, "select windows, samples from window_held")[1] == [(2, 6)]

        # Windows published ahead of the next batch are marked in the row, not cut out of
        # it: left out of window_held_rows and of what a restarted job loads.
        _, rest = held.release(T0 + 10_000)
        store.publish_released("cfg.w", RESULT_SCHEMA.empty_table(), None,
                               released_before_ms=T0 + 10_000, windows=1, samples=2)  # fmt: skip
        restored = HeldWindows.from_stored(store.read_held("cfg.w"))
        assert restored.table is not None and restored.table.equals(rest.table)
        assert run_sql(clean_store, "select metric from window_held_rows")[1] == [("NULL",)]
        assert run_sql(clean_store, "select windows, samples from window_held")[1] == [(1, 2)]

        assert not commit(0, rest)  # replayed: the stored holding stays the batch's own
        assert run_sql(clean_store, "select count(*) from window_held_rows")[1] == [(1,)]
        assert commit(1, rest)  # written whole: the mark goes with the windows it marked
        assert run_sql(clean_store, "select released_before_ms from window_held")[1] == [(None,)]
        _, rows = run_sql(clean_store, "select metric, revision from window_held_rows")
        assert rows == [("NULL", 2)]
        # A new checkpoint's revisions start above the holding's too (window_held_rows).
        assert store.start_checkpoint("cfg", "w", ["cfg.w"]) == 2
        assert commit(2, HeldWindows())
        assert run_sql(clean_store, "select count(*) from window_held_rows")[1] == [(0,)]
        # Retention: only a holding no batch has written since the cutoff goes.
        assert store.prune(T0)["window_held"] == 0
        assert store.prune(T0 + 1)["window_held"] == 1
    finally:
        store.close()


def test_the_writer_rewrites_its_holding_only_when_a_batch_changes_it(
    clean_store: str, tmp_path: Path
) -> None:
    """A batch of idle input (no changed window, the watermark short of every held end)
    leaves the stored holding as it is; a change or a release rewrites it. A new writer (a
    restarted job) starts from the stored holding."""
    config = parse_config(CONFIG, "test")
    store = ResultStore(clean_store)
    try:
        def writer() -> HoldingBatchWriter:
            return HoldingBatchWriter(config, config.windows[0], store, tmp_path / "cp",
                                      ManualClock(T0))  # fmt: skip

        first = writer()
        publish, holding = first._held_after(_windows(("a", "{}", 0, 2, 2.0)), T0 + 5_000)
        assert publish.num_rows == 0 and holding is not None and holding.num_windows == 1
        first._held = holding  # as _commit does once the store took the batch
        publish, holding = first._held_after(_windows(), T0 + 9_999)
        assert publish.num_rows == 0 and holding is None  # idle: nothing to write
        store.commit_batch(
            "held.w", 0, RESULT_SCHEMA.empty_table(), [], revision=1,
            held=HeldSnapshot("held", "w", 1, 2, first._held.to_snapshot(),
                              first._held.sql_arrays()),
        )  # fmt: skip
        restarted = writer()
        publish, holding = restarted._held_after(_windows(), T0 + 10_000)
        assert _by_window(publish) == {("a", "{}", 0): (2, 2.0)}
        assert holding is not None and holding.num_windows == 0  # released: rewritten
    finally:
        store.close()


def test_a_lane_narrowed_to_counters_drops_the_sets_of_a_holding_stored_before(
    clean_store: str, tmp_path: Path
) -> None:
    """A holding stored when the tumbling window's native lane still merged sets: with
    ``sets: with_timers`` the lane takes counters and gauges only (``splits_sets``), so it
    keeps its counters and leaves the set to the sketch lane, which rebuilds it from the log
    under a new checkpoint (released by both, the two rows would race on revision)."""
    config = parse_config(CONFIG.replace("allowed_lateness: 1s}", "allowed_lateness: 1s, "
                                         "sets: with_timers}"), "test")
    assert config.windows[0].sets == "with_timers"
    before = _windows(("a", "{}", 0, 2, 2.0), ("users", "{}", 0, 3, None))
    before = before.set_column(
        before.schema.get_field_index("metric_type"), "metric_type", pa.array(["c", "s"])
    )
    held = HeldWindows().merged(before)
    assert held.of_types(None) is held
    assert _by_window(held.of_types(("s",)).table) == {("users", "{}", 0): (3, None)}
    store = ResultStore(clean_store)
    try:
        store.commit_batch(
            "held.w", 0, RESULT_SCHEMA.empty_table(), [], revision=1,
            held=HeldSnapshot("held", "w", 2, 5, held.to_snapshot(), held.sql_arrays()),
        )  # fmt: skip
        writer = HoldingBatchWriter(config, config.windows[0], store, tmp_path / "cp",
                                    ManualClock(T0))  # fmt: skip
        assert writer.lane_types == ("c", "g")
        publish, holding = writer._held_after(_windows(), T0 + 10_000)
        assert _by_window(publish) == {("a", "{}", 0): (2, 2.0)}
        assert holding is not None and holding.num_windows == 0
    finally:
        store.close()


def test_a_released_window_past_the_last_committed_watermark_is_offered_as_fresh(
    clean_store: str, tmp_path: Path
) -> None:
    """A window the holding releases with its end past the watermark of the last batch the
    store took was held until now: the store may insert it without conflict arbitration
    (``commit_batch(fresh=...)``). Before this process committed a batch (start, restart)
    nothing is offered as fresh; rows stored beyond the watermark push the bound on."""
    config = parse_config(CONFIG, "test")
    store = ResultStore(clean_store)
    try:
        writer = HoldingBatchWriter(config, config.windows[0], store, tmp_path / "cp",
                                    ManualClock(T0))  # fmt: skip
        rows = pa.table({"metric": ["a", "b", "c"],
                         "window_end_ms": [T0 + 10_000, T0 + 20_000, T0 + 30_000]})  # fmt: skip
        upsert, fresh = writer._split_fresh(rows)
        assert upsert.equals(rows) and fresh is None  # nothing committed here yet

        def committed(watermark_ms: int | None, stored_until_ms: int | None = None) -> None:
            writer._committed(BatchOutcome(False, 0, 0, fresh_stored_until_ms=stored_until_ms),
                              watermark_ms)  # fmt: skip

        committed(None)  # no heartbeat yet: nothing known
        assert writer._split_fresh(rows)[1] is None
        committed(T0 + 10_000)
        upsert, fresh = writer._split_fresh(rows)
        assert upsert.column("metric").to_pylist() == ["a"]  # a correction of a published one
        assert fresh is not None and fresh.column("metric").to_pylist() == ["b", "c"]
        committed(T0 + 20_000, stored_until_ms=T0 + 30_000)  # a replay stored up to 30 s
        upsert, fresh = writer._split_fresh(rows)
        assert upsert.num_rows == 3 and fresh is not None and fresh.num_rows == 0
        committed(T0 + 15_000)  # never back
        assert writer._split_fresh(rows)[1].num_rows == 0  # type: ignore[union-attr]
    finally:
        store.close()


def _log_offsets(checkpoint: Path, positions: dict[int, dict[str, tuple[int, int]]]) -> None:
    """Spark's offset log for the spool source: per batch id, receiver → (last sequence
    admitted, its heartbeat in ms after T0)."""
    (checkpoint / "offsets").mkdir(parents=True, exist_ok=True)
    for batch_id, receivers in positions.items():
        offset = {"receivers": {name: {"seq": seq, "heartbeat_ms": T0 + beat_ms, "closed": False}
                                for name, (seq, beat_ms) in receivers.items()}}  # fmt: skip
        (checkpoint / "offsets" / str(batch_id)).write_text(
            'v1\n{"batchWatermarkMs":0}\n' + json.dumps(offset)
        )


def test_the_event_floor_of_a_batch_comes_from_its_segments_footers(tmp_path: Path) -> None:
    """The earliest event time a batch can read: the first pane of each segment it admitted
    (from the footer), a segment without rows counting its heartbeat; a receiver new in the
    batch brings all its segments; a checkpoint's first batch has no floor."""
    spool = Spool(tmp_path / "spool")
    for beat_s in (1, 2, 3):
        spool.segment("udp-0", beat_s, {"c1": 1.0})  # seq 0, 1, 2: panes 0 s, 1 s, 2 s
    spool.segment("udp-0", 5, {})  # seq 3: heartbeat only, at 5 s
    checkpoint = tmp_path / "cp"
    _log_offsets(checkpoint, {0: {"udp-0": (1, 2_000)}, 1: {"udp-0": (3, 5_000)}})
    assert batch_event_floor_ms(spool.path, checkpoint, 0) is None
    assert batch_event_floor_ms(spool.path, checkpoint, 1) == T0 + 2_000
    _log_offsets(checkpoint, {2: {"udp-0": (3, 5_000)}})  # nothing new
    assert batch_event_floor_ms(spool.path, checkpoint, 2) is None
    spool.segment("udp-0", 6, {})  # seq 4
    spool.segment("udp-1", 6, {"c1": 1.0})  # udp-1 seq 0: pane 5 s, new in batch 3
    _log_offsets(checkpoint, {3: {"udp-0": (4, 6_000), "udp-1": (0, 6_000)}})
    assert batch_event_floor_ms(spool.path, checkpoint, 3) == T0 + 5_000


def _write_segments(spool: Spool, beats_s: range) -> None:
    for beat_s in beats_s:
        spool.segment("udp-0", beat_s, {"c1": 1.0})


def _release_setup(tmp_path: Path, first_batch_upto_s: int) -> tuple[Spool, Path]:
    """Counter c1 in every pane 0..10 s of udp-0 (segment n has heartbeat n + 1 s); batch 0
    admits the segments up to heartbeat ``first_batch_upto_s``, batch 1 the rest (heartbeat
    11 s: W = 10 s, 10 s windows [0 s, 10 s) close). Only batch 0's segments are in the log
    yet (``_write_segments`` the rest once it committed: see ``_closed_by_log``)."""
    spool = Spool(tmp_path / "spool")
    _write_segments(spool, range(1, first_batch_upto_s + 1))
    checkpoint = tmp_path / "cp"
    _log_offsets(checkpoint, {0: {"udp-0": (first_batch_upto_s - 1, first_batch_upto_s * 1000)},
                              1: {"udp-0": (10, 11_000)}})  # fmt: skip
    return spool, checkpoint


_STORED = (
    "select metric, (extract(epoch from window_start) * 1000)::bigint - %s, count, revision,"
    " is_final from window_results order by 2"
)


def test_a_batch_with_no_row_in_the_windows_it_closes_publishes_them_before_spark_runs(
    clean_store: str, tmp_path: Path
) -> None:
    """Batch 1 brings only the segment [10 s, 11 s): the held [0 s, 10 s) is published, with
    the batch's revision, before the batch's own rows exist (``_release_ahead``), and leaves
    the stored holding in that transaction (never shown held and published at once). A
    crash before the batch commits: the restarted writer loads the shrunk holding, publishes
    nothing again, and the replayed batch stores every window once."""
    config = parse_config(CONFIG, "test")
    window = config.windows[0]
    spool, checkpoint = _release_setup(tmp_path, first_batch_upto_s=10)
    store = ResultStore(clean_store)
    try:
        def writer() -> HoldingBatchWriter:
            return HoldingBatchWriter(config, window, store, checkpoint, ManualClock(T0),
                                      spool=spool.path)  # fmt: skip

        first = writer()
        first._commit(_windows(("c1", "{}", 0, 10, 10.0)), 0)  # W = 9 s: held
        assert run_sql(clean_store, _STORED, [T0])[1] == []
        _write_segments(spool, range(11, 12))
        first._release_ahead(1)
        revision = first.revision(1)
        assert run_sql(clean_store, _STORED, [T0])[1] == [("c1", 0, 10, revision, False)]
        assert run_sql(clean_store, "select count(*) from window_held_rows")[1] == [(0,)]
        assert run_sql(clean_store, "select windows, samples from window_held")[1] == [(0, 0)]

        restarted = writer()  # the process died before batch 1 committed; Spark runs it again
        restarted._release_ahead(1)
        restarted._commit(_windows(("c1", "{}", 10, 1, 1.0)), 1)
        assert run_sql(clean_store, _STORED, [T0])[1] == [("c1", 0, 10, revision, False)]
        _, held = run_sql(clean_store, "select metric, count from window_held_rows")
        assert held == [("c1", 1)]
        assert run_sql(clean_store, "select count(*) from sink_batches")[1] == [(2,)]
    finally:
        store.close()


def test_a_batch_with_a_row_in_a_window_it_closes_publishes_it_after_spark(
    clean_store: str, tmp_path: Path
) -> None:
    """Batch 1 also brings [9 s, 10 s): Spark's row for [0 s, 10 s) is needed, so nothing is
    published ahead and the batch's commit publishes the window with that row's value."""
    config = parse_config(CONFIG, "test")
    spool, checkpoint = _release_setup(tmp_path, first_batch_upto_s=9)
    store = ResultStore(clean_store)
    try:
        writer = HoldingBatchWriter(config, config.windows[0], store, checkpoint,
                                    ManualClock(T0), spool=spool.path)  # fmt: skip
        writer._commit(_windows(("c1", "{}", 0, 9, 9.0)), 0)
        _write_segments(spool, range(10, 12))
        writer._release_ahead(1)
        assert run_sql(clean_store, _STORED, [T0])[1] == []
        writer._commit(_windows(("c1", "{}", 0, 10, 10.0), ("c1", "{}", 10, 1, 1.0)), 1)
        assert run_sql(clean_store, _STORED, [T0])[1] == [
            ("c1", 0, 10, writer.revision(1), False)]
    finally:
        store.close()


def _watcher_setup(
    clean_store: str, tmp_path: Path, delay_s: int, applied_upto_s: int,
    before_commit: bool = False,
) -> tuple[Path, HoldingBatchWriter]:
    """Counter c1 in panes 0..11 s of udp-0 (segment n: pane n s, heartbeat n + 1 s) and a
    writer that committed batch 0, the segments up to heartbeat ``applied_upto_s``; the rest
    reach the log after that commit (``before_commit``: before it, so the commit sees them)."""
    config = parse_config(CONFIG.replace("watermark_delay: 1s", f"watermark_delay: {delay_s}s"),
                          "test")  # fmt: skip
    spool = Spool(tmp_path / "spool")
    _write_segments(spool, range(1, applied_upto_s + 1))
    if before_commit:
        _write_segments(spool, range(applied_upto_s + 1, 13))
    checkpoint = tmp_path / "cp"
    _log_offsets(checkpoint, {0: {"udp-0": (applied_upto_s - 1, applied_upto_s * 1000)}})
    writer = HoldingBatchWriter(config, config.windows[0], ResultStore(clean_store), checkpoint,
                                ManualClock(T0), spool=spool.path)  # fmt: skip
    writer._commit(_windows(("c1", "{}", 0, min(applied_upto_s, 10), 10.0)), 0)
    if not before_commit:
        _write_segments(spool, range(applied_upto_s + 1, 13))
    return checkpoint, writer


def _batch_one_changes_nothing_published(
    writer: HoldingBatchWriter, checkpoint: Path, store_url: str,
    published: list[tuple[str, int, int, int, bool]],
) -> None:
    """Spark plans batch 1 with the segments up to heartbeat 12 s and runs it (a row in
    [10 s, 11 s)): the published window stays as it is, and the holding keeps the new pane
    only."""
    _log_offsets(checkpoint, {1: {"udp-0": (11, 12_000)}})
    writer._release_ahead(1)
    writer._commit(_windows(("c1", "{}", 10, 2, 2.0)), 1)
    assert run_sql(store_url, _STORED, [T0])[1] == published
    _, held = run_sql(store_url, "select metric, count from window_held_rows")
    assert held == [("c1", 2)]


def test_windows_the_log_closes_are_published_before_the_batch_that_takes_it_is_planned(
    clean_store: str, tmp_path: Path
) -> None:
    """Batch 0 took panes up to 9 s (W = 9 s); the log already holds [10 s, 11 s) and
    [11 s, 12 s), which close [0 s, 10 s) and have no row in it. The window is published at
    once (final too: W' = 11 s is its end plus the lateness), at the revision of batch 1,
    the batch Spark plans next with those segments; that batch then publishes nothing
    again."""
    checkpoint, writer = _watcher_setup(clean_store, tmp_path, delay_s=1, applied_upto_s=10)
    try:
        assert writer.release_before_next_batch() == 1
        published = [("c1", 0, 10, writer.revision(1), True)]
        assert run_sql(clean_store, _STORED, [T0])[1] == published
        assert run_sql(clean_store, "select windows from window_held")[1] == [(0,)]
        assert writer.release_before_next_batch() == 0  # nothing held is due

        _batch_one_changes_nothing_published(writer, checkpoint, clean_store, published)
    finally:
        writer._store.close()


def test_while_a_batch_runs_the_windows_the_next_one_closes_are_published_at_its_revision(
    clean_store: str, tmp_path: Path
) -> None:
    """Delay 2 s. Batch 0 took panes up to 9 s; batch 1 runs with [10 s, 11 s) (W = 9 s:
    it closes nothing). The log holds [11 s, 12 s) too (W' = 10 s): neither batch has a row
    in [0 s, 10 s), so it is published while batch 1 runs, at batch 2's revision."""
    checkpoint, writer = _watcher_setup(clean_store, tmp_path, delay_s=2, applied_upto_s=10)
    try:
        _log_offsets(checkpoint, {1: {"udp-0": (10, 11_000)}})
        assert writer.release_before_next_batch() == 1
        published = [("c1", 0, 10, writer.revision(2), False)]
        assert run_sql(clean_store, _STORED, [T0])[1] == published
        writer._commit(_windows(("c1", "{}", 10, 1, 1.0)), 1)  # batch 1 ends: W = 9 s
        assert run_sql(clean_store, _STORED, [T0])[1] == published
    finally:
        writer._store.close()


def test_nothing_is_published_early_when_a_batch_to_come_or_the_running_one_closes_it(
    clean_store: str, tmp_path: Path
) -> None:
    """Batch 0 took panes up to 8 s (W = 8 s). Batch 1, running, brings [9 s, 10 s): a row
    in [0 s, 10 s), so the window waits for its commit, though the log closes it. And once
    batch 1 is planned with the closing segment itself, it is that batch's to publish."""
    checkpoint, writer = _watcher_setup(clean_store, tmp_path, delay_s=1, applied_upto_s=9)
    try:
        _log_offsets(checkpoint, {1: {"udp-0": (9, 10_000)}})  # W = 9 s: closes nothing
        assert writer.release_before_next_batch() == 0
        _log_offsets(checkpoint, {1: {"udp-0": (11, 12_000)}})  # W = 11 s: it closes [0, 10)
        assert writer.release_before_next_batch() == 0
        assert run_sql(clean_store, _STORED, [T0])[1] == []
    finally:
        writer._store.close()


def test_a_batchs_commit_publishes_the_windows_the_log_already_closes(
    clean_store: str, tmp_path: Path
) -> None:
    """Batch 0 took panes up to 9 s (W = 9 s); by its commit the log holds [10 s, 11 s) and
    [11 s, 12 s), which close [0 s, 10 s) (W' = 11 s) and have no row in it. The commit
    publishes the window itself, at batch 1's revision (as the watcher would have: the same
    on a replay), final (W' is its end plus the lateness), and stores the holding without
    it. Spark replaying batch 0 after a crash: the store refuses it, and the restarted
    writer loads that holding, so nothing is published twice or lost."""
    checkpoint, writer = _watcher_setup(clean_store, tmp_path, delay_s=1, applied_upto_s=10,
                                        before_commit=True)  # fmt: skip
    try:
        published = [("c1", 0, 10, writer.revision(1), True)]
        assert run_sql(clean_store, _STORED, [T0])[1] == published
        assert run_sql(clean_store, "select windows from window_held")[1] == [(0,)]
        assert writer.release_before_next_batch() == 0

        replayed = HoldingBatchWriter(writer._config, writer._window, writer._store, checkpoint,
                                      ManualClock(T0), spool=tmp_path / "spool")  # fmt: skip
        replayed._commit(_windows(("c1", "{}", 0, 10, 10.0)), 0)  # refused: committed
        assert replayed._holding().num_windows == 0
        _batch_one_changes_nothing_published(replayed, checkpoint, clean_store, published)
    finally:
        writer._store.close()


def test_a_batchs_commit_leaves_a_window_the_log_closes_when_a_row_to_come_is_in_it(
    clean_store: str, tmp_path: Path
) -> None:
    """Batch 0 took panes up to 8 s; the log holds [9 s, 10 s), a row in [0 s, 10 s), and
    the segments closing it. The commit publishes nothing: the batch that takes that row
    publishes the window with it."""
    _, writer = _watcher_setup(clean_store, tmp_path, delay_s=1, applied_upto_s=9,
                               before_commit=True)  # fmt: skip
    try:
        assert run_sql(clean_store, _STORED, [T0])[1] == []
        _, held = run_sql(clean_store, "select metric, count from window_held_rows")
        assert held == [("c1", 9)]
    finally:
        writer._store.close()
