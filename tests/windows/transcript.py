"""One transcript format, two engines: the reference windower and Spark, held to the same
expected rows, so a change of semantics fails on both (``docs/development.md``, "Window
transcripts").

A transcript is YAML::

    name: stragglers_within_lateness
    config: |                       # a window config, exactly as users write it
      pane: 1s
      windows: [{name: w, kind: tumbling, size: 2s, watermark_delay: 1s, allowed_lateness: 1s}]
    segments:                       # in log order; each becomes one segment of its receiver
      - receiver: r0
        heartbeat: 2000             # ms after T0: "no event earlier than this any more"
        closed: false               # optional: the receiver shut down cleanly
        samples:                    # StatsD lines and their event time (ms after T0)
          - {at: 200, line: "a:1|c"}
        emits: []                   # optional: the rows this segment's micro-batch writes
    expect:
      windows:                      # every window row the store must hold, and nothing else
        - {window: w, metric: a, start: 0, count: 1, sum: 1.0, final: true, late_events: 0}
      late:                         # every late partial (optional)
        - {window: w, metric: a, start: 0, count: 1}
      after_replay:                 # optional: every window row after `streamgauge replay`
        - {window: w, metric: a, start: 0, count: 2, sum: 11.0, final: true}

Times are integer milliseconds after ``T0``; ``end`` (optional) is the window's exclusive end,
worth listing for session windows, whose end moves as they grow. ``after_replay`` lists the
rows the store must hold once `streamgauge replay` has run over all time (same fields): the
reference's ``stored(after_replay=True)`` must meet it, and so must the Spark job followed by
``replay``. Listed window fields other than
``window/metric/start`` are compared; ``tags`` defaults to ``{}``; ``p50``/``p90``/``p99``/
``p999``/``distinct_count`` may be listed too; ``early`` is an early row's tick
(``early_as_of``, ms after T0; null on every other row).

``emits`` (a window with ``early_every`` shows its running value there): once any segment
lists it, each segment is run as one micro-batch and the rows whose revision its batch changed
(early, on-time, revised, final) must be exactly those listed (none when the key is absent),
with the same fields compared as under ``expect.windows``.

The segments carry the combiner's sketch columns (t-digest, HDR buckets, HLL), as a receiver
writes them. The loader is strict:
unknown keys, heartbeats going backwards, unparsable lines or expectations naming an unknown
window are refused with every problem listed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from streamgauge.configs import ConfigError, PipelineConfig, parse_config
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import SEGMENT_SCHEMA, Heartbeat, SegmentWriter
from streamgauge.ingest.protocol import Reject, parse_line
from streamgauge.windows.reference import PanePartial, Segment

T0 = 1_700_000_000_000
_PARTIAL_FIELDS = frozenset(field.name for field in fields(PanePartial))
WINDOW_FIELDS = {
    "count", "sum", "min", "max", "last", "final", "late_events", "type", "end", "early",
}  # fmt: skip
SKETCH_FIELDS = {"p50", "p90", "p99", "p999", "distinct_count"}
"""Expectable sketch columns (compared by ``test_transcripts.check_sketches``' rules)."""


class TranscriptError(ValueError):
    pass


@dataclass(frozen=True)
class Transcript:
    name: str
    config: PipelineConfig
    segments: tuple[Segment, ...]
    expected_windows: tuple[dict[str, Any], ...]
    expected_late: tuple[dict[str, Any], ...] | None
    expected_emits: tuple[tuple[dict[str, Any], ...], ...] | None = None
    """Per segment, the rows its micro-batch writes (``emits``); None if no segment says."""
    expected_after_replay: tuple[dict[str, Any], ...] | None = None

    def write_spool(self, spool: Path) -> None:
        """Write the segments as a real segment log (same writer as the ingest tier)."""
        writers: dict[str, SegmentWriter] = {}
        for segment in self.segments:
            writer = writers.get(segment.receiver)
            if writer is None:
                writer = writers[segment.receiver] = SegmentWriter(spool, segment.receiver)
            heartbeat = Heartbeat(segment.heartbeat_ms, segment.closed)
            writer.append(_partials_batch(segment.partials), heartbeat)


def _partials_batch(partials: tuple[PanePartial, ...]) -> pa.RecordBatch:
    columns = {
        field.name: [getattr(p, field.name, None) for p in partials] for field in SEGMENT_SCHEMA
    }
    return pa.RecordBatch.from_pydict(columns, schema=SEGMENT_SCHEMA)


def _check_keys(where: str, found: dict[str, Any], allowed: set[str], problems: list[str]) -> None:
    for key in sorted(set(found) - allowed):
        problems.append(f"{where}: unknown key {key!r}")


def load_transcript(text: str, source: str) -> Transcript:
    """Parse and validate; every problem is reported at once."""
    problems: list[str] = []
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise TranscriptError(f"{source}: not YAML: {error}") from None
    if not isinstance(document, dict):
        raise TranscriptError(f"{source}: a transcript is a mapping")
    _check_keys("", document, {"name", "description", "config", "segments", "expect"}, problems)
    try:
        config = parse_config(
            str(document.get("config", "")),
            f"{source}:config",
            default_name=str(document.get("name", "transcript")),
        )
    except ConfigError as error:
        raise TranscriptError(f"{source}: config: {error}") from None

    segments: list[Segment] = []
    emits: list[tuple[dict[str, Any], ...]] = []
    any_emits = False
    names = {w.name for w in config.windows}
    last_heartbeat: dict[str, int] = {}
    for index, raw in enumerate(document.get("segments") or []):
        where = f"segments[{index}]"
        if not isinstance(raw, dict):
            problems.append(f"{where}: must be a mapping")
            continue
        _check_keys(where, raw, {"receiver", "heartbeat", "closed", "samples", "emits"},
                    problems)  # fmt: skip
        any_emits = any_emits or "emits" in raw
        emitted = tuple(raw.get("emits") or [])
        for emit_index, row in enumerate(emitted):
            _check_window_row(f"{where}.emits[{emit_index}]", row, names, problems)
        emits.append(emitted)
        receiver = str(raw.get("receiver", "r0"))
        heartbeat = raw.get("heartbeat")
        if not isinstance(heartbeat, int):
            problems.append(f"{where}.heartbeat: an integer number of ms after T0 is required")
            continue
        if heartbeat < last_heartbeat.get(receiver, 0):
            problems.append(
                f"{where}.heartbeat: {heartbeat} goes backwards for receiver {receiver!r} "
                f"(was {last_heartbeat[receiver]}): a heartbeat is a promise, never withdrawn"
            )
        last_heartbeat[receiver] = heartbeat
        combiner = PaneCombiner(config.pane_ms)
        for sample_index, sample in enumerate(raw.get("samples") or []):
            sample_where = f"{where}.samples[{sample_index}]"
            if not isinstance(sample, dict):
                problems.append(f"{sample_where}: must be a mapping {{at, line}}")
                continue
            _check_keys(sample_where, sample, {"at", "line"}, problems)
            at, line = sample.get("at"), sample.get("line")
            if not isinstance(at, int):
                problems.append(f"{sample_where}.at: an integer number of ms is required")
                continue
            parsed = parse_line(str(line).encode())
            if isinstance(parsed, Reject):
                problems.append(f"{sample_where}.line: {line!r} is rejected ({parsed.reason})")
                continue
            # transcripts hold metric lines only; an event or service check has no samples
            assert isinstance(parsed, list), f"{sample_where}.line: {line!r} is not a metric"
            for value in parsed:
                combiner.add(value, T0 + at, T0 + min(at, heartbeat))
        partials = tuple(
            PanePartial(**{k: v for k, v in row.items() if k in _PARTIAL_FIELDS})
            for row in combiner.drain().to_pylist()
        )
        segments.append(Segment(receiver, T0 + heartbeat, bool(raw.get("closed")), partials))

    expect = document.get("expect") or {}
    _check_keys("expect", expect, {"windows", "late", "after_replay"}, problems)
    listed: dict[str, list[dict[str, Any]]] = {"windows": [], "after_replay": []}
    for section, expected_rows in listed.items():
        for index, row in enumerate(expect.get(section) or []):
            _check_window_row(f"expect.{section}[{index}]", row, names, problems)
            expected_rows.append(row)
    expected_late = None
    if "late" in expect:
        expected_late = tuple(expect["late"] or [])
        for index, row in enumerate(expected_late):
            _check_keys(f"expect.late[{index}]", row,
                        {"window", "metric", "start", "tags", "count"}, problems)  # fmt: skip
    if problems:
        raise TranscriptError(f"{source}:\n  " + "\n  ".join(problems))
    return Transcript(
        str(document.get("name", source)),
        config,
        tuple(segments),
        tuple(listed["windows"]),
        expected_late,
        tuple(emits) if any_emits else None,
        tuple(listed["after_replay"]) if "after_replay" in expect else None,
    )


def _check_window_row(where: str, row: Any, names: set[str], problems: list[str]) -> None:
    if not isinstance(row, dict):
        problems.append(f"{where}: must be a mapping {{window, metric, start, ...}}")
        return
    _check_keys(where, row, {"window", "metric", "start", "tags"} | WINDOW_FIELDS
                | SKETCH_FIELDS, problems)  # fmt: skip
    if row.get("window") not in names:
        problems.append(f"{where}.window: {row.get('window')!r} is not a window of the config")


# -- the state both engines are compared on -------------------------------------------------

StateKey = tuple[str, str, str, int]  # window, metric, tags (canonical JSON), start ms after T0


def canonical_tags(tags: Any) -> str:
    if isinstance(tags, str):
        tags = json.loads(tags)
    return json.dumps(tags or {}, sort_keys=True, separators=(",", ":"))


def expected_state(
    transcript: Transcript, *, after_replay: bool = False
) -> dict[StateKey, dict[str, Any]]:
    rows = transcript.expected_after_replay if after_replay else transcript.expected_windows
    return expected_rows(rows or ())


def expected_rows(rows: tuple[dict[str, Any], ...]) -> dict[StateKey, dict[str, Any]]:
    """Listed window rows by key, with the fields they name."""
    state = {}
    for row in rows:
        key = (row["window"], row["metric"], canonical_tags(row.get("tags")), row["start"])
        state[key] = {k: v for k, v in row.items() if k in WINDOW_FIELDS}
    return state


def expected_sketches(
    transcript: Transcript, *, after_replay: bool = False
) -> dict[StateKey, dict[str, Any]]:
    """The sketch columns the transcript's expectations name, per window."""
    state = {}
    rows = transcript.expected_after_replay if after_replay else transcript.expected_windows
    for row in rows or ():
        key = (row["window"], row["metric"], canonical_tags(row.get("tags")), row["start"])
        state[key] = {k: v for k, v in row.items() if k in SKETCH_FIELDS}
    return state
