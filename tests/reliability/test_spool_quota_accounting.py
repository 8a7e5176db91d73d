"""The spool's disk quota filled under load: over the quota the
receivers refuse new data and count it, never drop it silently, and receive again once the
window job has read the spool and the janitor has freed space.

`streamgauge ingest` runs with a small ``--spool-quota``; a StatsD client sends a burst of
counters over many series (a few big segments: the quota fills in about a second), then a
paced load throughout. `streamgauge process` (same quota: its janitor enforces it) starts only
once the receiver refuses, so the spool is full of segments the job has not read, which
nothing may delete. Timeline::

    ingest  ──▶ bound ── burst ── paced ───────────────────────────────────── stop ─ SIGTERM
    spool              quota: refusing (counted) ─── job reads, janitor frees ──▶ writing
    process                  start ──(Spark starts)── commits ─────────────────────── drain

Afterwards:

- accounting, in the store: counter lines sent = counter samples stored (``window_results``
  and ``window_pending``) + refused over the quota + kernel drops +
  rejects, the last three counted by the receiver and written through the pipeline as its
  self-metrics; the refusal is ``streamgauge.ingest.refused{reason=spool_quota}`` there,
  equal to the receiver's own count, and a warning in its log;
- exactly once: the store equals the reference windower over the whole log. The janitor
  deletes committed segments for the quota, so the test keeps hard links to every segment as
  it appears (the log as written, checked gapless) and compares against that;
- recovery: once the janitor has deleted committed segments, the receiver writes the paced
  counters again: segments after that point hold them (so does the store, which equals the
  reference over the log), and the receiver logs it.

A small batch may still fit under the quota while a big one does not, so the receiver's
log can say "writing new data again" and "refusing" more than once before the janitor frees
space; every refusal is counted the same way.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamgauge.ingest.log import (
    REFUSED_SPOOL_QUOTA,
    list_segments,
    read_segment,
    segment_at,
)
from tests.e2e.harness import (
    Daemon,
    PacedSender,
    load,
    reference_rows,
    scratch_dir,
    stored_rows,
)
from tests.reliability.split_pipeline import RECEIVER, SplitPipeline

CONFIG = """
name: quota
pane: 1s
windows:
  - {name: per_2s, kind: tumbling, size: 2s, watermark_delay: 1s, allowed_lateness: 1s,
     group_by: [reason]}
"""  # group_by keeps the self-metrics' reason tag in the store (the default drops every tag)
# The burst writes segments of ~0.5 MB (5,000 series); then 4 segments/s of ~5 KB (7 counters
# and the self-metrics, ~20 KB/s). The 10 % of the quota the janitor frees holds ~10 s of
# that: more than the janitor's and the receiver's 5 s rescan intervals.
QUOTA = "2MiB"
BURST_LINES = 60_000  # ~3 MB of segments
BURST_SERIES = 5_000


class LogCopy(threading.Thread):
    """Hard links to every segment of the stream as it appears, in a directory the janitor
    does not prune and the quota does not count: the log as written, for the reference."""

    def __init__(self, spool: Path, copy: Path) -> None:
        super().__init__(daemon=True)
        self._spool, self._copy = spool, copy
        self.path = copy
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.sweep()
            time.sleep(0.05)

    def sweep(self) -> None:
        (self._copy / RECEIVER).mkdir(parents=True, exist_ok=True)
        for segment in list_segments(self._spool, RECEIVER):
            linked = self._copy / RECEIVER / Path(segment.path).name
            if not linked.exists():
                with contextlib.suppress(FileNotFoundError):  # pruned already: a gap, seen
                    os.link(segment.path, linked)

    def stop(self) -> None:
        self._halt.set()
        self.join()
        self.sweep()


@pytest.fixture()
def processes() -> Iterator[SplitPipeline]:
    root = scratch_dir("streamgauge-quota-")
    running = SplitPipeline(root, CONFIG, "--spool-quota", QUOTA)
    try:
        yield running
    finally:
        running.cleanup()
        shutil.rmtree(root, ignore_errors=True)


def _counter_samples(spool: Path, after: int) -> int:
    """Paced counter samples in the stream's segments after sequence ``after``."""
    return sum(row["count"] for segment in list_segments(spool, RECEIVER, after=after)
               for batch in read_segment(segment) for row in batch.to_pylist()
               if row["metric"].startswith("quota.c."))  # fmt: skip


COUNTER_SAMPLES = (  # emitted windows, and the last ones the watermark has not passed yet
    "select coalesce(sum(count), 0) as n from (select count from window_results where metric "
    "like 'quota.%' union all select count from window_pending where metric like 'quota.%') w"
)
REFUSED = (  # the receiver's count, through the pipeline (integer sums: exact)
    "select coalesce(sum(sum), 0)::bigint as n from window_results where metric = "
    f"'streamgauge.ingest.refused' and tags->>'reason' = '{REFUSED_SPOOL_QUOTA}'"
)
DROPPED = (
    "select coalesce(sum(sum), 0)::bigint as n from window_results where metric in "
    "('streamgauge.ingest.kernel_drops', 'streamgauge.ingest.rejected')"
)


