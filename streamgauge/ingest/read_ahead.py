"""Reader threads that move datagrams from the kernel's socket buffers into memory, so that a
busy receive loop does not leave those buffers to overflow.

The receive loop can be held for milliseconds (a roll, the general parser on new series, the
GIL taken by the segment writer building a segment). A reader thread per datagram socket keeps
reading meanwhile, up to a byte limit; beyond that it waits (counted in ``full_waits``), the
kernel buffer fills, and its drops are counted as kernel drops. Each reader hands over
buffers of whole datagrams, each datagram followed by a newline, in read order (``take``); a
pipe (``wake_fd``) wakes the receive loop. The loop stamps the receive time when it takes
them, never earlier, so a heartbeat written before stays true.

Two implementations of that contract:

- ``CompiledReadAhead`` (Linux): the thread's whole loop — ``poll``, ``recvmmsg``, copying the
  datagrams into a byte ring, the hand-over, the wake-up — is one compiled function that
  never holds the GIL. A Python reader needed the GIL after every ``recvmmsg`` (a memoryview
  per datagram, the join), and while the segment writer held it the reader drained slower
  than datagrams arrived at a high one-line rate (every drop burst fell in a segment write).
  Compiled, the loss-free rate at 1 line per datagram is markedly higher, at less CPU per
  datagram (``bench/ingest.py``, alternated with the Python reader).
- ``PythonReadAhead``: the same in Python, where ``recvmmsg`` is not available.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import errno
import functools
import logging
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar, cast

import numba
import numpy as np

from streamgauge.ingest import sources, transports
from streamgauge.ingest.intrinsics import (
    address_of,
    as_int64,
    c_address,
    call_address,
    call_nanosleep,
    call_poll,
    call_recvmmsg,
    call_write,
    load_acquire,
    load_i32,
    load_u64,
    store_release,
)
from streamgauge.ingest.transports import Chunk, DatagramReader, describe, unix_key

log = logging.getLogger(__name__)

MAX_DATAGRAMS_PER_WAKEUP = 4096
#: A reader that found fewer than this many datagrams waits READ_AHEAD_COALESCE_S before it
#: hands them over, so that the loop wakes for bigger batches.
COALESCE_DATAGRAMS = 256
#: Datagrams read ahead by the reader threads (bytes) before they wait for the receive loop.
#: A compiled reader's ring, resident once it has gone round: at 16 MiB the peak RSS at full
#: rate (20 lines per datagram) came too close to the 300 MB budget; 8 MiB here and the
#: kernel's 8 MiB hold about a tenth of a second at that rate (bench/ingest/README.md).
READ_AHEAD_BYTES = 8 << 20
#: A reader thread that found fewer than COALESCE_DATAGRAMS waits this long before it polls
#: again. Woken by every few datagrams (a few dozen per ``recvmmsg`` at a high one-line
#: rate), it took the GIL from the receive loop over ten thousand times a second; 0.5 ms at
#: that rate is a couple of hundred datagrams, a small part of the ~10 k an 8 MiB socket
#: buffer holds. Fewer wake-ups cost the receiver less CPU at 1 and at 20 lines per datagram,
#: for a trace of loss near the one-line ceiling (bench/ingest.py, alternated).
READ_AHEAD_COALESCE_S = 0.0005
#: How long a reader blocks in ``poll`` before it looks at its stop flag again.
POLL_TIMEOUT_MS = 100

Taken = list[Chunk]


class ReadAhead(Protocol):
    """What the receive loop uses of a read-ahead."""

    sockets: list[socket.socket]
    wake_fd: int
    needs_gil: bool
    """Its readers take the GIL to hand over: threads holding it must not be slowed down."""

    @property
    def full_waits(self) -> int: ...

    @property
    def truncated(self) -> int:
        """Datagrams longer than a slot, cut back to their last newline (``DatagramReader``)."""

    @property
    def read_errors(self) -> int:
        """Reads that failed transiently and were retried (``DatagramReader.read_errors``)."""

    @property
    def last_read_error(self) -> int:
        """The errno of one of them, a reader's last (0: none); for the log."""

    def start(self) -> None: ...

    def stop(self) -> None: ...

    def close(self) -> None: ...

    def take(self, max_datagrams: int = MAX_DATAGRAMS_PER_WAKEUP) -> Taken: ...

    def ipv6_name(self, key: int) -> str | None:
        """The address of IPv6 sender ``key`` (``sources.IPV6``), if a reader holds it."""


