"""The ingest process as `streamgauge ingest` runs it: crash under load and restart, graceful
stop, and several processes sharing one UDP port (what `streamgauge run --receivers N` does)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from streamgauge.ingest.log import list_segments, read_heartbeat, read_segment
from streamgauge.ingest.process import (
    IngestChildren,
    IngestSettings,
    bind_receivers,
    parse_byte_size,
)
from streamgauge.ingest.transports import parse_listen_spec

CONFIG = """
name: ingest_test
pane: 1s
windows:
  - name: per_2s
    kind: tumbling
    size: 2s
    metrics: ["*"]
"""


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(CONFIG)
    return path


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(config: Path, data_dir: Path, *args: str, **popen: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "streamgauge", "ingest", "--config", str(config),
         "--data-dir", str(data_dir), *args],
        stderr=subprocess.PIPE, **popen,
    )


def _wait_for_stats(data_dir: Path, receiver: str, process: subprocess.Popen[bytes],
                    minimum_lines: int = 0) -> dict[str, Any]:
    path = data_dir / "ingest" / f"{receiver}.json"
    deadline = time.monotonic() + 30
    while True:
        if process.poll() is not None:
            assert process.stderr is not None
            pytest.fail(f"ingest exited {process.returncode}: {process.stderr.read().decode()}")
        try:
            stats: dict[str, Any] = json.loads(path.read_text())
            if stats["lines"] >= minimum_lines:
                return stats
        except (FileNotFoundError, json.JSONDecodeError):
            pass
        assert time.monotonic() < deadline, f"no stats with {minimum_lines} lines in {path}"
        time.sleep(0.05)


def _metric_counts(spool: Path, receiver: str) -> dict[str, int]:
    """Sum of `count` per metric over every segment; reading each one proves it is whole."""
    counts: dict[str, int] = {}
    for segment in list_segments(spool, receiver):
        read_heartbeat(segment)
        for batch in read_segment(segment):
            for row in batch.to_pylist():
                counts[row["metric"]] = counts.get(row["metric"], 0) + row["count"]
    return counts


class Sender(threading.Thread):
    """Sends `name:1|c` lines, 20 per datagram, as fast as the loop goes, until stopped."""

    def __init__(self, port: int, name: str) -> None:
        super().__init__(daemon=True)
        self.port, self.name, self.sent = port, name, 0
        self.halt = threading.Event()

    def run(self) -> None:
        datagram = b"\n".join([self.name.encode() + b":1|c"] * 20)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            while not self.halt.is_set():
                sock.sendto(datagram, ("127.0.0.1", self.port))
                self.sent += 20
                if self.sent % 2000 == 0:
                    time.sleep(0.002)  # heavy load, but within the receive buffer


def test_kill_9_under_load_then_restart_loses_no_segment_and_counts_nothing_twice(
    tmp_path: Path, config: Path
) -> None:
    data_dir = tmp_path / "data"
    spool = data_dir / "spool"
    port = _free_udp_port()
    listen = ("--listen", f"udp://127.0.0.1:{port}")
    first = _start(config, data_dir, *listen)
    _wait_for_stats(data_dir, "udp-0", first)
    sender = Sender(port, "crash.before")
    sender.start()
    _wait_for_stats(data_dir, "udp-0", first, minimum_lines=20_000)
    # the stats file is written when a segment is queued; the writer thread writes it after
    deadline = time.monotonic() + 30
    while not _metric_counts(spool, "udp-0").get("crash.before"):
        assert time.monotonic() < deadline, "no segment written"
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    sender.halt.set()
    sender.join()

    before = list_segments(spool, "udp-0")
    assert [s.sequence for s in before] == list(range(len(before)))
    counted_before = _metric_counts(spool, "udp-0")["crash.before"]
    # What was combined but not yet written died with the process; nothing more appears.
    assert 0 < counted_before <= sender.sent

    (data_dir / "ingest" / "udp-0.json").unlink()  # the dead process's; wait for the new one
    # what a kill in mid-write leaves (the kill above may have left one too, under this name)
    torn = spool / "udp-0" / f".{before[-1].sequence + 1:012d}.arrow.tmp"
    torn.write_bytes(b"half a segment")
    second = _start(config, data_dir, *listen)
    _wait_for_stats(data_dir, "udp-0", second, minimum_lines=0)
    # removed on start (the writer thread may be writing a new one under the same name now)
    assert not (torn.exists() and torn.read_bytes() == b"half a segment")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _ in range(500):
            sock.sendto(b"\n".join([b"crash.after:1|c"] * 20), ("127.0.0.1", port))
    second.send_signal(signal.SIGTERM)  # at once: whatever is queued must still be read
    assert second.wait(30) == 0

    after = list_segments(spool, "udp-0")
    assert [s.sequence for s in after] == list(range(len(after)))  # the sequence continued
    assert after[len(before)].sequence == before[-1].sequence + 1
    assert read_heartbeat(after[-1]).closed
    counts = _metric_counts(spool, "udp-0")
    assert counts["crash.before"] == counted_before  # the restart re-counted nothing
    stats = json.loads((data_dir / "ingest" / "udp-0.json").read_text())
    assert stats["kernel_drops"] in ({}, {f"udp://127.0.0.1:{port}": 0})
    assert counts["crash.after"] == 10_000 == stats["lines"]  # graceful stop lost nothing


def test_ingest_serves_tcp_and_a_unix_socket_and_removes_the_socket_file(
    tmp_path: Path, config: Path
) -> None:
    data_dir = tmp_path / "data"
    unix_path = tmp_path / "sg.sock"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        tcp_port = probe.getsockname()[1]
    process = _start(config, data_dir, "--listen", f"tcp://127.0.0.1:{tcp_port}",
                     "--listen", f"unixgram://{unix_path}", "--unix-mode", "0660")
    _wait_for_stats(data_dir, "udp-0", process)
    assert oct(unix_path.stat().st_mode & 0o777) == oct(0o660)
    with socket.create_connection(("127.0.0.1", tcp_port)) as conn:
        conn.sendall(b"over.tcp:1|c\n" * 100)
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as unix:
        unix.sendto(b"over.unix:1|c\n" * 10, str(unix_path))
    _wait_for_stats(data_dir, "udp-0", process, minimum_lines=110)
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert not unix_path.exists()
    counts = _metric_counts(data_dir / "spool", "udp-0")
    assert (counts["over.tcp"], counts["over.unix"]) == (100, 10)


def test_a_burst_of_sigterms_stops_ingest_once_and_cleanly(tmp_path: Path, config: Path) -> None:
    """When `run` dies, the kernel sends its receivers SIGTERM once per thread of `run` that
    exits (PR_SET_PDEATHSIG follows the parent thread): signals arrive while the handler of
    the first is still running, and the receiver must still drain, close and exit."""
    data_dir = tmp_path / "data"
    process = _start(config, data_dir, "--listen", f"127.0.0.1:{_free_udp_port()}")
    _wait_for_stats(data_dir, "udp-0", process)
    try:
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGTERM)
        assert process.wait(30) == 0
    finally:
        process.kill()
    [*_, last] = list_segments(data_dir / "spool", "udp-0")
    assert read_heartbeat(last).closed


def test_bad_ingest_options_fail_with_one_line(tmp_path: Path, config: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "streamgauge", "ingest", "--config", str(config),
         "--data-dir", str(tmp_path), "--listen", "sctp://x:1"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 2
    assert "unknown scheme 'sctp'" in done.stderr
    assert "Traceback" not in done.stderr


def test_receivers_share_one_udp_port_each_writing_its_own_stream(
    tmp_path: Path, config: Path
) -> None:
    data_dir = tmp_path / "data"
    groups = bind_receivers([parse_listen_spec("udp://127.0.0.1:0")], 2)
    port = groups[0][0].getsockname()[1]
    assert groups[1][0].getsockname()[1] == port
    children = IngestChildren([
        _start(config, data_dir, "--receiver", f"udp-{index}",
               "--inherit-fd", str(sockets[0].fileno()),
               pass_fds=[sockets[0].fileno()])
        for index, sockets in enumerate(groups)
    ])
    for sockets in groups:
        sockets[0].close()
    for index, child in enumerate(children.children):
        _wait_for_stats(data_dir, f"udp-{index}", child)
    sent = 0
    for _ in range(64):  # many source ports: the kernel spreads them over both sockets
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            for _ in range(10):
                sock.sendto(b"shared:1|c\nshared:1|c", ("127.0.0.1", port))
                sent += 2
    children.send_signal(signal.SIGTERM)
    assert children.wait(30) == 0
    per_stream = [_metric_counts(data_dir / "spool", f"udp-{i}").get("shared", 0)
                  for i in range(2)]
    assert sum(per_stream) == sent
    assert all(per_stream), per_stream
    assert os.path.exists(data_dir / "ingest" / "udp-1.json")


@pytest.mark.parametrize(
    ("text", "size"),
    [("0", 0), ("1048576", 1 << 20), ("500MB", 500_000_000), ("20GiB", 20 << 30),
     ("3 TB", 3 * 10**12), ("64KiB", 65_536), ("12B", 12)],
)  # fmt: skip
def test_spool_quota_sizes(text: str, size: int) -> None:
    assert parse_byte_size(text) == size


@pytest.mark.parametrize("text", ["", "-1", "1.5GB", "20gb", "GiB", "10 PB", "ten"])
def test_bad_spool_quota_sizes_name_the_flag_and_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match=r"--spool-quota .* is not a size: .*KiB"):
        parse_byte_size(text, "--spool-quota")


def test_ingest_settings_refuse_a_negative_quota_and_an_empty_write_queue(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="spool_quota_bytes must be >= 0.*write_queue_depth"):
        IngestSettings(tmp_path, "udp-0", 1000, spool_quota_bytes=-1, write_queue_depth=0)


@pytest.mark.parametrize("nice", [-1, 20])
def test_ingest_settings_refuse_a_worker_nice_outside_0_to_19(tmp_path: Path, nice: int) -> None:
    with pytest.raises(ValueError, match=rf"worker_nice must be in 0\.\.19, got {nice}"):
        IngestSettings(tmp_path, "udp-0", 1000, worker_nice=nice)


def test_a_bad_spool_quota_fails_ingest_run_and_process_with_one_line(
    tmp_path: Path, config: Path
) -> None:
    for command in ("ingest", "run", "process"):
        done = subprocess.run(
            [sys.executable, "-m", "streamgauge", command, "--config", str(config),
             "--data-dir", str(tmp_path), "--spool-quota", "lots"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert done.returncode == 2, command
        assert "--spool-quota 'lots' is not a size" in done.stderr
        assert "Traceback" not in done.stderr
