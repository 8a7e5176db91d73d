"""Arrow columns as PostgreSQL arrays in the binary wire format, built by numpy.

``window_held`` stores held windows' values as eleven arrays of one element per window
(``store.HeldSnapshot``; a table of the first design, which the window job no longer writes:
``docs/architecture.md §8``). Sent as text literals, arrays that size cost the writer and
PostgreSQL quoting, escaping and float parsing per element, the largest part of such a write.
In ``array_recv``'s binary format each element is a length and its bytes, so building is a
few vector operations over Arrow's buffers and PostgreSQL's parsing is close to a copy.

The format (``src/backend/utils/adt/arrayfuncs.c``, ``array_recv``), all integers
big-endian: ``int32 ndim, int32 has_nulls, oid element_type``, then per dimension ``int32
size, int32 lower_bound``, then per element ``int32 length`` (-1: NULL) and that many bytes
(the element type's own binary form: UTF-8 for text, big-endian for int8 and float8).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from psycopg.adapt import Dumper
from psycopg.pq import Format


class PgArray(bytes):
    """A one-dimensional array in PostgreSQL's binary format; subclasses name the type."""

    element_oid: ClassVar[int]
    array_oid: ClassVar[int]
    numpy_type: ClassVar[str | None] = None
    """Big-endian numpy type of a fixed-width element (None: variable-width UTF-8 text)."""


class TextArray(PgArray):
    element_oid, array_oid = 25, 1009


class Int8Array(PgArray):
    element_oid, array_oid, numpy_type = 20, 1016, ">i8"


class Float8Array(PgArray):
    element_oid, array_oid, numpy_type = 701, 1022, ">f8"


ARRAY_TYPES: dict[str, type[PgArray]] = {
    "text[]": TextArray, "int8[]": Int8Array, "float8[]": Float8Array,
}  # fmt: skip
"""The array classes by the SQL type they stand for."""


def pg_array(column: pa.Array | pa.ChunkedArray, sql_type: str) -> PgArray:
    """``column`` as the binary image of a one-dimensional ``sql_type`` array (NULLs kept)."""
    kind = ARRAY_TYPES[sql_type]
    n = len(column)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    valid = np.ones(n, bool) if column.null_count == 0 else column.is_valid().to_numpy(False)
    has_nulls = int(not valid.all())
    if n == 0:
        return kind(np.array([0, 0, kind.element_oid], ">i4").tobytes())
    header = np.array([1, has_nulls, kind.element_oid, n, 1], ">i4").tobytes()
    if kind.numpy_type is not None:
        body = _fixed_width_elements(column, valid, kind.numpy_type)
    else:
        body = _text_elements(column, valid)
    return kind(header + body)


def _fixed_width_elements(column: pa.Array, valid: np.ndarray, numpy_type: str) -> bytes:
    """Per element: length 8 and the value, or length -1 alone for a NULL."""
    n = len(column)
    values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False).astype(numpy_type)
    width = values.dtype.itemsize
    records = np.empty((n, 4 + width), np.uint8)
    lengths = np.where(valid, width, -1).astype(">i4")
    records[:, :4] = lengths.view(np.uint8).reshape(n, 4)
    records[:, 4:] = values.view(np.uint8).reshape(n, width)
    if valid.all():
        return records.tobytes()
    keep = np.ones(records.shape, bool)
    keep[~valid, 4:] = False
    return records[keep].tobytes()


def _text_elements(column: pa.Array, valid: np.ndarray) -> bytes:
    """Per element: its UTF-8 length and bytes, or length -1 alone for a NULL."""
    text = pc.fill_null(pc.cast(column, pa.large_string()), "")
    assert isinstance(text, pa.Array), "pg_array combines chunks before this"
    offsets = np.frombuffer(text.buffers()[1], np.int64)[text.offset : text.offset + len(text) + 1]
    data = np.frombuffer(text.buffers()[2] or b"", np.uint8)[offsets[0] : offsets[-1]]
    relative = offsets - offsets[0]
    n = len(text)
    lengths = np.where(valid, np.diff(relative), -1).astype(">i4")
    out = np.empty(4 * n + len(data), np.uint8)
    prefix_at = (4 * np.arange(n) + relative[:-1])[:, None] + np.arange(4)
    is_prefix = np.zeros(len(out), bool)
    is_prefix[prefix_at] = True
    out[prefix_at] = lengths.view(np.uint8).reshape(n, 4)
    out[~is_prefix] = data
    return out.tobytes()


class _PgArrayDumper(Dumper):
    """Passes a ``PgArray`` as it is, in the binary format, under its array type's oid."""

    format = Format.BINARY

    def dump(self, obj: bytes) -> bytes:
        return obj


def _dumper_for(kind: type[PgArray]) -> type[Dumper]:
    return type(f"{kind.__name__}Dumper", (_PgArrayDumper,), {"oid": kind.array_oid})


def register_array_dumpers(adapters: object) -> None:
    """Teach a psycopg adapters map (a connection's ``adapters``) to send ``PgArray``s."""
    for kind in ARRAY_TYPES.values():
        adapters.register_dumper(kind, _dumper_for(kind))  # type: ignore[attr-defined]
