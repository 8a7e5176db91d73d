"""The StatsD / DogStatsD line protocol: one datagram in, samples and counted rejects out.

A datagram holds one or more lines separated by ``\\n`` (``\\r\\n`` tolerated). Three kinds of
line::

    name:value[:value...]|type[|@rate][|#tag:value,tag2][|T<unix seconds>][|c:<container>]
    name:member|s
    _e{<title bytes>,<text bytes>}:title|text[|d:ts][|h:host][|k:key][|p:prio][|s:src]
        [|t:alert][|#tags]
    _sc|name|status[|d:ts][|h:host][|#tags][|m:message]

Where StatsD peers disagree, this parser reads a line as the Datadog agent's DogStatsD parser
does (``docs/conformance.md`` lists the differences that remain):

- the name ends at the line's first ``:``. A set's member is everything from there to the first
  ``|``, colons included (``users:user:42|s`` is the one member ``user:42``); any other type
  splits that text at each ``:`` into several values and skips empty ones (``d:1::2:|d`` is
  ``1`` and ``2``);
- an empty entry in a tag list is skipped (``#,k:v``, ``#k:v,``, ``#a,,b``);
- a field this parser does not know (``|f:future``, ``|zz``) is ignored, and the line counted
  under the adjustment ``unknown_field``; DogStatsD ``|e:<external data>`` and
  ``|card:<cardinality>`` are known and ignored, uncounted;
- ``@rate`` scales a counter's value by ``1 / rate``, and a timer, histogram or distribution
  value stands for ``1 / rate`` values, truncated to a whole number (``sample_weight``):
  ``lat:5|h|@0.5`` is two values of 5, ``lat:5|h|@0.3`` three. Gauges and sets ignore it.

A bad line is never an exception that reaches the receiver loop: it becomes a ``Reject`` with
a stable reason from ``REJECT_REASONS`` so that it can be counted and sampled, and the rest of
the datagram is still parsed. Every non-empty line ends up as exactly one of: a metric line
(its samples), an event, a service check, or a reject — ``ParseResult.accounted()`` is always
``lines``.

The parser is clock-free: a ``|T`` timestamp is carried on the sample as ``timestamp_ms`` and
the receiver decides whether it is within the allowed skew of its receive clock.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

#: The metric types this build aggregates (all StatsD/DogStatsD ones). ``unsupported_type``
#: stays a reason name for a type known but not aggregated, should one be added.
SUPPORTED_TYPES = frozenset({"c", "g", "ms", "h", "d", "s"})
KNOWN_TYPES = SUPPORTED_TYPES

#: Every reason a line can be rejected for. Stable names: they are self-metric tag values.
REJECT_REASONS = (
    "malformed_line",
    "line_too_long",
    "invalid_name",
    "unknown_type",
    "unsupported_type",
    "invalid_value",
    "nan_value",
    "invalid_sample_rate",
    "invalid_timestamp",
    "too_many_tags",
    "invalid_tag",
    "invalid_event",
    "invalid_service_check",
    "type_conflict",
)

#: Counted, but the line is still aggregated (in an adjusted form): not rejects. A line with
#: a ``|T`` too far from the receive clock is stamped with the receive time instead; a line of
#: a new series beyond the cardinality limit is folded into the metric's overflow series; a
#: line with fields this parser does not know is kept without them.
ADJUSTMENT_REASONS = ("timestamp_out_of_range", "cardinality_limited", "unknown_field")

#: Types whose sampled values are weighted: one value sent at ``@rate`` stands for ``1 / rate``
#: values in the count, the sum and every sketch (counters scale the value itself instead).
WEIGHTED_TYPES = frozenset({"ms", "h", "d"})

#: The most values one sample stands for. ``@1e-300`` is a valid rate whose ``1 / rate``
#: overflows an int64 count after a few lines (``@5e-324``: infinity): capped here, a window's
#: count stays exact in int64 for 2**32 such lines.
MAX_SAMPLE_WEIGHT = 1 << 31

_NAME_RE = re.compile(r"[A-Za-z0-9_.\-/]+", re.ASCII)
_TAG_KEY_RE = re.compile(r"[A-Za-z0-9_.\-/]+", re.ASCII)
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")
# Plain decimal numbers only: float() would also take "1_000", " 1", "٣" and "0x" forms.
_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?", re.ASCII)
_NOT_FINITE = frozenset({"nan", "inf", "infinity"})
_TIMESTAMP_RE = re.compile(r"\d{1,12}", re.ASCII)
_EVENT_HEADER_RE = re.compile(rb"_e\{(\d{1,5}),(\d{1,6})\}")
_EVENT_PRIORITIES = frozenset({"normal", "low"})
_EVENT_ALERT_TYPES = frozenset({"error", "warning", "info", "success"})
_SERVICE_CHECK_STATUSES = {"0": 0, "1": 1, "2": 2, "3": 3}  # ok, warning, critical, unknown
#: DogStatsD 1.3 fields this build accepts and ignores (origin data for the Datadog agent).
_IGNORED_FIELD_PREFIXES = ("e:", "card:")

Tags = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class ProtocolLimits:
    """Guards against hostile or broken clients; each breach is a counted reject."""

    max_line_bytes: int = 4096
    max_tags: int = 64
    max_name_bytes: int = 250
    max_tag_bytes: int = 200  # one tag, "key:value"

    def __post_init__(self) -> None:
        for name in ("max_line_bytes", "max_tags", "max_name_bytes", "max_tag_bytes"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"ProtocolLimits.{name} must be positive, got {value}")


DEFAULT_LIMITS = ProtocolLimits()


@dataclass(frozen=True, slots=True)
class Sample:
    """One parsed value. ``delta`` marks a gauge ``+N``/``-N`` (relative to the current value);
    ``timestamp_ms`` is the client's ``|T`` (whole seconds, as milliseconds), if it sent one."""

    metric: str
    metric_type: str
    value: float
    sample_rate: float
    tags: Tags
    delta: bool = False
    timestamp_ms: int | None = None
    member: str = ""
    """Sets (``s``): the member, as sent (``value`` is 1.0)."""
    unknown_fields: int = 0
    """Fields of the line this parser does not know, ignored: the receiver counts the line as
    ``adjusted{unknown_field}`` once it aggregates it (a line it rejects is not adjusted)."""


