"""The ``sketches:`` section: error targets compiled into sketch parameters, checked like the rest.

Targets are what the user writes (``distinct_error: 0.02``); ``PipelineConfig.sketches`` is
what they compile to (``streamgauge.sketches.accuracy.compile_accuracy``), the parameters every
receiver and the window job build sketches with.
"""

from __future__ import annotations

import dataclasses
import textwrap
from pathlib import Path

import pytest
import yaml

from streamgauge.cli import main
from streamgauge.configs import (
    ConfigError,
    ConfigIssue,
    PipelineConfig,
    SketchTargets,
    WindowSpec,
    describe_sketches,
    parse_config,
)
from streamgauge.sketches.accuracy import SketchParams, compile_accuracy, hll_error

WINDOWS = "windows: [{name: w, kind: tumbling, size: 10s}]\n"
WINDOW = WindowSpec(name="w", kind="tumbling", size_ms=10_000)

EXAMPLE = """\
name: checkout
sketches:
  distinct_error: 0.02        # -> HLL lgK 14
  quantile_error: 0.005       # -> t-digest k 600, HDR 3 significant digits
  value_range: [0.1, 60000]
windows: [{name: w, kind: tumbling, size: 10s}]
"""


def issues_of(text: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        parse_config(textwrap.dedent(text), "test.yaml")
    return [(issue.path, issue.message) for issue in caught.value.issues]


def with_sketches(body: str) -> str:
    """A valid config whose ``sketches:`` section holds ``body`` (one ``key: value`` a line)."""
    lines = textwrap.dedent(body).strip().splitlines()
    return "sketches:\n" + "".join(f"  {line}\n" for line in lines) + WINDOWS


# --- good configs -------------------------------------------------------------------------------


def test_the_example_compiles_to_what_compile_accuracy_picks() -> None:
    config = parse_config(EXAMPLE, "<text>")
    assert config.sketch_targets == SketchTargets(
        distinct_error=0.02, quantile_error=0.005, value_range=(0.1, 60_000.0)
    )
    assert config.sketches == compile_accuracy(0.02, 0.005, (0.1, 60_000.0))
    params = config.sketches
    assert (params.hll_lg_k, params.tdigest_k, params.hdr_significant_digits) == (14, 600, 3)
    assert params.value_range == (0.1, 60_000.0)
    assert config.warnings == ()


def test_no_section_means_the_documented_defaults() -> None:
    config = parse_config(WINDOWS, "<text>")
    assert isinstance(config.sketches, SketchParams)
    assert config.sketches == compile_accuracy()
    assert (config.sketches.hll_lg_k, config.sketches.tdigest_k) == (12, 200)
    assert not config.sketch_targets.is_set
    assert "sketches" not in config.to_canonical_dict()


def test_an_empty_section_is_the_same_as_none() -> None:
    assert parse_config("sketches: {}\n" + WINDOWS, "<text>") == parse_config(WINDOWS, "<text>")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("distinct_error: 0.02", compile_accuracy(distinct_error=0.02)),
        ("quantile_error: 0.005", compile_accuracy(quantile_error=0.005)),
        ("value_range: [1, 60000]", compile_accuracy(value_range=(1.0, 60_000.0))),
        ("distinct_error: 0.033", compile_accuracy()),  # met by the default lgK 12
    ],
)
def test_every_key_is_optional(body: str, expected: SketchParams) -> None:
    assert parse_config(with_sketches(body), "<text>").sketches == expected


def test_expensive_targets_compile_with_warnings_at_their_keys() -> None:
    config = parse_config(with_sketches("distinct_error: 0.005\nquantile_error: 0.0001"), "t")
    assert config.sketches.hll_lg_k == 18
    assert config.warnings == (
        "sketches.distinct_error: 0.005 needs HLL lgK 18: up to 256 KiB per set series per window",
        "sketches.quantile_error: 0.0001 needs t-digest k 2000: about 37 KiB per timer series "
        "per window",
        "sketches.quantile_error: 0.0001 needs 4 significant digits in HDR histograms: up to "
        "16384 bucket rows per power of two of range per series per window",
    )


# --- bad configs: each at its path, with its reason -------------------------------------------

LG_K_21 = f"{hll_error(21):.3%}"

