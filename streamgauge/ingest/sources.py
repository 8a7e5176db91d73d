"""Who sent a datagram: its source address as one int64 key, so that a read batch's datagrams
are counted per sender with numpy instead of a Python call each.

``recvmmsg`` writes each datagram's sender into its slot's ``msg_name`` (``NAME_BYTES`` per
slot, room for a ``sockaddr_in6``), and on a Unix datagram socket with ``SO_PASSCRED`` the
sending process's credentials into its slot's ``msg_control`` (``CONTROL_BYTES`` per slot, one
``SCM_CREDENTIALS`` message). ``source_key`` and ``credentials_key`` pack them:

    IPv4 (and IPv4-mapped IPv6)   address << 16 | port                       below 2**48
    IPv6                          IPV6 | 42-bit hash of the address << 16 | port
    Unix datagram socket          UNIX | PID | the sending process's pid     (pid below 2**31)
    Unix, no credentials          UNIX | the socket's descriptor (every such sender of one
                                  socket together: an unbound client socket has no address)
    TCP connection                TCP | the connection's serial number (``Receiver``)
    nothing known                 UNKNOWN

A Unix sender is its process, as the receiver's pid namespace sees it (``SCM_CREDENTIALS``):
several client sockets of one process are one sender, and a pid reused by a later process
continues the earlier one's sender. A datagram arrives without credentials when the socket
has no ``SO_PASSCRED`` (``transports.bind_unixgram`` sets it) or its sender's pid is not
visible in the receiver's pid namespace (the kernel then gives pid 0).

An IPv6 key keeps a hash, not the address: each reader's ``ipv6_names`` (filled when it
first sees a key) names it for people.
"""

from __future__ import annotations

import ctypes
import socket
import sys
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

import numba
import numpy as np

#: Bytes of ``msg_name`` per read slot: a sockaddr_in6 (28), rounded up to a multiple of 8.
NAME_BYTES = 32
IPV6 = 1 << 62
UNIX = 1 << 61
TCP = 1 << 60
UNKNOWN = 0
#: Marks a Unix sender's key as holding its pid (beside UNIX), not the socket's descriptor.
PID = 1 << 32
_PID_LIMIT = 1 << 31  # pid_t is an int: a pid is below, and below PID
_PORT_BITS = 16
_HASH_MASK = (1 << 42) - 1  # below the flag bits (58 and up)
_AF_INET = int(socket.AF_INET)
_AF_INET6 = int(socket.AF_INET6)
_AF_UNIX = int(socket.AF_UNIX)
# struct cmsghdr {size_t cmsg_len; int cmsg_level; int cmsg_type;}, then (SCM_CREDENTIALS)
# struct ucred {pid_t pid; uid_t uid; gid_t gid;}; every part aligned to a size_t (CMSG_ALIGN)
_SIZE_T = ctypes.sizeof(ctypes.c_size_t)
_UCRED_BYTES = 12
_CMSG_HEADER = (_SIZE_T + 8 + _SIZE_T - 1) // _SIZE_T * _SIZE_T
_SOL_SOCKET = int(socket.SOL_SOCKET)
_SCM_CREDENTIALS = int(getattr(socket, "SCM_CREDENTIALS", 2))
#: Bytes of ``msg_control`` per read slot of a Unix datagram socket: room for one
#: SCM_CREDENTIALS message, CMSG_SPACE(sizeof(struct ucred)).
CONTROL_BYTES = _CMSG_HEADER + (_UCRED_BYTES + _SIZE_T - 1) // _SIZE_T * _SIZE_T
#: Whether this platform passes a Unix datagram sender's credentials (Linux).
CREDENTIALS = hasattr(socket, "SO_PASSCRED") and hasattr(socket, "SCM_CREDENTIALS")
_FMIX_1 = np.uint64(0xFF51AFD7ED558CCD)  # murmur3's fmix64
_FMIX_2 = np.uint64(0xC4CEB9FE1A85EC53)

