"""Following nodes as they join: a list, then a watch from its resourceVersion, resumed after it ends.

A watch ends by design (the server's timeout) and may be answered 410 Gone when its resourceVersion is
too old; both are normal, so the loop re-lists (a 410) or re-watches from the last version seen. The
facade reads an answer whole, so each watch is short (``timeout_s``, 5 s): a join is reported within
that, and an idle cluster costs one small request per period.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from ._client import Kube, resource_of
from ._errors import KubeError

__all__ = ["joined_nodes"]


def _tainted(node: dict[str, Any], taint: str) -> bool:
    return any(t.get("key") == taint for t in (node.get("spec") or {}).get("taints") or ())


def joined_nodes(
    kube: Kube, *, taint: str, follow: bool = True, timeout_s: int = 5
) -> Iterator[tuple[str, str]]:
    """(name, uid) of each node carrying ``taint`` (a node waiting to be onboarded): those present now,
    then, with ``follow``, those added or tainted later — each UID once."""
    seen: set[str] = set()
    path = resource_of("v1", "Node").path()
    while True:
        listing = kube.request("GET", path, doing="list nodes")
        version = str((listing.get("metadata") or {}).get("resourceVersion") or "")
        for node in listing.get("items") or ():
            yield from _report(node, taint, seen)
        if not follow:
            return
        while True:
            try:
                text = kube.request(
                    "GET", path, doing="watch nodes", accept="*/*", timeout_s=timeout_s + 10,
                    query={"watch": "1", "resourceVersion": version, "timeoutSeconds": timeout_s,
                           "allowWatchBookmarks": "true"},
                )  # fmt: skip
            except KubeError as exc:
                if exc.status == 410:
                    break  # too old: list again
                raise
            for line in str(text).splitlines():
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if event.get("type") == "ERROR":
                    break
                if event.get("type") in ("ADDED", "MODIFIED"):
                    yield from _report(obj, taint, seen)


def _report(node: dict[str, Any], taint: str, seen: set[str]) -> Iterator[tuple[str, str]]:
    meta = node.get("metadata") or {}
    uid = str(meta.get("uid") or "")
    if uid and uid not in seen and _tainted(node, taint):
        seen.add(uid)
        yield str(meta.get("name")), uid
