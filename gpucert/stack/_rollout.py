"""Putting a rendered stack on the cluster and watching it take: apply, target, wait, verify, record.

Each function does one step of configure's runbook and is idempotent, so a second configure run moves no
``resourceVersion``. Readiness is judged per node, the way the GPU Operator's gates do: a component is ready
on a node when it has a Ready pod made from the DaemonSet's current template, since an aggregate
``numberReady`` cannot say *which* node is missing, and the error must name it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import StackNotReady
from ..kube import Kube, mark_never_certified
from ._labels import DEPLOY_PREFIX, MANAGED, driver_label, release_label, stack_label, version_label
from ._model import COMPONENTS, Manifest, StackPlan

__all__ = [
    "Applied",
    "apply_manifests",
    "component_targets",
    "desired_target_labels",
    "desired_version_labels",
    "gpu_shortfall",
    "label_nodes",
    "not_ready_nodes",
    "observed_versions",
    "prune_driver_variants",
    "wait_until",
]

_PART_OF = "app.kubernetes.io/part-of=gpucert"
_VERSION = "app.kubernetes.io/version"
_REVISION_HASH = "controller-revision-hash"


@dataclass(frozen=True)
class Applied:
    """An object as the server holds it after an apply."""

    step: str
    kind: str
    namespace: str | None
    name: str
    resource_version: str


def apply_manifests(kube: Kube, manifests: Iterable[Manifest]) -> list[Applied]:
    """Server-side apply each manifest in order; returns what the server holds."""
    out = []
    for manifest in manifests:
        # Read first, so that an apply that changes nothing is not recorded as a change (the audit trail).
        api_version, kind = str(manifest.obj.get("apiVersion")), str(manifest.obj.get("kind"))
        before = kube.find(api_version, kind, manifest.name, manifest.namespace)
        stored = kube.apply(manifest.obj, before=before)
        meta = stored.get("metadata") or {}
        out.append(
            Applied(manifest.step, manifest.kind, manifest.namespace, manifest.name, str(meta.get("resourceVersion")))
        )
    return out


def prune_driver_variants(kube: Kube, plan: StackPlan) -> list[str]:
    """Delete the driver DaemonSets no node is labelled for any more (after an upgrade moved them all to a
    new variant); returns their names. A variant some node outside this run still uses is kept."""
    label = driver_label(plan.label_prefix)
    in_use = {str((n["metadata"].get("labels") or {}).get(label)) for n in kube.nodes(label)}
    in_use |= {v.id for v in plan.drivers}
    selector = f"{_PART_OF},app.kubernetes.io/component=driver"
    pruned = []
    for ds in kube.list_objects("apps/v1", "DaemonSet", plan.namespace, label_selector=selector):
        variant = (ds["spec"]["template"]["spec"].get("nodeSelector") or {}).get(label)
        if variant not in in_use and kube.delete("apps/v1", "DaemonSet", ds["metadata"]["name"], plan.namespace):
            pruned.append(str(ds["metadata"]["name"]))
    return pruned


def component_targets(plan: StackPlan, component: str, labels: Mapping[str, Mapping[str, str]]) -> list[str]:
    """The nodes that should run ``component``: the plan's nodes, less host-driver nodes for the driver
    and nodes that opted out with ``nvidia.com/gpu.deploy.<component>=false`` (``labels``: node → labels)."""
    nodes = plan.nodes if component != "driver" else tuple(n for n in plan.nodes if n in plan.node_driver)
    return [n for n in nodes if labels.get(n, {}).get(f"{DEPLOY_PREFIX}{component}") != "false"]


def desired_target_labels(plan: StackPlan) -> dict[str, dict[str, str | None]]:
    """Node → the targeting labels configure writes before installing (``None`` removes a label)."""
    stack, driver = stack_label(plan.label_prefix), driver_label(plan.label_prefix)
    return {node: {stack: MANAGED, driver: plan.node_driver.get(node)} for node in plan.nodes}


def desired_version_labels(
    plan: StackPlan, observed: Mapping[str, Mapping[str, str]]
) -> dict[str, dict[str, str | None]]:
    """Node → the version labels recording what was verified running there (absent components removed)."""
    versions = {c: version_label(plan.label_prefix, c) for c in COMPONENTS}
    release: dict[str, str | None] = {release_label(plan.label_prefix): plan.release}
    return {
        node: {**release, **{versions[c]: observed.get(node, {}).get(c) for c in COMPONENTS}} for node in plan.nodes
    }


def label_nodes(kube: Kube, desired: Mapping[str, Mapping[str, str | None]]) -> list[str]:
    """Patch the labels of the nodes whose labels (read afresh) differ from ``desired``; returns the nodes
    patched. A node without a ``GpuCertified`` condition gets it ``Unknown``: never certified."""
    nodes = {n["metadata"]["name"]: n for n in kube.nodes()}
    current = {name: n["metadata"].get("labels") or {} for name, n in nodes.items()}
    changed = []
    for node, want in desired.items():
        have = current.get(node, {})
        patch = {k: v for k, v in want.items() if have.get(k) != v and not (v is None and k not in have)}
        if patch:
            kube.label_node(node, patch, before=nodes.get(node))
            changed.append(node)
        if node in nodes:
            mark_never_certified(kube, nodes[node])
    return changed


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Whether the pod is Ready and not being deleted."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _owner_uid(pod: Mapping[str, Any]) -> str | None:
    refs = (pod.get("metadata") or {}).get("ownerReferences") or ()
    return next((str(r.get("uid")) for r in refs if r.get("controller") and r.get("kind") == "DaemonSet"), None)


@dataclass(frozen=True)
class _Template:
    """A DaemonSet's current template, as its pods can be matched to it."""

    generation: int
    #: The DaemonSet controller counts every scheduled pod as updated (its status, for this generation).
    all_updated: bool