SKETCH_MISTAKES = [
    (
        "distinct_error: 0.0001",
        "sketches.distinct_error",
        f"0.0001 is impossible: it needs HLL lgK above 21, and lgK 21 gives ±{LG_K_21} at 2 sigma",
    ),
    (
        "quantile_error: 2",
        "sketches.quantile_error",
        "2 is impossible: an error target must be in (0, 1)",
    ),
    (
        "quantile_error: 0",
        "sketches.quantile_error",
        "0 is impossible: an error target must be in (0, 1)",
    ),
    (
        "quantile_error: 0.00001",
        "sketches.quantile_error",
        "1e-05 is impossible for the t-digest: the best measured compression (k=2000) reaches "
        "0.0001 in rank",
    ),
    ("distinct_error: .nan", "sketches.distinct_error", "nan is not a number"),
    (
        "value_range: [5, 1]",
        "sketches.value_range",
        "[5, 1] is impossible: it must be (low, high) with 0 < low < high, finite (HDR "
        "histograms record no negatives, and relative error is undefined at 0)",
    ),
    (
        "value_range: [0, 10]",
        "sketches.value_range",
        "[0, 10] is impossible: it must be (low, high) with 0 < low < high, finite (HDR "
        "histograms record no negatives, and relative error is undefined at 0)",
    ),
    (
        "value_range: [0.000000001, 1.0e+12]",
        "sketches.value_range",
        "[1e-09, 1000000000000] is impossible at 2 significant digits: it spans 1e+21x, and "
        "high scaled by 1e+11 exceeds 2^62",
    ),
    # wrong types
    (
        "distinct_error: 2%",
        "sketches.distinct_error",
        "must be a fraction, not a string ('2%'); write 0.02 for 2%",
    ),
    (
        "distinct_error: yes",
        "sketches.distinct_error",
        "must be a number like 0.02, not a boolean (true)",
    ),
    (
        "quantile_error: '0.01'",
        "sketches.quantile_error",
        "must be a number like 0.02, not a string ('0.01')",
    ),
    ("quantile_error:", "sketches.quantile_error", "empty value; write a value or remove the key"),
    (
        "value_range: [1]",
        "sketches.value_range",
        "must be [low, high], two numbers like [0.1, 60000], not a list of 1",
    ),
    (
        "value_range: [1, 10, 100]",
        "sketches.value_range",
        "must be [low, high], two numbers like [0.1, 60000], not a list of 3",
    ),
    (
        "value_range: [1ms, 1m]",
        "sketches.value_range",
        "must be [low, high], two numbers like [0.1, 60000], not a list of 2",
    ),
    (
        "value_range: 60000",
        "sketches.value_range",
        "must be [low, high], two numbers like [0.1, 60000], not a number (60000)",
    ),
    # unknown keys: parameters point to the target that picks them
    (
        "lg_k: 14",
        "sketches.lg_k",
        "unknown key; sketches: takes error targets and picks lg_k from them: "
        "did you mean distinct_error?",
    ),
    (
        "compression: 400",
        "sketches.compression",
        "unknown key; sketches: takes error targets and picks compression from them: "
        "did you mean quantile_error?",
    ),
    ("distinct_eror: 0.02", "sketches.distinct_eror", "unknown key; did you mean distinct_error?"),
    (
        "colour: red",
        "sketches.colour",
        "unknown key; valid keys here: distinct_error, quantile_error, value_range",
    ),
]


@pytest.mark.parametrize(("body", "path", "message"), SKETCH_MISTAKES)
def test_sketch_mistakes(body: str, path: str, message: str) -> None:
    assert issues_of(with_sketches(body)) == [(path, message)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "sketches: 0.02\n" + WINDOWS,
            [("sketches", "must be a mapping like {distinct_error: 0.02}, not a number (0.02)")],
        ),
        (
            "sketches:\n" + WINDOWS,
            [("sketches", "empty value; write a value or remove the key")],
        ),
        (
            "distinct_error: 0.02\n" + WINDOWS,
            [("distinct_error", "unknown key; distinct_error belongs under sketches:")],
        ),
        (
            "windows: [{name: w, kind: tumbling, size: 10s, quantile_error: 0.01}]\n",
            [
                (
                    "windows[0].quantile_error",
                    "unknown key; quantile_error is set once for the whole config, under sketches:",
                )
            ],
        ),
    ],
)
def test_section_level_mistakes(text: str, expected: list[tuple[str, str]]) -> None:
    assert issues_of(text) == expected


