"""HyperLogLog distinct counts for sets (``s``), in Spark's own HLL format.

Apache DataSketches HLL, as written by Spark's native ``hll_sketch_agg`` / ``hll_union_agg``:
type **HLL_8** (Spark 4.3 writes HLL_8 updatable images; checked by deserializing them here), so a
sketch built at ingest in Python, a pane sketch built by Spark and a rollup unioned in either place
are the same kind of object and union without conversion. HLL_8 is also the fastest type to
update and union; it costs 2^lgK bytes once a sketch leaves the exact (list/set) mode, 4 KiB at
lgK 12, and far less for small sets.

Hashing agrees both ways: a Python sketch and a Spark sketch of the same ints or strings have the
same registers (their union estimates exactly what either does), so unions across the two never
double count. Ints hash as 64-bit integers (Spark ``bigint``), strings as their UTF-8 bytes (Spark
``string``). Do not mix representations of one member (``"42"`` and ``42`` are different members).

Error: a sketch built in one stream uses the HIP estimator (RSE ≈ 0.83/sqrt(K)); any *union*
falls back to the composite estimator (RSE ≈ 1.04/sqrt(K)), and every stored window is a union of
panes or receivers, so :mod:`streamgauge.sketches.accuracy` sizes lgK with the union constant.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
from datasketches import hll_sketch, hll_union, tgt_hll_type

__all__ = [
    "DEFAULT_LG_K",
    "HLL_TYPE",
    "DistinctEstimate",
    "build_hll",
    "deserialize_hll",
    "estimate",
    "new_hll",
    "serialize_hll",
    "union_hll",
    "update_hll",
]

DEFAULT_LG_K = 12
"""2^12 registers: ±3.2 % at 2 sigma for a union (DataSketches' a-priori bound), 4 KiB each."""

HLL_TYPE = tgt_hll_type.HLL_8
"""The type Spark's ``hll_sketch_agg`` and ``hll_union_agg`` write (see module docstring)."""

# DataSketches' own limits for lg_config_k.
MIN_LG_K = 4
MAX_LG_K = 21


class DistinctEstimate(NamedTuple):
    """An estimate with its a-priori confidence bounds (``num_std_devs`` sigma, default 2)."""

    estimate: float
    lower_bound: float
    upper_bound: float


def _check_lg_k(lg_k: int) -> None:
    if not isinstance(lg_k, int) or isinstance(lg_k, bool) or not MIN_LG_K <= lg_k <= MAX_LG_K:
        raise ValueError(
            f"HLL lg_k={lg_k!r} is invalid: DataSketches accepts {MIN_LG_K}..{MAX_LG_K}"
        )


def new_hll(lg_k: int = DEFAULT_LG_K) -> hll_sketch:
    """An empty HLL_8 sketch with 2^lg_k registers."""
    _check_lg_k(lg_k)
    return hll_sketch(lg_k, HLL_TYPE)


def update_hll(sketch: hll_sketch, values: Iterable[str | int] | np.ndarray) -> None:
    """Add ``values`` (strings or ints; a numpy array of either) to ``sketch``.

    The fastest path measured: convert once to Python objects (``ndarray.tolist``) and let
    ``map`` drive the bound ``update`` in C; about 0.1 µs per int and 0.35 µs per string, against
    0.16 µs for a Python ``for`` loop over numpy scalars. Floats are refused: a set member that
    arrives as ``1.0`` in one place and ``1`` in another would count twice.
    """
    if isinstance(values, np.ndarray):
        if values.dtype.kind == "f":
            raise ValueError("HLL members must be strings or integers, not floats")
        items: Iterable[str | int] = values.ravel().tolist()
    else:
        items = values
    # deque(maxlen=0) consumes the iterator at C speed without storing the None results.
    deque(map(sketch.update, items), maxlen=0)


def build_hll(values: Iterable[str | int] | np.ndarray, lg_k: int = DEFAULT_LG_K) -> hll_sketch:
    """A sketch of ``values`` (see :func:`update_hll` for accepted types)."""
    sketch = new_hll(lg_k)
    update_hll(sketch, values)
    return sketch


def serialize_hll(sketch: hll_sketch) -> bytes:
    """Compact serialized form (HLL_8), readable by Spark's ``hll_*`` functions and DataSketches.

    Compact, not updatable: it is the canonical stored image (Spark's updatable images carry the
    same registers and deserialize to the same estimate).
    """
    return bytes(sketch.serialize_compact())


def deserialize_hll(blob: bytes) -> hll_sketch:
    """Read any DataSketches HLL image (compact or updatable, HLL_4/6/8, Spark's included)."""
    try:
        return hll_sketch.deserialize(bytes(blob))
    except (RuntimeError, ValueError, IndexError) as exc:  # IndexError: a truncated image
        raise ValueError(f"not a serialized HLL sketch ({len(blob)} bytes): {exc}") from exc


def union_hll(sketches: Iterable[bytes | hll_sketch], lg_k: int = DEFAULT_LG_K) -> hll_sketch:
    """Union serialized (or live) sketches: per pane, receiver, window. Result is HLL_8 at lg_k.

    Inputs with a larger lgK are downsampled to ``lg_k``; inputs with a smaller one make the union
    take their (coarser) lgK, as DataSketches does: a union is only as precise as its coarsest
    input.
    """
    _check_lg_k(lg_k)
    union = hll_union(lg_k)
    for item in sketches:
        union.update(item if isinstance(item, hll_sketch) else deserialize_hll(item))
    return union.get_result(HLL_TYPE)


def estimate(sketch: hll_sketch | bytes, num_std_devs: int = 2) -> DistinctEstimate:
    """Distinct-count estimate with ``num_std_devs`` (1, 2 or 3) sigma bounds."""
    if num_std_devs not in (1, 2, 3):
        raise ValueError(f"num_std_devs={num_std_devs!r} is invalid: DataSketches offers 1, 2 or 3")
    if isinstance(sketch, bytes | bytearray | memoryview):
        sketch = deserialize_hll(bytes(sketch))
    return DistinctEstimate(
        float(sketch.get_estimate()),
        float(sketch.get_lower_bound(num_std_devs)),
        float(sketch.get_upper_bound(num_std_devs)),
    )
