"""Conformance with the servers StatsD/DogStatsD clients come from, as one table.

Each row is a case taken from a peer's own test suite (cited by project, file and test name):
the datagram, what that peer's test expects, and what streamgauge does with it — asserted at
two public seams, ``parse_datagram`` (the samples, or the reject) and a ``UdpReceiver`` fed
the datagram over UDP (the stats, and the partial in the segment log). Where the peers
disagree streamgauge reads a line as the Datadog agent does; a row where streamgauge does
not do what its peer expects names the difference (``differs``), and every such difference
is listed in ``docs/conformance.md``.

``SESSION_CASES`` hold sessions as Spark draws them (``session_window``), through the
reference windower: the rule every engine here keeps (``docs/conformance.md``, "Windows").

``CLIENT_CASES`` send through the real clients (datadogpy's ``DogStatsd``, the ``statsd``
package) and check the exact bytes they put on the wire before the receiver reads them.

A sampled timer, histogram or distribution value stands for ``1 / rate`` values (truncated, as
the Datadog agent and statsd_exporter count it): the row's ``count`` and ``total`` say what the
peer's test expects of the window's count and sum, and ``quantiles`` its percentiles, read
here off the stored HDR histogram; its t-digest must hold the same weight as the count.
"""

from __future__ import annotations

import collections
import json
import random
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
from streamgauge.configs import parse_config
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.log import SegmentWriter, list_segments, read_segment
from streamgauge.ingest.protocol import ADJUSTMENT_REASONS, REJECT_REASONS, parse_datagram
from streamgauge.ingest.receiver import SELF_METRIC_PREFIX, UdpReceiver, bind_udp
from streamgauge.sketches.accuracy import compile_accuracy
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hll import estimate
from streamgauge.sketches.tdigest import deserialize_tdigest
from streamgauge.windows.reference import PanePartial, ReferenceWindower, Segment

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
    rates: tuple[float, ...] = ()  # each value's own rate, when they differ (default: rate)
    count: int | None = None  # the partial's count (default: one per value)
    total: float | None = None  # timers, histograms, distributions: the sum (default: values')
    quantiles: tuple[tuple[float, float], ...] = ()  # (q, value) of the stored histogram


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
DDM = "datadog-agent: pkg/metrics/"
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
    Case(DDM + "histogram_test.go: TestHistogramSampleRate",
         b"h:1|h\nh:2|h|@0.5\nh:3|h|@0.2\nh:10|h|@0.5",
         "count 10 (1 + 2 + 5 + 2), sum 40, min 1, max 10, p20 2, median 3, p80 3, p95 10",
         Kept("h", "h", (1.0, 2.0, 3.0, 10.0), rates=(1.0, 0.5, 0.2, 0.5), count=10,
              total=40.0, quantiles=((0.2, 2.0), (0.5, 3.0), (0.8, 3.0), (0.95, 10.0)))),
    Case(DDM + "histogram.go: addSample (weight int64(1 / rate))", b"lat:5|h|@0.3",
         "count 3 (1 / 0.3 truncated); sum 5 / 0.3 = 16.67",
         Kept("lat", "h", (5.0,), rate=0.3, count=3, total=15.0), differs="sampled-sum"),
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
         "10 observations of 0.0005 s",
         Kept("foo.timing", "ms", (0.5,), rate=0.1, count=10, total=5.0), differs="timer-units"),
    Case(SE + " (datadog timings with extended aggregation values and sampling but without"
         " tags)", b"foo_timing:0.5:120:3000:10:20000:0.01|ms|@0.5",
         "each value observed twice, in seconds: 12 observations",
         Kept("foo_timing", "ms", (0.5, 120.0, 3000.0, 10.0, 20000.0, 0.01), rate=0.5, count=12,
              total=2 * 23130.51, quantiles=((0.25, 0.5), (0.5, 10.0), (0.75, 3000.0))),
         differs="timer-units"),
    Case(SE + " (datadog timings with extended aggregation values, sampling, and tags)",
         b"foo_timing:0.5:120:3000:10:20000:0.01|ms|@0.5|#tag1:bar,tag2:baz",
         "each value observed twice, in seconds, labels tag1=bar, tag2=baz",
         Kept("foo_timing", "ms", (0.5, 120.0, 3000.0, 10.0, 20000.0, 0.01),
              (("tag1", "bar"), ("tag2", "baz")), rate=0.5, count=12, total=2 * 23130.51),
         differs="timer-units"),
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
         Kept("a_test_value", "ms", (100.0,), rate=0.1, count=10, total=1000.0)),
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
    Case(TG + "statsd_test.go: TestParse_DataDogTags (timer)",
         b"my_timer:3|ms|@0.1|#live,host:localhost",
         "count 10, sum 30, lower = upper = 3; tags host=localhost, live=true",
         Kept("my_timer", "ms", (3.0,), (("host", "localhost"), ("live", "")), rate=0.1,
              count=10, total=30.0, quantiles=((0.5, 3.0),)),
         differs="bare-tags"),
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
         Kept("glork", "ms", (320.0,), rate=0.1, count=10, total=3200.0),
         differs="timer-units"),
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
    rates = stored.rates or (stored.rate,) * len(stored.values)
    assert got == [(stored.metric, stored.kind, value, stored.tags, rate, timestamp_ms)
                   for value, rate in zip(stored.values, rates, strict=True)]
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
    assert row["count"] == (len(stored.values) if stored.count is None else stored.count)
    if stored.kind == "s":
        assert round(estimate(row["sketch"]).estimate) == len(set(stored.values))
        return
    numbers = [float(v) for v in stored.values]
    if stored.kind == "c":
        assert row["sum"] == pytest.approx(sum(v / stored.rate for v in numbers))
    elif stored.kind == "g":
        assert row["last"] == (numbers[-1] if stored.last is None else stored.last)
    else:
        total = sum(numbers) if stored.total is None else stored.total
        assert (row["sum"], row["min"], row["max"]) == pytest.approx(
            (total, min(numbers), max(numbers)))
        # every sketch weighs each value as the count does
        assert deserialize_tdigest(row["sketch"]).get_total_weight() == row["count"]
        assert sum(row["hdr_count"]) == row["count"]
        layout = HdrLayout.from_params(compile_accuracy())
        for q, value in stored.quantiles:
            got = layout.quantile(row["hdr_bucket"], row["hdr_count"], q)
            assert got == pytest.approx(value, rel=layout.relative_error), q


