"""Sketch columns of pane partials: built from exactly the values each partial received."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.protocol import MAX_SAMPLE_WEIGHT, Sample, sample_weight
from streamgauge.sketches.accuracy import compile_accuracy, kll_error
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hll import estimate
from streamgauge.sketches.kll import deserialize_kll, new_kll, serialize_kll
from streamgauge.sketches.tdigest import (
    deserialize_tdigest,
    new_tdigest,
    quantiles,
    serialize_tdigest,
)

PANE = 1000


def _rows(batch: pa.RecordBatch) -> dict[tuple[str, int], dict[str, object]]:
    return {(r["metric"], r["pane_start_ms"]): r for r in batch.to_pylist()}


def test_timer_partials_carry_a_tdigest_and_hdr_buckets_of_their_values() -> None:
    rng = np.random.default_rng(7)
    values = rng.lognormal(3.0, 1.0, 500).round(3)
    combiner = PaneCombiner(PANE)
    for i, value in enumerate(values):
        pane = 0 if i < 300 else PANE  # two panes: each partial sketches only its own values
        combiner.add(Sample("api.latency", "ms", float(value), 1.0, ()), pane + 5, pane + 5)
    combiner.add(Sample("api.count", "c", 1.0, 1.0, ()), 5, 5)
    rows = _rows(combiner.drain())
    layout = HdrLayout.from_params(compile_accuracy())
    for pane, part in ((0, values[:300]), (PANE, values[300:])):
        row = rows[("api.latency", pane)]
        digest = deserialize_tdigest(row["sketch"])  # type: ignore[arg-type]
        assert digest.get_total_weight() == len(part)
        assert (digest.get_min_value(), digest.get_max_value()) == (part.min(), part.max())
        expected = layout.histogram(part)
        assert row["hdr_bucket"] == expected.indices.tolist()
        assert row["hdr_count"] == expected.counts.tolist()
        assert sum(expected.counts) == row["count"] == len(part)
    counter = rows[("api.count", 0)]
    assert (counter["sketch"], counter["hdr_bucket"], counter["hdr_count"]) == (None, None, None)


def test_a_partial_s_tdigest_is_datasketches_own_bytes_for_its_values() -> None:
    """Built for all partials at once, each pane digest is the image DataSketches' own
    ``update`` then ``serialize`` makes of the partial's values, in the order they came: one
    value (the single-value form), a few, and more than the compression keeps apart; through
    the general lane, the fast lane, and both."""
    rng = np.random.default_rng(11)
    sizes = {"one": 1, "few": 10, "near": 150, "many": 1000}
    combiner = PaneCombiner(PANE)
    slots = {name: combiner.add(Sample(name, "ms", 0.5, 1.0, ()), 5, 5) for name in sizes}
    sent: dict[str, list[float]] = {name: [0.5] for name in sizes}
    for name, size in sizes.items():
        values = rng.lognormal(3.0, 1.0, size).round(3)
        general, fast = values[: size // 2], values[size // 2:]
        for value in general:
            combiner.add(Sample(name, "ms", float(value), 1.0, ()), 6, 6)
        combiner.add_fast(np.full(len(fast), slots[name], np.int64), fast, 7)
        sent[name] += general.tolist() + fast.tolist()
    rows = _rows(combiner.drain())
    for name, values_sent in sent.items():
        expected = new_tdigest(compile_accuracy().tdigest_k)
        expected.update(np.array(values_sent))
        assert rows[(name, 0)]["sketch"] == serialize_tdigest(expected), name


@pytest.mark.parametrize("size", [1, 2, 10, 199])
def test_a_partial_s_kll_is_datasketches_own_bytes_below_k_values(size: int) -> None:
    """With ``quantiles: kll``, below k values a pane's KLL (built for all partials at once)
    is the image DataSketches' ``update`` then ``serialize`` makes of the partial's values in
    its order: the fast lane's, then the general lane's (``PaneSketches.columns``)."""
    k = 200
    values = np.random.default_rng(size).lognormal(3.0, 1.0, size).round(3)
    combiner = PaneCombiner(PANE, kll_k=k)
    slot = combiner.add(Sample("api.latency", "ms", float(values[0]), 1.0, ()), 5, 5)
    combiner.add(Sample("other", "ms", 1.0, 1.0, ()), 5, 5)  # a second owner beside it
    combiner.add_fast(np.full(size - 1, slot, np.int64), values[1:], 6)
    rows = _rows(combiner.drain())
    expected = new_kll(k)
    expected.update(np.concatenate([values[1:], values[:1]]))
    assert rows[("api.latency", 0)]["kll"] == serialize_kll(expected)


@pytest.mark.parametrize("size", [200, 1000, 20_000])
def test_a_partial_s_kll_of_k_values_or_more_holds_them_within_its_rank_bound(size: int) -> None:
    """From k values on the pane's KLL is compacted (deterministically, where DataSketches'
    ``update`` flips a coin): every value counted, min and max exact, ranks within the
    sketch's bound, and the same bytes for the same values."""
    k = 200
    values = np.random.default_rng(size).lognormal(3.0, 1.0, size)

    def kll_of(sent: np.ndarray) -> bytes:
        combiner = PaneCombiner(PANE, kll_k=k)
        slot = combiner.add(Sample("api.latency", "ms", float(sent[0]), 1.0, ()), 5, 5)
        combiner.add_fast(np.full(len(sent) - 1, slot, np.int64), sent[1:], 6)
        blob = combiner.drain().column("kll")[0].as_py()
        assert isinstance(blob, bytes)
        return blob

    blob = kll_of(values)
    assert blob == kll_of(values)
    sketch = deserialize_kll(blob)
    assert (sketch.n, sketch.get_min_value(), sketch.get_max_value()) == (
        size, values.min(), values.max())
    ordered = np.sort(values)
    for q in (0.5, 0.9, 0.99):
        rank = np.searchsorted(ordered, sketch.get_quantile(q), side="right") / size
        assert abs(rank - q) <= 1.5 * kll_error(k), q


