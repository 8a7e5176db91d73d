"""The SQL behind every panel, annotation and alert, and the query model that carries it.

Grafana sends ``rawSql`` to its PostgreSQL data source after two substitutions (see
``pkg/tsdb/grafana-postgresql-datasource/macros.go`` and ``sqleng``): dashboard variables
(``$window``, ``$metric``: single values are inserted with ``'`` doubled and no quotes added,
hence ``'$metric'`` below), then ``$__interval``, ``$__unixEpochFrom()`` and the macros
``$__timeFilter(col)`` (``col BETWEEN '<from RFC3339>' AND '<to RFC3339>'``, both ends
inclusive) and ``$__timeGroupAlias(col, 10s)`` (``floor(extract(epoch from col)/10)*10 AS
"time"``). The tests expand exactly that and run every query here on a real PostgreSQL.

Windows are plotted at their start (a window ``[10:00:00, 10:00:10)`` is the point 10:00:00),
filtered by ``window_start`` for panels and by ``window_end`` for alerts (an alert looks at the
windows that *ended* within its look-back). Within one ``$__interval`` bucket several windows
combine the way each aggregate allows: counts and sums add, min and max take the extreme,
``last`` takes the latest window's, ``rate`` is total sum over total window seconds,
t-digest percentile columns show the largest window's value (percentiles do not average), and
distinct counts merge the windows' HyperLogLog registers (``streamgauge_hll_distinct``, schema
migration 5: HLL estimates do not add; a bucket of one window keeps that window's own count,
which the sketch's exact small-set mode makes exact where registers alone cannot).

Percentiles over a bucket or the whole range come from the windows' HDR histograms instead:
the buckets of all windows in the bucket (per tag group) are added per bucket (index and
bounds, so a layout change never adds unlike buckets), then ``streamgauge_hdr_quantiles``
reads the quantiles off the sum, as HdrHistogram does (schema migrations 4, 12 and 17).
Only windows that are in ``window_results`` count (CTE ``windows``: the emitted ones the other
panels show, with their finality), and their buckets are unpacked from those same rows
(``streamgauge_hdr_entries(hdr_bucket_counts)``; the bounds from the row's layout columns): the
``window_histograms`` view shows a row each, without joining it back to ``windows``. The
per-tag-group panel hands each series' bins to the quantile function unmerged
(``histogram_percentiles_sql`` says why); the range stat adds them per bucket first, down to a
few hundred bins. Measured on an hour of 10 s windows of 10 metrics and 10 hosts, 100 buckets
each (360 k buckets of the metric shown), 1 m buckets, load ~1.8 on 2 cores: per-tag-group
panel 0.53 s, range stat 0.07 s, heatmap 0.11 s, against 0.60, 0.28 and 0.58 s for the same
panels over the bucket-row table the arrays replaced.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Literal, cast

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.models import dashboard as dashboard_models

from streamgauge.configs import CLIENT_AGGREGATE_METRICS, Aggregate, AlertSpec, PipelineConfig
from streamgauge.sketches.accuracy import PERCENTILES

DATASOURCE_TYPE = "grafana-postgresql-datasource"
"""The PostgreSQL plugin id since Grafana 10.3 (``postgres`` remains an alias)."""

SELF_METRIC_PREFIX = "streamgauge.ingest."
INGEST_METRICS = (
    "streamgauge.ingest.datagrams",
    "streamgauge.ingest.lines",
    "streamgauge.ingest.samples",
)
REJECTED_METRIC = "streamgauge.ingest.rejected"
KERNEL_DROPS_METRIC = "streamgauge.ingest.kernel_drops"
#: ``pipeline_metrics`` name of failed store attempts (labels ``config``, ``reason``): written by
#: the daemon, since a store that is down cannot receive them through the pipeline.
STORE_ERRORS_METRIC = "streamgauge.store.errors"
WATERMARK_KEY_PREFIX = "watermark_ms:"

QueryFormat = Literal["time_series", "table"]


class PostgresQuery(cogvariants.Dataquery):
    """A raw-SQL PostgreSQL target: the SDK has builders for many data sources but not this one.

    Serialised the way Grafana 11's SQL query editor saves a query in code mode.
    """

    def __init__(self, ref_id: str, raw_sql: str, fmt: QueryFormat, datasource_uid: str) -> None:
        self.ref_id = ref_id
        self.raw_sql = raw_sql
        self.format = fmt
        self.datasource_uid = datasource_uid

    def to_json(self) -> dict[str, object]:
        return {
            "refId": self.ref_id,
            "datasource": {"type": DATASOURCE_TYPE, "uid": self.datasource_uid},
            "editorMode": "code",
            "format": self.format,
            "rawQuery": True,
            "rawSql": self.raw_sql,
        }


class PostgresQueryBuilder(cogbuilder.Builder[PostgresQuery]):
    """The builder form the SDK's ``with_target`` and alerting ``model`` expect."""

    def __init__(self, query: PostgresQuery) -> None:
        self._query = query

    def build(self) -> PostgresQuery:
        return self._query


