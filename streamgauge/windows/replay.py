"""`streamgauge replay`: recompute final windows from the segment log and publish corrections.

The streaming job never changes a final window: partials that arrive after it are recorded in
``late_events``. Replay reads the retained log again, with the streaming job's own logic
objects (``OpenWindows``, ``OpenSessions``, ``SlidingWindowLogic``) but **without** the
lateness cut, so late partials are included, and writes every window that changed with the
next revision (``ResultStore.publish_corrections``). Like the job's, its windows are merged
in this process (no Spark). Only metrics with rows in ``late_events`` are
recomputed (the others cannot differ), and of their recomputed windows only the final ones
that intersect ``[from, to)`` and that the late partials affect are published. Sessions read
**every** retained segment (a session can chain across any span of time, so no range of the
log is enough); the other kinds the segments from ``size`` (sliding: ``2 size``) before
``from``. Per kind:

- a **session** holding a late partial (``pane_start`` inside it). It replaces every stored
  session of its series inside it (``publish_corrections(supersede=True)``): a late partial
  may extend a session or bridge several into one. Timeline (gap 4 s, lateness 1 s)::

      t (s)      0    1    2    3    4    5    6    7    8    9   10
      stored     [0 ........... 4)      [6 ........... 10)      both final
      late                      x  (own session [3, 7) already final: late_events)
      replay     [0 ...................................... 10)  revision above both;
                 rows [0, 4) and [6, 10) and their bucket rows deleted in that transaction

  Whole sessions are taken: one that intersects ``[from, to)`` is recomputed and published
  entire, even where it reaches beyond the range.
- a **sliding** window holding a late partial, or starting just after one (``t + pane``: the
  right window of a late pane, which exists only because of it). A window that changed is a
  correction; one that did not exist (a window only a late pane defines) is an insert. Sliding
  windows are never superseded: more partials only add windows.

The late partials inside a published window are marked ``replayed_at`` (by id, as read
before the log). ``late_events`` of a published row counts, as for every row, the late
partials recorded against its exact bounds: a session merged by replay starts from 0.
Replaying again recomputes the same values, so it changes nothing.

Only final windows are replayed (``window_end + allowed_lateness <= watermark`` of the query
that computes the window, as stored in ``pipeline_state``): open windows still
belong to the streaming job, whose revisions must keep increasing.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.clock import Clock
from streamgauge.configs import PipelineConfig, WindowSpec
from streamgauge.sinks.store import LateRecord, ResultStore, canonical_tags_text
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.quantile_kernels import quantile_kernel
from streamgauge.windows.assign import PaneAssigner
from streamgauge.windows.batch_log import partials_since
from streamgauge.windows.open_sessions import OpenSessions
from streamgauge.windows.open_windows import OpenWindows
from streamgauge.windows.plan import query_name, sketch_params
from streamgauge.windows.results import to_result_rows, with_hdr_buckets
from streamgauge.windows.sliding_logic import SlidingWindowLogic
from streamgauge.windows.source import admitted_offset
from streamgauge.windows.window_rows import take_hdr

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ReplayedWindow:
    window_name: str
    watermark_ms: int | None
    windows_recomputed: int
    windows_corrected: int
    late_partials_applied: int
    skipped: str = ""
    windows_retracted: int = 0
    """Stored sessions superseded by a recomputed one (deleted)."""


def parse_time_ms(text: str) -> int:
    """ISO-8601 with a UTC offset (``2026-11-21T10:00:00Z``) or epoch seconds → epoch ms."""
    stripped = text.strip()
    try:
        seconds = float(stripped)
    except ValueError:
        pass
    else:
        return round(seconds * 1000)
    try:
        parsed = dt.datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"{text!r} is neither ISO-8601 (2026-11-21T10:00:00Z) nor epoch seconds"
        ) from None
    if parsed.tzinfo is None:
        raise ValueError(f"{text!r} has no UTC offset: write it with Z or +00:00")
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    return (parsed - epoch) // dt.timedelta(milliseconds=1)


def replay(
    config: PipelineConfig,
    spool: Path | str,
    store: ResultStore,
    clock: Clock,
    *,
    from_ms: int,
    to_ms: int,
    on_window: Callable[[int, int, str], None] | None = None,
) -> list[ReplayedWindow]:
    """Recompute the final windows of ``config`` overlapping ``[from_ms, to_ms)``;
    ``on_window(index, of, name)`` is told as each window's turn comes (progress)."""
    if to_ms <= from_ms:
        raise ValueError(f"--to ({to_ms} ms) must be after --from ({from_ms} ms)")
    report = []
    for index, window in enumerate(config.windows):
        if on_window is not None:
            on_window(index, len(config.windows), window.name)
        if window.kind in ("session", "sliding"):
            report.append(
                replay_series_window(config, window, spool, store, clock, from_ms=from_ms,
                                     to_ms=to_ms)  # fmt: skip
            )
            continue
        report.append(
            replay_pane_window(config, window, spool, store, clock, from_ms=from_ms,
                               to_ms=to_ms)  # fmt: skip
        )
    return report


