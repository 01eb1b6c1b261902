"""Tests of the in-pod payload (gpucert.bench): its rows pass the results contract, on the CPU and without
torch; its parsers read real tool output; its NVML sampler follows the telemetry rules with a fake NVML.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from gpucert.bench import RepeatRule, parse_all_reduce_perf, parse_dcgm_diag, payload_files
from gpucert.bench._cli import ArgumentsError, check_args, parse_args
from gpucert.bench._dcgm import DcgmError, run_dcgm_diag
from gpucert.bench._nccl_tests import NcclTestsError, check_extra_args
from gpucert.bench._nvml import Sampler
from gpucert.bench._rows import Device, RowWriter
from gpucert.bench._run import Options, Watchdog, run
from gpucert.metrics import METRICS, RESULT_COLUMNS
from gpucert.results import read_results

FIXTURE = Path(__file__).resolve().parent / "data" / "fixtures" / "nccl-tests" / "all_reduce_perf_2x8_h100.txt"
TORCH_STEPS = ("gemm_bf16_tflops", "hbm_copy_gbps", "h2d_gbps", "d2h_gbps")
TELEMETRY = {n for n, m in METRICS.items() if m.kind == "telemetry"} - {"gpu_count_expected"}
ROOT = Path(__file__).resolve().parents[1]


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    return True


def _payload(args: list[str], tmp: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None) -> Any:
    full_env = {**os.environ, "NODE_NAME": "node-a", **(env or {})}
    done = subprocess.run(
        [sys.executable, "-m", "gpucert.bench", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd or ROOT,
        timeout=120,
        check=False,
    )
    rows = tmp / "rows.jsonl"
    rows.write_text(done.stdout, encoding="utf-8")
    return done, rows


def _check_lines(stdout: str) -> list[dict[str, Any]]:
    """Every stdout line is one row: a JSON object with exactly the contract's columns, in order."""
    parsed = []
    for line in stdout.splitlines():
        row = json.loads(line)
        assert list(row) == list(RESULT_COLUMNS), line
        parsed.append(row)
    assert parsed
    return parsed


def _stack(stderr: str) -> dict[str, str]:
    lines = [line for line in stderr.splitlines() if line.startswith("gpucert-stack: ")]
    assert len(lines) == 1, stderr
    record = json.loads(lines[0].removeprefix("gpucert-stack: "))
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in record.items())
    return dict(record)


# ---------------------------------------------------------------------------------------------------------
# The whole payload on the CPU


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, Path]:
    pytest.importorskip("torch", reason="the CPU run measures with torch (the Makefile installs the CPU wheel)")
    tmp = tmp_path_factory.mktemp("cpu-run")
    stack = tmp / "stack.json"
    # No RDMA NIC whatever this machine has: the NIC rows are real telemetry (tests/test_bench_nic.py).
    no_nics = ["--ib-sysfs", str(tmp / "no-infiniband")]
    done, rows = _payload(
        ["--device", "cpu", "--run-id", "t1", "--repeats", "2", "--stack-json", str(stack), *no_nics],
        tmp,
        env={"GPUCERT_EXPECTED_GPUS": "2"},
    )
    return done, rows, stack


def test_cpu_run_prints_valid_results(cpu_run: tuple[Any, Path, Path]) -> None:
    done, rows, _ = cpu_run
    assert done.returncode == 0, done.stderr
    _check_lines(done.stdout)
    frame = read_results(rows)
    host = socket.gethostname()
    assert set(frame["run_id"].astype(str)) == {"t1"}
    assert set(frame["node"].astype(str)) == {"node-a"}
    assert set(frame["gpu_model"].astype(str)) == {"cpu"}
    gpu_rows = frame[frame["gpu"].notna()]
    assert set(gpu_rows["gpu_uuid"].astype(str)) == {f"CPU-{host}-0", f"CPU-{host}-1"}
    for metric in TORCH_STEPS:
        for gpu in (0, 1):
            got = frame[(frame["metric"] == metric) & (frame["gpu"] == gpu)]
            # --repeats 2, and the host copies' own twelve (--repeats-of's defaults), more if they disagree.
            rule, n = RepeatRule(repeats=2), len(got)
            assert sorted(got["repeat"]) == list(range(n)), metric
            assert rule.base(metric) <= n <= rule.ceiling(metric), metric
            assert (got["value"] > 0).all()
    allreduce = frame[frame["metric"] == "nccl_allreduce_busbw_gbps"]
    assert sorted(allreduce["repeat"]) == [0, 1]
    assert allreduce["gpu"].isna().all()
    assert (allreduce["value"] > 0).all()
    expected = frame[frame["metric"] == "gpu_count_expected"]
    assert expected["value"].tolist() == [2.0]


def test_cpu_run_invents_no_telemetry(cpu_run: tuple[Any, Path, Path]) -> None:
    done, rows, _ = cpu_run
    frame = read_results(rows)
    # On the CPU no telemetry is attributed to the pretend devices; without NVML, one node-level error.
    assert not set(frame["metric"].astype(str)) & TELEMETRY
    if not _nvml_works():
        errors = frame[frame["metric"] == "error"]
        assert len(errors) == 1
        assert errors["gpu"].isna().all()
        assert "NVML" in done.stderr


