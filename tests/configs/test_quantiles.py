"""``quantiles: tdigest | kll`` per window: shape, rules, alerts it refuses, what validate says."""

# ruff: noqa: E501  (tables of cases and messages read best one per line)

from __future__ import annotations

from pathlib import Path

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
    canonical = config.to_canonical_dict()["windows"]
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
        "#   timers in fast (quantiles: kll): KLL k 200, ~5 KiB; merged by Spark natively (no sketch-lane query);",
        "#     rank error ±1.33 % at any quantile (99 % confidence): p50 is a value between p48.67 and p51.33, p90 between p88.67 and p91.33;",
        "#     p99 and p999 not stored (a p99 would be anywhere in p97.67..p100), no HDR histogram rows",
    ]


def test_an_expensive_kll_k_is_a_warning() -> None:
    config = parse_config(
        "sketches: {quantile_error: 0.0005}\n"
        "windows: [{name: w, kind: tumbling, size: 10s, quantiles: kll}]\n",
        "t",
    )
    assert config.kll_k is not None and config.kll_k > 5000
    assert any("needs KLL k" in warning for warning in config.warnings)


def test_sets_with_timers_is_per_tumbling_window_and_moves_its_sets_to_the_sketch_lane() -> None:
    """``sets: with_timers``: the window's sets merge in its sketch lane (``splits_sets``),
    its native lane takes counters and gauges only; the default keeps sets native, and a
    hopping window whose hop is its size is the tumbling window it is."""
    from streamgauge.windows.checkpoints import splits_sets
    from streamgauge.windows.job import native_lane_types, sketch_lane_types

    config = parse_config(
        "windows:\n"
        "  - {name: apart, kind: tumbling, size: 10s, sets: with_timers}\n"
        "  - {name: whole, kind: hopping, size: 10s, hop: 10s, sets: with_timers}\n"
        "  - {name: plain, kind: tumbling, size: 10s}\n",
        "t",
    )
    assert [w.sets for w in config.windows] == ["with_timers", "with_timers", "native"]
    assert [splits_sets(w) for w in config.windows] == [True, True, False]
    apart, _, plain = config.windows
    assert (native_lane_types(apart), sketch_lane_types(apart)) == (
        ("c", "g"), ("d", "h", "ms", "s"))  # fmt: skip
    assert (native_lane_types(plain), sketch_lane_types(plain)) == (
        ("c", "g", "s"), ("d", "h", "ms"))  # fmt: skip
    canonical = config.to_canonical_dict()["windows"]
    assert [w["sets"] for w in canonical] == ["with_timers", "with_timers", "native"]
    assert parse_config(yaml.safe_dump(config.to_canonical_dict()), "again") == config


def test_sets_separate_runs_sets_in_a_query_of_their_own(tmp_path: Path) -> None:
    """``sets: separate``: the native lane takes counters and gauges only, the sketch lane
    its usual types, and the sets a third query with a checkpoint of its own, which
    retention counts (``all_checkpoints``); the window's checkpoint differs from the other
    two choices' (other states)."""
    from streamgauge.windows.checkpoints import (
        JobPaths,
        all_checkpoints,
        checkpoint_dir,
        sets_checkpoint,
        sets_query,
        splits_sets,
    )
    from streamgauge.windows.job import native_lane_types, sketch_lane_types

    def window_of(sets: str) -> str:
        return f"  - {{name: w, kind: tumbling, size: 10s, sets: {sets}}}\n"

    configs = {sets: parse_config("windows:\n" + window_of(sets), "t")
               for sets in ("separate", "with_timers", "native")}  # fmt: skip
    separate = configs["separate"].windows[0]
    assert (sets_query(separate), splits_sets(separate)) == (True, False)
    assert (native_lane_types(separate), sketch_lane_types(separate)) == (
        ("c", "g"), ("d", "h", "ms"))  # fmt: skip
    paths = JobPaths(spool=tmp_path / "spool", checkpoints=tmp_path / "checkpoints")
    own = checkpoint_dir(paths, configs["separate"], separate)
    assert sets_checkpoint(own) in all_checkpoints(paths, configs["separate"])
    assert len({checkpoint_dir(paths, c, c.windows[0]) for c in configs.values()}) == 3
    for other in ("with_timers", "native"):
        assert not sets_query(configs[other].windows[0])
        assert len(all_checkpoints(paths, configs[other])) == 2
    canonical = configs["separate"].to_canonical_dict()
    assert canonical["windows"][0]["sets"] == "separate"
    assert parse_config(yaml.safe_dump(canonical), "again") == configs["separate"]


@pytest.mark.parametrize(
    ("window", "path", "message"),
    [
        ("{name: w, kind: tumbling, size: 10s, sets: timers}", "windows[0].sets", "unknown value 'timers'; one of native, with_timers, separate; did you mean with_timers?"),
        ("{name: w, kind: tumbling, size: 10s, sets: 1}", "windows[0].sets", "must be one of native, with_timers, separate, not a number (1)"),
        ("{name: w, kind: hopping, size: 10s, hop: 5s, sets: with_timers}", "windows[0].sets", "tumbling windows only: a hopping window merges its sets by panes"),
        ("{name: w, kind: sliding, size: 5s, sets: with_timers}", "windows[0].sets", "tumbling windows only: a sliding window merges its sets in its own operator already"),
        ("{name: w, kind: tumbling, size: 10s, quantiles: kll, sets: with_timers}", "windows[0].sets", "a quantiles: kll window runs one query, which merges every type"),
        ("{name: w, kind: tumbling, size: 10s, quantiles: kll, sets: separate}", "windows[0].sets", "a quantiles: kll window runs one query, which merges every type"),
        ("{name: w, kind: session, gap: 5s, key: user, sets: separate}", "windows[0].sets", "tumbling windows only: a session window merges its sets in its own operator already"),
    ],
)  # fmt: skip
def test_bad_sets_are_reported_at_their_path(window: str, path: str, message: str) -> None:
    assert issues(f"windows: [{window}]") == [(path, message)]
