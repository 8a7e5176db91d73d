"""Sliding windows (``kind: sliding``): Kafka Streams ``SlidingWindows``, per series, per pane.

A series is (metric, the ``group_by`` tags). Its events are its pane partials, at event time
``t = min(pane_start, segment heartbeat)`` like every other kind, so time has pane resolution
``p`` (the config's ``pane``; ``size`` is a multiple of it). The windows are defined by the
data: for each pane ``t`` holding data,

- its **left** window ``[t + p - size, t + p)``, the one ending just after it, and
- its **right** window ``[t + p, t + p + size)``, the one starting just after it, if any
  data lies in it.

Each window aggregates every partial inside it (count/sum/min/max/last as the other kinds);
only windows holding data exist. Two panes share a window exactly when their starts are less
than ``size`` apart. Timeline (pane 1 s, size 3 s), one series::

    t (s)         -2  -1  0   1   2   3   4   5   6   7   8   9
    panes                 x       x               x
    left of 0     [...........)                                   {0}
    left of 2             [...........)                           {0, 2}
    right of 0                [...........)                       {2}
    left of 6                             [...........)           {6}
    right of 2: [3, 6) and right of 6: [7, 10) hold no data: no window

This is ``KStreamSlidingWindowAggregate`` (Kafka Streams, ``SlidingWindows`` with time
difference ``D``) adapted to half-open windows at pane resolution: Kafka's inclusive left
window ``[t - D, t]`` becomes ``[t + p - size, t + p)`` and its right window ``[t + 1,
t + 1 + D]`` becomes ``[t + p, t + p + size)``, i.e. Kafka's one millisecond is our pane and
``size`` plays ``D + 1``: records "within D of each other" are panes less than ``size`` apart.
As in Kafka, a window is created when a record makes it non-empty (a record's left window; the
right window of an earlier record it falls in; its own right window if later data is there)
and updated by every later record inside it.

Lateness (``W' = prior heartbeat of the partial's segment - watermark_delay``, ``L =
allowed_lateness``; a window is final when ``end + L <= W'``): Kafka's ``closeTime = stream
time - grace`` is our ``W' - L`` (stream time driven by heartbeats rather than by the newest
record), and its two rules become:

- ``t + size + L <= W'``: every window that can hold ``t`` (the latest is ``[t, t + size)``)
  is final. Kafka drops such a record (``t + 1 + D <= closeTime``); here the stateless late
  query records it in ``late_events`` with the bounds of its left window
  (``sliding_late_partials``).
- otherwise the partial is on time for some windows. It joins the series' panes and goes to
  every window it reaches, the windows the panes define that hold ``t``: the left windows of
  the panes ``t' >= t`` within reach and the right windows of earlier panes ``t'`` with
  ``t' + p <= t < t' + p + size``. An open one is created or updated; a final one never
  changes: the operator records the partial in ``late_events`` with that window's bounds (so
  its row's ``late_events`` counts it), where Kafka skips it and counts a dropped record.
  Its own right window ends after every window holding ``t``, so it is never final here.

Straggler example (size 3 s, lateness 1 s, delay 0): panes at 0 and 6, then a partial at
4 s in a segment whose prior heartbeat is 6 s (``W' = 6``; ``4 + 3 + 1 > 6``, so it is not
entirely late)::

    t (s)         0   1   2   3   4   5   6   7   8
    panes         x                       x
    straggler                     s
    left of 4             [...........)        5 + 1 <= 6: final, late row [2, 5), not created
    left of 6                     [...........)        7 + 1 > 6: open, updated {4, 6}
    right of 4                        [...........)    new: {6}

Emission follows the rules of every window kind (``docs/concepts.md``, "A window's rows:
provisional, revised, final"); a sliding window waits in ``window_pending`` until the
watermark passes its end, is provisional, corrected while stragglers change it, final at
``end + L <= W``. Sliding windows are never superseded (a window's bounds never change), so
the operator emits ``upsert`` and ``late`` rows but no ``retract``.

Operator: ``applyInPandasWithState`` keyed by (metric, tags), fed the partials that are not
entirely late, in update mode, like ``session_windows``. State per series = the metric type,
the panes (merged per event time) and the windows (by start), each packed as a blob of
fixed-size records each followed by its sketches (``window_sketches``): an array field in the
state schema crashes the Python worker, a blob does not. Every window row carries, like a
session's, p50/p90/p99/p999, the merged digest, the HdrHistogram encoding and bucket rows
(``ms h d``) or the distinct count and merged HLL (``s``). A new window merges the panes inside
it in time order; an existing one merges each partial that reaches it.
A new window starts as the sum of the panes held inside it: with one receiver every one of
them was on time for it (``W'`` never goes back, and the window is open now). Per call it
emits the windows the batch created or changed. A pane is kept while a window it defines can
still be reached (``t + p + size > `` Spark's watermark), a window while it ends after it;
Spark's watermark trails ours by ``delay + L + size + p`` (``sliding_horizon_ms``). An
event-time timeout at the newest of those bounds frees idle series.

Within a micro-batch the partials of a series are applied in log order as far as the rows
tell it (prior heartbeat, segment heartbeat, event time), as for sessions; the order only
matters for the "late for a final window" decisions.

Cost: a pane lies in up to ``size / p`` windows, so a series with data in every pane updates
that many windows (and output rows) per pane, as in Kafka; finding them scans the panes held
(about ``(size + L + delay) / p`` per series). With sketches that is also ``size / p`` sketch
merges per partial (~0.1 ms each: digest ~20 µs, HDR buckets ~80 µs) and as many window rows
with quantiles and HdrHistogram encodings, and the state holds a sketch per pane and per
window. Measured, a 1 min window of 1 s panes, one timer series with 100 lognormal values in
every pane: 1.8 MB of state (121 panes, 0.34 MB; 121 windows, 1.4 MB) and ~24 ms per pane.
Keep ``size / pane`` small for sketched metrics (or use hopping windows, whose panes merge
once per window).
Several receivers: the spool source holds a fast receiver's segments back until the slowest
open receiver catches up (``source.py``), so Spark's watermark never runs past partials a
lagging receiver still sends.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from streamgauge.configs import WindowSpec
from streamgauge.sketches.accuracy import SketchParams, compile_accuracy
from streamgauge.windows import window_sketches
from streamgauge.windows.aggregates import Scalars, output_frame, read_batch
from streamgauge.windows.session_windows import rows_in_log_order
from streamgauge.windows.window_sketches import Sketches, SketchMerger

#: One pane or window in a state blob: time (pane event time or window start), count, sum,
#: min, max, last, last_event_ms; its sketches follow it (``window_sketches.pack_records``).
_RECORD = struct.Struct("<qqddddq")

STATE_DDL = "metric_type string, panes binary, windows binary"

#: The same columns as the session operator's, so ``SessionBatchWriter`` commits both.
OUTPUT_DDL = (
    "change string, metric string, tags string, metric_type string, "
    "window_start_ms bigint, window_end_ms bigint, count bigint, sum double, min double, "
    "max double, last double, receiver string, pane_start_ms bigint, first_recv_ms bigint, "
    f"last_recv_ms bigint, prior_heartbeat_ms bigint, {window_sketches.OUTPUT_DDL}"
)
OUTPUT_COLUMNS = tuple(part.split()[0] for part in OUTPUT_DDL.split(", "))

_INPUT_COLUMNS = (
    "metric", "tags", "metric_type", "event_ms", "event_ts", "count", "sum", "min", "max", "last",
    "last_event_ms", "first_recv_ms", "last_recv_ms", "receiver", "pane_start_ms",
    "segment_heartbeat_ms", "prior_heartbeat_ms", "sketch", "hdr_bucket", "hdr_count",
)  # fmt: skip


def sliding_horizon_ms(window: WindowSpec, pane_ms: int) -> int:
    """How far Spark's watermark trails the newest event time of a sliding query.

    ``delay + lateness + size + pane``. With one receiver Spark's watermark is then at most
    ``W' - lateness - size - pane`` for any later partial, and a partial that is not entirely
    late has ``t > W' - lateness - size``: Spark never drops it, and a pane or window whose
    reach ends before the watermark (``t + pane + size``, ``end``) can no longer be touched.
    """
    assert window.size_ms is not None
    return window.watermark_delay_ms + window.allowed_lateness_ms + window.size_ms + pane_ms


@dataclass(slots=True)
class Partial:
    """Merged aggregates of a pane or of a window; ``at`` is the pane time or window start."""

    at: int
    scalars: Scalars = field(default_factory=Scalars)
    sketches: Sketches = field(default_factory=Sketches)

    def merge(self, other: Partial, merger: SketchMerger) -> None:
        self.scalars.merge_scalars(other.scalars)
        merger.absorb(self.sketches, other.sketches)

    def values(self) -> tuple[Any, ...]:
        """The state record: ``at``, then the scalars."""
        return (self.at, *self.scalars.record())


def pack(records: dict[int, Partial], merger: SketchMerger) -> bytes:
    return window_sketches.pack_records(
        [(_RECORD.pack(*records[at].values()), records[at].sketches) for at in sorted(records)],
        merger.fingerprint,
    )


def unpack(blob: bytes, merger: SketchMerger) -> dict[int, Partial]:
    records = {}
    for fields, sketches in window_sketches.unpack_records(blob, _RECORD, merger.fingerprint):
        at, *scalars = fields
        records[at] = Partial(at, Scalars(*scalars), sketches)
    return records


def reached_starts(t: int, panes: dict[int, Partial], size: int, pane_ms: int) -> set[int]:
    """Starts of the windows defined by ``panes`` (which hold ``t``) that contain ``t``."""
    starts = set()
    for other in panes:
        left = other + pane_ms - size
        if left <= t < left + size:
            starts.add(left)
        right = other + pane_ms
        if right <= t < right + size:
            starts.add(right)
    return starts


def sum_panes(start: int, panes: dict[int, Partial], size: int, merger: SketchMerger) -> Partial:
    """A new window: the panes inside it merged in time order (sketches too)."""
    window = Partial(start)
    for at in sorted(panes):
        if start <= at < start + size:
            window.merge(panes[at], merger)
    return window


def sliding_state_function(window: WindowSpec, pane_ms: int, params: SketchParams) -> Any:
    """The ``applyInPandasWithState`` function for ``window`` (picklable closure)."""
    assert window.size_ms is not None
    size, lateness, delay = window.size_ms, window.allowed_lateness_ms, window.watermark_delay_ms
    merger = SketchMerger(params)

    def update_sliding(
        key: tuple[str, str], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        metric, tags = key
        metric_type: str | None = None
        panes: dict[int, Partial] = {}
        windows: dict[int, Partial] = {}
        if state.exists:
            metric_type, pane_blob, window_blob = state.get
            panes, windows = unpack(pane_blob, merger), unpack(window_blob, merger)
        before = {start: w.values() for start, w in windows.items()}
        out: list[tuple[Any, ...]] = []
        no_sketches = (None,) * len(window_sketches.OUTPUT_COLUMNS)
        if not state.hasTimedOut:
            batch, metric_type = read_batch(frames, metric_type)
            for row in rows_in_log_order(batch):
                t = int(row.event_ms)
                closed_before = int(row.prior_heartbeat_ms) - delay
                partial = Partial(t, Scalars.of_row(row))
                merger.add(partial.sketches, row.metric_type, row.sketch, row.hdr_bucket,
                           row.hdr_count)  # fmt: skip
                if t in panes:
                    panes[t].merge(partial, merger)
                else:
                    panes[t] = Partial(t)
                    panes[t].merge(partial, merger)
                for start in sorted(reached_starts(t, panes, size, pane_ms)):
                    if start + size + lateness <= closed_before:
                        # Final: never changed; the partial is recorded against it instead.
                        out.append(
                            ("late", metric, tags, row.metric_type, start, start + size,
                             int(row.count), float(row.sum), float(row.min), float(row.max),
                             float(row.last), row.receiver, int(row.pane_start_ms),
                             int(row.first_recv_ms), int(row.last_recv_ms),
                             int(row.prior_heartbeat_ms), *no_sketches)
                        )  # fmt: skip
                    elif start in windows:
                        windows[start].merge(partial, merger)
                    else:
                        windows[start] = sum_panes(start, panes, size, merger)
                # Its own right window (later data only): ends after every window holding t,
                # so it is open whenever the partial is not entirely late.
                right = t + pane_ms
                if right not in windows and any(right <= at < right + size for at in panes):
                    windows[right] = sum_panes(right, panes, size, merger)
        for start in sorted(windows):
            if before.get(start) != windows[start].values():
                w = windows[start]
                out.append(
                    ("upsert", metric, tags, metric_type, start, start + size,
                     *w.scalars.output_values(), *[None] * 5,
                     *merger.columns(w.sketches, metric_type or ""))
                )  # fmt: skip
        # Free what no partial Spark still lets through can reach (see sliding_horizon_ms).
        watermark = state.getCurrentWatermarkMs()
        panes = {at: p for at, p in panes.items() if at + pane_ms + size > watermark}
        windows = {start: w for start, w in windows.items() if start + size > watermark}
        if panes or windows:
            state.update((metric_type, pack(panes, merger), pack(windows, merger)))
            reach = [at + pane_ms + size for at in panes] + [s + size for s in windows]
            state.setTimeoutTimestamp(max(reach))
        else:
            state.remove()
        if out:
            yield output_frame(out, OUTPUT_COLUMNS)

    return update_sliding


def slid_partials(
    source: DataFrame, window: WindowSpec, *, pane_ms: int, params: SketchParams | None = None
) -> DataFrame:
    """Partials of ``window`` → sliding-window changes per series (``upsert`` and ``late``).

    The same output columns as ``job.sessionized_partials``, so ``SessionBatchWriter`` commits
    them. ``pane_ms`` is the config's pane: it sets where a pane's windows start and end.
    Partials entirely late (see the module docstring) are left to ``sliding_late_partials``.
    """
    # Imported here, not at the top: job.py imports this module to start sliding queries.
    from streamgauge.windows.job import metric_filter, series_tags

    assert window.size_ms is not None
    event = F.least(F.col("pane_start_ms"), F.col("segment_heartbeat_ms"))
    closes_at = event + F.lit(window.size_ms + window.allowed_lateness_ms)
    entirely_late = closes_at <= F.col("prior_heartbeat_ms") - F.lit(window.watermark_delay_ms)
    on_time = (
        source.where(metric_filter(window.metrics) & ~entirely_late)
        .withColumn("event_ms", event)
        .withColumn("event_ts", F.timestamp_millis("event_ms"))
        .withColumn("tags", series_tags(window.group_by))
        .withWatermark("event_ts", f"{sliding_horizon_ms(window, pane_ms)} milliseconds")
        .select(*_INPUT_COLUMNS)
    )
    return on_time.groupBy("metric", "tags").applyInPandasWithState(
        sliding_state_function(window, pane_ms, params or compile_accuracy()),
        OUTPUT_DDL,
        STATE_DDL,
        "Update",
        "EventTimeTimeout",
    )


def sliding_late_partials(source: DataFrame, window: WindowSpec, *, pane_ms: int) -> DataFrame:
    """Partials entirely late for ``window`` (``t + size + lateness <= W'``): a stateless
    query, like ``job.late_partials``, with the bounds of each partial's left window
    ``[t + p - size, t + p)`` (what Kafka logs when it drops such a record)."""
    from streamgauge.windows.job import metric_filter, series_tags

    assert window.size_ms is not None
    event = F.least(F.col("pane_start_ms"), F.col("segment_heartbeat_ms"))
    closes_at = event + F.lit(window.size_ms + window.allowed_lateness_ms)
    late = (closes_at <= F.col("prior_heartbeat_ms") - F.lit(window.watermark_delay_ms)) & (
        metric_filter(window.metrics)
    )
    return (
        source.withColumn("window_end_ms", event + F.lit(pane_ms))
        .withColumn("window_start_ms", event + F.lit(pane_ms - window.size_ms))
        .withColumn("tags", series_tags(window.group_by))
        .withColumn("late", late)
        .where((F.col("pane_start_ms") < F.col("prior_heartbeat_ms")) & F.col("late"))
    )
