"""The open windows of one tumbling or hopping window spec: the one place they live.

``docs/architecture.md`` §4. The job's driver holds, per window spec, the on-time pane
partials of every window not final yet (``PaneAssigner`` placed them), merged per
(series, pane, first on-time window) into a :class:`_PaneTable`: scalar aggregates in numpy
arrays, t-digests and HDR buckets in CSR columns (``sketches.digest_columns``,
``sketches.hdr_columns``), merged by one compiled call per batch whatever the number of
series. A series is an integer (:class:`SeriesIndex`), so no string is hashed past the
batch's first look-up.

A tumbling window is one pane: its table *is* the window, published without a merge. A
hopping window is made of ``size / hop`` panes when it is published (:meth:`OpenWindows.windows`,
one merge per owner). Sets keep their pane HLL images and union them when published.

A pane leaves once every window holding it is final (:meth:`OpenWindows.evict`). Merging is a
pure function of the partials in their order (batch order, then log order within a batch), so
a batch run again after a crash gives the same values and the same sketch bytes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.sketches import digest_columns as dc
from streamgauge.sketches import hdr_columns as hc
from streamgauge.sketches.accuracy import SketchParams
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hdr_encoding import encode_v2
from streamgauge.sketches.tdigest import DEFAULT_K
from streamgauge.windows.assign import PaneAssigner
from streamgauge.windows.window_sketches import QUANTILE_COLUMNS, QUANTILES, merge_hll
from streamgauge.windows.window_sketches import distinct_count as hll_distinct_count

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


class SeriesIndex:
    """A stable integer per series (metric and projected tags) of one window spec."""

    def __init__(self) -> None:
        self._keys = pa.array([], pa.string())
        self.metric = pa.array([], pa.string())
        self.tags = pa.array([], pa.string())

    def __len__(self) -> int:
        return len(self._keys)

    def ids(self, metric: pa.Array, tags: pa.Array) -> IntArray:
        """The series of each row, new series numbered after the known ones."""
        keys = _joined(metric, tags)
        found = pc.index_in(keys, value_set=self._keys)
        known = np.asarray(pc.fill_null(found, -1).to_numpy(zero_copy_only=False), np.int64)
        new_rows = np.flatnonzero(known < 0)
        if new_rows.size:
            fresh = pc.take(keys, pa.array(new_rows, pa.int64()))
            unique = fresh.unique()
            first = np.asarray(pc.index_in(unique, value_set=fresh).to_numpy(), np.int64)
            take = pa.array(new_rows[first], pa.int64())
            base = len(self._keys)
            self._keys = pa.concat_arrays([self._keys, unique])
            self.metric = pa.concat_arrays([self.metric, _array(metric).take(take)])
            self.tags = pa.concat_arrays([self.tags, _array(tags).take(take)])
            placed = np.asarray(pc.index_in(fresh, value_set=unique).to_numpy(), np.int64)
            known[new_rows] = base + placed
        return known

    def keys_of(self, series: IntArray) -> pa.Array:
        return self._keys.take(pa.array(series, pa.int64()))

    def retain(self, alive: IntArray) -> IntArray:
        """Keep only the series ``alive`` (sorted unique ids), renumbered ``0..``; returns the
        new id of every old one (-1: gone)."""
        remap = np.full(len(self._keys), -1, np.int64)
        remap[alive] = np.arange(len(alive))
        take = pa.array(alive, pa.int64())
        self._keys, self.metric, self.tags = (
            self._keys.take(take), self.metric.take(take), self.tags.take(take)
        )
        return remap


@dataclass
class _PaneTable:
    """The merged partials of one (pane, first on-time window start): a row per series."""

    series: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    type_code: npt.NDArray[np.int8] = field(default_factory=lambda: np.zeros(0, np.int8))
    count: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    sum: FloatArray = field(default_factory=lambda: np.zeros(0))
    min: FloatArray = field(default_factory=lambda: np.zeros(0))
    max: FloatArray = field(default_factory=lambda: np.zeros(0))
    last: FloatArray = field(default_factory=lambda: np.zeros(0))
    last_event_ms: IntArray = field(default_factory=lambda: np.zeros(0, np.int64))
    digests: dc.DigestColumns | None = None
    hdr: hc.HdrColumns = field(default_factory=lambda: hc.HdrColumns.empty(0))
    hll_rows: list[IntArray] = field(default_factory=list)
    hll_images: list[pa.Array] = field(default_factory=list)

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

    def _grow(self, new_series: IntArray, k: int = DEFAULT_K) -> None:
        n = len(new_series)
        self.series = np.concatenate([self.series, new_series])
        self.type_code = np.concatenate([self.type_code, np.full(n, _NO_TYPE, np.int8)])
        self.count = np.concatenate([self.count, np.zeros(n, np.int64)])
        self.sum = np.concatenate([self.sum, np.zeros(n)])
        self.min = np.concatenate([self.min, np.full(n, np.inf)])
        self.max = np.concatenate([self.max, np.full(n, -np.inf)])
        self.last = np.concatenate([self.last, np.zeros(n)])
        self.last_event_ms = np.concatenate([self.last_event_ms, np.full(n, -(2**62), np.int64)])
        empty = dc.DigestColumns.empty(n, self.digests.k if self.digests else k)
        self.digests = empty if self.digests is None else dc.concat([self.digests, empty])
        self.hdr = hc.concat([self.hdr, hc.HdrColumns.empty(n)])

    def absorb(self, rows: IntArray, partials: _Partials) -> None:
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
        assert self.digests is not None
        if partials.has_digests:
            self.digests = dc.merge_into(self.digests, partials.digests, rows)
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
        assert self.digests is not None
        self.series = remap[self.series[rows]]
        for name in ("type_code", "count", "sum", "min", "max", "last", "last_event_ms"):
            setattr(self, name, getattr(self, name)[rows])
        self.digests = dc.take(self.digests, rows)
        self.hdr = take_hdr(self.hdr, rows)
        kept_rows, kept_images = [], []
        for held, images in zip(self.hll_rows, self.hll_images, strict=True):
            moved = new_row[held]
            ok = np.flatnonzero(moved >= 0)
            kept_rows.append(moved[ok])
            kept_images.append(images.take(pa.array(ok, pa.int64())))
        self.hll_rows, self.hll_images = kept_rows, kept_images


@dataclass(frozen=True)
class _Partials:
    """A batch's on-time partials of one pane table, as columns."""

    type_code: npt.NDArray[np.int8]
    count: IntArray
    sum: FloatArray
    min: FloatArray
    max: FloatArray
    last: FloatArray
    last_event_ms: IntArray
    digests: dc.DigestColumns
    hdr: hc.HdrColumns
    hll: pa.Array
    hll_valid: npt.NDArray[np.bool_]

    @property
    def has_digests(self) -> bool:
        return bool(len(self.digests.means)) or bool(len(self.hdr.buckets))

    @property
    def has_hll(self) -> bool:
        return bool(self.hll_valid.any())

    @classmethod
    def of(cls, placed: pa.Table, rows: IntArray, k: int) -> _Partials:
        take = pa.array(rows, pa.int64())
        part = placed.take(take)
        types = part.column("metric_type").combine_chunks()
        code = np.full(len(types), _NO_TYPE, np.int8)
        for index, name in enumerate(_TYPES):
            code[np.asarray(pc.equal(types, name).to_numpy(zero_copy_only=False), bool)] = index
        sketched = pc.is_in(types, pa.array(_SKETCHED))
        sketch = part.column("sketch").combine_chunks()
        nulls = pa.nulls(len(sketch), pa.binary())
        is_set = pc.equal(types, "s")
        return cls(
            code, _ints(part, "count"), _floats(part, "sum"),
            _floats(part, "min"), _floats(part, "max"),
            _floats(part, "last"), _ints(part, "last_event_ms"),
            dc.from_serialized(pc.if_else(sketched, sketch, nulls), k),
            hc.from_lists(part.column("hdr_bucket"), part.column("hdr_count")),
            pc.if_else(is_set, sketch, nulls),
            np.asarray(pc.and_(is_set, pc.is_valid(sketch)).to_numpy(zero_copy_only=False),
                       bool),
        )  # fmt: skip


