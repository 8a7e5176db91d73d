"""The compiled window config: the frozen description the windowing job, sinks and Grafana read.

``WindowSpec`` and ``PipelineConfig`` check themselves at construction with the same rules the
YAML loader reports (``config_problems``), so a spec built in Python by a test or by the Spark
job is held to exactly what a YAML file is held to, and no consumer re-checks anything.

The rules run on ``WindowDraft``s, windows in which any value may be missing, rather than on
finished specs: the loader has to keep checking a window whose ``size`` was unreadable, so that
a user sees every mistake in one run instead of one per run.

Windows are half-open ``[start, end)`` on event time. All durations are integer milliseconds.
"""

from __future__ import annotations

import contextlib
import difflib
import fnmatch
import functools
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from streamgauge.configs.durations import format_duration_ms
from streamgauge.sketches.accuracy import (
    DEFAULT_KLL_K,
    KLL_BYTES_PER_K,
    KLL_PERCENTILES,
    PERCENTILES,
    SketchParams,
    compile_accuracy,
    kll_error,
)

WindowKind = Literal["tumbling", "hopping", "sliding", "session"]
QuantileSketch = Literal["tdigest", "kll"]
Aggregate = Literal[
    "count", "sum", "min", "max", "last", "p50", "p90", "p99", "p999", "distinct_count", "rate"
]  # fmt: skip
#: What an alert can watch: a ``window_results`` column, or ``rate`` (sum per second of window).
AGGREGATES: tuple[Aggregate, ...] = (
    "count", "sum", "min", "max", "last", "p50", "p90", "p99", "p999", "distinct_count",
    "rate",
)  # fmt: skip
#: What an alert can watch of the clients (``client_completeness``, docs/completeness.md): the
#: fraction of a DogStatsD client's metrics, or packets, that arrived, per client and window.
ClientAggregate = Literal["completeness", "packet_completeness"]
#: The metric such an alert names: the received side of the fraction.
CLIENT_AGGREGATE_METRICS: dict[str, str] = {
    "completeness": "streamgauge.ingest.client.metrics_received",
    "packet_completeness": "streamgauge.ingest.client.packets_received",
}
#: The tags a client alert can filter on and is evaluated per (columns of the view).
CLIENT_ALERT_TAGS = ("source", "client", "client_version", "client_transport")
AlertAggregate = Aggregate | ClientAggregate
ALERT_AGGREGATES: tuple[str, ...] = (*AGGREGATES, *CLIENT_AGGREGATE_METRICS)
Comparison = Literal[">", ">=", "<", "<=", "==", "!="]
COMPARISONS: tuple[Comparison, ...] = (">=", "<=", "==", "!=", ">", "<")
WINDOW_KINDS: tuple[WindowKind, ...] = ("tumbling", "hopping", "sliding", "session")
#: How a window computes the percentiles of timers, histograms and distributions:
#: ``tdigest`` (default): the panes' t-digests and HDR histograms merged per window, p50..p999
#: and histogram rows; ``kll``: the panes' KLL sketches merged per window
#: (``sketches.kll_columns``), p50 and p90 only (see ``kll_problem``), and histogram rows.
QUANTILE_SKETCHES: tuple[QuantileSketch, ...] = ("tdigest", "kll")
#: Window kinds that take the ``quantiles:`` key. Sessions and sliding windows compute
#: percentiles too, always from t-digests and HDR histograms (``windows.window_sketches``), so
#: for them the key would choose nothing.
QUANTILE_KINDS: tuple[WindowKind, ...] = ("tumbling", "hopping")
#: What a ``quantiles: kll`` window stores no value for (``accuracy.KLL_PERCENTILES`` says why).
KLL_UNSTORED: tuple[str, ...] = tuple(name for name in PERCENTILES if name not in KLL_PERCENTILES)

#: Keys whose meaning depends on the kind; every other window key is valid for every kind.
KIND_SPECIFIC_KEYS: tuple[str, ...] = ("size", "hop", "offset", "gap", "key")
KIND_KEYS: Mapping[WindowKind, frozenset[str]] = {
    "tumbling": frozenset({"size", "offset"}),
    "hopping": frozenset({"size", "hop"}),
    "sliding": frozenset({"size"}),
    "session": frozenset({"gap", "key"}),
}
REQUIRED_KEYS: Mapping[WindowKind, tuple[str, ...]] = {
    "tumbling": ("size",),
    "hopping": ("size", "hop"),
    "sliding": ("size",),
    "session": ("gap", "key"),
}

DEFAULT_PANE_MS = 1_000
DEFAULT_WATERMARK_DELAY_MS = 1_000
DEFAULT_ALLOWED_LATENESS_MS = 0
DEFAULT_METRICS: tuple[str, ...] = ("*",)
#: Above this a ``quantiles: kll`` series-window costs more sketch bytes than the t-digest's
#: and HLL's expensive thresholds (32 KiB).
_EXPENSIVE_KLL_BYTES = 32 * 1024

#: Grafana's alert scheduler ticks every 10 s (``[unified_alerting] base_interval``, not
#: configurable since Grafana 9): a rule group's interval must be a multiple of it.
EVALUATION_STEP_MS = 10_000
#: Window kinds alerts can watch: the ones with a fixed grid of window ends to evaluate on.
ALERTABLE_KINDS: tuple[WindowKind, ...] = ("tumbling", "hopping")
#: Prometheus/Grafana label names (Grafana refuses others in alert rule labels).
_LABEL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: "> 250", ">= 1", "< 0.5", "== 0", "!= -1.5e3"
_CONDITION = re.compile(
    r"\s*(>=|<=|==|!=|>|<)\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*", re.ASCII
)

