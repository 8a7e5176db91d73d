"""Conformance with the servers StatsD/DogStatsD clients come from, as one table.

Each row is a case taken from a peer's own test suite (cited by project, file and test name):
the datagram, what that peer's test expects, and what streamgauge does with it — asserted at
two public seams, ``parse_datagram`` (the samples, or the reject) and a ``UdpReceiver`` fed
the datagram over UDP (the stats, and the partial in the segment log). Where the peers
disagree streamgauge reads a line as the Datadog agent does; a row where streamgauge does
not do what its peer expects names the difference (``differs``), and every such difference
is listed in ``docs/conformance.md``.

``CLIENT_CASES`` send through the real clients (datadogpy's ``DogStatsd``, the ``statsd``
package) and check the exact bytes they put on the wire before the receiver reads them.
"""

from __future__ import annotations

import collections
import json
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import statsd
from datadog.dogstatsd.base import DogStatsd

from streamgauge.clock import ManualClock
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import SegmentWriter, list_segments, read_segment
from streamgauge.ingest.protocol import ADJUSTMENT_REASONS, REJECT_REASONS, parse_datagram
from streamgauge.ingest.receiver import SELF_METRIC_PREFIX, UdpReceiver, bind_udp
from streamgauge.sketches.hll import estimate

#: The receive clock: near the ``|T`` timestamps of the Datadog agent's cases (within skew).
RECV_MS = 1_657_100_500_000
CONFORMANCE_DOC = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"

Tags = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Kept:
    """Aggregated: one series, one sample per value (a number, or a set's member)."""

    metric: str
    kind: str
    values: tuple[float | str, ...]
    tags: Tags = ()
    rate: float = 1.0
    timestamp_s: int | None = None
    adjusted: tuple[str, ...] = ()  # one entry per line adjusted, by reason
    last: float | None = None  # gauges: the value after all lines (default: the last value)


@dataclass(frozen=True)
class Rejected:
    """Not aggregated: a counted reject."""

    reason: str


@dataclass(frozen=True)
class Counted:
    """An event or a service check: parsed and counted, not stored."""

    kind: str  # "events" or "service_checks"
    adjusted: tuple[str, ...] = ()


Expected = Kept | Rejected | Counted


@dataclass(frozen=True)
class Case:
    source: str  # project: file: test
    datagram: bytes
    peer: str  # what the peer's test expects
    stored: Expected  # what streamgauge does
    differs: str = ""  # the docs/conformance.md difference this row shows, if any


DD = "datadog-agent: comp/dogstatsd/server/impl/"
SE = "statsd_exporter: pkg/line/line_test.go: TestLineToEvents"
GO = "gostatsd: pkg/statsd/lexer_test.go: "
ETSY = "Etsy statsd: test/graphite_tests.js: "
TG = "telegraf: plugins/inputs/statsd/"
VEC = "vector: src/sources/statsd/parser.rs: "
CID = "2a25f7fc8fbf573d62053d7263dd2d440c07b6ab4d2b107e50b0d4df1f2ee15f"
UNK = ("unknown_field",)

