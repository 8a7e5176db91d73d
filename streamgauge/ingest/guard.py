"""The cardinality guard: a bound on the series one receiver keeps apart.

A *series* is (metric, type, tag set). A series is **active** while it has had a sample within
the last ``ttl_ms`` of the receive clock. The guard admits a new series only while the number
of active series stays within ``max_series`` overall and ``max_series_per_metric`` for its
metric; otherwise the line is folded into an **overflow series** with the single tag
``streamgauge_overflow:true`` and counted as ``cardinality_limited``:

- the metric's own overflow series (same metric and type) when the metric already has active
  series (its per-metric limit, or the overall limit, was reached while it was reporting);
- the shared ``streamgauge.overflow.<type>`` series when the metric itself is new: a flood of
  distinct *names* must not create one overflow series per name, or the overflow series
  would be as unbounded as what they replace (``overflow_metric``).

Nothing is dropped: the overflow series carries the values, only the tag (or name) detail is
lost. The overflow series are bounded: at most one per active metric plus one per type.

Why activity (LRU with a TTL) and not a reset per window: an established series keeps its
slot as long as it keeps reporting, so a burst of new tag values cannot push the series that
were there first into overflow at the next reset, and a series that stopped reporting frees
its slot ``ttl_ms`` later. Overflow series themselves are always admitted and not counted.
The limits are per receiver process (with ``--receivers N`` the whole daemon admits up to N
times as many), and time is the receive clock, never client timestamps.

Timeline with ``max_series=2``, ``ttl_ms=10``::

    t=0  a  → admitted            active: a
    t=1  b  → admitted            active: a b
    t=2  c  → overflow            (a, b active)
    t=9  a  → refreshed           active: b a
    t=12 c  → admitted (b expired at 11)   active: a c
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

OVERFLOW_TAG = ("streamgauge_overflow", "true")
OVERFLOW_TAGS: tuple[tuple[str, str], ...] = (OVERFLOW_TAG,)
SHARED_OVERFLOW_PREFIX = "streamgauge.overflow."
"""New metric names refused by the guard fold into ``streamgauge.overflow.<type>``."""

SeriesId = tuple[str, str, tuple[tuple[str, str], ...]]  # metric, type, sorted tag pairs


@dataclass(frozen=True, slots=True)
class CardinalityLimits:
    """0 disables a limit."""

    max_series: int = 100_000
    max_series_per_metric: int = 10_000
    ttl_ms: int = 10 * 60_000

    def __post_init__(self) -> None:
        problems = [
            f"{name} must be >= 0, got {getattr(self, name)}"
            for name in ("max_series", "max_series_per_metric")
            if getattr(self, name) < 0
        ]
        if self.ttl_ms <= 0:
            problems.append(f"ttl_ms must be positive, got {self.ttl_ms}")
        if problems:
            raise ValueError("cardinality limits: " + "; ".join(problems))


class CardinalityGuard:
    """Decides, per line, whether its series may stay apart. One receiver loop owns it."""

    def __init__(
        self,
        limits: CardinalityLimits = CardinalityLimits(),  # noqa: B008 - frozen, shared safely
        on_expire: Callable[[SeriesId], None] | None = None,
    ) -> None:
        """``on_expire`` is told about each series that went idle (to drop its gauge state)."""
        self._limits = limits
        self._on_expire = on_expire
        self._last_seen: OrderedDict[SeriesId, int] = OrderedDict()  # oldest activity first
        self._per_metric: dict[str, int] = {}

    @property
    def active(self) -> int:
        return len(self._last_seen)

    def admit(self, series: SeriesId, now_ms: int) -> bool:
        """True if ``series`` may be kept apart; False: fold it into the overflow series."""
        last_seen = self._last_seen
        if series in last_seen:
            last_seen[series] = now_ms
            last_seen.move_to_end(series)
            return True
        self.expire(now_ms)
        limits = self._limits
        metric = series[0]
        per_metric = self._per_metric.get(metric, 0)
        if (limits.max_series and len(last_seen) >= limits.max_series) or (
            limits.max_series_per_metric and per_metric >= limits.max_series_per_metric
        ):
            return False
        last_seen[series] = now_ms
        self._per_metric[metric] = per_metric + 1
        return True

    def tracks(self, metric: str) -> bool:
        """Whether ``metric`` has active series (so its own overflow series is bounded)."""
        return metric in self._per_metric

    def overflow_metric(self, metric: str, metric_type: str) -> str:
        """Where a refused line of ``metric`` goes: its own overflow series if the metric is
        active, else the shared one of its type."""
        return metric if metric in self._per_metric else SHARED_OVERFLOW_PREFIX + metric_type

    def refresh(self, series: SeriesId, now_ms: int) -> None:
        """Record activity of an admitted series seen at ``now_ms`` (no-op if not active).

        The receiver's fast path tells the guard in bulk, oldest activity first, before the
        guard next decides anything (an ``admit`` of a new series or an ``expire``)."""
        last_seen = self._last_seen
        if series in last_seen:
            last_seen[series] = now_ms
            last_seen.move_to_end(series)

    def refresh_many(self, series: Iterable[SeriesId | None], seen_ms: Iterable[int]) -> None:
        """``refresh`` for many series at once, in order (oldest activity first): the fast
        path reports ~every active series at each roll, 10k at 10k series, and one call per
        series was most of a roll's time on the receive thread once segments were built on
        the writer thread."""
        last_seen = self._last_seen
        move_to_end = last_seen.move_to_end
        for one, now_ms in zip(series, seen_ms, strict=True):
            try:
                move_to_end(one)  # type: ignore[arg-type]  # KeyError (None too): not active
            except KeyError:
                continue
            last_seen[one] = now_ms  # type: ignore[index]

    def expire(self, now_ms: int) -> None:
        """Forget series idle for longer than the TTL (the oldest are at the front)."""
        horizon = now_ms - self._limits.ttl_ms
        last_seen = self._last_seen
        while last_seen:
            series, seen = next(iter(last_seen.items()))
            if seen > horizon:
                break
            del last_seen[series]
            remaining = self._per_metric[series[0]] - 1
            if remaining:
                self._per_metric[series[0]] = remaining
            else:
                del self._per_metric[series[0]]
            if self._on_expire is not None:  # after the count: ``tracks`` is up to date
                self._on_expire(series)
