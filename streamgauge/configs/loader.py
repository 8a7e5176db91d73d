"""YAML text -> ``PipelineConfig``, reporting every mistake in the file at once.

Three passes, each collecting rather than stopping:

1. YAML: syntax errors (with line and column) and duplicate keys, which PyYAML would otherwise
   resolve silently by keeping the last one.
2. Shape (pydantic, ``extra="forbid"``): unknown keys, wrong types, unreadable durations. A
   mapping that fails is validated again without its failing keys, so the rest of it still
   reaches pass 3.
3. Rules (``model.config_problems``): cross-field and cross-window checks, the same ones
   ``WindowSpec`` and ``PipelineConfig`` run at construction, and the ``sketches:`` targets
   compiled one by one (an impossible target is reported at its key).

Nothing is built until all three passes are clean, so a caller swapping configs either gets a
complete new config or a ``ConfigError`` and keeps the old one.
"""

from __future__ import annotations

import datetime
import difflib
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeVar

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic_core import ErrorDetails

from streamgauge.configs.durations import parse_duration_ms
from streamgauge.configs.model import (
    DEFAULT_PANE_MS,
    NAME_MAX_LENGTH,
    QUANTILE_SKETCHES,
    SKETCH_KEYS,
    WINDOW_KINDS,
    AlertDraft,
    AlertSpec,
    Loc,
    PipelineConfig,
    Problem,
    QuantileSketch,
    SketchTargets,
    WindowDraft,
    WindowKind,
    WindowSpec,
    config_problems,
    format_path,
    name_problem,
    parse_condition,
)

__all__ = ["ConfigError", "ConfigIssue", "default_config_name", "load_config", "parse_config"]


@dataclass(frozen=True)
class ConfigIssue:
    """One mistake: where (``windows[1].hop``, ``""`` for the whole document) and what."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(Exception):
    """A config that cannot be used, with every issue found in it, in document order."""

    def __init__(self, source: str, issues: Iterable[ConfigIssue]) -> None:
        self.source = source
        self.issues = tuple(issues)
        super().__init__(source, self.issues)

    def __str__(self) -> str:
        return "\n".join(f"{self.source}: {issue}" for issue in self.issues)


# --- pass 2: shape -------------------------------------------------------------------------


def _describe(value: object) -> str:
    """What a YAML value is, in YAML's words: users did not write Python types."""
    if value is None:
        return "an empty value"
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, int | float):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({value!r})"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, datetime.date):
        return f"a date ({value})"
    return type(value).__name__


def _present(value: object) -> object:
    # "size:" with nothing after it: YAML reads null. Taking that as "use the default" would
    # hide a half-finished edit, so an empty value is refused like any other bad value.
    if value is None:
        raise ValueError("empty value; write a value or remove the key")
    return value


def _duration(value: object) -> int:
    # "size: 10" reaches here as an int and "size: 1.5" as a float; both get the message that
    # asks for a unit. bool is an int in Python, but "size: yes" is not a number to the user.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return parse_duration_ms(str(value))
    if isinstance(value, str):
        return parse_duration_ms(value)
    raise ValueError(f"must be a duration like 10s or 250ms, not {_describe(value)}")


def _number(value: object) -> float:
    # "distinct_error: 2%" reaches here as a string; the number it means is 0.02.
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str) and value.strip().endswith("%"):
        raise ValueError(f"must be a fraction, not a string ({value!r}); write 0.02 for 2%")
    raise ValueError(f"must be a number like 0.02, not {_describe(value)}")


def _value_range(value: object) -> tuple[float, float]:
    if isinstance(value, list) and len(value) == 2:
        low, high = value
        if all(isinstance(v, int | float) and not isinstance(v, bool) for v in (low, high)):
            return float(low), float(high)
    shown = f"a list of {len(value)}" if isinstance(value, list) else _describe(value)
    raise ValueError(f"must be [low, high], two numbers like [0.1, 60000], not {shown}")


