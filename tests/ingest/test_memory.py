"""Released library pages (memory.py): the libraries still work, with the same results."""

from __future__ import annotations

import sys

import numpy as np
import pyarrow as pa
import pytest

from streamgauge.ingest import memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc, /proc")


def test_released_library_pages_leave_the_libraries_working() -> None:
    """Only clean, read-only pages go: numpy and Arrow IPC give the same results after."""
    values = np.arange(100_000, dtype=np.int64)
    batch = pa.record_batch([pa.array(values)], names=["v"])

    def round_trip() -> list[int]:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        read: list[int] = pa.ipc.open_stream(sink.getvalue()).read_all().column("v").to_pylist()
        return read[-3:]

    before = (round_trip(), int(values.sum()))
    released_kb = memory.release_library_pages(lambda path: "libarrow" in path)
    assert released_kb > 1024  # libarrow's code that importing and the round trip touched
    assert (round_trip(), int(values.sum())) == before
    assert memory.release_library_pages(lambda path: False) == 0


def test_shared_library_names() -> None:
    assert memory.shared_library("/usr/lib/x86_64-linux-gnu/libcrypto.so.3")
    assert memory.shared_library("/venv/site-packages/numpy/_core/_multiarray_umath.cpython.so")
    assert not memory.shared_library("/usr/lib/locale/C.utf8/LC_CTYPE")
    assert not memory.shared_library("/venv/site-packages/pyarrow/libarrow.sonnet")
