"""Held windows copied into ``window_results`` before they close, committed when they do
(``HoldingBatchWriter.prepare_next_release``, ``ResultStore.prepare_release``), against the
real PostgreSQL: invisible until then, published at the revision the usual path would give
them, and rolled back whenever that path has to publish them instead.

Timeline (10 s windows, delay 2 s; segment n holds pane n - 1 s, heartbeat n s)::

    batch 0: segments 1..10 s (W = 8 s) | batch 1 runs: 11 s (W = 9 s) | 12 s: W' = 10 s
    [0 s, 10 s) copied here, uncommitted ^                closes it: committed ^
"""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from streamgauge.clock import ManualClock
from streamgauge.configs import parse_config
from streamgauge.sinks.store import ResultStore, run_sql
from streamgauge.windows.job import HoldingBatchWriter
from tests.reliability.segments import Spool
from tests.windows.test_held_windows import (
    _STORED,
    CONFIG,
    T0,
    _log_offsets,
    _windows,
    _write_segments,
)


def _batch_zero_committed(
    clean_store: str, tmp_path: Path, delay_s: int
) -> tuple[Path, Spool, HoldingBatchWriter]:
    """A writer that committed batch 0: panes 0..9 s of counter c1 (heartbeat 10 s)."""
    config = parse_config(CONFIG.replace("watermark_delay: 1s", f"watermark_delay: {delay_s}s"),
                          "test")  # fmt: skip
    spool = Spool(tmp_path / "spool")
    _write_segments(spool, range(1, 11))
    checkpoint = tmp_path / "cp"
    _log_offsets(checkpoint, {0: {"udp-0": (9, 10_000)}})
    writer = HoldingBatchWriter(config, config.windows[0], ResultStore(clean_store), checkpoint,
                                ManualClock(T0), spool=spool.path)  # fmt: skip
    writer._commit(_windows(("c1", "{}", 0, 10, 10.0)), 0)
    return checkpoint, spool, writer


def _prepared_setup(
    clean_store: str, tmp_path: Path, delay_s: int = 2
) -> tuple[Path, Spool, HoldingBatchWriter]:
    """Batch 0 committed panes 0..9 s of counter c1; batch 1 runs with [10 s, 11 s); the
    writer has copied [0 s, 10 s) into a prepared release (at batch 2's revision)."""
    checkpoint, spool, writer = _batch_zero_committed(clean_store, tmp_path, delay_s)
    assert writer.prepare_next_release() is False  # no segment past it yet: rows may come
    _write_segments(spool, range(11, 12))
    _log_offsets(checkpoint, {1: {"udp-0": (10, 11_000)}})
    assert writer.between_batches() == 0  # nothing closes yet
    assert writer._preparing is not None and writer._preparing.batch_id == 2
    return checkpoint, spool, writer


@pytest.fixture
def writers() -> list[HoldingBatchWriter]:
    """Each test's writer: its prepared release rolled back and its store closed at the
    end, pass or fail (an open transaction would hold the next test's TRUNCATE)."""
    made: list[HoldingBatchWriter] = []
    yield made  # type: ignore[misc]
    for writer in made:
        writer.abort_prepared()
        writer._store.close()


def test_windows_copied_before_they_close_are_visible_once_their_segment_arrives(
    clean_store: str, tmp_path: Path, writers: list[HoldingBatchWriter]
) -> None:
    """The copy is invisible to every reader; the closing segment commits it, at batch 2's
    revision (what ``release_before_next_batch`` gives them), provisional, and marks the
    windows published in the stored holding. Batch 1's commit changes nothing after."""
    _, spool, writer = _prepared_setup(clean_store, tmp_path)
    writers.append(writer)
    assert run_sql(clean_store, _STORED, [T0])[1] == []
    _write_segments(spool, range(12, 13))
    assert writer.between_batches() == 1
    published = [("c1", 0, 10, writer.revision(2), False)]
    assert run_sql(clean_store, _STORED, [T0])[1] == published
    assert run_sql(clean_store, "select windows from window_held")[1] == [(0,)]
    assert writer._preparing is None
    writer._commit(_windows(("c1", "{}", 10, 1, 1.0)), 1)
    assert run_sql(clean_store, _STORED, [T0])[1] == published


