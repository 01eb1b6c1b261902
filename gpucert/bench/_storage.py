"""Sequential read throughput of a mounted volume (a PVC or a host path): ``storage_read_gbps``, GB/s.

What is measured must be the storage, not the page cache the file was just written through: each repeat
reads a file written once, in 16 MiB sequential reads, with **fio** when it is on the PATH (``--direct=1``;
where the file system refuses direct I/O, ``--invalidate=1``: fio drops the file's cached pages first),
else with **O_DIRECT** into page-aligned (``mmap``) buffers, else (tmpfs refuses O_DIRECT at ``open``)
after **posix_fadvise(DONTNEED)** on the fsynced file. A file system that ignores that (tmpfs keeps its data
nowhere else) then measures memory: the log line says which method ran, so such a number is never taken
for a disk's. A path that is missing, is not a directory or cannot be written is a :class:`StorageError`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["BLOCK_BYTES", "StorageBench", "StorageError", "parse_fio_json"]

#: One sequential read (and write) request; a multiple of every block size O_DIRECT may require.
BLOCK_BYTES = 16 << 20
#: A fio run per repeat may not take longer than this (it also lays the file out on its first run).
FIO_TIMEOUT_S = 1800.0


class StorageError(Exception):
    """The storage step cannot run or measure; the message names the path or the tool."""


def parse_fio_json(text: str) -> float:
    """GB/s read by the job of ``fio --output-format=json`` output (``read.bw_bytes``, else ``read.bw`` in
    KiB/s); raises ``ValueError`` for output that holds no such job, or a job that failed."""
    start = text.find("{")
    if start < 0:
        raise ValueError("fio printed no JSON")
    try:
        report, _ = json.JSONDecoder().raw_decode(text[start:])
    except ValueError:
        raise ValueError("fio's JSON output is not valid JSON") from None
    jobs = report.get("jobs") if isinstance(report, dict) else None
    if not isinstance(jobs, list) or not jobs or not isinstance(jobs[0], dict):
        raise ValueError("fio's JSON output holds no job")
    job = jobs[0]
    if job.get("error"):
        raise ValueError(f"fio's job failed with error {job['error']}")
    read = job.get("read")
    if not isinstance(read, dict):
        raise ValueError("fio's job has no read statistics")
    if isinstance(read.get("bw_bytes"), (int, float)):
        bytes_per_s = float(read["bw_bytes"])
    elif isinstance(read.get("bw"), (int, float)):
        bytes_per_s = float(read["bw"]) * 1024
    else:
        raise ValueError("fio's read statistics hold no bandwidth (bw_bytes or bw)")
    if not bytes_per_s > 0:
        raise ValueError(f"fio read at {bytes_per_s:g} bytes/s: nothing was read")
    return bytes_per_s / 1e9


@dataclass
class StorageBench:
    """Reads of a ``size_bytes`` file under ``path``; :meth:`prepare` once, :meth:`measure` per repeat,
    :meth:`close` at the end. ``fio`` is the fio executable (None: the payload's own reads)."""

    path: str
    size_bytes: int
    fio: str | None = field(default_factory=lambda: shutil.which("fio"))
    block_bytes: int = BLOCK_BYTES
    #: how the last measurement read: the words of the run's log line
    method: str = field(default="", init=False)
    _file: Path | None = field(default=None, init=False)
    _direct: bool = field(default=True, init=False)

    def __post_init__(self) -> None:
        # Whole blocks: O_DIRECT reads need lengths (and so a file) aligned to the block.
        blocks = max(1, -(-self.size_bytes // self.block_bytes))
        self.size_bytes = blocks * self.block_bytes

    @property
    def file(self) -> Path:
        return Path(self.path) / f".gpucert-storage-read-{os.getpid()}.dat"

    def prepare(self) -> None:
        """Check the path and write the file (fio lays its file out itself); raises :class:`StorageError`."""
        where = Path(self.path)
        if not where.exists():
            raise StorageError(f"the storage path {self.path} does not exist (is the volume mounted?)")
        if not where.is_dir():
            raise StorageError(f"the storage path {self.path} is not a directory")
        if not os.access(where, os.W_OK | os.X_OK):
            raise StorageError(f"the storage path {self.path} is not writable by this process")
        self._file = self.file
        if self.fio is None:
            self._write()

    def measure(self) -> float:
        """GB/s of one read of the whole file; raises :class:`StorageError`."""
        if self._file is None:
            raise StorageError("the storage step was not prepared")
        return self._fio() if self.fio is not None else self._read()

    def close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.unlink()

    # --- fio ---------------------------------------------------------------------------------------------

    def _fio(self) -> float:
        assert self._file is not None
        assert self.fio is not None
        job = f"--rw=read --bs={self.block_bytes} --size={self.size_bytes} --ioengine=psync --numjobs=1"
        args = [self.fio, "--name=gpucert-read", f"--filename={self._file}", *job.split(), "--output-format=json"]
        refused = ""
        if self._direct:
            done = self._run_fio([*args, "--direct=1"])
            if done.returncode == 0:
                self.method = "fio, direct I/O (O_DIRECT)"
                return self._parsed(done)
            self._direct = False  # the file system refuses direct I/O (tmpfs): drop the cache instead
            refused = _tail(done.stderr or done.stdout)
        done = self._run_fio([*args, "--direct=0", "--invalidate=1"])
        if done.returncode != 0:
            why = _tail(done.stderr or done.stdout)
            raise StorageError(f"fio failed on {self._file} (exit {done.returncode}): {why}")
        self.method = "fio, buffered reads after dropping the file's cached pages (--invalidate=1)" + (
            f"; direct I/O refused: {refused}" if refused else ""
        )
        return self._parsed(done)

    def _run_fio(self, args: list[str]) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(args, capture_output=True, text=True, timeout=FIO_TIMEOUT_S, check=False)
        except subprocess.TimeoutExpired:
            raise StorageError(f"fio did not finish reading {self._file} in {FIO_TIMEOUT_S:.0f} s") from None
        except OSError as exc:
            raise StorageError(f"cannot run {self.fio}: {exc.strerror or exc}") from None

    def _parsed(self, done: subprocess.CompletedProcess[str]) -> float:
        try:
            return parse_fio_json(done.stdout)
        except ValueError as exc:
            raise StorageError(f"fio on {self._file}: {exc}") from None

    # --- the payload's own reads -------------------------------------------------------------------------

    def _write(self) -> None:
        """The file, of distinct random blocks (nothing a compressing or deduplicating file system can
        shrink), fsynced so that its pages are clean and the cache can drop them."""
        assert self._file is not None
        pattern = bytearray(os.urandom(self.block_bytes))
        try:
            with open(self._file, "wb", buffering=0) as out:
                for i in range(self.size_bytes // self.block_bytes):
                    pattern[:8] = i.to_bytes(8, "little")
                    out.write(pattern)
                os.fsync(out.fileno())
        except OSError as exc:
            self.close()
            raise StorageError(f"cannot write {self._file}: {exc.strerror or exc}") from None

    def _read(self) -> float:
        assert self._file is not None
        fd, direct = self._open()
        try:
            buffer = mmap.mmap(-1, self.block_bytes)  # page-aligned, as O_DIRECT requires
            try:
                if not direct:
                    self._drop_cache(fd)
                started = time.perf_counter()
                total = 0
                while True:
                    try:
                        got = os.readv(fd, [buffer])
                    except OSError as exc:
                        if direct and total == 0 and exc.errno == errno.EINVAL:
                            # O_DIRECT opened but refused at the first read: read through the cache.
                            self._direct = False
                            os.close(fd)
                            fd, direct = self._open()
                            self._drop_cache(fd)
                            started = time.perf_counter()
                            continue
                        raise StorageError(f"cannot read {self._file}: {exc.strerror or exc}") from None
                    if got == 0:
                        break
                    total += got
                elapsed = time.perf_counter() - started
            finally:
                buffer.close()
        finally:
            os.close(fd)
        if total < self.size_bytes:
            raise StorageError(f"{self._file} ended after {total:,} of its {self.size_bytes:,} bytes")
        if not elapsed > 0:
            raise StorageError(f"reading {self._file} took no measurable time")
        return total / elapsed / 1e9

    def _open(self) -> tuple[int, bool]:
        """A descriptor on the file: O_DIRECT while the file system accepts it; sets :attr:`method`."""
        assert self._file is not None
        o_direct = getattr(os, "O_DIRECT", 0)
        if self._direct and o_direct:
            try:
                fd = os.open(self._file, os.O_RDONLY | o_direct)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise StorageError(f"cannot open {self._file}: {exc.strerror or exc}") from None
                self._direct = False  # tmpfs refuses O_DIRECT at open
            else:
                self.method = "O_DIRECT reads (the page cache bypassed)"
                return fd, True
        self._direct = False
        try:
            fd = os.open(self._file, os.O_RDONLY)
        except OSError as exc:
            raise StorageError(f"cannot open {self._file}: {exc.strerror or exc}") from None
        if hasattr(os, "posix_fadvise"):
            self.method = (
                "buffered reads after posix_fadvise(DONTNEED) (the file system refused O_DIRECT; one that keeps "
                "its data in memory, such as tmpfs, measures memory)"
            )
        else:
            self.method = "buffered reads, the page cache not dropped (no O_DIRECT, no posix_fadvise): memory"
        return fd, False

    def _drop_cache(self, fd: int) -> None:
        if hasattr(os, "posix_fadvise"):
            with contextlib.suppress(OSError):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)


def _tail(text: str, limit: int = 300) -> str:
    words = " ".join((text or "").split())
    return words[-limit:] or "(no message)"
