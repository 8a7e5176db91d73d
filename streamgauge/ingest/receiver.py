"""The receiver loop: sockets → parser → guards → pane combiner → segment log.

One receiver owns its sockets (any mix of UDP, TCP and Unix datagram), one combiner and one
segment stream. It wakes on readable data or on the roll timer, drains every queued datagram
without blocking, and every ``roll_ms`` drains what it combined into one segment, with a
heartbeat. When input is idle it still writes a heartbeat-only segment every
``heartbeat_interval_ms`` so downstream windows can close.

Three threads keep the socket buffers from overflowing while the loop is busy:

    reader thread(s)  ──recvmmsg──▶ read-ahead ring (8 MiB) ──wake fd──▶ receive loop
    receive loop: parse, combine; every roll_ms detach ──▶ SegmentQueue (≤ 4 segments)
    writer thread: build the batch (columns, sketches), Arrow IPC to a temporary, fsync,
                   rename, in order

Datagram sockets are read by a read-ahead thread each (``read_ahead.py``: many datagrams per
``recvmmsg``, in a compiled loop that never holds the GIL), so a busy loop does not stop the
reading. At a roll the loop only *detaches* what it combined
(``PaneCombiner.detach``: numpy copies and container swaps, about a millisecond at 10k
series); the ``SegmentQueue``'s thread builds the record batch and its pane sketches (~50–100
ms of CPU per roll at 10k series) and writes it, so neither the build nor the disk stops the
loop. Both queues are bounded and count when they are full:
``read_ahead_full`` (the kernel buffer then takes the input; its drops are ``kernel_drops``)
and ``write_backpressure`` / ``write_blocked_ms`` (the loop waited for the disk).

Accounting: every non-empty line received ends up in exactly one bucket, so

    lines == metric_lines + events + service_checks + Σ rejected[reason]

holds at all times (``IngestStats.accounted``). Adjustments — ``timestamp_out_of_range`` (a
``|T`` further than ``max_skew_ms`` from the receive clock: the receive time is used instead),
``cardinality_limited`` (folded into the overflow series) and ``unknown_field`` (fields the
parser does not know, ignored) — are counted on top, per line: those lines are still
aggregated (or counted as the event or service check they are). Rejects and adjustments share
a bounded sample of raw lines for debugging, and every count is fed back into the pipeline as
ordinary metrics named ``streamgauge.ingest.*``. Besides the line counts: ``refused{reason}``
and ``refused_partials{reason}`` (samples and partials the segment writer did not write:
``spool_quota``, ``disk_full``, ``spool_unavailable``; received and accounted, not in the
log), ``write_backpressure`` and ``write_blocked_ms``, ``read_ahead_full``, ``read_errors``
(datagram reads the kernel failed for a moment, paused and retried), and the gauges
``series_active{receiver}`` and ``segment_lag_ms{receiver}`` (age of the oldest segment the
window job has not committed, or passed over with nothing in it for an idle lane).

Event time and heartbeats: a sample's event time is its ``|T`` when within the skew, else the
receive time. A client timestamp in the past puts the partial in its own, older pane; the
heartbeat still says "receive clock now" and is never held back by the skew — such a partial
is a straggler to the window job, which handles lateness.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import logging
import os
import selectors
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from streamgauge.clock import Clock
from streamgauge.ingest import clients as client_counts
from streamgauge.ingest import kernel, sources
from streamgauge.ingest.clients import Batch, Clients, Report
from streamgauge.ingest.collector import FullCollections
from streamgauge.ingest.combiner import PaneCombiner, canonical_tags
from streamgauge.ingest.fastpath import FastPath
from streamgauge.ingest.guard import (
    OVERFLOW_TAGS,
    CardinalityGuard,
    CardinalityLimits,
    SeriesId,
)
from streamgauge.ingest.log import (
    DEFAULT_MAX_SKEW_MS,
    Heartbeat,
    SegmentQueue,
    SegmentWriter,
    WriterCounts,
    list_segments,
    read_heartbeat,
    segment_at,
)
from streamgauge.ingest.priority import lower_thread_priority
from streamgauge.ingest.protocol import (
    DEFAULT_LIMITS,
    ParseResult,
    ProtocolLimits,
    Reject,
    Sample,
    parse_datagram,
    sample_weight,
)
from streamgauge.ingest.read_ahead import (
    COALESCE_DATAGRAMS,
    MAX_DATAGRAMS_PER_WAKEUP,
    READ_AHEAD_BYTES,
    ReadAhead,
    prepare_read_ahead,
    read_ahead_for,
)
from streamgauge.ingest.transports import (
    Chunk,
    DatagramReader,
    LineAssembler,
    ListenSpec,
    bind_udp,
    describe,
)
from streamgauge.retention import done_sequences

__all__ = ["IngestStats", "Receiver", "UdpReceiver", "bind_udp"]

log = logging.getLogger(__name__)

SELF_METRIC_PREFIX = "streamgauge.ingest."
MAX_DATAGRAM_BYTES = 65535
MAX_TCP_READ_BYTES = 1 << 16
MAX_TCP_CONNECTIONS = 1024
REJECT_SAMPLE_SIZE = 32
TRUNCATED_SAMPLE = b"<datagram over 64 KiB: its last line cut off>"
KERNEL_POLL_MS = 1000
LAG_POLL_MS = 5000
CLIENT_EXPIRY_POLL_MS = 10_000
#: A wake-up that found fewer than COALESCE_DATAGRAMS datagrams waits this long before the
#: next one, so that the next read finds a bigger batch: per-batch costs are amortised over
#: more lines and the CPU goes to the senders meanwhile (the 8 MiB receive buffer holds ~40 ms
#: at 200 MB/s).
COALESCE_S = 0.002


@dataclass(slots=True)
class IngestStats:
    """Cumulative counts since the receiver started; ``accounted()`` always equals ``lines``."""

    datagrams: int = 0  # UDP and Unix datagrams
    tcp_connections: int = 0  # accepted
    lines: int = 0
    metric_lines: int = 0  # lines aggregated (possibly into an overflow series)
    # values aggregated ("a:1:2:3|d" is one line, three samples), each as many as it stands
    # for ("a:1|d|@0.5" is two: protocol.sample_weight): what the logged partials' counts add
    # up to
    samples: int = 0
    events: int = 0
    service_checks: int = 0
    segments: int = 0
    series_active: int = 0
    segment_lag_ms: int = 0  # age of the oldest segment the window job has not committed
    #: partials (rows) and their samples that did not reach the log, by reason
    #: (``spool_quota``, ``disk_full``): received and combined, then refused by the writer
    refused_partials: collections.Counter[str] = field(default_factory=collections.Counter)
    refused_samples: collections.Counter[str] = field(default_factory=collections.Counter)
    write_backpressure: int = 0  # rolls that waited for the segment writer (queue full)
    write_blocked_ms: int = 0  # how long they waited
    syscalls: int = 0  # datagram reads (recvmmsg or recv calls)
    read_ahead_full: int = 0  # times a reader thread waited for the loop (READ_AHEAD_BYTES)
    read_errors: int = 0  # datagram reads failed with ENOMEM/ENOBUFS/ECONNREFUSED, retried
    full_collections: int = 0  # run by the receiver itself (collector.FullCollections)
    full_collection_ms: int = 0  # their total pause
    rejected: collections.Counter[str] = field(default_factory=collections.Counter)
    adjusted: collections.Counter[str] = field(default_factory=collections.Counter)
    kernel_drops: collections.Counter[str] = field(default_factory=collections.Counter)
    udp_rcvbuf_errors: int = 0  # namespace-wide, since start: context, not only ours
    #: datagrams (and TCP reads) from clients beyond the per-client limit, by reason
    #: (``client_limit``): counted together, not per client (``clients.py``)
    clients_overflowed: collections.Counter[str] = field(default_factory=collections.Counter)
    reject_sample: collections.deque[dict[str, str]] = field(
        default_factory=lambda: collections.deque(maxlen=REJECT_SAMPLE_SIZE)
    )

    def accounted(self) -> int:
        return (
            self.metric_lines + self.events + self.service_checks + sum(self.rejected.values())
        )

    def to_json(self) -> dict[str, object]:
        return {
            "datagrams": self.datagrams,
            "tcp_connections": self.tcp_connections,
            "lines": self.lines,
            "metric_lines": self.metric_lines,
            "samples": self.samples,
            "events": self.events,
            "service_checks": self.service_checks,
            "segments": self.segments,
            "series_active": self.series_active,
            "segment_lag_ms": self.segment_lag_ms,
            "refused_partials": dict(self.refused_partials),
            "refused_samples": dict(self.refused_samples),
            "write_backpressure": self.write_backpressure,
            "write_blocked_ms": self.write_blocked_ms,
            "syscalls": self.syscalls,
            "read_ahead_full": self.read_ahead_full,
            "read_errors": self.read_errors,
            "full_collections": self.full_collections,
            "full_collection_ms": self.full_collection_ms,
            "rejected": dict(self.rejected),
            "adjusted": dict(self.adjusted),
            "kernel_drops": dict(self.kernel_drops),
            "udp_rcvbuf_errors": self.udp_rcvbuf_errors,
            "clients_overflowed": dict(self.clients_overflowed),
            "reject_sample": list(self.reject_sample),
        }


@dataclass(slots=True)
class _Connection:
    sock: socket.socket
    lines: LineAssembler
    key: int  # the client (``sources.TCP`` | serial)


@dataclass(slots=True)
class _ClientNotes:
    """The general path's lines a client batch needs one by one, by line index."""

    rejected: dict[str, list[int]] = field(default_factory=dict)
    not_metrics: list[int] = field(default_factory=list)
    #: telemetry lines: (line, counter name, value, tags)
    telemetry: list[tuple[int, str, float, tuple[tuple[str, str], ...]]] = field(
        default_factory=list)

    def reject(self, reason: str, line: int) -> None:
        self.rejected.setdefault(reason, []).append(line)


