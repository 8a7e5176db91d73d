"""The whole-buffer fast path gives exactly what the line-by-line general path gives."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from streamgauge.clock import ManualClock
from streamgauge.ingest import fastpath, memory
from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.fastpath import _parse_values
from streamgauge.ingest.guard import CardinalityLimits
from streamgauge.ingest.log import SegmentWriter, list_segments, read_segment
from streamgauge.ingest.protocol import _NUMBER_RE
from streamgauge.ingest.receiver import Receiver

T0 = 1_700_000_000_000


def _values(texts: list[bytes]) -> list[float | None]:
    buffer = b"|".join(texts) + b"|"
    starts, position = [], 0
    for text in texts:
        starts.append(position)
        position += len(text) + 1
    values, _, ok = _parse_values(
        np.frombuffer(buffer, np.uint8), np.array(starts), np.array([len(t) for t in texts])
    )
    return [float(v) if good else None for v, good in zip(values, ok, strict=True)]


def test_plain_decimals_parse_exactly_as_float_does() -> None:
    texts = [b"0", b"1", b"42", b"-3", b"1.", b".5", b"-.5", b"0.1", b"3.14159", b"007",
             b"123456789012345", b"0.00000000000001", b"99999.9999"]
    for text, value in zip(texts, _values(texts), strict=True):
        assert value is not None and value.hex() == float(text).hex(), text


def test_other_numbers_are_left_to_the_general_parser() -> None:
    texts = [b"-0", b"-0.0", b"+1", b"1e3", b"1.2.3", b"-", b".", b"1-2", b"nan", b"1 ",
             b"1234567890123456", b"--1", b"1_0"]
    assert _values(texts) == [None] * len(texts)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="0123456789.-+e", min_size=1, max_size=16))
def test_a_value_is_fast_only_if_the_protocol_takes_it_and_then_equal(text: str) -> None:
    (value,) = _values([text.encode()])
    if value is not None:
        assert _NUMBER_RE.fullmatch(text)
        assert value.hex() == float(text).hex()


NAMES = ["a", "b", "c.d", "bad name", ""]
TYPES = ["c", "g", "ms", "d", "h", "s", "q"]
VALUES = ["1", "0", "-0", "2.5", "-3", "+4", "1e3", "nan", "1:2", "", ".5", "7", "1:", "::2",
          "a:b"]
EXTRAS = ["", "", "", "|@0.5", "|@0.25", "|@0.3", "|#x:1", "|#x:1,y:2", "|#y:2,x:1", "|#x",
          "|T{ts}", "|T1", "|c:abc", "\r", "|zz", "|@2", "|f:x", "|#,x:1", "|#x:1,", "|#x:1|zz"]


@st.composite
def _line(draw: st.DrawFn) -> bytes:
    if draw(st.integers(0, 30)) == 0:
        return draw(st.sampled_from([b"", b"_e{1,1}:a|b", b"_sc|db|0", b"\xff:1|c", b"x"]))
    extra = draw(st.sampled_from(EXTRAS)).replace("{ts}", str(T0 // 1000 + 1))
    text = (f"{draw(st.sampled_from(NAMES))}:{draw(st.sampled_from(VALUES))}"
            f"|{draw(st.sampled_from(TYPES))}{extra}")
    return text.encode()


_step: st.SearchStrategy[tuple[str, list[bytes], int]] = st.one_of(
    st.tuples(
        st.just("batch"),
        st.lists(st.lists(_line(), min_size=1, max_size=6).map(b"\n".join), max_size=8),
        st.integers(0, 1500),
    ),
    st.tuples(st.just("roll"), st.just([]), st.integers(0, 1500)),
)


def _receiver(root: Path, sock: socket.socket, fast: bool, limits: CardinalityLimits
              ) -> tuple[Receiver, ManualClock]:
    clock = ManualClock(T0)
    # no /proc/net: the namespace's drop counters (other programs' too) would differ per run
    receiver = Receiver(
        sock, SegmentWriter(root, "udp-0", fsync=False), PaneCombiner(1000), clock,
        cardinality=limits, fast_path=fast, proc_net=root / "no-proc",
    )
    return receiver, clock


def _exact(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows with floats as hex: 0.0 and -0.0 (and every last bit) must match."""
    return [
        tuple(v.hex() if isinstance(v, float) else v for v in row.values()) for row in rows
    ]


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large])
# A pane's sketch takes its fast values before its general ones: -0.0 then 0.0 must not give
# another t-digest than 0.0 then -0.0 (found by this test).
@example(steps=[("batch", [b"b:-0|ms"], 0), ("batch", [b"b:0|ms"], 0)], max_series=0,
         ttl_ms=600_000)