@dataclass(frozen=True, slots=True)
class Event:
    """A DogStatsD event (``_e{..}``): parsed and counted; storing them is a later option."""

    title: str
    text: str
    timestamp_ms: int | None = None
    hostname: str = ""
    aggregation_key: str = ""
    priority: str = "normal"
    source_type: str = ""
    alert_type: str = "info"
    tags: Tags = ()
    unknown_fields: int = 0  # fields this parser does not know, ignored (``Sample``'s)


@dataclass(frozen=True, slots=True)
class ServiceCheck:
    """A DogStatsD service check (``_sc|``): parsed and counted."""

    name: str
    status: int
    timestamp_ms: int | None = None
    hostname: str = ""
    tags: Tags = ()
    message: str = ""
    unknown_fields: int = 0  # fields this parser does not know, ignored (``Sample``'s)


@dataclass(frozen=True, slots=True)
class Reject:
    """A line that was not aggregated, with the reason it is counted under."""

    reason: str
    line: bytes


@dataclass(slots=True)
class ParseResult:
    """What one or more datagrams held, line by line."""

    #: One entry per accepted metric line: the raw line and its samples (one per value).
    metric_lines: list[tuple[bytes, list[Sample]]] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    service_checks: list[ServiceCheck] = field(default_factory=list)
    lines: int = 0
    #: (reason, line) of the events and service checks above that were accepted in an
    #: adjusted form (``unknown_field``): counted on top of them. A metric line's adjustment
    #: rides on its samples instead (``Sample.unknown_fields``): the receiver may still reject
    #: the line (``type_conflict``), and then it is no adjusted line.
    adjusted: list[tuple[str, bytes]] = field(default_factory=list)
    #: Where each metric line, reject, event and service check above was in the datagram:
    #: its index among the datagram's ``\n``-separated lines (empty ones included), so that
    #: a receiver can tell which sender's datagram it came from (``clients.py``).
    metric_positions: list[int] = field(default_factory=list)
    reject_positions: list[int] = field(default_factory=list)
    event_positions: list[int] = field(default_factory=list)
    service_check_positions: list[int] = field(default_factory=list)

    @property
    def samples(self) -> list[Sample]:
        return [sample for _, samples in self.metric_lines for sample in samples]

    def accounted(self) -> int:
        """Lines that ended up somewhere; equals ``lines`` (the accounting invariant)."""
        return (
            len(self.metric_lines) + len(self.rejects) + len(self.events)
            + len(self.service_checks)
        )


