"""Typing help for tests that read segments of a local spool by path."""

from __future__ import annotations

from pathlib import Path

from streamgauge.ingest.spool_fs import SpoolPath


def local_path(path: SpoolPath) -> Path:
    """``path`` as the ``Path`` it is on a local spool (``LocalSpool.path``): ``SpoolPath``
    also admits an object store's key, which ``read_segment``/``read_heartbeat`` do not take."""
    assert isinstance(path, Path), path
    return path