@pytest.mark.parametrize("case", CASES, ids=[c.datagram.decode("utf-8", "replace")[:60]
                                             for c in CASES])  # fmt: skip
def test_peer_case(case: Case, tmp_path: Path) -> None:
    _check_parse(case.datagram, case.stored)
    _check_stored(tmp_path, case.datagram, case.stored)


def test_every_difference_is_documented() -> None:
    """``docs/conformance.md`` lists exactly the differences the table shows (by id)."""
    documented = set(re.findall(r"^\| `([a-z-]+)` \|", CONFORMANCE_DOC.read_text(), re.M))
    assert documented == {case.differs for case in CASES if case.differs}


# -- session windows, as Spark draws them ------------------------------------------------------

SPARK = "spark: sql/core/src/test/scala/org/apache/spark/sql/DataFrameSessionWindowingSuite.scala: "


@dataclass(frozen=True)
class SessionCase:
    source: str
    gap_s: int
    events_s: tuple[int, ...]  # event times of one series, in the order sent
    peer: str
    sessions: tuple[tuple[int, int, int], ...]  # (start s, end s, events) by start


SESSION_CASES = [
    SessionCase(SPARK + "session window groupBy with multiple keys statement (key a)", 10,
                (34, 39, 56, 64), "(34 ~ 49), (56 ~ 74)", ((34, 49, 2), (56, 74, 2))),
    SessionCase(SPARK + "session window groupBy with multiple keys statement - keys overlapped"
                " with sessions (key b)", 10, (39, 45, 27), "(27 ~ 37), (39 ~ 55)",
                ((27, 37, 1), (39, 55, 2))),
    SessionCase(SPARK + "SPARK-36724: Support timestamp_ntz as a type of time column", 10,
                (30, 25), "(25 ~ 40), 2 events", ((25, 40, 2),)),
    SessionCase("spark: sql/core/src/main/scala/org/apache/spark/sql/execution/aggregate/"
                "MergingSessionsIterator.scala: processCurrentSortedGroup (a session joins the"
                " current one when sessionStart <= its end)", 5, (35, 40),
                "one session (35 ~ 45): events one gap apart", ((35, 45, 2),)),
    SessionCase("the same rule, the other side: an event one gap before a session", 5,
                (40, 35), "one session (35 ~ 45)", ((35, 45, 2),)),
]


