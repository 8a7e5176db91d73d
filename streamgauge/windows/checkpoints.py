"""Where the window job's streaming queries keep their checkpoints, without Spark.

The window job (``job.py``), retention and the receivers' ``segment_lag_ms`` all need the
checkpoint directories of the *running* config's queries: retention deletes only what every
one of them committed, and the lag is the age of the oldest segment not committed by all of
them. A checkpoint left under ``checkpoints/`` by an older config (a window renamed, resized,
or a changed sketch layout) stops moving for good and must not count for either. The
receivers run in their own processes, where importing pyspark would cost ~1.7 s and ~70 MB
per process: hence this module, which ``job.py`` re-exports.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from streamgauge.configs import PipelineConfig, WindowSpec
from streamgauge.sketches.accuracy import SketchParams, compile_accuracy

LANE_LAYOUT = 3
"""Bumped when a lane's state layout changes (2: sets' HLL in the native aggregation, timers
in the sketch lane; 3: late rows in the sketch lane's query), so a checkpoint of an older
layout is not resumed (see checkpoint_dir)."""


@dataclass(frozen=True)
class JobPaths:
    spool: Path | str  # a directory, or a pyarrow.fs URI (streamgauge.ingest.spool_fs)
    checkpoints: Path


def checkpoint_dir(paths: JobPaths, config: PipelineConfig, window: WindowSpec) -> Path:
    """Checkpoint per (config, window definition).

    Spark's state layout is tied to the query's shape; a changed size or lateness under the
    same name gets a fresh checkpoint (and rebuilds from the retained log) instead of a
    start-up failure on incompatible state.
    """
    shape: list[object] = [
        config.pane_ms, window.kind, window.size_ms, window.offset_ms, window.watermark_delay_ms,
        window.allowed_lateness_ms, list(window.metrics), list(window.group_by),
    ]  # fmt: skip
    if window.kind == "session":  # appended only here: other kinds keep their checkpoints
        shape += [window.gap_ms, window.key]
    elif window.kind != "sliding":
        shape += [LANE_LAYOUT]
        if window.uses_kll:  # appended only here: tdigest windows keep their checkpoints
            shape += ["kll", sketch_params(config).kll_k]
        elif window.kind == "hopping" and window.hop_ms:
            # Counters, gauges and sets by panes (job.hopping_pane_aggregates): another state.
            shape += ["panes"]
        elif sets_query(window):
            # Counters and gauges without an HLL per group, sets in a query of their own:
            # another state here; the sketch lane's and the sets' checkpoints are named
            # after this one.
            shape += ["sets query"]
        elif splits_sets(window):
            # Counters and gauges without an HLL per group, sets in the sketch lane: other
            # states in both lanes (the sketch lane's checkpoint is named after this one).
            shape += ["sets apart"]
        if adds_in_driver(window):
            # No state at all in the native lane: the held windows add the batches' sums.
            shape += ["sums added on the driver"]
    fingerprint = json.dumps(shape)
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:10]
    return paths.checkpoints / config.name / f"{window.name}-{digest}"


def all_checkpoints(paths: JobPaths, config: PipelineConfig) -> list[Path]:
    """Every checkpoint the running queries of ``config`` use (window and late queries)."""
    found = []
    for window in config.windows:
        checkpoint = checkpoint_dir(paths, config, window)
        found.append(checkpoint)
        if window.kind in ("session", "sliding"):
            found.append(checkpoint.with_name(checkpoint.name + ".late"))
        elif window.uses_kll:  # one query: late rows ride in it (kll_lane_with_late_rows)
            continue
        else:  # late rows ride in the sketch lane (sketch_lane_with_late_rows)
            found.append(sketch_checkpoint(checkpoint, sketch_params(config), window))
            if sets_query(window):
                found.append(sets_checkpoint(checkpoint))
    return found


def splits_sets(window: WindowSpec) -> bool:
    """Whether ``window``'s sets merge in its sketch lane rather than its native lane
    (``sets: with_timers``; ``job.native_lane_types``, ``job.sketch_lane_types``).

    A native lane that merges sets' HLLs with ``hll_union_agg`` keeps an HLL buffer in the
    state of *every* group, a counter's too (an empty one), and Spark sorts its groups
    instead of hashing them (issue #4, README "What p50 ≤ 1 s at 100k series would take
    here"). Without sets, counters and gauges keep plain sums and extremes: at 100k counters
    the lane's task CPU fell 17 %, freshness p50 7.62 → 7.07 s (medians of five alternated
    runs, three clearly ahead). The sets then go to the sketch lane's operator, which
    merges HLLs as the session and sliding operators do, at ~1 ms per set partial: 10k sets
    per second no longer keep up there, while the native lane handles them in ~1 s batches.
    Hence a choice per window, not the default. A query of their own would keep sets native,
    but a third query per window slowed every batch of the other two more than the HLLs did.
    The config allows it on tumbling windows without ``quantiles: kll`` only.
    """
    return (
        window.sets == "with_timers"
        and window.kind == "tumbling"
        and not window.uses_kll
    )


def sets_query(window: WindowSpec) -> bool:
    """Whether ``window``'s sets merge in a native query of their own (``sets: separate``;
    ``job.set_lane_partials``), beside its native lane of counters and gauges and its
    sketch lane.

    The native lane then aggregates counters and gauges as with ``sets: with_timers``
    (no HLL buffer per group, a hash aggregate instead of a sort), while sets keep Spark's
    own ``hll_union_agg``. Session 17 measured a third query slower than the HLLs: every
    idle query ran a batch per segment. Since session 18 a lane with no rows for it waits
    (``source.QuietLane``), so with no set in the log the third query costs ~0.6 s of task
    time in 82 s; at 100k counters batches were 1.37 s against 1.72 s, and with 10k sets
    beside them the counters still gained, while at 10k counters + 1k sets the two were
    level: a choice per window (README "What p50 ≤ 1 s at 100k series would take here",
    item 8).
    """
    return window.sets == "separate" and window.kind == "tumbling" and not window.uses_kll


def adds_in_driver(window: WindowSpec) -> bool:
    """Whether ``window``'s native lane keeps no Spark state: each micro-batch hands over its
    own rows' sums per window and the job's holding adds them up (``job.plain_batch_windows``,
    ``held_windows.AddedWindows``).

    A lane of counters and gauges alone (``sets: with_timers`` or ``separate``) whose open
    windows the job holds (no ``early_every``): its values are plain sums and extremes, which
    add up outside Spark exactly as inside. Spark's state duplicated the holding and cost
    ~0.4 s of a 1.3 s batch at 100k series (README "What p50 ≤ 1 s at 100k series would
    take here", item 12).
    """
    return (
        (sets_query(window) or splits_sets(window))
        and window.early_every_ms is None
    )


def sets_checkpoint(checkpoint: Path) -> Path:
    """Checkpoint of a window's sets query (``sets_query``), beside the window's own, whose
    name fingerprints the definition."""
    return checkpoint.with_name(f"{checkpoint.name}.sets")


def sketch_checkpoint(checkpoint: Path, params: SketchParams, window: WindowSpec) -> Path:
    """Checkpoint of a window's sketch lane, beside the window's own.

    Its state holds HDR bucket *indices*, which mean values only under one layout, so the
    layout is part of the name: a config whose ``quantile_error``/``value_range`` changed
    starts the lane afresh instead of reading old indices with the new layout. A hopping
    window's lane is the pane-merge operator (``hopping_windows``), whose state and input
    differ from the copied rows' operator: ``.panes`` in the name starts it afresh too (a
    new checkpoint's revisions start above the stored ones, ``revision_base``).
    """
    layout = [params.hdr_lowest, params.hdr_highest, params.hdr_significant_digits,
              params.value_scale]  # fmt: skip
    digest = hashlib.sha256(json.dumps(layout).encode()).hexdigest()[:8]
    lane = "panes" if window.kind == "hopping" and window.hop_ms else "sketches"
    return checkpoint.with_name(f"{checkpoint.name}.{lane}-{digest}")


def sketch_params(config: PipelineConfig) -> SketchParams:
    """The config's compiled sketch accuracy (the documented defaults when it sets none)."""
    compiled = getattr(config, "sketches", None)
    return compiled if isinstance(compiled, SketchParams) else compile_accuracy()
