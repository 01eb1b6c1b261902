"""Giving freed memory back to the operating system, for a long flow process between its big steps; and
keeping it, for a short command.

A certify of 10,000 nodes parses millions of rows in its shards, then judges them: glibc keeps the freed
arenas for reuse, so the judge's memory comes on top of the shards' peak. :func:`release_freed_memory`
collects garbage and asks glibc (``malloc_trim``) to return free pages; :func:`return_arrow_memory` has Arrow
allocate from glibc too (its own pools kept about 350 MB of a 3.9-million-row table at that judge).

A command that reads once and exits (``gpucert compare``) wants the opposite, :func:`keep_freed_memory`: by
default glibc maps each block over 32 MB (one float column of 4 million rows) afresh and unmaps it when
freed, so the process faults in new pages all the way through, and page faults are dear on a virtual machine.
"""

from __future__ import annotations

import ctypes
import functools
import gc
from collections.abc import Callable

__all__ = ["freed_memory_kept", "keep_freed_memory", "release_freed_memory", "return_arrow_memory"]

# mallopt's parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8


class _Allocator:
    """What this process told the C allocator."""

    keeps_freed_memory = False


_allocator = _Allocator()


@functools.cache
def _libc_function(name: str) -> Callable[..., int] | None:
    """The C library's function ``name`` (of the process's own symbols: no search for the library, which
    would run ``ldconfig``), or ``None`` where it has none (``mallopt`` on macOS)."""
    try:
        return getattr(ctypes.CDLL(None), name, None)
    except OSError:
        return None


def release_freed_memory() -> bool:
    """Collect garbage and return the C allocator's free memory to the system; returns whether glibc's
    ``malloc_trim`` was there to do the second part."""
    gc.collect()
    trim = _libc_function("malloc_trim")
    if trim is None:
        return False
    trim(0)
    return True


def return_arrow_memory() -> None:
    """From now on Arrow allocates from the C allocator (its system pool), whose free pages
    :func:`release_freed_memory` returns, instead of mimalloc, which keeps them: for a long flow process."""
    import pyarrow as pa  # here: the module itself is imported by processes that never use Arrow

    pa.set_memory_pool(pa.system_memory_pool())


def keep_freed_memory() -> bool:
    """For the rest of this process glibc keeps freed memory for reuse and serves every thread from one
    heap, and Arrow (:func:`gpucert._prefetch.reading_pool`) allocates from glibc; returns whether glibc
    was there to be told. Call it first, and only in a process that exits when its one job is done.

    Measured on ``gpucert compare`` of 100,000 GPUs × 3 repeats (2-core VM, ten runs side by side): 8 % less
    wall time, a third less system time, 110 MB less peak memory.
    """
    mallopt = _libc_function("mallopt")
    if mallopt is None:
        return False
    # Each call returns 1 on success; a glibc that refuses one keeps its defaults for the others.
    settled = [
        mallopt(_M_MMAP_MAX, 0),  # no block mapped on its own, so none unmapped when freed
        mallopt(_M_TRIM_THRESHOLD, 2**31 - 1),  # nor the heap's top given back
        mallopt(_M_ARENA_MAX, 1),  # and what one thread frees, another reuses
    ]
    _allocator.keeps_freed_memory = all(r == 1 for r in settled)
    return _allocator.keeps_freed_memory


def freed_memory_kept() -> bool:
    """Whether :func:`keep_freed_memory` took effect in this process."""
    return _allocator.keeps_freed_memory