def test_cpu_run_records_the_stack(cpu_run: tuple[Any, Path, Path]) -> None:
    done, _, stack_file = cpu_run
    record = _stack(done.stderr)
    assert record == json.loads(stack_file.read_text(encoding="utf-8"))
    assert record["node"] == "node-a"
    assert record["gpu_model"] == "cpu"
    assert record["torch"]
    assert record["kernel"]
    assert record["hostname"] == socket.gethostname()


def test_without_torch_every_torch_step_is_an_error(tmp_path: Path) -> None:
    """Run from the files a ConfigMap would ship, with torch made unimportable: error rows, exit 0, and
    nothing imported beyond the standard library (no pandas, numpy, Prefect or Kubernetes client)."""
    ship = tmp_path / "payload"
    for rel, text in payload_files().items():
        (ship / rel).parent.mkdir(parents=True, exist_ok=True)
        (ship / rel).write_text(text, encoding="utf-8")
    (ship / "sitecustomize.py").write_text(
        textwrap.dedent(
            """
            import atexit, sys

            class _Block:
                def find_spec(self, name, path=None, target=None):
                    if name.split(".")[0] == "torch":
                        raise ImportError("blocked for the test: torch is not installed")
                    return None

            sys.meta_path.insert(0, _Block())

            def _report():
                heavy = sorted(m for m in ("pandas", "numpy", "pyarrow", "prefect", "kubernetes") if m in sys.modules)
                import gpucert
                print("IMPORTED:" + json.dumps({"heavy": heavy, "gpucert": gpucert.__file__}), file=sys.stderr)

            import json
            atexit.register(_report)
            """
        ),
        encoding="utf-8",
    )
    done, rows = _payload(
        ["--device", "cpu", "--run-id", "no-torch", "--repeats", "2"],
        tmp_path,
        env={"PYTHONPATH": str(ship)},
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    _check_lines(done.stdout)
    frame = read_results(rows)
    assert "torch is not installed" in done.stderr
    perf = {n for n, m in METRICS.items() if m.kind == "perf"}
    assert not set(frame["metric"].astype(str)) & perf
    errors = frame[frame["metric"] == "error"]
    per_gpu = errors[errors["gpu"].notna()]
    assert sorted(per_gpu["gpu"].tolist()) == [0] * 4 + [1] * 4  # gemm, copy, h2d, d2h on each device
    assert errors["gpu"].isna().sum() >= 1  # the all-reduce (and NVML, where missing)
    imported = json.loads(next(x for x in done.stderr.splitlines() if x.startswith("IMPORTED:"))[9:])
    assert imported["heavy"] == []
    assert imported["gpucert"].startswith(str(ship))
    _stack(done.stderr)


def test_bad_arguments_exit_2() -> None:
    with pytest.raises(SystemExit) as exc:
        parse_args(["--run-id", "Not_A_Label"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        parse_args(["--run-id", "ok", "--copy-bytes", "lots"])
    opts = parse_args(["--run-id", "ok", "--device", "cpu", "--copy-bytes", "4M", "--gemm-shape", "64x32x16"])
    assert opts.copy_bytes == 4 << 20
    assert opts.gemm_shape == (64, 32, 16)


# ---------------------------------------------------------------------------------------------------------
# nccl-tests and dcgmi


def test_all_reduce_perf_parser_on_a_real_output() -> None:
    parsed = parse_all_reduce_perf(FIXTURE.read_text(encoding="utf-8"))
    assert len(parsed.points) == 2 * 31
    assert parsed.largest_size == 8 * 2**30
    assert parsed.peak_busbw_gbps == pytest.approx(338.82)
    assert parsed.wrong == 0
    last_in_place = [p for p in parsed.points if p.size == parsed.largest_size and p.in_place]
    assert last_in_place[0].busbw_gbps == pytest.approx(337.35)
    assert last_in_place[0].time_us == 47743


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "no all_reduce_perf table rows"),
        ("hello, world\nSegmentation fault (core dumped)\n", "no all_reduce_perf table rows"),
        ("#  size count type\n    8589934592    2147483648     float     sum      -1    47535  180.71", "truncated"),
        ("  1024  256 float sum -1 12.0 abc 0.01 0 12.0 0.01 0.01 0", "not a number"),
    ],
)
def test_all_reduce_perf_parser_refuses_garbage(text: str, says: str) -> None:
    with pytest.raises(NcclTestsError, match=says):
        parse_all_reduce_perf(text)


def test_all_reduce_perf_parser_reads_unvalidated_runs() -> None:
    text = "  1048576  262144 float sum -1 203.2 5.16 9.68 N/A 207.2 5.06 9.49 N/A\n"
    parsed = parse_all_reduce_perf(text)
    assert parsed.peak_busbw_gbps == pytest.approx(9.68)
    assert parsed.points[0].wrong is None