def read_ahead_for(sockets: Sequence[socket.socket], limit_bytes: int = READ_AHEAD_BYTES
                   ) -> ReadAhead:
    """The compiled read-ahead where ``recvmmsg`` is available, else the Python one."""
    if transports.recvmmsg_available():
        return CompiledReadAhead(sockets, limit_bytes)
    return PythonReadAhead(sockets, limit_bytes)


def prepare_read_ahead() -> None:
    """Load ahead of time what ``read_ahead_for`` will need: the compiled loop
    (``load_compiled``), if it will build the compiled read-ahead."""
    if transports.recvmmsg_available():
        load_compiled()


class _WakePipe:
    """A non-blocking pipe: readers write a byte when they hand something over, the receive
    loop selects on ``wake_fd`` and drains it before it looks (so no hand-over is missed)."""

    def __init__(self) -> None:
        self.wake_fd, self.write_fd = os.pipe()
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self.write_fd, False)

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_fd, 4096):
                pass

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError):  # full of wake-ups already
            os.write(self.write_fd, b"!")

    def close(self) -> None:
        os.close(self.wake_fd)
        os.close(self.write_fd)


class PythonReadAhead:
    """A Python thread per datagram socket, reading many datagrams per ``recvmmsg`` (or one
    per ``recv`` where there is none) while blocked in ``poll``/``recvmmsg`` without the GIL,
    holding it to join what it read. Hands over at most ``limit_bytes``."""

    needs_gil = True

    def __init__(self, sockets: Sequence[socket.socket], limit_bytes: int = READ_AHEAD_BYTES
                 ) -> None:
        self.sockets = list(sockets)
        self._limit = limit_bytes
        self._cond = threading.Condition()
        self._buffers: collections.deque[Chunk] = collections.deque()
        self._bytes = 0
        self._stop = threading.Event()
        self._full_waits = 0
        self._datagram_readers: list[DatagramReader] = []
        self._pipe = _WakePipe()
        self.wake_fd = self._pipe.wake_fd
        self._threads = [
            threading.Thread(target=self._read, args=(sock,), daemon=True,
                             name=f"read-ahead-{describe(sock)}")
            for sock in self.sockets
        ]  # fmt: skip

    @property
    def full_waits(self) -> int:
        return self._full_waits

    @property
    def truncated(self) -> int:
        return sum(reader.truncated for reader in self._datagram_readers)

    @property
    def read_errors(self) -> int:
        return sum(reader.read_errors for reader in self._datagram_readers)

    @property
    def last_read_error(self) -> int:
        return max((r.last_read_error for r in self._datagram_readers if r.read_errors),
                   default=0)  # fmt: skip

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def ipv6_name(self, key: int) -> str | None:
        return next((name for reader in self._datagram_readers
                     if (name := reader.ipv6_names.get(key)) is not None), None)  # fmt: skip

    def stop(self) -> None:
        """Stop reading (what the threads read is still handed over by ``take``)."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()

    def close(self) -> None:
        self._pipe.close()

    def take(self, max_datagrams: int = MAX_DATAGRAMS_PER_WAKEUP) -> Taken:
        """The chunks read, oldest first, about ``max_datagrams`` datagrams (at least one
        chunk): one wake-up's worth, so that the loop still rolls on time after a stall. If
        more are left, the wake-up fd stays readable."""
        self._pipe.drain()
        taken: Taken = []
        with self._cond:
            count = 0
            while self._buffers and (not taken or count + self._buffers[0].count
                                     <= max_datagrams):  # fmt: skip
                item = self._buffers.popleft()
                taken.append(item)
                count += item.count
                self._bytes -= len(item.buffer)
            left = bool(self._buffers)
            self._cond.notify_all()
        if left:
            self._pipe.wake()
        return taken

    def _read(self, sock: socket.socket) -> None:
        reader = DatagramReader()
        self._datagram_readers.append(reader)
        poller = select.poll()  # not select.select: no limit on the descriptor's number
        poller.register(sock, select.POLLIN)
        while not self._stop.is_set():
            with self._cond:
                if self._bytes >= self._limit:
                    self._full_waits += 1
                    while self._bytes >= self._limit and not self._stop.is_set():
                        self._cond.wait(0.1)
            if not poller.poll(POLL_TIMEOUT_MS):
                continue
            chunk = reader.read_queued(sock, MAX_DATAGRAMS_PER_WAKEUP)
            if not chunk.count:
                continue
            with self._cond:
                was_empty = not self._buffers
                self._buffers.append(chunk)
                self._bytes += len(chunk.buffer)
            if was_empty:
                self._pipe.wake()
            if chunk.count < COALESCE_DATAGRAMS:
                time.sleep(READ_AHEAD_COALESCE_S)


# -- the compiled reader ------------------------------------------------------------------------
#
# One reader thread per socket and its owner (the receive loop) share a ring of bytes and a
# ring of chunk descriptors, single producer, single consumer:
#
#   ring:  ...| chunk k: datagram\n datagram\n ... | chunk k+1 ... |  (wraps around)
#   descriptors[k % DESCRIPTORS] = (start, used, count, calls, first), start and the counters
#   below counted in bytes since the start (monotonic; the ring position is start % capacity)
#   senders[d % SENDER_SLOTS], lengths[d % SENDER_SLOTS]: datagram d's sender
#   (sources.source_key, on a Unix socket sources.credentials_key) and length; a chunk's
#   datagrams are first .. first + count - 1
#
# The reader copies datagrams into the open chunk and publishes it (release store of
# control[_PUBLISHED]); the owner takes published chunks in order and frees their bytes
# (release stores of control[_TAKEN] and control[_FREED]). Each side reads the other's
# counters with acquire loads, so a chunk's bytes are written before they are read and read
# before they are overwritten.

_F = TypeVar("_F", bound=Callable[..., Any])


def _jit(function: _F) -> _F:
    """numba's ``njit``, typed for mypy; ``nogil``: the reader never holds the GIL."""
    return cast(_F, numba.njit(cache=True, nogil=True)(function))


