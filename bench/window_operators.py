"""Sliding and session windows' operators alone: milliseconds per call, as Spark calls them.

    .venv/bin/python bench/window_operators.py --series 200 --panes 40 --per-call 4

Both kinds run one ``applyInPandasWithState`` function per series per micro-batch, in a Python
worker; on a live job most of a batch's time is those calls (Spark's ``state.allUpdates``).
This feeds the functions the input Spark would (counter partials, one per series per 1 s pane,
``--per-call`` panes per micro-batch), with the state carried between calls and the watermark
trailing the newest pane by the job's horizon, without Spark around them. Sliding: 10 s windows;
session: gap 3 s, each series sending 5 of every 10 panes, so sessions close and are evicted.

Run it against another checkout to compare code (the machine's load moves both alike only if
the runs alternate)::

    git worktree add /tmp/base <rev> && cd /tmp/base
    PYTHONPATH=/tmp/base /work/main/.venv/bin/python /work/main/bench/window_operators.py

Printed per kind: calls, median and mean ms per call over ``--repeat`` runs, output rows.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd
from hopping_operator import State

from streamgauge.configs import parse_config
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.windows import session_windows, sliding_windows

T0 = 1_700_000_000_000
WINDOWS = {
    "sliding": "{name: w, kind: sliding, size: 10s, watermark_delay: 1s, allowed_lateness: 2s}",
    "session": "{name: w, kind: session, gap: 3s, key: user, watermark_delay: 1s, "
    "allowed_lateness: 2s}",
}


def partials(series: int, first_pane: int, panes: int, kind: str) -> dict[int, pd.DataFrame]:
    """One micro-batch's input per series: its counter partials of ``panes`` panes from
    ``first_pane`` (sessions: only the panes in the series' 5 active seconds of every 10)."""
    frames = {}
    for i in range(series):
        offsets = np.arange(first_pane, first_pane + panes)
        if kind == "session":
            offsets = offsets[(offsets + i) % 10 < 5]
        if not len(offsets):
            continue
        t = T0 + offsets * 1000
        frames[i] = pd.DataFrame({
            "metric": f"m{i}", "tags": "{}", "metric_type": "c", "event_ms": t,
            "event_ts": pd.to_datetime(t, unit="ms", utc=True), "count": 1,
            "sum": np.arange(len(t), dtype=np.float64) + i, "min": np.nan, "max": np.nan,
            "last": np.nan, "last_event_ms": t + 500, "first_recv_ms": t + 500,
            "last_recv_ms": t + 500, "receiver": "r0", "pane_start_ms": t,
            "segment_heartbeat_ms": t + 1000, "prior_heartbeat_ms": t, "sketch": None,
            "hdr_bucket": None, "hdr_count": None,
        })  # fmt: skip
    return frames


def operator(kind: str) -> tuple[Callable[..., Iterator[pd.DataFrame]], int]:
    """The state function of a ``kind`` window, and its watermark horizon (ms)."""
    window = parse_config(f"name: b\npane: 1s\nwindows: [{WINDOWS[kind]}]\n", "b").windows[0]
    params = compile_accuracy()
    if kind == "sliding":
        return (
            sliding_windows.sliding_state_function(window, 1000, params),
            sliding_windows.sliding_horizon_ms(window, 1000),
        )
    return (
        session_windows.session_state_function(window, params),
        session_windows.session_horizon_ms(window),
    )


def run(kind: str, series: int, panes: int, per_call: int) -> tuple[list[float], int]:
    """Seconds per call, and rows emitted, feeding ``panes`` panes in calls of ``per_call``."""
    function, horizon = operator(kind)
    states = [State() for _ in range(series)]
    seconds: list[float] = []
    emitted = 0
    for first in range(0, panes, per_call):
        frames = partials(series, first, per_call, kind)  # not timed: Spark's work
        for i, state in enumerate(states):
            state.watermark = T0 + first * 1000 - horizon
            frame = frames.get(i)
            if frame is None and not state.exists:
                continue
            batch: Any = [] if frame is None else [frame]
            state.hasTimedOut = frame is None
            started = time.perf_counter()
            for out in function((f"m{i}", "{}"), iter(batch), state):
                emitted += len(out)
            seconds.append(time.perf_counter() - started)
    return seconds, emitted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--series", type=int, default=200)
    parser.add_argument("--panes", type=int, default=40)
    parser.add_argument("--per-call", type=int, default=4, help="panes per micro-batch")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--kinds", default="sliding,session")
    args = parser.parse_args()
    print(f"{'kind':<9}{'calls':>7}{'ms/call median':>16}{'ms/call mean':>14}{'rows out':>10}")
    for kind in args.kinds.split(","):
        medians, means = [], []
        for _ in range(args.repeat):
            seconds, emitted = run(kind, args.series, args.panes, args.per_call)
            medians.append(statistics.median(seconds) * 1000)
            means.append(statistics.fmean(seconds) * 1000)
        print(f"{kind:<9}{len(seconds):>7}{statistics.median(medians):>16.3f}"
              f"{statistics.median(means):>14.3f}{emitted:>10}")  # fmt: skip


if __name__ == "__main__":
    main()