def test_fast_lane_values_reach_the_same_sketches_as_the_general_lane() -> None:
    """Half the samples through ``add``, half through ``add_fast``, interleaved: the partial's
    sketches hold all of them."""
    combiner = PaneCombiner(PANE)
    slot = combiner.add(Sample("t", "h", 1.0, 1.0, (("k", "v"),)), 10, 10)
    other = combiner.add(Sample("u", "d", 2.0, 1.0, ()), 10, 10)
    counter = combiner.add(Sample("n", "c", 1.0, 1.0, ()), 10, 10)
    sent_t, sent_u = [1.0], [2.0]
    for step in range(20):
        fast_t = np.arange(step * 10, step * 10 + 10, dtype=np.float64)
        slots = np.array([slot] * 10 + [other, counter], dtype=np.int64)
        combiner.add_fast(slots, np.concatenate([fast_t, [step + 0.5, 1.0]]), 20 + step)
        sent_t += fast_t.tolist()
        sent_u.append(step + 0.5)
        combiner.add(Sample("t", "h", 1000.0 + step, 1.0, (("k", "v"),)), 20 + step, 20 + step)
        sent_t.append(1000.0 + step)
    rows = _rows(combiner.drain())
    layout = HdrLayout.from_params(compile_accuracy())
    for metric, sent in (("t", sent_t), ("u", sent_u)):
        row = rows[(metric, 0)]
        assert row["count"] == len(sent)
        expected = layout.histogram(np.array(sent))
        assert (row["hdr_bucket"], row["hdr_count"]) == (
            expected.indices.tolist(), expected.counts.tolist()
        )
        digest = deserialize_tdigest(row["sketch"])  # type: ignore[arg-type]
        assert digest.get_total_weight() == len(sent)
        assert digest.get_max_value() == max(sent)
    assert rows[("n", 0)]["sketch"] is None


def test_a_slot_freed_before_the_drain_keeps_its_buffered_values() -> None:
    combiner = PaneCombiner(PANE)
    slot = combiner.add(Sample("t", "ms", 1.0, 1.0, ()), 10, 10)
    combiner.add_fast(np.array([slot, slot], dtype=np.int64), np.array([2.0, 3.0]), 20)
    combiner.forget("t", "ms", ())
    reused = combiner.add(Sample("other", "ms", 50.0, 1.0, ()), 30, 30)
    assert reused == slot  # the slot went to another series...
    rows = _rows(combiner.drain())
    digest = deserialize_tdigest(rows[("t", 0)]["sketch"])  # type: ignore[arg-type]
    assert (digest.get_total_weight(), digest.get_max_value()) == (3, 3.0)  # ...not its values
    assert deserialize_tdigest(rows[("other", 0)]["sketch"]).get_total_weight() == 1  # type: ignore[arg-type]


