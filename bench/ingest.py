"""Ingest load benchmark: the highest rate with < 0.1 % loss, streamgauge beside its peers.

    python bench/ingest.py [--seconds 3] [--repeat 3] [--series 10000] [--rcvbuf BYTES]
                           [--rates20 ...] [--rates1 ...] [--receivers N[,M...]]
                           [--daemons streamgauge,etsy-statsd,python-recvfrom]
                           [--no-recvmmsg] [--sender-sockets K]

For 1 and 20 lines per datagram and increasing rates (lines/s), each run starts a fresh
daemon on a loopback UDP port, warms it up (every series once, at 20k lines/s, then checks
that all of it arrived), sends mixed c/ms/g/d lines over 10k series for ``--seconds`` with a
small C load generator (bench/ingest/sender.c, compiled here with gcc: a Python sender tops
out near the rates being measured and takes the CPU the receiver needs), and stops the daemon.

- streamgauge (`streamgauge ingest`, fsync on, 8 MiB effective SO_RCVBUF): loss = 1 -
  aggregated / sent, aggregated = the ``count`` of the bench series in the segment log, less
  the lines counted after the warm-up. ``--receivers N`` (a list runs each): N ingest
  processes on one port, sockets bound here with SO_REUSEPORT and passed down (as `streamgauge
  run --receivers N` does), streams udp-0..N-1 summed; the sender then spreads its datagrams
  over ``--sender-sockets`` source sockets (default 4 per receiver) so the kernel spreads
  them over the receivers. ``--no-recvmmsg`` adds a streamgauge row reading one datagram per
  system call, to measure what recvmmsg gains.
- Etsy statsd (npm ``statsd``, installed into a temporary directory with npm unless
  ``--etsy-dir`` has one): same port setup, a counting backend (bench/ingest/
  etsy_count_backend.js) adds up its ``statsd.metrics_received`` per flush; its UDP server
  is statsd's own with an 8 MiB receive buffer (bench/ingest/etsy_udp_rcvbuf.js).
- streamgauge-run: the whole daemon, `streamgauge run` (receiver, embedded PostgreSQL, the
  window job on Spark ``local[2]``, one tumbling 10 s window over the bench series), counted as
  streamgauge's standalone ingest is; its CPU column is the receiver's, ``all cpu`` adds the
  driver, the JVM, Spark's Python workers and PostgreSQL, and a line under it gives each
  part's cores. Started once per run: the JVM takes ~20 s to start.
- python-recvfrom: the floor the issue quotes, a plain Python ``recvfrom`` loop that only
  counts lines (no parsing, no aggregation, no log), same receive buffer.

CPU is the daemon's user+system time over the measured send divided by its duration (100 % =
one core; summed over receiver processes); RSS its peak (VmHWM, summed). Each (daemon, shape,
rate) runs ``--repeat`` times; the table shows medians, and the summary the highest rate whose
median loss is < 0.1 %. The machine has 2 cores shared by sender, kernel and daemon. A
script, never a timed test.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from streamgauge.ingest.log import list_receivers, list_segments, read_segment
from streamgauge.ingest.transports import bind_udp

HERE = Path(__file__).resolve().parent / "ingest"
CONFIG = "name: bench\npane: 1s\nwindows:\n  - name: w\n    kind: tumbling\n    size: 10s\n"
WARMUP_RATE = 20_000
#: Both daemons get an 8 MiB receive buffer: the kernel doubles a SO_RCVBUF request, and caps
#: Node's (unprivileged) one at net.core.rmem_max first; streamgauge sets SO_RCVBUFFORCE.
SG_RCVBUF = 4 << 20
ETSY_RCVBUF = 8 << 20


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _proc_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _udp_drops(port: int) -> int:
    """Kernel drops of the UDP socket(s) bound to ``port`` (last column of /proc/net/udp)."""
    total = 0
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        columns = line.split()
        if len(columns) >= 13 and int(columns[1].split(":")[1], 16) == port:
            total += int(columns[12])
    return total


def build_sender(workdir: Path) -> Path:
    binary = workdir / "sender"
    subprocess.run(["gcc", "-O2", "-o", str(binary), str(HERE / "sender.c")], check=True)
    return binary


#: Set by ``--gso``: the load generator sends runs of equal-length datagrams as one UDP GSO
#: buffer (``SENDER_GSO=1``, see sender.c); the receivers still get separate datagrams.
SENDER_ENV: dict[str, str] = {}


def send(sender: Path, port: int, rate: float, per: int, seconds: float, series: int,
         sockets: int = 1) -> tuple[int, float]:
    out = subprocess.run(
        [str(sender), "127.0.0.1", str(port), str(int(rate)), str(per), str(seconds),
         str(series), str(sockets)], check=True, capture_output=True, text=True,
        env={**os.environ, **SENDER_ENV},
    ).stdout.split()
    return int(out[0]), float(out[2])


def _wait(condition, timeout_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def _settled(read, pause_s: float = 0.7, timeout_s: float = 15) -> int:  # type: ignore[no-untyped-def]
    """A count once two readings ``pause_s`` apart agree (the daemons report per roll/flush)."""
    last = read()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(pause_s)
        now = read()
        if now == last:
            break
        last = now
    return int(last)


Processes = list[subprocess.Popen[bytes]]

#: `streamgauge ingest` with recvmmsg off: the reader falls back to one recv_into per datagram
NO_RECVMMSG = ("import sys, streamgauge.ingest.transports as t; t._RECVMMSG = None; "
               "from streamgauge.cli import main; sys.exit(main(sys.argv[1:]))")


class Streamgauge:
    def __init__(self, rcvbuf: int | None, receivers: int = 1, recvmmsg: bool = True,
                 sender_sockets: int | None = None) -> None:
        self.rcvbuf = rcvbuf
        self.receivers = receivers
        self.recvmmsg = recvmmsg
        self.sender_sockets = sender_sockets or (1 if receivers == 1 else 4 * receivers)
        self.name = "streamgauge" + (f" x{receivers}" if receivers > 1 else "") + (
            "" if recvmmsg else " (recv)")

    def start(self, root: Path, port: int) -> Processes:
        (root / "c.yaml").write_text(CONFIG)
        processes = []
        for index in range(self.receivers):
            # bound here as `streamgauge run` does: every socket on the port before any sends
            sock = bind_udp("127.0.0.1", port, self.rcvbuf or SG_RCVBUF,
                            reuse_port=self.receivers > 1)
            head = ["-c", NO_RECVMMSG] if not self.recvmmsg else ["-m", "streamgauge"]
            command = [sys.executable, *head, "ingest", "--config", str(root / "c.yaml"),
                       "--data-dir", str(root), "--receiver", f"udp-{index}",
                       "--inherit-fd", str(sock.fileno()),
                       "--max-series", "0", "--max-series-per-metric", "0"]
            processes.append(subprocess.Popen(command, stderr=subprocess.DEVNULL,
                                              pass_fds=[sock.fileno()]))
            sock.close()
        self.stats = [root / "ingest" / f"udp-{i}.json" for i in range(self.receivers)]
        _wait(lambda: all(path.exists() for path in self.stats), 30)
        return processes

    def received(self, root: Path) -> int:
        return sum(int(json.loads(path.read_text())["lines"]) for path in self.stats)

    def stop_and_count(self, processes: Processes, root: Path) -> int:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            process.wait(60)
        return _bench_lines_in_log(root)


def _bench_lines_in_log(root: Path) -> int:
    return sum(
        row["count"]
        for receiver in list_receivers(root / "spool")
        for segment in list_segments(root / "spool", receiver)
        for batch in read_segment(segment.path)
        for row in batch.select(["metric", "count"]).to_pylist()
        if row["metric"].startswith("bench.")
    )


PY_RECVFROM = r"""
import socket, sys
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
try:  # SO_RCVBUFFORCE (33 on Linux; Python 3.11 does not name it)
    sock.setsockopt(socket.SOL_SOCKET, getattr(socket, "SO_RCVBUFFORCE", 33), int(sys.argv[3]))
