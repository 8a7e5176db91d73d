"""What a running daemon exposes about itself, read the way ``streamgauge status`` reads it.

Sources, all written by the daemon as it runs (nothing here recomputes what the pipeline
computes):

- ``<data-dir>/run.json``: where everything listens, the store URL, the PIDs, the limits;
- ``<data-dir>/ingest/<receiver>.json``: each receiver's cumulative counters (``IngestStats``,
  rewritten at every 250 ms roll), the same counts the ``streamgauge.ingest.*`` self-metrics
  carry through the pipeline;
- the store's ``pipeline_state`` (each window's watermark), ``window_results``,
  ``window_latest`` and ``late_events``;
- the segment log's streams (``describe_spool``).

Rates (lines/s) are differences between two readings of the cumulative counters
(``IngestTotals.rate_from``): one reading has none.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from streamgauge.redaction import redact_url

#: Per window: its watermark, how far it is behind now, and what is emitted, pending or late.
WINDOW_STATUS_SQL = """
WITH w AS (
    SELECT config_name, substr(key, length('watermark_ms:') + 1) AS window_name, value_ms
    FROM pipeline_state WHERE key LIKE 'watermark_ms:%'
)
SELECT w.config_name, w.window_name, w.value_ms AS watermark_ms,
       (extract(epoch from now()) * 1000)::bigint - w.value_ms AS watermark_lag_ms,
       (SELECT count(*) FROM window_results r
        WHERE (r.config_name, r.window_name) = (w.config_name, w.window_name)) AS windows_emitted,
       -- what the view shows as pending: window_pending's rows; windows the job holds in
       -- memory between batches are not there
       (SELECT count(*) FROM window_latest p
        WHERE (p.config_name, p.window_name) = (w.config_name, w.window_name)
          AND p.status = 'pending') AS windows_pending,
       (SELECT coalesce(sum(count), 0)::bigint FROM late_events l
        WHERE (l.config_name, l.window_name) = (w.config_name, w.window_name)) AS late_samples,
       (SELECT max(r.window_end) FROM window_results r
        WHERE (r.config_name, r.window_name) = (w.config_name, w.window_name))
           AS last_published_end
FROM w ORDER BY 1, 2
"""


#: The status line ``run`` last drew (``terminal.LiveStatus``), for ``status`` to show how
#: many lines arrive per second without waiting for a second reading of the counters.
STATUS_LINE_FILE = "status-line.json"


def read_status_line(data_dir: Path) -> dict[str, Any] | None:
    """``{"at_ms", "lines_per_s", "text"}`` as ``run`` last wrote it, or None."""
    try:
        return dict(json.loads((data_dir / STATUS_LINE_FILE).read_text()))
    except (FileNotFoundError, ValueError):
        return None


def write_status_line(data_dir: Path, at_ms: int, lines_per_s: float | None, text: str) -> None:
    temporary = data_dir / f"{STATUS_LINE_FILE}.tmp"
    temporary.write_text(json.dumps({"at_ms": at_ms, "lines_per_s": lines_per_s, "text": text}))
    temporary.replace(data_dir / STATUS_LINE_FILE)


#: Only the watermarks (one indexed table of a few rows): what the live status line asks
#: every second, between the counts of ``WINDOW_STATUS_SQL``, which read every stored row.
WATERMARKS_SQL = """
SELECT config_name, substr(key, length('watermark_ms:') + 1) AS window_name,
       value_ms AS watermark_ms,
       (extract(epoch from now()) * 1000)::bigint - value_ms AS watermark_lag_ms
FROM pipeline_state WHERE key LIKE 'watermark_ms:%' ORDER BY 1, 2
"""


def read_running(data_dir: Path) -> dict[str, Any] | None:
    """``run.json`` of the daemon on ``data_dir`` (None if none runs), password included."""
    try:
        return dict(json.loads((data_dir / "run.json").read_text()))
    except FileNotFoundError:
        return None


def read_ingest(data_dir: Path) -> dict[str, dict[str, Any]]:
    """Each receiver's cumulative counters, by stream name."""
    ingest_dir = data_dir / "ingest"
    found: dict[str, dict[str, Any]] = {}
    for path in sorted(ingest_dir.glob("*.json")) if ingest_dir.exists() else ():
        try:
            found[path.stem] = json.loads(path.read_text())
        except (OSError, ValueError):  # replaced between the listing and the read: skip it
            continue
    return found


