"""The column kernels of a window's quantile sketch, as one object: t-digest or KLL.

A window's ``quantiles:`` setting (``tdigest``, the default, or ``kll``) compiles into one
:class:`QuantileKernel` (:func:`quantile_kernel`). The open windows' rows
(``windows.window_rows``) call it for every operation on their quantile sketches (decode a
batch's pane sketches, merge them into held rows, gather and merge panes into windows, read
the percentiles, encode), so every window takes the same path whichever sketch it merges:

===================  =====================  ============================  ===================
kernel               pane partials' column  columns                       percentiles stored
===================  =====================  ============================  ===================
``TDigestKernel``    ``sketch``             ``digest_columns`` CSR        p50, p90, p99, p999
``KllKernel``        ``kll``                ``kll_columns`` CSR           p50, p90
===================  =====================  ============================  ===================

A KLL sketch's only error is in rank and the same at every quantile (``accuracy.kll_error``:
±1.33 % at k 200), so a "p99" could lie anywhere in p97.7..p100: a KLL window stores p50 and
p90 and leaves p99 and p999 NULL.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Literal, Protocol, cast

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from streamgauge.sketches import digest_columns as dc
from streamgauge.sketches import kll_columns as kc
from streamgauge.sketches.accuracy import KLL_PERCENTILES, PERCENTILES, SketchParams

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

__all__ = ["KllKernel", "QuantileColumns", "QuantileKernel", "TDigestKernel", "quantile_kernel"]


class QuantileColumns(Protocol):
    """Quantile sketches of many series as columns (``DigestColumns``, ``KllColumns``)."""

    def __len__(self) -> int: ...

    @property
    def sizes(self) -> IntArray:
        """Per series, 0 when its sketch is empty."""
        ...


class QuantileKernel(ABC):
    """What a window does with its quantile sketches (module docstring). Columns given to a
    kernel are of its own kind (those it made)."""

    partial_column: str
    """The pane partials' column holding this sketch (the segment log's schema)."""
    stored_quantiles: frozenset[float]
    """The normalized ranks this sketch is accurate enough to store a value for."""

    def __init__(self, k: int) -> None:
        self.k = k

    @abstractmethod
    def empty(self, n: int) -> QuantileColumns:
        """``n`` empty sketches."""

    @abstractmethod
    def from_serialized(self, blobs: pa.Array) -> QuantileColumns:
        """The sketches of serialised ``blobs`` (NULL: empty)."""

    @abstractmethod
    def to_serialized(self, cols: QuantileColumns) -> pa.Array:
        """Each sketch serialised in its library's binary format."""

    @abstractmethod
    def concat(self, parts: Sequence[QuantileColumns]) -> QuantileColumns:
        """The sketches of ``parts``, one after another."""

    @abstractmethod
    def gather(self, parts: Sequence[tuple[QuantileColumns, npt.ArrayLike]]) -> QuantileColumns:
        """Rows ``rows`` of each ``(cols, rows)`` part, the parts one after another."""

    def take(self, cols: QuantileColumns, rows: npt.ArrayLike) -> QuantileColumns:
        """Rows ``rows`` of ``cols``, in that order."""
        return self.gather([(cols, rows)])

    @abstractmethod
    def merge_by_owner(
        self, cols: QuantileColumns, owner: npt.ArrayLike, n_owners: int
    ) -> QuantileColumns:
        """Sketch ``i`` merged into row ``owner[i]`` of ``n_owners``, in order."""

    @abstractmethod
    def merge_into(
        self, held: QuantileColumns, partials: QuantileColumns, owner: npt.ArrayLike
    ) -> QuantileColumns:
        """``held`` with ``partials[i]`` merged into its row ``owner[i]``, in order."""

    def quantiles(self, cols: QuantileColumns, qs: Sequence[float]) -> FloatArray:
        """Values at the normalized ranks ``qs``, shape ``(len(cols), len(qs))``: NaN for an
        empty sketch and for a rank not in ``stored_quantiles``."""
        kept = [i for i, q in enumerate(qs) if q in self.stored_quantiles]
        out = np.full((len(cols), len(qs)), np.nan)
        if kept and len(cols):
            out[:, kept] = self._quantiles(cols, [qs[i] for i in kept])
        return out

    @abstractmethod
    def _quantiles(self, cols: QuantileColumns, qs: Sequence[float]) -> FloatArray: ...


