"""``gpucert explain`` end to end at scale: a 64-node job over 6 hours of 15 s telemetry, timed per part.

A simulated cluster (``gpucert sim``) runs a Job of ``--nodes`` pods, 8 GPUs each; their 6 h of DCGM
history (every series the explain gathering reads, with dcgm-exporter's pod labels, one GPU throttling
thermally from hour 2) and the job's ``train_step_seconds`` are written as OpenMetrics and backfilled with
``promtool`` into a real Prometheus (the binaries of ``tests/test_telemetry_prometheus.py``). Then
:func:`gpucert.explain.explain_job` runs as ``gpucert explain`` does: find the job over the official client,
the range queries, the events, the record (an empty store), the judgement and the timeline.

Printed: the seconds per part — ``prometheus`` (the range queries: HTTP and JSON decoding, summed over the
query threads), ``frames`` (answers into frames, summed likewise), ``gather`` (the wall time of both), then
resolve, events, record, judge, render — the points read, and whether the straggler was named. The issue's
bar: ≤ 30 s beyond the Prometheus queries.

    python benchmarks/explain_e2e_speed.py [--nodes 64] [--hours 6] [--workers 4] [--workdir benchmarks/out/explain]
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpucert.explain import explain_job
from gpucert.kube import Kube
from gpucert.telemetry import PrometheusSource
from gpucert_sim import SimCluster
from tests.test_telemetry_prometheus import IDLE_CONFIG, PromBins, _cache_dir, running_prometheus

STEP = 15
GAUGES = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES",
)
COUNTERS = (
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_THERMAL_VIOLATION",
    "DCGM_FI_DEV_POWER_VIOLATION",
)


def history(path: Path, pods: dict[str, str], start: int, end: int, hot: tuple[str, int], onset: int) -> int:
    """Write the OpenMetrics backfill of every pod's GPUs to ``path``; returns the samples written."""
    rng = np.random.default_rng(7)
    times = np.arange(start, end + 1, STEP)
    n = len(times)
    after = times >= onset
    written = 0
    with path.open("w", encoding="utf-8") as out:
        for name in (*GAUGES, *COUNTERS, "train_step_seconds"):
            out.write(f"# TYPE {name} gauge\n")
            for i, (pod, node) in enumerate(sorted(pods.items())):
                if name == "train_step_seconds":
                    values = np.where(after, 1.9, 1.0) + rng.normal(0, 0.01, n)
                    series = [(f'{name}{{namespace="bench",pod="{pod}"}}', values)]
                else:
                    series = []
                    for gpu in range(8):
                        is_hot = (node, gpu) == hot
                        values = _values(name, is_hot, after, rng, n)
                        labels = (
                            f'gpu="{gpu}",UUID="GPU-{i:04d}-{gpu}",modelName="NVIDIA H200",hostname="{node}",'
                            f'pod="{pod}",namespace="bench",container="train"'
                        )
                        series.append((f"{name}{{{labels}}}", values))
                for prefix, values in series:
                    out.write("".join(f"{prefix} {v:.6g} {t}\n" for v, t in zip(values, times, strict=True)))
                    written += n
        out.write("# EOF\n")
    return written


