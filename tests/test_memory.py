"""``release_freed_memory``: the flow process gives what its waves freed back to the system."""

from __future__ import annotations

import platform
import sys

import pyarrow as pa

from gpucert._memory import release_freed_memory, return_arrow_memory


def test_freed_memory_is_given_back_where_glibc_can() -> None:
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert release_freed_memory() is glibc


def test_arrow_allocates_where_the_release_reaches() -> None:
    """After return_arrow_memory a parsed table's buffers come from the C allocator, which
    release_freed_memory trims, not from mimalloc or jemalloc, which keep their pages."""
    before = pa.default_memory_pool()
    try:
        return_arrow_memory()
        assert pa.default_memory_pool().backend_name == "system"
        assert pa.array(range(1000)).buffers()[1] is not None  # allocates through it
    finally:
        pa.set_memory_pool(before)
