"""A pure-Python windower with the Spark job's semantics: the oracle of the transcript tests.

It consumes the same thing the job does (segments of pane partials, each with its receiver's
heartbeat) and produces the final state the store must hold: one row per window with its
aggregates, ``is_final`` and ``late_events``, plus the late partials. It is deliberately
simple (dicts and loops, no Spark), so that a disagreement points at the job.

Rules (the same as ``streamgauge.windows.job``; see its docstrings):

- event time of a partial = ``min(pane_start, heartbeat of its segment)``;
- window ``[start, end)`` with ``start = t - (t - offset) mod size``;
- final when ``end + allowed_lateness <= W``, ``W = heartbeat(receivers) - watermark_delay``,
  the heartbeat of the receivers being the minimum over open streams (the latest if all are
  closed), and never below the ``W`` a feed already committed: a receiver that joins with an
  older heartbeat lowers the minimum, not the watermark;
- a partial is late for a window when ``end + allowed_lateness <= max(prior heartbeat -
  watermark_delay, C)``: prior heartbeat = the stream's previous segment's heartbeat (0 if
  none), ``C`` = the ``W`` committed before this feed (its micro-batch). The log rule alone
  would let a receiver's first segment (no prior heartbeat) change a window already published
  final; ``C`` keeps it final whichever receiver brings the partial. Timeline (tumbling 2 s,
  delay 1 s, lateness 1 s)::

      r0  heartbeat 10 s           C = 9 s: [0, 2) final (2 + 1 <= 9)
      r1  first segment, a partial at 0.5 s, prior heartbeat 0 (log rule: on time)
          2 + 1 <= max(0 - 1, 9): late for [0, 2); W stays 9 s, r1's heartbeat 6 s or not

Session windows (``streamgauge.windows.open_sessions`` has the timeline): per series
(metric, ``group_by`` tags and the ``key`` tag), partials in log order (within a segment by
event time); with ``W' = max(prior heartbeat - watermark_delay, C)`` as above, a partial is
late when ``t + gap + allowed_lateness <= W'`` (recorded with bounds ``[t, t + gap)``) or when
it reaches a session already final by that same measure (recorded with that session's
bounds); otherwise it merges every session ``[start, end)`` with ``start - gap <= t <= end``
into one (both ends included: events exactly ``gap`` apart are one session, as Spark draws
them).

Sliding windows (``streamgauge.windows.sliding_logic`` has the timelines and the Kafka
Streams reference): per series (metric, ``group_by`` tags), partials in the same order as
sessions. With pane ``p``, a partial at ``t`` is late when ``t + size + allowed_lateness <=
W'`` (recorded with its left window's bounds ``[t + p - size, t + p)``). Otherwise it is
kept, and for every window the kept partials define (the left window ``[u + p - size, u +
p)`` of each kept time ``u``, the right window ``[u + p, u + p + size)`` of each) that holds
``t``: a final one (same measure) records it as late with its bounds, an
open one is created (from every kept partial inside it) or has it added. Then ``t``'s own
right window is created if a kept partial lies in it.

Sketches (``window_sketches``): every window also merges its partials' t-digests, HDR buckets
and HLLs with the operators' own ``SketchMerger``, one partial (or pane, or absorbed session) at
a time and in the operators' order: within a segment, partials in ``LOG_ORDER``
(event time, then every other column as a tie-break); a new session starts from its partial and
absorbs the sessions it touches by start; a sliding pane merges its partials, and a new sliding
window merges the panes inside it in time order. So for one receiver whose heartbeats strictly
increase (each segment sorts after the previous one in the operators' order too) a session or
sliding window's digest and HLL are byte for byte the operators'; otherwise (several receivers,
equal heartbeats, and tumbling/hopping windows, whose open windows merge a micro-batch's
partials at once, per pane, and a hopping window's panes when it is published:
``open_windows``) the digest merge order differs and quantiles agree within the t-digest's
rank error. This windower copies a hopping partial into each window it lies in: the definition
the pane merge must equal. HDR buckets add per index and the HLL union keeps the maximum per
register, so bucket rows and distinct counts agree exactly whatever the order.

Early emission (``early_every``, the store's ``_EARLY``): each ``feed`` is one micro-batch.
After it, with watermark ``W``, a window ``[start, end)`` with ``W < end`` and ``W - start >=
early_every`` is published early at its tick ``start + k * early_every <= W`` when it was not
published yet, or when its early row is of an earlier tick and a value changed since. A window
with ``end <= W`` is published as the store keeps it (provisional, then final). ``emissions``
lists, per ``feed``, the rows whose revision that batch changed; ``stored()`` shows an open
window's early row as published. Which early rows appear depends on which watermarks the
batches see, so the Spark job is compared with it one micro-batch per segment::

    window [0, 10), early_every 2 s, feeds at W = 2.2, 2.8, 4.1, 6.1, 10
    emits            early@2  -   early@4 (changed)  - (unchanged)  on-time
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from streamgauge.configs import PipelineConfig, WindowSpec
from streamgauge.ingest.pane_sketches import SKETCHED_TYPES
from streamgauge.windows.source import receivers_heartbeat_ms
from streamgauge.windows.window_sketches import OUTPUT_COLUMNS, Sketches, SketchMerger

LOG_ORDER = (
    "prior_heartbeat_ms", "segment_heartbeat_ms", "event_ms", "receiver", "pane_start_ms",
    "count", "sum", "min", "max", "last", "last_event_ms", "first_recv_ms", "last_recv_ms",
)  # fmt: skip
"""The order in which the windower takes a segment's partials: log order as far as the rows
tell it, then every other column (a total order, so two hosts' partials of one pane, projected
onto one series, merge the same way every time)."""


@dataclass(frozen=True, slots=True)
class PanePartial:
    """One row of a segment (``streamgauge.ingest.log.SEGMENT_SCHEMA``)."""

    metric: str
    metric_type: str
    tags: str
    pane_start_ms: int
    count: int
    sum: float
    min: float
    max: float
    last: float
    last_event_ms: int
    first_recv_ms: int
    last_recv_ms: int
    sketch: bytes | None = None
    hdr_bucket: Sequence[int] | None = None
    hdr_count: Sequence[int] | None = None


def merge_key(partial: PanePartial, event_ms: int) -> tuple[Any, ...]:
    """The operators' order of the partials of one segment (``LOG_ORDER`` after the receiver,
    then the sketch bytes): event time, then every other column."""
    after_receiver = LOG_ORDER[LOG_ORDER.index("receiver") + 1 :]
    return (event_ms, *(getattr(partial, name) for name in after_receiver), partial.sketch or b"")


@dataclass(frozen=True, slots=True)
class Segment:
    receiver: str
    heartbeat_ms: int
    closed: bool
    partials: tuple[PanePartial, ...]


WindowKey = tuple[str, str, str, int, int]  # window name, metric, tags, start, end


@dataclass(slots=True)
class WindowState:
    metric_type: str
    count: int = 0
    sum: float = 0.0
    min: float = float("inf")
    max: float = float("-inf")
    last: float = 0.0
    last_event_ms: int = -1
    sketches: Sketches = field(default_factory=Sketches)

    @classmethod
    def of(cls, partial: PanePartial, merger: SketchMerger) -> WindowState:
        """One partial's aggregates and sketches (what the operators merge into windows)."""
        state = cls(partial.metric_type, partial.count, partial.sum, partial.min, partial.max,
                    partial.last, partial.last_event_ms)  # fmt: skip
        merger.add(state.sketches, partial.metric_type, partial.sketch, partial.hdr_bucket,
                   partial.hdr_count)  # fmt: skip
        return state

    def merge(self, other: WindowState, merger: SketchMerger) -> None:
        self.metric_type = min(self.metric_type, other.metric_type)
        self.count += other.count
        self.sum += other.sum
        self.min = min(self.min, other.min)
        self.max = max(self.max, other.max)
        if other.last_event_ms > self.last_event_ms:
            self.last, self.last_event_ms = other.last, other.last_event_ms
        merger.absorb(self.sketches, other.sketches)


