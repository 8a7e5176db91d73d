"""Durations as written in window configs: ``250ms``, ``10s``, ``5m``, ``1h``, ``1m30s``.

Every duration is held as an integer number of milliseconds. Floats are refused at the door
because window boundaries are compared for equality (``size % hop``, ``size % pane``) and a
float ``0.1 + 0.2`` would make two configs that read the same compile to different windows.

A unit is mandatory. ``10`` could mean seconds (StatsD flush intervals) or milliseconds
(StatsD timers), and guessing wrong shifts every window by a factor of a thousand, so a bare
number is an error whose message says which unit to add.
"""

from __future__ import annotations

import re
from decimal import Decimal

#: Milliseconds per unit, largest first: the order compound durations must be written in and
#: the order ``format_duration_ms`` writes them in.
UNIT_MS: dict[str, int] = {
    "d": 86_400_000,
    "h": 3_600_000,
    "m": 60_000,
    "s": 1_000,
    "ms": 1,
}

#: Results are stored as PostgreSQL ``bigint`` and Spark ``LongType``; a longer duration would
#: overflow them downstream rather than here, where the message can still name the config key.
MAX_DURATION_MS = 2**63 - 1

_UNITS_TEXT = ", ".join(UNIT_MS)
_PART = re.compile(r"(\d+)(\.\d+)?([^\d.]*)", re.ASCII)
_BARE_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?", re.ASCII)


def parse_duration_ms(text: str) -> int:
    """Turn ``"1m30s"`` into ``90000``; raise ``ValueError`` with a sentence a user can act on."""
    stripped = text.strip()
    if not stripped:
        raise ValueError(f"a duration cannot be empty; write one like 10s (units: {_UNITS_TEXT})")
    if stripped.startswith("-"):
        raise ValueError(f"{stripped!r} is negative; durations are 0 or more")
    if _BARE_NUMBER.fullmatch(stripped):
        if stripped.isdigit():
            raise ValueError(
                f"{stripped} has no unit; write {stripped}s for seconds or {stripped}ms for "
                f"milliseconds (units: {_UNITS_TEXT})"
            )
        raise ValueError(
            f"{stripped} has no unit; write a whole number with a unit, like 1500ms or 2s "
            f"(units: {_UNITS_TEXT})"
        )

    total = 0
    position = 0
    previous_unit: str | None = None
    while position < len(stripped):
        part = _PART.match(stripped, position)
        if part is None or part.end() == position:
            raise ValueError(
                f"{stripped!r} is not a duration; write a number and a unit, like 10s, 250ms "
                f"or 1m30s (units: {_UNITS_TEXT})"
            )
        digits, fraction, unit = part.groups()
        if unit not in UNIT_MS:
            if not unit:
                raise ValueError(f"{stripped!r}: {digits} has no unit (units: {_UNITS_TEXT})")
            hint = ""
            if unit.strip() in UNIT_MS:
                hint = "; write it without spaces"
            elif unit.lower() in UNIT_MS:
                hint = "; units are lowercase"
            raise ValueError(f"{stripped!r}: unknown unit {unit!r} (units: {_UNITS_TEXT}){hint}")
        if fraction:
            raise ValueError(_fraction_message(stripped, digits + fraction, unit))
        if previous_unit is not None and UNIT_MS[unit] >= UNIT_MS[previous_unit]:
            raise ValueError(
                f"{stripped!r}: write each unit at most once, largest first (like 1h30m or 1s500ms)"
            )
        if len(digits) > 19:  # longer than any int64, and int() refuses >4300 digits anyway
            raise ValueError(f"{stripped!r} is too long; the limit is {MAX_DURATION_MS}ms")
        total += int(digits) * UNIT_MS[unit]
        previous_unit = unit
        position = part.end()

    if total > MAX_DURATION_MS:
        raise ValueError(f"{stripped!r} is too long; the limit is {MAX_DURATION_MS}ms")
    return total


def format_duration_ms(ms: int) -> str:
    """Write milliseconds the way a user would type them: ``90000`` -> ``1m30s``.

    Whole seconds are written with the largest units first (``1h30m``); anything with a
    millisecond part is written in milliseconds alone (``2500ms``). Used for the effective
    config and for values in error messages; ``parse_duration_ms`` reads every result back.
    """
    if isinstance(ms, bool) or not isinstance(ms, int):
        raise TypeError(f"durations are integer milliseconds, not {type(ms).__name__}")
    if ms < 0:
        raise ValueError(f"durations are 0 or more; got {ms}ms")
    if ms % 1000:
        # Sub-second values read best as one number, the way people write them: "2500ms", not
        # "2s500ms".
        return f"{ms}ms"
    if ms == 0:
        return "0s"
    parts: list[str] = []
    remaining = ms
    for unit, unit_ms in UNIT_MS.items():
        count, remaining = divmod(remaining, unit_ms)
        if count:
            parts.append(f"{count}{unit}")
    return "".join(parts)


def _fraction_message(text: str, number: str, unit: str) -> str:
    """Offer the integer spelling of ``1.5s`` when there is one; millisecond is the resolution."""
    ms = Decimal(number) * UNIT_MS[unit]
    if ms == ms.to_integral_value():
        return f"{text!r}: fractions are not supported; write {format_duration_ms(int(ms))}"
    return f"{text!r}: durations have millisecond resolution; {number}{unit} is not whole ms"
