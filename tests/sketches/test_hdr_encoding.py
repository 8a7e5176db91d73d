"""``encode_v2``: each row reads back, by ``hdrh`` and by ``HdrLayout.decode``, as its counts, and
its uncompressed payload is byte for byte the ``hdrhistogram`` package's own."""

from __future__ import annotations

import base64
import struct
import zlib

import numpy as np
import pyarrow as pa
import pytest
from hdrh.histogram import HdrHistogram

from streamgauge.sketches import compile_accuracy, hdr_encoding, kernels
from streamgauge.sketches.hdr import HdrLayout, merge
from streamgauge.sketches.hdr_encoding import encode_v2, v2_payloads

DEFAULT = HdrLayout.from_params(compile_accuracy())
SMALL = HdrLayout(1, 10_000, 1, 1.0)
COARSE = HdrLayout(1000, 100_000_000, 2, 1.0)  # unit magnitude > 0
# 458 752 buckets: zero runs past 2^13 and 2^16 (3-byte varints), payloads past one stored
# block (65 535 bytes) and past the deflate window (32 KiB).
WIDE = HdrLayout(1, 2**40, 4, 1.0)


def _lognormal(layout: HdrLayout, seed: int, n: int = 100) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    idx = layout.bucket_indices(rng.lognormal(3.0, 1.0, n))
    return merge(idx, np.ones_like(idx))


