"""The parser as two tables: lines it accepts (with what they mean) and lines it rejects (why)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamgauge.ingest.protocol import (
    REJECT_REASONS,
    Event,
    ParseResult,
    ProtocolLimits,
    Reject,
    Sample,
    ServiceCheck,
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
    (
        b"x:1|c|#a:b|c:abc123",  # container joins the tags, wherever the fields come
        [Sample("x", "c", 1.0, 1.0, (("a", "b"), ("container", "abc123")))],
    ),
    (
        b"x:1|c|c:abc|#container:mine",  # an explicit tag wins over the origin id
        [Sample("x", "c", 1.0, 1.0, (("container", "mine"),))],
    ),
    (b"x:1|c|T1700000000", [Sample("x", "c", 1.0, 1.0, (), timestamp_ms=1_700_000_000_000)]),
    (b"x:2|g|T0", [Sample("x", "g", 2.0, 1.0, (), timestamp_ms=0)]),  # skew is the receiver's
    (b"x:1|c|e:it-false,cn-x|card:high", [Sample("x", "c", 1.0, 1.0, ())]),  # DogStatsD 1.3
    (b"x:1|c|", [Sample("x", "c", 1.0, 1.0, ())]),  # a trailing separator
    (b"x:1e3|ms", [Sample("x", "ms", 1000.0, 1.0, ())]),
    (b"x:.5|h", [Sample("x", "h", 0.5, 1.0, ())]),
    (b"x:1|c|#url:http://a/b?c=1", [Sample("x", "c", 1.0, 1.0, (("url", "http://a/b?c=1"),))]),
    (b"x:1|c|#k:caf\xc3\xa9 au lait", [Sample("x", "c", 1.0, 1.0, (("k", "caf\u00e9 au lait"),))]),
    (b"a/b-c_d.e:1|c", [Sample("a/b-c_d.e", "c", 1.0, 1.0, ())]),
    # sets: the member is a string, any printable text (numbers stay text: "42" is not 42.0)
    (b"users:u-42|s|#env:prod",
     [Sample("users", "s", 1.0, 1.0, (("env", "prod"),), member="u-42")]),
    # one member, colons and all: sets take no multi-value list
    (b"users:42:caf\xc3\xa9|s", [Sample("users", "s", 1.0, 1.0, (), member="42:caf\u00e9")]),
    (b"users:user:42|s", [Sample("users", "s", 1.0, 1.0, (), member="user:42")]),
    (b"peers:2001:db8::1|s|#k:v",
     [Sample("peers", "s", 1.0, 1.0, (("k", "v"),), member="2001:db8::1")]),
    (b"users:+10|s", [Sample("users", "s", 1.0, 1.0, (), member="+10")]),
    (b"users::|s", [Sample("users", "s", 1.0, 1.0, (), member=":")]),
    # an empty item of a multi-value list is skipped, for every type but sets
    (b"d:1:2:|d", [Sample("d", "d", v, 1.0, ()) for v in (1.0, 2.0)]),
    (b"x:1::2|ms", [Sample("x", "ms", v, 1.0, ()) for v in (1.0, 2.0)]),
    (b"x::5|c", [Sample("x", "c", 5.0, 1.0, ())]),
    (b"g:+1:|g", [Sample("g", "g", 1.0, 1.0, (), delta=True)]),
    # empty tags are skipped
    (b"x:1|c|#,k:v", [Sample("x", "c", 1.0, 1.0, (("k", "v"),))]),
    (b"x:1|c|#k:v,", [Sample("x", "c", 1.0, 1.0, (("k", "v"),))]),
    (b"a:1|g|#f,,z", [Sample("a", "g", 1.0, 1.0, (("f", ""), ("z", "")))]),
    (b"a:1|g|#,", [Sample("a", "g", 1.0, 1.0, ())]),
    # fields this parser does not know are ignored (and counted by the receiver)
    (b"x:1|c|f:future", [Sample("x", "c", 1.0, 1.0, (), unknown_fields=1)]),
    (b"x:1|c|#k:v|zz|m:1", [Sample("x", "c", 1.0, 1.0, (("k", "v"),), unknown_fields=2)]),
    (b"u:a:b|s|f:x", [Sample("u", "s", 1.0, 1.0, (), member="a:b", unknown_fields=1)]),
]

BAD = [
    (b"api.requests", "malformed_line"),  # no value
    (b"api.requests:1", "malformed_line"),  # no type
    (b"foo:1||", "malformed_line"),  # empty type
    (b":1|c", "malformed_line"),  # empty name
    (b"bad name:1|c", "invalid_name"),
    (b"x:1|q", "unknown_type"),
    (b"x:|s", "invalid_value"),  # a set member must not be empty
    (b"x:a\x01b|s", "invalid_value"),  # nor hold control characters
    (b"x:abc|c", "invalid_value"),
    (b"x:|c", "invalid_value"),
    (b"x:nan|g", "nan_value"),
    (b"x:inf|ms", "nan_value"),
    (b"x:1|c|@0", "invalid_sample_rate"),
    (b"x:1|c|@1.5", "invalid_sample_rate"),
    (b"x:1|c|@fast", "invalid_sample_rate"),
    (b"x:1|c|#" + b",".join(b"t%d:v" % i for i in range(65)), "too_many_tags"),
    (b"x:1|c|#:v", "invalid_tag"),
    (b"x:1|c|#a,:v", "invalid_tag"),
    (b"x:1|c|#" + b",".join(b"t%d:v" % i for i in range(65)) + b",,", "too_many_tags"),
    (b"\xff\xfe:1|c", "malformed_line"),
    (b"x|c", "malformed_line"),  # no colon at all
    (b"caf\xc3\xa9:1|c", "invalid_name"),  # non-ASCII name
    (b"a" * 251 + b":1|c", "invalid_name"),  # name too long
    (b"x\ty:1|c", "invalid_name"),
    (b"x:1|C", "unknown_type"),  # types are case-sensitive
    (b"x:1|c|@", "invalid_sample_rate"),
    (b"x:1|c|@ 0.5", "invalid_sample_rate"),
    (b"x:1|c|@-0.5", "invalid_sample_rate"),
    (b"x:1_000|c", "invalid_value"),  # float() would take it
    (b"x: 1|c", "invalid_value"),  # float() would strip it
    (b"x:0x10|c", "invalid_value"),
    (b"x:\xd9\xa3|c", "invalid_value"),  # an Arabic-Indic digit: float() takes it
    (b"d::|d", "invalid_value"),  # only empty items: no value at all
    (b"x:1:abc|d", "invalid_value"),
    (b"x:1e999|g", "nan_value"),  # overflows to inf
    (b"x:-inf|g", "nan_value"),
    (b"x:NaN|ms", "nan_value"),
    (b"x:1|c|T", "invalid_timestamp"),
    (b"x:1|c|T-5", "invalid_timestamp"),
    (b"x:1|c|T17e8", "invalid_timestamp"),
    (b"x:1|c|T1700000000.5", "invalid_timestamp"),
    (b"x:1|c|#bad key:v", "invalid_tag"),
    (b"x:1|c|#caf\xc3\xa9:v", "invalid_tag"),  # non-ASCII key
    (b"x:1|c|#k:a\x00b", "invalid_tag"),  # NUL: PostgreSQL jsonb refuses \u0000
    (b"x:1|c|#k:" + b"v" * 300, "invalid_tag"),
    (b"x:1|c|c:a\x01b", "invalid_tag"),
    (b"_e{5,4}:hello|wor", "invalid_event"),  # text shorter than its length
    (b"_e{5}:hello|x", "invalid_event"),
    (b"_e{a,b}:x|y", "invalid_event"),
    (b"_e{0,1}:|x", "invalid_event"),  # no title
    (b"_e{1,1}:ab|c", "invalid_event"),  # length cuts the title
    (b"_e{1,1}:a|bc", "invalid_event"),  # garbage after the text
    (b"_e{1,1}:a|b|p:urgent", "invalid_event"),
    (b"_e{1,1}:a|b|t:fatal", "invalid_event"),
    (b"_e{1,1}:a|b|d:yesterday", "invalid_event"),
    (b"_e{1,1}:a|b|#:x", "invalid_event"),
    (b"_e{2,1}:\xc3|b", "invalid_event"),  # a length that splits a character
    (b"_e{1,1}", "invalid_event"),
    (b"_sc|", "invalid_service_check"),
    (b"_sc|db", "invalid_service_check"),
    (b"_sc|db|7", "invalid_service_check"),
    (b"_sc|bad name|0", "invalid_service_check"),
    (b"_sc|db|0|d:soon", "invalid_service_check"),
    (b"_sc|db|\xff", "invalid_service_check"),
]

EVENTS = [
    (b"_e{5,5}:hello|world", Event("hello", "world")),
    (
        b"_e{5,11}:hello|line\\nline2|d:1700000000|h:web-1|k:deploy|p:low|s:jenkins|t:error"
        b"|#env:prod,team|c:cid",
        Event(
            "hello", "line\nline2", 1_700_000_000_000, "web-1", "deploy", "low", "jenkins",
            "error", (("container", "cid"), ("env", "prod"), ("team", "")),
        ),
    ),
    (b"_e{5,5}:caf\xc3\xa9|\xc3\xa9t\xc3\xa9", Event("caf\u00e9", "\u00e9t\u00e9")),  # UTF-8 bytes
    (b"_e{3,0}:a|b|", Event("a|b", "")),  # a title may contain "|"
    (b"_e{1,1}:a|b|#,x", Event("a", "b", tags=(("x", ""),))),  # an empty tag is skipped
    (b"_e{1,1}:a|b|x:1234|zz", Event("a", "b", unknown_fields=2)),  # ignored, counted
]

SERVICE_CHECKS = [
    (b"_sc|db.up|0", ServiceCheck("db.up", 0)),
    (
        b"_sc|db.up|2|d:1700000000|h:db-1|#env:prod|m:disk full | really\\nfull|c:cid",
        ServiceCheck(
            "db.up", 2, 1_700_000_000_000, "db-1", (("container", "cid"), ("env", "prod")),
            "disk full | really\nfull",
        ),
    ),
    (b"_sc|db.up|3|card:low", ServiceCheck("db.up", 3)),
    (b"_sc|db.up|0|zz|#,k:v", ServiceCheck("db.up", 0, tags=(("k", "v"),), unknown_fields=1)),
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


@pytest.mark.parametrize(("line", "expected"), EVENTS, ids=[e[0][:30].decode() for e in EVENTS])
def test_events_are_parsed(line: bytes, expected: Event) -> None:
    assert parse_line(line) == expected


@pytest.mark.parametrize(
    ("line", "expected"), SERVICE_CHECKS, ids=[c[0][:30].decode() for c in SERVICE_CHECKS]
)
def test_service_checks_are_parsed(line: bytes, expected: ServiceCheck) -> None:
    assert parse_line(line) == expected


def test_events_and_service_checks_with_unknown_fields_are_listed_as_adjusted() -> None:
    """They are kept, and listed for the receiver to count; a metric line's unknown fields
    are on its samples (the receiver may still reject the line)."""
    datagram = b"_e{1,1}:a|b|zz\n_sc|db|0|x:1\n_e{1,1}:a|b\nm:1|c|zz\n_sc|db|9|zz"
    result = parse_datagram(datagram)
    assert result.adjusted == [("unknown_field", b"_e{1,1}:a|b|zz"),
                               ("unknown_field", b"_sc|db|0|x:1")]
    assert [s.unknown_fields for s in result.samples] == [1]
    assert [r.reason for r in result.rejects] == ["invalid_service_check"]
    assert result.accounted() == result.lines == 5


def test_every_line_lands_in_exactly_one_bucket() -> None:
    datagram = b"\n".join(
        [b"a:1:2|d", b"_e{1,1}:t|x", b"_sc|db|0", b"bad", b"x:1|q", b"", b"b:1|c"]
    )
    result = parse_datagram(datagram)
    assert result.lines == 6
    assert (len(result.metric_lines), len(result.events), len(result.service_checks)) == (2, 1, 1)
    assert [r.reason for r in result.rejects] == ["malformed_line", "unknown_type"]
    assert len(result.samples) == 3
    assert result.accounted() == result.lines


# -- property: arbitrary bytes and mutated valid datagrams never raise, and every line is
# accepted or counted under exactly one reason.

_VALID_LINES = [g[0] for g in GOOD] + [e[0] for e in EVENTS] + [c[0] for c in SERVICE_CHECKS]
_ALPHABET = b":|@#,.T_e{}sc\r\n-+0123456789abcxyz \x00\xff"


@st.composite
def _mutated_datagrams(draw: st.DrawFn) -> bytes:
    lines = draw(st.lists(st.sampled_from(_VALID_LINES), min_size=1, max_size=5))
    data = bytearray(b"\n".join(lines))
    for _ in range(draw(st.integers(0, 6))):
        position = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["insert", "delete", "replace"]))
        byte = draw(st.sampled_from(_ALPHABET))
        if action == "insert":
            data.insert(position, byte)
        elif position < len(data):
            if action == "delete":
                del data[position]
            else:
                data[position] = byte
    return bytes(data)


def _check_accounting(datagram: bytes) -> None:
    limits = ProtocolLimits(max_line_bytes=200, max_tags=4)
    result = parse_datagram(datagram, limits)
    expected_lines = sum(1 for raw in datagram.split(b"\n") if raw.rstrip(b"\r"))
    assert result.lines == expected_lines
    assert result.accounted() == result.lines
    assert all(r.reason in REJECT_REASONS for r in result.rejects)
    for _, samples in result.metric_lines:
        assert samples and all(isinstance(s, Sample) for s in samples)
    assert isinstance(result, ParseResult)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=300))
def test_arbitrary_bytes_never_raise_and_every_line_is_accounted(datagram: bytes) -> None:
    _check_accounting(datagram)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_mutated_datagrams())
def test_mutated_valid_datagrams_never_raise_and_every_line_is_accounted(datagram: bytes) -> None:
    _check_accounting(datagram)