def _fake_tool(tmp_path: Path, output: str, status: int = 0) -> str:
    out = tmp_path / "out.txt"
    out.write_text(output, encoding="utf-8")
    tool = tmp_path / "all_reduce_perf"
    tool.write_text(f"#!/bin/sh\ncat '{out}'\nexit {status}\n", encoding="utf-8")
    tool.chmod(0o755)
    return str(tool)


def _run_in_process(opts: Options) -> tuple[list[dict[str, Any]], str]:
    out, err = io.StringIO(), io.StringIO()
    assert run(opts, out=out, err=err, nvml_module=_NoNvml()) == 0
    return _check_lines(out.getvalue()), err.getvalue()


class _NoNvml:
    class NVMLError(Exception):
        value = 12

    def nvmlInit(self) -> None:
        raise self.NVMLError("NVML Shared Library Not Found")


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for all_reduce_perf")
def test_nccl_tests_step_reports_busbw_or_an_error(tmp_path: Path) -> None:
    skip = frozenset({"gemm", "copy", "h2d", "d2h"})
    good = _fake_tool(tmp_path, FIXTURE.read_text(encoding="utf-8"))
    rows, _ = _run_in_process(
        Options("t2", "node-b", device="cuda", rule=RepeatRule(repeats=2), skip=skip, nccl_tests=good)
    )
    busbw = [r for r in rows if r["metric"] == "nccl_allreduce_busbw_gbps"]
    assert [(r["repeat"], r["value"], r["gpu"]) for r in busbw] == [(0, 338.82, None), (1, 338.82, None)]

    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    bad = _fake_tool(bad_dir, "# nThread 1 nGpus 8\n#  size count\n     1024   256 float", status=0)
    rows, err = _run_in_process(
        Options("t2", "node-b", device="cuda", rule=RepeatRule(repeats=2), skip=skip, nccl_tests=bad)
    )
    assert not [r for r in rows if r["metric"] == "nccl_allreduce_busbw_gbps"]
    assert [r["gpu"] for r in rows if r["metric"] == "error"].count(None) >= 1
    assert "all_reduce_perf" in err
    assert "truncated" in err


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for all_reduce_perf")
def test_nccl_tests_args_reach_all_reduce_perf_after_the_payloads_own(tmp_path: Path) -> None:
    called = tmp_path / "args"
    tool = Path(_fake_tool(tmp_path, FIXTURE.read_text(encoding="utf-8")))
    tool.write_text(tool.read_text(encoding="utf-8").replace("#!/bin/sh\n", f"#!/bin/sh\necho \"$@\" > '{called}'\n"))
    opts = parse_args(
        [
            "--run-id",
            "t5",
            "--node",
            "node-d",
            "--repeats",
            "1",
            "--nccl-tests",
            str(tool),
            "--nccl-tests-args=-d bfloat16 -G 1",
            "--allreduce-bytes",
            "1G",
            "--allreduce-iters",
            "7",
            *(f"--skip={step}" for step in ("gemm", "copy", "h2d", "d2h")),
        ]
    )
    assert opts.nccl_tests_args == ("-d", "bfloat16", "-G", "1")
    rows, _ = _run_in_process(opts)
    assert [r["value"] for r in rows if r["metric"] == "nccl_allreduce_busbw_gbps"] == [338.82]
    gib = str(1 << 30)
    assert called.read_text(encoding="utf-8").split() == [
        "-b",
        gib,
        "-e",
        gib,
        "-f",
        "2",
        "-g",
        "0",
        "-n",
        "7",
        "-w",
        "5",
        "-c",
        "1",
        "-d",
        "bfloat16",
        "-G",
        "1",
    ]


@pytest.mark.parametrize(
    "args", [["-g", "1"], ["-g1"], ["--ngpus=1"], ["--ngp", "1"], ["-b", "1K"], ["--check=0"], ["-n", "1"]]
)
def test_nccl_tests_args_may_not_set_what_the_payload_measures(args: list[str]) -> None:
    with pytest.raises(ValueError, match="which the payload sets itself"):
        check_extra_args(args)
    with pytest.raises(SystemExit):
        parse_args(["--run-id", "ok", "--nccl-tests-args", " ".join(args)])


