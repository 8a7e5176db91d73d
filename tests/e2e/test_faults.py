"""Faults while traffic flows: the store must end up holding exactly what the durable log
holds, once, whatever happened in between: nothing lost, nothing counted twice (the log is
the source of truth and the job exactly-once over it, ``docs/architecture.md §2, §3``).

- ``kill -9`` of the daemon (the Spark driver) mid-stream, then a restart on the same data
  directory: Spark resumes from its checkpoint, the interrupted micro-batch is replayed with
  the same id, and the store ignores what it already committed.
- The same under a timer load in tumbling, sliding and session windows: every window's
  values, HDR histogram and digest weight as the reference windower computes them from the
  log (an uninterrupted run), and its percentiles within the digest's rank error.
- The embedded PostgreSQL stopped mid-run and started again: the job retries with backoff and
  stops advancing; the log holds the backlog; when the store returns, everything is written:
  every counter line sent is stored once or counted as dropped.
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from streamgauge.sinks.embedded import EmbeddedPostgres
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.windows.reference import ReferenceWindower
from tests.e2e.harness import (
    Daemon,
    PacedSender,
    _canonical,
    daemon_for,
    load,
    reference_rows,
    segments_from_spool,
    stored_rows,
    wait_until,
)
from tests.windows.test_transcripts import check_quantiles

CONFIG = """
name: faults
pane: 1s
windows:
  - {name: per_2s, kind: tumbling, size: 2s, watermark_delay: 1s, allowed_lateness: 1s,
     metrics: ["e2e.*"]}
