"""The standard HdrHistogram V2 encoding of many sparse histograms in one compiled pass.

Why: every published timer/histogram/distribution window stores ``hdr_histogram``, its HDR
histogram in the HdrHistogram family's compressed V2 form, base64 (so the Java, C, Go and Rust
HdrHistogram tools read it). :meth:`HdrLayout.encode <streamgauge.sketches.hdr.HdrLayout.encode>`
goes through the ``hdrhistogram`` package, one Python call and a fresh histogram object per
window (~50 µs); :func:`encode_v2` encodes every window of a batch in one numba pass.

Contract: :func:`encode_v2` takes ``n`` sparse histograms as CSR columns (row ``i`` is bucket
indices ``buckets[offsets[i]:offsets[i + 1]]``, strictly increasing, into the layout's counts
array, and ``counts`` beside them, ≥ 0) and returns a ``pa.string()`` array (``large_string``
beyond 2 GiB of text) whose row ``i`` ``HdrHistogram.decode`` (``hdrh``) and
:meth:`HdrLayout.decode` read back as exactly that row's non-zero counts, with the layout's
lowest, highest and significant digits and the integer-to-double conversion ratio
``1 / value_scale``, as :meth:`HdrLayout.encode` writes them. A row without buckets is NULL:
the callers (``window_sketches.columns``, ``sketch_windows``, ``open_windows._encoded``) store
NULL for a window without buckets. A row whose buckets all have count 0 is an empty histogram,
as :meth:`HdrLayout.encode` gives it.

What is written (``hdrh/codec.py`` and the package's C ``encode``): the *payload*, the same
bytes :meth:`HdrLayout.encode` compresses (:func:`v2_payloads` returns them; the tests compare):

- a header, big-endian: cookie ``0x1c849313`` (V2, word size 9), payload length, normalizing
  index offset 0, significant digits, lowest and highest trackable value (u64), the conversion
  ratio (f64) — 40 bytes;
- the counts ``0 .. max non-zero index`` (the package's ``get_counts_array_index(max_value) +
  1``, which is that index + 1 for every index), each as ZigZag LEB128 and every run of ``k``
  zeros as the one value ``-k``; LEB128 as HdrHistogram writes it: at most 9 bytes, the ninth a
  full 8 bits; no counts at all for an empty histogram.

Then the payload zlib-compressed, behind a compression header (cookie ``0x1c849314``,
compressed length, big-endian), the whole base64 (standard alphabet, ``=`` padded), per row.

The zlib stream is built here too, so no row costs a Python call: one deflate block with the
*fixed* Huffman codes over greedy LZ77 matches (3-byte hash chains, the newest 4 candidates per
position: zlib's level-1 ``deflate_fast``), or with ``compress=False`` *stored* blocks
(≤ 65 535 bytes each, LEN/NLEN); then the Adler-32. Any zlib reader inflates either. For small
payloads ``zlib.compress`` picks a fixed-Huffman block too; for larger ones it builds dynamic
Huffman codes and searches longer (lazy matching, longer chains): ~5 % smaller at 100 values
(~92 buckets: 242 base64 bytes a window here), not worth the time here. Stored blocks take about
half the time and are ~1/3 larger (317 bytes). ``bench/sketch_columns.py`` times both;
``bench/hdr_encoding.py`` compares them with ``HdrLayout.encode`` and ``zlib.compress`` per row.

Large batches run in chunks of rows on several threads (:mod:`streamgauge.sketches.kernels`):
every row's text is a function of that row alone, the same for any number of threads.

Counts up to 2^63 - 1 are written as the format says; ``hdrh``'s own decoder drops the ninth
LEB128 byte's top bit, so it reads counts ≥ 2^62 wrong, from this encoder or its own.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt
import pyarrow as pa

from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.kernels import chunk_bounds, compact, run_chunks

__all__ = ["encode_v2", "v2_payloads"]

IntArray = npt.NDArray[np.int64]
ByteArray = npt.NDArray[np.uint8]
Int32Array = npt.NDArray[np.int32]

_F = TypeVar("_F", bound=Callable[..., Any])

#: V2 encoding cookie with word size 9 (the payload header's) and the compression cookie.
ENCODING_COOKIE = 0x1C849313
COMPRESSION_COOKIE = 0x1C849314
#: Bytes of the payload header: cookie, length, offset, digits (u32), lowest, highest (u64),
#: conversion ratio (f64).
PAYLOAD_HEADER_LEN = 40
#: Largest stored deflate block.
STORED_BLOCK = 65535
#: Text beyond this many bytes does not fit ``pa.string()``'s int32 offsets.
MAX_STRING_BYTES = 2**31 - 1

_BASE64 = np.frombuffer(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", dtype=np.uint8
).copy()

# LZ77: 3-byte hash chains, at most _MAX_CHAIN candidates per position, deflate's limits.
_HASH_BITS = 12
_MAX_CHAIN = 4
_TOO_FAR = 4096
_MIN_MATCH = 3
_MAX_MATCH = 258
_WINDOW = 32768

# Status codes of _plan (status = code + 4 * row).
_OK, _BAD_INDEX, _NOT_INCREASING, _NEGATIVE_COUNT = 0, 1, 2, 3


def _reversed(code: int, length: int) -> int:
    """A Huffman code's bits in the order deflate emits them (LSB-first packing)."""
    out = 0
    for _ in range(length):
        out = (out << 1) | (code & 1)
        code >>= 1
    return out


