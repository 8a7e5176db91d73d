"""The compiled ``FastPath.split`` gives exactly what the numpy one it replaced gives
(``numpy_fastpath.NumpyFastPath``, the oracle), on random buffers against random key caches
and combiner states: same lines, same fast/slow choice, same slots, same value bits, same
weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamgauge.ingest import fastpath
from streamgauge.ingest.fastpath import FastPath, Split
from tests.ingest.numpy_fastpath import NumpyFastPath

SLOTS = 12
NAMES = [f"m{i}" for i in range(30)] + ["a.b", "", "x y", "é"]
VALUES = ["1", "0", "-0", "-0.0", "2.5", "-3", "+4", "1e3", "nan", "1:2", "", ".5", "7.",
          "-.25", "123456789012345", "1234567890123456", "0.000000000000001", "1..2", "-",
          "00012.50", "99999999999999.9", "3 ", ".", "-.", "1:", "::2", "a:b:c"]  # fmt: skip
TYPES = ["c", "g", "ms", "d", "h", "s", "q", ""]
EXTRAS = ["", "", "|@0.5", "|@0.1", "|@0.3", "|#x:1", "|#x:1,y:2", "|T1", "\r", "|", ":",
          "|#h:a|@0.5", "|#,x:1", "|#x:1,", "|f:x", "|zz"]


@dataclass
class FakeCombiner:
    """The four per-slot columns ``FastPath`` reads, free to set to any state."""

    slot_type: np.ndarray = field(default_factory=lambda: np.zeros(SLOTS, np.int8))
    slot_gen: np.ndarray = field(default_factory=lambda: np.zeros(SLOTS, np.int64))
    admitted: np.ndarray = field(default_factory=lambda: np.ones(SLOTS, bool))
    seen_ms: np.ndarray = field(default_factory=lambda: np.full(SLOTS, 1000, np.int64))


_key = st.tuples(st.sampled_from(NAMES), st.sampled_from(TYPES), st.sampled_from(EXTRAS))


@st.composite
def _line(draw: Any, keys: list[tuple[str, str, str]]) -> bytes:
    """Mostly one of ``keys`` with any value; now and then any bytes."""
    if draw(st.integers(0, 15)) == 0:
        junk: bytes = draw(st.binary(max_size=20).filter(lambda b: b"\n" not in b))
        return junk
    name, kind, extra = draw(st.sampled_from(keys))
    return f"{name}:{draw(st.sampled_from(VALUES))}|{kind}{extra}".encode()


_state = st.tuples(
    st.lists(st.integers(-1, 5), min_size=SLOTS, max_size=SLOTS),  # slot types
    # mostly what lets a key take the fast path: its slot's generation, admitted, seen lately
    st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=SLOTS, max_size=SLOTS),  # gen bumps
    st.lists(st.sampled_from([True, True, True, False]), min_size=SLOTS, max_size=SLOTS),
    st.lists(st.sampled_from([0, 999, 1000, 5000, 9500]), min_size=SLOTS, max_size=SLOTS),
)
def _round(keys: list[tuple[str, str, str]]) -> st.SearchStrategy[Any]:
    return st.tuples(
        _state,
        st.lists(st.tuples(_line(keys), st.integers(0, SLOTS - 1),
                           st.sampled_from([1.0, 0.5, 0.1, 0.3, 1e-12])),
                 max_size=40),  # registrations: (line, slot, rate)
        st.lists(st.tuples(_line(keys), st.sampled_from(NAMES)), max_size=6),  # conflicts
        st.lists(st.sampled_from(NAMES), max_size=2),  # names whose conflicts are forgotten
        st.lists(st.lists(_line(keys), max_size=25), min_size=1, max_size=3),  # buffers
        st.booleans(),  # the last line of each buffer without its "\n"
        st.sampled_from([1000, 2000, 10_000]),  # recv_ms
    )


def _same(a: Split, b: Split) -> None:
    for name in ("starts", "ends", "slow", "fast", "fast_slots", "fast_weights", "conflicts"):
        x, y = getattr(a, name), getattr(b, name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    assert a.fast_values.dtype == b.fast_values.dtype == np.float64
    assert np.array_equal(a.fast_values.view(np.int64), b.fast_values.view(np.int64))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                   HealthCheck.data_too_large])
@given(rounds=st.lists(_key, min_size=1, max_size=16).flatmap(
           lambda keys: st.lists(_round(keys), min_size=1, max_size=4)),
       max_line_bytes=st.one_of(st.just(8192), st.integers(4, 24)),
       ttl_ms=st.sampled_from([600_000, 1000]))
def test_compiled_split_equals_the_numpy_split(
    rounds: list[Any], max_line_bytes: int, ttl_ms: int
) -> None:
    combiner = FakeCombiner()
    new = FastPath(combiner, max_line_bytes, ttl_ms)  # type: ignore[arg-type]
    old = NumpyFastPath(combiner, max_line_bytes, ttl_ms)  # type: ignore[arg-type]
    for (types, bumps, admitted, seen), registrations, conflicts, forgotten, buffers, cut, \
            recv_ms in rounds:
        for line, slot, rate in registrations:
            new.remember(line, slot, rate)
            old.remember(line, slot, rate)
        for line, metric in conflicts:
            new.remember_conflict(line, metric)
            old.remember_conflict(line, metric)
        for metric in forgotten:
            new.forget_conflicts(metric)
            old.forget_conflicts(metric)
        # after the registrations: keys of slots freed since (compaction) and of live ones
        combiner.slot_type[:] = types
        combiner.slot_gen += bumps
        combiner.admitted[:] = admitted
        combiner.seen_ms[:] = seen
        for lines in buffers:
            buffer = b"".join(line + b"\n" for line in lines)
            if cut and buffer:
                buffer = buffer[:-1]
            _same(new.split(buffer, recv_ms), old.split(buffer, recv_ms))
        assert len(new) == len(old)


def test_many_keys_grow_the_table_and_all_are_found() -> None:
    """Thousands of keys (the table is rebuilt many times over), every one found afterwards,
    and none of the lines that differ from a key by one byte."""
    combiner = FakeCombiner(
        slot_type=np.zeros(5000, np.int8), slot_gen=np.zeros(5000, np.int64),
        admitted=np.ones(5000, bool), seen_ms=np.full(5000, 1000, np.int64),
    )
    fast = FastPath(combiner, 8192, 600_000)  # type: ignore[arg-type]
    lines = [b"bench.m%d:1|c|#host:h%d" % (i % 100, i // 100) for i in range(5000)]
    for start in range(0, 5000, 700):
        for slot in range(start, min(start + 700, 5000)):
            fast.remember(lines[slot], slot, 1.0)
        fast.split(b"", 0)
    split = fast.split(b"".join(line + b"\n" for line in lines), 1000)
    assert split.fast_slots.tolist() == list(range(5000))
    near = [line.replace(b"host:", b"host;") for line in lines[:50]]
    near += [line + b"0" for line in lines[:50]]
    assert not len(fast.split(b"".join(line + b"\n" for line in near), 1000).fast)


def test_every_key_length_and_byte_is_compared_also_at_the_buffer_end() -> None:
    """Names and rests of 1 to 19 bytes (every tail of a word), each line alone in a buffer
    (the word reads at the buffer's end, buffers under a word long) and among others: the
    key is found, and a line that differs from it in any one byte is not."""
    keys = [(b"n" * n, b"|c" + b"x" * r) for n in range(1, 20) for r in range(18)]
    count = len(keys)
    combiner = FakeCombiner(
        slot_type=np.zeros(count, np.int8), slot_gen=np.zeros(count, np.int64),
        admitted=np.ones(count, bool), seen_ms=np.full(count, 1000, np.int64),
    )
    fast = FastPath(combiner, 8192, 600_000)  # type: ignore[arg-type]
    lines = [name + b":1" + rest for name, rest in keys]
    for slot, line in enumerate(lines):
        fast.remember(line, slot, 1.0)
    assert fast.split(b"".join(line + b"\n" for line in lines), 1000).fast_slots.tolist() == (
        list(range(count))
    )
    for slot, line in enumerate(lines):
        assert fast.split(line + b"\n", 1000).fast_slots.tolist() == [slot]
        assert fast.split(b"x:1|g\n" + line + b"\n", 1000).fast_slots.tolist() == [slot]
        value = line.index(b":1")
        for position in [*range(value), *range(value + 2, len(line))]:  # not the value
            changed = bytearray(line)
            changed[position] = ord("y")
            assert not len(fast.split(bytes(changed) + b"\n", 1000).fast), changed


def test_nothing_is_compiled_after_construction() -> None:
    """Registration, table growth, compaction and splits after ``FastPath()`` reuse the
    signatures it compiled: a new one would compile on the receive thread, for seconds."""
    combiner = FakeCombiner()
    fast = FastPath(combiner, 8192, 600_000)  # type: ignore[arg-type]
    functions: list[Any] = [
        fastpath._scan, fastpath._hash_keys, fastpath._insert, fastpath._count_lines
    ]
    compiled = [len(function.signatures) for function in functions]
    for round_ in range(3):
        for slot in range(SLOTS):
            fast.remember(b"m%d.%d:1|c" % (slot, round_), slot, 1.0)
        fast.split(b"m0.0:1|c\n", 1000)
        combiner.slot_gen += 1  # every key stale: the next registration compacts
    assert [len(function.signatures) for function in functions] == compiled
