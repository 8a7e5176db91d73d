"""When a receiver process lets CPython's garbage collector and its thread switches stop reading.

A receiver reads its sockets on read-ahead threads (``read_ahead.py``) so that the
kernel's socket buffer is drained while the receive loop parses. Those threads needed the GIL
around every ``recvmmsg`` (the compiled reader does not; the loop that empties its ring
does), so two things held them off for longer than the socket buffer lasts
(an 8 MiB buffer holds ~10k small datagrams, ~50 ms at 200k datagrams/s, since the kernel
charges ~830 bytes a datagram):

- **Full collections.** Start-up leaves ~117k objects the collector tracks (most of them
  numba's compiler state) and the first 10k series add ~60k more. CPython runs a full
  collection whenever the objects promoted since the last one exceed a quarter of the
  long-lived ones, which happens over and over while series arrive: each one holds the GIL
  for longer than the socket buffer lasts, and ``bench/ingest.py`` saw them early in every
  measured send. Freezing start-up's objects alone makes it worse: with the long-lived count
  near zero, the quarter rule fires far more often. So the receiver freezes what
  start-up made *and* takes full collections off the automatic schedule; it runs one itself
  every ``FULL_COLLECTION_EVERY_MS``, after a roll, over the live state only (the young
  generations are still collected automatically: those pauses are a few ms).
- **Thread switches.** A thread waiting for the GIL gets it when the holder reaches the switch
  interval, 5 ms by default. While the receive loop was busy parsing, a read-ahead thread
  waited that long after each system call, so it read at most ~256 datagrams (one
  ``recvmmsg``) every ~5–20 ms. ``SWITCH_INTERVAL_S`` = 0.5 ms lets it in ten times sooner.

Both together raise the highest loss-free rate at 1 and at 20 lines per datagram
(``bench/ingest.py --repeat 3 --seconds 2 --receivers 1``, before and after alternated;
current figures in ``docs/performance.md``).
"""

from __future__ import annotations

import gc
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

FULL_COLLECTION_EVERY_MS = 60_000
SWITCH_INTERVAL_S = 0.0005
#: gen2's threshold counts gen1 collections; this many never come (one per ~7000 objects).
NEVER = 1 << 30


def settle_after_startup() -> int:
    """Collect once, freeze what is left (it lives as long as the process), stop automatic
    full collections and shorten the switch interval; returns how many objects were frozen.
    Process-wide: only for a receiver process, after everything it keeps is built."""
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, NEVER)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    return gc.get_freeze_count()


@dataclass
class FullCollections:
    """Runs a full collection when ``every_ms`` has passed since the last, by the receiver's
    clock (so tests drive it by hand); the receiver counts them and their pauses."""

    every_ms: int = FULL_COLLECTION_EVERY_MS
    collect: Callable[[], object] = gc.collect
    monotonic_ns: Callable[[], int] = time.monotonic_ns
    _last_ms: int | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.every_ms <= 0:
            raise ValueError(f"every_ms must be positive, got {self.every_ms}")

    def maybe_collect(self, now_ms: int) -> int | None:
        """Collect if one is due at ``now_ms`` and return its pause (ms), else None; the
        first call only starts the schedule (``settle_after_startup`` has just collected)."""
        if self._last_ms is None:
            self._last_ms = now_ms
            return None
        if now_ms - self._last_ms < self.every_ms:
            return None
        started = self.monotonic_ns()
        self.collect()
        self._last_ms = now_ms
        return (self.monotonic_ns() - started) // 1_000_000
