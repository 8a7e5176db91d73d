"""The ingest process: one receiver serving one or more sockets into one stream of the log.

Runs alone (`streamgauge ingest`) or as a child of `streamgauge run`, which binds the sockets
itself (so a port conflict is reported before anything starts) and passes them down by file
descriptor; with ``--receivers N`` it starts N children on one UDP port (``SO_REUSEPORT``),
each writing its own stream ``udp-<i>``. SIGINT/SIGTERM stop a child cleanly: it drains its
sockets and writes a closing segment, so nothing received is lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import pyarrow as pa

from streamgauge.clock import Clock, SystemClock
from streamgauge.ingest.collector import FullCollections, settle_after_startup
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.guard import CardinalityLimits
from streamgauge.ingest.log import (
    DEFAULT_MAX_SKEW_MS,
    DEFAULT_WRITE_QUEUE_DEPTH,
    SegmentQueue,
    SegmentWriter,
    validate_receiver_name,
)
from streamgauge.ingest.memory import release_library_pages
from streamgauge.ingest.priority import DEFAULT_WORKER_NICE, MAX_NICE
from streamgauge.ingest.protocol import DEFAULT_LIMITS, ProtocolLimits
from streamgauge.ingest.receiver import Receiver
from streamgauge.ingest.spool_fs import resolve_spool
from streamgauge.ingest.stream_lock import hold
from streamgauge.ingest.transports import (
    DEFAULT_RCVBUF_BYTES,
    UNIX_SOCKET_MODES,
    ListenSpec,
    bind,
    describe,
    parse_listen_spec,
)
from streamgauge.sketches.accuracy import SketchParams, compile_accuracy

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestSettings:
    data_dir: Path
    receiver: str
    pane_ms: int
    roll_ms: int = 250
    heartbeat_interval_ms: int = 1000
    fsync: bool = True
    #: A client ``|T`` is the event time only within this distance of the receive clock.
    max_skew_ms: int = DEFAULT_MAX_SKEW_MS
    limits: ProtocolLimits = DEFAULT_LIMITS
    cardinality: CardinalityLimits = field(default_factory=CardinalityLimits)
    rcvbuf_bytes: int = DEFAULT_RCVBUF_BYTES
    unix_mode: int = 0o600
    #: Nice steps the receive loop and the segment writer run below the socket readers
    #: (``priority.py``); 0 = alike.
    worker_nice: int = DEFAULT_WORKER_NICE
    #: Over this many bytes in the spool (all streams), new data is refused and counted
    #: (``streamgauge.ingest.refused{reason=spool_quota}``); 0 = no quota.
    spool_quota_bytes: int = 0
    #: Segments waiting for the writer thread before a roll waits for it (counted).
    write_queue_depth: int = DEFAULT_WRITE_QUEUE_DEPTH
    #: The config's compiled sketch accuracy: pane sketches must use the layout (HDR buckets)
    #: and sizes (HLL lgK, t-digest k) the window job merges them with.
    sketches: SketchParams = field(default_factory=compile_accuracy)
    #: Where the segment log is, when not ``data_dir/spool``: a directory or a
    #: ``pyarrow.fs`` URI (``--spool s3://bucket/prefix``), shared by several hosts.
    spool_location: str | None = None
    #: ``PipelineConfig.kll_k``: the k of the KLL sketch timer/histogram/distribution partials
    #: carry for ``quantiles: kll`` windows; ``None``: no window reads one, none is built.
    kll_k: int | None = None
    #: The running config's query checkpoints (``windows.plan.WindowPlan.checkpoints``) whose
    #: commits give ``segment_lag_ms``; ``None``: the lag is not measured.
    query_checkpoints: tuple[Path, ...] | None = None

    def __post_init__(self) -> None:
        problems = []
        if self.pane_ms <= 0:
            problems.append(f"pane_ms must be positive, got {self.pane_ms}")
        if self.roll_ms <= 0:
            problems.append(f"roll_ms must be positive, got {self.roll_ms}")
        if self.max_skew_ms < 0:
            problems.append(f"max_skew_ms must be >= 0, got {self.max_skew_ms}")
        if self.rcvbuf_bytes <= 0:
            problems.append(f"rcvbuf_bytes must be positive, got {self.rcvbuf_bytes}")
        if not 0 <= self.worker_nice <= MAX_NICE:
            problems.append(f"worker_nice must be in 0..{MAX_NICE}, got {self.worker_nice}")
        if self.spool_quota_bytes < 0:
            problems.append(f"spool_quota_bytes must be >= 0 (0 = none), got "
                            f"{self.spool_quota_bytes}")
        if self.write_queue_depth < 1:
            problems.append(f"write_queue_depth must be at least 1, got {self.write_queue_depth}")
        if self.unix_mode not in UNIX_SOCKET_MODES:
            problems.append(f"unix_mode must be 0600 or 0660, got {self.unix_mode:04o}")
        try:
            validate_receiver_name(self.receiver)
        except ValueError as error:
            problems.append(str(error))
        if problems:
            raise ValueError("ingest settings: " + "; ".join(problems))

    @property
    def spool(self) -> Path | str:
        return self.spool_location or self.data_dir / "spool"

    @property
    def stats_path(self) -> Path:
        return self.data_dir / "ingest" / f"{self.receiver}.json"

    @property
    def checkpoints(self) -> Path:
        """The root of the window job's checkpoints (``JobPaths.checkpoints``)."""
        return self.data_dir / "checkpoints"


