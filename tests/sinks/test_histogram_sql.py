"""The SQL histogram helpers of migrations 4 and 12, on the real PostgreSQL: quantiles over any
range, from the ``window_histograms`` view of the windows' bucket arrays.

Windows' buckets are built with ``HdrLayout`` from seeded random values and written through
``ResultStore.commit_batch`` the way the window job writes them (``with_hdr_buckets``), for
several windows and hosts::

    window    [0,10) [10,20) [20,30) [30,40) [40,50) [50,60)   (seconds after T)
    host a    lognormal(3.0, 0.5), 400 samples per window
    host b    lognormal(3.5, 0.8), 250 samples per window
    host c    bimodal: 5 ms and 200 ms humps, 300 samples per window

Every quantile SQL computes over a union of those windows and hosts must equal
``HdrLayout.quantile`` of the same rows merged in Python (exactly: the same nearest-rank rule
and the same reported value), and lie within the layout's relative error of the exact quantile
of the raw samples.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa
import pytest
from hdrh.histogram import HdrHistogram

from streamgauge.sinks.store import HDR_COLUMNS, RESULT_SCHEMA, ResultStore, RetryPolicy, run_sql
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hdr_columns import HdrColumns
from streamgauge.windows.results import with_hdr_buckets

T = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
WINDOW_S = 10
WINDOWS = 6
HOSTS = ("a", "b", "c")
QUANTILES = (0.0, 0.001, 0.01, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999, 1.0)
LAYOUT = HdrLayout(lowest=1, highest=3_600_000_000, significant_digits=2, value_scale=1000.0)


def highest_equivalent(layout: HdrLayout, index: int) -> float:
    """The value HdrHistogram reports for bucket ``index`` (``bucket_upper`` is exclusive)."""
    end_scaled = round(layout.bucket_upper(index) * layout.value_scale)
    return (end_scaled - 1) / layout.value_scale


def samples(host: str, window: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    rng = np.random.default_rng([HOSTS.index(host), window, 20241122])
    if host == "a":
        return rng.lognormal(3.0, 0.5, 400)
    if host == "b":
        return rng.lognormal(3.5, 0.8, 250)
    return np.concatenate([rng.normal(5.0, 0.5, 150), rng.normal(200.0, 20.0, 150)])


def bucket_rows(host: str, window: int) -> list[tuple[Any, ...]]:
    """What ``window_histograms`` shows of a window: its key, bucket, bounds, count, revision."""
    hist = LAYOUT.histogram(samples(host, window))
    assert hist.clamped_low == hist.clamped_high == hist.nan == 0
    start = T + dt.timedelta(seconds=window * WINDOW_S)
    end = start + dt.timedelta(seconds=WINDOW_S)
    return [
        ("cfg", "per_10s", "api.latency", {"host": host}, start, end, int(i),
         LAYOUT.bucket_lower(int(i)), highest_equivalent(LAYOUT, int(i)), int(n), 1)
        for i, n in zip(hist.indices, hist.counts, strict=True)
    ]  # fmt: skip


def store_windows(
    url: str, config: str, windows: Sequence[tuple[str, int, Any]], layout: HdrLayout = LAYOUT,
    batch: int = 0,
) -> None:
    """Commit one window row per ``(host, window, values)``: the histogram of ``values`` in its
    HDR columns, as the window job writes them (``with_hdr_buckets``)."""
    rows, indices, counts = [], [], []
    for host, window, values in windows:
        hist = layout.histogram(values)
        start_ms = int((T + dt.timedelta(seconds=window * WINDOW_S)).timestamp() * 1000)
        row: dict[str, Any] = dict.fromkeys(set(RESULT_SCHEMA.names) - set(HDR_COLUMNS))
        row.update(
            config_name=config, window_name="per_10s", metric="api.latency",
            tags=json.dumps({"host": host}), metric_type="ms", window_start_ms=start_ms,
            window_end_ms=start_ms + WINDOW_S * 1000, count=len(values), revision=1,
            is_final=True, late_events=0, emitted_at_ms=start_ms,
        )  # fmt: skip
        rows.append(row)
        indices.append(hist.indices)
        counts.append(hist.counts)
    hdr = HdrColumns(np.cumsum([0, *map(len, indices)]), np.concatenate(indices),
                     np.concatenate(counts))  # fmt: skip
    table = pa.Table.from_pylist(rows)
    with ResultStore(url, retry=RetryPolicy(max_attempts=3)) as store:
        store.commit_batch(f"hist-sql.{config}", batch, with_hdr_buckets(table, hdr, layout),
                           [], revision=1)  # fmt: skip


@pytest.fixture(scope="module")
def histograms(postgres_url: str) -> Iterator[str]:
    with ResultStore(postgres_url, retry=RetryPolicy(max_attempts=3)) as store:
        store.ensure_schema()
    run_sql(postgres_url, "TRUNCATE window_rows, window_sketches, window_pending, sink_batches")
    windows = [(host, window, samples(host, window)) for host in HOSTS for window in range(WINDOWS)]
    store_windows(postgres_url, "cfg", windows)
    yield postgres_url
    run_sql(postgres_url, "TRUNCATE window_rows, window_sketches, window_pending, sink_batches")


def test_the_view_shows_each_window_bucket_as_the_bucket_table_held_it(histograms: str) -> None:
    """Every (window, bucket) row, with the bounds ``HdrLayout`` gives and the window row's
    revision: the rows the store wrote one per bucket before schema version 12."""
    _, rows = run_sql(
        histograms,
        "SELECT config_name, window_name, metric, tags, window_start, window_end, bucket,"
        " lower_bound, upper_bound, count, revision FROM window_histograms"
        " WHERE config_name = 'cfg' ORDER BY tags->>'host', window_start, bucket",
    )
    assert rows == [row for host in HOSTS for window in range(WINDOWS)
                    for row in bucket_rows(host, window)]  # fmt: skip


def test_a_windows_arrays_are_the_buckets_of_its_hdrhistogram_encoding(
    histograms: str,
) -> None:
    """The arrays hold what the stored V2 encoding decodes to (the window job writes both from
    one histogram): ascending non-empty bucket indices, their counts, and the layout's
    constants as the hdrhistogram package derives them."""
    values = samples("b", 2)
    hist = LAYOUT.histogram(values)
    store_windows(histograms, "cfg_encoded", [("b", 2, values)])
    encoded = LAYOUT.encode(hist.indices, hist.counts)
    run_sql(histograms, "UPDATE window_results SET hdr_histogram = %s"
            " WHERE config_name = 'cfg_encoded'", (encoded,))  # fmt: skip
    _, rows = run_sql(
        histograms,
        "SELECT hdr_histogram, hdr_buckets, hdr_counts, hdr_unit_magnitude,"
        " hdr_half_count_magnitude, hdr_value_scale FROM window_results"
        " WHERE config_name = 'cfg_encoded'",
    )
    run_sql(histograms, "DELETE FROM window_results WHERE config_name = 'cfg_encoded'")
    [(stored, buckets, counts, unit, half, scale)] = rows
    decoded = HdrHistogram.decode(stored)
    nonzero = [i for i in range(decoded.counts_len) if decoded.counts[i]]
    assert buckets == nonzero
    assert counts == [decoded.counts[i] for i in nonzero]
    assert (unit, half) == (decoded.unit_magnitude, decoded.sub_bucket_half_count_magnitude)
    assert scale == 1 / decoded.encoder.payload.payload.conversion_ratio_bits


def test_sql_bounds_equal_hdr_layout_bounds_for_every_index_of_several_layouts(
    histograms: str,
) -> None:
    for layout in (LAYOUT, HdrLayout(1, 10_000, 1, 1.0), HdrLayout(1000, 100_000_000, 2, 1.0),
                   HdrLayout(1, 2**40, 4, 1.0), HdrLayout(1, 3_600_000, 3, 0.01)):  # fmt: skip
        reference = HdrHistogram(layout.lowest, layout.highest, layout.significant_digits)
        constants = [reference.unit_magnitude, reference.sub_bucket_half_count_magnitude,
                     layout.value_scale]  # fmt: skip
        _, rows = run_sql(
            histograms,
            "SELECT array_agg(streamgauge_hdr_lower_bound(i, %s, %s, %s) ORDER BY i),"
            " array_agg(streamgauge_hdr_upper_bound(i, %s, %s, %s) ORDER BY i)"
            " FROM generate_series(0, %s) AS i",
            (*constants, *constants, layout.counts_len - 1),
        )
        [(lower, upper)] = rows
        expected_lower, expected_upper = layout.bounds(np.arange(layout.counts_len))
        assert lower == expected_lower.tolist()
        assert upper == expected_upper.tolist()


def sql_quantiles(url: str, hosts: Sequence[str], windows: range) -> list[float]:
    """One value over the range and hosts: the form a Grafana stat panel uses."""
    start = T + dt.timedelta(seconds=windows.start * WINDOW_S)
    end = T + dt.timedelta(seconds=windows.stop * WINDOW_S)
    _, rows = run_sql(
        url,
        "SELECT streamgauge_hdr_quantiles(streamgauge_histogram("
        "  (bucket, lower_bound, upper_bound, count)::streamgauge_hdr_bin), %s)"
        " FROM window_histograms"
        " WHERE config_name = 'cfg' AND window_name = 'per_10s' AND metric = 'api.latency'"
        "   AND tags->>'host' = ANY(%s) AND window_start >= %s AND window_end <= %s",
        (list(QUANTILES), list(hosts), start, end),
    )
    ((values,),) = rows
    assert isinstance(values, list)
    return [float(v) for v in values]


def python_quantiles(hosts: Sequence[str], windows: range) -> list[float]:
    rows = [r for h in hosts for w in windows for r in bucket_rows(h, w)]
    indices = [r[6] for r in rows]
    counts = [r[9] for r in rows]
    return [LAYOUT.quantile(indices, counts, q) for q in QUANTILES]


def exact_quantiles(hosts: Sequence[str], windows: range) -> list[float]:
    """Nearest rank round(q * n) (at least 1) of the sorted raw samples: the same rank rule."""
    values = np.sort(np.concatenate([samples(h, w) for h in hosts for w in windows]))
    n = len(values)
    return [float(values[max(int(q * 100.0 * n / 100 + 0.5), 1) - 1]) for q in QUANTILES]


CASES = [
    (("a",), range(0, 1)),  # one window of one host
    (("a",), range(0, WINDOWS)),  # one host over the whole range
    (("a", "b"), range(1, 4)),  # two hosts over three windows
    (HOSTS, range(0, WINDOWS)),  # everything
    (("b", "c"), range(2, 6)),
]


@pytest.mark.parametrize(("hosts", "windows"), CASES)
def test_sql_quantiles_equal_hdr_layout_of_the_merged_buckets(
    histograms: str, hosts: Sequence[str], windows: range
) -> None:
    assert sql_quantiles(histograms, hosts, windows) == python_quantiles(hosts, windows)


@pytest.mark.parametrize(("hosts", "windows"), CASES)
def test_sql_quantiles_are_within_the_relative_error_of_the_exact_ones(
    histograms: str, hosts: Sequence[str], windows: range
) -> None:
    got = sql_quantiles(histograms, hosts, windows)
    for q, value, exact in zip(QUANTILES, got, exact_quantiles(hosts, windows), strict=True):
        bound = max(exact * LAYOUT.relative_error, 1 / LAYOUT.value_scale)
        assert abs(value - exact) <= bound, (q, value, exact)


def test_a_p99_time_series_per_host_like_a_grafana_panel(histograms: str) -> None:
    # 20 s time buckets ($__timeGroup(window_start, 20s)), one series per host: merge the bucket
    # rows per (time bucket, host, bucket) first, then one histogram per (time bucket, host).
    _, rows = run_sql(
        histograms,
        "SELECT t, host, streamgauge_hdr_quantile(streamgauge_histogram("
        "  (bucket, lower_bound, upper_bound, n)::streamgauge_hdr_bin), 0.99)"
        " FROM (SELECT floor(extract(epoch from window_start)/20)*20 AS t,"
        "              tags->>'host' AS host, bucket, lower_bound, upper_bound,"
        "              sum(count)::bigint AS n"
        "       FROM window_histograms WHERE config_name = 'cfg'"
        "       GROUP BY 1, 2, 3, 4, 5) per_bucket"
        " GROUP BY 1, 2 ORDER BY 1, 2",
    )
    expected = []
    for first in range(0, WINDOWS, 2):
        for host in HOSTS:
            rows_py = [r for w in (first, first + 1) for r in bucket_rows(host, w)]
            p99 = LAYOUT.quantile([r[6] for r in rows_py], [r[9] for r in rows_py], 0.99)
            expected.append((T.timestamp() + first * WINDOW_S, host, p99))
    assert [(float(str(t)), h, v) for t, h, v in rows] == expected


def test_the_row_aggregate_equals_the_bin_aggregate(histograms: str) -> None:
    _, rows = run_sql(
        histograms,
        "SELECT streamgauge_histogram(h) = streamgauge_histogram("
        "  (bucket, lower_bound, upper_bound, count)::streamgauge_hdr_bin),"
        " streamgauge_hdr_quantile(streamgauge_histogram(h), 0.5)"
        ' FROM window_histograms h WHERE tags = \'{"host": "b"}\'',
    )
    assert rows == [(True, python_quantiles(("b",), range(WINDOWS))[QUANTILES.index(0.5)])]


def test_merged_histogram_adds_counts_per_bucket(histograms: str) -> None:
    _, rows = run_sql(
        histograms,
        "SELECT (b).bucket, (b).count FROM (SELECT unnest(streamgauge_histogram(h)) AS b"
        " FROM window_histograms h WHERE tags->>'host' IN ('a', 'c')) m",
    )
    merged = [r for h in ("a", "c") for w in range(WINDOWS) for r in bucket_rows(h, w)]
    indices, counts = np.unique([r[6] for r in merged], return_inverse=True)
    sums = np.bincount(counts, weights=[r[9] for r in merged]).astype(int)
    assert rows == list(zip(indices.tolist(), sums.tolist(), strict=True))  # sorted by bucket
    assert sum(int(str(n)) for _, n in rows) == WINDOWS * (400 + 300)


def test_empty_histogram_and_bad_quantiles(histograms: str) -> None:
    _, rows = run_sql(
        histograms,
        "SELECT streamgauge_hdr_quantile(streamgauge_histogram(h), 0.5),"
        " streamgauge_hdr_quantiles(streamgauge_histogram(h), '{0.5, 0.99}'),"
        " streamgauge_hdr_quantiles(streamgauge_histogram(h), '{}')"
        " FROM window_histograms h WHERE false",
    )
    assert rows == [(None, [None, None], [])]  # no rows: no value (no zero), like percentile_disc
    for q in ("1.5", "-0.1", "'NaN'", "NULL"):
        with pytest.raises(psycopg.errors.NumericValueOutOfRange, match="not between 0 and 1"):
            run_sql(
                histograms,
                f"SELECT streamgauge_hdr_quantile(streamgauge_histogram(h), {q}::float8)"
                " FROM window_histograms h",
            )


def test_hand_computed_nearest_rank() -> None:
    """The rank rule spelled out on four samples, no database: HdrLayout is the reference."""
    # buckets (value 1 ms = scaled 1000 -> its bucket) with counts 1, 2, 1 -> ranks 1 | 2 3 | 4
    indices = LAYOUT.bucket_indices([1.0, 2.0, 2.0, 3.0])
    assert LAYOUT.quantile(indices, [1, 1, 1, 1], 0.5) == highest_equivalent(
        LAYOUT, int(indices[1])
    )  # round(0.5 * 4) = 2: the second sample's bucket
    assert LAYOUT.quantile(indices, [1, 1, 1, 1], 0.0) == LAYOUT.bucket_lower(int(indices[0]))


def test_a_layout_change_inside_the_range_keeps_quantiles_within_the_coarser_error(
    histograms: str,
) -> None:
    """Windows 0-2 written with 2 significant digits, 3-5 with 3 (``quantile_error`` lowered):
    the same bucket index means other values in the two layouts, so merging on the index alone
    would read quantiles off the wrong values; merging on index and bounds keeps them apart."""
    fine = HdrLayout(lowest=1, highest=3_600_000_000, significant_digits=3, value_scale=1000.0)
    # 0.05 ms .. 10 s: both layouts' index ranges overlap widely
    values = [np.random.default_rng([window, 7]).lognormal(1.0, 2.0, 2000)
              for window in range(WINDOWS)]  # fmt: skip
    coarse = {int(i) for v in values[:3] for i in LAYOUT.histogram(v).indices}
    assert coarse & {int(i) for v in values[3:] for i in fine.histogram(v).indices}
    store_windows(histograms, "cfg_changed", [("x", w, values[w]) for w in range(3)])
    store_windows(histograms, "cfg_changed", [("x", w, values[w]) for w in range(3, WINDOWS)],
                  fine, batch=1)  # fmt: skip
    with psycopg.connect(histograms, autocommit=True) as conn:
        try:
            got = conn.execute(
                "SELECT streamgauge_hdr_quantiles(streamgauge_histogram(h), %s)"
                " FROM window_histograms h WHERE config_name = 'cfg_changed'",
                (list(QUANTILES),),
            ).fetchone()
        finally:
            conn.execute("DELETE FROM window_results WHERE config_name = 'cfg_changed'")
    assert got is not None
    ordered = np.sort(np.concatenate(values))
    n = len(ordered)
    for q, value in zip(QUANTILES, got[0], strict=True):
        exact = float(ordered[max(int(q * 100.0 * n / 100 + 0.5), 1) - 1])
        bound = max(exact * LAYOUT.relative_error, 1 / LAYOUT.value_scale)
        assert abs(value - exact) <= bound, (q, value, exact)


def test_quantiles_of_unmerged_bins_equal_those_of_the_merged_histogram(histograms: str) -> None:
    """The dashboards pass ``array_agg`` of raw rows (no merge step): same answers, any order."""
    _, rows = run_sql(
        histograms,
        "SELECT streamgauge_hdr_quantiles(array_agg("
        "  (bucket, lower_bound, upper_bound, count)::streamgauge_hdr_bin"
        "  ORDER BY random()), %s),"
        " streamgauge_hdr_quantiles(streamgauge_histogram(h), %s)"
        " FROM window_histograms h WHERE config_name = 'cfg'",
        (list(QUANTILES), list(QUANTILES)),
    )
    ((unmerged, merged),) = rows
    assert unmerged == merged == python_quantiles(HOSTS, range(WINDOWS))