_Str = Annotated[str | None, BeforeValidator(_present)]
_Number = Annotated[float | None, BeforeValidator(_number), BeforeValidator(_present)]
_Duration = Annotated[int | None, BeforeValidator(_duration), BeforeValidator(_present)]
_Kind = Annotated[WindowKind | None, BeforeValidator(_present)]
_Quantiles = Annotated[QuantileSketch | None, BeforeValidator(_present)]
_StrList = Annotated[list[str] | None, BeforeValidator(_present)]
_StrMap = Annotated[dict[str, str] | None, BeforeValidator(_present)]


class _Shape(BaseModel):
    """Strict: every key must be known and every value must already have the right type."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _RawWindow(_Shape):
    name: _Str = None
    kind: _Kind = None
    size: _Duration = None
    hop: _Duration = None
    offset: _Duration = None
    gap: _Duration = None
    key: _Str = None
    watermark_delay: _Duration = None
    allowed_lateness: _Duration = None
    metrics: _StrList = None
    group_by: _StrList = None
    quantiles: _Quantiles = None
    early_every: _Duration = None


class _RawAlert(_Shape):
    name: _Str = None
    window: _Str = None
    metric: _Str = None
    aggregate: _Str = None
    condition: _Str = None
    for_: _Duration = Field(None, alias="for")  # "for" is a Python keyword
    tags: _StrMap = None
    labels: _StrMap = None
    annotations: _StrMap = None


class _RawSketches(_Shape):
    distinct_error: _Number = None
    quantile_error: _Number = None
    value_range: Annotated[
        tuple[float, float] | None, BeforeValidator(_value_range), BeforeValidator(_present)
    ] = None


class _RawConfig(_Shape):
    name: _Str = None
    pane: _Duration = None
    sketches: Annotated[dict[Any, Any] | None, BeforeValidator(_present)] = None
    windows: Annotated[list[Any] | None, BeforeValidator(_present)] = None
    alerts: Annotated[list[Any] | None, BeforeValidator(_present)] = None


_WINDOW_KEYS = tuple(_RawWindow.model_fields)
_CONFIG_KEYS = tuple(_RawConfig.model_fields)
assert tuple(_RawSketches.model_fields) == SKETCH_KEYS
_ALERT_KEYS = tuple(field.alias or key for key, field in _RawAlert.model_fields.items())

#: Names users bring from other systems, mapped to ours.
_SYNONYMS = {
    "slide": "hop",
    "step": "hop",
    "advance": "hop",
    "length": "size",
    "duration": "size",
    "timeout": "gap",
    "session_gap": "gap",
    "lateness": "allowed_lateness",
    "grace": "allowed_lateness",
    "delay": "watermark_delay",
    "watermark": "watermark_delay",
    "tags": "group_by",
    "type": "kind",
    "percentiles": "quantiles",
    "quantile": "quantiles",
    "sketch": "quantiles",
    "early": "early_every",
    "early_firing": "early_every",
    "early_firings": "early_every",
    "emit_every": "early_every",
    "update_every": "early_every",
}


#: Names users bring from Prometheus rules and Grafana, mapped to the alert keys.
_ALERT_SYNONYMS = {
    "alert": "name",
    "title": "name",
    "expr": "condition",
    "threshold": "condition",
    "pending": "for",
    "pending_period": "for",
    "duration": "for",
    "filter": "tags",
    "matchers": "tags",
    "agg": "aggregate",
    "aggregation": "aggregate",
    "column": "aggregate",
}


#: Sketch parameters users reach for, mapped to the target that sets them: the config takes
#: the error wanted, and picks the parameter (``validate`` prints the one it picked).
_SKETCH_SYNONYMS = {
    "lg_k": "distinct_error",
    "lgk": "distinct_error",
    "hll_lg_k": "distinct_error",
    "precision": "distinct_error",
    "set_eps": "distinct_error",
    "compression": "quantile_error",
    "tdigest_k": "quantile_error",
    "k": "quantile_error",
    "significant_digits": "quantile_error",
    "kll_k": "quantile_error",
    "digits": "quantile_error",
    "range": "value_range",
    "min": "value_range",
    "max": "value_range",
    "lowest": "value_range",
    "highest": "value_range",
}


def _unknown_key_message(key: str, model: type[_Shape]) -> str:
    if model is _RawSketches:
        if key in _SKETCH_SYNONYMS:
            return (
                f"unknown key; sketches: takes error targets and picks {key} from them: "
                f"did you mean {_SKETCH_SYNONYMS[key]}?"
            )
        guess = next(iter(difflib.get_close_matches(key, SKETCH_KEYS, n=1)), None)
        if guess is not None:
            return f"unknown key; did you mean {guess}?"
        return f"unknown key; valid keys here: {', '.join(SKETCH_KEYS)}"
    if key in SKETCH_KEYS and model is _RawConfig:
        return f"unknown key; {key} belongs under sketches:"
    if key in SKETCH_KEYS and model is _RawWindow:
        return f"unknown key; {key} is set once for the whole config, under sketches:"
    if model is _RawAlert:
        guess = _ALERT_SYNONYMS.get(key) or next(
            iter(difflib.get_close_matches(key, _ALERT_KEYS, n=1)), None
        )
        if guess is not None:
            return f"unknown key; did you mean {guess}?"
        return f"unknown key; valid keys here: {', '.join(_ALERT_KEYS)}"
    valid = _WINDOW_KEYS if model is _RawWindow else _CONFIG_KEYS
    if model is _RawWindow and key == "sets":
        # ``sets: separate`` / ``with_timers`` chose where a window merged its sets' HLLs, a
        # speed trade-off every metric type now makes the same way.
        return (
            "unknown key; sets: is no longer needed (every metric type takes one path): "
            "remove it"
        )
    if model is _RawWindow and key in _CONFIG_KEYS:
        return f"unknown key; {key} is set once for the whole config, at the top level"
    if model is _RawConfig and key in _WINDOW_KEYS:
        return f"unknown key; {key} belongs inside a window, under windows:"
    guess = _SYNONYMS.get(key) or next(iter(difflib.get_close_matches(key, valid, n=1)), None)
    if guess is not None and guess in valid:
        return f"unknown key; did you mean {guess}?"
    return f"unknown key; valid keys here: {', '.join(valid)}"


def _choice_message(
    value: object, choices: Sequence[str], what: str, *, fold_case: bool = False
) -> str:
    """A value outside a key's fixed ``choices``: the choices, and the nearest one to a
    misspelt string (``fold_case``: compared in lower case, a looser match)."""
    listed = ", ".join(choices)
    if not isinstance(value, str):
        return f"must be one of {listed}, not {_describe(value)}"
    if fold_case:
        guess = difflib.get_close_matches(value.lower(), choices, n=1, cutoff=0.5)
    else:
        guess = difflib.get_close_matches(value, choices, n=1)
    hint = f"; did you mean {guess[0]}?" if guess else ""
    return f"unknown {what} {value!r}; one of {listed}{hint}"


def _shape_message(error: ErrorDetails, model: type[_Shape]) -> str:
    """pydantic's message, rephrased where pydantic speaks Python and users wrote YAML."""
    kind, value = error["type"], error["input"]
    if kind == "value_error":
        return str(error.get("ctx", {}).get("error", error["msg"]))
    if kind == "extra_forbidden":
        return _unknown_key_message(str(error["loc"][-1]), model)
    if kind == "invalid_key":
        return f"key {value!r} is not a name; keys are words like size or windows"
    if kind == "literal_error" and error["loc"][:1] == ("quantiles",):
        return _choice_message(value, QUANTILE_SKETCHES, "quantile sketch", fold_case=True)
    if kind == "literal_error":
        return _choice_message(value, WINDOW_KINDS, "kind")
    if kind == "string_type":
        if model is _RawAlert and error["loc"][:1] == ("condition",):
            return f'must be a quoted string like "> 250", not {_describe(value)}'
        return f"must be a string, not {_describe(value)}"
    if kind == "dict_type":
        if error["loc"] == ("sketches",):
            return f"must be a mapping like {{distinct_error: 0.02}}, not {_describe(value)}"
        return f"must be a mapping like {{key: value}}, not {_describe(value)}"
    if kind == "list_type":
        if error["loc"] == ("alerts",):
            return (
                f"must be a list of alerts (each starting with '- name:'), not {_describe(value)}"
            )
        if error["loc"] == ("windows",):
            return (
                f"must be a list of windows (each starting with '- name:'), not {_describe(value)}"
            )
        return f'must be a list like ["a", "b"], not {_describe(value)}'
    return error["msg"]


