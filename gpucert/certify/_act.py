"""Telling the cluster: state labels, annotations and the ``unhealthy`` taint, written per node.

A node's labels, annotations and taints are changed in one merge patch that carries the
``resourceVersion`` it was computed from, so a taint someone else added in between is never
overwritten: the server answers 409 and the patch is recomputed from the node as it now is.
Nothing is written to a node whose labels, annotations and taints would not change.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..kube import Kube, KubeConflict
from ._decide import NodeDecision

__all__ = ["NodeChange", "apply_decision", "node_patch"]

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


def _taint_keys(prefix: str) -> tuple[str, str]:
    return f"{prefix}/unhealthy", f"{prefix}/uncertified"


def node_patch(
    node: Mapping[str, Any],
    decision: NodeDecision,
    *,
    prefix: str,
    run_id: str,
    now: datetime,
    taint: bool,
    observe_only: bool,
) -> tuple[dict[str, Any] | None, NodeChange]:
    """The merge patch that brings ``node`` in line with ``decision``, or None when nothing changes.

    ``taint`` says the node may be tainted (its fail was confirmed, or a hard gate fired, and the blast
    radius allows it). A ``certified`` node loses gpucert's ``unhealthy`` and ``uncertified`` taints; a
    ``degraded`` one its ``unhealthy`` taint (it no longer fails). Observe-only never touches taints.
    """
    meta = node.get("metadata") or {}
    have_labels = meta.get("labels") or {}
    have_notes = meta.get("annotations") or {}
    labels: dict[str, str | None] = {}
    if decision.state is not None:
        labels[f"{prefix}/state"] = decision.state
    notes: dict[str, str | None] = {
        f"{prefix}/last-run": run_id,
        f"{prefix}/summary": decision.summary[:_SUMMARY_MAX],
    }
    if decision.state == "certified":
        notes[f"{prefix}/certified-at"] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = {k: v for k, v in labels.items() if have_labels.get(k) != v}
    notes = {k: v for k, v in notes.items() if have_notes.get(k) != v}

    unhealthy, uncertified = _taint_keys(prefix)
    taints = list((node.get("spec") or {}).get("taints") or [])
    wanted = taints
    change = None
    if not observe_only:
        if decision.state == "failed" and taint:
            mine = {"key": unhealthy, "value": decision.cause or "unknown", "effect": "NoSchedule"}
            wanted = [t for t in taints if t.get("key") != unhealthy] + [mine]
            change = "added"
        elif decision.state in ("certified", "degraded"):
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


def _same_taints(a: list[Mapping[str, Any]], b: list[Mapping[str, Any]]) -> bool:
    def key(t: Mapping[str, Any]) -> tuple[str, str, str]:
        return (str(t.get("key")), str(t.get("value") or ""), str(t.get("effect")))

    return sorted(map(key, a)) == sorted(map(key, b))


def apply_decision(
    kube: Kube,
    decision: NodeDecision,
    *,
    prefix: str,
    run_id: str,
    now: datetime,
    taint: bool,
    observe_only: bool,
) -> NodeChange:
    """Write ``decision`` to its node (see :func:`node_patch`); retried on a concurrent change (409).

    Raises :class:`~gpucert.kube.KubeNotFound` when the node is gone, :class:`KubeConflict` when it kept
    changing under us.
    """
    for attempt in range(_ATTEMPTS):
        node = kube.get("v1", "Node", decision.node)
        patch, change = node_patch(
            node, decision, prefix=prefix, run_id=run_id, now=now, taint=taint, observe_only=observe_only
        )
        if patch is None:
            return change
        try:
            kube.merge_patch("v1", "Node", decision.node, patch)
        except KubeConflict:
            if attempt + 1 == _ATTEMPTS:
                raise
            continue
        return change
    raise AssertionError("unreachable")