def _fixed_tables() -> tuple[IntArray, IntArray, IntArray, IntArray, IntArray, IntArray]:
    """Bits to emit (code reversed, extra bits above it) and their number, per literal byte,
    per match length 0..258 and per distance 0..32768, in the fixed Huffman code (RFC 1951
    3.2.6)."""

    def literal(symbol: int) -> tuple[int, int]:
        if symbol < 144:
            return _reversed(0x30 + symbol, 8), 8
        if symbol < 256:
            return _reversed(0x190 + symbol - 144, 9), 9
        if symbol < 280:
            return _reversed(symbol - 256, 7), 7
        return _reversed(0xC0 + symbol - 280, 8), 8

    lit_bits = np.zeros(256, np.int64)
    lit_n = np.zeros(256, np.int64)
    for v in range(256):
        lit_bits[v], lit_n[v] = literal(v)
    length_base = [3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67,
                   83, 99, 115, 131, 163, 195, 227, 258]  # fmt: skip
    length_extra = [0] * 8 + [1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0]
    len_bits = np.zeros(_MAX_MATCH + 1, np.int64)
    len_n = np.zeros(_MAX_MATCH + 1, np.int64)
    for length in range(_MIN_MATCH, _MAX_MATCH + 1):
        k = max(i for i, base in enumerate(length_base) if base <= length)
        code, n = literal(257 + k)
        len_bits[length] = code | ((length - length_base[k]) << n)
        len_n[length] = n + length_extra[k]
    dist_base = [1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769,
                 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577]  # fmt: skip
    dist_bits = np.zeros(_WINDOW + 1, np.int64)
    dist_n = np.zeros(_WINDOW + 1, np.int64)
    for k, base in enumerate(dist_base):
        extra = max(0, k // 2 - 1)
        d = np.arange(base, min(base + (1 << extra), _WINDOW + 1))
        dist_bits[d] = _reversed(k, 5) | ((d - base) << 5)
        dist_n[d] = 5 + extra
    return lit_bits, lit_n, len_bits, len_n, dist_bits, dist_n


_TABLES = _fixed_tables()


def _jit(function: _F) -> _F:
    """numba's ``njit``, typed for mypy (numba ships no annotations)."""
    return cast(_F, numba.njit(cache=True, nogil=True)(function))


@_jit
def _varint_len(z: Any) -> Any:
    """Bytes of HdrHistogram's LEB128 for the 64-bit pattern ``z`` (a ZigZag value)."""
    n = 1
    for _ in range(8):
        z = (z >> 7) & 0x01FFFFFFFFFFFFFF  # logical shift of the 64-bit pattern
        if z == 0:
            return n
        n += 1
    return n


@_jit
def _put_varint(out: Any, pos: Any, z: Any) -> Any:
    """Write ``z``'s LEB128 at ``out[pos]``: 7 bits a byte, the ninth byte 8 bits; new pos."""
    for _ in range(8):
        rest = (z >> 7) & 0x01FFFFFFFFFFFFFF
        if rest == 0:
            out[pos] = z & 0x7F
            return pos + 1
        out[pos] = (z & 0x7F) | 0x80
        pos += 1
        z = rest
    out[pos] = z & 0xFF
    return pos + 1


@_jit
def _put_u32(out: Any, pos: Any, value: Any) -> None:
    """``value`` as 4 big-endian bytes at ``out[pos]``."""
    out[pos] = (value >> 24) & 0xFF
    out[pos + 1] = (value >> 16) & 0xFF
    out[pos + 2] = (value >> 8) & 0xFF
    out[pos + 3] = value & 0xFF


@_jit
def _plan_rows(offsets: Any, buckets: Any, counts: Any, counts_len: Any, payload_len: Any,
               first: Any, last: Any) -> Any:  # fmt: skip
    """Rows ``first .. last - 1``: each payload's length (header + counts; 0 for a row without
    buckets) into ``payload_len``; status ``0`` or ``code + 4 * row`` of the first row that
    breaks the contract (the rows after it are not planned)."""
    for i in range(first, last):
        lo = offsets[i]
        hi = offsets[i + 1]
        payload_len[i] = 0
        if hi == lo:
            continue
        size = PAYLOAD_HEADER_LEN
        last_index = -1  # index of the last non-zero count
        previous = -1
        for j in range(lo, hi):
            b = buckets[j]
            c = counts[j]
            if b < 0 or b >= counts_len:
                return _BAD_INDEX + 4 * i
            if b <= previous:
                return _NOT_INCREASING + 4 * i
            if c < 0:
                return _NEGATIVE_COUNT + 4 * i
            previous = b
            if c == 0:
                continue
            gap = b - last_index - 1
            if gap > 0:
                size += _varint_len(2 * gap - 1)  # ZigZag of -gap
            size += _varint_len(c << 1)  # ZigZag of c >= 0 (past 2^62, a 64-bit pattern)
            last_index = b
        payload_len[i] = size
    return _OK


@_jit
def _plan(offsets: Any, buckets: Any, counts: Any, counts_len: Any) -> Any:
    """``_plan_rows`` of every row, in one thread: ``(payload_len, status)``."""
    payload_len = np.zeros(len(offsets) - 1, np.int64)
    status = _plan_rows(offsets, buckets, counts, counts_len, payload_len, 0, len(offsets) - 1)
    return payload_len, status


@_jit
def _put_payload(out: Any, pos: Any, buckets: Any, counts: Any, lo: Any, hi: Any,
                 header: Any, counts_len: Any) -> Any:  # fmt: skip
    """Write row ``buckets[lo:hi]``'s payload at ``out[pos]``: its end and status (``_OK``, or
    the code of the row's first problem: then the payload is not whole)."""
    for k in range(PAYLOAD_HEADER_LEN):  # loops, not slice assignment: compiles 2 s faster
        out[pos + k] = header[k]
    w = pos + PAYLOAD_HEADER_LEN
    last = -1
    previous = -1
    for j in range(lo, hi):
        c = counts[j]
        b = buckets[j]
        if b < 0 or b >= counts_len:
            return w, _BAD_INDEX
        if b <= previous:
            return w, _NOT_INCREASING
        if c < 0:
            return w, _NEGATIVE_COUNT
        previous = b
        if c == 0:
            continue
        gap = b - last - 1
        # one-byte values (nearly all) written here, the rest by _put_varint: a call per value
        # costs more than the value
        if gap > 0:
            z = 2 * gap - 1  # ZigZag of -gap
            if z < 0x80:
                out[w] = z
                w += 1
            else:
                w = _put_varint(out, w, z)
        z = c << 1  # ZigZag of c >= 0 (past 2^62, a 64-bit pattern: negative here)
        if 0 <= z < 0x80:
            out[w] = z
            w += 1
        else:
            w = _put_varint(out, w, z)
        last = b
    _put_u32(out, pos + 4, w - pos - PAYLOAD_HEADER_LEN)
    return w, _OK


@_jit
def _payloads(offsets: Any, buckets: Any, counts: Any, payload_offsets: Any, header: Any,
              counts_len: Any) -> Any:  # fmt: skip
    """Every row's payload at ``data[payload_offsets[i]:payload_offsets[i + 1]]``."""
    data = np.empty(payload_offsets[-1], np.uint8)
    for i in range(len(offsets) - 1):
        if offsets[i + 1] > offsets[i]:
            _put_payload(data, payload_offsets[i], buckets, counts, offsets[i], offsets[i + 1],
                         header, counts_len)  # fmt: skip
    return data


@_jit
def _adler32(data: Any, size: Any) -> Any:
    """zlib's Adler-32 of ``data[:size]`` (sums reduced every 5552 bytes, zlib's NMAX)."""
    s1 = 1
    s2 = 0
    k = 0
    while k < size:
        stop = min(size, k + 5552)
        for t in range(k, stop):
            s1 += data[t]
            s2 += s1
        s1 %= 65521
        s2 %= 65521
        k = stop
    return (s2 << 16) | s1


@_jit
def _deflate_fixed(data: Any, size: Any, out: Any, w: Any, head: Any, chain: Any, base: Any,
                   lit_bits: Any, lit_n: Any, len_bits: Any, len_n: Any, dist_bits: Any,
                   dist_n: Any) -> Any:  # fmt: skip
    """One final fixed-Huffman deflate block of ``data[:size]`` at ``out[w]``; its end.

    Greedy LZ77 (zlib's ``deflate_fast``): at each position the longest earlier match among
    the newest ``_MAX_CHAIN`` positions with the same 3-byte hash, emitted if it has at least
    3 bytes (a 3-byte match only within ``_TOO_FAR``), else a literal; every position passed is
    hashed in. ``head`` (hash -> newest position) holds positions numbered from ``base`` for
    this input, so entries of earlier inputs (below ``base``) need no reset; ``chain`` links a
    position to the previous one with its hash. Bits collect in a 64-bit word, 32 at a time
    written out. Everything is written out inline: a call per byte costs more than its work."""
    acc = np.int64(3)  # BFINAL = 1, BTYPE = 01
    nbits = 3
    mask = (1 << _HASH_BITS) - 1
    t = 0
    while t < size:
        best = 0
        distance = 0
        if t + _MIN_MATCH <= size:
            key = (np.int64(data[t]) << 16) | (np.int64(data[t + 1]) << 8) | np.int64(data[t + 2])
            h = ((key * 2654435761) >> 12) & mask
            candidate = head[h]
            head[h] = base + t
            chain[t] = candidate
            limit = min(_MAX_MATCH, size - t)
            tries = 0
            while candidate >= base and tries < _MAX_CHAIN:
                s = candidate - base
                if t - s > _WINDOW:
                    break
                if data[s + best] == data[t + best]:  # can it beat the best? (cheap first test)
                    m = 0
                    while m < limit and data[s + m] == data[t + m]:
                        m += 1
                    if m > best:
                        best = m
                        distance = t - s
                        if m == limit:
                            break
                candidate = chain[s]
                tries += 1
        if best > _MIN_MATCH or (best == _MIN_MATCH and distance <= _TOO_FAR):
            # a 3-byte match farther than _TOO_FAR costs about what its literals do (zlib's)
            acc |= len_bits[best] << nbits
            nbits += len_n[best]
            acc |= dist_bits[distance] << nbits
            nbits += dist_n[distance]
            end = t + best
            for u in range(t + 1, min(end, size - _MIN_MATCH + 1)):
                key = (np.int64(data[u]) << 16) | (np.int64(data[u + 1]) << 8) | np.int64(
                    data[u + 2])  # fmt: skip
                h = ((key * 2654435761) >> 12) & mask
                chain[u] = head[h]
                head[h] = base + u
            t = end
        else:
            v = data[t]
            acc |= lit_bits[v] << nbits
            nbits += lit_n[v]
            t += 1
        if nbits >= 32:  # at most 31 bits were added: 63 at most held
            out[w] = acc & 0xFF
            out[w + 1] = (acc >> 8) & 0xFF
            out[w + 2] = (acc >> 16) & 0xFF
            out[w + 3] = (acc >> 24) & 0xFF
            acc >>= 32
            nbits -= 32
            w += 4
    nbits += 7  # end of block: code 256, seven 0 bits
    while nbits > 0:
        out[w] = acc & 0xFF
        acc >>= 8
        nbits -= 8
        w += 1
    return w


@_jit
def _put_stored(data: Any, size: Any, out: Any, w: Any) -> Any:
    """``data[:size]`` as stored deflate blocks at ``out[w]``; their end."""
    blocks = max(1, (size + STORED_BLOCK - 1) // STORED_BLOCK)
    k = 0
    for block in range(blocks):
        m = min(STORED_BLOCK, size - k)
        out[w] = 1 if block == blocks - 1 else 0
        out[w + 1] = m & 0xFF
        out[w + 2] = m >> 8
        out[w + 3] = ~m & 0xFF
        out[w + 4] = (~m >> 8) & 0xFF
        w += 5
        for u in range(m):
            out[w + u] = data[k + u]
        w += m
        k += m
    return w


@_jit
def _base64(raw: Any, size: Any, text: Any, o: Any, alphabet: Any) -> Any:
    """``raw[:size]`` base64 (``=`` padded) at ``text[o]``; its end."""
    t = 0
    while t + 3 <= size:
        v = (np.int64(raw[t]) << 16) | (np.int64(raw[t + 1]) << 8) | np.int64(raw[t + 2])
        text[o] = alphabet[(v >> 18) & 63]
        text[o + 1] = alphabet[(v >> 12) & 63]
        text[o + 2] = alphabet[(v >> 6) & 63]
        text[o + 3] = alphabet[v & 63]
        o += 4
        t += 3
    left = size - t
    if left:
        v = np.int64(raw[t]) << 16
        if left == 2:
            v |= np.int64(raw[t + 1]) << 8
        text[o] = alphabet[(v >> 18) & 63]
        text[o + 1] = alphabet[(v >> 12) & 63]
        text[o + 2] = alphabet[(v >> 6) & 63] if left == 2 else 61  # "="
        text[o + 3] = 61
        o += 4
    return o


@_jit
def _raw_bound(payload: Any) -> Any:
    """Most bytes a payload of ``payload`` bytes takes framed: headers, deflate, Adler-32.

    Fixed Huffman spends at most 9 bits a byte; stored blocks 5 bytes per 65 535."""
    fixed = (3 + 9 * payload + 7 + 7) // 8
    stored = 5 * max(1, (payload + STORED_BLOCK - 1) // STORED_BLOCK) + payload
    return 8 + 2 + max(fixed, stored) + 4


@_jit
def _encode_rows(offsets: Any, buckets: Any, counts: Any, counts_len: Any, header: Any,
                 alphabet: Any, compress: Any, lit_bits: Any, lit_n: Any, len_bits: Any,
                 len_n: Any, dist_bits: Any, dist_n: Any, first: Any, last: Any, start: Any,
                 text: Any, text_offsets: Any) -> Any:  # fmt: skip
    """Rows ``first .. last - 1``' base64 texts, back to back from ``text[start]`` on (row
    ``i``'s end at ``text_offsets[i + 1]``): the end of the last, and status ``_OK`` or
    ``code + 4 * row`` of the first row that breaks the contract (the rows after it are not
    written). The rows are checked as their payloads are written, not in a pass of their own.
    """
    longest = 0
    for i in range(first, last):
        longest = max(longest, offsets[i + 1] - offsets[i])
    largest = _payload_bound(longest)
    payload = np.empty(largest, np.uint8)
    raw = np.empty(_raw_bound(largest), np.uint8)
    head = np.empty(1 << _HASH_BITS, np.int64)
    for h in range(len(head)):
        head[h] = -1
    chain = np.empty(largest, np.int64)
    base = 0
    o = start
    for i in range(first, last):
        lo = offsets[i]
        hi = offsets[i + 1]
        if hi > lo:
            size, status = _put_payload(payload, 0, buckets, counts, lo, hi, header, counts_len)
            if status != _OK:
                return o, status + 4 * i
            _put_u32(raw, 0, COMPRESSION_COOKIE)
            raw[8] = 0x78  # zlib: deflate, 32 KiB window, no dictionary (0x7801 % 31 == 0)
            raw[9] = 0x01
            if compress:
                w = _deflate_fixed(payload, size, raw, 10, head, chain, base, lit_bits, lit_n,
                                   len_bits, len_n, dist_bits, dist_n)  # fmt: skip
                base += size
            else:
                w = _put_stored(payload, size, raw, 10)
            _put_u32(raw, w, _adler32(payload, size))
            w += 4
            _put_u32(raw, 4, w - 8)
            o = _base64(raw, w, text, o, alphabet)
        text_offsets[i + 1] = o
    return o, _OK


@_jit
def _payload_bound(buckets: Any) -> Any:
    """Most bytes of the payload of a row of ``buckets`` buckets: the header, and per bucket a
    zero run (at most 9 LEB128 bytes) and a count (at most 9)."""
    return PAYLOAD_HEADER_LEN + 18 * buckets


def payload_header(layout: HdrLayout) -> ByteArray:
    """The 40-byte V2 payload header of ``layout`` with payload length 0 (set per row)."""
    packed = struct.pack(
        ">IIIIQQd", ENCODING_COOKIE, 0, 0, layout.significant_digits, layout.lowest,
        layout.highest, 1.0 / layout.value_scale,
    )  # fmt: skip
    return np.frombuffer(packed, dtype=np.uint8).copy()


def _columns(layout: HdrLayout, offsets: npt.ArrayLike, buckets: npt.ArrayLike,
             counts: npt.ArrayLike) -> tuple[IntArray, Int32Array, IntArray]:  # fmt: skip
    """The columns as int64 offsets, int32 buckets and int64 counts (views where they already
    are), their shapes and offsets checked."""
    offs = np.ascontiguousarray(offsets, dtype=np.int64)
    raw_idx = np.asarray(buckets)
    cnt = np.ascontiguousarray(counts, dtype=np.int64)
    if offs.ndim != 1 or len(offs) < 1 or raw_idx.ndim != 1 or cnt.shape != raw_idx.shape:
        raise ValueError(
            f"offsets {offs.shape}, buckets {raw_idx.shape}, counts {cnt.shape}: expected 1-d "
            "offsets (n + 1) and buckets and counts of one length"
        )
    if offs[0] < 0 or offs[-1] > len(raw_idx) or np.any(offs[1:] < offs[:-1]):
        raise ValueError(f"offsets must be non-decreasing within 0..{len(raw_idx)}")
    if raw_idx.dtype == np.int32:
        idx = np.ascontiguousarray(raw_idx)
    else:
        # One kernel signature (int32, HdrColumns' own dtype); an index outside the layout
        # (maybe outside int32) becomes -1, which the kernels report as outside it.
        wide = np.ascontiguousarray(raw_idx, dtype=np.int64)
        idx = np.where((wide >= 0) & (wide < layout.counts_len), wide, -1).astype(np.int32)
    return offs, idx, cnt


def _refuse(layout: HdrLayout, offs: IntArray, status: int) -> None:
    """``ValueError`` for a kernel status (``code + 4 * row``) other than ``_OK``."""
    if status == _OK:
        return
    row, code = divmod(int(status), 4)
    problem = {
        _BAD_INDEX: f"a bucket index outside 0..{layout.counts_len - 1}",
        _NOT_INCREASING: "bucket indices not strictly increasing",
        _NEGATIVE_COUNT: "a negative count",
    }[code]
    raise ValueError(f"row {row} (buckets[{offs[row]}:{offs[row + 1]}]) has {problem}")


def _checked(layout: HdrLayout, offsets: npt.ArrayLike, buckets: npt.ArrayLike,
             counts: npt.ArrayLike) -> tuple[IntArray, Int32Array, IntArray, IntArray]:  # fmt: skip
    """``_columns`` and each row's payload length, validated."""
    offs, idx, cnt = _columns(layout, offsets, buckets, counts)
    payload_len, status = _plan(offs, idx, cnt, layout.counts_len)
    _refuse(layout, offs, status)
    return offs, idx, cnt, payload_len


def _text_bounds(row_buckets: IntArray) -> IntArray:
    """Most base64 bytes the text of a row of that many buckets takes (``_raw_bound`` of
    ``_payload_bound``; 0 for none)."""
    payload_len = PAYLOAD_HEADER_LEN + 18 * row_buckets
    fixed = (3 + 9 * payload_len + 7 + 7) // 8
    stored = 5 * np.maximum(1, (payload_len + STORED_BLOCK - 1) // STORED_BLOCK) + payload_len
    raw = 8 + 2 + np.maximum(fixed, stored) + 4
    bounds: IntArray = np.where(row_buckets > 0, 4 * ((raw + 2) // 3), 0)
    return bounds


def v2_payloads(
    layout: HdrLayout, offsets: npt.ArrayLike, buckets: npt.ArrayLike, counts: npt.ArrayLike
) -> tuple[IntArray, ByteArray]:
    """Each row's uncompressed V2 payload (header + counts, what ``zlib`` compresses), as
    ``(payload_offsets (n + 1), data)``; a row without buckets has none. Same contract as
    :func:`encode_v2`."""
    offs, idx, cnt, payload_len = _checked(layout, offsets, buckets, counts)
    payload_offsets = np.zeros(len(offs), np.int64)
    np.cumsum(payload_len, out=payload_offsets[1:])
    return payload_offsets, _payloads(offs, idx, cnt, payload_offsets, payload_header(layout),
                                      layout.counts_len)  # fmt: skip


def encode_v2(
    layout: HdrLayout,
    offsets: npt.ArrayLike,
    buckets: npt.ArrayLike,
    counts: npt.ArrayLike,
    *,
    compress: bool = True,
) -> pa.Array:
    """HdrHistogram V2 compressed base64 text of each CSR row (see the module docstring).

    ``offsets`` has ``n + 1`` non-decreasing entries; row ``i`` is ``buckets[offsets[i]:
    offsets[i + 1]]`` (strictly increasing indices in ``0 .. layout.counts_len - 1``, any
    integer dtype) with ``counts`` beside them (≥ 0; zero counts are not recorded). Returns
    ``pa.string()`` (``pa.large_string()`` past 2 GiB of text), NULL for a row without
    buckets. ``compress=False`` writes stored deflate blocks: faster, larger. Raises
    ``ValueError`` naming the first row that breaks the contract.
    """
    offs, idx, cnt = _columns(layout, offsets, buckets, counts)
    n = len(offs) - 1
    row_buckets = np.diff(offs)
    bounds = np.zeros(n + 1, np.int64)
    np.cumsum(_text_bounds(row_buckets), out=bounds[1:])
    # numpy's allocation (huge pages for large arrays: cheaper to touch first than numba's;
    # the bound is ~10x the text, but the pages past it are never touched)
    text = np.empty(int(bounds[-1]), np.uint8)
    text_offsets = np.zeros(n + 1, np.int64)
    args = (offs, idx, cnt, layout.counts_len, payload_header(layout), _BASE64, compress,
            *_TABLES)  # fmt: skip
    chunks = chunk_bounds(offs - offs[0])
    if chunks is None:
        end, status = _encode_rows(*args, 0, n, 0, text, text_offsets)
        _refuse(layout, offs, status)
    else:
        # Chunk c's texts from its rows' first bound on; then the chunks moved together.
        capacity = bounds[chunks[:-1]]
        done = run_chunks(lambda c: _encode_rows(*args, chunks[c], chunks[c + 1], capacity[c],
                                                 text, text_offsets), len(chunks) - 1)  # fmt: skip
        for _, status in done:  # the first chunk's problem is the first row's
            _refuse(layout, offs, status)
        end = compact(chunks, capacity, [e for e, _ in done], text_offsets, text)
    text = text[:end]
    valid = offs[1:] > offs[:-1]
    null_count = n - int(np.count_nonzero(valid))
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if null_count else None
    if text_offsets[-1] > MAX_STRING_BYTES:
        kind, offsets_buffer = pa.large_string(), pa.py_buffer(text_offsets)
    else:
        kind, offsets_buffer = pa.string(), pa.py_buffer(text_offsets.astype(np.int32))
    return pa.Array.from_buffers(
        kind, n, [validity, offsets_buffer, pa.py_buffer(text)], null_count=null_count
    )