def test_nccl_tests_args_others_pass() -> None:
    assert check_extra_args(["-d", "bfloat16", "-o", "sum", "--op=max", "-G", "1", "-w", "10", "-a", "3"]) == (
        "-d",
        "bfloat16",
        "-o",
        "sum",
        "--op=max",
        "-G",
        "1",
        "-w",
        "10",
        "-a",
        "3",
    )
    with pytest.raises(SystemExit):
        parse_args(["--run-id", "ok", "--nccl-tests-args", "-d 'bfloat16"])  # an unclosed quote


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for dcgmi")
def test_the_dcgm_level_is_the_one_dcgmi_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    called = tmp_path / "args"
    report = tmp_path / "report.json"
    report.write_text(json.dumps(DCGM_3), encoding="utf-8")
    tool = tmp_path / "dcgmi"
    tool.write_text(f"#!/bin/sh\necho \"$@\" > '{called}'\ncat '{report}'\n", encoding="utf-8")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    default = parse_args(["--run-id", "t6"])
    assert (default.dcgm, default.dcgm_level) == (False, 1)
    skip = [f"--skip={step}" for step in ("gemm", "copy", "h2d", "d2h", "allreduce", "telemetry")]
    opts = parse_args(["--run-id", "t6", "--node", "node-e", "--device", "cpu", "--dcgm-level", "4", *skip])
    assert (opts.dcgm, opts.dcgm_level) == (True, 4)  # a level asks for the diagnostic
    rows, _ = _run_in_process(opts)
    assert called.read_text(encoding="utf-8").split() == ["diag", "-r", "4", "-j"]
    assert [(r["metric"], r["gpu"]) for r in rows] == [("error", 1)]
    with pytest.raises(ValueError, match="not one of 1, 2, 3, 4"):
        run_dcgm_diag(5)
    with pytest.raises(SystemExit):
        parse_args(["--run-id", "t6", "--dcgm-level", "5"])


def test_checked_arguments_are_exact_and_raise_instead_of_exiting() -> None:
    base = ["--run-id", "ok", "--node", "n"]
    # The pod's own parser completes an abbreviation; the check does not, so what passes it is what runs.
    assert parse_args([*base, "--gemm-sec", "2"]).gemm_seconds == 2.0
    for bad, words in (
        (["--gemm-sec", "2"], "unrecognized arguments: --gemm-sec 2"),
        (["--help"], "unrecognized arguments: --help"),
        (["--copy-bytes", "lots"], "argument --copy-bytes: 'lots' is not a size"),
    ):
        with pytest.raises(ArgumentsError, match=words):
            check_args([*base, *bad])
    assert check_args([*base, "--gemm-seconds=2"]).gemm_seconds == 2.0


DCGM_3 = {
    "DCGM GPU Diagnostic": {
        "test_categories": [
            {"category": "Deployment", "tests": [{"name": "Denylist", "results": [{"status": "Pass"}]}]},
            {
                "category": "Hardware",
                "tests": [
                    {
                        "name": "Memory",
                        "results": [
                            {"gpu_ids": "0", "status": "Pass"},
                            {"gpu_ids": "1", "status": "Fail", "warnings": ["DBE"]},
                        ],
                    },
                    {"name": "PCIe", "results": [{"gpu_ids": "0", "status": "Skip"}]},
                ],
            },
        ]
    },
    "version": "3.3.5",
}
DCGM_4 = {
    "DCGM Diagnostic": {
        "test_categories": [
            {
                "category": "Deployment",
                "tests": [
                    {
                        "name": "software",
                        "results": [{"entity_group": "GPU", "entity_group_id": 1, "entity_id": 0, "status": "Pass"}],
                    }
                ],
            }
        ]
    }
}


def test_dcgm_parser_is_tolerant() -> None:
    old = parse_dcgm_diag("Running diag…\n" + json.dumps(DCGM_3))
    assert old.summary() == {"Denylist": "pass", "Memory": "fail", "PCIe": "skip"}
    assert any(t.failed_gpus for t in old.tests)
    assert [t.failed_gpus for t in old.tests if t.name == "Memory"] == [(1,)]
    new = parse_dcgm_diag(json.dumps(DCGM_4))
    assert not any(t.failed_gpus for t in new.tests)
    assert new.summary() == {"software": "pass"}
    for garbage in ("", "Error: unable to connect to host engine", "{not json", '{"a": 1}'):
        with pytest.raises(DcgmError):
            parse_dcgm_diag(garbage)


# ---------------------------------------------------------------------------------------------------------
# The NVML sampler, with a fake NVML