_F = TypeVar("_F", bound=Callable[..., Any])


def _jit(function: _F) -> _F:
    """numba's ``njit``, typed for mypy; ``nogil``: called from the compiled reader loop."""
    return cast(_F, numba.njit(cache=True, nogil=True)(function))


@_jit
def _fmix(h: np.uint64) -> np.uint64:
    h = (h ^ (h >> np.uint64(33))) * _FMIX_1
    h = (h ^ (h >> np.uint64(33))) * _FMIX_2
    return h ^ (h >> np.uint64(33))


@_jit
def _big_endian(names: np.ndarray, start: int, n: int) -> np.uint64:
    word = np.uint64(0)
    for i in range(start, start + n):
        word = (word << np.uint64(8)) | np.uint64(names[i])
    return word


@_jit
def source_key(names: np.ndarray, offset: int, length: int, unix_key: int) -> np.int64:
    """The key of the sender whose ``sockaddr`` (``length`` bytes) is at ``names[offset:]``.
    (int64 throughout: numba makes a float of an int64 mixed with a uint64.)"""
    if length < 2:
        return np.int64(unix_key)  # an unnamed Unix datagram sender, or none
    family = np.int64(names[offset]) | np.int64(names[offset + 1]) << 8  # host order (LE)
    if family == _AF_UNIX:
        return np.int64(unix_key)
    port = np.int64(names[offset + 2]) << 8 | np.int64(names[offset + 3])
    if family == _AF_INET and length >= 8:
        return np.int64(_big_endian(names, offset + 4, 4)) << _PORT_BITS | port
    if family == _AF_INET6 and length >= 24:
        high = _big_endian(names, offset + 8, 8)
        low = _big_endian(names, offset + 16, 8)
        if high == 0 and (low >> np.uint64(32)) == np.uint64(0xFFFF):  # ::ffff:a.b.c.d
            return np.int64(low & np.uint64(0xFFFFFFFF)) << _PORT_BITS | port
        hashed = np.int64(_fmix(high ^ _fmix(low)) & np.uint64(_HASH_MASK))
        return np.int64(IPV6) | hashed << _PORT_BITS | port
    return np.int64(UNKNOWN)


@_jit
def source_keys(names: np.ndarray, lengths: np.ndarray, count: int, unix_key: int
                ) -> np.ndarray:
    """``source_key`` of the first ``count`` slots (``NAME_BYTES`` each; their ``msg_namelen``
    in ``lengths``)."""
    keys = np.empty(count, dtype=np.int64)
    for i in range(count):
        keys[i] = source_key(names, i * NAME_BYTES, int(lengths[i]), unix_key)
    return keys


@_jit
def _little_endian(data: np.ndarray, start: int, n: int) -> np.int64:
    word = np.int64(0)
    for i in range(start + n - 1, start - 1, -1):
        word = (word << 8) | np.int64(data[i])
    return word


@_jit
def credentials_pid(controls: np.ndarray, offset: int, length: int) -> np.int64:
    """The sending process's pid in the SCM_CREDENTIALS message among the control messages
    (``length`` bytes, at most ``CONTROL_BYTES``) at ``controls[offset:]``; 0 if none came."""
    at = offset
    end = offset + min(length, CONTROL_BYTES)  # never past the slot, whatever length says
    while at + _CMSG_HEADER <= end:
        size = _little_endian(controls, at, _SIZE_T)
        if size < _CMSG_HEADER or at + size > end:
            return np.int64(0)
        level = _little_endian(controls, at + _SIZE_T, 4)
        kind = _little_endian(controls, at + _SIZE_T + 4, 4)
        if level == _SOL_SOCKET and kind == _SCM_CREDENTIALS and size >= _CMSG_HEADER + 4:
            return _little_endian(controls, at + _CMSG_HEADER, 4)  # a negative one: >= 2**31
        at += int(size + _SIZE_T - 1) // _SIZE_T * _SIZE_T
    return np.int64(0)