#: Config and window names end up in result rows, series keys and generated identifiers
#: (Grafana UIDs, PostgreSQL object names), so they are restricted to characters every one of
#: those accepts, and to PostgreSQL's identifier length (NAMEDATALEN - 1).
NAME_PATTERN = re.compile(r"[a-z0-9_]+")
NAME_MAX_LENGTH = 63

#: A tag key is what precedes ``:`` in a DogStatsD ``|#key:value,key2`` section, so it can
#: never contain these; a ``group_by`` entry that does could never match a tag.
_TAG_FORBIDDEN = frozenset(":,|")

#: A location in the document: keys and list indexes, e.g. ``("windows", 1, "hop")``.
Loc = tuple[str | int, ...]
#: One broken rule: where, and a sentence saying what is wrong.
Problem = tuple[Loc, str]


def format_path(loc: Loc) -> str:
    """``("windows", 1, "hop")`` -> ``windows[1].hop``: the spelling users search their YAML for."""
    text = ""
    for part in loc:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a config or a window, or ``None`` if it can."""
    if not NAME_PATTERN.fullmatch(name):
        return f"{name!r} is not a valid name; use only lowercase letters, digits and _"
    if len(name) > NAME_MAX_LENGTH:
        return f"{name!r} is {len(name)} characters long; the limit is {NAME_MAX_LENGTH}"
    return None


def tag_problem(tag: str) -> str | None:
    """Why ``tag`` cannot be a tag key, or ``None`` if it can."""
    if not tag.strip():
        return "a tag name cannot be empty"
    if any(ch in _TAG_FORBIDDEN or ch.isspace() for ch in tag):
        return f"{tag!r} is not a tag name; tag names contain no whitespace, ':', ',' or '|'"
    return None


def _show(ms: int) -> str:
    """Durations in messages, as the user would write them (negatives only come from Python)."""
    return format_duration_ms(ms) if ms >= 0 else f"{ms}ms"


@dataclass(frozen=True)
class WindowDraft:
    """A window as far as it could be read; ``None`` marks a value missing or already reported.

    ``given`` holds the keys the user wrote, valid or not, so that a key with a bad value is not
    reported a second time as missing. A ``None`` inside ``metrics`` or ``group_by`` is an entry
    that was unreadable; it keeps its place so the other entries keep their indexes.
    """

    given: frozenset[str]
    name: str | None = None
    kind: WindowKind | None = None
    size_ms: int | None = None
    hop_ms: int | None = None
    offset_ms: int | None = None
    gap_ms: int | None = None
    key: str | None = None
    watermark_delay_ms: int | None = None
    allowed_lateness_ms: int | None = None
    metrics: Sequence[str | None] | None = None
    group_by: Sequence[str | None] | None = None
    quantiles: QuantileSketch | None = None
    early_every_ms: int | None = None


def _not_allowed(key: str, kind: WindowKind) -> str:
    owners = [k for k in WINDOW_KINDS if key in KIND_KEYS[k]]
    listed = owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} and {owners[-1]}"
    message = f"not allowed on a {kind} window ({key} belongs to {listed} windows)"
    if kind == "sliding" and key == "hop":
        # Flink and Spark call fixed-size windows that advance by a slide "sliding windows";
        # here those are hopping windows, and sliding means Kafka Streams' SlidingWindows.
        message += "; for fixed windows that advance by hop, use kind: hopping"
    return message


_EARLY_SESSION = (
    "not supported on a session window: a session's end moves with every event, so each "
    "time it grows it is a new window row, and early rows would be re-emitted at every "
    "micro-batch instead of once per early_every; a session appears when the watermark "
    "passes its end (use a tumbling or hopping window for running values)"
)


def window_problems(draft: WindowDraft, pane_ms: int | None) -> list[Problem]:
    """Every rule a single window breaks, with locations relative to the window.

    ``pane_ms`` is ``None`` when the pane is unknown (a spec built on its own, or a pane that was
    itself invalid); the multiple-of-pane rules are then skipped rather than guessed.
    """
    problems: list[Problem] = []
    given = draft.given
    kind = draft.kind

    if "name" not in given:
        problems.append((("name",), "required; every window needs a name, stored with its rows"))
    elif draft.name is not None and (problem := name_problem(draft.name)):
        problems.append((("name",), problem))

    if "kind" not in given:
        problems.append((("kind",), f"required; one of {', '.join(WINDOW_KINDS)}"))

    allowed = set(KIND_SPECIFIC_KEYS) if kind is None else set(KIND_KEYS[kind])
    if kind is not None:
        for key in KIND_SPECIFIC_KEYS:
            if key in given and key not in allowed:
                problems.append(((key,), _not_allowed(key, kind)))
        for key in REQUIRED_KEYS[kind]:
            if key not in given:
                problems.append(((key,), f"required for a {kind} window"))

    def usable(key: str, value: int | None, *, positive: bool) -> int | None:
        """The value if later rules may rely on it; reports it if it is out of range."""
        if value is None or key not in allowed | {"watermark_delay", "allowed_lateness",
                                                  "early_every"}:
            return None
        if positive and value <= 0:
            problems.append(((key,), f"must be greater than 0, not {_show(value)}"))
            return None
        if value < 0:
            problems.append(((key,), f"must be 0 or more, not {_show(value)}"))
            return None
        return value

    size = usable("size", draft.size_ms, positive=True)
    hop = usable("hop", draft.hop_ms, positive=True)
    offset = usable("offset", draft.offset_ms, positive=False)
    gap = usable("gap", draft.gap_ms, positive=True)
    usable("watermark_delay", draft.watermark_delay_ms, positive=False)
    usable("allowed_lateness", draft.allowed_lateness_ms, positive=False)
    early = usable("early_every", draft.early_every_ms, positive=True)
    if early is not None and kind == "session":
        problems.append((("early_every",), _EARLY_SESSION))
        early = None
    if early is not None and size is not None and early >= size:
        problems.append(
            (
                ("early_every",),
                f"early_every {_show(early)} must be smaller than size {_show(size)}; the "
                "emission at the window's end is the on-time one, not an early one",
            )
        )

    if offset is not None and size is not None and offset >= size:
        problems.append(
            (("offset",), f"offset {_show(offset)} must be smaller than size {_show(size)}")
        )
    if hop is not None and size is not None:
        if hop > size:
            problems.append(
                (
                    ("hop",),
                    f"hop {_show(hop)} is larger than size {_show(size)}; events between two "
                    "windows would fall in none (hop must be at most size)",
                )
            )
        elif size % hop:
            problems.append((("hop",), f"size {_show(size)} is not a multiple of hop {_show(hop)}"))

    if pane_ms is not None:
        # Windows are unions of panes; a boundary inside a pane would need data the ingest
        # tier has already summed away.
        for key, value in (("size", size), ("hop", hop), ("offset", offset), ("gap", gap),
                           ("early_every", early)):
            if value is not None and value % pane_ms:
                problems.append(
                    ((key,), f"{_show(value)} is not a multiple of the pane {_show(pane_ms)}")
                )

    if draft.key is not None and "key" in allowed and (problem := tag_problem(draft.key)):
        problems.append((("key",), problem))

    if draft.quantiles == "kll" and kind is not None and kind not in QUANTILE_KINDS:
        problems.append(
            (
                ("quantiles",),
                f"a {kind} window computes no percentiles yet (only "
                f"{' and '.join(QUANTILE_KINDS)} windows do), so quantiles: kll would change "
                "nothing; remove it",
            )
        )

    if draft.metrics is not None:
        if not draft.metrics:
            problems.append((("metrics",), "must list at least one glob; ['*'] matches all"))
        for index, glob in enumerate(draft.metrics):
            if glob is not None and not glob.strip():
                problems.append((("metrics", index), "an empty glob matches no metric"))

    if draft.group_by is not None:
        first_seen: dict[str, int] = {}
        for index, tag in enumerate(draft.group_by):
            if tag is None:
                continue
            if problem := tag_problem(tag):
                problems.append((("group_by", index), problem))
            elif tag in first_seen:
                problems.append(
                    (
                        ("group_by", index),
                        f"duplicate tag {tag!r} (already group_by[{first_seen[tag]}])",
                    )
                )
            else:
                first_seen[tag] = index
    return problems


def evaluation_interval_ms(kind: WindowKind, size_ms: int | None, hop_ms: int | None) -> int:
    """How often alerts on a window are evaluated: once per new window end, on Grafana's grid.

    A tumbling window gets a new end every ``size``, a hopping one every ``hop``. Grafana runs
    rule groups on a 10 s scheduler tick, so the step is rounded UP to a multiple of 10 s
    (evaluating more often than windows close finds nothing new; less often than the grid
    allows would skip windows): 10s -> 10s, 15s -> 20s, 1m -> 60s, 2500ms -> 10s.
    """
    step = hop_ms if kind == "hopping" and hop_ms else size_ms
    if step is None or step <= 0:
        return EVALUATION_STEP_MS
    return -(-step // EVALUATION_STEP_MS) * EVALUATION_STEP_MS


def parse_condition(text: str) -> tuple[Comparison, float]:
    """``"> 250"`` -> ``(">", 250.0)``; ``ValueError`` with a sentence otherwise."""
    match = _CONDITION.fullmatch(text)
    if match is None:
        raise ValueError(
            f'{text!r} is not a condition; write an operator and a number, like "> 250", '
            '">= 1", "< 0.5" or "== 0" (operators: >, >=, <, <=, ==, !=)'
        )
    op, number = match.groups()
    value = float(number)
    if value != value or value in (float("inf"), float("-inf")):  # "1e999" overflows to inf
        raise ValueError(f"{text!r}: {number} is not a finite number")
    return op, value  # type: ignore[return-value]


def format_threshold(value: float) -> str:
    """``250.0`` -> ``250``, ``0.5`` -> ``0.5``: the number as a user would write it."""
    return str(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)


@dataclass(frozen=True)
class AlertDraft:
    """An alert as far as it could be read; ``None`` marks a value missing or already reported."""

    given: frozenset[str]
    name: str | None = None
    window: str | None = None
    metric: str | None = None
    aggregate: str | None = None
    condition: str | None = None
    for_ms: int | None = None
    tags: Mapping[str, str] | None = None
    labels: Mapping[str, str] | None = None
    annotations: Mapping[str, str] | None = None


def _client_alert_problems(draft: AlertDraft, window: WindowDraft | None) -> list[Problem]:
    """A completeness alert reads ``client_completeness``: its metric is the received side,
    its window keeps the ``source`` tag, its tags are the view's client columns."""
    metric = CLIENT_AGGREGATE_METRICS.get(draft.aggregate or "")
    if metric is None:
        return []
    problems: list[Problem] = []
    if draft.metric is not None and draft.metric != metric:
        problems.append((("metric",), f"aggregate {draft.aggregate} watches {metric} (against "
                                       "what the clients said they sent), not "
                                       f"{draft.metric!r}"))
    if window is not None and window.group_by is not None and "source" not in window.group_by:
        problems.append((("window",), f"window {draft.window!r} does not keep the source tag; "
                                       "give it group_by: [source, ...] to tell the clients "
                                       "apart"))
    for tag in draft.tags or {}:
        if tag not in CLIENT_ALERT_TAGS:
            problems.append((("tags", tag), f"a {draft.aggregate} alert filters on "
                                            f"{', '.join(CLIENT_ALERT_TAGS)}, not {tag!r}"))
    return problems


