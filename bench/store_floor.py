"""PostgreSQL's own floor on this machine: the least it takes to make N window rows visible.

    .venv/bin/python bench/store_floor.py --series 100000 --rounds 12

Every window of a tumbling config closes at the same instant, so at N series the batch that
passes a window's end has N rows to make visible. Against the embedded PostgreSQL, with the
store's own schema, each round times (median over the rounds after the first two):

- **floor, schema as is**: one ``COPY`` of N window rows straight into a table made ``LIKE
  window_rows INCLUDING ALL`` (the table behind the ``window_results`` view: its primary key
  on the series' number and the window's bounds, and the ``window_end`` index), committed.
  The payload is built before the clock starts: no Python per row, only PostgreSQL's
  insert, index and WAL work;
- **floor, no primary key**: the same without the key the keep-the-highest-revision upsert
  needs; **floor, no index**: heap and WAL alone;
- **store: promoting batch**: ``ResultStore.commit_batch`` as the window job calls it when
  the watermark passes the end of N windows whose rows wait in ``window_pending`` (a batch
  before put them there); the batch brings a changed row for each, and its watermark also
  passes end + allowed lateness, so they go in final;
- **store: open-window batch**: a batch that only updates the N open windows' rows in
  ``window_pending``, which every live batch before the end pays;
- **store: closed rows direct**: ``commit_batch`` of N rows whose end the watermark has
  already passed, with no pending rows, through the general upsert;
- **store: closing, held windows (fresh)**: what the window job's held lane writes when the
  watermark passes the end of N windows it held (``commit_batch(fresh=...)``: a plain
  insert, the rows provisional); **store: finalizing them, next batch**: the batch after,
  whose watermark passes their end + allowed lateness (it only marks them final).

Compare with ``bench/spark_floor.py`` (Spark's own floor for N series): the two floors
together bound the freshness any window job writing through Spark into this store can reach
at N series on this machine.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pyarrow as pa

from streamgauge.clock import ManualClock
from streamgauge.sinks.embedded import EmbeddedPostgres
from streamgauge.sinks.store import Finalization, ResultStore

T0 = 1_700_000_000_000
SIZE_MS = 10_000
LATENESS_MS = 2_000
COLUMNS = (
    "config_name", "window_name", "series_id", "window_start", "window_end", "metric_type",
    "count", "sum", "revision", "is_final", "late_events", "emitted_at",
)  # fmt: skip
FLOOR_TABLES = {
    "floor, schema as is": "CREATE TABLE {t} (LIKE window_rows INCLUDING ALL)",
    "floor, no primary key": (
        "CREATE TABLE {t} (LIKE window_rows INCLUDING DEFAULTS INCLUDING CONSTRAINTS);"
        " CREATE INDEX ON {t} (window_end)"
    ),
    "floor, no index": "CREATE TABLE {t} (LIKE window_rows INCLUDING DEFAULTS)",
}


def copy_payload(series: int, start_ms: int) -> bytes:
    """N counter rows of one window (series numbered 1..N), in COPY's text format."""
    start = time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime(start_ms / 1000))
    end = time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime((start_ms + SIZE_MS) / 1000))
    return "".join(
        f"bench\tw\t{i + 1}\t{start}\t{end}\tc\t10\t10\t1\tt\t0\t{end}\n" for i in range(series)
    ).encode()


def result_rows(
    series: int, start_ms: int, count: int, revision: int, *, final: bool = False
) -> pa.Table:
    """N counter rows of window ``[start_ms, start_ms + size)`` as the window job emits
    (``final``: the batch's watermark passed its end + allowed lateness)."""
    n = series
    return pa.table(
        {
            "config_name": pa.array(["bench"] * n),
            "window_name": pa.array(["w"] * n),
            "metric": pa.array([f"bench.m{i}" for i in range(n)]),
            "tags": pa.array(["{}"] * n),
            "metric_type": pa.array(["c"] * n),
            "window_start_ms": pa.array([start_ms] * n, pa.int64()),
            "window_end_ms": pa.array([start_ms + SIZE_MS] * n, pa.int64()),
            "count": pa.array([count] * n, pa.int64()),
            "sum": pa.array([float(count)] * n),
            **{name: pa.nulls(n, pa.float64())
               for name in ("min", "max", "last", "p50", "p90", "p99", "distinct_count")},
            "revision": pa.array([revision] * n, pa.int64()),
            "is_final": pa.array([final] * n),
            "late_events": pa.array([0] * n, pa.int64()),
            "emitted_at_ms": pa.array([T0] * n, pa.int64()),
        }
    )


