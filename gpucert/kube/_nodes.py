"""What a Node object says, read one way everywhere: readiness, taints, conditions, gpucert's taint keys.

Pure functions over the API's dicts (no calls), so the certify flow, onboarding, configure's inventory
and ``watch-nodes`` agree on what "Ready" and "tainted" mean.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "condition",
    "has_taint",
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
    for cond in (node.get("status") or {}).get("conditions") or ():
        if isinstance(cond, Mapping) and cond.get("type") == kind:
            return cond
    return None


def node_ready(node: Mapping[str, Any]) -> bool:
    """Whether the kubelet reports the node Ready."""
    ready = condition(node, "Ready")
    return ready is not None and ready.get("status") == "True"


def has_taint(node: Mapping[str, Any], key: str) -> bool:
    """Whether the node carries a taint with ``key`` (any value, any effect)."""
    return any(t.get("key") == key for t in (node.get("spec") or {}).get("taints") or ())


def unhealthy_taint(prefix: str) -> str:
    """The key of the taint a confirmed fail puts on a node (DESIGN.md: ``<prefix>/unhealthy``)."""
    return f"{prefix}/unhealthy"


def uncertified_taint(prefix: str) -> str:
    """The key of the taint new nodes register with (``<prefix>/uncertified``); onboarding lifts it."""
    return f"{prefix}/uncertified"


def taint_keys(prefix: str) -> tuple[str, str]:
    """gpucert's two taint keys: (unhealthy, uncertified)."""
    return unhealthy_taint(prefix), uncertified_taint(prefix)
