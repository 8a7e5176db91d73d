"""Whole-buffer parsing for the common line shape, with the general parser as the fallback.

Almost every line a busy StatsD port receives is ``name:value|type[|@rate][|#tags]`` for a
series that was seen a moment ago. For one wake-up's worth of datagrams joined into one buffer,
one compiled pass (numba, ``_scan``) goes over the bytes once and finds, line by line:

- the line's end, its first ``:`` and the first ``|`` after it;
- the value between them, if it is a plain decimal (``-?digits[.digits]``, at most 15
  digits): parsed exactly, as ``m / 10**k`` with both exact in a double — a correctly rounded
  quotient, the same double ``float(text)`` gives;
- the line's **key**, the line with its value cut out (``name:`` + ``|type|...``), hashed in
  its two parts (``name:``, then ``|type|...``) and looked up in an open-addressing table of
  the keys the general parser accepted before; a hit is compared byte for byte with the
  stored key, so a hash collision can cost a probe, never a wrong series.

The pass is one loop over lines, not numpy over the whole buffer: numpy needed a pass per
question (``data == x`` per separator, one per character column of the values) plus pyarrow's
``index_in`` rehashing every known name on every call, several times the compiled pass's cost
per line. The first call compiles it (``cache=True``: later processes load it from
the cache); ``FastPath()`` makes that call, so no datagram waits for the compiler.

Within a line it reads 8 bytes at a time (unaligned little-endian words): the separators are
found with the bit trick for "a byte of this word equals x"; the key's two parts are hashed
word by word (FNV-1a's step on words, the product's high half folded down, murmur3's fmix64
at the end: the table slot comes from the hash's top bits) and compared with the stored key
word by word. Byte by byte (64-bit FNV-1a as the bytes went by) is measurably slower, most of
the difference in the key's byte-by-byte compare and the rest in FNV-1a's chain of multiplies
(``bench/ingest/scan_micro.py`` measures the per-line cost).

A key is cached only after ``parse_line`` accepted a line with it (no ``|T``, no field the
parser does not know: such a line is counted as ``adjusted{unknown_field}`` each time, which
only the general path does), so what the cache says about a key — its series, sample rate,
type — is what ``parse_line`` says about any line with that key and a plain value: the name
and every field but the value are in the key. A set line never takes the fast path (its member
is text, ``users:user:42|s`` included), nor does a multi-value one (``d:1:2:|d``): a ``:`` in
the value is no plain decimal. The key's rate gives each fast line what the general path would:
a counter's value scaled by ``1 / rate`` (``Split.fast_values``), and the number of values a
timer, histogram or distribution sample stands for (``Split.fast_weights``,
``protocol.sample_weight``).

A key whose line the receiver rejected as a ``type_conflict`` (its name has another type, so
every line with that key is one) is cached too, as ``CONFLICT``: its lines come back in
``Split.conflicts`` and the receiver counts them in bulk. The name's type is forgotten when its
last series expires, and its conflict keys with it (``forget_conflicts``). A flood of them
(``bench/ingest/type_flood.py``) took ~6 µs a line through the general parser, ~80 ns now.
Only in a wake-up whose general-path lines hold no metric line, though: beside one (a set, a
new key) the receiver sends the conflicts the general way too, to keep its reject sample in
line order, so a flood mixed with set traffic is still parsed line by line.

A line takes the fast path only if all of this holds; everything else — a new key, ``\\r``,
several values, gauge signs (deltas), ``-0``, exponents, long lines, a series the cardinality
guard would have to (re)admit — goes to the general parser, line by line, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import numba
import numpy as np

from streamgauge.ingest.combiner import PaneCombiner
from streamgauge.ingest.intrinsics import address_of, as_int64, load_i64, load_u64, trailing_zeros
from streamgauge.ingest.protocol import MAX_SAMPLE_WEIGHT

MAX_VALUE_BYTES = 16
MAX_DIGITS = 15  # < 2**53: the mantissa is exact in a double
_POW10 = np.array([10.0**k for k in range(MAX_DIGITS + 1)])
_NL, _CR, _COLON, _PIPE, _DOT, _MINUS, _ZERO, _NINE = 10, 13, 58, 124, 46, 45, 48, 57
_COUNTER = 0
_GAUGE = 1
_TIMER, _DISTRIBUTION = 2, 4  # combiner.TYPE_CODES: "ms" 2, "h" 3, "d" 4 are weighted by rate
_SET = 5  # combiner.TYPE_CODES["s"]
_MAX_WEIGHT = MAX_SAMPLE_WEIGHT
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: a table slot from the top bits
_HASH_SEED = np.uint64(0xCBF29CE484222325)
_HASH_MUL = np.uint64(0x100000001B3)  # FNV's prime: odd, so (h ^ word) * it loses nothing
_FMIX_1 = np.uint64(0xFF51AFD7ED558CCD)  # murmur3's fmix64
_FMIX_2 = np.uint64(0xC4CEB9FE1A85EC53)
_ONES = np.uint64(0x0101010101010101)  # a byte in every byte of a word
_HIGHS = np.uint64(0x8080808080808080)
_NL_WORD = np.uint64(_NL * 0x0101010101010101)
_COLON_WORD = np.uint64(_COLON * 0x0101010101010101)
_PIPE_WORD = np.uint64(_PIPE * 0x0101010101010101)
WORD = 8
_MIN_TABLE_BITS = 4
# A table entry: the key's id in the low 32 bits, its hash's high 32 above (a probe passes
# over other keys without reading anything of theirs, and a hit reads no key_hash: one random
# read less per line); -1 when empty. Key ids stay far below 2**31.
_EMPTY = -1
#: ``key_slot`` of a key whose name has another type: its lines are ``type_conflict`` rejects
#: (counted by the receiver in bulk), until the name's type is forgotten.
CONFLICT = -1
#: ``key_slot`` of a conflict key whose name's type was forgotten: the general path decides.
_FORGOTTEN = -2
_KEY_MASK = 0xFFFFFFFF
_TAG_BITS = np.uint64(0xFFFFFFFF00000000)

_F = TypeVar("_F", bound=Callable[..., Any])


def _jit(function: _F) -> _F:
    """numba's ``njit``, typed for mypy (numba ships no annotations). ``nogil``: the read-ahead
    thread keeps reading the socket while a buffer is parsed."""
    return cast(_F, numba.njit(cache=True, nogil=True)(function))


def _inline(function: _F) -> _F:
    """``_jit``, inlined into its callers by numba itself (LLVM left ``_find`` and
    ``_hash_bytes`` as calls from ``_scan``). For helpers without array arguments only: numba
    counts an array's references where it inlines one (atomic increments on every call)."""
    return cast(_F, numba.njit(cache=True, nogil=True, inline="always")(function))