@dataclass(frozen=True, slots=True)
class StoredWindow:
    """What ``window_results`` holds for a window, minus revision and emission time."""

    metric_type: str
    count: int
    sum: float | None
    min: float | None
    max: float | None
    last: float | None
    is_final: bool
    late_events: int
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    p999: float | None = None
    distinct_count: float | None = None
    sketch: bytes | None = None
    hdr_histogram: str | None = None
    histogram: tuple[tuple[int, int], ...] = ()
    """The ``window_histograms`` rows: (bucket, count) per non-empty bucket, by bucket."""
    early_as_of: int | None = None
    """An early row's tick (``window_results.early_as_of``); None on every other row."""

    def same_values(self, other: StoredWindow) -> bool:
        """Whether the store would see no change of value (``_VALUES``, not finality, late
        events or early marks)."""
        neutral = {"is_final": False, "late_events": 0, "early_as_of": None}
        return replace(self, **neutral) == replace(other, **neutral)  # type: ignore[arg-type]


@dataclass(frozen=True, slots=True)
class LatePartial:
    window_name: str
    metric: str
    tags: str
    window_start_ms: int
    window_end_ms: int
    receiver: str
    pane_start_ms: int
    count: int


def windows_containing(window: WindowSpec, event_ms: int) -> list[tuple[int, int]]:
    """Every ``[start, end)`` of ``window`` that contains ``event_ms`` (one for tumbling)."""
    if window.kind not in ("tumbling", "hopping"):
        raise NotImplementedError(f"reference windower: kind {window.kind!r}")
    assert window.size_ms is not None
    size = window.size_ms
    step = window.hop_ms if window.kind == "hopping" and window.hop_ms else size
    latest = event_ms - (event_ms - window.offset_ms) % step
    return [(start, start + size) for start in range(latest - size + step, latest + 1, step)]