def alert_problems(
    draft: AlertDraft,
    windows: Mapping[str, WindowDraft] | None,
    kll_rank_error: float | None = None,
) -> list[Problem]:
    """Every rule one alert breaks, locations relative to the alert.

    ``windows`` maps the config's readable window names to their drafts (``None``: the windows
    could not be read, so the checks that need them are skipped rather than guessed).
    ``kll_rank_error`` is the config's compiled KLL error, for the message refusing a p99 of a
    ``quantiles: kll`` window (``None``: the default k's).
    """
    problems: list[Problem] = []
    given = draft.given
    for key, why in (
        ("name", "every alert needs a name; it becomes the rule's title and UID"),
        ("window", "the name of a window in windows: whose results the alert watches"),
        ("metric", "the exact metric name the alert watches"),
        ("aggregate", f"one of {', '.join(ALERT_AGGREGATES)}"),
        ("condition", 'an operator and a number, like "> 250"'),
    ):
        if key not in given:
            problems.append(((key,), f"required; {why}"))

    if draft.name is not None and (problem := name_problem(draft.name)):
        problems.append((("name",), problem))

    window: WindowDraft | None = None
    if draft.window is not None and windows is not None:
        window = windows.get(draft.window)
        if window is None:
            known = ", ".join(windows) or "none"
            guess = difflib.get_close_matches(draft.window, list(windows), n=1)
            hint = f"; did you mean {guess[0]}?" if guess else ""
            problems.append(
                (("window",), f"no window named {draft.window!r} (windows: {known}){hint}")
            )
        elif window.kind is not None and window.kind not in ALERTABLE_KINDS:
            problems.append(
                (
                    ("window",),
                    f"window {draft.window!r} is a {window.kind} window; alerts watch "
                    f"{' or '.join(ALERTABLE_KINDS)} windows, whose ends fall on a fixed grid",
                )
            )
            window = None

    if draft.metric is not None:
        if not draft.metric.strip():
            problems.append((("metric",), "cannot be empty"))
        elif any(ch in draft.metric for ch in "*?["):
            problems.append(
                (("metric",), f"{draft.metric!r} is a glob; an alert watches one exact metric")
            )
        elif window is not None and window.metrics is not None:
            globs = [g for g in window.metrics if g is not None]
            if globs and not any(fnmatch.fnmatchcase(draft.metric, g) for g in globs):
                problems.append(
                    (
                        ("metric",),
                        f"window {draft.window!r} does not aggregate {draft.metric!r} (its "
                        f"metrics: {', '.join(globs)}); the alert would never see data",
                    )
                )

    if draft.aggregate is not None and draft.aggregate not in ALERT_AGGREGATES:
        guess = difflib.get_close_matches(draft.aggregate, ALERT_AGGREGATES, n=1)
        hint = f"; did you mean {guess[0]}?" if guess else ""
        problems.append(
            (
                ("aggregate",),
                f"unknown aggregate {draft.aggregate!r}; one of {', '.join(ALERT_AGGREGATES)}"
                f"{hint}",
            )
        )
    problems += _client_alert_problems(draft, window)

    if (
        window is not None
        and window.quantiles == "kll"
        and draft.aggregate in KLL_UNSTORED
        and window.kind in QUANTILE_KINDS
    ):
        message = kll_problem(draft.aggregate, draft.window, kll_rank_error)
        problems.append((("aggregate",), message))

    if draft.condition is not None:
        try:
            parse_condition(draft.condition)
        except ValueError as exc:
            problems.append((("condition",), str(exc)))

    if draft.for_ms is not None:
        if draft.for_ms < 0:
            problems.append((("for",), f"must be 0 or more, not {_show(draft.for_ms)}"))
        elif window is not None and window.kind is not None:
            step = evaluation_interval_ms(window.kind, window.size_ms, window.hop_ms)
            if draft.for_ms % step:
                problems.append(
                    (
                        ("for",),
                        f"{_show(draft.for_ms)} is not a multiple of the evaluation interval "
                        f"{_show(step)} of window {draft.window!r}; Grafana counts the pending "
                        f"period in evaluations (use {_show(-(-draft.for_ms // step) * step)})",
                    )
                )

    if draft.tags is not None:
        group_by: list[str] | None = None
        if window is not None and window.group_by is not None:
            group_by = [t for t in window.group_by if t is not None]
        elif window is not None and "group_by" not in window.given:
            group_by = []  # the default: every tag aggregated away
        for tag, value in draft.tags.items():
            if problem := tag_problem(tag):
                problems.append((("tags", tag), problem))
            elif group_by is not None and tag not in group_by:
                kept = ", ".join(group_by) if group_by else "none"
                problems.append(
                    (
                        ("tags", tag),
                        f"window {draft.window!r} does not keep tag {tag!r} (group_by: {kept}); "
                        "the filter would match nothing",
                    )
                )
            if not value:
                problems.append((("tags", tag), "an empty value matches no series"))

    if draft.labels is not None:
        for label in draft.labels:
            if not _LABEL_NAME.fullmatch(label) or label.startswith("__"):
                problems.append(
                    (
                        ("labels", label),
                        f"{label!r} is not a label name; letters, digits and _, not starting "
                        "with a digit or __",
                    )
                )
    return problems


