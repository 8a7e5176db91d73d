"""The sketch columns of pane partials: raw values kept per (series, pane) until a drain.

Why keep raw values rather than update a sketch per sample: at drain time the values of every
partial are one CSR (the fast lane's gathered in one indexing), their t-digests are built by
one ``digest_columns.merge_by_owner`` call (DataSketches' compress, the bytes its ``update``
then ``serialize`` would write) and their HDR bucket indices by one
``HdrLayout.bucket_indices``; no Python call per partial or per sample, and the receive loop's
fast lane only appends the arrays it already has. A pane lives at most a roll interval
(250 ms by default) in the combiner, so the values held are bounded by what one roll interval
brings.

Columns produced (``SEGMENT_SCHEMA``):

- ``sketch``: timers/histograms/distributions: a serialized ``tdigest_double(k)``; sets: a
  compact HLL_8 of the members (Spark's ``hll_union_agg`` reads it); NULL otherwise;
- ``hdr_bucket``/``hdr_count``: timers/histograms/distributions: the HDR histogram of the
  values as sparse rows (sorted bucket indices, counts); NULL otherwise. Values outside the
  layout's range are clamped into its end buckets (their exact value still shows in min/max);
- ``kll``: timers/histograms/distributions, only when built with ``kll_k`` (a window of the
  config has ``quantiles: kll``): a serialized ``kll_doubles_sketch(kll_k)`` of the values,
  the DataSketches binary format (``sketches.kll_columns`` merges it, Spark reads it); NULL
  otherwise. Built for all partials by one ``kll_columns.merge_by_owner`` call
  (``_unit_klls``).

**Weights.** Each value carries the number of values it stands for (``protocol.sample_weight``:
``lat:5|h|@0.5`` is 5 with weight 2). A partial whose values all weigh 1 is built as above. One
with heavier values gets every sketch as if each value had been sent that many times, without
repeating it (a weight may be 2**31):

- HDR: the weights are added per bucket;
- t-digest: a value of weight ``w`` enters as ``min(w, 2k)`` centroids at that value (integer
  weights adding up to ``w``; fewer when the row has many values: at most 2**16 centroids a
  row), compressed by ``digest_columns``' merge (datasketches' own compress) into a
  ``tdigest_double(k)``; the Python binding has no weighted update. Pieces rather than one
  centroid of weight ``w``: the rank function interpolates between centroid means, so one
  heavy centroid would spread its values towards its neighbours (10 sent at ``@0.1`` beside
  three 1000s: p50 280 instead of 10). Small weights are thus exactly ``w`` copies; a digest
  holds at most ~2k centroids, so no value needs more pieces than that;
- KLL: per distinct weight, a sketch of the values with it is merged into the result that
  many times, by doubling (``log2(weight)`` merges); KLL has no weighted update either.

The three then hold the same total weight, the partial's ``count``.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from datasketches import kll_doubles_sketch

from streamgauge.sketches import digest_columns, kll_columns
from streamgauge.sketches.accuracy import SketchParams
from streamgauge.sketches.hdr import HdrLayout
from streamgauge.sketches.hll import new_hll, serialize_hll
from streamgauge.sketches.kernels import run_indices
from streamgauge.sketches.kll import deserialize_kll, new_kll, serialize_kll

SKETCHED_TYPES = ("d", "h", "ms")
"""Types whose partials carry a t-digest and HDR buckets of their values (sets: an HLL)."""

SeriesKey = tuple[str, str, str]  # metric, metric type, canonical tags JSON
PartialKey = tuple[SeriesKey, int]  # series, pane start


@dataclass(frozen=True, slots=True)
class FastValues:
    """The fast lane's raw values of one segment, grouped by row: ``values[starts[i]:ends[i]]``
    (in line order) belong to row ``rows[i]``, each row at most once; ``weights`` beside
    ``values``."""

    rows: np.ndarray
    starts: np.ndarray
    ends: np.ndarray
    values: np.ndarray
    weights: np.ndarray


@dataclass(frozen=True, slots=True)
class FastKeys:
    """The keys of the fast lane's rows of a segment, (``slot_keys[slots[i]]``, ``panes[i]``),
    made only when iterated: a drain needs them only for a partial the fast lane took over
    from the general lane, whose held values are filed under its key."""

    slot_keys: Sequence[SeriesKey | None]
    slots: np.ndarray
    panes: np.ndarray

    def __len__(self) -> int:
        return len(self.slots)

    def __iter__(self) -> Iterator[tuple[SeriesKey | None, int]]:
        slot_keys = self.slot_keys
        return zip((slot_keys[s] for s in self.slots.tolist()), self.panes.tolist(), strict=True)


class PaneSketches:
    """Raw values and set members per partial, turned into sketch columns at drain time."""

    def __init__(self, params: SketchParams, kll_k: int | None = None) -> None:
        self._params = params
        self._kll_k = kll_k
        self._layout = HdrLayout.from_params(params)
        # values and their weights (protocol.sample_weight), side by side
        self._values: defaultdict[PartialKey, list[tuple[np.ndarray, np.ndarray]]] = (
            defaultdict(list))
        self._scalars: defaultdict[PartialKey, list[tuple[float, int]]] = defaultdict(list)
        self._members: defaultdict[PartialKey, list[str]] = defaultdict(list)

    def add_value(self, key: PartialKey, value: float, weight: int = 1) -> None:
        # + 0.0 turns -0.0 into 0.0 (and nothing else changes): a sketch keeps the first of
        # equal values as its min/max, and a partial's fast-lane values come before these,
        # so a signed zero would make the same lines give another sketch by which path took
        # them. The fast lane never holds -0.0 ("-0" forms take this path).
        self._scalars[key].append((value + 0.0, weight))

    def add_values(
        self, key: PartialKey, values: np.ndarray, weights: np.ndarray | None = None
    ) -> None:
        """``values`` of one partial, each standing for its ``weights`` entry (None: 1)."""
        if weights is None:
            weights = np.ones(len(values), dtype=np.int64)
        self._values[key].append((values, weights))

    def add_member(self, key: PartialKey, member: str) -> None:
        self._members[key].append(member)

    def __len__(self) -> int:
        return len(self._values.keys() | self._scalars.keys()) + len(self._members)

    def detach(self) -> PaneSketches:
        """Everything held so far, moved to a new ``PaneSketches`` (same parameters); this
        one starts empty. The combiner hands the detached one to the segment writer thread,
        which builds the columns there (``columns``) while the receive loop goes on."""
        held = PaneSketches.__new__(PaneSketches)
        held._params, held._kll_k, held._layout = self._params, self._kll_k, self._layout
        held._values, self._values = self._values, defaultdict(list)
        held._scalars, self._scalars = self._scalars, defaultdict(list)
        held._members, self._members = self._members, defaultdict(list)
        return held

    def columns(
        self, keys: list[PartialKey], fast: FastValues | None = None,
        fast_keys: FastKeys | None = None,
    ) -> tuple[pa.Array, pa.Array, pa.Array, pa.Array]:  # fmt: skip
        """``sketch``, ``hdr_bucket``, ``hdr_count``, ``kll`` for the partials ``keys`` then
        ``fast_keys`` (in row order), taking every held value; partials without values get
        NULLs.

        ``fast``: the fast lane's values, already grouped by row (``FastValues``): a row's
        values are those held under its key, then its fast-lane values, then its scalars.
        Matching rows by position, not by key, spares a dict lookup per partial: at 10k
        series this was a third of the segment's build time. For the same reason the fast
        rows' keys are looked at only when a held value's key is not among ``keys``."""
        n = len(keys) + (0 if fast_keys is None else len(fast_keys))
        held, scalars, members = self._values, self._scalars, self._members
        self._values, self._scalars, self._members = (
            defaultdict(list), defaultdict(list), defaultdict(list))
        # row -> its (values, weights), in order, for the rows with more than fast-lane
        # values; the fast lane's own rows are gathered at once (``_value_rows``)
        merged: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        set_rows: list[tuple[int, list[str]]] = []
        fast_at = np.full(n, -1, np.int64)  # row -> its entry in ``fast``; -1: none, or taken
        if fast is not None:
            fast_at[fast.rows] = np.arange(len(fast.rows))
        if held or scalars or members:
            row_of: dict[PartialKey | tuple[SeriesKey | None, int], int] = dict(
                zip(keys, range(len(keys)), strict=True))
            if fast_keys is not None and not (held.keys() | scalars.keys() | members.keys()
                                              ) <= row_of.keys():  # fmt: skip
                row_of.update(zip(fast_keys, range(len(keys), n), strict=True))
            for key in held.keys() | scalars.keys():
                row = row_of.get(key)
                if row is None:  # values without a partial: cannot happen (add makes both)
                    continue
                parts = list(held.get(key, []))
                if fast is not None and fast_at[row] >= 0:
                    start, end = int(fast.starts[fast_at[row]]), int(fast.ends[fast_at[row]])
                    fast_at[row] = -1
                    parts.append((fast.values[start:end], fast.weights[start:end]))
                if scalars.get(key):
                    pairs = scalars[key]
                    parts.append((np.array([v for v, _ in pairs], dtype=np.float64),
                                  np.array([w for _, w in pairs], dtype=np.int64)))
                merged[row] = parts
            set_rows = [(row_of[key], member_list) for key, member_list in members.items()
                        if key in row_of]
        rows, sizes, values, weights = _value_rows(merged, fast_at, fast)
        owner = np.repeat(np.arange(len(rows), dtype=np.int64), sizes)
        offsets = np.zeros(len(rows) + 1, np.int64)
        np.cumsum(sizes, out=offsets[1:])
        heavy = np.bincount(owner, weights=weights != 1, minlength=len(rows)) > 0
        tdigest_k, kll_k = self._params.tdigest_k, self._kll_k
        unit, weighted = np.flatnonzero(~heavy), np.flatnonzero(heavy)
        # (rows, their blobs) for each column: built by kind, placed at the end (``_placed``)
        sketches: list[tuple[np.ndarray, pa.Array]] = []
        klls: list[tuple[np.ndarray, pa.Array]] = []
        if len(unit):
            sketches.append((rows[unit], _unit_tdigests(values, offsets, unit, tdigest_k)))
            if kll_k is not None:  # only for a config with a window of quantiles: kll
                klls.append((rows[unit], _unit_klls(values, offsets, unit, kll_k)))
        if len(weighted):
            parts = [(values[offsets[i]:offsets[i + 1]], weights[offsets[i]:offsets[i + 1]])
                     for i in weighted.tolist()]  # fmt: skip
            sketches.append((rows[weighted], _weighted_tdigests(parts, tdigest_k)))
            if kll_k is not None:  # one call per weighted partial (sample rates): few
                klls.append((rows[weighted], pa.array(
                    [serialize_kll(_weighted_kll(v, w, kll_k)) for v, w in parts], pa.binary())))
        if set_rows:
            hlls = []
            for _, member_list in set_rows:
                hll = new_hll(self._params.hll_lg_k)
                for member in member_list:
                    hll.update(member)
                hlls.append(serialize_hll(hll))
            sketches.append((np.array([row for row, _ in set_rows], np.int64),
                             pa.array(hlls, pa.binary())))  # fmt: skip
        bucket, count = self._hdr_lists(n, rows, owner, values,
                                        weights if len(weighted) else None)  # fmt: skip
        return _placed(n, sketches), bucket, count, _placed(n, klls)

    def _hdr_lists(
        self, n: int, rows: np.ndarray, owner: np.ndarray, values: np.ndarray,
        weights: np.ndarray | None = None,
    ) -> tuple[pa.Array, pa.Array]:  # fmt: skip
        """Sparse HDR histograms of every partial at once (one ``np.unique`` over all values,
        keyed by row): ``values[owner == i]`` are row ``rows[i]``'s."""
        present = np.zeros(n, dtype=bool)
        indices = self._layout.bucket_indices(values)
        combined = rows[owner] * self._layout.counts_len + indices  # by row: the lists' order
        if weights is None:
            unique, counts = np.unique(combined, return_counts=True)
        else:  # each value counts its weight; integer sums, exact
            unique, inverse = np.unique(combined, return_inverse=True)
            counts = np.zeros(len(unique), dtype=np.int64)
            np.add.at(counts, inverse, weights)
        buckets = (unique % self._layout.counts_len).astype(np.int32)
        lengths = np.bincount(unique // self._layout.counts_len, minlength=n)
        present[rows] = True
        offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
        mask = pa.array(~present)
        return (
            pa.ListArray.from_arrays(offsets, pa.array(buckets, pa.int32()), mask=mask),
            pa.ListArray.from_arrays(offsets, pa.array(counts.astype(np.int64)), mask=mask),
        )


def _value_rows(
    merged: dict[int, list[tuple[np.ndarray, np.ndarray]]], fast_at: np.ndarray,
    fast: FastValues | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Every row with values as one CSR: ``(rows, sizes, values, weights)``, the values of
    ``rows[i]`` the ``sizes[i]`` after those of the rows before it. The fast lane's rows
    (``fast_at[row]`` still pointing at their entry) are gathered in one indexing, not a
    call per row; ``merged``'s rows, few, are joined one by one."""
    if fast is not None and len(fast.rows):
        own = np.flatnonzero(fast_at[fast.rows] == np.arange(len(fast.rows)))
        fast_rows = fast.rows[own].astype(np.int64)
        fast_sizes = (fast.ends[own] - fast.starts[own]).astype(np.int64)
        take = run_indices(fast.starts[own].astype(np.int64), fast_sizes)
        fast_values, fast_weights = fast.values[take], fast.weights[take]
    else:
        fast_rows, fast_sizes = np.zeros(0, np.int64), np.zeros(0, np.int64)
        fast_values, fast_weights = np.zeros(0), np.zeros(0, np.int64)
    slow = [(np.concatenate([v for v, _ in parts]), np.concatenate([w for _, w in parts]))
            for parts in merged.values()]  # fmt: skip
    rows = np.concatenate([fast_rows, np.fromiter(merged, np.int64, len(merged))])
    sizes = np.concatenate([fast_sizes, np.array([len(v) for v, _ in slow], np.int64)])
    values = np.concatenate([fast_values, *(v for v, _ in slow)]).astype(np.float64, copy=False)
    weights = np.concatenate([fast_weights, *(w for _, w in slow)]).astype(np.int64, copy=False)
    return rows, sizes, values, weights


def _unit_tdigests(values: np.ndarray, offsets: np.ndarray, owners: np.ndarray, k: int
                   ) -> pa.Array:  # fmt: skip
    """A serialized ``tdigest_double(k)`` of each owner's values (``values[offsets[i]:
    offsets[i + 1]]``, every weight 1): the bytes datasketches' ``update`` then ``serialize``
    writes (``_tdigests``)."""
    values, sizes = _values_of(values, offsets, owners)
    return _tdigests(values, np.ones(len(values)), sizes, k)


def _values_of(values: np.ndarray, offsets: np.ndarray, owners: np.ndarray
               ) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """The values of ``owners`` (CSR rows of ``values``, ``offsets``) end to end, and how
    many each has."""
    sizes = offsets[owners + 1] - offsets[owners]
    if len(owners) < len(offsets) - 1:  # not every owner: their values only
        values = values[run_indices(offsets[owners], sizes)]
    return values, sizes


def _unit_klls(values: np.ndarray, offsets: np.ndarray, owners: np.ndarray, k: int
               ) -> pa.Array:  # fmt: skip
    """A serialized ``kll_doubles_sketch(k)`` of each owner's values (``values[offsets[i]:
    offsets[i + 1]]``, every weight 1), all built by one ``kll_columns.merge_by_owner`` call
    over single-item sketches. DataSketches' ``update`` files level 0 downwards, so a sketch
    holds its values in reverse order: the items go in reversed, and below ``k`` values the
    bytes are those its ``update`` then ``serialize`` writes. From ``k`` on the merge compacts
    (``update`` waits for the next value), deterministically where ``update`` flips a random
    coin (``kll_columns``: the same bound)."""
    values, sizes = _values_of(values, offsets, owners)
    items = np.ascontiguousarray(values[::-1], np.float64)
    owner = np.repeat(np.arange(len(owners), dtype=np.int64), sizes)[::-1]
    singles = kll_columns.KllColumns(
        np.arange(len(items) + 1, dtype=np.int64), items, np.zeros(len(items), np.uint8),
        np.ones(len(items), np.int64), items, items, k,
    )  # fmt: skip
    return kll_columns.to_serialized(kll_columns.merge_by_owner(singles, owner, len(owners)))


def _tdigests(means: np.ndarray, weights: np.ndarray, sizes: np.ndarray, k: int) -> pa.Array:
    """A serialized ``tdigest_double(k)`` per owner of ``sizes[i]`` centroids (``means``,
    ``weights``, owner after owner), all compressed in one ``merge_by_owner`` call
    (``digest_columns``' merge is datasketches' compress; a digest of one unit value carries
    the reverse-merge flag datasketches' compress leaves on it)."""
    columns = digest_columns.DigestColumns(
        np.arange(len(means) + 1, dtype=np.int64), means, weights, means, means,
        np.zeros(len(means), np.bool_), k,
    )  # fmt: skip
    merged = digest_columns.merge_by_owner(
        columns, np.repeat(np.arange(len(sizes), dtype=np.int64), sizes), len(sizes))
    merged.reverse_merge[sizes == 1] = True
    return digest_columns.to_serialized(merged)


def _placed(n: int, parts: list[tuple[np.ndarray, pa.Array]]) -> pa.Array:
    """A column of ``n`` binary rows from ``parts``, each (rows, their blobs in that order);
    NULL in the rows no part names."""
    if not parts:
        return pa.nulls(n, pa.binary())
    values = pa.concat_arrays([blobs.cast(pa.binary()) for _, blobs in parts])
    place = np.full(n, -1, np.int64)
    place[np.concatenate([rows for rows, _ in parts])] = np.arange(len(values))
    return values.take(pa.array(place, mask=place < 0))


#: The most centroids one weighted partial's values enter its t-digest's compress as.
_PIECES_PER_ROW = 1 << 16


def _pieces(values: np.ndarray, weights: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each value as ``min(weight, per_value)`` centroids whose integer weights add up to its
    weight (``per_value``: 2k, less when the row has many values)."""
    per_value = max(1, min(2 * k, _PIECES_PER_ROW // len(values)))
    counts = np.minimum(weights, per_value)
    whole, extra = np.divmod(weights, counts)
    of = np.repeat(np.arange(len(values)), counts)
    nth = np.arange(len(of)) - np.repeat(np.cumsum(counts) - counts, counts)
    return values[of], (whole[of] + (nth < extra[of])).astype(np.float64)


def _weighted_tdigests(parts: list[tuple[np.ndarray, np.ndarray]], k: int) -> pa.Array:
    """A serialized ``tdigest_double(k)`` per (values, weights) (module docstring: the
    pieces), all compressed in one ``merge_by_owner`` call (``_tdigests``)."""
    pieces = [_pieces(v, w, k) for v, w in parts]
    sizes = np.array([len(v) for v, _ in pieces], dtype=np.int64)
    return _tdigests(np.concatenate([v for v, _ in pieces]),
                     np.concatenate([w for _, w in pieces]), sizes, k)  # fmt: skip


def _weighted_kll(values: np.ndarray, weights: np.ndarray, k: int) -> kll_doubles_sketch:
    """A ``kll_doubles_sketch(k)`` holding each value ``weight`` times: per distinct weight,
    the sketch of its values merged in by binary doubling."""
    result = new_kll(k)
    for weight in np.unique(weights).tolist():
        part = new_kll(k)
        part.update(np.ascontiguousarray(values[weights == weight]))
        remaining = int(weight)
        while remaining:
            if remaining & 1:
                result.merge(part)
            remaining >>= 1
            if remaining:
                part.merge(deserialize_kll(serialize_kll(part)))  # twice its weight
    return result
