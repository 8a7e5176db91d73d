"""Where a streaming query's micro-batch time goes, from Spark's own UI (REST API).

Spark's progress reports give ``addBatch`` as one figure; inside it, a ``foreachBatch`` sink
runs Spark jobs (the scan and partial aggregation, the stateful aggregation after the
shuffle, the collect to the driver) with driver-side work between and after them (planning,
converting the collected rows, the store's commit). This reads the jobs Spark ran for one
query, by the description Structured Streaming gives them (the query name on its first line),
and prints per micro-batch: the wall time of its jobs' stages by stage name, and the time
inside the batch that no job covered (the driver's share).
"""

from __future__ import annotations

import datetime
import json
import statistics
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

#: Spark settings that keep every job and stage of a bench run in the UI (default: 1000).
KEEP_ALL_JOBS = {"spark.ui.retainedJobs": "100000", "spark.ui.retainedStages": "100000"}


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def _ms(stamp: str) -> int:
    """Spark UI time ("2026-11-22T12:00:00.123GMT") as epoch ms."""
    parsed = datetime.datetime.strptime(stamp.replace("GMT", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    return int(parsed.timestamp() * 1000)


@dataclass(frozen=True)
class UiSnapshot:
    """The completed stages (by id) and succeeded jobs of an application, read once: every
    figure of a run comes from the same snapshot (a long run's lists run to thousands)."""

    stages: dict[int, dict[str, Any]]
    jobs: list[dict[str, Any]]

    @classmethod
    def read(cls, ui_url: str, app_id: str) -> UiSnapshot:
        base = f"{ui_url}/api/v1/applications/{app_id}"
        stages = {s["stageId"]: s for s in _get(f"{base}/stages?status=complete")}
        return cls(stages, _get(f"{base}/jobs?status=succeeded"))


def batch_breakdown(ui: UiSnapshot, query: str, since_ms: int) -> dict[str, list[float]]:
    """Per batch of ``query`` submitted at or after ``since_ms``: seconds by stage name, plus
    ``jobs (wall)``, the union of its jobs' wall time; lists over batches."""
    stages = ui.stages
    by_batch: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for job in ui.jobs:
        lines = (job.get("description") or "").splitlines()
        if not lines or lines[0] != query or "completionTime" not in job:
            continue
        if _ms(job["submissionTime"]) < since_ms:
            continue
        batch = next((line for line in lines if line.startswith("batch = ")), "?")
        by_batch[batch].append(job)
    figures: dict[str, list[float]] = defaultdict(list)
    for jobs in by_batch.values():
        per_stage: dict[str, float] = defaultdict(float)
        for job in jobs:
            for stage_id in job["stageIds"]:
                stage = stages.get(stage_id)
                if stage is None or "completionTime" not in stage:
                    continue  # skipped (its output reused) or still running
                wall = _ms(stage["completionTime"]) - _ms(stage["submissionTime"])
                per_stage[f"stage {stage['name'].split(' at ')[0]}"] += wall / 1000
        spans = sorted((_ms(j["submissionTime"]), _ms(j["completionTime"])) for j in jobs)
        covered, reach = 0, 0
        for start, end in spans:
            covered += max(0, end - max(start, reach))
            reach = max(reach, end)
        per_stage["jobs (wall)"] = covered / 1000
        for name, seconds in per_stage.items():
            figures[name].append(seconds)
    return figures


def print_breakdown(figures: dict[str, list[float]]) -> None:
    """Medians over the batches, largest first."""
    if not figures:
        print("spark jobs per batch: none found in the UI")
        return
    batches = max(len(v) for v in figures.values())
    parts = sorted(((statistics.median(v), name) for name, v in figures.items()), reverse=True)
    print(f"spark jobs per batch ({batches} batches, median s): "
          + ", ".join(f"{name} {seconds:.2f}" for seconds, name in parts))  # fmt: skip


def task_seconds(ui: UiSnapshot, since_ms: int) -> dict[str, tuple[float, float]]:
    """Per query (by job description), its tasks' run time and CPU time in seconds, summed
    over the stages of jobs submitted at or after ``since_ms``: what each query costs the
    executors, an idle one included (a query with no rows still runs its stages every batch
    its offsets move)."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for job in ui.jobs:
        lines = (job.get("description") or "").splitlines()
        if not lines or _ms(job["submissionTime"]) < since_ms:
            continue
        for stage_id in job["stageIds"]:
            stage = ui.stages.get(stage_id)
            if stage is None:
                continue
            totals[lines[0]][0] += stage["executorRunTime"] / 1000
            totals[lines[0]][1] += stage["executorCpuTime"] / 1e9
    return {query: (run, cpu) for query, (run, cpu) in totals.items()}
