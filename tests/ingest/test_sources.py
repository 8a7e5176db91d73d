"""A Unix datagram sender's key (``sources``): its process, read from the SCM_CREDENTIALS
message the kernel writes into a read slot's control buffer, packed apart from every other
kind of key, and named for people."""

from __future__ import annotations

import os
import socket
import struct
import sys

import numpy as np
import pytest

from streamgauge.ingest import sources

pytestmark = pytest.mark.skipif(not sources.CREDENTIALS, reason="SO_PASSCRED is Linux's")

FD_KEY = sources.UNIX | 7  # the listening socket's descriptor: a sender without credentials


def _message(level: int, kind: int, data: bytes) -> bytes:
    """One control message as the kernel lays it out (``struct cmsghdr``, then the data),
    padded to CMSG_SPACE."""
    header = struct.pack("@Nii", socket.CMSG_LEN(len(data)), level, kind)
    message = header + data
    return message + bytes(socket.CMSG_SPACE(len(data)) - len(message))


def _credentials(pid: int) -> bytes:
    return _message(socket.SOL_SOCKET, socket.SCM_CREDENTIALS, struct.pack("@iII", pid, 0, 0))


def _slots(messages: list[bytes]) -> np.ndarray:
    """Read slots of ``sources.CONTROL_BYTES``, one message each."""
    controls = np.zeros(len(messages) * sources.CONTROL_BYTES, dtype=np.uint8)
    for i, message in enumerate(messages):
        start = i * sources.CONTROL_BYTES
        controls[start : start + len(message)] = np.frombuffer(message, dtype=np.uint8)
    return controls


def test_a_slots_control_buffer_holds_one_credentials_message() -> None:
    assert socket.CMSG_SPACE(12) == sources.CONTROL_BYTES  # sizeof(struct ucred)
    assert len(_credentials(1)) == sources.CONTROL_BYTES


def test_each_slot_is_keyed_by_the_pid_in_its_credentials_else_by_the_socket() -> None:
    rights = _message(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("@i", 5))
    messages = [
        _credentials(1234), _credentials(1234), _credentials(99),
        b"",  # no control message (a socket without SO_PASSCRED)
        _credentials(0),  # the sender's pid is not visible in the receiver's namespace
        rights,  # another message than credentials
        _credentials(4321),  # cut short (msg_controllen below): no whole header
        _credentials(2**31 - 1),
    ]  # fmt: skip
    lengths = np.array([len(m) for m in messages], dtype=np.uint64)
    lengths[6] = 8
    keys = sources.credentials_keys(_slots(messages), lengths, len(messages), FD_KEY)
    pid = sources.key_of_pid
    assert keys.tolist() == [pid(1234), pid(1234), pid(99), FD_KEY, FD_KEY, FD_KEY, FD_KEY,
                             pid(2**31 - 1)]  # fmt: skip
    # a length beyond the slot (never written by the kernel) reads no further than the slot
    assert sources.credentials_key(_slots(messages), 0, 1 << 20, FD_KEY) == pid(1234)


def test_a_pids_key_stands_apart_from_every_other_key_and_names_the_process() -> None:
    key = sources.key_of_pid(1234, FD_KEY)
    assert key == sources.UNIX | sources.PID | 1234
    assert key != sources.UNIX | 1234  # the socket whose descriptor is 1234
    assert key >= 1 << 48 and not key & (sources.IPV6 | sources.TCP)  # not IPv4, IPv6, TCP
    assert sources.describe_key(key) == "unixgram pid 1234"
    assert sources.describe_key(sources.key_of_pid(2**31 - 1)) == f"unixgram pid {2**31 - 1}"
    # no process known: the socket's key, which the receiver names by its path
    assert sources.key_of_pid(0, FD_KEY) == sources.key_of_pid(-5, FD_KEY) == FD_KEY
    assert sources.describe_key(FD_KEY) is None
    # an IPv4 sender's key keeps its name, bit 32 (PID) set or not
    ipv4 = sources.key_of_address(socket.AF_INET, ("10.1.0.7", 53111))
    assert ipv4 & sources.PID and sources.describe_key(ipv4) == "udp://10.1.0.7:53111"


def test_recvmsg_s_credentials_give_the_same_key() -> None:
    """The Python readers' path: the control messages as ``socket.recvmsg`` parses them, here
    the kernel's own for this process."""
    receiver, sender = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    with receiver, sender:
        receiver.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sender.send(b"a:1|c")
        _, ancillary, _, _ = receiver.recvmsg(64, sources.CONTROL_BYTES)
    assert sources.key_of_ancillary(ancillary, FD_KEY) == sources.key_of_pid(os.getpid())
    assert sources.key_of_ancillary([], FD_KEY) == FD_KEY
    other = (socket.SOL_SOCKET, socket.SCM_RIGHTS, (5).to_bytes(4, sys.byteorder))
    assert sources.key_of_ancillary([other], FD_KEY) == FD_KEY
