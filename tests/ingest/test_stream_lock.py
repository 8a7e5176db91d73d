"""One writer per stream: a restart waits for the receiver still writing the stream, whether
that receiver finishes its closing segment or is killed outright; it gives up with a message
that names the stream and the holder's pid."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamgauge.ingest.stream_lock import StreamBusy, hold, lock_path, wait_for_writers

_HOLDER = """
import sys, time
from pathlib import Path
from streamgauge.ingest.stream_lock import hold
with hold(Path(sys.argv[1]), sys.argv[2]):
    print("held", flush=True)
    time.sleep(float(sys.argv[3]))
"""


def _holder(data_dir: Path, receiver: str, seconds: float) -> subprocess.Popen[str]:
    """A real process holding ``receiver``'s stream for ``seconds``, started and holding."""
    process = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(data_dir), receiver, str(seconds)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    assert process.stdout.readline() == "held\n"
    return process


@pytest.mark.parametrize("ends", ["closes", "killed"])
def test_a_restart_waits_for_the_receiver_still_writing_then_proceeds(
    tmp_path: Path, ends: str
) -> None:
    holder = _holder(tmp_path, "udp-1", 30 if ends == "killed" else 0.5)
    waited: list[tuple[str, str]] = []
    if ends == "killed":
        holder.kill()  # the kernel drops the flock with the process
    started = time.monotonic()
    wait_for_writers(tmp_path, timeout_s=20, on_wait=lambda *told: waited.append(told))
    assert holder.wait(5) is not None
    assert time.monotonic() - started < 10
    if ends == "closes":  # it was told who it waited for
        assert waited == [("udp-1", f"pid {holder.pid}")]
    with hold(tmp_path, "udp-1", timeout_s=0):  # and the stream is free for the new writer
        assert lock_path(tmp_path, "udp-1").read_text().strip() != str(holder.pid)


def test_a_stream_held_past_the_wait_names_the_stream_and_its_holder(tmp_path: Path) -> None:
    holder = _holder(tmp_path, "udp-0", 30)
    try:
        with pytest.raises(StreamBusy, match=rf"stream udp-0 .*\(pid {holder.pid},"):
            wait_for_writers(tmp_path, timeout_s=0.3)
        with pytest.raises(StreamBusy, match="udp-0"), hold(tmp_path, "udp-0", timeout_s=0.1):
            pass
    finally:
        holder.kill()
        holder.wait()


def test_a_data_directory_without_receivers_is_free_at_once(tmp_path: Path) -> None:
    wait_for_writers(tmp_path, timeout_s=0)
    with hold(tmp_path, "udp-0", timeout_s=0), hold(tmp_path, "udp-1", timeout_s=0):
        pass  # two streams, two writers
