"""Per-client counts: each datagram's sender as every reader sees it, what a receiver counts
per client, a DogStatsD report set against what arrived, the limit, TCP connections, and the
processes sending on one Unix datagram socket."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamgauge.clock import ManualClock
from streamgauge.ingest import sources
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import SegmentWriter
from streamgauge.ingest.read_ahead import CompiledReadAhead, PythonReadAhead, ReadAhead
from streamgauge.ingest.receiver import Receiver
from streamgauge.ingest.transports import (
    Chunk,
    DatagramReader,
    bind_tcp,
    bind_udp,
    bind_unixgram,
    unix_key,
)

T0 = 1_700_000_000_000
TELEMETRY = (b"datadog.dogstatsd.client.metrics:%d|c|#client:py,client_version:0.50.0,"
             b"client_transport:udp\n"
             b"datadog.dogstatsd.client.packets_sent:%d|c|#client:py,client_version:0.50.0,"
             b"client_transport:udp\n"
             b"datadog.dogstatsd.client.packets_dropped_queue:%d|c|#client:py,"
             b"client_version:0.50.0,client_transport:udp\n")  # fmt: skip

#: (family of the listening socket, where it listens, where the sender sends from)
FAMILIES = [
    (socket.AF_INET, "127.0.0.1", "127.0.0.1"),
    (socket.AF_INET6, "::1", "::1"),
    (socket.AF_INET6, "::", "127.0.0.1"),  # IPv4 on a dual-stack socket: ::ffff:127.0.0.1
]


def _reader_chunks(kind: str) -> Callable[[socket.socket, int], list[Chunk]]:
    def read(sock: socket.socket, expected: int) -> list[Chunk]:
        chunks: list[Chunk] = []
        if kind in ("recvmmsg", "recv"):
            reader = DatagramReader(batched=kind == "recvmmsg")
            deadline = time.monotonic() + 5
            while sum(c.count for c in chunks) < expected and time.monotonic() < deadline:
                chunk = reader.read_queued(sock, 4096)
                if chunk.count:
                    chunks.append(chunk)
            return chunks
        read_ahead: ReadAhead = (CompiledReadAhead if kind == "compiled" else PythonReadAhead)(
            [sock])
        read_ahead.start()
        deadline = time.monotonic() + 5
        while sum(c.count for c in chunks) < expected and time.monotonic() < deadline:
            chunks += read_ahead.take()
            time.sleep(0.01)
        read_ahead.stop()
        read_ahead.close()
        return chunks

    return read


@pytest.mark.parametrize("kind", ["recvmmsg", "recv", "compiled", "python"])
@pytest.mark.parametrize(("family", "listen", "sender_host"), FAMILIES)
def test_every_reader_gives_each_datagram_its_senders_key(
    kind: str, family: socket.AddressFamily, listen: str, sender_host: str
) -> None:
    sock = bind_udp(listen, 0)
    sock.setblocking(False)  # as a receiver has it
    port = sock.getsockname()[1]
    senders = [socket.socket(socket.AF_INET6 if ":" in sender_host else socket.AF_INET,
                             socket.SOCK_DGRAM) for _ in range(2)]  # fmt: skip
    for sender in senders:
        sender.bind((sender_host, 0))
    expected = []
    for i in range(6):
        sender = senders[i % 2]
        sender.sendto(b"k:%d|c" % i, (sender_host, port))
        expected.append(sources.key_of_address(sender.family, sender.getsockname()))
    chunks = _reader_chunks(kind)(sock, 6)
    keys = np.concatenate([c.keys for c in chunks]).tolist()
    assert keys == expected
    assert np.concatenate([c.lengths for c in chunks]).tolist() == [len(b"k:%d|c" % i)
                                                                   for i in range(6)]
    if sender_host == "::1":
        assert all(k & sources.IPV6 for k in keys)
    else:
        assert all(sources.describe_key(k) == f"udp://127.0.0.1:{sources.port_of(k)}"
                   for k in keys)  # fmt: skip
    for s in (sock, *senders):
        s.close()


def _receiver(tmp_path: Path, sock: socket.socket, **kwargs: Any) -> tuple[Receiver, ManualClock]:
    clock = ManualClock(T0)
    receiver = Receiver(sock, SegmentWriter(tmp_path, "udp-0", fsync=False), PaneCombiner(1000),
                        clock, read_ahead_bytes=0, **kwargs)  # fmt: skip
    return receiver, clock


def _drain(receiver: Receiver, datagrams: int) -> None:
    deadline = time.monotonic() + 5
    while receiver.stats.datagrams < datagrams and time.monotonic() < deadline:
        receiver.receive_available()


def _clients(receiver: Receiver) -> dict[str, dict[str, Any]]:
    document: dict[str, Any] = receiver.clients.to_json()
    return {c["source"]: c for c in document["clients"]}


def test_a_report_is_set_against_what_arrived_since_the_previous_one(tmp_path: Path) -> None:
    """Three intervals of a DogStatsD client, as the receiver sees them:

        first report | 10 metrics, 2 lost | report: 10 sent | 5 metrics | report: 5 sent
        (left out)     8/10 arrived                            5/5

    plus a rejected line and an event, which are no metric."""
    sock = bind_udp("127.0.0.1", 0)
    port = sock.getsockname()[1]
    receiver, _ = _receiver(tmp_path, sock)
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    client.bind(("127.0.0.1", 0))
    sent = 0

    def send(*datagrams: bytes) -> None:
        nonlocal sent
        for datagram in datagrams:
            client.sendto(datagram, ("127.0.0.1", port))
            sent += 1
        _drain(receiver, sent)

    send(b"a:1|c\n", TELEMETRY % (1, 1, 0))  # the first report only starts the count
    send(*[b"a:1|c\n"] * 8, b"bad line\n", b"_e{1,1}:t|x\n")  # 2 of 10 lost on the way
    send(TELEMETRY % (10, 11, 2))
    send(*[b"a:1|c\n"] * 5, TELEMETRY % (5, 6, 0))
    (me,) = _clients(receiver).values()
    assert me["source"] == f"udp://127.0.0.1:{client.getsockname()[1]}"
    assert me["tags"] == {"client": "py", "client_version": "0.50.0", "client_transport": "udp"}
    assert (me["datagrams"], me["rejected"], me["reports_unaligned"]) == (
        sent, {"malformed_line": 1}, 1)
    # the event is no metric; the malformed line is one (the client counted it as sent)
    assert me["telemetry"] == {"reports": 2, "metrics_sent": 15.0, "metrics_received": 14,
                               "packets_sent": 17.0, "packets_received": 17,
                               "packets_dropped": {"queue": 2}}  # fmt: skip
    assert me["last_report"]["metrics_received"] == 5
    receiver.roll(receiver.now_ms())
    client.close()
    sock.close()


def test_a_lost_report_leaves_its_interval_out(tmp_path: Path) -> None:
    """Report 2 lost: more datagrams arrive before report 3 than it says were sent."""
    sock = bind_udp("127.0.0.1", 0)
    port = sock.getsockname()[1]
    receiver, _ = _receiver(tmp_path, sock)
    client = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    datagrams = [TELEMETRY % (0, 0, 0), *[b"a:1|c"] * 20, TELEMETRY % (10, 11, 0)]
    for datagram in datagrams:
        client.sendto(datagram, ("127.0.0.1", port))
    _drain(receiver, len(datagrams))
    (me,) = _clients(receiver).values()
    assert (me["telemetry"]["reports"], me["reports_unaligned"]) == (0, 2)
    client.close()
    sock.close()


def test_clients_beyond_the_limit_are_counted_together(tmp_path: Path) -> None:
    sock = bind_udp("127.0.0.1", 0)
    port = sock.getsockname()[1]
    receiver, _ = _receiver(tmp_path, sock, max_clients=2)
    senders = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(4)]
    for sender in senders:
        sender.sendto(b"a:1|c", ("127.0.0.1", port))
        _drain(receiver, senders.index(sender) + 1)
    clients = _clients(receiver)
    assert len(clients) == 3 and clients["overflow"]["datagrams"] == 2
    receiver.roll(receiver.now_ms())
    assert receiver.stats.clients_overflowed == {"client_limit": 2}
    for s in (sock, *senders):
        s.close()


def test_a_tcp_connection_is_a_client(tmp_path: Path) -> None:
    listener = bind_tcp("127.0.0.1", 0)
    receiver, _ = _receiver(tmp_path, listener)
    with socket.create_connection(listener.getsockname()) as conn:
        conn.sendall(b"a:1|c\nb:2|c\n" + TELEMETRY % (0, 0, 0) + b"c:x|c\n")
        deadline = time.monotonic() + 5
        while receiver.stats.lines < 6 and time.monotonic() < deadline:
            receiver.receive_available()
        peer = conn.getsockname()
    (me,) = _clients(receiver).values()
    assert me["source"] == f"tcp://{peer[0]}:{peer[1]}"
    assert (me["datagrams"], me["lines"], me["rejected"]) == (1, 6, {"invalid_value": 1})
    assert me["tags"]["client"] == "py"
    listener.close()


# -- Unix datagram senders: one client per process ----------------------------------------------

#: Sends each argument after the first (hex) as a datagram to the Unix socket at the first,
#: from one unbound socket (no address: only its process tells it apart); prints its pid.
UNIX_SENDER = """
import os, socket, sys
with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
    for datagram in sys.argv[2:]:
        sock.sendto(bytes.fromhex(datagram), sys.argv[1])