# control[...]: int64 words shared by a compiled reader and its owner
_STOP = 0  # set by the owner: publish what is read and return
_PUBLISHED = 1  # chunks published by the reader
_TAKEN = 2  # chunks taken by the owner
_FREED = 3  # ring bytes the owner is done with
_FULL_WAITS = 4  # times the reader found the ring (or the descriptors) full
_TRUNCATED = 5  # datagrams longer than a slot, cut back to their last newline
_READ_ERRORS = 6  # reads failed with a transient error (transports.TRANSIENT_READ_ERRORS)
_LAST_READ_ERROR = 7  # the errno of the last of them
_SENDERS_FREED = 8  # datagrams whose sender the owner is done with
_CONTROL_SIZE = 9
_SCRATCH_SIZE = 6  # int64s: the loop's C arguments (see _read_loop)
_START, _USED, _COUNT, _CALLS, _FIRST = range(5)  # a descriptor's fields
DESCRIPTORS = 4096
#: Datagrams whose sender the ring holds: 12 bytes each (3 MiB, resident once the ring went
#: round). The reader waits for room here too, so it bounds the datagrams read ahead: about
#: a quarter of a second at the highest one-line rate (bench/ingest.py).
SENDER_SLOTS = 1 << 18
#: IPv6 senders' addresses, by their key's hash (``ipv6_name``), for naming clients.
IPV6_NAMES = 64
# libc[...]: the C functions the loop calls, by address
_RECVMMSG, _POLL, _NANOSLEEP, _WRITE, _ERRNO_LOCATION = range(5)
_NL = 10
_MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0x40)
_MSG_TRUNC = transports.MSG_TRUNC
_TRANSIENT_READ_ERRORS = tuple(sorted(transports.TRANSIENT_READ_ERRORS))  # numba: a constant
_POLLIN = getattr(select, "POLLIN", 1)