@dataclass(slots=True)
class SessionState:
    start: int
    end: int
    state: WindowState


def series_keys(window: WindowSpec) -> tuple[str, ...]:
    """``group_by``, plus the ``key`` tag of a session window."""
    if window.kind == "session" and window.key and window.key not in window.group_by:
        return (*window.group_by, window.key)
    return window.group_by


def project_tags(tags_json: str, group_by: tuple[str, ...]) -> str:
    """Keep the ``group_by`` keys, in the sorted order ingest wrote them."""
    if not group_by:
        return "{}"
    tags = json.loads(tags_json)
    kept = {k: v for k, v in tags.items() if k in group_by}
    return json.dumps(kept, separators=(",", ":"))


def merge_session(
    series: list[SessionState], t: int, own: WindowState, gap: int, merger: SketchMerger
) -> None:
    """Add an on-time partial at ``t`` to a series' sessions: it opens ``[t, t + gap)`` and
    absorbs, by start (the operator's order), every session it touches."""
    touched = [s for s in series if s.start - gap <= t <= s.end]
    merged = SessionState(t, t + gap, own)
    for session in sorted(touched, key=lambda s: s.start):
        series.remove(session)
        merged.start = min(merged.start, session.start)
        merged.end = max(merged.end, session.end)
        merged.state.merge(session.state, merger)
    series.append(merged)


