"""Window configs: the YAML schema, its loader, and the frozen specs the pipeline runs on.

``load_config(path)`` is the way in; ``PipelineConfig`` and ``WindowSpec`` are what comes out.
"""

from streamgauge.configs.durations import format_duration_ms, parse_duration_ms
from streamgauge.configs.loader import (
    ConfigError,
    ConfigIssue,
    default_config_name,
    load_config,
    parse_config,
)
from streamgauge.configs.model import WINDOW_KINDS, PipelineConfig, WindowKind, WindowSpec

__all__ = [
    "WINDOW_KINDS",
    "ConfigError",
    "ConfigIssue",
    "PipelineConfig",
    "WindowKind",
    "WindowSpec",
    "default_config_name",
    "format_duration_ms",
    "load_config",
    "parse_config",
    "parse_duration_ms",
]
