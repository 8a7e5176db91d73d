"""The terminal of ``streamgauge run``: streamgauge's own words only.

What reaches it:

- the start-up banner (``banner``): what listens where, the store, the Spark UI, the data and
  log directories, how to send, query and look;
- streamgauge's log records (``TerminalHandler``; other libraries' go to
  ``<data-dir>/logs/streamgauge.log`` only) and the receivers' lines (``forward_lines``);
- one status line (``LiveStatus``): redrawn in place every second when stdout is a
  terminal, printed as a plain line every ``interval`` otherwise (a log file, systemd);
- each ERROR event of Spark as one line naming the log that holds its details
  (``SparkErrors``); Spark's and the JVM's other output is in ``<data-dir>/logs/``
  (``jvm_logs``).

Every write goes through one ``Terminal``, so a log line never lands in the middle of the
status line: the status line is erased, the log line written, the status line drawn again.
"""

from __future__ import annotations

import logging
import logging.handlers
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any, TextIO

from streamgauge.operator.snapshot import (
    WATERMARKS_SQL,
    IngestTotals,
    read_ingest,
    window_status,
    write_status_line,
)

CLEAR_LINE = "\r\x1b[K"
#: The receivers' log format (``cli.main``'s basicConfig), to show their lines like ours.
_CHILD_RECORD = re.compile(
    r"^\d{4}-\d\d-\d\d (?P<time>\d\d:\d\d:\d\d),\d+ (?P<level>[A-Z]+) [\w.]+: (?P<message>.*)$"
)
#: How often the live status counts the windows published and the late samples (it reads
#: the watermarks at every redraw): the counts read every row of the window.
WINDOWS_EVERY_S = 5.0
_NO_COUNTS = {"windows_emitted": 0, "windows_pending": 0, "late_samples": 0}


class Terminal:
    """One writer for the terminal: permanent lines, and (when live) one status line kept
    at the bottom and redrawn in place."""

    def __init__(self, stream: TextIO, *, live: bool) -> None:
        self._stream = stream
        self.live = live
        self._status = ""
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        """A permanent line, above the status line."""
        with self._lock:
            if self.live and self._status:
                self._stream.write(CLEAR_LINE)
            self._stream.write(text.rstrip("\n") + "\n")
            if self.live and self._status:
                self._stream.write(self._fit(self._status))
            self._stream.flush()

    def status(self, text: str) -> None:
        """Replace the status line (live), or print it as a line of its own (not live)."""
        if not self.live:
            self.line(text)
            return
        with self._lock:
            self._status = text
            self._stream.write(CLEAR_LINE + self._fit(text))
            self._stream.flush()

    def clear_status(self) -> None:
        with self._lock:
            if self.live and self._status:
                self._stream.write(CLEAR_LINE)
                self._stream.flush()
            self._status = ""

    @staticmethod
    def _fit(text: str) -> str:
        """A status line longer than the terminal would wrap, and ``\\r`` then redraws only
        its last row: cut it to the width."""
        width = shutil.get_terminal_size((120, 24)).columns
        return text if len(text) < width else text[: max(0, width - 2)] + "…"


def clock_prefix(at: float | None = None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(at))


def _labelled(level: int, message: str) -> str:
    if level >= logging.ERROR:
        return f"error: {message}"
    if level >= logging.WARNING:
        return f"warning: {message}"
    return message


class TerminalHandler(logging.Handler):
    """streamgauge's log records as ``HH:MM:SS message`` lines on the terminal."""

    def __init__(
        self, terminal: Terminal, *, only_streamgauge: bool, details: Path | None = None
    ) -> None:
        """``details``: the log file holding each record in full; a record of several lines
        (a query's Java error) shows its first line on the terminal and names that file."""
        super().__init__()
        self._terminal = terminal
        self._details = details
        if only_streamgauge:
            self.addFilter(lambda record: record.name.split(".", 1)[0] == "streamgauge")

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
            if record.exc_info and record.levelno >= logging.ERROR:
                message += f" ({record.exc_info[1]!r})"
            lines = message.strip().splitlines() or [""]
            if len(lines) > 1:
                message = lines[0] + (f" (details: {self._details})" if self._details else "")
            self._terminal.line(f"{clock_prefix(record.created)}  "
                                f"{_labelled(record.levelno, message)}")  # fmt: skip
        except Exception:  # noqa: BLE001 - logging must never raise into the caller
            self.handleError(record)


