"""The UDP receiver loop: socket → parser → pane combiner → segment log.

One receiver owns one socket, one combiner and one segment stream. It wakes on readable data
or on the roll timer, drains every queued datagram without blocking, and every ``roll_ms``
writes what it combined as one segment, with a heartbeat. When input is idle it still writes
a heartbeat-only segment every ``heartbeat_interval_ms`` so downstream windows can close.

Everything that is not aggregated is counted: rejected lines by reason (with a bounded sample
of the raw lines for debugging), and the counts are also fed back into the pipeline as
ordinary counters named ``streamgauge.ingest.*``.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import select
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from streamgauge.clock import Clock
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import Heartbeat, SegmentWriter
from streamgauge.ingest.protocol import (
    DEFAULT_LIMITS,
    ParseResult,
    ProtocolLimits,
    Sample,
    parse_datagram,
)

log = logging.getLogger(__name__)

SELF_METRIC_PREFIX = "streamgauge.ingest."
MAX_DATAGRAM_BYTES = 65535
MAX_DATAGRAMS_PER_WAKEUP = 4096
REJECT_SAMPLE_SIZE = 32


@dataclass(slots=True)
class IngestStats:
    """Cumulative counts since the receiver started; ``accounted`` must equal ``lines``."""

    datagrams: int = 0
    lines: int = 0
    samples: int = 0
    segments: int = 0
    rejected: collections.Counter[str] = field(default_factory=collections.Counter)
    reject_sample: collections.deque[dict[str, str]] = field(
        default_factory=lambda: collections.deque(maxlen=REJECT_SAMPLE_SIZE)
    )

    def to_json(self) -> dict[str, object]:
        return {
            "datagrams": self.datagrams,
            "lines": self.lines,
            "samples": self.samples,
            "segments": self.segments,
            "rejected": dict(self.rejected),
            "reject_sample": list(self.reject_sample),
        }


def bind_udp(host: str, port: int, rcvbuf_bytes: int = 8 << 20) -> socket.socket:
    """Bind a UDP socket with a large receive buffer (the biggest lever against kernel drops)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    _set_receive_buffer(sock, rcvbuf_bytes)
    sock.bind((host, port))
    return sock


def _set_receive_buffer(sock: socket.socket, size: int) -> None:
    # SO_RCVBUFFORCE ignores net.core.rmem_max but needs CAP_NET_ADMIN; fall back to the
    # capped SO_RCVBUF for unprivileged users.
    force = getattr(socket, "SO_RCVBUFFORCE", None)
    if force is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, force, size)
            return
        except PermissionError:
            pass
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


class UdpReceiver:
    def __init__(
        self,
        sock: socket.socket,
        writer: SegmentWriter,
        combiner: PaneCombiner,
        clock: Clock,
        *,
        roll_ms: int = 250,
        heartbeat_interval_ms: int = 1000,
        limits: ProtocolLimits = DEFAULT_LIMITS,
        stats_path: Path | None = None,
    ) -> None:
        self._sock = sock
        self._sock.setblocking(False)
        self._writer = writer
        self._combiner = combiner
        self._clock = clock
        self._roll_ms = roll_ms
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._limits = limits
        self._stats_path = stats_path
        self.stats = IngestStats()
        self._last_now_ms = 0
        self._last_segment_ms = 0
        self._pending_self_metrics = IngestStats()

    def now_ms(self) -> int:
        """The receive clock, never going backwards.

        A wall clock stepped back by NTP would otherwise give later datagrams earlier event
        times than a heartbeat already promised ("nothing earlier than t"), making them late.
        """
        now = self._clock.now_ms()
        if now < self._last_now_ms:
            now = self._last_now_ms
        self._last_now_ms = now
        return now

    def run(self, stop: threading.Event) -> None:
        """Receive until ``stop`` is set, then drain the socket and write a closing segment."""
        next_roll = self.now_ms() + self._roll_ms
        while not stop.is_set():
            timeout_s = max(0, next_roll - self.now_ms()) / 1000
            readable, _, _ = select.select([self._sock], [], [], min(timeout_s, 0.25))
            if readable:
                self.receive_available()
            now = self.now_ms()
            if now >= next_roll:
                self.roll(now)
                next_roll = now + self._roll_ms
        self.receive_available()
        self.roll(self.now_ms(), closed=True)

    def receive_available(self) -> int:
        """Read every datagram queued on the socket (bounded per call) and combine it."""
        received = 0
        result = ParseResult()
        while received < MAX_DATAGRAMS_PER_WAKEUP:
            try:
                datagram = self._sock.recv(MAX_DATAGRAM_BYTES)
            except (BlockingIOError, InterruptedError):
                break
            received += 1
            parse_datagram(datagram, self._limits, into=result)
        if received:
            self._account(received, result, self.now_ms())
        return received

    def _account(self, datagrams: int, result: ParseResult, recv_ms: int) -> None:
        self.stats.datagrams += datagrams
        self.stats.lines += result.lines
        pending = self._pending_self_metrics
        pending.datagrams += datagrams
        pending.lines += result.lines
        accepted = 0
        for sample in result.samples:
            if self._combiner.type_conflicts(sample):
                self._reject("type_conflict", f"{sample.metric}|{sample.metric_type}".encode())
                continue
            self._combiner.add(sample, recv_ms, recv_ms)
            accepted += 1
        self.stats.samples += accepted
        pending.samples += accepted
        for reject in result.rejects:
            self._reject(reject.reason, reject.line)

    def _reject(self, reason: str, line: bytes) -> None:
        self.stats.rejected[reason] += 1
        self._pending_self_metrics.rejected[reason] += 1
        self.stats.reject_sample.append(
            {"reason": reason, "line": line[:256].decode("utf-8", "replace")}
        )

    def roll(self, now_ms: int, *, closed: bool = False) -> None:
        """Write a segment if there is data, a heartbeat is due, or the receiver is closing."""
        self._add_self_metrics(now_ms)
        heartbeat_due = now_ms - self._last_segment_ms >= self._heartbeat_interval_ms
        if len(self._combiner) == 0 and not heartbeat_due and not closed:
            return
        # Every datagram combined so far was received at or before now_ms, and every later
        # one will be stamped at or after it (now_ms never goes backwards): the heartbeat.
        batch = self._combiner.drain()
        self._writer.append(batch, Heartbeat(now_ms, closed))
        self.stats.segments += 1
        self._last_segment_ms = now_ms
        self._write_stats()

    def _add_self_metrics(self, now_ms: int) -> None:
        """Feed this roll's counts back in as ordinary counters, so they land in the store."""
        pending = self._pending_self_metrics
        if pending.datagrams == 0 and not pending.rejected:
            return
        counts = [
            ("datagrams", pending.datagrams, ()),
            ("lines", pending.lines, ()),
            ("samples", pending.samples, ()),
        ] + [("rejected", n, (("reason", reason),)) for reason, n in pending.rejected.items()]
        for name, value, tags in counts:
            self._combiner.add(
                Sample(SELF_METRIC_PREFIX + name, "c", float(value), 1.0, tags), now_ms, now_ms
            )
        self._pending_self_metrics = IngestStats()

    def _write_stats(self) -> None:
        if self._stats_path is None:
            return
        temporary = self._stats_path.with_suffix(".tmp")
        temporary.write_text(json.dumps(self.stats.to_json(), indent=1))
        os.replace(temporary, self._stats_path)
