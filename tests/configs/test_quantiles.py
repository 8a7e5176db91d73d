"""``quantiles: tdigest | kll`` per window: shape, rules, alerts it refuses, what validate says."""

# ruff: noqa: E501  (tables of cases and messages read best one per line)

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest
import yaml

from streamgauge.cli import main
from streamgauge.configs import ConfigError, PipelineConfig, WindowSpec, parse_config

KLL_P99 = (
    "window 'fast' computes percentiles with KLL (quantiles: kll), whose rank error is ±1.33 %: "
    "its {aggregate} could be anywhere between p{low} and p100, so it stores none (nor histogram "
    "rows); alert on p50 or p90, or use quantiles: tdigest for this window"
)


def issues(text: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "test.yaml")
    return [(issue.path, issue.message) for issue in caught.value.issues]


def test_default_is_tdigest_and_kll_is_per_window() -> None:
    config = parse_config(
        "windows:\n"
        "  - {name: fast, kind: tumbling, size: 10s, quantiles: kll}\n"
        "  - {name: hop, kind: hopping, size: 10s, hop: 5s, quantiles: kll}\n"
        "  - {name: slow, kind: tumbling, size: 10s}\n"
        "  - {name: s, kind: session, gap: 5s, key: user}\n",
        "t",
    )
    assert [w.quantiles for w in config.windows] == ["kll", "kll", "tdigest", "tdigest"]
    assert config.kll_windows == ("fast", "hop")
    assert config.kll_k == 200  # what receivers build pane KLLs with
    # a list of the windows' own canonical dicts (PipelineConfig.to_canonical_dict)
    canonical = cast(list[dict[str, object]], config.to_canonical_dict()["windows"])
    assert [w.get("quantiles") for w in canonical] == ["kll", "kll", "tdigest", None]
    assert parse_config(yaml.safe_dump(config.to_canonical_dict()), "again") == config


def test_without_a_kll_window_receivers_build_no_kll() -> None:
    config = parse_config("windows: [{name: w, kind: tumbling, size: 10s}]", "t")
    assert (config.kll_windows, config.kll_k) == ((), None)


def test_kll_k_follows_quantile_error() -> None:
    config = parse_config(
        "sketches: {quantile_error: 0.01}\n"
        "windows: [{name: w, kind: tumbling, size: 10s, quantiles: kll}]\n",
        "t",
    )
    assert (config.kll_k, round(config.sketches.kll_rank_error, 5)) == (269, 0.00997)


@pytest.mark.parametrize(
    ("window", "path", "message"),
    [
        ("{name: w, kind: tumbling, size: 10s, quantiles: KLL}", "windows[0].quantiles", "unknown quantile sketch 'KLL'; one of tdigest, kll; did you mean kll?"),
        ("{name: w, kind: tumbling, size: 10s, quantiles: hdr}", "windows[0].quantiles", "unknown quantile sketch 'hdr'; one of tdigest, kll"),
        ("{name: w, kind: tumbling, size: 10s, quantiles: 3}", "windows[0].quantiles", "must be one of tdigest, kll, not a number (3)"),
        ("{name: w, kind: tumbling, size: 10s, quantiles: }", "windows[0].quantiles", "empty value; write a value or remove the key"),
        ("{name: w, kind: tumbling, size: 10s, percentiles: kll}", "windows[0].percentiles", "unknown key; did you mean quantiles?"),
        ("{name: w, kind: session, gap: 5s, key: user, quantiles: kll}", "windows[0].quantiles", "a session window computes no percentiles yet (only tumbling and hopping windows do), so quantiles: kll would change nothing; remove it"),
        ("{name: w, kind: sliding, size: 5s, quantiles: kll}", "windows[0].quantiles", "a sliding window computes no percentiles yet (only tumbling and hopping windows do), so quantiles: kll would change nothing; remove it"),
    ],
)  # fmt: skip
def test_bad_quantiles_are_reported_at_their_path(window: str, path: str, message: str) -> None:
    assert issues(f"windows: [{window}]") == [(path, message)]


def test_kll_k_is_not_a_knob_the_target_is() -> None:
    text = "sketches: {kll_k: 400}\nwindows: [{name: w, kind: tumbling, size: 10s}]"
    assert issues(text) == [
        ("sketches.kll_k", "unknown key; sketches: takes error targets and picks kll_k from them: did you mean quantile_error?")
    ]


ALERTS = """\
windows:
  - {name: fast, kind: tumbling, size: 10s, quantiles: kll}
  - {name: slow, kind: tumbling, size: 10s}
alerts:
"""


