"""Where StatsD lines arrive: UDP (IPv4/IPv6), TCP (newline-delimited), Unix datagram sockets.

``--listen`` takes ``udp://HOST:PORT``, ``tcp://HOST:PORT``, ``unixgram:///absolute/path``, or
a plain ``HOST:PORT`` (UDP). IPv6 hosts go in brackets: ``udp://[::1]:8125``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import mmap
import os
import socket
import stat
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from streamgauge.ingest import sources

DEFAULT_RCVBUF_BYTES = 8 << 20
UNIX_SOCKET_MODES = (0o600, 0o660)
SCHEMES = ("udp", "tcp", "unixgram")


@dataclass(frozen=True, slots=True)
class ListenSpec:
    scheme: str  # udp | tcp | unixgram
    host: str = ""
    port: int = 0
    path: str = ""

    def __str__(self) -> str:
        if self.scheme == "unixgram":
            return f"unixgram://{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_listen_spec(text: str) -> ListenSpec:
    """Canonicalise a ``--listen`` value; the error names the value and the accepted forms."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "udp", text
    if scheme not in SCHEMES:
        raise ValueError(
            f"--listen {text!r}: unknown scheme {scheme!r}; use udp://HOST:PORT, "
            "tcp://HOST:PORT, unixgram:///PATH or HOST:PORT"
        )
    if scheme == "unixgram":
        if not rest.startswith("/"):
            raise ValueError(f"--listen {text!r}: a unixgram path must be absolute")
        return ListenSpec("unixgram", path=rest)
    host, colon, port = rest.rpartition(":")
    if not colon or not port.isdigit() or int(port) > 65535:
        raise ValueError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8125")
    if host.startswith("[") != host.endswith("]"):
        raise ValueError(f"--listen {text!r}: unbalanced brackets around the IPv6 host")
    return ListenSpec(scheme, host.strip("[]") or "127.0.0.1", int(port))


