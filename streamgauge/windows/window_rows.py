"""Held aggregates of windows as columns, and the windows' rows made of them.

``docs/architecture.md`` §4. A window's open state is a row of :class:`AggregateRows`: scalar
aggregates in numpy arrays, quantile sketches (t-digests, or KLLs in a ``quantiles: kll``
window: ``sketches.quantile_kernels``) and HDR buckets in CSR columns, merged by one compiled
call per batch whatever the number of series; sets keep their pane HLL images and union them
when a window is made. ``OpenWindows`` (tumbling, hopping: a row per series and pane) and
``OpenSessions`` (a row per session) hold them; :class:`WindowBuilder` merges rows into
windows and makes their result rows (``WINDOW_SCHEMA``) in one pass for all series.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.sketches import hdr_columns as hc
from streamgauge.sketches.accuracy import SketchParams
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hdr_encoding import encode_v2
from streamgauge.sketches.hll_unions import HllUnions, ImageRows, union_rows
from streamgauge.sketches.kernels import run_indices
from streamgauge.sketches.quantile_kernels import QuantileColumns, QuantileKernel
from streamgauge.windows.window_sketches import QUANTILE_COLUMNS, QUANTILES

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_SKETCHED = ("d", "h", "ms")
_TYPES = ("c", "d", "g", "h", "ms", "s")
"""Every metric type, sorted: a window of one name and tags with partials of two types takes
the smaller, as the first design's ``min(metric_type)`` did."""
_NO_TYPE = len(_TYPES)

WINDOW_SCHEMA = pa.schema([
    ("metric", pa.string()), ("tags", pa.string()), ("metric_type", pa.string()),
    ("window_start_ms", pa.int64()), ("window_end_ms", pa.int64()), ("count", pa.int64()),
    ("sum", pa.float64()), ("min", pa.float64()), ("max", pa.float64()),
    ("last", pa.float64()), *((name, pa.float64()) for name in QUANTILE_COLUMNS),
    ("distinct_count", pa.float64()), ("sketch", pa.binary()), ("hdr_histogram", pa.string()),
])  # fmt: skip
"""The columns of :meth:`OpenWindows.windows` (``results.to_result_rows`` takes them), besides
the HDR buckets it returns apart."""


class SeriesNames(Protocol):
    """The metric and projected tags of each series id (``open_windows.SeriesIndex``)."""

    metric: pa.Array
    tags: pa.Array


