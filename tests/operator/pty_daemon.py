"""`streamgauge run` on a pseudo-terminal, read as a person at that terminal would see it.

The daemon is the session leader of a new session whose controlling terminal is the pty, so
``ctrl_c`` is the real thing: the terminal driver sends SIGINT to the daemon's whole process
group (the receivers, the JVM, its Python workers), as a person's Ctrl-C does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.e2e.harness import START_TIMEOUT_S, free_udp_port, stop_leftover_server

COLUMNS = 250
#: What the JVM and Spark print when they reach a terminal (none of it may reach ours).
JVM_MARKERS = (
    "WARN ", "WARNING: Using incubator", "log4j", "NativeCodeLoader", "Exception", "\tat ",
    "ERROR ", "Setting default log level", "SparkContext", "py4j", "Traceback",
)  # fmt: skip
STATUS_LINE = re.compile(
    r"in (?P<rate>[\d,]+|…) lines/s \| rejects (?P<rejects>[\d,]+) \| series (?P<series>[\d,]+)"
    r"(?: \| watermark lag (?P<lags>[^|]+) \| published (?P<published>[\d,]+) \| "
    r"late (?P<late>[\d,]+))?.*\| store lag (?P<store_lag>\S+)"
)


def run_on_terminal(
    argv: list[str], columns: int = COLUMNS, stderr: int | None = None
) -> tuple[int, subprocess.Popen[bytes]]:
    """Starts ``argv`` with a new pty as its controlling terminal; (master fd, process).
    ``stderr``: a file descriptor for its stderr instead of the pty."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))

    def controlling_terminal() -> None:
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        # As from a person's shell: Ctrl-C interrupts. A test run started in the background
        # (`make test &`) ignores SIGINT, and an ignored signal stays ignored across exec,
        # so Python would install no KeyboardInterrupt handler and Ctrl-C would do nothing.
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    # COLUMNS, when set (pytest sets it), wins over the terminal's own size
    env = {**os.environ, "COLUMNS": str(columns), "LINES": "50"}
    process = subprocess.Popen(argv, stdin=slave, stdout=slave,
                               stderr=slave if stderr is None else stderr, env=env,
                               preexec_fn=controlling_terminal)  # fmt: skip
    os.close(slave)
    return master, process


class Screen(threading.Thread):
    """Everything written to a pty, as text, collected until the other side closes."""

    def __init__(self, master: int) -> None:
        super().__init__(daemon=True)
        self._master = master
        self._data = bytearray()
        self._lock = threading.Lock()

    def run(self) -> None:
        while True:
            try:
                chunk = os.read(self._master, 65536)
            except OSError:  # EIO: every process holding the pty's other side has exited
                return
            if not chunk:
                return
            with self._lock:
                self._data += chunk

    @property
    def text(self) -> str:
        with self._lock:
            return self._data.decode(errors="replace")

    def wait_for(self, pattern: str, timeout_s: float = 90, since: int = 0) -> re.Match[str]:
        deadline = time.monotonic() + timeout_s
        compiled = re.compile(pattern)
        while time.monotonic() < deadline:
            found = compiled.search(self.text, since)
            if found:
                return found
            time.sleep(0.2)
        raise AssertionError(f"no {pattern!r} on the terminal:\n{self.text[-4000:]}")

    def status_lines(self) -> list[str]:
        """Every state the in-place status line was drawn in, oldest first (what follows an
        erase of the line and starts as the status line does; log lines are erased too)."""
        drawn = (part.split("\r")[0] for part in self.text.split("\r\x1b[K")[1:])
        return [text for text in drawn if text.startswith("in ")]


class PtyDaemon:
    """``streamgauge run`` on a terminal, with a config, a data dir and a UDP port."""

    def __init__(self, config: Path, data_dir: Path, port: int, *extra: str) -> None:
        self.data_dir = data_dir
        self.port = port
        self.master, self.process = run_on_terminal(
            [sys.executable, "-m", "streamgauge", "run", "--config", str(config),
             "--data-dir", str(data_dir), "--listen", f"127.0.0.1:{port}", *extra])  # fmt: skip
        self.screen = Screen(self.master)
        self.screen.start()
        self.info: dict[str, Any] = {}

    def wait_started(self) -> None:
        run_file = self.data_dir / "run.json"
        deadline = time.monotonic() + START_TIMEOUT_S
        while not run_file.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise AssertionError(f"daemon did not start:\n{self.screen.text[-5000:]}")
            time.sleep(0.2)
        self.info = json.loads(run_file.read_text())

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


@contextlib.contextmanager
def daemon_on(config: Path, data_dir: Path, *extra: str) -> Iterator[PtyDaemon]:
    """``streamgauge run`` on a terminal, started; killed afterwards with its embedded
    PostgreSQL."""
    daemon = PtyDaemon(config, data_dir, free_udp_port(), *extra)
    try:
        daemon.wait_started()
        yield daemon
    finally:
        daemon.kill()
        stop_leftover_server(data_dir)
