"""What the simulated controllers read and write of Pods, Nodes and owners, in one place.

Several controllers ask the same questions (is this pod finished? which Job owns it? is that node
Ready?) and write the same shapes (a condition, an Event); answering them once keeps the controllers
agreeing with each other, and with how a real cluster spells these fields.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from ._resources import ResourceType, lookup
from ._store import Obj, Store, now_rfc3339

__all__ = [
    "DAEMONSETS",
    "EVENTS",
    "JOBS",
    "NODES",
    "PODS",
    "Key",
    "controller_ref",
    "controlling_owner",
    "delete_owned_pod",
    "deleting",
    "key_of",
    "node_ready",
    "owner_ref",
    "phase",
    "pod_ready",
    "ready_condition",
    "record_event",
    "set_condition",
    "terminal",
]


def _resource(group: str, version: str, plural: str) -> ResourceType:
    found = lookup(group, version, plural)
    assert found is not None, plural
    return found


PODS = _resource("", "v1", "pods")
NODES = _resource("", "v1", "nodes")
EVENTS = _resource("", "v1", "events")
JOBS = _resource("batch", "v1", "jobs")
DAEMONSETS = _resource("apps", "v1", "daemonsets")

#: (namespace, name); cluster-scoped objects (nodes) have namespace "".
Key = tuple[str, str]

_TERMINAL = frozenset({"Succeeded", "Failed"})


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


def phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def terminal(pod: Mapping[str, Any] | None) -> bool:
    return pod is not None and phase(pod) in _TERMINAL


def deleting(obj: Mapping[str, Any]) -> bool:
    return bool(obj["metadata"].get("deletionTimestamp"))


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for cond in (obj.get("status") or {}).get("conditions") or ():
        if cond.get("type") == kind:
            return dict(cond)
    return None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    cond = _condition(pod, "Ready")
    return cond is not None and cond.get("status") == "True"


def node_ready(node: Mapping[str, Any] | None) -> bool:
    if node is None:
        return False
    cond = _condition(node, "Ready")
    return cond is not None and cond.get("status") == "True"


def controller_ref(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with ``controller: true``: the one object that manages this one."""
    for ref in obj["metadata"].get("ownerReferences") or ():
        if ref.get("controller"):
            return dict(ref)
    return None


def controlling_owner(obj: Mapping[str, Any], kind: str, api_version: str) -> Key | None:
    """The key of the ``kind`` object that controls ``obj`` (same namespace), or None."""
    ref = controller_ref(obj)
    if ref is None or ref.get("kind") != kind or ref.get("apiVersion") != api_version:
        return None
    return (obj["metadata"].get("namespace") or "", str(ref["name"]))


def owner_ref(owner: Mapping[str, Any]) -> dict[str, Any]:
    """The controller ownerReference a controller puts on what it creates (GC follows it)."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def set_condition(conditions: Sequence[Mapping[str, Any]] | None, new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``conditions`` with ``new`` in place of the one of its type.

    The transition time is kept while the status stays the same, as controllers do: rewriting an
    unchanged condition must not change the object (the store then writes nothing and the loop settles).
    """
    out: list[dict[str, Any]] = []
    replaced = False
    for cond in conditions or ():
        if cond.get("type") == new["type"]:
            merged = dict(new)
            if cond.get("status") == new.get("status") and cond.get("lastTransitionTime"):
                merged["lastTransitionTime"] = cond["lastTransitionTime"]
                if "lastProbeTime" in cond:
                    merged["lastProbeTime"] = cond["lastProbeTime"]
            out.append(merged)
            replaced = True
        else:
            out.append(dict(cond))
    if not replaced:
        out.append(dict(new))
    return out


def ready_condition(ready: bool, now: str) -> dict[str, Any]:
    """A node's ``Ready`` condition as its kubelet posts it: up, or down with the runtime not healthy."""
    cond = (
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}
        if ready
        else {
            "type": "Ready",
            "status": "False",
            "reason": "KubeletNotReady",
            "message": "container runtime is down: PLEG is not healthy",
        }
    )
    return {**cond, "lastHeartbeatTime": now, "lastTransitionTime": now}


def record_event(store: Store, involved: Obj, kind: str, reason: str, message: str, component: str) -> None:
    """A core/v1 Event about ``involved``, as a controller or kubelet records it (``kubectl describe``)."""
    meta = involved["metadata"]
    now = now_rfc3339()
    namespace = meta.get("namespace") or "default"
    suffix = secrets.token_hex(8)
    store.create(
        EVENTS,
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{suffix}", "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved.get("apiVersion"),
                "kind": involved.get("kind"),
                "name": meta["name"],
                "namespace": meta.get("namespace"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": component},
            "reportingComponent": component,
            "reportingInstance": "",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        },
    )


def delete_owned_pod(store: Store, owner: Obj, pod: Obj, component: str) -> None:
    """Delete a controller's pod (if still there) and record ``SuccessfulDelete`` on the owner, as the
    Job and DaemonSet controllers do."""
    meta = pod["metadata"]
    if store.get(PODS, meta.get("namespace"), meta["name"]) is not None:
        store.delete(PODS, meta.get("namespace"), meta["name"])
        record_event(store, owner, "Normal", "SuccessfulDelete", f"Deleted pod: {meta['name']}", component)