@dataclass
class AggregateRows:
    """Merged partials, a row per (series, what the owner keys it by): a pane of
    ``OpenWindows``, a session of ``OpenSessions``. Row ``i`` belongs to series
    ``series[i]``; the aggregates of every metric type sit side by side, the quantile
    sketches those of ``kernel``."""

    kernel: QuantileKernel
    series: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    type_code: npt.NDArray[np.int8] = field(default_factory=lambda: np.zeros(0, np.int8))
    count: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    sum: FloatArray = field(default_factory=lambda: np.zeros(0))
    min: FloatArray = field(default_factory=lambda: np.zeros(0))
    max: FloatArray = field(default_factory=lambda: np.zeros(0))
    last: FloatArray = field(default_factory=lambda: np.zeros(0))
    last_event_ms: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    quantile_sketches: QuantileColumns = field(init=False)
    """``kernel``'s columns (t-digests or KLLs)."""
    hdr: hc.HdrColumns = field(default_factory=lambda: hc.HdrColumns.empty(0))
    hll_rows: list[IntArray] = field(default_factory=list)
    hll_images: list[pa.Array] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.quantile_sketches = self.kernel.empty(len(self.series))

    @property
    def num_rows(self) -> int:
        return len(self.series)

    def rows_of(self, series: IntArray) -> IntArray:
        """Each series' row, new rows (empty aggregates) added for series not held yet."""
        lookup = np.full(len(series), -1, np.int64)
        if self.num_rows:
            order = np.argsort(self.series, kind="stable")
            at = np.searchsorted(self.series[order], series)
            at = np.minimum(at, self.num_rows - 1)
            hit = self.series[order][at] == series
            lookup[hit] = order[at[hit]]
        missing = np.flatnonzero(lookup < 0)
        if missing.size:
            new_series, first = np.unique(series[missing], return_index=True)
            new_series = series[missing][np.sort(first)]
            base = self.num_rows
            self._grow(new_series)
            positions = {int(s): base + i for i, s in enumerate(new_series.tolist())}
            lookup[missing] = [positions[int(s)] for s in series[missing].tolist()]
        return lookup

    def add_rows(self, new_series: IntArray) -> IntArray:
        """Empty rows for ``new_series`` (one each, in order); their row numbers."""
        base = self.num_rows
        self._grow(new_series)
        return np.arange(base, self.num_rows, dtype=np.int64)

    def _grow(self, new_series: IntArray) -> None:
        n = len(new_series)
        self.series = np.concatenate([self.series, new_series])
        self.type_code = np.concatenate([self.type_code, np.full(n, _NO_TYPE, np.int8)])
        self.count = np.concatenate([self.count, np.zeros(n, np.int64)])
        self.sum = np.concatenate([self.sum, np.zeros(n)])
        self.min = np.concatenate([self.min, np.full(n, np.inf)])
        self.max = np.concatenate([self.max, np.full(n, -np.inf)])
        self.last = np.concatenate([self.last, np.zeros(n)])
        self.last_event_ms = np.concatenate([self.last_event_ms, np.full(n, -(2**62), np.int64)])
        self.quantile_sketches = self.kernel.concat([self.quantile_sketches,
                                                     self.kernel.empty(n)])  # fmt: skip
        self.hdr = hc.concat([self.hdr, hc.HdrColumns.empty(n)])

    def absorb(self, rows: IntArray, partials: Partials) -> None:
        """Merge ``partials`` (in order) into the table's ``rows``."""
        np.minimum.at(self.type_code, rows, partials.type_code)
        np.add.at(self.count, rows, partials.count)
        np.add.at(self.sum, rows, partials.sum)
        np.minimum.at(self.min, rows, partials.min)
        np.maximum.at(self.max, rows, partials.max)
        # ``last``: the value of the latest event; of equal events, the later partial.
        order = np.lexsort((np.arange(len(rows)), partials.last_event_ms, rows))
        is_last = np.r_[rows[order][1:] != rows[order][:-1], True]
        latest = order[is_last]
        newer = partials.last_event_ms[latest] >= self.last_event_ms[rows[latest]]
        self.last[rows[latest][newer]] = partials.last[latest][newer]
        self.last_event_ms[rows[latest][newer]] = partials.last_event_ms[latest][newer]
        if partials.has_distributions:
            self.quantile_sketches = self.kernel.merge_into(
                self.quantile_sketches, partials.quantile_sketches, rows
            )
            self.hdr = hc.merge_into(self.hdr, partials.hdr, rows)
        if partials.has_hll:
            valid = np.flatnonzero(partials.hll_valid)
            self.hll_rows.append(rows[valid])
            self.hll_images.append(partials.hll.take(pa.array(valid, pa.int64())))

    def keep(self, alive: npt.NDArray[np.bool_], remap: IntArray) -> None:
        """Only the rows ``alive``, their series renumbered by ``remap``."""
        rows = np.flatnonzero(alive)
        new_row = np.full(self.num_rows, -1, np.int64)
        new_row[rows] = np.arange(len(rows))
        self.series = remap[self.series[rows]]
        for name in ("type_code", "count", "sum", "min", "max", "last", "last_event_ms"):
            setattr(self, name, getattr(self, name)[rows])
        self.quantile_sketches = self.kernel.take(self.quantile_sketches, rows)
        self.hdr = take_hdr(self.hdr, rows)
        kept_rows, kept_images = [], []
        for held, images in zip(self.hll_rows, self.hll_images, strict=True):
            moved = new_row[held]
            ok = np.flatnonzero(moved >= 0)
            kept_rows.append(moved[ok])
            kept_images.append(images.take(pa.array(ok, pa.int64())))
        self.hll_rows, self.hll_images = kept_rows, kept_images


def _only(blobs: pa.Array, rows: npt.NDArray[np.bool_]) -> pa.Array:
    """``blobs`` where ``rows``, NULL elsewhere."""
    return _where(rows, blobs, pa.nulls(len(blobs), blobs.type))