def kll_problem(aggregate: str, window: str | None, rank_error: float | None) -> str:
    """Why an alert cannot watch ``aggregate`` (p99, p999) of a ``quantiles: kll`` window."""
    error = rank_error if rank_error is not None else kll_error(DEFAULT_KLL_K)
    q = PERCENTILES.get(aggregate, 0.99)
    low, high = max(q - error, 0.0), min(q + error, 1.0)
    return (
        f"window {window!r} computes percentiles with KLL (quantiles: kll), whose rank error "
        f"is ±{error * 100:.3g} %: its {aggregate} could be anywhere between "
        f"p{low * 100:.4g} and p{high * 100:.4g}, so it stores none (nor histogram rows); "
        "alert on p50 or p90, or use quantiles: tdigest for this window"
    )


#: The keys of the ``sketches:`` section, in the order they are documented and printed.
SKETCH_KEYS: tuple[str, ...] = ("distinct_error", "quantile_error", "value_range")


@dataclass(frozen=True, kw_only=True)
class SketchTargets:
    """The ``sketches:`` section as written: error targets, ``None`` where the default applies.

    Like the drafts, it does not check itself: ``PipelineConfig`` checks it with
    ``sketch_problems`` and compiles it (``compile``) into the ``SketchParams`` the ingest
    tier and the window job build sketches with. Numbers are stored as floats, so
    ``quantile_error: 1`` and ``1.0`` are the same target.
    """

    distinct_error: float | None = None
    quantile_error: float | None = None
    value_range: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        for key in ("distinct_error", "quantile_error"):
            value = getattr(self, key)
            if isinstance(value, int) and not isinstance(value, bool):
                object.__setattr__(self, key, float(value))
        if isinstance(self.value_range, Sequence) and not isinstance(self.value_range, str):
            object.__setattr__(
                self,
                "value_range",
                tuple(
                    float(v) if isinstance(v, int) and not isinstance(v, bool) else v
                    for v in self.value_range
                ),
            )

    @property
    def is_set(self) -> bool:
        """Whether any target was given (an empty ``sketches: {}`` sets none)."""
        return any(getattr(self, key) is not None for key in SKETCH_KEYS)

    def compile(self) -> SketchParams:
        """The sketch parameters meeting these targets; ``ValueError`` if they are impossible."""
        return _compile_targets(self)

    def to_canonical_dict(self) -> dict[str, object]:
        """The targets that were set, in the YAML's keys (unset ones stay unset: a default is
        not a target, and spelling one out would change what the config says)."""
        out: dict[str, object] = {}
        if self.distinct_error is not None:
            out["distinct_error"] = _yaml_number(self.distinct_error)
        if self.quantile_error is not None:
            out["quantile_error"] = _yaml_number(self.quantile_error)
        if self.value_range is not None:
            out["value_range"] = [_yaml_number(v) for v in self.value_range]
        return out


