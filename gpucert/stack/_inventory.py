"""Preflight's inventory: what each GPU node is, read from its Node object (nothing runs on the host).

A node the GPU Operator marks ``nvidia.com/gpu.deploy.driver=pre-installed`` without a readable driver
version gets ``host_driver=""``, which the planner refuses: an unknown driver cannot be checked.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..errors import InputError
from ..kube import Kube, node_ready
from ._labels import DEPLOY_PREFIX, DRIVER_FULL, DRIVER_PARTS, GPU_COUNT, GPU_PRESENT, GPU_PRODUCT, PRE_INSTALLED
from ._model import NodeInfo

__all__ = ["DEFAULT_GPU_SELECTOR", "node_info", "pick_targets", "take_inventory"]

#: Which nodes are GPU nodes, unless told otherwise (NFD/GFD set it on every node with an NVIDIA GPU).
DEFAULT_GPU_SELECTOR = f"{GPU_PRESENT}=true"


def _host_driver(labels: Mapping[str, str]) -> str | None:
    if labels.get(f"{DEPLOY_PREFIX}driver") != PRE_INSTALLED:
        return None
    if labels.get(DRIVER_FULL):
        return labels[DRIVER_FULL]
    parts = [labels.get(key) for key in DRIVER_PARTS]
    if parts[0] and parts[1]:
        return ".".join(p for p in parts if p)
    return ""


def node_info(node: Mapping[str, Any], known_models: Iterable[str] = ()) -> NodeInfo:
    """The :class:`NodeInfo` of a Node object.

    ``nvidia.com/gpu.product`` has spaces turned into dashes, which loses information
    (``NVIDIA A100-SXM4-80GB``), so the label is matched against ``known_models`` (the matrix's NVML
    names) first; an unknown product is returned with dashes read as spaces, for the planner to refuse.
    """
    meta = node.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    info = (node.get("status") or {}).get("nodeInfo") or {}
    product = labels.get(GPU_PRODUCT)
    model = None
    if product:
        model = next((m for m in known_models if m.replace(" ", "-") == product), product.replace("-", " "))
    try:
        count = int(labels[GPU_COUNT]) if GPU_COUNT in labels else None
    except ValueError:
        count = None
    return NodeInfo(
        name=str(meta.get("name")),
        gpu_model=model,
        gpu_count=count,
        kernel=str(info.get("kernelVersion") or ""),
        os_image=str(info.get("osImage") or ""),
        container_runtime=str(info.get("containerRuntimeVersion") or ""),
        kubelet_version=str(info.get("kubeletVersion") or ""),
        host_driver=_host_driver(labels),
        ready=node_ready(node),
        labels=labels,
    )


def take_inventory(
    kube: Kube, *, selector: str = DEFAULT_GPU_SELECTOR, known_models: Iterable[str] = ()
) -> list[NodeInfo]:
    """The GPU nodes matching ``selector``, sorted by name; raises :class:`InputError` when there are none."""
    models = list(known_models)
    nodes = sorted(kube.nodes(selector), key=lambda n: str(n["metadata"]["name"]))
    if not nodes:
        raise InputError(f"no GPU nodes: no node matches the label selector {selector!r}")
    return [node_info(node, models) for node in nodes]


def pick_targets(inventory: Sequence[NodeInfo], names: Sequence[str] | None) -> list[NodeInfo]:
    """The nodes of ``inventory`` named in ``names`` (all of them when None or empty); raises
    :class:`InputError` naming every one of ``names`` that is not a GPU node of the inventory."""
    if not names:
        return list(inventory)
    by_name = {info.name: info for info in inventory}
    missing = [name for name in names if name not in by_name]
    if missing:
        raise InputError(f"not GPU nodes of this cluster: {', '.join(sorted(set(missing)))}")
    return [by_name[name] for name in sorted(set(names))]