def bind(
    spec: ListenSpec,
    *,
    rcvbuf_bytes: int = DEFAULT_RCVBUF_BYTES,
    reuse_port: bool = False,
    unix_mode: int = 0o600,
) -> socket.socket:
    if spec.scheme == "udp":
        return bind_udp(spec.host, spec.port, rcvbuf_bytes, reuse_port=reuse_port)
    if spec.scheme == "tcp":
        return bind_tcp(spec.host, spec.port, reuse_port=reuse_port)
    return bind_unixgram(Path(spec.path), rcvbuf_bytes, mode=unix_mode)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def bind_udp(
    host: str, port: int, rcvbuf_bytes: int = DEFAULT_RCVBUF_BYTES, *, reuse_port: bool = False
) -> socket.socket:
    """Bind a UDP socket with a large receive buffer (the biggest lever against kernel drops).

    ``reuse_port``: several sockets (one per receiver process) share the port and the kernel
    spreads senders over them by their address hash.
    """
    sock = socket.socket(_family(host), socket.SOCK_DGRAM)
    try:
        # No SO_REUSEADDR: on Linux it lets a second UDP socket bind the same port and take
        # its traffic silently; a busy port must fail (UDP has no TIME_WAIT to work around).
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        set_receive_buffer(sock, rcvbuf_bytes)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def bind_tcp(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    sock = socket.socket(_family(host), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def bind_unixgram(
    path: Path, rcvbuf_bytes: int = DEFAULT_RCVBUF_BYTES, *, mode: int = 0o600
) -> socket.socket:
    """A Unix datagram socket at ``path``, readable and writable by the owner (0600) or also
    the group (0660); never world-writable. A stale socket file from a crash is replaced; any
    other file at the path is refused. ``SO_PASSCRED`` (Linux): each datagram comes with its
    sender's credentials, so that senders are told apart by process (``sources``)."""
    if mode not in UNIX_SOCKET_MODES:
        raise ValueError(f"unix socket mode must be 0600 or 0660, got {mode:04o}")
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise FileExistsError(f"{path} exists and is not a socket; refusing to replace it")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        set_receive_buffer(sock, rcvbuf_bytes)
        if sources.CREDENTIALS:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        # The umask makes the socket private from the moment it exists; chmod then widens it
        # to the requested mode (0660) if asked. umask is per process: ingest binds at start.
        previous = os.umask(0o177)
        try:
            sock.bind(str(path))
        finally:
            os.umask(previous)
        os.chmod(path, mode)
    except OSError:
        sock.close()
        raise
    return sock


def set_receive_buffer(sock: socket.socket, size: int) -> None:
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


def describe(sock: socket.socket) -> str:
    """The socket as a ``--listen`` value (for logs, stats and self-metric tags)."""
    address = sock.getsockname()
    if sock.family == socket.AF_UNIX:
        return f"unixgram://{address}"
    scheme = "tcp" if sock.type == socket.SOCK_STREAM else "udp"
    return str(ListenSpec(scheme, address[0], address[1]))


class LineAssembler:
    """Turns a TCP byte stream into whole lines: a line split across reads is kept until its
    newline arrives. A partial line longer than ``max_line_bytes`` is cut off and its rest
    skipped up to the next newline; the caller counts it as ``line_too_long``."""

    def __init__(self, max_line_bytes: int) -> None:
        self._max = max_line_bytes
        self._pending = b""
        self._skipping = False

    def feed(self, data: bytes) -> tuple[bytes, int]:
        """(complete lines ending in a newline, or b"", number of overlong lines cut off)."""
        overlong = 0
        if self._skipping:
            newline = data.find(b"\n")
            if newline < 0:
                return b"", 0
            data = data[newline + 1 :]
            self._skipping = False
        buffer = self._pending + data if self._pending else data
        cut = buffer.rfind(b"\n")
        if cut < 0:
            complete, self._pending = b"", buffer
        else:
            complete, self._pending = buffer[: cut + 1], buffer[cut + 1 :]
        if len(self._pending) > self._max:
            # "x:1|c" + 70 KB without a newline: never buffered without bound
            self._pending = b""
            self._skipping = True
            overlong = 1
        return complete, overlong

    def close(self) -> bytes:
        """What is left at end of stream: a last line without its newline still counts."""
        rest, self._pending = self._pending, b""
        return rest


# -- many datagrams per system call -------------------------------------------------------------


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


class _MsgHdr(ctypes.Structure):
    _fields_ = [
        ("msg_name", ctypes.c_void_p),
        ("msg_namelen", ctypes.c_uint32),
        ("msg_iov", ctypes.POINTER(_IoVec)),
        ("msg_iovlen", ctypes.c_size_t),
        ("msg_control", ctypes.c_void_p),
        ("msg_controllen", ctypes.c_size_t),
        ("msg_flags", ctypes.c_int),
    ]


class _MMsgHdr(ctypes.Structure):
    _fields_ = [("msg_hdr", _MsgHdr), ("msg_len", ctypes.c_uint)]


_SIZE_T = ctypes.sizeof(ctypes.c_size_t)
_SIZE_T_FORMAT: Literal["Q", "I"] = "Q" if _SIZE_T == 8 else "I"  # a memoryview's size_t


def _load_recvmmsg() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).recvmmsg
    except (OSError, AttributeError):
        return None
    function.argtypes = [
        ctypes.c_int, ctypes.POINTER(_MMsgHdr), ctypes.c_uint, ctypes.c_int, ctypes.c_void_p,
    ]  # fmt: skip
    function.restype = ctypes.c_int
    return function


_RECVMMSG = _load_recvmmsg()

TRANSIENT_READ_ERRORS = frozenset({errno.ENOMEM, errno.ENOBUFS, errno.ECONNREFUSED})
"""Errors of a datagram read that say nothing lasting about the socket: the kernel could not
allocate for this read (ENOMEM, ENOBUFS), or reported a pending ICMP error (ECONNREFUSED,
cleared by reporting it). The datagrams stay queued, so a reader counts the error
(``read_errors``), pauses ``READ_ERROR_PAUSE_S`` and reads again: ending the reader at the
first one would send the socket's input to the kernel's drop counter for good."""
READ_ERROR_PAUSE_S = 0.001


def recvmmsg_available() -> bool:
    """Whether this platform has ``recvmmsg(2)`` (Linux), and it was not turned off (the
    benchmark's ``--no-recvmmsg`` sets ``_RECVMMSG`` to None)."""
    return _RECVMMSG is not None

_MSG_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0x40)
MSG_TRUNC = getattr(socket, "MSG_TRUNC", 0x20)
DATAGRAM_SLOT_BYTES = 65536  # a whole UDP datagram (at most 65507 bytes of payload)
IPV6_NAMES_KEPT = 4096
DATAGRAM_SLOTS = 2048
"""Datagrams per ``recvmmsg`` call. Each call's return takes the GIL back from the receive loop
and the segment writer; at 1 line per datagram, 256 per call meant 16 calls per 4,096-datagram
read, and during a segment write the reader drained slower than datagrams arrived. 2048 raises
the loss-free one-line rate (bench/ingest.py, 256 and 2048 alternated). The cost: small
datagrams touch one page per slot, a few MB more resident at full rate."""