_M = TypeVar("_M", bound=_Shape)


#: For each list-valued key, the indexes of the entries that failed validation.
_Holes = dict[str, set[int]]


def _read_shape(
    model: type[_M], data: Mapping[Any, Any], loc: Loc, problems: list[Problem]
) -> tuple[_M, _Holes]:
    """Validate ``data``, recording every error; return what validates without the bad parts.

    A bad key is dropped; a bad entry of a list is dropped from the list and its index returned
    as a hole, so ``group_by: [a, 1, a]`` still reports the duplicate ``a`` at its real index.
    """
    try:
        return model.model_validate(data), {}
    except ValidationError as exc:
        bad_keys: set[object] = set()
        holes: _Holes = {}
        for error in exc.errors():
            where = error["loc"]
            if error["type"] == "invalid_key":
                problems.append((loc, _shape_message(error, model)))
            else:
                problems.append(((*loc, *where), _shape_message(error, model)))
            key = where[0]
            if len(where) == 2 and isinstance(where[1], int) and isinstance(data.get(key), list):
                holes.setdefault(str(key), set()).add(where[1])
            else:
                bad_keys.add(key)
        cleaned = {
            key: [v for i, v in enumerate(value) if i not in holes[key]] if key in holes else value
            for key, value in data.items()
            if key not in bad_keys
        }
        return model.model_validate(cleaned), {k: v for k, v in holes.items() if k not in bad_keys}


