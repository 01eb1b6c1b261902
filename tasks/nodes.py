"""Tasks about single nodes: waiting for one to be Ready."""

from __future__ import annotations

from gpucert.errors import InputError
from gpucert.kube import Kube
from gpucert.stack import wait_until

from ._retry import kube_task

__all__ = ["wait_for_node"]


@kube_task("wait for the node", "wait for {node}")
def wait_for_node(kube: Kube, node: str, uid: str | None, timeout_s: float) -> str:
    """Wait until ``node`` is Ready; returns its UID. Raises ``InputError`` when the node has another UID
    than ``uid`` (a rejoined node: the caller meant the earlier one) and ``StackNotReady`` on timeout."""

    def pending() -> dict[str, str]:
        obj = kube.find("v1", "Node", node)
        if obj is None:
            return {node: "not registered"}
        if uid and obj["metadata"].get("uid") != uid:
            raise InputError(
                f"node {node} has UID {obj['metadata'].get('uid')}, not {uid}: it rejoined since"
            )
        conditions = (obj.get("status") or {}).get("conditions") or ()
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        return {} if ready else {node: "not Ready"}

    wait_until(pending, what=f"node {node}", total=1, timeout_s=timeout_s)
    return str(kube.get("v1", "Node", node)["metadata"].get("uid"))
