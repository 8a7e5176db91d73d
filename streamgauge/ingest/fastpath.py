"""Whole-buffer parsing for the common line shape, with the general parser as the fallback.

Almost every line a busy StatsD port receives is ``name:value|type[|@rate][|#tags]`` for a
series that was seen a moment ago. For one wake-up's worth of datagrams joined into one buffer,
this module finds, with numpy over the whole buffer at once:

- the line boundaries, each line's first ``:`` and the first ``|`` after it;
- the value between them, if it is a plain decimal (``-?digits[.digits]``, at most 15
  digits): parsed exactly, as ``m / 10**k`` with both exact in a double — a correctly rounded
  quotient, the same double ``float(text)`` gives;
- the line's **key**, the line with its value cut out (``name:`` + ``|type|...``), looked up
  with one ``pyarrow.compute.index_in`` call among the keys the general parser accepted before.

A key is cached only after ``parse_line`` accepted a line with it (no ``|T``), so what the
cache says about a key — its series, sample rate, type — is what ``parse_line`` says about any
line with that key and a plain value: the name and every field but the value are in the key.

A line takes the fast path only if all of this holds; everything else — a new key, ``\\r``,
several values, gauge signs (deltas), ``-0``, exponents, long lines, a series the cardinality
guard would have to (re)admit — goes to the general parser, line by line, as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.ingest.combiner import PaneCombiner

MAX_VALUE_BYTES = 16
MAX_DIGITS = 15  # < 2**53: the mantissa is exact in a double
_POW10 = np.array([10.0**k for k in range(MAX_DIGITS + 1)])
_NL, _CR, _COLON, _PIPE, _DOT, _MINUS = 10, 13, 58, 124, 46, 45
_GAUGE = 1
_SET = 5  # combiner.TYPE_CODES["s"]


@dataclass(slots=True)
class Split:
    """One buffer of lines, split into the fast ones (ready to combine) and the rest."""

    buffer: bytes
    starts: np.ndarray  # every line, including empty ones
    ends: np.ndarray
    slow: np.ndarray  # indices of non-empty lines for the general parser, in order
    fast: np.ndarray  # indices of fast lines, in order
    fast_slots: np.ndarray
    fast_values: np.ndarray  # counters already scaled by 1/rate

    def lines(self, indices: np.ndarray) -> list[bytes]:
        buffer, starts, ends = self.buffer, self.starts, self.ends
        return [buffer[starts[i] : ends[i]] for i in indices.tolist()]


class FastPath:
    """The key cache and the vectorised splitter of one receiver."""

    def __init__(self, combiner: PaneCombiner, max_line_bytes: int, ttl_ms: int) -> None:
        self._combiner = combiner
        self._max_line_bytes = max_line_bytes
        self._ttl_ms = ttl_ms
        self._keys: list[bytes] = []
        self._index: dict[bytes, int] = {}
        self._key_slot = np.zeros(0, dtype=np.int64)
        self._key_gen = np.zeros(0, dtype=np.int64)
        self._key_rate = np.zeros(0, dtype=np.float64)
        self._pending: list[tuple[bytes, int, int, float]] = []
        self._known: pa.Array | None = None

    def __len__(self) -> int:
        return len(self._keys)

    @staticmethod
    def key_of(line: bytes) -> bytes | None:
        """The line without its value: ``name:`` + ``|type|...``; None if it has no such
        shape."""
        colon = line.find(b":")
        if colon < 0:
            return None
        pipe = line.find(b"|", colon)
        if pipe < 0:
            return None
        return line[: colon + 1] + line[pipe:]

    def remember(self, line: bytes, slot: int, sample_rate: float) -> None:
        """``parse_line`` accepted ``line`` (one value, no ``|T``) as series ``slot``.

        Sets never take the fast path: their value is a member (text), not a number.
        """
        if self._combiner.slot_type[slot] == _SET:
            return
        key = self.key_of(line)
        if key is not None:
            self._pending.append((key, slot, int(self._combiner.slot_gen[slot]), sample_rate))

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        gens = self._combiner.slot_gen
        # Keys whose slot was freed since: drop them (compaction), then add the new ones.
        live = self._key_gen == gens[self._key_slot] if len(self._keys) else np.zeros(0, bool)
        if len(self._keys) and not live.all() and (~live).sum() * 2 > len(self._keys):
            keep = np.flatnonzero(live)
            self._keys = [self._keys[i] for i in keep.tolist()]
            self._key_slot = self._key_slot[keep]
            self._key_gen = self._key_gen[keep]
            self._key_rate = self._key_rate[keep]
            self._index = {key: i for i, key in enumerate(self._keys)}
            self._known = pa.array(self._keys, pa.binary())
        slots, gen_list, rates = [], [], []
        updates: list[tuple[int, int, int, float]] = []
        for key, slot, gen, rate in self._pending:
            index = self._index.get(key)
            if index is None:
                self._index[key] = len(self._keys)
                self._keys.append(key)
                slots.append(slot)
                gen_list.append(gen)
                rates.append(rate)
            elif index < len(self._key_slot):
                updates.append((index, slot, gen, rate))
            else:  # twice in the same pending list: the later registration wins
                position = index - len(self._key_slot)
                slots[position], gen_list[position], rates[position] = slot, gen, rate
        self._pending = []
        for index, slot, gen, rate in updates:
            self._key_slot[index] = slot
            self._key_gen[index] = gen
            self._key_rate[index] = rate
        if slots:
            self._key_slot = np.concatenate([self._key_slot, np.array(slots, dtype=np.int64)])
            self._key_gen = np.concatenate([self._key_gen, np.array(gen_list, dtype=np.int64)])
            self._key_rate = np.concatenate([self._key_rate, np.array(rates, dtype=np.float64)])
            self._known = pa.array(self._keys, pa.binary())

    def split(self, buffer: bytes, recv_ms: int) -> Split:
        """Split ``buffer`` (lines ending in ``\\n``) into fast and general lines."""
        self._flush_pending()
        data = np.frombuffer(buffer, dtype=np.uint8)
        ends = np.flatnonzero(data == _NL)
        starts = np.empty_like(ends)
        starts[:1] = 0
        starts[1:] = ends[:-1] + 1
        nonempty = ends > starts
        empty = np.zeros(0, dtype=np.int64)
        if self._known is None or not len(ends):
            return Split(buffer, starts, ends, np.flatnonzero(nonempty), empty, empty,
                         np.zeros(0))
        colons = np.flatnonzero(data == _COLON)
        pipes = np.flatnonzero(data == _PIPE)
        colons = np.append(colons, len(data))  # sentinels: "not found" lands past every end
        pipes = np.append(pipes, len(data))
        colon = colons[np.searchsorted(colons, starts)]
        pipe = pipes[np.searchsorted(pipes, colon)]
        width = pipe - colon - 1
        candidate = (
            (pipe < ends) & (width >= 1) & (width <= MAX_VALUE_BYTES)
            & (ends - starts <= self._max_line_bytes) & (data[np.maximum(ends - 1, 0)] != _CR)
        )
        lines = np.flatnonzero(candidate)
        values, negative, ok = _parse_values(data, colon[lines] + 1, width[lines])
        lines, values, negative = lines[ok], values[ok], negative[ok]
        key_ids = self._lookup(buffer, starts[lines], colon[lines] + 1, pipe[lines], ends[lines])
        combiner = self._combiner
        known = key_ids >= 0
        key_ids = np.where(known, key_ids, 0)
        slots = self._key_slot[key_ids]
        slot_type = combiner.slot_type[slots]
        fast_mask = (
            known
            & (self._key_gen[key_ids] == combiner.slot_gen[slots])
            & combiner.admitted[slots]
            # a series the guard might expire must be re-admitted in line order: general path
            & (combiner.seen_ms[slots] > recv_ms - self._ttl_ms)
            & ~(negative & (slot_type == _GAUGE))  # "-5|g" is a delta
        )
        fast = lines[fast_mask]
        slots = slots[fast_mask]
        values = values[fast_mask]
        counters = slot_type[fast_mask] == 0
        if counters.any():
            values = np.where(counters, values / self._key_rate[key_ids[fast_mask]], values)
        is_fast = np.zeros(len(ends), dtype=bool)
        is_fast[fast] = True
        slow = np.flatnonzero(nonempty & ~is_fast)
        return Split(buffer, starts, ends, slow, fast, slots, values)

    def _lookup(
        self, buffer: bytes, starts: np.ndarray, name_ends: np.ndarray, pipes: np.ndarray,
        ends: np.ndarray,
    ) -> np.ndarray:
        """Each line's key (``buffer[start:name_end] + buffer[pipe:end]``) → cached key id,
        -1 if unknown."""
        n = len(starts)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        # One binary array over the buffer (no copy), 4 entries per line: the name with its
        # colon, the value, the rest of the line, the gap up to the next candidate line.
        offsets = np.empty(4 * n + 1, dtype=np.int64)
        offsets[0:-1:4] = starts
        offsets[1:-1:4] = name_ends
        offsets[2:-1:4] = pipes
        offsets[3:-1:4] = ends
        offsets[-1] = ends[-1]
        offset_type = pa.int32() if len(buffer) < 2**31 else pa.int64()
        binary_type = pa.binary() if offset_type == pa.int32() else pa.large_binary()
        pieces = pa.Array.from_buffers(
            binary_type, 4 * n,
            [None, pa.py_buffer(offsets.astype(offset_type.to_pandas_dtype())),
             pa.py_buffer(buffer)],
        )
        picks = np.arange(0, 4 * n, 4)
        names = pieces.take(pa.array(picks))
        rests = pieces.take(pa.array(picks + 2))
        keys = pc.binary_join_element_wise(names, rests, pa.scalar(b"", binary_type))
        if binary_type != pa.binary():
            keys = keys.cast(pa.binary())
        if len(self._keys) > DICT_LOOKUP_RATIO * n:
            # Few lines against many known keys: index_in would hash every known key again
            # (76 % of a receiver's CPU in the 100k-series soak, py-spy).
            index = self._index
            return np.fromiter((index.get(key, -1) for key in keys.to_pylist()), np.int64, n)
        found = pc.index_in(keys, value_set=self._known)
        ids: np.ndarray = found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        return ids


#: ``_lookup`` looks keys up one by one in the dict when the known keys outnumber the lines by
#: this much: ``pc.index_in`` hashes its whole value set again on every call. Measured here:
#: index_in about 100 ns per known key + 25 ns per line, the dict about 250 ns per line
#: (``to_pylist`` and ``get``); 100k known keys and 400 lines: 43 ms against 0.06 ms.
DICT_LOOKUP_RATIO = 2


def _parse_values(
    data: np.ndarray, starts: np.ndarray, widths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Plain decimals ``-?digits[.digits]`` (``1.``, ``.5`` included) → (value, negative, ok).

    Exactly ``float(text)``: the digits as an integer m < 10**15 and the fraction digits k ≤ 15
    are both exact doubles, so ``m / 10**k`` is the correctly rounded value of the decimal.
    ``-0`` forms are not ok (their -0.0 takes the general path)."""
    n = len(starts)
    if n == 0:
        empty = np.zeros(0)
        return empty, np.zeros(0, dtype=bool), np.zeros(0, dtype=bool)
    width = int(widths.max())
    columns = np.arange(width)
    inside = columns[None, :] < widths[:, None]
    positions = np.minimum(starts[:, None] + columns[None, :], len(data) - 1)
    chars = np.where(inside, data[positions], 0)
    digit = chars - 48
    is_digit = inside & (chars >= 48) & (chars <= 57)
    is_dot = chars == _DOT
    negative = chars[:, 0] == _MINUS
    other = inside & ~is_digit & ~is_dot
    other[:, 0] &= ~negative
    ndigits = is_digit.sum(axis=1)
    after_dot = np.cumsum(is_dot, axis=1) > 0
    fraction_digits = (is_digit & after_dot).sum(axis=1)
    mantissa = np.zeros(n, dtype=np.int64)
    for column in range(width):
        mantissa = np.where(is_digit[:, column], mantissa * 10 + digit[:, column], mantissa)
    ok = (
        ~other.any(axis=1) & (is_dot.sum(axis=1) <= 1) & (ndigits >= 1)
        & (ndigits <= MAX_DIGITS) & ~(negative & (mantissa == 0))
    )
    values = mantissa / _POW10[np.minimum(fraction_digits, MAX_DIGITS)]
    values = np.where(negative, -values, values)
    return values, negative, ok
