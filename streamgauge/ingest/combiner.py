"""Combine samples into pane partials before they reach the log.

Writing raw samples would make the log and Spark carry every datagram; combining per
(series, event-time pane) first makes both proportional to the number of active series
instead (DESIGN.md §3: "combine early, write small").

Partial per (metric, type, tags, pane):

=========  ===============================================================
counter    count of samples, sum scaled by 1/sample rate
gauge      last value (deltas applied to the series' current value), min, max
timer      count, sum, min, max (sketches and histograms come with the sketches slice)
=========  ===============================================================
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

from streamgauge.ingest.log import SEGMENT_SCHEMA
from streamgauge.ingest.protocol import Sample

SeriesKey = tuple[str, str, str]  # metric, metric type, canonical tags JSON


@dataclass(slots=True)
class Partial:
    count: int
    total: float
    minimum: float
    maximum: float
    last: float
    last_event_ms: int
    first_recv_ms: int
    last_recv_ms: int


def canonical_tags(tags: tuple[tuple[str, str], ...]) -> str:
    """Sorted-key JSON: the same tag set always gives the same series key and jsonb value."""
    return json.dumps(dict(tags), sort_keys=True, separators=(",", ":"))


class PaneCombiner:
    """Accumulates partials for one receiver until they are drained into a segment.

    Not thread-safe: one receiver loop owns it.
    """

    def __init__(self, pane_ms: int) -> None:
        if pane_ms <= 0:
            raise ValueError(f"pane_ms must be positive, got {pane_ms}")
        self._pane_ms = pane_ms
        self._partials: dict[tuple[SeriesKey, int], Partial] = {}
        # Gauges keep their value across panes (StatsD semantics: "+3" moves the current value).
        self._gauges: dict[SeriesKey, float] = {}
        self._types: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._partials)

    def type_conflicts(self, sample: Sample) -> bool:
        """True if the name was first seen with another type (one name, one meaning)."""
        known = self._types.setdefault(sample.metric, sample.metric_type)
        return known != sample.metric_type

    def forget(self, metric: str, metric_type: str, tags: tuple[tuple[str, str], ...]) -> None:
        """Drop a series' carried state (the current gauge value) once it went idle, so that
        state stays bounded by the active series (see ``CardinalityGuard``)."""
        self._gauges.pop((metric, metric_type, canonical_tags(tags)), None)

    def add(self, sample: Sample, event_ms: int, recv_ms: int) -> None:
        key: SeriesKey = (sample.metric, sample.metric_type, canonical_tags(sample.tags))
        pane_start = event_ms - event_ms % self._pane_ms
        if sample.metric_type == "c":
            value = sample.value / sample.sample_rate
        elif sample.metric_type == "g":
            value = self._gauges.get(key, 0.0) + sample.value if sample.delta else sample.value
            self._gauges[key] = value
        else:
            value = sample.value
        partial = self._partials.get((key, pane_start))
        if partial is None:
            self._partials[(key, pane_start)] = Partial(
                1, value, value, value, value, event_ms, recv_ms, recv_ms
            )
            return
        partial.count += 1
        partial.total += value
        if value < partial.minimum:
            partial.minimum = value
        if value > partial.maximum:
            partial.maximum = value
        if event_ms >= partial.last_event_ms:
            partial.last = value
            partial.last_event_ms = event_ms
        partial.last_recv_ms = recv_ms

    def drain(self) -> pa.RecordBatch:
        """Hand over everything combined so far as one record batch and start afresh."""
        items = sorted(self._partials.items(), key=lambda item: (item[0][1], item[0][0]))
        self._partials = {}
        keys = [key for key, _ in items]
        partials = [partial for _, partial in items]
        columns = [
            pa.array([k[0][0] for k in keys], pa.string()),
            pa.array([k[0][1] for k in keys], pa.string()),
            pa.array([k[0][2] for k in keys], pa.string()),
            pa.array([k[1] for k in keys], pa.int64()),
            pa.array([p.count for p in partials], pa.int64()),
            pa.array([p.total for p in partials], pa.float64()),
            pa.array([p.minimum for p in partials], pa.float64()),
            pa.array([p.maximum for p in partials], pa.float64()),
            pa.array([p.last for p in partials], pa.float64()),
            pa.array([p.last_event_ms for p in partials], pa.int64()),
            pa.array([p.first_recv_ms for p in partials], pa.int64()),
            pa.array([p.last_recv_ms for p in partials], pa.int64()),
        ]
        return pa.RecordBatch.from_arrays(columns, schema=SEGMENT_SCHEMA)