class SqlAnnotationTarget(dashboard_models.AnnotationTarget):
    """An annotation query's target for a SQL data source (the SDK types only Grafana's own)."""

    def __init__(self, raw_sql: str) -> None:
        super().__init__()
        self.raw_sql = raw_sql

    def to_json(self) -> dict[str, object]:
        return {
            "editorMode": "code",
            "format": "table",
            "rawQuery": True,
            "rawSql": self.raw_sql,
            "refId": "Anno",
        }


class SqlAnnotationTargetBuilder(cogbuilder.Builder[dashboard_models.AnnotationTarget]):
    def __init__(self, raw_sql: str) -> None:
        self._target = SqlAnnotationTarget(raw_sql)

    def build(self) -> dashboard_models.AnnotationTarget:
        return self._target


def literal(text: str) -> str:
    """A SQL string literal (``standard_conforming_strings`` is on since PostgreSQL 9.1)."""
    return "'" + text.replace("'", "''") + "'"


# --- per-config dashboard ----------------------------------------------------------------------

#: How windows combine inside one $__interval bucket (see the module docstring).
BUCKET_EXPRESSIONS: Mapping[Aggregate, str] = {
    "count": "sum(count)",
    "sum": "sum(sum)",
    "min": "min(min)",
    "max": "max(max)",
    "last": "(array_agg(last ORDER BY window_start DESC) FILTER (WHERE last IS NOT NULL))[1]",
    "p50": "max(p50)",
    "p90": "max(p90)",
    "p99": "max(p99)",
    "p999": "max(p999)",
    "distinct_count": (
        "CASE WHEN count(*) = 1 THEN max(distinct_count)"
        " ELSE coalesce(streamgauge_hll_distinct(hll_registers), max(distinct_count)) END"
    ),
    "rate": "sum(sum) / sum(extract(epoch FROM window_end - window_start))",
}

#: The value of one window, for alerts (no combining: each window is evaluated on its own).
WINDOW_EXPRESSIONS: Mapping[Aggregate, str] = {
    "count": "count::double precision",
    "sum": "sum",
    "min": "min",
    "max": "max",
    "last": "last",
    "p50": "p50",
    "p90": "p90",
    "p99": "p99",
    "p999": "p999",
    "distinct_count": "distinct_count",
    "rate": "sum / extract(epoch FROM window_end - window_start)",
}

#: Quantiles the histogram panels draw: (series label, q).
HISTOGRAM_QUANTILES: tuple[tuple[str, float], ...] = tuple(PERCENTILES.items())
#: The aggregates an alert reads from the window's HDR histogram when it has one.
ALERT_HISTOGRAM_QUANTILES: Mapping[str, float] = PERCENTILES
#: Heatmap rows per power of two (2^(1/8): rows about 9 % apart; an HDR bucket is ≤ 1 % wide).
HEATMAP_ROWS_PER_OCTAVE = 8

_BINS = "array_agg((bucket, lower_bound, upper_bound, n)::streamgauge_hdr_bin)"

# A series is the metric, plus its tags when the window keeps any.
_SERIES = "CASE WHEN tags = '{}'::jsonb THEN metric ELSE metric || ' ' || tags::text END"


