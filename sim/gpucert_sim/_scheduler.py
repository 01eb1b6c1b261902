"""The scheduler: binds each unbound Pod to a node where it fits, or leaves it Pending and says why.

gpucert places a benchmark Job on one node (a hostname selector), through the taints it puts on nodes
(tolerations), and only where the GPUs are free; a simulator that bound pods anywhere would hide every
mistake in that. So the filters are kube-scheduler's, in its order, as far as gpucert's workloads use
them: node ``spec.unschedulable`` (cordon; tolerated by ``node.kubernetes.io/unschedulable``), the
Ready condition, taints with effect NoSchedule/NoExecute against tolerations (``Exists``/``Equal``),
``nodeSelector`` and required node affinity (``matchExpressions`` In/NotIn/Exists/DoesNotExist,
``matchFields`` on ``metadata.name``), required inter-pod affinity and anti-affinity (a term's
``labelSelector`` against the pods bound and not finished in its namespaces, within the node's
``topologyKey`` domain: gpucert's pair Job keeps its two pods on different nodes this way), then
``nvidia.com/gpu`` requests against the node's allocatable minus what the pods bound there and not
finished already request. A pod that fits nowhere stays
Pending with ``PodScheduled=False``/``Unschedulable`` and kube-scheduler's message (``0/8 nodes are
available: 1 Insufficient nvidia.com/gpu, 7 node(s) didn't match Pod's node affinity/selector.``) and a
``FailedScheduling`` Event; it is tried again whenever a node changes or a pod ends or goes.

Among the nodes that fit, the one with the most free GPUs wins (then the first by name): spreading, so a
later 8-GPU pod still finds a whole node. A pod that names its nodes (a ``nodeSelector``, affinity ``In``
on a label or on ``metadata.name``, as gpucert's benchmark pods do) is placed by looking at those nodes
only, through the store's label index; all nodes are scanned only to say why a pod fits nowhere, so at
10,000 nodes binding a pod costs what binding it at 10 does. Limits: CPU, memory and pod-count requests are
not counted (simulated nodes are large and gpucert's pods small), there is no preemption, an existing pod's
anti-affinity is not held against a newcomer (only the newcomer's own terms count: gpucert's terms are
symmetric), a ``namespaceSelector`` is read as "every namespace", and binding writes ``spec.nodeName``
directly rather than through the ``binding`` subresource (which the simulator does not serve).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._controllers import Runtime
from ._objects import NODES, PODS, Key, deleting, key_of, node_ready, phase, record_event, set_condition, terminal
from ._store import Obj, WatchEvent, now_rfc3339

__all__ = [
    "GPU",
    "Scheduler",
    "gpu_request",
    "misfit",
    "node_gpus",
    "selector_matches",
    "tolerates",
    "untolerated_taint",
]

GPU = "nvidia.com/gpu"
_COMPONENT = "default-scheduler"
_BLOCKING = ("NoSchedule", "NoExecute")
_UNSCHEDULABLE_TAINT = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
_NOT_READY_TAINT = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


# --- predicates (shared with the DaemonSet controller) --------------------------------------------------


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether one toleration tolerates one taint (core/v1 ``Toleration.ToleratesTaint``)."""
    effect = toleration.get("effect") or ""
    if effect and effect != taint.get("effect"):
        return False
    key = toleration.get("key") or ""
    operator = toleration.get("operator") or "Equal"
    if not key:
        return operator == "Exists"  # an empty key with Exists tolerates everything
    if key != taint.get("key"):
        return False
    if operator == "Exists":
        return True
    return operator == "Equal" and (toleration.get("value") or "") == (taint.get("value") or "")


def untolerated_taint(
    tolerations: Sequence[Mapping[str, Any]], taints: Iterable[Mapping[str, Any]], effects: Sequence[str] = _BLOCKING
) -> Mapping[str, Any] | None:
    """The first taint of ``effects`` that no toleration tolerates, or None."""
    for taint in taints:
        if taint.get("effect") in effects and not any(tolerates(t, taint) for t in tolerations):
            return taint
    return None


