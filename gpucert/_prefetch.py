"""Reading Parquet results ahead, while the interpreter is still importing pandas, and the Arrow memory pool
the results are read into.

``gpucert compare`` spends its first half second importing, on one core; decoding a fleet's Parquet results
takes about as long. :func:`prefetch_parquet` starts the decoding on a thread once the arguments are parsed
(on Arrow's threads too: measured faster than one decoding thread on 2 cores, 1.79 s against 1.90 s median
of twelve compares of 100,000 GPUs), and :func:`gpucert.results.read_results` takes the table (:func:`take`)
instead of reading the file again; it still validates every value, and reads again a file that failed to
decode. This module imports neither pandas nor :mod:`gpucert.results` (whose import is what it overlaps).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from ._memory import freed_memory_kept

__all__ = ["discard", "prefetch_parquet", "reading_pool", "take"]

_PARQUET = (".parquet", ".pq")

_lock = threading.Lock()
#: file identity → the thread reading it and where it puts the table (or nothing, when reading failed)
_pending: dict[tuple[str, int, int], tuple[threading.Thread, list[Any]]] = {}


def _identity(path: str | os.PathLike[str]) -> tuple[str, int, int] | None:
    """The file as it is now (real path, size, modification time), or ``None`` when it cannot be stat'ed."""
    try:
        real = os.path.realpath(path)
        info = os.stat(real)
    except (OSError, ValueError):
        return None
    return real, info.st_size, info.st_mtime_ns


def prefetch_parquet(paths: Sequence[str]) -> None:
    """Start decoding each Parquet file of ``paths`` (by suffix) on a daemon thread; other files and files
    that cannot be stat'ed are left to the reader."""
    for path in paths:
        if not path.lower().endswith(_PARQUET):
            continue
        key = _identity(path)
        if key is None:
            continue
        box: list[Any] = []
        thread = threading.Thread(target=_read, args=(key[0], box), name="gpucert-prefetch", daemon=True)
        with _lock:
            if key in _pending:
                continue
            _pending[key] = (thread, box)
        thread.start()


def _read(path: str, box: list[Any]) -> None:
    try:
        import pyarrow.parquet as pq

        # Not pq.read_table: it goes through pyarrow.dataset, whose import imports pandas, and so would
        # wait for the very import this read is to overlap (decoding began only once it ended).
        with reading_pool(), pq.ParquetFile(path) as parquet:
            box.append(parquet.read())
    except Exception:  # the reader reads the file again and reports what is wrong
        box.clear()


def take(path: str | os.PathLike[str]) -> Any | None:
    """The Arrow table read ahead for ``path`` (waiting for it), once; ``None`` when none was, when reading
    failed, or when the file changed since."""
    key = _identity(path)
    if key is None:
        return None
    with _lock:
        entry = _pending.pop(key, None)
    if entry is None:
        return None
    thread, box = entry
    thread.join()
    return box[0] if box else None


def discard() -> None:
    """Forget every table read ahead and not taken (a command that stopped before reading its results).

    Waits for reads still under way: a process must not exit while Arrow decodes on one of its threads.
    """
    with _lock:
        threads = [thread for thread, _ in _pending.values()]
        _pending.clear()
    for thread in threads:
        thread.join()


def _pool() -> Any:
    """The Arrow memory pool results are read into: the system's where glibc keeps freed memory
    (:func:`gpucert._memory.keep_freed_memory`), else jemalloc where this pyarrow has it; asked each time, as
    the allocator's setting may come later.

    Not Arrow's default (mimalloc): reading through it spent three to four times the system time (0.6 to 0.9 s
    against about 0.2 s on 100,000 GPUs × 3 repeats, 2-core VM), returning pages to the kernel and faulting
    them in again. The system's where glibc keeps what is freed, because the buffers the reader frees are
    then the very memory numpy's arrays take next.
    """
    import pyarrow as pa

    return pa.system_memory_pool() if freed_memory_kept() else _jemalloc_where_built()


@functools.cache
def _jemalloc_where_built() -> Any:
    import pyarrow as pa

    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:
        return pa.system_memory_pool()


class _PoolSwitch:
    """Who is reading through :func:`_pool` now, and the default pool to restore after the last."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0
        self.before: Any = None


_switch = _PoolSwitch()


@contextlib.contextmanager
def reading_pool() -> Iterator[None]:
    """Arrow's default memory pool is :func:`_pool` meanwhile (the Parquet, CSV and JSON readers take no
    pool argument). Every buffer remembers the pool it came from, so other threads' work is unaffected but
    for where its new buffers come from; nested and concurrent uses restore the default once, at the end
    of the last."""
    import pyarrow as pa

    with _switch.lock:
        if _switch.users == 0:
            _switch.before = pa.default_memory_pool()
            pa.set_memory_pool(_pool())
        _switch.users += 1
    try:
        yield
    finally:
        with _switch.lock:
            _switch.users -= 1
            if _switch.users == 0:
                pa.set_memory_pool(_switch.before)
                _switch.before = None
