"""The dashboards' and alerts' SQL over an hour of timer windows: two versions of the store.

    .venv/bin/python bench/panel_reads.py --before /tmp/sg-before
    .venv/bin/python bench/panel_reads.py --type s --members 20 --before /tmp/sg-before

An hour of 10 s windows of 10 timer metrics x 10 hosts (36,000 windows, ~90 HDR buckets, a
t-digest image and an HdrHistogram encoding each) is written through each version's own
``ResultStore.commit_batch`` into its own database of one embedded PostgreSQL, analysed, and
each generated query (``streamgauge.grafana.queries``, the macros expanded as Grafana does:
``tests/grafana/grafana_macros.py``) runs ``--repeat`` times over the last hour with 1 m
buckets, alternating the versions. Printed: the median time per query and version, and the
load average. Each version runs in its own process (``PYTHONPATH`` = its checkout).

``--type s``: set windows instead, each a DataSketches HLL image (lgK 12) of ``--members``
members (20: SET mode; 5000: HLL mode), drawn from a pool of 200 images; the queries are the
distinct count per bucket and over the range (the union of the windows' registers in SQL).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from versions import alternated, databases, load_average, run_in

HERE = Path(__file__).resolve().parent
T0 = 1_700_000_000_000
SIZE_MS = 10_000
WINDOWS = 360
METRICS = 10
HOSTS = 10
BUCKETS = 90
CONFIG = """
name: bench
pane: 1s
windows:
  - {name: w, kind: tumbling, size: 10s, metrics: ["api.*"], group_by: [host]}
"""


def _write(url: str, metric_type: str, members: int) -> None:
    """An hour of timer (or set) windows, published through this version's store."""
    import numpy as np
    import pyarrow as pa

    from streamgauge.clock import ManualClock
    from streamgauge.sinks.store import ResultStore
    from streamgauge.sketches.hdr import HdrLayout
    from streamgauge.sketches.hdr_columns import HdrColumns
    from streamgauge.windows import results

    layout = HdrLayout(1, 3_600_000_000, 2, 1000.0)
    store = ResultStore(url, clock=ManualClock(T0))
    store.ensure_schema()
    series = METRICS * HOSTS
    metrics = [f"api.m{i // HOSTS}" for i in range(series)]
    tags = [json.dumps({"host": f"h{i % HOSTS}"}) for i in range(series)]
    images, counts_of = _set_images(members) if metric_type == "s" else ([], [])
    for w in range(WINDOWS):
        rng = np.random.default_rng(w)
        first = rng.integers(900, 1500, series)
        buckets = (first[:, None] + np.arange(BUCKETS)[None, :]).ravel().astype(np.int32)
        counts = rng.integers(1, 20, series * BUCKETS).astype(np.int64)
        hdr = HdrColumns(np.arange(series + 1, dtype=np.int64) * BUCKETS, buckets, counts)
        encoded = layout.encode(buckets[:BUCKETS], counts[:BUCKETS])
        centroids = np.sort(rng.lognormal(3, 1, 96))
        sketch = np.stack([centroids, rng.integers(1, 30, 96).astype(float)], 1).tobytes()
        start = T0 + w * SIZE_MS
        columns = {
            "config_name": pa.array(["bench"] * series), "window_name": pa.array(["w"] * series),
            "metric": pa.array(metrics), "tags": pa.array(tags),
            "metric_type": pa.array(["ms"] * series),
            "window_start_ms": pa.array([start] * series, pa.int64()),
            "window_end_ms": pa.array([start + SIZE_MS] * series, pa.int64()),
            "count": pa.array(np.asarray(counts.reshape(series, BUCKETS).sum(1), np.int64)),
            **{name: pa.array(rng.random(series) * 100)
               for name in ("sum", "min", "max", "p50", "p90", "p99", "p999")},
            "last": pa.nulls(series, pa.float64()),
            "distinct_count": pa.nulls(series, pa.float64()),
            "sketch": pa.array([sketch] * series, pa.binary()),
            "hdr_histogram": pa.array([encoded] * series, pa.string()),
            "revision": pa.array([w + 1] * series, pa.int64()),
            "is_final": pa.array([True] * series),
            "late_events": pa.array([0] * series, pa.int64()),
            "emitted_at_ms": pa.array([start + SIZE_MS] * series, pa.int64()),
        }  # fmt: skip
        if metric_type == "s":  # the same columns, a set's values (keys keep their places)
            picked = rng.integers(0, len(images), series)
            columns |= {
                "metric_type": pa.array(["s"] * series),
                **{name: pa.nulls(series, pa.float64()) for name in ("p50", "p90", "p99", "p999")},
                "distinct_count": pa.array([counts_of[i] for i in picked], pa.float64()),
                "sketch": pa.array([images[i] for i in picked], pa.binary()),
                "hdr_histogram": pa.nulls(series, pa.string()),
            }
            hdr = HdrColumns.empty(series)
        rows = results.with_hdr_buckets(pa.table(columns), hdr, layout)
        store.commit_batch("bench.w", w, rows.slice(0, 0), [], revision=w + 1, fresh=rows)
    store.close()


