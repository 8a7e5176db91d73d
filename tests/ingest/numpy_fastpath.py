"""The numpy fast path this package had before the numba one (main at 6468bbb), kept as the
oracle of ``test_fastpath``: the numba ``FastPath.split`` must give what this one gives.

Its own docstring, as it was:

Whole-buffer parsing for the common line shape, with the general parser as the fallback.

Almost every line a busy StatsD port receives is ``name:value|type[|@rate][|#tags]`` for a
series that was seen a moment ago. For one wake-up's worth of datagrams joined into one buffer,
this module finds, with numpy over the whole buffer at once:

- the line boundaries, each line's first ``:`` and the first ``|`` after it;
- the value between them, if it is a plain decimal (``-?digits[.digits]``, at most 15
  digits): parsed exactly, as ``m / 10**k`` with both exact in a double — a correctly rounded
  quotient, the same double ``float(text)`` gives;
- the line's **key**, the line with its value cut out (``name:`` + ``|type|...``), looked up
  among the keys the general parser accepted before: with one ``pyarrow.compute.index_in``
  call over the buffer's pieces, which finds the line's *name* (``name:``) and *rest*
  (``|type|...``) among the known names and rests, then the (name, rest) pair with a
  ``searchsorted`` among the known pairs. No key is built, and the value set ``index_in``
  hashes on every call holds names and rests, not their products (10k series of 100 names
  on 100 hosts: ~500 parts instead of 10k keys).

A key is cached only after ``parse_line`` accepted a line with it (no ``|T``), so what the
cache says about a key — its series, sample rate, type — is what ``parse_line`` says about any
line with that key and a plain value: the name and every field but the value are in the key.

A line takes the fast path only if all of this holds; everything else — a new key, ``\\r``,
several values, gauge signs (deltas), ``-0``, exponents, long lines, a series the cardinality
guard would have to (re)admit — goes to the general parser, line by line, as before.

Added since, together with the compiled path: keys of type conflicts (``remember_conflict``,
``forget_conflicts``), whose lines are handed back as ``conflicts``, in neither list; each fast
line's weight (``Split.fast_weights``), from ``protocol.sample_weight``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.ingest.combiner import TYPE_CODES, PaneCombiner
from streamgauge.ingest.fastpath import CONFLICT, FastPath, Split, live_keys
from streamgauge.ingest.protocol import sample_weight

TYPE_NAMES = {code: name for name, code in TYPE_CODES.items()}

MAX_VALUE_BYTES = 16
MAX_DIGITS = 15  # < 2**53: the mantissa is exact in a double
_POW10 = np.array([10.0**k for k in range(MAX_DIGITS + 1)])
_NL, _CR, _COLON, _PIPE, _DOT, _MINUS = 10, 13, 58, 124, 46, 45
_GAUGE = 1
_SET = 5  # combiner.TYPE_CODES["s"]


class NumpyFastPath:
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
        self._conflict_keys: dict[str, list[bytes]] = {}
        self._known: pa.Array | None = None
        # A key is name + rest, split at its first ":" (the name holds no other): each part
        # has an id among the known parts, a key is the pair, sorted by its code.
        self._part_index: dict[bytes, int] = {}
        self._parts: pa.Array = pa.array([], pa.binary())
        self._pair_codes = np.zeros(0, dtype=np.int64)  # sorted (name id << 32) | rest id
        self._pair_keys = np.zeros(0, dtype=np.int64)  # key id of each code

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

    # The conflict keys' bookkeeping is FastPath's own (what this oracle checks is the split).
    # Typed for this class: the functions use only attributes both classes have (key_of,
    # _pending, _conflict_keys, _flush_pending, _index, _key_slot).
    remember_conflict: ClassVar[Callable[[NumpyFastPath, bytes, str], None]] = cast(
        "Callable[[NumpyFastPath, bytes, str], None]", FastPath.remember_conflict
    )
    forget_conflicts: ClassVar[Callable[[NumpyFastPath, str], None]] = cast(
        "Callable[[NumpyFastPath, str], None]", FastPath.forget_conflicts
    )

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        # Keys whose slot was freed since: drop them (compaction), then add the new ones.
        live = live_keys(self._key_slot, self._key_gen, self._combiner.slot_gen)
        if len(self._keys) and not live.all() and (~live).sum() * 2 > len(self._keys):
            keep = np.flatnonzero(live)
            self._keys = [self._keys[i] for i in keep.tolist()]
            self._key_slot = self._key_slot[keep]
            self._key_gen = self._key_gen[keep]
            self._key_rate = self._key_rate[keep]
            self._index = {key: i for i, key in enumerate(self._keys)}
            self._known = pa.array(self._keys, pa.binary())
            self._part_index = {}  # parts of dropped keys go too
            self._index_pairs(0)
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
            first_new = len(self._key_slot)
            self._key_slot = np.concatenate([self._key_slot, np.array(slots, dtype=np.int64)])
            self._key_gen = np.concatenate([self._key_gen, np.array(gen_list, dtype=np.int64)])
            self._key_rate = np.concatenate([self._key_rate, np.array(rates, dtype=np.float64)])
            self._known = pa.array(self._keys, pa.binary())
            self._index_pairs(first_new)

    def _index_pairs(self, first: int) -> None:
        """Give the keys from ``first`` on their (name, rest) pair codes (all keys: afresh)."""
        parts = self._part_index
        codes = []
        for key in self._keys[first:]:
            cut = key.index(b":") + 1
            name_id = parts.setdefault(key[:cut], len(parts))
            rest_id = parts.setdefault(key[cut:], len(parts))
            codes.append((name_id << 32) | rest_id)
        self._parts = pa.array(list(parts), pa.binary())
        ids = np.arange(first, len(self._keys), dtype=np.int64)
        new_codes = np.array(codes, dtype=np.int64)
        if first:
            new_codes = np.concatenate([self._pair_codes, new_codes])
            ids = np.concatenate([self._pair_keys, ids])
        order = np.argsort(new_codes, kind="stable")
        self._pair_codes, self._pair_keys = new_codes[order], ids[order]

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
                         np.zeros(0), empty, empty)
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
        conflict = known & (slots == CONFLICT)
        known &= slots >= 0
        slots = np.maximum(slots, 0)
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
        # Added with the compiled path's weights: protocol.sample_weight per line.
        weights = np.array(
            [sample_weight(TYPE_NAMES.get(int(kind), ""), float(rate)) for kind, rate in
             zip(slot_type[fast_mask], self._key_rate[key_ids[fast_mask]], strict=True)],
            dtype=np.int64,
        )  # fmt: skip
        is_fast = np.zeros(len(ends), dtype=bool)
        is_fast[fast] = True
        is_fast[lines[conflict]] = True
        slow = np.flatnonzero(nonempty & ~is_fast)
        return Split(buffer, starts, ends, slow, fast, slots, values, weights, lines[conflict])

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
        if len(self._part_index) > DICT_LOOKUP_RATIO * n:
            # Few lines against many known parts: index_in would hash every known part again
            # (at 100k series most of a receiver's CPU, by py-spy).
            picks = np.arange(0, 4 * n, 4)
            names = pieces.take(pa.array(picks))
            rests = pieces.take(pa.array(picks + 2))
            keys = pc.binary_join_element_wise(names, rests, pa.scalar(b"", binary_type))
            index = self._index
            return np.fromiter((index.get(key, -1) for key in keys.to_pylist()), np.int64, n)
        if not len(self._pair_codes):
            return np.full(n, -1, dtype=np.int64)
        parts = self._parts if binary_type == pa.binary() else self._parts.cast(binary_type)
        part_ids, found = _ids(pc.index_in(pieces, value_set=parts))
        name_ids, rest_ids = part_ids[0::4].astype(np.int64), part_ids[2::4].astype(np.int64)
        codes = (name_ids << 32) | rest_ids  # meaningless where not found: masked below
        pair_codes = self._pair_codes
        at = np.minimum(np.searchsorted(pair_codes, codes), len(pair_codes) - 1)
        hit = found[0::4] & found[2::4] & (pair_codes[at] == codes)
        ids: np.ndarray = np.where(hit, self._pair_keys[at], -1)
        return ids


#: ``_lookup`` looks keys up one by one in the dict when the known names and rests outnumber
#: the lines by this much: ``pc.index_in`` hashes its whole value set again on every call, so
#: it costs per known key and per line, the dict (``to_pylist`` and ``get``) per line only; with
#: far more known keys than lines the dict is orders of magnitude cheaper.
DICT_LOOKUP_RATIO = 2


def _ids(found: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``index_in``'s result read from its buffers: (int32 ids, found); an id is undefined
    where not found. ``fill_null(-1).to_numpy()`` cost several times as much (a float64
    round trip over every piece)."""
    m = len(found)
    validity, values = found.buffers()[0], found.buffers()[1]
    ids = np.frombuffer(values, dtype=np.int32, count=found.offset + m)[found.offset :]
    if validity is None or found.null_count == 0:
        return ids, np.ones(m, dtype=bool)
    valid = np.unpackbits(
        np.frombuffer(validity, dtype=np.uint8), count=found.offset + m, bitorder="little"
    )[found.offset :].view(bool)
    return ids, valid


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
    # One pass per character column, each over every line at once (1-D: row-wise reductions
    # over a lines x width matrix cost several times as much for the usual 1-3 characters).
    last = len(data) - 1
    negative = data[starts] == _MINUS
    mantissa = np.zeros(n, dtype=np.int64)
    ndigits = np.zeros(n, dtype=np.int64)
    fraction_digits = np.zeros(n, dtype=np.int64)
    dots = np.zeros(n, dtype=np.int64)
    bad = np.zeros(n, dtype=bool)
    for column in range(int(widths.max())):
        inside = widths > column
        chars = data[np.minimum(starts + column, last)]
        digit = chars.astype(np.int64) - 48
        is_digit = inside & (digit >= 0) & (digit <= 9)
        is_dot = inside & (chars == _DOT)
        other = inside & ~is_digit & ~is_dot
        if column == 0:
            other &= ~negative
        bad |= other
        mantissa = np.where(is_digit, mantissa * 10 + digit, mantissa)
        ndigits += is_digit
        fraction_digits += is_digit & (dots > 0)
        dots += is_dot
    ok = (
        ~bad & (dots <= 1) & (ndigits >= 1) & (ndigits <= MAX_DIGITS)
        & ~(negative & (mantissa == 0))
    )
    values = mantissa / _POW10[np.minimum(fraction_digits, MAX_DIGITS)]
    values = np.where(negative, -values, values)
    return values, negative, ok
