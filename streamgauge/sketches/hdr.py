"""HDR histograms as bucket rows: the ``hdrhistogram`` package's layout, computed in numpy.

Why HDR beside the t-digest: an HDR histogram has *fixed* bucket boundaries, so histograms from
any panes, hosts, windows and tag groups merge by adding counts per bucket index — which SQL does
with ``GROUP BY bucket`` over ``window_histograms`` rows — and a quantile read from the sum is
within a bounded *relative value* error of the exact one, whatever the data (averaging
percentiles is meaningless; adding histograms is right).

Layout (``hdrh.histogram.HdrHistogram``, the HdrHistogram family's standard): integers
``0..highest``; with ``d`` significant digits there are ``2^m`` sub-buckets per power-of-two
bucket where ``2^m >= 2*10^d`` (256 for d=2). Values below ``2^m`` have unit-wide buckets; above,
bucket width doubles each power of two, so width/value stays ≤ 1/2^(m-1) (1/128 for d=2).

Metric values are floats (milliseconds with decimals) but the layout is over integers, so a value
``v`` is recorded as ``floor(v * value_scale)`` — exactly what ``HdrHistogram.record_value(v *
value_scale)`` does (``int()`` truncation), so our indices equal the package's for every value.
Default ``value_scale`` 1000: milliseconds → integer microseconds. The relative error bound
``10^-d`` then holds for values ≥ ``10^d / value_scale`` (0.1 ms at the defaults); below that the
error is at most ``1 / value_scale`` absolute (1 µs). Values outside ``[0, highest]`` are clamped
to the nearest end and *counted* (:class:`HdrBuckets`); NaN cannot be placed and is counted apart.

Quantiles follow ``HdrHistogram.get_value_at_percentile``: nearest rank ``round(q * n)`` (at least
1), reported as the *highest* value equivalent to that bucket (the lowest for q=0), divided by
``value_scale``.

Encoding: the standard compressed V2 form (base64 of a zlib'd header + ZigZag-LEB128 counts),
written by the package's own encoder so Java/C/Go/Rust HdrHistogram read it. The header's
integer-to-double conversion ratio is set to ``1 / value_scale``, so a reader can recover units.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import numpy.typing as npt
from hdrh.histogram import HdrHistogram

if TYPE_CHECKING:
    from streamgauge.sketches.accuracy import SketchParams

__all__ = ["HdrBuckets", "HdrLayout", "merge"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# 2^0 .. 2^62: searchsorted(_POW2, x, "right") == x.bit_length() for 1 <= x < 2^63, exactly
# (a float log2 would round near powers of two above 2^53).
_POW2 = np.left_shift(np.int64(1), np.arange(63, dtype=np.int64))


class HdrBuckets(NamedTuple):
    """A histogram as sparse rows plus what could not be placed exactly (never silent)."""

    indices: IntArray
    """Sorted, unique bucket indices (the package's counts-array index)."""
    counts: IntArray
    """Samples per bucket, same length as ``indices``."""
    clamped_low: int
    """Values below 0 (including -inf), recorded in the bucket of 0."""
    clamped_high: int
    """Values above ``highest`` (including +inf), recorded in the bucket of ``highest``."""
    nan: int
    """NaN values: not recorded anywhere."""


def merge(indices: npt.ArrayLike, counts: npt.ArrayLike) -> tuple[IntArray, IntArray]:
    """Add counts per bucket index (the in-Python twin of SQL's ``GROUP BY bucket``).

    Concatenate the rows of any number of histograms with the same layout and pass them here.
    """
    idx = np.asarray(indices, dtype=np.int64)
    cnt = np.asarray(counts, dtype=np.int64)
    if idx.shape != cnt.shape:
        raise ValueError(f"indices {idx.shape} and counts {cnt.shape} differ in shape")
    unique, inverse = np.unique(idx, return_inverse=True)
    summed = np.bincount(inverse, weights=cnt, minlength=len(unique))
    # bincount sums in float64: exact for totals below 2^53 samples, far beyond a window's count.
    return unique, summed.astype(np.int64)


@dataclass(frozen=True)
class HdrLayout:
    """Bucket layout of ``HdrHistogram(lowest, highest, significant_digits)`` over scaled values.

    ``lowest`` and ``highest`` are in *scaled integer* units (the package's arguments);
    ``value_scale`` converts original units to them. Build from compiled accuracy with
    :meth:`from_params`.
    """

    lowest: int
    highest: int
    significant_digits: int
    value_scale: float
    _unit_magnitude: int = field(init=False, repr=False)
    _half_count_magnitude: int = field(init=False, repr=False)
    _half_count: int = field(init=False, repr=False)
    _sub_bucket_mask: int = field(init=False, repr=False)
    _counts_len: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        problems = []
        if not 1 <= self.significant_digits <= 5:
            problems.append(f"significant_digits={self.significant_digits} is outside 1..5")
        if self.lowest < 1:
            problems.append(f"lowest={self.lowest} must be >= 1")
        if self.highest < 2 * self.lowest:
            problems.append(f"highest={self.highest} must be >= 2 * lowest ({2 * self.lowest})")
        if self.highest >= 2**62:
            problems.append(f"highest={self.highest} must be below 2^62")
        if not self.value_scale > 0:
            problems.append(f"value_scale={self.value_scale} must be > 0")
        if problems:
            raise ValueError("invalid HDR layout: " + "; ".join(problems))
        # Take the derived constants from the package itself, so any rounding in its float
        # arithmetic (math.log based) is reproduced rather than re-derived.
        ref = HdrHistogram(self.lowest, self.highest, self.significant_digits)
        object.__setattr__(self, "_unit_magnitude", int(ref.unit_magnitude))
        object.__setattr__(self, "_half_count_magnitude", int(ref.sub_bucket_half_count_magnitude))
        object.__setattr__(self, "_half_count", int(ref.sub_bucket_half_count))
        object.__setattr__(self, "_sub_bucket_mask", int(ref.sub_bucket_mask))
        object.__setattr__(self, "_counts_len", int(ref.counts_len))

    @classmethod
    def from_params(cls, params: SketchParams) -> HdrLayout:
        """The layout compiled by :func:`streamgauge.sketches.accuracy.compile_accuracy`."""
        return cls(
            params.hdr_lowest, params.hdr_highest, params.hdr_significant_digits, params.value_scale
        )

    @property
    def counts_len(self) -> int:
        """Number of bucket indices (``0 .. counts_len - 1``)."""
        return self._counts_len

    @property
    def relative_error(self) -> float:
        """Bound on |reported - exact| / exact for values ≥ ``10^d / value_scale``: 10^-d."""
        return float(10.0**-self.significant_digits)

    # -- values -> indices ------------------------------------------------------------------

    def scale(self, values: npt.ArrayLike) -> tuple[IntArray, int, int, int]:
        """Scaled, clamped integers for ``values`` and the counts (below 0, above highest, NaN).

        NaN entries are removed from the returned array.
        """
        v = np.asarray(values, dtype=np.float64).ravel()
        nan_mask = np.isnan(v)
        nan = int(np.count_nonzero(nan_mask))
        if nan:
            v = v[~nan_mask]
        # floor(v * scale) == int(v * scale) for v >= 0: the package's own conversion.
        scaled = v * self.value_scale
        low_mask = scaled < 0
        high_mask = scaled >= self.highest + 1
        low = int(np.count_nonzero(low_mask))
        high = int(np.count_nonzero(high_mask))
        scaled = np.where(low_mask, 0.0, np.where(high_mask, float(self.highest), scaled))
        return np.floor(scaled).astype(np.int64), low, high, nan

    def indices_of_scaled(self, scaled: npt.ArrayLike) -> IntArray:
        """Bucket index of each scaled integer in ``[0, highest]`` (vectorised package formula)."""
        x = np.asarray(scaled, dtype=np.int64)
        pow2ceiling = np.searchsorted(_POW2, x | self._sub_bucket_mask, side="right")
        bucket = pow2ceiling.astype(np.int64) - (
            self._unit_magnitude + self._half_count_magnitude + 1
        )
        sub_bucket = np.right_shift(x, bucket + self._unit_magnitude)
        return ((bucket + 1) << self._half_count_magnitude) + sub_bucket - self._half_count

    def bucket_indices(self, values: npt.ArrayLike) -> IntArray:
        """Bucket index per value (clamped; NaN removed). Counts of clamping: :meth:`histogram`."""
        scaled, _, _, _ = self.scale(values)
        return self.indices_of_scaled(scaled)

    def histogram(self, values: npt.ArrayLike) -> HdrBuckets:
        """Sparse histogram of ``values``: sorted unique indices, counts, and what was clamped."""
        scaled, low, high, nan = self.scale(values)
        idx = self.indices_of_scaled(scaled)
        unique, counts = np.unique(idx, return_counts=True)
        return HdrBuckets(unique.astype(np.int64), counts.astype(np.int64), low, high, nan)

    # -- indices -> values ------------------------------------------------------------------

    def _check_index(self, index: int) -> int:
        i = int(index)
        if not 0 <= i < self._counts_len:
            raise ValueError(f"bucket index {index} is outside 0..{self._counts_len - 1}")
        return i

    def _lowest_scaled(self, index: int) -> int:
        # HdrHistogram.get_value_from_index
        bucket = (index >> self._half_count_magnitude) - 1
        sub_bucket = (index & (self._half_count - 1)) + self._half_count
        if bucket < 0:
            sub_bucket -= self._half_count
            bucket = 0
        return sub_bucket << (bucket + self._unit_magnitude)

    def _width_scaled(self, index: int) -> int:
        # The bucket's power of two: index // half_count - 1, but bucket 0 spans two halves.
        bucket = max((index >> self._half_count_magnitude) - 1, 0)
        return 1 << (bucket + self._unit_magnitude)

    def bucket_lower(self, index: int) -> float:
        """Smallest original-unit value recorded in bucket ``index`` (inclusive)."""
        i = self._check_index(index)
        return self._lowest_scaled(i) / self.value_scale

    def bucket_upper(self, index: int) -> float:
        """End of bucket ``index`` in original units, exclusive: the bucket is [lower, upper)."""
        i = self._check_index(index)
        return (self._lowest_scaled(i) + self._width_scaled(i)) / self.value_scale

    def bounds(self, indices: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        """Per bucket index: the lowest value and the highest *equivalent* value (what a
        quantile falling in the bucket reports), in original units — ``window_histograms``'
        ``lower_bound``/``upper_bound``."""
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size and (idx.min() < 0 or idx.max() >= self._counts_len):
            raise ValueError(f"bucket indices must be in 0..{self._counts_len - 1}")
        bucket = (idx >> self._half_count_magnitude) - 1
        sub_bucket = (idx & (self._half_count - 1)) + self._half_count
        first = bucket < 0
        sub_bucket = np.where(first, sub_bucket - self._half_count, sub_bucket)
        bucket = np.maximum(bucket, 0)
        lowest = sub_bucket << (bucket + self._unit_magnitude)
        width = np.left_shift(np.int64(1), bucket + self._unit_magnitude)
        return lowest / self.value_scale, (lowest + width - 1) / self.value_scale

    def quantile(self, indices: npt.ArrayLike, counts: npt.ArrayLike, q: float) -> float:
        """``HdrHistogram.get_value_at_percentile(100 * q) / value_scale`` over sparse rows.

        ``indices`` need not be sorted or unique (rows of several histograms are fine). An empty
        histogram has no quantile: ``ValueError``.
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile q={q!r} is outside [0, 1]")
        idx, cnt = merge(indices, counts)
        keep = cnt > 0
        idx, cnt = idx[keep], cnt[keep]
        total = int(cnt.sum())
        if total == 0:
            raise ValueError("an empty histogram has no quantiles")
        percentile = min(q * 100.0, 100.0)
        # get_target_count_at_percentile, with the package's float expression kept verbatim.
        target = max(int((percentile * total / 100) + 0.5), 1)
        pos = int(np.searchsorted(np.cumsum(cnt), target, side="left"))
        index = self._check_index(int(idx[pos]))
        lowest = self._lowest_scaled(index)
        if percentile == 0.0:
            return lowest / self.value_scale
        return (lowest + self._width_scaled(index) - 1) / self.value_scale

    # -- standard encoding ------------------------------------------------------------------

    def encode(self, indices: npt.ArrayLike, counts: npt.ArrayLike) -> str:
        """Standard compressed (V2, base64) encoding, by the package's encoder."""
        idx, cnt = merge(indices, counts)
        keep = cnt > 0
        idx, cnt = idx[keep], cnt[keep]
        if idx.size and (idx[0] < 0 or idx[-1] >= self._counts_len):
            raise ValueError(
                f"bucket indices {int(idx[0])}..{int(idx[-1])} do not fit this layout "
                f"(0..{self._counts_len - 1})"
            )
        hist = HdrHistogram(self.lowest, self.highest, self.significant_digits)
        if idx.size:
            counts_view = np.ctypeslib.as_array(hist.counts)
            counts_view[idx] = cnt.astype(counts_view.dtype)
            hist.set_internal_tacking_values(int(idx[0]), int(idx[-1]), int(cnt.sum()))
        hist.encoder.payload.payload.conversion_ratio_bits = 1.0 / self.value_scale
        encoded: bytes = hist.encode()
        return encoded.decode("ascii")

    def decode(self, encoded: str | bytes) -> tuple[IntArray, IntArray]:
        """Sparse ``(indices, counts)`` of an encoded histogram with this layout."""
        try:
            hist = HdrHistogram.decode(encoded)
        except Exception as exc:  # the package raises TypeError, zlib.error and its own classes
            raise ValueError(f"not an encoded HdrHistogram: {exc}") from exc
        theirs = (
            hist.lowest_trackable_value,
            hist.highest_trackable_value,
            hist.significant_figures,
        )
        ours = (self.lowest, self.highest, self.significant_digits)
        if theirs != ours:
            raise ValueError(
                f"encoded histogram has (lowest, highest, digits) = {theirs}, this layout {ours}"
            )
        counts_view = np.ctypeslib.as_array(hist.counts)
        nonzero = np.flatnonzero(counts_view)
        return nonzero.astype(np.int64), counts_view[nonzero].astype(np.int64)
