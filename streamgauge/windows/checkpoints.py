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

LANE_LAYOUT = 4
"""Bumped when a query's shape changes, so a checkpoint of an older shape is not resumed (see
checkpoint_dir). 4: every window but ``quantiles: kll`` is one stateless query whose driver
holds the open windows (``pane_writer``)."""


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
        shape += [window.gap_ms, window.key, LANE_LAYOUT]
    elif window.kind == "sliding":
        shape += [LANE_LAYOUT]
    else:
        if window.uses_kll:  # appended only here: tdigest windows keep their checkpoints
            shape += [3, "kll", sketch_params(config).kll_k]
        else:
            shape += [LANE_LAYOUT, window.hop_ms]
    fingerprint = json.dumps(shape)
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:10]
    return paths.checkpoints / config.name / f"{window.name}-{digest}"


def all_checkpoints(paths: JobPaths, config: PipelineConfig) -> list[Path]:
    """Every checkpoint the running queries of ``config`` use (one per window)."""
    found = []
    for window in config.windows:
        checkpoint = checkpoint_dir(paths, config, window)
        found.append(checkpoint)
    return found


def sketch_params(config: PipelineConfig) -> SketchParams:
    """The config's compiled sketch accuracy (the documented defaults when it sets none)."""
    compiled = getattr(config, "sketches", None)
    return compiled if isinstance(compiled, SketchParams) else compile_accuracy()