def _series_filter(config: PipelineConfig) -> str:
    return (
        f"config_name = {literal(config.name)}\n"
        "  AND window_name = '$window'\n"
        "  AND metric = '$metric'\n"
        "  AND $__timeFilter(window_start)"
    )


def aggregate_sql(config: PipelineConfig, aggregate: Aggregate, *, provisional: bool) -> str:
    """One aggregate of the selected metric and window, one point per ``$__interval`` bucket.

    ``provisional=True`` keeps only the buckets holding a window that is not final yet, and
    names the series "... (provisional)": drawn over the full series as dashed points.
    """
    series = f"{_SERIES} || ' (provisional)'" if provisional else _SERIES
    having = "\nHAVING NOT bool_and(is_final)" if provisional else ""
    return (
        "SELECT\n"
        "  $__timeGroupAlias(window_start, $__interval),\n"
        f"  {series} AS metric,\n"
        f"  {BUCKET_EXPRESSIONS[aggregate]} AS value\n"
        "FROM window_results\n"
        f"WHERE {_series_filter(config)}\n"
        f"GROUP BY 1, 2{having}\n"
        "ORDER BY 1, 2"
    )


def stat_samples_sql(config: PipelineConfig) -> str:
    """Samples of the selected metric received in the time range."""
    return (
        "SELECT coalesce(sum(count), 0) AS samples\n"
        "FROM window_results\n"
        f"WHERE {_series_filter(config)}"
    )


def stat_windows_sql(config: PipelineConfig) -> str:
    """Windows in range: final, provisional (closed, stragglers may still change them) and
    early (still open, published by ``early_every``: a running value)."""
    return (
        "SELECT\n"
        "  count(*) FILTER (WHERE is_final) AS final,\n"
        "  count(*) FILTER (WHERE NOT is_final AND early_as_of IS NULL) AS provisional,\n"
        "  count(*) FILTER (WHERE early_as_of IS NOT NULL) AS early\n"
        "FROM window_results\n"
        f"WHERE {_series_filter(config)}"
    )


def stat_distinct_sql(config: PipelineConfig) -> str:
    """Distinct count over the whole range and every tag group: the union of the windows'
    HyperLogLog registers (``streamgauge_hll_distinct``), not a sum or a largest window.

    Rows written before schema version 5 have no registers; the largest window's count
    stands in for them.
    """
    return (
        "SELECT coalesce(streamgauge_hll_distinct(hll_registers), max(distinct_count))"
        " AS distinct_count\n"
        "FROM window_results\n"
        f"WHERE {_series_filter(config)}"
    )


def corrections_annotation_sql(config: PipelineConfig) -> str:
    """Annotation rows (time, timeend, text, tags) for the selected metric's corrected windows.

    ``window_results.corrections`` counts the value changes after a window first appeared
    (stragglers within the allowed lateness, or `streamgauge replay`), so the annotation stays
    after the window is final.
    """
    return (
        "SELECT\n"
        '  window_start AS "time",\n'
        "  window_end AS timeend,\n"
        f"  {_SERIES} || ': corrected ' || corrections || 'x, revision ' || revision"
        " || ', count ' || count AS text,\n"
        "  'correction' AS tags\n"
        "FROM window_results\n"
        f"WHERE config_name = {literal(config.name)}\n"
        "  AND window_name = '$window'\n"
        "  AND metric = '$metric'\n"
        "  AND corrections > 0\n"
        "  AND $__timeFilter(window_start)\n"
        "ORDER BY 1, 3"
    )


def _quantile_array() -> str:
    return "'{" + ",".join(repr(q) for _, q in HISTOGRAM_QUANTILES) + "}'"


def _emitted_windows(config: PipelineConfig) -> str:
    """CTE ``windows``: the selected series' windows in ``window_results`` within the range,
    with their ``$__interval`` bucket ``t`` and their HDR buckets."""
    return (
        "windows AS (\n"
        "  SELECT $__timeGroup(window_start, $__interval) AS t, metric, tags, window_start,\n"
        "    is_final, hdr_bucket_counts, hdr_unit_magnitude, hdr_half_count_magnitude,\n"
        "    hdr_value_scale\n"
        "  FROM window_results\n"
        f"  WHERE {_series_filter(config).replace(chr(10), chr(10) + '  ')}\n"
        ")"
    )


