"""Telling the cluster: state labels, annotations, the ``unhealthy`` taint and the ``GpuCertified`` condition,
written per node from its :class:`~gpucert.certify.SettledDecision` (docs/reference/labels-taints-conditions.md).

A node's labels, annotations and taints change in one merge patch carrying the ``resourceVersion`` it was
computed from, so a taint someone else added in between is never overwritten: the server answers 409 and the
patch is recomputed. Nothing is written to a node that would not change. The condition goes to ``status`` as a
strategic merge patch keyed by type, so the kubelet's conditions stay; an inconclusive decision leaves it as it
was, like the label.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from .._crashpoints import crashpoint
from ..kube import Kube, KubeConflict, condition, node_name, taint_keys
from ._settle import SettledDecision

#: The node condition a decision is written as.
CONDITION = "GpuCertified"
_CONDITION_STATUS = {"certified": "True", "degraded": "False", "failed": "False"}
_REASON_OF_STATE = {"certified": "Certified", "degraded": "Degraded", "failed": "Failed"}

_SUMMARY_MAX = 500
_ATTEMPTS = 5


@dataclass(frozen=True)
class NodeChange:
    """What was written to one node (all empty when nothing had to change)."""

    node: str
    labels: Mapping[str, str | None]
    annotations: Mapping[str, str | None]
    #: ``added``, ``lifted`` or None.
    taint: str | None
    #: The ``GpuCertified`` condition's new status, None when it did not change.
    condition: str | None = None


def node_patch(
    node: Mapping[str, Any], decision: SettledDecision, *, prefix: str, run_id: str, now: datetime
) -> tuple[dict[str, Any] | None, NodeChange]:
    """The merge patch that brings ``node`` in line with ``decision``, or None when nothing changes.

    ``decision.taint`` says what happens to ``<prefix>/unhealthy``: ``added`` puts it on with the cause,
    ``lifted`` takes it off (and, for a certified node, ``<prefix>/uncertified`` too); anything else
    leaves the taints as they are.
    """
    meta = node.get("metadata") or {}
    have_labels = meta.get("labels") or {}
    have_notes = meta.get("annotations") or {}
    labels: dict[str, str | None] = {}
    if decision.state is not None:
        labels[f"{prefix}/state"] = decision.state
    notes: dict[str, str | None] = {f"{prefix}/last-run": run_id, f"{prefix}/summary": decision.summary[:_SUMMARY_MAX]}
    if decision.state == "certified":
        notes[f"{prefix}/certified-at"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = {k: v for k, v in labels.items() if have_labels.get(k) != v}
    notes = {k: v for k, v in notes.items() if have_notes.get(k) != v}

    unhealthy, uncertified = taint_keys(prefix)
    taints = list((node.get("spec") or {}).get("taints") or [])
    wanted = taints
    change = None
    if decision.taint == "added":
        mine = {"key": unhealthy, "value": decision.cause or "unknown", "effect": "NoSchedule"}
        wanted = [t for t in taints if t.get("key") != unhealthy] + [mine]
        change = "added"
    elif decision.taint == "lifted":
        drop = {unhealthy, uncertified} if decision.state == "certified" else {unhealthy}
        wanted = [t for t in taints if t.get("key") not in drop]
        change = "lifted"
    if _same_taints(wanted, taints):
        wanted, change = taints, None

    if not labels and not notes and change is None:
        return None, NodeChange(str(meta.get("name")), {}, {}, None)
    patch: dict[str, Any] = {"metadata": {"resourceVersion": meta.get("resourceVersion")}}
    if labels:
        patch["metadata"]["labels"] = labels
    if notes:
        patch["metadata"]["annotations"] = notes
    if change is not None:
        patch["spec"] = {"taints": wanted}
    return patch, NodeChange(str(meta.get("name")), labels, notes, change)


def condition_patch(node: Mapping[str, Any], decision: SettledDecision, *, now: datetime) -> dict[str, Any] | None:
    """The status patch that writes ``decision`` as the ``GpuCertified`` condition, or None when it would
    not change. An inconclusive decision leaves a condition as it was, and gives a node without one
    ``Unknown`` (never certified). ``lastTransitionTime`` moves only when the status does."""
    have = condition(node, CONDITION)
    if decision.state is None:
        if have is not None:
            return None
        status, reason, message = "Unknown", "NotCertified", f"never certified: {decision.summary}"[:_SUMMARY_MAX]
    else:
        status, reason, message = _CONDITION_STATUS[decision.state], _reason(decision), decision.summary[:_SUMMARY_MAX]
    if have is not None and (have.get("status"), have.get("reason"), have.get("message")) == (status, reason, message):
        return None
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    moved = have is None or have.get("status") != status
    entry = {
        "type": CONDITION,
        "status": status,
        "reason": reason,
        "message": message,
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp if moved else (have or {}).get("lastTransitionTime", stamp),
    }
    return {"status": {"conditions": [entry]}}


def _reason(decision: SettledDecision) -> str:
    """A condition reason is CamelCase (``[A-Za-z]…``): the cause (``row_remap`` → ``RowRemap``), else the
    state."""
    if decision.state != "certified" and decision.cause:
        return "".join(part.capitalize() for part in decision.cause.split("_") if part) or "Unknown"
    return _REASON_OF_STATE[decision.state or "certified"]


def _same_taints(a: list[Mapping[str, Any]], b: list[Mapping[str, Any]]) -> bool:
    def key(t: Mapping[str, Any]) -> tuple[str, str, str]:
        return (str(t.get("key")), str(t.get("value") or ""), str(t.get("effect")))

    return sorted(map(key, a)) == sorted(map(key, b))


def apply_decision(kube: Kube, decision: SettledDecision, *, prefix: str, run_id: str, now: datetime) -> NodeChange:
    """Write ``decision`` to its node (see :func:`node_patch`, :func:`condition_patch`); the metadata patch
    is retried on a concurrent change (409). Raises :class:`~gpucert.kube.KubeNotFound` when the node is gone,
    :class:`KubeConflict` when it kept changing under us."""
    for attempt in range(_ATTEMPTS):
        node = kube.get("v1", "Node", decision.node)
        patch, change = node_patch(node, decision, prefix=prefix, run_id=run_id, now=now)
        if patch is not None:
            try:
                node = kube.merge_patch("v1", "Node", decision.node, patch, before=node)
            except KubeConflict:
                if attempt + 1 == _ATTEMPTS:
                    raise
                continue
            crashpoint("between-taints", when=change.taint == "added")
        status = condition_patch(node, decision, now=now)
        if status is not None:
            kube.patch_status("v1", "Node", node_name(node) or decision.node, status)
            change = replace(change, condition=status["status"]["conditions"][0]["status"])
        return change
    raise AssertionError("unreachable")
