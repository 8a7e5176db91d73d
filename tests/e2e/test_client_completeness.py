"""A DogStatsD client's completeness, end to end: the real ``datadog`` client with its
telemetry on (every second) sends through a UDP relay that drops every fifth of its
datagrams of metrics (never a telemetry report), to a real daemon and store; a plain StatsD
client sends beside it, straight to the daemon.

    datadog client ──▶ relay (drops every 5th metric datagram) ──▶ daemon ──▶ PostgreSQL
    statsd client  ───────────────────────────────────────────────▶    client_completeness

The relay sees every datagram the client sent, so it knows each telemetry interval's truth:
metrics sent (the datagrams of metrics it saw) and metrics that arrived (those it forwarded).
The store must show the same, added up over the windows; the plain client's completeness is
unknown (NULL), and the metrics themselves arrive as they would without any of this.

Over a Unix datagram socket (DogStatsD's default transport) clients have no address: two
processes, each with its own ``datadog`` client on the one socket, are two clients, told
apart by their pids (SCM_CREDENTIALS), each with its own completeness.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import statsd
from datadog.dogstatsd.base import DogStatsd

from tests.e2e.harness import daemon_for, scratch_dir, wait_until

CONFIG = """
name: fleet
pane: 1s
windows:
  - {name: apps_2s, kind: tumbling, size: 2s, watermark_delay: 1s, metrics: ["app.*"]}
  - {name: clients_2s, kind: tumbling, size: 2s, watermark_delay: 1s,
     metrics: ["streamgauge.ingest.client.*", "datadog.dogstatsd.client.*"],
     group_by: [source, client, client_version, client_transport, reason]}