_WINDOW_BUCKETS = (
    "windows w CROSS JOIN LATERAL streamgauge_hdr_entries(w.hdr_bucket_counts) AS h(bucket, count)"
)
"""The buckets of the ``windows`` CTE's rows, one row each (``window_histograms``' rows)."""


def _bound(which: str, row: str = "w", bucket: str = "h.bucket") -> str:
    """A bucket's ``lower`` or ``upper`` bound, from the layout columns of its window row."""
    return (f"streamgauge_hdr_{which}_bound({bucket}, {row}.hdr_unit_magnitude, "
            f"{row}.hdr_half_count_magnitude, {row}.hdr_value_scale)")  # fmt: skip


def histogram_percentiles_sql(config: PipelineConfig, *, provisional: bool) -> str:
    """p50/p90/p99/p999 per tag group and ``$__interval`` bucket, from the merged histograms.

    Each point is the quantile of all samples of the bucket's windows of that tag group (not
    the largest or the mean of per-window percentiles). ``provisional=True`` keeps the buckets
    holding a window that is not final yet, named "... (provisional)", like ``aggregate_sql``.

    The windows' bins go to ``streamgauge_hdr_quantiles`` unmerged (it reads the same
    quantiles from them): adding them per bucket first made PostgreSQL sort the bucket rows on
    disk to group them, 1.2 s against 0.53 s at 1 m and 10 m buckets alike (the data of the
    module docstring).
    """
    labels = "'{" + ",".join(label for label, _ in HISTOGRAM_QUANTILES) + "}'::text[]"
    suffix = " || ' (provisional)'" if provisional else ""
    where = "\nWHERE NOT f.final" if provisional else ""
    return (
        f"WITH {_emitted_windows(config)}, finality AS (\n"
        "  SELECT t, tags, bool_and(is_final) AS final\n"
        "  FROM windows\n"
        "  GROUP BY 1, 2\n"
        "), per_series AS (\n"
        "  SELECT w.t, w.metric, w.tags, streamgauge_hdr_quantiles(array_agg(\n"
        f"      (h.bucket, {_bound('lower')}, {_bound('upper')}, h.count)"
        "::streamgauge_hdr_bin),\n"
        f"    {_quantile_array()}) AS v\n"
        f"  FROM {_WINDOW_BUCKETS}\n"
        "  GROUP BY 1, 2, 3\n"
        ")\n"
        'SELECT t AS "time",\n'
        f"  q.label || ' ' || {_SERIES}{suffix} AS metric,\n"
        "  v[q.i] AS value\n"
        "FROM per_series JOIN finality f USING (t, tags),\n"
        f"  unnest({labels}) WITH ORDINALITY AS q(label, i){where}\n"
        "ORDER BY 1, 2"
    )


def histogram_range_percentiles_sql(config: PipelineConfig) -> str:
    """One value per quantile over the whole time range and all tag groups of the metric."""
    columns = ", ".join(f"v[{i}] AS {label}" for i, (label, _) in enumerate(HISTOGRAM_QUANTILES, 1))
    return (
        f"WITH {_emitted_windows(config)}, per_bucket AS (\n"
        "  SELECT h.bucket,\n"
        f"    {_bound('lower')} AS lower_bound,\n"
        f"    {_bound('upper')} AS upper_bound,\n"
        "    sum(h.count)::bigint AS n\n"
        f"  FROM {_WINDOW_BUCKETS}\n"
        "  GROUP BY 1, 2, 3\n"
        ")\n"
        f"SELECT {columns}\n"
        f"FROM (SELECT streamgauge_hdr_quantiles({_BINS}, {_quantile_array()}) AS v\n"
        "      FROM per_bucket) merged"
    )