def live_keys(key_slot: np.ndarray, key_gen: np.ndarray, slot_gen: np.ndarray) -> np.ndarray:
    """Which cached keys still hold: a series' key whose slot has the generation it was
    cached with (a freed slot's has moved on), or a conflict key not forgotten."""
    live: np.ndarray = np.where(key_slot >= 0, key_gen == slot_gen[np.maximum(key_slot, 0)],
                                key_slot == CONFLICT)  # fmt: skip
    return live


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
    fast_weights: np.ndarray  # values each stands for: protocol.sample_weight (int64)
    conflicts: np.ndarray  # indices of lines whose key is a type conflict, in order

    def lines(self, indices: np.ndarray) -> list[bytes]:
        buffer, starts, ends = self.buffer, self.starts, self.ends
        return [buffer[starts[i] : ends[i]] for i in indices.tolist()]


class FastPath:
    """The key cache and the compiled splitter of one receiver."""

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
        self._conflict_keys: dict[str, list[bytes]] = {}  # by name: its keys marked CONFLICT
        # The keys' bytes end to end (key i: key_bytes[offsets[i]:offsets[i + 1]]) and WORD
        # zero bytes (_word reads need an array of at least a word), their hashes, and the
        # hash table of key ids and hash tags (-1: empty; at most half full).
        self._key_bytes = np.zeros(WORD, dtype=np.uint8)
        self._key_offsets = np.zeros(1, dtype=np.int64)
        self._key_hash = np.zeros(0, dtype=np.uint64)
        self._table = np.full(1 << _MIN_TABLE_BITS, _EMPTY, dtype=np.int64)
        self._shift = np.uint64(64 - _MIN_TABLE_BITS)
        # Compile (or load from numba's cache) every jitted function now, not on the first
        # datagram: the first compile takes seconds. Every later call must pass the same
        # array types (a read-only array is another type: another compile, on the receive
        # thread; test_fastpath_oracle checks there is none).
        _hash_keys(self._key_bytes, self._key_offsets, 0)
        _insert(self._table, self._shift, self._key_hash, 0)
        self.split(b"a:1|c\n", 0)

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
        """``parse_line`` accepted ``line`` (one value, no ``|T``, no unknown field) as series
        ``slot``.

        Sets never take the fast path: their value is a member (text), not a number.
        """
        if self._combiner.slot_type[slot] == _SET:
            return
        key = self.key_of(line)
        if key is not None:
            self._pending.append((key, slot, int(self._combiner.slot_gen[slot]), sample_rate))

    def remember_conflict(self, line: bytes, metric: str) -> None:
        """``line`` (one value, no ``|T``) was a ``type_conflict``: ``metric`` has another
        type. Every line with its key and a plain value is one too, until ``forget_conflicts``.

        A type flood (a client sending a name as a gauge that others send as a counter) would
        otherwise take the general parser line by line, far slower than the fast path: at a
        busy port the kernel would drop most of it (``bench/ingest/type_flood.py``).
        """
        key = self.key_of(line)
        if key is not None:
            self._pending.append((key, CONFLICT, 0, 1.0))
            self._conflict_keys.setdefault(metric, []).append(key)

    def forget_conflicts(self, metric: str) -> None:
        """``metric``'s type was forgotten (it has no active series): its conflict keys go
        back to the general path, which decides afresh."""
        keys = self._conflict_keys.pop(metric, None)
        if keys is None:
            return
        self._flush_pending()
        for key in keys:
            index = self._index.get(key)
            if index is not None and self._key_slot[index] == CONFLICT:
                self._key_slot[index] = _FORGOTTEN

    def _flush_pending(self) -> None:
        if not self._pending:
            return
        # Keys whose slot was freed since (or forgotten conflicts): drop them (compaction),
        # then add the new ones.
        live = live_keys(self._key_slot, self._key_gen, self._combiner.slot_gen)
        if len(self._keys) and not live.all() and (~live).sum() * 2 > len(self._keys):
            keep = np.flatnonzero(live)
            self._keys = [self._keys[i] for i in keep.tolist()]
            self._key_slot = self._key_slot[keep]
            self._key_gen = self._key_gen[keep]
            self._key_rate = self._key_rate[keep]
            self._index = {key: i for i, key in enumerate(self._keys)}
            self._add_keys(0)
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
            self._add_keys(first_new)

    def _add_keys(self, first: int) -> None:
        """Store and hash the keys from ``first`` on (all keys: afresh) and put them in the
        table; a table more than half full is rebuilt at twice the size."""
        new = self._keys[first:]
        lengths = np.fromiter(map(len, new), dtype=np.int64, count=len(new))
        new_bytes = np.frombuffer(bytearray(b"".join(new) + bytes(WORD)), dtype=np.uint8)
        if first == 0:  # (bytearray: writable; a read-only array would compile another _scan)
            self._key_bytes, self._key_offsets = new_bytes, np.zeros(1, dtype=np.int64)
        else:
            self._key_bytes = np.concatenate([self._key_bytes[:-WORD], new_bytes])
        ends = self._key_offsets[-1] + np.cumsum(lengths)
        self._key_offsets = np.concatenate([self._key_offsets, ends])
        new_hashes = _hash_keys(self._key_bytes, self._key_offsets, first)
        self._key_hash = np.concatenate([self._key_hash[:first], new_hashes])
        if first == 0 or 2 * len(self._keys) > len(self._table):
            bits = max(_MIN_TABLE_BITS, (4 * len(self._keys)).bit_length())
            self._table = np.full(1 << bits, _EMPTY, dtype=np.int64)
            self._shift = np.uint64(64 - bits)
            first = 0
        _insert(self._table, self._shift, self._key_hash, first)

    def split(self, buffer: bytes, recv_ms: int) -> Split:
        """Split ``buffer`` (lines ending in ``\\n``) into fast and general lines."""
        self._flush_pending()
        combiner = self._combiner
        # At least a word for _scan's word reads (zeros after the last "\n" are no line).
        # Counted in numba: bytes.count took ~25 ns per line (20 lines per datagram).
        data = np.frombuffer(buffer if len(buffer) >= WORD else buffer.ljust(WORD, b"\0"),
                             dtype=np.uint8)  # fmt: skip
        starts, ends, slow, fast, slots, values, weights, conflicts = _scan(
            data, _count_lines(data), self._max_line_bytes,
            self._table, self._shift, self._key_offsets, self._key_bytes,
            self._key_slot, self._key_gen, self._key_rate,
            combiner.slot_type, combiner.slot_gen, combiner.admitted, combiner.seen_ms,
            # a series the guard might expire must be re-admitted in line order: general path
            recv_ms - self._ttl_ms,
        )  # fmt: skip
        # numba hands back arrays whose dtype is an equal but not the identical (canonical)
        # dtype object; numpy's ufunc.at then takes its casting loop: add_fast's
        # np.maximum.at ran ~20x slower (80 ns per value) until re-viewed here.
        return Split(
            buffer, starts.view(np.int64), ends.view(np.int64), slow.view(np.int64),
            fast.view(np.int64), slots.view(np.int64), values.view(np.float64),
            weights.view(np.int64), conflicts.view(np.int64),
        )