"""
DROP_EVERY = 5
SECONDS = 4.0
TELEMETRY = b"datadog.dogstatsd.client."


@dataclass(eq=False)  # a thread: hashed by identity
class LossyRelay(threading.Thread):
    """Forwards UDP datagrams to ``port`` from one socket of its own (one client in, one
    client out), dropping every ``drop_every``-th datagram of metrics; per telemetry interval
    (a report ends it) it counts the metric datagrams seen and forwarded."""

    port: int
    drop_every: int
    intervals: list[tuple[int, int]] = field(default_factory=list)  # (seen, forwarded)
    seen: int = 0
    forwarded: int = 0
    dropped: int = 0

    def __post_init__(self) -> None:
        super().__init__(daemon=True)
        self.inbound = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.inbound.bind(("127.0.0.1", 0))
        self.inbound.settimeout(0.05)
        self.outbound = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.outbound.bind(("127.0.0.1", 0))
        self.halt = threading.Event()

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.inbound.getsockname()[1])

    def run(self) -> None:
        metric_datagrams = 0
        while not self.halt.is_set():
            try:
                data = self.inbound.recv(65536)
            except TimeoutError:
                continue
            if data.startswith(TELEMETRY):
                self.intervals.append((self.seen, self.forwarded))
                self.seen = self.forwarded = 0
            else:
                metric_datagrams += 1
                self.seen += data.count(b"\n") or 1
                if metric_datagrams % self.drop_every == 0:
                    self.dropped += 1
                    continue
                self.forwarded += data.count(b"\n") or 1
            self.outbound.sendto(data, ("127.0.0.1", self.port))

    def stop(self) -> None:
        self.halt.set()
        self.join()
        self.inbound.close()


def test_completeness_shown_is_what_the_relay_dropped_and_unknown_without_telemetry() -> None:
    with daemon_for(CONFIG, "completeness") as daemon:
        daemon.start()
        relay = LossyRelay(daemon.port, DROP_EVERY)
        relay.start()
        dogstatsd = DogStatsd(*relay.address, telemetry_min_flush_interval=1)
        plain = statsd.StatsClient("127.0.0.1", daemon.port)
        plain_sent = 0
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            dogstatsd.increment("app.requests", tags=["endpoint:/a"])
            plain.incr("app.plain")
            plain_sent += 1
            time.sleep(0.005)
        time.sleep(1.2)  # one more telemetry interval, closed by one last metric
        dogstatsd.increment("app.requests", tags=["endpoint:/a"])
        time.sleep(0.3)
        relay.stop()
        dogstatsd.close_socket()
        # the relay's first interval began before the client's first report: left out
        aligned = relay.intervals[1:]
        sent = sum(seen for seen, _ in aligned)
        arrived = sum(forwarded for _, forwarded in aligned)
        assert len(aligned) >= 2 and 0 < arrived < sent, relay.intervals
        out_port = relay.outbound.getsockname()[1]
        source = f"udp://127.0.0.1:{out_port}"
        forwarded_total = sum(f for _, f in relay.intervals) + relay.forwarded
        wait_until(daemon, f"""
            select coalesce(sum(reports) + sum(reports_unaligned), 0) >= {len(relay.intervals)}
                   as ok
            from client_completeness where source = '{source}'""")  # fmt: skip
        # the last datagrams are counted at the roll after them, maybe in the next window
        wait_until(daemon, f"""
            select coalesce(sum(datagrams), 0) >= {forwarded_total + len(relay.intervals)} as ok
            from client_completeness where source = '{source}'""")  # fmt: skip
        rows = daemon.query(f"""
            select window_start, client, client_transport, datagrams, lines, reports,
                   reports_unaligned, metrics_sent, metrics_received, packets_sent,
                   packets_received, completeness, packet_completeness
            from client_completeness where source = '{source}' order by window_start""")
        # the library is known from the client's first report on
        assert {(r["client"], r["client_transport"]) for r in rows
                if r["reports"] or r["reports_unaligned"]} == {("py", "udp")}  # fmt: skip
        assert sum(r["reports_unaligned"] for r in rows) == 1  # the first report only
        # added up over the windows: exactly the relay's intervals
        assert sum(r["metrics_sent"] or 0 for r in rows) == sent
        assert sum(r["metrics_received"] or 0 for r in rows) == arrived
        # each window: the drops made in the intervals whose report arrived in it
        for row in rows:
            if row["metrics_sent"]:
                assert abs(row["completeness"] - (1 - 1 / DROP_EVERY)) <= 2 / row[
                    "metrics_sent"], row
                # one packet per metric, and the report's own packet in the next interval
                assert row["packets_received"] <= row["packets_sent"]
        # what the receivers counted from the relay: every datagram it forwarded
        assert sum(r["datagrams"] for r in rows) == forwarded_total + len(relay.intervals)

        # the plain StatsD client: counted, its completeness unknown
        plain_rows = daemon.query("""
            select datagrams, completeness, reports from client_completeness
            where source <> '""" + source + "'")
        assert sum(r["datagrams"] for r in plain_rows) == plain_sent
        assert {(r["completeness"], r["reports"]) for r in plain_rows} == {(None, 0)}

        # nothing else changes: the metrics arrived as sent (less the drops), and the
        # telemetry is stored as the ordinary counters it is
        wait_until(daemon, f"""
            select coalesce(sum(sum), 0) >= {plain_sent} as ok from window_results
            where metric = 'app.plain'""")  # fmt: skip
        totals = {r["metric"]: r["total"] for r in daemon.query("""
            select metric, sum(sum) as total from window_results
            where window_name = 'apps_2s' group by metric""")}  # fmt: skip
        assert totals == {"app.requests": forwarded_total, "app.plain": plain_sent}
        telemetry = daemon.query("""
            select tags->>'client' as client, sum(sum) as total from window_results
            where metric = 'datadog.dogstatsd.client.metrics' group by 1""")
        assert [r["client"] for r in telemetry] == ["py"]

        # streamgauge status: the client with its figure, the plain one unknown
        document = json.loads(daemon.cli("status", "--json", "--data-dir",
                                         str(daemon.data_dir)))  # fmt: skip
        clients = {c["source"]: c for stats in document["ingest"].values()
                   for c in stats["clients"]["clients"]}  # fmt: skip
        assert clients[source]["tags"]["client"] == "py"
        assert clients[source]["telemetry"]["metrics_received"] == arrived
        table = daemon.cli("status", "--data-dir", str(daemon.data_dir))
        line = next(text for text in table.splitlines() if source in text)
        assert f"{100 * arrived / sent:.1f}%" in line
        plain_line = next(text for text in table.splitlines()
                          if "udp://127.0.0.1:" in text and source not in text)
        assert "unknown" in plain_line
        assert daemon.stop() == 0


#: A process with its own ``datadog`` client on the Unix socket ``argv[1]``: sends
#: ``argv[2]`` at ``sample_rate`` ``argv[3]`` for ``argv[4]`` seconds, blocking when the
#: socket's queue is full (so nothing is lost), telemetry every second; prints its pid, its
#: calls and its telemetry reports (counted where the client builds them).
DATADOG_PROCESS = """
import json, os, sys, time
from datadog.dogstatsd.base import DogStatsd
path, metric = sys.argv[1], sys.argv[2]
sample_rate, seconds = float(sys.argv[3]), float(sys.argv[4])
client = DogStatsd(socket_path=path, socket_timeout=None, telemetry_min_flush_interval=1)
reports = 0
build_report = client._flush_telemetry
def counted():
    global reports
    reports += 1
    return build_report()
client._flush_telemetry = counted
calls = 0
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    client.increment(metric, sample_rate=sample_rate)
    calls += 1
    time.sleep(0.005)
time.sleep(1.2)  # one more telemetry interval, closed by one last (unsampled) metric
client.increment(metric)
calls += 1
client.close_socket()
print(json.dumps({"pid": os.getpid(), "calls": calls, "reports": reports}))
"""
SAMPLE_RATE_B = 0.5