class FakeNvml:
    """Just enough of pynvml for the sampler: three GPUs, scripted answers."""

    NVML_FEATURE_DISABLED = 0
    NVML_FEATURE_ENABLED = 1
    nvmlEventTypeXidCriticalError = 8

    class NVMLError(Exception):
        def __init__(self, value: int) -> None:
            super().__init__(f"NVML error {value}")
            self.value = value

    def __init__(self) -> None:
        # GPU 0: sane H200 with NVLink, a link down and CRC errors; GPU 1: PCIe card, HW brake;
        # GPU 2: falls off the bus after its first sample.
        self.reasons = {0: [0x1, 0x4, 0x1, 0x20], 1: [0x80, 0x80, 0x1, 0x1]}
        self.gen_loaded = {0: 5, 1: 4}
        self.width_loaded = {0: 16, 1: 16}
        self.load: dict[int, str | None] = {0: None, 1: None}
        self.calls: dict[int, int] = {0: 0, 1: 0}
        self.replays = {0: 10, 1: 0}
        self.crc = {0: 100}
        self.events: list[Any] = []
        self.lost_after = 1
        self.samples_of_2 = 0

    # identity
    def nvmlDeviceGetUUID(self, h: int) -> str:
        return f"GPU-{h:08d}"

    def _lost(self, h: int) -> None:
        if h == 2 and self.samples_of_2 > self.lost_after:
            raise self.NVMLError(15)

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: int) -> int:
        if h == 2:
            self.samples_of_2 += 1
            self._lost(h)
            return 0
        seq = self.reasons[h]
        value = seq[min(self.calls[h], len(seq) - 1)]
        self.calls[h] += 1
        return value

    def nvmlDeviceGetTemperature(self, h: int, sensor: int) -> int:
        self._lost(h)
        return min(60 + 5 * self.calls.get(h, 0), 85)  # warms while sampled, as a real GPU under load, up to a plateau

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: int) -> int:
        self._lost(h)
        return self.gen_loaded.get(h, 5) if self.load.get(h) == "pcie" else 1

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: int) -> int:
        self._lost(h)
        return self.width_loaded.get(h, 16) if self.load.get(h) == "pcie" else 16

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: int) -> int:
        return 5

    def nvmlDeviceGetMaxPcieLinkWidth(self, h: int) -> int:
        return 16

    def nvmlDeviceGetTemperatureThreshold(self, h: int, kind: int) -> int:
        return 87

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        self._lost(h)
        return 700_000 if h == 0 else 500_000

    def nvmlDeviceGetPcieReplayCounter(self, h: int) -> int:
        self._lost(h)
        value = self.replays.get(h, 0)
        self.replays[h] = value + 30 if h == 0 else value
        return value

    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int:
        if h != 0:
            raise self.NVMLError(3)  # not supported: no NVLink
        if link >= 4:
            raise self.NVMLError(2)  # invalid argument: no such link
        return self.NVML_FEATURE_DISABLED if link == 2 else self.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, h: int, link: int, counter: int) -> int:
        if counter == 3:
            raise self.NVMLError(3)  # CRC data not counted on this GPU
        return self.crc[h] + link

    def nvmlDeviceGetTotalEccErrors(self, h: int, kind: int, counter: int) -> int:
        self._lost(h)
        return 0 if kind == 1 else 7

    def nvmlDeviceGetRemappedRows(self, h: int) -> tuple[int, int, int, int]:
        self._lost(h)
        return (0, 1, 1, 0) if h == 1 else (0, 0, 0, 0)

    # events
    def nvmlEventSetCreate(self) -> str:
        return "es"

    def nvmlDeviceGetSupportedEventTypes(self, h: int) -> int:
        return 0xFF

    def nvmlDeviceRegisterEvents(self, h: int, kinds: int, es: str) -> None:
        assert kinds == 8

    def nvmlEventSetWait(self, es: str, ms: int) -> Any:
        if not self.events:
            raise self.NVMLError(10)  # timeout
        return self.events.pop(0)

    def nvmlEventSetFree(self, es: str) -> None:
        pass


class _Event:
    def __init__(self, device: int, kind: int, data: int) -> None:
        self.device, self.eventType, self.eventData = device, kind, data


def test_sampler_rules_with_a_fake_nvml() -> None:
    nvml = FakeNvml()
    now = [1000.0]
    notes: list[str] = []
    sampler = Sampler(nvml, {0: 0, 1: 1, 2: 2}, clock=lambda: now[0], say=notes.append)
    sampler.begin()
    nvml.crc[0] = 100  # start total over links 0..3: 100+101+102+103
    with sampler.loading([0, 1], "pcie"):
        nvml.load = {0: "pcie", 1: "pcie"}
        sampler.sample()  # GPU 0: 0x1; GPU 1: 0x80 (HW power brake)
    nvml.load = {0: None, 1: None}
    with sampler.loading([0, 1], "compute"):
        sampler.sample()  # GPU 0: 0x4; GPU 1: 0x80
    sampler.sample()  # idle: GPU 0 0x1, GPU 1 0x1; link trained down to Gen1 (must not count)
    nvml.events = [_Event(1, 8, 79), _Event(0, 0x2, 0), _Event(0, 8, 48)]
    sampler.wait_events(0.2)
    nvml.crc[0] = 105  # +5 on each of 4 links → +20
    now[0] += 120.0  # two minutes
    out = sampler.stop()

    g0, g1, g2 = out[0].values, out[1].values, out[2]
    assert g0["clocks_event_reasons"] == 0x1 | 0x4 | 0x1 | 0x20  # the last sample comes from stop()
    assert g0["hw_slowdown_frac"] == 0.0
    assert g1["clocks_event_reasons"] == 0x80 | 0x1
    assert g1["hw_slowdown_frac"] == 1.0  # both benchmark samples braked; idle samples do not count
    assert (g0["pcie_gen"], g0["pcie_width"], g0["pcie_gen_max"]) == (5, 16, 5)
    assert g1["pcie_gen"] == 4  # measured under PCIe load: trained below its max of 5
    assert g0["pcie_replays_per_min"] == pytest.approx(30 / 2)
    assert g0["nvlink_down"] == 1
    assert g0["nvlink_crc_errors"] == 20
    assert "nvlink_down" not in g1
    assert "nvlink_crc_errors" not in g1
    assert any("NVLink" in n for n in out[1].notes)
    assert g0["temp_slowdown_c"] == 87
    assert g0["temp_max_c"] >= 60
    assert (g0["power_limit_w"], g0["power_limit_default_w"], g1["power_limit_w"]) == (700, 700, 500)
    assert (g0["ecc_dbe_volatile"], g0["ecc_sbe_volatile"]) == (0, 7)
    assert (g1["remapped_rows_pending"], g1["remapped_rows_failure"]) == (1, 0)
    assert out[0].xids == [48]
    assert out[1].xids == [79]
    assert not out[0].problems
    assert not out[1].problems
    # GPU 2 fell off the bus: a problem (an error row), and nothing read after it made up.
    assert any("lost" in p for p in g2.problems)
    assert "ecc_dbe_volatile" not in g2.values
    assert "remapped_rows_pending" not in g2.values
    assert set(g0) <= set(METRICS)


