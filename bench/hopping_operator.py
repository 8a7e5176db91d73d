"""Hopping windows' sketch lane, operator only: copied rows vs. pane merge, same process.

    .venv/bin/python bench/hopping_operator.py --series 50 --panes 40

The two ``applyInPandasWithState`` functions a hopping window's timers can go through, called
as Spark calls them (one call per series per micro-batch, state carried between calls), on the
same timer partials (t-digest + HDR buckets of 10 lognormal values per partial, one partial per
series per 1 s pane), without Spark around them:

- **copy** (``sketch_windows.sketch_state_function``, the lane before pane merge): each partial
  arrives as size/hop rows, one per window (``assign_windows``' explode);
- **panes** (``hopping_windows.hopping_state_function``): each partial arrives once with its
  pane and first on-time window (``job.hopping_partials``).

Two feeds: *live* (one micro-batch per pane, as a running job sees them) and *catch-up* (every
pane in one micro-batch, as after a restart). The runs alternate copy/panes per size/hop ratio
so the machine's load hits both alike. What it leaves out: Spark's own cost of the copies
(explode, shuffle, Arrow transfer of size/hop rows per partial), which only adds to copy's side.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import pandas as pd

from streamgauge.configs import parse_config
from streamgauge.ingest.pane_sketches import PaneSketches
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.windows import hopping_windows, sketch_windows

T0 = 1_700_000_000_000


class State:
    """What the operators use of Spark's ``GroupState``; the watermark trails the newest pane
    by the job's horizon (delay 1 s + lateness 2 s + size), so windows are evicted as in Spark."""

    def __init__(self) -> None:
        self.value: tuple[Any, ...] | None = None
        self.hasTimedOut = False
        self.watermark = 0

    @property
    def exists(self) -> bool:
        return self.value is not None

    @property
    def get(self) -> tuple[Any, ...]:
        assert self.value is not None
        return self.value

    def update(self, value: tuple[Any, ...]) -> None:
        self.value = value

    def remove(self) -> None:
        self.value = None

    def getCurrentWatermarkMs(self) -> int:  # noqa: N802 (Spark's name)
        return self.watermark

    def setTimeoutTimestamp(self, ms: int) -> None:  # noqa: N802
        pass


def partials(series: int, panes: int) -> list[pd.DataFrame]:
    """Per pane, one timer partial per series (``SEGMENT_SCHEMA``'s columns the lanes read)."""
    rng = np.random.default_rng(7)
    params = compile_accuracy()
    out = []
    for pane in range(panes):
        start = T0 + pane * 1000
        sketches = PaneSketches(params)
        keys = [((f"m{i}", "ms", "{}"), start) for i in range(series)]
        values = rng.lognormal(3.0, 0.8, (series, 10)).round(3)
        for key, row in zip(keys, values, strict=True):
            sketches.add_values(key, row)
        digest, buckets, counts, _ = sketches.columns(keys)
        out.append(pd.DataFrame({
            "metric": [f"m{i}" for i in range(series)], "tags": "{}", "metric_type": "ms",
            "event_ms": start, "count": 10, "sum": values.sum(axis=1),
            "min": values.min(axis=1), "max": values.max(axis=1), "last": values[:, -1],
            "last_event_ms": start + 500, "sketch": digest.to_pylist(),
            "hdr_bucket": buckets.to_pylist(), "hdr_count": counts.to_pylist(),
        }))  # fmt: skip
    return out


def copied(frame: pd.DataFrame, size: int, hop: int) -> pd.DataFrame:
    """``assign_windows``: each partial once per window holding it."""
    latest = frame["event_ms"] - (frame["event_ms"] % hop)
    parts = []
    for back in range(0, size, hop):
        start = latest - back
        parts.append(frame.assign(window_start_ms=start, window_end_ms=start + size))
    return pd.concat(parts, ignore_index=True)[list(sketch_windows.INPUT_COLUMNS)]


def paned(frame: pd.DataFrame, size: int, hop: int) -> pd.DataFrame:
    """``hopping_partials``: each partial once, with its pane (all on time here)."""
    pane = frame["event_ms"] - (frame["event_ms"] % hop)
    return frame.assign(pane_ms=pane, from_start_ms=pane - size + hop)[
        list(hopping_windows.INPUT_COLUMNS)
    ]


def run(kind: str, batches: list[pd.DataFrame], size: int, hop: int) -> tuple[float, int]:
    """Seconds to feed ``batches`` through one operator; rows it emitted."""
    window = parse_config(
        f"name: b\npane: 1s\nwindows: [{{name: h, kind: hopping, size: {size}ms, hop: {hop}ms, "
        "watermark_delay: 1s, allowed_lateness: 2s}]\n",
        "b",
    ).windows[0]
    params = compile_accuracy()
    if kind == "copy":
        function = sketch_windows.sketch_state_function(params)
        shape = copied
    else:
        function = hopping_windows.hopping_state_function(window, params)
        shape = paned
    inputs = [shape(frame, size, hop) for frame in batches]  # not timed: Spark's work
    states: dict[str, State] = {}
    emitted = 0
    started = time.perf_counter()
    for batch, frame in zip(batches, inputs, strict=True):
        newest = int(batch["event_ms"].max())
        for metric, rows in frame.groupby("metric", sort=True):
            state = states.setdefault(str(metric), State())
            state.watermark = newest - (1000 + 2000 + size)
            for out in function((str(metric), "{}"), iter([rows]), state):
                emitted += len(out)
    return time.perf_counter() - started, emitted


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--series", type=int, default=50)
    parser.add_argument("--panes", type=int, default=40)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shapes", default="10000/5000,10000/1000,60000/1000",
                        help="size/hop pairs in ms")  # fmt: skip
    args = parser.parse_args()
    frames = partials(args.series, args.panes)
    n = args.series * args.panes
    print(f"{args.series} timer series x {args.panes} panes = {n} partials, "
          f"medians of {args.repeat} alternating runs (ms per partial)")  # fmt: skip
    print(f"{'size/hop':<14}{'feed':<10}{'copy':>10}{'panes':>10}{'copy/panes':>12}{'rows':>8}")
    for shape in args.shapes.split(","):
        size, hop = (int(part) for part in shape.split("/"))
        for feed, batches in (("live", frames), ("catch-up", [pd.concat(frames)])):
            times: dict[str, list[float]] = {"copy": [], "panes": []}
            rows: dict[str, int] = {}
            for _ in range(args.repeat):
                for kind in ("copy", "panes"):
                    seconds, rows[kind] = run(kind, batches, size, hop)
                    times[kind].append(seconds)
            copy, panes = (statistics.median(times[k]) * 1000 / n for k in ("copy", "panes"))
            assert rows["copy"] == rows["panes"], rows  # the same windows emitted
            print(f"{f'{size // 1000}s/{hop // 1000}s':<14}{feed:<10}{copy:>10.2f}{panes:>10.2f}"
                  f"{copy / panes:>11.1f}x{rows['copy']:>8}")  # fmt: skip


if __name__ == "__main__":
    main()