def _dense(layout: HdrLayout, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return np.arange(n, dtype=np.int64), rng.integers(1, 300, n)


CASES: dict[str, tuple[HdrLayout, list[int] | np.ndarray, list[int] | np.ndarray]] = {
    "one bucket at 0": (DEFAULT, [0], [1]),
    "one bucket": (DEFAULT, [1000], [7]),
    "last bucket": (DEFAULT, [DEFAULT.counts_len - 1], [2]),
    "first and last bucket": (DEFAULT, [0, DEFAULT.counts_len - 1], [3, 5]),
    "first and last, small layout": (SMALL, [0, SMALL.counts_len - 1], [1, 1]),
    "coarse layout": (COARSE, [0, 700, COARSE.counts_len - 1], [4, 1, 9]),
    "long zero runs": (WIDE, [0, 9_000, 80_000, 300_000, WIDE.counts_len - 1], [1, 2, 3, 4, 5]),
    "large counts": (
        DEFAULT,
        [1, 2, 3, 4, 5, 6, 7, 50],
        [2**31 + 1, 2**32, 2**53 + 1, 2**55 - 1, 2**55, 2**56, 2**62 - 1, 1],
    ),
    "zero counts beside others": (DEFAULT, [3, 9, 12, 40], [0, 4, 0, 0]),
    "all counts zero": (DEFAULT, [3, 7], [0, 0]),
    "dense, past one stored block": (WIDE, *_dense(WIDE, 70_000, 1)),
    **{f"lognormal {seed}": (DEFAULT, *_lognormal(DEFAULT, seed)) for seed in range(6)},
    "lognormal, 3 digits": (
        HdrLayout(1, 3_600_000_000, 3, 1000.0),
        *_lognormal(HdrLayout(1, 3_600_000_000, 3, 1000.0), 7, 400),
    ),
}


def _package_payload(layout: HdrLayout, buckets: np.ndarray, counts: np.ndarray) -> bytes:
    """What ``HdrLayout.encode`` compresses, with exact integer totals (its ``merge`` adds in
    float64, so counts past 2^53 go in directly here)."""
    keep = counts > 0
    idx, cnt = buckets[keep], counts[keep]
    hist = HdrHistogram(layout.lowest, layout.highest, layout.significant_digits)
    if idx.size:
        np.ctypeslib.as_array(hist.counts)[idx] = cnt.astype(np.uint64)
        hist.set_internal_tacking_values(int(idx[0]), int(idx[-1]), sum(int(c) for c in cnt))
    hist.encoder.payload.payload.conversion_ratio_bits = 1.0 / layout.value_scale
    return zlib.decompress(base64.b64decode(hist.encode())[8:])


def _inflate(text: str) -> bytes:
    """The payload of an encoding, checking the frame: strict base64, compression cookie and
    length, one complete zlib stream (its Adler-32 checked by zlib) and nothing after it."""
    raw = base64.b64decode(text, validate=True)
    cookie, length = struct.unpack(">II", raw[:8])
    assert cookie == hdr_encoding.COMPRESSION_COOKIE
    assert length == len(raw) - 8
    stream = zlib.decompressobj()
    payload = stream.decompress(raw[8:])
    assert stream.eof and stream.unused_data == b""
    return payload


@pytest.mark.parametrize("compress", [True, False], ids=["fixed", "stored"])
@pytest.mark.parametrize("case", list(CASES))
def test_row_reads_back_as_its_counts(case: str, compress: bool) -> None:
    layout, b, c = CASES[case]
    buckets, counts = np.asarray(b, np.int64), np.asarray(c, np.int64)
    out = encode_v2(layout, [0, len(buckets)], buckets, counts, compress=compress)
    assert out.type == pa.string() and len(out) == 1 and out.null_count == 0
    text = out[0].as_py()
    assert _inflate(text) == _package_payload(layout, buckets, counts)

    nonzero = counts > 0
    hist = HdrHistogram.decode(text)
    assert (hist.lowest_trackable_value, hist.highest_trackable_value,
            hist.significant_figures) == (layout.lowest, layout.highest,
                                          layout.significant_digits)  # fmt: skip
    assert hist.get_int_to_double_conversion_ratio() == 1.0 / layout.value_scale
    decoded = np.ctypeslib.as_array(hist.counts).astype(np.int64)
    expected = np.zeros(layout.counts_len, np.int64)
    expected[buckets[nonzero]] = counts[nonzero]
    np.testing.assert_array_equal(decoded, expected)
    assert hist.get_total_count() == sum(int(x) for x in counts)

    indices, decoded_counts = layout.decode(text)
    np.testing.assert_array_equal(indices, buckets[nonzero])
    np.testing.assert_array_equal(decoded_counts, counts[nonzero])


@pytest.mark.parametrize("seed", range(3))
def test_payload_is_hdr_layout_encode_s(seed: int) -> None:
    buckets, counts = _lognormal(DEFAULT, seed)
    ours = encode_v2(DEFAULT, [0, len(buckets)], buckets, counts)[0].as_py()
    assert _inflate(ours) == _inflate(DEFAULT.encode(buckets, counts))


@pytest.mark.parametrize("layout", [DEFAULT, SMALL, COARSE], ids=repr)
def test_package_encodes_counts_up_to_the_max_index_for_every_index(layout: HdrLayout) -> None:
    """The package writes counts ``0 .. get_counts_array_index(max_value)`` where max_value is
    the highest value equivalent to the max index's: that is the max index itself."""
    ref = HdrHistogram(layout.lowest, layout.highest, layout.significant_digits)
    for i in range(layout.counts_len):
        value = ref.get_highest_equivalent_value(ref.get_value_from_index(i))
        assert ref.get_counts_array_index(value) == i


def test_counts_past_2_62_are_written_as_the_package_writes_them() -> None:
    """Nine-byte LEB128 with a full ninth byte; ``hdrh``'s decoder reads these wrong (it drops
    that byte's top bit), so only the bytes are compared."""
    buckets, counts = np.array([1, 2, 9]), np.array([2**62, 2**63 - 1, 2**62 + 12345])
    for compress in (True, False):
        text = encode_v2(DEFAULT, [0, 3], buckets, counts, compress=compress)[0].as_py()
        assert _inflate(text) == _package_payload(DEFAULT, buckets, counts)


def test_empty_rows_are_null_and_no_rows_is_empty() -> None:
    out = encode_v2(DEFAULT, [0, 0, 1, 1], [5], [2])
    assert out.to_pylist()[0] is None and out.to_pylist()[2] is None
    assert DEFAULT.decode(out[1].as_py())[0].tolist() == [5]
    empty = encode_v2(DEFAULT, [0], np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert empty.type == pa.string() and len(empty) == 0


def test_many_rows_at_once_equal_each_row_alone() -> None:
    rows = [_lognormal(DEFAULT, seed, n) for seed, n in enumerate([100, 1, 7, 300, 32] * 8)]
    rows[3] = (np.zeros(0, np.int64), np.zeros(0, np.int64))  # NULL rows between
    rows[17] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    rows[9] = (np.array([4, 8]), np.array([0, 0]))  # an empty histogram, not NULL
    offsets = np.cumsum([0] + [len(b) for b, _ in rows])
    buckets = np.concatenate([b for b, _ in rows]).astype(np.int32)  # HdrColumns' dtype
    counts = np.concatenate([c for _, c in rows])
    for compress in (True, False):
        together = encode_v2(DEFAULT, offsets, buckets, counts, compress=compress)
        alone = [
            encode_v2(DEFAULT, [0, len(b)], b, c, compress=compress)[0].as_py() for b, c in rows
        ]
        assert together.to_pylist() == alone
        assert together.null_count == 2
    payload_offsets, data = v2_payloads(DEFAULT, offsets, buckets, counts)
    for i, (b, c) in enumerate(rows):
        payload = data[payload_offsets[i] : payload_offsets[i + 1]].tobytes()
        assert payload == (_package_payload(DEFAULT, b, c) if len(b) else b"")


def test_offsets_need_not_start_at_zero() -> None:
    b, c = _lognormal(DEFAULT, 1)
    shifted = encode_v2(DEFAULT, [3, 3 + len(b)], np.r_[[1, 2, 3], b], np.r_[[1, 1, 1], c])
    assert shifted.to_pylist() == encode_v2(DEFAULT, [0, len(b)], b, c).to_pylist()


def test_large_string_past_int32_offsets(monkeypatch: pytest.MonkeyPatch) -> None:
    b, c = _lognormal(DEFAULT, 2)
    small = encode_v2(DEFAULT, [0, 0, len(b)], b, c)
    monkeypatch.setattr(hdr_encoding, "MAX_STRING_BYTES", 10)
    large = encode_v2(DEFAULT, [0, 0, len(b)], b, c)
    assert large.type == pa.large_string()
    assert large.to_pylist() == small.to_pylist()


def test_compressed_is_smaller_than_stored() -> None:
    rows = [_lognormal(DEFAULT, seed) for seed in range(20)]
    offsets = np.cumsum([0] + [len(b) for b, _ in rows])
    cols = (offsets, np.concatenate([b for b, _ in rows]), np.concatenate([c for _, c in rows]))
    fixed = sum(len(s) for s in encode_v2(DEFAULT, *cols).to_pylist())
    stored = sum(len(s) for s in encode_v2(DEFAULT, *cols, compress=False).to_pylist())
    package = sum(len(DEFAULT.encode(b, c)) for b, c in rows)
    assert fixed < 0.8 * stored
    assert fixed < 1.06 * package


@pytest.mark.parametrize(
    ("offsets", "buckets", "counts", "message"),
    [
        ([0, 1], [DEFAULT.counts_len], [1], "row 0 .* outside 0..3327"),
        ([0, 1, 2], [0, -1], [1, 1], "row 1 .* outside"),
        ([0, 2], [5, 5], [1, 1], "row 0 .* not strictly increasing"),
        ([0, 1, 3], [1, 9, 4], [1, 1, 1], "row 1 .* not strictly increasing"),
        ([0, 2], [1, 2], [1, -1], "row 0 .* negative count"),
        ([0, 2, 1], [1, 2], [1, 1], "non-decreasing"),
        ([0, 3], [1, 2], [1, 1], "non-decreasing within 0..2"),
        ([0, 2], [1, 2], [1], "one length"),
    ],
)
def test_rows_that_break_the_contract_are_refused(
    offsets: list[int], buckets: list[int], counts: list[int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        encode_v2(DEFAULT, offsets, buckets, counts)


@pytest.mark.parametrize("chunks", [2, 3, 7])
def test_chunked_encoding_equals_the_serial_one(monkeypatch: pytest.MonkeyPatch,
                                                chunks: int) -> None:  # fmt: skip
    """Rows split into chunks (one per thread, texts moved together after): the same text."""
    rows = [_lognormal(DEFAULT, seed, n) for seed, n in enumerate([100, 1, 7, 300, 32] * 6)]
    rows[4] = rows[11] = (np.zeros(0, np.int64), np.zeros(0, np.int64))
    offsets = np.cumsum([0] + [len(b) for b, _ in rows])
    buckets = np.concatenate([b for b, _ in rows]).astype(np.int32)
    counts = np.concatenate([c for _, c in rows])
    serial = [encode_v2(DEFAULT, offsets, buckets, counts, compress=c) for c in (True, False)]
    monkeypatch.setattr(kernels, "FORCE_CHUNKS", chunks)
    for compress, expected in zip((True, False), serial, strict=True):
        assert encode_v2(DEFAULT, offsets, buckets, counts, compress=compress).equals(expected)
    # the first bad row is named, whichever chunk finds a problem first
    bad_counts = counts.copy()
    bad_counts[offsets[25]] = -1
    bad_counts[offsets[20] + 1] = -1
    with pytest.raises(ValueError, match="row 20 .* negative count"):
        encode_v2(DEFAULT, offsets, buckets, bad_counts)
