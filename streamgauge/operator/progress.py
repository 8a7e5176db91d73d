"""Progress of long work (``streamgauge replay``), on stderr while it runs.

Every ``interval_s`` the line says the elapsed time; which of the config's windows the work is
on, with the windows done / to do and, once one is done, the time left at the pace so far
(``window``: replay tells it as each window's turn comes); and, of each Spark stage running
now (a ``quantiles: kll`` window's aggregation), its tasks done / to do, the rate since the
line first saw the stage and the time left in it. Every other window is recomputed in the
driver, reading the log itself: no Spark stage then. On a terminal the line is redrawn in
place; otherwise it is printed every ``plain_every_s``, so a log file gets a line, not a
flood.
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
        self._window: tuple[int, int, str, float] | None = None  # index, of, name, began

    def window(self, index: int, of: int, name: str) -> None:
        """The work is on window ``index`` (from 0) of ``of``, ``name``, from now on."""
        self._window = (index, of, name, time.monotonic())

    def run(self) -> None:
        while not self._halt.wait(self._interval_s):
            try:
                text = self.describe()
            except Exception:  # noqa: BLE001 - the JVM may be stopping: no line this time
                continue
            self._terminal.status(text)

    def describe(self) -> str:
        now = time.monotonic()
        elapsed = duration((now - self._began) * 1000)
        parts = [f"{self._what}: {elapsed}"]
        if self._window is not None:
            index, of, name, began = self._window
            text = f"window {index + 1}/{of} {name}"
            if index:  # the windows done so far set the pace of those left
                left = (began - self._began) / index * (of - index) - (now - began)
                text += f", about {duration(max(left, 0.0) * 1000)} left"
            parts.append(text)
        stages = []
        for job_id in sorted(self._tracker.getActiveJobsIds()):
            job = self._tracker.getJobInfo(job_id)
            for stage_id in sorted(job.stageIds) if job is not None else ():
                stage = self._tracker.getStageInfo(stage_id)
                if stage is None or stage.numActiveTasks == 0:
                    continue
                stages.append(self._stage_text(job_id, stage))
        if not stages:
            stages.append("no Spark stage running" if self._window is None
                          else "reading the log in the driver")  # fmt: skip
        return " | ".join(parts + stages)

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
