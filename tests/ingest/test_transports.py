"""Listen addresses, socket binding, TCP line assembly and the kernel's drop counters."""

from __future__ import annotations

import os
import select
import socket
import stat
import sys
import time
from pathlib import Path

import pytest

from streamgauge.ingest import kernel
from streamgauge.ingest.transports import (
    DatagramReader,
    LineAssembler,
    ListenSpec,
    bind_udp,
    bind_unixgram,
    parse_listen_spec,
)

LISTEN_GOOD = [
    ("127.0.0.1:8125", ListenSpec("udp", "127.0.0.1", 8125)),
    (":8125", ListenSpec("udp", "127.0.0.1", 8125)),
    ("udp://0.0.0.0:9", ListenSpec("udp", "0.0.0.0", 9)),
    ("udp://[::1]:8125", ListenSpec("udp", "::1", 8125)),
    ("[::]:8125", ListenSpec("udp", "::", 8125)),
    ("tcp://127.0.0.1:8126", ListenSpec("tcp", "127.0.0.1", 8126)),
    ("unixgram:///run/sg.sock", ListenSpec("unixgram", path="/run/sg.sock")),
]
LISTEN_BAD = [
    ("127.0.0.1", "expected HOST:PORT"),
    ("127.0.0.1:http", "expected HOST:PORT"),
    ("127.0.0.1:70000", "expected HOST:PORT"),
    ("sctp://a:1", "unknown scheme 'sctp'"),
    ("unixgram://relative.sock", "must be absolute"),
    ("udp://[::1:8125", "unbalanced brackets"),
]


@pytest.mark.parametrize(("text", "spec"), LISTEN_GOOD)
def test_listen_values(text: str, spec: ListenSpec) -> None:
    assert parse_listen_spec(text) == spec


