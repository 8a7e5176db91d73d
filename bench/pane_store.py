"""A hopping window's store commit alone: copied rows vs panes, same process, same PostgreSQL.

    .venv/bin/python bench/pane_store.py --series 5000 --size 10 --hop 1 --batches 30

Live feed without Spark: each micro-batch advances the watermark by one hop and brings one new
counter partial per series. The two ways a hopping window's counters reach the store:

- **copy** (the native lane before panes): Spark copied each partial into its size/hop windows,
  so each batch upserts every open window of every series (``size/hop`` rows per series) into
  ``window_pending``, and the store promotes the windows the watermark passed
  (``commit_batch`` with result rows);
- **panes**: each batch upserts one pane per series into ``window_panes``; the store makes the
  windows the watermark passed from their panes (``commit_batch(panes=...)``).

The two alternate batch by batch, each in its own (config, window), so the machine's load hits
both alike. Printed: median and p90 commit time per batch after ``--warmup`` batches, and with
``--statements`` the time per SQL statement of the pane path (cursor-side wall time).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg
import pyarrow as pa

from streamgauge.clock import ManualClock
from streamgauge.sinks.embedded import EmbeddedPostgres
from streamgauge.sinks.store import (
    PANE_SCHEMA,
    RESULT_SCHEMA,
    Finalization,
    PaneBatch,
    ResultStore,
    RetryPolicy,
)

T0 = 1_700_000_000_000
LATENESS_MS = 2_000
DELAY_MS = 1_000
LANE = ("c", "g", "s")


def result_rows(
    config: str, window: str, metrics: pa.Array, starts: list[int], size_ms: int,
    revision: int, watermark: int,
) -> pa.Table:  # fmt: skip
    """One counter row per (series, window start): what the copied rows' lane committed."""
    n_series = len(metrics)
    n = n_series * len(starts)
    start_col = pa.array([s for s in starts for _ in range(n_series)], pa.int64())
    ends = [s + size_ms for s in starts for _ in range(n_series)]
    columns: dict[str, Any] = {
        "config_name": pa.array([config] * n), "window_name": pa.array([window] * n),
        "metric": pa.concat_arrays([metrics] * len(starts)), "tags": pa.array(["{}"] * n),
        "metric_type": pa.array(["c"] * n), "window_start_ms": start_col,
        "window_end_ms": pa.array(ends, pa.int64()),
        "count": pa.array([1] * n, pa.int64()), "sum": pa.array([1.0] * n),
    }  # fmt: skip
    for name in ("min", "max", "last", "p50", "p90", "p99", "p999", "distinct_count"):
        columns[name] = pa.nulls(n, pa.float64())
    columns["sketch"] = pa.nulls(n, pa.binary())
    columns["hdr_histogram"] = pa.nulls(n, pa.string())
    columns["revision"] = pa.array([revision] * n, pa.int64())
    columns["is_final"] = pa.array([e + LATENESS_MS <= watermark for e in ends])
    columns["late_events"] = pa.array([0] * n, pa.int64())
    columns["emitted_at_ms"] = pa.array([T0] * n, pa.int64())
    return pa.table(columns).select(list(RESULT_SCHEMA.names))


def pane_rows(config: str, window: str, metrics: pa.Array, pane_ms: int, size_ms: int,
              hop_ms: int) -> pa.Table:  # fmt: skip
    n = len(metrics)
    return pa.table(
        {
            "config_name": pa.array([config] * n), "window_name": pa.array([window] * n),
            "metric": metrics, "tags": pa.array(["{}"] * n),
            "pane_ms": pa.array([pane_ms] * n, pa.int64()),
            "from_start_ms": pa.array([pane_ms - size_ms + hop_ms] * n, pa.int64()),
            "metric_type": pa.array(["c"] * n), "count": pa.array([1] * n, pa.int64()),
            "sum": pa.array([1.0] * n), "min": pa.nulls(n, pa.float64()),
            "max": pa.nulls(n, pa.float64()), "last": pa.nulls(n, pa.float64()),
            "last_event_ms": pa.array([pane_ms + 500] * n, pa.int64()),
            "sketch": pa.nulls(n, pa.binary()),
        },  # fmt: skip
        schema=PANE_SCHEMA,
    )


def windows_of_panes(assembled: pa.Table, revision: int, watermark: int) -> pa.Table:
    """``PaneBatch.to_results`` for counters (no sets here): the job's result columns."""
    n = assembled.num_rows
    values = assembled.drop_columns(["set_sketches"])
    ends = values.column("window_end_ms")
    extra: dict[str, Any] = {
        "config_name": pa.array(["bench"] * n), "window_name": pa.array(["panes"] * n),
        "revision": pa.array([revision] * n, pa.int64()),
        "is_final": pa.array([e + LATENESS_MS <= watermark for e in ends.to_pylist()]),
        "late_events": pa.array([0] * n, pa.int64()),
        "emitted_at_ms": pa.array([T0] * n, pa.int64()),
    }  # fmt: skip
    for name in ("p50", "p90", "p99", "p999", "distinct_count"):
        extra[name] = pa.nulls(n, pa.float64())
    extra["sketch"] = pa.nulls(n, pa.binary())
    extra["hdr_histogram"] = pa.nulls(n, pa.string())
    for name, column in extra.items():
        values = values.append_column(name, column)
    return values