def parse_datagram(
    datagram: bytes, limits: ProtocolLimits = DEFAULT_LIMITS, into: ParseResult | None = None
) -> ParseResult:
    """Parse every line of one datagram; bad lines become rejects, good ones samples."""
    result = into if into is not None else ParseResult()
    for position, raw in enumerate(datagram.split(b"\n")):
        line = raw.rstrip(b"\r")
        if not line:
            continue
        result.lines += 1
        # "x:1|c" followed by 5000 bytes of tags: refused before any decoding or splitting
        if len(line) > limits.max_line_bytes:
            result.rejects.append(Reject("line_too_long", line[:256]))
            result.reject_positions.append(position)
            continue
        outcome = parse_line(line, limits)
        if isinstance(outcome, list):
            result.metric_lines.append((line, outcome))
            result.metric_positions.append(position)
        elif isinstance(outcome, Reject):
            result.rejects.append(outcome)
            result.reject_positions.append(position)
        elif isinstance(outcome, Event):
            result.events.append(outcome)
            result.event_positions.append(position)
            if outcome.unknown_fields:
                result.adjusted.append(("unknown_field", line))
        else:
            result.service_checks.append(outcome)
            result.service_check_positions.append(position)
            if outcome.unknown_fields:
                result.adjusted.append(("unknown_field", line))
    return result


