"""What Grafana does to a PostgreSQL ``rawSql`` before sending it, so tests can run it for real.

Followed from Grafana's source (pkg/tsdb/grafana-postgresql-datasource/macros.go and
sqleng's ``Interpolate``) and the SQL data sources' frontend variable handling:

1. dashboard variables ``$name`` / ``${name}``: a single value is inserted with ``'`` doubled
   and no quotes added (the query writes ``'$metric'``);
2. ``$__interval_ms`` (integer ms), ``$__interval`` (``gtime.FormatInterval``: the largest
   whole unit, ``10s``, ``1m``, ``500ms``), ``$__unixEpochFrom()`` / ``$__unixEpochTo()``
   (integer seconds);
3. the macros, matched by ``\\$([_a-zA-Z0-9]+)\\(([^\\)]*)\\)``: ``$__timeFilter(c)`` ->
   ``c BETWEEN '<from>' AND '<to>'`` (RFC 3339 nano, UTC, inclusive), ``$__timeFrom()``,
   ``$__timeTo()``, ``$__timeGroup(c, 10s)`` -> ``floor(extract(epoch from c)/10)*10``,
   ``$__timeGroupAlias`` the same ``AS "time"``, ``$__time(c)``, ``$__timeEpoch(c)``,
   ``$__unixEpochFilter(c)``, ``$__unixEpochGroup(Alias)``. An unknown macro is an error.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping

_MACRO = re.compile(r"\$([_a-zA-Z0-9]+)\(([^\)]*)\)")
_UNITS = (("y", 31_536_000_000), ("w", 604_800_000), ("d", 86_400_000), ("h", 3_600_000),
          ("m", 60_000), ("s", 1_000), ("ms", 1))  # fmt: skip


def format_interval(ms: int) -> str:
    """gtime.FormatInterval: the largest unit the interval reaches, integer-divided."""
    for unit, size in _UNITS:
        if ms >= size:
            return f"{ms // size}{unit}"
    return "1ms"


def parse_interval(text: str) -> float:
    """gtime.ParseInterval for the forms we emit: ``10s``, ``1m``, ``500ms`` -> seconds."""
    match = re.fullmatch(r"(\d+)(ms|s|m|h|d|w|y)", text.strip().strip("'"))
    if match is None:
        raise ValueError(f"error parsing interval {text}")
    number, unit = match.groups()
    return int(number) * dict(_UNITS)[unit] / 1000


def rfc3339nano(t: dt.datetime) -> str:
    """Go's time.RFC3339Nano in UTC: fraction without trailing zeros, ``Z`` suffix."""
    t = t.astimezone(dt.UTC)
    text = t.strftime("%Y-%m-%dT%H:%M:%S")
    if t.microsecond:
        text += "." + f"{t.microsecond:06d}".rstrip("0")
    return text + "Z"


def _seconds(value: float) -> str:
    """Go's %v of a float64: 10 -> "10", 0.5 -> "0.5"."""
    return str(int(value)) if float(value).is_integer() else repr(value)


def expand(
    sql: str,
    *,
    time_from: dt.datetime,
    time_to: dt.datetime,
    interval_ms: int,
    variables: Mapping[str, str] | None = None,
) -> str:
    for name in sorted(variables or {}, key=len, reverse=True):
        value = (variables or {})[name].replace("'", "''")
        sql = sql.replace("${" + name + "}", value)
        pattern = re.compile(r"\$" + re.escape(name) + r"(?![A-Za-z0-9_])")
        sql = pattern.sub(value.replace("\\", "\\\\"), sql)  # a literal replacement
    sql = sql.replace("$__interval_ms", str(interval_ms))
    sql = sql.replace("$__interval", format_interval(interval_ms))
    sql = sql.replace("$__unixEpochFrom()", str(int(time_from.timestamp())))
    sql = sql.replace("$__unixEpochTo()", str(int(time_to.timestamp())))

    def macro(match: re.Match[str]) -> str:
        name = match.group(1)
        args = [a.strip(" ") for a in match.group(2).split(",")]
        start, end = rfc3339nano(time_from), rfc3339nano(time_to)
        if name == "__time":
            return f'{args[0]} AS "time"'
        if name == "__timeEpoch":
            return f'extract(epoch from {args[0]}) as "time"'
        if name == "__timeFilter":
            return f"{args[0]} BETWEEN '{start}' AND '{end}'"
        if name == "__timeFrom":
            return f"'{start}'"
        if name == "__timeTo":
            return f"'{end}'"
        if name in ("__timeGroup", "__timeGroupAlias"):
            if len(args) < 2:
                raise ValueError(f"macro {name} needs time column and interval")
            seconds = _seconds(parse_interval(args[1]))
            group = f"floor(extract(epoch from {args[0]})/{seconds})*{seconds}"
            return group + (' AS "time"' if name == "__timeGroupAlias" else "")
        if name == "__unixEpochFilter":
            lo, hi = int(time_from.timestamp()), int(time_to.timestamp())
            return f"{args[0]} >= {lo} AND {args[0]} <= {hi}"
        if name in ("__unixEpochGroup", "__unixEpochGroupAlias"):
            seconds = _seconds(parse_interval(args[1]))
            group = f"floor(({args[0]})/{seconds})*{seconds}"
            return group + (' AS "time"' if name == "__unixEpochGroupAlias" else "")
        raise ValueError(f"unknown macro {name!r}")

    sql = _MACRO.sub(macro, sql)
    if "$" in sql.replace("$$", ""):
        raise ValueError(f"unexpanded $ left in the query: {sql}")
    return sql