def _libc_addresses() -> np.ndarray:
    libc = ctypes.CDLL(None, use_errno=True)
    names = ("recvmmsg", "poll", "nanosleep", "write", "__errno_location")
    return np.array([c_address(getattr(libc, name)) for name in names], dtype=np.int64)


@_jit
def _wait_for_room(control: np.ndarray, head: int, need: int, capacity: int, published: int,
                   sequence: int, nanosleep: int, pause: int) -> None:
    """Wait until the owner has freed enough of the ring for ``need`` more bytes after
    ``head``, taken enough chunks for one more descriptor, and freed a sender slot for
    datagram ``sequence``; a wait is counted once."""
    freed, taken = address_of(control) + 8 * _FREED, address_of(control) + 8 * _TAKEN
    senders_freed = address_of(control) + 8 * _SENDERS_FREED
    waited = False
    while (head + need - load_acquire(freed) > capacity
           or published - load_acquire(taken) >= DESCRIPTORS
           or sequence - load_acquire(senders_freed) >= SENDER_SLOTS):
        if not waited:
            control[_FULL_WAITS] += 1
            waited = True
        call_nanosleep(nanosleep, pause, 0)


@_jit
def _whole_lines(slots: np.ndarray, start: int, length: int) -> int:
    """The length of the whole lines of the ``length`` bytes at ``start``: up to the last
    newline, 0 if there is none."""
    for end in range(start + length - 1, start - 1, -1):
        if slots[end] == _NL:
            return end - start
    return 0


@_jit
def _publish(descriptors: np.ndarray, control: np.ndarray, published: int, start: int,
             used: int, count: int, calls: int, sequence: int, write: int, wake_fd: int,
             wake_byte: int) -> None:
    """Describe the chunk (its datagrams end before datagram ``sequence``), then publish it
    (a release store), then write a byte down the wake-up pipe (a full pipe already has the
    loop's attention)."""
    descriptor = descriptors[published % DESCRIPTORS]
    descriptor[_START], descriptor[_USED] = start, used
    descriptor[_COUNT], descriptor[_CALLS] = count, calls
    descriptor[_FIRST] = sequence - count
    store_release(address_of(control) + 8 * _PUBLISHED, published + 1)
    call_write(write, wake_fd, wake_byte, 1)


@_jit
def _record_ipv6(names: np.ndarray, offset: int, key: np.int64, ipv6: np.ndarray) -> None:
    """Keep the address of an IPv6 sender for ``ipv6_name``: its 16 bytes as two words, then
    the key (a release store: a reader that sees the key sees the words)."""
    row = int(key >> 16) % IPV6_NAMES
    if ipv6[row, 0] == key:
        return
    ipv6[row, 1] = as_int64(load_u64(address_of(names) + offset + 8))
    ipv6[row, 2] = as_int64(load_u64(address_of(names) + offset + 16))
    store_release(address_of(ipv6) + 24 * row, int(key))


