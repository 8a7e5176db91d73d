"""Window configs: the YAML schema, its loader, and the frozen specs the pipeline runs on.

``load_config(path)`` is the way in; ``PipelineConfig``, ``WindowSpec`` and
``AlertSpec`` are what comes out (``PipelineConfig.sketches``: the compiled ``sketches:``
accuracy targets).
"""

from streamgauge.configs.durations import format_duration_ms, parse_duration_ms
from streamgauge.configs.loader import (
    ConfigError,
    ConfigIssue,
    default_config_name,
    load_config,
    parse_config,
)
from streamgauge.configs.model import (
    AGGREGATES,
    ALERT_AGGREGATES,
    CLIENT_AGGREGATE_METRICS,
    COMPARISONS,
    EVALUATION_STEP_MS,
    SKETCH_KEYS,
    WINDOW_KINDS,
    Aggregate,
    AlertAggregate,
    AlertSpec,
    Comparison,
    PipelineConfig,
    SketchTargets,
    WindowKind,
    WindowSpec,
    describe_sketches,
    evaluation_interval_ms,
    format_threshold,
    parse_condition,
)

__all__ = [
    "AGGREGATES",
    "ALERT_AGGREGATES",
    "CLIENT_AGGREGATE_METRICS",
    "COMPARISONS",
    "EVALUATION_STEP_MS",
    "SKETCH_KEYS",
    "WINDOW_KINDS",
    "Aggregate",
    "AlertAggregate",
    "AlertSpec",
    "Comparison",
    "ConfigError",
    "ConfigIssue",
    "PipelineConfig",
    "SketchTargets",
    "WindowKind",
    "WindowSpec",
    "default_config_name",
    "describe_sketches",
    "evaluation_interval_ms",
    "format_threshold",
    "format_duration_ms",
    "load_config",
    "parse_condition",
    "parse_config",
    "parse_duration_ms",
]