_SIZE = re.compile(r"^(\d+)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?$")
_SIZE_UNITS = {
    None: 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
}  # fmt: skip


def parse_byte_size(text: str, name: str = "size") -> int:
    """``"0"`` (none), ``"1073741824"``, ``"500MB"``, ``"20GiB"``, … → bytes; ``name`` (the
    flag) goes into the error."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"{name} {text!r} is not a size: use a whole number of bytes with an optional unit "
            "B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)"
        )
    return int(match.group(1)) * _SIZE_UNITS[match.group(2)]


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT``, ``[V6HOST]:PORT`` or ``udp://…`` → (host, port): a UDP address."""
    spec = parse_listen_spec(text)
    if spec.scheme != "udp":
        raise ValueError(f"{text!r}: expected a UDP HOST:PORT, e.g. 127.0.0.1:8125")
    return spec.host, spec.port


def run_ingest(
    settings: IngestSettings,
    sock: socket.socket | Sequence[socket.socket] | None = None,
    listen: tuple[str, int] | Sequence[ListenSpec] = ("127.0.0.1", 8125),
    clock: Clock | None = None,
) -> None:
    """Receive until SIGINT/SIGTERM; the caller's process exits afterwards.

    ``sock``: sockets already bound (inherited from `streamgauge run`); else ``listen`` is
    bound here.
    """
    # Arrow's default pool (mimalloc) keeps freed pages resident under load (its arena holds
    # about twice what is allocated); the system pool (glibc malloc, which the receive loop
    # uses anyway) gives them back, and peak RSS under load is lower by tens of MB. Set before
    # the receiver builds anything with Arrow; buffers go back to the pool they came from, so
    # the switch is safe.
    pa.set_memory_pool(pa.system_memory_pool())
    # Importing numba ran LLVM's static constructors (most of libllvmlite resident), and
    # pyarrow mapped libraries a receiver hardly uses; release them before the receiver is
    # built, so that the start-up peak is not the imports' plus everything the receiver then
    # allocates (at one line per datagram start-up is the peak). Loading the cached fast path
    # faults most of LLVM back in (numba sets up its codegen even to link cached code),
    # released again below once the receiver is built.
    release_library_pages()
    with hold(settings.data_dir, settings.receiver, on_wait=_tell_waiting):
        _run_ingest(settings, sock, listen, clock)


def _tell_waiting(stream: str, holder: str) -> None:
    log.warning("ingest %s: waiting for the receiver still writing it (%s) to close it",
                stream, holder)  # fmt: skip


def _run_ingest(
    settings: IngestSettings,
    sock: socket.socket | Sequence[socket.socket] | None,
    listen: tuple[str, int] | Sequence[ListenSpec],
    clock: Clock | None,
) -> None:
    """``run_ingest`` once this process is its stream's one writer (``stream_lock``)."""
    if sock is None:
        specs = [ListenSpec("udp", *listen)] if isinstance(listen, tuple) else list(listen)
        sockets = bind_all(specs, settings)
    else:
        sockets = [sock] if isinstance(sock, socket.socket) else list(sock)
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        # The first signal starts the drain and the rest are ignored (SIGKILL still stops a
        # drain that hangs). When `run` dies the kernel sends SIGTERM once per thread of `run`
        # that exits (PR_SET_PDEATHSIG follows the parent thread), and Python runs a handler
        # between two bytecodes of the main thread: also inside an earlier handler's
        # ``stop.set()``, which holds the event's lock, where a second ``set()`` would wait
        # for itself forever; and a signal during the interpreter's shutdown, with the default
        # handler back, would end the process by SIGTERM after a clean drain.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        log.info("ingest %s: signal %d, draining and closing", settings.receiver, signum)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    settings.stats_path.parent.mkdir(parents=True, exist_ok=True)
    receiver_spool = resolve_spool(settings.spool)  # str() of it is redacted: fit for the log
    receiver = Receiver(
        sockets,
        SegmentQueue(
            SegmentWriter(receiver_spool, settings.receiver, fsync=settings.fsync),
            depth=settings.write_queue_depth,
            quota_bytes=settings.spool_quota_bytes,
        ),
        PaneCombiner(settings.pane_ms, sketches=settings.sketches, kll_k=settings.kll_k),
        clock or SystemClock(),
        roll_ms=settings.roll_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        limits=settings.limits,
        max_skew_ms=settings.max_skew_ms,
        cardinality=settings.cardinality,
        stats_path=settings.stats_path,
        checkpoints=settings.query_checkpoints,
        full_collections=FullCollections(),
        worker_nice=settings.worker_nice,
    )
    # The fast path is compiled (or loaded from numba's cache) by now and LLVM is done: its
    # library code (about a hundred MB) leaves this process's RSS, and so do the pages of the
    # other libraries the start-up touched; what the loop uses comes back. bench/ingest.py
    # reports the receiver's peak RSS (bench/ingest/README.md).
    released_kb = release_library_pages()
    frozen = settle_after_startup()  # see collector.py: full collections by the receiver
    log.info("ingest %s: receiving on %s, writing to %s (%d MB of library code released, %d "
             "start-up objects frozen)", settings.receiver, " ".join(receiver.listening),
             receiver_spool, released_kb >> 10, frozen)  # fmt: skip
    try:
        receiver.run(stop)
    finally:
        close_all(sockets)
    log.info("ingest %s: closed after %s", settings.receiver, receiver.stats.to_json())