def replay_pane_window(
    config: PipelineConfig,
    window: WindowSpec,
    spool: Path | str,
    store: ResultStore,
    clock: Clock,
    *,
    from_ms: int,
    to_ms: int,
) -> ReplayedWindow:
    """Recompute and publish the final tumbling or hopping windows of ``window`` overlapping
    ``[from_ms, to_ms)`` that hold a late partial, with the streaming job's own logic
    (``PaneAssigner``, ``OpenWindows``) over the log read again, no partial late."""
    watermark_ms = store.read_state(config.name, f"watermark_ms:{window.name}")
    if watermark_ms is None:
        return ReplayedWindow(window.name, None, 0, 0, 0)
    # Read before the log: every late row seen here has its partial in what is read next.
    late = store.read_late_partials(config.name, window.name)
    if not late:
        return ReplayedWindow(window.name, watermark_ms, 0, 0, 0)
    assert window.size_ms is not None
    params = sketch_params(config)
    windows = OpenWindows(PaneAssigner.of(window), params,
            quantile_kernel(window.quantiles, params))
    metrics = pa.array(sorted({record.metric for record in late}), pa.string())
    for table in _never_late(spool, metrics, from_ms - window.size_ms):
        windows.absorb(windows.assigner.assign(table).on_time)
    last_end = watermark_ms - window.allowed_lateness_ms  # final windows only
    starts = [s for s in windows.window_starts(None, last_end)
              if s < to_ms and s + window.size_ms > from_ms]  # fmt: skip
    recomputed = windows.windows(dict.fromkeys(starts))
    chosen, applied = affected_windows(recomputed.table, late, window, config.pane_ms)
    keep = pa.array(_rows_of(recomputed.table, chosen), pa.int64())
    rows = to_result_rows(
        chosen, config, window, revision=1, watermark_ms=watermark_ms,
        emitted_at_ms=clock.now_ms(),
    )  # fmt: skip
    rows = with_hdr_buckets(
        rows, take_hdr(recomputed.hdr, np.asarray(keep.to_numpy(), np.int64)),
        HdrLayout.from_params(params),
    )  # fmt: skip
    outcome = store.publish_corrections(
        rows, lock_name=query_name(config, window), late_ids=applied
    )
    return ReplayedWindow(
        window.name, watermark_ms, rows.num_rows, outcome.rows_upserted, outcome.rows_finalized
    )


def _rows_of(table: pa.Table, chosen: pa.Table) -> list[int]:
    """The row numbers in ``table`` of ``chosen``'s windows (a subset, in order)."""
    index = {key: i for i, key in enumerate(zip(
        *(table.column(n).to_pylist() for n in ("metric", "tags", "window_start_ms")),
        strict=True))}  # fmt: skip
    return [index[key] for key in zip(
        *(chosen.column(n).to_pylist() for n in ("metric", "tags", "window_start_ms")),
        strict=True)]  # fmt: skip


