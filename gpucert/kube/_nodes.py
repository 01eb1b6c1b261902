"""What a Node object says, read one way everywhere: readiness, taints, conditions, gpucert's taint keys.

Pure functions over the API's dicts (no calls), so the certify flow, onboarding, configure's inventory
and ``watch-nodes`` agree on what "Ready" and "tainted" mean — and one writer, :func:`mark_never_certified`,
for the places that admit a node (configure's labelling, the join watcher).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..errors import KubeNotFound

if TYPE_CHECKING:
    from ._client import Kube

__all__ = [
    "CERTIFIED_CONDITION",
    "condition",
    "has_taint",
    "mark_never_certified",
    "never_certified_patch",
    "node_name",
    "node_ready",
    "taint_keys",
    "uncertified_taint",
    "unhealthy_taint",
]


def node_name(node: Mapping[str, Any]) -> str:
    """The node's name (``""`` when it has none)."""
    return str((node.get("metadata") or {}).get("name") or "")


def condition(node: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The node's status condition of type ``kind``, or None."""
    conditions = (node.get("status") or {}).get("conditions") or ()
    return next((c for c in conditions if isinstance(c, Mapping) and c.get("type") == kind), None)


def node_ready(node: Mapping[str, Any]) -> bool:
    """Whether the kubelet reports the node Ready."""
    ready = condition(node, "Ready")
    return ready is not None and ready.get("status") == "True"


def has_taint(node: Mapping[str, Any], key: str) -> bool:
    """Whether the node carries a taint with ``key`` (any value, any effect)."""
    return any(t.get("key") == key for t in (node.get("spec") or {}).get("taints") or ())


def unhealthy_taint(prefix: str) -> str:
    """The key of the taint a confirmed fail puts on a node (``<prefix>/unhealthy``)."""
    return f"{prefix}/unhealthy"


def uncertified_taint(prefix: str) -> str:
    """The key of the taint new nodes register with (``<prefix>/uncertified``); onboarding lifts it."""
    return f"{prefix}/uncertified"


def taint_keys(prefix: str) -> tuple[str, str]:
    """gpucert's two taint keys: (unhealthy, uncertified)."""
    return unhealthy_taint(prefix), uncertified_taint(prefix)


#: The node condition gpucert writes its decisions as (``gpucert.certify`` writes True and False).
CERTIFIED_CONDITION = "GpuCertified"


def never_certified_patch(node: Mapping[str, Any], *, now: datetime) -> dict[str, Any] | None:
    """The status patch giving ``node`` the ``GpuCertified`` condition ``Unknown`` (reason ``NotCertified``)
    a node never certified carries, or None when it has the condition already (whatever its status: a
    decision is never overwritten)."""
    if condition(node, CERTIFIED_CONDITION) is not None:
        return None
    stamp = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    entry = {
        "type": CERTIFIED_CONDITION,
        "status": "Unknown",
        "reason": "NotCertified",
        "message": "never certified: gpucert has not benchmarked this node yet",
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }
    return {"status": {"conditions": [entry]}}


def mark_never_certified(kube: Kube, node: Mapping[str, Any], *, now: datetime | None = None) -> bool:
    """Give ``node`` (its object as read) the ``Unknown`` ``GpuCertified`` condition when it has none, as
    the README promises for a node never certified; returns whether it was written. A node deleted
    meanwhile is skipped; any other :class:`~gpucert.kube.KubeError` is raised."""
    patch = never_certified_patch(node, now=now or datetime.now(UTC))
    if patch is None:
        return False
    with contextlib.suppress(KubeNotFound):
        kube.patch_status("v1", "Node", node_name(node), patch)
        return True
    return False
