"""kubectl against the simulated cluster: the commands an operator runs while gpucert works.

Skipped where kubectl is not installed (Debian: ``apt-get install kubernetes-client``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Callable, Iterator

import pytest

from gpucert_sim import SimCluster

from .unavailable import require

pytestmark = require(shutil.which("kubectl") is not None, "kubectl is not on PATH (apt-get install kubernetes-client)")

Kubectl = Callable[..., str]


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    # The bare API: the test seeds a pod and its log itself.
    with SimCluster(nodes=3, gpus=8, model="NVIDIA H200", controllers=False) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kubectl(sim: SimCluster) -> Kubectl:
    def run(*args: str) -> str:
        done = subprocess.run(
            ["kubectl", "--kubeconfig", str(sim.kubeconfig_path), *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
        return done.stdout

    return run


def test_get_nodes_by_label(kubectl: Kubectl) -> None:
    out = kubectl("get", "nodes", "-l", "nvidia.com/gpu.product=NVIDIA-H200", "-o", "name")
    assert out.split() == [f"node/gpu-node-0000{i}" for i in range(3)]
    assert kubectl("get", "no", "-l", "nvidia.com/gpu.product=NVIDIA-A100", "-o", "name").strip() == ""


def test_label_taint_and_cordon(kubectl: Kubectl) -> None:
    kubectl("label", "node", "gpu-node-00001", "gpucert.io/state=failed")
    kubectl("taint", "node", "gpu-node-00001", "gpucert.io/unhealthy=xid:NoSchedule")
    kubectl("cordon", "gpu-node-00001")
    node = json.loads(kubectl("get", "node", "gpu-node-00001", "-o", "json"))
    assert node["metadata"]["labels"]["gpucert.io/state"] == "failed"
    assert node["spec"]["taints"] == [{"key": "gpucert.io/unhealthy", "value": "xid", "effect": "NoSchedule"}]
    assert node["spec"]["unschedulable"] is True
    kubectl("taint", "node", "gpu-node-00001", "gpucert.io/unhealthy-")
    kubectl("label", "node", "gpu-node-00001", "gpucert.io/state-")
    kubectl("uncordon", "gpu-node-00001")
    node = json.loads(kubectl("get", "node", "gpu-node-00001", "-o", "json"))
    assert "gpucert.io/state" not in node["metadata"]["labels"]
    assert not node["spec"].get("taints")
    assert not node["spec"].get("unschedulable")


def test_pods_on_a_node_their_logs_and_delete(sim: SimCluster, kubectl: Kubectl) -> None:
    for name, node in (("bench-a", "gpu-node-00000"), ("bench-b", "gpu-node-00002")):
        # Running: a kubelet serves no log of a container that has not started (400, as a real one).
        sim.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"nodeName": node, "containers": [{"name": "bench", "image": "gpucert"}]},
                "status": {
                    "phase": "Running",
                    "containerStatuses": [{"name": "bench", "ready": True, "state": {"running": {}}}],
                },
            }
        )
    sim.store.set_log("default", "bench-a", '{"metric": "gemm_tflops", "value": 731.2}\n')
    out = kubectl("get", "pods", "--field-selector", "spec.nodeName=gpu-node-00000", "-o", "name")
    assert out.split() == ["pod/bench-a"]
    assert kubectl("logs", "bench-a") == '{"metric": "gemm_tflops", "value": 731.2}\n'
    kubectl("delete", "pod", "bench-a", "bench-b")
    assert kubectl("get", "pods", "-o", "name").strip() == ""
