"""Pair benchmarks: the payload's two-node all-reduce, and the Indexed Job + headless Service that runs it.

The payload's two-node path runs for real: two local processes (two "nodes"), their ranks over gloo on the
CPU, meeting at a loopback rendezvous, their logs read by the pod-log reader of the certify flow. The
busbw formula is checked against nccl-tests' own numbers (a real 2 × 8 H100 run), and the nccl-tests path
under a stand-in ``mpirun`` that prints that run. The manifests are checked against Kubernetes' schema
(``kubernetes_validate``, 1.33, strict) and created on the simulated cluster.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from gpucert.bench._allreduce import busbw_gbps
from gpucert.bench._cli import parse_pair_args
from gpucert.bench._nccl_tests import NcclTestsError, parse_all_reduce_perf
from gpucert.bench._pair import PairMeasurement, mpi_slots, run_pair_nccl_tests, sweep_sizes
from gpucert.bench._rows import Device, RowWriter
from gpucert.certify import (
    BenchmarkSettings,
    CollectedResults,
    benchmark_job,
    ensure_payload,
    pair_job,
    pair_name,
    parse_pod_log,
    payload_configmap,
)
from gpucert.certify._jobs import PayloadArgsError, owned_by
from gpucert.kube import Kube, RetryPolicy, connect
from gpucert_sim import SimCluster

from .conftest import eventually

K8S = "1.33"
PREFIX = "gpucert.io"
REPO = Path(__file__).resolve().parent.parent
#: nccl-tests' own output, 2 nodes × 8 H100 over MPI (tests/data/fixtures/README.md names its origin).
FIXTURE = REPO / "tests" / "data" / "fixtures" / "nccl-tests" / "all_reduce_perf_2x8_h100.txt"
METRIC = "nccl_pair_busbw_gbps"
TABLE = re.compile(
    r"^gpucert-bench: pair:\s+([\d,]+) B\s+([\d.]+) us\s+algbw\s+(\S+) GB/s\s+busbw\s+(\S+) GB/s$", re.MULTILINE
)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pair_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpucert.bench", "pair", *args]


RANK_ENV = ("JOB_COMPLETION_INDEX", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def start(*args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k not in (*RANK_ENV, "GPUCERT_DEADLINE_S", "NODE_NAME")}
    env["PYTHONUNBUFFERED"] = "1"
    return subprocess.Popen(
        pair_cmd(*args), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(proc: subprocess.Popen[str], timeout_s: float = 120.0) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the payload hung past {timeout_s} s:\n{err[-3000:]}") from None
    return proc.returncode, out, err


def read_log(out: str, err: str, run_id: str, node: str) -> CollectedResults:
    # `kubectl logs` shows both streams; the reader must take them mixed.
    return parse_pod_log(err + out, run_id=run_id, node=node, source=f"log of {node}")


def table(err: str) -> list[tuple[int, float, float, float]]:
    return [(int(s.replace(",", "")), float(t), float(a), float(b)) for s, t, a, b in TABLE.findall(err)]


# --- the payload's two-node path, for real --------------------------------------------------------------


def test_two_processes_measure_one_pair_over_gloo_and_their_logs_read_as_pair_rows() -> None:
    """Node A (2 pretend GPUs, node rank 0) and node B (1, node rank 1) form one all-reduce of 3 ranks."""
    port = free_port()
    common = (
        "--run-id",
        "pair-1",
        "--nodes",
        "node-a",
        "node-b",
        "--master",
        f"127.0.0.1:{port}",
        "--device",
        "cpu",
        "--repeats",
        "3",
        "-b",
        "64K",
        "-e",
        "512K",
        "-n",
        "3",
        "-w",
        "1",
        "--rendezvous-timeout",
        "60",
    )
    t0 = time.monotonic()
    a = start(*common, "--node", "node-a", "--rank", "0", "--cpu-devices", "2")
    b = start(*common, "--node", "node-b", "--rank", "1", "--cpu-devices", "1")
    (rc_a, out_a, err_a), (rc_b, out_b, err_b) = finish(a), finish(b)
    took = time.monotonic() - t0
    assert (rc_a, rc_b) == (0, 0), err_a[-2000:] + err_b[-2000:]
    sides = {"node-a": read_log(out_a, err_a, "pair-1", "node-a"), "node-b": read_log(out_b, err_b, "pair-1", "node-b")}
    values = {}
    for node, peer in (("node-a", "node-b"), ("node-b", "node-a")):
        got = sides[node]
        rows = got.results
        assert got.errors == [], got.errors
        assert set(rows["metric"].astype(str)) == {METRIC}
        assert set(rows["peer"].astype(str)) == {peer}  # each side's rows name the other node
        assert rows["gpu"].isna().all()
        # Three sweeps, and more while they disagree (a loaded CPU is noisy), up to the payload's 7.
        assert 3 <= len(rows) <= 7
        assert list(rows["repeat"]) == list(range(len(rows)))
        assert set(rows["gpu_model"].astype(str)) == {"cpu"}
        assert all(math.isfinite(v) and v > 0 for v in rows["value"])
        assert got.stack is not None
        assert got.stack["node"] == node
        values[node] = list(rows["value"])
    # One collective measured by both: the times are the slowest rank's, so both sides say the same.
    # Global rank 0 decides on extra repeats for everyone, so both sides have as many.
    assert values["node-a"] == pytest.approx(values["node-b"], rel=1e-9)
    if len(values["node-a"]) > 3:
        assert "repeats disagree" in err_a + err_b
    assert "met node-b (1 ranks): 3 ranks in all" in err_a
    assert "met node-a (2 ranks): 3 ranks in all" in err_b
    # The sweep: the same sizes on both sides, nccl-tests' -b/-e/-f; busbw = algbw · 2(n−1)/n with n = 3.
    sweep_a, sweep_b = table(err_a), table(err_b)
    assert [s for s, *_ in sweep_a] == [s for s, *_ in sweep_b] == list(sweep_sizes(64 << 10, 512 << 10, 2))
    assert sweep_a == sweep_b
    for size, time_us, algbw, busbw in sweep_a:
        assert algbw == pytest.approx(size / (time_us * 1e-6) / 1e9, rel=2e-3)
        assert busbw / algbw == pytest.approx(2 * (3 - 1) / 3, rel=2e-3)
    # The rows carry the largest size's busbw; the table its median over the repeats.
    assert sweep_a[-1][3] == pytest.approx(statistics.median(values["node-a"]), rel=2e-3)
    assert took < 90


def test_a_rendezvous_that_never_completes_ends_in_an_error_row_within_its_timeout() -> None:
    """Node rank 0 whose peer never comes, and node rank 1 whose master never listens: both bounded."""
    timeout = 3
    alone = start(
        "--run-id",
        "pair-2",
        "--node",
        "node-a",
        "--rank",
        "0",
        "--master",
        f"127.0.0.1:{free_port()}",
        "--device",
        "cpu",
        "--rendezvous-timeout",
        str(timeout),
    )
    lost = start(
        "--run-id",
        "pair-2",
        "--node",
        "node-b",
        "--rank",
        "1",
        "--master",
        f"127.0.0.1:{free_port()}",
        "--device",
        "cpu",
        "--rendezvous-timeout",
        str(timeout),
    )
    expected = ((alone, "node-a", "did not join the rendezvous"), (lost, "node-b", "could not be reached"))
    for proc, node, words in expected:
        rc, out, err = finish(proc, timeout_s=60)
        assert rc == 0, err[-2000:]
        got = read_log(out, err, "pair-2", node)
        rows = got.results
        assert list(rows["metric"].astype(str)) == ["error"]
        assert rows["gpu"].isna().all()
        assert rows["peer"].isna().all()  # an error row is the node's: no pair was measured
        [message] = got.errors
        assert message.startswith(f"{METRIC} on node: ")
        assert words in message
        assert f"within {timeout} s" in message
        # Bounded by the timeout (the rest is starting Python and importing torch), never a hang.
        done = re.search(r"pair done in ([\d.]+) s", err)
        assert done is not None
        assert float(done.group(1)) < timeout + 20


def test_a_peer_of_another_run_is_refused_on_both_sides() -> None:
    port = free_port()
    args = ("--master", f"127.0.0.1:{port}", "--device", "cpu", "--rendezvous-timeout", "30")
    a = start("--run-id", "pair-3", "--node", "node-a", "--rank", "0", *args)
    b = start("--run-id", "pair-4", "--node", "node-b", "--rank", "1", *args)
    for proc, run_id, node in ((a, "pair-3", "node-a"), (b, "pair-4", "node-b")):
        rc, out, err = finish(proc, timeout_s=60)
        assert rc == 0, err[-2000:]
        got = read_log(out, err, run_id, node)
        assert list(got.results["metric"].astype(str)) == ["error"]
        [message] = got.errors
        assert "is of run" in message, message


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--run-id", "r", "--rank", "0"], "needs --master"),
        (["--run-id", "r", "--master", "h:1"], "--rank"),
        (["--run-id", "r", "--rank", "2", "--master", "h:1"], "0 or 1"),
        (["--run-id", "r", "--rank", "0", "--master", "h"], "HOST:PORT"),
        (["--run-id", "r", "--rank", "0", "--master", "h:70000"], "HOST:PORT"),
        (["--run-id", "r", "--rank", "0", "--master", "h:1", "--nodes", "a", "a"], "twice"),
        (["--run-id", "r", "--rank", "0", "--master", "h:1", "-b", "2M", "-e", "1M"], "larger than the largest"),
        (["--run-id", "r", "--rank", "0", "--master", "h:1", "-f", "1"], "at least 2"),
        (["--run-id", "r", "--nccl-tests", "x", "--mpi-hosts", "a:8"], "two hosts"),
    ],
)
def test_the_pair_command_line_refuses_what_it_cannot_run(
    argv: list[str], words: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in RANK_ENV:
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(SystemExit) as caught:
        parse_pair_args(argv)
    assert caught.value.code == 2
    assert words in capsys.readouterr().err


def test_the_rank_defaults_to_the_indexed_jobs_completion_index_then_mpis(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    opts = parse_pair_args(["--run-id", "r", "--master", "[fd00::1]:29500", "--device", "cpu"])
    assert (opts.rank, opts.node, opts.master) == (1, "gpu-node-7", ("fd00::1", 29500))
    assert opts.sizes == sweep_sizes(64 << 10, 1 << 20, 2)
    assert parse_pair_args(["--run-id", "r", "--master", "h:1", "--rank", "0"]).rank == 0  # the flag wins
    monkeypatch.delenv("JOB_COMPLETION_INDEX")
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "1")  # `mpirun -np 2 python -m gpucert.bench pair …`
    assert parse_pair_args(["--run-id", "r", "--master", "h:1"]).rank == 1
    monkeypatch.setenv("OMPI_COMM_WORLD_RANK", "3")
    with pytest.raises(SystemExit):
        parse_pair_args(["--run-id", "r", "--master", "h:1"])
    assert "OMPI_COMM_WORLD_RANK" in capsys.readouterr().err


# --- busbw: nccl-tests' formula, on nccl-tests' own numbers ---------------------------------------------


def test_busbw_is_nccl_tests_formula_on_its_own_two_node_run() -> None:
    """2 nodes × 8 H100 under MPI: n = 16 ranks, busbw = algbw · 2·15/16, at every size it printed."""
    text = FIXTURE.read_text(encoding="utf-8")
    parsed = parse_all_reduce_perf(text)
    ranks = len(re.findall(r"^#\s*Rank\s+\d+", text, flags=re.MULTILINE))
    assert ranks == 16
    checked = 0
    for p in parsed.points:
        if p.time_us < 100 or p.algbw_gbps < 1:  # fewer printed digits than the check needs
            continue
        algbw = p.size / (p.time_us * 1e-6) / 1e9
        assert algbw == pytest.approx(p.algbw_gbps, rel=5e-3, abs=0.006)
        assert busbw_gbps(p.size, p.time_us * 1e-6, ranks) == pytest.approx(p.busbw_gbps, rel=5e-3, abs=0.006)
        checked += 1
    assert checked >= 20
    # The pair's own measurement computes the same figure: 8 GiB in 47,535 µs over 16 ranks.
    measured = PairMeasurement(world=16, sizes=(8 << 30,), seconds=((47535e-6,),))
    assert measured.busbw() == [pytest.approx(338.82, abs=0.01)]
    [(size, time_us, algbw, busbw)] = measured.table()
    assert (size, time_us, algbw) == (8 << 30, pytest.approx(47535), pytest.approx(180.71, abs=0.01))
    assert busbw / algbw == pytest.approx(2 * 15 / 16)


def fake_mpirun(tmp_path: Path, output: str) -> Path:
    """A stand-in ``mpirun``: records its arguments, prints ``output`` as all_reduce_perf would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (tmp_path / "output.txt").write_text(output, encoding="utf-8")
    mpirun = bin_dir / "mpirun"
    mpirun.write_text(
        f"#!/bin/sh\necho \"$@\" >> '{tmp_path / 'calls'}'\ncat '{tmp_path / 'output.txt'}'\n", encoding="utf-8"
    )
    mpirun.chmod(0o755)
    return mpirun


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for mpirun")
def test_the_nccl_tests_path_runs_all_reduce_perf_under_mpirun_and_reports_its_busbw(tmp_path: Path) -> None:
    mpirun = fake_mpirun(tmp_path, FIXTURE.read_text(encoding="utf-8"))
    perf = tmp_path / "all_reduce_perf"
    perf.write_text("#!/bin/sh\nexit 1\n", encoding="utf-8")  # mpirun runs it; the stand-in does not
    perf.chmod(0o755)
    env = {"PATH": f"{mpirun.parent}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            sys.executable,
            "-S",
            "-m",
            "gpucert.bench",
            "pair",
            "--run-id",
            "pair-5",
            "--node",
            "ztan-mig-235z",
            "--peer",
            "ztan-mig-gq73",
            "--nccl-tests",
            str(perf),
            "--mpi-hosts",
            "ztan-mig-235z:8,ztan-mig-gq73:8",
            "--mpirun-args",
            "--allow-run-as-root -x NCCL_DEBUG",
            "--repeats",
            "2",
            "-b",
            "8",
            "-e",
            "8G",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    got = read_log(done.stdout, done.stderr, "pair-5", "ztan-mig-235z")
    rows = got.results
    assert set(rows["metric"].astype(str)) == {METRIC}
    assert set(rows["peer"].astype(str)) == {"ztan-mig-gq73"}
    # The better of out-of-place (338.82) and in-place (337.35) at the largest size, as nccl-tests printed it.
    assert list(rows["value"]) == [338.82, 338.82]
    calls = (tmp_path / "calls").read_text(encoding="utf-8").splitlines()
    assert len(calls) == 2
    assert calls[0].split() == [
        "--allow-run-as-root",
        "-x",
        "NCCL_DEBUG",
        "-np",
        "16",
        "-H",
        "ztan-mig-235z:8,ztan-mig-gq73:8",
        str(perf),
        "-b",
        "8",
        "-e",
        str(8 << 30),
        "-f",
        "2",
        "-g",
        "1",
        "-n",
        "20",
        "-w",
        "5",
        "-c",
        "1",
    ]


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for mpirun")
def test_the_nccl_tests_path_measures_disagreeing_repeats_again_as_a_node_does_within_the_deadline(
    tmp_path: Path,
) -> None:
    """The pair goes through the payload's one repeat loop: sweeps that disagree get more, as the node's
    benchmarks do, and none that would not fit before --deadline-seconds."""
    good = FIXTURE.read_text(encoding="utf-8")
    slow = good.replace("338.82", "200.00").replace("337.35", "199.00")  # a transient, far below
    # Call 1 is good, the rest slow: the median is slow and the good sweep stands far above it.
    (tmp_path / "out-1.txt").write_text(good, encoding="utf-8")
    (tmp_path / "out-n.txt").write_text(slow, encoding="utf-8")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    mpirun = bin_dir / "mpirun"
    mpirun.write_text(
        f"#!/bin/sh\ncd '{tmp_path}'\necho \"$@\" >> calls\n"
        'if [ "$(wc -l < calls)" -eq 1 ]; then cat out-1.txt; else cat out-n.txt; fi\n',
        encoding="utf-8",
    )
    mpirun.chmod(0o755)
    perf = tmp_path / "all_reduce_perf"
    perf.write_text("#!/bin/sh\nexit 1\n", encoding="utf-8")
    perf.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(REPO)}

    def pair(*extra: str) -> tuple[list[float], str, int]:
        (tmp_path / "calls").unlink(missing_ok=True)
        done = subprocess.run(
            [
                sys.executable,
                "-S",
                "-m",
                "gpucert.bench",
                "pair",
                "--run-id",
                "pair-6",
                "--node",
                "a",
                "--peer",
                "b",
                "--nccl-tests",
                str(perf),
                "--mpi-hosts",
                "a:8,b:8",
                "--repeats",
                "3",
                *extra,
            ],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        values = list(read_log(done.stdout, done.stderr, "pair-6", "a").results["value"])
        calls = (tmp_path / "calls").read_text(encoding="utf-8").splitlines()
        return values, done.stderr, len(calls)

    values, err, calls = pair()
    assert (values, calls) == ([338.82] + [200.0] * 6, 7)
    said = f"pair: {METRIC}: repeats disagree (1 of 3 repeats far above their median): 2 more, 5 of at most 7"
    assert said in err
    assert f"pair: {METRIC}: repeats still disagree after 7" in err
    # 30 s is the margin kept free before the deadline: no extra sweep fits.
    values, err, calls = pair("--deadline-seconds", "30")
    assert (values, calls) == ([338.82, 200.0, 200.0], 3)
    assert "2 more would not fit before the deadline" in err


@pytest.mark.skipif(sys.platform == "win32", reason="a shell script stands in for mpirun")
def test_all_reduce_perf_built_without_mpi_is_no_pair_measurement(tmp_path: Path) -> None:
    """Without MPI=1 each process measures alone: every header lists rank 0, and that is refused."""
    alone = re.sub(r"(#\s*Rank\s+)\d+", r"\g<1>0", FIXTURE.read_text(encoding="utf-8"))
    mpirun = fake_mpirun(tmp_path, alone)
    with pytest.raises(NcclTestsError, match="built with MPI=1"):
        run_pair_nccl_tests(
            "/bin/true", mpirun=str(mpirun), hosts="a:8,b:8", sizes=(8, 1 << 20, 2), iters=1, warmup=1, timeout_s=30
        )
    one_host = re.sub(r" on ztan-mig-gq73 ", " on ztan-mig-235z ", FIXTURE.read_text(encoding="utf-8"))
    mpirun = fake_mpirun(tmp_path, one_host)
    with pytest.raises(NcclTestsError, match="not across the two nodes"):
        run_pair_nccl_tests(
            "/bin/true", mpirun=str(mpirun), hosts="a:8,b:8", sizes=(8, 1 << 20, 2), iters=1, warmup=1, timeout_s=30
        )
    assert mpi_slots("a:8,b:4") == 12
    for bad in ("a:8", "a:8,a:8", "a,b", "a:0,b:8", "a:8,b:8,c:8"):
        with pytest.raises(ValueError, match="two hosts"):
            mpi_slots(bad)


def test_pair_rows_name_the_peer_and_only_pair_metrics_take_one() -> None:
    out, err = io.StringIO(), io.StringIO()
    rows = RowWriter("r1", "n1", "NVIDIA H200", {0: Device(0, "GPU-x", "NVIDIA H200", 0)}, out=out, err=err)
    assert rows.pair_row(METRIC, "n2", 42.5, 1)
    assert not rows.pair_row(METRIC, "n2", float("inf"), 2)  # no measurement: the node's error row instead
    with pytest.raises(ValueError, match="peer is for pair metrics only"):
        rows.node_row(METRIC, 1.0)
    with pytest.raises(ValueError, match="the peer node is needed"):
        rows.pair_row(METRIC, "", 1.0)
    with pytest.raises(ValueError, match="a peer is for pair metrics only"):
        rows._measured("nccl_allreduce_busbw_gbps", None, 1.0, 0, "n2")
    lines = [json.loads(x) for x in out.getvalue().splitlines()]
    assert [(r["metric"], r["gpu"], r["peer"], r["value"], r["repeat"]) for r in lines] == [
        (METRIC, None, "n2", 42.5, 1),
        ("error", None, None, 1.0, 0),
    ]
    assert METRIC in err.getvalue()


def test_sweep_sizes_follow_nccl_tests_and_end_at_the_largest() -> None:
    assert sweep_sizes(8, 64, 2) == (8, 16, 32, 64)
    assert sweep_sizes(1 << 20, 8 << 30, 2)[-1] == 8 << 30
    assert sweep_sizes(100, 1000, 4) == (100, 400, 1000)
    assert sweep_sizes(6, 50, 2) == (4, 12, 24, 48)  # whole float32 elements, each size once
    with pytest.raises(ValueError, match="larger than the largest"):
        sweep_sizes(2, 1, 2)


# --- the Job and its Service ----------------------------------------------------------------------------


def validate(obj: Mapping[str, Any]) -> None:
    kubernetes_validate.validate(dict(obj), K8S, strict=True)


@pytest.fixture(scope="module")
def cm() -> dict[str, Any]:
    return payload_configmap()


LONG_NODE = ".".join(["ip-10-0-0-1"] + ["compute-internal-zone-a" * 2] * 4 + ["example"])[:253].rstrip(".-")


def kubelet_expand(arg: str, env: Mapping[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        return "$" if match.group(0) == "$$" else env.get(match.group(1), match.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)", one, arg)


def test_the_pair_job_and_service_are_valid_indexed_and_meet_through_the_service(
    cm: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = pair_job("night-1", "gpu-node-00002", "gpu-node-00001", 8, payload=cm)
    job, svc = pair.job, pair.service
    validate(job)
    validate(svc)
    name = pair_name("night-1", "gpu-node-00001", "gpu-node-00002")
    assert job["metadata"]["name"] == svc["metadata"]["name"] == name == pair.name
    assert len(name) <= 61  # `<job>-<index>` is each pod's hostname, a DNS label
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    assert (spec["backoffLimit"], spec["activeDeadlineSeconds"], spec["ttlSecondsAfterFinished"]) == (0, 3600, 86400)
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    assert pod["subdomain"] == svc["metadata"]["name"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False
    assert "nodeName" not in pod
    # Either pod may land on either node, never both on one: affinity to exactly the two, anti-affinity.
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    # One term per node, ORed: the API server allows a metadata.name matchFields requirement one value.
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]}
        for n in ("gpu-node-00001", "gpu-node-00002")
    ]
    assert pair.nodes == ("gpu-node-00001", "gpu-node-00002")
    [apart] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert apart["topologyKey"] == "kubernetes.io/hostname"
    assert apart["labelSelector"] == {"matchLabels": {f"{PREFIX}/pair-job": name}}
    # The Service: headless, names published before readiness, selecting this Job's pods and no others.
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    selector = svc["spec"]["selector"]
    assert selector == {f"{PREFIX}/pair-job": name}
    assert selector.items() <= labels.items()
    other = pair_job("night-1", "gpu-node-00001", "gpu-node-00003", 8, payload=cm).job
    assert not selector.items() <= other["spec"]["template"]["metadata"]["labels"].items()
    assert svc["spec"]["ports"] == [{"name": "rendezvous", "protocol": "TCP", "port": 29500, "targetPort": 29500}]
    # The benchmark Job's conventions: labels, tolerations, GPUs, the payload, no node annotation (two nodes).
    bench = benchmark_job("night-1", "gpu-node-00001", 8, payload=cm)
    assert pod["tolerations"] == bench["spec"]["template"]["spec"]["tolerations"]
    assert pod["volumes"] == bench["spec"]["template"]["spec"]["volumes"]
    assert labels["app.kubernetes.io/managed-by"] == "gpucert"
    assert labels[f"{PREFIX}/run-id"] == "night-1"
    assert f"{PREFIX}/node" not in labels
    assert job["metadata"]["annotations"] == {f"{PREFIX}/pair": "gpu-node-00001,gpu-node-00002"}
    [c] = pod["containers"]
    assert c["resources"] == bench["spec"]["template"]["spec"]["containers"][0]["resources"]
    # The command line, as each pod's payload parses it after the kubelet expanded it.
    assert pair.master == f"{name}-0.{name}.gpucert-system.svc:29500"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["JOB_COMPLETION_INDEX"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}
    }
    assert c["command"] == ["python", "-m", "gpucert.bench"]
    assert c["args"][0] == "pair"
    for index, node in ((0, "gpu-node-00002"), (1, "gpu-node-00001")):
        args = [kubelet_expand(a, {"NODE_NAME": node}) for a in c["args"][1:]]
        monkeypatch.setenv("JOB_COMPLETION_INDEX", str(index))  # what the Job controller gives pod `index`
        opts = parse_pair_args(args)
        assert (opts.rank, opts.node, opts.nodes) == (index, node, ("gpu-node-00001", "gpu-node-00002"))
        assert opts.master == (f"{name}-0.{name}.gpucert-system.svc", 29500)
        assert (opts.rule.repeats, opts.deadline_s) == (3, 3300)


def test_a_pair_is_one_job_whichever_way_round_and_names_never_collide(cm: dict[str, Any]) -> None:
    assert pair_name("night-1", "n1", "n2") == pair_name("night-1", "n2", "n1")
    names = {
        pair_name("night-1", "n1", "n2"),
        pair_name("night-1", "n1", "n3"),
        pair_name("night-2", "n1", "n2"),
        pair_name("night-1", "n1-n2", "n3"),
        pair_name("night-1", "n1", "n2-n3"),
        pair_name("2026-12-01", "n1", "n2"),
        pair_name("night-1", LONG_NODE, LONG_NODE[:-1] + "x"),
    }
    assert len(names) == 7
    for name in names:
        assert len(name) <= 61
        assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name), name  # a Service name starts with a letter
    pair = pair_job("2026-12-01", LONG_NODE, "gpu-node-1", 8, payload=cm)
    validate(pair.job)
    validate(pair.service)
    assert len(pair.master.rpartition(":")[0]) <= 253