def _yaml_number(value: float) -> float | int:
    """``60000.0`` -> ``60000``: the number as a user would write it (it loads back equal)."""
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


@functools.lru_cache(maxsize=64)
def _compile_targets(targets: SketchTargets) -> SketchParams:
    return compile_accuracy(targets.distinct_error, targets.quantile_error, targets.value_range)


def _show_target(value: object) -> str:
    """A target as the YAML spells it: ``2``, ``0.0001``, ``[5, 1]``."""
    if isinstance(value, float):
        return format_threshold(value)
    if isinstance(value, tuple):
        return f"[{', '.join(_show_target(v) for v in value)}]"
    return repr(value)


def _sketch_message(key: str, value: object, message: str) -> str:
    """``compile_accuracy``'s sentence with its ``key=value`` opening in the YAML's spelling:
    the location already names the key."""
    prefix = f"{key}={value!r}"
    if message.startswith(prefix):
        return _show_target(value) + message[len(prefix) :]
    return message


def sketch_problems(targets: SketchTargets) -> list[Problem]:
    """Every target that cannot be met (or is not a target at all), located under ``sketches``.

    Each key is compiled on its own, so ``distinct_error: 0.0001`` and ``quantile_error: 2``
    are both reported; ``value_range`` is checked with the ``quantile_error`` it goes with
    (the HDR digits decide how far it may span), or with the default if that one is bad.
    """
    problems: list[Problem] = []
    usable_quantile: float | None = None
    for key in ("distinct_error", "quantile_error"):
        value = getattr(targets, key)
        if value is None:
            continue
        try:
            if key == "distinct_error":
                compile_accuracy(distinct_error=value)
            else:
                compile_accuracy(quantile_error=value)
        except ValueError as exc:
            problems.append((("sketches", key), _sketch_message(key, value, str(exc))))
        else:
            if key == "quantile_error":
                usable_quantile = value
    value_range = targets.value_range
    if value_range is not None:
        if not (
            isinstance(value_range, tuple)
            and len(value_range) == 2
            and all(isinstance(v, float) for v in value_range)
        ):
            problems.append(
                (
                    ("sketches", "value_range"),
                    f"must be [low, high], two numbers like [0.1, 60000], not {value_range!r}",
                )
            )
        else:
            try:
                compile_accuracy(quantile_error=usable_quantile, value_range=value_range)
            except ValueError as exc:
                message = _sketch_message("value_range", value_range, str(exc))
                problems.append((("sketches", "value_range"), message))
    return problems


def sketch_warnings(params: SketchParams) -> tuple[str, ...]:
    """``params.warnings`` located like errors: ``sketches.distinct_error: 0.005 needs ...``."""
    located = []
    for warning in params.warnings:
        key, _, rest = warning.partition("=")
        if key in SKETCH_KEYS:
            located.append(f"sketches.{key}: {rest}")
        else:
            located.append(f"sketches: {warning}")
    return tuple(located)