@dataclass(frozen=True, slots=True)
class Chunk:
    """Datagrams read together: each followed by a newline in ``buffer``, ``count`` of them,
    read in ``calls`` system calls; per datagram its sender (``sources``' key) and its
    length in ``buffer`` (without the newline)."""

    buffer: bytes
    count: int
    calls: int
    keys: np.ndarray
    lengths: np.ndarray


def unix_key(sock: socket.socket) -> int:
    """The key of a Unix datagram socket's senders whose datagrams came without credentials
    (``sources``), all of them together (0 for other sockets)."""
    return sources.UNIX | sock.fileno() if sock.family == socket.AF_UNIX else sources.UNKNOWN


class DatagramReader:
    """Reads every datagram queued on a socket, many per system call.

    On Linux one ``recvmmsg(2)`` (through ctypes) fills up to ``slots`` preallocated buffers;
    elsewhere, or when ``batched=False``, one ``recv_into`` per datagram. ``read`` returns the
    datagrams as views into those buffers, valid until the next ``read``: the caller joins or
    copies them before reading again. Buffers are allocated once; a page is only resident
    once a datagram touched it, so small datagrams keep the footprint small.

    A Unix datagram socket's datagrams are read with their senders' credentials
    (``sources.credentials_key``): the slots get control buffers (``credentials``, or at the
    first read of such a socket), which the headers keep; a reader of UDP sockets only has
    none, and its reads pay nothing for them.
    """

    def __init__(
        self,
        slots: int = DATAGRAM_SLOTS,
        slot_bytes: int = DATAGRAM_SLOT_BYTES,
        *,
        batched: bool = True,
        credentials: bool = False,
    ) -> None:
        """``credentials``: give the slots their control buffers now (a reader of one Unix
        datagram socket: the compiled read-ahead's, which calls ``recvmmsg`` itself)."""
        if slots < 1 or slot_bytes < 1:
            raise ValueError(f"slots and slot_bytes must be positive, got {slots}, {slot_bytes}")
        self.slots = slots
        self.slot_bytes = slot_bytes
        self.batched = batched and _RECVMMSG is not None
        # An anonymous mapping, not bytearray(n): bytearray zero-fills, so all 16 MiB were
        # resident from the start, in each reader (the receive loop's and the read-ahead
        # thread's: 32 MiB of a receiver's RSS); a mapping's zero pages cost nothing until a
        # datagram lands in them (~1 MiB at 20 lines per datagram).
        self._buffer = mmap.mmap(-1, slots * slot_bytes)
        self._view = memoryview(self._buffer)
        # Each slot's sender (msg_name), for per-client counts (``keys``).
        self._names = np.zeros(slots * sources.NAME_BYTES, dtype=np.uint8)
        self._keys: list[int] = []  # the one-by-one reader's, per datagram of the last read
        #: IPv6 senders' addresses by key (``sources``: an IPv6 key holds a hash)
        self.ipv6_names: dict[int, str] = {}
        self._known: dict[Any, int] = {}  # the one-by-one reader's keys by sender address
        #: Each slot's control messages (``sources.CONTROL_BYTES``), once a Unix datagram
        #: socket is read (none: ``control_bytes`` 0)
        self._controls = np.zeros(0, dtype=np.uint8)
        self.control_bytes = 0
        self._family = 0  # of the socket of the last ``read`` (for ``keys``)
        self._received = 0
        self.syscalls = 0  # for tests and benchmarks: datagrams / syscalls is the batching
        #: Datagrams longer than a slot (only a Unix datagram socket's can be): each was cut
        #: back to its last newline, the line cut off to be counted as ``line_too_long``.
        self.truncated = 0
        #: Reads that failed with one of TRANSIENT_READ_ERRORS (each paused, then retried),
        #: and the last such errno.
        self.read_errors = 0
        self.last_read_error = 0
        if not self.batched:
            return
        base = ctypes.addressof(ctypes.c_char.from_buffer(self._buffer))
        names = self._names.ctypes.data
        self._iovecs = (_IoVec * slots)()
        self._headers = (_MMsgHdr * slots)()
        for index in range(slots):
            self._iovecs[index].iov_base = base + index * slot_bytes
            self._iovecs[index].iov_len = slot_bytes
            self._headers[index].msg_hdr.msg_iov = ctypes.pointer(self._iovecs[index])
            self._headers[index].msg_hdr.msg_iovlen = 1
            self._headers[index].msg_hdr.msg_name = names + index * sources.NAME_BYTES
            self._headers[index].msg_hdr.msg_namelen = sources.NAME_BYTES
        # msg_len of every header, as one strided integer view (read without ctypes calls)
        stride = ctypes.sizeof(_MMsgHdr) // 4
        lengths = memoryview(self._headers).cast("B").cast("I")
        self._lengths = lengths[_MMsgHdr.msg_len.offset // 4 :: stride]
        self._flags = lengths[_MsgHdr.msg_flags.offset // 4 :: stride]
        self._namelens = lengths[_MsgHdr.msg_namelen.offset // 4 :: stride]
        sizes = memoryview(self._headers).cast("B").cast(_SIZE_T_FORMAT)
        self._controllens = sizes[_MsgHdr.msg_controllen.offset // _SIZE_T ::
                                  ctypes.sizeof(_MMsgHdr) // _SIZE_T]  # fmt: skip
        self.headers_address = ctypes.addressof(self._headers)
        if credentials:
            self._attach_controls()

    def _attach_controls(self) -> None:
        """Give every slot a control buffer for its sender's credentials."""
        if self.control_bytes or not sources.CREDENTIALS:
            return
        size = sources.CONTROL_BYTES
        self._controls = np.zeros(self.slots * size, dtype=np.uint8)
        controls = self._controls.ctypes.data
        for index in range(self.slots):
            self._headers[index].msg_hdr.msg_control = controls + index * size
            self._headers[index].msg_hdr.msg_controllen = size
        self.control_bytes = size

    def lengths_array(self) -> np.ndarray:
        """The headers' ``msg_len`` fields as a (strided) uint32 array: for compiled
        readers, which call ``recvmmsg`` themselves with ``headers_address``."""
        return np.asarray(self._lengths)

    def flags_array(self) -> np.ndarray:
        """The headers' ``msg_flags`` fields (``MSG_TRUNC``: the datagram was longer than its
        slot), as a strided int32 array, for compiled readers."""
        return np.asarray(self._flags).view(np.int32)

    def namelens_array(self) -> np.ndarray:
        """The headers' ``msg_namelen`` fields (value-result: reset to ``NAME_BYTES`` before
        each ``recvmmsg``), as a strided uint32 array, for compiled readers."""
        return np.asarray(self._namelens)

    def names_array(self) -> np.ndarray:
        """The slots' ``msg_name`` bytes (``sources.NAME_BYTES`` each), for compiled readers."""
        return self._names

    def controls_array(self) -> np.ndarray:
        """The slots' ``msg_control`` bytes (``control_bytes`` each; empty without), for
        compiled readers."""
        return self._controls

    def controllens_array(self) -> np.ndarray:
        """The headers' ``msg_controllen`` fields (value-result: reset to ``control_bytes``
        before each ``recvmmsg`` when there are control buffers), as a strided array of
        ``size_t``, for compiled readers."""
        return np.asarray(self._controllens)

    def keys(self, sock: socket.socket) -> np.ndarray:
        """The sender (``sources.source_key``; of a Unix datagram socket's,
        ``sources.credentials_key``) of each datagram of the last ``read``."""
        if not self.batched:
            return np.array(self._keys, dtype=np.int64)
        family = self._family  # ``sock``'s: the last read's
        if family == socket.AF_UNIX and self.control_bytes:
            lengths = np.ascontiguousarray(np.asarray(self._controllens)[: self._received])
            return sources.credentials_keys(self._controls, lengths, self._received,
                                            sources.UNIX | sock.fileno())  # fmt: skip
        own_key = sources.UNIX | sock.fileno() if family == socket.AF_UNIX else sources.UNKNOWN
        lengths = np.ascontiguousarray(np.asarray(self._namelens)[: self._received])
        keys = sources.source_keys(self._names, lengths, self._received, own_key)
        if family == socket.AF_INET6:
            for slot in np.flatnonzero(keys & sources.IPV6).tolist():
                self._name_ipv6(int(keys[slot]), sources.ipv6_name(self._names,
                                                                   slot * sources.NAME_BYTES))
        return keys

    def _name_ipv6(self, key: int, name: str) -> None:
        if key not in self.ipv6_names:
            if len(self.ipv6_names) >= IPV6_NAMES_KEPT:
                self.ipv6_names.clear()
            self.ipv6_names[key] = name

    def buffer_array(self) -> np.ndarray:
        """The slots' bytes (slot i at ``i * slot_bytes``), writable, for compiled readers."""
        return np.frombuffer(self._buffer, dtype=np.uint8)

    def read(self, sock: socket.socket, limit: int) -> list[memoryview]:
        """Up to about ``limit`` datagrams queued on ``sock`` right now; [] if none."""
        if not self.batched:
            return self._read_one_by_one(sock, limit)
        fd = sock.fileno()
        headers, slots, size, view = self._headers, self.slots, self.slot_bytes, self._view
        lengths = self._lengths
        datagrams: list[memoryview] = []
        self._received = 0
        wanted = min(slots, max(1, limit))
        np.asarray(self._namelens)[:wanted] = sources.NAME_BYTES  # value-result fields
        self._family = family = sock.family
        if family == socket.AF_UNIX:
            self._attach_controls()
            if self.control_bytes:
                np.asarray(self._controllens)[:wanted] = self.control_bytes
        # Each call reuses the buffers, so one call per read: it returns when the queue is
        # empty or all slots are full. Callers wanting more read again after consuming these.
        received = _RECVMMSG(fd, headers, wanted, _MSG_DONTWAIT, None)
        self.syscalls += 1
        if received < 0:
            error = ctypes.get_errno()
            if error in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EINTR):
                return datagrams
            if error in TRANSIENT_READ_ERRORS:
                self._transient_error(error)
                return datagrams
            raise OSError(error, os.strerror(error))
        self._received = received
        flags = self._flags
        for index in range(received):
            start = index * size
            length = lengths[index]
            if flags[index] & MSG_TRUNC:
                length = self._whole_lines(start, length)
            datagrams.append(view[start : start + length])
        return datagrams

    def read_queued(self, sock: socket.socket, limit: int) -> Chunk:
        """Every datagram queued on ``sock`` now, up to about ``limit``, each followed by a
        newline (copied out of the slots, which the next read reuses), with their senders."""
        chunks: list[bytes] = []
        keys: list[np.ndarray] = []
        lengths: list[np.ndarray] = []
        received = 0
        calls = self.syscalls
        while received < limit:
            datagrams = self.read(sock, limit - received)
            if not datagrams:
                break
            received += len(datagrams)
            chunks.append(b"\n".join(datagrams))
            keys.append(self.keys(sock))
            lengths.append(np.fromiter(map(len, datagrams), dtype=np.int64,
                                       count=len(datagrams)))  # fmt: skip
            if len(datagrams) < self.slots and self.batched:
                break  # the queue was empty
        return Chunk(
            b"\n".join([*chunks, b""]) if received else b"", received, self.syscalls - calls,
            np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64),
            np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64),
        )

    def _whole_lines(self, start: int, length: int) -> int:
        """A datagram cut off at ``length`` bytes: the length of its whole lines (up to its
        last newline, none if it has none); counted in ``truncated``."""
        self.truncated += 1
        return max(0, self._buffer.rfind(b"\n", start, start + length) - start)

    def _transient_error(self, error: int) -> None:
        self.read_errors += 1
        self.last_read_error = error
        time.sleep(READ_ERROR_PAUSE_S)

    def _read_one_by_one(self, sock: socket.socket, limit: int) -> list[memoryview]:
        """One ``recvfrom`` per datagram; on a Unix datagram socket one ``recvmsg``, with the
        sender's credentials (its process says more than its address, if it has one)."""
        datagrams: list[memoryview] = []
        recv_from, receive_message = sock.recvfrom_into, sock.recvmsg_into
        view, size = self._view, self.slot_bytes
        keys = self._keys = []
        family, own_key, known = sock.family, unix_key(sock), self._known
        credentials = family == socket.AF_UNIX and sources.CREDENTIALS
        for index in range(min(limit, self.slots)):
            start = index * size
            slot = view[start : start + size]
            try:  # MSG_TRUNC: the datagram's whole length, even if longer than the slot
                if credentials:
                    length, ancillary, _, _ = receive_message([slot], sources.CONTROL_BYTES,
                                                              MSG_TRUNC)  # fmt: skip
                else:
                    length, address = recv_from(slot, 0, MSG_TRUNC)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                if exc.errno not in TRANSIENT_READ_ERRORS:
                    raise
                self._transient_error(exc.errno)
                break
            self.syscalls += 1
            if length > size:
                length = self._whole_lines(start, size)
            datagrams.append(view[start : start + length])
            if credentials:
                keys.append(sources.key_of_ancillary(ancillary, own_key))
                continue
            key = known.get(address)
            if key is None:  # a new sender: this path's Python call per datagram is enough
                key = known[address] = sources.key_of_address(family, address, own_key)
                if key & sources.IPV6:
                    self._name_ipv6(key, address[0])
                if len(known) > IPV6_NAMES_KEPT:
                    known.clear()
            keys.append(key)
        return datagrams
