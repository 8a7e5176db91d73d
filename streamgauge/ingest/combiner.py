"""Combine samples into pane partials before they reach the log.

Writing raw samples would make the log and Spark carry every datagram; combining per
(series, event-time pane) first makes both proportional to the number of active series
instead: the job's load grows with active series, not with lines (``docs/concepts.md``,
"Panes and partials").

Partial per (metric, type, tags, pane):

=========  ===============================================================
counter    count of samples, sum scaled by 1/sample rate
gauge      last value (deltas applied to the series' current value), min, max
timer      count, sum, min, max, a t-digest and HDR histogram buckets of the values (h, d too)
set        count of samples, an HLL_8 sketch of the members
=========  ===============================================================

A timer, histogram or distribution sample sent at ``@rate`` stands for ``w =
protocol.sample_weight`` values (``1 / rate`` truncated): it adds ``w`` to the count, ``w *
value`` to the sum and weight ``w`` to the t-digest, HDR buckets and KLL, as ``w`` samples
of that value would (min, max and last are the value's own).

Sketches are built once per partial when the combiner is drained, from the raw values kept
beside the partials (``_SketchValues``): the lanes below never see them, so moving a partial
between lanes never touches a sketch, and the receive loop pays one list append (general lane)
or one array append per wake-up (fast lane) per sketched sample.

Two lanes, one set of partials. ``add`` takes one sample (the general path: any line the
protocol allows). ``add_fast`` takes a whole wake-up's worth of plain samples at once — series
already known (a *slot* each), no client timestamp, no gauge delta — and updates numpy columns
with ``ufunc.at`` in line order, so sums, extremes and the last value come out bit-for-bit as
``add`` would give them. A partial lives in exactly one lane at a time: before either lane
touches a (series, pane) the other one holds, the partial is moved over.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.ingest.log import SEGMENT_SCHEMA
from streamgauge.ingest.pane_sketches import (
    SKETCHED_TYPES,
    FastKeys,
    FastValues,
    PaneSketches,
    SeriesKey,
)
from streamgauge.ingest.protocol import Sample, sample_weight
from streamgauge.ingest.slot_keys import SlotKeyColumns
from streamgauge.sketches.accuracy import SketchParams, compile_accuracy

FastSketched = tuple[int, np.ndarray, np.ndarray, np.ndarray]  # pane, slots, values, weights


@dataclass(slots=True)
class Partial:
    count: int
    total: float
    minimum: float
    maximum: float
    last: float
    last_event_ms: int
    first_recv_ms: int
    last_recv_ms: int


def canonical_tags(tags: tuple[tuple[str, str], ...]) -> str:
    """Sorted-key JSON: the same tag set always gives the same series key and jsonb value."""
    return json.dumps(dict(tags), sort_keys=True, separators=(",", ":"))


TYPE_CODES = {"c": 0, "g": 1, "ms": 2, "h": 3, "d": 4, "s": 5}
_COUNTER, _GAUGE = 0, 1
_INITIAL_SLOTS = 1024


class PaneCombiner:
    """Accumulates partials for one receiver until they are drained into a segment.

    Not thread-safe: one receiver loop owns it.

    Every series it has seen has a *slot* (an index into numpy columns) until ``forget``
    frees it; the fast lane's partials are those columns, all for one pane (``fast_pane``).
    """

    # per-slot columns, grown together by _allocate
    slot_type: np.ndarray
    sketched: np.ndarray
    slot_gen: np.ndarray
    f_count: np.ndarray
    f_total: np.ndarray
    f_min: np.ndarray
    f_max: np.ndarray
    f_last: np.ndarray
    f_last_event: np.ndarray
    f_first_recv: np.ndarray
    f_last_recv: np.ndarray
    sealed_row: np.ndarray
    in_dict: np.ndarray
    g_value: np.ndarray
    g_fresh: np.ndarray
    admitted: np.ndarray
    seen_ms: np.ndarray
    synced_ms: np.ndarray
    capacity: int

    def __init__(
        self, pane_ms: int, sketches: SketchParams | None = None, kll_k: int | None = None
    ) -> None:
        """``kll_k``: also give timer/histogram/distribution partials a KLL sketch of that k
        (``PipelineConfig.kll_k``: a window of the config has ``quantiles: kll``)."""
        if pane_ms <= 0:
            raise ValueError(f"pane_ms must be positive, got {pane_ms}")
        self._pane_ms = pane_ms
        self._sketches = PaneSketches(sketches or compile_accuracy(), kll_k)
        # Fast-lane values of sketched series, (pane, slots, values, weights) per wake-up,
        # grouped by series only when needed (drain, or before a slot is freed).
        self._fast_sketched: list[FastSketched] = []
        self._partials: dict[tuple[SeriesKey, int], Partial] = {}
        # Gauges keep their value across panes (StatsD semantics: "+3" moves the current value).
        self._gauges: dict[SeriesKey, float] = {}
        self._types: dict[str, str] = {}
        # -- slots ----------------------------------------------------------------------------
        self._slot_of: dict[SeriesKey, int] = {}
        self.slot_keys: list[SeriesKey | None] = []
        self.slot_series: list[tuple[str, str, tuple[tuple[str, str], ...]] | None] = []
        self._free: list[int] = []
        self._key_columns = SlotKeyColumns()  # the slots' keys as strings, for the drains
        self.fast_pane: int | None = None
        self._n_fast = 0  # slots with a fast-lane partial (count > 0)
        # The fast lane's partials of the pane before, kept as columns until drained (turning
        # 10k of them into Python objects at every pane change stalled the receive loop).
        self._sealed_pane: int | None = None
        self._sealed: dict[str, np.ndarray] = {}
        self._sealed_live = 0
        self._allocate(_INITIAL_SLOTS)

    def _allocate(self, capacity: int) -> None:
        old = getattr(self, "capacity", 0)
        self.capacity = capacity

        def grow(name: str, dtype: type, fill: object) -> None:
            array: np.ndarray = np.full(capacity, fill, dtype=dtype)
            if old:
                array[:old] = getattr(self, name)
            setattr(self, name, array)

        grow("slot_type", np.int8, -1)
        grow("sketched", np.bool_, False)  # the series' partials carry sketches of values
        grow("slot_gen", np.int64, 0)  # bumped when a slot is freed: stale references see it
        grow("f_count", np.int64, 0)
        grow("f_total", np.float64, -0.0)  # -0.0 + v == v for every v, also -0.0
        grow("f_min", np.float64, np.inf)
        grow("f_max", np.float64, -np.inf)
        grow("f_last", np.float64, 0.0)
        grow("f_last_event", np.int64, 0)
        grow("f_first_recv", np.int64, 0)
        grow("f_last_recv", np.int64, 0)
        grow("sealed_row", np.int64, -1)  # row of the slot in self._sealed, -1 if none
        grow("in_dict", np.bool_, False)  # a general-lane partial for (slot, fast_pane) exists
        grow("g_value", np.float64, 0.0)  # current gauge value set by the fast lane...
        grow("g_fresh", np.bool_, False)  # ...newer than self._gauges[key]
        # The cardinality guard's view, kept here per slot for the receiver's fast path.
        grow("admitted", np.bool_, False)
        grow("seen_ms", np.int64, 0)  # last activity (fast lane included)
        grow("synced_ms", np.int64, 0)  # last activity the guard itself was told

    def __len__(self) -> int:
        return len(self._partials) + self._n_fast + self._sealed_live

    _COLUMNS = ("f_count", "f_total", "f_min", "f_max", "f_last", "f_last_event",
                "f_first_recv", "f_last_recv")

    def _unseal(self, slot: int) -> None:
        """Move the sealed partial of ``slot`` to the general lane."""
        row = int(self.sealed_row[slot])
        key = self.slot_keys[slot]
        assert key is not None and self._sealed_pane is not None
        sealed = self._sealed
        self._partials[(key, self._sealed_pane)] = Partial(
            int(sealed["f_count"][row]), float(sealed["f_total"][row]),
            float(sealed["f_min"][row]), float(sealed["f_max"][row]),
            float(sealed["f_last"][row]), int(sealed["f_last_event"][row]),
            int(sealed["f_first_recv"][row]), int(sealed["f_last_recv"][row]),
        )
        sealed["live"][row] = False
        self.sealed_row[slot] = -1
        self._sealed_live -= 1

    def _unseal_all(self) -> None:
        if self._sealed_live:
            for slot in self._sealed["slot"][self._sealed["live"]].tolist():
                self._unseal(slot)
        self._sealed, self._sealed_pane = {}, None

    @property
    def slots_used(self) -> int:
        return len(self.slot_keys)

    def slot_of(self, key: SeriesKey) -> int | None:
        return self._slot_of.get(key)

    def _slot(self, key: SeriesKey, sample: Sample) -> int:
        slot = self._slot_of.get(key)
        if slot is not None:
            return slot
        if self._free:
            slot = self._free.pop()
            self.slot_keys[slot] = key
            self.slot_series[slot] = (sample.metric, sample.metric_type, sample.tags)
        else:
            slot = len(self.slot_keys)
            if slot >= self.capacity:
                self._allocate(self.capacity * 2)
            self.slot_keys.append(key)
            self.slot_series.append((sample.metric, sample.metric_type, sample.tags))
        self._slot_of[key] = slot
        self.slot_type[slot] = TYPE_CODES[sample.metric_type]
        self.sketched[slot] = sample.metric_type in SKETCHED_TYPES
        self.admitted[slot] = False
        self.in_dict[slot] = self.fast_pane is not None and (key, self.fast_pane) in self._partials
        return slot

    def known_type(self, metric: str) -> str | None:
        """The type ``metric`` has while it has series here; None for a name not held."""
        return self._types.get(metric)

    def remember_type(self, sample: Sample) -> None:
        """Record the type of a name that now has a series here (see ``forget``)."""
        self._types.setdefault(sample.metric, sample.metric_type)

    def forget(self, metric: str, metric_type: str, tags: tuple[tuple[str, str], ...]) -> None:
        """Drop a series' carried state (the current gauge value) once it went idle, so that
        state stays bounded by the active series (see ``CardinalityGuard``)."""
        key = (metric, metric_type, canonical_tags(tags))
        self._gauges.pop(key, None)
        slot = self._slot_of.get(key)
        if slot is None:
            return
        self._resolve_fast_sketched()  # buffered values still name the slot's series by index
        del self._slot_of[key]
        if self.f_count[slot]:
            self._to_dict(slot)  # its partial still goes into the next segment
        if self.sealed_row[slot] >= 0:
            self._unseal(slot)
        self.g_fresh[slot] = False
        self.in_dict[slot] = False
        self.admitted[slot] = False
        self.slot_type[slot] = -1
        self.sketched[slot] = False
        self.slot_gen[slot] += 1
        self.slot_keys[slot] = None
        self.slot_series[slot] = None
        self._free.append(slot)

    def forget_type(self, metric: str) -> None:
        """Drop a name's type once it has no active series (the receiver knows when, from the
        guard), so the names remembered stay bounded by the active series."""
        self._types.pop(metric, None)

    def _to_dict(self, slot: int) -> None:
        """Move the fast lane's partial of ``slot`` to the general lane (same values)."""
        key = self.slot_keys[slot]
        assert key is not None and self.fast_pane is not None
        self._partials[(key, self.fast_pane)] = Partial(
            int(self.f_count[slot]), float(self.f_total[slot]), float(self.f_min[slot]),
            float(self.f_max[slot]), float(self.f_last[slot]), int(self.f_last_event[slot]),
            int(self.f_first_recv[slot]), int(self.f_last_recv[slot]),
        )
        self._reset_fast(slot)
        self._n_fast -= 1
        self.in_dict[slot] = True

    def _reset_fast(self, slots: int | np.ndarray) -> None:
        self.f_count[slots] = 0
        self.f_total[slots] = -0.0
        self.f_min[slots] = np.inf
        self.f_max[slots] = -np.inf

    def _from_dict(self, slot: int) -> None:
        """Move the general lane's partial of (slot, fast_pane) into the fast lane."""
        key = self.slot_keys[slot]
        assert key is not None
        partial = self._partials.pop((key, self.fast_pane))  # type: ignore[arg-type]
        self.f_count[slot] = partial.count
        self.f_total[slot] = partial.total
        self.f_min[slot] = partial.minimum
        self.f_max[slot] = partial.maximum
        self.f_last[slot] = partial.last
        self.f_last_event[slot] = partial.last_event_ms
        self.f_first_recv[slot] = partial.first_recv_ms
        self.f_last_recv[slot] = partial.last_recv_ms
        self.in_dict[slot] = False
        self._n_fast += 1

    def _set_fast_pane(self, pane: int) -> None:
        """The fast lane moves to another pane: its partials are sealed (kept as columns)."""
        self._unseal_all()
        slots = np.flatnonzero(self.f_count[: self.slots_used])
        if len(slots):
            self._sealed = {name: getattr(self, name)[slots] for name in self._COLUMNS}
            self._sealed["slot"] = slots
            self._sealed["live"] = np.ones(len(slots), dtype=bool)
            self._sealed_pane = self.fast_pane
            self._sealed_live = len(slots)
            self.sealed_row[slots] = np.arange(len(slots))
            self._reset_fast(slots)
            self._n_fast = 0
        self.fast_pane = pane
        used = self.slots_used
        self.in_dict[:used] = False
        for key, partial_pane in self._partials:
            if partial_pane == pane:
                slot = self._slot_of.get(key)
                if slot is not None:
                    self.in_dict[slot] = True

    def add(self, sample: Sample, event_ms: int, recv_ms: int) -> int:
        """Combine one sample (the general lane); returns the series' slot."""
        key: SeriesKey = (sample.metric, sample.metric_type, canonical_tags(sample.tags))
        slot = self._slot(key, sample)
        pane_start = event_ms - event_ms % self._pane_ms
        if pane_start == self.fast_pane:
            if self.f_count[slot]:
                self._to_dict(slot)
            self.in_dict[slot] = True
        elif pane_start == self._sealed_pane and self.sealed_row[slot] >= 0:
            self._unseal(slot)
        weight = 1
        if sample.metric_type == "c":
            value = sample.value / sample.sample_rate
        elif sample.metric_type == "g":
            if self.g_fresh[slot]:
                self._gauges[key] = float(self.g_value[slot])
                self.g_fresh[slot] = False
            value = self._gauges.get(key, 0.0) + sample.value if sample.delta else sample.value
            self._gauges[key] = value
        else:
            value = sample.value
            if sample.metric_type == "s":
                self._sketches.add_member((key, pane_start), sample.member)
            else:
                weight = sample_weight(sample.metric_type, sample.sample_rate)
                self._sketches.add_value((key, pane_start), value, weight)
        partial = self._partials.get((key, pane_start))
        if partial is None:
            self._partials[(key, pane_start)] = Partial(
                weight, value * weight, value, value, value, event_ms, recv_ms, recv_ms
            )
            return slot
        partial.count += weight
        partial.total += value * weight
        if value < partial.minimum:
            partial.minimum = value
        if value > partial.maximum:
            partial.maximum = value
        if event_ms >= partial.last_event_ms:
            partial.last = value
            partial.last_event_ms = event_ms
        partial.last_recv_ms = recv_ms
        return slot

    def add_fast(
        self, slots: np.ndarray, values: np.ndarray, recv_ms: int,
        weights: np.ndarray | None = None,
    ) -> None:  # fmt: skip
        """Combine plain samples of known series received at ``recv_ms``, in line order.

        ``slots``: each sample's series slot; ``values``: already scaled by 1/sample rate for
        counters; gauges are absolute values (no deltas), never -0.0. ``weights``: the values
        each sample stands for (``protocol.sample_weight`` of its type and rate, int64; None:
        all 1). Event time is ``recv_ms`` for all of them. Equivalent to ``add`` called once
        per sample in order.
        """
        if not len(slots):
            return
        if weights is None:
            weights = np.ones(len(slots), dtype=np.int64)
        pane = recv_ms - recv_ms % self._pane_ms
        if pane != self.fast_pane:
            self._set_fast_pane(pane)
        sketched = self.sketched[slots]
        if sketched.any():
            self._fast_sketched.append(
                (pane, slots[sketched], values[sketched], weights[sketched]))
        pulled = self.in_dict[slots]
        if pulled.any():
            for slot in np.unique(slots[pulled]).tolist():
                self._from_dict(slot)
        used = self.slots_used
        count_before = self.f_count[:used].copy()
        np.add.at(self.f_count, slots, weights)
        touched = np.flatnonzero(self.f_count[:used] != count_before)
        fresh = touched[count_before[touched] == 0]
        self._n_fast += len(fresh)
        self.f_first_recv[fresh] = recv_ms
        # value * weight as add computes it (x * 1 is x, -0.0 included)
        np.add.at(self.f_total, slots, values * weights)
        # Python's "if value < minimum" keeps -0.0 against 0.0; np.minimum would not.
        min_neg_zero = touched[(self.f_min[touched] == 0) & np.signbit(self.f_min[touched])]
        max_neg_zero = touched[(self.f_max[touched] == 0) & np.signbit(self.f_max[touched])]
        np.minimum.at(self.f_min, slots, values)
        np.maximum.at(self.f_max, slots, values)
        self.f_min[min_neg_zero[self.f_min[min_neg_zero] == 0]] = -0.0
        self.f_max[max_neg_zero[self.f_max[max_neg_zero] == 0]] = -0.0
        last_index = np.full(used, -1, dtype=np.int64)
        np.maximum.at(last_index, slots, np.arange(len(slots), dtype=np.int64))
        last_values = values[last_index[touched]]
        newer = (count_before[touched] == 0) | (recv_ms >= self.f_last_event[touched])
        self.f_last[touched[newer]] = last_values[newer]
        self.f_last_event[touched[newer]] = recv_ms
        self.f_last_recv[touched] = recv_ms
        gauges = touched[self.slot_type[touched] == _GAUGE]
        if len(gauges):
            self.g_value[gauges] = values[last_index[gauges]]
            self.g_fresh[gauges] = True

    def _resolve_fast_sketched(self) -> None:
        """Hand the fast lane's buffered values to ``_sketches`` under their series keys."""
        if self._fast_sketched:
            resolve_fast_sketched(self._fast_sketched, self.slot_keys, self._sketches)
            self._fast_sketched = []

    def drain(self) -> pa.RecordBatch:
        """Hand over everything combined so far as one record batch and start afresh."""
        return self.detach().build()

    def detach(self) -> PaneDrain:
        """Hand over everything combined so far, to be built into a record batch later
        (``PaneDrain.build``, on the segment writer thread), and start afresh.

        Only numpy copies of the fast lane's columns and swaps of containers happen here, so
        the receive loop is back at its socket within a millisecond or two at 10k series;
        turning partials and raw values into Arrow columns and sketches (~100 ms per roll at
        10k series, most of it building t-digests) is left to ``build``.
        """
        used = self.slots_used
        fast = np.flatnonzero(self.f_count[:used])
        sealed_live = self._sealed_live
        live = self._sealed["live"] if sealed_live else np.zeros(0, dtype=bool)
        sealed_slots = self._sealed["slot"][live] if sealed_live else np.zeros(0, np.int64)
        lanes = {}
        for name in self._COLUMNS:
            column: np.ndarray = getattr(self, name)[fast]
            if sealed_live:
                column = np.concatenate([column, self._sealed[name][live]])
            lanes[name] = column
        fast_pane = self.fast_pane if self.fast_pane is not None else 0
        sealed_pane = self._sealed_pane if self._sealed_pane is not None else 0
        panes = np.concatenate([np.full(len(fast), fast_pane, dtype=np.int64),
                                np.full(len(sealed_slots), sealed_pane, dtype=np.int64)])
        drained = PaneDrain(
            partials=self._partials,
            # a shallow copy: a slot freed and reused later must not rename these partials
            slot_keys=list(self.slot_keys),
            slot_gen=self.slot_gen[:used].copy(),
            key_columns=self._key_columns,
            slots=np.concatenate([fast, sealed_slots]),
            panes=panes,
            lanes=lanes,
            fast_sketched=self._fast_sketched,
            sketches=self._sketches.detach(),
        )
        self._partials = {}
        self._fast_sketched = []
        self._reset_fast(fast)
        self._n_fast = 0
        if sealed_live:
            self.sealed_row[sealed_slots] = -1
        self._sealed, self._sealed_pane, self._sealed_live = {}, None, 0
        self.in_dict[:used] = False
        return drained