def test_sampler_thread_runs_and_stops() -> None:
    nvml = FakeNvml()
    sampler = Sampler(nvml, {0: 0}, interval=0.01)
    sampler.start()
    time.sleep(0.1)
    out = sampler.stop()
    assert nvml.calls[0] >= 3
    assert "clocks_event_reasons" in out[0].values


def test_row_writer_refuses_a_non_number() -> None:
    out, err = io.StringIO(), io.StringIO()
    rows = RowWriter("r1", "n1", "NVIDIA H200", {0: Device(0, "GPU-x", "NVIDIA H200", 0)}, out=out, err=err)
    assert rows.gpu("gemm_bf16_tflops", 0, 700.5, 0)
    assert not rows.gpu("hbm_copy_gbps", 0, float("nan"), 0)
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [(r["metric"], r["value"], r["gpu_uuid"]) for r in lines] == [
        ("gemm_bf16_tflops", 700.5, "GPU-x"),
        ("error", 1.0, "GPU-x"),
    ]
    assert "hbm_copy_gbps" in err.getvalue()
    assert lines[0]["ts"].endswith("Z")


def test_watchdog_fires_on_a_hung_step() -> None:
    fired: list[tuple[str, int | None, float]] = []
    dog = Watchdog(lambda step, gpu, seconds: fired.append((step, gpu, seconds)))
    with dog.guard("gemm_bf16_tflops", 3, 0.05):
        time.sleep(0.3)
    with dog.guard("h2d_gbps", 0, 5.0):
        pass
    time.sleep(0.05)
    assert fired == [("gemm_bf16_tflops", 3, 0.05)]


class FakeNode(FakeNvml):
    """Two H200s NVML sees, for a whole run in CUDA mode on a machine where torch has no CUDA."""

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"NVIDIA H200"  # old bindings return bytes

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.124.06"

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return 12080

    def nvmlDeviceGetVbiosVersion(self, h: int) -> str:
        return "96.00.A5.00.01"


