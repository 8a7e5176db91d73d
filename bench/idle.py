"""What an idle daemon costs: `streamgauge run` on a config with no traffic, beside REV's.

    .venv/bin/python bench/idle.py --seconds 120 --settle 60
    .venv/bin/python bench/idle.py --compare e1f16d3 --pairs 2

Starts ``streamgauge run --config configs/quickstart.yaml`` on a fresh data directory (the
embedded PostgreSQL, one receiver, the Spark job on ``local[2]``), sends nothing, waits
``--settle`` seconds for start-up, then measures for ``--seconds``: the CPU time of the
daemon's whole process tree (driver, JVM, Python workers, PostgreSQL, receivers) per second
of wall time, and the lines the daemon printed meanwhile (and how many were JVM warnings).
With ``--compare REV`` the same run of REV's code (a git worktree of that commit on
``PYTHONPATH``) alternates with this one, ``--pairs`` times.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def tree_cpu(process: psutil.Process) -> float:
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = p.cpu_times()
            total += times.user + times.system
    return total


def run_once(code: Path, args: argparse.Namespace) -> tuple[float, int, int]:
    """Cores used while idle, lines printed while measured, JVM warnings among them."""
    data = Path(tempfile.mkdtemp(prefix="streamgauge-idle-"))
    env = {**os.environ, "PYTHONPATH": str(code)}
    command = [sys.executable, "-m", "streamgauge", "run", "--config",
               str(code / "configs" / "quickstart.yaml"), "--data-dir", str(data),
               "--listen", "127.0.0.1:0"]  # fmt: skip
    daemon = subprocess.Popen(command, cwd=code, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)  # fmt: skip
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert daemon.stdout is not None
        for line in daemon.stdout:
            lines.append((time.monotonic(), line))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        time.sleep(args.settle)
        process = psutil.Process(daemon.pid)
        started, cpu0 = time.monotonic(), tree_cpu(process)
        time.sleep(args.seconds)
        cores = (tree_cpu(process) - cpu0) / (time.monotonic() - started)
        measured = [text for at, text in lines if at >= started]
        warnings = sum(1 for text in measured if " WARN " in text or "Exception" in text)
        return cores, len(measured), warnings
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=120)
        except subprocess.TimeoutExpired:
            daemon.kill()
        shutil.rmtree(data, ignore_errors=True)


def worktree(revision: str) -> Path:
    tree = Path(tempfile.gettempdir()) / f"streamgauge-bench-{revision}"
    if not tree.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(tree),
                        revision], check=True, capture_output=True)  # fmt: skip
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--seconds", type=int, default=120)
    parser.add_argument("--settle", type=int, default=60)
    parser.add_argument("--compare", metavar="REV")
    parser.add_argument("--pairs", type=int, default=1)
    args = parser.parse_args()
    sides = [("this code", ROOT)]
    if args.compare:
        sides.insert(0, (args.compare, worktree(args.compare)))
    print(f"idle daemon: streamgauge run, configs/quickstart.yaml, no traffic, measured "
          f"{args.seconds} s after {args.settle} s of start-up, "
          f"{os.cpu_count()} cores")  # fmt: skip
    for _ in range(args.pairs):
        for label, code in sides:
            cores, printed, warnings = run_once(code, args)
            print(f"{label:<10} {cores:.3f} cores  {printed} lines printed ({warnings} JVM "
                  f"warnings)  load {os.getloadavg()[0]:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
