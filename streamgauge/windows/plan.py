"""What a config's windows compile into: the window job's plan, read by everyone who needs it.

A config (``PipelineConfig``: what the user wrote) compiles into one ``WindowPlan`` (what
runs): per window one streaming query (``QueryPlan``) with its name, its checkpoint, the span
an idle query waits out and the watermarks at which its results change
(``source.QuietLane``); the logic objects of ``pane_writer`` compute every window kind and
metric type. The job starts its queries from the plan
(``job.start_window_queries``); retention and the receivers' ``segment_lag_ms`` read its
checkpoints (only the running config's count: one left by an older config, a window renamed,
resized or with a changed sketch layout, stops moving for good); `status` reads them for a
catch-up's progress (``run.json``).

Spark-free: the receivers run in their own processes, where importing pyspark would cost
~1.7 s and ~70 MB per process.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path

from streamgauge.configs import PipelineConfig, WindowSpec
from streamgauge.sketches.accuracy import SketchParams, compile_accuracy

LANE_LAYOUT = 4
"""Bumped when a query's shape changes, so a checkpoint of an older shape is not resumed (see
checkpoint_dir). 4: the window is one stateless query whose driver holds the open windows
(``pane_writer``)."""


TRIGGER_INTERVAL = "0.1 seconds"
"""How often a live query asks the log for new segments. A batch runs only when its source
admits some (``source.QuietLane``: when the batch changes what a reader sees), so this sets how
soon a due batch starts, not how many run; asking costs a listing of the new segments."""


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
        shape += [LANE_LAYOUT, window.hop_ms]
        if window.uses_kll:  # appended only here: tdigest windows keep their checkpoints
            shape += ["kll", sketch_params(config).kll_k]
    fingerprint = json.dumps(shape)
    digest = hashlib.sha256(fingerprint.encode()).hexdigest()[:10]
    return paths.checkpoints / config.name / f"{window.name}-{digest}"


def sketch_params(config: PipelineConfig) -> SketchParams:
    """The config's compiled sketch accuracy (the documented defaults when it sets none)."""
    compiled = getattr(config, "sketches", None)
    return compiled if isinstance(compiled, SketchParams) else compile_accuracy()


def quiet_span_ms(config: PipelineConfig, window: WindowSpec) -> int:
    """From a partial's pane to the heartbeat at which every window holding it is final:
    while a row taken is younger, a driver-lane query takes every segment (``QuietLane``). A
    window holding a partial ends at most ``size`` (a session: ``gap``) after it."""
    reach_ms = window.gap_ms if window.kind == "session" else window.size_ms
    assert reach_ms is not None
    if window.kind == "sliding":
        reach_ms += config.pane_ms  # a pane's right window ends a pane later
    return config.pane_ms + reach_ms + window.watermark_delay_ms + window.allowed_lateness_ms


def boundaries_ms(config: PipelineConfig, window: WindowSpec) -> tuple[int, int]:
    """``(stride, phase)``: the window's results change only when its watermark crosses
    ``phase + k * stride`` (a window's end, or an ``early_every`` tick), or that plus
    ``allowed_lateness`` (a window becomes final), or when a straggler revises one: what a
    driver-lane query waits for between batches (``source.QuietLane``). Tumbling and hopping
    windows end on a lattice of their hop (offset by ``offset``) and tick on one of their
    ``early_every``; a session or sliding window may end at any pane."""
    if window.kind in ("session", "sliding"):
        return config.pane_ms, 0
    assert window.size_ms is not None
    stride = math.gcd(window.hop_ms or window.size_ms, window.size_ms, window.early_every_ms or 0)
    return stride, (window.offset_ms or 0) % stride


@dataclass(frozen=True)
class QueryPlan:
    """One window's streaming query."""

    window: WindowSpec
    #: ``<config>.<window>``: Spark's query name, and the store's lock and batch claims.
    name: str
    checkpoint: Path
    #: ``quiet_span_ms``.
    quiet_span_ms: int
    #: ``boundaries_ms``.
    boundaries_ms: tuple[int, int]

    @property
    def late_name(self) -> str:
        """The name its late rows are claimed under in the store."""
        return f"{self.name}.late"


@dataclass(frozen=True)
class WindowPlan:
    """A config's windows as the job runs them (module docstring)."""

    config: PipelineConfig
    paths: JobPaths
    queries: tuple[QueryPlan, ...]
    sketches: SketchParams

    @classmethod
    def of(cls, config: PipelineConfig, paths: JobPaths) -> WindowPlan:
        queries = tuple(
            QueryPlan(
                window, query_name(config, window), checkpoint_dir(paths, config, window),
                quiet_span_ms(config, window), boundaries_ms(config, window),
            )
            for window in config.windows
        )  # fmt: skip
        return cls(config, paths, queries, sketch_params(config))

    @property
    def checkpoints(self) -> list[Path]:
        """Every checkpoint of the running queries (retention, ``segment_lag_ms``)."""
        return [query.checkpoint for query in self.queries]

    def query(self, window: str) -> QueryPlan:
        for query in self.queries:
            if query.window.name == window:
                return query
        raise KeyError(f"config {self.config.name!r} has no window {window!r}")


def query_name(config: PipelineConfig, window: WindowSpec) -> str:
    """A window's query name (``QueryPlan.name``), for those that have no plan (replay)."""
    return f"{config.name}.{window.name}"
