"""``kill -9`` of the Spark driver under load, receivers kept running: every line sent is in
the store exactly once, or counted as dropped.

`streamgauge ingest` and `streamgauge process` run as separate processes (as with receivers
on other hosts, ``docs/scale-out.md``), so killing the window job does not stop the receivers:
a StatsD client keeps sending throughout, the log keeps growing, and the restarted job resumes
from its checkpoints. Afterwards:

- accounting: counter lines sent = counter samples stored (emitted windows, and the last ones
  still waiting for the watermark, which the job's clean stop parks in ``window_pending``) +
  kernel drops + rejects (both counted by the receivers and written through the pipeline as
  self-metrics);
- exactly once: the store equals the reference windower over the durable log (a micro-batch
  committed before the kill and replayed after it is not counted twice).
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streamgauge.ingest.log import list_receivers, list_segments, read_segment
from tests.e2e.harness import (
    Daemon,
    PacedSender,
    load,
    reference_rows,
    scratch_dir,
    stored_rows,
)
from tests.reliability.split_pipeline import SplitPipeline

CONFIG = """
name: driverkill
pane: 1s
windows:
  - {name: per_2s, kind: tumbling, size: 2s, watermark_delay: 1s, allowed_lateness: 1s}
  # The open windows live in the driver: a restart rebuilds them from the log, and a batch
  # run again after the kill must not add its partials twice.
  - {name: per_4s, kind: tumbling, size: 4s, watermark_delay: 1s, allowed_lateness: 1s}
"""
WINDOWS = ("per_2s", "per_4s")


def _log_rows(spool: Path) -> list[dict[str, Any]]:
    return [row for receiver in list_receivers(spool) for info in list_segments(spool, receiver)
            for batch in read_segment(info)
            for row in batch.to_pylist()]  # fmt: skip


@pytest.fixture()
def processes() -> Iterator[SplitPipeline]:
    root = scratch_dir("streamgauge-driverkill-")
    running = SplitPipeline(root, CONFIG)
    try:
        yield running
    finally:
        running.cleanup()


COUNTER_SAMPLES = (  # emitted windows, and the last ones the watermark has not passed yet
    "select coalesce(sum(count), 0) as n from (select count from window_results where {w} "
    "union all select count from window_pending where {w}) w"
)


def counter_samples(window: str) -> str:
    """``COUNTER_SAMPLES`` of one window."""
    return COUNTER_SAMPLES.format(w=f"metric like 'e2e.c.%' and window_name = '{window}'")

DROPPED = (  # the receivers' own counts, through the pipeline (integer sums: exact)
    "select coalesce(sum(sum), 0)::bigint as n from window_results where metric in "
    "('streamgauge.ingest.kernel_drops', 'streamgauge.ingest.rejected')"
)


def test_kill_9_of_the_driver_under_load_loses_nothing_and_counts_nothing_twice(
    processes: SplitPipeline,
) -> None:
    processes.start_ingest()
    processes.start_process()
    processes.wait_for_receiver()  # lines sent before it binds would reach nobody, uncounted
    sender = PacedSender(processes.port, lines_per_second=400)
    sender.start()
    processes.wait_for("select count(*) >= 5 as ok from window_results "
                       "where metric like 'e2e.%'")  # fmt: skip
    assert processes.process is not None
    processes.process.kill()  # mid-stream: the receiver keeps writing the log
    processes.process.wait()
    time.sleep(3)
    processes.start_process()
    processes.wait_for("select count(*) >= 1 as ok from sink_batches "
                       "where committed_at > now() - interval '5 seconds'")  # fmt: skip
    time.sleep(2)
    sender.stop()
    assert processes.ingest is not None
    processes.ingest.send_signal(signal.SIGTERM)  # flushes and closes its stream
    assert processes.ingest.wait(timeout=60) == 0, processes.log("ingest.log")
    # Every counter line sent is a stored sample or a counted drop (none expected at 400/s),
    # in each window.
    for window in WINDOWS:
        samples = counter_samples(window)
        try:
            processes.wait_for(f"select ({samples}) + ({DROPPED}) = {sender.sent} as ok",
                               timeout_s=120)  # fmt: skip
        except AssertionError:
            in_log = sum(row["count"] for row in _log_rows(processes.data_dir / "spool")
                         if row["metric"].startswith("e2e.c."))  # fmt: skip
            raise AssertionError(
                f"{window}: sent {sender.sent}, in the log {in_log}, stored"
                f" {processes.query(samples)}, dropped {processes.query(DROPPED)}"
            ) from None
    assert processes.query(DROPPED) == [{"n": 0}]
    assert processes.process is not None
    processes.process.send_signal(signal.SIGTERM)  # drains what is left in the log
    assert processes.process.wait(timeout=120) == 0, processes.log("process.log")
    for window in WINDOWS:
        [stored] = processes.query(counter_samples(window))
        assert stored["n"] == sender.sent > 0, window

    # Exactly once: the store equals the reference windower over the whole log.
    config = load(processes.config)
    reader = Daemon(processes.config, processes.data_dir, processes.port, processes.root / "q")
    assert stored_rows(reader, config.name) == reference_rows(config, processes.data_dir / "spool")