def test_over_the_spool_quota_under_load_lines_are_refused_and_counted_then_received_again(
    processes: SplitPipeline,
) -> None:
    processes.start_ingest()
    # lines sent before the socket is bound would reach nobody, uncounted: wait for a segment
    processes.wait_for_receiver()
    copy = LogCopy(processes.spool, processes.root / "log-copy")
    copy.start()
    # Counters only, known totals: the burst's big segments fill the quota in about a second,
    # then quota.c.<n>:1|c paced. A bound receiver on localhost: sendto does not fail (the
    # client would swallow it), so ``sent`` is every line that left.
    sender = PacedSender(processes.port, prefix="quota", timers=False, burst=BURST_LINES,
                         burst_series=BURST_SERIES)  # fmt: skip
    sender.start()
    processes.wait(lambda: processes.stats().get("refused_samples", {}).get(REFUSED_SPOOL_QUOTA),
                   "the receiver refusing over the quota")  # fmt: skip
    assert f"{RECEIVER}: refusing new data ({REFUSED_SPOOL_QUOTA})" in processes.log("ingest.log")

    processes.start_process()  # reads the full spool; its janitor then frees committed segments
    processes.wait(lambda: not segment_at(processes.spool, RECEIVER, 0).exists(),
                   "the janitor freeing committed segments", timeout_s=240)  # fmt: skip
    freed_at = list_segments(processes.spool, RECEIVER)[-1].sequence + 1
    processes.wait(lambda: _counter_samples(copy.path, after=freed_at - 1) > 0,
                   "the receiver writing data again")  # fmt: skip
    refused_at_recovery = processes.stats()["refused_samples"][REFUSED_SPOOL_QUOTA]
    time.sleep(4)  # load after the recovery
    sender.stop()
    assert processes.ingest is not None
    processes.ingest.send_signal(signal.SIGTERM)  # flushes and closes its stream
    assert processes.ingest.wait(timeout=60) == 0, processes.log("ingest.log")
    copy.stop()

    # The receiver's own ledger: every line sent was received (or dropped by the kernel,
    # counted), aggregated, and either written or refused.
    stats = processes.stats()
    drops = sum(stats["kernel_drops"].values())
    assert stats["lines"] + drops == sender.sent
    assert stats["metric_lines"] == stats["lines"] and stats["rejected"] == {}
    refused = stats["refused_samples"][REFUSED_SPOOL_QUOTA]
    assert set(stats["refused_samples"]) == {REFUSED_SPOOL_QUOTA} and refused > 0

    # In the store: sent = stored + refused + dropped, the refusal as the receiver counted it.
    accounted = (f"select ({COUNTER_SAMPLES}) + ({REFUSED}) + ({DROPPED}) = {sender.sent} "
                 f"and ({REFUSED}) = {refused} as ok")  # fmt: skip
    deadline = time.monotonic() + 120
    while not processes.query(accounted)[0]["ok"]:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"sent {sender.sent}, stored {processes.query(COUNTER_SAMPLES)}, refused "
                f"{processes.query(REFUSED)} (receiver: {refused}), dropped "
                f"{processes.query(DROPPED)}\n{processes.log('process.log')}")
        time.sleep(0.5)
    assert processes.process is not None
    processes.process.send_signal(signal.SIGTERM)  # drains what is left in the log
    assert processes.process.wait(timeout=120) == 0, processes.log("process.log")
    [stored] = processes.query(COUNTER_SAMPLES)
    assert stored["n"] + refused + drops == sender.sent and stored["n"] > 0
    [partials] = processes.query(REFUSED.replace("ingest.refused'", "ingest.refused_partials'"))
    assert partials["n"] == stats["refused_partials"][REFUSED_SPOOL_QUOTA] > 0

    # Writing resumed once space was freed: data segments written after that are in the log
    # (and so in the store: it equals the reference over the log, below).
    assert _counter_samples(copy.path, after=freed_at - 1) > 0
    assert "writing new data again" in processes.log("ingest.log", 1_000_000)

    # Exactly once: the store equals the reference windower over the log as written.
    copied = list_segments(copy.path, RECEIVER)
    assert [s.sequence for s in copied] == list(range(len(copied)))  # no segment missed
    assert len(list_segments(processes.spool, RECEIVER)) < len(copied)  # the janitor pruned
    config = load(processes.config)
    reader = Daemon(processes.config, processes.data_dir, processes.port, processes.root / "q")
    assert stored_rows(reader, config.name) == reference_rows(config, copy.path)
    refusals = len(re.findall(r"refusing new data", processes.log("ingest.log", 1_000_000)))
    print(f"spool quota {QUOTA}: sent {sender.sent} counter lines = {stored['n']} stored + "
          f"{refused} refused ({refused_at_recovery} before the first recovery, {refusals} "
          f"refusal episode(s)) + {drops} kernel drops; {len(copied)} segments written")