def describe_sketches(params: SketchParams, kll_windows: Sequence[str] = ()) -> list[str]:
    """What the compiled sketches are and the error they buy, one line each (for ``validate``).

    ``kll_windows``: the names of the ``quantiles: kll`` windows (the KLL lines only show then).
    """
    low, high = (format_threshold(v) for v in params.value_range)
    kll_lines = []
    if kll_windows:
        error = params.kll_rank_error * 100
        kll_lines = [
            f"  timers in {', '.join(kll_windows)} (quantiles: kll): KLL k {params.kll_k}, "
            f"~{-(-KLL_BYTES_PER_K * params.kll_k // 1024)} KiB, instead of the t-digest;",
            f"    rank error ±{error:.3g} % at any quantile (99 % confidence): p50 is a value "
            f"between p{50 - error:.4g} and p{50 + error:.4g}, p90 between p{90 - error:.4g} "
            f"and p{90 + error:.4g};",
            f"    p99 and p999 not stored (a p99 would be anywhere in p{99 - error:.4g}.."
            f"p{min(99 + error, 100):.4g})",
        ]
    return [
        "sketches, compiled (what the targets cost per series and window):",
        f"  sets: HLL lgK {params.hll_lg_k}, up to {2**params.hll_lg_k // 1024} KiB; distinct "
        f"counts within ±{params.distinct_error * 100:.3g} % (2 sigma, any union)",
        f"  timers: t-digest k {params.tdigest_k}, ~{19 * params.tdigest_k // 1024} KiB; rank "
        f"error ≤ {params.quantile_rank_error:g} for p50..p90 (p99 and above far smaller)",
        f"  timers: HDR histogram, {params.hdr_significant_digits} significant digits; quantile "
        f"values within ±{params.hdr_relative_error * 100:g} % for values in [{low}, {high}] "
        f"(outside: clamped and counted; scale {params.value_scale:g}, "
        f"highest {params.hdr_highest})",
        *kll_lines,
    ]


def _targets_for(params: SketchParams) -> SketchTargets:
    """Targets that compile to ``params``' choices, for params built in Python without any."""
    default = compile_accuracy()
    quantile_choice = (params.tdigest_k, params.hdr_significant_digits, params.kll_k)
    # Each choice is made for a range of targets (t-digest k: [its error, the next smaller
    # k's), HDR digits: [10^-d, 10^-(d-1)), KLL k: [kll_error(k), kll_error(k - 1))); a
    # target all three were compiled from lies in each range, so the largest lower end does.
    return SketchTargets(
        distinct_error=None if params.hll_lg_k == default.hll_lg_k else params.distinct_error,
        quantile_error=None
        if quantile_choice == (default.tdigest_k, default.hdr_significant_digits, default.kll_k)
        else max(params.quantile_rank_error, params.hdr_relative_error, params.kll_rank_error),
        value_range=None if params.value_range == default.value_range else params.value_range,
    )


def config_problems(
    *,
    given: Collection[str],
    name: str | None,
    pane_ms: int | None,
    windows: Sequence[WindowDraft | None] | None,
    alerts: Sequence[AlertDraft | None] | None = None,
    sketches: SketchTargets | None = None,
) -> list[Problem]:
    """Every rule a whole config breaks, windows and alerts included, with locations from the root.

    A ``None`` in ``windows`` or ``alerts`` is an entry that could not be read at all (already
    reported); it still holds its index so that later paths stay right.
    """
    problems = _config_and_window_problems(given=given, name=name, pane_ms=pane_ms, windows=windows)
    if sketches is not None:
        problems += sketch_problems(sketches)
    if alerts is None:
        return problems
    by_name: dict[str, WindowDraft] | None = None
    if windows is not None and all(w is not None for w in windows):
        by_name = {}
        for draft in windows:
            if draft is not None and draft.name is not None:
                by_name.setdefault(draft.name, draft)
    first_seen: dict[str, int] = {}
    kll_rank_error: float | None = None
    if sketches is not None and sketches.quantile_error is not None:
        # An impossible target is reported by sketch_problems; the default k's error meanwhile.
        with contextlib.suppress(ValueError):
            kll_rank_error = sketches.compile().kll_rank_error
    for index, alert in enumerate(alerts):
        if alert is None:
            continue
        for loc, message in alert_problems(alert, by_name, kll_rank_error):
            problems.append((("alerts", index, *loc), message))
        if alert.name is None:
            continue
        if alert.name in first_seen:
            problems.append(
                (
                    ("alerts", index, "name"),
                    f"duplicate alert name {alert.name!r} (already used by "
                    f"alerts[{first_seen[alert.name]}])",
                )
            )
        else:
            first_seen[alert.name] = index
    return problems


def _config_and_window_problems(
    *,
    given: Collection[str],
    name: str | None,
    pane_ms: int | None,
    windows: Sequence[WindowDraft | None] | None,
) -> list[Problem]:
    problems: list[Problem] = []
    if name is not None and (problem := name_problem(name)):
        problems.append((("name",), problem))
    if pane_ms is not None and pane_ms <= 0:
        problems.append((("pane",), f"must be greater than 0, not {_show(pane_ms)}"))
        pane_ms = None

    if windows is None:
        if "windows" not in given:
            problems.append((("windows",), "required; a config needs at least one window"))
        return problems
    if not windows:
        problems.append((("windows",), "no windows; a config needs at least one window"))

    first_seen: dict[str, int] = {}
    for index, draft in enumerate(windows):
        if draft is None:
            continue
        for loc, message in window_problems(draft, pane_ms):
            problems.append((("windows", index, *loc), message))
        if draft.name is None:
            continue
        if draft.name in first_seen:
            problems.append(
                (
                    ("windows", index, "name"),
                    f"duplicate window name {draft.name!r} (already used by "
                    f"windows[{first_seen[draft.name]}])",
                )
            )
        else:
            first_seen[draft.name] = index
    return problems


def _raise_problems(what: str, problems: list[Problem]) -> None:
    if problems:
        details = "; ".join(f"{format_path(loc)}: {message}" for loc, message in problems)
        raise ValueError(f"invalid {what}: {details}")


@functools.lru_cache(maxsize=1024)
def _glob_pattern(globs: tuple[str, ...]) -> re.Pattern[str]:
    """One regex for all globs: ``matches`` runs once per metric name on the hot path."""
    return re.compile("|".join(f"(?:{fnmatch.translate(glob)})" for glob in globs))