@_jit
def _read_loop(
    libc: np.ndarray, fd: int, headers: int, n_slots: int, lengths: np.ndarray,
    flags: np.ndarray, slots: np.ndarray, slot_bytes: int, ring: np.ndarray,
    descriptors: np.ndarray,
    control: np.ndarray, wake_fd: int, scratch: np.ndarray, min_datagrams: int,
    max_datagrams: int, names: np.ndarray, namelens: np.ndarray, own_key: int,
    senders: np.ndarray, sender_lengths: np.ndarray, ipv6: np.ndarray, controls: np.ndarray,
    controllens: np.ndarray, control_bytes: int,
) -> int:
    """Read ``fd`` until ``control[_STOP]``; returns 0, or the errno that ended it.

    ``recvmmsg`` fills the ``n_slots`` slots of ``slots`` (``slot_bytes`` each; their
    lengths in ``lengths`` and flags in ``flags``, the headers at address ``headers``; a
    datagram longer than its slot is cut back to its last newline, counted in
    ``control[_TRUNCATED]``: only a Unix datagram socket's can be); the datagrams are copied,
    each followed by a newline, into the open chunk, which is published when the queue is
    empty and it holds ``min_datagrams`` or the reader already paused once for more, when it
    holds ``max_datagrams``, or before the reader waits for room. A read failing with a
    transient error (``transports.TRANSIENT_READ_ERRORS``) is counted in
    ``control[_READ_ERRORS]`` and retried after a pause; any other error ends the loop.
    Each datagram's sender (``sources.source_key`` of its slot's ``names``, their lengths in
    ``namelens``; ``own_key`` for a Unix socket's) and length go to ``senders`` and
    ``sender_lengths``, an IPv6 sender's address to ``ipv6``. A Unix datagram socket's
    slots have ``control_bytes`` of ``controls`` each (0 for other sockets: no control
    buffers, and none of this per datagram), their lengths in ``controllens``: its
    senders are ``sources.credentials_key`` of them, their processes (``own_key`` for a
    datagram without credentials).
    ``scratch``: int64s for the C calls — [0:2] the pause (a timespec), [2] the pollfd, [3]
    the wake-up byte, [4:6] the pause after a transient error (a timespec).
    """
    recvmmsg, poll, write = libc[_RECVMMSG], libc[_POLL], libc[_WRITE]
    nanosleep, errno_location = libc[_NANOSLEEP], libc[_ERRNO_LOCATION]
    base = address_of(scratch)
    pause, pollfd, wake_byte, error_pause = base, base + 16, base + 24, base + 32
    stop = address_of(control) + 8 * _STOP
    freed, taken = address_of(control) + 8 * _FREED, address_of(control) + 8 * _TAKEN
    senders_freed = address_of(control) + 8 * _SENDERS_FREED
    capacity = len(ring)
    published = control[_PUBLISHED]
    head = start = control[_FREED]  # all taken before: the ring is empty
    sequence = control[_SENDERS_FREED]
    count = calls = staged = copied = 0
    queue_empty = True  # the last read found fewer datagrams than slots
    paused = False
    while True:
        while copied < staged:
            length = int(lengths[copied])
            if flags[copied] & _MSG_TRUNC:
                length = _whole_lines(slots, copied * slot_bytes, length)
                control[_TRUNCATED] += 1
            if count == max_datagrams or head + length + 1 - start > capacity // 2:
                # full, or half the ring: hand it over, so the owner can free it meanwhile
                _publish(descriptors, control, published, start, head - start, count, calls,
                         sequence, write, wake_fd, wake_byte)
                published += 1
                start, count, calls, paused = head, 0, 0, False
            if head + length + 1 - load_acquire(freed) > capacity or (
                    published - load_acquire(taken) >= DESCRIPTORS) or (
                    sequence - load_acquire(senders_freed) >= SENDER_SLOTS):
                if count:  # what the owner could take to make room
                    _publish(descriptors, control, published, start, head - start, count,
                             calls, sequence, write, wake_fd, wake_byte)
                    published += 1
                    start, count, calls, paused = head, 0, 0, False
                _wait_for_room(control, head, length + 1, capacity, published, sequence,
                               nanosleep, pause)
            source = copied * slot_bytes
            at = head % capacity
            first = min(length, capacity - at)  # the part before the ring's end
            ring[at : at + first] = slots[source : source + first]
            ring[: length - first] = slots[source + first : source + length]
            ring[(at + length) % capacity] = _NL
            if control_bytes:
                key = sources.credentials_key(controls, copied * control_bytes,
                                              int(controllens[copied]), own_key)  # fmt: skip
            else:
                name = copied * sources.NAME_BYTES
                key = sources.source_key(names, name, int(namelens[copied]), own_key)
                if key & sources.IPV6:
                    _record_ipv6(names, name, key, ipv6)
            senders[sequence % SENDER_SLOTS] = key
            sender_lengths[sequence % SENDER_SLOTS] = length
            sequence += 1
            head += length + 1
            count += 1
            copied += 1
        stopping = load_acquire(stop) != 0
        if count and (stopping or count >= max_datagrams
                      or queue_empty and (count >= min_datagrams or paused)):
            _publish(descriptors, control, published, start, head - start, count, calls,
                     sequence, write, wake_fd, wake_byte)
            published += 1
            start, count, calls, paused = head, 0, 0, False
        if stopping:
            return 0
        if count and queue_empty:
            call_nanosleep(nanosleep, pause, 0)  # for a bigger batch
            paused = True
        elif queue_empty:
            call_poll(poll, pollfd, 1, POLL_TIMEOUT_MS)  # idle: until readable, or a while
        for slot in range(staged):  # value-result: the room for the next sender's address
            namelens[slot] = sources.NAME_BYTES
        if control_bytes:  # and for its credentials
            for slot in range(staged):
                controllens[slot] = control_bytes
        received = call_recvmmsg(recvmmsg, fd, headers, n_slots, _MSG_DONTWAIT, 0)
        calls += 1
        if received < 0:
            error = load_i32(call_address(errno_location))
            if error in _TRANSIENT_READ_ERRORS:
                control[_READ_ERRORS] += 1
                control[_LAST_READ_ERROR] = error
                call_nanosleep(nanosleep, error_pause, 0)
            elif error != errno.EAGAIN and error != errno.EWOULDBLOCK and error != errno.EINTR:
                if count:
                    _publish(descriptors, control, published, start, head - start, count,
                             calls, sequence, write, wake_fd, wake_byte)
                return error
            received = 0
        staged, copied = received, 0
        queue_empty = received < n_slots


