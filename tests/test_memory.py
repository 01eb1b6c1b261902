"""``release_freed_memory``: the flow process gives what its waves freed back to the system;
``keep_freed_memory``: a one-command process keeps it for reuse (each in a process of its own: the
setting is the whole process's)."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from gpucert._memory import freed_memory_kept, release_freed_memory, return_arrow_memory

_GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def test_freed_memory_is_given_back_where_glibc_can() -> None:
    assert release_freed_memory() is _GLIBC


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


def _python(script: str) -> str:
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_block_freed_is_the_next_one_allocated_once_memory_is_kept() -> None:
    """64 MB malloc'ed, touched and freed, then again: the second time finds its pages already there
    (by default glibc maps a block that big on its own, and unmaps it when freed)."""
    script = """
import ctypes, resource, sys
from gpucert._memory import keep_freed_memory
print(keep_freed_memory())
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
size = 64 << 20
def faults_touching_a_new_block():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    block = libc.malloc(size)
    ctypes.memset(block, 1, size)
    libc.free(block)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults_touching_a_new_block()
print(faults_touching_a_new_block())
"""
    kept, faults = _python(script).split()
    assert kept == str(_GLIBC)
    if _GLIBC:
        assert int(faults) < (64 << 20) // 4096 // 20, f"{faults} page faults: the freed block was not reused"


def test_only_the_gpucert_program_keeps_freed_memory(tmp_path: Path) -> None:
    """The program's compare keeps freed memory and reads Arrow through glibc; a caller of ``main`` (this
    test process) is left as it was."""
    missing = str(tmp_path / "absent.parquet")
    script = f"""
import sys
from gpucert import _memory, _prefetch, cli
sys.argv = ["gpucert", "compare", {missing!r}, "--baselines", {tmp_path.as_uri()!r}, "--out", "v.csv"]
try:
    cli.console()
except SystemExit as exit:
    print(exit.code, _memory.freed_memory_kept(), _prefetch._pool().backend_name)
"""
    code, kept, pool = _python(script).split()
    assert code == "2"  # the results file is not there: still a clean exit
    assert kept == str(_GLIBC)
    assert pool == ("system" if _GLIBC else pa.jemalloc_memory_pool().backend_name)
    from gpucert.cli import main

    assert main(["compare", missing, "--baselines", tmp_path.as_uri(), "--out", str(tmp_path / "v.csv")]) == 2
    assert not freed_memory_kept()
