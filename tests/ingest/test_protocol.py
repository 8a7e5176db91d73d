"""The parser as two tables: lines it accepts (with what they mean) and lines it rejects (why)."""

from __future__ import annotations

import pytest

from streamgauge.ingest.protocol import (
    REJECT_REASONS,
    ProtocolLimits,
    Reject,
    Sample,
    parse_datagram,
    parse_line,
)

GOOD = [
    (b"api.requests:1|c", [Sample("api.requests", "c", 1.0, 1.0, ())]),
    (b"api.requests:3|c|@0.5", [Sample("api.requests", "c", 3.0, 0.5, ())]),
    (b"api.requests:-2|c", [Sample("api.requests", "c", -2.0, 1.0, ())]),
    (b"queue.depth:42|g", [Sample("queue.depth", "g", 42.0, 1.0, ())]),
    (b"queue.depth:+3|g", [Sample("queue.depth", "g", 3.0, 1.0, (), delta=True)]),
    (b"queue.depth:-3|g", [Sample("queue.depth", "g", -3.0, 1.0, (), delta=True)]),
    (b"api.latency:12.5|ms", [Sample("api.latency", "ms", 12.5, 1.0, ())]),
    (b"api.latency:12|ms|@0.1", [Sample("api.latency", "ms", 12.0, 0.1, ())]),
    (b"size:512|h", [Sample("size", "h", 512.0, 1.0, ())]),
    (
        b"api.latency:1:2:3|d|#env:prod,host:a",
        [
            Sample("api.latency", "d", v, 1.0, (("env", "prod"), ("host", "a")))
            for v in (1.0, 2.0, 3.0)
        ],
    ),
    (b"x:1|c|#flag", [Sample("x", "c", 1.0, 1.0, (("flag", ""),))]),
    (b"x:1|c|c:abc123", [Sample("x", "c", 1.0, 1.0, (("container", "abc123"),))]),
    (b"x:1|c|T1700000000", [Sample("x", "c", 1.0, 1.0, ())]),
]

BAD = [
    (b"api.requests", "malformed_line"),  # no value
    (b"api.requests:1", "malformed_line"),  # no type
    (b"foo:1||", "malformed_line"),  # empty type
    (b":1|c", "malformed_line"),  # empty name
    (b"bad name:1|c", "invalid_name"),
    (b"x:1|q", "unknown_type"),
    (b"x:1|s", "unsupported_type"),  # sets arrive with the HyperLogLog slice
    (b"x:abc|c", "invalid_value"),
    (b"x:|c", "invalid_value"),
    (b"x:nan|g", "nan_value"),
    (b"x:inf|ms", "nan_value"),
    (b"x:1|c|@0", "invalid_sample_rate"),
    (b"x:1|c|@1.5", "invalid_sample_rate"),
    (b"x:1|c|@fast", "invalid_sample_rate"),
    (b"x:1|c|#" + b",".join(b"t%d:v" % i for i in range(65)), "too_many_tags"),
    (b"x:1|c|#:v", "invalid_tag"),
    (b"x:1|c|zzz", "malformed_line"),
    (b"\xff\xfe:1|c", "malformed_line"),
]


@pytest.mark.parametrize(("line", "expected"), GOOD, ids=[g[0].decode() for g in GOOD])
def test_good_lines(line: bytes, expected: list[Sample]) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize(("line", "reason"), BAD, ids=[b[0][:40].decode("latin-1") for b in BAD])
def test_bad_lines_are_rejected_with_their_reason(line: bytes, reason: str) -> None:
    assert reason in REJECT_REASONS
    assert parse_line(line) == Reject(reason, line)


def test_a_datagram_of_many_lines_parses_each_and_keeps_going_after_a_bad_one() -> None:
    result = parse_datagram(b"a:1|c\r\nb:oops|c\n\nc:2|g\n")
    assert result.lines == 3
    assert [s.metric for s in result.samples] == ["a", "c"]
    assert result.rejects == [Reject("invalid_value", b"b:oops|c")]


def test_overlong_lines_are_rejected_without_parsing() -> None:
    limits = ProtocolLimits(max_line_bytes=20)
    result = parse_datagram(b"short:1|c\n" + b"x" * 30 + b":1|c", limits)
    assert [s.metric for s in result.samples] == ["short"]
    assert [r.reason for r in result.rejects] == ["line_too_long"]
