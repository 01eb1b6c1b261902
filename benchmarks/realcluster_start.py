"""How long the real-control-plane tier takes to stand up and tear down (issue 29's "cold start well under 30 s").

Starts etcd, kube-apiserver, kube-controller-manager and kube-scheduler from ``$KUBEBUILDER_ASSETS`` (else the
cache ``tests/controlplane.py`` unpacks the assets' ``k8s/`` into, tests/assets.py), attaches N preconfigured
GPU nodes of the simulator's kubelets and waits for their stack to run, then stops everything; prints each
phase per round::

    python benchmarks/realcluster_start.py [--rounds 3] [--nodes 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpucert_sim._attach import AttachedKubelets
from tests.controlplane import ControlPlane


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=8)
    args = parser.parse_args()
    for round_ in range(1, args.rounds + 1):
        began = time.monotonic()
        with ControlPlane() as plane:
            up = time.monotonic() - began
            attaching = time.monotonic()
            with AttachedKubelets(plane.admin_kubeconfig, nodes=args.nodes, preconfigured=True):
                attached = time.monotonic() - attaching
            stopping = time.monotonic()
        down = time.monotonic() - stopping
        print(
            f"round {round_}: control plane up {up:.1f} s; {args.nodes} preconfigured nodes attached, their "
            f"stack running {attached:.1f} s; everything stopped {down:.1f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
