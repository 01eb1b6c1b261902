"""Tasks about single nodes: waiting for one to be Ready, reading whether it was admitted."""

from __future__ import annotations

from gpucert.errors import InputError
from gpucert.kube import Kube, has_taint, node_ready, uncertified_taint
from gpucert.stack import wait_until

from ._retry import kube_task

__all__ = ["admitted", "wait_for_node"]


@kube_task("wait for the node", "wait for {node}")
def wait_for_node(kube: Kube, node: str, uid: str | None, timeout_s: float) -> str:
    """Wait until ``node`` is Ready; returns its UID. Raises ``InputError`` when the node has another UID
    than ``uid`` (a rejoined node: the caller meant the earlier one) and ``StackNotReady`` on timeout."""

    def pending() -> dict[str, str]:
        obj = kube.find("v1", "Node", node)
        if obj is None:
            return {node: "not registered"}
        if uid and obj["metadata"].get("uid") != uid:
            raise InputError(f"node {node} has UID {obj['metadata'].get('uid')}, not {uid}: it rejoined since")
        return {} if node_ready(obj) else {node: "not Ready"}

    wait_until(pending, what=f"node {node}", total=1, timeout_s=timeout_s)
    return str(kube.get("v1", "Node", node)["metadata"].get("uid"))


@kube_task("admitted?", "is {node} admitted")
def admitted(kube: Kube, node: str, *, prefix: str) -> bool:
    """Whether ``node`` is certified and no longer carries ``<prefix>/uncertified``."""
    obj = kube.get("v1", "Node", node)
    state = ((obj.get("metadata") or {}).get("labels") or {}).get(f"{prefix}/state")
    return state == "certified" and not has_taint(obj, uncertified_taint(prefix))