def _where(rows: npt.NDArray[np.bool_], then: pa.Array, otherwise: pa.Array) -> pa.Array:
    """``pc.if_else`` without its copy when every row takes one side: a batch's windows are
    mostly of one type, and a timer window's blobs are kilobytes each."""
    if rows.all():
        return then
    if not rows.any():
        return otherwise
    return pc.if_else(pa.array(rows), then, otherwise)


@dataclass(frozen=True)
class Partials:
    """A batch's on-time partials of one pane table, as columns."""

    type_code: npt.NDArray[np.int8]
    count: IntArray
    sum: FloatArray
    min: FloatArray
    max: FloatArray
    last: FloatArray
    last_event_ms: IntArray
    quantile_sketches: QuantileColumns
    hdr: hc.HdrColumns
    hll: pa.Array
    hll_valid: npt.NDArray[np.bool_]

    @property
    def has_distributions(self) -> bool:
        """Some partial holds values' distribution (a quantile sketch or HDR buckets)."""
        return bool(self.quantile_sketches.sizes.any()) or bool(len(self.hdr.buckets))

    @property
    def has_hll(self) -> bool:
        return bool(self.hll_valid.any())

    @classmethod
    def of(cls, placed: pa.Table, rows: IntArray, kernel: QuantileKernel) -> Partials:
        """The ``rows`` of ``placed`` (all of them, the usual batch of one pane: no copy), their
        quantile sketches ``kernel``'s."""
        whole = len(rows) == placed.num_rows and (len(rows) == 0 or int(rows[-1]) == len(rows) - 1)
        part = placed if whole else placed.take(pa.array(rows, pa.int64()))
        types = part.column("metric_type").combine_chunks()
        code = np.full(len(types), _NO_TYPE, np.int8)
        for index, name in enumerate(_TYPES):
            code[np.asarray(pc.equal(types, name).to_numpy(zero_copy_only=False), bool)] = index
        sketch = part.column("sketch").combine_chunks()
        is_set = code == _TYPES.index("s")
        is_sketched = np.isin(code, [_TYPES.index(t) for t in _SKETCHED])
        return cls(
            code, ints_of(part, "count"), floats_of(part, "sum"),
            floats_of(part, "min"), floats_of(part, "max"),
            floats_of(part, "last"), ints_of(part, "last_event_ms"),
            kernel.from_serialized(_only(array_of(part.column(kernel.partial_column)),
                                         is_sketched)),
            hc.from_lists(part.column("hdr_bucket"), part.column("hdr_count")),
            _only(sketch, is_set),
            is_set & np.asarray(pc.is_valid(sketch).to_numpy(zero_copy_only=False), bool),
        )  # fmt: skip


    @classmethod
    def of_merged(cls, merged: Merged, hll: pa.Array) -> Partials:
        """Merged windows as partials (to fold into rows: a merge of sessions)."""
        return cls(
            merged.type_code, merged.count, merged.sum, merged.min, merged.max, merged.last,
            merged.last_event_ms, merged.quantile_sketches, merged.hdr, hll,
            np.asarray(pc.is_valid(hll).to_numpy(zero_copy_only=False), bool),
        )  # fmt: skip


ENCODING_COLUMNS = ("sketch", "hdr_histogram")
"""The columns of ``WINDOW_SCHEMA`` that serialise a window's sketches (``Windows.encodings``)."""
VALUE_SCHEMA = pa.schema([f for f in WINDOW_SCHEMA if f.name not in ENCODING_COLUMNS])
"""``WINDOW_SCHEMA`` without the encodings: what a reader sees as the window's values."""


