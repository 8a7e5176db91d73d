"""Pane partials: counters scale by sample rate, gauges keep state, timers keep extremes."""

from __future__ import annotations

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
