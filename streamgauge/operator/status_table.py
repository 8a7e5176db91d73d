"""``streamgauge status`` for a person: the status document (``snapshot.status_document``) as
sections of aligned tables.

Sections: the daemon (what listens where), receivers (cumulative counts; lines/s between two
readings with ``--watch``), clients (per sender: what arrived, and for a DogStatsD client
with telemetry what fraction of what it sent), segment streams, windows (watermark, lag,
pending, published, last published, late, the log's segments its query has yet to read, and a
catch-up's progress), the store, and recent rejects by reason with a
sample line each.
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Any

from streamgauge.operator.snapshot import IngestTotals
from streamgauge.operator.table import aligned
from streamgauge.operator.terminal import catch_up_text, duration

#: Sample lines shown per reject reason (the receiver keeps the last 32 of all reasons).
SAMPLES_PER_REASON = 1


def render(
    document: dict[str, Any], *, now_ms: int | None = None, earlier: dict[str, Any] | None = None,
    interval_s: float | None = None,
) -> str:  # fmt: skip
    """The document as text. ``earlier`` (the previous reading, ``interval_s`` before) adds
    each receiver's lines/s."""
    now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
    sections = [_daemon(document), _receivers(document, earlier, interval_s),
                _clients(document), _streams(document, now_ms), _windows(document),
                _rejects(document)]  # fmt: skip
    return "\n\n".join(s for s in sections if s) + "\n"


def _daemon(document: dict[str, Any]) -> str:
    running = document.get("running")
    if running is None:
        return f"no daemon running on {document['data_dir']} (no run.json)"
    pids = ", ".join(str(p) for p in running.get("ingest_pids", [running.get("ingest_pid")]))
    rows = [
        ("config", f"{running.get('config_name')} ({running.get('config')})"),
        ("udp", running.get("udp")),
        ("store", running.get("postgres_url")),
        ("spark ui", running.get("spark_ui")),
        ("data", running.get("data_dir")),
        ("pids", f"daemon {running.get('pid')}, receivers {pids}"),
    ]
    line = document.get("status_line")
    if line is not None:
        rows.append(("now", f"{line['text']} (at {_clock(line['at_ms'])} UTC)"))
    windows = document.get("windows")
    if isinstance(windows, str):
        rows.append(("store status", windows))
    return "\n".join(f"{name:<13}{value}" for name, value in rows)


def _receivers(
    document: dict[str, Any], earlier: dict[str, Any] | None, interval_s: float | None
) -> str:
    ingest: dict[str, dict[str, Any]] = document.get("ingest") or {}
    if not ingest:
        return ""
    before: dict[str, dict[str, Any]] = (earlier or {}).get("ingest") or {}
    limit = (document.get("running") or {}).get("cardinality", {}).get("max_series")
    rows = []
    for name, stats in ingest.items():
        totals = IngestTotals.of({name: stats}, 1.0)
        rate = None
        if name in before and interval_s:
            rate = IngestTotals.of({name: stats}, interval_s).rate_from(
                IngestTotals.of({name: before[name]}, 0.0), "lines")
        rows.append((
            name, f"{totals.lines:,}", f"{totals.samples:,}", f"{totals.rejected:,}",
            f"{totals.series_active:,}", "" if not limit else f"{limit:,}",
            f"{totals.cardinality_limited:,}", f"{totals.kernel_drops:,}", f"{totals.refused:,}",
            duration(totals.segment_lag_ms),
        ) + (() if earlier is None else ("…" if rate is None else f"{rate:,.0f}",)))  # fmt: skip
    columns = ("RECEIVER", "LINES", "SAMPLES", "REJECTED", "SERIES", "LIMIT", "OVERFLOWED",
               "KERNEL DROPS", "REFUSED", "STORE LAG")  # fmt: skip
    # lines/s is the difference of two readings: with --watch, from the second one on
    return "receivers (since start)\n" + aligned(
        columns + (() if earlier is None else ("LINES/S",)), rows, indent="  ")


#: Clients shown, the most lines first (each receiver writes its STATS_CLIENTS busiest).
CLIENT_ROWS = 20


def completeness(telemetry: dict[str, Any] | None, sent: str = "metrics_sent",
                 received: str = "metrics_received") -> str:
    """What arrived of what a client said it sent, as a percentage; "unknown" without its
    telemetry (a plain StatsD client), never 100 %."""
    if not telemetry or not telemetry.get("reports") or not telemetry.get(sent):
        return "unknown"
    return f"{100.0 * float(telemetry[received] or 0) / float(telemetry[sent]):.1f}%"


