"""What each client sent and what arrived of it: per-sender counts, and the DogStatsD clients'
own telemetry set beside them (docs/completeness.md).

A client is a sender (``sources.py``: an address and port on UDP, a connection on TCP, a
sending process on a Unix datagram socket, named ``unixgram pid N``). Per client the receiver
counts datagrams, lines, rejected lines by reason, and the kernel drops of its sockets while
the client was sending. The DogStatsD clients (datadogpy, datadog-go, the Java client, ...)
also report what they sent, every 10 s unless turned off, as ordinary counters from the same
socket::

    datadog.dogstatsd.client.metrics:120|c|#client:py,client_version:0.50.0,client_transport:udp
    datadog.dogstatsd.client.packets_sent:12|c|#...
    datadog.dogstatsd.client.packets_dropped_queue:0|c|#...   (and _writer, events, bytes ...)

Such a report covers what the client sent since its previous one, so it is set against what
arrived from the client since *its* previous report (an interval closes at the report's first
line, and the report's datagram counts in the next interval, as the client counts its
telemetry packet in the next report's ``packets_sent``):

    client     m m m T1 m m m m T2 m m         T: a telemetry report
    receiver   ── interval 1 ──┤── interval 2 ─┤
               T2 says "6 metrics sent"; 4 arrived between T1 and T2: completeness 4/6

Both figures are emitted at the report's arrival as ``streamgauge.ingest.client.*`` counters
(``SELF_METRICS``), so a window adds up whole intervals on both sides, and the store's
``client_completeness`` view divides them. A window's figure covers the reports that arrived
in it: intervals that began up to one telemetry interval before the window.

The batch counts are vectorised: one ``np.bincount`` per read batch over the datagrams'
client rows (none when one client sent the whole batch); only reports, rejected and other
rare lines are looked at one by one. At most ``limit`` clients are tracked; the others are
counted together under the source ``overflow`` (their reports are not aligned), and their
datagrams in ``clients_overflowed{reason=client_limit}``. A client idle for ``ttl_ms`` is
forgotten.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from streamgauge.ingest import sources

TELEMETRY_PREFIX = "datadog.dogstatsd.client."
#: The tags the DogStatsD clients put on their telemetry, kept on the client's self-metrics.
CLIENT_TAGS = ("client", "client_version", "client_transport")
#: Report counters set against what arrived, by telemetry name.
SENT_METRICS = "metrics"
SENT_PACKETS = "packets_sent"
DROPPED = {"packets_dropped_queue": "queue", "packets_dropped_writer": "writer"}
DEFAULT_MAX_CLIENTS = 1024
CLIENT_TTL_MS = 10 * 60_000
OVERFLOW_SOURCE = "overflow"
CLIENT_LIMIT_REASON = "client_limit"
#: Rejected lines that were no metric line: the client counts them as events and checks.
NOT_METRIC_REJECTS = frozenset({"invalid_event", "invalid_service_check"})
PREFIX = "streamgauge.ingest.client."
#: Every self-metric of a client (counters), tagged ``source`` and the client's CLIENT_TAGS.
SELF_METRICS = (
    "datagrams", "lines", "rejected", "kernel_drops", "reports", "metrics_sent",
    "metrics_received", "packets_sent", "packets_received", "packets_dropped",
    "reports_unaligned",
)  # fmt: skip
#: Clients written to the stats file (``streamgauge status``), the most lines first.
STATS_CLIENTS = 50

Tags = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Report:
    """A client's telemetry lines in one datagram (or TCP read): its first line's index in
    the batch, its unit, the non-empty lines of that unit from that line on, and the
    counters by telemetry name (``metrics``, ``packets_sent``, ...)."""

    line: int
    unit: int
    unit_lines_from: int
    counters: dict[str, float]
    tags: Tags


@dataclass(slots=True)
class Batch:
    """One read batch: per unit (a datagram, or a TCP read) its sender's key and its
    non-empty lines, the line index each unit starts at (``first_line``, one more entry than
    units), and the rare lines by index: rejected by reason, not metrics (events, service
    checks, telemetry lines), telemetry reports."""

    keys: np.ndarray
    lines: np.ndarray
    first_line: np.ndarray
    rejected: dict[str, np.ndarray] = field(default_factory=dict)
    not_metrics: list[np.ndarray] = field(default_factory=list)
    reports: list[Report] = field(default_factory=list)

    def units_of(self, lines: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.first_line, lines, side="right") - 1


@dataclass(slots=True)
class _Telemetry:
    """A client's reports added up (since start, or in the last report)."""

    reports: int = 0
    metrics_sent: float = 0.0
    metrics_received: int = 0
    packets_sent: float | None = None
    packets_received: int | None = None
    dropped: collections.Counter[str] = field(default_factory=collections.Counter)

    def add(self, other: _Telemetry) -> None:
        self.reports += other.reports
        self.metrics_sent += other.metrics_sent
        self.metrics_received += other.metrics_received
        if other.packets_sent is not None and other.packets_received is not None:
            self.packets_sent = (self.packets_sent or 0.0) + other.packets_sent
            self.packets_received = (self.packets_received or 0) + other.packets_received
        self.dropped.update(other.dropped)

    def to_json(self) -> dict[str, object]:
        return {
            "reports": self.reports, "metrics_sent": self.metrics_sent,
            "metrics_received": self.metrics_received, "packets_sent": self.packets_sent,
            "packets_received": self.packets_received, "packets_dropped": dict(self.dropped),
        }  # fmt: skip