def configure_daemon_logging(
    terminal: Terminal, logs_dir: Path, level: int, *, verbose: bool
) -> None:
    """Logging of ``run``: streamgauge's records at ``level`` on the terminal (every
    library's too with ``verbose``); everything at INFO and above (or ``level``, if lower)
    in ``logs_dir/streamgauge.log``, rotated; Python warnings as log records."""
    logs_dir.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    root.setLevel(min(level, logging.INFO))
    details = logs_dir / "streamgauge.log"
    on_terminal = TerminalHandler(terminal, only_streamgauge=not verbose, details=details)
    on_terminal.setLevel(level)
    root.addHandler(on_terminal)
    to_file = logging.handlers.RotatingFileHandler(details, maxBytes=10 << 20, backupCount=3)
    to_file.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(to_file)
    logging.captureWarnings(True)
    logging.getLogger("py4j").setLevel(logging.WARNING)


def forward_lines(pipe: IO[bytes], terminal: Terminal) -> threading.Thread:
    """Show what a receiver child prints, in the terminal's format, until its pipe closes."""

    def forward() -> None:
        for raw in iter(pipe.readline, b""):
            text = raw.decode(errors="replace").rstrip()
            if not text:
                continue
            match = _CHILD_RECORD.match(text)
            if match:
                level = logging.getLevelName(match["level"])
                level = level if isinstance(level, int) else logging.INFO
                text = f"{match['time']}  {_labelled(level, match['message'])}"
            terminal.line(text)
        pipe.close()

    thread = threading.Thread(target=forward, name="receiver-output", daemon=True)
    thread.start()
    return thread


class SparkErrors:
    """Follows ``spark-errors.log`` (one line per ERROR event, ``jvm_logs``) from where it
    ended when this was created; ``new_lines`` returns what was added since."""

    def __init__(self, errors_log: Path, details_log: Path) -> None:
        self._path = errors_log
        self._details = details_log
        self._offset = self._size()

    def _size(self) -> int:
        try:
            return self._path.stat().st_size
        except FileNotFoundError:
            return 0

    def new_lines(self) -> list[str]:
        size = self._size()
        if size < self._offset:  # rolled over: the new file is read from its start
            self._offset = 0
        if size == self._offset:
            return []
        with open(self._path, "rb") as handle:
            handle.seek(self._offset)
            data = handle.read(size - self._offset)
        complete = data.rfind(b"\n") + 1  # a line still being written waits for the next call
        self._offset += complete
        return [
            f"spark {_spark_event(line)} (details: {self._details})"
            for line in data[:complete].decode(errors="replace").splitlines() if line.strip()
        ]  # fmt: skip


def _spark_event(line: str, limit: int = 240) -> str:
    """``2026-11-27 10:00:00 ERROR Executor: message`` without its date, cut to ``limit``."""
    parts = line.split(" ", 2)
    text = parts[2] if len(parts) == 3 else line
    return text if len(text) <= limit else text[: limit - 1] + "…"


