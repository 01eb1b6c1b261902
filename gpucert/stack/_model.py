"""The values configure passes between its steps: what a node is, what was asked, what was chosen.

Plain frozen dataclasses, so the planner, the renderer and the flow share one vocabulary and each can be
tested on its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["COMPONENTS", "DriverVariant", "Manifest", "NodeInfo", "StackPlan", "StackRequest"]

#: The stack's components in the order configure installs them (docs/design/configure.md, "Why this order";
#: the GPU Operator's state order): each waits for the one before it to be ready on every target node.
COMPONENTS: tuple[str, ...] = ("driver", "container-toolkit", "device-plugin", "dcgm-exporter", "gpu-feature-discovery")


@dataclass(frozen=True)
class NodeInfo:
    """One GPU node as preflight sees it (from its Node object; nothing is read from the host)."""

    name: str
    #: NVML device name, e.g. ``NVIDIA H200`` (from ``nvidia.com/gpu.product``, dashes as spaces).
    gpu_model: str | None
    #: GPUs the node has (``nvidia.com/gpu.count``), None when nothing says.
    gpu_count: int | None
    kernel: str
    #: ``status.nodeInfo.osImage``, e.g. ``Ubuntu 22.04.4 LTS``.
    os_image: str
    #: ``status.nodeInfo.containerRuntimeVersion``, e.g. ``containerd://1.7.20``.
    container_runtime: str
    #: ``status.nodeInfo.kubeletVersion``, e.g. ``v1.30.4``.
    kubelet_version: str
    #: The version of a driver installed on the host (not by gpucert), when the node says it has one.
    host_driver: str | None = None
    ready: bool = True
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StackRequest:
    """What the user asked for; every field None means "the newest compatible choice"."""

    #: A release of the compatibility matrix (e.g. ``25.10``).
    release: str | None = None
    #: Component → version overrides, e.g. ``{"driver": "570.195.03"}``.
    versions: Mapping[str, str] = field(default_factory=dict)
    #: Images come from this registry instead of the matrix's (air-gapped mirrors).
    registry: str | None = None

    def unset(self) -> tuple[str, ...]:
        """The fields not given (``release``, ``versions``, ``registry``): what a record may fill in."""
        given = {
            "release": self.release is not None,
            "versions": bool(self.versions),
            "registry": self.registry is not None,
        }
        return tuple(name for name, present in given.items() if not present)


@dataclass(frozen=True)
class DriverVariant:
    """One driver DaemonSet: a driver version built for one OS, on the nodes labelled for it."""

    #: A DNS label naming the variant, e.g. ``580-95-05-ubuntu22-04``; nodes carry it in the
    #: ``<prefix>/driver`` label and the DaemonSet selects on it.
    id: str
    version: str
    #: The image's OS tag suffix, e.g. ``ubuntu22.04``.
    os_tag: str
    image: str


@dataclass(frozen=True)
class StackPlan:
    """Everything the templates need, and what verification checks against."""

    release: str
    namespace: str
    label_prefix: str
    #: Target nodes, by name, in a stable order.
    nodes: tuple[str, ...]
    #: Component → version for the release-wide components (all but the driver).
    versions: Mapping[str, str]
    #: Component → image (with tag) for the release-wide components.
    images: Mapping[str, str]
    drivers: tuple[DriverVariant, ...]
    #: Node → driver variant id, for nodes that get gpucert's driver.
    node_driver: Mapping[str, str]
    #: Node → version of its host driver, for nodes that keep their own (no driver pod there).
    host_driver: Mapping[str, str]
    #: GPU model → driver version chosen for it (what the flow reports).
    model_driver: Mapping[str, str]
    #: The Kubernetes minor versions of the target nodes' kubelets, e.g. ``("1.30",)``.
    kubernetes_versions: tuple[str, ...]
    #: What was asked (the pins and the registry go into the record a full configure applies).
    request: StackRequest = field(default_factory=StackRequest)

    def expected_versions(self, node: str) -> dict[str, str]:
        """Component → version this node should run once configured."""
        if node in self.host_driver:
            return {**self.versions, "driver": self.host_driver[node]}
        return {**self.versions, "driver": {v.id: v.version for v in self.drivers}[self.node_driver[node]]}


@dataclass(frozen=True)
class Manifest:
    """One rendered object and the install step it belongs to (``namespace``, ``rbac`` or a component)."""

    step: str
    obj: Mapping[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    @property
    def namespace(self) -> str | None:
        ns = self.obj["metadata"].get("namespace")
        return str(ns) if ns is not None else None
