"""The series keys of the combiner's slots as Arrow string columns, kept from drain to drain.

A segment's rows name their series by three strings (metric, type, canonical tags). The fast
lane's rows are slots of the combiner, and turning each row's key tuple into those strings
at every drain was a Python loop per row, on the segment writer thread, holding the GIL the
receive loop needs (at 100k series about a third of a segment's build). Here a slot's strings
are converted once, at the first drain after the slot gets its series, and a drain's rows
take theirs in one ``take`` per column.

A slot changes series only after it is freed, and freeing bumps its generation
(``PaneCombiner.slot_gen``), so a cached slot is current while its generation is the one it
was converted at; a slot free at a drain (no key) is converted when it has one again.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from streamgauge.ingest.pane_sketches import SeriesKey

_NO_KEY: SeriesKey = ("", "", "")
"""What a free slot holds in the columns: no row ever takes it."""


class SlotKeyColumns:
    """Metric, type and tags per slot, as of the last snapshot ``take`` was given."""

    def __init__(self) -> None:
        # ``take`` runs on the segment writer thread; the lock keeps a second caller (a
        # drain built elsewhere) from seeing a half-updated cache.
        self._lock = threading.Lock()
        self._reset()

    def _reset(self) -> None:
        self._gen = np.zeros(0, np.int64)  # each slot's generation when converted
        self._converted = np.zeros(0, np.bool_)  # it held a key then
        self._columns = tuple(pa.array([], pa.string()) for _ in range(3))

    def take(
        self, slot_keys: Sequence[SeriesKey | None], slot_gen: np.ndarray, slots: np.ndarray
    ) -> tuple[pa.Array, pa.Array, pa.Array]:
        """The metric, type and tags of ``slots`` (each holding a key in ``slot_keys``),
        ``slot_keys`` and ``slot_gen`` being the combiner's at one moment (a drain's
        snapshot)."""
        with self._lock:
            self._update(slot_keys, slot_gen)
            index = pa.array(slots, pa.int64())
            metric, metric_type, tags = (column.take(index) for column in self._columns)
            return metric, metric_type, tags

    def _update(self, slot_keys: Sequence[SeriesKey | None], slot_gen: np.ndarray) -> None:
        n = len(slot_keys)
        if n < len(self._gen):  # fewer slots than converted: not a later snapshot, start over
            self._reset()
        known = len(self._gen)
        current = self._converted & (self._gen == slot_gen[:known])
        stale = np.flatnonzero(~current)
        positions = np.concatenate([stale, np.arange(known, n)])
        if not len(positions):
            return
        keys = [slot_keys[i] for i in positions.tolist()]
        strings = [pa.array(part, pa.string())
                   for part in zip(*(_NO_KEY if k is None else k for k in keys), strict=True)]
        replaced = pa.array(~current) if len(stale) else None
        columns = []
        for column, values in zip(self._columns, strings, strict=True):
            if replaced is not None:
                column = pc.replace_with_mask(column, replaced, values.slice(0, len(stale)))
            columns.append(pa.concat_arrays([column, values.slice(len(stale))]))
        self._columns = tuple(columns)
        self._gen = np.array(slot_gen[:n], np.int64)
        converted = np.ones(n, np.bool_)
        converted[:known] = current
        converted[positions] = [k is not None for k in keys]
        self._converted = converted