@_jit
def _published(control: np.ndarray) -> int:
    """How many chunks the reader has published (an acquire load)."""
    return load_acquire(address_of(control) + 8 * _PUBLISHED)


@_jit
def _release(control: np.ndarray, taken: int, freed: int, senders_freed: int) -> None:
    """The owner is done with chunks up to ``taken``, ring bytes up to ``freed`` and senders
    up to ``senders_freed``."""
    store_release(address_of(control) + 8 * _FREED, freed)
    store_release(address_of(control) + 8 * _SENDERS_FREED, senders_freed)
    store_release(address_of(control) + 8 * _TAKEN, taken)


@functools.cache
def load_compiled() -> None:
    """Compile the reader's functions, or load them from numba's cache, now: the first call
    takes seconds to compile, and loading faults LLVM's code back in, which a receiver
    process releases once it is built (``process.py``). Told to stop, the loop returns at
    once. The arguments have the types of a real reader's (another type: another compile).
    Once per process: a receiver loads them before its readers are built."""
    slots = DatagramReader(slots=2, slot_bytes=1)
    control = np.zeros(_CONTROL_SIZE, dtype=np.int64)
    _release_stop(control)
    _read_loop(np.zeros(5, dtype=np.int64), -1, slots.headers_address, slots.slots,
               slots.lengths_array(), slots.flags_array(), slots.buffer_array(),
               slots.slot_bytes,
               np.zeros(8, dtype=np.uint8), np.zeros((1, 5), dtype=np.int64), control, -1,
               np.zeros(_SCRATCH_SIZE, dtype=np.int64), 1, 1, slots.names_array(),
               slots.namelens_array(), 0, np.zeros(1, dtype=np.int64),
               np.zeros(1, dtype=np.int32), np.zeros((IPV6_NAMES, 3), dtype=np.int64),
               slots.controls_array(), slots.controllens_array(), slots.control_bytes,
               )  # fmt: skip
    _published(control)
    _release(control, 0, 0, 0)
    sources.prepare()