@pytest.mark.parametrize(
    ("nodes", "words"),
    [
        (('n1"\n  evil: {{ x }}', "n2"), "not a DNS subdomain"),
        (("n1", "$(PYTHONPATH)"), "not a DNS subdomain"),
        (("N1", "n2"), "not a DNS subdomain"),
        (("", "n2"), "not a DNS subdomain"),
        (("n1", "n1"), "two nodes"),
    ],
)
def test_node_names_that_are_no_node_s_are_refused(cm: dict[str, Any], nodes: tuple[str, str], words: str) -> None:
    with pytest.raises(ValueError, match=words):
        pair_job("night-1", *nodes, 8, payload=cm)


def test_values_cannot_bend_the_pair_manifests_and_reach_the_payload_as_written(cm: dict[str, Any]) -> None:
    evil = 'x"\n  evil: {{ x }} &a *a $(PYTHONPATH)'
    settings = BenchmarkSettings(pod_annotations={"example.com/note": evil}, label_prefix="example.com")
    pair = pair_job(
        "night-1",
        "n1",
        "n2",
        4,
        payload=cm,
        settings=settings,
        pair_args=("-b", "1M", f"--stack-json=/tmp/{evil}.json"),
    )
    validate(pair.job)
    validate(pair.service)
    template = pair.job["spec"]["template"]
    assert template["metadata"]["annotations"] == {"example.com/pair": "n1,n2", "example.com/note": evil}
    assert set(pair.job["metadata"]) == set(pair.service["metadata"]) == {"name", "namespace", "labels", "annotations"}
    args = template["spec"]["containers"][0]["args"]
    assert args[-1] == f"--stack-json=/tmp/{evil.replace('$', '$$')}.json"
    assert args[-3:-1] == ["-b", "1M"]
    opts = parse_pair_args([kubelet_expand(a, {"NODE_NAME": "n1"}) for a in args[1:]] + ["--rank", "0"])
    assert opts.stack_json == f"/tmp/{evil}.json"
    assert opts.min_bytes == 1 << 20


