"""How long configure takes on a simulated cluster, beyond the simulated rollout time (issue 4's bar:
≤ 30 s on 64 nodes).

The simulator makes each pod Ready ``--pod-ready`` seconds after it starts; the five components roll
out one after another, each on all nodes at once, so the rollout itself costs about
5 × (pod start + pod ready). What is left is configure's own cost: inventory, planning, rendering,
applies, label patches, polls, verification, artifacts, Prefect's bookkeeping.

    python benchmarks/configure_speed.py [--nodes 64] [--pod-ready 2.0] [--faults]

Runs the flow under a temporary Prefect server (started first, not counted), then a second run on the
configured cluster (which must change nothing). Prints what it measured.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--pod-start", type=float, default=0.5, help="simulated seconds from bound to Running")
    parser.add_argument("--pod-ready", type=float, default=2.0, help="simulated seconds from Running to Ready")
    parser.add_argument("--faults", action="store_true", help="10 %% 500s and 3 %% 429s (Retry-After 1 s)")
    args = parser.parse_args()

    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    from gpucert.blocks.cluster import GpuCluster
    from gpucert.flows.configure import configure
    from gpucert.stack import COMPONENTS
    from gpucert_sim import ApiFaults, SimCluster, SimTiming

    faults = ApiFaults(error_rate=0.1, throttle_rate=0.03, retry_after_s=1, seed=1) if args.faults else None
    timing = SimTiming(pod_start_s=args.pod_start, pod_ready_s=args.pod_ready)
    rollout_s = len(COMPONENTS) * (args.pod_start + args.pod_ready)
    t0 = time.perf_counter()
    with (
        prefect_test_harness(server_startup_timeout=90),
        temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
    ):
        print(f"prefect test server up in {time.perf_counter() - t0:.1f} s (not counted)")
        with SimCluster(nodes=args.nodes, timing=timing, faults=faults) as sim:
            cluster = GpuCluster(kubeconfig=str(sim.kubeconfig_path))
            t1 = time.perf_counter()
            first = configure(cluster=cluster, rollout_timeout_s=300)
            t_first = time.perf_counter() - t1
            sim.set_faults(None)
            t2 = time.perf_counter()
            second = configure(cluster=cluster, rollout_timeout_s=300)
            t_second = time.perf_counter() - t2
    print(
        f"nodes {args.nodes}, GPUs verified {first.gpus_verified}, release {first.release}, "
        f"API faults {'on' if args.faults else 'off'}"
    )
    print(
        f"first run   {t_first:6.2f} s; simulated rollout {rollout_s:.1f} s "
        f"(5 components × {args.pod_start + args.pod_ready:.1f} s); beyond it {t_first - rollout_s:6.2f} s"
    )
    print(
        f"second run  {t_second:6.2f} s; nodes relabelled {len(second.labelled_nodes)}; drift rows {len(second.drift)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