print(os.getpid())
"""
unix_only = pytest.mark.skipif(not sources.CREDENTIALS, reason="SO_PASSCRED is Linux's")


def _send_from_a_process(path: Path, datagrams: list[bytes]) -> int:
    """Send ``datagrams`` from a process of their own (at most 10 queued: a Unix datagram
    socket's net.unix.max_dgram_qlen); returns its pid."""
    done = subprocess.run([sys.executable, "-c", UNIX_SENDER, str(path),
                           *[d.hex() for d in datagrams]],
                          capture_output=True, text=True, check=True, timeout=60)  # fmt: skip
    return int(done.stdout)


@unix_only
@pytest.mark.parametrize("kind", ["recvmmsg", "recv", "compiled", "python"])
def test_every_reader_tells_unix_datagram_senders_apart_by_process(
    kind: str, tmp_path: Path
) -> None:
    path = tmp_path / "s.sock"
    sock = bind_unixgram(path)
    sock.setblocking(False)  # as a receiver has it
    first = _send_from_a_process(path, [b"a:1|c", b"a:2|c"])
    second = _send_from_a_process(path, [b"b:1|c", b"b:22|c", b"b:3|c"])
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as me:
        me.sendto(b"me:1|c", str(path))
    chunks = _reader_chunks(kind)(sock, 6)
    keys = np.concatenate([c.keys for c in chunks]).tolist()
    pid = sources.key_of_pid
    assert keys == [pid(first)] * 2 + [pid(second)] * 3 + [pid(os.getpid())]
    assert [sources.describe_key(k) for k in keys[1:3]] == [f"unixgram pid {first}",
                                                           f"unixgram pid {second}"]
    assert np.concatenate([c.lengths for c in chunks]).tolist() == [5, 5, 5, 6, 5, 6]
    sock.close()


@unix_only
@pytest.mark.parametrize("kind", ["recvmmsg", "recv", "compiled", "python"])
def test_a_unix_socket_without_credentials_counts_its_senders_together(
    kind: str, tmp_path: Path
) -> None:
    """A socket bound without SO_PASSCRED (not by ``bind_unixgram``): no credentials come,
    and every sender is the socket's one key, as before there were any."""
    path = tmp_path / "s.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.setblocking(False)
    _send_from_a_process(path, [b"a:1|c"])
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as me:
        me.sendto(b"me:1|c", str(path))
    chunks = _reader_chunks(kind)(sock, 2)
    assert np.concatenate([c.keys for c in chunks]).tolist() == [unix_key(sock)] * 2
    sock.close()


@unix_only
def test_one_reader_of_udp_and_unix_sockets_keys_each_by_its_kind(tmp_path: Path) -> None:
    """A receiver reading its sockets itself has one reader for all: the Unix socket's reads
    give processes, the UDP socket's addresses, in any order; a reader that only ever read
    UDP has no control buffers."""
    udp, unix = bind_udp("127.0.0.1", 0), bind_unixgram(tmp_path / "s.sock")
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.bind(("127.0.0.1", 0))
    address_key = sources.key_of_address(socket.AF_INET, sender.getsockname())
    udp_only, both = DatagramReader(), DatagramReader()
    for _ in range(2):
        sender.sendto(b"u:1|c", udp.getsockname())
        assert both.read_queued(udp, 10).keys.tolist() == [address_key]
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as me:
            me.sendto(b"x:1|c", str(tmp_path / "s.sock"))
        assert both.read_queued(unix, 10).keys.tolist() == [sources.key_of_pid(os.getpid())]
    sender.sendto(b"u:1|c", udp.getsockname())
    assert udp_only.read_queued(udp, 10).keys.tolist() == [address_key]
    assert (udp_only.control_bytes, both.control_bytes) == (0, sources.CONTROL_BYTES)
    for s in (udp, unix, sender):
        s.close()


@unix_only
@pytest.mark.parametrize("recvmmsg", [True, False])
def test_each_process_on_a_unix_socket_is_a_client_with_its_own_report(
    recvmmsg: bool, tmp_path: Path
) -> None:
    """Two DogStatsD clients in two processes, over one Unix socket: each is a client, its
    report set against what arrived from it alone (5 of 5 metrics; 4 of 8, the rest sampled
    out by the client, which counts them as sent)."""
    path = tmp_path / "s.sock"
    sock = bind_unixgram(path)
    receiver, _ = _receiver(tmp_path / "spool", sock, recvmmsg=recvmmsg)
    report = TELEMETRY.replace(b"client_transport:udp", b"client_transport:uds")
    first = [report % (0, 0, 0), *[b"a:1|c"] * 5, report % (5, 6, 0)]
    second = [report % (0, 0, 0), *[b"b:1|c|@0.5"] * 4, report % (8, 5, 0)]
    a = _send_from_a_process(path, first)
    _drain(receiver, len(first))
    b = _send_from_a_process(path, second)
    _drain(receiver, len(first) + len(second))
    clients = _clients(receiver)
    assert set(clients) == {f"unixgram pid {a}", f"unixgram pid {b}"}
    for pid, datagrams, sent, received, packets in ((a, 7, 5.0, 5, 6), (b, 6, 8.0, 4, 5)):
        me = clients[f"unixgram pid {pid}"]
        assert me["tags"]["client_transport"] == "uds"
        assert (me["datagrams"], me["reports_unaligned"]) == (datagrams, 1)
        telemetry = me["telemetry"]
        assert (telemetry["reports"], telemetry["metrics_sent"], telemetry["metrics_received"],
                telemetry["packets_sent"], telemetry["packets_received"]) == (
            1, sent, received, float(packets), packets)  # fmt: skip
    receiver.roll(receiver.now_ms())
    sock.close()