def test_set_partials_carry_an_hll_of_their_members() -> None:
    combiner = PaneCombiner(PANE)
    members = [f"user-{i % 300}" for i in range(1000)]  # 300 distinct, repeated
    for i, member in enumerate(members):
        combiner.add(Sample("users", "s", 1.0, 1.0, (), member=member), i, i)
    row = _rows(combiner.drain())[("users", 0)]
    assert row["count"] == 1000
    sketch = row["sketch"]
    assert isinstance(sketch, bytes)
    assert round(estimate(sketch).estimate) == 300  # exact mode (coupon list)
    assert (row["hdr_bucket"], row["hdr_count"]) == (None, None)


def _sampled_rows(combiner: PaneCombiner, sent: list[tuple[float, float]]) -> dict[str, object]:
    """``sent`` (value, rate) of timer ``t``: the first half through ``add``, the rest through
    ``add_fast`` with the weights the fast path gives them; the drained row."""
    half = len(sent) // 2
    slot = 0
    for value, rate in sent[:half]:
        slot = combiner.add(Sample("t", "ms", value, rate, ()), 10, 10)
    values = np.array([v for v, _ in sent[half:]])
    weights = np.array([sample_weight("ms", r) for _, r in sent[half:]], dtype=np.int64)
    combiner.add_fast(np.full(len(values), slot, dtype=np.int64), values, 20, weights)
    return _rows(combiner.drain())[("t", 0)]


def test_a_sampled_value_weighs_in_every_sketch_as_that_many_values_would() -> None:
    """``t:v|ms|@rate`` against ``1 / rate`` (truncated) copies of ``t:v|ms``: the same count,
    sum and HDR buckets; the same t-digest quantiles (below ~160 values nothing is compressed:
    w unit centroids either way) and KLL quantiles (every value kept, n < k)."""
    rng = np.random.default_rng(3)
    rates = [1.0, 0.5, 0.25, 0.3, 0.1]
    sent = [(float(v), rates[i % len(rates)]) for i, v in enumerate(rng.integers(1, 500, 24))]
    copies = [(v, 1.0) for v, rate in sent for _ in range(int(1 / rate))]
    weighted = _sampled_rows(PaneCombiner(PANE, kll_k=200), sent)
    repeated = _sampled_rows(PaneCombiner(PANE, kll_k=200), copies)
    assert weighted["count"] == repeated["count"] == len(copies)
    assert weighted["sum"] == sum(v for v, _ in copies)
    for column in ("min", "max", "hdr_bucket", "hdr_count"):
        assert weighted[column] == repeated[column], column
    ours = deserialize_tdigest(weighted["sketch"])  # type: ignore[arg-type]
    theirs = deserialize_tdigest(repeated["sketch"])  # type: ignore[arg-type]
    assert ours.get_total_weight() == theirs.get_total_weight() == len(copies)
    qs = np.linspace(0.05, 0.95, 19)
    assert quantiles(ours, qs).tolist() == quantiles(theirs, qs).tolist()
    kll_ours = deserialize_kll(weighted["kll"])  # type: ignore[arg-type]
    kll_theirs = deserialize_kll(repeated["kll"])  # type: ignore[arg-type]
    assert kll_ours.n == kll_theirs.n == len(copies)
    assert [kll_ours.get_quantile(q) for q in qs] == [kll_theirs.get_quantile(q) for q in qs]


def test_a_huge_weight_is_carried_not_repeated() -> None:
    """``@1e-9`` stands for 999 999 999 values (``1 / rate`` truncated); ``@1e-300`` is capped
    at ``MAX_SAMPLE_WEIGHT``. Neither is built by repeating the value."""
    combiner = PaneCombiner(PANE, kll_k=200)
    combiner.add(Sample("t", "h", 7.0, 1e-9, ()), 10, 10)
    combiner.add(Sample("t", "h", 3.0, 1e-300, ()), 10, 10)
    row = _rows(combiner.drain())[("t", 0)]
    total = int(1 / 1e-9) + MAX_SAMPLE_WEIGHT
    assert row["count"] == total == 999_999_999 + 2**31
    assert row["sum"] == 7.0 * 999_999_999 + 3.0 * 2**31
    counts = row["hdr_count"]
    assert isinstance(counts, list) and sum(counts) == total
    assert deserialize_tdigest(row["sketch"]).get_total_weight() == total  # type: ignore[arg-type]
    assert deserialize_kll(row["kll"]).n == total  # type: ignore[arg-type]