@_jit
def credentials_key(controls: np.ndarray, offset: int, length: int, unix_key: int
                    ) -> np.int64:
    """The key of the Unix datagram sender whose control messages (``length`` bytes, its
    slot's ``msg_controllen``) are at ``controls[offset:]``: its pid's, else ``unix_key``
    (no credentials, or pid 0: a sender outside the receiver's pid namespace)."""
    pid = credentials_pid(controls, offset, length)
    if 0 < pid < _PID_LIMIT:
        return np.int64(UNIX | PID) | pid
    return np.int64(unix_key)


@_jit
def credentials_keys(controls: np.ndarray, lengths: np.ndarray, count: int, unix_key: int
                     ) -> np.ndarray:
    """``credentials_key`` of the first ``count`` slots (``CONTROL_BYTES`` each; their
    ``msg_controllen`` in ``lengths``)."""
    keys = np.empty(count, dtype=np.int64)
    for i in range(count):
        keys[i] = credentials_key(controls, i * CONTROL_BYTES, int(lengths[i]), unix_key)
    return keys


def key_of_pid(pid: int, unix_key: int = UNKNOWN) -> int:
    """The key of a Unix datagram sender with process id ``pid`` (``unix_key`` if none: 0)."""
    return UNIX | PID | pid if 0 < pid < _PID_LIMIT else unix_key


def key_of_ancillary(ancillary: Iterable[tuple[int, int, bytes]], unix_key: int) -> int:
    """``credentials_key`` of the control messages as Python's ``recvmsg`` gives them."""
    for level, kind, data in ancillary:
        if level == _SOL_SOCKET and kind == _SCM_CREDENTIALS and len(data) >= 4:
            return key_of_pid(int.from_bytes(data[:4], sys.byteorder, signed=True), unix_key)
    return unix_key


def key_of_address(family: int, address: Any, unix_key: int = UNKNOWN) -> int:
    """``source_key`` of an address as Python's socket module gives it (``recvfrom``)."""
    if family == _AF_INET:
        return int.from_bytes(socket.inet_aton(address[0]), "big") << _PORT_BITS | int(address[1])
    if family == _AF_INET6:
        packed = socket.inet_pton(socket.AF_INET6, address[0].split("%")[0])
        names = np.zeros(NAME_BYTES, dtype=np.uint8)
        names[0:2] = np.frombuffer(_AF_INET6.to_bytes(2, "little"), dtype=np.uint8)
        names[2:4] = np.frombuffer(int(address[1]).to_bytes(2, "big"), dtype=np.uint8)
        names[8:24] = np.frombuffer(packed, dtype=np.uint8)
        return int(source_key(names, 0, 28, unix_key))
    return unix_key


def ipv6_name(names: np.ndarray, offset: int) -> str:
    """The text of the IPv6 address of the ``sockaddr_in6`` at ``names[offset:]``."""
    return socket.inet_ntop(socket.AF_INET6, names[offset + 8 : offset + 24].tobytes())


def describe_key(key: int, scheme: str = "udp") -> str | None:
    """A person's name for a key that carries its address (IPv4) or process (a Unix
    datagram sender: ``unixgram pid 1234``), else None."""
    if key & ~(PID - 1) == UNIX | PID:
        return f"unixgram pid {key & (PID - 1)}"
    if key <= 0 or key >= 1 << 48:
        return None
    address = socket.inet_ntoa((key >> _PORT_BITS).to_bytes(4, "big"))
    return f"{scheme}://{address}:{key & 0xFFFF}"


def port_of(key: int) -> int:
    return key & 0xFFFF


def prepare() -> None:
    """Compile (or load from numba's cache) now, not on the first datagram."""
    source_keys(np.zeros(NAME_BYTES, dtype=np.uint8), np.zeros(1, dtype=np.uint32), 1, 0)
    credentials_keys(np.zeros(CONTROL_BYTES, dtype=np.uint8), np.zeros(1, dtype=np.uint64),
                     1, 0)  # fmt: skip