SelfMetric = tuple[str, float, Tags, int]  # name, counter value, tags, event time (ms)

_COUNTERS = ("datagrams", "lines", "kernel_drops", "since_datagrams", "since_lines",
             "since_other", "pending_datagrams", "pending_lines", "pending_kernel_drops",
             "last_seen_ms", "last_report_ms", "unaligned")  # fmt: skip


class Clients:
    """Per-client counts of one receiver, at most ``limit`` clients (row 0: the overflow)."""

    def __init__(
        self,
        limit: int = DEFAULT_MAX_CLIENTS,
        ttl_ms: int = CLIENT_TTL_MS,
        name_of: Callable[[int], str | None] | None = None,
    ) -> None:
        """``name_of``: names keys that hold no address (IPv6, TCP, a Unix datagram socket's
        senders without credentials: ``sources``)."""
        if limit < 1:
            raise ValueError(f"the client limit must be at least 1, got {limit}")
        self.limit = limit
        self.ttl_ms = ttl_ms
        self._name_of = name_of
        self._rows: dict[int, int] = {}
        self._free: list[int] = []
        self._names: list[str] = [OVERFLOW_SOURCE]
        self._tags: list[Tags] = [()]
        self._rejected: list[collections.Counter[str]] = [collections.Counter()]
        self._pending_rejected: list[collections.Counter[str]] = [collections.Counter()]
        self._telemetry: list[_Telemetry] = [_Telemetry()]
        self._last_report: list[_Telemetry | None] = [None]
        #: the self-metric series each client was given: forgotten with it (``expire``)
        self._series: list[set[tuple[str, Tags]]] = [set()]
        self._arrays = {name: np.zeros(16, dtype=np.int64) for name in _COUNTERS}
        self._used = 1
        self._closed: list[SelfMetric] = []
        #: datagrams (or TCP reads) from clients beyond the limit, not pending self-metrics
        self.overflowed = 0
        self.pending_overflowed = 0

    def __len__(self) -> int:
        return len(self._rows)

    def _row(self, key: int, now_ms: int) -> int:
        row = self._rows.get(key)
        if row is not None:
            return row
        if len(self._rows) >= self.limit:
            return 0
        if self._free:
            row = self._free.pop()
        else:
            row = self._used
            self._used += 1
            if row >= len(self._arrays["lines"]):
                for name, array in self._arrays.items():
                    self._arrays[name] = np.concatenate([array, np.zeros_like(array)])
            self._names.append("")
            self._tags.append(())
            self._rejected.append(collections.Counter())
            self._pending_rejected.append(collections.Counter())
            self._telemetry.append(_Telemetry())
            self._last_report.append(None)
            self._series.append(set())
        for array in self._arrays.values():
            array[row] = 0
        self._names[row] = self._describe(key)
        self._tags[row] = ()
        self._rejected[row] = collections.Counter()
        self._pending_rejected[row] = collections.Counter()
        self._telemetry[row] = _Telemetry()
        self._last_report[row] = None
        self._series[row] = set()
        self._rows[key] = row
        return row

    def _describe(self, key: int) -> str:
        name = sources.describe_key(key)
        if name is None and self._name_of is not None:
            name = self._name_of(key)
        if name is None and key & sources.IPV6:
            name = f"udp://[ipv6 {(key >> 16) & ((1 << 42) - 1):x}]:{sources.port_of(key)}"
        return name if name is not None else f"unknown {key:x}"

    def observe(self, batch: Batch, now_ms: int) -> None:
        """Count a batch; close the intervals its telemetry reports end."""
        keys = batch.keys
        if not len(keys):
            return
        a = self._arrays
        first = int(keys[0])
        if int(keys[-1]) == first and bool((keys == first).all()):
            row = self._row(first, now_ms)
            rows = np.full(len(keys), row, dtype=np.int64)
            n, lines = len(keys), int(batch.lines.sum())
            for prefix in ("", "since_", "pending_"):
                a[prefix + "datagrams"][row] += n
                a[prefix + "lines"][row] += lines
            a["last_seen_ms"][row] = now_ms
            if row == 0:
                self.overflowed += n
                self.pending_overflowed += n
        else:
            unique, inverse = np.unique(keys, return_inverse=True)
            by_key = np.array([self._row(k, now_ms) for k in unique.tolist()], dtype=np.int64)
            rows = by_key[inverse]
            size = self._used
            datagrams = np.bincount(rows, minlength=size)
            lines_per_row = np.bincount(rows, weights=batch.lines, minlength=size).astype(
                np.int64)  # fmt: skip
            for prefix in ("", "since_", "pending_"):
                a[prefix + "datagrams"][:size] += datagrams
                a[prefix + "lines"][:size] += lines_per_row
            a["last_seen_ms"][by_key] = now_ms
            if datagrams[0]:
                self.overflowed += int(datagrams[0])
                self.pending_overflowed += int(datagrams[0])
        for reason, lines_at in batch.rejected.items():
            if not len(lines_at):
                continue
            picked, counts = np.unique(rows[batch.units_of(lines_at)], return_counts=True)
            for row, count in zip(picked.tolist(), counts.tolist(), strict=True):
                self._rejected[row][reason] += count
                self._pending_rejected[row][reason] += count
            if reason in NOT_METRIC_REJECTS:
                batch.not_metrics.append(lines_at)
        others = (np.concatenate(batch.not_metrics) if batch.not_metrics
                  else np.zeros(0, dtype=np.int64))  # fmt: skip
        other_rows = rows[batch.units_of(others)]
        if len(others):
            a["since_other"][: self._used] += np.bincount(other_rows, minlength=self._used)
        for report in sorted(batch.reports, key=lambda r: r.line):
            self._close(batch, rows, others, other_rows, report, now_ms)

    def _close(self, batch: Batch, rows: np.ndarray, others: np.ndarray,
               other_rows: np.ndarray, report: Report, now_ms: int) -> None:
        """End the client's interval at ``report``: what arrived since its last report
        against what the report says was sent."""
        row = int(rows[report.unit])
        if row == 0:
            return  # an untracked client: nothing of its interval was kept
        a = self._arrays
        mine = rows[report.unit + 1 :] == row
        after_datagrams = 1 + int(np.count_nonzero(mine))
        after_lines = report.unit_lines_from + int(batch.lines[report.unit + 1 :][mine].sum())
        after_other = int(np.count_nonzero((other_rows == row) & (others >= report.line)))
        received = (int(a["since_lines"][row]) - after_lines) - (
            int(a["since_other"][row]) - after_other)  # fmt: skip
        datagrams = int(a["since_datagrams"][row]) - after_datagrams
        a["since_datagrams"][row] = after_datagrams
        a["since_lines"][row] = after_lines
        a["since_other"][row] = after_other
        counters = report.counters
        client_tags = tuple((k, v) for k, v in report.tags if k in CLIENT_TAGS)
        if client_tags:
            self._tags[row] = client_tags
        if not self._aligned(row, now_ms, datagrams, counters.get(SENT_PACKETS)):
            a["unaligned"][row] += 1
            unaligned = ("reports_unaligned", 1.0, self._tags_of(row), now_ms)
            self._series[row].add((unaligned[0], unaligned[2]))
            self._closed.append(unaligned)
            return
        last = _Telemetry(reports=1, metrics_sent=counters.get(SENT_METRICS, 0.0),
                          metrics_received=received)  # fmt: skip
        datagram_key = not int(batch.keys[report.unit]) & sources.TCP
        if SENT_PACKETS in counters and datagram_key:
            last.packets_sent, last.packets_received = counters[SENT_PACKETS], datagrams
        for name, reason in DROPPED.items():
            if name in counters:
                last.dropped[reason] += int(counters[name])
        if not last.dropped and "packets_dropped" in counters:
            last.dropped["unspecified"] += int(counters["packets_dropped"])
        self._telemetry[row].add(last)
        self._last_report[row] = last
        tags = self._tags_of(row)
        closed: list[SelfMetric] = [
            ("reports", 1.0, tags, now_ms),
            ("metrics_sent", last.metrics_sent, tags, now_ms),
            ("metrics_received", float(received), tags, now_ms),
        ]
        if last.packets_sent is not None and last.packets_received is not None:
            closed.append(("packets_sent", last.packets_sent, tags, now_ms))
            closed.append(("packets_received", float(last.packets_received), tags, now_ms))
        closed += [("packets_dropped", float(n), (*tags, ("reason", reason)), now_ms)
                   for reason, n in last.dropped.items()]  # fmt: skip
        self._series[row].update((name, series_tags) for name, _, series_tags, _ in closed)
        self._closed += closed

    def _aligned(self, row: int, now_ms: int, datagrams: int, packets_sent: float | None
                 ) -> bool:
        """Whether what arrived since the client's previous report is what this report
        covers. Not for its first report (the count began with the first datagram seen, not
        with the client's interval), nor after a lost report: the arrivals then span two
        intervals, the report one, which shows as more datagrams arrived than the report
        says were sent. Such a report only starts the next interval (counted in
        ``reports_unaligned``): set against two intervals' arrivals, a uniform loss would
        hide itself (as many reports lost as metrics). A lost report goes unnoticed when
        fewer datagrams arrived over both intervals than the client sent in the second (more
        than half lost, or a first interval with little in it): the figure then reads high,
        by what arrived of the first interval. (The time between reports says nothing: a
        client sends its report with its next metric after the interval, so a client that
        pauses reports late.)"""
        a = self._arrays
        previous = int(a["last_report_ms"][row])
        a["last_report_ms"][row] = now_ms
        if not previous:
            return False
        return packets_sent is None or datagrams <= packets_sent

    def _tags_of(self, row: int) -> Tags:
        return tuple(sorted((("source", self._names[row]), *self._tags[row])))

    def kernel_drops(self, drops: int, active_since_ms: int) -> None:
        """The receiver's datagram sockets dropped ``drops`` more datagrams: counted for every
        client that sent since ``active_since_ms`` (each may have lost some of them)."""
        a = self._arrays
        active = a["last_seen_ms"][: self._used] >= active_since_ms
        active[0] = active[0] and self.overflowed > 0
        a["kernel_drops"][: self._used][active] += drops
        a["pending_kernel_drops"][: self._used][active] += drops

    def take_self_metrics(self, now_ms: int) -> list[SelfMetric]:
        """This roll's counters per client, and the intervals closed since the last call."""
        a = self._arrays
        out, self._closed = self._closed, []
        first = len(out)
        busy = np.flatnonzero((a["pending_datagrams"][: self._used]
                               | a["pending_lines"][: self._used]
                               | a["pending_kernel_drops"][: self._used]) != 0)  # fmt: skip
        for row in busy.tolist():
            tags = self._tags_of(row)
            for name in ("datagrams", "lines", "kernel_drops"):
                value = int(a["pending_" + name][row])
                if value:
                    out.append((name, float(value), tags, now_ms))
                a["pending_" + name][row] = 0
            for reason, n in self._pending_rejected[row].items():
                out.append(("rejected", float(n), (*tags, ("reason", reason)), now_ms))
            self._pending_rejected[row].clear()
            self._series[row].update((name, series_tags) for name, _, series_tags, _
                                     in out[first:])  # fmt: skip
            first = len(out)
        return out

    def expire(self, now_ms: int) -> list[tuple[str, Tags]]:
        """Forget the clients idle for ``ttl_ms`` (their last counts were already taken);
        returns their self-metric series (name without ``PREFIX``, tags), for the combiner to
        forget too: a sender that changes its port for every datagram would otherwise hold
        series without bound."""
        seen = self._arrays["last_seen_ms"]
        gone: list[tuple[str, Tags]] = []
        for key, row in list(self._rows.items()):
            if now_ms - int(seen[row]) >= self.ttl_ms:
                del self._rows[key]
                self._free.append(row)
                gone += self._series[row]
                self._series[row] = set()
        return gone

    def to_json(self) -> dict[str, object]:
        """The ``STATS_CLIENTS`` clients with the most lines, cumulative (``status``)."""
        a = self._arrays
        rows = sorted(self._rows.values(), key=lambda r: -int(a["lines"][r]))[:STATS_CLIENTS]
        if self.overflowed:
            rows.append(0)
        clients = []
        for row in rows:
            last = self._last_report[row]
            clients.append({
                "source": self._names[row], "tags": dict(self._tags[row]),
                "datagrams": int(a["datagrams"][row]), "lines": int(a["lines"][row]),
                "rejected": dict(self._rejected[row]),
                "kernel_drops": int(a["kernel_drops"][row]),
                "reports_unaligned": int(a["unaligned"][row]),
                "last_seen_ms": int(a["last_seen_ms"][row]),
                "telemetry": self._telemetry[row].to_json(),
                "last_report": None if last is None else last.to_json(),
            })  # fmt: skip
        return {"tracked": len(self._rows), "limit": self.limit,
                "overflowed": self.overflowed, "clients": clients}  # fmt: skip