def status_text(
    totals: IngestTotals, earlier: IngestTotals | None, windows: list[dict[str, Any]] | str | None,
    width: int | None = None, catch_up: Sequence[dict[str, Any]] = (),
) -> str:
    """The one status line: what arrives, what the guard holds, how far each window's
    watermark is behind now, what was published, what came late, how far the store is behind
    the log (the slowest receiver's ``segment_lag_ms``) and, while a window query catches up
    with the log (``catch_up``: ``Backlog.to_json`` of each), the furthest one's progress.

    Wider than ``width``, the per-window lags give way to the largest one, so that the line
    keeps every part on an 80-column terminal."""
    rate = totals.rate_from(earlier, "lines")
    head = [
        f"in {_count(rate) if rate is not None else '…'} lines/s",
        f"rejects {_count(totals.rejected)}",
        f"series {_count(totals.series_active)}",
    ]
    tail = [f"store lag {duration(totals.segment_lag_ms)}"]
    behind = [late for late in catch_up if late["catching_up"]]
    if behind:  # the query furthest from done: what the operator waits for
        tail.append(catch_up_text(max(behind, key=lambda late: late["left_s"])))
    if isinstance(windows, str):
        return " | ".join([*head, windows, *tail])
    if not windows:
        return " | ".join([*head, "watermark: none yet", *tail])
    done = [
        f"published {_count(sum(int(w['windows_emitted']) for w in windows))}",
        f"late {_count(sum(int(w['late_samples']) for w in windows))}",
    ]
    lags = " ".join(f"{w['window_name']} {duration(w['watermark_lag_ms'])}" for w in windows)
    line = " | ".join([*head, f"watermark lag {lags}", *done, *tail])
    if width is None or len(line) < width or len(windows) == 1:
        return line
    worst = max(windows, key=lambda w: int(w["watermark_lag_ms"]))
    lag = f"lag {duration(worst['watermark_lag_ms'])} ({worst['window_name']})"
    return " | ".join([*head, lag, *done, *tail])


def catch_up_text(late: dict[str, Any]) -> str:
    """``catch-up per_10s: 1,234/5,000 segments, 120/s, 31s left`` (``Backlog.to_json``)."""
    to_do, done = int(late["segments_to_do"]), late["segments_done"]
    of = f"{to_do:,} segments to do" if done is None else f"{done:,}/{done + to_do:,} segments"
    rate = late["segments_per_s"]
    left = late["left_s"]
    return "".join([
        f"catch-up {late['window']}: {of}",
        "" if rate is None else f", {rate:,.0f}/s",
        "" if left is None else f", {duration(left * 1000)} left",
    ])  # fmt: skip


def duration(ms: int | float | None) -> str:
    """A lag for a person: ``850ms``, ``1.9s``, ``42s``, ``3m05s``, ``2h01m``."""
    if ms is None:
        return "-"
    ms = int(ms)
    if abs(ms) < 1000:
        return f"{ms}ms"
    seconds = ms / 1000
    if abs(seconds) < 10:
        return f"{seconds:.1f}s"
    if abs(seconds) < 60:
        return f"{seconds:.0f}s"
    minutes, rest = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _count(value: float) -> str:
    return f"{value:,.0f}"


