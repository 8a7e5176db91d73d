"""Hopping windows by pane merge: each partial is merged once into its hop-wide pane.

A hopping window (``size``, ``hop``, ``size`` a multiple of ``hop``) covers ``k = size / hop``
panes of width ``hop``; every instant lies in ``k`` windows. Copying each partial into its
``k`` windows (``F.explode(F.sequence(...))``, Spark's own overlapping ``window()``) ships,
shuffles and merges every row ``k`` times. Here a partial goes through Spark once, keyed by
series, and the operator merges the micro-batch's partials of a pane into one **pane delta**
(one merge per partial), then each open window containing the pane absorbs that delta (one
merge per window, not per partial). Size 6 s, hop 2 s (``k = 3``), partials at 4.2 s and
5.7 s in one micro-batch::

    t (s)           0     2     4     6     8
    panes           |  .  |  .  |##|  .  |  .  |       pane [4, 6): delta = 4.2 s + 5.7 s
    window [0, 6)   [=================)                 absorbs the delta
    window [2, 8)         [=================)           absorbs the delta
    window [4, 10)              [=================)     absorbs the delta (new window)

Values merge as everywhere else: counts and sums add, min/max compare, ``last`` is the value of
the latest event, t-digests merge, HDR bucket counts add per index, HLLs union
(``window_sketches.SketchMerger``).

Lateness is per window, as for the copied rows (``job.assign_windows``): with ``W' = prior
heartbeat - delay``, a partial is late for window ``[s, s + size)`` when ``s + size +
lateness <= W'``. Windows containing a pane are ordered by start, so the windows a partial
is late for are the oldest ones: a partial carries ``from_start``, the first window start it
is on time for, and the pane deltas are kept per ``(pane, from_start)``; a delta reaches the
windows starting at ``from_start`` or later. Straggler at 2.5 s whose ``W'`` is 5 s (size 4 s,
hop 2 s, lateness 1 s)::

    window [0, 4)   4 + 1 <= 5: final  -> late row (stateless, ``job.late_partials``)
    window [2, 6)   6 + 1 >  5: open   -> absorbs the delta, re-emitted with a new revision

Partials late for every window they lie in never reach the operator; their late rows (one
per window) come from the stateless ``job.late_partials``, exactly as before.

Determinism: within a call a pane delta merges its partials in ``sketch_windows.MERGE_ORDER``
(a total order of the rows, whatever order Spark's shuffle gives) and windows absorb deltas
by pane, then ``from_start``; so a replayed micro-batch gives the same bytes. A window absorbs
all of a batch's deltas in one t-digest merge (its digest read and written once per batch, as
``sketch_windows.merge_rows`` does), and a pane of a single partial is that partial's sketches
as they are (no merge).

State per series: the metric type and the open windows (those Spark's watermark has not
passed), each a fixed record and its sketches (``window_sketches.pack_records``), as the
sliding operator keeps them. Spark's watermark is defined on the end of the newest window a
partial lies in (``pane + size``, the newest ``window_end`` of the copied rows) with the same
horizon as the copied rows, so windows are evicted exactly when they were before.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from streamgauge.configs import WindowSpec
from streamgauge.ingest.pane_sketches import SKETCHED_TYPES
from streamgauge.sketches.accuracy import SketchParams
from streamgauge.sketches.hll import serialize_hll, union_hll
from streamgauge.windows import window_sketches
from streamgauge.windows.aggregates import Scalars, output_frame, read_batch, rows_in_order
from streamgauge.windows.sketch_windows import MERGE_ORDER, merge_digest, merge_hdr
from streamgauge.windows.window_sketches import Sketches, SketchMerger

#: One window in a state blob: start, count, sum, min, max, last, last_event_ms.
_RECORD = struct.Struct("<qqddddq")

STATE_DDL = "metric_type string, windows binary"

OUTPUT_DDL = (
    "change string, metric string, tags string, metric_type string, window_start_ms bigint, "
    "window_end_ms bigint, count bigint, sum double, min double, max double, last double, "
    f"{window_sketches.OUTPUT_DDL}"
)
OUTPUT_COLUMNS = tuple(part.split()[0] for part in OUTPUT_DDL.split(", "))

INPUT_COLUMNS = (
    "metric", "tags", "metric_type", "pane_ms", "from_start_ms", "count", "sum", "min", "max",
    "last", "last_event_ms", "sketch", "hdr_bucket", "hdr_count",
)  # fmt: skip
"""What the operator reads: a partial, its pane's start and the first window start it is on
time for (``job.hopping_partials`` computes both in Spark)."""


@dataclass(slots=True)
class Aggregate(Scalars):
    """Merged values of a pane delta or of a window: count, sum, min, max, last,
    last_event_ms (:class:`Scalars`, in that order), then the sketches."""

    sketches: Sketches = field(default_factory=Sketches)

    def merge_all(self, others: list[Aggregate], merger: SketchMerger) -> None:
        """Merge ``others`` in order; their sketches in one call per kind (``absorb_all``)."""
        for other in others:
            self.merge_scalars(other)
        absorb_all(self.sketches, [other.sketches for other in others], merger)


def absorb_all(sketches: Sketches, others: list[Sketches], merger: SketchMerger) -> None:
    """``SketchMerger.absorb`` of each of ``others`` in turn, with one t-digest (de)serialisation
    and one HDR merge for them all: the window's digest is read and written once per batch, not
    once per pane (the round trips dominated the cost: bench/windows.py --catch-up)."""
    digests = [other.digest for other in others if other.digest]
    if digests:
        sketches.digest = merge_digest(sketches.digest, digests, merger.k)
    with_buckets = [other for other in others if len(other.buckets)]
    if with_buckets:
        sketches.buckets, sketches.counts = merge_hdr(
            sketches.buckets, sketches.counts,
            [o.buckets for o in with_buckets], [o.counts for o in with_buckets],
        )  # fmt: skip
    hlls = [other.hll for other in others if other.hll]
    if hlls:
        merged = [sketches.hll, *hlls] if sketches.hll else hlls
        sketches.hll = serialize_hll(union_hll(merged, merger.lg_k))
    sketches.complete = sketches.complete and all(other.complete for other in others)


def pack(windows: dict[int, Aggregate], merger: SketchMerger) -> bytes:
    records = [
        (_RECORD.pack(start, *w.record()), w.sketches)
        for start, w in sorted(windows.items())
    ]
    return window_sketches.pack_records(records, merger.fingerprint)


def unpack(blob: bytes, merger: SketchMerger) -> dict[int, Aggregate]:
    windows = {}
    for fields, sketches in window_sketches.unpack_records(blob, _RECORD, merger.fingerprint):
        start, count, total, low, high, last, last_event_ms = fields
        windows[start] = Aggregate(count, total, low, high, last, last_event_ms, sketches)
    return windows


def partial_sketches(metric_type: str, sketch: Any, hdr_bucket: Any, hdr_count: Any) -> Sketches:
    """One partial's sketch columns as :class:`Sketches`, as they are: a pane of one partial
    (the usual case: ``pane == hop``) costs no merge; windows merge it at their accuracy."""
    if sketch is not None and metric_type == "s":
        return Sketches(hll=bytes(sketch))
    if metric_type not in SKETCHED_TYPES:
        return Sketches()
    found = Sketches(digest=b"" if sketch is None else bytes(sketch))
    if hdr_bucket is not None:
        found.buckets = np.asarray(hdr_bucket, dtype=np.int32)
        found.counts = np.asarray(hdr_count, dtype=np.int64)
    return found


def pane_deltas(
    batch: pd.DataFrame, merger: SketchMerger
) -> dict[tuple[int, int], Aggregate]:
    """A micro-batch's partials of one series merged per ``(pane, from_start)``, each partial
    once, in ``MERGE_ORDER`` (with the sketch bytes as the last tie-break)."""
    grouped: dict[tuple[int, int], list[Aggregate]] = {}
    for row in rows_in_order(batch, ("pane_ms", "from_start_ms", *MERGE_ORDER)):
        partial = Aggregate.of_row(row)
        partial.sketches = partial_sketches(row.metric_type, row.sketch, row.hdr_bucket,
                                            row.hdr_count)  # fmt: skip
        grouped.setdefault((int(row.pane_ms), int(row.from_start_ms)), []).append(partial)
    deltas = {}
    for key, partials in grouped.items():
        if len(partials) == 1:
            deltas[key] = partials[0]
        else:
            deltas[key] = delta = Aggregate()
            delta.merge_all(partials, merger)
    return deltas


def hopping_state_function(window: WindowSpec, params: SketchParams) -> Any:
    """The ``applyInPandasWithState`` function of ``window`` (picklable closure)."""
    assert window.size_ms is not None and window.hop_ms is not None
    size, hop = window.size_ms, window.hop_ms
    merger = SketchMerger(params)

    def update_hopping(
        key: tuple[str, str], frames: Iterator[pd.DataFrame], state: Any
    ) -> Iterator[pd.DataFrame]:
        metric, tags = key
        metric_type: str | None = None
        windows: dict[int, Aggregate] = {}
        if state.exists:
            metric_type, blob = state.get
            windows = unpack(blob, merger)
        changed: set[int] = set()
        if not state.hasTimedOut:
            batch, metric_type = read_batch(frames, metric_type)
            reaching: dict[int, list[Aggregate]] = {}
            for (pane, from_start), delta in sorted(pane_deltas(batch, merger).items()):
                for start in range(max(from_start, pane - size + hop), pane + 1, hop):
                    reaching.setdefault(start, []).append(delta)
            for start, deltas in reaching.items():
                windows.setdefault(start, Aggregate()).merge_all(deltas, merger)
                changed.add(start)
        out = [
            ("upsert", metric, tags, metric_type, start, start + size, *w.output_values(),
             *merger.columns(w.sketches, metric_type or ""))
            for start in sorted(changed)
            for w in (windows[start],)
        ]  # fmt: skip
        # Free what Spark's watermark passed: no on-time partial can reach it (job._on_time).
        watermark = state.getCurrentWatermarkMs()
        kept = {start: w for start, w in windows.items() if start + size > watermark}
        if kept:
            state.update((metric_type, pack(kept, merger)))
            state.setTimeoutTimestamp(max(kept) + size)
        else:
            state.remove()
        if out:
            yield output_frame(out, OUTPUT_COLUMNS)

    return update_hopping


def set_values_of_panes(assembled: pa.Table, lg_k: int) -> pa.Table:
    """Windows the store merged from their panes (``store.ASSEMBLED_SCHEMA``), with each set
    window's pane HLLs unioned: ``sketch`` (HLL_8) and ``distinct_count``, NULL for other
    types, in place of ``set_sketches``.

    The counters', gauges' and sets' lane of a hopping window (``job.hopping_pane_aggregates``)
    keeps panes, not windows: the store merges a window's counts, sums, extremes and last
    value in SQL when it publishes it, and this unions the HLLs (SQL has no DataSketches). A
    union as Spark's ``hll_union_agg`` makes it, even of one pane: its estimator is the
    union's, not the pane sketch's own; the estimate rounded as ``hll_sketch_estimate`` does.
    """
    sketches: list[bytes | None] = []
    distinct: list[float | None] = []
    kinds = assembled.column("metric_type").to_pylist()
    for kind, panes in zip(kinds, assembled.column("set_sketches").to_pylist(), strict=True):
        if kind != "s" or not panes:
            sketches.append(None)
            distinct.append(None)
            continue
        union = union_hll(panes, lg_k)
        sketches.append(serialize_hll(union))
        # Rounded as Spark's hll_sketch_estimate rounds (window_sketches.SketchMerger.columns).
        distinct.append(float(math.floor(union.get_estimate() + 0.5)))
    values = assembled.drop_columns(["set_sketches"])
    values = values.append_column("distinct_count", pa.array(distinct, pa.float64()))
    return values.append_column("sketch", pa.array(sketches, pa.binary()))
