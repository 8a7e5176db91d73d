"""Ingest load generator: the highest rate `streamgauge ingest` takes with < 0.1 % loss.

    python bench/ingest.py [--seconds 3] [--series 10000] [--rates 50000,100000,200000,...]

For 1 and 20 lines per datagram and each rate (lines/s), it starts a fresh `streamgauge ingest`
on a loopback UDP port, sends mixed c/ms/g/d lines over 10k series for ``--seconds`` at that
rate, stops the receiver gracefully (SIGTERM drains the socket), then counts what reached the
segment log. Loss = 1 - aggregated / sent; the receiver's stats file gives kernel drops. CPU is
the receiver's user+system time over the run; RSS its peak (VmHWM).

The sender is Python: above a few 100k lines/s the sender, not the receiver, is the limit, and
the "achieved" column shows it. A script, never a timed test.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from streamgauge.ingest.log import list_segments, read_segment

CONFIG = "name: bench\npane: 1s\nwindows:\n  - name: w\n    kind: tumbling\n    size: 10s\n"
TYPES = ("c", "ms", "g", "d")


def _lines(series: int) -> list[bytes]:
    return [
        b"bench.m%d:%d|%s|#host:h%d" % (i % 100, i % 97, TYPES[i % 4].encode(), i // 100)
        for i in range(series)
    ]


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def run_once(rate: int, per_datagram: int, seconds: float, series: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="sg-bench-"))
    (root / "c.yaml").write_text(CONFIG)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    receiver = subprocess.Popen(
        [sys.executable, "-m", "streamgauge", "ingest", "--config", str(root / "c.yaml"),
         "--data-dir", str(root), "--listen", f"udp://127.0.0.1:{port}",
         "--max-series", "0", "--max-series-per-metric", "0"],
        stderr=subprocess.DEVNULL,
    )
    stats_path = root / "ingest" / "udp-0.json"
    while not stats_path.exists():
        time.sleep(0.05)
    lines = _lines(series)
    datagrams = [
        b"\n".join(lines[(i + j) % series] for j in range(per_datagram))
        for i in range(0, series, per_datagram)
    ]
    cpu_before = _proc_cpu_s(receiver.pid)
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sender.connect(("127.0.0.1", port))
    interval = per_datagram / rate
    start = time.perf_counter()
    sent = 0
    index = 0
    while (elapsed := time.perf_counter() - start) < seconds:
        due = int(elapsed / interval) + 1
        while sent // per_datagram < due:
            sender.send(datagrams[index])
            index = (index + 1) % len(datagrams)
            sent += per_datagram
    duration = time.perf_counter() - start
    cpu = _proc_cpu_s(receiver.pid) - cpu_before
    rss = _peak_rss_mb(receiver.pid)
    time.sleep(0.3)
    receiver.send_signal(signal.SIGTERM)
    receiver.wait(60)
    stats = json.loads(stats_path.read_text())
    aggregated = sum(
        row["count"]
        for segment in list_segments(root / "spool", "udp-0")
        for batch in read_segment(segment.path)
        for row in batch.to_pylist()
        if row["metric"].startswith("bench.")
    )
    subprocess.run(["rm", "-rf", str(root)], check=False)
    return {
        "rate": rate,
        "achieved": sent / duration,
        "loss": 1 - aggregated / sent,
        "kernel_drops": sum(stats["kernel_drops"].values()),
        "cpu": cpu / duration,
        "rss_mb": rss,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--rates", default="25000,50000,100000,200000,400000,800000,1600000")
    args = parser.parse_args()
    rates = [int(r) for r in args.rates.split(",")]
    print("lines/dgram  target/s  achieved/s  loss     kernel_drops  cpu    rss_mb")
    for per_datagram in (1, 20):
        best = 0.0
        for rate in rates:
            r = run_once(rate, per_datagram, args.seconds, args.series)
            print(f"{per_datagram:>11}  {rate:>8}  {r['achieved']:>10.0f}  {r['loss']:>6.3%}  "
                  f"{r['kernel_drops']:>12.0f}  {r['cpu']:>5.0%}  {r['rss_mb']:>6.0f}", flush=True)
            if r["loss"] >= 0.001:
                break
            best = max(best, r["achieved"])
        print(f"{per_datagram} line(s)/datagram: highest rate under 0.1 % loss {best:,.0f} lines/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