@dataclass(slots=True)
class PaneDrain:
    """One roll's partials, detached from the combiner: the general lane's ``Partial``
    objects, the fast lane's columns (rows ``slots`` of the combiner, pane ``panes``), the
    raw values of sketched series. Owned by whoever builds it; shares nothing mutable with
    the combiner, so ``build`` may run on another thread while the receive loop goes on."""

    partials: dict[tuple[SeriesKey, int], Partial]
    slot_keys: list[SeriesKey | None]
    slot_gen: np.ndarray
    key_columns: SlotKeyColumns
    slots: np.ndarray
    panes: np.ndarray
    lanes: dict[str, np.ndarray]
    fast_sketched: list[FastSketched]
    sketches: PaneSketches

    def __len__(self) -> int:
        return len(self.partials) + len(self.slots)

    def _group_fast_sketched(self, first_fast_row: int) -> FastValues | None:
        """The fast lane's buffered values grouped by (series, pane), each group matched to
        its row: fast-lane rows are ``first_fast_row + i`` for (``slots[i]``, ``panes[i]``).
        A group whose partial moved to the general lane meanwhile goes to ``sketches``
        under its key instead, as ``resolve_fast_sketched`` would have put it."""
        if not self.fast_sketched:
            return None
        batches, self.fast_sketched = self.fast_sketched, []
        panes = np.concatenate([np.full(len(s), pane, dtype=np.int64)
                                for pane, s, _, _ in batches])  # fmt: skip
        slots = np.concatenate([s for _, s, _, _ in batches])
        values = np.concatenate([v for _, _, v, _ in batches])
        weights = np.concatenate([w for _, _, _, w in batches])
        order = np.lexsort((slots, panes))  # stable: values keep their line order in a group
        slots, panes = slots[order], panes[order]
        values, weights = values[order], weights[order]
        bounds = np.flatnonzero((slots[1:] != slots[:-1]) | (panes[1:] != panes[:-1])) + 1
        starts = np.concatenate([[0], bounds]).astype(np.int64)
        ends = np.concatenate([bounds, [len(slots)]]).astype(np.int64)
        group_slots, group_panes = slots[starts], panes[starts]
        unique_panes, pane_index = np.unique(
            np.concatenate([self.panes, group_panes]), return_inverse=True)
        row_codes = self.slots * len(unique_panes) + pane_index[: len(self.panes)]
        group_codes = group_slots * len(unique_panes) + pane_index[len(self.panes) :]
        found = np.zeros(len(starts), dtype=bool)
        at = np.zeros(len(starts), dtype=np.int64)
        if len(row_codes):
            by_code = np.argsort(row_codes)
            position = np.minimum(
                np.searchsorted(row_codes[by_code], group_codes), len(row_codes) - 1)
            at = by_code[position]
            found = row_codes[at] == group_codes
        for group in np.flatnonzero(~found).tolist():
            key = self.slot_keys[int(group_slots[group])]
            assert key is not None
            self.sketches.add_values(
                (key, int(group_panes[group])), values[starts[group] : ends[group]],
                weights[starts[group] : ends[group]])
        return FastValues(first_fast_row + at[found], starts[found], ends[found], values, weights)

    def build(self) -> pa.RecordBatch:
        """The segment's record batch, ordered by (pane, metric, type, tags)."""
        items = list(self.partials.items())
        fast_values = self._group_fast_sketched(len(items))
        self.partials = {}
        keys = [key for (key, _), _ in items]
        partials = [partial for _, partial in items]
        lanes = self.lanes

        def ints(general: list[int], lane: np.ndarray) -> pa.Array:
            return pa.array(np.concatenate([np.array(general, dtype=np.int64), lane]), pa.int64())

        def floats(general: list[float], lane: np.ndarray) -> pa.Array:
            return pa.array(
                np.concatenate([np.array(general, dtype=np.float64), lane]), pa.float64()
            )

        fast_strings = self.key_columns.take(self.slot_keys, self.slot_gen, self.slots)
        columns = [
            pa.concat_arrays([pa.array([k[i] for k in keys], pa.string()), fast_strings[i]])
            for i in range(3)
        ]
        columns += [
            ints([pane for (_, pane), _ in items], self.panes),
            ints([p.count for p in partials], lanes["f_count"]),
            floats([p.total for p in partials], lanes["f_total"]),
            floats([p.minimum for p in partials], lanes["f_min"]),
            floats([p.maximum for p in partials], lanes["f_max"]),
            floats([p.last for p in partials], lanes["f_last"]),
            ints([p.last_event_ms for p in partials], lanes["f_last_event"]),
            ints([p.first_recv_ms for p in partials], lanes["f_first_recv"]),
            ints([p.last_recv_ms for p in partials], lanes["f_last_recv"]),
        ]
        columns += self.sketches.columns(
            [key for key, _ in items], fast_values, FastKeys(self.slot_keys, self.slots, self.panes)
        )
        batch = pa.RecordBatch.from_arrays(columns, schema=SEGMENT_SCHEMA)
        # Ordered by (pane, metric, type, tags), as sorted() over the keys would give them
        # (UTF-8 byte order is code point order).
        order = pc.sort_indices(
            batch,
            sort_keys=[(name, "ascending") for name in
                       ("pane_start_ms", "metric", "metric_type", "tags")],
        )
        return batch.take(order)


def resolve_fast_sketched(
    fast_sketched: list[FastSketched],
    slot_keys: list[SeriesKey | None],
    sketches: PaneSketches,
) -> None:
    """Hand the fast lane's buffered values, (pane, slots, values, weights) per wake-up, to
    ``sketches`` under their series keys: one array per (series, pane), in line order."""
    by_pane: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
    for pane, slots, values, weights in fast_sketched:
        by_pane.setdefault(pane, []).append((slots, values, weights))
    for pane, parts in by_pane.items():
        slots = np.concatenate([p[0] for p in parts])
        values = np.concatenate([p[1] for p in parts])
        weights = np.concatenate([p[2] for p in parts])
        order = np.argsort(slots, kind="stable")  # stable: values keep their line order
        slots, values, weights = slots[order], values[order], weights[order]
        unique, starts = np.unique(slots, return_index=True)
        ends = [*starts[1:].tolist(), len(slots)]
        for slot, start, end in zip(unique.tolist(), starts.tolist(), ends, strict=True):
            key = slot_keys[slot]
            assert key is not None
            sketches.add_values((key, pane), values[start:end], weights[start:end])
