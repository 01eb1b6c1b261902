"""The payload's storage step: ``storage_read_gbps`` of a directory in tmp_path, small sizes.

tmp_path may be on a file system that takes O_DIRECT or on tmpfs, which refuses it at ``open``: either way a
number comes out and the log line names the method. A stand-in ``fio`` (a shell script printing fio's JSON)
checks the fio path, its fallback when direct I/O is refused, and its failures.
"""

from __future__ import annotations

import errno
import io
import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from gpucert.bench import RepeatRule
from gpucert.bench._cli import parse_args
from gpucert.bench._run import Options, run
from gpucert.bench._storage import BLOCK_BYTES, StorageBench, StorageError, parse_fio_json

MiB = 1 << 20
SKIP_ALL = frozenset({"gemm", "copy", "h2d", "d2h", "allreduce", "telemetry", "dcgm", "nic"})
#: What ``fio --output-format=json`` prints (fio 3.x, trimmed to what is read), with a warning line first.
FIO_JSON = {
    "fio version": "fio-3.36",
    "jobs": [
        {
            "jobname": "gpucert-read",
            "error": 0,
            "read": {"io_bytes": 33554432, "bw_bytes": 2_500_000_000, "bw": 2441406},
        }
    ],
}


class _NoNvml:
    class NVMLError(Exception):
        value = 12

    def nvmlInit(self) -> None:
        raise self.NVMLError("NVML Shared Library Not Found")


def _run(opts: Options) -> tuple[list[dict[str, Any]], str]:
    out, err = io.StringIO(), io.StringIO()
    assert run(opts, out=out, err=err, nvml_module=_NoNvml()) == 0
    return [json.loads(line) for line in out.getvalue().splitlines()], err.getvalue()


def test_fio_json_parses() -> None:
    text = "fio: note: both iodepth >= 1 and synchronous I/O engine are selected\n" + json.dumps(FIO_JSON)
    assert parse_fio_json(text) == 2.5
    kib = {"jobs": [{"error": 0, "read": {"bw": 1_000_000}}]}
    assert parse_fio_json(json.dumps(kib)) == pytest.approx(1.024)
    for bad, words in (
        ("", "no JSON"),
        ("{", "not valid JSON"),
        ('{"jobs": []}', "no job"),
        ('{"jobs": [{"error": 5, "read": {"bw_bytes": 1}}]}', "failed with error 5"),
        ('{"jobs": [{"error": 0, "read": {"bw_bytes": 0}}]}', "nothing was read"),
        ('{"jobs": [{"error": 0}]}', "no read statistics"),
    ):
        with pytest.raises(ValueError, match=words):
            parse_fio_json(bad)


def test_reads_beat_the_page_cache_or_say_they_could_not(tmp_path: Path) -> None:
    bench = StorageBench(str(tmp_path), 3 * MiB, fio=None, block_bytes=MiB)
    bench.prepare()
    try:
        assert bench.file.stat().st_size == 3 * MiB
        first = bench.measure()
        assert first > 0
        assert bench.method.startswith(("O_DIRECT", "buffered reads after posix_fadvise(DONTNEED)"))
        assert bench.measure() > 0
    finally:
        bench.close()
    assert not bench.file.exists()


def test_where_o_direct_is_refused_the_cache_is_dropped_and_the_method_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tmpfs refused O_DIRECT at open (EINVAL) before Linux 6.6, as other file systems still do."""
    if not getattr(os, "O_DIRECT", 0):
        pytest.skip("no O_DIRECT on this platform")
    real_open, dropped = os.open, []

    def refusing(path: Any, flags: int, *args: Any) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, *args)

    def fadvise(fd: int, offset: int, length: int, advice: int) -> None:
        dropped.append(advice)

    monkeypatch.setattr(os, "open", refusing)
    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    bench = StorageBench(str(tmp_path), 2 * MiB, fio=None, block_bytes=MiB)
    bench.prepare()
    try:
        assert bench.measure() > 0
        assert bench.measure() > 0
    finally:
        bench.close()
    assert dropped == [os.POSIX_FADV_DONTNEED] * 2  # before each read pass
    assert "posix_fadvise(DONTNEED)" in bench.method
    assert "refused O_DIRECT" in bench.method
    assert "tmpfs, measures memory" in bench.method


def test_the_size_is_whole_blocks(tmp_path: Path) -> None:
    assert StorageBench(str(tmp_path), 1, fio=None).size_bytes == BLOCK_BYTES
    assert StorageBench(str(tmp_path), 5 * MiB + 1, fio=None, block_bytes=MiB).size_bytes == 6 * MiB


def test_a_missing_or_unusable_path_names_it(tmp_path: Path) -> None:
    with pytest.raises(StorageError, match=f"the storage path {tmp_path / 'nope'} does not exist"):
        StorageBench(str(tmp_path / "nope"), MiB, fio=None).prepare()
    plain = tmp_path / "file"
    plain.write_text("x")
    with pytest.raises(StorageError, match="is not a directory"):
        StorageBench(str(plain), MiB, fio=None).prepare()


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_path_names_it(tmp_path: Path) -> None:
    locked = tmp_path / "ro"
    locked.mkdir(mode=0o555)
    with pytest.raises(StorageError, match=f"{locked} is not writable"):
        StorageBench(str(locked), MiB, fio=None).prepare()


def test_a_full_volume_is_an_error_naming_the_file(tmp_path: Path) -> None:
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full to stand for a full volume")
    bench = StorageBench(str(tmp_path), MiB, fio=None, block_bytes=MiB)
    bench.prepare()
    # Point the file at /dev/full: every write fails with ENOSPC.
    bench._file = Path("/dev/full")
    with pytest.raises(StorageError, match="cannot write /dev/full: No space left on device"):
        bench._write()


def _fake_fio(tmp_path: Path, script: str) -> str:
    tool = tmp_path / "fio"
    tool.write_text("#!/bin/sh\n" + script, encoding="utf-8")
    tool.chmod(0o755)
    return str(tool)


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for fio")
def test_fio_direct_then_buffered_when_direct_io_is_refused(tmp_path: Path) -> None:
    answer = tmp_path / "answer.json"
    answer.write_text(json.dumps(FIO_JSON))
    args = tmp_path / "args"
    fio = _fake_fio(
        tmp_path,
        f"""echo "$@" >> '{args}'