@pytest.mark.parametrize(
    ("pair_args", "words"),
    [
        (("--rank", "1"), "may not set --rank"),
        (("--master=h:1",), "may not set --master"),
        (("--nodes", "a", "b"), "may not set --nodes"),
        (("--mpi-hosts", "a:8,b:8"), "may not set --mpi-hosts"),
        (("--gemm-seconds", "2"), "unrecognized arguments"),
        (("--min-byte", "1M"), "unrecognized arguments"),
        (("-b", "lots"), "is not a size"),
        ("-b", "a sequence of strings"),
    ],
)
def test_pair_args_the_payload_would_refuse_are_refused(cm: dict[str, Any], pair_args: Any, words: str) -> None:
    with pytest.raises(PayloadArgsError, match=re.escape(words)):
        pair_job("night-1", "n1", "n2", 8, payload=cm, pair_args=pair_args)


# --- on the simulated cluster ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=3, gpus=8, model="NVIDIA H200", seed=5, preconfigured=True) as cluster:
        yield cluster
        assert cluster.runtime is not None
        assert cluster.runtime.errors == []


@pytest.fixture(scope="module")
def kube(sim: SimCluster) -> Kube:
    return connect(sim.kubeconfig_path, retry=RetryPolicy(attempts=8, base_delay_s=0.001, max_delay_s=0.01))


