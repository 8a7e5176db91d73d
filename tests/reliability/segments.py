"""Hand-written segment logs for the reliability tests: chosen heartbeats per receiver, and
the same segments kept for the reference windower."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa

from streamgauge.configs import PipelineConfig
from streamgauge.ingest.log import SEGMENT_SCHEMA, Heartbeat, SegmentWriter
from streamgauge.windows.reference import PanePartial, ReferenceWindower, Segment

T0 = 1_700_000_000_000


class Spool:
    """Writes segments with chosen heartbeats and keeps what it wrote for the reference."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.writers: dict[str, SegmentWriter] = {}
        self.written: list[Segment] = []

    def segment(self, receiver: str, beat_s: int, values: dict[str, float], *,
                closed: bool = False) -> None:  # fmt: skip
        """One segment at heartbeat ``T0 + beat_s``: per metric, one partial in the pane
        before (metrics starting with ``c`` are counters, the others timers)."""
        pane_ms = T0 + (beat_s - 1) * 1000
        partials = tuple(
            PanePartial(metric, "c" if metric.startswith("c") else "ms", "{}", pane_ms, 1,
                        value, value, value, value, pane_ms, pane_ms, pane_ms)
            for metric, value in sorted(values.items())
        )  # fmt: skip
        writer = self.writers.get(receiver) or SegmentWriter(self.path, receiver, fsync=False)
        self.writers[receiver] = writer
        writer.append(_batch(partials), Heartbeat(T0 + beat_s * 1000, closed))
        self.written.append(Segment(receiver, T0 + beat_s * 1000, closed, partials))

    def open_heartbeat_ms(self) -> int:
        """The minimum over open receivers' newest heartbeats (the latest if all closed)."""
        newest: dict[str, Segment] = {}
        for segment in self.written:
            newest[segment.receiver] = segment
        beats = [s.heartbeat_ms for s in newest.values() if not s.closed]
        return min(beats) if beats else max(s.heartbeat_ms for s in newest.values())

    def expected(self, config: PipelineConfig) -> dict[tuple[Any, ...], dict[str, Any]]:
        """``window_results`` as the reference windower computes it from what was written, fed
        in heartbeat order (how a job that reads the streams together sees them: a receiver
        written after another is not one that joined after it):
        (window, metric, start ms) → end ms, count, sum, min, max, is_final."""
        windower = ReferenceWindower(config)
        windower.feed_all(sorted(self.written, key=lambda segment: segment.heartbeat_ms))
        return {
            (name, metric, start): {"end_ms": end, "count": w.count, "sum": w.sum,
                                    "min": w.min, "max": w.max, "is_final": w.is_final}
            for (name, metric, _tags, start, end), w in windower.stored().items()
        }  # fmt: skip


def _batch(partials: tuple[PanePartial, ...]) -> pa.RecordBatch:
    """The partials in SEGMENT_SCHEMA; columns the reference does not model (sketches) NULL."""
    known = set(PanePartial.__slots__)
    columns = [
        pa.array([getattr(p, f.name) for p in partials], f.type) if f.name in known
        else pa.nulls(len(partials), f.type)
        for f in SEGMENT_SCHEMA
    ]  # fmt: skip
    return pa.RecordBatch.from_arrays(columns, schema=SEGMENT_SCHEMA)


STORED_SQL = (
    "select window_name, metric, (extract(epoch from window_start) * 1000)::bigint as start_ms, "
    "(extract(epoch from window_end) * 1000)::bigint as end_ms, count, sum, min, max, is_final "
    "from window_results where config_name = %s"
)


def keyed(rows: list[dict[str, Any]]) -> dict[tuple[Any, ...], dict[str, Any]]:
    """Rows of ``STORED_SQL`` in the shape of ``Spool.expected``."""
    return {
        (r["window_name"], r["metric"], r["start_ms"]): {
            k: r[k] for k in ("end_ms", "count", "sum", "min", "max", "is_final")
        }
        for r in rows
    }
