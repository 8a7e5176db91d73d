"""The window job's work per micro-batch in the driver, without Spark or the store: two
versions of the code alternated.

    .venv/bin/python bench/window_step.py --series 100000 --types ms --before /tmp/sg-base
    .venv/bin/python bench/window_step.py --series 100000 --types c:40,ms:40,g:10,s:10 \\
        --kind hopping --hop 5s --before /tmp/sg-base

One segment a second, holding a pane partial per series (``window_job.type_batch``: timers
carry a t-digest and HDR buckets of 10 values), read back from a spool and stepped through a
window's logic object (``pane_writer.window_logic``) with the watermark one pane behind, for
``--batches`` seconds; the first 10 are left out (numba's cache, the first windows). Timed per
batch: **read** (``batch_log.read_partials``), **step** (``logic.step``: placing the partials
in their panes, merging, the windows to publish), **rows** (the result rows with their HDR
buckets), **encode** (the sketches' serialised forms, made once the rows are stored:
``Windows.encodings``; a version that encodes within the step shows 0) and **to rows**
(read + step + rows: what a closing batch's rows wait for before the store). Printed per
version: the medians of batches that publish nothing ("plain") and of those that close
windows ("closing"), and the load average before and after.
``--before CHECKOUT``: another checkout's code (``git worktree add /tmp/sg-base REV``).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from versions import THIS_CHECKOUT, alternated, load_average, run_in

T0 = 1_700_000_000_000
LEFT_OUT = 10


def _steps(series: int, types: str, kind: str, size: str, hop: str, batches: int
           ) -> dict[str, list[list[float]]]:  # fmt: skip
    """In this process's version: per batch (read, step, rows) seconds, plain and closing."""
    import numpy as np
    import pyarrow as pa
    from window_job import moved_to_pane, parse_types, type_batch

    from streamgauge.configs.loader import load_config
    from streamgauge.ingest.log import Heartbeat, SegmentWriter
    from streamgauge.sketches.hdr import HdrLayout
    from streamgauge.windows.batch_log import read_partials
    try:
        from streamgauge.windows.plan import sketch_params
    except ImportError:  # a checkout from before the plan (--before)
        from streamgauge.windows.checkpoints import sketch_params  # type: ignore[no-redef]
    from streamgauge.windows.pane_writer import window_logic
    from streamgauge.windows.results import to_result_rows, with_hdr_buckets

    rng = np.random.default_rng(7)
    panes = pa.Table.from_batches([
        type_batch(pa.array([f"bench.{t}{i}" for i in range(n)], pa.string()), t, rng)
        for t, n in parse_types(types, series).items() if n
    ]).combine_chunks().to_batches()[0]  # fmt: skip
    scratch = Path(tempfile.mkdtemp(prefix="window-step-"))
    hopping = f", hop: {hop}" if kind == "hopping" else ""
    (scratch / "bench.yaml").write_text(
        f"name: bench\npane: 1s\nwindows:\n  - {{name: w, kind: {kind}, size: {size}{hopping}, "
        "watermark_delay: 1s, allowed_lateness: 2s, metrics: [\"bench.*\"]}\n")  # fmt: skip
    config = load_config(scratch / "bench.yaml")
    window = config.windows[0]
    params = sketch_params(config)
    layout = HdrLayout.from_params(params)
    logic = window_logic(window, params, config.pane_ms)
    writer = SegmentWriter(scratch / "spool", "r0", fsync=False)
    try:
        timed: dict[str, list[list[float]]] = {"plain": [], "closing": []}
        start: dict[str, Any] = {}
        for second in range(batches):
            pane = T0 + second * 1000
            info = writer.append(moved_to_pane(panes, pane), Heartbeat(pane + 1000, False))
            end = {"r0": {"seq": info.sequence, "heartbeat_ms": pane + 1000, "closed": False}}
            began = time.perf_counter()
            partials = read_partials(scratch / "spool", start, end)
            read = time.perf_counter()
            step = logic.step(partials, pane)
            stepped = time.perf_counter()
            values = getattr(step.publish, "values", None)  # None: encoded within the step
            rows = to_result_rows(step.publish.table if values is None else values, config,
                                  window, revision=second + 1, watermark_ms=pane,
                                  emitted_at_ms=pane)  # fmt: skip
            with_hdr_buckets(rows, step.publish.hdr, layout)
            done = time.perf_counter()
            if values is not None:
                step.publish.encodings  # noqa: B018 (made when first asked for)
            encoded = time.perf_counter()
            start = end
            if second >= LEFT_OUT:
                which = "closing" if step.publish.num_rows else "plain"
                timed[which].append([read - began, stepped - read, done - stepped, encoded - done])
    finally:  # about a gigabyte of segments per run at 100k series
        shutil.rmtree(scratch, ignore_errors=True)
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--series", type=int, default=100_000)
    parser.add_argument("--types", default="ms", help="ms, or a mix: c:40,ms:40,g:10,s:10")
    parser.add_argument("--kind", choices=("tumbling", "hopping", "sliding", "session"),
                        default="tumbling")  # fmt: skip
    parser.add_argument("--size", default="10s")
    parser.add_argument("--hop", default="5s")
    parser.add_argument("--batches", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", type=Path, help="checkout of the version to compare with")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_steps(args.series, args.types, args.kind, args.size, args.hop,
                                args.batches)))  # fmt: skip
        return
    versions = {"this code": THIS_CHECKOUT}
    if args.before is not None:
        versions = {"before": args.before.resolve(), **versions}
    load_before = load_average()
    timed: dict[str, dict[str, list[list[float]]]] = {
        name: {"plain": [], "closing": []} for name in versions}  # fmt: skip
    for _, name in alternated(list(versions), args.rounds):
        out = run_in(versions[name], __file__, "--child", "--series", str(args.series),
                     "--types", args.types, "--kind", args.kind, "--size", args.size,
                     "--hop", args.hop, "--batches", str(args.batches))  # fmt: skip
        for which in ("plain", "closing"):
            timed[name][which] += out[which]
    print(f"window step: {args.kind} {args.size}"
          f"{f' by {args.hop}' if args.kind == 'hopping' else ''}, {args.series} series of "
          f"{args.types}, 1 s panes, {args.batches} batches ({LEFT_OUT} left out) x "
          f"{args.rounds} alternated rounds; load average {load_before} before, "
          f"{load_average()} after")  # fmt: skip
    print(f"{'':10} {'batches':>12} {'read':>8} {'step':>8} {'rows':>8} {'encode':>8}"
          f" {'to rows':>8}  (medians, s)")  # fmt: skip
    for name, kinds in timed.items():
        for which, batches in kinds.items():
            if not batches:
                continue
            medians = [statistics.median(b[i] for b in batches) for i in range(4)]
            medians.append(statistics.median(sum(b[:3]) for b in batches))
            print(f"{name:10} {which:>8} {len(batches):3d} "
                  + " ".join(f"{m:8.3f}" for m in medians))


if __name__ == "__main__":
    main()