def window_status(url: str, sql: str = WINDOW_STATUS_SQL) -> list[dict[str, Any]] | str:
    """Per window (``WINDOW_STATUS_SQL``, or ``WATERMARKS_SQL``), or why the store could not
    say."""
    import psycopg  # psycopg alone, not the store module: that one loads Arrow and numpy too

    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=5,
                             application_name="streamgauge status") as conn:  # fmt: skip
            cursor = conn.execute(sql.encode())
            columns = [column.name for column in cursor.description or ()]
            return [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
    except psycopg.Error as error:
        return f"store unavailable: {first_line(error)}"


def status_document(data_dir: Path, spool: str) -> dict[str, Any]:
    """The JSON document of ``streamgauge status --json`` (docs/self-metrics.md)."""
    from streamgauge.ingest.log import describe_spool

    report: dict[str, Any] = {"data_dir": str(data_dir)}
    running = read_running(data_dir)
    if running is not None:
        report["windows"] = window_status(running["postgres_url"])
        running["postgres_url"] = redact_url(running["postgres_url"])
        report["running"] = running
        line = read_status_line(data_dir)
        if line is not None:
            report["status_line"] = line
    report["spool"] = describe_spool(spool)
    if running is not None and running.get("checkpoints"):
        from streamgauge.operator.catch_up import backlog

        last = {name: stream.get("last_sequence") for name, stream in report["spool"].items()}
        checkpoints = {w: Path(path) for w, path in running["checkpoints"].items()}
        report["catch_up"] = [
            late.to_json() for late in backlog(checkpoints, last, running.get("catch_up_from"))
        ]
    ingest = read_ingest(data_dir)
    if ingest or (data_dir / "ingest").exists():
        report["ingest"] = ingest
    return report


@dataclass(frozen=True, slots=True)
class IngestTotals:
    """The receivers' counters added up, at one reading (``at_s``: time.monotonic())."""

    at_s: float
    lines: int = 0
    samples: int = 0
    rejected: int = 0
    series_active: int = 0
    segment_lag_ms: int = 0  # the slowest receiver's
    kernel_drops: int = 0
    refused: int = 0
    cardinality_limited: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, ingest: dict[str, dict[str, Any]], at_s: float) -> IngestTotals:
        reasons: dict[str, int] = {}
        for stats in ingest.values():
            for reason, n in stats.get("rejected", {}).items():
                reasons[reason] = reasons.get(reason, 0) + int(n)
        return cls(
            at_s=at_s,
            lines=sum(int(s.get("lines", 0)) for s in ingest.values()),
            samples=sum(int(s.get("samples", 0)) for s in ingest.values()),
            rejected=sum(reasons.values()),
            series_active=sum(int(s.get("series_active", 0)) for s in ingest.values()),
            segment_lag_ms=max((int(s.get("segment_lag_ms", 0)) for s in ingest.values()),
                               default=0),  # fmt: skip
            kernel_drops=sum(sum(s.get("kernel_drops", {}).values()) for s in ingest.values()),
            refused=sum(sum(s.get("refused_samples", {}).values()) for s in ingest.values()),
            cardinality_limited=sum(
                int(s.get("adjusted", {}).get("cardinality_limited", 0)) for s in ingest.values()
            ),
            rejected_by_reason=reasons,
        )

    def rate_from(self, earlier: IngestTotals | None, counter: str) -> float | None:
        """Per second between ``earlier`` and this reading; None without two readings (or
        when a receiver restarted and its counters began again)."""
        if earlier is None or self.at_s <= earlier.at_s:
            return None
        delta = getattr(self, counter) - getattr(earlier, counter)
        if delta < 0:
            return None
        return float(delta) / (self.at_s - earlier.at_s)


def first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def json_value(value: Any) -> Any:
    """A store value as JSON has it: timestamps in ISO-8601 UTC, numerics as floats."""
    if isinstance(value, dt.datetime):
        return value.astimezone(dt.UTC).isoformat()
    if isinstance(value, decimal.Decimal):
        return float(value)
    if isinstance(value, list):
        return json.dumps(value, sort_keys=True)
    return value
