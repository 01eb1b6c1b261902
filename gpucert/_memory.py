"""Giving freed memory back to the operating system, for a long flow process between its big steps.

A certify of 10,000 nodes reads and parses millions of rows in its shards, then judges them: CPython and
glibc keep the freed arenas of the first for reuse, so the process's RSS after the shards stays near
their peak and the judge's own memory comes on top. :func:`release_freed_memory` collects garbage and
asks glibc (``malloc_trim``) to return free pages; elsewhere (macOS, musl) only the collection is done.
:func:`return_arrow_memory` makes Arrow's buffers part of what it returns: Arrow's own pools (mimalloc,
jemalloc) keep a parsed table's freed pages, about 350 MB of 3.9 million rows at the judge of 10,000 nodes.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
from collections.abc import Callable

__all__ = ["release_freed_memory", "return_arrow_memory"]


@functools.cache
def _trim() -> Callable[[int], int] | None:
    name = ctypes.util.find_library("c")
    if not name:
        return None
    try:
        return getattr(ctypes.CDLL(name), "malloc_trim", None)
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Collect garbage and return the C allocator's free memory to the system; returns whether glibc's
    ``malloc_trim`` was there to do the second part."""
    gc.collect()
    trim = _trim()
    if trim is None:
        return False
    trim(0)
    return True


def return_arrow_memory() -> None:
    """From now on Arrow allocates from the C allocator (its system pool), whose free pages
    :func:`release_freed_memory` returns, instead of mimalloc, which keeps them for reuse.

    For a long flow process whose big steps (a shard's logs, a night's results) come one after another;
    a command that reads once and exits keeps Arrow's faster pools (:mod:`gpucert._prefetch`).
    """
    import pyarrow as pa  # here: the module itself is imported by processes that never use Arrow

    pa.set_memory_pool(pa.system_memory_pool())
