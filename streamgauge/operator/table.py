"""Rows for a person (aligned columns) or for a program (tab-separated), one formatter each.

``query``, ``status`` and ``top`` print through these: a column whose every value is a number
is aligned right, any other left; None prints as an empty cell. TSV keeps values as they are
(tabs and newlines inside a value become spaces, so a row stays one line).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

_NUMBER = re.compile(r"^[-+]?[\d,]*\.?\d+(?:[eE][-+]?\d+)?%?$")


def cell(value: Any) -> str:
    if value is None:
        return ""
    return str(value)


def aligned(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, indent: str = "") -> str:
    """Columns padded to their widest value, two spaces apart, numbers to the right."""
    text = [[cell(v).replace("\n", " ") for v in row] for row in rows]
    widths = [len(c) for c in columns]
    for row in text:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], len(value))
    numeric = [
        bool(text) and all(_NUMBER.match(row[i]) or not row[i] for row in text)
        and any(row[i] for row in text)
        for i in range(len(columns))
    ]  # fmt: skip

    def line(values: Sequence[str]) -> str:
        padded = [
            v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return (indent + "  ".join(padded)).rstrip()

    head = [c.rjust(widths[i]) if numeric[i] else c for i, c in enumerate(columns)]
    return "\n".join([line(head), *(line(row) for row in text)])


def tsv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    def clean(value: Any) -> str:
        return cell(value).replace("\t", " ").replace("\n", " ")

    lines = ["\t".join(columns)] if columns else []
    lines += ["\t".join(clean(v) for v in row) for row in rows]
    return "\n".join(lines)
