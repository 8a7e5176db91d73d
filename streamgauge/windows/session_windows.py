"""Session windows (``kind: session``): a stateful Spark operator per series, with retractions.

A series is (metric, the ``key`` tag's value, the ``group_by`` tags). Its events are its pane
partials, at event time ``t = min(pane_start, segment heartbeat)`` (the same event time as the
other kinds, so sessions have pane resolution). A **session** is a maximal run of events in
which consecutive events are less than ``gap`` apart; it is the half-open interval
``[first event, last event + gap)``. Timeline (pane 1 s, gap 3 s), one series::

    t (s)        0    1    2    3    4    5    6    7    8    9   10   11   12
    events       x         x                        x    x
    sessions     [0 ...... 2 ........ 5)            [7 ...... 8 ........ 11)
                 2 - 0 < 3: one session             7 - 2 = 5 >= 3: a new one

    straggler at 4 s (within lateness): 4 - 2 < 3 and 7 - 4 < 3, so it merges both:
    sessions     [0 ............................................... 11)
                 rows [0, 5) and [7, 11) are retracted in the transaction that writes [0, 11)

Emission follows the rules of every window kind (``docs/concepts.md``, "A window's rows:
provisional, revised, final"): a session waits in ``window_pending`` until the watermark ``W``
passes its end, then is provisional in ``window_results``, corrected while stragglers extend
or merge it, final once ``end + allowed_lateness <= W``.

Lateness, per partial (``W' = prior heartbeat of its segment - watermark_delay``):

- ``t + gap + allowed_lateness <= W'``: the session the partial would open on its own is
  already final. The stateless late query records it in ``late_events`` with the bounds
  ``[t, t + gap)`` (the ``assign_windows`` rule shape of the other kinds).
- otherwise it is on time for its own session, but it may still reach back into a session
  that is final: ``start - gap < t < end`` with ``end + allowed_lateness <= W'``. A final
  session never changes, so the operator records that partial in ``late_events`` with **that
  session's** bounds (so the session row's ``late_events`` counts it) instead of merging it.
  Example (gap 5 s, lateness 2 s, delay 0): session [0, 10) final at W' = 12; a partial at
  8 s has 8 + 5 + 2 = 15 > 12 (its own session would be open) but 8 < 10 touches [0, 10).

Operator: ``applyInPandasWithState`` keyed by (metric, tags), fed the on-time partials in
update mode. State per series = the metric type and the open (or recently final) sessions,
packed as one binary blob (an array field in the state schema crashes the Python worker, a
blob does not): per session a fixed-size record, then its variable-length sketches
(``window_sketches``: t-digest and HDR buckets for ``ms h d``, HLL for ``s``; a lognormal timer
session ~17 KB, a set session at most 4.2 KB). Each call emits, per series, the sessions
the batch created or changed (``change = 'upsert'``, with p50/p90/p99/p999, the merged digest,
the HdrHistogram encoding and bucket rows, or the distinct count and merged HLL), the
superseded ones (``'retract'``: the store deletes their rows and bucket rows) and the partials
late for a final session (``'late'``). A merged session starts from the partial that bridges
them and absorbs the sessions it touches by start, so its sketches depend on the partials
alone, not on the order sessions sit in the state. Sessions are
dropped from state once Spark's watermark passes their end: Spark's watermark trails ours by
``gap + allowed_lateness`` at least (see ``session_horizon_ms``), so by then the session is
final and no on-time partial can reach it. An event-time timeout at the newest session end
makes Spark call back for idle series so their state is freed.

Within a micro-batch the partials of a series are applied in log order as far as the rows
tell it: by prior heartbeat, then segment heartbeat, then event time (then every other column,
``LOG_ORDER``, so a replayed batch merges sums and digests in the same order). For one receiver
with strictly increasing heartbeats this is exactly the order of the log, so the result does
not depend on how Spark cuts batches.
With several receivers feeding the same series in one batch, the order between receivers is
by heartbeat; it only matters for the "late for a final session" decision, whose own
watermark is per receiver anyway.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from streamgauge.configs import WindowSpec
from streamgauge.sketches.accuracy import SketchParams
from streamgauge.windows import window_sketches
from streamgauge.windows.aggregates import Scalars, output_frame, read_batch, rows_in_order
from streamgauge.windows.window_sketches import Sketches, SketchMerger

#: One session in the state blob: start, end, count, sum, min, max, last, last_event_ms; its
#: sketches follow it (``window_sketches.pack_records``).
_RECORD = struct.Struct("<qqqddddq")

STATE_DDL = "metric_type string, sessions binary"

OUTPUT_DDL = (
    "change string, metric string, tags string, metric_type string, "
    "window_start_ms bigint, window_end_ms bigint, count bigint, sum double, min double, "
    "max double, last double, receiver string, pane_start_ms bigint, first_recv_ms bigint, "
    f"last_recv_ms bigint, prior_heartbeat_ms bigint, {window_sketches.OUTPUT_DDL}"
)
OUTPUT_COLUMNS = tuple(part.split()[0] for part in OUTPUT_DDL.split(", "))

LOG_ORDER = (
    "prior_heartbeat_ms", "segment_heartbeat_ms", "event_ms", "receiver", "pane_start_ms",
    "count", "sum", "min", "max", "last", "last_event_ms", "first_recv_ms", "last_recv_ms",
)  # fmt: skip
"""How the partials of a series within one micro-batch are ordered before they are merged: log
order as far as the rows tell it (prior heartbeat, segment heartbeat, event time), then every
other column, ending with the sketch bytes (``rows_in_log_order``). The tail only breaks ties
between partials that differ in nothing the log order sees (two hosts' partials of one pane,
projected onto one series): floating-point sums and t-digest merges depend on the order, and
Spark's shuffle does not fix the order of a group's rows, so a replayed batch must not either."""


def rows_in_log_order(batch: pd.DataFrame) -> list[Any]:
    """``batch``'s rows in ``LOG_ORDER``, then by sketch bytes (a total order of what is
    merged), as named tuples."""
    return rows_in_order(batch, LOG_ORDER)


def session_horizon_ms(window: WindowSpec) -> int:
    """How far Spark's watermark trails the newest event time of a session query.

    ``delay + lateness + gap``: then Spark's watermark is at most ``W - lateness - gap``, so
    (1) an on-time partial (``t + gap + lateness > W'``) is never behind it and never dropped
    by Spark, and (2) a session whose end it passes is final and out of reach of any on-time
    partial (``t > W' - gap - lateness >= end``), so its state can go.
    """
    assert window.gap_ms is not None
    return window.watermark_delay_ms + window.allowed_lateness_ms + window.gap_ms


@dataclass(slots=True)
class Session:
    start: int
    end: int
    scalars: Scalars = field(default_factory=Scalars)
    sketches: Sketches = field(default_factory=Sketches)

    def absorb(self, other: Session, merger: SketchMerger) -> None:
        self.start = min(self.start, other.start)
        self.end = max(self.end, other.end)
        self.scalars.merge_scalars(other.scalars)
        merger.absorb(self.sketches, other.sketches)

    def values(self) -> tuple[Any, ...]:
        """The state record: start, end, then the scalars."""
        return (self.start, self.end, *self.scalars.record())


def pack_sessions(sessions: list[Session], merger: SketchMerger) -> bytes:
    return window_sketches.pack_records(
        [(_RECORD.pack(*s.values()), s.sketches) for s in sessions], merger.fingerprint
    )


def unpack_sessions(blob: bytes, merger: SketchMerger) -> list[Session]:
    sessions = []
    for fields, sketches in window_sketches.unpack_records(blob, _RECORD, merger.fingerprint):
        start, end, *scalars = fields
        sessions.append(Session(start, end, Scalars(*scalars), sketches))
    return sessions


def session_state_function(window: WindowSpec, params: SketchParams) -> Any:
    """The ``applyInPandasWithState`` function for ``window`` (picklable closure)."""
    assert window.gap_ms is not None
    gap, lateness, delay = window.gap_ms, window.allowed_lateness_ms, window.watermark_delay_ms
    merger = SketchMerger(params)

    def update_sessions(
        key: tuple[str, str], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        metric, tags = key
        metric_type, sessions = None, []
        if state.exists:
            metric_type, blob = state.get
            sessions = unpack_sessions(blob, merger)
        before = {(s.start, s.end): s.values() for s in sessions}
        superseded: set[tuple[int, int]] = set()
        out: list[tuple[Any, ...]] = []
        no_sketches = (None,) * len(window_sketches.OUTPUT_COLUMNS)
        if not state.hasTimedOut:
            batch, metric_type = read_batch(frames, metric_type)
            for row in rows_in_log_order(batch):
                t = int(row.event_ms)
                touched = [s for s in sessions if s.start - gap < t < s.end]
                closed_before = int(row.prior_heartbeat_ms) - delay
                final = [s for s in touched if s.end + lateness <= closed_before]
                if final:
                    target = min(final, key=lambda s: s.start)
                    out.append(
                        ("late", metric, tags, row.metric_type, target.start, target.end,
                         int(row.count), float(row.sum), float(row.min), float(row.max),
                         float(row.last), row.receiver, int(row.pane_start_ms),
                         int(row.first_recv_ms), int(row.last_recv_ms),
                         int(row.prior_heartbeat_ms), *no_sketches)
                    )  # fmt: skip
                    continue
                merged = Session(t, t + gap, Scalars.of_row(row))
                merger.add(merged.sketches, row.metric_type, row.sketch, row.hdr_bucket,
                           row.hdr_count)  # fmt: skip
                # By start, not by the state's list order (which depends on batch cuts): the
                # sketch merge order must be a function of the partials alone.
                for session in sorted(touched, key=lambda s: s.start):
                    merged.absorb(session, merger)
                    sessions.remove(session)
                    superseded.add((session.start, session.end))
                sessions.append(merged)
        sessions.sort(key=lambda s: s.start)
        current = {(s.start, s.end) for s in sessions}
        for start, end in sorted((superseded & set(before)) - current):
            out.append(("retract", metric, tags, metric_type, start, end, *[None] * 10,
                        *no_sketches))  # fmt: skip
        for session in sessions:
            if before.get((session.start, session.end)) != session.values():
                out.append(
                    ("upsert", metric, tags, metric_type, session.start, session.end,
                     *session.scalars.output_values(), *[None] * 5,
                     *merger.columns(session.sketches, metric_type or ""))
                )  # fmt: skip
        # Free what no on-time partial can reach any more (see session_horizon_ms).
        watermark = state.getCurrentWatermarkMs()
        sessions = [s for s in sessions if s.end > watermark]
        if sessions:
            state.update((metric_type, pack_sessions(sessions, merger)))
            state.setTimeoutTimestamp(max(s.end for s in sessions))
        else:
            state.remove()
        if out:
            yield output_frame(out, OUTPUT_COLUMNS)

    return update_sessions
