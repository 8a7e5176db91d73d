"""Where numba keeps the compiled code of streamgauge's kernels (``cache=True``).

numba checks a cached function against its own source file only. A function that calls a
compiled function of another module (the read-ahead loop inlines ``sources.source_key``)
keeps running the old callee after that module changes, after a ``git pull`` say, until its
cache is deleted by hand. So the cache lives in a directory named by a hash of every module
that compiles code: a change to any of them compiles afresh into a new directory, and the
directories of other versions are removed. A ``NUMBA_CACHE_DIR`` set by the user is kept.

Set through the environment before numba is imported (``streamgauge/__init__.py``), so that
commands that never compile (``status``) do not pay for importing numba.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
_PREFIX = "numba-"


_IMPORTS_NUMBA = re.compile(r"^(?:from|import) (?:numba|llvmlite)\b", re.MULTILINE)


_IMPORTS_OURS = re.compile(r"^from streamgauge((?:\.\w+)*) import \(?([\w, ]*)", re.MULTILINE)


def compiled_sources(package: Path = PACKAGE) -> list[Path]:
    """The package's modules that import numba (those that compile code, or define the
    intrinsics it calls), and the package modules they import from: compiled code has their
    functions inlined and their constants frozen in."""
    found: set[Path] = set()
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8", errors="replace")
        if not _IMPORTS_NUMBA.search(text):
            continue
        found.add(path)
        for module, names in _IMPORTS_OURS.findall(text):
            base = package.joinpath(*module.split(".")[1:])
            candidates = [base.with_suffix(".py")]
            candidates += [base / f"{name.strip()}.py" for name in names.split(",")]
            found.update(candidate for candidate in candidates if candidate.is_file())
    return sorted(found)


def cache_dir(package: Path = PACKAGE) -> Path:
    """The cache directory of this version of ``package``'s compiled modules."""
    digest = hashlib.sha256()
    for path in compiled_sources(package):
        digest.update(path.relative_to(package).as_posix().encode() + b"\0")
        digest.update(path.read_bytes())
    name = _PREFIX + digest.hexdigest()[:16]
    inside = package / "__pycache__"
    if os.access(inside if inside.exists() else package, os.W_OK):
        return inside / name
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return home / "streamgauge" / name


def use_versioned_cache(package: Path = PACKAGE) -> None:
    """Point numba at ``cache_dir`` (unless the user chose one) and remove the caches of
    other versions beside it."""
    if "NUMBA_CACHE_DIR" in os.environ:
        return
    try:
        chosen = cache_dir(package)
    except OSError:  # a module unreadable: numba's own per-file cache, as before
        return
    os.environ["NUMBA_CACHE_DIR"] = str(chosen)
    with contextlib.suppress(OSError):
        for other in chosen.parent.glob(_PREFIX + "*"):
            if other != chosen:
                shutil.rmtree(other, ignore_errors=True)