class _CompiledReader:
    """One socket's compiled reader: its slots, ring, descriptors, control words, thread."""

    def __init__(self, sock: socket.socket, limit_bytes: int, libc: np.ndarray,
                 wake_w: int) -> None:
        self.sock = sock
        # np.zeros: calloc'd, so pages become resident only as the ring first goes round;
        # at least two of the largest datagrams fit
        self.ring = np.zeros(max(limit_bytes, 4 * transports.DATAGRAM_SLOT_BYTES),
                             dtype=np.uint8)  # fmt: skip
        self.descriptors = np.zeros((DESCRIPTORS, 5), dtype=np.int64)
        self.control = np.zeros(_CONTROL_SIZE, dtype=np.int64)
        self.senders = np.zeros(SENDER_SLOTS, dtype=np.int64)
        self.sender_lengths = np.zeros(SENDER_SLOTS, dtype=np.int32)
        self.ipv6 = np.zeros((IPV6_NAMES, 3), dtype=np.int64)
        # control buffers (credentials) for a Unix datagram socket's slots only
        self._slots = DatagramReader(credentials=sock.family == socket.AF_UNIX)
        scratch = np.zeros(_SCRATCH_SIZE, dtype=np.int64)
        scratch[1] = int(READ_AHEAD_COALESCE_S * 1e9)  # struct timespec {0 s, ns}
        scratch[5] = int(transports.READ_ERROR_PAUSE_S * 1e9)
        pollfd = scratch[2:3].view(np.int32)  # struct pollfd {int fd; short events, revents}
        pollfd[0] = sock.fileno()
        pollfd.view(np.int16)[2] = _POLLIN
        scratch[3] = ord("!")
        self._arguments = (
            libc, sock.fileno(), self._slots.headers_address, self._slots.slots,
            self._slots.lengths_array(), self._slots.flags_array(), self._slots.buffer_array(),
            self._slots.slot_bytes,
            self.ring, self.descriptors, self.control, wake_w, scratch, COALESCE_DATAGRAMS,
            MAX_DATAGRAMS_PER_WAKEUP, self._slots.names_array(), self._slots.namelens_array(),
            unix_key(sock), self.senders, self.sender_lengths, self.ipv6,
            self._slots.controls_array(), self._slots.controllens_array(),
            self._slots.control_bytes,
        )
        load_compiled()  # not on the reader thread
        self.thread = threading.Thread(target=self._run, daemon=True,
                                       name=f"read-ahead-{describe(sock)}")

    def _run(self) -> None:
        error = _read_loop(*self._arguments)
        if error:
            log.error("read-ahead of %s stopped: %s", describe(self.sock), os.strerror(error))

    def take(self, room: int, taken: Taken) -> bool:
        """Append the published chunks, oldest first, while they fit in ``room`` datagrams
        (at least one if ``taken`` is empty); False if one was left for later."""
        first = int(self.control[_TAKEN])  # only the owner writes it
        last = _published(self.control)
        capacity = len(self.ring)
        freed = int(self.control[_FREED])
        senders_freed = int(self.control[_SENDERS_FREED])
        index = first
        for index in range(first, last):
            start, used, count, calls, sequence = self.descriptors[index % DESCRIPTORS].tolist()
            if taken and count > room:
                break
            at = start % capacity
            if at + used <= capacity:
                buffer = self.ring[at : at + used].tobytes()
            else:
                buffer = self.ring[at:].tobytes() + self.ring[: at + used - capacity].tobytes()
            taken.append(Chunk(buffer, count, calls, *self._senders(sequence, count)))
            room -= count
            freed = start + used
            senders_freed = sequence + count
        else:
            index = last
        if index != first:
            _release(self.control, index, freed, senders_freed)
        return index == last

    def _senders(self, sequence: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Datagrams ``sequence`` .. ``sequence + count - 1``: their senders and lengths."""
        at = sequence % SENDER_SLOTS
        picks = np.arange(at, at + count) % SENDER_SLOTS if at + count > SENDER_SLOTS else (
            slice(at, at + count))  # fmt: skip
        return self.senders[picks].copy(), self.sender_lengths[picks].astype(np.int64)

    def ipv6_name(self, key: int) -> str | None:
        """The address of IPv6 sender ``key``, if this reader still holds it."""
        row = self.ipv6[(key >> 16) % IPV6_NAMES]
        words = row.tolist()
        if words[0] != key:
            return None
        address = np.array(words[1:], dtype=np.int64).tobytes()
        if int(row[0]) != key:  # overwritten while read
            return None
        return socket.inet_ntop(socket.AF_INET6, address)

    @property
    def full_waits(self) -> int:
        return int(self.control[_FULL_WAITS])

    @property
    def truncated(self) -> int:
        return int(self.control[_TRUNCATED])

    @property
    def read_errors(self) -> int:
        return int(self.control[_READ_ERRORS])

    @property
    def last_read_error(self) -> int:
        return int(self.control[_LAST_READ_ERROR])


class CompiledReadAhead:
    """A compiled reader loop per datagram socket (see the module's docstring), each with a
    ring of ``limit_bytes`` (at least four of the largest datagrams)."""

    needs_gil = False

    def __init__(self, sockets: Sequence[socket.socket], limit_bytes: int = READ_AHEAD_BYTES
                 ) -> None:
        self.sockets = list(sockets)
        self._pipe = _WakePipe()
        self.wake_fd = self._pipe.wake_fd
        libc = _libc_addresses()
        self._readers = [_CompiledReader(sock, limit_bytes, libc, self._pipe.write_fd)
                         for sock in self.sockets]  # fmt: skip
        self._salvaged: Taken = []

    @property
    def full_waits(self) -> int:
        return sum(reader.full_waits for reader in self._readers)

    @property
    def truncated(self) -> int:
        return sum(reader.truncated for reader in self._readers)

    @property
    def read_errors(self) -> int:
        return sum(reader.read_errors for reader in self._readers)

    @property
    def last_read_error(self) -> int:
        return max((r.last_read_error for r in self._readers if r.read_errors), default=0)

    def start(self) -> None:
        for reader in self._readers:
            reader.thread.start()

    def ipv6_name(self, key: int) -> str | None:
        return next((name for reader in self._readers
                     if (name := reader.ipv6_name(key)) is not None), None)  # fmt: skip

    def stop(self) -> None:
        """Stop reading; what was read is still handed over by ``take``. A reader waiting for
        room gets it: the chunks are taken while the threads finish."""
        for reader in self._readers:
            _release_stop(reader.control)
        for reader in self._readers:
            while reader.thread.is_alive():
                reader.thread.join(0.05)
                reader.take(1 << 62, self._salvaged)

    def close(self) -> None:
        self._pipe.close()

    def take(self, max_datagrams: int = MAX_DATAGRAMS_PER_WAKEUP) -> Taken:
        """(datagrams each followed by a newline, how many, system calls), oldest first per
        socket, about ``max_datagrams`` of them (at least one chunk). If more are left, the
        wake-up fd stays readable."""
        self._pipe.drain()
        taken, self._salvaged = self._salvaged, []
        left = False
        for reader in self._readers:
            room = max_datagrams - sum(chunk.count for chunk in taken)
            if not reader.take(room, taken):
                left = True
                break
        if left:
            self._pipe.wake()
        return taken


@_jit
def _release_stop(control: np.ndarray) -> None:
    """Ask the reader to stop (a release store it reads with an acquire load)."""
    store_release(address_of(control) + 8 * _STOP, 1)
