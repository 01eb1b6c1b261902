"""Simulated GPU nodes: the Node objects a kubelet and GPU feature discovery would register.

Names and GPU model come from the fleet model (:class:`gpucert_sim.fleet.Fleet`), so a node in the simulated
cluster is the same node whose benchmarks and telemetry the fleet model generates. ``nvidia.com/gpu``
appears in capacity only when the stack is in place (``preconfigured``): before that no device plugin
has advertised the GPUs, which is exactly what configure has to fix.

Each node also carries its place in the fabric, from the fleet model's topology (:meth:`Fleet.topology`):
``topology.kubernetes.io/zone`` (``zone-a``, …, the well-known label a cloud provider sets) and
``<prefix>/leaf`` (``gpucert.io/leaf``: ``leaf-00``, …, the leaf switch or rack, as an operator labels
it), which gpucert's pairing plan reads to pair nodes within and across leaves.
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from ._resources import lookup
from ._store import Store, now_rfc3339
from .fleet import ZONE_LABEL, Fleet

__all__ = ["gpu_node", "leaf_label_of", "register_nodes"]

# Three minors older than the API server (KUBERNETES_VERSION), as the version-skew policy allows a kubelet to
# be: the older releases of the compatibility matrix still fit the simulated nodes, as on a cluster upgraded
# control plane first. Never newer than the server (a kubelet newer than its API server is unsupported).
_KUBELET = "v1.33.5"
# AWS names for the 8-GPU boxes the fleet models; other shapes get a descriptive made-up name.
_INSTANCE_TYPES = {("NVIDIA H200", 8): "p5e.48xlarge", ("NVIDIA H100 80GB HBM3", 8): "p5.48xlarge"}
_GPU_MEMORY_MIB = {"NVIDIA H200": "143771", "NVIDIA H100 80GB HBM3": "81559"}


def _product(model: str) -> str:
    """GPU feature discovery's ``nvidia.com/gpu.product``: the NVML name with spaces as dashes."""
    return model.replace(" ", "-")


def _labels(name: str, model: str, gpus: int, topology: dict[str, str]) -> dict[str, str]:
    product = _product(model)
    instance = _INSTANCE_TYPES.get((model, gpus), f"gpu-{gpus}x-{product.lower()}")
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "beta.kubernetes.io/os": "linux",
        "beta.kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": instance,
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": product,
        "nvidia.com/gpu.count": str(gpus),
        **topology,
    }
    if model in _GPU_MEMORY_MIB:
        labels["nvidia.com/gpu.memory"] = _GPU_MEMORY_MIB[model]
    return labels


def _resources(gpus: int, preconfigured: bool) -> tuple[dict[str, str], dict[str, str]]:
    capacity = {
        "cpu": "192",
        "memory": "2113714724Ki",
        "pods": "110",
        "ephemeral-storage": "3750000000Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
    }
    allocatable = {**capacity, "cpu": "191500m", "memory": "2092743204Ki", "ephemeral-storage": "3456000000Ki"}
    if preconfigured:
        capacity["nvidia.com/gpu"] = allocatable["nvidia.com/gpu"] = str(gpus)
    return capacity, allocatable


def _conditions(now: str) -> list[dict[str, str]]:
    healthy = [
        ("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        ("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        ("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
    ]
    rows = [{"type": t, "status": "False", "reason": r, "message": m} for t, r, m in healthy]
    rows.append(
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}
    )
    return [{**row, "lastHeartbeatTime": now, "lastTransitionTime": now} for row in rows]


def gpu_node(
    name: str,
    index: int,
    *,
    model: str,
    gpus: int,
    preconfigured: bool = False,
    uncertified_taint: str | None = None,
    topology: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The Node object of one simulated GPU node; ``index`` gives it a stable address and ids, ``topology``
    its zone and leaf labels (label key → value)."""
    now = now_rfc3339()
    digest = hashlib.sha256(name.encode()).hexdigest()
    capacity, allocatable = _resources(gpus, preconfigured)
    spec: dict[str, Any] = {
        "podCIDR": f"10.{128 + index // 256 % 64}.{index % 256}.0/24",
        "providerID": f"gpucert-sim:///{name}",
    }
    if uncertified_taint:
        spec["taints"] = [{"key": uncertified_taint, "effect": "NoSchedule"}]
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": _labels(name, model, gpus, dict(topology or {})),
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": spec,
        "status": {
            "capacity": capacity,
            "allocatable": allocatable,
            "conditions": _conditions(now),
            "addresses": [
                {"type": "InternalIP", "address": f"10.0.{index // 250}.{index % 250 + 1}"},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": digest[:32],
                "systemUUID": str(uuid.UUID(digest[32:64])),
                "bootID": str(uuid.UUID(digest[:32])),
                "kernelVersion": "5.15.0-119-generic",
                "osImage": "Ubuntu 22.04.4 LTS",
                "containerRuntimeVersion": "containerd://1.7.20",
                "kubeletVersion": _KUBELET,
                "kubeProxyVersion": _KUBELET,
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    }


def register_nodes(
    store: Store,
    fleet: Fleet,
    *,
    preconfigured: bool = False,
    uncertified_taint: str | None = None,
    names: list[str] | None = None,
    label_prefix: str = "gpucert.io",
) -> list[str]:
    """Create the Nodes of ``fleet`` (or of the named subset) in ``store``; returns their names."""
    nodes = lookup("", "v1", "nodes")
    assert nodes is not None
    index = fleet.node_index
    chosen = fleet.node_names if names is None else names
    leaf_label = leaf_label_of(label_prefix)
    for name in chosen:
        topology = {ZONE_LABEL: fleet.zone_of(name), leaf_label: fleet.leaf_of(name)}
        store.create(
            nodes,
            gpu_node(
                name,
                index[name],
                model=fleet.model.name,
                gpus=fleet.gpus_per_node,
                preconfigured=preconfigured,
                uncertified_taint=uncertified_taint,
                topology=topology,
            ),
        )
    return list(chosen)


def leaf_label_of(label_prefix: str) -> str:
    """The leaf label under gpucert's label prefix: ``gpucert.io/leaf`` by default."""
    return f"{label_prefix}/leaf"