CASES = [
    # -- the Datadog agent: the reference where peers disagree
    Case(DD + "parse_metrics_test.go: TestParseSetMultiple", b"daemon:abc:def|s",
         "one set member abc:def (':' is part of a set's value)",
         Kept("daemon", "s", ("abc:def",))),
    Case(DD + "parse_metrics_test.go: TestParseSetUnicode",
         "daemon:♬†øU†øU¥ºuT0♪|s".encode(), "one member, as sent",
         Kept("daemon", "s", ("♬†øU†øU¥ºuT0♪",))),
    Case(DD + "parse_metrics_test.go: TestParseGaugeMultiple", b"daemon:666:777|g",
         "values 666, 777", Kept("daemon", "g", (666.0, 777.0))),
    Case(DD + "parse_metrics_test.go: TestParseCounterMultiple", b"daemon:666:777|c",
         "values 666, 777", Kept("daemon", "c", (666.0, 777.0))),
    Case(DD + "parse_metrics_test.go: TestParseHistogramrMultiple", b"daemon:21:22|h",
         "values 21, 22", Kept("daemon", "h", (21.0, 22.0))),
    Case(DD + "parse_metrics_test.go: TestParseCounterWithTags",
         b"custom_counter:1|c|#protocol:http,bench", "tags protocol:http, bench",
         Kept("custom_counter", "c", (1.0,), (("bench", ""), ("protocol", "http")))),
    Case(DD + "parse_metrics_test.go: TestParseGaugeWithPoundOnly", b"daemon:666|g|#",
         "no tags", Kept("daemon", "g", (666.0,))),
    Case(DD + "parse_metrics_test.go: TestParseGaugeWithSampleRate", b"daemon:666|g|@0.21",
         "666, sample rate 0.21", Kept("daemon", "g", (666.0,), rate=0.21)),
    Case(DD + "parse_metrics_test.go: TestParseGaugeWithUnicode",
         "♬†øU†øU¥ºuT0♪:666|g|#intitulé:T0µ".encode(), "kept, name and tag as sent",
         Rejected("invalid_name"), differs="names"),
    Case(DD + "parse_metrics_test.go: TestParseMetricError", b"daemon:666", "error",
         Rejected("malformed_line")),
    Case(DD + "parse_metrics_test.go: TestParseMetricError", b"daemon:666|", "error",
         Rejected("malformed_line")),
    Case(DD + "parse_metrics_test.go: TestParseMetricError", b"daemon:|g", "error",
         Rejected("invalid_value")),
    Case(DD + "parse_metrics_test.go: TestParseMetricError", b":666|g", "error",
         Rejected("malformed_line")),
    Case(DD + "parse_metrics_test.go: TestParseMetricError", b"abc666|g", "error",
         Rejected("malformed_line")),
    Case(DD + "parse_metrics_test.go: TestParseMetricError (unknown metadata prefix)",
         b"daemon:666|g|m:test", "kept, the field ignored",
         Kept("daemon", "g", (666.0,), adjusted=UNK)),
    Case(DD + "parse_metrics_test.go: TestParseMetricError", b"daemon:abc|g", "error",
         Rejected("invalid_value")),
    Case(DD + "parse_metrics_test.go: TestParseMetricError", b"daemon:666|unknown", "error",
         Rejected("unknown_type")),
    Case(DD + "parse_metrics_test.go: TestParseMetricError", b"daemon:666|g|@abc", "error",
         Rejected("invalid_sample_rate")),
    Case(DD + "parse_metrics_test.go: TestParseGaugeWithTimestamp",
         b"metric:1234|g|#onetag|T1657100430", "tag onetag, timestamp 1657100430",
         Kept("metric", "g", (1234.0,), (("onetag", ""),), timestamp_s=1657100430)),
    Case(DD + "parse_metrics_test.go: TestParseGaugeWithTimestamp",
         b"metric:1234|g|#|T1657100430", "no tags, timestamp 1657100430",
         Kept("metric", "g", (1234.0,), timestamp_s=1657100430)),
    Case(DD + "parse_metrics_test.go: TestParseGaugeWithTimestamp",
         b"metric:1234|g|T1657100540|@0.25|#atag", "tag atag, rate 0.25, timestamp 1657100540",
         Kept("metric", "g", (1234.0,), (("atag", ""),), 0.25, 1657100540)),
    Case(DD + "parse_metrics_test.go: TestParseGaugeTimestampMalformed",
         b"metric:1234|g|#onetag|TABCD", "error", Rejected("invalid_timestamp")),
    Case(DD + "parse_metrics_test.go: TestParseGaugeTimestampMalformed",
         b"metric:1234|g|#onetag|T-102348932", "error", Rejected("invalid_timestamp")),
    Case(DD + "parse_metrics_test.go: TestParseManyPipes (2 future extensions, 7 pipes)",
         b"example.metric:2.39283|d|T1657100540|@1.000000|#environment:dev|c:" + CID.encode()
         + b"|f:wowthisisacoolfeature|f2:omgthisoneiscooler",
         "kept: tag environment:dev, the container id as origin, the extensions ignored",
         Kept("example.metric", "d", (2.39283,), (("container", CID), ("environment", "dev")),
              timestamp_s=1657100540, adjusted=UNK),
         differs="container"),
    Case(DD + "parse_test.go: TestUnsafeParseFloatList (1.1234:41:)", b"daemon:1.1234:41:|d",
         "values 1.1234, 41 (an empty item skipped)", Kept("daemon", "d", (1.1234, 41.0))),
    Case(DD + "parse_test.go: TestUnsafeParseFloatList (1.1234::41)", b"daemon:1.1234::41|d",
         "values 1.1234, 41", Kept("daemon", "d", (1.1234, 41.0))),
    Case(DD + "parse_test.go: TestUnsafeParseFloatList (:1.1234::41)",
         b"daemon::1.1234::41|d", "values 1.1234, 41", Kept("daemon", "d", (1.1234, 41.0))),
    Case(DD + "parse_events_test.go: TestEventError (unknown metadata)",
         b"_e{5,4}:title|text|x:1234", "kept, the field ignored", Counted("events", UNK)),
    Case(DD + "parse_events_test.go: TestEventError (invalid priority)",
         b"_e{5,4}:title|text|p:urgent", "kept, the field ignored",
         Rejected("invalid_event"), differs="event-field-values"),
    Case(DD + "parse_events_test.go: TestEventEmptyTextWithAlertType",
         b"_e{10,0}:test title||t:warning", "kept: empty text, alert type warning",
         Counted("events")),
    Case(DD + "parse_events_test.go: TestEventEmptyTitle", b"_e{0,9}:|test text", "error",
         Rejected("invalid_event")),
    Case(DD + "parse_service_checks_test.go: TestServiceCheckError (unknown metadata)",
         b"_sc|agent.up|0|u:unknown", "kept, the field ignored",
         Counted("service_checks", UNK)),
    Case(DD + "parse_service_checks_test.go: TestServiceCheckError (invalid timestamp)",
         b"_sc|agent.up|0|d:some_time", "kept, the field ignored",
         Rejected("invalid_service_check"), differs="event-field-values"),
    Case(DD + "parse_service_checks_test.go: TestServiceCheckError", b"_sc|agent.up|OK",
         "error", Rejected("invalid_service_check")),
    # -- statsd_exporter
    Case(SE + " (datadog tag extension with empty tags)", b"foo:100|c|#tag:value,,",
         "labels tag=value", Kept("foo", "c", (100.0,), (("tag", "value"),))),
    Case(SE + " (datadog tag extension with multiple colons)", b"foo:100|c|@0.1|#tag1:foo:bar",
         "counter 1000, label tag1=foo:bar",
         Kept("foo", "c", (100.0,), (("tag1", "foo:bar"),), rate=0.1)),
    Case(SE + " (datadog tag extension with # in all keys, as sent by datadog php client)",
         b"foo:100|c|#tag1:bar,#tag2:baz", "labels tag1=bar, tag2=baz",
         Rejected("invalid_tag"), differs="tag-keys"),
    Case(SE + " (datadog tag extension with valueless tags: ignored)",
         b"foo:100|c|#tag_without_a_value", "no labels (the bare tag dropped)",
         Kept("foo", "c", (100.0,), (("tag_without_a_value", ""),)), differs="bare-tags"),
    Case(SE + " (datadog timings with extended aggregation values)",
         b"foo_timing:0.5:120:3000:10:20000:0.01|ms|#tag1:bar,tag2:baz",
         "6 observations, in seconds (0.0005 ... 0.00001)",
         Kept("foo_timing", "ms", (0.5, 120.0, 3000.0, 10.0, 20000.0, 0.01),
              (("tag1", "bar"), ("tag2", "baz"))),
         differs="timer-units"),
    Case(SE + " (datadog counter with invalid extended aggregation values)",
         b"foo_counter:0.5:120:3000:10:20000:0.01|c|#tag1:bar,tag2:baz", "no events",
         Kept("foo_counter", "c", (0.5, 120.0, 3000.0, 10.0, 20000.0, 0.01),
              (("tag1", "bar"), ("tag2", "baz"))),
         differs="multi-value-counters"),
    Case(SE + " (timings with sampling factor)", b"foo.timing:0.5|ms|@0.1",
         "10 observations of 0.0005 s", Kept("foo.timing", "ms", (0.5,), rate=0.1),
         differs="sampled-timers"),
    Case(SE + " (illegal sampling factor)", b"foo:1|c|@bar", "counter 1 (rate ignored)",
         Rejected("invalid_sample_rate"), differs="bad-sample-rate"),
    Case(SE + " (zero sampling factor)", b"foo:2|c|@0", "counter 2 (rate ignored)",
         Rejected("invalid_sample_rate"), differs="bad-sample-rate"),
    Case(SE + " (empty component)", b"foo:1|c|", "no events", Kept("foo", "c", (1.0,)),
         differs="trailing-pipe"),
    Case(SE + " (bad value)", b"foo:1o|c", "no events", Rejected("invalid_value")),
    Case(SE + " (illegal stat type)", b"foo:2|t", "no events", Rejected("unknown_type")),
    Case(SE + " (invalid utf8)", b"invalid\xc3\x28utf8:1|c", "no events",
         Rejected("malformed_line")),
    Case(SE + " (dogstatsd container ID extension)", b"foo:100|c|#tag1:value|c:container123",
         "labels tag1=value, container_id=container123",
         Kept("foo", "c", (100.0,), (("container", "container123"), ("tag1", "value"))),
         differs="container"),
    Case(SE + " (dogstatsd container ID malformed - no colon)", b"foo:100|c|#tag1:value|c",
         "no events", Kept("foo", "c", (100.0,), (("tag1", "value"),), adjusted=UNK),
         differs="unknown-fields"),
    # -- gostatsd
    Case(GO + "TestMetricsLexer", b"a:1|g|#f,,", "tags f", Kept("a", "g", (1.0,), (("f", ""),))),
    Case(GO + "TestMetricsLexer", b"a:1|g|#,,f", "tags f", Kept("a", "g", (1.0,), (("f", ""),))),
    Case(GO + "TestMetricsLexer", b"a:1|g|#f,,z", "tags f, z",
         Kept("a", "g", (1.0,), (("f", ""), ("z", "")))),
    Case(GO + "TestMetricsLexer", b"a:1|g|#,", "no tags", Kept("a", "g", (1.0,))),
    Case(GO + "TestMetricsLexer", b"a:1|g|#,,", "no tags", Kept("a", "g", (1.0,))),
    Case(GO + "TestMetricsLexer", b"smp.rte:5|c|@0.1|#foo:bar,baz", "counter 50, tags foo:bar, baz",
         Kept("smp.rte", "c", (5.0,), (("baz", ""), ("foo", "bar")), rate=0.1)),
    Case(GO + "TestMetricsLexer", b"un1qu3:john|s|#some:42", "set member john, tag some:42",
         Kept("un1qu3", "s", ("john",), (("some", "42"),))),
    Case(GO + "TestMetricsLexer", b"smp gge:1|g", "gauge named smp_gge",
         Rejected("invalid_name"), differs="names"),
    Case(GO + "TestInvalidMetricsLexer", b"NaN.should.be:NaN|g", "error",
         Rejected("nan_value")),
    Case(GO + "TestInvalidMetricsLexer", b"foo.bar.baz:1|q", "error", Rejected("unknown_type")),
    # -- Etsy statsd
    Case(ETSY + "send_malformed_post", b"a_bad_test_value|z", "bad_lines_seen 1",
         Rejected("malformed_line")),
    Case(ETSY + "sampled_timers_are_valid", b"a_test_value:100|ms|@0.1", "count 10",
         Kept("a_test_value", "ms", (100.0,), rate=0.1), differs="sampled-timers"),
    Case(ETSY + "gauge_modifications_are_valid", b"test_value:50|g\ntest_value:-3|g",
         "gauge 47", Kept("test_value", "g", (50.0, -3.0), last=47.0)),
    Case(ETSY + "metric_names_are_sanitized", b"b ar:250|c", "counter named b_ar",
         Rejected("invalid_name"), differs="names"),
    Case(ETSY + "metric_names_are_sanitized", b"fo/o:250|c", "counter named fo-o",
         Kept("fo/o", "c", (250.0,)), differs="names"),
    # -- telegraf
    Case(TG + "statsd_test.go: TestParse_InvalidLines", b"i.dont.have.a.pipe:45g", "error",
         Rejected("malformed_line")),
    Case(TG + "statsd_test.go: TestParse_InvalidLines", b"invalid.plus.minus.non.gauge:+10|s",
         "error", Kept("invalid.plus.minus.non.gauge", "s", ("+10",)), differs="signed-values"),
    Case(TG + "statsd_test.go: TestParse_InvalidLines", b"invalid.plus.minus.non.gauge:+10|ms",
         "error", Kept("invalid.plus.minus.non.gauge", "ms", (10.0,)), differs="signed-values"),
    Case(TG + "statsd_test.go: TestParse_InvalidSampleRate", b"invalid.sample.rate:45|c|0.1",
         "kept, the rate ignored", Kept("invalid.sample.rate", "c", (45.0,), adjusted=UNK)),
    Case(TG + "statsd_test.go: TestParse_InvalidSampleRate", b"invalid.sample.rate.2:45|c|@foo",
         "kept, the rate ignored", Rejected("invalid_sample_rate"), differs="bad-sample-rate"),
    Case(TG + "statsd_test.go: TestParse_InvalidSampleRate", b"invalid.sample.rate:45|s|@0.1",
         "kept", Kept("invalid.sample.rate", "s", ("45",), rate=0.1)),
    Case(TG + "statsd_test.go: TestParse_Counters", b"sample.rate:1|c|@0.1", "counter 10",
         Kept("sample.rate", "c", (1.0,), rate=0.1)),
    Case(TG + "statsd_test.go: TestParse_Sets", b"scientific.notation.sets:4.696E+5|s",
         "a member, its text", Kept("scientific.notation.sets", "s", ("4.696E+5",))),
    Case(TG + "datadog_test.go: TestEventError (unknown metadata)",
         b"_e{5,4}:title|text|x:1234", "error", Counted("events", UNK),
         differs="unknown-fields"),
    # -- vector
    Case(VEC + "enhanced_tags", b"foo:1|c|#tag1,tag2:valueA,tag2:valueB,tag3:value,tag3,tag4:",
         "tags tag1, tag2=valueA, tag2=valueB, tag3=value, tag3, tag4=''",
         Kept("foo", "c", (1.0,), (("tag1", ""), ("tag2", "valueB"), ("tag3", ""), ("tag4", ""))),
         differs="repeated-tag-keys"),
    Case(VEC + "sampled_counter", b"bar:2|c|@0.1", "counter 20",
         Kept("bar", "c", (2.0,), rate=0.1)),
    Case(VEC + "zero_sampled_counter", b"bar:2|c|@0", "counter 2 (rate 0 read as 1)",
         Rejected("invalid_sample_rate"), differs="bad-sample-rate"),
    Case(VEC + "sampled_timer", b"glork:320|ms|@0.1", "0.320 s, 10 times",
         Kept("glork", "ms", (320.0,), rate=0.1), differs="sampled-timers"),
    Case(VEC + "sets", b"uniques:765|s", "member 765", Kept("uniques", "s", ("765",))),
    Case(VEC + "signed_gauge", b"gaugor:-4|g", "gauge decremented by 4",
         Kept("gaugor", "g", (-4.0,))),
]