def parse_line(
    line: bytes, limits: ProtocolLimits = DEFAULT_LIMITS
) -> list[Sample] | Event | ServiceCheck | Reject:
    """Parse one line (without its newline) into one sample per value, an event, a service
    check, or a reject."""
    if line.startswith(b"_e{"):
        return _parse_event(line, limits)
    if line.startswith(b"_sc|"):
        return _parse_service_check(line, limits)
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        # b"\xff\xfe:1|c": not UTF-8
        return Reject("malformed_line", line)
    name, colon, rest = text.partition(":")
    # "foo|c" and ":1|c": no name/value separator, or nothing before it
    if not colon or not name:
        return Reject("malformed_line", line)
    # "bad name:1|c", "é:1|c", 300 × "a" + ":1|c": names are short, printable ASCII
    if len(name) > limits.max_name_bytes or not _NAME_RE.fullmatch(name):
        return Reject("invalid_name", line)
    fields = rest.split("|")
    # "foo:1" and "foo:1||": a value without a type
    if len(fields) < 2 or not fields[1]:
        return Reject("malformed_line", line)
    metric_type = fields[1]
    # "x:1|q"
    if metric_type not in KNOWN_TYPES:
        return Reject("unknown_type", line)

    sample_rate = 1.0
    tags: Tags = ()
    container = ""
    timestamp_ms: int | None = None
    unknown = 0
    for extra in fields[2:]:
        if extra.startswith("@"):
            # "x:1|c|@fast", "x:1|c|@ 0.5"
            if not _NUMBER_RE.fullmatch(extra[1:]):
                return Reject("invalid_sample_rate", line)
            sample_rate = float(extra[1:])
            # "x:1|c|@0", "x:1|c|@1.5": a rate must be in (0, 1]
            if not 0.0 < sample_rate <= 1.0:
                return Reject("invalid_sample_rate", line)
        elif extra.startswith("#"):
            parsed_tags = _parse_tags(extra[1:], limits)
            if isinstance(parsed_tags, str):
                return Reject(parsed_tags, line)
            tags = parsed_tags
        elif extra.startswith("T"):
            # "x:1|c|T", "x:1|c|T-5", "x:1|c|T17e8": whole unix seconds only
            if not _TIMESTAMP_RE.fullmatch(extra[1:]):
                return Reject("invalid_timestamp", line)
            timestamp_ms = int(extra[1:]) * 1000
        elif extra.startswith("c:"):
            # "x:1|c|c:ab\x01c": the container id becomes a tag value
            if not _tag_value_ok(extra[2:], limits):
                return Reject("invalid_tag", line)
            container = extra[2:]
        elif extra == "" or extra.startswith(_IGNORED_FIELD_PREFIXES):
            continue
        else:
            # "x:1|c|f:future", "x:1|c|zzz": a field this parser does not know. The Datadog
            # agent ignores it (a newer client's extension); so does this parser, counting it.
            unknown += 1
    if container:
        # An explicit "#container:x" tag wins over the origin-detected "|c:" id.
        tag_map = dict(tags)
        tag_map.setdefault("container", container)
        tags = tuple(sorted(tag_map.items()))

    if metric_type == "s":
        member = fields[0]
        # "users:|s", "users:a\x01|s": a set member is any non-empty printable string. It is
        # one member even with colons in it ("users:user:42|s", "peers:2001:db8::1|s"): sets
        # take no multi-value list, as in the Datadog agent.
        if not member or not _tag_value_ok(member, limits):
            return Reject("invalid_value", line)
        return [Sample(name, "s", 1.0, sample_rate, tags, False, timestamp_ms, member, unknown)]
    samples: list[Sample] = []
    for value_text in fields[0].split(":"):
        # "d:1:2:|d", "d:1::2|d": an empty item of a multi-value list is skipped (no value
        # was sent), as the Datadog agent does; "x:|c" and "d::|d" hold none: rejected below.
        if not value_text:
            continue
        value = _parse_value(value_text)
        if isinstance(value, str):
            return Reject(value, line)
        delta = metric_type == "g" and value_text[:1] in ("+", "-")
        samples.append(
            Sample(name, metric_type, value, sample_rate, tags, delta, timestamp_ms, "", unknown)
        )
    if not samples:
        # "x:|c", "d::|d": no value at all
        return Reject("invalid_value", line)
    return samples


def sample_weight(metric_type: str, sample_rate: float) -> int:
    """How many values one sample of ``metric_type`` sent at ``sample_rate`` stands for.

    ``1 / rate`` truncated to an integer, at most ``MAX_SAMPLE_WEIGHT``, for timers,
    histograms and distributions (1 for every other type): the Datadog agent's
    ``int64(1 / rate)`` (``pkg/metrics/histogram.go`` ``addSample``; its distributions use the
    same truncated count, ``pkg/quantile/agent.go`` ``Insert``) and statsd_exporter's
    ``int(1 / samplingFactor)`` observations (``pkg/line/line.go``). A whole number, so the
    count, the HDR buckets and the t-digest's and KLL's weights all hold the same total. The
    compiled fast path (``fastpath._scan``) computes the same expression."""
    if metric_type not in WEIGHTED_TYPES:
        return 1
    inverse = 1.0 / sample_rate
    return int(inverse) if inverse < MAX_SAMPLE_WEIGHT else MAX_SAMPLE_WEIGHT


def _parse_value(text: str) -> float | str:
    """A finite float, or the reject reason."""
    if not _NUMBER_RE.fullmatch(text):
        # "x:nan|g", "x:-inf|ms" vs "x:abc|c", "x:|c", "x:1_000|c"
        return "nan_value" if text.lower().lstrip("+-") in _NOT_FINITE else "invalid_value"
    value = float(text)
    # "x:1e999|g": overflows to infinity
    if not math.isfinite(value):
        return "nan_value"
    return value


