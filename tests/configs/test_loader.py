"""The YAML loader: shipped configs load, canonical forms, and every mistake reported at once."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import cast

import pytest
import yaml

from streamgauge.configs import (
    AlertSpec,
    ConfigError,
    ConfigIssue,
    PipelineConfig,
    WindowSpec,
    load_config,
    parse_config,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def issues_of(text: str) -> list[tuple[str, str]]:
    with pytest.raises(ConfigError) as caught:
        parse_config(textwrap.dedent(text), "test.yaml")
    return [(issue.path, issue.message) for issue in caught.value.issues]


def one_window(body: str, *, pane: str = "1s") -> str:
    """A config holding a single window whose keys are ``body`` (one ``key: value`` a line)."""
    lines = textwrap.dedent(body).strip().splitlines()
    window = "\n".join(["  - " + lines[0], *("    " + line for line in lines[1:])])
    return f"pane: {pane}\nwindows:\n{window}\n"


# --- the shipped configs ---------------------------------------------------------------------


def test_quickstart_loads() -> None:
    assert load_config(CONFIGS / "quickstart.yaml") == PipelineConfig(
        name="quickstart",
        pane_ms=1_000,
        windows=(
            WindowSpec(
                name="per_10s",
                kind="tumbling",
                size_ms=10_000,
                watermark_delay_ms=1_000,
                allowed_lateness_ms=5_000,
                metrics=("*",),
                group_by=(),
            ),
            WindowSpec(
                name="per_1m",
                kind="tumbling",
                size_ms=60_000,
                watermark_delay_ms=2_000,
                allowed_lateness_ms=30_000,
            ),
        ),
        alerts=(
            AlertSpec(
                name="ingest_rejecting_lines",
                window="per_1m",
                metric="streamgauge.ingest.rejected",
                aggregate="sum",
                op=">",
                threshold=0,
                labels=(("severity", "warning"),),
                annotations=(
                    ("summary", "streamgauge is rejecting StatsD lines (see streamgauge status)"),
                ),
            ),
        ),
    )


def test_reference_loads_one_window_of_each_kind() -> None:
    config = load_config(CONFIGS / "reference.yaml")
    assert (config.name, config.pane_ms) == ("reference", 1_000)
    assert [(w.name, w.kind) for w in config.windows] == [
        ("per_10s", "tumbling"),
        ("api_1m_every_10s", "hopping"),
        ("checkout_errors_5m", "sliding"),
        ("user_sessions", "session"),
        ("clients_1m", "tumbling"),
    ]
    hopping = config.window("api_1m_every_10s")
    assert (hopping.size_ms, hopping.hop_ms, hopping.group_by) == (
        60_000,
        10_000,
        ("endpoint", "status"),
    )
    session = config.window("user_sessions")
    assert (session.size_ms, session.gap_ms, session.key) == (None, 1_800_000, "user")
    assert (session.watermark_delay_ms, session.allowed_lateness_ms) == (5_000, 60_000)


def test_reference_uses_every_key() -> None:
    """The reference is the documentation: a key added to the schema must appear in it."""
    document = yaml.safe_load((CONFIGS / "reference.yaml").read_text())
    assert set(document) == {"name", "pane", "windows", "alerts"}
    assert set().union(*document["alerts"]) == {
        "name",
        "window",
        "metric",
        "aggregate",
        "condition",
        "for",
        "tags",
        "labels",
        "annotations",
    }
    assert set().union(*document["windows"]) == {
        "name",
        "kind",
        "size",
        "hop",
        "offset",
        "gap",
        "key",
        "watermark_delay",
        "allowed_lateness",
        "metrics",
        "group_by",
        "quantiles",
        "early_every",
    }


@pytest.mark.parametrize("file", ["quickstart.yaml", "reference.yaml"])
def test_canonical_dict_loads_back_to_the_same_config(file: str) -> None:
    config = load_config(CONFIGS / file)
    printed = yaml.safe_dump(config.to_canonical_dict(), sort_keys=False)
    assert parse_config(printed, "<validate>") == config


# --- defaults and canonicalisation -----------------------------------------------------------


def test_defaults() -> None:
    config = parse_config("windows: [{name: w, kind: tumbling, size: 10s}]", "<text>")
    assert config == PipelineConfig(
        name="streamgauge",
        pane_ms=1_000,
        windows=(
            WindowSpec(
                name="w",
                kind="tumbling",
                size_ms=10_000,
                hop_ms=None,
                offset_ms=0,
                gap_ms=None,
                key=None,
                watermark_delay_ms=1_000,
                allowed_lateness_ms=0,
                metrics=("*",),
                group_by=(),
            ),
        ),
    )
    assert config.to_canonical_dict() == {
        "name": "streamgauge",
        "pane": "1s",
        "windows": [
            {
                "name": "w",
                "kind": "tumbling",
                "size": "10s",
                "offset": "0s",
                "watermark_delay": "1s",
                "allowed_lateness": "0s",
                "metrics": ["*"],
                "group_by": [],
                "quantiles": "tdigest",
            }
        ],
    }


def test_hop_equal_to_size_is_canonicalised_to_tumbling() -> None:
    config = parse_config(
        one_window("name: w\nkind: hopping\nsize: 10s\nhop: 10s\nallowed_lateness: 2s"), "t"
    )
    window = config.window("w")
    assert (window.kind, window.size_ms, window.hop_ms, window.offset_ms) == (
        "tumbling",
        10_000,
        None,
        0,
    )
    assert window == WindowSpec(
        name="w", kind="tumbling", size_ms=10_000, allowed_lateness_ms=2_000
    )
    assert config.to_canonical_dict()["windows"] == [
        {
            "name": "w",
            "kind": "tumbling",
            "size": "10s",
            "offset": "0s",
            "watermark_delay": "1s",
            "allowed_lateness": "2s",
            "metrics": ["*"],
            "group_by": [],
            "quantiles": "tdigest",
        }
    ]


def test_early_every_on_tumbling_hopping_and_sliding_windows() -> None:
    config = parse_config(
        "windows:\n"
        "  - {name: t, kind: tumbling, size: 1h, early_every: 1m}\n"
        "  - {name: h, kind: hopping, size: 10s, hop: 5s, early_every: 2s}\n"
        "  - {name: s, kind: sliding, size: 10s, early_every: 3s}\n"
        "  - {name: n, kind: tumbling, size: 10s}\n",
        "<text>",
    )
    assert [w.early_every_ms for w in config.windows] == [60_000, 2_000, 3_000, None]
    # a list of the windows' own canonical dicts (PipelineConfig.to_canonical_dict)
    printed = cast(list[dict[str, object]], config.to_canonical_dict()["windows"])
    assert [w.get("early_every") for w in printed] == ["1m", "2s", "3s", None]


def test_hopping_window_with_a_smaller_hop_stays_hopping() -> None:
    window = parse_config(one_window("name: w\nkind: hopping\nsize: 1m\nhop: 15s"), "t").window("w")
    assert (window.kind, window.size_ms, window.hop_ms) == ("hopping", 60_000, 15_000)


def test_session_window_values() -> None:
    window = parse_config(
        one_window("name: s\nkind: session\ngap: 30s\nkey: user\ngroup_by: [device]"), "t"
    ).window("s")
    assert (window.kind, window.size_ms, window.gap_ms, window.key, window.group_by) == (
        "session",
        None,
        30_000,
        "user",
        ("device",),
    )


@pytest.mark.parametrize(
    ("file_name", "expected"),
    [
        ("quick.yaml", "quick"),
        ("Checkout-API.yaml", "checkout_api"),
        ("prod.eu-west.yml", "prod_eu_west"),
        ("x" * 80 + ".yaml", "x" * 63),
    ],
)
def test_default_name_is_the_file_stem(tmp_path: Path, file_name: str, expected: str) -> None:
    path = tmp_path / file_name
    path.write_text("windows: [{name: w, kind: sliding, size: 5m}]\n")
    assert load_config(path).name == expected


def test_name_key_wins_over_the_file_stem(tmp_path: Path) -> None:
    path = tmp_path / "file_stem.yaml"
    path.write_text("name: from_key\nwindows: [{name: w, kind: sliding, size: 5m}]\n")
    assert load_config(path).name == "from_key"


# --- every mistake at once -------------------------------------------------------------------

MANY_MISTAKES = """\
name: many_mistakes
pane: 1s
retention: 7d                   # unknown key at the top level
windows:
  - name: per_10s
    kind: tumbling
    size: 10s
    hop: 5s                     # hop on a tumbling window
  - name: per_10s               # duplicate name
    kind: tumbling
    size: 2500ms                # not a multiple of the pane
  - name: hopping_bad
    kind: hopping
    size: 10s
    hop: 3s                     # size not a multiple of hop
    colour: red                 # unknown key in a window
  - name: late
    kind: tumbling
    size: 1m
    allowed_lateness: 5 seconds # bad duration
  - name: no_size
    kind: sliding               # missing size
