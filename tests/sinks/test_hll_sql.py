"""Distinct counts over any range in SQL (migration 5), on the real PostgreSQL.

Each trial is one set metric (``users.<n>.<trial>``) with n distinct members spread over 60
ten-second windows and two hosts, half of them seen twice (in another window, or on the other
host), so windows and hosts overlap::

    window    [0,10) [10,20) ... [590,600)   (seconds after T)
    host a    S      S           S           one DataSketches HLL (lgK 12) per window and host,
    host b    S      S           S           written through ResultStore.commit_batch

The distinct count of the whole range is ``streamgauge_hll_distinct(hll_registers)`` over the
metric's 120 rows: it must equal Ertl's estimate computed in Python on the union of the same
registers, and be within DataSketches' 2-sigma union bound for lgK 12 (3.183 %) of n in 95 % of
trials (the binomial allowance below: the bound is a 2-sigma one, so about one trial in twenty
is expected outside it).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import cast

import numpy as np
import psycopg
import pyarrow as pa
import pytest
from datasketches import hll_sketch, tgt_hll_type

from streamgauge.clock import ManualClock
from streamgauge.sinks.store import ResultStore, RetryPolicy, run_sql
from streamgauge.sketches.hll import build_hll, serialize_hll
from streamgauge.sketches.hll_registers import estimate_registers, hll_registers

T0 = 1_704_067_200_000  # 2024-01-01T00:00:00Z
WINDOW_MS = 10_000
WINDOWS = 60
HOSTS = ("a", "b")
BOUND = 0.03183  # DataSketches' 2-sigma relative error of a union at lgK 12
# n -> trials, and the misses allowed: P(more misses | 5 % per trial) < 0.5 %.
TRIALS = {100: (40, 6), 10_000: (40, 6), 1_000_000: (8, 3)}


def window_sketches(n: int, trial: int) -> list[bytes]:
    """The 120 serialized sketches of one trial, in (host, window) order."""
    rng = np.random.default_rng([n, trial, 20250105])
    members = (trial << 40) + n * 1_000 + np.arange(n, dtype=np.int64)
    first = rng.integers(0, WINDOWS * len(HOSTS), n)
    again = rng.random(n) < 0.5
    second = rng.integers(0, WINDOWS * len(HOSTS), int(again.sum()))
    cells = np.concatenate([first, second])
    seen = np.concatenate([members, members[again]])
    order = np.argsort(cells, kind="stable")
    bounds = np.cumsum(np.bincount(cells, minlength=WINDOWS * len(HOSTS)))[:-1]
    return [serialize_hll(build_hll(part)) for part in np.split(seen[order], bounds)]


def result_rows(metric: str, sketches: list[bytes], revision: int) -> pa.Table:
    rows = len(sketches)
    cells = [(host, w) for host in HOSTS for w in range(WINDOWS)][:rows]
    return pa.table(
        {
            "config_name": ["web"] * rows,
            "window_name": ["10s"] * rows,
            "metric": [metric] * rows,
            "tags": [json.dumps({"host": host}) for host, _ in cells],
            "metric_type": ["s"] * rows,
            "window_start_ms": [T0 + w * WINDOW_MS for _, w in cells],
            "window_end_ms": [T0 + (w + 1) * WINDOW_MS for _, w in cells],
            "count": [1] * rows,
            "sum": pa.nulls(rows, pa.float64()),
            "min": pa.nulls(rows, pa.float64()),
            "max": pa.nulls(rows, pa.float64()),
            "last": pa.nulls(rows, pa.float64()),
            "p50": pa.nulls(rows, pa.float64()),
            "p90": pa.nulls(rows, pa.float64()),
            "p99": pa.nulls(rows, pa.float64()),
            "distinct_count": [1.0] * rows,
            "sketch": pa.array(sketches, pa.binary()),
            "revision": [revision] * rows,
            "is_final": [True] * rows,
            "late_events": [0] * rows,
            "emitted_at_ms": [T0 + 3_600_000] * rows,
        }
    )


@pytest.fixture(scope="module")
def schema_url(postgres_url: str) -> str:
    with ResultStore(postgres_url, retry=RetryPolicy(max_attempts=3)) as store:
        store.ensure_schema()
    return postgres_url


@pytest.fixture(scope="module")
def trials(schema_url: str) -> Iterator[dict[tuple[int, int], float]]:
    """Writes every trial through the store; maps (n, trial) to the Python union estimate."""
    run_sql(schema_url, "TRUNCATE window_rows, window_sketches, window_pending, sink_batches")
    expected: dict[tuple[int, int], float] = {}
    with ResultStore(schema_url, clock=ManualClock(T0), retry=RetryPolicy(max_attempts=3)) as store:
        batch = 0
        for n, (count, _) in TRIALS.items():
            for trial in range(count):
                sketches = window_sketches(n, trial)
                union = np.max([hll_registers(s) for s in sketches], axis=0)
                expected[(n, trial)] = estimate_registers(union)
                batch += 1
                store.commit_batch("hll", batch, result_rows(f"users.{n}.{trial}", sketches, 1),
                                   [], revision=1)  # fmt: skip
    yield expected
    run_sql(schema_url, "TRUNCATE window_rows, window_sketches, sink_batches")


DISTINCT_OVER_RANGE = """
SELECT metric, streamgauge_hll_distinct(hll_registers) AS users
FROM window_results
WHERE metric LIKE 'users.%%' AND metric_type = 's'
  AND window_start >= %s AND window_end <= %s
