"""How long certify takes on a simulated cluster (issue 5's bars: 64 nodes × 8 GPUs with five faults of
different kinds ≤ 60 s; 1,000 nodes ≤ 5 minutes on a 2-core machine), simulated benchmark time ≈ 0.

    python benchmarks/certify_speed.py [--nodes 64] [--faults 5] [--max-parallel 16] [--shard-size N]
                                       [--workers N] [--sim-process] [--no-pairs] [--clean-only]

``--shard-size`` sets the policy's shard size: a run of more nodes benchmarks in shards — here in this
process, as sub-flows, unless ``--workers N`` starts N real ``prefect worker start`` processes on a
process pool (``--limit 1`` each, the ``shards`` queue) with prefect.yaml's ``certify-shard`` deployment and
saves the blocks, so the shards run as child flow runs on them as in production and this process is the
parent alone (the workers' flow-run processes' peak RSS is printed apart). Each run also prints the
Prefect task runs it made.
Each run measures its links too (the policy's ``network.pairs``, on by default); ``--no-pairs`` turns them
off, for issue 14's bar: the pairing rounds and their judgement add at most 2× the certify without them.
``--sim-process`` serves the simulated cluster from its own ``gpucert sim up`` process (faults through
``gpucert sim inject``), so this process's peak RSS is the flow's alone — the parent of issue 17's bar.

A clean first run seeds the baselines (timed and printed too), then the measured run has faults of five
kinds injected on five nodes. Runs under a temporary Prefect server started first (not counted). Prints
what it measured: wall time, nodes per state, what was tainted, peak RSS of this process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

KINDS = [("pcie_gen4", 2), ("remap_failure", 5), ("hw_thermal", 1), ("nvlink_one_down", 6), ("power_brake", None)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--faults", type=int, default=5, help="faulty nodes (kinds cycle through five)")
    parser.add_argument("--max-parallel", type=int, default=16)
    parser.add_argument("--shard-size", type=int, default=None, help="the policy's shard size (default 1000)")
    parser.add_argument(
        "--workers",
        type=int,
        default=0,
        help="shards on this many process workers (the certify-shard deployment), not in this process",
    )
    parser.add_argument("--sim-process", action="store_true", help="the simulator in its own process")
    parser.add_argument("--clean-only", action="store_true", help="only the first run (it seeds the baselines)")
    parser.add_argument("--no-pairs", action="store_true", help="the policy's network.pairs off: no links step")
    args = parser.parse_args()

    import httpx
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    from gpucert.blocks.cluster import GpuCluster
    from gpucert.blocks.policy import CertificationPolicy
    from gpucert.blocks.store import StoreLocation
    from gpucert.certify import CertifyOutcome
    from gpucert.flows.certify import certify

    logging.getLogger("prefect").setLevel(logging.WARNING)
    t0 = time.perf_counter()
    with (
        prefect_test_harness(server_startup_timeout=120),
        temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
    ):
        print(f"prefect test server up in {time.perf_counter() - t0:.1f} s (not counted)", flush=True)
        t1 = time.perf_counter()
        with (
            simulated(args.nodes, args.sim_process) as (kubeconfig, inject, sim_peak_mb),
            tempfile.TemporaryDirectory() as d,
            shard_workers(args.workers, kubeconfig, str(PREFECT_API_URL.value()), Path(d)) as workers_peak_mb,
        ):
            print(f"simulated cluster of {args.nodes} nodes up in {time.perf_counter() - t1:.1f} s", flush=True)
            cluster = GpuCluster(kubeconfig=str(kubeconfig))
            store = StoreLocation(uri=f"file://{d}/store")

            fields: dict[str, Any] = {"shard_size": args.shard_size} if args.shard_size else {}
            if args.no_pairs:
                fields["policy"] = {"network": {"pairs": False}}
            policy = CertificationPolicy(**fields) if fields else None
            if args.workers:  # a worker's flow run loads the blocks by reference: saved, or the shards stay here
                cluster.save("bench-cluster", overwrite=True)
                store.save("bench-store", overwrite=True)
                policy = policy or CertificationPolicy()
                policy.save("bench-policy", overwrite=True)

            def task_runs() -> int:
                answer = httpx.post(f"{PREFECT_API_URL.value()}/task_runs/count", json={}, timeout=30)
                answer.raise_for_status()
                return int(answer.json())

            def run(run_id: str) -> tuple[float, CertifyOutcome]:
                start, tasks_before, busy_before = time.perf_counter(), task_runs(), machine_busy()
                with RssSampler() as rss:
                    out = asyncio.run(
                        certify(
                            cluster=cluster, store=store, policy=policy, run_id=run_id, max_parallel=args.max_parallel
                        )
                    )
                seconds = time.perf_counter() - start
                busy = (machine_busy() - busy_before) / seconds
                print(
                    f"  {run_id}: {task_runs() - tasks_before} Prefect task runs; the machine's CPUs busy "
                    f"{busy:.2f} of {os.cpu_count()} on average",
                    flush=True,
                )
                print(f"  peak RSS of this process by step: {rss.by_task(str(PREFECT_API_URL.value()))}", flush=True)
                if args.workers:
                    print(
                        f"  peak RSS of one shard's flow-run process on a worker: {workers_peak_mb():.0f} MB",
                        flush=True,
                    )
                for line in out.links[:2]:
                    print(f"  links: {line}", flush=True)
                return seconds, out

            seconds, clean = run("bench-clean")
            print(f"clean run (seeds baselines): {seconds:6.1f} s; states {clean.states}", flush=True)
            if args.clean_only:
                decided = sum(clean.states.values())
                print(f"  {decided} of {args.nodes} nodes decided; tainted {len(clean.tainted)}")
                print(
                    f"  peak RSS of this process: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB"
                    + (f"; of the simulator: {sim_peak_mb():.0f} MB" if args.sim_process else " (flow + simulator)")
                )
                return 0
            names = [f"gpu-node-{i:05d}" for i in range(args.nodes)]
            step = max(1, len(names) // max(1, args.faults))
            injected = []
            for i in range(args.faults):
                kind, gpu = KINDS[i % len(KINDS)]
                node = names[(i * step + step // 2) % len(names)]
                inject(kind, node, gpu)
                injected.append(f"{kind}@{node}")
            seconds, night = run("bench-night")
    print(f"faulty run: {seconds:6.1f} s for {args.nodes} nodes × 8 GPUs; injected {', '.join(injected)}")
    print(f"  states {night.states}; tainted {night.tainted}; unconfirmed {night.unconfirmed}")
    print(
        f"  audit trail: {night.audited} changes recorded and sent as Events in {night.audit_seconds:.1f} s "
        f"({night.audit_seconds / seconds * 100:.1f} % of the run)"
    )
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if args.sim_process:
        where = "shards on the workers" if args.workers else "shards as its sub-flows"
        print(
            f"  peak RSS of this process (the flow; {where}): {peak_mb:.0f} MB; "
            f"of the simulator: {sim_peak_mb():.0f} MB"
        )
    else:
        print(f"  peak RSS of this process (flow + simulator): {peak_mb:.0f} MB")
    return 0


def machine_busy() -> float:
    """CPU seconds the whole machine has spent on anything but idling and waiting for I/O (``/proc/stat``):
    whether a run was held up by the CPUs (busy near all of them) or by waiting."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