"""

WINDOW_KEYS = (
    "name, kind, size, hop, offset, gap, key, watermark_delay, allowed_lateness, metrics, "
    "group_by, quantiles, early_every"
)


def test_many_mistakes_are_reported_together_in_document_order() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(MANY_MISTAKES, "many.yaml")
    error = caught.value
    assert error.source == "many.yaml"
    assert error.issues == (
        ConfigIssue(
            "retention", "unknown key; valid keys here: name, pane, sketches, windows, alerts"
        ),
        ConfigIssue(
            "windows[0].hop", "not allowed on a tumbling window (hop belongs to hopping windows)"
        ),
        ConfigIssue(
            "windows[1].name", "duplicate window name 'per_10s' (already used by windows[0])"
        ),
        ConfigIssue("windows[1].size", "2500ms is not a multiple of the pane 1s"),
        ConfigIssue("windows[2].hop", "size 10s is not a multiple of hop 3s"),
        ConfigIssue("windows[2].colour", f"unknown key; valid keys here: {WINDOW_KEYS}"),
        ConfigIssue(
            "windows[3].allowed_lateness",
            "'5 seconds': unknown unit ' seconds' (units: d, h, m, s, ms)",
        ),
        ConfigIssue("windows[4].size", "required for a sliding window"),
    )
    assert str(error).splitlines() == [
        "many.yaml: retention: unknown key; valid keys here: name, pane, sketches, windows, alerts",
        "many.yaml: windows[0].hop: not allowed on a tumbling window "
        "(hop belongs to hopping windows)",
        "many.yaml: windows[1].name: duplicate window name 'per_10s' (already used by windows[0])",
        "many.yaml: windows[1].size: 2500ms is not a multiple of the pane 1s",
        "many.yaml: windows[2].hop: size 10s is not a multiple of hop 3s",
        f"many.yaml: windows[2].colour: unknown key; valid keys here: {WINDOW_KEYS}",
        "many.yaml: windows[3].allowed_lateness: '5 seconds': unknown unit ' seconds' "
        "(units: d, h, m, s, ms)",
        "many.yaml: windows[4].size: required for a sliding window",
    ]


def test_bad_entries_in_a_list_do_not_hide_the_others() -> None:
    text = one_window("name: w\nkind: sliding\nsize: 5s\ngroup_by: [a, 1, a, 'x:y']")
    assert issues_of(text) == [
        ("windows[0].group_by[1]", "must be a string, not a number (1)"),
        ("windows[0].group_by[2]", "duplicate tag 'a' (already group_by[0])"),
        (
            "windows[0].group_by[3]",
            "'x:y' is not a tag name; tag names contain no whitespace, ':', ',' or '|'",
        ),
    ]


# --- one mistake at a time: (window keys, pane) -> exactly these issues -----------------------

SINGLE_WINDOW_MISTAKES = [
    (
        "name: w\nkind: tumbling\nsize: 10",
        [
            (
                "windows[0].size",
                "10 has no unit; write 10s for seconds or 10ms for milliseconds "
                "(units: d, h, m, s, ms)",
            )
        ],
    ),
    (
        "name: w\nkind: tumbling\nsize: 1.5",
        [
            (
                "windows[0].size",
                "1.5 has no unit; write a whole number with a unit, like 1500ms or 2s "
                "(units: d, h, m, s, ms)",
            )
        ],
    ),
    (
        "name: w\nkind: tumbling\nsize: [10s]",
        [("windows[0].size", "must be a duration like 10s or 250ms, not a list")],
    ),
    (
        "name: w\nkind: tumbling\nsize:",
        [("windows[0].size", "empty value; write a value or remove the key")],
    ),
    ("name: w\nkind: tumbling", [("windows[0].size", "required for a tumbling window")]),
    (
        "name: w\nkind: hopping\nsize: 10s",
        [("windows[0].hop", "required for a hopping window")],
    ),
    (
        "name: w\nkind: session",
        [
            ("windows[0].gap", "required for a session window"),
            ("windows[0].key", "required for a session window"),
        ],
    ),
    (
        "kind: sliding\nsize: 5s",
        [("windows[0].name", "required; every window needs a name, stored with its rows")],
    ),
    (
        "name: w\nsize: 5s",
        [("windows[0].kind", "required; one of tumbling, hopping, sliding, session")],
    ),
    (
        "name: w\nkind: tumbeling\nsize: 5s",
        [
            (
                "windows[0].kind",
                "unknown kind 'tumbeling'; one of tumbling, hopping, sliding, session; "
                "did you mean tumbling?",
            )
        ],
    ),
    (
        "name: w\nkind: session\nsize: 10s\ngap: 5s\nkey: user",
        [
            (
                "windows[0].size",
                "not allowed on a session window "
                "(size belongs to tumbling, hopping and sliding windows)",
            )
        ],
    ),
    (
        "name: w\nkind: hopping\nsize: 10s\nhop: 5s\noffset: 1s",
        [
            (
                "windows[0].offset",
                "not allowed on a hopping window (offset belongs to tumbling windows)",
            )
        ],
    ),
    (
        "name: w\nkind: sliding\nsize: 10s\nhop: 5s",
        [
            (
                "windows[0].hop",
                "not allowed on a sliding window (hop belongs to hopping windows); "
                "for fixed windows that advance by hop, use kind: hopping",
            )
        ],
    ),
    (
        "name: w\nkind: tumbling\nsize: 10s\ngap: 5s\nkey: user",
        [
            ("windows[0].gap", "not allowed on a tumbling window (gap belongs to session windows)"),
            ("windows[0].key", "not allowed on a tumbling window (key belongs to session windows)"),
        ],
    ),
    (
        "name: w\nkind: hopping\nsize: 10s\nhop: 20s",
        [
            (
                "windows[0].hop",
                "hop 20s is larger than size 10s; events between two windows would fall in none "
                "(hop must be at most size)",
            )
        ],
    ),
    (
        "name: w\nkind: tumbling\nsize: 10s\noffset: 10s",
        [("windows[0].offset", "offset 10s must be smaller than size 10s")],
    ),
    (
        "name: w\nkind: tumbling\nsize: 10s\noffset: 500ms",
        [("windows[0].offset", "500ms is not a multiple of the pane 1s")],
    ),
    (
        "name: w\nkind: hopping\nsize: 10s\nhop: 2500ms",
        [("windows[0].hop", "2500ms is not a multiple of the pane 1s")],
    ),
    (
        "name: w\nkind: session\ngap: 1500ms\nkey: user",
        [("windows[0].gap", "1500ms is not a multiple of the pane 1s")],
    ),
    ("name: w\nkind: sliding\nsize: 0s", [("windows[0].size", "must be greater than 0, not 0s")]),
    (
        "name: w\nkind: hopping\nsize: 10s\nhop: 0s",
        [("windows[0].hop", "must be greater than 0, not 0s")],
    ),
    (
        "name: w\nkind: session\ngap: 0ms\nkey: user",
        [("windows[0].gap", "must be greater than 0, not 0s")],
    ),
    (
        "name: w\nkind: sliding\nsize: 5s\nwatermark_delay: -1s",
        [("windows[0].watermark_delay", "'-1s' is negative; durations are 0 or more")],
    ),
    (
        "name: Per-10s\nkind: sliding\nsize: 5s",
        [
            (
                "windows[0].name",
                "'Per-10s' is not a valid name; use only lowercase letters, digits and _",
            )
        ],
    ),
    (
        f"name: {'w' * 64}\nkind: sliding\nsize: 5s",
        [("windows[0].name", f"'{'w' * 64}' is 64 characters long; the limit is 63")],
    ),
    (
        "name: 10\nkind: sliding\nsize: 5s",
        [("windows[0].name", "must be a string, not a number (10)")],
    ),
    (
        "name: w\nkind: sliding\nsize: 5s\nmetrics: []",
        [("windows[0].metrics", "must list at least one glob; ['*'] matches all")],
    ),
    (
        "name: w\nkind: sliding\nsize: 5s\nmetrics: 'api.*'",
        [("windows[0].metrics", 'must be a list like ["a", "b"], not a string (\'api.*\')')],
    ),
    (
        "name: w\nkind: sliding\nsize: 5s\nmetrics: ['']",
        [("windows[0].metrics[0]", "an empty glob matches no metric")],
    ),
    (
        "name: w\nkind: sliding\nsize: 5s\ngroup_by: ['']",
        [("windows[0].group_by[0]", "a tag name cannot be empty")],
    ),
    (
        "name: w\nkind: session\ngap: 5s\nkey: 'user id'",
        [
            (
                "windows[0].key",
                "'user id' is not a tag name; tag names contain no whitespace, ':', ',' or '|'",
            )
        ],
    ),
    (
        "name: w\nkind: tumbling\nsize: 10s\nearly_every: 10s",
        [
            (
                "windows[0].early_every",
                "early_every 10s must be smaller than size 10s; the emission at the window's "
                "end is the on-time one, not an early one",
            )
        ],
    ),
    (
        "name: w\nkind: hopping\nsize: 10s\nhop: 5s\nearly_every: 2500ms",
        [("windows[0].early_every", "2500ms is not a multiple of the pane 1s")],
    ),
    (
        "name: w\nkind: tumbling\nsize: 10s\nearly_every: 0s",
        [("windows[0].early_every", "must be greater than 0, not 0s")],
    ),
    (
        "name: w\nkind: session\ngap: 5s\nkey: user\nearly_every: 1s",
        [
            (
                "windows[0].early_every",
                "not supported on a session window: a session's end moves with every event, "
                "so each time it grows it is a new window row, and early rows would be "
                "re-emitted at every micro-batch instead of once per early_every; a session "
                "appears when the watermark passes its end (use a tumbling or hopping window "
                "for running values)",
            )
        ],
    ),
    (
        "name: w\nkind: tumbling\nsize: 10s\nearly: 2s",
        [("windows[0].early", "unknown key; did you mean early_every?")],
    ),
    (
        "name: w\nkind: sliding\nsize: 5s\nslide: 1s",
        [("windows[0].slide", "unknown key; did you mean hop?")],
    ),
    (
        "name: w\nkind: sliding\nsize: 5s\ngroupby: [a]",
        [("windows[0].groupby", "unknown key; did you mean group_by?")],
    ),
    (
        "name: w\nkind: sliding\nsize: 5s\npane: 1s",
        [
            (
                "windows[0].pane",
                "unknown key; pane is set once for the whole config, at the top level",
            )
        ],
    ),
    (
        "name: w\nkind: sliding\nsize: 5s\nsize: 6s",
        [
            (
                "windows[0].size",
                "duplicate key (first at line 5, again at line 6); "
                "YAML would keep only the last one",
            )
        ],
    ),
    (
        "name: w\nkind: sliding\nsize: 5s\n1: x",
        [("windows[0]", "key 1 is not a name; keys are words like size or windows")],
    ),
]


@pytest.mark.parametrize(("body", "expected"), SINGLE_WINDOW_MISTAKES)
def test_single_window_mistakes(body: str, expected: list[tuple[str, str]]) -> None:
    assert issues_of(one_window(body)) == expected


def test_pane_must_divide_every_size_and_be_positive() -> None:
    assert issues_of(one_window("name: w\nkind: tumbling\nsize: 10s", pane="3s")) == [
        ("windows[0].size", "10s is not a multiple of the pane 3s")
    ]
    assert issues_of(one_window("name: w\nkind: tumbling\nsize: 10s", pane="0s")) == [
        ("pane", "must be greater than 0, not 0s")
    ]
    assert (
        parse_config(one_window("name: w\nkind: tumbling\nsize: 10s", pane="250ms"), "t").pane_ms
        == 250
    )


# --- whole-document mistakes -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "windows:\n  - name: a\n    kind: tumbling\n   size: 10s\n",
            "invalid YAML at line 4, column 4: expected <block end>, but found "
            "'<block mapping start>' (while parsing a block collection)",
        ),
        (
            "windows: [a, b\n",
            "invalid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>' "
            "(while parsing a flow sequence)",
        ),
        (
            "name: a\n\tpane: 1s\n",
            "invalid YAML at line 2, column 1: found character '\\t' that cannot start any token "
            "(while scanning for the next token)",
        ),
        (
            "windows: []\n---\nwindows: []\n",
            "invalid YAML at line 2, column 1: but found another document "
            "(expected a single document in the stream)",
        ),
    ],
)
def test_yaml_syntax_errors_have_line_and_column(text: str, expected: str) -> None:
    assert issues_of(text) == [("", expected)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "- name: w\n  kind: sliding\n",
            "the document must be a mapping with the keys name, pane, sketches, windows, "
            "alerts, not a list",
        ),
        (
            "just a string\n",
            "the document must be a mapping with the keys name, pane, sketches, windows, alerts, "
            "not a string ('just a string')",
        ),
        ("", "the document is empty; a config needs at least a windows: list"),
        ("# only a comment\n", "the document is empty; a config needs at least a windows: list"),
    ],
)
def test_document_must_be_a_mapping(text: str, expected: str) -> None:
    assert issues_of(text) == [("", expected)]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("windows: []\n", [("windows", "no windows; a config needs at least one window")]),
        ("name: x\n", [("windows", "required; a config needs at least one window")]),
        (
            "windows: 5\n",
            [
                (
                    "windows",
                    "must be a list of windows (each starting with '- name:'), not a number (5)",
                )
            ],
        ),
        ("windows: [5]\n", [("windows[0]", "a window must be a mapping, not a number (5)")]),
        (
            "name: Prod-EU\nwindows: [{name: w, kind: sliding, size: 5s}]\n",
            [("name", "'Prod-EU' is not a valid name; use only lowercase letters, digits and _")],
        ),
        (
            "size: 10s\nwindows: [{name: w, kind: sliding, size: 5s}]\n",
            [("size", "unknown key; size belongs inside a window, under windows:")],
        ),
    ],
)
def test_document_level_mistakes(text: str, expected: list[tuple[str, str]]) -> None:
    assert issues_of(text) == expected


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "absent.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.issues == (
        ConfigIssue("", "cannot read the file: No such file or directory"),
    )
    assert str(caught.value) == f"{path}: cannot read the file: No such file or directory"


def test_non_utf8_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.issues == (
        ConfigIssue("", "cannot read the file: it is not UTF-8 text (invalid continuation byte)"),
    )


# --- the model on its own: the same rules without YAML ---------------------------------------


def test_window_spec_refuses_what_the_loader_refuses() -> None:
    with pytest.raises(ValueError) as caught:
        WindowSpec(name="w", kind="tumbling", size_ms=10_000, hop_ms=5_000)
    assert str(caught.value) == (
        "invalid window 'w': hop: not allowed on a tumbling window (hop belongs to hopping windows)"
    )
    with pytest.raises(ValueError) as caught:
        WindowSpec(name="w", kind="hopping", size_ms=10_000, hop_ms=3_000, offset_ms=-1)
    assert str(caught.value) == (
        "invalid window 'w': offset: not allowed on a hopping window "
        "(offset belongs to tumbling windows); hop: size 10s is not a multiple of hop 3s"
    )


def test_pipeline_config_checks_windows_against_its_pane() -> None:
    window = WindowSpec(name="w", kind="tumbling", size_ms=2_500)
    with pytest.raises(ValueError) as caught:
        PipelineConfig(name="c", pane_ms=1_000, windows=(window, window))
    assert str(caught.value) == (
        "invalid config 'c': windows[0].size: 2500ms is not a multiple of the pane 1s; "
        "windows[1].size: 2500ms is not a multiple of the pane 1s; "
        "windows[1].name: duplicate window name 'w' (already used by windows[0])"
    )
    assert PipelineConfig(name="c", pane_ms=500, windows=(window,)).window("w") is window


def test_window_lookup_names_the_known_windows() -> None:
    config = load_config(CONFIGS / "quickstart.yaml")
    assert config.window("per_1m").size_ms == 60_000
    with pytest.raises(KeyError, match="has no window 'per_5m' \\(windows: per_10s, per_1m\\)"):
        config.window("per_5m")


@pytest.mark.parametrize(
    ("metrics", "metric", "expected"),
    [
        (("*",), "anything.at.all", True),
        (("api.*",), "api.latency", True),
        (("api.*",), "api.http.requests", True),
        (("api.*",), "apix.latency", False),
        (("api.*",), "API.latency", False),
        (("checkout.errors", "checkout.*.errors"), "checkout.eu.errors", True),
        (("checkout.errors", "checkout.*.errors"), "checkout.errors", True),
        (("checkout.errors", "checkout.*.errors"), "checkout.errors.total", False),
        (("db.query_?",), "db.query_1", True),
        (("db.query_?",), "db.query_10", False),
        (("host[12].cpu",), "host2.cpu", True),
        (("host[12].cpu",), "host3.cpu", False),
    ],
)
def test_matches(metrics: tuple[str, ...], metric: str, expected: bool) -> None:
    window = WindowSpec(name="w", kind="sliding", size_ms=1_000, metrics=metrics)
    assert window.matches(metric) is expected
