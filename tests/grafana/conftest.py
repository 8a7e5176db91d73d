"""A config with alerts, used by every Grafana test, and the windows it writes to the store."""

from __future__ import annotations

import textwrap

import pytest

from streamgauge.configs import PipelineConfig, parse_config

CONFIG_TEXT = textwrap.dedent(
    """\
    name: shop
    windows:
      - name: per_10s
        kind: tumbling
        size: 10s
        watermark_delay: 1s
        allowed_lateness: 5s
        group_by: [host]
      - name: per_1m
        kind: tumbling
        size: 1m
        allowed_lateness: 30s
    alerts:
      - name: api_p99_high
        window: per_10s
        metric: api.latency
        aggregate: p99
        condition: "> 50"
        for: 20s
        tags: {host: a}
        labels: {severity: page, team: "$ops"}
        annotations: {summary: "API p99 above 50 ms"}
      - name: api_rate_low
        window: per_10s
        metric: api.latency
        aggregate: rate
        condition: "<= 1"
      - name: rejecting
        window: per_1m
        metric: streamgauge.ingest.rejected
        aggregate: sum
        condition: "> 0"
    """
)


@pytest.fixture(scope="session")
def config() -> PipelineConfig:
    return parse_config(CONFIG_TEXT, "shop.yaml")
