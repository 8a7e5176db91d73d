"""Fuzzing the parser and the receiver's whole-buffer path with hostile input.

``tests/ingest/test_protocol.py`` already checks, on short inputs, that ``parse_datagram``
never raises and that ``accounted() == lines``; ``tests/ingest/test_fastpath.py`` checks that
the fast and general paths agree on a grammar of near-valid lines. This goes further:

- inputs: arbitrary bytes; valid StatsD/DogStatsD datagrams mutated by byte flips, truncation,
  splicing of lines from different datagrams, huge and odd values, unicode, ``\\r\\n``, runs of
  ``:``/``|``/``#``, over-long lines;
- the parser: every non-empty line is in exactly one bucket *and the right one* (rejects carry
  their own line, a metric line has one sample per value, every sample is finite with a rate
  in (0, 1], names and tag keys in the allowed charset, tags sorted and unique); parsing is
  line-local (a datagram parses as the concatenation of its lines, and ``\\r\\n`` is ``\\n``);
- the receiver (fast path, warmed so that mutated lines hit the key cache): no exception;
  ``lines`` is the number of non-empty lines; ``accounted() == lines``; every reject and
  adjustment under a named reason; the samples in the segment log are exactly the samples it
  counted; and the same stats and partials as the general path.

Runs in seconds by default; ``STREAMGAUGE_FUZZ_EXAMPLES=20000`` (examples per test) for a long
run.
"""

from __future__ import annotations

import collections
import json
import math
import os
import socket
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamgauge.clock import ManualClock
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.guard import CardinalityLimits
from streamgauge.ingest.log import SegmentWriter, list_segments, read_segment
from streamgauge.ingest.protocol import (
    ADJUSTMENT_REASONS,
    REJECT_REASONS,
    ParseResult,
    ProtocolLimits,
    parse_datagram,
)
from streamgauge.ingest.receiver import SELF_METRIC_PREFIX, Receiver

T0 = 1_700_000_000_000
_EXAMPLES = int(os.environ.get("STREAMGAUGE_FUZZ_EXAMPLES", "0"))
_SETTINGS: dict[str, Any] = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large,
                              HealthCheck.filter_too_much],
}


def _examples(default: int) -> int:
    return _EXAMPLES or default


LIMITS = ProtocolLimits(max_line_bytes=512, max_tags=8, max_name_bytes=64, max_tag_bytes=64)

