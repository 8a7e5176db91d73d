"""KLL quantile sketches for ``quantiles: kll`` windows, in Spark's own KLL format.

Apache DataSketches ``kll_doubles_sketch``: ingest builds one per timer/histogram/distribution
pane partial, the window job merges them (``kll_columns``), and the stored images are what
Spark's ``kll_sketch_*`` / ``kll_merge_agg_double`` functions read. No conversion is needed
either way (checked with pyspark
4.3.0 and datasketches 5.2.0; ``tests/sketches/test_kll.py`` keeps a blob of each side):

- Spark reads Python's serialization: n, quantiles and merges of Python-built sketches (k 200,
  thousands of values, three values, a single value, empty) equal Python's own;
- Python reads Spark's: ``kll_sketch_agg_double`` and ``kll_merge_agg_double`` images
  deserialize here with the same n, k and quantiles (both use the compact DataSketches image,
  preamble ``05 01 0f ..`` for a sketch with several values, ``02 02 0f 04`` for one value);
- two traps: ``kll_sketch_get_quantile_double`` of an **empty** sketch fails the query
  (``KLL_INVALID_INPUT_SKETCH_BUFFER``; an empty sketch is what ``kll_merge_agg_double``
  returns for a group of NULLs, so guard with ``kll_sketch_get_n_double(...) > 0``), and a
  merge without an explicit k adopts the first input's k (order-dependent), so the job always
  passes k.

Error: KLL's only error is in **rank**, the same at every quantile, and it survives merging:
``kll_error(k)`` (DataSketches' a-priori bound, 99 % confidence) is ±1.33 % at k 200. So a
"p99" may be anywhere between p97.7 and p100: a KLL window stores p50 and p90 only.
"""

from __future__ import annotations

from collections.abc import Iterable

from datasketches import kll_doubles_sketch

__all__ = ["deserialize_kll", "merge_kll", "new_kll", "serialize_kll"]


def new_kll(k: int) -> kll_doubles_sketch:
    return kll_doubles_sketch(k)


def serialize_kll(sketch: kll_doubles_sketch) -> bytes:
    return bytes(sketch.serialize())


def deserialize_kll(blob: bytes) -> kll_doubles_sketch:
    return kll_doubles_sketch.deserialize(bytes(blob))


def merge_kll(blobs: Iterable[bytes | None], k: int) -> kll_doubles_sketch:
    """One sketch of k ``k`` holding every serialized sketch of ``blobs`` (NULLs skipped), as
    Spark's ``kll_merge_agg_double(blob, k)`` merges them."""
    merged = new_kll(k)
    for blob in blobs:
        if blob is not None:
            merged.merge(deserialize_kll(blob))
    return merged

