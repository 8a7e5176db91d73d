"""Dashboards built with ``grafana-foundation-sdk`` (Grafana 11.6 schema), as JSON-ready dicts.

Two per config: the results dashboard (template variables ``window`` and ``metric``; a time
series per aggregate with provisional values drawn as dashed points over the full series;
stat panels; an annotation on every corrected window; percentiles per tag group and over the
whole range from the windows' merged HDR histograms (their ``hdr_bucket_counts``, what
``window_histograms`` shows), and a heatmap of them) and
the pipeline-health dashboard (ingest rates, rejects by reason, kernel drops, each client's
completeness, watermark lag, late events, corrections, store errors from
``pipeline_metrics``).
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import dashboard as dash
from grafana_foundation_sdk.builders import heatmap, stat, timeseries
from grafana_foundation_sdk.builders.common import LineStyle, ScaleDistributionConfig
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models.dashboard import (
    DashboardCursorSync,
    DataSourceRef,
    DynamicConfigValue,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

from streamgauge.configs import AGGREGATES, Aggregate, PipelineConfig
from streamgauge.grafana import queries
from streamgauge.grafana.uids import dashboard_uid, health_dashboard_uid

#: Panel units for the aggregates (values are whatever the client sent: no unit is assumed).
_UNITS: dict[Aggregate, str] = {"count": "short", "rate": "reqps"}
#: What a percentile column is, per the window's ``quantiles`` option (panel descriptions).
_PERCENTILE_NOTE = (
    " The window's own t-digest percentile (rank error about 0.001 at p99); windows with "
    "quantiles: kll store p50 and p90 from KLL (rank error ±1.33 % at k 200) and no p99/p999. "
    "For percentiles over the range, read the histogram panels."
)
_DISTINCT_NOTE = " Windows merged by their HyperLogLog registers (±3.2 % at 2 sigma by default)."

_TITLES: dict[Aggregate, str] = {
    "count": "Samples per window (count)",
    "sum": "Sum",
    "min": "Min",
    "max": "Max",
    "last": "Last (gauges)",
    "p50": "p50 (largest window in bucket)",
    "p90": "p90 (largest window in bucket)",
    "p99": "p99 (largest window in bucket)",
    "p999": "p999 (largest window in bucket)",
    "distinct_count": "Distinct count (sets)",
    "rate": "Rate per second (sum / window seconds)",
}


def _ref(datasource_uid: str) -> DataSourceRef:
    return DataSourceRef(type_val=queries.DATASOURCE_TYPE, uid=datasource_uid)


def _target(ref_id: str, sql: str, fmt: queries.QueryFormat, ds: str) -> Any:
    return queries.PostgresQueryBuilder(queries.PostgresQuery(ref_id, sql, fmt, ds))


def _min_interval(config: PipelineConfig) -> str:
    """The smallest step of the config's windows: a bucket never splits one window."""
    steps = [w.hop_ms or w.size_ms or w.gap_ms or 1000 for w in config.windows]
    seconds = max(1, min(steps) // 1000)
    return f"{seconds}s"


def _window_variable(config: PipelineConfig) -> dash.CustomVariable:
    names = [w.name for w in config.windows]
    return (
        dash.CustomVariable("window")
        .label("Window")
        .values(",".join(names))
        .current(VariableOption(selected=True, text=names[0], value=names[0]))
    )


def _metric_variable(config: PipelineConfig, ds: str) -> dash.QueryVariable:
    return (
        dash.QueryVariable("metric")
        .label("Metric")
        .datasource(_ref(ds))
        .query(queries.metric_variable_sql(config))
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
    )


def _provisional_style() -> list[DynamicConfigValue]:
    return [
        DynamicConfigValue(
            id_val="custom.lineStyle", value=LineStyle().fill("dash").dash([6, 6]).build()
        ),
        DynamicConfigValue(id_val="custom.showPoints", value="always"),
        DynamicConfigValue(id_val="custom.pointSize", value=7),
        DynamicConfigValue(id_val="color", value={"mode": "fixed", "fixedColor": "orange"}),
    ]


def _aggregate_panel(config: PipelineConfig, aggregate: Aggregate, ds: str) -> timeseries.Panel:
    return (
        timeseries.Panel()
        .title(_TITLES[aggregate])
        .description(
            f"{aggregate} of $metric in window $window; dashed orange points: buckets holding "
            "a window that is not final yet (stragglers may still change it, or, with "
            "early_every, still open: a running value)."
            + (_PERCENTILE_NOTE if aggregate in ("p50", "p90", "p99", "p999") else "")
            + (_DISTINCT_NOTE if aggregate == "distinct_count" else "")
        )
        .datasource(_ref(ds))
        .interval(_min_interval(config))
        .with_target(
            _target(
                "A", queries.aggregate_sql(config, aggregate, provisional=False), "time_series", ds
            )
        )
        .with_target(
            _target(
                "B", queries.aggregate_sql(config, aggregate, provisional=True), "time_series", ds
            )
        )
        .override_by_query("B", _provisional_style())
        .unit(_UNITS.get(aggregate, "none"))
        .show_points(common.VisibilityMode.AUTO)
        .span(12)
        .height(8)
    )


def _histogram_percentiles_panel(config: PipelineConfig, ds: str) -> timeseries.Panel:
    sql = queries.histogram_percentiles_sql
    return (
        timeseries.Panel()
        .title("p50 / p90 / p99 / p999 per tag group (histograms merged per bucket)")
        .description(
            "Quantiles of all samples of $metric in the bucket's windows, per tag group, read "
            "off the sum of the windows' HDR histograms (never an average of percentiles); "
            "within the histogram's relative error of the exact value. Dashed orange points: "
            "buckets holding a window that is not final yet."
        )
        .datasource(_ref(ds))
        .interval(_min_interval(config))
        .with_target(_target("A", sql(config, provisional=False), "time_series", ds))
        .with_target(_target("B", sql(config, provisional=True), "time_series", ds))
        .override_by_query("B", _provisional_style())
        .show_points(common.VisibilityMode.AUTO)
        .span(24)
        .height(9)
    )


def _heatmap_panel(config: PipelineConfig, ds: str) -> heatmap.Panel:
    return (
        heatmap.Panel()
        .title("Histogram heatmap (all tag groups)")
        .description(
            "Samples of $metric per time bucket and value row, from the HDR bucket rows; each "
            f"row is named by its upper edge (rows are 2^(1/{queries.HEATMAP_ROWS_PER_OCTAVE}) "
            "apart, about 9 %)."
        )
        .datasource(_ref(ds))
        .interval(_min_interval(config))
        .with_target(_target("A", queries.heatmap_sql(config), "time_series", ds))
        .calculate(False)
        .rows_frame(heatmap.RowsHeatmapOptions().layout(common.HeatmapCellLayout.LE))
        .y_axis(
            heatmap.YAxisConfig().scale_distribution(
                ScaleDistributionConfig().type(common.ScaleDistribution.LOG).log(2)
            )
        )
        .cell_values(heatmap.CellValues().unit("short"))
        .span(24)
        .height(9)
    )


def _stat(title: str, sql: str, ds: str, *, unit: str = "short") -> stat.Panel:
    return (
        stat.Panel()
        .title(title)
        .datasource(_ref(ds))
        .with_target(_target("A", sql, "table", ds))
        .unit(unit)
        .span(8)
        .height(4)
    )


def _dashboard(title: str, uid: str, tags: list[str]) -> dash.Dashboard:
    """What every streamgauge dashboard shares: UTC, last hour, 10 s refresh, shared cursor."""
    return (
        dash.Dashboard(title)
        .uid(uid)
        .tags(tags)
        .editable()
        .tooltip(DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("10s")
        .timezone("utc")
    )


def results_dashboard(config: PipelineConfig, datasource_uid: str) -> dict[str, Any]:
    """The config's results dashboard, as the JSON dict Grafana stores."""
    ds = datasource_uid
    builder = (
        _dashboard(
            f"streamgauge: {config.name}", dashboard_uid(config.name), ["streamgauge", config.name]
        )
        .with_variable(_window_variable(config))
        .with_variable(_metric_variable(config, ds))
        .annotation(
            dash.AnnotationQuery()
            .name("Windows revised by stragglers")
            .datasource(_ref(ds))
            .enable(True)
            .icon_color("orange")
            .target(queries.SqlAnnotationTargetBuilder(queries.corrections_annotation_sql(config)))
        )
        .with_row(dash.Row("Totals"))
        .with_panel(_stat("Samples in range", queries.stat_samples_sql(config), ds))
        .with_panel(
            _stat(
                "Windows in range: final / provisional / early",
                queries.stat_windows_sql(config),
                ds,
            )
        )
        .with_panel(_stat("Distinct count over the range", queries.stat_distinct_sql(config), ds))
        .with_row(dash.Row("Aggregates per window"))
    )
    for aggregate in AGGREGATES:
        builder = builder.with_panel(_aggregate_panel(config, aggregate, ds))
    builder = (
        builder.with_row(
            dash.Row("Percentiles from histograms (timers, histograms, distributions)")
        )
        .with_panel(
            _stat(
                "p50 / p90 / p99 / p999 over the range, all tag groups",
                queries.histogram_range_percentiles_sql(config),
                ds,
                unit="none",
            ).span(24)
        )
        .with_panel(_histogram_percentiles_panel(config, ds))
        .with_panel(_heatmap_panel(config, ds))
    )
    return _to_dict(builder.build())


def _health_series(
    title: str, sql: str, ds: str, config: PipelineConfig, *, unit: str
) -> timeseries.Panel:
    return (
        timeseries.Panel()
        .title(title)
        .datasource(_ref(ds))
        .interval(_min_interval(config))
        .with_target(_target("A", sql, "time_series", ds))
        .unit(unit)
        .span(12)
        .height(8)
    )


def health_dashboard(config: PipelineConfig, datasource_uid: str) -> dict[str, Any]:
    """The pipeline-health dashboard, from the self-metrics and the store's own columns."""
    ds = datasource_uid
    builder = (
        _dashboard(
            f"streamgauge: {config.name} pipeline health",
            health_dashboard_uid(config.name),
            ["streamgauge", config.name, "health"],
        )
        .with_variable(_window_variable(config))
        .with_panel(
            _health_series(
                "Ingest per second", queries.ingest_rate_sql(config), ds, config, unit="short"
            )
        )
        .with_panel(
            _health_series(
                "Rejected lines by reason", queries.rejects_sql(config), ds, config, unit="short"
            )
        )
        .with_panel(
            _health_series(
                "Datagrams dropped by the kernel (receive buffer full)",
                queries.kernel_drops_sql(config),
                ds,
                config,
                unit="short",
            )
        )
        .with_panel(
            _health_series(
                "Result-store errors (failed attempts, retried)",
                queries.store_errors_sql(config),
                ds,
                config,
                unit="short",
            )
        )
        .with_panel(
            _stat(
                "Watermark lag (s) at last commit / age of last commit (s)",
                queries.watermark_lag_sql(config),
                ds,
                unit="s",
            ).span(12)
        )
        .with_panel(
            _health_series(
                "Late events (after final)",
                queries.late_events_sql(config),
                ds,
                config,
                unit="short",
            )
        )
        .with_panel(
            _health_series(
                "Revised (while provisional) and provisional rows",
                queries.corrections_sql(config),
                ds,
                config,
                unit="short",
            )
        )
        .with_panel(
            _health_series(
                "Client completeness: metrics arrived / metrics the client sent",
                queries.client_completeness_sql(config),
                ds,
                config,
                unit="percentunit",
            ).description(
                "Per DogStatsD client (its address and library), from its own telemetry: the "
                "fraction of the metrics it sent that reached the receivers, over the "
                "telemetry intervals (10 s by default) whose report arrived in the bucket. "
                "Clients without telemetry (plain StatsD) have no line: unknown, not 100 %. "
                "Needs a window over streamgauge.ingest.client.* with group_by: [source, "
                "client] (docs/completeness.md)."
            )
        )
    )
    return _to_dict(builder.build())


def _to_dict(model: object) -> dict[str, Any]:
    """The SDK model through its own encoder, back as plain data (what is written and sent)."""
    data: dict[str, Any] = json.loads(json.dumps(model, cls=JSONEncoder))
    # Panel ids are what panel links and alert annotations refer to: give every panel (rows
    # too) its own, in layout order, so they are stable from one export to the next.
    for number, panel in enumerate(data.get("panels", []), start=1):
        panel["id"] = number
    return data


def dashboard_json(data: dict[str, Any]) -> str:
    """Stable text for files and golden comparisons."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"
