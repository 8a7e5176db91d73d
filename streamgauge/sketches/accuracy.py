"""Accuracy as the knob: users state error targets, this module picks the sketch parameters.

``compile_accuracy(distinct_error=0.02, quantile_error=0.01, value_range=(0.1, 60_000))`` returns
a frozen :class:`SketchParams`. Impossible targets raise ``ValueError`` with a sentence naming the
value; merely expensive ones compile, with a sentence in ``SketchParams.warnings`` for the config
validator to show (nothing is printed here).

**distinct_error → HLL lgK.** The smallest lgK whose DataSketches a-priori bound at **2 sigma**
(about 95 % of estimates inside) for a **union** is ≤ the target. Union, because every stored
distinct count is a union (of panes, receivers, windows) and a union loses the single-stream HIP
estimator: its RSE is the classic ≈ 1.04/sqrt(2^lgK), not HIP's ≈ 0.83/sqrt(2^lgK). The bound is
taken from ``hll_sketch.get_rel_err`` (the library's own table, measured for lgK ≤ 12 and
1.04/sqrt(K) above), worse side of the two: at lgK 12 that is 3.283 % (3.183 % on the other side,
the figure DataSketches usually quotes). 2 sigma, because "distinct_error: 0.02" reads as "the
count is within 2 %", which 1 sigma would break for one answer in three.

**quantile_error → t-digest k and HDR significant digits.** One number, two meanings, stated in
``docs/configuration.md`` ("Sketch accuracy"): the t-digest's *rank* error mid-range (q in
0.5..0.9; tails are far better) and the HDR histogram's *relative value* error. k is the
smallest in :data:`TDIGEST_RANK_ERROR` whose measured worst mid-range rank error, including a
two-mode distribution with an empty gap at the median (t-digest's worst case), is ≤ the target.
HDR digits d is the smallest with 10^-d ≤ target.

Measured (``python bench/sketches.py --tdigest-table``; 200k samples, 2 seeds, one digest and 60
merged pane digests each; quantiles by :func:`streamgauge.sketches.tdigest.quantiles`)::

      k   mid smooth   mid gap   q=0.99   q=0.999   bytes (200k lognormal)
     50     0.0702     0.0856   0.00034   0.00006     1 376
    100     0.0278     0.0481   0.00013   0.00002     2 448
    200     0.0094     0.0192   0.00009   0.00002     4 432
    300     0.0076     0.0103   0.00005   0.00001     6 304
    400     0.0053     0.0096   0.00004   0.00001     8 224
    600     0.0013     0.0037   0.00004   0.00001    12 128
   1000     0.0004     0.0004   0.00002   0.00001    19 360
   1500     0.0002     0.0002   0.00004   0.00001    28 080
   2000     0.0001     0.0001   0.00001   0.00000    36 720

"smooth" = uniform, lognormal, sorted lognormal, overlapping two-mode lognormal (70/30, the
worst of the four); "gap" = two normal modes (10 and 100) with nothing between them at the
median. So the default k=200 meets a 0.015 mid-range target on smooth data but not with an
empty gap at the median (0.019). (With the library's own ``get_quantile`` the k=200 mid-range
error measured 0.015-0.022 on smooth data and 0.030 with the gap; see tdigest.py.)

**quantile_error → KLL k** (windows with ``quantiles: kll`` only). The same number read as a
*rank* error, which is the only error KLL has: k is the smallest whose DataSketches a-priori
normalized rank error (``kll_doubles_sketch.get_normalized_rank_error(k, False)``: single
quantile, 99 % confidence, any merge of sketches) is ≤ the target; unset, k = 200 (±1.33 %, the
library's and Spark's default). Unlike the t-digest's, KLL's rank error is the same at every
quantile: at k = 200 a "p99" may be anywhere between p97.7 and p100, so kll windows store p50
and p90 only. A sketch holds about 3k values (k = 200: 614 values, 5 000 bytes at 10^6 samples).

**value_range → HDR scale and range.** ``(low, high)`` in the metric's units (ms): ``high`` is the
largest value recorded unclamped, ``low`` the smallest that must get the relative error bound.
``value_scale`` is the smallest power of ten with ``low * value_scale >= 10^d`` (the HDR
layout is exact to one unit below 2·10^d units), so the default ``(0.1 ms, 1 h)`` gives 1000,
microseconds.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from datasketches import hll_sketch, kll_doubles_sketch
from hdrh.histogram import HdrHistogram

from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hll import DEFAULT_LG_K, MAX_LG_K, MIN_LG_K
from streamgauge.sketches.tdigest import DEFAULT_K

__all__ = [
    "DEFAULT_HDR_SIGNIFICANT_DIGITS",
    "DEFAULT_KLL_K",
    "DEFAULT_VALUE_RANGE",
    "TDIGEST_RANK_ERROR",
    "SketchParams",
    "compile_accuracy",
    "hll_error",
    "kll_error",
]

DEFAULT_HDR_SIGNIFICANT_DIGITS = 2
"""≈ 1 % relative value error (bucket width ≤ 1/128 of its value)."""

DEFAULT_VALUE_RANGE = (0.1, 3_600_000.0)
"""0.1 ms .. 1 hour: timers outside it are clamped and counted."""

TDIGEST_RANK_ERROR: dict[int, float] = {
    50: 0.0856,
    100: 0.0481,
    200: 0.0192,
    300: 0.0103,
    400: 0.0096,
    600: 0.0037,
    1000: 0.0004,
    1500: 0.0002,
    2000: 0.0001,
}
"""k → worst measured mid-range rank error, gap case included (table in the module docstring)."""

PERCENTILES: Mapping[str, float] = {"p50": 0.5, "p90": 0.9, "p99": 0.99, "p999": 0.999}
"""The percentiles a window of timers, histograms or distributions stores (its columns), by
name: the normalized rank of each."""
KLL_PERCENTILES: tuple[str, ...] = ("p50", "p90")
"""Those a ``quantiles: kll`` window stores a value for: KLL's rank error is the same at every
quantile (±1.33 % at k 200), so its "p99" could be anywhere between p97.7 and p100."""

DEFAULT_KLL_K = 200
"""DataSketches' and Spark's default: ±1.33 % normalized rank error."""
MIN_KLL_K = 8
MAX_KLL_K = 65_535
"""The k DataSketches' KLL image (a uint16) and Spark's ``kll_merge_agg_double`` accept."""
KLL_BYTES_PER_K = 25
"""Serialized KLL doubles bytes per unit of k once a sketch has compacted (k 200: 5 000 bytes
at 10^6 samples, k 2000: 44 632)."""

_UNION_SIGMAS = 2
# Above these a series-window costs more than 32 KiB of sketch bytes (HLL_8: 2^lgK; t-digest:
# ~19 bytes x k), or, for HDR, up to ~2^(m-1) bucket rows per power of two of range.
_EXPENSIVE_LG_K = 15
_EXPENSIVE_K = 2000
_EXPENSIVE_DIGITS = 4


@dataclass(frozen=True)
class SketchParams:
    """Compiled sketch parameters and the accuracy they deliver.

    ``warnings`` holds one sentence per expensive choice (a tuple, so the object stays frozen).
    """

    hll_lg_k: int = DEFAULT_LG_K
    tdigest_k: int = DEFAULT_K
    hdr_lowest: int = 1
    hdr_highest: int = 3_600_000_000
    hdr_significant_digits: int = DEFAULT_HDR_SIGNIFICANT_DIGITS
    value_scale: float = 1000.0
    value_range: tuple[float, float] = DEFAULT_VALUE_RANGE
    distinct_error: float = 0.0
    """2-sigma relative error of a unioned distinct count at ``hll_lg_k`` (worse side)."""
    quantile_rank_error: float = 0.0
    """Worst measured mid-range t-digest rank error at ``tdigest_k`` (tails are far better)."""
    hdr_relative_error: float = 0.01
    """HDR quantile relative value error bound for values in ``value_range``."""
    kll_k: int = DEFAULT_KLL_K
    """KLL sketch size of ``quantiles: kll`` windows (pane partials and their merges)."""
    kll_rank_error: float = 0.0
    """A-priori normalized rank error of one KLL quantile at ``kll_k`` (99 % confidence)."""
    warnings: tuple[str, ...] = ()


def hll_error(lg_k: int, num_std_devs: int = _UNION_SIGMAS) -> float:
    """A-priori relative error of a *unioned* HLL at ``lg_k``, worse of the two sides."""
    return max(
        abs(float(hll_sketch.get_rel_err(upper, True, lg_k, num_std_devs)))
        for upper in (True, False)
    )


def kll_error(k: int) -> float:
    """A-priori normalized rank error of a single KLL quantile at ``k`` (99 % confidence)."""
    return float(kll_doubles_sketch.get_normalized_rank_error(k, False))


def _compile_kll_k(quantile_error: float | None) -> int:
    """The smallest k meeting ``quantile_error`` in rank (bisection: the error falls with k).

    Every target the t-digest accepts (>= 0.0001) is met below ``MAX_KLL_K`` (0.0001 needs
    k = 30 565), so this never refuses one on its own.
    """
    if quantile_error is None:
        return DEFAULT_KLL_K
    low, high = MIN_KLL_K, MAX_KLL_K
    if kll_error(high) > quantile_error:
        return high
    while low < high:
        middle = (low + high) // 2
        if kll_error(middle) <= quantile_error:
            high = middle
        else:
            low = middle + 1
    return low


def _check_fraction(name: str, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name}={value!r} is not a number")
    if not 0.0 < value < 1.0:
        raise ValueError(f"{name}={value!r} is impossible: an error target must be in (0, 1)")


def _compile_lg_k(distinct_error: float | None, warnings: list[str]) -> int:
    if distinct_error is None:
        return DEFAULT_LG_K
    _check_fraction("distinct_error", distinct_error)
    for lg_k in range(MIN_LG_K, MAX_LG_K + 1):
        if hll_error(lg_k) <= distinct_error:
            if lg_k >= _EXPENSIVE_LG_K:
                warnings.append(
                    f"distinct_error={distinct_error} needs HLL lgK {lg_k}: up to "
                    f"{2**lg_k // 1024} KiB per set series per window"
                )
            return lg_k
    raise ValueError(
        f"distinct_error={distinct_error} is impossible: it needs HLL lgK above {MAX_LG_K}, and "
        f"lgK {MAX_LG_K} gives ±{hll_error(MAX_LG_K):.3%} at 2 sigma"
    )


def _compile_tdigest_k(quantile_error: float | None, warnings: list[str]) -> int:
    if quantile_error is None:
        return DEFAULT_K
    for k, error in sorted(TDIGEST_RANK_ERROR.items()):
        if error <= quantile_error:
            if k >= _EXPENSIVE_K:
                warnings.append(
                    f"quantile_error={quantile_error} needs t-digest k {k}: about {19 * k // 1024} "
                    "KiB per timer series per window"
                )
            return k
    best_k = max(TDIGEST_RANK_ERROR)
    raise ValueError(
        f"quantile_error={quantile_error} is impossible for the t-digest: the best measured "
        f"compression (k={best_k}) reaches {TDIGEST_RANK_ERROR[best_k]} in rank"
    )


def _compile_digits(quantile_error: float | None, warnings: list[str]) -> int:
    if quantile_error is None:
        return DEFAULT_HDR_SIGNIFICANT_DIGITS
    for digits in range(1, 6):
        if 10.0**-digits <= quantile_error * (1 + 1e-9):
            if digits >= _EXPENSIVE_DIGITS:
                warnings.append(
                    f"quantile_error={quantile_error} needs {digits} significant digits in HDR "
                    f"histograms: up to {2 ** math.ceil(math.log2(2 * 10**digits)) // 2} bucket "
                    "rows per power of two of range per series per window"
                )
            return digits
    raise ValueError(
        f"quantile_error={quantile_error} is impossible for HDR histograms: 5 significant digits "
        "(0.001 %) is the most the layout supports"
    )


def _compile_range(
    value_range: tuple[float, float] | None, digits: int
) -> tuple[tuple[float, float], float, int]:
    low, high = DEFAULT_VALUE_RANGE if value_range is None else value_range
    if not (math.isfinite(low) and math.isfinite(high)) or not 0.0 < low < high:
        raise ValueError(
            f"value_range={value_range!r} is impossible: it must be (low, high) with "
            "0 < low < high, finite (HDR histograms record no negatives, and relative error "
            "is undefined at 0)"
        )
    # Smallest power of ten putting `low` at >= 10^digits scaled units (see module docstring).
    exponent = math.ceil(math.log10(10.0**digits / low) - 1e-12)
    value_scale = 10.0**exponent
    highest = math.ceil(high * value_scale)
    if highest >= 2**62:
        raise ValueError(
            f"value_range={value_range!r} is impossible at {digits} significant digits: it spans "
            f"{high / low:.3g}x, and high scaled by {value_scale:g} exceeds 2^62"
        )
    return (float(low), float(high)), value_scale, max(highest, 2)


def compile_accuracy(
    distinct_error: float | None = None,
    quantile_error: float | None = None,
    value_range: tuple[float, float] | None = None,
) -> SketchParams:
    """Sketch parameters meeting the targets; ``None`` means the documented default.

    Defaults: HLL lgK 12, t-digest k 200, HDR 2 significant digits over 0.1 ms .. 1 h, KLL k 200.
    """
    warnings: list[str] = []
    if quantile_error is not None:
        _check_fraction("quantile_error", quantile_error)
    lg_k = _compile_lg_k(distinct_error, warnings)
    k = _compile_tdigest_k(quantile_error, warnings)
    digits = _compile_digits(quantile_error, warnings)
    (low, high), value_scale, highest = _compile_range(value_range, digits)
    # Fail here rather than at the first window if the package refuses the layout.
    HdrHistogram(1, highest, digits)
    params = SketchParams(
        hll_lg_k=lg_k,
        tdigest_k=k,
        hdr_lowest=1,
        hdr_highest=highest,
        hdr_significant_digits=digits,
        value_scale=value_scale,
        value_range=(low, high),
        distinct_error=hll_error(lg_k),
        quantile_rank_error=TDIGEST_RANK_ERROR.get(k, float("nan")),
        hdr_relative_error=10.0**-digits,
        kll_k=(kll_k := _compile_kll_k(quantile_error)),
        kll_rank_error=kll_error(kll_k),
        warnings=tuple(warnings),
    )
    HdrLayout.from_params(params)  # validates the combination once more, in one place
    return params
