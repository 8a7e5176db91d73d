"""A real S3 API server for the object-store spool tests: moto in server mode on 127.0.0.1.

Not a mock of pyarrow: pyarrow's S3FileSystem speaks HTTP to it as to AWS. Every URI carries
its region, endpoint and (test) credentials, so no AWS SDK code path looks elsewhere for them
(the EC2 metadata endpoint, a profile): the only address contacted is the server's.
"""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs

BUCKET = "streamgauge-test"
ACCESS_KEY = "testing-key"
SECRET_KEY = "testing-secret-do-not-log"
START_TIMEOUT_S = 60
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class S3Server:
    port: int
    log_path: Path

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def uri(self, prefix: str | None = None) -> str:
        """A spool URI under a fresh prefix (one per test), credentials included."""
        prefix = prefix or f"spool-{uuid.uuid4().hex[:12]}"
        return (
            f"s3://{ACCESS_KEY}:{SECRET_KEY}@{BUCKET}/{prefix}"
            f"?endpoint_override={self.endpoint}&scheme=http&region=us-east-1"
        )

    def filesystem(self) -> pafs.S3FileSystem:
        return pafs.S3FileSystem(
            access_key=ACCESS_KEY, secret_key=SECRET_KEY, region="us-east-1", scheme="http",
            endpoint_override=self.endpoint, allow_bucket_creation=True,
        )  # fmt: skip

    def requests(self) -> list[str]:
        """The server's access log so far: ``"PUT /bucket/key HTTP/1.1"`` lines.

        The server logs a request after answering it, so a marker request is made and waited
        for first: every request answered before it is then in the log."""
        marker = f"{BUCKET}/_marker-{uuid.uuid4().hex}"
        self.filesystem().get_file_info(marker)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            text = _ANSI.sub("", self.log_path.read_text(errors="replace"))  # werkzeug colours
            lines = [line.split('"')[1] for line in text.splitlines() if line.count('"') >= 2]
            seen = [i for i, line in enumerate(lines) if marker in line]
            if seen:
                return [line for line in lines[: seen[0]] if "_marker-" not in line]
            if time.monotonic() > deadline:
                raise RuntimeError(f"the marker request {marker} never reached the server log")
            time.sleep(0.05)


def free_tcp_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def running_s3_server(workdir: Path, port: int | None = None) -> Iterator[S3Server]:
    """``moto.server`` as a subprocess, with the test bucket created; stopped afterwards.
    It keeps objects in memory: a server started again on the same ``port`` is empty."""
    port = port or free_tcp_port()
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "moto.log"
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not start:\n{log_path.read_text()}")
            time.sleep(0.1)
        server = S3Server(port, log_path)
        server.filesystem().create_dir(BUCKET)
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