def _set_images(members: int) -> tuple[list[bytes], list[float]]:
    """200 HLL images (lgK 12) of ``members`` members each, from overlapping ranges, and
    their distinct counts."""
    import numpy as np

    from streamgauge.sketches.hll import build_hll, serialize_hll
    from streamgauge.windows.window_sketches import distinct_count

    rng = np.random.default_rng(0)
    images = [serialize_hll(build_hll(range(first, first + members), 12))
              for first in rng.integers(0, 50 * members, 200).tolist()]  # fmt: skip
    return images, [float(distinct_count(image) or 0) for image in images]


def _queries(metric_type: str) -> dict[str, str]:
    """The generated SQL of the panels and an alert that read the windows."""
    sys.path.insert(0, str(HERE.parent))
    from streamgauge.configs.loader import parse_config
    from streamgauge.grafana import queries
    from tests.grafana.grafana_macros import expand

    config = parse_config(CONFIG, "bench")
    end = dt.datetime.fromtimestamp((T0 + WINDOWS * SIZE_MS) / 1000, dt.UTC)
    texts = {
        "distinct per bucket": queries.aggregate_sql(config, "distinct_count", provisional=False),
        "distinct over the range": queries.stat_distinct_sql(config),
    } if metric_type == "s" else {
        "percentiles per tag group": queries.histogram_percentiles_sql(config, provisional=False),
        "percentiles over the range": queries.histogram_range_percentiles_sql(config),
        "heatmap": queries.heatmap_sql(config),
        "p99 per window": queries.aggregate_sql(config, "p99", provisional=False),
        "samples stat": queries.stat_samples_sql(config),
    }
    variables = {"metric": "api.m3", "host": "All", "window": "w", "config": "bench"}
    return {
        name: expand(text, time_from=end - dt.timedelta(hours=1), time_to=end,
                     interval_ms=60_000, variables=variables)
        for name, text in texts.items()
    }  # fmt: skip


def _time(url: str, repeat: int, metric_type: str) -> dict[str, float]:
    import psycopg

    timings = {}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("ANALYZE")
        for name, text in _queries(metric_type).items():
            conn.execute(text).fetchall()  # warm the cache
            runs = []
            for _ in range(repeat):
                began = time.perf_counter()
                conn.execute(text).fetchall()
                runs.append(time.perf_counter() - began)
            timings[name] = statistics.median(runs)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--before", type=Path, help="checkout of the version to compare with")
    parser.add_argument("--after", type=Path, default=HERE.parent)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--type", choices=("ms", "s"), default="ms")
    parser.add_argument("--members", type=int, default=20, help="members per set (--type s)")
    parser.add_argument("--child", nargs=2, metavar=("WHAT", "URL"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        what, url = args.child
        if what == "write":
            _write(url, args.type, args.members)
            print("null")  # what run_in reads
        else:
            print(json.dumps(_time(url, args.repeat, args.type)))
        return

    versions = {"after": args.after.resolve()}
    if args.before is not None:
        versions = {"before": args.before.resolve(), **versions}
    load_before = load_average()
    results: dict[str, list[dict[str, float]]] = {name: [] for name in versions}
    with databases(list(versions), "panel-reads-") as urls:

        def child(name: str, what: str) -> Any:
            return run_in(versions[name], __file__, "--repeat", str(args.repeat), "--type",
                          args.type, "--members", str(args.members), "--child", what,
                          urls[name])  # fmt: skip

        for name in versions:
            child(name, "write")
        for _, name in alternated(list(versions), 2):
            results[name].append(child(name, "time"))
    what = (f"set metrics x {HOSTS} hosts ({WINDOWS * METRICS * HOSTS:,} windows, "
            f"{args.members} members each)" if args.type == "s" else
            f"timer metrics x {HOSTS} hosts ({WINDOWS * METRICS * HOSTS:,} windows, {BUCKETS} "
            "buckets each)")  # fmt: skip
    print(f"panel and alert SQL over an hour of 10 s windows, {METRICS} {what}, 1 m buckets, "
          f"median of {args.repeat} runs x 2 alternated rounds; load average "
          f"{load_before} before, {load_average()} after")  # fmt: skip
    names = list(next(iter(results.values()))[0])
    print(f"{'query':<28}" + "".join(f"{v:>10}" for v in versions))
    for query in names:
        cells = [statistics.median(r[query] for r in results[v]) for v in versions]
        print(f"{query:<28}" + "".join(f"{c:9.3f}s" for c in cells))


if __name__ == "__main__":
    main()