def _values(name: str, hot: bool, after: np.ndarray, rng: np.random.Generator, n: int) -> np.ndarray:
    slow = after & hot
    if name == "DCGM_FI_DEV_SM_CLOCK":
        return np.where(slow, 990.0, 1980.0 - rng.integers(0, 15, n))
    if name == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS":
        return np.where(slow, float(0x48), 0.0)
    if name == "DCGM_FI_DEV_POWER_USAGE":
        return np.where(slow, 450.0, 680.0 + rng.normal(0, 3, n))
    if name == "DCGM_FI_DEV_GPU_TEMP":
        return np.where(slow, 89.0, 62.0 + rng.normal(0, 1, n))
    if name == "DCGM_FI_DEV_GPU_UTIL":
        return np.where(slow, 99.0, np.where(after, 60.0, 95.0))
    if name == "DCGM_FI_PROF_GR_ENGINE_ACTIVE":
        return np.where(slow, 0.97, np.where(after, 0.55, 0.9))
    if name == "DCGM_FI_DEV_XID_ERRORS":
        return np.zeros(n)
    if name in ("DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES"):
        return np.full(n, 20e9)
    rate = {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 300e9}.get(name, 0.0)
    per_step = np.full(n, rate * STEP)
    if name == "DCGM_FI_DEV_THERMAL_VIOLATION":
        per_step = np.where(slow, 0.9e9 * STEP, 0.0)
    return np.cumsum(per_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--workdir", default="benchmarks/out/explain")
    parser.add_argument("--workers", type=int, default=4, help="range queries in flight at once")
    args = parser.parse_args()
    bins = PromBins(_cache_dir() / "usr/bin/prometheus", _cache_dir() / "usr/bin/promtool")
    if not bins.promtool.is_file():
        sys.exit("no Prometheus binaries: run tests/test_telemetry_prometheus.py once to fetch them")
    work = Path(args.workdir)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    end = (int(time.time()) - 600) // 60 * 60
    start = end - int(args.hours * 3600)
    with SimCluster(nodes=args.nodes, gpus=8, preconfigured=True, seed=1) as sim:
        api = sim.api_client()
        client.CoreV1Api(api).create_namespace({"metadata": {"name": "bench"}})
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "pretrain"},
            "spec": {
                "parallelism": args.nodes,
                "completions": args.nodes,
                "template": {
                    "metadata": {"annotations": {"sim.gpucert.io/run-seconds": "36000"}},
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {"name": "train", "image": "train:1", "resources": {"limits": {"nvidia.com/gpu": "8"}}}
                        ],
                    },
                },
            },
        }
        client.BatchV1Api(api).create_namespaced_job("bench", job)
        kube = Kube(api)
        deadline = time.monotonic() + 60
        while True:
            pods = kube.list_objects("v1", "Pod", "bench", label_selector="job-name=pretrain")
            placed = {p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods}
            if len(placed) == args.nodes and all(placed.values()):
                break
            if time.monotonic() > deadline:
                sys.exit("the job's pods were not all scheduled")
            time.sleep(0.2)
        hot = (sorted(placed.values())[args.nodes // 3], 5)
        began = time.perf_counter()
        samples = history(work / "history.om", placed, start, end, hot, start + 7200)
        written = time.perf_counter() - began
        began = time.perf_counter()
        made = subprocess.run(
            [str(bins.promtool), "tsdb", "create-blocks-from", "openmetrics", "history.om", "data"],
            cwd=work,
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            sys.exit(made.stderr[-2000:])
        (work / "history.om").unlink()
        backfilled = time.perf_counter() - began
        with running_prometheus(bins, work, IDLE_CONFIG) as url:
            source = PrometheusSource(url, workers=args.workers)
            began = time.perf_counter()
            done = explain_job(
                kube,
                source,
                "bench/pretrain",
                since=datetime.fromtimestamp(start, UTC),
                until=datetime.fromtimestamp(end, UTC),
                now=datetime.now(UTC) + timedelta(seconds=1),
            )
            total = time.perf_counter() - began
    s = done.seconds
    # The work that is not a query: answers into frames (thread time, so an upper bound of its share of the
    # wall), events, pod logs, the record, the judgement and the timeline.
    rest = sum(s.get(k, 0.0) for k in ("resolve", "frames", "events", "logs", "record", "judge", "render"))
    first = done.explanation.suspects[0] if done.explanation.suspects else None
    print(
        f"{args.nodes} nodes × 8 GPUs, {args.hours:g} h at {STEP} s: {samples:,} samples backfilled "
        f"(written {written:.0f} s, promtool {backfilled:.0f} s)"
    )
    print(
        f"explain_job: {total:.1f} s wall; {done.gathered.queries} queries, "
        f"{len(done.gathered.telemetry):,} telemetry rows"
    )
    print("  " + ", ".join(f"{k} {v:.2f} s" for k, v in sorted(s.items())))
    print(
        f"  beyond the Prometheus queries: {rest:.1f} s (bar: ≤ 30 s); the queries' own time is summed over "
        f"{args.workers} threads"
    )
    named = f"{first.node} GPU {first.gpu}" if first else "none"
    print(f"  straggler: {named} (injected {hot[0]} GPU {hot[1]}); verdict {done.explanation.verdict}")


if __name__ == "__main__":
    main()