def test_gpus_torch_cannot_use_get_error_rows_and_real_telemetry(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the case needs a torch that cannot use the GPUs")
    nvml = FakeNode()
    nvml.events = [_Event(1, 8, 94)]
    out, err = io.StringIO(), io.StringIO()
    opts = Options("t3", "gpu-node-1", device="cuda", rule=RepeatRule(repeats=2), expected_gpus=8, sample_interval=0.01)
    assert run(opts, out=out, err=err, nvml_module=nvml) == 0
    rows_file = tmp_path / "rows.jsonl"
    rows_file.write_text(out.getvalue(), encoding="utf-8")
    frame = read_results(rows_file)
    assert set(frame["gpu_model"].astype(str)) == {"NVIDIA H200"}
    errors = frame[frame["metric"] == "error"]
    assert sorted(errors["gpu"].dropna().tolist()) == [0] * 4 + [1] * 4
    assert errors["gpu"].isna().sum() == 1  # the all-reduce
    assert not set(frame["metric"].astype(str)) & {n for n, m in METRICS.items() if m.kind == "perf"}
    node = frame[frame["gpu"].isna() & (frame["metric"] != "error")].set_index("metric")["value"]
    assert (node["gpu_count"], node["gpu_count_expected"]) == (2, 8)
    gpu0 = frame[frame["gpu"] == 0].set_index("metric")["value"]
    assert gpu0["pcie_gen_max"] == 5
    assert gpu0["nvlink_down"] == 1
    assert frame.loc[frame["metric"] == "xid", ["gpu", "value"]].values.tolist() == [[1, 94]]
    assert set(frame.loc[frame["gpu"] == 1, "gpu_uuid"].astype(str)) == {"GPU-00000001"}
    stack = _stack(err.getvalue())
    assert stack["driver"] == "570.124.06"
    assert stack["cuda_driver"] == "12.8"
    assert stack["vbios.1"] == "96.00.A5.00.01"
    assert "torch cannot" in err.getvalue() or "CUDA is not available" in err.getvalue()


def test_dcgm_step_turns_failed_tests_into_error_rows(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    report = tmp_path / "report.json"
    report.write_text(json.dumps(DCGM_3), encoding="utf-8")
    tool = tmp_path / "dcgmi"
    tool.write_text(f"#!/bin/sh\ncat '{report}'\nexit 226\n", encoding="utf-8")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    skip = frozenset({"gemm", "copy", "h2d", "d2h", "allreduce", "telemetry"})
    rows, err = _run_in_process(Options("t4", "node-c", device="cpu", skip=skip, dcgm=True))
    assert [(r["metric"], r["gpu"]) for r in rows] == [("error", 1)]
    line = next(x for x in err.splitlines() if x.startswith("gpucert-dcgm: "))
    assert json.loads(line.removeprefix("gpucert-dcgm: "))["Memory"] == "fail"


# ---------------------------------------------------------------------------------------------------------
# Repeats that disagree are measured again, up to --max-repeats (docs/design/verdict-engine.md, "Stage 1: repeats")


class _Scripted:
    """Stands in for a torch step: each (metric, GPU) returns its script's values in turn, then its last."""

    def __init__(self, scripts: dict[tuple[str, int], list[float]], default: list[float]) -> None:
        self.scripts = scripts
        self.default = default
        self.calls: Counter[tuple[str, int]] = Counter()
        #: the GPU being measured: every CPU device is the same torch device, so the run's choice is kept
        self.current = 0

    def step(self, metric: str) -> Any:
        def measure(_torch: Any, _device: Any, *_args: Any, **_kw: Any) -> float:
            gpu = self.current
            values = self.scripts.get((metric, gpu), self.default)
            i = self.calls[(metric, gpu)]
            self.calls[(metric, gpu)] += 1
            return values[min(i, len(values) - 1)]

        return measure


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> _Scripted:
    pytest.importorskip("torch", reason="the CPU devices are torch's")
    from gpucert.bench import _run as run_module

    # GPU 0's GEMM: two transients among its first three; GPU 1's: oscillating for good.
    fake = _Scripted(
        {
            ("gemm_bf16_tflops", 0): [700.0, 500.0, 520.0, 700.0, 701.0],
            ("gemm_bf16_tflops", 1): [700.0, 600.0, 800.0, 650.0, 750.0, 620.0, 780.0, 700.0, 640.0],
        },
        [100.0, 100.1, 99.9],
    )
    real_device = run_module._Run._torch_device

    def device(self: Any, torch_index: int) -> Any:
        fake.current = torch_index
        return real_device(self, torch_index)

    monkeypatch.setattr(run_module._Run, "_torch_device", device)
    monkeypatch.setattr(run_module, "gemm_tflops", fake.step("gemm_bf16_tflops"))
    monkeypatch.setattr(run_module, "copy_gbps", fake.step("hbm_copy_gbps"))
    monkeypatch.setattr(
        run_module,
        "transfer_gbps",
        lambda torch, d, n, s, *, to_device: fake.step("h2d_gbps" if to_device else "d2h_gbps")(torch, d),
    )
    return fake


def _repeats_of(rows: list[dict[str, Any]]) -> dict[tuple[str, int | None], list[int]]:
    got: dict[tuple[str, int | None], list[int]] = {}
    for r in rows:
        if METRICS[r["metric"]].kind == "perf":
            got.setdefault((r["metric"], r["gpu"]), []).append(r["repeat"])
    return got


def test_unstable_repeats_are_measured_again_up_to_the_maximum(scripted: _Scripted) -> None:
    skip = frozenset({"allreduce", "telemetry", "dcgm"})
    opts = Options("t5", "node-d", device="cpu", gemm_warmup_seconds=0.0, skip=skip)
    rows, err = _run_in_process(opts)
    repeats = _repeats_of(rows)
    # Two transients of three: two more settle it (their median is out of the transients' reach).
    assert repeats[("gemm_bf16_tflops", 0)] == [0, 1, 2, 3, 4]
    # Never agreeing: it stops at --max-repeats (7), and says so.
    assert repeats[("gemm_bf16_tflops", 1)] == list(range(7))
    assert scripted.calls[("gemm_bf16_tflops", 1)] == 7
    # Stable metrics stay at their base repeats: --repeats, and twelve for the host copies (--repeats-of).
    for metric, base in (("hbm_copy_gbps", 3), ("h2d_gbps", 12), ("d2h_gbps", 12)):
        for gpu in (0, 1):
            assert repeats[(metric, gpu)] == list(range(base)), (metric, gpu)
    # Its median (520) is a transient itself: the good repeat stands far above it.
    assert "GPU 0: gemm_bf16_tflops: repeats disagree (1 of 3 repeats far above their median): 2 more, 5 of" in err
    assert "GPU 1: gemm_bf16_tflops: repeats still disagree after 7" in err


def test_max_repeats_equal_to_repeats_turns_extra_repeats_off(scripted: _Scripted) -> None:
    skip = frozenset({"allreduce", "telemetry", "dcgm"})
    opts = Options("t5", "node-d", device="cpu", gemm_warmup_seconds=0.0, skip=skip, rule=RepeatRule(max_repeats=3))
    rows, err = _run_in_process(opts)
    assert {k: len(v) for k, v in _repeats_of(rows).items()} == {k: opts.rule.base(k[0]) for k in _repeats_of(rows)}
    assert "at the maximum of 3" in err


def test_no_extra_repeat_starts_when_it_would_not_fit_before_the_deadline(scripted: _Scripted) -> None:
    skip = frozenset({"allreduce", "telemetry", "dcgm"})
    opts = Options("t5", "node-d", device="cpu", gemm_warmup_seconds=0.0, skip=skip, deadline_s=5.0)
    rows, err = _run_in_process(opts)
    assert all(len(v) == opts.rule.base(metric) for (metric, _), v in _repeats_of(rows).items())
    assert "would not fit before the deadline" in err
    # With time enough, the same run measures again.
    scripted.calls.clear()
    opts = replace(opts, deadline_s=3600.0)
    rows, _ = _run_in_process(opts)
    assert len(_repeats_of(rows)[("gemm_bf16_tflops", 0)]) == 5


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for all_reduce_perf")
def test_the_all_reduce_is_measured_again_when_its_repeats_disagree(tmp_path: Path) -> None:
    text = FIXTURE.read_text(encoding="utf-8")
    (tmp_path / "good.txt").write_text(text, encoding="utf-8")
    (tmp_path / "low.txt").write_text(text.replace("338.82", "250.00").replace("337.35", "249.00"))
    tool = tmp_path / "all_reduce_perf"
    tool.write_text(
        textwrap.dedent(
            f"""\
            #!/bin/sh
            n=$(cat '{tmp_path}/count' 2>/dev/null || echo 0); n=$((n + 1)); echo $n > '{tmp_path}/count'
            case $n in 2|3) cat '{tmp_path}/low.txt';; *) cat '{tmp_path}/good.txt';; esac
            """
        ),
        encoding="utf-8",
    )
    tool.chmod(0o755)
    skip = frozenset({"gemm", "copy", "h2d", "d2h"})
    rows, err = _run_in_process(Options("t6", "node-e", device="cuda", skip=skip, nccl_tests=str(tool)))
    busbw = [(r["repeat"], r["value"]) for r in rows if r["metric"] == "nccl_allreduce_busbw_gbps"]
    assert busbw == [(0, 338.82), (1, 250.0), (2, 250.0), (3, 338.82), (4, 338.82)]
    assert "node: nccl_allreduce_busbw_gbps: repeats disagree" in err


def test_repeat_options_parse_and_default_to_the_policy() -> None:
    from gpucert.policy import default_policy

    base = ["--run-id", "ok", "--node", "n"]
    opts = parse_args(base)
    policy = default_policy()
    rule = opts.rule
    assert (rule.repeats, rule.max_repeats, opts.deadline_s) == (3, 7, 0.0)
    assert dict(rule.cv_rep) == {m: p.cv_rep for m, p in policy.metrics.items()}
    assert (rule.unstable_factor, rule.transient_pct) == (policy.repeats.unstable_factor, policy.repeats.transient_pct)
    opts = check_args(
        [
            *base,
            "--repeats",
            "5",
            "--max-repeats",
            "3",
            "--cv-rep",
            "h2d_gbps=0.02",
            "--unstable-factor",
            "4",
            "--transient-pct",
            "6",
            "--deadline-seconds",
            "3000",
        ]
    )
    rule = opts.rule
    assert rule.max_repeats == 5  # never fewer than --repeats
    assert dict(rule.cv_rep)["h2d_gbps"] == 0.02
    assert dict(rule.cv_rep)["gemm_bf16_tflops"] == 0.007
    assert (rule.unstable_factor, rule.transient_pct, opts.deadline_s) == (4.0, 6.0, 3000.0)
    for bad, words in (
        (["--cv-rep", "pcie_gen=0.1"], "not METRIC=CV"),
        (["--repeats-of", "pcie_gen=3"], "not METRIC=N"),
        (["--repeats-of", "h2d_gbps=0"], "from 1 to 25"),
        (["--cv-rep", "h2d_gbps=2"], "fraction"),
        (["--unstable-factor", "1"], "above 1"),
        (["--transient-pct", "100"], "between 0 and 100"),
        (["--max-repeats", "0"], "at least 1"),
    ):
        with pytest.raises(ArgumentsError, match=words):
            check_args([*base, *bad])


def test_the_deadline_may_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCERT_DEADLINE_S", "1800")
    assert parse_args(["--run-id", "ok"]).deadline_s == 1800.0
    assert parse_args(["--run-id", "ok", "--deadline-seconds", "60"]).deadline_s == 60.0
