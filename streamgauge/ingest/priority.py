"""Thread priorities in a receiver: the socket readers first, the work that can wait after.

A socket's receive buffer is the only place a datagram waits that nobody counts: the kernel
drops what does not fit. The default 8 MiB buffer holds about 10,000 one-line datagrams
(832 bytes of kernel accounting each on loopback), 13 ms at 750 k datagrams/s. The compiled
readers (``read_ahead.py``) empty it into an 8 MiB ring of their own, so the threads behind
them, the receive loop (parse and combine) and the segment writer, have hundreds of
milliseconds of slack; the readers have 13 ms.

On 2 cores at a high one-line rate, every 250 ms roll the writer builds and writes its
segment in a burst longer than the readers' slack, the readers get less of a core while it
runs, and the socket buffer overflows in bursts while the ring is never full. With the loop and
the writer at nice +8 (the readers at the process's own) the scheduler lets a waking reader
take the core from them, and those losses all but vanish (``bench/ingest.py`` at one line per
datagram).

The same holds between processes in ``streamgauge run``: the window job (the driver, its JVM
and Python workers) reads the segment log, which keeps what it has not read yet, so when it
falls behind it catches up (``docs/architecture.md`` D7, D8); a receiver that falls behind
loses datagrams for good. ``run`` therefore starts its receivers first and then runs the job
``JOB_NICE_ABOVE_WORKERS`` steps below the receivers' workers.

Linux only: there ``setpriority(PRIO_PROCESS, tid)`` sets one thread's nice value (elsewhere
it would renice a process with that number). Raising a nice value needs no privilege;
lowering it again does, so a thread made after a lowered one inherits its value: the
readers must be started first.
"""

from __future__ import annotations

import logging
import os
import sys

log = logging.getLogger(__name__)

#: How much lower (in nice steps) a receiver runs its loop and segment writer than its
#: socket readers; 0 leaves them alike.
DEFAULT_WORKER_NICE = 8
MAX_NICE = 19


#: How much lower than a receiver's loop and writer ``run`` puts the window job.
JOB_NICE_ABOVE_WORKERS = 5


def job_nice(worker_nice: int) -> int:
    """The nice steps ``run`` lowers the window job by, for receivers whose workers run
    ``worker_nice`` below their readers."""
    return min(MAX_NICE, worker_nice + JOB_NICE_ABOVE_WORKERS)


def lower_thread_priority(native_id: int, by: int) -> int | None:
    """Raise thread ``native_id``'s nice value by ``by`` (capped at 19); the new value, or
    None where nothing changed (``by`` <= 0, not Linux, or the kernel refused: logged)."""
    if by <= 0 or not sys.platform.startswith("linux"):
        return None
    try:
        nice = min(MAX_NICE, os.getpriority(os.PRIO_PROCESS, native_id) + by)
        os.setpriority(os.PRIO_PROCESS, native_id, nice)
    except OSError as error:
        log.warning("could not lower the priority of thread %d: %s", native_id, error)
        return None
    return nice
