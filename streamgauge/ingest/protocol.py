"""The StatsD / DogStatsD line protocol: one datagram in, samples and counted rejects out.

A datagram holds one or more lines separated by ``\\n`` (``\\r\\n`` tolerated)::

    name:value|type[|@rate][|#tag:value,tag2][|T<unix seconds>][|c:<container>]

A bad line is never an exception that reaches the receiver loop: it becomes a ``Reject`` with
a stable reason from ``REJECT_REASONS`` so that it can be counted and sampled, and the rest of
the datagram is still parsed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

#: The metric types this build aggregates. ``s`` (sets) needs the HyperLogLog sketches of a
#: later slice and is rejected as ``unsupported_type`` until then, so it is counted, not lost.
SUPPORTED_TYPES = frozenset({"c", "g", "ms", "h", "d"})
KNOWN_TYPES = SUPPORTED_TYPES | {"s"}

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
    "too_many_tags",
    "invalid_tag",
    "type_conflict",
)

_NAME_RE = re.compile(r"[A-Za-z0-9_.\-/]+")


@dataclass(frozen=True, slots=True)
class ProtocolLimits:
    """Guards against hostile or broken clients; each breach is a counted reject."""

    max_line_bytes: int = 4096
    max_tags: int = 64
    max_name_bytes: int = 250


DEFAULT_LIMITS = ProtocolLimits()


@dataclass(frozen=True, slots=True)
class Sample:
    """One parsed value. ``delta`` marks a gauge ``+N``/``-N`` (relative to the current value)."""

    metric: str
    metric_type: str
    value: float
    sample_rate: float
    tags: tuple[tuple[str, str], ...]
    delta: bool = False


@dataclass(frozen=True, slots=True)
class Reject:
    """A line that was not aggregated, with the reason it is counted under."""

    reason: str
    line: bytes


@dataclass(slots=True)
class ParseResult:
    samples: list[Sample] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    lines: int = 0


def parse_datagram(
    datagram: bytes, limits: ProtocolLimits = DEFAULT_LIMITS, into: ParseResult | None = None
) -> ParseResult:
    """Parse every line of one datagram; bad lines become rejects, good ones samples."""
    result = into if into is not None else ParseResult()
    for raw in datagram.split(b"\n"):
        line = raw.rstrip(b"\r")
        if not line:
            continue
        result.lines += 1
        if len(line) > limits.max_line_bytes:
            result.rejects.append(Reject("line_too_long", line[:256]))
            continue
        outcome = parse_line(line, limits)
        if isinstance(outcome, Reject):
            result.rejects.append(outcome)
        else:
            result.samples.extend(outcome)
    return result


def parse_line(line: bytes, limits: ProtocolLimits = DEFAULT_LIMITS) -> list[Sample] | Reject:
    """Parse one line (without its newline) into one sample per value, or a reject."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError:
        return Reject("malformed_line", line)
    name, colon, rest = text.partition(":")
    # "foo|c" and ":1|c": no name/value separator, or nothing before it
    if not colon or not name:
        return Reject("malformed_line", line)
    if len(name) > limits.max_name_bytes or not _NAME_RE.fullmatch(name):
        return Reject("invalid_name", line)
    fields = rest.split("|")
    # "foo:1" and "foo:1||": a value without a type
    if len(fields) < 2 or not fields[1]:
        return Reject("malformed_line", line)
    metric_type = fields[1]
    if metric_type not in KNOWN_TYPES:
        return Reject("unknown_type", line)
    if metric_type not in SUPPORTED_TYPES:
        return Reject("unsupported_type", line)

    sample_rate = 1.0
    tags: tuple[tuple[str, str], ...] = ()
    for extra in fields[2:]:
        if extra.startswith("@"):
            try:
                sample_rate = float(extra[1:])
            except ValueError:
                return Reject("invalid_sample_rate", line)
            # "foo:1|c|@0", "foo:1|c|@1.5", "foo:1|c|@nan": a rate must be in (0, 1]
            if not 0.0 < sample_rate <= 1.0:
                return Reject("invalid_sample_rate", line)
        elif extra.startswith("#"):
            parsed_tags = _parse_tags(extra[1:], limits)
            if isinstance(parsed_tags, str):
                return Reject(parsed_tags, line)
            tags = parsed_tags
        elif extra.startswith("c:") and len(extra) > 2:
            tags = (*tags, ("container", extra[2:]))
        elif extra.startswith("T") or extra == "":
            # Client timestamps (|T) are honoured by a later slice; event time is the receive
            # time for now, so the field is accepted and ignored rather than rejected.
            continue
        else:
            return Reject("malformed_line", line)

    values = fields[0].split(":")
    samples: list[Sample] = []
    for value_text in values:
        delta = metric_type == "g" and value_text[:1] in ("+", "-")
        try:
            value = float(value_text)
        except ValueError:
            return Reject("invalid_value", line)
        if not math.isfinite(value):
            return Reject("nan_value", line)
        samples.append(Sample(name, metric_type, value, sample_rate, tags, delta))
    return samples


def _parse_tags(text: str, limits: ProtocolLimits) -> tuple[tuple[str, str], ...] | str:
    """``k:v,k2`` → sorted pairs (a bare tag gets an empty value); a reason string if bad."""
    if not text:
        return ()
    parts = text.split(",")
    if len(parts) > limits.max_tags:
        return "too_many_tags"
    pairs: dict[str, str] = {}
    for part in parts:
        key, _, value = part.partition(":")
        # "foo:1|c|#,a:b" or "#:v": a tag with no key
        if not key:
            return "invalid_tag"
        pairs[key] = value
    return tuple(sorted(pairs.items()))