def _digests(cols: QuantileColumns) -> dc.DigestColumns:
    return cast(dc.DigestColumns, cols)


def _klls(cols: QuantileColumns) -> kc.KllColumns:
    return cast(kc.KllColumns, cols)


class TDigestKernel(QuantileKernel):
    """DataSketches ``tdigest_double`` (``digest_columns``): every percentile."""

    partial_column = "sketch"
    stored_quantiles = frozenset(PERCENTILES.values())

    def empty(self, n: int) -> QuantileColumns:
        return dc.DigestColumns.empty(n, self.k)

    def from_serialized(self, blobs: pa.Array) -> QuantileColumns:
        return dc.from_serialized(blobs, self.k)

    def to_serialized(self, cols: QuantileColumns) -> pa.Array:
        return cast(pa.Array, dc.to_serialized(_digests(cols)))

    def concat(self, parts: Sequence[QuantileColumns]) -> QuantileColumns:
        return dc.concat([_digests(p) for p in parts], self.k)

    def gather(self, parts: Sequence[tuple[QuantileColumns, npt.ArrayLike]]) -> QuantileColumns:
        return dc.gather([(_digests(cols), rows) for cols, rows in parts], self.k)

    def merge_by_owner(
        self, cols: QuantileColumns, owner: npt.ArrayLike, n_owners: int
    ) -> QuantileColumns:
        return dc.merge_by_owner(_digests(cols), owner, n_owners)

    def merge_into(
        self, held: QuantileColumns, partials: QuantileColumns, owner: npt.ArrayLike
    ) -> QuantileColumns:
        return dc.merge_into(_digests(held), _digests(partials), owner)

    def _quantiles(self, cols: QuantileColumns, qs: Sequence[float]) -> FloatArray:
        return dc.quantiles(_digests(cols), qs)


class KllKernel(QuantileKernel):
    """DataSketches ``kll_doubles_sketch`` (``kll_columns``): p50 and p90 only."""

    partial_column = "kll"
    stored_quantiles = frozenset(PERCENTILES[name] for name in KLL_PERCENTILES)

    def empty(self, n: int) -> QuantileColumns:
        return kc.KllColumns.empty(n, self.k)

    def from_serialized(self, blobs: pa.Array) -> QuantileColumns:
        return kc.from_serialized(blobs, self.k)

    def to_serialized(self, cols: QuantileColumns) -> pa.Array:
        return kc.to_serialized(_klls(cols))

    def concat(self, parts: Sequence[QuantileColumns]) -> QuantileColumns:
        return kc.concat([_klls(p) for p in parts], self.k)

    def gather(self, parts: Sequence[tuple[QuantileColumns, npt.ArrayLike]]) -> QuantileColumns:
        return kc.gather([(_klls(cols), rows) for cols, rows in parts], self.k)

    def merge_by_owner(
        self, cols: QuantileColumns, owner: npt.ArrayLike, n_owners: int
    ) -> QuantileColumns:
        return kc.merge_by_owner(_klls(cols), owner, n_owners)

    def merge_into(
        self, held: QuantileColumns, partials: QuantileColumns, owner: npt.ArrayLike
    ) -> QuantileColumns:
        return kc.merge_into(_klls(held), _klls(partials), owner)

    def _quantiles(self, cols: QuantileColumns, qs: Sequence[float]) -> FloatArray:
        return kc.quantiles(_klls(cols), qs)


def quantile_kernel(kind: Literal["tdigest", "kll"], params: SketchParams) -> QuantileKernel:
    """The kernel of a window's ``quantiles:`` setting, at the config's compiled k."""
    if kind == "kll":
        return KllKernel(params.kll_k)
    return TDigestKernel(params.tdigest_k)
