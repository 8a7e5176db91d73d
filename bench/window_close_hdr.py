"""A window close of N timer series with ~90 HDR buckets each: the store's cost, two versions.

    .venv/bin/python bench/window_close_hdr.py --series 20000 --rounds 5 \\
        --before /tmp/sg-h1-base --after .

What the pane writer does in the batch whose watermark passes the end of N timer windows: the
windows' rows are published for the first time (``commit_batch(fresh=...)``, with the
finalization and the watermark), each with its sketch, its HdrHistogram encoding and its HDR
buckets. Timed per round: **build**, turning the windows' CSR buckets into what the store takes
(``results.histogram_rows``: one row per window and bucket, or ``results.with_hdr_buckets``:
list columns of the window rows, two, or one packed from schema version 17), **commit**,
the ``commit_batch`` call, and **rows visible**, the part of it until the windows' rows
commit (from schema version 15 their sketches commit after them; before, the whole call).

Each version runs in its own process (``PYTHONPATH`` = its checkout) against an embedded
PostgreSQL of its own, started by its code (with its settings); the rounds alternate the
order of the two, and each round closes the next window, so both stores grow alike. A round
runs in a new process: from schema version 18 on, its series are numbered (and known to the
store's writer) before the clock starts, as in the job after its first close. Printed:
median and range per version over the rounds after the first, the load average before and
after, and what each server wrote to its WAL (a page's first change after a checkpoint
writes the whole page again: the full-page images).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import types
from pathlib import Path
from typing import Any

from versions import alternated, clusters, load_average, run_in

T0 = 1_700_000_000_000
SIZE_MS = 10_000
LATENESS_MS = 2_000
BUCKETS = 90


def _close_window(url: str, series: int, round_: int) -> dict[str, float]:
    """One round in this process's version: N timer windows closing, published fresh."""
    import numpy as np
    import pyarrow as pa

    from streamgauge.clock import ManualClock
    from streamgauge.sinks import store as store_module
    from streamgauge.sinks.store import Finalization, ResultStore
    from streamgauge.sketches.hdr import HdrLayout
    from streamgauge.sketches.hdr_columns import HdrColumns
    from streamgauge.windows import results

    rng = np.random.default_rng([series, round_])
    layout = HdrLayout(1, 3_600_000_000, 2, 1000.0)
    first = rng.integers(900, 1500, series)
    buckets = (first[:, None] + np.arange(BUCKETS)[None, :]).ravel().astype(np.int32)
    counts = rng.integers(1, 20, series * BUCKETS).astype(np.int64)
    hdr = HdrColumns(np.arange(series + 1, dtype=np.int64) * BUCKETS, buckets, counts)
    encoded = layout.encode(buckets[:BUCKETS], counts[:BUCKETS])
    # A t-digest image's size and entropy: 96 centroids of (mean, weight) doubles.
    centroids = np.sort(rng.lognormal(3, 1, 96))
    sketch = np.stack([centroids, rng.integers(1, 30, 96).astype(float)], 1).tobytes()
    start = T0 + round_ * SIZE_MS
    rows = pa.table({
        "config_name": pa.array(["bench"] * series), "window_name": pa.array(["w"] * series),
        "metric": pa.array([f"bench.t{i}" for i in range(series)]),
        "tags": pa.array(['{"host":"a"}'] * series), "metric_type": pa.array(["ms"] * series),
        "window_start_ms": pa.array([start] * series, pa.int64()),
        "window_end_ms": pa.array([start + SIZE_MS] * series, pa.int64()),
        "count": pa.array(np.asarray(counts.reshape(series, BUCKETS).sum(1), np.int64)),
        **{name: pa.array(rng.random(series) * 100)
           for name in ("sum", "min", "max", "p50", "p90", "p99", "p999")},
        "last": pa.nulls(series, pa.float64()), "distinct_count": pa.nulls(series, pa.float64()),
        "sketch": pa.array([sketch] * series, pa.binary()),
        "hdr_histogram": pa.array([encoded] * series, pa.string()),
        "revision": pa.array([round_ + 1] * series, pa.int64()),
        "is_final": pa.array([False] * series), "late_events": pa.array([0] * series, pa.int64()),
        "emitted_at_ms": pa.array([start + SIZE_MS] * series, pa.int64()),
    })  # fmt: skip
    watermark = start + SIZE_MS
    rows_committed: list[float] = []
    if hasattr(ResultStore, "_commit_fresh_sketches"):  # rows first, sketches after them
        write_sketches = ResultStore._commit_fresh_sketches

        # Any version's signature: each process runs its own checkout's ResultStore.
        def timed(self: Any, *args: Any, **kwargs: Any) -> None:
            rows_committed.append(time.perf_counter())
            write_sketches(self, *args, **kwargs)

        ResultStore._commit_fresh_sketches = timed  # type: ignore[method-assign]
    store = ResultStore(url, clock=ManualClock(watermark))
    store.ensure_schema()
    _number_series(url, store, rows)
    began = time.perf_counter()
    extra: dict[str, Any] = {}
    if hasattr(store_module, "HISTOGRAM_SCHEMA"):  # one row per window and bucket
        named = types.SimpleNamespace(name="bench")
        extra["histograms"] = results.histogram_rows(  # type: ignore[attr-defined]
            rows, hdr, named, types.SimpleNamespace(name="w"), revision=round_ + 1,
            layout=layout,
        )
    else:
        rows = results.with_hdr_buckets(rows, hdr, layout)
    built = time.perf_counter()
    store.commit_batch(
        "bench.w", round_, rows.slice(0, 0),
        [Finalization("bench", "w", watermark, LATENESS_MS)], revision=round_ + 1,
        state={("bench", "watermark_ms:w"): watermark}, lock_name="bench.w",
        hold_after={("bench", "w"): watermark}, fresh=rows, **extra,
    )  # fmt: skip
    done = time.perf_counter()
    store.close()
    visible = rows_committed[0] if rows_committed else done
    return {"build_s": built - began, "commit_s": done - built, "rows_s": visible - built}