except PermissionError:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, int(sys.argv[3]))
sock.bind(("127.0.0.1", int(sys.argv[1])))
sock.settimeout(0.1)
lines = datagrams = 0
def report():
    with open(sys.argv[2] + ".tmp", "w") as out:
        out.write(str(lines))
    __import__("os").replace(sys.argv[2] + ".tmp", sys.argv[2])
report()
while True:
    try:
        data = sock.recvfrom(65535)[0]
    except TimeoutError:
        report()
        continue
    lines += data.count(b"\n") + 1
    datagrams += 1
    if datagrams % 4096 == 0:
        report()
"""


class StreamgaugeRun:
    """`streamgauge run`: what the receiver keeps when the window job and the store share the
    machine with it."""

    name = "streamgauge run"
    sender_sockets = 1

    def start(self, root: Path, port: int) -> Processes:
        (root / "c.yaml").write_text(CONFIG)
        command = [sys.executable, "-m", "streamgauge", "run", "--config", str(root / "c.yaml"),
                   "--data-dir", str(root), "--listen", f"127.0.0.1:{port}",
                   "--pg-port", str(_free_port()), "--master", "local[2]",
                   "--max-series", "0", "--max-series-per-metric", "0"]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL)
        run_file = root / "run.json"
        if not _wait(run_file.exists, 240):
            raise RuntimeError("streamgauge run did not start in 240 s")
        info = json.loads(run_file.read_text())
        self.stats = [root / "ingest" / "udp-0.json"]
        _wait(lambda: all(path.exists() for path in self.stats), 30)
        self.postmaster = int((root / "postgres" / "postmaster.pid").read_text().split()[0])
        self.receiver_pids = [int(pid) for pid in info["ingest_pids"]]
        return [self.process]

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds of run's process tree and of the embedded PostgreSQL's, by part."""
        parts: dict[str, float] = {}
        for top in (self.process.pid, self.postmaster):
            try:
                tree = [psutil.Process(top), *psutil.Process(top).children(recursive=True)]
            except psutil.NoSuchProcess:
                continue
            for proc in tree:
                with contextlib.suppress(psutil.NoSuchProcess):
                    times = proc.cpu_times()
                    part = self._part(proc, top)
                    parts[part] = parts.get(part, 0.0) + times.user + times.system
        return parts

    def _part(self, proc: psutil.Process, top: int) -> str:
        if top == self.postmaster:
            return "postgres"
        if proc.pid in self.receiver_pids:
            return "receiver"
        if proc.pid == self.process.pid:
            return "driver"
        if proc.name() == "java":
            return "jvm"
        return "py-workers" if "pyspark" in " ".join(proc.cmdline()) else "other"

    def received(self, root: Path) -> int:
        return sum(int(json.loads(path.read_text())["lines"]) for path in self.stats)

    def stop_and_count(self, processes: Processes, root: Path) -> int:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(180)
        return _bench_lines_in_log(root)


