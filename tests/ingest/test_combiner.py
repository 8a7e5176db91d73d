"""Pane partials: counters scale by sample rate, timers count it, gauges keep state, timers keep
extremes."""

from __future__ import annotations

import numpy as np
import pytest

from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.protocol import parse_line


def _feed(combiner: PaneCombiner, line: bytes, event_ms: int) -> None:
    samples = parse_line(line)
    assert isinstance(samples, list)
    for sample in samples:
        combiner.add(sample, event_ms, event_ms)


def test_counters_sum_scaled_by_sample_rate_and_count_samples() -> None:
    combiner = PaneCombiner(1000)
    _feed(combiner, b"hits:1|c", 10_100)
    _feed(combiner, b"hits:1|c|@0.5", 10_900)
    _feed(combiner, b"hits:1|c|@0.25", 11_000)  # next pane
    rows = combiner.drain().to_pylist()
    assert [(r["pane_start_ms"], r["count"], r["sum"]) for r in rows] == [
        (10_000, 2, 3.0),
        (11_000, 1, 4.0),
    ]
    assert len(combiner) == 0


@pytest.mark.parametrize(
    ("lines", "count", "total"),
    [
        # a timer, histogram or distribution value stands for 1 / rate values, truncated
        ([b"lat:5|h|@0.5"], 2, 10.0),
        ([b"lat:5|ms|@0.1", b"lat:1|ms"], 11, 51.0),
        ([b"lat:5|d|@0.3"], 3, 15.0),  # 1 / 0.3 = 3.33: 3 values (the Datadog agent's count)
        ([b"lat:5|d|@0.7"], 1, 5.0),  # 1 / 0.7 = 1.43: 1
        ([b"lat:1:2|h|@0.25"], 8, 12.0),  # each value of a multi-value line
        # counters scale the value, not the count; gauges and sets ignore the rate
        ([b"hits:2|c|@0.3"], 1, 2 / 0.3),
        ([b"depth:7|g|@0.5"], 1, 7.0),
        ([b"users:a|s|@0.5"], 1, 1.0),
    ],
)
def test_a_sample_rate_weighs_each_type_as_the_datadog_agent_does(
    lines: list[bytes], count: int, total: float
) -> None:
    combiner = PaneCombiner(1000)
    for line in lines:
        _feed(combiner, line, 100)
    (row,) = combiner.drain().to_pylist()
    assert (row["count"], row["sum"]) == (count, total)


def test_gauge_deltas_move_the_current_value_across_panes() -> None:
    combiner = PaneCombiner(1000)
    _feed(combiner, b"depth:10|g", 1_000)
    _feed(combiner, b"depth:+5|g", 1_200)
    _feed(combiner, b"depth:-20|g", 2_100)
    rows = combiner.drain().to_pylist()
    assert [(r["pane_start_ms"], r["last"], r["min"], r["max"]) for r in rows] == [
        (1_000, 15.0, 10.0, 15.0),
        (2_000, -5.0, -5.0, -5.0),
    ]


def test_timers_keep_count_sum_min_max_per_tag_set() -> None:
    combiner = PaneCombiner(1000)
    _feed(combiner, b"lat:5|ms|#host:a", 500)
    _feed(combiner, b"lat:9|ms|#host:a", 600)
    _feed(combiner, b"lat:7|ms|#host:b", 700)
    rows = {r["tags"]: r for r in combiner.drain().to_pylist()}
    assert rows['{"host":"a"}']["count"] == 2
    assert (rows['{"host":"a"}']["min"], rows['{"host":"a"}']["max"]) == (5.0, 9.0)
    assert rows['{"host":"a"}']["sum"] == 14.0
    assert rows['{"host":"b"}']["count"] == 1


def test_a_name_keeps_its_first_type() -> None:
    combiner = PaneCombiner(1000)
    first = parse_line(b"x:1|c")
    second = parse_line(b"x:1|g")
    assert isinstance(first, list) and isinstance(second, list)
    assert combiner.known_type("x") is None
    combiner.remember_type(first[0])
    combiner.remember_type(second[0])  # a later type never replaces the first
    assert combiner.known_type("x") == "c" != second[0].metric_type


