"""``release_freed_memory``: the flow process gives what its waves freed back to the system."""

from __future__ import annotations

import platform
import sys

from gpucert._memory import release_freed_memory


def test_freed_memory_is_given_back_where_glibc_can() -> None:
    glibc = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"
    assert release_freed_memory() is glibc