@dataclass(frozen=True)
class Windows:
    """Windows made of panes: one row per (series, window), in ``WINDOW_SCHEMA``, and their
    HDR buckets (row ``i``'s in ``hdr``)."""

    table: pa.Table
    hdr: hc.HdrColumns

    @property
    def num_rows(self) -> int:
        return int(self.table.num_rows)


class OpenWindows:
    """The panes of one tumbling or hopping window spec's open windows (module docstring)."""

    def __init__(self, assigner: PaneAssigner, params: SketchParams) -> None:
        self.assigner = assigner
        self._k = params.tdigest_k
        self._lg_k = params.hll_lg_k
        self._layout = HdrLayout.from_params(params)
        self.series = SeriesIndex()
        self._tables: dict[tuple[int, int], _PaneTable] = {}
        """By (pane start, first on-time window start)."""

    @property
    def num_rows(self) -> int:
        """Pane rows held: a series has one per pane (and per first on-time window)."""
        return sum(table.num_rows for table in self._tables.values())

    def panes(self) -> list[tuple[int, int]]:
        """The (pane start, first on-time window start) of every pane table held."""
        return sorted(self._tables)

    @property
    def earliest_pane_ms(self) -> int | None:
        return min((pane for pane, _ in self._tables), default=None)

    def absorb(self, placed: pa.Table) -> None:
        """Add a batch's on-time partials (``Assigned.on_time``), in their order."""
        if placed.num_rows == 0:
            return
        series = self.series.ids(placed.column("metric"), placed.column("tags"))
        pane = _ints(placed, "pane_ms")
        from_start = _ints(placed, "from_start_ms")
        for p, f in sorted(set(zip(pane.tolist(), from_start.tolist(), strict=True))):
            rows = np.flatnonzero((pane == p) & (from_start == f))
            table = self._tables.setdefault((p, f), _PaneTable())
            if table.digests is None:
                table.digests = dc.DigestColumns.empty(0, self._k)
            table.absorb(table.rows_of(series[rows]), _Partials.of(placed, rows, self._k))

    def starts_touched(
        self, placed: pa.Table, wanted: Callable[[int], bool]
    ) -> dict[int, pa.Array]:
        """Per window start for which ``wanted(start)``, the series (``metric\\x1ftags``)
        whose window ``placed`` (a batch's on-time rows) changed: what a batch must publish
        again if those windows were published already. The series keys are built only when
        some start is wanted (a straggler's batch), not for every batch."""
        if placed.num_rows == 0:
            return {}
        a = self.assigner
        pane = _ints(placed, "pane_ms")
        first = np.maximum(_ints(placed, "from_start_ms"), pane - a.size_ms + a.hop_ms)
        starts = np.unique(np.concatenate(
            [first + j * a.hop_ms for j in range(a.panes_per_window)]
        )).tolist()  # fmt: skip
        starts = [start for start in starts if wanted(int(start))]
        if not starts:
            return {}
        keys = _joined(placed.column("metric"), placed.column("tags"))
        touched: dict[int, pa.Array] = {}
        for start in starts:
            inside = (first <= start) & (pane >= start) & (pane < start + a.size_ms)
            if inside.any():
                touched[int(start)] = pc.unique(keys.filter(pa.array(inside)))
        return touched

    def window_starts(self, ends_after_ms: int | None, ends_through_ms: int) -> list[int]:
        """Starts of the windows with data whose end is in ``(ends_after, ends_through]``."""
        earliest = self.earliest_pane_ms
        if earliest is None:
            return []
        a = self.assigner
        low = earliest - a.size_ms + a.hop_ms
        if ends_after_ms is not None:
            low = max(low, ends_after_ms - a.size_ms + 1)
        first = low + int(np.mod(a.offset_ms - low, a.hop_ms))
        return list(range(first, ends_through_ms - a.size_ms + 1, a.hop_ms))

    def windows(self, starts: dict[int, pa.Array | None]) -> Windows:
        """The windows starting at each of ``starts``, of every series with data in them
        (``None``) or of the series listed (``metric\\x1ftags`` keys)."""
        parts: list[Windows] = []
        size = self.assigner.size_ms
        for start, listed in sorted(starts.items()):
            tables = [t for (p, f), t in sorted(self._tables.items())
                      if start <= p < start + size and f <= start and t.num_rows]  # fmt: skip
            if tables:
                window = self._window(start, tables, listed)
                if window.num_rows:
                    parts.append(window)
        if not parts:
            return self._no_windows()
        if len(parts) == 1:
            return parts[0]
        return Windows(pa.concat_tables([p.table for p in parts]),
                       hc.concat([p.hdr for p in parts]))  # fmt: skip

    def evict(self, final_before_ms: int) -> None:
        """Forget the panes whose every window is final (ends at or before
        ``final_before_ms``): the newest window holding pane ``p`` ends at ``p + size``;
        and the series no pane holds any more."""
        size = self.assigner.size_ms
        gone = [key for key in self._tables if key[0] + size <= final_before_ms]
        for key in gone:
            del self._tables[key]
        if not gone or not len(self.series):
            return
        held = [t.series for t in self._tables.values()]
        alive = np.unique(np.concatenate(held)) if held else np.zeros(0, np.int64)
        if len(alive) == len(self.series):
            return
        remap = self.series.retain(alive)
        for table in self._tables.values():
            table.keep(np.ones(table.num_rows, bool), remap)

    def _window(self, start: int, tables: list[_PaneTable], listed: pa.Array | None) -> Windows:
        """One window start's rows, merged from its pane tables."""
        picked = []
        for table in tables:
            rows = np.arange(table.num_rows)
            if listed is not None:
                keys = self.series.keys_of(table.series)
                rows = np.flatnonzero(np.asarray(
                    pc.is_in(keys, value_set=listed).to_numpy(zero_copy_only=False), bool))
            if rows.size:
                picked.append((table, rows))
        if not picked:
            return self._no_windows()
        if len(picked) == 1 and not picked[0][0].hll_rows:
            table, rows = picked[0]
            merged = _Merged.of_rows(table, rows)
            hll: pa.Array = pa.nulls(len(rows), pa.binary())
        else:
            merged, hll = self._merged(picked)
        return self._rows(start, merged, hll)

    def _merged(self, picked: list[tuple[_PaneTable, IntArray]]) -> tuple[_Merged, pa.Array]:
        """Several pane tables' rows merged per series (in pane order)."""
        series = np.concatenate([t.series[rows] for t, rows in picked])
        owners, owner = np.unique(series, return_inverse=True)
        n = len(owners)
        type_code = np.full(n, _NO_TYPE, np.int8)
        count = np.zeros(n, np.int64)
        total = np.zeros(n)
        low = np.full(n, np.inf)
        high = np.full(n, -np.inf)
        last = np.zeros(n)
        last_event = np.full(n, -(2**62), np.int64)
        at = 0
        digest_parts, hdr_parts = [], []
        hll_owner: list[IntArray] = []
        hll_images: list[pa.Array] = []
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
            assert table.digests is not None
            digest_parts.append(dc.take(table.digests, rows))
            hdr_parts.append(take_hdr(table.hdr, rows))
            row_owner = np.full(table.num_rows, -1, np.int64)
            row_owner[rows] = o
            for held, images in zip(table.hll_rows, table.hll_images, strict=True):
                mine = row_owner[held]
                ok = np.flatnonzero(mine >= 0)
                hll_owner.append(mine[ok])
                hll_images.append(images.take(pa.array(ok, pa.int64())))
        merged = _Merged(
            owners, type_code, count, total, low, high, last,
            dc.merge_by_owner(dc.concat(digest_parts, self._k), owner, n),
            hc.merge_by_owner(hc.concat(hdr_parts), owner, n),
        )  # fmt: skip
        return merged, self._union_hll(hll_owner, hll_images, n)

    def _rows(self, start: int, merged: _Merged, hll: pa.Array) -> Windows:
        n = len(merged.series)
        take = pa.array(merged.series, pa.int64())
        types = np.array(_TYPES + ("",), dtype=object)[merged.type_code]
        is_sketched = np.isin(types, _SKETCHED)
        quantile_values = dc.quantiles(merged.digests, QUANTILES)
        blobs = dc.to_serialized(merged.digests)
        has_digest = pa.array(is_sketched & (merged.digests.sizes > 0))
        table = pa.table(
            {
                "metric": self.series.metric.take(take),
                "tags": self.series.tags.take(take),
                "metric_type": pa.array(types, pa.string()),
                "window_start_ms": pa.array(np.full(n, start, np.int64)),
                "window_end_ms": pa.array(np.full(n, start + self.assigner.size_ms, np.int64)),
                "count": pa.array(merged.count, pa.int64()),
                "sum": pa.array(merged.sum, pa.float64()),
                "min": pa.array(merged.min, pa.float64()),
                "max": pa.array(merged.max, pa.float64()),
                "last": pa.array(merged.last, pa.float64()),
                **{
                    name: pc.if_else(
                        has_digest, pa.array(quantile_values[:, i]), pa.nulls(n, pa.float64())
                    )
                    for i, name in enumerate(QUANTILE_COLUMNS)
                },
                "distinct_count": self._distinct_counts(hll),
                "sketch": pc.if_else(has_digest, blobs, hll),
                "hdr_histogram": self._encoded(merged.hdr, is_sketched),
            }
        )
        return Windows(table, merged.hdr)

    def _union_hll(self, owners: list[IntArray], images: list[pa.Array], n: int) -> pa.Array:
        """Per owner, the union of its sets' HLL images (NULL: no set image)."""
        out: list[bytes | None] = [None] * n
        if owners and sum(len(o) for o in owners):
            owner = np.concatenate(owners)
            blobs = pa.concat_arrays(images)
            order = np.argsort(owner, kind="stable")
            listed = blobs.take(pa.array(order, pa.int64())).to_pylist()
            sorted_owner = owner[order]
            bounds = np.flatnonzero(np.diff(sorted_owner)) + 1
            for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(order)], strict=True):
                out[int(sorted_owner[lo])] = merge_hll(b"", listed[lo:hi], self._lg_k)
        return pa.array(out, pa.binary())

    @staticmethod
    def _distinct_counts(hll: pa.Array) -> pa.Array:
        return pa.array([hll_distinct_count(b) if b else None for b in hll.to_pylist()],
                        pa.float64())  # fmt: skip

    def _encoded(self, hdr: hc.HdrColumns, is_sketched: npt.NDArray[np.bool_]) -> pa.Array:
        """The HdrHistogram V2 encoding of each sketched window (NULL otherwise)."""
        encoded = encode_v2(self._layout, hdr.offsets, hdr.buckets, hdr.counts)
        return pc.if_else(pa.array(is_sketched), encoded, pa.nulls(len(hdr), pa.string()))

    @staticmethod
    def _no_windows() -> Windows:
        return Windows(WINDOW_SCHEMA.empty_table(), hc.HdrColumns.empty(0))