class Receiver:
    """Serves one or more sockets into one segment stream. Not thread-safe: call ``run``."""

    def __init__(
        self,
        sockets: socket.socket | Sequence[socket.socket],
        writer: SegmentWriter | SegmentQueue,
        combiner: PaneCombiner,
        clock: Clock,
        *,
        roll_ms: int = 250,
        heartbeat_interval_ms: int = 1000,
        limits: ProtocolLimits = DEFAULT_LIMITS,
        max_skew_ms: int = DEFAULT_MAX_SKEW_MS,
        cardinality: CardinalityLimits = CardinalityLimits(),  # noqa: B008 - frozen
        stats_path: Path | None = None,
        proc_net: Path = kernel.PROC_NET,
        fast_path: bool = True,
        recvmmsg: bool = True,
        checkpoints: Sequence[Path] | None = None,
        read_ahead_bytes: int = READ_AHEAD_BYTES,
        full_collections: FullCollections | None = None,
        worker_nice: int = 0,
        max_clients: int = client_counts.DEFAULT_MAX_CLIENTS,
    ) -> None:
        """``writer``: a ``SegmentQueue`` writes on its own thread; a bare ``SegmentWriter``
        writes in ``roll`` itself. ``recvmmsg``: many datagrams per system call on Linux.
        ``checkpoints``: the running config's query checkpoints (``WindowPlan.checkpoints``), for
        the segment lag.
        ``read_ahead_bytes``: while ``run`` runs, datagram sockets are read by read-ahead
        threads holding up to this much (0: read by the loop itself).
        ``full_collections``: run the garbage collector's full collections from ``roll``
        (a receiver process takes them off the automatic schedule: ``collector.py``).
        ``worker_nice``: while compiled readers read the datagram sockets, ``run``'s thread
        and the segment writer run this many nice steps below them (``priority.py``).
        ``max_clients``: senders counted one by one (``clients.py``); the others together."""
        if max_skew_ms < 0:
            raise ValueError(f"max_skew_ms must be >= 0, got {max_skew_ms}")
        self._sockets = [sockets] if isinstance(sockets, socket.socket) else list(sockets)
        self._selector = selectors.DefaultSelector()
        self._udp_inodes: dict[int, str] = {}
        for sock in self._sockets:
            sock.setblocking(False)
            listening = sock.type == socket.SOCK_STREAM
            self._selector.register(sock, selectors.EVENT_READ, "accept" if listening else None)
            if sock.family in (socket.AF_INET, socket.AF_INET6) and not listening:
                self._udp_inodes[kernel.socket_inode(sock)] = describe(sock)
        self._connections: dict[int, _Connection] = {}
        self._connection_names: dict[int, str] = {}
        self._connection_serial = 0
        self.clients = Clients(max_clients, name_of=self._name_client)
        self._next_client_expiry_ms = 0
        self._kernel_polled_ms = 0
        self._writer = writer if isinstance(writer, SegmentQueue) else SegmentQueue(writer, depth=0)
        self._reader = DatagramReader(batched=recvmmsg)
        self._read_ahead_bytes = read_ahead_bytes
        self._worker_nice = worker_nice
        self._read_ahead: ReadAhead | None = None
        self._datagram_sockets = [s for s in self._sockets if s.type == socket.SOCK_DGRAM]
        if read_ahead_bytes and self._datagram_sockets:
            prepare_read_ahead()  # now, while LLVM is loaded for the fast path anyway
        self._read_ahead_full_seen = 0
        self._truncated_seen = 0  # datagrams cut by every reader, counted so far
        self._truncated_by_stopped = 0  # by read-aheads stopped since
        self._read_errors_seen = 0  # transient read errors of every reader, counted so far
        self._read_errors_by_stopped = 0  # by read-aheads stopped since
        self._read_error_logged_ms: int | None = None
        self._full_collections = full_collections
        self._checkpoints = list(checkpoints) if checkpoints is not None else None
        self._next_lag_poll_ms = 0
        self._lag_ms: int | None = None
        self._first_segment: int | None = None
        self._combiner = combiner
        self._clock = clock
        self._roll_ms = roll_ms
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._limits = limits
        self._max_skew_ms = max_skew_ms
        self._guard = CardinalityGuard(cardinality, on_expire=self._forget_series)
        # Datagram sockets: whole-buffer parsing of the common line shape (see fastpath.py).
        self._fast = (
            FastPath(combiner, limits.max_line_bytes, cardinality.ttl_ms) if fast_path else None
        )
        self.fast_lines = 0  # lines combined by the fast path (for tests and benchmarks)
        self.fast_conflicts = 0  # type conflicts the fast path counted in bulk (the same)
        self._stats_path = stats_path
        self._proc_net = proc_net
        self.stats = IngestStats()
        # Restarted on a clock behind the stream's last heartbeat (a host back with its clock
        # stepped back): keep the promise the previous process made, never a smaller one.
        self._last_now_ms = self._last_heartbeat_ms()
        self._last_segment_ms = 0
        self._pending_self_metrics = IngestStats()
        self._rcvbuf_errors_at_start = kernel.udp_rcvbuf_errors(proc_net)
        self._next_kernel_poll_ms = 0

    def _name_client(self, key: int) -> str | None:
        """A client's name where its key holds no address (``sources``)."""
        if key & sources.TCP:
            return self._connection_names.get(key)
        if key & sources.UNIX:
            fd = key & ~sources.UNIX
            return next((describe(s) for s in self._datagram_sockets if s.fileno() == fd), None)
        if key & sources.IPV6:
            address = self._reader.ipv6_names.get(key)
            if address is None and self._read_ahead is not None:
                address = self._read_ahead.ipv6_name(key)
            return None if address is None else f"udp://[{address}]:{sources.port_of(key)}"
        return None

    @property
    def listening(self) -> list[str]:
        return [describe(sock) for sock in self._sockets]

    def _last_heartbeat_ms(self) -> int:
        """The heartbeat of this stream's last segment (0 if none or unreadable)."""
        writer = self._writer.writer
        existing = list_segments(writer.spool, writer.receiver, upto=writer.next_sequence)
        try:
            return read_heartbeat(existing[-1]).heartbeat_ms if existing else 0
        except (OSError, pa.ArrowException):  # deleted by retention meanwhile
            return 0

    def now_ms(self) -> int:
        """The receive clock, never going backwards (not across restarts either).

        A wall clock stepped back by NTP would otherwise give later datagrams earlier event
        times than a heartbeat already promised ("nothing earlier than t"), making them late.
        """
        now = self._clock.now_ms()
        if now < self._last_now_ms:
            now = self._last_now_ms
        self._last_now_ms = now
        return now

    def run(self, stop: threading.Event) -> None:
        """Receive until ``stop`` is set, then drain the sockets and write a closing segment."""
        self._start_read_ahead()
        self._yield_to_readers()
        next_roll = self.now_ms() + self._roll_ms
        while not stop.is_set():
            timeout_s = max(0, next_roll - self.now_ms()) / 1000
            handled = 0
            for key, _ in self._selector.select(min(timeout_s, 0.25)):
                handled += self._service(key)
            if 0 < handled < COALESCE_DATAGRAMS:
                time.sleep(COALESCE_S)
            now = self.now_ms()
            if now >= next_roll:
                self.roll(now)
                next_roll = now + self._roll_ms
        self._stop_read_ahead()
        self.close()

    def _start_read_ahead(self) -> None:
        if not self._read_ahead_bytes or not self._datagram_sockets:
            return
        for sock in self._datagram_sockets:
            self._selector.unregister(sock)
        read_ahead = read_ahead_for(self._datagram_sockets, self._read_ahead_bytes)
        self._selector.register(read_ahead.wake_fd, selectors.EVENT_READ, "read-ahead")
        self._read_ahead = read_ahead
        read_ahead.start()

    def _yield_to_readers(self) -> None:
        """Once readers that never take the GIL run, this thread (the loop) and the segment
        writer go ``worker_nice`` below them: a reader waking to a filling socket buffer gets
        a core from them (``priority.py``). Not with Python readers: they need the GIL these
        threads hold, so slowing them would slow the readers too."""
        read_ahead = self._read_ahead
        if not self._worker_nice or read_ahead is None or read_ahead.needs_gil:
            return
        for thread_id in (threading.get_native_id(), self._writer.thread_id):
            if thread_id is not None:
                nice = lower_thread_priority(thread_id, self._worker_nice)
                log.debug("thread %d of receiver %s at nice %s", thread_id,
                          self._writer.receiver, nice)

    def _stop_read_ahead(self) -> None:
        """Stop the reader threads, take what they read; the loop reads the sockets again."""
        read_ahead = self._read_ahead
        if read_ahead is None:
            return
        read_ahead.stop()
        while self._take_read_ahead():
            pass
        self._selector.unregister(read_ahead.wake_fd)
        read_ahead.close()
        self._truncated_by_stopped += read_ahead.truncated
        self._read_errors_by_stopped += read_ahead.read_errors
        self._read_ahead = None
        for sock in read_ahead.sockets:
            self._selector.register(sock, selectors.EVENT_READ, None)

    def _take_read_ahead(self) -> int:
        read_ahead = self._read_ahead
        assert read_ahead is not None
        full = read_ahead.full_waits
        if full != self._read_ahead_full_seen:
            self.stats.read_ahead_full += full - self._read_ahead_full_seen
            self._pending_self_metrics.read_ahead_full += full - self._read_ahead_full_seen
            self._read_ahead_full_seen = full
        self._count_truncated()
        taken = read_ahead.take()
        if not taken:
            return 0
        received = sum(chunk.count for chunk in taken)
        self.stats.syscalls += sum(chunk.calls for chunk in taken)
        self.stats.datagrams += received
        self._pending_self_metrics.datagrams += received
        # each datagram already ends in a newline; one buffer is not copied again
        if len(taken) == 1:
            chunk = taken[0]
        else:
            chunk = Chunk(b"".join([c.buffer for c in taken]), received, 0,
                          np.concatenate([c.keys for c in taken]),
                          np.concatenate([c.lengths for c in taken]))  # fmt: skip
        self._ingest_buffer(chunk.buffer, self.now_ms(), chunk)
        return received

    def close(self) -> None:
        """Read what is queued, end every TCP connection (its last unterminated line counts),
        and write the closing segment. The listening sockets belong to the caller."""
        # More may be queued than one call reads; bounded, so a client that never stops
        # sending over TCP cannot hold the shutdown forever.
        for _ in range(1000):
            if not self.receive_available():
                break
        for fd in list(self._connections):
            self._end_connection(fd)
        # The last data first, then the closing segment with what the writer refused of it
        # (over the spool quota): its own rows are never refused for the quota, so the
        # refusal is counted in the log, not only in the stats file.
        self.roll(self.now_ms())
        self._writer.flush()
        self.roll(self.now_ms(), closed=True)
        self._writer.close()  # waits until every segment is written
        self._take_writer_counts()  # what the closing one refused (disk_full): in the stats
        self._write_stats()
        self._selector.close()

    def receive_available(self) -> int:
        """Read everything queued on every socket right now (bounded per socket) and combine
        it; returns the number of datagrams and TCP reads handled."""
        handled = 0
        for key, _ in self._selector.select(0):
            handled += self._service(key)
        return handled

    def _service(self, key: selectors.SelectorKey) -> int:
        if key.data == "read-ahead":
            return self._take_read_ahead()
        sock = key.fileobj
        assert isinstance(sock, socket.socket)
        if key.data == "accept":
            self._accept(sock)
            return 0
        if isinstance(key.data, _Connection):
            return self._read_stream(key.data)
        return self._read_datagrams(sock)

    def _read_datagrams(self, sock: socket.socket) -> int:
        """Everything queued on ``sock`` (up to MAX_DATAGRAMS_PER_WAKEUP), as one buffer."""
        chunk = self._reader.read_queued(sock, MAX_DATAGRAMS_PER_WAKEUP)
        self.stats.syscalls += chunk.calls
        self._count_truncated()
        if chunk.count:
            self.stats.datagrams += chunk.count
            self._pending_self_metrics.datagrams += chunk.count
            self._ingest_buffer(chunk.buffer, self.now_ms(), chunk)
        return chunk.count

    def _ingest_datagrams(self, datagrams: list[bytes], recv_ms: int) -> None:
        """Parse and combine datagrams received together (see ``_ingest_buffer``)."""
        self._ingest_buffer(b"\n".join([*datagrams, b""]), recv_ms)

    def _ingest_buffer(self, buffer: bytes, recv_ms: int, chunk: Chunk | None = None) -> None:
        """Parse and combine one wake-up's datagrams, joined by newlines; the same outcome as
        ``parse_datagram`` and ``_account`` line by line, with the common lines combined in
        bulk. (A line never spans datagrams: each ends where its datagram does.) ``chunk``:
        the datagrams' senders and lengths, to count per client (``clients.py``)."""
        notes = _ClientNotes() if chunk is not None else None
        if self._fast is None:
            result = parse_datagram(buffer, self._limits)
            self._account(result, recv_ms, notes)
            if chunk is not None and notes is not None:
                ends = np.flatnonzero(np.frombuffer(buffer, dtype=np.uint8) == ord("\n"))
                starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
                self._count_clients(chunk, starts, ends, notes, None, None, recv_ms)
            return
        split = self._fast.split(buffer, recv_ms)
        fast, slots, values = split.fast, split.fast_slots, split.fast_values
        weights = split.fast_weights
        slow, conflicts = split.slow, split.conflicts
        slow_lines: np.ndarray | None = None  # the general path's line i: slow_lines[i]
        if len(slow):
            if not len(fast) and not len(conflicts):
                result = parse_datagram(buffer, self._limits)
            else:
                result = parse_datagram(b"\n".join(split.lines(slow)), self._limits)
                slow_lines = slow
                if len(conflicts) and result.metric_lines:
                    # Counted in bulk, their sampled lines would go before this buffer's
                    # other metric lines' (type conflicts, adjustments): the general path
                    # keeps the sample in line order. (Rejects are sampled after all of them.)
                    slow = np.sort(np.concatenate([slow, conflicts]))
                    conflicts = conflicts[:0]
                    result = parse_datagram(b"\n".join(split.lines(slow)), self._limits)
                    slow_lines = slow
                # A series with lines on both paths in one wake-up: all its lines take the
                # general path, in line order (gauge deltas and sums depend on the order).
                demote = self._shared_series(result, slots)
                if demote is not None:
                    moved = np.isin(slots, demote)
                    slow = np.sort(np.concatenate([slow, fast[moved]]))
                    fast, slots, values = fast[~moved], slots[~moved], values[~moved]
                    weights = weights[~moved]
                    result = parse_datagram(b"\n".join(split.lines(slow)), self._limits)
                    slow_lines = slow
        if len(conflicts):
            self._count_type_conflicts(split.lines(conflicts[-REJECT_SAMPLE_SIZE:]),
                                       len(conflicts))  # fmt: skip
        if len(slow):
            self._sync_guard()
            self._account(result, recv_ms, notes)
        if len(fast):
            self._combiner.add_fast(slots, values, recv_ms, weights)
            self._combiner.seen_ms[slots] = recv_ms
            n = len(fast)
            self.fast_lines += n
            stats, pending = self.stats, self._pending_self_metrics
            stats.lines += n
            pending.lines += n
            stats.metric_lines += n
            pending.metric_lines += n
            weighed = int(weights.sum())
            stats.samples += weighed
            pending.samples += weighed
        if chunk is not None and notes is not None:
            self._count_clients(chunk, split.starts, split.ends, notes,
                                slow_lines if len(slow) else None, conflicts)  # fmt: skip

    def _count_clients(
        self, chunk: Chunk, starts: np.ndarray, ends: np.ndarray, notes: _ClientNotes,
        slow_lines: np.ndarray | None, conflicts: np.ndarray | None, recv_ms: int | None = None,
    ) -> None:
        """Count the batch per client: datagrams and lines with numpy, the general path's
        rejects, non-metric and telemetry lines (``notes``, by their index in the general
        path's buffer, ``slow_lines`` mapping it to the batch's line) one by one."""
        now_ms = self.now_ms() if recv_ms is None else recv_ms
        datagram_ends = np.cumsum(chunk.lengths + 1)
        first_line = np.concatenate([[0], np.searchsorted(starts, datagram_ends)])
        empty = np.flatnonzero(ends == starts)
        lines = np.diff(first_line)
        if len(empty):
            lines = lines - np.diff(np.searchsorted(empty, first_line))
        batch = Batch(chunk.keys, lines, first_line)

        def lines_of(positions: list[int]) -> np.ndarray:
            at = np.array(positions, dtype=np.int64)
            return slow_lines[at] if slow_lines is not None else at

        for reason, positions in notes.rejected.items():
            batch.rejected[reason] = lines_of(positions)
        if conflicts is not None and len(conflicts):
            batch.rejected["type_conflict"] = np.concatenate(
                [batch.rejected.get("type_conflict", np.zeros(0, np.int64)), conflicts])
        if notes.not_metrics:
            batch.not_metrics.append(lines_of(notes.not_metrics))
        if notes.telemetry:
            at = lines_of([line for line, _, _, _ in notes.telemetry])
            batch.not_metrics.append(at)
            reports: dict[int, Report] = {}
            for line, (_, name, value, tags) in zip(at.tolist(), notes.telemetry, strict=True):
                unit = int(batch.units_of(np.array([line]))[0])
                report = reports.get(unit)
                if report is None:
                    end = int(first_line[unit + 1])
                    report = reports[unit] = Report(
                        line, unit, int(np.count_nonzero(ends[line:end] > starts[line:end])),
                        {}, tags)  # fmt: skip
                report.counters[name] = report.counters.get(name, 0.0) + value
            batch.reports = list(reports.values())
        self.clients.observe(batch, now_ms)

    def _count_type_conflicts(self, last_lines: list[bytes], count: int) -> None:
        """``count`` lines the fast path found to be type conflicts, the last of them
        ``last_lines`` (only those can stay in the bounded sample)."""
        self.fast_conflicts += count
        stats, pending = self.stats, self._pending_self_metrics
        stats.lines += count
        pending.lines += count
        stats.rejected["type_conflict"] += count - len(last_lines)
        pending.rejected["type_conflict"] += count - len(last_lines)
        for line in last_lines:
            self._count("rejected", "type_conflict", line)

    def _shared_series(self, result: ParseResult, fast_slots: np.ndarray) -> np.ndarray | None:
        """Slots of the fast lines whose series also has a line in ``result``, if any."""
        if not result.metric_lines:
            return None
        combiner = self._combiner
        in_fast = np.zeros(combiner.slots_used, dtype=bool)
        in_fast[fast_slots] = True
        shared = set()
        for _, samples in result.metric_lines:
            first = samples[0]
            slot = combiner.slot_of((first.metric, first.metric_type, canonical_tags(first.tags)))
            if slot is not None and slot < len(in_fast) and in_fast[slot]:
                shared.add(slot)
        return np.array(sorted(shared), dtype=np.int64) if shared else None

    def _sync_guard(self) -> None:
        """Tell the guard about the fast path's activity, oldest first (see ``refresh``)."""
        combiner = self._combiner
        used = combiner.slots_used
        pending = np.flatnonzero(combiner.seen_ms[:used] != combiner.synced_ms[:used])
        if not len(pending):
            return
        pending = pending[np.argsort(combiner.seen_ms[pending], kind="stable")]
        seen = combiner.seen_ms[pending]
        series = combiner.slot_series
        self._guard.refresh_many([series[slot] for slot in pending.tolist()], seen.tolist())
        combiner.synced_ms[pending] = seen

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return
        if len(self._connections) >= MAX_TCP_CONNECTIONS:
            log.warning("more than %d TCP connections: closing a new one", MAX_TCP_CONNECTIONS)
            conn.close()
            return
        conn.setblocking(False)
        self._connection_serial += 1
        key = sources.TCP | self._connection_serial
        with contextlib.suppress(OSError):
            self._connection_names[key] = str(ListenSpec("tcp", *conn.getpeername()[:2]))
        connection = _Connection(conn, LineAssembler(self._limits.max_line_bytes), key)
        self._connections[conn.fileno()] = connection
        self._selector.register(conn, selectors.EVENT_READ, connection)
        self.stats.tcp_connections += 1
        self._pending_self_metrics.tcp_connections += 1

    def _read_stream(self, connection: _Connection) -> int:
        try:
            data = connection.sock.recv(MAX_TCP_READ_BYTES)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:  # reset by the peer: what was buffered still counts
            data = b""
        if not data:
            self._end_connection(connection.sock.fileno())
            return 1
        complete, overlong = connection.lines.feed(data)
        result = parse_datagram(complete, self._limits) if complete else ParseResult()
        self._count_overlong(result, overlong)
        self._account_stream(connection.key, complete, result)
        return 1

    def _account_stream(self, key: int, lines: bytes, result: ParseResult) -> None:
        """A TCP read's lines: accounted, and counted for its connection as one unit."""
        notes = _ClientNotes()
        now_ms = self.now_ms()
        self._account(result, now_ms, notes)
        if not lines.endswith(b"\n"):
            lines += b"\n"
        ends = np.flatnonzero(np.frombuffer(lines, dtype=np.uint8) == ord("\n"))
        starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
        unit = Chunk(lines, 1, 0, np.array([key], dtype=np.int64),
                     np.array([len(lines) - 1], dtype=np.int64))  # fmt: skip
        self._count_clients(unit, starts, ends, notes, None, None, now_ms)

    def _end_connection(self, fd: int) -> None:
        connection = self._connections.pop(fd)
        self._selector.unregister(connection.sock)
        rest = connection.lines.close()
        connection.sock.close()
        if rest:
            self._account_stream(connection.key, rest, parse_datagram(rest, self._limits))
        self._connection_names.pop(connection.key, None)

    def _count_truncated(self) -> None:
        """Datagrams longer than a read slot (64 KiB: only a Unix datagram socket's can be)
        are cut back to their last newline by the readers; the line cut off in each new one
        is a ``line_too_long`` reject (a line of unknown length: its datagram's rest is
        gone)."""
        total = self._truncated_by_stopped + self._reader.truncated
        if self._read_ahead is not None:
            total += self._read_ahead.truncated
        for _ in range(total - self._truncated_seen):
            self.stats.lines += 1
            self._pending_self_metrics.lines += 1
            self._count("rejected", "line_too_long", TRUNCATED_SAMPLE)
        self._truncated_seen = total

    def _count_read_errors(self) -> None:
        """Reads the kernel failed for want of memory (ENOMEM, ENOBUFS) or with a pending
        ICMP error (ECONNREFUSED): the readers paused and read again, losing nothing by
        themselves (what the kernel then dropped is in ``kernel_drops``). Counted in
        ``read_errors`` once per roll (no invariant needs them sooner, unlike the truncated
        lines' rejects, so not on the per-wake-up path), and logged at most once a minute."""
        total = self._read_errors_by_stopped + self._reader.read_errors
        last_error = self._reader.last_read_error
        if self._read_ahead is not None:
            total += self._read_ahead.read_errors
            last_error = self._read_ahead.last_read_error or last_error
        new = total - self._read_errors_seen
        if new <= 0:
            return
        self._read_errors_seen = total
        self.stats.read_errors += new
        self._pending_self_metrics.read_errors += new
        now_ms = self.now_ms()
        if self._read_error_logged_ms is None or now_ms - self._read_error_logged_ms >= 60_000:
            self._read_error_logged_ms = now_ms
            log.warning(
                "datagram reads failed %d more time(s) (last: %s), %d in all; retried",
                new, os.strerror(last_error) if last_error else "unknown", total,
            )  # fmt: skip

    def _count_overlong(self, result: ParseResult, overlong: int) -> None:
        for _ in range(overlong):
            result.lines += 1
            result.rejects.append(Reject("line_too_long", b"<TCP line without a newline>"))
            result.reject_positions.append(0)  # cut off before the read's first whole line

    def _account(self, result: ParseResult, recv_ms: int, notes: _ClientNotes | None = None
                 ) -> None:
        """Count and combine what the general parser made of some lines; ``notes`` collects
        the lines a client batch counts one by one (by ``result``'s positions)."""
        stats, pending = self.stats, self._pending_self_metrics
        stats.lines += result.lines
        pending.lines += result.lines
        metric_lines = samples_added = 0
        if notes is not None and len(result.metric_positions) != len(result.metric_lines):
            notes = None  # a result built by hand, without positions: no client counts
        positions = result.metric_positions if notes is not None else ()
        for index, (line, samples) in enumerate(result.metric_lines):
            first = samples[0]
            if self._combiner.known_type(first.metric) not in (None, first.metric_type):
                # "x:1|c" then "x:1|g": one name, one meaning (the first one seen)
                self._count("rejected", "type_conflict", line)
                if notes is not None:
                    notes.reject("type_conflict", positions[index])
                if self._fast is not None and first.timestamp_ms is None and len(samples) == 1:
                    self._fast.remember_conflict(line, first.metric)
                continue
            telemetry = first.metric.startswith(client_counts.TELEMETRY_PREFIX)
            if telemetry and notes is not None:
                notes.telemetry.append((
                    positions[index], first.metric[len(client_counts.TELEMETRY_PREFIX):],
                    sum(s.value for s in samples), first.tags))  # fmt: skip
            event_ms = recv_ms
            if first.timestamp_ms is not None:
                if abs(first.timestamp_ms - recv_ms) <= self._max_skew_ms:
                    event_ms = first.timestamp_ms
                else:
                    # "x:1|c|T1" (1970) or a clock a day ahead: receive time instead
                    self._count("adjusted", "timestamp_out_of_range", line)
            if first.unknown_fields:
                # "x:1|c|f:future": kept without the field
                self._count("adjusted", "unknown_field", line)
            admitted = self._guard.admit((first.metric, first.metric_type, first.tags), recv_ms)
            if not admitted:
                self._count("adjusted", "cardinality_limited", line)
                # A new name goes to the shared overflow series: names stay bounded too.
                metric = self._guard.overflow_metric(first.metric, first.metric_type)
                samples = [dataclasses.replace(s, metric=metric, tags=OVERFLOW_TAGS)
                           for s in samples]  # fmt: skip
            self._combiner.remember_type(samples[0])
            for sample in samples:
                slot = self._combiner.add(sample, event_ms, recv_ms)
            if admitted and self._fast is not None:
                combiner = self._combiner
                combiner.admitted[slot] = True
                combiner.seen_ms[slot] = combiner.synced_ms[slot] = recv_ms
                # Not a line with unknown fields: the fast path would not count them. Nor a
                # client's telemetry: its lines must reach the client counts one by one.
                if first.timestamp_ms is None and not first.unknown_fields and not telemetry:
                    self._fast.remember(line, slot, first.sample_rate)
            metric_lines += 1
            samples_added += sum(sample_weight(s.metric_type, s.sample_rate) for s in samples)
        stats.metric_lines += metric_lines
        pending.metric_lines += metric_lines
        stats.samples += samples_added
        pending.samples += samples_added
        stats.events += len(result.events)
        pending.events += len(result.events)
        stats.service_checks += len(result.service_checks)
        pending.service_checks += len(result.service_checks)
        for reason, line in result.adjusted:
            self._count("adjusted", reason, line)
        for reject in result.rejects:
            self._count("rejected", reject.reason, reject.line)
        if notes is not None and len(result.reject_positions) == len(result.rejects):
            for reject, position in zip(result.rejects, result.reject_positions, strict=True):
                notes.reject(reject.reason, position)
            notes.not_metrics += result.event_positions
            notes.not_metrics += result.service_check_positions

    def _count(self, kind: str, reason: str, line: bytes) -> None:
        getattr(self.stats, kind)[reason] += 1
        getattr(self._pending_self_metrics, kind)[reason] += 1
        self.stats.reject_sample.append(
            {"reason": reason, "line": line[:256].decode("utf-8", "replace")}
        )

    def _forget_series(self, series: SeriesId) -> None:
        self._combiner.forget(*series)
        if not self._guard.tracks(series[0]):
            self._combiner.forget_type(series[0])
            if self._fast is not None:
                self._fast.forget_conflicts(series[0])

    def roll(self, now_ms: int, *, closed: bool = False) -> None:
        """Write a segment if there is data, a heartbeat is due, or the receiver is closing."""
        self._poll_kernel(now_ms, force=closed)
        self._take_writer_counts()
        self._count_read_errors()
        self._poll_lag(now_ms)
        self._sync_guard()
        self._guard.expire(now_ms)
        self.stats.series_active = self._guard.active
        self._add_self_metrics(now_ms)
        if now_ms >= self._next_client_expiry_ms:
            self._next_client_expiry_ms = now_ms + CLIENT_EXPIRY_POLL_MS
            for name, tags in self.clients.expire(now_ms):
                self._combiner.forget(client_counts.PREFIX + name, "c", tags)
        heartbeat_due = now_ms - self._last_segment_ms >= self._heartbeat_interval_ms
        if len(self._combiner) == 0 and not heartbeat_due and not closed:
            return
        # Every datagram combined so far was received at or before now_ms, and every later
        # one will be stamped at or after it (now_ms never goes backwards): the heartbeat.
        # Client timestamps (|T) in the past do not hold it back: those partials are late.
        # Detached, not built: the writer thread builds the batch (Arrow columns, sketches)
        # and writes it, in append order, so the heartbeat still follows all of its rows.
        self._writer.append(self._combiner.detach(), Heartbeat(now_ms, closed))
        self.stats.segments += 1
        self._last_segment_ms = now_ms
        self._take_writer_counts()  # in the stats now, in the log with the next segment
        self._collect_garbage(now_ms)
        self._write_stats()

    def _collect_garbage(self, now_ms: int) -> None:
        """A due full collection, right after the combiner's partials were handed over."""
        scheduled = self._full_collections
        took_ms = None if scheduled is None else scheduled.maybe_collect(now_ms)
        if took_ms is None:
            return
        # the pending self-metrics are written with the next roll's
        for stats in (self.stats, self._pending_self_metrics):
            stats.full_collections += 1
            stats.full_collection_ms += took_ms

    def _take_writer_counts(self) -> None:
        """What the segment writer refused or waited for since the last roll."""
        counts: WriterCounts = self._writer.take_counts()
        stats, pending = self.stats, self._pending_self_metrics
        for reason, n in counts.refused_partials.items():
            stats.refused_partials[reason] += n
            pending.refused_partials[reason] += n
        for reason, n in counts.refused_samples.items():
            stats.refused_samples[reason] += n
            pending.refused_samples[reason] += n
        stats.write_backpressure += counts.backpressure
        pending.write_backpressure += counts.backpressure
        stats.write_blocked_ms += counts.blocked_ms
        pending.write_blocked_ms += counts.blocked_ms

    def _poll_lag(self, now_ms: int) -> None:
        """Segment lag: how old the oldest segment of this stream is that the window job has
        not committed yet (0 when every query read everything), every LAG_POLL_MS.

        The window job runs several queries over the stream (one per window, each with its own
        checkpoint), and a segment is done only once *all* of them committed it: the oldest
        unread segment is the one after the *smallest* committed sequence (or passed over:
        ``retention.done_sequences``, an idle query's segments with nothing for it). Only the
        running config's checkpoints count (``checkpoints``, from ``WindowPlan.checkpoints``): one
        left by an older config stops moving and is not lag. A query that has committed
        nothing of this stream yet (a new checkpoint rebuilding from the log) has the stream's
        first segment as its oldest.
        """
        if self._checkpoints is None or now_ms < self._next_lag_poll_ms:
            return
        self._next_lag_poll_ms = now_ms + LAG_POLL_MS
        writer = self._writer.writer
        receiver = writer.receiver
        oldest = writer.next_sequence  # every query read everything written
        for checkpoint in self._checkpoints:
            try:
                committed = done_sequences(checkpoint)  # an idle lane's passed-over too
            except (OSError, ValueError, KeyError):  # a commit being written right now
                continue
            if committed and receiver in committed:
                oldest = min(oldest, committed[receiver] + 1)
            else:
                oldest = min(oldest, self._first_sequence())
        lag = 0
        if oldest < writer.next_sequence:
            try:
                lag = max(0, now_ms - read_heartbeat(segment_at(
                    writer.spool, receiver, oldest)).heartbeat_ms)
            except (OSError, pa.ArrowException):  # not written yet, or deleted meanwhile
                lag = self.stats.segment_lag_ms
        self.stats.segment_lag_ms = lag
        self._lag_ms = lag

    def _first_sequence(self) -> int:
        """The stream's oldest segment still in the spool (listed once, while it exists)."""
        writer = self._writer.writer
        first = self._first_segment
        if first is None or not segment_at(writer.spool, writer.receiver, first).exists():
            existing = list_segments(writer.spool, writer.receiver, upto=writer.next_sequence)
            first = self._first_segment = existing[0].sequence if existing else None
        return first if first is not None else writer.next_sequence

    def _poll_kernel(self, now_ms: int, *, force: bool = False) -> None:
        """Per-socket drops and the namespace's RcvbufErrors, at most once per second."""
        if now_ms < self._next_kernel_poll_ms and not force:
            return
        self._next_kernel_poll_ms = now_ms + KERNEL_POLL_MS
        polled, self._kernel_polled_ms = self._kernel_polled_ms, now_ms
        if self._udp_inodes:
            drops = kernel.udp_socket_drops(set(self._udp_inodes), self._proc_net)
            for inode, total in drops.items():
                where = self._udp_inodes[inode]
                new = total - self.stats.kernel_drops[where]
                if new > 0:
                    self.stats.kernel_drops[where] = total
                    self._pending_self_metrics.kernel_drops[where] += new
                    self.clients.kernel_drops(new, polled)
        errors = kernel.udp_rcvbuf_errors(self._proc_net) - self._rcvbuf_errors_at_start
        if errors > self.stats.udp_rcvbuf_errors:
            self._pending_self_metrics.udp_rcvbuf_errors += errors - self.stats.udp_rcvbuf_errors
            self.stats.udp_rcvbuf_errors = errors

    def _add_self_metrics(self, now_ms: int) -> None:
        """Feed this roll's counts back in as ordinary metrics, so they land in the store."""
        pending = self._pending_self_metrics
        counters: list[tuple[str, int, tuple[tuple[str, str], ...]]] = [
            ("datagrams", pending.datagrams, ()),
            ("tcp_connections", pending.tcp_connections, ()),
            ("lines", pending.lines, ()),
            ("samples", pending.samples, ()),
            ("events", pending.events, ()),
            ("service_checks", pending.service_checks, ()),
            ("udp_rcvbuf_errors", pending.udp_rcvbuf_errors, ()),
        ]
        counters += [("rejected", n, (("reason", r),)) for r, n in pending.rejected.items()]
        counters += [("adjusted", n, (("reason", r),)) for r, n in pending.adjusted.items()]
        counters += [("kernel_drops", n, (("listen", w),)) for w, n in pending.kernel_drops.items()]
        counters += [("refused", n, (("reason", r),)) for r, n in pending.refused_samples.items()]
        counters += [
            ("refused_partials", n, (("reason", r),)) for r, n in pending.refused_partials.items()
        ]
        overflowed = self.clients.pending_overflowed
        if overflowed:
            self.clients.pending_overflowed = 0
            reason = client_counts.CLIENT_LIMIT_REASON
            self.stats.clients_overflowed[reason] += overflowed
            pending.clients_overflowed[reason] += overflowed
        counters += [("clients_overflowed", n, (("reason", r),))
                     for r, n in pending.clients_overflowed.items()]  # fmt: skip
        counters += [
            ("write_backpressure", pending.write_backpressure, ()),
            ("write_blocked_ms", pending.write_blocked_ms, ()),
            ("read_ahead_full", pending.read_ahead_full, ()),
            ("read_errors", pending.read_errors, ()),
            ("full_collections", pending.full_collections, ()),
            ("full_collection_ms", pending.full_collection_ms, ()),
        ]
        wrote = False
        for name, value, tags in counters:
            if value:
                self._combiner.add(
                    Sample(SELF_METRIC_PREFIX + name, "c", float(value), 1.0, tags), now_ms, now_ms
                )
                wrote = True
        # per client: a telemetry report's interval at the report's receive time
        for name, amount, tags, event_ms in self.clients.take_self_metrics(now_ms):
            self._combiner.add(Sample(client_counts.PREFIX + name, "c", amount, 1.0, tags),
                               event_ms, now_ms)  # fmt: skip
        if wrote:  # with traffic only: an idle receiver writes heartbeats, not gauges
            gauges = [("series_active", self._guard.active)]
            if self._lag_ms is not None:
                gauges.append(("segment_lag_ms", self._lag_ms))
            for name, gauge in gauges:
                self._combiner.add(
                    Sample(
                        SELF_METRIC_PREFIX + name, "g", float(gauge), 1.0,
                        (("receiver", self._writer.receiver),),
                    ),
                    now_ms,
                    now_ms,
                )
        self._pending_self_metrics = IngestStats()

    def _write_stats(self) -> None:
        if self._stats_path is None:
            return
        temporary = self._stats_path.with_suffix(".tmp")
        document = self.stats.to_json()
        document["clients"] = self.clients.to_json()
        temporary.write_text(json.dumps(document, indent=1))
        os.replace(temporary, self._stats_path)


#: The walking skeleton's name, kept for callers that serve one UDP socket.
UdpReceiver = Receiver
