"""The ingest process: one UDP receiver writing one stream of the segment log.

Runs alone (`streamgauge ingest`) or as a child of `streamgauge run`, which binds the socket
itself (so a port conflict is reported before anything starts) and passes it down.
SIGINT/SIGTERM stop it cleanly: it drains the socket and writes a closing segment, so
nothing received is lost.
"""

from __future__ import annotations

import logging
import signal
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from streamgauge.clock import Clock, SystemClock
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import SegmentWriter
from streamgauge.ingest.receiver import UdpReceiver, bind_udp

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestSettings:
    data_dir: Path
    receiver: str
    pane_ms: int
    roll_ms: int = 250
    heartbeat_interval_ms: int = 1000
    fsync: bool = True

    @property
    def spool(self) -> Path:
        return self.data_dir / "spool"

    @property
    def stats_path(self) -> Path:
        return self.data_dir / "ingest" / f"{self.receiver}.json"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[V6HOST]:PORT`` → (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8125")
    return host.strip("[]") or "127.0.0.1", int(port)


def run_ingest(
    settings: IngestSettings,
    sock: socket.socket | None = None,
    listen: tuple[str, int] = ("127.0.0.1", 8125),
    clock: Clock | None = None,
) -> None:
    """Receive until SIGINT/SIGTERM; the caller's process exits afterwards."""
    if sock is None:
        sock = bind_udp(*listen)
    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        log.info("ingest %s: signal %d, draining and closing", settings.receiver, signum)
        stop.set()

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)
    settings.stats_path.parent.mkdir(parents=True, exist_ok=True)
    receiver = UdpReceiver(
        sock,
        SegmentWriter(settings.spool, settings.receiver, fsync=settings.fsync),
        PaneCombiner(settings.pane_ms),
        clock or SystemClock(),
        roll_ms=settings.roll_ms,
        heartbeat_interval_ms=settings.heartbeat_interval_ms,
        stats_path=settings.stats_path,
    )
    address = sock.getsockname()
    log.info("ingest %s: receiving UDP on %s:%s", settings.receiver, address[0], address[1])
    receiver.run(stop)
    sock.close()
    log.info("ingest %s: closed after %s", settings.receiver, receiver.stats.to_json())