def _number_series(url: str, store: Any, rows: Any) -> None:
    """From schema version 18 on: the series numbered and known to the store's writer, as
    after the job's first close (each round runs in a new process; a close numbers only the
    series it has not stored before)."""
    series_ids = getattr(store, "_series", None)
    if series_ids is None:
        return
    import psycopg

    with psycopg.connect(url) as conn, conn.transaction(), conn.cursor() as cur:
        series_ids.discard()
        series_ids.with_ids(cur, rows)
    series_ids.remember()


def _wal_written(url: str) -> tuple[int, int, int]:
    """The server's WAL records, full-page images and bytes since it started."""
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal").fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--series", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--before", type=Path, help="checkout of the version to compare with")
    parser.add_argument("--after", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--child", nargs=3, metavar=("URL", "SERIES", "ROUND"),
                        help=argparse.SUPPRESS)  # fmt: skip
    args = parser.parse_args()
    if args.child:
        url, series, round_ = args.child
        print(json.dumps(_close_window(url, int(series), int(round_))))
        return

    versions = {"after": args.after.resolve()}
    if args.before is not None:
        versions = {"before": args.before.resolve(), **versions}
    load_before = load_average()
    timings: dict[str, list[dict[str, float]]] = {name: [] for name in versions}
    with clusters(versions, "window-close-hdr-") as urls:
        for round_, name in alternated(list(versions), args.rounds):
            timings[name].append(run_in(versions[name], __file__, "--child", urls[name],
                                        str(args.series), str(round_)))  # fmt: skip
        wal = {name: _wal_written(url) for name, url in urls.items()}
    print(f"window close: {args.series} timer series x {BUCKETS} buckets, embedded PostgreSQL, "
          f"{args.rounds} alternated rounds (first left out); load average "
          f"{load_before} before, {load_average()} after")  # fmt: skip
    print(f"{'':8} {'build median':>13} {'rows visible':>13} {'commit median':>14} "
          f"{'commit min..max':>18}")  # fmt: skip
    for name, rounds in timings.items():
        kept = rounds[1:] or rounds
        build = statistics.median(r["build_s"] for r in kept)
        visible = statistics.median(r.get("rows_s", r["commit_s"]) for r in kept)
        commits = [r["commit_s"] for r in kept]
        print(f"{name:8} {build:12.3f}s {visible:12.3f}s {statistics.median(commits):13.3f}s "
              f"{min(commits):8.3f}..{max(commits):.3f}s")  # fmt: skip
    for name, (records, full_pages, written) in wal.items():
        print(f"{name:8} WAL over the run: {records:,} records, {full_pages:,} full-page images, "
              f"{written / 2**20:,.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
