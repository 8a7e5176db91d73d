"""HDR histogram layout: our numpy indices and quantiles are the ``hdrhistogram`` package's."""

from __future__ import annotations

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram
from hypothesis import given, settings
from hypothesis import strategies as st

from streamgauge.sketches import compile_accuracy
from streamgauge.sketches.hdr import HdrLayout, merge

DEFAULT = HdrLayout.from_params(compile_accuracy())
# Small and odd layouts too: lowest > 1 (unit magnitude > 0), 1 and 3 digits.
LAYOUTS = [
    DEFAULT,
    HdrLayout(1, 10_000, 1, 1.0),
    HdrLayout(1000, 100_000_000, 2, 1.0),
    HdrLayout(1, 3_600_000_000, 3, 1000.0),
]


def _package(layout: HdrLayout) -> HdrHistogram:
    return HdrHistogram(layout.lowest, layout.highest, layout.significant_digits)


def _boundaries(layout: HdrLayout) -> np.ndarray:
    """Every bucket's first and last integer, and their neighbours, within [0, highest]."""
    ref = _package(layout)
    lows = np.array([ref.get_value_from_index(i) for i in range(ref.counts_len)], dtype=np.int64)
    edges = np.concatenate([lows - 1, lows, lows + 1, np.arange(0, 600), [layout.highest]])
    return np.unique(edges[(edges >= 0) & (edges <= layout.highest)])


@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
def test_indices_equal_package_at_every_bucket_boundary(layout: HdrLayout) -> None:
    ref = _package(layout)
    scaled = _boundaries(layout)
    ours = layout.indices_of_scaled(scaled)
    theirs = np.array([ref._counts_index_for(int(x)) for x in scaled])
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("layout", LAYOUTS, ids=repr)
def test_bucket_bounds_equal_package(layout: HdrLayout) -> None:
    ref = _package(layout)
    for index in range(0, ref.counts_len, 7):
        low = ref.get_value_from_index(index)
        assert layout.bucket_lower(index) == low / layout.value_scale
        assert layout.bucket_upper(index) == (ref.get_highest_equivalent_value(low) + 1) / (
            layout.value_scale
        )


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(0.0, 3_600_000.0, allow_nan=False), min_size=1, max_size=50))
def test_float_values_index_like_record_value(values: list[float]) -> None:
    """Our index of a float ms value is where ``record_value(v * value_scale)`` puts it."""
    ref = _package(DEFAULT)
    ours = DEFAULT.bucket_indices(np.array(values))
    for v, index in zip(values, ours, strict=True):
        assert ref._counts_index_for(v * DEFAULT.value_scale) == index


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.floats(0.0, 50_000.0, allow_nan=False), min_size=1, max_size=300),
    st.floats(0.0, 1.0),
)
def test_quantile_equals_package(values: list[float], q: float) -> None:
    ref = _package(DEFAULT)
    for v in values:
        assert ref.record_value(v * DEFAULT.value_scale)
    buckets = DEFAULT.histogram(np.array(values))
    expected = ref.get_value_at_percentile(q * 100) / DEFAULT.value_scale
    assert DEFAULT.quantile(buckets.indices, buckets.counts, q) == expected


def test_out_of_range_values_are_clamped_and_counted() -> None:
    values = np.array(
        [
            -5.0,
            -0.0001,
            0.0,
            1.5,
            3_600_000.0,
            3_600_000.0009,
            3_600_001.0,
            4e6,
            np.inf,
            -np.inf,
            np.nan,
        ]
    )
    buckets = DEFAULT.histogram(values)
    assert (buckets.clamped_low, buckets.clamped_high, buckets.nan) == (3, 3, 1)
    assert int(buckets.counts.sum()) == len(values) - 1  # all but the NaN
    top = DEFAULT.bucket_indices(np.array([3_600_000.0]))[0]
    assert (
        dict(zip(buckets.indices.tolist(), buckets.counts.tolist(), strict=True))[top] == 5
    )  # 3 clamped + 2 in range