def heatmap_edge_sql(upper_bound: str) -> str:
    """The heatmap row of a bucket: the power of 2^(1/8) at or above its upper bound.

    ``- 1e-9`` keeps a bound that is an exact power (1024 ms) in its own row despite the
    rounding of ``ln(x) / ln(2)``; a bound of 0 (the value 0) gets the row 0.
    """
    n = HEATMAP_ROWS_PER_OCTAVE
    return (
        f"CASE WHEN {upper_bound} <= 0 THEN 0::double precision\n"
        f"    ELSE power(2, ceil(ln({upper_bound}) / ln(2) * {n} - 1e-9) / {n}) END"
    )


def heatmap_sql(config: PipelineConfig) -> str:
    """Samples per (``$__interval`` bucket, value row) over all tag groups: Grafana's heatmap of
    pre-bucketed data, one series per row named by its upper edge (``le``)."""
    return (
        f"WITH {_emitted_windows(config)}\n"
        'SELECT t AS "time", edge::text AS metric, n AS value\n'
        "FROM (\n"
        "  SELECT\n"
        "    w.t,\n"
        f"    {heatmap_edge_sql(_bound('upper'))} AS edge,\n"
        "    sum(h.count)::double precision AS n\n"
        f"  FROM {_WINDOW_BUCKETS}\n"
        "  GROUP BY 1, 2\n"
        ") cells\n"
        "ORDER BY t, edge"
    )


def metric_variable_sql(config: PipelineConfig) -> str:
    """The ``metric`` variable: metric names the selected window has results for in the
    dashboard's time range (the variable refreshes when it changes).

    Why the range: without it every load of the dashboard read every row the window ever
    stored (at 100k series, 100k rows per 10 s window). The range is on ``window_end``, which
    ``window_results_window_end_idx`` indexes (the panels filter on ``window_start``; a window
    straddling the range's start is the only difference)."""
    return (
        "SELECT DISTINCT metric FROM window_results\n"
        f"WHERE config_name = {literal(config.name)} AND window_name = '$window'\n"
        "  AND $__timeFilter(window_end)\n"
        "ORDER BY 1"
    )


# --- pipeline health ---------------------------------------------------------------------------


def ingest_rate_sql(config: PipelineConfig) -> str:
    """Datagrams, lines and samples per second (the receivers' counters, fed back as metrics)."""
    names = ", ".join(literal(m) for m in INGEST_METRICS)
    return (
        "SELECT\n"
        "  $__timeGroupAlias(window_start, $__interval),\n"
        f"  substr(metric, {len(SELF_METRIC_PREFIX) + 1}) AS metric,\n"
        f"  {BUCKET_EXPRESSIONS['rate']} AS value\n"
        "FROM window_results\n"
        f"WHERE config_name = {literal(config.name)}\n"
        "  AND window_name = '$window'\n"
        f"  AND metric IN ({names})\n"
        "  AND $__timeFilter(window_start)\n"
        "GROUP BY 1, 2\n"
        "ORDER BY 1, 2"
    )


def rejects_sql(config: PipelineConfig) -> str:
    """Rejected lines per bucket by reason (the ``reason`` tag survives if the window keeps it)."""
    return (
        "SELECT\n"
        "  $__timeGroupAlias(window_start, $__interval),\n"
        "  coalesce(tags->>'reason', 'all reasons') AS metric,\n"
        "  sum(sum) AS value\n"
        "FROM window_results\n"
        f"WHERE config_name = {literal(config.name)}\n"
        "  AND window_name = '$window'\n"
        f"  AND metric = {literal(REJECTED_METRIC)}\n"
        "  AND $__timeFilter(window_start)\n"
        "GROUP BY 1, 2\n"
        "ORDER BY 1, 2"
    )


def kernel_drops_sql(config: PipelineConfig) -> str:
    """Datagrams the kernel dropped per bucket, by listening socket (``listen`` tag)."""
    return (
        "SELECT\n"
        "  $__timeGroupAlias(window_start, $__interval),\n"
        "  coalesce(tags->>'listen', 'all sockets') AS metric,\n"
        "  sum(sum) AS value\n"
        "FROM window_results\n"
        f"WHERE config_name = {literal(config.name)}\n"
        "  AND window_name = '$window'\n"
        f"  AND metric = {literal(KERNEL_DROPS_METRIC)}\n"
        "  AND $__timeFilter(window_start)\n"
        "GROUP BY 1, 2\n"
        "ORDER BY 1, 2"
    )