def node(i: int) -> str:
    return f"gpu-node-{i:05d}"


def pods_of(kube: Kube, namespace: str, selector: Mapping[str, str]) -> list[dict[str, Any]]:
    text = ",".join(f"{k}={v}" for k, v in selector.items())
    return kube.list_objects("v1", "Pod", namespace, label_selector=text)


def test_the_pair_job_and_service_run_on_the_simulated_cluster(kube: Kube, cm: dict[str, Any]) -> None:
    """Created with the official client, the Job runs one pod on each node of the pair and completes,
    its Service selects exactly those pods, and deleting the Job takes the Service with it."""
    pair = pair_job("night-20", node(2), node(0), 8, payload=cm)
    ns = pair.job["metadata"]["namespace"]
    ensure_payload(kube, cm)
    job = kube.create(pair.job)
    svc = kube.create(owned_by(pair.service, job))
    assert svc["spec"]["clusterIP"] == "None"
    stored = kube.get("batch/v1", "Job", pair.name, ns)
    assert (stored["spec"]["completionMode"], stored["spec"]["completions"]) == ("Indexed", 2)
    assert stored["spec"]["template"]["spec"]["subdomain"] == pair.name

    def complete() -> dict[str, Any] | None:
        got = kube.get("batch/v1", "Job", pair.name, ns)
        done = [c for c in (got.get("status") or {}).get("conditions") or () if c.get("status") == "True"]
        return got if any(c["type"] == "Complete" for c in done) else None

    finished = eventually(complete, 15.0)
    assert finished["status"]["succeeded"] == 2
    pods = pods_of(kube, ns, svc["spec"]["selector"])
    assert sorted(p["spec"]["nodeName"] for p in pods) == [node(0), node(2)]  # one pod on each node
    assert {p["metadata"]["labels"]["batch.kubernetes.io/job-name"] for p in pods} == {pair.name}
    kube.delete("batch/v1", "Job", pair.name, ns)
    eventually(lambda: kube.find("v1", "Service", pair.name, ns) is None, 10.0)


