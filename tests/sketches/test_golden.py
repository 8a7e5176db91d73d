"""Frozen serialized sketches: a library upgrade that changes a format fails here, not in prod.

Regenerate only on purpose (and then think about every stored blob):
    python -m tests.sketches.test_golden
"""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
import pytest

from streamgauge.sketches import compile_accuracy, hdr, hll, tdigest

DATA = Path(__file__).resolve().parent.parent / "data" / "sketches"
LAYOUT = hdr.HdrLayout.from_params(compile_accuracy())


def _values() -> np.ndarray:
    """10 000 latency-like values from integer arithmetic only (no RNG or libm: identical on
    every platform and numpy version)."""
    i = np.arange(10_000, dtype=np.int64)
    values: np.ndarray = ((i * 7919) % 10_007) / 100.0 + (i % 7 == 0) * 250.0
    return values


def _blobs() -> dict[str, bytes]:
    values = _values()
    idx, cnt, *_ = LAYOUT.histogram(values)
    return {
        "hll_lgk12_5000_strings.b64": hll.serialize_hll(
            hll.build_hll(f"user-{i}" for i in range(5000))
        ),
        "hll_lgk12_100_ints.b64": hll.serialize_hll(hll.build_hll(range(100))),
        "tdigest_k200_10000.b64": tdigest.serialize_tdigest(tdigest.build_tdigest(values)),
        "hdr_d2_us_10000.b64": LAYOUT.encode(idx, cnt).encode("ascii"),
    }


def _read(name: str) -> bytes:
    text = (DATA / name).read_text().strip()
    return text.encode("ascii") if name.startswith("hdr") else base64.b64decode(text)


@pytest.mark.parametrize("name", sorted(_blobs()))
def test_reserializing_gives_identical_bytes(name: str) -> None:
    assert _blobs()[name] == _read(name)


def test_golden_hll_estimates() -> None:
    big = hll.estimate(_read("hll_lgk12_5000_strings.b64"))
    assert big.estimate == pytest.approx(4973.735618494752, rel=1e-12)  # frozen: the HIP estimate
    assert big.lower_bound < 5000 < big.upper_bound
    assert round(hll.estimate(_read("hll_lgk12_100_ints.b64")).estimate) == 100


def test_golden_tdigest_quantiles() -> None:
    digest = tdigest.deserialize_tdigest(_read("tdigest_k200_10000.b64"))
    assert digest.get_total_weight() == 10_000 and digest.k == 200
    ordered = np.sort(_values())
    for q in (0.5, 0.9, 0.99, 0.999):
        got = tdigest.quantiles(digest, [q])[0]
        rank = np.searchsorted(ordered, got, "right") / len(ordered)
        assert abs(rank - q) <= 0.01, (q, got)


def test_golden_hdr_quantiles() -> None:
    idx, cnt = LAYOUT.decode(_read("hdr_d2_us_10000.b64"))
    assert int(cnt.sum()) == 10_000
    ordered = np.sort(_values())
    for q in (0.5, 0.9, 0.99, 0.999, 1.0):
        exact = ordered[max(int(q * 10_000 + 0.5), 1) - 1]
        assert LAYOUT.quantile(idx, cnt, q) == pytest.approx(exact, rel=LAYOUT.relative_error)


if __name__ == "__main__":
    DATA.mkdir(parents=True, exist_ok=True)
    for file_name, blob in _blobs().items():
        text = (
            blob.decode("ascii")
            if file_name.startswith("hdr")
            else base64.b64encode(blob).decode("ascii")
        )
        (DATA / file_name).write_text(text + "\n")
        print("wrote", DATA / file_name, len(blob), "bytes")