class StatementTimer:
    """Wall time per SQL statement (its first words), summed over the batches it measures."""

    def __init__(self) -> None:
        self.totals: collections.Counter[str] = collections.Counter()
        self.enabled = False
        self._original = psycopg.Cursor.execute

    def install(self) -> None:
        timer = self

        def execute(cursor: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return timer._original(cursor, query, *args, **kwargs)
            finally:
                if timer.enabled:
                    text = query if isinstance(query, str) else repr(query)
                    label = " ".join(text.split()[:6])[:70]
                    timer.totals[label] += time.perf_counter() - started

        psycopg.Cursor.execute = execute  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=5000)
    parser.add_argument("--size", type=int, default=10, help="window size, seconds")
    parser.add_argument("--hop", type=int, default=1, help="hop, seconds")
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=12, help="batches left out of figures")
    parser.add_argument("--statements", action="store_true",
                        help="time each SQL statement of the pane path")  # fmt: skip
    args = parser.parse_args()
    size_ms, hop_ms = args.size * 1000, args.hop * 1000
    metrics = pa.array([f"m{i:06d}" for i in range(args.series)])
    timer = StatementTimer()
    if args.statements:
        timer.install()
    root = Path(tempfile.mkdtemp(prefix="pane-store-"))
    server = EmbeddedPostgres(root / "pg", sync_initdb=False)
    times: dict[str, list[float]] = {"copy": [], "panes": []}
    try:
        url = server.start()
        with ResultStore(url, clock=ManualClock(T0), retry=RetryPolicy(max_attempts=2)) as store:
            store.ensure_schema()
            for batch in range(args.batches):
                pane = T0 + batch * hop_ms
                watermark = pane - DELAY_MS
                revision = batch + 1
                fin = [Finalization("bench", "copy", watermark, LATENESS_MS, LANE)]
                starts = list(range(pane - size_ms + hop_ms, pane + 1, hop_ms))
                rows = result_rows("bench", "copy", metrics, starts, size_ms, revision, watermark)
                started = time.perf_counter()
                store.commit_batch(
                    "bench.copy", batch, rows, fin, revision=revision,
                    state={("bench", "watermark_ms:copy"): watermark},
                    hold_after={("bench", "copy"): watermark}, lane_types=LANE,
                )  # fmt: skip
                copied = time.perf_counter() - started
                panes = PaneBatch(
                    panes=pane_rows("bench", "panes", metrics, pane, size_ms, hop_ms),
                    size_ms=size_ms, hop_ms=hop_ms, allowed_lateness_ms=LATENESS_MS,
                    early_every_ms=None, config_name="bench", window_name="panes",
                    watermark_key="watermark_ms:panes", progress_ms=watermark,
                    to_results=lambda a, r=revision, w=watermark: windows_of_panes(a, r, w),
                )  # fmt: skip
                timer.enabled = batch >= args.warmup
                started = time.perf_counter()
                store.commit_batch(
                    "bench.panes", batch, RESULT_SCHEMA.empty_table(),
                    [Finalization("bench", "panes", watermark, LATENESS_MS, LANE)],
                    revision=revision, state={("bench", "watermark_ms:panes"): watermark},
                    hold_after={("bench", "panes"): watermark}, lane_types=LANE, panes=panes,
                )  # fmt: skip
                by_panes = time.perf_counter() - started
                timer.enabled = False
                if batch >= args.warmup:
                    times["copy"].append(copied)
                    times["panes"].append(by_panes)
            check = psycopg.connect(url).execute(
                "SELECT window_name, count(*), sum(count) FROM window_results"
                " WHERE window_end <= (SELECT max(window_end) FROM window_results"
                "  WHERE window_name = 'panes') GROUP BY 1 ORDER BY 1"
            ).fetchall()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
    k = size_ms // hop_ms
    print(f"store commit per batch, hopping {args.size} s / {args.hop} s (k = {k}), "
          f"{args.series} counter series, {len(times['copy'])} batches after "
          f"{args.warmup}")  # fmt: skip
    print(f"{'path':<8}{'median s':>10}{'p90 s':>9}")
    for path, values in times.items():
        p90 = statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]
        print(f"{path:<8}{statistics.median(values):>10.3f}{p90:>9.3f}")
    ratio = statistics.median(times["copy"]) / statistics.median(times["panes"])
    print(f"copy / panes: {ratio:.2f}x")
    print("published windows (window, rows, sum of counts):", check)
    if args.statements:
        measured = len(times["panes"])
        print("pane path, mean ms per batch by statement:")
        for label, total in timer.totals.most_common(12):
            print(f"  {1000 * total / measured:8.1f}  {label}")


if __name__ == "__main__":
    main()