@_jit
def _scan(
    data: np.ndarray, n_lines: int, max_line_bytes: int,
    table: np.ndarray, shift: np.uint64, key_offsets: np.ndarray,
    key_bytes: np.ndarray, key_slot: np.ndarray, key_gen: np.ndarray, key_rate: np.ndarray,
    slot_type: np.ndarray, slot_gen: np.ndarray, admitted: np.ndarray, seen_ms: np.ndarray,
    seen_after: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
           np.ndarray, np.ndarray]:
    """``FastPath.split``'s arrays: (starts, ends, slow, fast, fast slots, fast values,
    fast weights, conflicts) of the
    ``n_lines`` lines of ``data`` (each ends in ``\\n``, the count of which is ``n_lines``:
    no search goes past the last one, so none checks for the end; ``data`` holds at least
    ``WORD`` bytes)."""
    starts = np.empty(n_lines, dtype=np.int64)
    ends = np.empty(n_lines, dtype=np.int64)
    slow = np.empty(n_lines, dtype=np.int64)
    fast = np.empty(n_lines, dtype=np.int64)
    fast_slots = np.empty(n_lines, dtype=np.int64)
    fast_values = np.empty(n_lines, dtype=np.float64)
    fast_weights = np.empty(n_lines, dtype=np.int64)
    conflicts = np.empty(n_lines, dtype=np.int64)
    n_slow = n_fast = n_conflicts = 0
    base, key_base = address_of(data), address_of(key_bytes)
    table_base, offsets_base, mask = address_of(table), address_of(key_offsets), len(table) - 1
    limit, key_limit = base + len(data), key_base + len(key_bytes)
    pos = 0
    for line in range(n_lines):
        start = pos
        colon = pipe = -1
        # The line's first ":" (or its end), then the first "|" after it, then its end.
        end = _find_byte(base + pos, limit, _COLON_WORD) - base
        if data[np.uint64(end)] == _COLON:
            colon = end
            end = _find_byte(base + colon + 1, limit, _PIPE_WORD) - base
            if data[np.uint64(end)] == _PIPE:
                pipe = end
                end = _find_byte(base + pipe + 1, limit, _NL_WORD) - base
        pos = end + 1
        starts[line], ends[line] = start, end
        if end == start:
            continue
        width = pipe - colon - 1
        if (
            pipe >= 0 and 1 <= width <= MAX_VALUE_BYTES and end - start <= max_line_bytes
            and data[end - 1] != _CR
        ):
            ok, negative, value = _parse_value(data, colon + 1, width)
            if ok:
                # The key: the name up to its first ":" (included), then all from the "|" on.
                h = _hash_bytes(_HASH_SEED, base + start, colon + 1 - start, limit)
                h = _finish(_hash_bytes(h, base + pipe, end - pipe, limit),
                            colon + 1 - start + end - pipe)  # fmt: skip
                key = _find(
                    h, base + start, colon + 1 - start, base + pipe, end - pipe, limit,
                    table_base, mask, shift, offsets_base, key_base, key_limit,
                )
                slot = key_slot[key] if key >= 0 else _FORGOTTEN
                if slot == CONFLICT:
                    conflicts[n_conflicts] = line
                    n_conflicts += 1
                    continue
                if slot >= 0:
                    kind = slot_type[slot]
                    if (
                        key_gen[key] == slot_gen[slot] and admitted[slot]
                        and seen_ms[slot] > seen_after
                        and not (negative and kind == _GAUGE)  # "-5|g" is a delta
                    ):
                        fast[n_fast] = line
                        fast_slots[n_fast] = slot
                        fast_values[n_fast] = value / key_rate[key] if kind == _COUNTER else value
                        # protocol.sample_weight, the same float operations
                        weight = np.int64(1)
                        if _TIMER <= kind <= _DISTRIBUTION:
                            inverse = 1.0 / key_rate[key]
                            weight = np.int64(inverse) if inverse < _MAX_WEIGHT else np.int64(
                                _MAX_WEIGHT)
                        fast_weights[n_fast] = weight
                        n_fast += 1
                        continue
        slow[n_slow] = line
        n_slow += 1
    return (
        starts, ends, slow[:n_slow], fast[:n_fast], fast_slots[:n_fast], fast_values[:n_fast],
        fast_weights[:n_fast], conflicts[:n_conflicts],
    )


