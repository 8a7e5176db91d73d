"""Spark's own floor on this machine: the least a windowed streaming aggregation costs.

    .venv/bin/python bench/spark_floor.py --series 100000 --seconds 150 --warmup 75

No streamgauge code on the data path: Spark's built-in ``rate`` source makes ``--series`` rows
per second in the JVM (row ``v`` is series ``v % series``, its event time the source's
timestamp), Spark's own ``window()`` + ``sum`` + ``count`` aggregate them in tumbling 10 s
windows with a zero watermark delay, and ``foreachBatch`` takes each batch's rows to the
driver as Arrow and drops them. Same session settings as the window job (``local[2]``, one
state partition per core, the raw local file system for the checkpoint).

Printed, with the first ``--warmup`` seconds left out: micro-batch duration (median, p99),
rows per second taken against offered, and *freshness*: from a window's end (wall time, since
the rate source stamps rows with it) to the batch that hands the closed window to the driver
returning. That is the least any window job built on Spark micro-batches can reach here with
that many series: the window job adds its own source, sketches and the store to it.

``--output append`` (default) hands a window over once, when Spark's watermark passes it;
``--output update`` hands over every window a batch changes (what the window job does, so it
can publish provisional rows before the end and corrections after it), and freshness is then
measured to the first batch that runs after the window's end and returns.
"""

from __future__ import annotations

import argparse
import itertools
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from streamgauge.windows.session import build_spark_session  # noqa: E402

WINDOW_MS = 10_000


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--seconds", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=75)
    parser.add_argument("--output", choices=("append", "update"), default="append")
    parser.add_argument(
        "--arrival",
        choices=("spread", "segments"),
        default="spread",
        help="spread: rows spread evenly over each second (the rate source); segments: all "
        "series' rows at once, one segment per second, as receivers flush panes "
        "(rate-micro-batch, a 1 s processing-time trigger)",
    )
    args = parser.parse_args()

    spark = build_spark_session("local[2]", app_name="bench.spark_floor")
    checkpoint = Path(tempfile.mkdtemp(prefix="spark-floor-"))
    started_ms = time.time_ns() // 1_000_000
    measured_from_ms = started_ms + args.warmup * 1000
    batches: list[tuple[int, float, int]] = []  # (start ms, seconds, rows)
    closed_at: dict[int, int] = {}  # window end ms -> ms from its end to it on the driver
    lock = threading.Lock()

    def take(batch: DataFrame, batch_id: int) -> None:
        begun = time.time_ns() // 1_000_000
        table = batch.toArrow()
        ended = time.time_ns() // 1_000_000
        ends = set(table.column("end_ms").to_pylist()) if table.num_rows else set()
        with lock:
            batches.append((begun, (ended - begun) / 1000, table.num_rows))
            if args.arrival == "segments":
                # Batch k carries pane k, whatever the wall clock: a window is complete on the
                # driver when the last batch that changes it returns, measured from that
                # batch's trigger (Spark aligns processing-time triggers to the second).
                if begun >= measured_from_ms:
                    for end in ends:
                        closed_at[end] = ended - (begun // 1000) * 1000
                return
            for end in ends:
                if end <= begun or args.output == "append":
                    closed_at.setdefault(end, ended - end)
            if args.output == "update":
                # A window is closed once a batch that began after its end returns, even
                # if that batch changed nothing in it.
                newest = (begun // WINDOW_MS) * WINDOW_MS
                closed_at.setdefault(newest, ended - newest)

    if args.arrival == "spread":
        source = (
            spark.readStream.format("rate")
            .option("rowsPerSecond", args.series)
            .option("numPartitions", 2)
            .load()
        )
    else:
        source = (
            spark.readStream.format("rate-micro-batch")
            .option("rowsPerBatch", args.series)
            .option("numPartitions", 2)
            .option("startTimestamp", started_ms)
            .option("advanceMillisPerBatch", 1000)
            .load()
        )
    rows = (
        source
        .withWatermark("timestamp", "0 seconds")
        .groupBy(F.window("timestamp", "10 seconds"), (F.col("value") % args.series).alias("key"))
        .agg(F.sum("value").alias("total"), F.count("*").alias("rows"))
        .select(
            "key",
            "total",
            "rows",
            F.unix_millis(F.col("window.end")).alias("end_ms"),
        )
    )
    writer = (
        rows.writeStream.outputMode(args.output)
        .option("checkpointLocation", str(checkpoint))
        .foreachBatch(take)
    )
    if args.arrival == "segments":
        writer = writer.trigger(processingTime="1 second")
    query = writer.start()
    try:
        query.awaitTermination(args.seconds)
        # Stop between batches: a stop that interrupts one overflows the stack of Spark 4.3's
        # stream thread in a regex (printed, harmless, but noise on the bench's output).
        deadline = time.monotonic() + 10
        while query.status["isTriggerActive"] and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        query.stop()
        spark.stop()
        shutil.rmtree(checkpoint, ignore_errors=True)

    measured = [b for b in batches if b[0] >= measured_from_ms]
    durations = [seconds for _, seconds, _ in measured]
    freshness = [
        waited / 1000
        for end, waited in closed_at.items()
        if end % WINDOW_MS == 0
        and (end >= measured_from_ms or args.arrival == "segments")
    ]
    print(
        f"spark floor: {args.series} series, tumbling 10 s, output {args.output}, "
        f"arrival {args.arrival}, local[2]"
    )
    if len(measured) < 2 or not freshness:
        print("  too few batches after the warm-up to measure")
        return
    wall = (measured[-1][0] - measured[0][0]) / 1000
    taken = sum(rows for _, _, rows in measured[:-1])
    print(f"  batches measured: {len(measured)}")
    print(
        f"  driver-side batch (toArrow) median {statistics.median(durations):.2f} s, "
        f"p99 {percentile(durations, 0.99):.2f} s"
    )
    print(f"  batch interval median {statistics.median(_intervals(measured)):.2f} s")
    print(f"  window rows handed over per second of wall time: {taken / wall:,.0f}")
    print(
        f"  freshness (window end -> closed window on the driver) p50 "
        f"{statistics.median(freshness):.2f} s, p99 {percentile(freshness, 0.99):.2f} s "
        f"over {len(freshness)} windows"
    )


def _intervals(batches: list[tuple[int, float, int]]) -> list[float]:
    starts = [start for start, _, _ in batches]
    return [(later - earlier) / 1000 for earlier, later in itertools.pairwise(starts)]


if __name__ == "__main__":
    main()