def _sessions(gap_s: int, events_s: tuple[int, ...]) -> list[tuple[int, int, int]]:
    """The final sessions of one series whose events come in that order, one segment each."""
    config = parse_config(
        f"pane: 1s\nwindows: [{{name: s, kind: session, gap: {gap_s}s, key: id,"
        " watermark_delay: 0s, allowed_lateness: 1h}]", "conformance", default_name="conformance")
    windower = ReferenceWindower(config)
    last = max(events_s) * 1000
    for at_s in events_s:
        combiner = PaneCombiner(config.pane_ms)
        combiner.add(parse_datagram(b"a:1|c|#id:a").samples[0], RECV_MS + at_s * 1000,
                     RECV_MS + at_s * 1000)  # fmt: skip
        partials = tuple(PanePartial(**{k: v for k, v in row.items() if k in PANE_FIELDS})
                         for row in combiner.drain().to_pylist())  # fmt: skip
        windower.feed(Segment("r0", RECV_MS + last, False, partials))
    windower.feed(Segment("r0", RECV_MS + last + 3_600_000 + 60_000, True, ()))
    return sorted(((start - RECV_MS) // 1000, (end - RECV_MS) // 1000, row.count)
                  for (_, _, _, start, end), row in windower.stored().items())  # fmt: skip


PANE_FIELDS = frozenset(PanePartial.__dataclass_fields__)


@pytest.mark.parametrize("case", SESSION_CASES, ids=[c.source.rsplit(": ", 1)[-1][:60]
                                                     for c in SESSION_CASES])  # fmt: skip
def test_sessions_as_spark_draws_them(case: SessionCase) -> None:
    assert _sessions(case.gap_s, case.events_s) == list(case.sessions)


# -- the real clients --------------------------------------------------------------------------


def _datadog(port: int) -> DogStatsd:
    return DogStatsd("127.0.0.1", port, disable_telemetry=True, origin_detection_enabled=False,
                     disable_buffering=True)  # fmt: skip


def _sampled(send: Callable[[], None]) -> None:
    """``send`` a sampled metric that the client does put on the wire: both clients send when
    ``random.random() <= rate``, and the first draw after ``seed(31)`` is 0.012 (the
    generator's state is put back afterwards)."""
    state = random.getstate()
    random.seed(31)
    try:
        send()
    finally:
        random.setstate(state)


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
    ClientCase('statsd StatsClient.timing("lat", 5, rate=0.5)',
               lambda port: _sampled(
                   lambda: statsd.StatsClient("127.0.0.1", port).timing("lat", 5, rate=0.5)),
               (b"lat:5.000000|ms|@0.5",),
               SE + " (timings with sampling factor): 1 / rate observations",
               Kept("lat", "ms", (5.0,), rate=0.5, count=2, total=10.0)),
    ClientCase('datadogpy DogStatsd.histogram("lat", 5, sample_rate=0.5)',
               lambda port: _sampled(lambda: _datadog(port).histogram("lat", 5, sample_rate=0.5)),
               (b"lat:5|h|@0.5\n",),
               DDM + "histogram_test.go: TestHistogramSampleRate: count 2, sum 10",
               Kept("lat", "h", (5.0,), rate=0.5, count=2, total=10.0,
                    quantiles=((0.5, 5.0),))),
    ClientCase('datadogpy DogStatsd.timing("lat", 5, sample_rate=0.1)',
               lambda port: _sampled(lambda: _datadog(port).timing("lat", 5, sample_rate=0.1)),
               (b"lat:5|ms|@0.1\n",), ETSY + "sampled_timers_are_valid: count 10",
               Kept("lat", "ms", (5.0,), rate=0.1, count=10, total=50.0)),
    ClientCase('datadogpy DogStatsd.distribution("lat", 5, sample_rate=0.3)',
               lambda port: _sampled(
                   lambda: _datadog(port).distribution("lat", 5, sample_rate=0.3)),
               (b"lat:5|d|@0.3\n",),
               DDM + "histogram.go: addSample: count int64(1 / 0.3) = 3 (sum: sampled-sum)",
               Kept("lat", "d", (5.0,), rate=0.3, count=3, total=15.0)),
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