@_inline
def _find(
    h: np.uint64, name: int, name_length: int, rest: int, rest_length: int, limit: int,
    table: int, mask: int, shift: np.uint64, key_offsets: int, key_base: int, key_limit: int,
) -> int:
    """The id of the key with hash ``h`` whose bytes are the ``name_length`` at address
    ``name`` then the ``rest_length`` at ``rest`` (both before ``limit``), -1 if not stored.
    Linear probing; the table always has an empty slot, which ends a miss. The int64 arrays
    by address (``table``: ``mask + 1`` entries, ``key_offsets``); a key whose hash's high
    half (in its entry) differs is passed over without reading anything else of it."""
    length = name_length + rest_length
    tag = h & _TAG_BITS
    i = as_int64((h * _GOLDEN) >> shift)
    while True:
        entry = load_i64(table + 8 * i)
        if entry == _EMPTY:
            return -1
        key = entry & _KEY_MASK
        offset = load_i64(key_offsets + 8 * key)
        if (np.uint64(entry) & _TAG_BITS == tag
                and load_i64(key_offsets + 8 * key + 8) - offset == length):
            key_name = key_base + offset
            if _same_bytes(key_name, name, name_length, key_limit, limit) and _same_bytes(
                key_name + name_length, rest, rest_length, key_limit, limit
            ):
                return key
        i = (i + 1) & mask