def _component_pods(kube: Kube, namespace: str, component: str) -> tuple[dict[str, _Template], list[dict[str, Any]]]:
    """The component's DaemonSets (uid → current template) and their pods."""
    selector = f"{_PART_OF},app.kubernetes.io/component={component}"
    daemonsets = kube.list_objects("apps/v1", "DaemonSet", namespace, label_selector=selector)
    templates = {}
    for ds in daemonsets:
        generation = int(ds["metadata"].get("generation") or 1)
        status = ds.get("status") or {}
        updated = int(status.get("observedGeneration") or 0) >= generation and int(
            status.get("updatedNumberScheduled") or 0
        ) == int(status.get("desiredNumberScheduled") or 0)
        templates[str(ds["metadata"]["uid"])] = _Template(generation, updated)
    return templates, kube.list_objects("v1", "Pod", namespace, label_selector=selector)


def _current_pods_by_node(
    templates: Mapping[str, _Template], pods: Iterable[Mapping[str, Any]]
) -> dict[str, list[Mapping[str, Any]]]:
    """Node → the pods made from their DaemonSet's current template, as the DaemonSet controller judges it
    (``IsPodUpdated``): the pod's ``pod-template-generation`` is the DaemonSet's generation, or its
    ``controller-revision-hash`` is the current template's. A template changed and changed back is the same
    revision again, so a pod made before the change that was never replaced is current, under an older
    generation: its hash is matched to those of the pods made at this generation, and when there are none
    the controller's own count (every scheduled pod updated) says so."""
    owned = [(uid, pod) for pod in pods if (uid := _owner_uid(pod)) is not None and uid in templates]
    current_hashes: dict[str, set[str]] = {}
    for uid, pod in owned:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get("pod-template-generation") == str(templates[uid].generation):
            current_hashes.setdefault(uid, set()).add(str(labels.get(_REVISION_HASH)))
    by_node: dict[str, list[Mapping[str, Any]]] = {}
    for uid, pod in owned:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        generation = labels.get("pod-template-generation")
        current = (
            generation is None
            or generation == str(templates[uid].generation)
            or labels.get(_REVISION_HASH) in current_hashes.get(uid, set())
            or templates[uid].all_updated
        )
        if not current:
            continue  # a pod of an older template: the rollout has not reached this node yet
        node = (pod.get("spec") or {}).get("nodeName")
        if node:
            by_node.setdefault(str(node), []).append(pod)
    return by_node


def not_ready_nodes(kube: Kube, plan: StackPlan, component: str, targets: Sequence[str]) -> dict[str, str]:
    """Target node → why ``component`` is not ready there (empty when ready everywhere)."""
    templates, pods = _component_pods(kube, plan.namespace, component)
    by_node = _current_pods_by_node(templates, pods)
    missing: dict[str, str] = {}
    for node in targets:
        current = by_node.get(node, [])
        if any(pod_ready(p) for p in current):
            continue
        if not current:
            missing[node] = "no pod of the current template"
        else:
            pod = current[0]
            phase = (pod.get("status") or {}).get("phase") or "Pending"
            missing[node] = f"pod {pod['metadata']['name']} {phase}, not Ready"
    return missing


def gpu_shortfall(kube: Kube, expected: Mapping[str, int]) -> dict[str, str]:
    """Node → what it advertises when ``nvidia.com/gpu`` allocatable differs from ``expected[node]``."""
    nodes = {n["metadata"]["name"]: n for n in kube.nodes()}
    short: dict[str, str] = {}
    for node, want in expected.items():
        obj = nodes.get(node)
        if obj is None:
            short[node] = "node gone"
            continue
        have = ((obj.get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", "0")
        if str(have) != str(want):
            short[node] = f"advertises {have} nvidia.com/gpu, expected {want}"
    return short


def observed_versions(kube: Kube, plan: StackPlan) -> dict[str, dict[str, str]]:
    """Node → component → the version its Ready pod runs (the pod's ``app.kubernetes.io/version``);
    host-driver nodes report their host driver's version."""
    out: dict[str, dict[str, str]] = {n: {} for n in plan.nodes}
    for component in COMPONENTS:
        templates, pods = _component_pods(kube, plan.namespace, component)
        for pod in pods:
            node = str((pod.get("spec") or {}).get("nodeName") or "")
            version = ((pod.get("metadata") or {}).get("labels") or {}).get(_VERSION)
            if node in out and version and pod_ready(pod) and _owner_uid(pod) in templates:
                out[node][component] = str(version)
    for node, version in plan.host_driver.items():
        if node in out:
            out[node]["driver"] = version
    return out


def wait_until(
    check: Callable[[], Mapping[str, str]],
    *,
    what: str,
    total: int,
    timeout_s: float,
    poll_s: float = 0.25,
    max_poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Call ``check`` (node → why not yet) until it returns nothing; raise :class:`StackNotReady` with
    the last answer when ``timeout_s`` runs out. Polls start fast and slow down to ``max_poll_s``."""
    deadline = clock() + timeout_s
    while True:
        pending = check()
        if not pending:
            return
        if clock() >= deadline:
            raise StackNotReady(what, timeout_s, pending, total)
        sleep(max(0.0, min(poll_s, deadline - clock())))
        poll_s = min(max_poll_s, poll_s * 1.5)
