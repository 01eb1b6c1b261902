"""Which nodes a certify run benchmarks: the GPU nodes asked for, less those a workload is using.

A benchmark takes every GPU of a node for minutes; running it under a training job would both slow the
job and measure the job, not the GPU. So by default a node where any running or pending pod (other than
gpucert's own benchmark pods) requests ``nvidia.com/gpu`` is skipped and reported as busy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..kube import Kube

_GPU = "nvidia.com/gpu"


def _requests_gpu(pod: Mapping[str, Any]) -> bool:
    for container in (pod.get("spec") or {}).get("containers") or ():
        resources = container.get("resources") or {}
        for part in ("limits", "requests"):
            amount = (resources.get(part) or {}).get(_GPU)
            if amount not in (None, 0, "0"):
                return True
    return False


def _benchmark_pod(pod: Mapping[str, Any], prefix: str) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get("app.kubernetes.io/managed-by") == "gpucert" and f"{prefix}/run-id" in labels


def busy_nodes(kube: Kube, *, prefix: str = "gpucert.io") -> dict[str, str]:
    """Node → ``namespace/pod`` of one workload pod holding GPUs there (gpucert's benchmarks aside)."""
    busy: dict[str, str] = {}
    for pod in kube.iter_objects("v1", "Pod"):
        node = (pod.get("spec") or {}).get("nodeName")
        phase = (pod.get("status") or {}).get("phase")
        if not node or phase in ("Succeeded", "Failed") or node in busy:
            continue
        if _requests_gpu(pod) and not _benchmark_pod(pod, prefix):
            meta = pod["metadata"]
            busy[str(node)] = f"{meta.get('namespace')}/{meta.get('name')}"
    return busy


def choose_nodes(
    gpu_nodes: Sequence[str], asked: Iterable[str] | None, busy: Mapping[str, str], *, include_busy: bool = False
) -> tuple[list[str], dict[str, str]]:
    """The nodes to benchmark (sorted) and node → why each other asked-for node is skipped.

    ``asked`` None means every GPU node; a name that is not a GPU node is skipped with the reason.
    """
    known = set(gpu_nodes)
    wanted = sorted(set(asked)) if asked else sorted(known)
    chosen: list[str] = []
    skipped: dict[str, str] = {}
    for node in wanted:
        if node not in known:
            skipped[node] = "not a GPU node of this cluster"
        elif node in busy and not include_busy:
            skipped[node] = f"busy: {busy[node]} holds GPUs"
        else:
            chosen.append(node)
    return chosen, skipped
