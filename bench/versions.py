"""Benches that compare two versions of the code in one run: each measurement runs in a
process of its own whose ``PYTHONPATH`` is that version's checkout (a ``git worktree`` of an
earlier commit, or this one), and the rounds alternate which version goes first, so that a
machine getting busier or quieter over the run weighs on both alike.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

THIS_CHECKOUT = Path(__file__).resolve().parent.parent


def run_in(checkout: Path, script: str, *args: str) -> Any:
    """``script`` run with ``args`` on ``checkout``'s code; the JSON of its last line."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    done = subprocess.run([sys.executable, script, *args], env=env, check=True,
                          capture_output=True, text=True)  # fmt: skip
    return json.loads(done.stdout.strip().splitlines()[-1])


def alternated(names: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """(round, name) for every round, the names in order, then reversed, and so on."""
    for round_ in range(rounds):
        for name in names if round_ % 2 == 0 else list(reversed(names)):
            yield round_, name


@contextlib.contextmanager
def databases(names: Sequence[str], prefix: str) -> Iterator[dict[str, str]]:
    """One embedded PostgreSQL for the run, a database of its own per version: their URLs by
    name. Server and files go at the end."""
    import psycopg

    from streamgauge.sinks.embedded import EmbeddedPostgres

    base = Path(tempfile.mkdtemp(prefix=prefix))
    server = EmbeddedPostgres(base / "data", sync_initdb=False)
    url = server.start()
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            for name in names:
                conn.execute(f"CREATE DATABASE sg_{name}")
        yield {name: url.rsplit("/", 1)[0] + f"/sg_{name}" for name in names}
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


_SERVER = """
import sys
from pathlib import Path
from streamgauge.sinks.embedded import EmbeddedPostgres
server = EmbeddedPostgres(Path(sys.argv[2]), sync_initdb=False)
if sys.argv[1] == "start":
    print(server.start())
else:
    server.start()  # adopts the running server, then stops it
    server.stop()
"""


@contextlib.contextmanager
def clusters(checkouts: dict[str, Path], prefix: str) -> Iterator[dict[str, str]]:
    """An embedded PostgreSQL per version, started by that version's code (so with its own
    settings): their URLs by name. Servers and files go at the end."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    urls: dict[str, str] = {}
    try:
        for name, checkout in checkouts.items():
            env = {**os.environ, "PYTHONPATH": str(checkout)}
            # cwd too: ``python -c`` puts it first on sys.path, before PYTHONPATH
            done = subprocess.run([sys.executable, "-c", _SERVER, "start", str(base / name)],
                                  env=env, cwd=checkout, check=True, capture_output=True,
                                  text=True)  # fmt: skip
            urls[name] = done.stdout.strip().splitlines()[-1]
        yield urls
    finally:
        for name in urls:
            env = {**os.environ, "PYTHONPATH": str(checkouts[name])}
            subprocess.run([sys.executable, "-c", _SERVER, "stop", str(base / name)], env=env,
                           cwd=checkouts[name], check=False, capture_output=True)  # fmt: skip
        shutil.rmtree(base, ignore_errors=True)


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])