def test_encoding_round_trips_and_other_readers_agree() -> None:
    rng = np.random.default_rng(3)
    values = rng.lognormal(3.0, 1.2, 20_000)
    idx, cnt, *_ = DEFAULT.histogram(values)
    encoded = DEFAULT.encode(idx, cnt)
    back_idx, back_cnt = DEFAULT.decode(encoded)
    np.testing.assert_array_equal(back_idx, idx)
    np.testing.assert_array_equal(back_cnt, cnt)
    # The package (like any HdrHistogram reader) decodes it into the same histogram as recording.
    ref = _package(DEFAULT)
    for v in values:
        ref.record_value(v * DEFAULT.value_scale)
    decoded = HdrHistogram.decode(encoded)
    assert decoded.get_total_count() == ref.get_total_count() == len(values)
    for p in (50.0, 90.0, 99.0, 99.9, 100.0):
        assert decoded.get_value_at_percentile(p) == ref.get_value_at_percentile(p)
    assert decoded.get_int_to_double_conversion_ratio() == 1 / DEFAULT.value_scale
    # Same counts array as the package's own recording (equals() would also compare the unit
    # ratio, which we set in the header and the package leaves at 1).
    np.testing.assert_array_equal(
        np.ctypeslib.as_array(decoded.counts), np.ctypeslib.as_array(ref.counts)
    )


def test_decode_refuses_another_layout() -> None:
    other = HdrLayout(1, 1_000_000, 3, 1000.0)
    encoded = other.encode(*other.histogram(np.array([1.0, 2.0]))[:2])
    with pytest.raises(ValueError, match="this layout"):
        DEFAULT.decode(encoded)
    with pytest.raises(ValueError, match="not an encoded HdrHistogram"):
        DEFAULT.decode("bm90IGEgaGlzdG9ncmFt")


def test_empty_histogram() -> None:
    idx, cnt, low, high, nan = DEFAULT.histogram(np.array([]))
    assert len(idx) == len(cnt) == low == high == nan == 0
    assert DEFAULT.decode(DEFAULT.encode(idx, cnt))[0].size == 0
    with pytest.raises(ValueError, match="empty histogram"):
        DEFAULT.quantile(idx, cnt, 0.5)


def test_quantile_of_unions_within_relative_error() -> None:
    """3 hosts x 10 one-minute windows, different shapes per host; any union of windows and
    hosts, merged by adding counts, gives quantiles within 1 % of the exact nearest-rank
    quantile of the raw samples."""
    rng = np.random.default_rng(5)
    raw: dict[tuple[int, int], np.ndarray] = {}
    for host, (mu, sigma) in enumerate([(2.0, 0.5), (3.5, 1.0), (1.0, 2.0)]):
        for window in range(10):
            raw[host, window] = rng.lognormal(mu + 0.05 * window, sigma, 5_000) + 0.1
    rows = {key: DEFAULT.histogram(v) for key, v in raw.items()}
    selections = [
        [(0, 0)],
        [(h, 3) for h in range(3)],
        [(1, w) for w in range(10)],
        list(raw),
        [(h, w) for h in (0, 2) for w in range(2, 7)],
    ]
    for keys in selections:
        samples = np.sort(np.concatenate([raw[k] for k in keys]))
        idx, cnt = merge(
            np.concatenate([rows[k].indices for k in keys]),
            np.concatenate([rows[k].counts for k in keys]),
        )
        for q in (0.0, 0.25, 0.5, 0.9, 0.99, 0.999, 1.0):
            rank = max(int(q * 100 * len(samples) / 100 + 0.5), 1)  # HdrHistogram's nearest rank
            exact = samples[rank - 1]
            got = DEFAULT.quantile(idx, cnt, q)
            assert abs(got - exact) <= DEFAULT.relative_error * exact, (keys, q, got, exact)


def test_invalid_layouts_name_the_problem() -> None:
    with pytest.raises(ValueError, match="significant_digits=6 is outside 1..5"):
        HdrLayout(1, 1000, 6, 1.0)
    with pytest.raises(ValueError, match="highest=3 must be >= 2 \\* lowest"):
        HdrLayout(2, 3, 2, 1.0)
    with pytest.raises(ValueError, match="bucket index -1"):
        DEFAULT.bucket_lower(-1)