VALID_LINES = [
    b"hits:1|c", b"hits:2|c|@0.5", b"hits:3|c|#host:a,zone:z", b"lat:12.5|ms|#host:a",
    b"lat:7|ms|@0.25|#host:b", b"depth:10|g", b"depth:+5|g", b"depth:-2|g", b"req:1:2:3|d",
    b"size:4096|h", b"users:alice|s", b"users:bob|s|#team:x", b"hits:4|c|T%d" % (T0 // 1000),
    b"hits:5|c|c:abc123", b"hits:6|c|#k|e:ext|card:low", b"a.b-c/d_e:0.001|g",
    b"_e{5,4}:title|text|d:1700000000|h:host|p:low|t:error|#a:b",
    b"_sc|db.up|0|d:1700000000|h:web|#role:db|m:all good",
    b"_sc|disk|2|m:full | really|c:cid",
    # read as the Datadog agent reads them: a set member with colons, empty list items and
    # tags skipped, unknown fields ignored (and counted)
    b"users:user:42|s", b"peers:2001:db8::1|s|#k:v", b"req:1:2:|d", b"req::4|d",
    b"hits:7|c|#,k:v", b"hits:8|c|#k:v,", b"depth:3|g|#f,,z", b"hits:9|c|f:future",
    b"lat:3|ms|zz", b"_e{1,1}:a|b|x:1234", b"_sc|db.up|0|zz",
]
# Odd but meaningful pieces to splice in: huge and odd numbers, unicode, separators in runs.
PIECES = [
    b":", b"|", b"#", b",", b"@", b"\r", b"\r\n", b"\n", b"::", b"||", b"##", b"|#", b"|@",
    b"|T", b"|c:", b"_e{", b"_sc|", b"}", b"9" * 40, b"1e308", b"1e309", b"-1e999",
    b"0.0000000000000000000001", b"123456789012345", b"1234567890123456", b"-0", b"+0",
    b"nan", b"-inf", b"Infinity", b"1_000", b"\xd9\xa3", "é".encode(), "名前".encode(),
    "\U0001f4a5".encode(), b"\xff\xfe", b"\xc3", b"\x00", b"\x7f", b" ", b"\t",
    b"|@0", b"|@1.5", b"|@1e-300", b"|T99999999999999", b"|T-1", b"|f:x", b"|zz", b",,",
    b"#,", b"::1",
]


@st.composite
def mutated_datagrams(draw: st.DrawFn) -> bytes:
    """Valid lines, then a few mutations of the whole datagram."""
    lines = draw(st.lists(st.sampled_from(VALID_LINES), min_size=1, max_size=8))
    data = bytearray(b"\n".join(lines))
    for _ in range(draw(st.integers(0, 6))):
        action = draw(st.sampled_from(
            ["flip", "insert", "delete", "truncate", "splice", "piece", "repeat", "crlf",
             "long"]
        ))
        position = draw(st.integers(0, len(data)))
        if action == "flip" and position < len(data):
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif action == "insert":
            data[position:position] = bytes([draw(st.integers(0, 255))])
        elif action == "delete":
            del data[position : position + draw(st.integers(1, 8))]
        elif action == "truncate":
            del data[position:]
        elif action == "splice":  # the tail of another valid line glued in mid-line
            other = draw(st.sampled_from(VALID_LINES))
            data[position:position] = other[draw(st.integers(0, len(other))):]
        elif action == "piece":
            data[position:position] = draw(st.sampled_from(PIECES))
        elif action == "repeat":  # runs of one separator
            data[position:position] = draw(st.sampled_from([b":", b"|", b"#", b","])) * draw(
                st.integers(2, 300))
        elif action == "crlf":
            data = bytearray(bytes(data).replace(b"\n", b"\r\n"))
        else:  # over the line limit, or right at it
            data[position:position] = b"x" * draw(st.sampled_from(
                [LIMITS.max_line_bytes - 8, LIMITS.max_line_bytes, LIMITS.max_line_bytes + 1,
                 5000]))
    return bytes(data)


def datagrams() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=2000),
        mutated_datagrams(),
        st.text(max_size=200).map(lambda text: text.encode("utf-8", "surrogatepass")),
    )


def _nonempty_lines(data: bytes) -> list[bytes]:
    return [raw.rstrip(b"\r") for raw in data.split(b"\n") if raw.rstrip(b"\r")]


def _summary(result: ParseResult) -> tuple[Any, ...]:
    return (result.lines, result.metric_lines, result.rejects, result.events,
            result.service_checks)


def _check_parse(data: bytes) -> ParseResult:
    result = parse_datagram(data, LIMITS)
    lines = _nonempty_lines(data)
    assert result.lines == len(lines)
    assert result.accounted() == result.lines
    for reject in result.rejects:
        assert reject.reason in REJECT_REASONS
        # the line itself (cut to 256 bytes when it was too long to parse)
        if reject.reason == "line_too_long":
            assert any(line[:256] == reject.line and len(line) > LIMITS.max_line_bytes
                       for line in lines)
        else:
            assert reject.line in lines
    for line, samples in result.metric_lines:
        assert line in lines and len(line) <= LIMITS.max_line_bytes
        name, _, rest = line.decode("utf-8").partition(":")
        # one sample per value: a set's member is all of it, colons included; other types
        # skip empty items ("d:1::2:|d" is two values)
        values = rest.split("|")[0]
        items = [values] if samples[0].metric_type == "s" else [v for v in values.split(":") if v]
        assert len(samples) == len(items)
        for sample in samples:
            assert sample.metric == name and len(name) <= LIMITS.max_name_bytes
            assert name.isascii() and name.isprintable() and " " not in name
            assert math.isfinite(sample.value)
            assert 0.0 < sample.sample_rate <= 1.0
            keys = [key for key, _ in sample.tags]
            assert keys == sorted(set(keys)) and len(keys) <= LIMITS.max_tags + 1  # |c: adds
            if sample.metric_type == "s":
                assert sample.member == values and sample.value == 1.0
            assert sample.unknown_fields == samples[0].unknown_fields
    return result