def slide(
    panes: dict[int, WindowState],
    windows: dict[int, WindowState],
    t: int,
    own: WindowState,
    *,
    size: int,
    pane: int,
    deadline: int | None,
    late: Callable[[int], None] | None,
    merger: SketchMerger,
) -> None:
    """Add a partial at ``t`` to a series' sliding panes and windows. A window whose ``end <=
    deadline`` is final: the partial is recorded ``late`` against it instead (against its left
    window if every window that could hold it is final). ``deadline`` None: nothing is late."""

    def final(end: int) -> bool:
        return deadline is not None and end <= deadline

    def build(start: int) -> WindowState:
        state = WindowState(own.metric_type)
        for u in sorted(panes):
            if start <= u < start + size:
                state.merge(panes[u], merger)
        return state

    if final(t + size):
        assert late is not None
        late(t + pane - size)  # every window that could hold it is final
        return
    panes.setdefault(t, WindowState(own.metric_type)).merge(own, merger)
    starts = {u + pane - size for u in panes} | {u + pane for u in panes}
    for start in sorted(s for s in starts if s <= t < s + size):
        if final(start + size):
            assert late is not None
            late(start)  # a final window is never changed
        elif start in windows:
            windows[start].merge(own, merger)
        else:
            windows[start] = build(start)
    right = t + pane
    if right not in windows and any(right <= u < right + size for u in panes):
        windows[right] = build(right)


