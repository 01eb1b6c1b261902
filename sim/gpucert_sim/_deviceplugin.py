"""The NVIDIA device plugin, as its effect on nodes: GPUs are advertised once its pod is Ready there.

On a real node ``nvidia.com/gpu`` appears in capacity and allocatable only after the device plugin
registered with the kubelet; a benchmark pod asking for GPUs before that stays Pending. gpucert's
configure flow exists to get there, so the simulator makes the same dependency visible: when a pod of
the device-plugin DaemonSet (recognised by its labels ``app.kubernetes.io/part-of: gpucert`` and
``app.kubernetes.io/component: device-plugin``, docs/reference/labels-taints-conditions.md, "GPU stack
(configure)"; or the GPU Operator's, ``app: nvidia-device-plugin-daemonset`` managed by ``gpu-operator``) is
Ready on a node, the node's status gets ``nvidia.com/gpu`` = its GPU count (its ``nvidia.com/gpu.count``
label) in capacity and allocatable, a MODIFIED event for every node watcher. When the plugin's pod is gone
the count drops to 0, as a kubelet reports a resource whose plugin unregistered. Nodes that started
with GPUs advertised (``--preconfigured``) keep them: the simulator only takes away what it gave.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ._controllers import Runtime
from ._objects import DAEMONSETS, NODES, PODS, Key, controller_ref, deleting, pod_ready, terminal
from ._scheduler import GPU
from ._store import Obj, WatchEvent

__all__ = ["DEVICE_PLUGIN_LABELS", "DevicePlugin"]

DEVICE_PLUGIN_LABELS = {"app.kubernetes.io/part-of": "gpucert", "app.kubernetes.io/component": "device-plugin"}
#: The NVIDIA GPU Operator's device plugin DaemonSet (its ClusterPolicy's ``state-device-plugin``): a cluster
#: whose stack the operator runs advertises its GPUs the same way.
OPERATOR_DEVICE_PLUGIN_LABELS = {
    "app": "nvidia-device-plugin-daemonset",
    "app.kubernetes.io/managed-by": "gpu-operator",
}


def _is_device_plugin(ds: Mapping[str, Any] | None) -> bool:
    labels = ((ds or {}).get("metadata") or {}).get("labels") or {}
    return any(
        all(labels.get(k) == v for k, v in known.items())
        for known in (DEVICE_PLUGIN_LABELS, OPERATOR_DEVICE_PLUGIN_LABELS)
    )


class DevicePlugin:
    """Advertises GPUs on nodes where the device plugin runs; see the module docstring."""

    def __init__(self, runtime: Runtime, default_gpus: int) -> None:
        self.rt = runtime
        self.store = runtime.store
        self.default_gpus = default_gpus
        self._advertised: set[str] = set()

    def resync(self) -> Iterable[Key]:
        return [("", n["metadata"]["name"]) for n in self.store.list(NODES)[0]]

    def keys(self, event: WatchEvent) -> Iterable[Key]:
        if event.resource == NODES.key:
            if event.type == "DELETED":
                self._advertised.discard(event.obj["metadata"]["name"])
                return ()
            return (("", event.obj["metadata"]["name"]),) if event.type == "ADDED" else ()
        if event.resource == PODS.key:
            ref = controller_ref(event.obj)
            node = (event.obj.get("spec") or {}).get("nodeName")
            if node and ref is not None and ref.get("kind") == "DaemonSet":
                return (("", str(node)),)
        return ()

    def reconcile(self, key: Key) -> None:
        name = key[1]
        node = self.store.get(NODES, None, name)
        if node is None:
            return
        running = any(self._plugin_ready(p) for p in self.rt.pods.on_node(name))
        status = node.get("status") or {}
        capacity, allocatable = dict(status.get("capacity") or {}), dict(status.get("allocatable") or {})
        if running:
            labels = node["metadata"].get("labels") or {}
            try:
                gpus = int(labels.get("nvidia.com/gpu.count", self.default_gpus))
            except ValueError:
                gpus = self.default_gpus
            want = str(gpus)
            self._advertised.add(name)
        elif name in self._advertised:
            want = "0"
        else:
            return
        if capacity.get(GPU) == want and allocatable.get(GPU) == want:
            return
        capacity[GPU] = allocatable[GPU] = want
        self.store.update(NODES, {**node, "status": {**status, "capacity": capacity, "allocatable": allocatable}})

    def _plugin_ready(self, pod: Obj) -> bool:
        if deleting(pod) or terminal(pod) or not pod_ready(pod):
            return False
        ref = controller_ref(pod)
        if ref is None or ref.get("kind") != "DaemonSet":
            return False
        ds = self.store.get(DAEMONSETS, pod["metadata"].get("namespace"), str(ref["name"]))
        return ds is not None and ds["metadata"].get("uid") == ref.get("uid") and _is_device_plugin(ds)
