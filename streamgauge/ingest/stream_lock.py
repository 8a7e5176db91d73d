"""One writer per stream of the log: the receiver writing stream ``udp-0`` holds an ``flock``
on ``DATA_DIR/ingest/udp-0.lock`` for as long as it lives.

A stream's segments are numbered by its one writer (``log.SegmentWriter``), so two processes
writing the same stream would write the same sequence numbers. That can happen on a restart: a
receiver outlives its `streamgauge run` by the time it takes to drain its socket and write its
closing segment (it gets SIGTERM when its parent dies, even by SIGKILL). Until then it also
holds its port. So a restarted `run` first waits for every receiver of the data directory to
let go (``wait_for_writers``), and only then binds; a receiver takes its stream's lock before
it writes (``hold``). The kernel drops an ``flock`` with its process, so a receiver killed
outright leaves nothing to clean up. The lock file holds the holder's pid, for the message.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

#: How long a restart waits for the previous receivers: their drain and closing segment take
#: well under a second on an idle machine, seconds on a loaded one.
WAIT_S = 60.0
_POLL_S = 0.05


class StreamBusy(RuntimeError):
    """A stream's lock stayed held for the whole wait; the message names stream and pid."""


def lock_path(data_dir: Path, receiver: str) -> Path:
    return data_dir / "ingest" / f"{receiver}.lock"


def _holder(path: Path) -> str:
    with contextlib.suppress(OSError, ValueError):
        return f"pid {int(path.read_text().strip())}"
    return "pid unknown"


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait_for(
    path: Path, timeout_s: float, on_wait: Callable[[str, str], None] | None
) -> int:
    """An open descriptor of ``path`` holding its lock; raises ``StreamBusy`` at the deadline."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + timeout_s
        told = False
        while not _try_lock(fd):
            if not told and on_wait is not None:
                on_wait(path.stem, _holder(path))
                told = True
            if time.monotonic() >= deadline:
                raise StreamBusy(
                    f"stream {path.stem} is still written by another receiver ({_holder(path)}, "
                    f"lock {path}) after {timeout_s:g} s: stop that process first"
                )
            time.sleep(_POLL_S)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def hold(
    data_dir: Path,
    receiver: str,
    *,
    timeout_s: float = WAIT_S,
    on_wait: Callable[[str, str], None] | None = None,
) -> Iterator[None]:
    """Be the one writer of ``receiver``'s stream while the block runs (waiting for the last
    one first); ``on_wait(stream, holder)`` is told once if it has to wait."""
    path = lock_path(data_dir, receiver)
    fd = _wait_for(path, timeout_s, on_wait)
    try:
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        yield
    finally:
        os.close(fd)  # closing releases the flock


def wait_for_writers(
    data_dir: Path,
    *,
    timeout_s: float = WAIT_S,
    on_wait: Callable[[str, str], None] | None = None,
) -> None:
    """Return once no receiver holds a stream of ``data_dir`` (every ``*.lock`` under
    ``ingest/``, whatever number of receivers the last run had), all within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    for path in sorted((data_dir / "ingest").glob("*.lock")):
        fd = _wait_for(path, max(0.0, deadline - time.monotonic()), on_wait)
        os.close(fd)