def _lines(datagram: bytes) -> list[bytes]:
    return [line for line in datagram.split(b"\n") if line]


def _check_parse(datagram: bytes, stored: Expected) -> None:
    result = parse_datagram(datagram)
    assert result.accounted() == result.lines == len(_lines(datagram))
    if isinstance(stored, Rejected):
        assert stored.reason in REJECT_REASONS
        assert [(r.reason, r.line) for r in result.rejects] == [(stored.reason, datagram)]
        return
    assert result.rejects == []
    if isinstance(stored, Counted):
        assert len(getattr(result, stored.kind)) == 1
        assert [reason for reason, _ in result.adjusted] == list(stored.adjusted)
        return
    got = [
        (s.metric, s.metric_type, s.member if s.metric_type == "s" else s.value, s.tags,
         s.sample_rate, s.timestamp_ms)
        for s in result.samples
    ]
    timestamp_ms = None if stored.timestamp_s is None else stored.timestamp_s * 1000
    assert got == [(stored.metric, stored.kind, value, stored.tags, stored.rate, timestamp_ms)
                   for value in stored.values]
    with_unknown = sum(1 for _, samples in result.metric_lines if samples[0].unknown_fields)
    assert with_unknown == stored.adjusted.count("unknown_field")


def _receive(root: Path, datagram: bytes) -> tuple[UdpReceiver, list[dict[str, Any]]]:
    """``datagram`` sent over UDP to a receiver; its stats and its data rows once rolled."""
    sock = bind_udp("127.0.0.1", 0)
    clock = ManualClock(RECV_MS)
    receiver = UdpReceiver(sock, SegmentWriter(root, "udp-0", fsync=False), PaneCombiner(1000),
                           clock, proc_net=root / "no-proc")  # fmt: skip
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
        sender.sendto(datagram, sock.getsockname())
    deadline = time.monotonic() + 5
    while receiver.stats.datagrams < 1 and time.monotonic() < deadline:
        receiver.receive_available()
        time.sleep(0.005)
    receiver.roll(clock.now_ms(), closed=True)
    sock.close()
    rows = [row for segment in list_segments(root, "udp-0")
            for batch in read_segment(Path(segment.path)) for row in batch.to_pylist()
            if not row["metric"].startswith(SELF_METRIC_PREFIX)]  # fmt: skip
    return receiver, rows