"""


@pytest.fixture()
def daemon() -> Iterator[Daemon]:
    with daemon_for(CONFIG, "faults") as daemon:
        yield daemon


def _wait_for_rows(daemon: Daemon, minimum: int) -> None:
    wait_until(daemon, f"select count(*) >= {minimum} as ok from window_results")


def _assert_store_equals_log(daemon: Daemon) -> None:
    config = load(daemon.config_path)
    expected = reference_rows(config, daemon.data_dir / "spool")
    stored = stored_rows(daemon, config.name)
    assert expected, "the log holds no test traffic"
    assert stored == expected, _differences(stored, expected)  # every window, every value
    assert sum(row["is_final"] for row in stored.values()) >= 3


def _differences(stored: dict[tuple[Any, ...], Any], expected: dict[tuple[Any, ...], Any]) -> str:
    """The windows the store lacks, holds in excess, or holds with other values: the first
    few of each, whole (pytest's own dict diff truncates the values that differ)."""
    lines = [f"missing: {key} {expected[key]}" for key in sorted(expected.keys() - stored.keys())]
    lines += [f"extra: {key} {stored[key]}" for key in sorted(stored.keys() - expected.keys())]
    lines += [
        f"differs: {key} stored {stored[key]} expected {expected[key]}"
        for key in sorted(stored.keys() & expected.keys())
        if stored[key] != expected[key]
    ]
    return "\n".join(lines[:20] + [f"({len(lines)} differences)"])


COUNTER_SAMPLES = (  # emitted windows, and the last ones the watermark has not passed yet
    "select coalesce(sum(count), 0) as n from (select count from window_results where metric "
    "like 'e2e.c.%' union all select count from window_pending where metric like 'e2e.c.%') w"
)


def _assert_every_line_is_stored_or_counted(daemon: Daemon, sent: int) -> None:
    """Accounting: counter lines sent = samples stored + what the receivers counted as
    dropped by the kernel or rejected (their stats files: this config's window keeps only
    ``e2e.*``, so their self-metrics are not in the store)."""
    dropped = 0
    for stats_file in (daemon.data_dir / "ingest").glob("*.json"):
        stats = json.loads(stats_file.read_text())
        dropped += sum(stats["kernel_drops"].values()) + sum(stats["rejected"].values())
    [stored] = daemon.query(COUNTER_SAMPLES)
    assert stored["n"] + dropped == sent > 0, (stored, dropped, sent)


def test_kill_9_of_the_driver_then_restart_neither_loses_nor_double_counts(
    daemon: Daemon,
) -> None:
    daemon.start()
    sender = PacedSender(daemon.port)
    sender.start()
    _wait_for_rows(daemon, 3)
    daemon.kill9()  # mid-stream: batches in flight, the receiver's pane partly combined
    time.sleep(1)
    daemon.start()  # same data directory: same checkpoints, spool and store
    time.sleep(4)
    sender.stop()
    assert daemon.stop() == 0, daemon.log_tail()
    _, batches = daemon.query("select count(*) as n from sink_batches")[0].popitem()
    assert batches > 0
    _assert_store_equals_log(daemon)


TIMER_KINDS = """
name: timerfaults
pane: 1s
windows:
  - {name: per_2s, kind: tumbling, size: 2s, watermark_delay: 1s, allowed_lateness: 1s,
     metrics: ["e2e.*"]}
  - {name: slide_3s, kind: sliding, size: 3s, watermark_delay: 1s, allowed_lateness: 1s,
     metrics: ["e2e.*"]}
  - {name: sessions, kind: session, gap: 2s, key: user, watermark_delay: 1s,
     allowed_lateness: 1s, metrics: ["e2e.*"]}
"""


class TimerSender(PacedSender):
    """Timers of 40 series (``e2e.lat.<n>``, integer values), one line per datagram; the odd
    and the even series take turns every 3 s, so their sessions (gap 2 s) close."""

    def run(self) -> None:
        i = 0
        while not self._halt.is_set():
            turn = int(time.monotonic() / 3) % 2
            try:
                self._client.timing(f"e2e.lat.{2 * (i % 20) + turn}", (i * 37) % 500)
                self.sent += 1
            except OSError:
                pass  # nothing listens during a restart: those never reached the log
            i += 1
            time.sleep(self._interval_s)


def test_kill_9_under_a_timer_load_restarts_to_the_rows_of_an_uninterrupted_run() -> None:
    with daemon_for(TIMER_KINDS, "timerfaults") as daemon:
        daemon.start()
        sender = TimerSender(daemon.port, lines_per_second=400)
        sender.start()
        wait_until(daemon, "select count(distinct window_name) >= 3 as ok from window_results")
        daemon.kill9()
        time.sleep(1)
        daemon.start()
        time.sleep(4)
        sender.stop()
        assert daemon.stop() == 0, daemon.log_tail()
        config = load(daemon.config_path)
        _assert_store_equals_log(daemon)
        windower = ReferenceWindower(config)
        windower.feed_all(segments_from_spool(daemon.data_dir / "spool"))
        layout = HdrLayout.from_params(config.sketches)
        rows = {
            (r["window_name"], r["metric"], _canonical(r["tags"]), r["start"]): r
            for r in daemon.query(
                "select window_name, metric, tags, (extract(epoch from window_start) * 1000)"
                "::bigint as start, p99, encode(sketch, 'base64') as sketch, hdr_histogram "
                "from window_results "
                "where metric like 'e2e.lat.%'"
            )
        }  # fmt: skip
        checked = 0
        for (name, metric, tags, start, _end), expected in windower.stored().items():
            if not metric.startswith("e2e.lat."):
                continue
            got = rows[(name, metric, _canonical(tags), start)]
            assert expected.hdr_histogram is not None and expected.sketch is not None
            ours, theirs = layout.decode(got["hdr_histogram"]), layout.decode(
                expected.hdr_histogram)  # fmt: skip
            assert ours[0].tolist() == theirs[0].tolist(), (name, metric, start)
            assert ours[1].tolist() == theirs[1].tolist(), (name, metric, start)
            check_quantiles(
                bytes(expected.sketch), base64.b64decode(got["sketch"]), got,
                config.sketches.quantile_rank_error, (name, metric, start), {"p99": 0.99},
            )  # fmt: skip
            checked += 1
        assert checked >= 40


def test_store_outage_mid_run_is_caught_up_exactly_once(daemon: Daemon) -> None:
    daemon.start()
    sender = PacedSender(daemon.port)
    sender.start()
    _wait_for_rows(daemon, 3)
    server = EmbeddedPostgres(daemon.data_dir)
    server.start()  # adopts the daemon's running server
    server.stop()
    time.sleep(6)  # traffic keeps landing in the log; the job retries with backoff
    server = EmbeddedPostgres(daemon.data_dir)
    server.start()
    time.sleep(3)
    sender.stop()
    assert daemon.stop() == 0, daemon.log_tail()
    assert "unavailable" in daemon.log_tail(200_000)  # the outage was noticed and retried
    _assert_store_equals_log(daemon)
    _assert_every_line_is_stored_or_counted(daemon, sender.sent)
    # ...and counted: the failed attempts reached pipeline_metrics once the store was back,
    # for the health dashboard's store-errors panel.
    errors = daemon.query(
        "select labels->>'reason' as reason, sum(value) as n from pipeline_metrics "
        "where name = 'streamgauge.store.errors' group by 1"
    )
    assert errors and all(row["n"] > 0 for row in errors), errors