def test_two_processes_on_one_unix_socket_are_two_clients_with_their_own_completeness() -> None:
    """Process A sends every metric; process B samples half of them out, which its client
    counts as sent: A's completeness is 100 %, B's about half, and each one's datagrams and
    packets are its own exactly (nothing is lost on a blocking Unix socket)."""
    directory = scratch_dir("sg-unixgram-")
    path = directory / "dsd.sock"
    try:
        with daemon_for(CONFIG, "completeness-unix", "--listen", f"unixgram://{path}") as daemon:
            daemon.start()
            processes = [
                subprocess.Popen([sys.executable, "-c", DATADOG_PROCESS, str(path), metric,
                                  str(rate), str(SECONDS)], stdout=subprocess.PIPE, text=True)
                for metric, rate in (("app.unix_a", 1.0), ("app.unix_b", SAMPLE_RATE_B))
            ]  # fmt: skip
            a, b = [json.loads(p.communicate(timeout=120)[0]) for p in processes]
            assert [p.returncode for p in processes] == [0, 0]
            assert a["pid"] != b["pid"] and a["reports"] >= 3 and b["reports"] >= 3, (a, b)
            source = {"a": f"unixgram pid {a['pid']}", "b": f"unixgram pid {b['pid']}"}
            for name, process in (("a", a), ("b", b)):
                reports = process["reports"]
                wait_until(daemon, f"""
                    select coalesce(sum(reports) + sum(reports_unaligned), 0) >= {reports} as ok
                    from client_completeness where source = '{source[name]}'""")  # fmt: skip
            # the last datagrams are counted at the roll after them, maybe in the next window
            wait_until(daemon, f"""
                select coalesce(sum(datagrams), 0) >= {a["calls"] + a["reports"]} as ok
                from client_completeness where source = '{source["a"]}'""")  # fmt: skip
            rows = daemon.query("""
                select source, sum(datagrams) as datagrams, sum(reports) as reports,
                       sum(reports_unaligned) as unaligned, sum(metrics_sent) as metrics_sent,
                       sum(metrics_received) as metrics_received,
                       sum(packets_sent) as packets_sent,
                       sum(packets_received) as packets_received
                from client_completeness group by source""")
            by_source = {r["source"]: r for r in rows}
            # every datagram on the socket came with its sender's pid: no socket-wide client
            assert set(by_source) == set(source.values()), rows
            libraries = daemon.query("""
                select distinct source, client, client_transport from client_completeness
                where reports > 0 or reports_unaligned > 0""")
            assert sorted((r["source"], r["client"], r["client_transport"]) for r in libraries
                          ) == sorted((s, "py", "uds") for s in source.values())  # fmt: skip
            for name, process in (("a", a), ("b", b)):
                row = by_source[source[name]]
                assert row["unaligned"] == 1  # the first report only
                assert row["reports"] == process["reports"] - 1
                # each datagram is the sender's own, its report's packets all arrived
                assert row["packets_received"] == row["packets_sent"] > 0, row
            row_a, row_b = by_source[source["a"]], by_source[source["b"]]
            # A: one datagram per call and per report
            assert row_a["datagrams"] == a["calls"] + a["reports"]
            assert row_a["metrics_received"] == row_a["metrics_sent"] > 0
            assert row_a["metrics_sent"] <= a["calls"]
            # B: what its sampling let through, against all it counted
            assert row_b["metrics_sent"] <= b["calls"]
            completeness_b = row_b["metrics_received"] / row_b["metrics_sent"]
            assert abs(completeness_b - SAMPLE_RATE_B) < 0.15, row_b

            # streamgauge status: each process a client of its own, with its own figure
            document = json.loads(daemon.cli("status", "--json", "--data-dir",
                                             str(daemon.data_dir)))  # fmt: skip
            clients = {c["source"]: c for stats in document["ingest"].values()
                       for c in stats["clients"]["clients"]}  # fmt: skip
            assert clients[source["a"]]["datagrams"] == a["calls"] + a["reports"]
            assert clients[source["b"]]["tags"]["client_transport"] == "uds"
            table = daemon.cli("status", "--data-dir", str(daemon.data_dir))
            line_a = next(text for text in table.splitlines() if source["a"] in text)
            assert "100.0%" in line_a
            line_b = next(text for text in table.splitlines() if source["b"] in text)
            assert f"{100 * completeness_b:.1f}%" in line_b
            assert daemon.stop() == 0
    finally:
        shutil.rmtree(directory, ignore_errors=True)
