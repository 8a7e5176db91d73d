"""Hopping windows published from their panes (``commit_batch(panes=...)``), against a real
PostgreSQL: the store keeps a hopping window's pane aggregates and merges a window of them
when the watermark passes its end, when a pane of a published window changes, and at early
ticks. The window job does not publish this way (it merges a hopping window's panes in the
driver, ``docs/architecture.md §4``; its rules are pinned by the transcripts,
``tests/windows/transcripts/hopping*.yaml``); these pin the store's own rules for it.

Windows of size 4 s, hop 2 s, lateness 1 s (times in seconds)::

    panes       | 0  | 2  | 4  | 6  |
    h-2    [=========)                  [-2, 2)
    h0          [=========)             [0, 4)
    h2               [=========)        [2, 6)
    h4                    [=========)   [4, 8)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from streamgauge.cli import _window_status
from streamgauge.clock import ManualClock
from streamgauge.sinks.store import (
    PANE_SCHEMA,
    RESULT_SCHEMA,
    BatchOutcome,
    Finalization,
    PaneBatch,
    ResultStore,
    RetryPolicy,
    pane_window_starts,
    run_sql,
)

SECOND = 1000
SIZE, HOP, LATENESS = 4 * SECOND, 2 * SECOND, 1 * SECOND
NOW = 1_800_000_000_000
LANE = ("c", "g", "s")


@pytest.fixture
def store(clean_store: str) -> Iterator[ResultStore]:
    with ResultStore(clean_store, clock=ManualClock(NOW), retry=RetryPolicy(max_attempts=2)) as s:
        yield s


def pane(at_s: int, count: int, total: float, **overrides: Any) -> dict[str, Any]:
    """A counter pane at ``at_s`` seconds, on time for every window holding it."""
    row: dict[str, Any] = {
        "config_name": "web", "window_name": "h", "metric": "a", "tags": "{}",
        "pane_ms": at_s * SECOND, "from_start_ms": at_s * SECOND - SIZE + HOP,
        "metric_type": "c", "count": count, "sum": total, "min": None, "max": None,
        "last": None, "last_event_ms": None, "sketch": None,
    }  # fmt: skip
    row.update(overrides)
    return row


def commit(
    store: ResultStore, batch: int, watermark_s: float, *panes: dict[str, Any],
    early_every_s: int | None = None, progress_s: float | None = None,
) -> BatchOutcome:  # fmt: skip
    """One micro-batch of pane aggregates at watermark ``W`` (revision = batch + 1); the batch's
    own progress (its heartbeats' watermark) is ``W`` unless given."""
    watermark = int(watermark_s * SECOND)
    progress = watermark if progress_s is None else int(progress_s * SECOND)
    revision = batch + 1

    def to_results(assembled: pa.Table) -> pa.Table:
        n = assembled.num_rows
        ends = assembled.column("window_end_ms").to_pylist()
        values = assembled.drop_columns(["set_sketches"])
        extra = {
            "config_name": ["web"] * n, "window_name": ["h"] * n, "revision": [revision] * n,
            "is_final": [end + LATENESS <= watermark for end in ends],
            "late_events": [0] * n, "emitted_at_ms": [NOW] * n,
        }  # fmt: skip
        for name, column in extra.items():
            values = values.append_column(name, pa.array(column, RESULT_SCHEMA.field(name).type))
        for name in ("p50", "p90", "p99", "distinct_count"):
            values = values.append_column(name, pa.nulls(n, pa.float64()))
        return values

    rows = pa.Table.from_pylist(list(panes), schema=PANE_SCHEMA)
    early = None if early_every_s is None else early_every_s * SECOND
    batch_panes = PaneBatch(
        panes=rows, size_ms=SIZE, hop_ms=HOP, allowed_lateness_ms=LATENESS,
        early_every_ms=early, config_name="web", window_name="h",
        watermark_key="watermark_ms:h", to_results=to_results, progress_ms=progress,
    )  # fmt: skip
    return store.commit_batch(
        "web.h", batch, RESULT_SCHEMA.empty_table(),
        [Finalization("web", "h", watermark, LATENESS, LANE)], revision=revision,
        state={("web", "watermark_ms:h"): watermark}, hold_after={("web", "h"): watermark},
        lane_types=LANE, panes=batch_panes,
        early_every={} if early is None else {("web", "h"): early},
    )  # fmt: skip


def windows(url: str) -> list[tuple[Any, ...]]:
    """(start s, count, sum, revision, final, early tick s) of every published window."""
    _, rows = run_sql(
        url,
        "SELECT (extract(epoch FROM window_start))::int, count, sum, revision, is_final,"
        " (extract(epoch FROM early_as_of))::int FROM window_results ORDER BY window_start",
    )
    return rows


def kept_panes(url: str) -> list[tuple[Any, ...]]:
    _, rows = run_sql(url, "SELECT pane_ms / 1000, count FROM window_panes ORDER BY pane_ms")
    return rows


def test_a_window_is_merged_from_its_panes_when_the_watermark_passes_its_end(
    store: ResultStore, clean_store: str
) -> None:
    """W = 1 s: nothing has ended. W = 2.5 s: h-2 ends. W = 4.5 s: h0 = panes 0 + 2."""
    assert commit(store, 0, 1, pane(0, 1, 1.0), pane(2, 2, 3.0)).rows_upserted == 0
    assert windows(clean_store) == []
    assert commit(store, 1, 2.5).rows_upserted == 1  # no pane changed: h-2 ended
    assert windows(clean_store) == [(-2, 1, 1.0, 2, False, None)]
    commit(store, 2, 4.5, pane(4, 10, 10.0))
    assert windows(clean_store) == [
        (-2, 1, 1.0, 3, True, None),  # 2 + 1 <= 4.5: final, at this batch's revision
        (0, 3, 4.0, 3, False, None),
    ]


def test_a_changed_pane_corrects_the_published_windows_holding_it(
    store: ResultStore, clean_store: str
) -> None:
    """Pane 2 grows after h0 was published (W 4.5 s: h0 open to stragglers until 5 s)."""
    commit(store, 0, 4.5, pane(0, 1, 1.0), pane(2, 2, 3.0))
    commit(store, 1, 4.6, pane(2, 3, 103.0))
    assert windows(clean_store) == [
        (-2, 1, 1.0, 1, True, None),
        (0, 4, 104.0, 2, False, None),  # corrected at batch 1's revision; h2 not ended
    ]


def test_a_straggler_reaches_only_the_windows_it_is_on_time_for(
    store: ResultStore, clean_store: str
) -> None:
    """A partial in pane 2 late for h0 (final) but on time for h2 has from_start 2 s: its
    pane row is apart from the on-time one, and h0 leaves it out."""
    commit(store, 0, 5, pane(0, 1, 1.0), pane(2, 2, 3.0))
    commit(store, 1, 5, pane(2, 1, 100.0, from_start_ms=2 * SECOND))
    commit(store, 2, 6.5, pane(4, 1, 10.0))
    assert windows(clean_store)[1:] == [
        (0, 3, 4.0, 1, True, None),
        (2, 4, 113.0, 3, False, None),  # 2 + 1 (both pane-2 rows) + 1 (pane 4)
    ]


def test_panes_leave_once_every_window_holding_them_is_final(
    store: ResultStore, clean_store: str
) -> None:
    """Pane p's newest window is [p, p + 4 s): final when p + 4 + 1 <= W."""
    commit(store, 0, 1, pane(0, 1, 1.0), pane(2, 1, 1.0), pane(4, 1, 1.0))
    commit(store, 1, 4.9)
    assert kept_panes(clean_store) == [(0, 1), (2, 1), (4, 1)]
    commit(store, 2, 6.9)
    assert kept_panes(clean_store) == [(2, 1), (4, 1)]  # 0 + 4 + 1 <= 6.9; 2 + 4 + 1 > 6.9
    commit(store, 3, 9)
    assert kept_panes(clean_store) == []
    assert [w[0] for w in windows(clean_store)] == [-2, 0, 2, 4]
    assert all(w[4] for w in windows(clean_store))


def test_a_rebuild_under_a_later_stored_watermark_keeps_panes_until_its_batches_pass_them(
    store: ResultStore, clean_store: str
) -> None:
    """A new checkpoint re-reads the log while the stored watermark is at 100 s: every window
    it touches is published at once (final), and pane 2, split over two of its batches,
    comes back whole in the second; h0 must still hold pane 0 then."""
    commit(store, 0, 100, pane(0, 1, 1.0), pane(2, 2, 2.0), progress_s=1)
    assert windows(clean_store)[1] == (0, 3, 3.0, 1, True, None)
    commit(store, 1, 100, pane(2, 5, 5.0), progress_s=3)
    assert windows(clean_store)[1] == (0, 6, 6.0, 2, True, None)
    assert kept_panes(clean_store) == [(0, 1), (2, 5)]  # 0 + 4 + 1 > 3: not yet
    commit(store, 2, 100, progress_s=10)
    assert kept_panes(clean_store) == []


def test_a_replayed_batch_changes_nothing(store: ResultStore, clean_store: str) -> None:
    commit(store, 0, 4.5, pane(0, 1, 1.0), pane(2, 2, 3.0))
    before = windows(clean_store)
    assert commit(store, 0, 4.5, pane(0, 1, 1.0), pane(2, 2, 3.0)).already_committed
    assert windows(clean_store) == before


def test_an_open_window_is_published_early_from_its_panes_once_per_tick(
    store: ResultStore, clean_store: str
) -> None:
    """early_every 1 s; (start s, count, sum, revision, final, early tick s) per batch::

        W    0.5          1.2            2.1            3.0             4.0
        h-2  early @0     - (unchanged)  on time        final
        h0   -            early @1       early @2 (chg) - (unchanged)   on time
        h2   -            -              - (W - 2 < 1)  early @3
    """
    commit(store, 0, 0.5, pane(0, 1, 1.0), early_every_s=1)
    assert windows(clean_store) == [(-2, 1, 1.0, 1, False, 0)]
    commit(store, 1, 1.2, early_every_s=1)
    assert windows(clean_store) == [(-2, 1, 1.0, 1, False, 0), (0, 1, 1.0, 2, False, 1)]
    commit(store, 2, 2.1, pane(2, 2, 3.0), early_every_s=1)
    assert windows(clean_store) == [(-2, 1, 1.0, 3, False, None), (0, 3, 4.0, 3, False, 2)]
    commit(store, 3, 3.0, early_every_s=1)
    assert windows(clean_store) == [
        (-2, 1, 1.0, 4, True, None), (0, 3, 4.0, 3, False, 2), (2, 2, 3.0, 4, False, 3),
    ]  # fmt: skip
    commit(store, 4, 4.0, early_every_s=1)
    assert windows(clean_store)[1] == (0, 3, 4.0, 5, False, None)


def test_a_fresh_checkpoint_forgets_its_windows_panes_only(
    store: ResultStore, clean_store: str
) -> None:
    commit(store, 0, 1, pane(0, 1, 1.0), pane(0, 1, 1.0, window_name="other"))
    store.start_checkpoint("web", "h", ["web.h"], forget_panes=True)
    _, rows = run_sql(clean_store, "SELECT window_name FROM window_panes")
    assert rows == [("other",)]


def test_window_latest_shows_unpublished_windows_merged_from_their_panes(
    store: ResultStore, clean_store: str
) -> None:
    """Before W passes h0's end, window_latest shows it pending (panes 0 + 2, the revision of
    the batch that last changed a pane); then provisional, as published."""
    commit(store, 0, 1, pane(0, 1, 1.0))
    commit(store, 1, 3, pane(2, 2, 3.0))
    query = (
        "SELECT (extract(epoch FROM window_start))::int, count, sum, min, revision, status"
        " FROM window_latest ORDER BY window_start"
    )
    assert run_sql(clean_store, query)[1] == [
        (-2, 1, 1.0, None, 2, "final"),  # 2 + 1 <= W 3; min is NULL: not a gauge
        (0, 3, 4.0, None, 2, "pending"),
        (2, 2, 3.0, None, 2, "pending"),
    ]
    commit(store, 2, 4.5)
    assert run_sql(clean_store, query)[1][1] == (0, 3, 4.0, None, 3, "provisional")


def test_status_counts_windows_waiting_as_panes_as_pending(
    store: ResultStore, clean_store: str
) -> None:
    """W 1 s: h-2, h0 and h2 (panes 0, 2) have not ended; W 3 s: h-2 has."""
    commit(store, 0, 1, pane(0, 1, 1.0), pane(2, 1, 1.0))
    [status] = _window_status(clean_store)
    assert (status["window_name"], status["windows_pending"]) == ("h", 3)
    commit(store, 1, 3)
    [status] = _window_status(clean_store)
    assert (status["windows_pending"], status["windows_emitted"]) == (2, 1)


@pytest.mark.parametrize(
    ("previous", "watermark", "early", "oldest", "starts"),
    [
        (None, 4500, None, None, []),  # no pane kept, no watermark before: nothing to publish
        (None, 4500, None, 0, [-2000, 0]),  # first batch: every ended window of the kept panes
        (2500, 4500, None, 0, [0]),  # [0, 4) ends in (2.5 s, 4.5 s]
        (4500, 4900, None, 0, []),  # no end in (4.5 s, 4.9 s]
        (1200, 2100, 1000, 0, [-2000, 0]),  # [-2, 2) ended; [0, 4)'s tick 2 s is after 1.2 s
        (2100, 2900, 1000, 0, []),  # ticks 2 s again: nothing new
    ],
)
def test_the_starts_a_batch_publishes_whatever_its_panes(
    previous: int | None, watermark: int, early: int | None, oldest: int | None,
    starts: list[int],
) -> None:  # fmt: skip
    """Size 4 s, hop 2 s (module docstring): (b) ended in (W0, W], (c) early ticks."""
    assert pane_window_starts(previous, watermark, SIZE, HOP, 0, early, oldest) == starts
