"""How far each window query is behind the segment log, and how fast it closes the gap.

After a restart (or a burst the job could not keep up with) a window query has segments to
read that the receivers wrote meanwhile. Per query, from files alone (no Spark, no store):

- **to do**: segments in the log after the last one the query committed (``commits/<n>``
  of its checkpoint names, through ``offsets/<n>``, the last sequence per receiver);
- **done**: segments it committed since the daemon started (``run.json``'s
  ``catch_up_from``: what each query had committed when `run` started it);
- **rate**: segments committed per second over the query's recent commits (at least
  ``RATE_SPAN_MS`` of them, the commit files' times), and the time left at that rate.

A query that keeps up has a few segments to do at any moment (those written since its last
batch); ``catching_up`` says when the gap is worth showing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from streamgauge.ingest.log import list_receivers, list_segments
from streamgauge.ingest.spool_fs import SpoolLike
from streamgauge.retention import done_sequences, offset_sequences

#: The rate is measured over the newest commits spanning at least this long (or all there are).
RATE_SPAN_MS = 10_000
#: A query further behind than this many seconds of its own commit rate is catching up.
CATCHING_UP_S = 10.0
_MAX_COMMITS_READ = 200


@dataclass(frozen=True)
class Backlog:
    """One window query's position against the log."""

    window: str
    to_do: int
    done: int | None
    per_s: float | None

    @property
    def left_s(self) -> float | None:
        """Seconds until the query has read the log as written now, at its recent rate."""
        if self.per_s is None or self.per_s <= 0:
            return None
        return self.to_do / self.per_s

    @property
    def catching_up(self) -> bool:
        left = self.left_s
        return self.to_do > 0 and left is not None and left >= CATCHING_UP_S

    def to_json(self) -> dict[str, object]:
        """The form ``status --json`` shows, and what the status line and table read."""
        return {"window": self.window, "segments_to_do": self.to_do,
                "segments_done": self.done, "segments_per_s": self.per_s,
                "left_s": self.left_s, "catching_up": self.catching_up}  # fmt: skip


def backlog(
    checkpoints: Mapping[str, Path],
    last_sequences: Mapping[str, int | None],
    started_from: Mapping[str, Mapping[str, int]] | None = None,
) -> list[Backlog]:
    """Per window (``checkpoints``: window name → its query's checkpoint): its ``Backlog``
    against the streams' last sequences (``describe_spool``'s ``last_sequence``)."""
    found = []
    for window, checkpoint in checkpoints.items():
        committed = done_sequences(checkpoint) or {}
        to_do = sum(
            max(0, last - committed.get(stream, -1))
            for stream, last in last_sequences.items()
            if last is not None
        )
        done = None
        if started_from is not None and window in started_from:
            base = started_from[window]
            done = sum(max(0, seq - base.get(stream, -1)) for stream, seq in committed.items())
        found.append(Backlog(window, to_do, done, _commit_rate(checkpoint)))
    return found


def last_sequences(spool: SpoolLike) -> dict[str, int | None]:
    """Per stream of the log, the sequence of its newest segment (None: none yet)."""
    found: dict[str, int | None] = {}
    for stream in list_receivers(spool):
        segments = list_segments(spool, stream)
        found[stream] = segments[-1].sequence if segments else None
    return found


def catch_up_now(
    spool: SpoolLike,
    checkpoints: Mapping[str, Path],
    started_from: Mapping[str, Mapping[str, int]] | None = None,
) -> list[dict[str, object]]:
    """``backlog`` against the log as it is now, in the status document's form."""
    return [late.to_json() for late in backlog(checkpoints, last_sequences(spool), started_from)]


def _commit_rate(checkpoint: Path) -> float | None:
    """Segments per second over the newest commits spanning ``RATE_SPAN_MS``; None with fewer
    than two commits or no time between them."""
    commits = checkpoint / "commits"
    try:
        batches = sorted((int(p.name) for p in commits.iterdir() if p.name.isdigit()),
                         reverse=True)[:_MAX_COMMITS_READ]  # fmt: skip
    except FileNotFoundError:
        return None
    newest: tuple[float, int] | None = None
    oldest: tuple[float, int] | None = None
    for batch in batches:
        try:
            at_ms = (commits / str(batch)).stat().st_mtime * 1000
            total = _segments_through(checkpoint / "offsets" / str(batch))
        except (OSError, ValueError, KeyError):  # being written, or cleaned up by Spark
            continue
        if newest is None:
            newest = (at_ms, total)
            continue
        oldest = (at_ms, total)
        if newest[0] - at_ms >= RATE_SPAN_MS:
            break
    if newest is None or oldest is None or newest[0] <= oldest[0]:
        return None
    return (newest[1] - oldest[1]) / ((newest[0] - oldest[0]) / 1000)


def _segments_through(offsets: Path) -> int:
    """How many segments a batch's end offsets cover, all streams together."""
    return sum(seq + 1 for seq in offset_sequences(offsets).values())

