"""The DaemonSet controller: one pod per eligible node, rolled when the template changes.

gpucert's configure flow installs the GPU stack as DaemonSets and waits for their rollout status, and a
node that joins must get the stack's pods; so this follows kube-controller-manager's DaemonSet
controller where gpucert can see it:

* a node is eligible when it matches the template's ``nodeSelector``/required node affinity and every
  NoSchedule/NoExecute taint is tolerated, counting the tolerations the real controller adds to every
  DaemonSet pod (not-ready, unreachable, disk/memory/PID pressure, unschedulable: a cordoned node keeps
  its stack); a pod already on a node stays while its NoExecute taints are tolerated (a node gone
  NotReady keeps its pods, which its Endpoints list as not ready);
* eligible nodes without a pod get one (bound straight to the node, as the controller's node affinity
  would), pods on nodes no longer eligible (or gone) are deleted;
* a template change is a new generation; pods carry ``controller-revision-hash`` (a hash of the
  template) and ``pod-template-generation``, and with the default ``RollingUpdate`` strategy old pods
  are replaced while no more than ``maxUnavailable`` (default 1, a number or a percentage) of the
  eligible nodes are without a Ready pod; ``OnDelete`` replaces a pod only once it is deleted;
* status ``desiredNumberScheduled``, ``currentNumberScheduled``, ``numberMisscheduled``,
  ``numberReady``, ``numberAvailable``, ``numberUnavailable``, ``updatedNumberScheduled`` and
  ``observedGeneration``; a rollout is done when updated = available = desired at the observed
  generation, which is what ``kubectl rollout status`` checks.

How long a node takes to get Ready is the kubelet's :attr:`SimTiming.pod_ready_s`. ``minReadySeconds``
and ``maxSurge`` are not modelled; ControllerRevision objects are not served.
"""

from __future__ import annotations

import copy
import hashlib
import math
from collections.abc import Iterable, Mapping
from typing import Any

import orjson

from ._controllers import Runtime
from ._objects import (
    DAEMONSETS,
    NODES,
    PODS,
    Key,
    controller_ref,
    controlling_owner,
    delete_owned_pod,
    deleting,
    key_of,
    owner_ref,
    pod_ready,
    record_event,
    terminal,
)
from ._scheduler import selects, untolerated_taint
from ._store import Obj, WatchEvent

__all__ = ["DAEMON_TOLERATIONS", "DaemonSetController", "template_hash"]