def store_errors_sql(config: PipelineConfig) -> str:
    """Failed result-store attempts per bucket by reason, from ``pipeline_metrics``."""
    return (
        "SELECT\n"
        "  $__timeGroupAlias(ts, $__interval),\n"
        "  coalesce(labels->>'reason', 'all reasons') AS metric,\n"
        "  sum(value) AS value\n"
        "FROM pipeline_metrics\n"
        f"WHERE name = {literal(STORE_ERRORS_METRIC)}\n"
        f"  AND coalesce(labels->>'config', {literal(config.name)}) = {literal(config.name)}\n"
        "  AND $__timeFilter(ts)\n"
        "GROUP BY 1, 2\n"
        "ORDER BY 1, 2"
    )


def watermark_lag_sql(config: PipelineConfig) -> str:
    """Per window: how far the watermark was behind processing time at the last commit, and
    how long ago that commit was (a stalled job shows as a growing age, not a growing lag)."""
    return (
        "SELECT\n"
        f'  substr(key, {len(WATERMARK_KEY_PREFIX) + 1}) AS "window",\n'
        "  (extract(epoch FROM updated_at) * 1000 - value_ms) / 1000.0 AS lag_seconds,\n"
        "  extract(epoch FROM now() - updated_at)::double precision AS age_seconds\n"
        "FROM pipeline_state\n"
        f"WHERE config_name = {literal(config.name)}\n"
        f"  AND starts_with(key, {literal(WATERMARK_KEY_PREFIX)})\n"
        "ORDER BY 1"
    )


def late_events_sql(config: PipelineConfig) -> str:
    """Samples that came after their window was final, per bucket of their window's start.

    Read from ``late_events`` itself, not from ``window_results.late_events``: a late sample
    whose window has no row (every sample of it was late) is counted only there. Applied
    ones (``streamgauge replay``) still count: they were late.
    """
    return (
        "SELECT\n"
        "  $__timeGroupAlias(window_start, $__interval),\n"
        "  'late events' AS metric,\n"
        "  sum(count)::double precision AS value\n"
        "FROM late_events\n"
        f"WHERE config_name = {literal(config.name)}\n"
        "  AND window_name = '$window'\n"
        "  AND $__timeFilter(window_start)\n"
        "GROUP BY 1, 2\n"
        "ORDER BY 1, 2"
    )


def corrections_sql(config: PipelineConfig) -> str:
    """Corrected windows (``corrections > 0``) and provisional (not yet final) windows."""
    return (
        "SELECT\n"
        "  $__timeGroupAlias(window_start, $__interval),\n"
        "  count(*) FILTER (WHERE corrections > 0)::double precision AS corrected,\n"
        "  count(*) FILTER (WHERE NOT is_final)::double precision AS provisional\n"
        "FROM window_results\n"
        f"WHERE config_name = {literal(config.name)}\n"
        "  AND window_name = '$window'\n"
        "  AND $__timeFilter(window_start)\n"
        "GROUP BY 1\n"
        "ORDER BY 1"
    )


# --- alerts ------------------------------------------------------------------------------------


def _alert_value(aggregate: Aggregate) -> str:
    """The window's value; a percentile from its HDR histogram, else its t-digest column.

    The histogram's quantile has a bounded *value* error (the layout's, 1 % by default) and is
    the number the dashboard's histogram panels show; windows stored without HDR buckets
    (types without one, or written before schema version 4) keep the column's estimate. The
    buckets are the row's own (``hdr_bucket_counts``, what ``window_histograms`` shows of it).
    """
    q = ALERT_HISTOGRAM_QUANTILES.get(aggregate)
    if q is None:
        return WINDOW_EXPRESSIONS[aggregate]
    bounds = f"{_bound('lower', 'window_results')}, {_bound('upper', 'window_results')}"
    return (
        "coalesce((\n"
        "    SELECT streamgauge_hdr_quantile(array_agg(\n"
        f"      (h.bucket,\n       {bounds},\n       h.count)::streamgauge_hdr_bin), {q!r})\n"
        "    FROM streamgauge_hdr_entries(window_results.hdr_bucket_counts) AS h(bucket, count)\n"
        f"  ), {WINDOW_EXPRESSIONS[aggregate]})"
    )


