"""A window spec's metric globs select exactly what ``fnmatch.fnmatchcase`` selects, whether
the selector decides in one regex pass over a batch's names (globs of ``*`` and ``?``) or per
name (globs with ``[...]`` sets)."""

from __future__ import annotations

import fnmatch

import pyarrow as pa
import pytest

from streamgauge.windows.assign import SeriesSelector

NAMES = [
    "api.requests", "api.latency", "api", "apix.requests", "db.query.time", "db.query",
    "a.b", "a+b", "a.b.c", "x?y", "x.y", "(paren)", "dollar$", "back\\slash", "new\nline",
    "ünïcode.metric", "", "api.requests.5xx", "db1.q", "db2.q", "dbx.q",
]  # fmt: skip

GLOBS = {
    "prefix": ("api.*",),
    "suffix": ("*.time",),
    "one char": ("db?.q",),
    "literal dots and plus": ("a+b", "a.b"),
    "regex characters are literal": ("(paren)", "dollar$", "back\\slash", "x?y"),
    "star matches a newline": ("new*",),
    "several": ("api.*", "db.*"),
    "empty name": ("",),
    "a set": ("db[12].q",),
    "a negated set": ("db[!12].q",),
    "unicode": ("ü*",),
}


@pytest.mark.parametrize("case", GLOBS)
def test_globs_select_what_fnmatch_selects(case: str) -> None:
    globs = GLOBS[case]
    chosen = SeriesSelector(globs, ()).wanted(pa.chunked_array([pa.array(NAMES * 2)]))
    expected = [any(fnmatch.fnmatchcase(n, g) for g in globs) for n in NAMES * 2]
    assert chosen.to_pylist() == expected
    assert any(expected), "each case selects something"
