"""What a stateless window job pays Spark per micro-batch: the log's partials into the driver.

    .venv/bin/python bench/batch_transfer.py --series 100000 --seconds 12 --type ms

The window job's design keeps no Spark state: each micro-batch's partials are projected by
Spark (metric filter, event time capped at the heartbeat, tags re-keyed per ``group_by``) and
handed to the driver as Arrow (``DataFrame.toArrow``), where the open windows are held and
merged (``docs/architecture.md``). This bench writes ``--seconds`` one-second segments of
``--series`` partials each (what ingest writes at 1 s panes; timers carry a t-digest and HDR
buckets of 10 values) into a fresh spool, then drains it with ``availableNow``, one segment
per micro-batch, and prints per batch, as medians over the batches after the first two:

- ``raw``: ``batch.toArrow()`` of the source's rows, every column;
- ``projected``: the projection the job runs (``--group-by`` tags kept) and ``toArrow``.

Figures are seconds of driver wall time per batch, with the load average beside them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from window_job import moved_to_pane, type_batch  # noqa: E402

from streamgauge.ingest.log import Heartbeat, SegmentWriter  # noqa: E402
from streamgauge.windows.session import build_spark_session  # noqa: E402
from streamgauge.windows.source import register_source_for_query  # noqa: E402


def segments(series: int, seconds: int, metric_type: str) -> list[pa.RecordBatch]:
    """One pane batch per second (built ahead: building them is not what is measured)."""
    names = pa.array([f"bench.m{i}" for i in range(series)], pa.string())
    pane = type_batch(names, metric_type, np.random.default_rng(7))
    start = 1_700_000_000_000
    return [moved_to_pane(pane, start + s * 1000) for s in range(seconds)]


def projected(frame: DataFrame, group_by: tuple[str, ...]) -> DataFrame:
    tags = F.from_json(F.col("tags"), "map<string,string>")
    kept = F.to_json(F.map_filter(tags, lambda key, _v: key.isin(list(group_by))))
    event = F.least(F.col("pane_start_ms"), F.col("segment_heartbeat_ms"))
    return frame.select(
        "metric", "metric_type", kept.alias("tags") if group_by else F.col("tags"),
        event.alias("event_ms"), "count", "sum", "min", "max", "last", "last_event_ms",
        "sketch", "hdr_bucket", "hdr_count", "receiver", "segment_heartbeat_ms",
        "prior_heartbeat_ms",
    )  # fmt: skip


_SCALARS = ("metric", "metric_type", "tags", "pane_start_ms", "count", "sum", "min", "max",
            "last", "last_event_ms", "segment_heartbeat_ms", "prior_heartbeat_ms")
MODES: dict[str, Callable[[DataFrame, tuple[str, ...]], DataFrame]] = {
    "raw": lambda frame, _g: frame,
    "projected": projected,
    "scalars": lambda frame, _g: frame.select(*_SCALARS),
    "digest": lambda frame, _g: frame.select(*_SCALARS, "sketch"),
    "hdr": lambda frame, _g: frame.select(*_SCALARS, "hdr_bucket", "hdr_count"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--seconds", type=int, default=12)
    parser.add_argument("--type", default="ms", choices=("c", "ms", "s"))
    parser.add_argument("--group-by", default="host", help="comma-separated tag keys")
    parser.add_argument("--modes", default="raw,projected", help=f"of {', '.join(MODES)}")
    args = parser.parse_args()
    group_by = tuple(k for k in args.group_by.split(",") if k)
    root = Path(tempfile.mkdtemp(prefix="sg-transfer-"))
    try:
        t0 = time.perf_counter()
        panes = segments(args.series, args.seconds, args.type)
        print(f"{args.seconds} segments of {args.series} partials of type {args.type} "
              f"({time.perf_counter() - t0:.1f} s to build)")  # fmt: skip
        spark = build_spark_session("local[2]")
        modes = args.modes.split(",")
        timings: dict[str, list[float]] = {mode: [] for mode in modes}
        arrow_bytes: dict[str, list[int]] = {mode: [] for mode in modes}
        for mode in modes:
            name = f"transfer_{mode}"
            spool = root / f"spool_{mode}"
            writer = SegmentWriter(spool, "r0", fsync=False)
            source = register_source_for_query(spark, name)
            frame = spark.readStream.format(source).option("path", str(spool)).load()

            def each(batch: DataFrame, batch_id: int, mode: str = mode) -> None:
                began = time.perf_counter()
                table = MODES[mode](batch, group_by).toArrow()
                timings[mode].append(time.perf_counter() - began)
                arrow_bytes[mode].append(table.nbytes)

            query = (
                frame.writeStream.queryName(name)
                .option("checkpointLocation", str(root / f"cp_{mode}"))
                .foreachBatch(each)
                .trigger(processingTime="100 milliseconds")
                .start()
            )
            for batch in panes:  # one segment per micro-batch
                pane = int(batch.column("pane_start_ms")[0].as_py())
                writer.append(batch, Heartbeat(pane + 1000, False))
                query.processAllAvailable()
            query.stop()
        load = os.getloadavg()
        for mode, seconds in timings.items():
            measured = seconds[2:] or seconds
            megabytes = statistics.median(arrow_bytes[mode]) / 1e6
            print(f"{mode:>10}: toArrow per batch median {statistics.median(measured):.3f} s, "
                  f"max {max(measured):.3f} s over {len(measured)} batches "
                  f"({args.series} rows each, {megabytes:.1f} MB)")  # fmt: skip
        print(f"load average {load[0]:.2f} {load[1]:.2f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
