"""Injected clocks.

Every component that reads the time takes a ``Clock`` so tests can drive time by hand and
so nothing ever reads the wall clock as a float. Time is integer epoch milliseconds.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Source of the current time as integer epoch milliseconds."""

    def now_ms(self) -> int: ...


class SystemClock:
    """The wall clock, in integer epoch milliseconds (``time.time_ns`` avoids float rounding)."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that only moves when told to; for tests and the reference windower."""

    def __init__(self, start_ms: int = 0) -> None:
        self._now_ms = start_ms

    def now_ms(self) -> int:
        return self._now_ms

    def advance(self, delta_ms: int) -> None:
        if delta_ms < 0:
            raise ValueError(f"a manual clock only moves forward; got delta_ms={delta_ms}")
        self._now_ms += delta_ms

    def set(self, now_ms: int) -> None:
        self._now_ms = now_ms