def _inputs(combiner: PaneCombiner) -> None:
    """Both lanes, two panes, a timer with values in both lanes, a set."""
    _feed(combiner, b"lat:5|ms", 1_100)
    _feed(combiner, b"hits:2|c", 1_200)
    _feed(combiner, b"users:ann|s", 1_300)
    lat = combiner.slot_of(("lat", "ms", "{}"))
    hits = combiner.slot_of(("hits", "c", "{}"))
    assert lat is not None and hits is not None
    slots = np.array([lat, hits, lat, lat], dtype=np.int64)
    combiner.add_fast(slots, np.array([7.0, 3.0, 1.5, 9.0]), 1_400)  # pane 1000
    combiner.add_fast(slots[:2], np.array([4.0, 1.0]), 2_050)  # pane 2000: 1000 is sealed
    _feed(combiner, b"lat:11|ms", 2_060)  # the fast partial of (lat, 2000) moves over


def test_detached_partials_build_what_drain_gives_after_the_combiner_moved_on() -> None:
    """The writer thread builds a detached roll while the receive loop goes on: freeing the
    slots and reusing them for other series must not rename or change what was detached."""
    expected = PaneCombiner(1000)
    _inputs(expected)
    combiner = PaneCombiner(1000)
    _inputs(combiner)
    detached = combiner.detach()
    assert len(combiner) == 0
    combiner.forget("lat", "ms", ())
    combiner.forget("hits", "c", ())
    _feed(combiner, b"other:1|d", 2_500)  # takes a freed slot
    _feed(combiner, b"again:3|ms", 2_600)
    batch = detached.build()
    assert batch.equals(expected.drain())
    rows = {(r["metric"], r["pane_start_ms"]): r for r in batch.to_pylist()}
    assert sorted(rows) == [("hits", 1000), ("hits", 2000), ("lat", 1000), ("lat", 2000),
                            ("users", 1000)]
    assert rows[("lat", 1000)]["count"] == 4 and rows[("lat", 1000)]["sum"] == 22.5
    assert sum(rows[("lat", 1000)]["hdr_count"]) == 4
    assert rows[("lat", 2000)]["count"] == 2 and sum(rows[("lat", 2000)]["hdr_count"]) == 2
    assert [r["metric"] for r in combiner.drain().to_pylist()] == ["again", "other"]


def test_fast_rows_name_the_series_a_reused_slot_holds_at_each_drain() -> None:
    """A slot freed and given to another series names the new one in the next drains, whether
    the slot was reused before the next drain or stayed free through one."""
    combiner = PaneCombiner(1000)

    def fast(line: bytes, value: float, event_ms: int) -> None:
        _feed(combiner, line, event_ms)  # the series gets a slot (general lane)...
        (sample,) = parse_line(line)  # type: ignore[misc]
        slot = combiner.slot_of((sample.metric, sample.metric_type, "{}"))
        assert slot is not None
        combiner.add_fast(np.array([slot]), np.array([value]), event_ms)  # ...then the fast one

    def drained() -> list[tuple[str, str, int]]:
        rows = combiner.drain().to_pylist()
        return [(r["metric"], r["metric_type"], r["count"]) for r in rows]

    fast(b"a:1|ms", 2.0, 1_100)
    fast(b"b:1|c", 2.0, 1_100)
    assert drained() == [("a", "ms", 2), ("b", "c", 2)]
    combiner.forget("a", "ms", ())
    fast(b"c:1|c", 5.0, 2_100)  # a's slot, reused before the next drain
    combiner.add_fast(np.array([combiner.slot_of(("b", "c", "{}"))]), np.array([1.0]), 2_200)
    assert drained() == [("b", "c", 1), ("c", "c", 2)]
    combiner.forget("c", "c", ())
    combiner.add_fast(np.array([combiner.slot_of(("b", "c", "{}"))]), np.array([1.0]), 3_100)
    assert drained() == [("b", "c", 1)]  # c's slot free through a drain
    fast(b"d:3|d", 4.0, 4_100)
    fast(b"e:1|ms", 1.0, 4_200)  # a new slot
    assert drained() == [("d", "d", 2), ("e", "ms", 2)]