def _tag_value_ok(value: str, limits: ProtocolLimits) -> bool:
    return len(value) <= limits.max_tag_bytes and not _CONTROL_RE.search(value)


def _parse_tags(text: str, limits: ProtocolLimits) -> Tags | str:
    """``k:v,k2`` → sorted pairs (a bare tag gets an empty value); a reason string if bad.

    Empty entries are skipped: ``#,k:v`` and ``#k:v,`` (datadogpy given an empty tag),
    ``#a,,b``, ``#,``."""
    if not text:
        return ()
    parts = text.split(",")
    # "x:1|c|#t0:v,t1:v,...,t64:v" (empty entries not counted: they are no tags)
    if len(parts) > limits.max_tags and len(parts) - parts.count("") > limits.max_tags:
        return "too_many_tags"
    pairs: dict[str, str] = {}
    for part in parts:
        # "x:1|c|#,k:v", "x:1|c|#k:v,", "a:1|g|#f,,z": an empty entry is no tag
        if not part:
            continue
        key, _, value = part.partition(":")
        # "x:1|c|#:v", "x:1|c|#a,:v": a value with no key
        if not key:
            return "invalid_tag"
        # "x:1|c|#bad key:v", "x:1|c|#é:v": keys become column-like labels downstream
        if not _TAG_KEY_RE.fullmatch(key):
            return "invalid_tag"
        # "x:1|c|#k:a\x00b" (PostgreSQL jsonb refuses \u0000), or a 1 KB value
        if len(part) > limits.max_tag_bytes or _CONTROL_RE.search(value):
            return "invalid_tag"
        pairs[key] = value
    return tuple(sorted(pairs.items()))


def _parse_common_field(extra: str, limits: ProtocolLimits) -> tuple[str, object] | None:
    """Fields events and service checks share: ``d:`` ``h:`` ``#`` ``c:`` (and ignored ones).
    Returns (kind, value), ("bad", reason) for a broken one, or None if not a common field."""
    if extra.startswith("d:"):
        if not _TIMESTAMP_RE.fullmatch(extra[2:]):
            return ("bad", "timestamp")
        return ("d", int(extra[2:]) * 1000)
    if extra.startswith("h:"):
        return ("h", extra[2:]) if _tag_value_ok(extra[2:], limits) else ("bad", "hostname")
    if extra.startswith("#"):
        tags = _parse_tags(extra[1:], limits)
        return ("bad", tags) if isinstance(tags, str) else ("#", tags)
    if extra.startswith("c:"):
        return ("c", extra[2:]) if _tag_value_ok(extra[2:], limits) else ("bad", "container")
    if extra.startswith(_IGNORED_FIELD_PREFIXES):
        return ("ignored", None)
    return None


