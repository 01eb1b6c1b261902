"""The GPU stack a ``--preconfigured`` cluster starts with, as if ``gpucert configure`` had run.

Five DaemonSets in the stack's namespace, labelled the way DESIGN.md says stack objects are
(``app.kubernetes.io/part-of: gpucert`` and ``app.kubernetes.io/component``), which is what the
simulated controllers key on: the device plugin's Ready pods make nodes advertise ``nvidia.com/gpu``, the
exporter's Service gets Endpoints. They tolerate gpucert's taints and select GPU nodes, so every GPU node
runs the whole stack.

The images are a plausible current set, not a validated one: the configure flow (issue 4) owns the
version-locked templates and the compatibility matrix, and should become the single source of these
objects (render its templates here) so that configure on a preconfigured cluster changes nothing.
"""

from __future__ import annotations

from typing import Any

__all__ = ["STACK_COMPONENTS", "stack_daemonsets"]

#: component → image of the simulated stack (see the module docstring about their status).
STACK_COMPONENTS: dict[str, str] = {
    "driver": "nvcr.io/nvidia/driver:570.133.20-ubuntu22.04",
    "container-toolkit": "nvcr.io/nvidia/k8s/container-toolkit:v1.17.5-ubuntu20.04",
    "device-plugin": "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
    "dcgm-exporter": "nvcr.io/nvidia/k8s/dcgm-exporter:4.1.1-4.0.4-ubuntu22.04",
    "gpu-feature-discovery": "nvcr.io/nvidia/k8s-device-plugin:v0.17.1",
}


def _tolerations(prefix: str) -> list[dict[str, str]]:
    return [
        {"key": f"{prefix}/uncertified", "operator": "Exists", "effect": "NoSchedule"},
        {"key": f"{prefix}/unhealthy", "operator": "Exists", "effect": "NoSchedule"},
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
    ]


def stack_daemonsets(namespace: str, label_prefix: str = "gpucert.io") -> list[dict[str, Any]]:
    """The stack's DaemonSets, one per component, ready to be stored."""
    out = []
    for component, image in STACK_COMPONENTS.items():
        labels = {
            "app.kubernetes.io/name": f"nvidia-{component}",
            "app.kubernetes.io/part-of": "gpucert",
            "app.kubernetes.io/component": component,
        }
        out.append(
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": f"nvidia-{component}", "namespace": namespace, "labels": dict(labels)},
                "spec": {
                    "selector": {"matchLabels": {"app.kubernetes.io/name": f"nvidia-{component}"}},
                    "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "10%"}},
                    "template": {
                        "metadata": {"labels": dict(labels)},
                        "spec": {
                            "nodeSelector": {"nvidia.com/gpu.present": "true"},
                            "tolerations": _tolerations(label_prefix),
                            "containers": [{"name": component, "image": image}],
                        },
                    },
                },
            }
        )
    return out