class Windows:
    """Windows made of panes: one row per (series, window), in ``WINDOW_SCHEMA``, and their
    HDR buckets (row ``i``'s in ``hdr``).

    The values (``values``: counts, sums, quantiles, distinct counts) are made at once; the
    sketches' serialised forms (``encodings``: the t-digest's DataSketches bytes, the
    HdrHistogram V2 encoding) when first asked for. A closing batch stores its windows' rows
    before their sketches (``store.commit_batch``'s ``fresh_encodings``), and encoding timer
    windows is about half of a closing batch's step: the rows need not wait for it.
    """

    def __init__(
        self, values: pa.Table, hdr: hc.HdrColumns, encode: Callable[[], pa.Table]
    ) -> None:
        self.values = values
        """``VALUE_SCHEMA``."""
        self.hdr = hdr
        self._encode = encode
        self._encodings: pa.Table | None = None

    @property
    def num_rows(self) -> int:
        return int(self.values.num_rows)

    @property
    def encodings(self) -> pa.Table:
        """``ENCODING_COLUMNS``, row ``i``'s for row ``i`` of ``values``; made once."""
        if self._encodings is None:
            self._encodings = self._encode()
        return self._encodings

    @property
    def table(self) -> pa.Table:
        """``WINDOW_SCHEMA``: the values with their encodings."""
        table = self.values
        for name in ENCODING_COLUMNS:
            table = table.append_column(WINDOW_SCHEMA.field(name), self.encodings.column(name))
        return table.select(WINDOW_SCHEMA.names)

    @classmethod
    def concat(cls, parts: Sequence[Windows]) -> Windows:
        """``parts``' rows in order, still encoded only when asked."""
        return cls(
            pa.concat_tables([p.values for p in parts]), hc.concat([p.hdr for p in parts]),
            lambda: pa.concat_tables([p.encodings for p in parts]),
        )  # fmt: skip


class WindowBuilder:
    """Merges held rows into windows and makes their rows, for one window spec's series."""

    def __init__(self, series: SeriesNames, params: SketchParams, kernel: QuantileKernel
                 ) -> None:  # fmt: skip
        self.series = series
        self._kernel = kernel
        self._lg_k = params.hll_lg_k
        self._layout = HdrLayout.from_params(params)

    def merged(
        self, picked: list[tuple[AggregateRows, IntArray]], owner: IntArray | None = None,
        n_owners: int = 0,
    ) -> tuple[Merged, HllUnions]:  # fmt: skip
        """The rows ``picked`` (of one or several tables) merged per owner, in the order
        given; the union of their HLL images (NULL: none) with its estimate. ``owner`` (one
        per picked row, in order; ``n_owners`` of them): which merged row each goes to; None:
        one per series. Each owner's series is that of its first row."""
        series = np.concatenate([t.series[rows] for t, rows in picked])
        if owner is None:
            owners, owner = np.unique(series, return_inverse=True)
            n = len(owners)
        else:
            n = n_owners
            owners = np.zeros(n, np.int64)
            owners[owner[::-1]] = series[::-1]
        type_code = np.full(n, _NO_TYPE, np.int8)
        count = np.zeros(n, np.int64)
        total = np.zeros(n)
        low = np.full(n, np.inf)
        high = np.full(n, -np.inf)
        last = np.zeros(n)
        last_event = np.full(n, -(2**62), np.int64)
        at = 0
        quantile_parts, hdr_parts = [], []
        hll_parts: list[ImageRows] = []
        for table, rows in picked:
            o = owner[at : at + len(rows)]
            at += len(rows)
            np.minimum.at(type_code, o, table.type_code[rows])
            np.add.at(count, o, table.count[rows])
            np.add.at(total, o, table.sum[rows])
            np.minimum.at(low, o, table.min[rows])
            np.maximum.at(high, o, table.max[rows])
            newer = table.last_event_ms[rows] >= last_event[o]
            last[o[newer]] = table.last[rows][newer]
            last_event[o[newer]] = table.last_event_ms[rows][newer]
            quantile_parts.append((table.quantile_sketches, rows))
            hdr_parts.append(take_hdr(table.hdr, rows))
            row_owner = np.full(table.num_rows, -1, np.int64)
            row_owner[rows] = o
            for held, images in zip(table.hll_rows, table.hll_images, strict=True):
                mine = row_owner[held]
                ok = np.flatnonzero(mine >= 0)
                hll_parts.append(ImageRows(images, ok, mine[ok]))
        merged = Merged(
            owners, type_code, count, total, low, high, last, last_event,
            self._kernel.merge_by_owner(self._kernel.gather(quantile_parts), owner, n),
            hc.merge_by_owner(hc.concat(hdr_parts), owner, n),
        )  # fmt: skip
        return merged, union_rows(hll_parts, n, self._lg_k)

    def rows(
        self, start: int | IntArray, end: int | IntArray, merged: Merged, hll: HllUnions
    ) -> Windows:
        """Windows ``[start, end)`` (one for all, or one per merged row) of ``merged``."""
        n = len(merged.series)
        take = pa.array(merged.series, pa.int64())
        types = np.array(_TYPES + ("",), dtype=object)[merged.type_code]
        is_sketched = np.isin(types, _SKETCHED)
        quantile_values = self._kernel.quantiles(merged.quantile_sketches, QUANTILES)
        has_quantiles = is_sketched & (merged.quantile_sketches.sizes > 0)
        values = pa.table(
            {
                "metric": self.series.metric.take(take),
                "tags": self.series.tags.take(take),
                "metric_type": pa.array(types, pa.string()),
                "window_start_ms": pa.array(np.broadcast_to(start, n), pa.int64()),
                "window_end_ms": pa.array(np.broadcast_to(end, n), pa.int64()),
                "count": pa.array(merged.count, pa.int64()),
                "sum": pa.array(merged.sum, pa.float64()),
                "min": pa.array(merged.min, pa.float64()),
                "max": pa.array(merged.max, pa.float64()),
                "last": pa.array(merged.last, pa.float64()),
                **{
                    # NaN: a percentile the kernel stores none for (a KLL's p99)
                    name: _where(has_quantiles,
                                 pa.array(quantile_values[:, i], from_pandas=True),
                                 pa.nulls(n, pa.float64()))
                    for i, name in enumerate(QUANTILE_COLUMNS)
                },  # fmt: skip
                "distinct_count": self._distinct_counts(hll),
            }
        )

        def encode() -> pa.Table:
            return pa.table({
                "sketch": _where(has_quantiles,
                                 self._kernel.to_serialized(merged.quantile_sketches),
                                 hll.images),
                "hdr_histogram": self._encoded(merged.hdr, is_sketched),
            })  # fmt: skip

        return Windows(values, merged.hdr, encode)

    @staticmethod
    def _distinct_counts(hll: HllUnions) -> pa.Array:
        """The estimates rounded as Spark's ``hll_sketch_estimate`` rounds them (the count
        equals what Spark SQL reads from the stored image); NULL without a set."""
        return pa.array(np.floor(hll.estimates + 0.5), pa.float64(), from_pandas=True)

    def _encoded(self, hdr: hc.HdrColumns, is_sketched: npt.NDArray[np.bool_]) -> pa.Array:
        """The HdrHistogram V2 encoding of each sketched window (NULL otherwise)."""
        encoded = encode_v2(self._layout, hdr.offsets, hdr.buckets, hdr.counts)
        return _where(is_sketched, encoded, pa.nulls(len(hdr), pa.string()))

    @staticmethod
    def none() -> Windows:
        return Windows(
            VALUE_SCHEMA.empty_table(), hc.HdrColumns.empty(0),
            lambda: WINDOW_SCHEMA.empty_table().select(list(ENCODING_COLUMNS)),
        )  # fmt: skip