def alert_sql(config: PipelineConfig, alert: AlertSpec) -> str:
    """Every window of the alert's series that ended inside the rule's look-back, one value each.

    One string column per ``group_by`` tag of the window: Grafana turns string columns of a
    time-series result into labels, so each tag group is its own alert instance (``host=a``).

    Early rows (``early_as_of`` set: a window's ``early_every`` running value) are skipped: a
    window the watermark has not passed is incomplete, and its end can already lie inside the
    look-back (the watermark trails the clock by ``watermark_delay``), so a partial count
    would fire a "below" rule or a partial maximum clear an "above" one. The window is
    evaluated from its on-time row on. Unconditional, so a rule exported before a window got
    ``early_every`` stays right.
    """
    if alert.aggregate in CLIENT_AGGREGATE_METRICS:
        return client_alert_sql(config, alert)
    window = config.window(alert.window)
    labels = "".join(f"  tags->>{literal(tag)} AS {json.dumps(tag)},\n" for tag in window.group_by)
    tag_filter = ""
    if alert.tags:
        tag_json = json.dumps(dict(alert.tags), sort_keys=True, separators=(",", ":"))
        tag_filter = f"\n  AND tags @> {literal(tag_json)}::jsonb"
    return (
        "SELECT\n"
        '  window_end AS "time",\n'
        f"{labels}"
        f"  {_alert_value(cast(Aggregate, alert.aggregate))} AS value\n"
        "FROM window_results\n"
        f"WHERE config_name = {literal(config.name)}\n"
        f"  AND window_name = {literal(alert.window)}\n"
        f"  AND metric = {literal(alert.metric)}{tag_filter}\n"
        "  AND early_as_of IS NULL\n"
        "  AND $__timeFilter(window_end)\n"
        "ORDER BY 1"
    )


def client_alert_sql(config: PipelineConfig, alert: AlertSpec) -> str:
    """A completeness alert: per client (``source``, with its library as a label), the
    fraction of its metrics (or packets) that arrived in each window that ended inside the
    look-back. Clients without telemetry have none (NULL, dropped by the reducer): unknown is
    no breach, and never 100 %."""
    column = "completeness" if alert.aggregate == "completeness" else "packet_completeness"
    filters = "".join(f"\n  AND {tag} = {literal(value)}" for tag, value in alert.tags)
    return (
        "SELECT\n"
        '  window_end AS "time",\n'
        '  source AS "source",\n'
        "  coalesce(client, 'unknown') AS \"client\",\n"
        f"  {column} AS value\n"
        "FROM client_completeness\n"
        f"WHERE config_name = {literal(config.name)}\n"
        f"  AND window_name = {literal(alert.window)}\n"
        f"  AND {column} IS NOT NULL{filters}\n"
        "  AND $__timeFilter(window_end)\n"
        "ORDER BY 1"
    )


def client_completeness_sql(config: PipelineConfig) -> str:
    """Per client and bucket: the fraction of its metrics that arrived (its windows' counts
    added up, then divided). Clients without telemetry have no line: unknown, not 100 %."""
    return (
        "SELECT\n"
        "  $__timeGroupAlias(window_start, $__interval),\n"
        "  source || coalesce(' (' || max(client) || ')', '') AS metric,\n"
        "  sum(metrics_received) / nullif(sum(metrics_sent), 0) AS value\n"
        "FROM client_completeness\n"
        f"WHERE config_name = {literal(config.name)}\n"
        "  AND window_name = '$window'\n"
        "  AND metrics_sent IS NOT NULL\n"
        "  AND $__timeFilter(window_start)\n"
        "GROUP BY 1, source\n"
        "ORDER BY 1, 2"
    )
