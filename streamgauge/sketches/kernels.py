"""Running the column kernels (``digest_columns``, ``hdr_columns``, ``hdr_encoding``,
``hll_unions``) on several cores: a batch's rows split into chunks, each chunk one call of a
compiled kernel on a thread of a small pool.

Every kernel is compiled with ``nogil=True``, so the calls of a batch's chunks run at once on
the pool's threads (:func:`run_chunks`). Each row is computed exactly as in one call over all
rows, whatever chunk or thread computed it: the bytes are identical for any number of threads
(the tests compare). Chunks are contiguous rows of about equal work (:func:`chunk_bounds`),
a few per thread, taken by the threads in turn; kernels that write variable-size output write
each chunk's from a bound on its size on, and a last serial pass moves the chunks together.

Why a thread pool rather than numba's ``parallel=True``: the same speed on these row loops, but
nothing more to compile (``prange`` kernels took about 8 s more on the first run, with an empty
cache) and no threading layer (OpenMP's spinning threads, its fork safety, ``workqueue``'s lack
of thread safety when a caller runs batches on several threads).

Threads: :func:`threads`, the cores this process may use, or ``STREAMGAUGE_KERNEL_THREADS``;
:func:`set_threads` changes it. With one thread, or a batch too small to be worth a split
(:data:`MIN_CHUNK_WORK`), the kernels run in the calling thread.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar, cast

import numba
import numpy as np
import numpy.typing as npt

__all__ = [
    "chunk_bounds", "compact", "copy_runs", "jit", "merge_capacity", "run_chunks", "run_indices",
    "set_threads", "threads",
]  # fmt: skip

_F = TypeVar("_F", bound=Callable[..., Any])
_T = TypeVar("_T")

#: Fewest work units (centroids, buckets, ...) worth a chunk of their own: below about this,
#: handing a chunk to a thread costs more than it saves.
MIN_CHUNK_WORK = 50_000
#: Chunks per thread: a few, so that one slow chunk (larger rows) delays the batch less.
CHUNKS_PER_THREAD = 4
#: Tests set this to split every batch into (at most) this many chunks, whatever the threads
#: and the work: the chunked path on small inputs, and on one thread.
FORCE_CHUNKS: int | None = None


def _default_threads() -> int:
    configured = os.environ.get("STREAMGAUGE_KERNEL_THREADS", "")
    if configured:
        return max(1, int(configured))
    return max(1, len(os.sched_getaffinity(0)))


_threads = _default_threads()
_pool: ThreadPoolExecutor | None = None
_pool_pid = 0
_pool_lock = threading.Lock()


def jit(function: _F) -> _F:
    """numba's ``njit``, typed for mypy (numba ships no annotations). ``nogil``: chunks of a
    batch, and batches of several caller threads, run at once."""
    return cast(_F, numba.njit(cache=True, nogil=True)(function))


@jit
def merge_capacity(a_offsets: Any, heads: Any, offsets: Any, order: Any, b_first: Any,
                   b_last: Any) -> Any:  # fmt: skip
    """The output bounds of a CSR merge by owner: per owner ``g``, the entries of its held row
    ``heads[g]`` (in ``a_offsets``; -1: none) and of its inputs ``order[b_first[g]:b_last[g]]``
    (in ``offsets``), summed from the first owner on (``n + 1`` entries). A merge never outputs
    more than it reads, so owner ``g``'s output fits in ``capacity[g] .. capacity[g + 1]``."""
    n_owners = len(heads)
    capacity = np.zeros(n_owners + 1, np.int64)
    for g in range(n_owners):
        size = 0
        for r in range(b_first[g], b_last[g]):
            i = order[r]
            size += offsets[i + 1] - offsets[i]
        h = heads[g]
        if h >= 0:
            size += a_offsets[h + 1] - a_offsets[h]
        capacity[g + 1] = capacity[g] + size
    return capacity


@jit
def copy_runs(starts: Any, sizes: Any, out_starts: Any, first: Any, second: Any,
              out_first: Any, out_second: Any) -> None:  # fmt: skip
    """CSR rows copied whole, two columns at once: run ``i`` of ``sizes[i]`` entries of
    ``first`` and ``second`` from ``starts[i]`` to ``out_starts[i]`` of ``out_first`` and
    ``out_second`` (a gather of rows: a run per row, not an index per entry)."""
    for i in range(len(sizes)):
        s = starts[i]
        o = out_starts[i]
        size = sizes[i]
        out_first[o : o + size] = first[s : s + size]
        out_second[o : o + size] = second[s : s + size]