def test_the_simulated_indexed_job_gives_each_pod_its_index_and_hostname(kube: Kube, cm: dict[str, Any]) -> None:
    pair = pair_job("night-21", node(0), node(1), 8, payload=cm)
    ns = pair.job["metadata"]["namespace"]
    ensure_payload(kube, cm)
    job = kube.create(pair.job)
    kube.create(owned_by(pair.service, job))
    try:
        pods = eventually(
            lambda: found if len(found := pods_of(kube, ns, {f"{PREFIX}/pair-job": pair.name})) == 2 else None, 10.0
        )
        index = "batch.kubernetes.io/job-completion-index"
        assert sorted(str(p["metadata"].get("annotations", {}).get(index)) for p in pods) == ["0", "1"]
        assert sorted(str(p["spec"].get("hostname")) for p in pods) == [f"{pair.name}-0", f"{pair.name}-1"]
        for pod in pods:
            i = pod["metadata"]["annotations"][index]
            assert pod["metadata"]["labels"][index] == i
            assert re.fullmatch(rf"{pair.name}-{i}-[a-z0-9]{{5}}", pod["metadata"]["name"])
            assert pod["spec"]["subdomain"] == pair.name  # the headless Service: <job>-0.<svc>.<ns>.svc resolves
        finished = eventually(
            lambda: (
                j
                if (j := kube.get("batch/v1", "Job", pair.name, ns)).get("status", {}).get("completedIndexes") == "0-1"
                else None
            ),
            15.0,
        )
        assert finished["status"]["succeeded"] == 2
        # Each pod's log reads as its own node's pair rows, peer the other node, both sides the same values.
        pods = pods_of(kube, ns, {f"{PREFIX}/pair-job": pair.name})
        sides = {
            p["spec"]["nodeName"]: parse_pod_log(
                kube.pod_log(p["metadata"]["name"], ns),
                run_id="night-21",
                node=p["spec"]["nodeName"],
                source=p["metadata"]["name"],
            )
            for p in pods
        }
        assert set(sides) == {node(0), node(1)}
        values = {}
        for here, there in ((node(0), node(1)), (node(1), node(0))):
            rows = sides[here].results
            assert set(rows["metric"].astype(str)) == {METRIC}
            assert set(rows["peer"].astype(str)) == {there}
            assert sides[here].errors == []
            values[here] = list(rows["value"])
        assert values[node(0)] == values[node(1)]
        assert len(values[node(0)]) >= 3
    finally:
        kube.delete("batch/v1", "Job", pair.name, ns)