def test_sketch_mistakes_are_reported_with_every_other_mistake_in_document_order() -> None:
    text = """\
        pane: 1s
        sketches:
          distinct_error: 0.0001
          quantile_error: 2
          value_range: [5, 1]
          k: 400
        windows:
          - {name: w, kind: tumbling, size: 2500ms}
        alerts:
          - {name: a, window: nope, metric: m, aggregate: max, condition: "> 1"}
    """
    assert issues_of(text) == [
        (
            "sketches.distinct_error",
            f"0.0001 is impossible: it needs HLL lgK above 21, and lgK 21 gives ±{LG_K_21} at "
            "2 sigma",
        ),
        ("sketches.quantile_error", "2 is impossible: an error target must be in (0, 1)"),
        (
            "sketches.value_range",
            "[5, 1] is impossible: it must be (low, high) with 0 < low < high, finite (HDR "
            "histograms record no negatives, and relative error is undefined at 0)",
        ),
        (
            "sketches.k",
            "unknown key; sketches: takes error targets and picks k from them: "
            "did you mean quantile_error?",
        ),
        ("windows[0].size", "2500ms is not a multiple of the pane 1s"),
        ("alerts[0].window", "no window named 'nope' (windows: w)"),
    ]


# --- canonical form and round trip -------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        EXAMPLE,
        WINDOWS,
        "sketches: {}\n" + WINDOWS,
        with_sketches("value_range: [1, 60000]"),
        with_sketches("quantile_error: 0.0001"),
        with_sketches("distinct_error: 0.033"),  # compiles to the defaults, still printed
    ],
)
def test_canonical_yaml_loads_back_to_an_equal_config(text: str) -> None:
    config = parse_config(text, "<text>")
    printed = yaml.safe_dump(config.to_canonical_dict(), sort_keys=False)
    assert parse_config(printed, "<validate>") == config


def test_canonical_dict_holds_only_the_targets_that_were_set() -> None:
    canonical = parse_config(EXAMPLE, "<text>").to_canonical_dict()
    assert list(canonical) == ["name", "pane", "sketches", "windows"]
    assert canonical["sketches"] == {
        "distinct_error": 0.02,
        "quantile_error": 0.005,
        "value_range": [0.1, 60000],
    }
    partial = parse_config(with_sketches("distinct_error: 0.033"), "<text>")
    assert partial.to_canonical_dict()["sketches"] == {"distinct_error": 0.033}


# --- built in Python: held to the same rules ---------------------------------------------------


def test_existing_callers_get_the_defaults() -> None:
    config = PipelineConfig(name="c", pane_ms=1_000, windows=(WINDOW,), alerts=())
    assert config.sketches == compile_accuracy()
    assert config == parse_config("name: c\n" + WINDOWS, "<text>")


def test_targets_given_in_python_are_compiled() -> None:
    targets = SketchTargets(distinct_error=0.02, quantile_error=0.005, value_range=(0.1, 60_000))
    config = PipelineConfig(name="checkout", windows=(WINDOW,), sketch_targets=targets)
    assert config.sketches == compile_accuracy(0.02, 0.005, (0.1, 60_000.0))
    assert config == parse_config(EXAMPLE, "<text>")


@pytest.mark.parametrize(
    "params",
    [
        compile_accuracy(distinct_error=0.02),
        compile_accuracy(quantile_error=0.005, value_range=(0.1, 60_000.0)),
        compile_accuracy(0.01, 0.001, (1.0, 1e6)),
        compile_accuracy(quantile_error=0.0001),
    ],
)
def test_params_given_in_python_keep_their_choices_and_print_as_targets(
    params: SketchParams,
) -> None:
    config = PipelineConfig(name="c", windows=(WINDOW,), sketches=params)
    assert dataclasses.replace(config.sketches, warnings=()) == dataclasses.replace(
        params, warnings=()
    )
    printed = yaml.safe_dump(config.to_canonical_dict(), sort_keys=False)
    assert parse_config(printed, "<validate>") == config


