"""``streamgauge top``: the heaviest metrics and series right now, read from the segment log.

The receivers count lines in total, not per metric, but every segment they write holds one
row (a *partial*) per series and pane they combined in that 250 ms roll, with the number of
samples in it. So the last ``seconds`` of segments of every stream say, per metric and per
series: samples/s (a line with three values is three samples), partials/s (rows the window
job reads: what a series costs downstream), how many series the metric has, and how many
distinct values each tag key takes (the key that makes the series). The cardinality guard's
side comes from the receivers (``ingest/<receiver>.json``: active series, lines folded into
overflow series since start) and the limits from ``run.json``; overflow series in the log
(tag ``streamgauge_overflow:true`` or ``streamgauge.overflow.<type>``) are shown as such.

Timeline, ``seconds = 2``, rolls every 250 ms (segments by heartbeat)::

    stream udp-0  ... |s41|s42|s43|s44|s45|s46|s47|s48|s49|   (heartbeats, receive clock)
                          ^horizon = now - 2 s               ^now
                          s42..s49 are read; the rates divide by now - horizon

The guard's limits are per receiver process, and series are counted here over all streams
together: with ``--receivers N`` a series sent to several receivers counts once.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamgauge.operator.snapshot import IngestTotals, read_ingest, read_running
from streamgauge.operator.table import aligned

OVERFLOW_TAG_KEY = "streamgauge_overflow"
#: The columns of a segment ``top`` reads (a series, and the samples in its partial).
SERIES_COLUMNS = ("metric", "metric_type", "tags", "count")
SHARED_OVERFLOW_PREFIX = "streamgauge.overflow."


@dataclass(slots=True)
class SeriesLoad:
    metric: str
    metric_type: str
    tags: str  # canonical JSON, as in the log
    samples: int = 0
    partials: int = 0


@dataclass(slots=True)
class MetricLoad:
    metric: str
    metric_type: str
    samples: int = 0
    partials: int = 0
    series: int = 0
    overflow_samples: int = 0
    tag_values: dict[str, set[str]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TopReport:
    """What ``top`` found: per metric and per series, over ``span_ms`` of the log."""

    span_ms: int
    segments: int
    streams: int
    metrics: list[MetricLoad]
    series: list[SeriesLoad]
    totals: IngestTotals
    max_series: int | None
    max_series_per_metric: int | None

    def per_s(self, count: int) -> float:
        return count * 1000 / self.span_ms if self.span_ms > 0 else 0.0

    def to_json(self, limit: int) -> dict[str, Any]:
        return {
            "span_ms": self.span_ms,
            "segments": self.segments,
            "streams": self.streams,
            "receivers": {
                "lines": self.totals.lines,
                "series_active": self.totals.series_active,
                "max_series": self.max_series,
                "max_series_per_metric": self.max_series_per_metric,
                "cardinality_limited": self.totals.cardinality_limited,
            },
            "metrics": [
                {
                    "metric": m.metric, "metric_type": m.metric_type,
                    "samples_per_s": round(self.per_s(m.samples), 3),
                    "partials_per_s": round(self.per_s(m.partials), 3),
                    "series": m.series,
                    "overflow_samples_per_s": round(self.per_s(m.overflow_samples), 3),
                    "tag_values": {k: len(v) for k, v in sorted(m.tag_values.items())},
                }
                for m in self.metrics[:limit]
            ],
            "series": [
                {
                    "metric": s.metric, "metric_type": s.metric_type, "tags": json.loads(s.tags),
                    "samples_per_s": round(self.per_s(s.samples), 3),
                    "partials_per_s": round(self.per_s(s.partials), 3),
                }
                for s in self.series[:limit]
            ],
        }  # fmt: skip


def collect(data_dir: Path, spool: str, seconds: float, now_ms: int | None = None) -> TopReport:
    """Reads the segments written in the last ``seconds`` (by heartbeat) of every stream."""
    import pyarrow as pa

    from streamgauge.ingest.log import list_receivers, list_segments, read_heartbeat, read_segment

    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    horizon = now_ms - round(seconds * 1000)
    earliest = now_ms
    batches: list[pa.RecordBatch] = []
    segments = streams = 0
    for receiver in list_receivers(spool):
        streams += 1
        listed = list_segments(spool, receiver)
        covered_from = None
        for info in reversed(listed):  # newest first, until one is older than the horizon
            try:
                heartbeat = read_heartbeat(info).heartbeat_ms
            except (OSError, ValueError):  # removed by retention meanwhile
                continue
            if heartbeat <= horizon:
                covered_from = horizon
                break
            covered_from = heartbeat if covered_from is None else min(covered_from, heartbeat)
            segments += 1
            batches += [batch.select(SERIES_COLUMNS) for batch in read_segment(info)]
        if covered_from is not None:
            earliest = min(earliest, covered_from)
    by_series = _per_series(batches)
    by_metric: dict[tuple[str, str], MetricLoad] = {}
    for load in by_series:
        metric = by_metric.setdefault(
            (load.metric, load.metric_type), MetricLoad(load.metric, load.metric_type))
        metric.samples += load.samples
        metric.partials += load.partials
        metric.series += 1
        tag_set: dict[str, str] = json.loads(load.tags) if load.tags else {}
        if OVERFLOW_TAG_KEY in tag_set or load.metric.startswith(SHARED_OVERFLOW_PREFIX):
            metric.overflow_samples += load.samples
        for tag_key, value in tag_set.items():
            metric.tag_values.setdefault(tag_key, set()).add(value)
    running = read_running(data_dir) or {}
    limits = running.get("cardinality") or {}
    return TopReport(
        span_ms=max(1, now_ms - earliest) if by_series else round(seconds * 1000),
        segments=segments, streams=streams,
        metrics=sorted(by_metric.values(), key=lambda m: (-m.samples, -m.partials, m.metric)),
        series=sorted(by_series, key=lambda s: (-s.samples, -s.partials, s.metric)),
        totals=IngestTotals.of(read_ingest(data_dir), time.monotonic()),
        max_series=limits.get("max_series"),
        max_series_per_metric=limits.get("max_series_per_metric"),
    )  # fmt: skip


def _per_series(batches: list[Any]) -> list[SeriesLoad]:
    """Samples and partials per series, added up by Arrow: at 100k series a second of
    segments holds ~400k partials, too many for a Python loop a person waits for."""
    import pyarrow as pa

    if not batches:
        return []
    totals = pa.Table.from_batches(batches).group_by(list(SERIES_COLUMNS[:3])).aggregate(
        [("count", "sum"), ("count", "count")])
    names = ("metric", "metric_type", "tags", "count_sum", "count_count")
    columns = [totals.column(name).to_pylist() for name in names]
    return [
        SeriesLoad(metric, kind, tags, int(samples), int(partials))
        for metric, kind, tags, samples, partials in zip(*columns, strict=True)
    ]


def render(report: TopReport, limit: int) -> str:
    """Two tables, heaviest first: metrics, then series."""
    totals = report.totals
    guard = f"{totals.series_active:,} active series"
    if report.max_series:
        guard += f" (limit {report.max_series:,} per receiver)"
    head = [
        f"last {report.span_ms / 1000:.1f} s of the segment log: {report.segments:,} segments "
        f"of {report.streams} stream(s), {len(report.series):,} series in "
        f"{len(report.metrics):,} metrics",
        f"receivers: {guard}; {totals.cardinality_limited:,} lines folded into overflow "
        "series since start",
    ]
    if not report.metrics:
        return "\n".join([*head, "", "nothing received in that time"]) + "\n"
    per_metric_limit = report.max_series_per_metric
    metric_rows = [
        (
            m.metric, m.metric_type, f"{report.per_s(m.samples):,.1f}",
            f"{report.per_s(m.partials):,.1f}", f"{m.series:,}",
            _share(m.series, per_metric_limit),
            f"{report.per_s(m.overflow_samples):,.1f}" if m.overflow_samples else "",
            ", ".join(f"{k} {len(v):,}" for k, v in
                      sorted(m.tag_values.items(), key=lambda kv: -len(kv[1]))),
        )
        for m in report.metrics[:limit]
    ]  # fmt: skip
    series_rows = [
        (s.metric, s.metric_type, _tags_text(s.tags), f"{report.per_s(s.samples):,.1f}",
         f"{report.per_s(s.partials):,.1f}")
        for s in report.series[:limit]
    ]  # fmt: skip
    limit_head = "OF LIMIT" if per_metric_limit is None else f"OF {per_metric_limit:,}"
    return "\n".join([
        *head, "",
        aligned(("METRIC", "TYPE", "SAMPLES/S", "PARTIALS/S", "SERIES", limit_head,
                 "OVERFLOW/S", "TAG KEYS (DISTINCT VALUES)"), metric_rows),
        "",
        aligned(("METRIC", "TYPE", "TAGS", "SAMPLES/S", "PARTIALS/S"), series_rows),
    ]) + "\n"  # fmt: skip


def _share(series: int, limit: int | None) -> str:
    if not limit:
        return ""
    return f"{100 * series / limit:.1f}%"


def _tags_text(tags: str) -> str:
    parsed: dict[str, str] = json.loads(tags) if tags else {}
    return ",".join(f"{k}:{v}" for k, v in parsed.items())