@dataclass(frozen=True, kw_only=True)
class WindowSpec:
    """One window definition, canonical and valid.

    Canonical means one spelling per window shape: a hopping window whose hop equals its size
    is stored as the tumbling window it is, so the job runs the cheaper operator and two
    configs that mean the same compare equal. Only the keys of its kind are set: ``size_ms``
    for tumbling, hopping and sliding; ``hop_ms`` for hopping; ``gap_ms`` and ``key`` for
    session; ``offset_ms`` is 0 except on tumbling windows.
    """

    name: str
    kind: WindowKind
    size_ms: int | None = None
    hop_ms: int | None = None
    offset_ms: int = 0
    gap_ms: int | None = None
    key: str | None = None
    watermark_delay_ms: int = DEFAULT_WATERMARK_DELAY_MS
    allowed_lateness_ms: int = DEFAULT_ALLOWED_LATENESS_MS
    metrics: tuple[str, ...] = DEFAULT_METRICS
    group_by: tuple[str, ...] = ()
    quantiles: QuantileSketch = "tdigest"
    early_every_ms: int | None = None
    """Publish the open window's running value every this much watermark progress (event
    time) before its end; None: first emission when the watermark passes the end."""

    def __post_init__(self) -> None:
        if self.quantiles not in QUANTILE_SKETCHES:
            raise ValueError(
                f"invalid window {self.name!r}: quantiles: {self.quantiles!r} is not one of "
                f"{', '.join(QUANTILE_SKETCHES)}"
            )
        if self.kind not in WINDOW_KINDS:
            raise ValueError(
                f"invalid window {self.name!r}: kind: {self.kind!r} is not one of "
                f"{', '.join(WINDOW_KINDS)}"
            )
        # Lists passed from Python would make the spec unhashable and mutable behind its back.
        object.__setattr__(self, "metrics", tuple(self.metrics))
        object.__setattr__(self, "group_by", tuple(self.group_by))
        _raise_problems(f"window {self.name!r}", window_problems(self.draft(), pane_ms=None))
        if self.kind == "hopping" and self.hop_ms == self.size_ms:
            object.__setattr__(self, "kind", "tumbling")
            object.__setattr__(self, "hop_ms", None)

    def draft(self) -> WindowDraft:
        """This spec as the rules see it, so ``PipelineConfig`` can check it against its pane."""
        given = {"name", "kind", "watermark_delay", "allowed_lateness", "metrics", "group_by"}
        given.update(
            key
            for key, value in (
                ("size", self.size_ms),
                ("hop", self.hop_ms),
                ("gap", self.gap_ms),
                ("key", self.key),
            )
            if value is not None
        )
        if self.offset_ms != 0:
            given.add("offset")
        if self.quantiles != "tdigest":
            given.add("quantiles")
        if self.early_every_ms is not None:
            given.add("early_every")
        return WindowDraft(
            given=frozenset(given),
            name=self.name,
            kind=self.kind,
            size_ms=self.size_ms,
            hop_ms=self.hop_ms,
            offset_ms=self.offset_ms,
            gap_ms=self.gap_ms,
            key=self.key,
            watermark_delay_ms=self.watermark_delay_ms,
            allowed_lateness_ms=self.allowed_lateness_ms,
            metrics=self.metrics,
            group_by=self.group_by,
            quantiles=self.quantiles,
            early_every_ms=self.early_every_ms,
        )

    @property
    def uses_kll(self) -> bool:
        """Whether this window's timers, histograms and distributions go through KLL."""
        return self.quantiles == "kll"

    def matches(self, metric: str) -> bool:
        """Whether ``metric`` falls in this window's ``metrics`` globs.

        Case-sensitive on every platform (``fnmatchcase``): StatsD metric names are, and a
        config must select the same series on a laptop as on the cluster.
        """
        if self.metrics == DEFAULT_METRICS:
            return True
        return _glob_pattern(self.metrics).match(metric) is not None

    def to_canonical_dict(self) -> dict[str, object]:
        """The effective window with every default spelled out, in the YAML's own keys."""
        out: dict[str, object] = {"name": self.name, "kind": self.kind}
        if self.size_ms is not None:
            out["size"] = format_duration_ms(self.size_ms)
        if self.hop_ms is not None:
            out["hop"] = format_duration_ms(self.hop_ms)
        if self.kind == "tumbling":
            out["offset"] = format_duration_ms(self.offset_ms)
        if self.gap_ms is not None:
            out["gap"] = format_duration_ms(self.gap_ms)
        if self.key is not None:
            out["key"] = self.key
        out["watermark_delay"] = format_duration_ms(self.watermark_delay_ms)
        out["allowed_lateness"] = format_duration_ms(self.allowed_lateness_ms)
        out["metrics"] = list(self.metrics)
        out["group_by"] = list(self.group_by)
        if self.kind in QUANTILE_KINDS:
            out["quantiles"] = self.quantiles
        if self.early_every_ms is not None:
            out["early_every"] = format_duration_ms(self.early_every_ms)
        return out


