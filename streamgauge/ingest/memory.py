"""The pages of shared libraries a receiver process mapped and does not use (a receiver's
peak RSS is to stay under 300 MB, ``docs/performance.md``).

Importing numba runs LLVM's static constructors, spread over the whole of libllvmlite (~105 MB
of its 178 MB resident); pyarrow brings libarrow, libarrow_compute, libparquet and libarrow_s3
(~40 MB resident after a receiver's start-up, most of it never used again: a receiver only
writes Arrow IPC). Those pages are clean copies of the files. ``release_library_pages`` drops
them from this process's page tables; a page used again is faulted back in from the page
cache, unchanged. Releasing every library's pages, not libllvmlite's alone, lowers peak RSS
at full rate by tens of MB at the same CPU (``bench/ingest.py`` reports each receiver's peak
RSS; ``bench/ingest/README.md``).

Tried and not kept: fixing glibc's mmap threshold (``mallopt(M_MMAP_THRESHOLD)``, which stops
it sliding up to the size of the largest block freed, so that big buffers stop coming from the
threads' heaps). It saves a little more RSS, but every wake-up's buffer becomes a fresh
mapping to fault in and zero: the receiver needs more CPU and starts losing lines at full
rate, at any threshold from 128 KiB to 4 MiB.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable

_MADV_DONTNEED = 4  # Linux


def shared_library(path: str) -> bool:
    """Every shared library: ``*.so`` and versioned ``*.so.N``."""
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".so") or ".so." in name


def release_library_pages(matches: Callable[[str], bool] = shared_library) -> int:
    """Drop this process's resident pages of the mapped files ``matches`` accepts that it
    cannot have written; returns the kB that were resident in them.

    Only mappings with no write permission and no private dirty or anonymous page are released
    (the relocated RELRO part of a library keeps its pages), so ``madvise(MADV_DONTNEED)`` only
    drops page-table entries: a page used again is faulted back in from the page cache,
    unchanged. The page cache keeps the files (shared by all receivers, reclaimable); what
    leaves is this process's RSS. Linux only; elsewhere, or on any error, nothing is released.
    """
    if not sys.platform.startswith("linux"):
        return 0
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        mappings: list[tuple[int, int, str, dict[str, int]]] = []  # start, end, perms, kB
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                head = line.split()
                if not head[0].endswith(":"):  # "start-end perms offset dev inode [path]"
                    if len(head) > 5 and head[5].startswith("/") and matches(head[5]):
                        start, end = (int(x, 16) for x in head[0].split("-"))
                        mappings.append((start, end, head[1], {}))
                    else:
                        mappings.append((0, 0, "", {}))
                elif mappings and len(head) >= 2 and head[1].isdigit():
                    mappings[-1][3][head[0][:-1]] = int(head[1])
        released = 0
        for start, end, perms, kb in mappings:
            if (end > start and "w" not in perms and kb.get("Private_Dirty", 1) == 0
                    and kb.get("Anonymous", 1) == 0
                    and libc.madvise(start, end - start, _MADV_DONTNEED) == 0):
                released += kb.get("Rss", 0)
        return released
    except (OSError, ValueError):
        return 0