@pytest.mark.parametrize(("text", "message"), LISTEN_BAD)
def test_bad_listen_values_name_the_value(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as error:
        parse_listen_spec(text)
    assert repr(text) in str(error.value)


def test_listen_specs_print_as_they_parse() -> None:
    for text in ("udp://[::1]:8125", "tcp://127.0.0.1:1", "unixgram:///a/b"):
        assert str(parse_listen_spec(text)) == text


def test_lines_split_across_reads_are_joined() -> None:
    assembler = LineAssembler(max_line_bytes=100)
    assert assembler.feed(b"a:1|c\nb:") == (b"a:1|c\n", 0)
    assert assembler.feed(b"2|") == (b"", 0)
    assert assembler.feed(b"g\nc:3|ms") == (b"b:2|g\n", 0)
    assert assembler.close() == b"c:3|ms"


def test_an_endless_tcp_line_is_cut_once_and_skipped_to_its_newline() -> None:
    assembler = LineAssembler(max_line_bytes=10)
    assert assembler.feed(b"x" * 8) == (b"", 0)
    assert assembler.feed(b"x" * 8) == (b"", 1)
    assert assembler.feed(b"x" * 50) == (b"", 0)
    assert assembler.feed(b"xx\nok:1|c\n") == (b"ok:1|c\n", 0)
    assert assembler.close() == b""


@pytest.mark.parametrize("mode", [0o600, 0o660])
def test_unix_sockets_are_private_and_replace_a_stale_socket(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "sg.sock"
    first = bind_unixgram(path, mode=mode)
    first.close()  # a crash leaves the file behind
    again = bind_unixgram(path, mode=mode)
    assert stat.S_IMODE(path.stat().st_mode) == mode
    again.close()


def test_unix_socket_refuses_world_access_and_a_regular_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="0600 or 0660"):
        bind_unixgram(tmp_path / "a.sock", mode=0o666)
    (tmp_path / "data").write_text("precious")
    with pytest.raises(FileExistsError, match="not a socket"):
        bind_unixgram(tmp_path / "data")
    assert (tmp_path / "data").read_text() == "precious"


def test_kernel_counters_are_read_from_proc_files(tmp_path: Path) -> None:
    header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
    header += "timeout inode ref pointer drops\n"
    row = "  {sl}: 0100007F:1FBD 00000000:0000 07 00000000:00000000 00:00000000 00000000     0  "
    row += "      0 {inode} 2 0000000000000000 {drops}\n"
    (tmp_path / "udp").write_text(
        header + row.format(sl=1, inode=111, drops=7) + row.format(sl=2, inode=222, drops=9)
    )
    (tmp_path / "udp6").write_text(header + row.format(sl=1, inode=333, drops=4))
    (tmp_path / "snmp").write_text(
        "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n"
        "Udp: 100 0 5 100 5 0\n"
        "UdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors\n"
        "UdpLite: 0 0 0 0 99 0\n"
    )
    (tmp_path / "snmp6").write_text("Udp6InDatagrams    10\nUdp6RcvbufErrors   3\n")
    assert kernel.udp_socket_drops({111, 333, 999}, tmp_path) == {111: 7, 333: 4}
    assert kernel.udp_rcvbuf_errors(tmp_path) == 8
    assert kernel.udp_rcvbuf_errors(tmp_path / "missing") == 0


def test_a_real_socket_is_found_by_its_inode() -> None:
    if not os.path.exists("/proc/net/udp"):
        pytest.skip("no /proc/net/udp")
    sock = bind_udp("127.0.0.1", 0)
    try:
        inode = kernel.socket_inode(sock)
        assert kernel.udp_socket_drops({inode}) == {inode: 0}
    finally:
        sock.close()


def test_reuse_port_lets_two_sockets_share_a_port() -> None:
    first = bind_udp("127.0.0.1", 0, reuse_port=True)
    second = bind_udp("127.0.0.1", first.getsockname()[1], reuse_port=True)
    assert first.getsockname() == second.getsockname()
    with pytest.raises(OSError):
        bind_udp("127.0.0.1", first.getsockname()[1])  # without it: address in use
    first.close()
    second.close()
    assert socket.AF_INET6  # IPv6 binding is exercised in test_receiver


def _queue(sock: socket.socket, datagrams: list[bytes]) -> None:
    target = sock.getsockname()
    family = socket.AF_UNIX if sock.family == socket.AF_UNIX else sock.family
    with socket.socket(family, socket.SOCK_DGRAM) as sender:
        for datagram in datagrams:
            sender.sendto(datagram, target)
    deadline = time.monotonic() + 5
    # loopback delivers synchronously; the wait only guards against a slow scheduler
    while time.monotonic() < deadline:
        readable, _, _ = select.select([sock], [], [], 0.05)
        if readable:
            break


@pytest.mark.parametrize("batched", [True, False])
def test_a_datagram_reader_returns_every_queued_datagram_whole_and_in_order(
    batched: bool, tmp_path: Path
) -> None:
    sockets = [bind_udp("127.0.0.1", 0), bind_unixgram(tmp_path / "s.sock")]
    try:
        for sock in sockets:
            sock.setblocking(False)
            # a Unix datagram socket queues at most net.unix.max_dgram_qlen (10) datagrams
            many = 40 if sock.family != socket.AF_UNIX else 7
            sent = [b"a%d:1|c" % i for i in range(many)] + [b"", b"big:1|c\n" * 7000]
            _queue(sock, sent)
            reader = DatagramReader(slots=4, batched=batched)
            got: list[bytes] = []
            while chunk := reader.read(sock, 1000):
                got += [bytes(view) for view in chunk]  # views die at the next read
            assert got == sent
            if batched and sys.platform.startswith("linux"):
                # four per call, and the call that found the queue empty
                assert reader.batched and reader.syscalls == -(-len(sent) // 4) + 1
            assert reader.read(sock, 1000) == []
    finally:
        for sock in sockets:
            sock.close()


def test_a_datagram_reader_reads_at_most_its_limit() -> None:
    sock = bind_udp("127.0.0.1", 0)
    sock.setblocking(False)
    try:
        _queue(sock, [b"x:%d|c" % i for i in range(10)])
        reader = DatagramReader(slots=8)
        assert [bytes(v) for v in reader.read(sock, 3)] == [b"x:0|c", b"x:1|c", b"x:2|c"]
        assert len(reader.read(sock, 100)) == 7
    finally:
        sock.close()
