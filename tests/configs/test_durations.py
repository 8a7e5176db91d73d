"""Durations: the text users write in configs, and the integer milliseconds the pipeline uses."""

from __future__ import annotations

import pytest

from streamgauge.configs.durations import format_duration_ms, parse_duration_ms

GOOD = [
    ("250ms", 250),
    ("1s", 1_000),
    ("10s", 10_000),
    ("5m", 300_000),
    ("1h", 3_600_000),
    ("1d", 86_400_000),
    ("1m30s", 90_000),
    ("1h30m", 5_400_000),
    ("1s500ms", 1_500),
    ("1d2h3m4s5ms", 93_784_005),
    ("0s", 0),
    ("0ms", 0),
    (" 10s ", 10_000),
]


@pytest.mark.parametrize(("text", "expected"), GOOD)
def test_parse_good(text: str, expected: int) -> None:
    parsed = parse_duration_ms(text)
    assert parsed == expected
    assert type(parsed) is int


BAD = [
    # bare numbers: the message must tell the user which unit to add
    ("10", "10 has no unit; write 10s for seconds or 10ms for milliseconds"),
    ("0", "0 has no unit; write 0s for seconds or 0ms for milliseconds"),
    ("1.5", "1.5 has no unit; write a whole number with a unit, like 1500ms or 2s"),
    ("1e3", "1e3 has no unit"),
    ("1m30", "'1m30': 30 has no unit"),
    # unknown units
    ("10sec", "'10sec': unknown unit 'sec' (units: d, h, m, s, ms)"),
    ("10us", "'10us': unknown unit 'us'"),
    ("10S", "unknown unit 'S' (units: d, h, m, s, ms); units are lowercase"),
    ("10 s", "unknown unit ' s' (units: d, h, m, s, ms); write it without spaces"),
    # empty
    ("", "a duration cannot be empty"),
    ("   ", "a duration cannot be empty"),
    # negative
    ("-5s", "'-5s' is negative; durations are 0 or more"),
    ("-5", "'-5' is negative"),
    # not a duration at all
    ("abc", "'abc' is not a duration"),
    ("s", "'s' is not a duration"),
    ("+5s", "'+5s' is not a duration"),
    # fractions: the message offers the integer spelling
    ("1.5s", "'1.5s': fractions are not supported; write 1500ms"),
    ("0.5m", "'0.5m': fractions are not supported; write 30s"),
    ("0.0001s", "millisecond resolution"),
    # compound order
    ("30s1m", "'30s1m': write each unit at most once, largest first"),
    ("1s1s", "'1s1s': write each unit at most once, largest first"),
    # too large for a bigint
    ("99999999999999999999d", "is too long"),
    ("9" * 5000 + "ms", "is too long"),
    ("106751991168d", "is too long"),
]


@pytest.mark.parametrize(("text", "message"), BAD)
def test_parse_bad(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        parse_duration_ms(text)
    assert message in str(caught.value)


FORMATTED = [
    (0, "0s"),
    (1, "1ms"),
    (250, "250ms"),
    (1_000, "1s"),
    (2_500, "2500ms"),
    (10_000, "10s"),
    (60_000, "1m"),
    (90_000, "1m30s"),
    (3_600_000, "1h"),
    (5_400_000, "1h30m"),
    (86_400_000, "1d"),
    (90_061_000, "1d1h1m1s"),
    (86_400_001, "86400001ms"),
]


@pytest.mark.parametrize(("ms", "text"), FORMATTED)
def test_format(ms: int, text: str) -> None:
    assert format_duration_ms(ms) == text
    assert parse_duration_ms(text) == ms


def test_format_round_trips() -> None:
    values = [*range(0, 3_000, 7), *range(0, 10_000_000, 61_001), 7 * 86_400_000 + 1_000]
    assert [parse_duration_ms(format_duration_ms(ms)) for ms in values] == values


@pytest.mark.parametrize(
    ("value", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError), ("1s", TypeError)]
)
def test_format_refuses_non_durations(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        format_duration_ms(value)  # type: ignore[arg-type]