@_jit
def _hash_keys(key_bytes: np.ndarray, key_offsets: np.ndarray, first: int) -> np.ndarray:
    """The hashes of the stored keys from ``first`` on: the one ``_scan`` takes of a line's
    key, in the same two parts (a key's first ":" is its line's first: the name's end)."""
    hashes = np.empty(len(key_offsets) - 1 - first, dtype=np.uint64)
    base = address_of(key_bytes)
    limit = base + len(key_bytes)
    for key in range(first, len(key_offsets) - 1):
        start, end = key_offsets[key], key_offsets[key + 1]
        name_end = _find_byte(base + start, limit, _COLON_WORD) + 1 - base  # key_of: has ":"
        h = _hash_bytes(_HASH_SEED, base + start, name_end - start, limit)
        hashes[key - first] = _finish(_hash_bytes(h, base + name_end, end - name_end, limit),
                                      end - start)  # fmt: skip
    return hashes


@_jit
def _count_lines(data: np.ndarray) -> int:
    """The ``\\n`` in ``data`` (a loop LLVM vectorizes)."""
    count = 0
    for i in range(len(data)):
        if data[i] == _NL:
            count += 1
    return count


@_inline
def _word(address: int, limit: int) -> np.uint64:
    """The 8 bytes from ``address`` on, zeros for those at or past ``limit``, the end of an
    array of at least 8 bytes (so the word that ends there is in it)."""
    if address + WORD <= limit:
        return load_u64(address)
    return load_u64(limit - WORD) >> np.uint64(8 * (address + WORD - limit))


@_inline
def _first_bytes(word: np.uint64, n: int) -> np.uint64:
    """The ``n`` (1 to 7) first bytes of ``word``, zeros above."""
    return word & ((np.uint64(1) << np.uint64(8 * n)) - np.uint64(1))