@dataclass
class ReferenceWindower:
    config: PipelineConfig
    windows: dict[WindowKey, WindowState] = field(default_factory=dict)
    late: list[LatePartial] = field(default_factory=list)
    # Every partial, late or not: what `streamgauge replay` recomputes a final window from.
    replayed: dict[WindowKey, WindowState] = field(default_factory=dict)
    _heartbeats: dict[str, tuple[int, bool]] = field(default_factory=dict)
    # The watermark each window's query committed after the last feed (its floor).
    _committed: dict[str, int] = field(default_factory=dict)
    # Session windows: the sessions of each (window name, metric, tags), never evicted.
    sessions: dict[tuple[str, str, str], list[SessionState]] = field(default_factory=dict)
    # Sliding windows, per (window name, metric, tags): the kept partials merged per event
    # time (panes), and the windows by start; never evicted.
    sliding_panes: dict[tuple[str, str, str], dict[int, WindowState]] = field(
        default_factory=dict
    )
    sliding: dict[tuple[str, str, str], dict[int, WindowState]] = field(default_factory=dict)
    # Session and sliding windows, per (window name, metric, tags): every partial, late or
    # not, with its place in the log (``LOG_ORDER``) and event time: what replay recomputes.
    series_log: dict[tuple[str, str, str], list[tuple[tuple[Any, ...], int, PanePartial]]] = (
        field(default_factory=dict)
    )
    merger: SketchMerger = field(init=False)
    # Early emission: what window_results holds per window as the batches publish it, and the
    # rows each feed (micro-batch) gave a new revision. Tracked when a window has early_every
    # (or when asked): it needs the rows after every feed.
    track_emissions: bool = False
    published: dict[WindowKey, StoredWindow] = field(default_factory=dict)
    emissions: list[dict[WindowKey, StoredWindow]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.merger = SketchMerger(self.config.sketches)
        if any(w.early_every_ms is not None for w in self.config.windows):
            self.track_emissions = True

    def feed_all(self, segments: Iterable[Segment]) -> None:
        for segment in segments:
            self.feed(segment)

    def feed(self, segment: Segment) -> None:
        """One micro-batch: ``segment``'s partials, then its heartbeat."""
        prior_ms, _ = self._heartbeats.get(segment.receiver, (0, False))
        for partial in segment.partials:
            for window in self.config.windows:
                if window.kind in ("tumbling", "hopping") and window.matches(partial.metric):
                    self._assign(window, segment, prior_ms, partial)
        in_event_order = sorted(
            segment.partials, key=lambda p: merge_key(p, min(p.pane_start_ms, segment.heartbeat_ms))
        )
        for window in self.config.windows:
            if window.kind in ("session", "sliding"):
                for partial in in_event_order:
                    if window.matches(partial.metric):
                        self._log_for_replay(window, segment, prior_ms, partial)
            if window.kind == "session":
                for partial in in_event_order:
                    if window.matches(partial.metric):
                        self._sessionize(window, segment, prior_ms, partial)
            if window.kind == "sliding":
                for partial in in_event_order:
                    if window.matches(partial.metric):
                        self._slide(window, segment, prior_ms, partial)
        self._heartbeats[segment.receiver] = (segment.heartbeat_ms, segment.closed)
        self._commit_watermarks()
        if self.track_emissions:
            self.emissions.append(self._publish())

    def _publish(self) -> dict[WindowKey, StoredWindow]:
        """The store's commit of one batch: on-time, final and early rows; what changed."""
        emitted: dict[WindowKey, StoredWindow] = {}
        late_samples = self._late_samples()
        states = self._states()
        for key in [k for k in self.published if k not in states]:
            del self.published[key]  # a retracted session
        for key, state in states.items():
            window = self.config.window(key[0])
            watermark = self.watermark_ms(window)
            if watermark is None:
                continue
            before = self.published.get(key)
            start, end = key[3], key[4]
            if end <= watermark:
                final = end + window.allowed_lateness_ms <= watermark
                row = self._row(key, state, final, late_samples)
                self.published[key] = row
                if (before is None or before.early_as_of is not None
                        or before.is_final != final or not before.same_values(row)):  # fmt: skip
                    emitted[key] = row
                continue
            every = window.early_every_ms
            if every is None or watermark - start < every:
                continue
            tick = start + (watermark - start) // every * every
            row = replace(self._row(key, state, False, late_samples), early_as_of=tick)
            if before is None or (before.early_as_of is not None and before.early_as_of < tick
                                  and not before.same_values(row)):  # fmt: skip
                self.published[key] = emitted[key] = row
        return emitted

    def _assign(
        self, window: WindowSpec, segment: Segment, prior_ms: int, partial: PanePartial
    ) -> None:
        event_ms = min(partial.pane_start_ms, segment.heartbeat_ms)
        for start, end in windows_containing(window, event_ms):
            self._assign_one(window, segment, prior_ms, partial, start, end)

    def _assign_one(
        self, window: WindowSpec, segment: Segment, prior_ms: int, partial: PanePartial,
        start: int, end: int,
    ) -> None:  # fmt: skip
        tags = project_tags(partial.tags, window.group_by)
        key = (window.name, partial.metric, tags, start, end)
        self.replayed.setdefault(key, WindowState(partial.metric_type)).merge(
            WindowState.of(partial, self.merger), self.merger
        )
        if end + window.allowed_lateness_ms <= self._closed_before(window, prior_ms):
            self.late.append(
                LatePartial(
                    window.name, partial.metric, tags, start, end, segment.receiver,
                    partial.pane_start_ms, partial.count,
                )
            )  # fmt: skip
            return
        state = self.windows.get(key)
        if state is None:
            state = self.windows[key] = WindowState(partial.metric_type)
        state.merge(WindowState.of(partial, self.merger), self.merger)

    def _sessionize(
        self, window: WindowSpec, segment: Segment, prior_ms: int, partial: PanePartial
    ) -> None:
        assert window.gap_ms is not None
        gap, lateness = window.gap_ms, window.allowed_lateness_ms
        closed_before = self._closed_before(window, prior_ms)
        t = min(partial.pane_start_ms, segment.heartbeat_ms)
        tags = project_tags(partial.tags, series_keys(window))
        series = self.sessions.setdefault((window.name, partial.metric, tags), [])

        def late(start: int, end: int) -> None:
            self.late.append(
                LatePartial(window.name, partial.metric, tags, start, end, segment.receiver,
                            partial.pane_start_ms, partial.count)
            )  # fmt: skip

        if t + gap + lateness <= closed_before:
            late(t, t + gap)  # its own session would already be final
            return
        touched = [s for s in series if s.start - gap <= t <= s.end]
        final = [s for s in touched if s.end + lateness <= closed_before]
        if final:
            first = min(final, key=lambda s: s.start)
            late(first.start, first.end)  # reaches into a final session: never reopened
            return
        merge_session(series, t, WindowState.of(partial, self.merger), gap, self.merger)

    def _slide(
        self, window: WindowSpec, segment: Segment, prior_ms: int, partial: PanePartial
    ) -> None:
        assert window.size_ms is not None
        size, pane = window.size_ms, self.config.pane_ms
        deadline = self._closed_before(window, prior_ms) - window.allowed_lateness_ms
        t = min(partial.pane_start_ms, segment.heartbeat_ms)
        tags = project_tags(partial.tags, window.group_by)
        series = (window.name, partial.metric, tags)

        def late(start: int) -> None:
            self.late.append(
                LatePartial(window.name, partial.metric, tags, start, start + size,
                            segment.receiver, partial.pane_start_ms, partial.count)
            )  # fmt: skip

        slide(
            self.sliding_panes.setdefault(series, {}), self.sliding.setdefault(series, {}),
            t, WindowState.of(partial, self.merger), size=size, pane=pane, deadline=deadline,
            late=late, merger=self.merger,
        )  # fmt: skip

    def _log_for_replay(
        self, window: WindowSpec, segment: Segment, prior_ms: int, partial: PanePartial
    ) -> None:
        t = min(partial.pane_start_ms, segment.heartbeat_ms)
        tags = project_tags(partial.tags, series_keys(window))
        place = (prior_ms, segment.heartbeat_ms, t, segment.receiver, *merge_key(partial, t)[1:])
        self.series_log.setdefault((window.name, partial.metric, tags), []).append(
            (place, t, partial)
        )

    def _replay_series(self, states: dict[WindowKey, WindowState]) -> None:
        """``streamgauge replay`` over all time, for session and sliding windows.

        Per series with late partials, every partial (late ones included) in log order, with
        no lateness cut. A final recomputed session holding a late partial replaces the
        stored sessions inside it; a final recomputed sliding window is published when it
        holds a late partial or starts just after one (``t + p``: a window only a late pane
        defines, which holds no late partial itself).
        """
        late_at: dict[tuple[str, str, str], list[int]] = {}
        for late in self.late:
            late_at.setdefault((late.window_name, late.metric, late.tags), []).append(
                late.pane_start_ms
            )
        for series, logged in self.series_log.items():
            times = late_at.get(series)
            window = self.config.window(series[0])
            watermark = self.watermark_ms(window)
            if not times or watermark is None:
                continue
            lateness = window.allowed_lateness_ms
            ordered = [(t, partial) for _, t, partial in sorted(logged, key=lambda x: x[0])]
            if window.kind == "session":
                assert window.gap_ms is not None
                sessions: list[SessionState] = []
                for t, partial in ordered:
                    merge_session(sessions, t, WindowState.of(partial, self.merger),
                                  window.gap_ms, self.merger)  # fmt: skip
                for r in sessions:
                    if r.end + lateness > watermark or not any(r.start <= t < r.end for t in times):
                        continue
                    for key in [k for k in states if k[:3] == series and r.start <= k[3]
                                and k[4] <= r.end]:  # fmt: skip
                        del states[key]
                    states[(*series, r.start, r.end)] = r.state
                continue
            assert window.size_ms is not None
            size, pane = window.size_ms, self.config.pane_ms
            panes: dict[int, WindowState] = {}
            windows: dict[int, WindowState] = {}
            for t, partial in ordered:
                slide(panes, windows, t, WindowState.of(partial, self.merger), size=size,
                      pane=pane, deadline=None, late=None, merger=self.merger)  # fmt: skip
            for start, state in windows.items():
                end = start + size
                if end + lateness > watermark:
                    continue
                if any(start <= t < end or start == t + pane for t in times):
                    states[(*series, start, end)] = state

    def watermark_ms(self, window: WindowSpec) -> int | None:
        """``window``'s watermark as committed by the last feed (None before any heartbeat)."""
        return self._committed.get(window.name)

    def _commit_watermarks(self) -> None:
        """After a feed: each window's ``W`` from the receivers' heartbeats, never below the
        one committed before (the job's ``pipeline_state`` floor)."""
        heartbeat = receivers_heartbeat_ms(
            {r: {"heartbeat_ms": hb, "closed": closed} for r, (hb, closed) in
             self._heartbeats.items()}
        )  # fmt: skip
        if heartbeat is None:
            return
        for window in self.config.windows:
            watermark = heartbeat - window.watermark_delay_ms
            before = self._committed.get(window.name)
            self._committed[window.name] = watermark if before is None else max(before, watermark)

    def _closed_before(self, window: WindowSpec, prior_ms: int) -> int:
        """Windows (sessions, sliding windows) with ``end + allowed_lateness`` at or before
        this were final before the partial's segment came: by its own stream's log (``prior
        heartbeat - delay``) or by the watermark already committed, whichever says more."""
        closed = prior_ms - window.watermark_delay_ms
        committed = self._committed.get(window.name)
        return closed if committed is None else max(closed, committed)

    def stored(self, *, after_replay: bool = False) -> dict[WindowKey, StoredWindow]:
        """The final state of ``window_results``, as the job stores it (NULLs by type).

        Windows whose end the watermark has not passed are not there (the job holds them, or
        they wait in ``window_pending``).

        ``after_replay``: as after `streamgauge replay` over all time, final windows include
        their late partials (and windows made only of late partials exist); for session and
        sliding windows see ``_replay_series``.
        """
        late_samples = self._late_samples()
        result: dict[WindowKey, StoredWindow] = {}
        states = self._states()
        if after_replay:
            for key, state in self.replayed.items():
                window = self.config.window(key[0])
                watermark = self.watermark_ms(window)
                if watermark is not None and key[4] + window.allowed_lateness_ms <= watermark:
                    states[key] = state
            self._replay_series(states)
        for key, state in states.items():
            window = self.config.window(key[0])
            watermark = self.watermark_ms(window)
            if watermark is None or key[4] > watermark:
                early = self.published.get(key)
                if early is not None and early.early_as_of is not None:
                    result[key] = early  # an open window published early: as it was then
                continue  # else not emitted yet: the watermark has not passed its end
            final = key[4] + window.allowed_lateness_ms <= watermark
            result[key] = self._row(key, state, final, late_samples)
        return result

    def _late_samples(self) -> dict[WindowKey, int]:
        late_samples: dict[WindowKey, int] = {}
        for late in self.late:
            key = (late.window_name, late.metric, late.tags, late.window_start_ms,
                   late.window_end_ms)  # fmt: skip
            late_samples[key] = late_samples.get(key, 0) + late.count
        return late_samples

    def _states(self) -> dict[WindowKey, WindowState]:
        """Every window's current state (tumbling, hopping, sessions, sliding)."""
        states = dict(self.windows)
        for (name, metric, tags), series in self.sessions.items():
            for session in series:
                states[(name, metric, tags, session.start, session.end)] = session.state
        for (name, metric, tags), by_start in self.sliding.items():
            size = self.config.window(name).size_ms
            assert size is not None
            for start, state in by_start.items():
                states[(name, metric, tags, start, start + size)] = state
        return states

    def _row(
        self, key: WindowKey, state: WindowState, final: bool, late_samples: dict[WindowKey, int]
    ) -> StoredWindow:
        """The ``window_results`` row of a window (NULLs by type)."""
        counter, gauge = state.metric_type == "c", state.metric_type == "g"
        is_set = state.metric_type == "s"
        columns = dict(
            zip(OUTPUT_COLUMNS, self.merger.columns(state.sketches, state.metric_type),
                strict=True)
        )  # fmt: skip
        histogram = tuple(
            zip(state.sketches.buckets.tolist(), state.sketches.counts.tolist(), strict=True)
        ) if state.metric_type in SKETCHED_TYPES else ()  # fmt: skip
        return StoredWindow(
            metric_type=state.metric_type,
            count=state.count,
            sum=None if gauge or is_set else state.sum,
            min=None if counter or is_set else state.min,
            max=None if counter or is_set else state.max,
            last=state.last if gauge else None,
            is_final=final,
            late_events=late_samples.get(key, 0),
            **{name: columns[name] for name in OUTPUT_COLUMNS},
            histogram=histogram,
        )
