"""A native lane that keeps no Spark state (``adds_in_driver``): the holding adds each
micro-batch's sums per window (``AddedWindows``), keeps published windows for stragglers until
Spark's state would have evicted them, and stays exactly once across a replayed batch and a
new checkpoint, against the real PostgreSQL."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pyarrow as pa

from streamgauge.clock import ManualClock
from streamgauge.configs import parse_config
from streamgauge.sinks.store import ResultStore, run_sql
from streamgauge.windows.checkpoints import JobPaths, adds_in_driver
from streamgauge.windows.held_windows import AddedWindows, HeldWindows
from streamgauge.windows.job import AddingBatchWriter, HoldingBatchWriter, _native_writer
from tests.windows.test_held_windows import _STORED, _log_offsets, _release_setup

T0 = 1_700_000_000_000
CONFIG = """
name: added
pane: 1s
windows:
  - {name: w, kind: tumbling, size: 10s, watermark_delay: 1s, allowed_lateness: 5s,
     sets: separate}
"""
HORIZON_MS = 1_000 + 5_000 + 10_000  # delay + lateness + size


def _sums(*rows: tuple[str, str, int, int, float | None, float | None, int]) -> pa.Table:
    """One batch's sums per window, as ``plain_batch_windows`` hands them over: (metric,
    type, start s, count, sum, last, latest event ms after T0) of 10 s windows."""
    n = len(rows)
    return pa.table(
        {
            "metric": pa.array([r[0] for r in rows], pa.string()),
            "tags": pa.array(["{}"] * n, pa.string()),
            "metric_type": pa.array([r[1] for r in rows], pa.string()),
            "window_start_ms": pa.array([T0 + r[2] * 1000 for r in rows], pa.int64()),
            "window_end_ms": pa.array([T0 + r[2] * 1000 + 10_000 for r in rows], pa.int64()),
            "count": pa.array([r[3] for r in rows], pa.int64()),
            "sum": pa.array([r[4] for r in rows], pa.float64()),
            "min": pa.array([r[4] for r in rows], pa.float64()),
            "max": pa.array([r[4] for r in rows], pa.float64()),
            "last": pa.array([r[5] for r in rows], pa.float64()),
            "distinct_count": pa.nulls(n, pa.float64()),
            "sketch": pa.nulls(n, pa.binary()),
            "last_event_ms": pa.array([T0 + r[6] for r in rows], pa.int64()),
        }
    )


def _values(table: pa.Table | None) -> dict[tuple[str, int], tuple[int, float | None, object]]:
    if table is None:
        return {}
    return {
        (row["metric"], (row["window_start_ms"] - T0) // 1000): (
            row["count"], row["sum"] if row["metric_type"] == "c" else row["last"],
            row["min"])
        for row in table.to_pylist()
    }  # fmt: skip


def _writer(store: ResultStore, checkpoint: Path, spool: Path) -> AddingBatchWriter:
    """The writer of ``CONFIG``'s counters (a new one: a restarted job's)."""
    config = parse_config(CONFIG, "test")
    return AddingBatchWriter(config, config.windows[0], store, checkpoint, ManualClock(T0),
                             spool=spool)  # fmt: skip


def test_only_counter_and_gauge_lanes_without_early_rows_add_in_the_driver() -> None:
    for sets, early, adds in (("separate", "", True), ("with_timers", "", True),
                              ("native", "", False), ("separate", ", early_every: 2s", False)):
        config = parse_config(CONFIG.replace("sets: separate", f"sets: {sets}{early}"), "t")
        assert adds_in_driver(config.windows[0]) is adds
    config = parse_config(CONFIG, "t")
    paths = JobPaths(Path("/nonexistent"), Path("/nonexistent"))
    unused = cast(ResultStore, SimpleNamespace())  # the writers only use it per batch
    counters = _native_writer(config, config.windows[0], unused, Path("cp"), ManualClock(T0), paths)
    set_lane = _native_writer(config, config.windows[0], unused, Path("cp"), ManualClock(T0), paths,
                          sets=True)  # fmt: skip
    assert isinstance(counters, AddingBatchWriter) and type(set_lane) is HoldingBatchWriter


def test_sums_add_up_per_window_and_the_latest_event_gives_a_gauges_last() -> None:
    """Counts and sums add, extremes compare, a gauge's ``last`` is the value of the later
    event whichever batch brought it; windows of another start or series stay apart."""
    held = AddedWindows(horizon_ms=HORIZON_MS).merged(
        _sums(("c", "c", 0, 2, 3.0, None, 900), ("g", "g", 0, 1, 7.0, 7.0, 5_000))
    )
    held = held.merged(
        _sums(("c", "c", 0, 1, -1.0, None, 9_000), ("g", "g", 0, 1, 4.0, 4.0, 2_000),
              ("c", "c", 10, 1, 5.0, None, 10_500))  # fmt: skip
    )
    assert _values(held.table) == {
        ("c", 0): (3, 2.0, -1.0), ("g", 0): (2, 7.0, 4.0), ("c", 10): (1, 5.0, 5.0),
    }  # fmt: skip
    assert held.samples == 6 and held.num_windows == 3
    assert held.merged(_sums()) is held


def test_a_published_window_stays_for_stragglers_until_the_horizon() -> None:
    """Released windows are no longer held (counts, ``earliest_end_ms``, the arrays) but keep
    their sums: a straggler's batch adds to the whole window, which is published again. A
    window ``horizon`` behind the latest end is dropped, and a later row for it is not added
    (``dropped``: Spark's own watermark dropped it before)."""
    held = AddedWindows(horizon_ms=HORIZON_MS).merged(
        _sums(("c", "c", 0, 2, 2.0, None, 900), ("c", "c", 10, 1, 1.0, None, 10_100))
    )
    released, held = held.release(T0 + 10_000)
    assert _values(released) == {("c", 0): (2, 2.0, 2.0)}
    assert held.num_windows == 1 and held.samples == 1 and held.earliest_end_ms == T0 + 20_000
    assert held.published_before_ms == T0 + 10_000
    assert len(held.sql_arrays()["counts"]) < len(HeldWindows(held.table).sql_arrays()["counts"])
    released, again = held.release(T0 + 12_000)
    assert released is not None and released.num_rows == 0 and again.table == held.table

    straggler = _sums(("c", "c", 0, 1, 5.0, None, 800))
    merged = held.merged(straggler)
    assert _values(merged.published_again(straggler)) == {("c", 0): (3, 7.0, 2.0)}
    assert merged.published_again(_sums(("c", "c", 10, 1, 1.0, None, 10_200))) is None  # held

    # The latest end reaches 35 s: [0 s, 10 s) is more than 16 s behind it, published:
    # dropped; [10 s, 20 s), published too, is 15 s behind: kept.
    later = merged.merged(_sums(("c", "c", 25, 1, 1.0, None, 25_100)))
    _, later = later.release(T0 + 20_000)
    assert ("c", 0) not in _values(later.table) and ("c", 10) in _values(later.table)
    late_row = _sums(("c", "c", 0, 1, 9.0, None, 700))
    assert _values(later.dropped(late_row)) == {("c", 0): (1, 9.0, 9.0)}
    assert ("c", 0) not in _values(later.merged(late_row).table)


def test_the_snapshot_keeps_the_published_mark(clean_store: str, tmp_path: Path) -> None:
    """The stored holding keeps its published windows and the mark (``released_before_ms``):
    ``window_held_rows`` shows the held ones only, and a restarted writer adds a straggler
    to the whole published window."""
    spool, checkpoint = _release_setup(tmp_path, first_batch_upto_s=10)
    store = ResultStore(clean_store)
    try:
        first = _writer(store, checkpoint, spool.path)
        first._commit(_sums(("c1", "c", 0, 9, 9.0, None, 8_500)), 0)  # W = 9 s: held
        first._commit(_sums(("c1", "c", 0, 1, 1.0, None, 9_500),
                             ("c1", "c", 10, 1, 1.0, None, 10_500)), 1)  # W = 10 s  # fmt: skip
        assert run_sql(clean_store, _STORED, [T0])[1] == [("c1", 0, 10, first.revision(1), False)]
        _, held = run_sql(clean_store, "select metric, count from window_held_rows")
        assert held == [("c1", 1)]
        assert run_sql(clean_store, "select windows, samples, released_before_ms - %s"
                       " from window_held", [T0])[1] == [(1, 1, 10_000)]  # fmt: skip

        restarted = _writer(store, checkpoint, spool.path)
        holding = restarted._holding()
        assert isinstance(holding, AddedWindows)
        assert _values(holding.table) == {("c1", 0): (10, 10.0, 1.0), ("c1", 10): (1, 1.0, 1.0)}
        publish, _ = restarted._held_after(_sums(("c1", "c", 0, 2, 2.0, None, 9_900)), T0 + 10_000)
        assert _values(publish) == {("c1", 0): (12, 12.0, 1.0)}
    finally:
        store.close()


def test_a_replayed_batch_adds_nothing_twice(clean_store: str, tmp_path: Path) -> None:
    """Batch 1 committed, then the process died before Spark logged it: Spark runs it again
    in a new process, whose writer loads the holding that has its sums. The store refuses
    the batch, the writer reads the stored holding again, and batch 2 adds to that."""
    spool, checkpoint = _release_setup(tmp_path, first_batch_upto_s=5)
    store = ResultStore(clean_store)
    try:
        batch_1 = _sums(("c1", "c", 0, 6, 6.0, None, 9_500), ("c1", "c", 10, 1, 1.0, None, 10_500))
        first = _writer(store, checkpoint, spool.path)
        first._commit(_sums(("c1", "c", 0, 4, 4.0, None, 4_500)), 0)
        first._commit(batch_1, 1)
        restarted = _writer(store, checkpoint, spool.path)
        restarted._commit(batch_1, 1)  # replayed
        _log_offsets(checkpoint, {2: {"udp-0": (10, 11_000)}})
        restarted._commit(_sums(("c1", "c", 10, 1, 1.0, None, 10_900)), 2)
        assert run_sql(clean_store, _STORED, [T0])[1] == [("c1", 0, 10, first.revision(1), False)]
        _, held = run_sql(clean_store, "select metric, count from window_held_rows")
        assert held == [("c1", 2)]
    finally:
        store.close()


def test_a_new_checkpoint_forgets_the_holding_it_adds_again(
    clean_store: str, tmp_path: Path
) -> None:
    """A new checkpoint reads the log from its start and adds every sum again: the writer
    forgets the stored holding (``start_checkpoint(forget_held=True)``) before reading it."""
    spool, checkpoint = _release_setup(tmp_path, first_batch_upto_s=5)
    store = ResultStore(clean_store)
    try:
        first = _writer(store, checkpoint, spool.path)
        first._commit(_sums(("c1", "c", 0, 4, 4.0, None, 4_500)), 0)
        assert run_sql(clean_store, "select count(*) from window_held")[1] == [(1,)]
        fresh, _ = _release_setup(tmp_path / "again", first_batch_upto_s=5)
        new_checkpoint = tmp_path / "again" / "cp"
        rebuilt = _writer(store, new_checkpoint, fresh.path)
        assert rebuilt._holding().num_windows == 0
        assert run_sql(clean_store, "select count(*) from window_held")[1] == [(0,)]
        rebuilt._commit(_sums(("c1", "c", 0, 4, 4.0, None, 4_500)), 0)
        _, held = run_sql(clean_store, "select metric, count from window_held_rows")
        assert held == [("c1", 4)]
    finally:
        store.close()
