"""numba's cache follows every module compiled code depends on: a change to a module whose
function or constant compiled code takes in (not only to the compiling module itself) moves
the cache to a new directory, and the directories of other versions go."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamgauge.compiled_cache import PACKAGE, cache_dir, compiled_sources, use_versioned_cache

MODULES = {
    "loop.py": "import numba\nfrom streamgauge.limits import MAX\n\n@numba.njit(cache=True)\n"
               "def f(x):\n    return min(x, MAX)\n",
    "limits.py": "MAX = 10\n",
    "cli.py": "print('no compiled code here')\n",
}  # fmt: skip


@pytest.mark.parametrize(
    ("edited", "moves"),
    [("loop.py", True), ("limits.py", True), ("cli.py", False)],
)
def test_the_cache_moves_when_compiled_code_or_what_it_takes_in_changes(
    tmp_path: Path, edited: str, moves: bool
) -> None:
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    assert [p.name for p in compiled_sources(tmp_path)] == ["limits.py", "loop.py"]
    before = cache_dir(tmp_path)
    (tmp_path / edited).write_text(MODULES[edited].replace("10", "20") + "# edited\n")
    assert (cache_dir(tmp_path) != before) is moves


def test_other_versions_caches_go_and_a_user_s_choice_stays(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, text in MODULES.items():
        (tmp_path / name).write_text(text)
    stale = tmp_path / "__pycache__" / "numba-0123456789abcdef"
    stale.mkdir(parents=True)
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    use_versioned_cache(tmp_path)
    assert os.environ["NUMBA_CACHE_DIR"] == str(cache_dir(tmp_path))
    assert not stale.exists()
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/somewhere/else")
    use_versioned_cache(tmp_path)
    assert os.environ["NUMBA_CACHE_DIR"] == "/somewhere/else"


def test_importing_streamgauge_points_numba_at_this_version_s_cache() -> None:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", "import streamgauge, numba; print(numba.config.CACHE_DIR)"],
        env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == str(cache_dir(PACKAGE))
    names = {p.relative_to(PACKAGE).as_posix() for p in compiled_sources()}
    assert {"ingest/read_ahead.py", "ingest/sources.py", "sketches/kernels.py"} <= names