def test_the_batch_that_takes_the_closing_segment_commits_the_copy(
    clean_store: str, tmp_path: Path, writers: list[HoldingBatchWriter]
) -> None:
    """Spark plans batch 2 with the closing segment before the watcher sees it: its
    ``_release_ahead`` commits the copy (its own revision, the one the copy carries)."""
    checkpoint, spool, writer = _prepared_setup(clean_store, tmp_path)
    writers.append(writer)
    writer._commit(_windows(("c1", "{}", 10, 1, 1.0)), 1)  # W = 9 s: nothing closes
    assert writer._preparing is not None
    _write_segments(spool, range(12, 13))
    _log_offsets(checkpoint, {2: {"udp-0": (11, 12_000)}})
    writer._release_ahead(2)
    assert run_sql(clean_store, _STORED, [T0])[1] == [("c1", 0, 10, writer.revision(2), False)]
    assert writer._preparing is None


def test_a_batch_commit_that_finds_the_log_closing_them_commits_the_copy(
    clean_store: str, tmp_path: Path, writers: list[HoldingBatchWriter]
) -> None:
    """The closing segment lands while batch 1 runs: its commit finds it in the log
    (``_closed_by_log``) and commits the copy before its own transaction, which writes the
    holding without the window."""
    _, spool, writer = _prepared_setup(clean_store, tmp_path)
    writers.append(writer)
    _write_segments(spool, range(12, 13))
    writer._commit(_windows(("c1", "{}", 10, 1, 1.0)), 1)
    assert run_sql(clean_store, _STORED, [T0])[1] == [("c1", 0, 10, writer.revision(2), False)]
    _, held = run_sql(clean_store, "select metric, count from window_held_rows")
    assert held == [("c1", 1)]
    assert writer._preparing is None


def test_a_row_in_a_copied_window_rolls_the_copy_back(
    clean_store: str, tmp_path: Path, writers: list[HoldingBatchWriter]
) -> None:
    """Batch 1 brings a row in [0 s, 10 s) after all (Spark's whole value for it, 11): the
    copy is rolled back before the batch commits (its rows would make the window's writes
    wait), and the window goes out with the row when it closes."""
    _, spool, writer = _prepared_setup(clean_store, tmp_path)
    writers.append(writer)
    writer._commit(_windows(("c1", "{}", 0, 11, 11.0), ("c1", "{}", 10, 1, 1.0)), 1)
    assert writer._preparing is None
    assert run_sql(clean_store, _STORED, [T0])[1] == []
    _write_segments(spool, range(12, 13))
    assert writer.between_batches() == 1
    assert run_sql(clean_store, _STORED, [T0])[1] == [("c1", 0, 11, writer.revision(2), False)]


def test_a_copy_at_another_batchs_revision_is_rolled_back(
    clean_store: str, tmp_path: Path, writers: list[HoldingBatchWriter]
) -> None:
    """Delay 3 s: batch 2 runs and commits before the closing segment arrives, so batch 3
    takes it. The copy carries batch 2's revision: batch 2's commit rolls it back (the
    watcher did not look while it ran) and the windows are published the usual way, at
    batch 3's, as without a copy."""
    checkpoint, spool, writer = _prepared_setup(clean_store, tmp_path, delay_s=3)
    writers.append(writer)
    writer._commit(_windows(("c1", "{}", 10, 1, 1.0)), 1)
    _write_segments(spool, range(12, 13))
    _log_offsets(checkpoint, {2: {"udp-0": (11, 12_000)}})
    writer._release_ahead(2)  # W = 9 s
    writer._commit(_windows(("c1", "{}", 10, 2, 2.0)), 2)
    assert run_sql(clean_store, _STORED, [T0])[1] == []
    _write_segments(spool, range(13, 14))
    assert writer.between_batches() == 1
    assert run_sql(clean_store, _STORED, [T0])[1] == [("c1", 0, 10, writer.revision(3), False)]


def test_a_stopped_query_rolls_its_copy_back(
    clean_store: str, tmp_path: Path, writers: list[HoldingBatchWriter]
) -> None:
    """The query stops (``ReleaseWatcher``'s ``on_stop``): nothing of the copy is stored,
    and a writer restarted on the same store publishes the window as usual (here batch 1's
    commit, which finds the log closing it: ``_closed_by_log``)."""
    checkpoint, spool, writer = _prepared_setup(clean_store, tmp_path)
    writer.abort_prepared()
    writer._store.close()
    assert run_sql(clean_store, "select count(*) from window_results")[1] == [(0,)]
    restarted = HoldingBatchWriter(writer._config, writer._window, ResultStore(clean_store),
                                   checkpoint, ManualClock(T0), spool=spool.path)  # fmt: skip
    writers.append(restarted)
    _write_segments(spool, range(12, 14))  # W' = 11 s: [0 s, 10 s) closes, final too
    restarted._release_ahead(1)
    restarted._commit(_windows(("c1", "{}", 10, 1, 1.0)), 1)  # Spark runs batch 1 again
    assert run_sql(clean_store, _STORED, [T0])[1] == [("c1", 0, 10, restarted.revision(2), True)]