_COMPONENT = "daemonset-controller"
#: What the real DaemonSet controller adds to every pod it creates.
DAEMON_TOLERATIONS: tuple[dict[str, str], ...] = (
    {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute"},
    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/memory-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/pid-pressure", "operator": "Exists", "effect": "NoSchedule"},
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"},
)


def template_hash(template: Mapping[str, Any]) -> str:
    """A short stable hash of a pod template: equal templates, equal hashes (``controller-revision-hash``)."""
    return hashlib.sha256(orjson.dumps(template, option=orjson.OPT_SORT_KEYS)).hexdigest()[:10]


def _pod_spec(ds: Mapping[str, Any]) -> dict[str, Any]:
    spec = dict((((ds.get("spec") or {}).get("template") or {}).get("spec")) or {})
    tolerations = list(spec.get("tolerations") or ())
    tolerations += [t for t in DAEMON_TOLERATIONS if t not in tolerations]
    spec["tolerations"] = tolerations
    return spec


def _eligible(pod_spec: Mapping[str, Any], node: Obj, *, running: bool = False) -> bool:
    """Whether the node should run the DaemonSet's pod: selected, and its taints tolerated — for a pod
    already ``running`` there only the NoExecute ones, as the real controller lets a pod stay on a node
    that turned NotReady or unschedulable (``NoSchedule``) and evicts only what NoExecute would."""
    if not selects(pod_spec, node):
        return False
    taints = (node.get("spec") or {}).get("taints") or ()
    effects = ("NoExecute",) if running else ("NoSchedule", "NoExecute")
    return untolerated_taint(pod_spec.get("tolerations") or (), taints, effects) is None


def _max_unavailable(ds: Mapping[str, Any], desired: int) -> int:
    raw = (((ds.get("spec") or {}).get("updateStrategy") or {}).get("rollingUpdate") or {}).get("maxUnavailable", 1)
    if isinstance(raw, str) and raw.endswith("%"):
        try:
            value = math.ceil(float(raw[:-1]) / 100 * desired)
        except ValueError:
            value = 1
    else:
        try:
            value = int(raw)
        except (TypeError, ValueError):
            value = 1
    return max(1, value)


class DaemonSetController:
    """Runs DaemonSets; see the module docstring."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.store = runtime.store

    def resync(self) -> Iterable[Key]:
        return [key_of(d) for d in self.store.list(DAEMONSETS)[0]]

    def keys(self, event: WatchEvent) -> Iterable[Key]:
        if event.resource == DAEMONSETS.key:
            return (key_of(event.obj),) if event.type != "DELETED" else ()
        if event.resource == NODES.key:
            if event.type == "MODIFIED" and event.old is not None and not _scheduling_changed(event.old, event.obj):
                return ()  # a status heartbeat or a GPU count changes nothing for DaemonSets
            daemonsets = self.store.list(DAEMONSETS)[0]
            if event.type == "MODIFIED" and event.old is not None:
                # Only a DaemonSet the node turned eligible or ineligible for has anything to do: a
                # label or taint another controller or gpucert writes on 10,000 nodes must not cost
                # every DaemonSet a pass over every node each.
                return [key_of(d) for d in daemonsets if self._flips(d, event.old, event.obj)]
            return [key_of(d) for d in daemonsets]
        if event.resource == PODS.key:
            owner = controlling_owner(event.obj, "DaemonSet", "apps/v1")
            return (owner,) if owner is not None else ()
        return ()

    def _flips(self, ds: Obj, old: Obj, new: Obj) -> bool:
        """Whether the node change ``old`` → ``new`` changes the node's eligibility for ``ds``."""
        uid = ds["metadata"]["uid"]
        running = any(
            not deleting(p) and not terminal(p) and (controller_ref(p) or {}).get("uid") == uid
            for p in self.rt.pods.on_node(new["metadata"]["name"])
        )
        spec = _pod_spec(ds)
        return _eligible(spec, old, running=running) != _eligible(spec, new, running=running)

    def reconcile(self, key: Key) -> None:
        ds = self.store.get(DAEMONSETS, key[0], key[1])
        if ds is None or deleting(ds):
            return
        meta = ds["metadata"]
        spec = ds.get("spec") or {}
        pod_spec = _pod_spec(ds)
        revision = template_hash(spec.get("template") or {})
        nodes = {n["metadata"]["name"]: n for n in self.store.list(NODES)[0]}
        by_node: dict[str, list[Obj]] = {}
        for pod in self.rt.pods.owned_by(meta["uid"]):
            if deleting(pod) or terminal(pod):
                if terminal(pod) and not deleting(pod):
                    self._delete(ds, pod)  # a DaemonSet pod that ended is replaced, as the real one is
                continue
            by_node.setdefault(str((pod.get("spec") or {}).get("nodeName") or ""), []).append(pod)
        desired = [name for name, node in nodes.items() if _eligible(pod_spec, node, running=name in by_node)]
        wanted = set(desired)
        misscheduled = sum(len(pods) for node, pods in by_node.items() if node not in wanted)
        for node, pods in list(by_node.items()):
            if node not in wanted:
                for pod in pods:
                    self._delete(ds, pod)
                del by_node[node]
            elif len(pods) > 1:
                for pod in pods[1:]:
                    self._delete(ds, pod)
                by_node[node] = pods[:1]

        rolling = ((spec.get("updateStrategy") or {}).get("type") or "RollingUpdate") == "RollingUpdate"
        if rolling:
            self._roll(ds, desired, by_node, revision)
        for node in desired:
            if node not in by_node:
                by_node[node] = [self._create(ds, node, pod_spec, revision)]

        pods = [p for node in desired for p in by_node.get(node, ())]
        ready = sum(1 for p in pods if pod_ready(p))
        status: dict[str, Any] = {
            "desiredNumberScheduled": len(desired),
            "currentNumberScheduled": len(pods),
            "numberMisscheduled": misscheduled,
            "numberReady": ready,
            "numberAvailable": ready,
            "updatedNumberScheduled": sum(1 for p in pods if _revision(p) == revision),
            "observedGeneration": meta.get("generation", 1),
        }
        if len(desired) - ready:
            status["numberUnavailable"] = len(desired) - ready
        self.store.update(DAEMONSETS, {**ds, "status": status})

    def _roll(self, ds: Obj, desired: list[str], by_node: dict[str, list[Obj]], revision: str) -> None:
        """Delete old pods while the unavailable budget allows; their nodes get new pods after this."""
        old = [
            (node, by_node[node][0]) for node in desired if node in by_node and _revision(by_node[node][0]) != revision
        ]
        if not old:
            return
        unavailable = sum(1 for node in desired if node not in by_node or not pod_ready(by_node[node][0]))
        budget = _max_unavailable(ds, len(desired)) - unavailable
        # Old pods that are not Ready cost nothing to replace; then Ready ones, within the budget.
        for node, pod in sorted(old, key=lambda item: pod_ready(item[1])):
            if pod_ready(pod):
                if budget <= 0:
                    break
                budget -= 1
            self._delete(ds, pod)
            del by_node[node]

    def _create(self, ds: Obj, node: str, pod_spec: Mapping[str, Any], revision: str) -> Obj:
        meta = ds["metadata"]
        tmeta = ((ds.get("spec") or {}).get("template") or {}).get("metadata") or {}
        labels = {
            **(tmeta.get("labels") or {}),
            "controller-revision-hash": revision,
            "pod-template-generation": str(meta.get("generation", 1)),
        }
        pod_meta: dict[str, Any] = {
            "generateName": f"{meta['name']}-",
            "namespace": meta.get("namespace"),
            "labels": labels,
            "ownerReferences": [owner_ref(ds)],
        }
        if tmeta.get("annotations"):
            pod_meta["annotations"] = dict(tmeta["annotations"])
        spec = copy.deepcopy(dict(pod_spec))
        spec["nodeName"] = node
        spec["affinity"] = {
            **(spec.get("affinity") or {}),
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                }
            },
        }
        pod = self.store.create(
            PODS,
            {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec, "status": {"phase": "Pending"}},
        )
        record_event(
            self.store, ds, "Normal", "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}", _COMPONENT
        )
        return pod

    def _delete(self, ds: Obj, pod: Obj) -> None:
        delete_owned_pod(self.store, ds, pod, _COMPONENT)


def _revision(pod: Obj) -> str | None:
    labels = pod["metadata"].get("labels") or {}
    value = labels.get("controller-revision-hash")
    return str(value) if value is not None else None


def _scheduling_changed(old: Obj, new: Obj) -> bool:
    """Whether a node change can change which DaemonSets it runs: labels, taints, or Ready."""
    return old["metadata"].get("labels") != new["metadata"].get("labels") or (old.get("spec") or {}).get("taints") != (
        new.get("spec") or {}
    ).get("taints")