GROUP BY metric
"""


def test_sql_distinct_over_windows_and_hosts_is_within_the_bound(
    trials: dict[tuple[int, int], float], postgres_url: str
) -> None:
    start = time.perf_counter()
    _, rows = run_sql(postgres_url, DISTINCT_OVER_RANGE, ("2024-01-01", "2024-01-01 00:10"))
    elapsed = time.perf_counter() - start
    got = {(int(str(m).split(".")[1]), int(str(m).split(".")[2])): cast(float, v)
           for m, v in rows}  # fmt: skip
    assert got.keys() == trials.keys()
    for key, estimate in got.items():
        assert estimate == pytest.approx(trials[key], rel=1e-12), key  # SQL == Python
    for n, (count, allowed) in TRIALS.items():
        errors = np.array([got[(n, t)] / n - 1 for t in range(count)])
        misses = int(np.sum(np.abs(errors) > BOUND))
        assert misses <= allowed, (n, errors)
        assert abs(errors.mean()) < 0.01, n  # no bias
        if n == 100:  # few members: linear counting, off only by shared registers
            assert np.max(np.abs(errors)) <= 0.03, errors
    # 88 ranges of 120 windows each; a dashboard panel reads one.
    assert elapsed / len(rows) < 0.5, elapsed


def test_union_then_estimate_equals_the_one_step_aggregate(
    trials: dict[tuple[int, int], float], postgres_url: str
) -> None:
    _, rows = run_sql(
        postgres_url,
        "SELECT streamgauge_hll_estimate(streamgauge_hll_union(hll_registers)),"
        " streamgauge_hll_distinct(hll_registers), length(streamgauge_hll_union(hll_registers))"
        " FROM window_results WHERE metric = 'users.10000.0'",
    )
    [(two_steps, one_step, length)] = rows
    assert two_steps == one_step == pytest.approx(trials[(10_000, 0)], rel=1e-12)
    assert length == 4096


def test_mixed_lgk_unions_at_the_coarser_lgk(schema_url: str) -> None:
    fine = build_hll(range(5_000), lg_k=12)
    coarse = build_hll(range(2_500, 7_500), lg_k=10)
    _, rows = run_sql(
        schema_url,
        "SELECT streamgauge_hll_union(r) FROM (VALUES (%s::bytea), (%s::bytea), (NULL)) v(r)",
        (hll_registers(serialize_hll(fine)).tobytes(),
         hll_registers(serialize_hll(coarse)).tobytes()),  # fmt: skip
    )
    reference = build_hll(range(7_500), lg_k=10)
    np.testing.assert_array_equal(
        np.frombuffer(cast(bytes, rows[0][0]), np.uint8), hll_registers(serialize_hll(reference))
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("decode(repeat('00', 4095), 'hex')", "4095 bytes"),
        ("decode(repeat('00', 8), 'hex')", "8 bytes"),
        ("decode(repeat('40', 4096), 'hex')", "above 63"),
    ],
)
def test_what_is_not_a_register_array_is_refused(
    schema_url: str, value: str, message: str
) -> None:
    for sql in (f"SELECT streamgauge_hll_union(r) FROM (VALUES ({value})) v(r)",
                f"SELECT streamgauge_hll_estimate({value})"):  # fmt: skip
        with pytest.raises(Exception, match=message):
            run_sql(schema_url, sql)


def test_empty_registers_count_zero_and_null_stays_null(schema_url: str) -> None:
    _, rows = run_sql(
        schema_url,
        "SELECT streamgauge_hll_estimate(decode(repeat('00', 16), 'hex')),"
        " streamgauge_hll_estimate(NULL), (SELECT streamgauge_hll_distinct(r)"
        " FROM (VALUES (NULL::bytea)) v(r))",
    )
    assert rows == [(0.0, None, None)]


def test_set_rows_show_their_registers_on_every_path(schema_url: str) -> None:
    """After commit_batch (emitted and pending windows, then promoted) and publish_corrections
    (``streamgauge replay``), window_results shows every set row's ``hll_registers`` (derived
    from its image: nothing stored beside an HLL_8 image); rows without a set sketch get
    NULL."""
    run_sql(schema_url, "TRUNCATE window_rows, window_sketches, window_pending, sink_batches")
    small, big = serialize_hll(build_hll(range(5))), serialize_hll(build_hll(range(3_000)))
    rows = result_rows("users", [small, big], 1)  # host a, windows 0 and 1
    timer = rows.slice(0, 1).set_column(4, "metric_type", pa.array(["ms"]))
    timer = timer.set_column(2, "metric", pa.array(["api.latency"]))
    no_sketch = rows.slice(0, 1).set_column(2, "metric", pa.array(["empty"]))
    no_sketch = no_sketch.set_column(16, "sketch", pa.nulls(1, pa.binary()))
    with ResultStore(schema_url, clock=ManualClock(T0), retry=RetryPolicy(max_attempts=3)) as store:
        # Watermark between the two windows: window 1 is held in window_pending.
        store.commit_batch("q", 0, pa.concat_tables([rows, timer, no_sketch]), [], revision=1,
                           hold_after={("web", "10s"): T0 + WINDOW_MS})  # fmt: skip
        pending = run_sql(schema_url, "SELECT sketch, hll_registers FROM window_pending")[1]
        assert [(bytes(cast(bytes, s)), r) for s, r in pending] == [(big, None)]
        store.commit_batch("q", 1, pa.table({}), [], revision=2,
                           hold_after={("web", "10s"): T0 + 2 * WINDOW_MS})  # fmt: skip
        bigger = serialize_hll(build_hll(range(4_000)))
        corrected = result_rows("users", [small, bigger], 1).slice(1, 1)
        corrected = corrected.set_column(15, "distinct_count", pa.array([4_000.0]))
        store.publish_corrections(corrected, "q")  # a changed value: a correction
    _, stored = run_sql(
        schema_url,
        "SELECT metric, window_start = %s::timestamptz, hll_registers, revision"
        " FROM window_results ORDER BY metric, window_start",
        ("2024-01-01",),
    )
    assert [(m, first, r, rev) for m, first, r, rev in stored] == [
        ("api.latency", True, None, 1),
        ("empty", True, None, 1),
        ("users", True, hll_registers(small).tobytes(), 1),
        ("users", False, hll_registers(bigger).tobytes(), 3),  # promoted at 2, corrected
    ]


def test_a_batch_of_every_image_form_shows_each_image_s_registers(schema_url: str) -> None:
    """Set rows of every form DataSketches writes (empty; LIST, SET and HLL mode; HLL_4, HLL_6
    and HLL_8, compact and updatable; two lgK), committed in one batch: each row shows the
    registers ``hll_registers`` reads from its own image, derived in SQL from the image or,
    for HLL_4 / HLL_6 in HLL mode, stored (the store decodes those together, one call per
    lgK)."""
    run_sql(schema_url, "TRUNCATE window_rows, window_sketches, window_pending, sink_batches")
    images = []
    for lg_k in (10, 12):
        for distinct in (0, 3, 100, 5_000):
            for target in (tgt_hll_type.HLL_4, tgt_hll_type.HLL_6, tgt_hll_type.HLL_8):
                sketch = hll_sketch(lg_k, target)
                for value in range(distinct):
                    sketch.update(value + lg_k * 1_000_000)
                images += [bytes(sketch.serialize_compact()), bytes(sketch.serialize_updatable())]
    with ResultStore(schema_url, retry=RetryPolicy(max_attempts=3)) as store:
        store.commit_batch("forms", 0, result_rows("forms", images, 1), [], revision=1)
    _, stored = run_sql(
        schema_url,
        "SELECT hll_registers FROM window_results WHERE metric = 'forms'"
        " ORDER BY tags ->> 'host', window_start",
    )
    assert [bytes(cast(bytes, r)) for (r,) in stored] == [
        hll_registers(image).tobytes() for image in images
    ]
    packed = [image for image in images if image[7] & 3 == 2 and (image[7] >> 2) & 3 != 2]
    _, kept = run_sql(schema_url, "SELECT count(hll_registers) FROM window_sketches")
    assert kept == [(len(packed),)] and packed


def test_registers_of_something_not_an_image_are_refused(schema_url: str) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="not a DataSketches HLL"):
        run_sql(schema_url, "SELECT streamgauge_hll_image_registers('\\x0001020304'::bytea)")


def test_an_unreadable_set_sketch_is_refused_before_any_io(schema_url: str) -> None:
    bad = result_rows("users", [b"not a sketch"], 1)
    with ResultStore(schema_url, retry=RetryPolicy(max_attempts=1)) as store, pytest.raises(
        ValueError, match="row 0: the set's sketch is unreadable"
    ):
        store.commit_batch("q", 99, bad, [], revision=1)