# A type flood: counted in bulk after the first, demoted beside another metric line, and
# forgotten with the name's type when its series expires.
@example(steps=[("batch", [b"a:1|c", b"a:2|g"], 0), ("batch", [b"a:3|g\na:4|g"] * 20, 0),
                ("batch", [b"a:5|g\nb:1|c\na:6|g"], 2500), ("roll", [], 0),
                ("batch", [b"a:7|g"], 0), ("batch", [b"a:8|g\na:9|c"], 0)],
         max_series=0, ttl_ms=2_000)
# Sampled timers and histograms weigh 1 / rate on either path (@0.3: 3 values, truncated).
@example(steps=[("batch", [b"h:5|h|@0.3", b"t:1|ms|@0.5"], 0),
                ("batch", [b"h:7|h|@0.3\nh:2|h|@0.3\nt:4|ms|@0.5\nt:-3|ms"], 0),
                ("roll", [], 0), ("batch", [b"h:9|h|@0.3\nh:9|h"], 0)],
         max_series=0, ttl_ms=600_000)
@given(
    steps=st.lists(_step, min_size=1, max_size=25),
    max_series=st.sampled_from([0, 3]),
    ttl_ms=st.sampled_from([600_000, 2_000]),
)
def test_fast_and_general_paths_give_identical_partials_and_counts(
    tmp_path_factory: Any, steps: list[tuple[str, list[bytes], int]], max_series: int,
    ttl_ms: int,
) -> None:
    limits = CardinalityLimits(max_series=max_series, max_series_per_metric=0, ttl_ms=ttl_ms)
    root = tmp_path_factory.mktemp("fast")
    outcomes = []
    for fast in (True, False):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", 0))
            spool = root / ("fast" if fast else "general")
            receiver, clock = _receiver(spool, sock, fast, limits)
            for kind, datagrams, advance in steps:
                if kind == "batch" and datagrams:
                    receiver._ingest_datagrams(datagrams, receiver.now_ms())
                else:
                    receiver.roll(receiver.now_ms())
                clock.advance(advance)
            receiver.roll(receiver.now_ms(), closed=True)
            rows = [
                row
                for segment in list_segments(spool, "udp-0")
                for batch in read_segment(segment)
                for row in batch.to_pylist()
            ]
            stats = receiver.stats.to_json()
            assert receiver.stats.lines == receiver.stats.accounted()
            outcomes.append((_exact(rows), stats))
    assert outcomes[0][0] == outcomes[1][0]
    assert outcomes[0][1] == outcomes[1][1]


