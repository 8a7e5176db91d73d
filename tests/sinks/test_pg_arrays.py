"""Arrow columns sent as PostgreSQL binary arrays read back as the same values."""

from __future__ import annotations

import math

import psycopg
import pyarrow as pa
import pytest

from streamgauge.sinks.pg_arrays import pg_array, register_array_dumpers

AWKWARD_TEXT = ["a", "", None, 'C:\\x, {y} "z"', "Zürich", "NULL", "{}", "a\tb\nc", "𝄞"]


def _round_trip(url: str, column: pa.Array | pa.ChunkedArray, sql_type: str) -> list[object]:
    with psycopg.connect(url) as conn:
        register_array_dumpers(conn.adapters)
        row = conn.execute(
            f"SELECT %b::{sql_type}, array_ndims(%b::{sql_type})",
            [pg_array(column, sql_type), pg_array(column, sql_type)],
        ).fetchone()
    assert row is not None
    return list(row[0]) if row[0] is not None else [None]


@pytest.mark.parametrize(
    ("column", "sql_type"),
    [
        (pa.array(AWKWARD_TEXT), "text[]"),
        (pa.chunked_array([AWKWARD_TEXT[:4], AWKWARD_TEXT[4:]]), "text[]"),
        (pa.array(AWKWARD_TEXT).slice(2, 5), "text[]"),
        (pa.array([0, -1, 2**62, None, 1_700_000_000_000], pa.int64()), "int8[]"),
        (pa.array([1.5, None, -0.0, 1e300, float("inf")], pa.float64()), "float8[]"),
        (pa.array([3, 4], pa.int64()), "float8[]"),  # widened as the column's SQL type says
        (pa.nulls(3, pa.float64()), "float8[]"),
        (pa.nulls(2, pa.float64()), "text[]"),
    ],
)
def test_values_nulls_and_awkward_text_read_back_unchanged(
    clean_store: str, column: pa.Array | pa.ChunkedArray, sql_type: str
) -> None:
    expected = column.to_pylist()
    if sql_type == "float8[]":
        expected = [None if v is None else float(v) for v in expected]
    got = _round_trip(clean_store, column, sql_type)
    assert len(got) == len(expected)
    for value, want in zip(got, expected, strict=True):
        if isinstance(want, float) and math.isnan(want):
            assert isinstance(value, float) and math.isnan(value)
        else:
            assert value == want
    assert [v is None for v in got] == [v is None for v in expected]


@pytest.mark.parametrize("sql_type", ["text[]", "int8[]", "float8[]"])
def test_an_empty_column_is_an_empty_array(clean_store: str, sql_type: str) -> None:
    with psycopg.connect(clean_store) as conn:
        register_array_dumpers(conn.adapters)
        row = conn.execute(
            f"SELECT cardinality(%b::{sql_type}), %b::{sql_type} = '{{}}'",
            [pg_array(pa.array([], pa.string()), sql_type)] * 2,
        ).fetchone()
    assert row == (0, True)