def _expression_matches(expr: Mapping[str, Any], value: str | None) -> bool:
    operator, values = expr.get("operator"), [str(v) for v in expr.get("values") or ()]
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and values:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _term_matches(term: Mapping[str, Any], node: Obj) -> bool:
    labels = node["metadata"].get("labels") or {}
    exprs, fields = term.get("matchExpressions") or (), term.get("matchFields") or ()
    if not exprs and not fields:
        return False  # an empty term matches no node
    if not all(_expression_matches(e, labels.get(e.get("key"))) for e in exprs):
        return False
    return all(
        _expression_matches(f, node["metadata"]["name"] if f.get("key") == "metadata.name" else None) for f in fields
    )


def selects(spec: Mapping[str, Any], node: Obj) -> bool:
    """``nodeSelector`` and required node affinity of a pod spec against one node."""
    labels = node["metadata"].get("labels") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    ) or {}
    terms = required.get("nodeSelectorTerms")
    return not terms or any(_term_matches(t, node) for t in terms)


def selector_matches(selector: Mapping[str, Any] | None, labels: Mapping[str, Any]) -> bool:
    """A ``LabelSelector`` (``matchLabels``, ``matchExpressions``) against labels; a null selector matches
    nothing and an empty one everything, as in the API."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    return all(
        _expression_matches(e, None if (v := labels.get(e.get("key"))) is None else str(v))
        for e in selector.get("matchExpressions") or ()
    )


def _quantity(raw: Any) -> int:
    try:
        return int(str(raw))
    except ValueError:
        return 0


def gpu_request(pod: Mapping[str, Any]) -> int:
    """GPUs a pod requests: the sum over its containers, or its largest init container if that is more.

    Extended resources are requested through ``limits`` (requests default to them), so either counts.
    """
    spec = pod.get("spec") or {}

    def one(container: Mapping[str, Any]) -> int:
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        return _quantity(requests.get(GPU, limits.get(GPU, 0)))

    main = sum(one(c) for c in spec.get("containers") or ())
    init = max((one(c) for c in spec.get("initContainers") or ()), default=0)
    return max(main, init)


def node_gpus(node: Mapping[str, Any]) -> int:
    """``nvidia.com/gpu`` in the node's allocatable (0 before a device plugin advertised any)."""
    return _quantity(((node.get("status") or {}).get("allocatable") or {}).get(GPU, 0))


def _taint_text(taint: Mapping[str, Any]) -> str:
    return f"{{{taint.get('key')}: {taint.get('value') or ''}}}"


def misfit(spec: Mapping[str, Any], node: Obj, request: int, used: int) -> str | None:
    """Why a pod with this spec cannot go on ``node`` (kube-scheduler's words), or None when it fits."""
    tolerations = spec.get("tolerations") or ()
    if (node.get("spec") or {}).get("unschedulable") and not any(
        tolerates(t, _UNSCHEDULABLE_TAINT) for t in tolerations
    ):
        return "node(s) were unschedulable"
    if not node_ready(node) and not any(tolerates(t, _NOT_READY_TAINT) for t in tolerations):
        return f"node(s) had untolerated taint {_taint_text(_NOT_READY_TAINT)}"
    taint = untolerated_taint(tolerations, (node.get("spec") or {}).get("taints") or ())
    if taint is not None:
        return f"node(s) had untolerated taint {_taint_text(taint)}"
    if not selects(spec, node):
        return "node(s) didn't match Pod's node affinity/selector"
    if request and request > node_gpus(node) - used:
        return f"Insufficient {GPU}"
    return None


# --- the controller -------------------------------------------------------------------------------------