def _parse_event(line: bytes, limits: ProtocolLimits) -> Event | Reject:
    """``_e{title_len,text_len}:title|text|...``; the lengths are UTF-8 bytes."""
    header, colon, body = line.partition(b":")
    match = _EVENT_HEADER_RE.fullmatch(header)
    # "_e{5}:hello|x", "_e{a,b}:x|y", "_e{1,1}" (no body)
    if match is None or not colon:
        return Reject("invalid_event", line)
    title_len, text_len = int(match.group(1)), int(match.group(2))
    title_bytes = body[:title_len]
    separator = body[title_len : title_len + 1]
    text_bytes = body[title_len + 1 : title_len + 1 + text_len]
    rest = body[title_len + 1 + text_len :]
    # "_e{0,1}:|x" (no title), "_e{9,1}:ab|c" (lengths longer than the body),
    # "_e{1,1}:ab|c" (length cuts the title: no "|" where it should be)
    if (
        title_len == 0
        or len(title_bytes) != title_len
        or separator != b"|"
        or len(text_bytes) != text_len
        or (rest and not rest.startswith(b"|"))
    ):
        return Reject("invalid_event", line)
    try:
        title = title_bytes.decode("utf-8")
        text = text_bytes.decode("utf-8")
        extras = rest.decode("utf-8").split("|")[1:] if rest else []
    except UnicodeDecodeError:
        # "_e{2,1}:\xff\xfe|x": a length that splits a character, or not UTF-8 at all
        return Reject("invalid_event", line)
    values: dict[str, object] = {}
    unknown = 0
    for extra in extras:
        common = _parse_common_field(extra, limits)
        if common is not None:
            kind, value = common
            if kind == "bad":
                # "_e{1,1}:a|b|d:yesterday", "_e{1,1}:a|b|#:x"
                return Reject("invalid_event", line)
            values[kind] = value
        elif extra.startswith(("k:", "s:")):
            values[extra[0]] = extra[2:]
        elif extra.startswith(("p:", "t:")):
            # "_e{1,1}:a|b|p:urgent", "_e{1,1}:a|b|t:fatal"
            if extra[2:] not in (_EVENT_PRIORITIES if extra[0] == "p" else _EVENT_ALERT_TYPES):
                return Reject("invalid_event", line)
            values[extra[0]] = extra[2:]
        elif extra != "":
            # "_e{1,1}:a|b|x:1234", "_e{1,1}:a|b|zz": a field this parser does not know,
            # ignored and counted (the Datadog agent ignores it)
            unknown += 1
    tags = values.get("#", ())
    assert isinstance(tags, tuple)
    if "c" in values:
        tags = tuple(sorted({"container": str(values["c"]), **dict(tags)}.items()))
    timestamp = values.get("d")
    return Event(
        title,
        text.replace("\\n", "\n"),
        timestamp if isinstance(timestamp, int) else None,
        str(values.get("h", "")),
        str(values.get("k", "")),
        str(values.get("p", "normal")),
        str(values.get("s", "")),
        str(values.get("t", "info")),
        tags,
        unknown,
    )


def _parse_service_check(line: bytes, limits: ProtocolLimits) -> ServiceCheck | Reject:
    """``_sc|name|status|...``; ``m:`` (the message) comes last and may contain ``|``."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return Reject("invalid_service_check", line)
    head, marker, message = text.partition("|m:")
    fields = head.split("|")
    # "_sc|", "_sc|name" (no status), "_sc|bad name|0", "_sc|db|7"
    if (
        len(fields) < 3
        or len(fields[1]) > limits.max_name_bytes
        or not _NAME_RE.fullmatch(fields[1])
        or fields[2] not in _SERVICE_CHECK_STATUSES
    ):
        return Reject("invalid_service_check", line)
    values: dict[str, object] = {}
    unknown = 0
    for extra in fields[3:]:
        common = _parse_common_field(extra, limits)
        if common is None:
            if extra:
                # "_sc|db|0|x:1", "_sc|db|0|zz": a field this parser does not know, ignored
                # and counted (the Datadog agent ignores it)
                unknown += 1
            continue
        # "_sc|db|0|d:soon"
        if common[0] == "bad":
            return Reject("invalid_service_check", line)
        values[common[0]] = common[1]
    if marker:
        # The message may contain "|"; the client appends its origin fields after it:
        # "_sc|db|2|m:disk full | really|c:cid|card:low"
        message, _, origin = message.partition("|c:")
        message = message.split("|card:")[0].replace("\\n", "\n")
        container = origin.split("|")[0]
        if container:
            if not _tag_value_ok(container, limits):
                return Reject("invalid_service_check", line)
            values["c"] = container
    tags = values.get("#", ())
    assert isinstance(tags, tuple)
    if "c" in values:
        tags = tuple(sorted({"container": str(values["c"]), **dict(tags)}.items()))
    timestamp = values.get("d")
    return ServiceCheck(
        fields[1],
        _SERVICE_CHECK_STATUSES[fields[2]],
        timestamp if isinstance(timestamp, int) else None,
        str(values.get("h", "")),
        tags,
        message,
        unknown,
    )