@dataclass(frozen=True)
class Merged:
    """Windows' merged values, row ``i`` of series ``series[i]``."""

    series: IntArray
    type_code: npt.NDArray[np.int8]
    count: IntArray
    sum: FloatArray
    min: FloatArray
    max: FloatArray
    last: FloatArray
    last_event_ms: IntArray
    quantile_sketches: QuantileColumns
    hdr: hc.HdrColumns

    @classmethod
    def of_rows(cls, table: AggregateRows, rows: IntArray) -> Merged:
        whole = len(rows) == table.num_rows
        return cls(
            table.series[rows], table.type_code[rows], table.count[rows], table.sum[rows],
            table.min[rows], table.max[rows], table.last[rows], table.last_event_ms[rows],
            table.quantile_sketches if whole
            else table.kernel.take(table.quantile_sketches, rows),
            table.hdr if whole else take_hdr(table.hdr, rows),
        )  # fmt: skip


def take_hdr(cols: hc.HdrColumns, rows: IntArray) -> hc.HdrColumns:
    """The histograms of ``rows``, in that order."""
    sizes = np.diff(cols.offsets)[rows]
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    source = run_indices(cols.offsets[rows], sizes)
    return hc.HdrColumns(offsets, cols.buckets[source], cols.counts[source])


def array_of(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def ints_of(table: pa.Table, name: str) -> IntArray:
    values = array_of(table.column(name)).to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.int64)


def floats_of(table: pa.Table, name: str) -> FloatArray:
    values = array_of(table.column(name)).to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.float64)