def _closing_segment_commits_the_copy(
    writer: HoldingBatchWriter, spool: Spool, store_url: str, heartbeat_s: int, batch_id: int
) -> None:
    """The segment with heartbeat ``heartbeat_s`` closes [0 s, 10 s): the watcher commits
    its copy, at batch ``batch_id``'s revision."""
    preparing = writer._preparing
    assert preparing is not None and preparing.copied
    _write_segments(spool, range(heartbeat_s, heartbeat_s + 1))
    assert writer.between_batches() == 1
    assert writer._preparing is None and not preparing.dropped  # committed, not replaced
    assert run_sql(store_url, _STORED, [T0])[1] == [
        ("c1", 0, 10, writer.revision(batch_id), False)
    ]


def test_a_copy_whose_batch_is_planned_without_the_closing_segment_is_copied_again(
    clean_store: str, tmp_path: Path, writers: list[HoldingBatchWriter]
) -> None:
    """Delay 3 s: batch 2 is planned with [11 s, 12 s) only (W' = 9 s), so the copy's
    revision (batch 2's) was guessed too low. The watcher rolls it back as soon as it sees
    batch 2 planned and copies the window again at batch 3's revision, which batch 2's
    commit keeps and the closing segment commits."""
    checkpoint, spool, writer = _prepared_setup(clean_store, tmp_path, delay_s=3)
    writers.append(writer)
    writer._commit(_windows(("c1", "{}", 10, 1, 1.0)), 1)
    _write_segments(spool, range(12, 13))
    _log_offsets(checkpoint, {2: {"udp-0": (11, 12_000)}})
    assert writer.between_batches() == 0
    assert writer._preparing is not None
    assert (writer._preparing.batch_id, writer._preparing.copied) == (3, True)
    writer._release_ahead(2)
    writer._commit(_windows(("c1", "{}", 11, 1, 1.0)), 2)
    assert writer._preparing is not None and writer._preparing.batch_id == 3
    assert run_sql(clean_store, _STORED, [T0])[1] == []
    _closing_segment_commits_the_copy(writer, spool, clean_store, heartbeat_s=13, batch_id=3)


def test_with_no_batch_running_the_copy_carries_the_revision_of_the_batch_after_the_next(
    clean_store: str, tmp_path: Path, writers: list[HoldingBatchWriter]
) -> None:
    """Batch 0 committed; [10 s, 11 s) is in the log and no batch is planned. Spark plans
    batch 1 with that segment before the closing one comes, so the copy carries batch 2's
    revision, and the closing segment commits it."""
    checkpoint, spool, writer = _batch_zero_committed(clean_store, tmp_path, delay_s=2)
    writers.append(writer)
    _write_segments(spool, range(11, 12))
    assert writer.between_batches() == 0
    assert writer._preparing is not None
    assert (writer._preparing.batch_id, writer._preparing.copied) == (2, True)
    _log_offsets(checkpoint, {1: {"udp-0": (10, 11_000)}})
    writer._release_ahead(1)
    writer._commit(_windows(("c1", "{}", 10, 1, 1.0)), 1)
    assert writer._preparing is not None
    _closing_segment_commits_the_copy(writer, spool, clean_store, heartbeat_s=12, batch_id=2)


def test_a_release_cancelled_before_its_copy_connects_copies_nothing(
    clean_store: str, tmp_path: Path, writers: list[HoldingBatchWriter]
) -> None:
    """``cancel`` before ``copy`` opened its connection (there is no query to cancel yet):
    the copy raises once connected, and nothing is stored."""
    _, _, writer = _prepared_setup(clean_store, tmp_path)
    writers.append(writer)
    release = writer._store.prepare_release(writer._name)
    release.cancel()
    rows = writer._result_rows(_windows(("c1", "{}", 10, 1, 1.0)), 2, None, T0)
    with pytest.raises(psycopg.errors.QueryCanceled):
        release.copy(rows)
    writer.abort_prepared()
    assert run_sql(clean_store, "select count(*) from window_results")[1] == [(0,)]