@_inline
def _find_byte(address: int, limit: int, pattern: np.uint64) -> int:
    """The address of the first ``\\n``, or byte of ``pattern`` (one byte 8 times), from
    ``address`` on; there is one before ``limit``. A word at a time: ``(x - ONES) & ~x &
    HIGHS`` has the top bit of x's lowest zero byte set, and none below it (bits above it may
    be wrong, after a borrow: only the lowest is used)."""
    while True:
        word = _word(address, limit)
        nl, other = word ^ _NL_WORD, word ^ pattern
        found = ((nl - _ONES) & ~nl | (other - _ONES) & ~other) & _HIGHS
        if found:
            return address + (trailing_zeros(found) >> 3)
        address += WORD


@_inline
def _mix(h: np.uint64, word: np.uint64) -> np.uint64:
    """One word into the hash: FNV-1a's step on words, then the product's high half folded
    down (a product's low bits depend only on its factors' low bits: folded, every bit of
    this word reaches the bits the next words meet)."""
    h = (h ^ word) * _HASH_MUL
    return h ^ (h >> np.uint64(32))


@_inline
def _hash_bytes(h: np.uint64, address: int, n: int, limit: int) -> np.uint64:
    """``h`` with the ``n`` bytes at ``address`` (before ``limit``) mixed in, word by word
    (the last one zero-padded)."""
    while n >= WORD:
        h = _mix(h, load_u64(address))
        address += WORD
        n -= WORD
    if n > 0:
        h = _mix(h, _first_bytes(_word(address, limit), n))
    return h


@_inline
def _finish(h: np.uint64, length: int) -> np.uint64:
    """The key's hash: its length in, then murmur3's fmix64, so that every byte moves the
    top bits Fibonacci hashing takes the table slot from."""
    h ^= np.uint64(length)
    h = (h ^ (h >> np.uint64(33))) * _FMIX_1
    h = (h ^ (h >> np.uint64(33))) * _FMIX_2
    return h ^ (h >> np.uint64(33))


@_inline
def _same_bytes(a: int, b: int, n: int, a_limit: int, b_limit: int) -> bool:
    """The ``n`` bytes at address ``a`` (before ``a_limit``) equal those at ``b`` (before
    ``b_limit``), a word at a time."""
    while n >= WORD:
        if load_u64(a) != load_u64(b):
            return False
        a += WORD
        b += WORD
        n -= WORD
    return n == 0 or _first_bytes(_word(a, a_limit) ^ _word(b, b_limit), n) == 0


@_jit
def _insert(table: np.ndarray, shift: np.uint64, key_hash: np.ndarray, first: int) -> None:
    """Put the keys from ``first`` on into ``table`` (none of them is in it yet), each as its
    id under its hash's high half (``_find``)."""
    mask = len(table) - 1
    for key in range(first, len(key_hash)):
        h = key_hash[key]
        i = np.int64((h * _GOLDEN) >> shift)
        while table[i] != _EMPTY:
            i = (i + 1) & mask
        table[i] = as_int64(h & _TAG_BITS | np.uint64(key))


@_jit
def _parse_value(data: np.ndarray, start: int, width: int) -> tuple[bool, bool, float]:
    """A plain decimal ``-?digits[.digits]`` (``1.``, ``.5`` included) → (ok, negative, value).

    Exactly ``float(text)``: the digits as an integer m < 10**15 and the fraction digits k ≤ 15
    are both exact doubles, so ``m / 10**k`` is the correctly rounded value of the decimal.
    ``-0`` forms are not ok (their -0.0 takes the general path)."""
    negative = data[start] == _MINUS
    mantissa = ndigits = fraction_digits = dots = 0
    for pos in range(start + 1 if negative else start, start + width):
        c = data[pos]
        if _ZERO <= c <= _NINE:
            mantissa = mantissa * 10 + (c - _ZERO)  # int64 (uint8 - int64); < 10**16
            ndigits += 1
            if dots:
                fraction_digits += 1
        elif c == _DOT and not dots:
            dots = 1
        else:
            return False, negative, 0.0
    if ndigits < 1 or ndigits > MAX_DIGITS or (negative and mantissa == 0):
        return False, negative, 0.0
    value = mantissa / _POW10[fraction_digits]
    return True, negative, -value if negative else value


@_jit
def _parse_values(
    data: np.ndarray, starts: np.ndarray, widths: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``_parse_value`` over many values → (values, negative, ok): its table form, for tests."""
    n = len(starts)
    values = np.zeros(n, dtype=np.float64)
    negative = np.zeros(n, dtype=np.bool_)
    ok = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        ok[i], negative[i], values[i] = _parse_value(data, starts[i], widths[i])
    return values, negative, ok