@dataclass(frozen=True, kw_only=True)
class AlertSpec:
    """One alert rule: "``aggregate`` of ``metric`` in window ``window`` ``op`` ``threshold``".

    ``tags`` filters series by equality on their (group_by) tags; ``labels`` and
    ``annotations`` go to the Grafana rule as they are. Mappings are stored as sorted tuples of
    pairs so the spec stays hashable and compares equal however the YAML ordered them.
    """

    name: str
    window: str
    metric: str
    aggregate: AlertAggregate
    op: Comparison
    threshold: float
    for_ms: int = 0
    tags: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    annotations: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for key in ("tags", "labels", "annotations"):
            value = getattr(self, key)
            pairs = value.items() if isinstance(value, Mapping) else value
            object.__setattr__(self, key, tuple(sorted((str(k), str(v)) for k, v in pairs)))
        object.__setattr__(self, "threshold", float(self.threshold))
        _raise_problems(f"alert {self.name!r}", alert_problems(self.draft(), windows=None))

    @property
    def condition(self) -> str:
        return f"{self.op} {format_threshold(self.threshold)}"

    def draft(self) -> AlertDraft:
        return AlertDraft(
            given=frozenset({"name", "window", "metric", "aggregate", "condition", "for"}),
            name=self.name,
            window=self.window,
            metric=self.metric,
            aggregate=self.aggregate,
            condition=self.condition,
            for_ms=self.for_ms,
            tags=dict(self.tags),
            labels=dict(self.labels),
            annotations=dict(self.annotations),
        )

    def to_canonical_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "name": self.name,
            "window": self.window,
            "metric": self.metric,
            "aggregate": self.aggregate,
            "condition": self.condition,
            "for": format_duration_ms(self.for_ms),
        }
        for key in ("tags", "labels", "annotations"):
            out[key] = dict(getattr(self, key))
        return out


@dataclass(frozen=True, kw_only=True)
class PipelineConfig:
    """A whole config file: its name (stored with every result row), pane, windows, alerts,
    and the accuracy of its sketches.

    ``sketch_targets`` is the ``sketches:`` section as written; ``sketches`` is what it
    compiles to, the parameters every receiver and the window job build sketches with. Give
    either: targets are compiled here; parameters given alone (``compile_accuracy(...)`` from
    Python) are stored with targets that compile back to the same choices, so that
    ``to_canonical_dict`` can always print them.
    """

    name: str
    pane_ms: int = DEFAULT_PANE_MS
    windows: tuple[WindowSpec, ...]
    alerts: tuple[AlertSpec, ...] = ()
    sketches: SketchParams = field(default_factory=compile_accuracy)
    sketch_targets: SketchTargets = field(default_factory=SketchTargets)

    def __post_init__(self) -> None:
        object.__setattr__(self, "windows", tuple(self.windows))
        object.__setattr__(self, "alerts", tuple(self.alerts))
        _raise_problems(
            f"config {self.name!r}",
            config_problems(
                given={"name", "pane", "windows", "alerts"},
                name=self.name,
                pane_ms=self.pane_ms,
                windows=[window.draft() for window in self.windows],
                alerts=[alert.draft() for alert in self.alerts],
                sketches=self.sketch_targets,
            ),
        )
        compiled = self.sketch_targets.compile()
        if self.sketches == compiled:
            return
        default = compile_accuracy()
        if self.sketch_targets.is_set:
            if self.sketches != default:  # both given, and they disagree
                message = (
                    f"invalid config {self.name!r}: sketches: {self.sketches} is not what "
                    f"sketch_targets compiles to ({compiled}); give one of them (to change a "
                    "config's targets with dataclasses.replace, pass sketches=compile_accuracy() "
                    "along)"
                )
                raise ValueError(message)
        else:
            targets = _targets_for(self.sketches)
            compiled = targets.compile()
            if replace(compiled, warnings=()) != replace(self.sketches, warnings=()):
                message = (
                    f"invalid config {self.name!r}: sketches: {self.sketches} is not what any "
                    "sketches: section compiles to; build it with compile_accuracy()"
                )
                raise ValueError(message)
            object.__setattr__(self, "sketch_targets", targets)
        object.__setattr__(self, "sketches", compiled)

    @property
    def warnings(self) -> tuple[str, ...]:
        """Expensive choices the config makes, located like errors (``validate`` shows them)."""
        warnings = sketch_warnings(self.sketches)
        kll_bytes = KLL_BYTES_PER_K * self.sketches.kll_k
        if self.kll_k is not None and kll_bytes > _EXPENSIVE_KLL_BYTES:
            warnings += (
                f"sketches.quantile_error: {self.sketch_targets.quantile_error} needs KLL k "
                f"{self.sketches.kll_k} in the quantiles: kll windows: "
                f"about {kll_bytes // 1024} KiB per timer series per window",
            )
        return warnings

    @property
    def kll_windows(self) -> tuple[str, ...]:
        """The names of the windows with ``quantiles: kll``."""
        return tuple(window.name for window in self.windows if window.uses_kll)

    @property
    def kll_k(self) -> int | None:
        """The k of the KLL sketch every timer/histogram/distribution pane partial carries, or
        ``None`` when no window reads one (ingest then builds none: it costs drain time)."""
        return self.sketches.kll_k if self.kll_windows else None

    def evaluation_interval_ms(self, window_name: str) -> int:
        """The rule-group interval for alerts on ``window_name`` (a multiple of 10 s)."""
        window = self.window(window_name)
        return evaluation_interval_ms(window.kind, window.size_ms, window.hop_ms)

    def window(self, name: str) -> WindowSpec:
        """The window called ``name``; ``KeyError`` naming the ones that exist otherwise."""
        for window in self.windows:
            if window.name == name:
                return window
        known = ", ".join(window.name for window in self.windows)
        raise KeyError(f"config {self.name!r} has no window {name!r} (windows: {known})")

    def to_canonical_dict(self) -> dict[str, object]:
        """The effective config, defaults included; loading its YAML gives an equal config."""
        out: dict[str, object] = {"name": self.name, "pane": format_duration_ms(self.pane_ms)}
        if self.sketch_targets.is_set:  # only what the config set: defaults are not targets
            out["sketches"] = self.sketch_targets.to_canonical_dict()
        out["windows"] = [window.to_canonical_dict() for window in self.windows]
        if self.alerts:  # no alerts: print nothing rather than an empty list to wonder about
            out["alerts"] = [alert.to_canonical_dict() for alert in self.alerts]
        return out