def test_mixed_datagrams_take_both_paths_and_agree(tmp_path: Path) -> None:
    """A fixed mix: plain lines (fast after the first sight), deltas, rates, tags in another
    order or with empty entries, client timestamps, multi-values (with empty items), set
    members with colons, unknown fields (counted on every line, so never fast) and rejects,
    over several panes."""
    lines = [b"hits:1|c", b"hits:2|c|@0.5", b"lat:12.5|ms|#host:a", b"depth:10|g",
             b"depth:+5|g", b"depth:-2|g", b"lat:3|ms|#host:a", b"req:1:2:3|d",
             b"lat:7|ms|#host:b,zone:z", b"lat:8|ms|#zone:z,host:b", b"hits:x|c", b"q:1|zz",
             b"hits:4|c|T%d" % (T0 // 1000), b"depth:-0|g", b"hits:0|c\r", b"depth:0|g",
             b"hits:5|c|f:future", b"lat:9|ms|#,host:a", b"lat:2|ms|#host:a,", b"req:4:5:|d",
             b"users:user:42|s", b"peers:2001:db8::1|s", b"lat:4|ms|#host:a|@0.25",
             b"size:3|h|@0.3", b"size:1:2|h|@0.5"]
    unknown_sent = sum(lines[(round_ + i) % len(lines)] == b"hits:5|c|f:future"
                       for round_ in range(40) for k in (1, 3, 7) for i in range(k))
    assert unknown_sent > 10
    outcomes = []
    for fast in (True, False):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            sock.bind(("127.0.0.1", 0))
            receiver, clock = _receiver(tmp_path / str(fast), sock, fast, CardinalityLimits())
            for round_ in range(40):
                datagrams = [b"\n".join(lines[(round_ + i) % len(lines)] for i in range(k))
                             for k in (1, 3, 7)]
                receiver._ingest_datagrams(datagrams, receiver.now_ms())
                clock.advance(130)
                if round_ % 3 == 0:
                    receiver.roll(receiver.now_ms())
            receiver.roll(receiver.now_ms(), closed=True)
            rows = [row for segment in list_segments(tmp_path / str(fast), "udp-0")
                    for batch in read_segment(segment)
                    for row in batch.to_pylist()]
            outcomes.append((_exact(rows), receiver.stats.to_json()))
            # every line with its unknown field counted, on either path
            assert receiver.stats.adjusted["unknown_field"] == unknown_sent
            if fast:
                # a good part took the fast path (series mixed with |T or deltas did not)
                assert receiver.fast_lines > receiver.stats.lines / 4
            else:
                assert receiver.fast_lines == 0
    assert outcomes[0] == outcomes[1]


def test_released_library_pages_leave_the_fast_path_unchanged() -> None:
    """``release_library_pages`` (run at receiver start) only drops clean library pages:
    the compiled splitter, and numba itself, still work after it, with the same results."""
    fast = fastpath.FastPath(PaneCombiner(1000), 8192, 600_000)
    buffer = b"a:1|c\nb:2.5|g\nnot a line\n"
    before = fast.split(buffer, T0)
    assert memory.release_library_pages() > 0
    after = fast.split(buffer, T0)
    for name in ("starts", "ends", "slow", "fast", "fast_slots", "fast_values"):
        assert np.array_equal(getattr(before, name), getattr(after, name)), name
    assert fastpath.FastPath(PaneCombiner(1000), 8192, 600_000).split(buffer, T0).slow.tolist() \
        == before.slow.tolist()


def test_a_type_flood_is_counted_in_bulk_until_the_names_type_is_forgotten(
    tmp_path: Path,
) -> None:
    """``x`` is a counter; a client sends it as a gauge, over and over. After the first such
    line the fast path counts them as ``type_conflict`` without the general parser, with the
    last ones in the reject sample, the same counts as line by line. Once the counter's series
    expires (the guard forgets ``x``'s type), ``x`` as a gauge is a series like any other, and
    its lines take the fast path."""
    limits = CardinalityLimits(ttl_ms=2_000)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        receiver, clock = _receiver(tmp_path, sock, True, limits)
        receiver._ingest_datagrams([b"x:1|c", b"x:2|g"], receiver.now_ms())  # general path
        assert receiver.stats.rejected["type_conflict"] == 1
        for value in range(50):
            receiver._ingest_datagrams([b"x:%d|g\nx:%d.5|g" % (value, value)], receiver.now_ms())
        assert receiver.fast_conflicts == 100
        stats = receiver.stats
        assert stats.rejected["type_conflict"] == 101
        assert (stats.lines, stats.metric_lines) == (102, 1)
        assert stats.accounted() == stats.lines
        assert [entry["line"] for entry in stats.reject_sample][-2:] == ["x:49|g", "x:49.5|g"]
        # A buffer with another metric line: its conflicts go the general way, in line order.
        receiver._ingest_datagrams([b"x:7|g\ny:1|c\nx:8|g"], receiver.now_ms())
        assert receiver.fast_conflicts == 100
        assert stats.rejected["type_conflict"] == 103

        clock.advance(3_000)
        receiver.roll(receiver.now_ms())  # the counter's series expires, and x's type
        receiver._ingest_datagrams([b"x:9|g"], receiver.now_ms())
        receiver._ingest_datagrams([b"x:10|g"], receiver.now_ms())
        assert stats.rejected["type_conflict"] == 103
        assert receiver.fast_lines == 1  # "x:10|g", as the gauge it now is
        receiver.roll(receiver.now_ms(), closed=True)
    rows = [(row["metric_type"], row["count"], row["sum"] if row["metric_type"] == "c"
             else row["last"])
            for segment in list_segments(tmp_path, "udp-0")
            for batch in read_segment(segment) for row in batch.to_pylist()
            if row["metric"] == "x"]
    assert rows == [("c", 1, 1.0), ("g", 2, 10.0)]