class RssSampler:
    """This process's RSS every 0.2 s while in the ``with`` block, and its peak within each Prefect task
    run's window: where the flow's memory goes (a task running within another counts in both)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not self._stop.wait(0.2):
            with open("/proc/self/statm") as f:
                self.samples.append((time.time(), int(f.read().split()[1]) * page / 2**20))

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def by_task(self, api: str) -> str:
        """``step: peak MB`` for the task runs started while sampling, in the order they began, and the
        rest; then when each step started in the run and how long it lasted (first start to last end of its
        task runs, which may overlap: the shards run side by side)."""
        from datetime import datetime

        import httpx

        if not self.samples:
            return "no samples"
        since = datetime.fromtimestamp(self.samples[0][0], tz=UTC).isoformat()
        body = {"task_runs": {"start_time": {"after_": since}}, "limit": 200}
        runs = httpx.post(f"{api}/task_runs/filter", json=body, timeout=30).json()
        peaks: dict[str, float] = {}
        began: dict[str, float] = {}
        ended: dict[str, float] = {}
        covered: set[int] = set()
        for run in runs:
            if not run.get("start_time") or not run.get("end_time"):
                continue
            lo = datetime.fromisoformat(run["start_time"]).timestamp()
            hi = datetime.fromisoformat(run["end_time"]).timestamp()
            inside = [i for i, (t, _) in enumerate(self.samples) if lo <= t <= hi]
            if inside:
                # benchmark (the shards' too), judge, settle, pair, keep…; run_deployment's stand-in task run
                # for a child flow run is named after the run (a shard's wait in the parent).
                waits_for_a_shard = ".run_deployment." in str(run.get("task_key") or "")
                step = "shard" if waits_for_a_shard else str(run["name"]).split(" ")[0]
                peaks[step] = max(peaks.get(step, 0.0), *(self.samples[i][1] for i in inside))
                began[step] = min(began.get(step, lo), lo)
                ended[step] = max(ended.get(step, hi), hi)
                covered.update(inside)
        rest = [mb for i, (_, mb) in enumerate(self.samples) if i not in covered]
        in_order = sorted(peaks, key=began.__getitem__)
        line = ", ".join(f"{step} {peaks[step]:.0f}" for step in in_order)
        line += (f"; between tasks {max(rest):.0f}" if rest else "") + " MB (steps in the order they began)"
        t0 = self.samples[0][0]
        spans = ", ".join(f"{step} {began[step] - t0:.0f}+{ended[step] - began[step]:.1f}" for step in in_order)
        return f"{line}\n  steps as started+lasted, seconds into the run: {spans}"


@contextlib.contextmanager
def shard_workers(count: int, kubeconfig: Path, api_url: str, workdir: Path) -> Iterator[Callable[[], float]]:
    """``count`` process workers serving prefect.yaml's ``certify-shard`` deployment on the ``gpucert`` pool
    (none: nothing is started). Yields a function giving the largest peak RSS in MB any process below a
    worker reached (a flow run's, sampled every 0.5 s); the workers' output goes to ``workdir``."""
    if not count:
        yield lambda: 0.0
        return
    root = Path(__file__).resolve().parent.parent
    prefect = str(Path(sys.executable).with_name("prefect"))
    env = {
        **os.environ,
        "PREFECT_API_URL": api_url,
        "KUBECONFIG": str(kubeconfig),
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30",
    }
    for command in (
        ["work-pool", "create", "gpucert", "--type", "process", "--overwrite"],
        ["deploy", "--name", "certify-shard"],
    ):
        done = subprocess.run(
            [prefect, "--no-prompt", *command], env=env, cwd=root, capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            sys.exit(f"prefect {' '.join(command)} failed:\n{done.stdout}{done.stderr}")
    workers = []
    for i in range(count):
        log = (workdir / f"worker-{i}.log").open("wb")
        workers.append(
            subprocess.Popen(
                [
                    prefect,
                    "worker",
                    "start",
                    "--pool",
                    "gpucert",
                    "--type",
                    "process",
                    "--limit",
                    "1",
                    "--work-queue",
                    "shards",
                ],
                env=env,
                cwd=root,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    peaks: dict[int, float] = {}
    stop = threading.Event()

    def sample() -> None:
        page = os.sysconf("SC_PAGE_SIZE")
        while not stop.wait(0.5):
            for pid in _below({w.pid for w in workers}):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page / 2**20
                    peaks[pid] = max(peaks.get(pid, 0.0), rss)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        yield lambda: max(peaks.values(), default=0.0)
    finally:
        stop.set()
        for worker in workers:
            worker.terminate()
        for worker in workers:
            # The run is over and nothing is left for a worker to do; one that does not act on SIGTERM
            # at once (seen: a minute) is killed, so the script ends when its figures are printed.
            try:
                worker.wait(timeout=5)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()


def _below(roots: set[int]) -> list[int]:
    """Every process below ``roots`` (a process worker starts each flow run in a session of its own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):  # a process that ended while read
            children.setdefault(int(stat.read_text().rsplit(")", 1)[1].split()[1]), []).append(int(stat.parent.name))
    found, todo = [], list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@contextlib.contextmanager
def simulated(
    nodes: int, own_process: bool
) -> Iterator[tuple[Path, Callable[[str, str, int | None], None], Callable[[], float]]]:
    """A simulated cluster of ``nodes``: (its kubeconfig, inject(kind, node, gpu), the sim's peak RSS in MB)."""
    from gpucert_sim import SimCluster
    from gpucert_sim.fleet import Fault

    if not own_process:
        with SimCluster(nodes=nodes, preconfigured=True, seed=3) as sim:
            yield sim.kubeconfig_path, lambda kind, node, gpu: sim.inject_fault(Fault(kind, node, gpu)), lambda: 0.0
        return
    from benchmarks.sim_scale import Sim

    with tempfile.TemporaryDirectory() as workdir:
        proc = Sim(nodes, 8, Path(workdir), seed=3)
        peak = 0.0

        def sim_peak_mb() -> float:
            return max(peak, proc.peak_rss_mb()) if proc.proc.poll() is None else peak

        def inject(kind: str, node: str, gpu: int | None) -> None:
            command = [
                sys.executable,
                "-c",
                "import sys; from gpucert.cli import main; sys.exit(main())",
                "sim",
                "inject",
                "--kubeconfig",
                str(proc.kubeconfig),
                "--gpu",
                kind,
                node,
                *([str(gpu)] if gpu is not None else []),
            ]
            subprocess.run(command, check=True, capture_output=True)

        try:
            proc.wait_for_kubeconfig(timeout_s=300)
            yield proc.kubeconfig, inject, sim_peak_mb
            peak = proc.peak_rss_mb()
        finally:
            proc.stop()


if __name__ == "__main__":
    sys.exit(main())