class StorePaths:
    """The three store paths, each in its own window name so they never meet."""

    def __init__(self, store: ResultStore, series: int) -> None:
        self.store, self.series = store, series
        self.batch = 0

    def _commit(
        self, window: str, rows: pa.Table, watermark_ms: int, *, fresh: bool = False
    ) -> float:
        self.batch += 1
        rows = rows.set_column(
            rows.schema.get_field_index("window_name"), "window_name",
            pa.array([window] * rows.num_rows),
        )  # fmt: skip
        fin = Finalization("bench", window, watermark_ms, LATENESS_MS)
        began = time.perf_counter()
        self.store.commit_batch(
            f"bench.{window}", self.batch, rows.slice(0, 0) if fresh else rows, [fin],
            revision=self.batch, hold_after={("bench", window): watermark_ms},
            fresh=rows if fresh else None,
        )  # fmt: skip
        return time.perf_counter() - began

    def promoting(self, start_ms: int) -> float:
        self._commit("promote", result_rows(self.series, start_ms, 1, self.batch + 1),
                     start_ms + SIZE_MS - 1)  # fmt: skip
        return self._commit(
            "promote", result_rows(self.series, start_ms, 2, self.batch + 1, final=True),
            start_ms + SIZE_MS + LATENESS_MS,
        )

    def open_windows(self, start_ms: int) -> float:
        self._commit("open", result_rows(self.series, start_ms, 1, self.batch + 1), start_ms)
        return self._commit(
            "open", result_rows(self.series, start_ms, 2, self.batch + 1), start_ms + 1
        )

    def closed_direct(self, start_ms: int) -> float:
        return self._commit(
            "direct", result_rows(self.series, start_ms, 2, self.batch + 1, final=True),
            start_ms + SIZE_MS + LATENESS_MS,
        )

    def closed_fresh(self, start_ms: int) -> float:
        """What a held lane's closing batch writes: windows no row holds yet, provisional."""
        return self._commit(
            "fresh", result_rows(self.series, start_ms, 2, self.batch + 1),
            start_ms + SIZE_MS, fresh=True,
        )

    def finalizing(self, start_ms: int) -> float:
        """The batch after it: no rows, the watermark passes the windows' end + lateness."""
        self._commit("final", result_rows(self.series, start_ms, 2, self.batch + 1),
                     start_ms + SIZE_MS, fresh=True)  # fmt: skip
        return self._commit(
            "final", result_rows(0, start_ms, 2, self.batch + 1), start_ms + SIZE_MS + LATENESS_MS
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()

    base = Path(tempfile.mkdtemp(prefix="store-floor-"))
    server = EmbeddedPostgres(base / "data", sync_initdb=False)
    url = server.start()
    try:
        store = ResultStore(url, clock=ManualClock(T0))
        store.ensure_schema()
        paths = StorePaths(store, args.series)
        with psycopg.connect(url, autocommit=True) as conn:
            for i, ddl in enumerate(FLOOR_TABLES.values()):
                conn.execute(ddl.format(t=f"floor_{i}"))
            timings: dict[str, list[float]] = {name: [] for name in FLOOR_TABLES}
            store_paths: dict[str, Callable[[int], float]] = {
                "store: promoting batch": paths.promoting,
                "store: open-window batch": paths.open_windows,
                "store: closed rows direct": paths.closed_direct,
                "store: closing, held windows (fresh)": paths.closed_fresh,
                "store: finalizing them, next batch": paths.finalizing,
            }
            timings.update({name: [] for name in store_paths})
            for round_ in range(args.rounds):
                start_ms = T0 + round_ * SIZE_MS
                payload = copy_payload(args.series, start_ms)
                for i, name in enumerate(FLOOR_TABLES):  # one after another, every round
                    timings[name].append(_timed_copy(conn, f"floor_{i}", payload))
                for name, path in store_paths.items():
                    timings[name].append(path(start_ms))
        store.close()
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)

    print(f"store floor: {args.series} window rows per batch, embedded PostgreSQL, "
          f"{args.rounds} rounds (first 2 left out)")  # fmt: skip
    print(f"{'':37} {'median':>8} {'min':>8} {'max':>8}")
    for name, seconds in timings.items():
        kept = seconds[2:] or seconds
        print(f"{name:37} {statistics.median(kept):7.3f}s {min(kept):7.3f}s {max(kept):7.3f}s")


def _timed_copy(conn: psycopg.Connection[tuple[object, ...]], table: str, payload: bytes) -> float:
    began = time.perf_counter()
    statement = f"COPY {table} ({', '.join(COLUMNS)}) FROM STDIN"
    with conn.transaction(), conn.cursor() as cur, cur.copy(statement) as copy:
        copy.write(payload)
    return time.perf_counter() - began


if __name__ == "__main__":
    main()