def _check_stored(root: Path, datagram: bytes, stored: Expected) -> None:
    receiver, rows = _receive(root, datagram)
    stats = receiver.stats
    assert stats.lines == stats.accounted() == len(_lines(datagram))
    if isinstance(stored, Rejected):
        assert (stats.rejected, stats.adjusted, rows) == ({stored.reason: 1}, {}, [])
        return
    assert stats.rejected == {}
    assert set(stored.adjusted) <= set(ADJUSTMENT_REASONS)
    assert stats.adjusted == collections.Counter(stored.adjusted)
    if isinstance(stored, Counted):
        assert getattr(stats, stored.kind) == 1 and rows == []
        return
    (row,) = rows
    assert (row["metric"], row["metric_type"], json.loads(row["tags"])) == (
        stored.metric, stored.kind, dict(stored.tags))
    assert row["count"] == len(stored.values)
    if stored.kind == "s":
        assert round(estimate(row["sketch"]).estimate) == len(set(stored.values))
        return
    numbers = [float(v) for v in stored.values]
    if stored.kind == "c":
        assert row["sum"] == pytest.approx(sum(v / stored.rate for v in numbers))
    elif stored.kind == "g":
        assert row["last"] == (numbers[-1] if stored.last is None else stored.last)
    else:
        assert (row["sum"], row["min"], row["max"]) == pytest.approx(
            (sum(numbers), min(numbers), max(numbers)))


