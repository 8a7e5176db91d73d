"""Progress of long Spark work (``streamgauge replay``), on stderr while it runs.

Spark knows how far its running job is: each stage has a number of tasks, and its status
tracker says how many are done. Every ``interval_s`` the line says the elapsed time and, of
each stage running now, its tasks done / to do, the rate since the line first saw the stage
and the time left at that rate. On a terminal the line is redrawn in place;
otherwise it is printed every ``plain_every_s``, so a log file gets a line, not a flood.

What replay's own loop does (which window it is on) is not visible from here; the stage's
tasks are the part of its work that takes time.
"""

from __future__ import annotations

import threading
import time
from typing import Any, TextIO

from streamgauge.operator.terminal import Terminal, duration


class SparkProgress(threading.Thread):
    """Draws ``what``'s progress from a SparkContext's status tracker until ``stop``."""

    def __init__(
        self, spark_context: Any, what: str, stream: TextIO, *, interval_s: float = 1.0,
        plain_every_s: float = 10.0,
    ) -> None:  # fmt: skip
        super().__init__(name="spark-progress", daemon=True)
        self._tracker = spark_context.statusTracker()
        self._what = what
        self._terminal = Terminal(stream, live=stream.isatty())
        self._interval_s = interval_s if self._terminal.live else plain_every_s
        self._halt = threading.Event()
        self._began = time.monotonic()
        self._stage_seen: dict[int, tuple[float, int]] = {}  # stage -> (first seen, done then)

    def run(self) -> None:
        while not self._halt.wait(self._interval_s):
            try:
                text = self.describe()
            except Exception:  # noqa: BLE001 - the JVM may be stopping: no line this time
                continue
            self._terminal.status(text)

    def describe(self) -> str:
        elapsed = duration((time.monotonic() - self._began) * 1000)
        parts = [f"{self._what}: {elapsed}"]
        for job_id in sorted(self._tracker.getActiveJobsIds()):
            job = self._tracker.getJobInfo(job_id)
            for stage_id in sorted(job.stageIds) if job is not None else ():
                stage = self._tracker.getStageInfo(stage_id)
                if stage is None or stage.numActiveTasks == 0:
                    continue
                parts.append(self._stage_text(job_id, stage))
        if len(parts) == 1:
            parts.append("no Spark stage running")
        return " | ".join(parts)

    def _stage_text(self, job_id: int, stage: Any) -> str:
        now = time.monotonic()
        done, total = int(stage.numCompletedTasks), int(stage.numTasks)
        first_seen, done_then = self._stage_seen.setdefault(stage.stageId, (now, done))
        text = f"Spark job {job_id} stage {stage.stageId}: {done:,}/{total:,} tasks"
        if now - first_seen >= 1 and done > done_then:
            rate = (done - done_then) / (now - first_seen)
            left = (total - done) / rate
            text += f", {rate:.1f}/s, about {duration(left * 1000)} left in this stage"
        return text

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)
        self._terminal.clear_status()