def run_indices(starts: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64]
                ) -> npt.NDArray[np.int64]:  # fmt: skip
    """The indices ``starts[i] .. starts[i] + sizes[i] - 1`` of every run ``i``, end to end:
    what a gather of CSR rows indexes a column with when it copies by numpy indexing rather
    than by ``copy_runs``."""
    ends = np.cumsum(sizes)
    indices: npt.NDArray[np.int64] = (
        np.repeat(starts - ends + sizes, sizes) + np.arange(int(ends[-1]) if len(ends) else 0))
    return indices


def threads() -> int:
    """Threads a batch's chunks run on."""
    return _threads


def set_threads(count: int) -> None:
    """Run batches' chunks on ``count`` threads (1: in the calling thread only)."""
    global _threads, _pool
    if count < 1:
        raise ValueError(f"threads must be at least 1, got {count}")
    with _pool_lock:
        _threads = count
        if _pool is not None:
            _pool.shutdown(wait=False)
            _pool = None


def _executor() -> ThreadPoolExecutor:
    """The pool, made on first use (and again in a forked child, whose copy has no threads)."""
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():
            _pool = ThreadPoolExecutor(_threads, thread_name_prefix="sketch-kernels")
            _pool_pid = os.getpid()
        return _pool


def chunk_bounds(offsets: npt.NDArray[np.int64]) -> npt.NDArray[np.int64] | None:
    """Row bounds (``k + 1`` entries, from 0 to ``n``) splitting the CSR rows of ``offsets``
    into ``k`` chunks of about equal work (entries, and 1 per row), or ``None`` when the calling
    thread should do it all (one thread, or too little work to split)."""
    n = len(offsets) - 1
    work = int(offsets[-1] - offsets[0]) + n
    if FORCE_CHUNKS is not None:
        k = min(FORCE_CHUNKS, n)
    else:
        k = min(_threads * CHUNKS_PER_THREAD, work // MIN_CHUNK_WORK, n) if _threads > 1 else 1
    if k < 2:
        return None
    # Chunk c ends at the first row whose start reaches c/k of the work.
    targets = offsets[0] + (np.arange(1, k, dtype=np.int64) * work) // k
    weighted = offsets[:-1] + np.arange(n, dtype=np.int64)
    inner = np.searchsorted(weighted, targets, "left").astype(np.int64)
    bounds = np.unique(np.concatenate([[0], inner, [n]]).astype(np.int64))
    return bounds if len(bounds) > 2 else None


def run_chunks(work: Callable[[int], _T], n_chunks: int) -> list[_T]:
    """``[work(0), ..., work(n_chunks - 1)]``, the calls spread over the pool's threads (each
    ``work(c)`` calls a ``nogil`` kernel on chunk ``c``, so they run at once)."""
    if n_chunks <= 1 or _threads == 1:
        return [work(c) for c in range(n_chunks)]
    return list(_executor().map(work, range(n_chunks)))


def compact(chunks: npt.NDArray[np.int64], starts: npt.NDArray[np.int64], ends: list[int],
            offsets: npt.NDArray[np.int64], *arrays: npt.NDArray[Any]) -> int:  # fmt: skip
    """After a chunked kernel wrote chunk ``c``'s output at ``starts[c] .. ends[c]`` of each of
    ``arrays`` (the first at 0): move every chunk down behind the one before it, in order (by
    numpy, which copies overlapping ranges correctly at memory speed), and shift the CSR
    ``offsets`` of its rows (``chunks[c] + 1 .. chunks[c + 1]``) with it. Returns the end of
    the output."""
    end = int(ends[0])
    for c in range(1, len(chunks) - 1):
        source = int(starts[c])
        size = int(ends[c]) - source
        shift = source - end
        if shift:
            for array in arrays:
                array[end : end + size] = array[source : source + size]
            offsets[chunks[c] + 1 : chunks[c + 1] + 1] -= shift
        end += size
    return end