class PythonRecvfrom:
    """The issue's floor: a plain Python recvfrom loop counting lines, nothing else."""

    name = "python-recvfrom"

    def start(self, root: Path, port: int) -> Processes:
        self.count = root / "py-count"
        process = subprocess.Popen(
            [sys.executable, "-c", PY_RECVFROM, str(port), str(self.count), str(SG_RCVBUF)],
            stderr=subprocess.DEVNULL)
        _wait(self.count.exists, 30)
        return [process]

    def received(self, root: Path) -> int:
        return int(self.count.read_text() or 0) if self.count.exists() else 0

    def stop_and_count(self, processes: Processes, root: Path) -> int:
        now = _settled(lambda: self.received(root), pause_s=0.5)
        for process in processes:
            process.kill()
            process.wait(30)
        return now


class EtsyStatsd:
    name = "etsy-statsd"

    def __init__(self, directory: Path) -> None:
        self.main = directory / "node_modules" / "statsd" / "stats.js"

    def start(self, root: Path, port: int) -> Processes:
        self.count = root / "etsy-count"
        config = root / "etsy.js"
        config.write_text(json.dumps({
            "servers": [{"server": str(HERE / "etsy_udp_rcvbuf.js"), "port": port,
                         "address": "127.0.0.1", "recvBufferSize": ETSY_RCVBUF}],
            "mgmt_port": _free_port(),
            "mgmt_address": "127.0.0.1", "flushInterval": 500,
            "backends": [str(HERE / "etsy_count_backend.js")], "deleteIdleStats": True,
        }))
        process = subprocess.Popen(
            ["node", str(self.main), str(config)], cwd=self.main.parent,
            env={**os.environ, "ETSY_COUNT_FILE": str(self.count)},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        _wait(self.count.exists, 30)
        return [process]

    def received(self, root: Path) -> int:
        return int(self.count.read_text() or 0) if self.count.exists() else 0

    def stop_and_count(self, processes: Processes, root: Path) -> int:
        # statsd counts a flush later: wait until the total stops moving, then stop it
        now = _settled(lambda: self.received(root), pause_s=1.2)
        for process in processes:
            process.send_signal(signal.SIGTERM)
            process.wait(30)
        return now


Daemon = Streamgauge | StreamgaugeRun | EtsyStatsd | PythonRecvfrom


def run_once(daemon: Daemon, sender: Path, rate: int, per: int,
             seconds: float, series: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="sg-bench-"))
    port = _free_port()
    processes = daemon.start(root, port)
    sockets = daemon.sender_sockets if isinstance(daemon, Streamgauge) else 1
    everything = daemon.cpu_s if isinstance(daemon, StreamgaugeRun) else None
    # the receivers' CPU and memory: run's own process is the driver
    pids = daemon.receiver_pids if isinstance(daemon, StreamgaugeRun) else [
        p.pid for p in processes]
    try:
        warm, _ = send(sender, port, WARMUP_RATE, 1, series / WARMUP_RATE, series, sockets)
        _wait(lambda: daemon.received(root) >= warm, 3)
        baseline = _settled(lambda: daemon.received(root))
        drops_before = _udp_drops(port)
        cpu_before = sum(_proc_cpu_s(pid) for pid in pids)
        parts_before = everything() if everything else {}
        sent, duration = send(sender, port, rate, per, seconds, series, sockets)
        cpu = sum(_proc_cpu_s(pid) for pid in pids) - cpu_before
        parts = {part: seconds - parts_before.get(part, 0.0)
                 for part, seconds in (everything() if everything else {}).items()}
        all_cpu = sum(parts.values()) if everything else cpu
        time.sleep(0.3)
        drops = _udp_drops(port) - drops_before
        rss = sum(_peak_rss_mb(pid) for pid in pids)
        counted = daemon.stop_and_count(processes, root) - baseline
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
        shutil.rmtree(root, ignore_errors=True)
    return {"achieved": sent / duration, "loss": 1 - counted / sent,
            "kernel_drops": drops, "cpu": cpu / duration, "all_cpu": all_cpu / duration,
            "rss_mb": rss, **{f"cores {part}": s / duration for part, s in sorted(parts.items())}}