@settings(max_examples=_examples(1000), **_SETTINGS)
@given(datagrams())
def test_every_line_lands_in_the_one_bucket_it_belongs_to(data: bytes) -> None:
    _check_parse(data)


@settings(max_examples=_examples(400), **_SETTINGS)
@given(st.lists(datagrams(), min_size=2, max_size=4))
def test_parsing_is_line_local_splicing_datagrams_concatenates_their_results(
    parts: list[bytes],
) -> None:
    """One line's garbage never changes how its neighbours parse, and ``\\r\\n`` is ``\\n``."""
    whole = _check_parse(b"\n".join(parts))
    one_by_one = ParseResult()
    for part in parts:
        parse_datagram(part, LIMITS, into=one_by_one)
    assert _summary(whole) == _summary(one_by_one)
    crlf = b"\n".join(parts).replace(b"\n", b"\r\n")
    assert _summary(parse_datagram(crlf, LIMITS)) == _summary(whole)


# -- the receiver's whole-buffer path ------------------------------------------------------


def _receiver(root: Path, sock: socket.socket, fast: bool) -> tuple[Receiver, ManualClock]:
    clock = ManualClock(T0)
    receiver = Receiver(
        sock, SegmentWriter(root, "udp-0", fsync=False), PaneCombiner(1000), clock,
        limits=LIMITS, cardinality=CardinalityLimits(max_series=40, max_series_per_metric=0),
        fast_path=fast, proc_net=root / "no-proc",
    )
    return receiver, clock


def _exact(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [tuple(v.hex() if isinstance(v, float) else v for v in row.values()) for row in rows]


def _run(root: Path, fast: bool, batches: list[list[bytes]]) -> tuple[Receiver, list[Any]]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        receiver, clock = _receiver(root, sock, fast)
        # warm the key cache: mutated copies of these lines then reach the fast path's split
        receiver._ingest_datagrams(VALID_LINES, receiver.now_ms())
        for datagrams_ in batches:
            clock.advance(400)
            receiver._ingest_datagrams(datagrams_, receiver.now_ms())
            receiver.roll(receiver.now_ms())
        receiver.roll(receiver.now_ms(), closed=True)
    rows = [row for segment in list_segments(root, "udp-0")
            for batch in read_segment(segment) for row in batch.to_pylist()]
    return receiver, rows


@settings(max_examples=_examples(100), **_SETTINGS)
@given(batches=st.lists(st.lists(datagrams(), min_size=1, max_size=6), min_size=1, max_size=4))
def test_the_receiver_accounts_every_line_and_logs_every_sample_it_counts(
    tmp_path_factory: Any, batches: list[list[bytes]],
) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    outcomes = []
    for fast in (True, False):
        receiver, rows = _run(root / str(fast), fast, batches)
        stats = receiver.stats
        sent = [VALID_LINES, *batches]
        assert stats.lines == sum(len(_nonempty_lines(d)) for b in sent for d in b)
        assert stats.lines == stats.accounted()
        assert set(stats.rejected) <= set(REJECT_REASONS)
        assert set(stats.adjusted) <= set(ADJUSTMENT_REASONS)
        assert all(n > 0 for n in (*stats.rejected.values(), *stats.adjusted.values()))
        data_rows = [r for r in rows if not r["metric"].startswith(SELF_METRIC_PREFIX)]
        assert sum(r["count"] for r in data_rows) == stats.samples  # nothing lost in between
        assert stats.samples >= stats.metric_lines
        assert stats.series_active <= 40
        # the self-metrics in the log say the same as the stats
        logged: dict[tuple[str, str], float] = collections.defaultdict(float)
        for r in rows:
            if r["metric"].startswith(SELF_METRIC_PREFIX) and r["metric_type"] == "c":
                logged[(r["metric"][len(SELF_METRIC_PREFIX):], r["tags"])] += r["sum"]
        assert logged[("lines", "{}")] == stats.lines
        assert logged[("samples", "{}")] == stats.samples
        for kind in ("rejected", "adjusted"):
            for reason, n in getattr(stats, kind).items():
                assert logged[(kind, json.dumps({"reason": reason}, separators=(",", ":")))] == n
        outcomes.append((_exact(rows), stats.to_json()))
    assert outcomes[0] == outcomes[1]