class Scheduler:
    """Binds pending pods; see the module docstring."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.store = runtime.store
        self._waiting: set[Key] = set()  # unschedulable pods, tried again when something changes
        self._said: dict[Key, str] = {}  # the last FailedScheduling message, to not repeat an Event

    def resync(self) -> Iterable[Key]:
        return [key_of(p) for p in self.store.list(PODS)[0] if _unbound(p)]

    def keys(self, event: WatchEvent) -> Iterable[Key]:
        if event.resource == NODES.key:
            return list(self._waiting)
        if event.resource != PODS.key:
            return ()
        pod, key = event.obj, key_of(event.obj)
        if event.type == "DELETED":
            self._waiting.discard(key)
            self._said.pop(key, None)
            return list(self._waiting) if (pod.get("spec") or {}).get("nodeName") else ()
        if _unbound(pod):
            return (key,)
        if event.old is not None and not terminal(event.old) and terminal(pod):
            return list(self._waiting)  # a pod that ended frees its GPUs
        return ()

    def used_gpus(self, node: str) -> int:
        return sum(gpu_request(p) for p in self.rt.pods.on_node(node) if not terminal(p) and not deleting(p))

    def reconcile(self, key: Key) -> None:
        pod = self.store.get(PODS, key[0], key[1])
        if pod is None or not _unbound(pod):
            self._waiting.discard(key)
            self._said.pop(key, None)
            return
        spec, request = pod.get("spec") or {}, gpu_request(pod)
        names = self._named_nodes(spec)
        if names is not None:
            # Only the nodes the pod names can fit (misfit refuses every other), so the best of them is
            # the best of all; the full scan below is needed only for the message when none fits.
            named = [n for n in (self.store.get(NODES, None, name) for name in sorted(names)) if n is not None]
            fit = self._best(pod, named, request)
            if fit is not None:
                self._bind(pod, fit)
                self._waiting.discard(key)
                self._said.pop(key, None)
                return
        nodes, _ = self.store.list(NODES)
        reasons: Counter[str] = Counter()
        best: tuple[int, Obj] | None = None
        for node in nodes:
            # The GPUs in use are counted only where everything else fits: misfit checks them last.
            reason = misfit(spec, node, 0, 0) or self._affinity_misfit(pod, node)
            used = self.used_gpus(node["metadata"]["name"]) if request and reason is None else 0
            if reason is None:
                reason = misfit(spec, node, request, used)
            if reason is not None:
                reasons[reason] += 1
                continue
            free = node_gpus(node) - used
            if best is None or free > best[0]:
                best = (free, node)
        if best is not None:
            self._bind(pod, best[1])
            self._waiting.discard(key)
            self._said.pop(key, None)
            return
        self._waiting.add(key)
        detail = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
        message = f"0/{len(nodes)} nodes are available" + (f": {detail}." if detail else ".")
        status = dict(pod.get("status") or {})
        status["conditions"] = set_condition(
            status.get("conditions"),
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": message,
                "lastProbeTime": None,
                "lastTransitionTime": now_rfc3339(),
            },
        )
        status["phase"] = "Pending"
        self.store.update(PODS, {**pod, "status": status})
        if self._said.get(key) != message:
            self._said[key] = message
            record_event(self.store, pod, "Warning", "FailedScheduling", message, _COMPONENT)

    def _best(self, pod: Obj, nodes: Sequence[Obj], request: int) -> Obj | None:
        """The node of ``nodes`` (sorted by name) with the most free GPUs that the pod fits, or None."""
        spec = pod.get("spec") or {}
        best: tuple[int, Obj] | None = None
        for node in nodes:
            if misfit(spec, node, 0, 0) is not None or self._affinity_misfit(pod, node) is not None:
                continue
            used = self.used_gpus(node["metadata"]["name"]) if request else 0
            if misfit(spec, node, request, used) is None:
                free = node_gpus(node) - used
                if best is None or free > best[0]:
                    best = (free, node)
        return None if best is None else best[1]

    # --- inter-pod affinity -------------------------------------------------------------------------

    def _affinity_misfit(self, pod: Obj, node: Obj) -> str | None:
        """Why ``pod``'s required pod affinity or anti-affinity keeps it off ``node`` (kube-scheduler's
        words), or None."""
        affinity = (pod.get("spec") or {}).get("affinity") or {}
        for kind, wanted in (("podAntiAffinity", False), ("podAffinity", True)):
            terms = (affinity.get(kind) or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or ()
            for term in terms:
                if self._term_holds(pod, node, term, wanted) is False:
                    rules = "pod anti-affinity" if not wanted else "pod affinity"
                    return f"node(s) didn't match {rules} rules"
        return None

    def _term_holds(self, pod: Obj, node: Obj, term: Mapping[str, Any], wanted: bool) -> bool:
        """Whether one required term lets ``pod`` onto ``node``: a matching pod in the node's topology
        domain is wanted (affinity) or must not be there (anti-affinity)."""
        key = str(term.get("topologyKey") or "")
        domain = (node["metadata"].get("labels") or {}).get(key)
        if domain is None:
            return not wanted  # a node outside every domain of the key: no pod there to meet or to avoid
        selector = term.get("labelSelector")
        namespaces = self._namespaces(pod, term)
        if any(self._matches(p, pod, selector, namespaces) for p in self._pods_in_domain(key, str(domain))):
            return wanted
        if not wanted:
            return True
        # The first pod of a group that wants its own kind: no pod anywhere matches yet, and it matches
        # its own term (kube-scheduler's exception, so that such a group can start at all).
        anywhere = any(self._matches(p, pod, selector, namespaces) for p in self.store.list(PODS)[0])
        own = (pod["metadata"].get("namespace") in namespaces or namespaces == {"*"}) and selector_matches(
            selector, pod["metadata"].get("labels") or {}
        )
        return not anywhere and own

    def _pods_in_domain(self, key: str, domain: str) -> list[Obj]:
        names = [n["metadata"]["name"] for n in self._nodes_where(key, domain)]
        return [p for name in names for p in self.rt.pods.on_node(name)]

    def _nodes_where(self, key: str, value: str) -> list[Obj]:
        found = (self.store.get(NODES, None, name) for name in sorted(self._labelled(key, value)))
        return [n for n in found if n is not None]

    @staticmethod
    def _namespaces(pod: Obj, term: Mapping[str, Any]) -> set[str]:
        if term.get("namespaceSelector") is not None:
            return {"*"}
        listed = {str(n) for n in term.get("namespaces") or ()}
        return listed or {str(pod["metadata"].get("namespace") or "")}

    @staticmethod
    def _matches(other: Obj, pod: Obj, selector: Mapping[str, Any] | None, namespaces: set[str]) -> bool:
        meta = other["metadata"]
        if key_of(other) == key_of(pod) or terminal(other) or deleting(other):
            return False
        if namespaces != {"*"} and meta.get("namespace") not in namespaces:
            return False
        return bool((other.get("spec") or {}).get("nodeName")) and selector_matches(selector, meta.get("labels") or {})

    def _named_nodes(self, spec: Mapping[str, Any]) -> set[str] | None:
        """A superset of the nodes ``spec``'s nodeSelector and required node affinity can select, from the
        store's label index; None when they name no node or label value (any node may do)."""
        pins: list[set[str]] = [self._labelled(str(k), str(v)) for k, v in (spec.get("nodeSelector") or {}).items()]
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        terms = required.get("nodeSelectorTerms")
        if terms:
            union: set[str] | None = set()
            for term in terms:
                found = self._term_nodes(term)
                if found is None:
                    union = None
                    break
                assert union is not None
                union |= found
            if union is not None:
                pins.append(union)
        if not pins:
            return None
        return set.intersection(*pins)

    def _term_nodes(self, term: Mapping[str, Any]) -> set[str] | None:
        """A superset of the nodes one node selector term selects; None when it pins nothing."""
        exprs, fields = term.get("matchExpressions") or (), term.get("matchFields") or ()
        if not exprs and not fields:
            return set()  # an empty term matches no node
        pins: list[set[str]] = []
        for expr in exprs:
            if expr.get("operator") == "In":
                pins.append(
                    set().union(*(self._labelled(str(expr.get("key")), str(v)) for v in expr.get("values") or ()))
                )
        for expr in fields:
            if expr.get("key") == "metadata.name" and expr.get("operator") == "In":
                pins.append({str(v) for v in expr.get("values") or ()})
        return set.intersection(*pins) if pins else None

    def _labelled(self, label: str, value: str) -> set[str]:
        return {name for _, name in self.store.labelled(NODES, label, value)}

    def _bind(self, pod: Obj, node: Obj) -> None:
        name = node["metadata"]["name"]
        status = dict(pod.get("status") or {})
        status["conditions"] = set_condition(
            status.get("conditions"),
            {"type": "PodScheduled", "status": "True", "lastProbeTime": None, "lastTransitionTime": now_rfc3339()},
        )
        bound = self.store.update(PODS, {**pod, "spec": {**pod["spec"], "nodeName": name}, "status": status})
        meta = bound["metadata"]
        record_event(
            self.store,
            bound,
            "Normal",
            "Scheduled",
            f"Successfully assigned {meta.get('namespace')}/{meta['name']} to {name}",
            _COMPONENT,
        )


def _unbound(pod: Obj) -> bool:
    return (
        not (pod.get("spec") or {}).get("nodeName")
        and phase(pod) == "Pending"
        and not deleting(pod)
        and (pod.get("spec") or {}).get("schedulerName", "default-scheduler") == "default-scheduler"
    )
