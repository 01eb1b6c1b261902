"""``gpucert explain`` of a large job against a real Prometheus: 128 nodes × 8 GPUs over 6 hours at a 15 s scrape.

The history is written the way real exporters write it — dcgm-exporter's fields (all 22 the explain gathering
reads, zeros included — PCIe link generation and width with their maxima, ECC, row remapping, replays, XIDs,
violations, NVLink, PCIe traffic, clocks, power, temperature, utilisation), its labels (``gpu``, ``UUID``,
``Hostname``, the workload's ``pod``/``namespace``/``container``), node-exporter's infiniband collector (8 ports per
node), the job's ``train_step_seconds`` per pod and NCCL Inspector's per-rank collective times every 30 s (its
``comm_id``, ``hostname``, ``rank``, ``gpu_device_id`` …; ``coll_sn`` and ``timestamp`` dropped by a
``labeldrop`` relabeling, as a team keeping its series count bounded does) — as OpenMetrics, backfilled with
``promtool tsdb create-blocks-from openmetrics`` into a real Prometheus (the binaries of
``tests/test_telemetry_prometheus.py``). One GPU computes 20 % slower from hour 3 with no DCGM sign.

Then, in a fresh process (so its peak memory is explain's alone), :func:`gpucert.explain.gather` and the
judgement run as ``gpucert explain`` runs them — every range query, the frames, the judgement, the timeline —
over the job's pods (given, not listed from a cluster: the cluster side is a few list calls). Printed: the wall
seconds, the peak resident memory (``ru_maxrss``), the seconds per part and whether the straggler was named.
The bar of issue 31: ≤ 60 s and ≤ 2 GB on 2 cores.

    python benchmarks/explain_large.py [--nodes 128] [--hours 6] [--workdir benchmarks/out/explain-large]
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

STEP = 15
NCCL_EVERY = 30
GPUS = 8
SLOW_GPU = 5  # the GPU of node number nodes // 3 that computes 20 % slower from the middle of the window

#: dcgm-exporter fields → how a healthy GPU's values go (a gauge around a level, a counter at a rate, a constant).
DCGM: dict[str, tuple[str, float, float]] = {
    "DCGM_FI_DEV_SM_CLOCK": ("gauge", 1980, 6),
    "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": ("const", 0, 0),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", 650, 10),
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", 66, 1.2),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", 95, 1),
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE": ("gauge", 0.9, 0.01),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("counter", 300e9, 0),
    "DCGM_FI_PROF_PCIE_TX_BYTES": ("gauge", 18e9, 2e8),
    "DCGM_FI_PROF_PCIE_RX_BYTES": ("gauge", 22e9, 2e8),
    "DCGM_FI_DEV_XID_ERRORS": ("const", 0, 0),
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("const", 0, 0),
    "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": ("const", 0, 0),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("const", 0, 0),
    "DCGM_FI_DEV_THERMAL_VIOLATION": ("const", 0, 0),
    "DCGM_FI_DEV_POWER_VIOLATION": ("const", 0, 0),
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("const", 5, 0),
    "DCGM_FI_DEV_PCIE_MAX_LINK_GEN": ("const", 5, 0),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("const", 16, 0),
    "DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH": ("const", 16, 0),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("const", 0, 0),
    "DCGM_FI_DEV_ROW_REMAP_PENDING": ("const", 0, 0),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("const", 0, 0),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("const", 0, 0),
}
IB = (
    "node_infiniband_rate_bytes_per_second",
    "node_infiniband_symbol_error_total",
    "node_infiniband_link_downed_total",
    "node_infiniband_port_errors_received_total",
)


def node_name(i: int) -> str:
    return f"bench-gpu-{i:03d}"


def pod_name(i: int) -> str:
    return f"train-{i:03d}"


def _write(out: TextIO, prefix: str, values: np.ndarray, stamps: list[str], integer: bool) -> int:
    text = values.astype(np.int64).astype(str) if integer else np.char.mod("%.6g", values)
    out.write("".join(f"{prefix} {v} {t}\n" for v, t in zip(text.tolist(), stamps, strict=True)))
    return len(stamps)


def write_history(path: Path, nodes: int, start: int, end: int) -> int:
    """The OpenMetrics backfill; returns the samples written."""
    rng = np.random.default_rng(31)
    times = np.arange(start, end + 1, STEP, dtype=np.int64)
    stamps = [str(t) for t in times]
    n = len(times)
    after = times >= start + (end - start) // 2
    written = 0
    with path.open("w", encoding="ascii") as out:
        for name, (kind, level, spread) in DCGM.items():
            out.write(f"# TYPE {name} gauge\n")
            for i in range(nodes):
                for g in range(GPUS):
                    labels = (
                        f'gpu="{g}",UUID="GPU-{i:03d}-{g}",Hostname="{node_name(i)}",pod="{pod_name(i)}",'
                        f'namespace="bench",container="train"'
                    )
                    if kind == "gauge":
                        values = level + spread * rng.standard_normal(n)
                    elif kind == "counter":
                        values = level * STEP * np.arange(1, n + 1, dtype=np.float64)
                    else:
                        values = np.full(n, float(level))
                    integer = kind != "gauge" or level >= 100
                    written += _write(out, f"{name}{{{labels}}}", values, stamps, integer)
        step = 1.0 + 0.02 * rng.standard_normal(n)
        step[after] *= 1.2
        out.write("# TYPE train_step_seconds gauge\n")
        for i in range(nodes):
            written += _write(
                out,
                f'train_step_seconds{{namespace="bench",pod="{pod_name(i)}",container="train"}}',
                step,
                stamps,
                False,
            )
        for name in IB:
            out.write(f"# TYPE {name} gauge\n")
            for i in range(nodes):
                for d in range(8):
                    labels = f'device="mlx5_{d}",port="1",instance="{node_name(i)}:9100",job="node-exporter"'
                    values = np.full(n, 50e9) if name.endswith("per_second") else np.zeros(n)
                    written += _write(out, f"{name}{{{labels}}}", values, stamps, True)
        dumps = times[:: NCCL_EVERY // STEP]
        dump_stamps = [str(t) for t in dumps]
        late = dumps >= start + (end - start) // 2
        for name in ("nccl_collective_exec_time_microseconds", "nccl_bus_bandwidth_gbs"):
            out.write(f"# TYPE {name} gauge\n")
            for i in range(nodes):
                for g in range(GPUS):
                    exec_us = 300 * (1 + 0.015 * rng.standard_normal(len(dumps)))
                    if (i, g) != (nodes // 3, SLOW_GPU):
                        exec_us[late] *= 440 / 300  # every other rank waits for the slow one
                    values = exec_us if name.endswith("microseconds") else 360 * 300 / exec_us
                    labels = (
                        f'comm_id="0xbenchc0ffee",hostname="{pod_name(i)}",rank="{i * GPUS + g}",'
                        f'slurm_job="unknown",slurm_job_id="unknown",nranks="{nodes * GPUS}",n_nodes="{nodes}",'
                        f'gpu_device_id="GPU{g}",collective="AllReduce",message_size="256.00MB",'
                        f'instance="{node_name(i)}:9100",job="node-exporter"'
                    )
                    written += _write(out, f"{name}{{{labels}}}", values, dump_stamps, False)
        out.write("# EOF\n")
    return written


def explain_once(url: str, nodes: int, start: int, end: int) -> dict[str, Any]:
    """Gather and judge the job as ``gpucert explain`` does; the figures of this process."""
    import pandas as pd

    from gpucert.explain import JobTarget, TargetPod, diagnose, empty_record, gather
    from gpucert.kube import KubeError
    from gpucert.telemetry import PrometheusSource

    class NoCluster:
        def list_objects(self, *_: Any, **__: Any) -> list[dict[str, Any]]:
            return []

        def get(self, *_: Any, **__: Any) -> dict[str, Any]:
            raise KubeError("not here")

    began = time.perf_counter()
    window = (pd.Timestamp(start, unit="s", tz="UTC"), pd.Timestamp(end, unit="s", tz="UTC"))
    pods = tuple(
        TargetPod(
            namespace="bench",
            name=pod_name(i),
            uid=f"u{i}",
            node=node_name(i),
            phase="Running",
            reason="",
            gpus=GPUS,
            node_gpus=GPUS,
            started=window[0],
            ended=None,
            containers=("train",),
        )
        for i in range(nodes)
    )
    target = JobTarget(
        job="bench/train", kind="Job", namespace="bench", selector="job-name=train", pods=pods, window=window
    )
    got = gather(NoCluster(), PrometheusSource(url, timeout_s=300), target, read_logs=False)  # type: ignore[arg-type]
    explanation, html, judged = diagnose(target, got, empty_record(), list(got.notes))
    wall = time.perf_counter() - began
    usage = resource.getrusage(resource.RUSAGE_SELF)
    top = explanation.suspects[0] if explanation.suspects else None
    return {
        "wall_s": round(wall, 1),
        "peak_rss_mb": round(usage.ru_maxrss / 1024),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "parts_s": {k: round(v, 1) for k, v in {**got.seconds, **judged}.items()},
        "queries": got.queries,
        "telemetry_rows": len(got.telemetry),
        "collective_rows": len(got.collectives),
        "verdict": explanation.verdict,
        "answer": explanation.answer[0][:160],
        "named": top is not None and (top.node, top.gpu) == (node_name(nodes // 3), SLOW_GPU),
        "timeline_kb": len(html) // 1024,
    }


def _pid_of(workdir: Path) -> int:
    """The Prometheus serving ``workdir``'s data (its command line names it)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if str(workdir / "data").encode() in (proc / "cmdline").read_bytes():
                    return int(proc.name)
            except OSError:
                continue
    return 0


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 when unknown)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0.0
    import os

    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=128)
    parser.add_argument("--hours", type=float, default=6.0)
    parser.add_argument("--workdir", type=Path, default=Path("benchmarks/out/explain-large"))
    parser.add_argument("--explain-only", nargs=3, metavar=("URL", "START", "END"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.explain_only:
        url, start, end = args.explain_only
        print(json.dumps(explain_once(url, args.nodes, int(start), int(end))))
        return

    from tests.test_telemetry_prometheus import IDLE_CONFIG, PromBins, _cache_dir, running_prometheus

    found = shutil.which("prometheus"), shutil.which("promtool")
    bins = (
        PromBins(Path(found[0]), Path(found[1]))
        if found[0] and found[1]
        else PromBins(_cache_dir() / "usr/bin/prometheus", _cache_dir() / "usr/bin/promtool")
    )
    work = args.workdir.resolve()
    stamp = work / "window.json"
    if not stamp.is_file() or json.loads(stamp.read_text())["nodes"] != args.nodes:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        end = (int(time.time()) - 900) // 60 * 60
        start = end - int(args.hours * 3600)
        began = time.perf_counter()
        samples = write_history(work / "history.om", args.nodes, start, end)
        wrote = time.perf_counter()
        made = subprocess.run(
            [str(bins.promtool), "tsdb", "create-blocks-from", "openmetrics", "history.om", "data"],
            cwd=work,
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            sys.exit(f"promtool failed: {made.stderr[-2000:]}")
        (work / "history.om").unlink()
        print(
            f"history: {samples:,} samples written in {wrote - began:.0f} s, backfilled in "
            f"{time.perf_counter() - wrote:.0f} s",
            flush=True,
        )
        stamp.write_text(json.dumps({"nodes": args.nodes, "start": start, "end": end}))
    window = json.loads(stamp.read_text())
    with running_prometheus(bins, work, IDLE_CONFIG) as url:
        server = _pid_of(work)
        server_cpu = _cpu_s(server)
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--nodes",
                str(args.nodes),
                "--explain-only",
                url,
                str(window["start"]),
                str(window["end"]),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        server_cpu = _cpu_s(server) - server_cpu
    if child.returncode != 0:
        sys.exit(f"explain failed: {child.stderr[-3000:]}")
    figures = json.loads(child.stdout.strip().splitlines()[-1])
    figures["prometheus_cpu_s"] = round(server_cpu, 1)
    hours = (window["end"] - window["start"]) / 3600
    print(
        f"explain of {args.nodes} nodes × {GPUS} GPUs over {hours:g} h at {STEP} s: {figures['wall_s']} s, "
        f"peak {figures['peak_rss_mb']} MB (bar: 60 s, 2048 MB)"
    )
    with open("/proc/loadavg", encoding="ascii") as load:
        figures["load_average"] = load.read().split()[:3]
    print(
        f"CPU seconds: explain {figures['cpu_s']}, Prometheus {figures['prometheus_cpu_s']} (on an idle 2-core "
        f"machine the wall time is about their sum / 2 at best); load average {figures['load_average']}"
    )
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
