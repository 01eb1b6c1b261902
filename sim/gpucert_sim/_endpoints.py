"""The DCGM exporter Service's Endpoints, pointing at the simulator's per-node exporter paths.

operate finds the exporters as it would in a real cluster: it lists the Endpoints of the Service
labelled ``app.kubernetes.io/part-of: gpucert`` and ``app.kubernetes.io/component: dcgm-exporter``
(docs/reference/labels-taints-conditions.md, "GPU stack (configure)") and scrapes one target per address. A
real endpoints controller writes pod IPs there; the simulated exporters all live on the simulator's own port,
so this controller writes, per node, an address with ``ip: 127.0.0.1``, the node in ``nodeName`` (and the
exporter pod in ``targetRef`` when there is one), and the simulator's port under the Service's first port
name.

The GPU Operator's exporter Service (``nvidia-dcgm-exporter``, labelled ``app=nvidia-dcgm-exporter``, in the
operator's namespace) gets the same Endpoints: operate scrapes whichever installer's exporter runs the stack.

Endpoints carry only IP and port, so the path goes in an annotation on the Endpoints object:
``sim.gpucert.io/metrics-path: /dcgm/{node}/metrics`` (:data:`METRICS_PATH_ANNOTATION`), a template
where ``{node}`` is the address's ``nodeName`` (the same substitution a Prometheus relabel rule does
with ``__meta_kubernetes_endpoint_node_name``). A scraper reads it when present and uses ``/metrics``
otherwise, which is what a real exporter serves: the same code then works against both.

Which addresses:

* a Service with a ``selector`` (what configure applies with the exporter DaemonSet): the pods of its
  namespace that the selector matches and that are bound to an existing node; Ready pods on Ready
  nodes under ``addresses``, the others under ``notReadyAddresses``, as the real controller does;
* a Service without a selector (``--preconfigured`` creates one, as if the stack were installed on
  the hosts): every node of the cluster, Ready ones under ``addresses``.

Nodes joining, going NotReady or being deleted, and exporter pods starting or going, change the
Endpoints at once; a Service deleted takes its Endpoints with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ._controllers import Runtime
from ._dcgm import DCGM_PATH
from ._objects import NODES, PODS, Key, deleting, key_of, node_ready, pod_ready, terminal
from ._resources import lookup
from ._store import Obj, WatchEvent

__all__ = ["EXPORTER_LABELS", "METRICS_PATH_ANNOTATION", "OPERATOR_EXPORTER_LABELS", "DcgmEndpoints"]

EXPORTER_LABELS = {"app.kubernetes.io/part-of": "gpucert", "app.kubernetes.io/component": "dcgm-exporter"}
#: The GPU Operator's exporter Service's label (its state-dcgm-exporter/0400_service.yaml).
OPERATOR_EXPORTER_LABELS = {"app": "nvidia-dcgm-exporter"}
METRICS_PATH_ANNOTATION = "sim.gpucert.io/metrics-path"
_SERVICES = lookup("", "v1", "services")
_ENDPOINTS = lookup("", "v1", "endpoints")
assert _SERVICES is not None
assert _ENDPOINTS is not None
SERVICES, ENDPOINTS = _SERVICES, _ENDPOINTS
_HOST = "127.0.0.1"


def _is_exporter(obj: Mapping[str, Any] | None) -> bool:
    labels = ((obj or {}).get("metadata") or {}).get("labels") or {}
    return any(
        all(labels.get(k) == v for k, v in wanted.items()) for wanted in (EXPORTER_LABELS, OPERATOR_EXPORTER_LABELS)
    )


class DcgmEndpoints:
    """Keeps the exporter Services' Endpoints in line; see the module docstring."""

    def __init__(self, runtime: Runtime, port: Callable[[], int]) -> None:
        self.rt = runtime
        self.store = runtime.store
        self._port = port
        self._services: set[Key] = set()
        self._selector: dict[Key, dict[str, Any]] = {}  # each exporter Service's selector, from its events

    def resync(self) -> Iterable[Key]:
        services = [s for s in self.store.list(SERVICES)[0] if _is_exporter(s)]
        self._services.update(key_of(s) for s in services)
        self._selector.update((key_of(s), _selector(s)) for s in services)
        return [key_of(s) for s in services]

    def keys(self, event: WatchEvent) -> Iterable[Key]:
        if event.resource == SERVICES.key:
            if not (_is_exporter(event.obj) or key_of(event.obj) in self._services):
                return ()
            key = key_of(event.obj)
            if event.type == "DELETED":
                self._services.discard(key)
                self._selector.pop(key, None)
            else:
                self._services.add(key)
                self._selector[key] = _selector(event.obj)
            return (key,)
        if event.resource == NODES.key:
            if event.type == "MODIFIED" and event.old is not None and node_ready(event.old) == node_ready(event.obj):
                return ()
            return tuple(self._services)
        if event.resource == PODS.key:
            # Only a Service whose selector takes (or took) the pod lists it; a selector-less one lists
            # nodes. Every benchmark pod's event must not rebuild Endpoints of 10,000 addresses.
            namespace = event.obj["metadata"].get("namespace") or ""
            return tuple(k for k in self._services if k[0] == namespace and self._selects(k, event))
        return ()

    def _selects(self, key: Key, event: WatchEvent) -> bool:
        selector = self._selector.get(key)
        if not selector:
            return False
        return any(
            all((((pod.get("metadata") or {}).get("labels")) or {}).get(k) == v for k, v in selector.items())
            for pod in (event.obj, event.old)
            if pod is not None
        )

    def reconcile(self, key: Key) -> None:
        service = self.store.get(SERVICES, key[0], key[1])
        current = self.store.get(ENDPOINTS, key[0], key[1])
        if service is None or deleting(service) or not _is_exporter(service):
            if service is None and current is not None and _managed(current):
                self.store.delete(ENDPOINTS, key[0], key[1])
            return
        want = self._endpoints(service)
        if current is None:
            self.store.create(ENDPOINTS, want)
        elif (
            not _managed(current)
            or current.get("subsets") != want["subsets"]
            or current["metadata"].get("annotations") != want["metadata"]["annotations"]
            or current["metadata"].get("labels") != want["metadata"]["labels"]
        ):
            self.store.update(
                ENDPOINTS,
                {
                    **current,
                    "metadata": {**current["metadata"], **{k: want["metadata"][k] for k in ("labels", "annotations")}},
                    "subsets": want["subsets"],
                },
            )

    def _endpoints(self, service: Obj) -> dict[str, Any]:
        meta = service["metadata"]
        namespace = meta.get("namespace") or ""
        selector = (service.get("spec") or {}).get("selector") or {}
        nodes = {n["metadata"]["name"]: n for n in self.store.list(NODES)[0]}
        ready: list[dict[str, Any]] = []
        not_ready: list[dict[str, Any]] = []
        if selector:
            for pod in self.store.list(PODS, namespace)[0]:
                labels = pod["metadata"].get("labels") or {}
                node = (pod.get("spec") or {}).get("nodeName")
                if (
                    not node
                    or node not in nodes
                    or deleting(pod)
                    or terminal(pod)
                    or any(labels.get(k) != v for k, v in selector.items())
                ):
                    continue
                address = {
                    "ip": _HOST,
                    "nodeName": node,
                    "targetRef": {
                        "kind": "Pod",
                        "namespace": namespace,
                        "name": pod["metadata"]["name"],
                        "uid": pod["metadata"]["uid"],
                    },
                }
                (ready if pod_ready(pod) and node_ready(nodes[node]) else not_ready).append(address)
        else:
            for name, node in nodes.items():
                (ready if node_ready(node) else not_ready).append({"ip": _HOST, "nodeName": name})
        ports = (service.get("spec") or {}).get("ports") or [{}]
        port: dict[str, Any] = {"port": self._port(), "protocol": "TCP"}
        if ports[0].get("name"):
            port["name"] = ports[0]["name"]
        subset: dict[str, Any] = {"ports": [port]}
        if ready:
            subset["addresses"] = sorted(ready, key=lambda a: a["nodeName"])
        if not_ready:
            subset["notReadyAddresses"] = sorted(not_ready, key=lambda a: a["nodeName"])
        return {
            "apiVersion": "v1",
            "kind": "Endpoints",
            "metadata": {
                "name": meta["name"],
                "namespace": namespace,
                "labels": dict(meta.get("labels") or {}),
                "annotations": {METRICS_PATH_ANNOTATION: DCGM_PATH},
            },
            "subsets": [subset] if ready or not_ready else [],
        }


def _selector(service: Obj) -> dict[str, Any]:
    return dict((service.get("spec") or {}).get("selector") or {})


def _managed(endpoints: Obj) -> bool:
    return METRICS_PATH_ANNOTATION in (endpoints["metadata"].get("annotations") or {})