case "$*" in *--direct=1*) echo 'fio: looks like your file system does not support direct=1/buffered=0' >&2
  exit 1;; esac
cat '{answer}'
""",
    )
    data = tmp_path / "data"
    data.mkdir()
    bench = StorageBench(str(data), MiB, fio=fio)
    bench.prepare()
    assert bench.measure() == 2.5
    assert "--invalidate=1" in bench.method
    assert "direct I/O refused" in bench.method
    assert bench.measure() == 2.5  # direct I/O is not tried again
    calls = args.read_text().splitlines()
    assert len(calls) == 3
    assert "--direct=1" in calls[0]
    assert "--direct=0" in calls[1]
    assert "--direct=0" in calls[2]
    assert f"--filename={bench.file}" in calls[0]
    assert "--output-format=json" in calls[0]


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for fio")
def test_fio_that_fails_is_an_error_with_its_words(tmp_path: Path) -> None:
    fio = _fake_fio(tmp_path, "echo 'fio: pid=1, err=28/file:io_u.c:1889, error=No space left on device' >&2\nexit 1\n")
    bench = StorageBench(str(tmp_path), MiB, fio=fio)
    bench.prepare()
    with pytest.raises(StorageError, match=r"fio failed on .* error=No space left on device"):
        bench.measure()


# --- the payload -----------------------------------------------------------------------------------------


def test_the_payload_writes_storage_read_gbps_per_repeat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "no-fio"))  # the payload's own reads
    opts = Options(
        "t-st",
        "node-a",
        device="cpu",
        rule=RepeatRule(repeats=3),
        skip=SKIP_ALL,
        storage_path=str(tmp_path),
        storage_bytes=2 * MiB,
    )
    rows, err = _run(opts)
    storage = [r for r in rows if r["metric"] == "storage_read_gbps"]
    assert len(storage) >= 3
    assert [r["repeat"] for r in storage] == list(range(len(storage)))
    assert all(r["gpu"] is None and r["value"] > 0 for r in storage)
    assert "storage: storage_read_gbps by " in err
    assert not list(tmp_path.glob(".gpucert-storage-read-*"))  # removed afterwards


def test_the_payload_writes_an_error_row_for_a_missing_path(tmp_path: Path) -> None:
    opts = Options("t-st", "node-a", device="cpu", skip=SKIP_ALL, storage_path=str(tmp_path / "unmounted"))
    rows, err = _run(opts)
    assert [(r["metric"], r["gpu"], r["value"]) for r in rows] == [("error", None, 1.0)]
    assert f"error: storage_read_gbps on node: the storage path {tmp_path / 'unmounted'} does not exist" in err


def test_the_storage_arguments_parse() -> None:
    base = ["--run-id", "r"]
    assert parse_args(base).storage_path is None
    assert parse_args(base).storage_bytes == 4_000_000_000
    assert parse_args([*base, "--device", "cpu"]).storage_bytes == 64_000_000
    opts = parse_args([*base, "--storage-path", "/data", "--storage-size-gb", "0.5"])
    assert (opts.storage_path, opts.storage_bytes) == ("/data", 500_000_000)
    with pytest.raises(SystemExit):
        parse_args([*base, "--storage-size-gb", "0"])