def bind_all(
    specs: Sequence[ListenSpec],
    settings: IngestSettings | _BindSettings,
    *,
    reuse_port: bool = False,
) -> list[socket.socket]:
    """Bind every listener, or none: a failure closes the ones already bound."""
    sockets: list[socket.socket] = []
    try:
        for spec in specs:
            sockets.append(
                bind(
                    spec,
                    rcvbuf_bytes=settings.rcvbuf_bytes,
                    reuse_port=reuse_port and spec.scheme != "unixgram",
                    unix_mode=settings.unix_mode,
                )
            )
    except BaseException:
        close_all(sockets)
        raise
    return sockets


def close_all(sockets: Sequence[socket.socket]) -> None:
    """Close sockets; a Unix socket's file is removed (clients then fail fast, not silently)."""
    for sock in sockets:
        if sock.fileno() < 0:
            continue
        path = sock.getsockname() if sock.family == socket.AF_UNIX else ""
        sock.close()
        if path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)


def sockets_from_fds(fds: Sequence[int]) -> list[socket.socket]:
    """Rebuild inherited sockets; family and type are read back from each descriptor."""
    return [socket.socket(fileno=fd) for fd in fds]


def describe_all(sockets: Sequence[socket.socket]) -> list[str]:
    return [describe(sock) for sock in sockets]


class IngestChildren:
    """The ingest child processes of `streamgauge run`, supervised like one ``Popen``:
    ``poll`` reports the first child that exited, signals and ``kill`` go to all of them."""

    def __init__(self, children: Sequence[subprocess.Popen[bytes]]) -> None:
        if not children:
            raise ValueError("IngestChildren needs at least one process")
        self.children = list(children)
        self.returncode: int | None = None

    @property
    def pid(self) -> int:
        return self.children[0].pid

    @property
    def pids(self) -> list[int]:
        return [child.pid for child in self.children]

    def poll(self) -> int | None:
        for child in self.children:
            code = child.poll()
            if code is not None:
                self.returncode = code
                return code
        return None

    def send_signal(self, signum: int) -> None:
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signum)

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        for child in self.children:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            code = child.wait(remaining)
            if code != 0 or self.returncode is None:
                self.returncode = code
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        for child in self.children:
            if child.poll() is None:
                child.kill()


def bind_receivers(
    specs: Sequence[ListenSpec],
    receivers: int,
    *,
    rcvbuf_bytes: int = DEFAULT_RCVBUF_BYTES,
    unix_mode: int = 0o600,
) -> list[list[socket.socket]]:
    """The sockets of each of ``receivers`` ingest processes: receiver 0 gets every listener;
    the others get their own socket on each UDP port (``SO_REUSEPORT``: the kernel spreads
    senders over them). Port 0 is resolved once, so all share the port the first one got."""
    if receivers < 1:
        raise ValueError(f"--receivers must be at least 1, got {receivers}")
    udp_specs = [spec for spec in specs if spec.scheme == "udp"]
    if receivers > 1 and not udp_specs:
        raise ValueError(f"--receivers {receivers} needs a UDP listener to share")
    settings = _BindSettings(rcvbuf_bytes, unix_mode)
    first = bind_all(specs, settings, reuse_port=receivers > 1)
    groups = [first]
    try:
        bound_udp = [
            ListenSpec("udp", spec.host, sock.getsockname()[1])
            for spec, sock in zip(specs, first, strict=True)
            if spec.scheme == "udp"
        ]
        for _ in range(1, receivers):
            groups.append(bind_all(bound_udp, settings, reuse_port=True))
    except BaseException:
        for group in groups:
            for sock in group:
                sock.close()
        raise
    return groups


@dataclass(frozen=True)
class _BindSettings:
    rcvbuf_bytes: int
    unix_mode: int


def udp_address(sockets: Sequence[socket.socket]) -> str:
    """``HOST:PORT`` of the first UDP socket (what `streamgauge send --to` takes), else the
    first listener as a ``--listen`` value."""
    for sock in sockets:
        if sock.type == socket.SOCK_DGRAM and sock.family != socket.AF_UNIX:
            host, port = sock.getsockname()[:2]
            return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return describe(sockets[0])