def test_alerts_on_p99_and_p999_of_a_kll_window_are_refused_with_the_reason() -> None:
    text = ALERTS + (
        '  - {name: a, window: fast, metric: api.latency, aggregate: p50, condition: "> 1"}\n'
        '  - {name: b, window: fast, metric: api.latency, aggregate: p90, condition: "> 1"}\n'
        '  - {name: c, window: fast, metric: api.latency, aggregate: p99, condition: "> 1"}\n'
        '  - {name: d, window: fast, metric: api.latency, aggregate: p999, condition: "> 1"}\n'
        '  - {name: e, window: slow, metric: api.latency, aggregate: p99, condition: "> 1"}\n'
    )
    assert issues(text) == [
        ("alerts[2].aggregate", KLL_P99.format(aggregate="p99", low="97.67")),
        ("alerts[3].aggregate", KLL_P99.format(aggregate="p999", low="98.57")),
    ]


def test_the_refusal_quotes_the_configured_error() -> None:
    text = "sketches: {quantile_error: 0.01}\n" + ALERTS + (
        '  - {name: c, window: fast, metric: api.latency, aggregate: p99, condition: "> 1"}\n'
    )
    [(path, message)] = issues(text)
    assert path == "alerts[0].aggregate"
    assert "rank error is ±0.997 %: its p99 could be anywhere between p98 and p100" in message


def test_a_spec_built_in_python_is_held_to_the_same_rules() -> None:
    with pytest.raises(ValueError, match="quantiles: 'hdr' is not one of tdigest, kll"):
        WindowSpec(name="w", kind="tumbling", size_ms=10_000, quantiles="hdr")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="session window computes no percentiles yet"):
        WindowSpec(name="w", kind="session", gap_ms=5_000, key="user", quantiles="kll")
    window = WindowSpec(name="w", kind="tumbling", size_ms=10_000, quantiles="kll")
    assert PipelineConfig(name="c", windows=(window,)).kll_k == 200


def test_validate_prints_what_kll_buys(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "shop.yaml"
    path.write_text(
        "windows:\n"
        "  - {name: fast, kind: tumbling, size: 10s, quantiles: kll}\n"
        "  - {name: slow, kind: tumbling, size: 10s}\n"
    )
    assert main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    comments = [line for line in out.splitlines() if line.startswith("#")]
    assert comments[-3:] == [
        "#   timers in fast (quantiles: kll): KLL k 200, ~5 KiB, instead of the t-digest;",
        "#     rank error ±1.33 % at any quantile (99 % confidence): p50 is a value between p48.67 and p51.33, p90 between p88.67 and p91.33;",
        "#     p99 and p999 not stored (a p99 would be anywhere in p97.67..p100)",
    ]


def test_an_expensive_kll_k_is_a_warning() -> None:
    config = parse_config(
        "sketches: {quantile_error: 0.0005}\n"
        "windows: [{name: w, kind: tumbling, size: 10s, quantiles: kll}]\n",
        "t",
    )
    assert config.kll_k is not None and config.kll_k > 5000
    assert any("needs KLL k" in warning for warning in config.warnings)


@pytest.mark.parametrize(
    "window",
    [
        "{name: w, kind: tumbling, size: 10s, sets: separate}",
        "{name: w, kind: tumbling, size: 10s, sets: with_timers}",
        "{name: w, kind: hopping, size: 10s, hop: 5s, sets: native}",
    ],
)
def test_sets_is_refused_with_why_it_is_gone(window: str) -> None:
    """``sets:`` chose where a window merged its sets, a speed trade-off that no longer exists:
    a config that still says it is told to remove it, at its path."""
    message = "unknown key; sets: is no longer needed (every metric type takes one path): remove it"
    assert issues(f"windows: [{window}]") == [("windows[0].sets", message)]


def test_a_tumbling_window_is_one_query_with_one_checkpoint(tmp_path: Path) -> None:
    """Every metric type of a tumbling or hopping window takes one query: one checkpoint,
    which retention counts (``WindowPlan.checkpoints``)."""
    from streamgauge.windows.plan import JobPaths, WindowPlan, checkpoint_dir

    config = parse_config("windows: [{name: w, kind: tumbling, size: 10s}]", "t")
    paths = JobPaths(spool=tmp_path / "spool", checkpoints=tmp_path / "checkpoints")
    assert WindowPlan.of(config, paths).checkpoints == [checkpoint_dir(paths, config, config.windows[0])]