def _etsy_dir(given: str | None) -> tuple[Path | None, str]:
    if given:
        return Path(given), ""
    if shutil.which("npm") is None or shutil.which("node") is None:
        return None, "node/npm not found"
    directory = Path(tempfile.mkdtemp(prefix="sg-bench-etsy-"))
    result = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "statsd"],
                            cwd=directory, capture_output=True, text=True)
    if result.returncode != 0 or not (directory / "node_modules/statsd/stats.js").exists():
        return None, "npm install statsd failed: " + result.stderr[-300:]
    return directory, ""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--series", type=int, default=10_000)
    parser.add_argument("--rcvbuf", type=int,
                        help="streamgauge's --rcvbuf (default 4 MiB, doubled by the kernel)")
    parser.add_argument("--rates20", default="200000,400000,800000,1600000,3200000")
    parser.add_argument("--rates1", default="50000,100000,200000,400000")
    parser.add_argument("--receivers", default="1",
                        help="streamgauge receiver processes on the port (SO_REUSEPORT); a "
                        "comma-separated list runs each, e.g. 1,2")
    parser.add_argument("--sender-sockets", type=int,
                        help="source sockets of the load generator (default 1, or 4 per "
                        "receiver with several)")
    parser.add_argument("--no-recvmmsg", action="store_true",
                        help="also run streamgauge reading one datagram per system call")
    parser.add_argument("--daemons", default="streamgauge,etsy-statsd,python-recvfrom")
    parser.add_argument("--no-etsy", action="store_true")
    parser.add_argument("--etsy-dir", help="a directory where `npm install statsd` was run")
    parser.add_argument("--gso", action="store_true",
                        help="the load generator sends equal-length datagrams in UDP GSO "
                        "buffers (SENDER_GSO=1, see sender.c): half its CPU per datagram; the "
                        "daemons still receive, and may drop, every datagram on its own")
    args = parser.parse_args()
    if args.gso:
        SENDER_ENV["SENDER_GSO"] = "1"
    work = Path(tempfile.mkdtemp(prefix="sg-bench-bin-"))
    sender = build_sender(work)
    wanted = args.daemons.split(",")
    daemons: list[Daemon] = []
    if "streamgauge" in wanted:
        for receivers in (int(n) for n in args.receivers.split(",")):
            daemons.append(Streamgauge(args.rcvbuf, receivers, True, args.sender_sockets))
            if args.no_recvmmsg:
                daemons.append(Streamgauge(args.rcvbuf, receivers, False, args.sender_sockets))
    if "etsy-statsd" in wanted and not args.no_etsy:
        etsy, why = _etsy_dir(args.etsy_dir)
        if etsy is None:
            print(f"Etsy statsd not run: {why}")
        else:
            daemons.append(EtsyStatsd(etsy))
    if "streamgauge-run" in wanted:
        daemons.append(StreamgaugeRun())
    if "python-recvfrom" in wanted:
        daemons.append(PythonRecvfrom())
    print(f"medians of {args.repeat} runs of {args.seconds:g} s, {args.series} series, "
          "mixed c/ms/g/d, loopback UDP" + (", sender with UDP GSO" if args.gso else ""))
    print("daemon                  lines/dgram  target/s  achieved/s  loss     kernel_drops  cpu"
          "    all cpu  rss_mb")
    summary = []
    for per, rates in ((20, args.rates20), (1, args.rates1)):
        if not rates:  # --rates1 "": only the other shape
            continue
        for daemon in daemons:
            best = 0.0
            for rate in (int(r) for r in rates.split(",")):
                runs = [run_once(daemon, sender, rate, per, args.seconds, args.series)
                        for _ in range(args.repeat)]
                m = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in runs[0]}
                print(f"{daemon.name:<23} {per:>11}  {rate:>8}  {m['achieved']:>10.0f}  "
                      f"{m['loss']:>6.3%}  {m['kernel_drops']:>12.0f}  {m['cpu']:>5.0%}  "
                      f"{m['all_cpu']:>7.0%}  {m['rss_mb']:>6.0f}", flush=True)
                if isinstance(daemon, StreamgaugeRun):  # where the cores went
                    print("    " + ", ".join(f"{k.removeprefix('cores ')} {v:.2f}"
                                             for k, v in m.items() if k.startswith("cores ")))
                if m["loss"] >= 0.001:
                    break
                best = max(best, m["achieved"])
            summary.append(f"{daemon.name}, {per} line(s)/datagram: highest rate under 0.1 % "
                           f"loss {best:,.0f} lines/s")
    print("\n".join(summary))
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