def test_impossible_targets_in_python_raise_with_the_loaders_sentence() -> None:
    with pytest.raises(ValueError) as caught:
        PipelineConfig(
            name="c",
            windows=(WINDOW,),
            sketch_targets=SketchTargets(quantile_error=2, value_range=(5, 1)),
        )
    assert str(caught.value) == (
        "invalid config 'c': sketches.quantile_error: 2 is impossible: an error target must be "
        "in (0, 1); sketches.value_range: [5, 1] is impossible: it must be (low, high) with "
        "0 < low < high, finite (HDR histograms record no negatives, and relative error is "
        "undefined at 0)"
    )


def test_params_no_target_compiles_to_are_refused() -> None:
    handmade = dataclasses.replace(compile_accuracy(), hll_lg_k=13)  # error still lgK 12's
    with pytest.raises(ValueError, match="is not what any sketches: section compiles to"):
        PipelineConfig(name="c", windows=(WINDOW,), sketches=handmade)
    with pytest.raises(ValueError, match="is not what sketch_targets compiles to"):
        PipelineConfig(
            name="c",
            windows=(WINDOW,),
            sketches=compile_accuracy(distinct_error=0.02),
            sketch_targets=SketchTargets(distinct_error=0.01),
        )


def test_dataclasses_replace_keeps_or_recompiles_the_sketches() -> None:
    config = parse_config(EXAMPLE, "<text>")
    renamed = dataclasses.replace(config, name="other")
    assert (renamed.sketches, renamed.sketch_targets) == (config.sketches, config.sketch_targets)
    retargeted = dataclasses.replace(
        config, sketch_targets=SketchTargets(quantile_error=0.01), sketches=compile_accuracy()
    )
    assert retargeted.sketches == compile_accuracy(quantile_error=0.01)
    with pytest.raises(ValueError, match="pass sketches=compile_accuracy"):
        dataclasses.replace(config, sketch_targets=SketchTargets(quantile_error=0.01))


# --- streamgauge validate ----------------------------------------------------------------------


def test_validate_prints_the_compiled_parameters_as_comments(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "checkout.yaml"
    path.write_text(EXAMPLE)
    assert main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    config = parse_config(EXAMPLE, "<text>")
    assert yaml.safe_load(out) == config.to_canonical_dict()  # the comments do not change it
    assert parse_config(out, "<validate>") == config
    comments = [line for line in out.splitlines() if line.startswith("#")]
    assert comments == [f"# {line}" for line in describe_sketches(config.sketches)]
    assert comments == [
        "# sketches, compiled (what the targets cost per series and window):",
        "#   sets: HLL lgK 14, up to 16 KiB; distinct counts within ±1.62 % (2 sigma, any union)",
        "#   timers: t-digest k 600, ~11 KiB; rank error ≤ 0.0037 for p50..p90 (p99 and above "
        "far smaller)",
        "#   timers: HDR histogram, 3 significant digits; quantile values within ±0.1 % for "
        "values in [0.1, 60000] (outside: clamped and counted; scale 10000, highest 600000000)",
    ]


def test_validate_shows_the_defaults_when_nothing_is_set(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "plain.yaml"
    path.write_text(WINDOWS)
    assert main(["validate", str(path)]) == 0
    out, _ = capsys.readouterr()
    assert "sketches:" not in yaml.safe_dump(yaml.safe_load(out))
    assert "#   sets: HLL lgK 12, up to 4 KiB; distinct counts within ±3.28 %" in out
    assert "#   timers: t-digest k 200, ~3 KiB; rank error ≤ 0.0192 for p50..p90" in out


def test_validate_warns_about_expensive_targets_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "precise.yaml"
    path.write_text(with_sketches("distinct_error: 0.005"))
    assert main(["validate", str(path)]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [
        f"{path}: warning: sketches.distinct_error: 0.005 needs HLL lgK 18: up to 256 KiB per "
        "set series per window"
    ]
    assert "HLL lgK 18, up to 256 KiB" in out


def test_validate_reports_sketch_errors_with_the_others(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("sketches: {quantile_error: 2}\nwindows: [{name: w, kind: tumbling}]\n")
    assert main(["validate", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"{path}: sketches.quantile_error: 2 is impossible: an error target must be in (0, 1)",
        f"{path}: windows[0].size: required for a tumbling window",
        f"{path}: 2 error(s)",
    ]


def test_config_issue_paths_are_the_yaml_spelling() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(with_sketches("quantile_error: 2"), "x.yaml")
    assert caught.value.issues == (
        ConfigIssue(
            "sketches.quantile_error", "2 is impossible: an error target must be in (0, 1)"
        ),
    )