def _with_holes(values: list[str] | None, holes: set[int] | None) -> list[str | None] | None:
    """Put a ``None`` back where each unreadable entry was, so later indexes stay true."""
    if values is None or not holes:
        return list(values) if values is not None else None
    remaining = iter(values)
    return [None if i in holes else next(remaining) for i in range(len(values) + len(holes))]


# --- pass 1: YAML ----------------------------------------------------------------------------


def _yaml_position(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    if mark is None:
        return ""
    return f" at line {mark.line + 1}, column {mark.column + 1}"


def _yaml_problem(exc: yaml.YAMLError) -> str:
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
        context = f" ({exc.context})" if exc.context else ""
        return f"{exc.problem}{context}"
    return str(exc)


def _duplicate_keys(node: yaml.Node, loc: Loc, problems: list[Problem], seen: set[int]) -> None:
    """Find keys written twice in one mapping; PyYAML would keep the last without a word."""
    if id(node) in seen:  # aliases can make the node graph cyclic
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first_line: dict[tuple[str, str], int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                _duplicate_keys(value_node, loc, problems, seen)
                continue
            ident = (key_node.tag, key_node.value)
            child = (*loc, key_node.value)
            if ident in first_line:
                problems.append(
                    (
                        child,
                        f"duplicate key (first at line {first_line[ident]}, again at line "
                        f"{key_node.start_mark.line + 1}); YAML would keep only the last one",
                    )
                )
            else:
                first_line[ident] = key_node.start_mark.line + 1
            _duplicate_keys(value_node, child, problems, seen)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _duplicate_keys(item, (*loc, index), problems, seen)


def _read_yaml(text: str, problems: list[Problem]) -> tuple[bool, object]:
    """(readable, document). Unreadable YAML is one problem: nothing after the error is known."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return True, None
        _duplicate_keys(node, (), problems, set())
        return True, loader.construct_document(node)
    except yaml.YAMLError as exc:
        problems.append(((), f"invalid YAML{_yaml_position(exc)}: {_yaml_problem(exc)}"))
        return False, None
    finally:
        loader.dispose()


# --- putting it together -------------------------------------------------------------------


def _position(document: object, loc: Loc) -> tuple[int, ...]:
    """Where ``loc`` sits in the document, so issues read top to bottom like the file.

    A key that is missing sorts after the keys its mapping does have.
    """
    position: list[int] = []
    node = document
    for part in loc:
        if isinstance(node, dict) and part in node:
            position.append(list(node).index(part))
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            position.append(part)
            node = node[part]
        else:
            position.append(len(node) if isinstance(node, dict | list) else 0)
            break
    return tuple(position)


def _draft(raw: _RawWindow, holes: _Holes, given: frozenset[str]) -> WindowDraft:
    return WindowDraft(
        given=given,
        name=raw.name,
        kind=raw.kind,
        size_ms=raw.size,
        hop_ms=raw.hop,
        offset_ms=raw.offset,
        gap_ms=raw.gap,
        key=raw.key,
        watermark_delay_ms=raw.watermark_delay,
        allowed_lateness_ms=raw.allowed_lateness,
        metrics=_with_holes(raw.metrics, holes.get("metrics")),
        group_by=_with_holes(raw.group_by, holes.get("group_by")),
        quantiles=raw.quantiles,
        early_every_ms=raw.early_every,
    )


def _spec(raw: _RawWindow) -> WindowSpec:
    """Build a window the rules have passed; absent keys take the spec's defaults."""
    values: dict[str, Any] = {
        "name": raw.name,
        "kind": raw.kind,
        "size_ms": raw.size,
        "hop_ms": raw.hop,
        "offset_ms": raw.offset,
        "gap_ms": raw.gap,
        "key": raw.key,
        "watermark_delay_ms": raw.watermark_delay,
        "allowed_lateness_ms": raw.allowed_lateness,
        "metrics": None if raw.metrics is None else tuple(raw.metrics),
        "group_by": None if raw.group_by is None else tuple(raw.group_by),
        "quantiles": raw.quantiles,
        "early_every_ms": raw.early_every,
    }
    return WindowSpec(**{k: v for k, v in values.items() if v is not None})


def _alert_draft(raw: _RawAlert, given: frozenset[str]) -> AlertDraft:
    return AlertDraft(
        given=given,
        name=raw.name,
        window=raw.window,
        metric=raw.metric,
        aggregate=raw.aggregate,
        condition=raw.condition,
        for_ms=raw.for_,
        tags=raw.tags,
        labels=raw.labels,
        annotations=raw.annotations,
    )


def _alert_spec(raw: _RawAlert) -> AlertSpec:
    """Build an alert the rules have passed."""
    assert raw.condition is not None
    op, threshold = parse_condition(raw.condition)
    return AlertSpec(
        name=str(raw.name),
        window=str(raw.window),
        metric=str(raw.metric),
        aggregate=raw.aggregate,  # type: ignore[arg-type]  # checked against AGGREGATES
        op=op,
        threshold=threshold,
        for_ms=raw.for_ or 0,
        tags=tuple((raw.tags or {}).items()),
        labels=tuple((raw.labels or {}).items()),
        annotations=tuple((raw.annotations or {}).items()),
    )


def parse_config(text: str, source: str, default_name: str = "streamgauge") -> PipelineConfig:
    """Parse one YAML config; ``ConfigError`` lists every issue in it, in document order.

    ``source`` names the text in messages (a path, ``<stdin>``); ``default_name`` is the
    config name when the document has no ``name:`` key.
    """
    problems: list[Problem] = []
    readable, document = _read_yaml(text, problems)
    if readable and document is None:
        problems.append(((), "the document is empty; a config needs at least a windows: list"))
    elif readable and not isinstance(document, dict):
        problems.append(
            (
                (),
                f"the document must be a mapping with the keys {', '.join(_CONFIG_KEYS)}, "
                f"not {_describe(document)}",
            )
        )
    if not isinstance(document, dict):
        raise ConfigError(source, [ConfigIssue(format_path(loc), m) for loc, m in problems])

    top, _ = _read_shape(_RawConfig, document, (), problems)
    name = top.name
    if "name" not in document:
        if problem := name_problem(default_name):
            problems.append(
                (("name",), f"no name: key, and the default name is unusable: {problem}")
            )
        else:
            name = default_name
    pane_ms = top.pane if "pane" in document else DEFAULT_PANE_MS

    raw_windows: list[_RawWindow | None] | None = None
    drafts: list[WindowDraft | None] | None = None
    if top.windows is not None:
        raw_windows, drafts = [], []
        for index, item in enumerate(top.windows):
            if not isinstance(item, dict):
                problems.append(
                    (("windows", index), f"a window must be a mapping, not {_describe(item)}")
                )
                raw_windows.append(None)
                drafts.append(None)
                continue
            raw, holes = _read_shape(_RawWindow, item, ("windows", index), problems)
            raw_windows.append(raw)
            drafts.append(_draft(raw, holes, frozenset(k for k in item if isinstance(k, str))))

    raw_alerts: list[_RawAlert | None] | None = None
    alert_drafts: list[AlertDraft | None] | None = None
    if top.alerts is not None:
        raw_alerts, alert_drafts = [], []
        for index, item in enumerate(top.alerts):
            if not isinstance(item, dict):
                problems.append(
                    (("alerts", index), f"an alert must be a mapping, not {_describe(item)}")
                )
                raw_alerts.append(None)
                alert_drafts.append(None)
                continue
            raw_alert, _ = _read_shape(_RawAlert, item, ("alerts", index), problems)
            raw_alerts.append(raw_alert)
            alert_drafts.append(
                _alert_draft(raw_alert, frozenset(k for k in item if isinstance(k, str)))
            )

    targets = SketchTargets()
    if top.sketches is not None:
        raw_sketches, _ = _read_shape(_RawSketches, top.sketches, ("sketches",), problems)
        targets = SketchTargets(
            distinct_error=raw_sketches.distinct_error,
            quantile_error=raw_sketches.quantile_error,
            value_range=raw_sketches.value_range,
        )

    problems += config_problems(
        given=frozenset(k for k in document if isinstance(k, str)),
        name=name,
        pane_ms=pane_ms,
        windows=drafts,
        alerts=alert_drafts,
        sketches=targets,
    )

    if problems:
        problems.sort(key=lambda problem: _position(document, problem[0]))
        raise ConfigError(source, [ConfigIssue(format_path(loc), m) for loc, m in problems])

    # Every rule has passed, so none of these is None and no constructor can refuse.
    assert name is not None and pane_ms is not None and raw_windows is not None
    return PipelineConfig(
        name=name,
        pane_ms=pane_ms,
        windows=tuple(_spec(raw) for raw in raw_windows if raw is not None),
        alerts=tuple(_alert_spec(raw) for raw in raw_alerts or () if raw is not None),
        sketch_targets=targets,
    )


_NOT_NAME_CHARS = re.compile(r"[^a-z0-9_]")


def default_config_name(path: str | os.PathLike[str]) -> str:
    """The config name a file gets without ``name:``: its stem, made a valid name.

    ``Checkout-API.yaml`` -> ``checkout_api``.
    """
    name = _NOT_NAME_CHARS.sub("_", Path(path).stem.lower())[:NAME_MAX_LENGTH]
    return name or "streamgauge"


def load_config(path: str | os.PathLike[str]) -> PipelineConfig:
    """Read and parse a config file; an unreadable file is a ``ConfigError`` like any other."""
    source = os.fspath(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            source, [ConfigIssue("", f"cannot read the file: it is not UTF-8 text ({exc.reason})")]
        ) from exc
    except OSError as exc:
        raise ConfigError(
            source, [ConfigIssue("", f"cannot read the file: {exc.strerror or exc}")]
        ) from exc
    return parse_config(text, source, default_name=default_config_name(path))