class LiveStatus(threading.Thread):
    """Redraws the status line every ``interval_s`` from the receivers' counters and, every
    ``WINDOWS_EVERY_S``, the store's window status; shows Spark's new errors as they come."""

    def __init__(
        self, terminal: Terminal, data_dir: Path, url: str, interval_s: float,
        spark_errors: SparkErrors | None,
        catch_up: Callable[[], Sequence[dict[str, Any]]] | None = None,
    ) -> None:  # fmt: skip
        """``catch_up``: each window query's ``Backlog.to_json`` now (``catch_up.backlog``)."""
        super().__init__(name="live-status", daemon=True)
        self._terminal, self._data_dir, self._url = terminal, data_dir, url
        self._interval_s = interval_s
        self._catch_up = catch_up
        self._errors = spark_errors
        self._halt = threading.Event()

    def run(self) -> None:
        earlier: IngestTotals | None = None
        counts: dict[str, dict[str, Any]] = {}
        counted_at = float("-inf")
        while not self._halt.is_set():
            now = time.monotonic()
            try:
                totals = IngestTotals.of(read_ingest(self._data_dir), now)
                windows: list[dict[str, Any]] | str
                if now - counted_at >= max(WINDOWS_EVERY_S, self._interval_s):
                    windows, counted_at = window_status(self._url), now
                    if isinstance(windows, list):
                        counts = {w["window_name"]: w for w in windows}
                else:  # the lags now, the counts as last read
                    windows = window_status(self._url, WATERMARKS_SQL)
                    if isinstance(windows, list):
                        windows = [{**counts.get(w["window_name"], _NO_COUNTS), **w}
                                   for w in windows]  # fmt: skip
                self._draw(totals, earlier, windows, self._backlog())
                earlier = totals
            except Exception as error:  # noqa: BLE001 - the status line must not stop the daemon
                logging.getLogger(__name__).debug("status line skipped: %s", error)
            self._halt.wait(self._interval_s)
        self._show_errors()

    def _backlog(self) -> Sequence[dict[str, Any]]:
        if self._catch_up is None:
            return ()
        try:
            return self._catch_up()
        except (OSError, ValueError) as error:  # a checkpoint or segment being written
            logging.getLogger(__name__).debug("catch-up not read: %s", error)
            return ()

    def _draw(
        self, totals: IngestTotals, earlier: IngestTotals | None,
        windows: list[dict[str, Any]] | str, catch_up: Sequence[dict[str, Any]],
    ) -> None:  # fmt: skip
        whole = status_text(totals, earlier, windows, catch_up=catch_up)
        try:
            write_status_line(self._data_dir, int(time.time() * 1000),
                              totals.rate_from(earlier, "lines"), whole)  # fmt: skip
        except OSError as error:  # a full disk must not stop the terminal
            logging.getLogger(__name__).debug("status line not saved: %s", error)
        self._show_errors()
        if self._halt.is_set():
            return
        if self._terminal.live:
            width = shutil.get_terminal_size((120, 24)).columns
            self._terminal.status(status_text(totals, earlier, windows, width, catch_up))
        else:
            self._terminal.status(f"{clock_prefix()}  status: {whole}")

    def _show_errors(self) -> None:
        if self._errors is None:
            return
        for line in self._errors.new_lines():
            self._terminal.line(f"{clock_prefix()}  {line}")

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)
        self._terminal.clear_status()


def banner(
    *, config_name: str, config_path: str, windows: Sequence[str], listen: Iterable[str],
    udp: str, store: str, spark_ui: str | None, data_dir: Path, logs_dir: Path,
) -> str:  # fmt: skip
    """What listens where and how to use it, printed once everything is up."""
    here = f"--data-dir {data_dir}"
    rows = [
        ("listening", "  ".join([f"udp {udp}", *listen])),
        ("store", f"postgres {store}"),
        ("spark ui", spark_ui or "-"),
        ("data", str(data_dir)),
        ("logs", f"{logs_dir}  (Spark and the JVM: spark.log, jvm.log)"),
        ("send", f"streamgauge send 'api.requests:1|c' --to {udp}"),
        ("query", f"streamgauge query {here} 'select * from window_results'"),
        ("look", f"streamgauge status {here}   |   streamgauge top {here}"),
    ]
    head = (f"streamgauge {config_name}: windows {', '.join(windows)} "
            f"(config {config_path})")  # fmt: skip
    return "\n".join([head, *(f"  {name:<10} {value}" for name, value in rows)])


def stop_summary(
    final: dict[str, dict[str, Any]], windows: list[dict[str, Any]] | str | None
) -> str:
    """What a clean stop flushed: the receivers' last counts, and what the store holds: the
    windows published, and the open ones in ``window_pending`` (the job parks them when the
    input goes quiet or at the stop, so a reader sees every sample the log gave it; the next
    start publishes them)."""
    totals = IngestTotals.of(final, time.monotonic())
    segments = sum(int(stats.get("segments", 0)) for stats in final.values())
    closed = (
        f"stopped: the receivers took {totals.lines:,} lines ({totals.samples:,} samples, "
        f"{totals.rejected:,} rejected) and flushed them to the log in {segments:,} segments"
    )
    if isinstance(windows, list) and windows:
        published = ", ".join(f"{w['window_name']} {int(w['windows_emitted']):,}" for w in windows)
        closed += f"; the store holds windows: {published}"
        pending = [w for w in windows if int(w.get("windows_pending") or 0)]
        if pending:
            held = ", ".join(f"{w['window_name']} {int(w['windows_pending']):,}" for w in pending)
            closed += f"; open, in window_pending: {held}"
    return closed