def _clients(document: dict[str, Any]) -> str:
    ingest: dict[str, dict[str, Any]] = document.get("ingest") or {}
    found = [(receiver, client) for receiver, stats in ingest.items()
             for client in (stats.get("clients") or {}).get("clients", [])]  # fmt: skip
    if not found:
        return ""
    found.sort(key=lambda item: -int(item[1].get("lines", 0)))
    rows = []
    for receiver, client in found[:CLIENT_ROWS]:
        tags = client.get("tags") or {}
        library = " ".join(v for v in (tags.get("client"), tags.get("client_version")) if v)
        since = client.get("telemetry")
        dropped = sum((since or {}).get("packets_dropped", {}).values())
        rows.append((
            client["source"], library or "-", receiver, f"{client.get('datagrams', 0):,}",
            f"{client.get('lines', 0):,}", f"{sum(client.get('rejected', {}).values()):,}",
            f"{client.get('kernel_drops', 0):,}", completeness(client.get("last_report")),
            completeness(since), completeness(since, "packets_sent", "packets_received"),
            "" if since is None or not since.get("reports") else f"{dropped:,}",
        ))  # fmt: skip
    columns = ("SOURCE", "CLIENT", "RECEIVER", "DATAGRAMS", "LINES", "REJECTED",
               "KERNEL DROPS*", "COMPLETE (LAST)", "COMPLETE", "PACKETS", "CLIENT DROPS")
    return ("clients (since start; COMPLETE: metrics arrived / metrics the client's telemetry "
            "says it sent)\n" + aligned(columns, rows, indent="  ")
            + "\n  * dropped by the kernel while the client was sending: some may be others'")


def _streams(document: dict[str, Any], now_ms: int) -> str:
    spool: dict[str, dict[str, Any]] = document.get("spool") or {}
    if not spool:
        return "segment log: no streams yet"
    rows = []
    for name, stream in spool.items():
        beat = stream.get("heartbeat_ms")
        age = "" if beat is None else f"{_clock(beat)} ({duration(now_ms - beat)} ago)"
        state = "closed" if stream.get("closed") else "open"
        last = stream.get("last_sequence")
        rows.append((name, f"{stream.get('segments', 0):,}", "" if last is None else f"{last:,}",
                     age, state))  # fmt: skip
    return "segment log\n" + aligned(
        ("STREAM", "SEGMENTS", "LAST SEQ", "LAST HEARTBEAT", "STATE"), rows, indent="  ")


def _windows(document: dict[str, Any]) -> str:
    windows = document.get("windows")
    if windows is None:
        return ""
    if isinstance(windows, str):
        return f"windows: {windows}"
    if not windows:
        return "windows: no watermark yet (the window job has not finished a batch)"
    backlog = {late["window"]: late for late in document.get("catch_up") or ()}
    rows = [
        (
            f"{w['config_name']}.{w['window_name']}", _clock(w["watermark_ms"]),
            duration(w["watermark_lag_ms"]), f"{int(w['windows_pending']):,}",
            f"{int(w['windows_emitted']):,}", _clock_of(w.get("last_published_end")),
            f"{int(w['late_samples']):,}",
            _to_read(backlog.get(w["window_name"])),
        )
        for w in windows
    ]  # fmt: skip
    table = "windows\n" + aligned(
        ("WINDOW", "WATERMARK UTC", "LAG", "PENDING", "PUBLISHED", "LAST END UTC", "LATE",
         "LOG TO READ"),
        rows, indent="  ")  # fmt: skip
    behind = [f"  {catch_up_text(late)}" for late in backlog.values() if late["catching_up"]]
    return "\n".join([table, *behind])


def _to_read(late: dict[str, Any] | None) -> str:
    """The segments a window's query has yet to read ("" when the daemon did not say)."""
    return "" if late is None else f"{int(late['segments_to_do']):,} segments"


def _rejects(document: dict[str, Any]) -> str:
    ingest: dict[str, dict[str, Any]] = document.get("ingest") or {}
    counts = IngestTotals.of(ingest, 0.0).rejected_by_reason
    if not counts:
        return ""
    samples: dict[str, list[str]] = {}
    for stats in ingest.values():
        for sample in reversed(stats.get("reject_sample", [])):  # the newest first
            lines = samples.setdefault(sample["reason"], [])
            if len(lines) < SAMPLES_PER_REASON:
                lines.append(sample["line"])
    rows = [
        (reason, f"{n:,}", " / ".join(repr(line) for line in samples.get(reason, [])))
        for reason, n in sorted(counts.items(), key=lambda item: -item[1])
    ]
    return "rejected lines since start\n" + aligned(
        ("REASON", "LINES", "LAST SEEN"), rows, indent="  ")


def _clock(ms: int | None) -> str:
    if ms is None:
        return ""
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%H:%M:%S")


def _clock_of(value: Any) -> str:
    """A timestamp from the store (a datetime, or ISO text after a JSON round trip)."""
    if value is None:
        return ""
    if isinstance(value, str):
        value = dt.datetime.fromisoformat(value)
    return str(value.astimezone(dt.UTC).strftime("%H:%M:%S"))