def replay_series_window(
    config: PipelineConfig,
    window: WindowSpec,
    spool: Path | str,
    store: ResultStore,
    clock: Clock,
    *,
    from_ms: int,
    to_ms: int,
) -> ReplayedWindow:
    """Recompute and publish the final session or sliding windows of ``window`` that its late
    partials affect (see the module docstring)."""
    watermark_ms = store.read_state(config.name, f"watermark_ms:{window.name}")
    if watermark_ms is None:
        return ReplayedWindow(window.name, None, 0, 0, 0)
    # Read before the log: every late row seen here has its partial in what is read next.
    late = store.read_late_partials(config.name, window.name)
    if not late:
        return ReplayedWindow(window.name, watermark_ms, 0, 0, 0)
    params = sketch_params(config)
    metrics = pa.array(sorted({record.metric for record in late}), pa.string())
    final_through = watermark_ms - window.allowed_lateness_ms
    if window.kind == "session":
        sessions = OpenSessions(window, params)
        for table in _never_late(spool, metrics, None):
            sessions.absorb(table, None)
        rows = np.flatnonzero((sessions.end <= final_through) & (sessions.start < to_ms)
                              & (sessions.end > from_ms))  # fmt: skip
        recomputed = sessions.windows(rows)
    else:
        sliding = SlidingWindowLogic(window, params, config.pane_ms)
        size = sliding.size_ms
        for table in _never_late(spool, metrics, from_ms - 2 * size):
            sliding.open.absorb(sliding.open.assigner.assign(table).on_time)
        starts = [s for s in sliding.open.window_starts(None, final_through)
                  if s < to_ms and s + size > from_ms]  # fmt: skip
        recomputed = sliding.open.windows(dict.fromkeys(starts), sliding.exists)
    chosen, applied = affected_windows(recomputed.table, late, window, config.pane_ms)
    keep = np.asarray(_rows_of(recomputed.table, chosen), np.int64)
    rows_out = to_result_rows(
        chosen, config, window, revision=1, watermark_ms=watermark_ms,
        emitted_at_ms=clock.now_ms(),
    )  # fmt: skip
    rows_out = with_hdr_buckets(
        rows_out, take_hdr(recomputed.hdr, keep), HdrLayout.from_params(params)
    )
    outcome = store.publish_corrections(
        rows_out, lock_name=query_name(config, window),
        supersede=window.kind == "session", late_ids=applied,
    )  # fmt: skip
    return ReplayedWindow(
        window.name, watermark_ms, rows_out.num_rows, outcome.rows_upserted,
        outcome.rows_finalized, windows_retracted=outcome.rows_retracted,
    )  # fmt: skip


def _never_late(
    spool: Path | str, metrics: pa.Array, from_heartbeat_ms: int | None
) -> Iterator[pa.Table]:
    """The log's partials of ``metrics`` (from segments with heartbeats from
    ``from_heartbeat_ms``; None: all), each stream as if it had no prior heartbeat: no
    partial is late."""
    everything = admitted_offset(spool, {}, hold_back=False)["receivers"]
    for table in partials_since(spool, everything, from_heartbeat_ms):
        table = table.filter(pc.is_in(table.column("metric"), value_set=metrics))
        never_late = pa.array(np.zeros(table.num_rows, np.int64))
        yield table.set_column(
            table.schema.get_field_index("prior_heartbeat_ms"), "prior_heartbeat_ms", never_late
        )


def affected_windows(
    recomputed: pa.Table, late: list[LateRecord], window: WindowSpec, pane_ms: int
) -> tuple[pa.Table, list[int]]:
    """The recomputed windows a late partial affects, and the ids of the late partials inside
    them: a window holding a late partial's event time (its ``pane_start``: a late partial is
    never capped at its segment's heartbeat, which is after its window's end), or, for sliding
    windows, starting just after one (``pane_start + pane``)."""
    late_at: dict[tuple[str, str], list[LateRecord]] = {}
    for record in late:
        late_at.setdefault((record.metric, record.tags), []).append(record)
    keep: list[int] = []
    applied: set[int] = set()
    columns = (recomputed.column(name).to_pylist()
               for name in ("metric", "tags", "window_start_ms", "window_end_ms"))  # fmt: skip
    for index, (metric, tags, start, end) in enumerate(zip(*columns, strict=True)):
        records = late_at.get((metric, canonical_tags_text(json.loads(tags))), [])
        inside = [r.id for r in records if start <= r.pane_start_ms < end]
        defines = window.kind == "sliding" and any(
            start == r.pane_start_ms + pane_ms for r in records
        )
        if inside or defines:
            keep.append(index)
            applied.update(inside)
    return recomputed.take(pa.array(keep, pa.int64())), sorted(applied)