@dataclass(frozen=True)
class _Merged:
    """Windows' merged values, row ``i`` of series ``series[i]``."""

    series: IntArray
    type_code: npt.NDArray[np.int8]
    count: IntArray
    sum: FloatArray
    min: FloatArray
    max: FloatArray
    last: FloatArray
    digests: dc.DigestColumns
    hdr: hc.HdrColumns

    @classmethod
    def of_rows(cls, table: _PaneTable, rows: IntArray) -> _Merged:
        assert table.digests is not None
        whole = len(rows) == table.num_rows
        return cls(
            table.series[rows], table.type_code[rows], table.count[rows], table.sum[rows],
            table.min[rows], table.max[rows], table.last[rows],
            table.digests if whole else dc.take(table.digests, rows),
            table.hdr if whole else take_hdr(table.hdr, rows),
        )  # fmt: skip


def take_hdr(cols: hc.HdrColumns, rows: IntArray) -> hc.HdrColumns:
    """The histograms of ``rows``, in that order."""
    sizes = np.diff(cols.offsets)[rows]
    offsets = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(sizes, out=offsets[1:])
    source = np.repeat(cols.offsets[rows] - offsets[:-1], sizes) + np.arange(offsets[-1])
    return hc.HdrColumns(offsets, cols.buckets[source], cols.counts[source])


def _joined(metric: pa.Array | pa.ChunkedArray, tags: pa.Array | pa.ChunkedArray) -> pa.Array:
    joined = pc.binary_join_element_wise(metric, tags, "\x1f")
    return joined.combine_chunks() if isinstance(joined, pa.ChunkedArray) else joined


def _array(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _ints(table: pa.Table, name: str) -> IntArray:
    values = _array(table.column(name)).to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.int64)


def _floats(table: pa.Table, name: str) -> FloatArray:
    values = _array(table.column(name)).to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.float64)