@pytest.mark.parametrize("case", CASES, ids=[c.datagram.decode("utf-8", "replace")[:60]
                                             for c in CASES])  # fmt: skip
def test_peer_case(case: Case, tmp_path: Path) -> None:
    _check_parse(case.datagram, case.stored)
    _check_stored(tmp_path, case.datagram, case.stored)


def test_every_difference_is_documented() -> None:
    """``docs/conformance.md`` lists exactly the differences the table shows (by id)."""
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", CONFORMANCE_DOC.read_text(), re.M))
    assert documented == {case.differs for case in CASES if case.differs}


# -- the real clients --------------------------------------------------------------------------


def _datadog(port: int) -> DogStatsd:
    return DogStatsd("127.0.0.1", port, disable_telemetry=True, origin_detection_enabled=False,
                     disable_buffering=True)  # fmt: skip


def _two_user_ids(port: int) -> None:
    client = _datadog(port)
    client.set("users", "user:42")
    client.set("users", "user:43")


@dataclass(frozen=True)
class ClientCase:
    source: str  # the client call
    send: Callable[[int], None]  # makes that call towards a UDP port
    wire: tuple[bytes, ...]  # the datagrams the client sends
    peer: str
    stored: Kept


CLIENT_CASES = [
    ClientCase('datadogpy DogStatsd.set("users", "user:42"), .set("users", "user:43")',
               _two_user_ids,
               (b"users:user:42|s\n", b"users:user:43|s\n"),
               DD + "parse_metrics_test.go: TestParseSetMultiple: members user:42, user:43",
               Kept("users", "s", ("user:42", "user:43"))),
    ClientCase('datadogpy DogStatsd.set("peers", "2001:db8::1")',
               lambda port: _datadog(port).set("peers", "2001:db8::1"),
               (b"peers:2001:db8::1|s\n",),
               DD + "parse_metrics_test.go: TestParseSetMultiple: member 2001:db8::1",
               Kept("peers", "s", ("2001:db8::1",))),
    ClientCase('datadogpy DogStatsd.increment("x", tags=["", "k:v"])',
               lambda port: _datadog(port).increment("x", tags=["", "k:v"]),
               (b"x:1|c|#,k:v\n",), "gostatsd TestMetricsLexer (#,,f): the empty tag skipped",
               Kept("x", "c", (1.0,), (("k", "v"),))),
    ClientCase('datadogpy DogStatsd.increment("x", tags=["k:v", ""])',
               lambda port: _datadog(port).increment("x", tags=["k:v", ""]),
               (b"x:1|c|#k:v,\n",),
               SE + " (datadog tag extension with empty tags): the empty tag skipped",
               Kept("x", "c", (1.0,), (("k", "v"),))),
    ClientCase('datadogpy DogStatsd.gauge("a", 1, tags=["f", "", "z"])',
               lambda port: _datadog(port).gauge("a", 1, tags=["f", "", "z"]),
               (b"a:1|g|#f,,z\n",), GO + "TestMetricsLexer (a:1|g|#f,,z): tags f, z",
               Kept("a", "g", (1.0,), (("f", ""), ("z", "")))),
    ClientCase('datadogpy DogStatsd.gauge("a", 1, tags=["", ""])',
               lambda port: _datadog(port).gauge("a", 1, tags=["", ""]),
               (b"a:1|g|#,\n",), GO + "TestMetricsLexer (a:1|g|#,): no tags",
               Kept("a", "g", (1.0,))),
    ClientCase('statsd StatsClient.set("users", "user:42")',
               lambda port: statsd.StatsClient("127.0.0.1", port).set("users", "user:42"),
               (b"users:user:42|s",),
               DD + "parse_metrics_test.go: TestParseSetMultiple: member user:42",
               Kept("users", "s", ("user:42",))),
    ClientCase('statsd StatsClient.set("peers", "2001:db8::1")',
               lambda port: statsd.StatsClient("127.0.0.1", port).set("peers", "2001:db8::1"),
               (b"peers:2001:db8::1|s",),
               DD + "parse_metrics_test.go: TestParseSetMultiple: member 2001:db8::1",
               Kept("peers", "s", ("2001:db8::1",))),
]


@pytest.mark.parametrize("case", CLIENT_CASES, ids=[c.source for c in CLIENT_CASES])
def test_real_client(case: ClientCase, tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as capture:
        capture.bind(("127.0.0.1", 0))
        capture.settimeout(5)
        case.send(capture.getsockname()[1])
        wire = tuple(capture.recv(65535) for _ in case.wire)
    assert wire == case.wire
    datagram = b"".join(d if d.endswith(b"\n") else d + b"\n" for d in wire)
    _check_parse(datagram, case.stored)
    _check_stored(tmp_path, datagram, case.stored)
