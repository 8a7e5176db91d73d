"""Which recomputed session/sliding windows replay publishes (``replay.affected_windows``).

Sliding, pane 1 s, size 3 s, a late partial at 4 s::

    t (s)        0   1   2   3   4   5   6   7   8
    late                         x
    [2, 5)               [...........)          holds it: published, its late row applied
    [5, 8)                           [...........)  starts at 4 + 1: only the late pane
                                                    defines it: published (an insert)
    [6, 9)                               [...........)  neither: left alone
"""

from __future__ import annotations

import pyarrow as pa

from streamgauge.configs import WindowSpec
from streamgauge.sinks.store import LateRecord
from streamgauge.windows.replay import affected_windows


def recomputed(*rows: tuple[str, str, int, int]) -> pa.Table:
    metric, tags, start, end = zip(*rows, strict=True)
    return pa.table({"metric": metric, "tags": tags, "window_start_ms": start,
                     "window_end_ms": end})  # fmt: skip


def test_sliding_windows_holding_or_defined_by_a_late_partial_are_published() -> None:
    window = WindowSpec(name="s", kind="sliding", size_ms=3000)
    table = recomputed(("a", "{}", 2000, 5000), ("a", "{}", 5000, 8000), ("a", "{}", 6000, 9000),
                       ("b", "{}", 2000, 5000))  # fmt: skip
    late = [LateRecord(7, "a", "{}", 4000, 1)]
    chosen, applied = affected_windows(table, late, window, pane_ms=1000)
    assert chosen.column("window_start_ms").to_pylist() == [2000, 5000]
    assert chosen.column("metric").to_pylist() == ["a", "a"]
    assert applied == [7]


def test_sessions_holding_a_late_partial_of_their_own_series_are_published() -> None:
    """Series match on canonical tags: jsonb hands back keys in its own order and spacing."""
    window = WindowSpec(name="s", kind="session", gap_ms=4000, key="user")
    table = recomputed(("a", '{"host":"h","user":"u1"}', 0, 10_000),
                       ("a", '{"host":"h","user":"u2"}', 0, 10_000),
                       ("a", '{"host":"h","user":"u1"}', 20_000, 24_000))  # fmt: skip
    late = [LateRecord(1, "a", '{"host":"h","user":"u1"}', 3000, 1),
            LateRecord(2, "a", '{"host":"h","user":"u1"}', 10_000, 1)]  # fmt: skip
    chosen, applied = affected_windows(table, late, window, pane_ms=1000)
    assert chosen.column("tags").to_pylist() == ['{"host":"h","user":"u1"}']
    assert chosen.column("window_start_ms").to_pylist() == [0]
    assert applied == [1]  # 10 s is the session's exclusive end: not inside it, not applied
