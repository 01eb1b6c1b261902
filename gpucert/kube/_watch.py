"""Following nodes as they join: a list, then a watch from its resourceVersion, resumed after it ends.

A watch ends by design (the server's timeout), and its resourceVersion may be too old — answered 410
Gone/Expired, either as the HTTP status or, as a real API server does, as an ERROR event in a 200
stream. A 410 can only be cured by listing again (re-watching the same version fails the same way);
any other ERROR event is re-watched from the last good version, with back-off, and a run of them that
does not end is an error rather than a busy loop. The facade reads an answer whole, so each watch is
short (``timeout_s``, 5 s): a join is reported within that, and an idle cluster costs one small request
per period. Reading whole also means a stream cut mid-way (a proxy dropping long requests) loses what it
carried, so a watch that stays cut past the client's retries is answered like a 410: by listing again.

:func:`announce_joined_nodes` remembers what it announced on the cluster itself: after ``emit`` returns
it annotates the node ``<prefix>/join-announced: <uid>``, so a restarted watcher (or a second one after
a failover) does not onboard the same node twice, while a node that rejoins — a new Node object, a new
UID — is announced again. Emit first, mark second: a crash between the two announces a node twice
(the onboarding deployment's idempotency key is per node UID), never zero times.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

from ._client import Kube, resource_of
from ._errors import KubeError, KubeNotFound, KubeUnavailable
from ._nodes import has_taint

__all__ = ["ANNOUNCED_ANNOTATION", "announce_joined_nodes"]

#: The annotation (under the label prefix) holding the UID of the node object last announced.
ANNOUNCED_ANNOTATION = "join-announced"

_PAGE = 500
#: Watches in a row ending in a non-410 ERROR before giving up (about 7 s of back-off in all).
_MAX_WATCH_ERRORS = 8
_BACKOFF_S = 0.1
_BACKOFF_CAP_S = 2.0
_NODES = resource_of("v1", "Node")
#: The reason of a watch whose stream broke (past the client's retries): it is re-listed, like a 410.
_CUT = "Cut"

Node = dict[str, Any]


def announce_joined_nodes(
    kube: Kube,
    *,
    prefix: str,
    selector: str | None,
    emit: Callable[[str, str], None],
    follow: bool = True,
    timeout_s: int = 5,
    stop: Callable[[], bool] | None = None,
) -> int:
    """Call ``emit(name, uid)`` once per node waiting to be onboarded, then mark it announced.

    A node waits when it matches the label ``selector`` (None: every node), carries the
    ``<prefix>/uncertified`` taint and its ``<prefix>/join-announced`` annotation does not hold its
    current UID. Nodes present now are announced, then, with ``follow``, those that join or become
    eligible later, until ``stop()`` is true (checked between watches, so within ``timeout_s``).

    Returns how many nodes were announced. Raises whatever ``emit`` raises (that node is not marked),
    and :class:`KubeError` when a call fails past its retries or watches keep ending in errors.
    """
    taint, annotation = f"{prefix}/uncertified", f"{prefix}/{ANNOUNCED_ANNOTATION}"
    # Also remembered here: events queued before our own patch still show the node unmarked.
    announced: set[str] = set()
    for node in _follow(kube, selector=selector, follow=follow, timeout_s=timeout_s, stop=stop):
        name, uid = _identity(node)
        if not uid or uid in announced or not has_taint(node, taint):
            continue
        if ((node.get("metadata") or {}).get("annotations") or {}).get(annotation) == uid:
            continue
        emit(name, uid)
        announced.add(uid)
        _mark(kube, name, annotation, uid)
    return len(announced)


# --- list and watch ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ended:
    """How one watch ended: the version to resume from, and the ERROR status that ended it (None: cleanly)."""

    version: str
    error: dict[str, Any] | None
    progressed: bool


def _follow(
    kube: Kube, *, selector: str | None, follow: bool, timeout_s: int, stop: Callable[[], bool] | None
) -> Iterator[Node]:
    """Every node matching ``selector`` as listed, then (``follow``) as each watch event shows it.

    Raises :class:`KubeError` when a call fails past its retries or :data:`_MAX_WATCH_ERRORS` watches in
    a row end in an ERROR other than 410.
    """
    stopped = stop or (lambda: False)
    streak = 0  # watches in a row that ended in an error with no event between
    relist = True
    while relist:
        nodes, version = _list(kube, selector)
        yield from nodes
        relist = False
        while follow and not stopped() and not relist:
            ended = yield from _watch(kube, selector, version, timeout_s)
            version = ended.version
            if ended.error is None:
                streak = 0
                continue
            streak = 1 if ended.progressed else streak + 1
            _pause(_backoff(streak), stopped)
            if _expired(ended.error) or ended.error.get("reason") == _CUT:
                # Too old: only a fresh list has a version the server still knows, and it always cures a 410.
                # Cut: the events the broken stream carried are lost, and a list has them all.
                relist = not stopped()
            elif streak >= _MAX_WATCH_ERRORS:
                raise KubeError(
                    f"watch nodes: {streak} watches in a row ended in an error, the last: "
                    f"{ended.error.get('message') or ended.error}",
                    status=_code(ended.error),
                )


def _list(kube: Kube, selector: str | None) -> tuple[list[Node], str]:
    """The nodes matching ``selector`` and the resourceVersion to watch from; raises :class:`KubeError`."""
    while True:
        nodes: list[Node] = []
        version: str | None = None
        token: str | None = None
        try:
            while True:
                page = kube.request(
                    "GET", _NODES.path(), doing="list nodes",
                    query={"labelSelector": selector, "limit": _PAGE, "continue": token},
                )  # fmt: skip
                meta = page.get("metadata") or {}
                # The first page's version: pages of a real list share it, and an older one only replays more.
                version = str(meta.get("resourceVersion") or "") if version is None else version
                nodes.extend(page.get("items") or ())
                token = meta.get("continue") or None
                if not token:
                    return nodes, version
        except KubeError as exc:
            if exc.status != 410 or token is None:
                raise
            # The continue token outlived its snapshot: list again from the start.


def _watch(kube: Kube, selector: str | None, version: str, timeout_s: int) -> Generator[Node, None, _Ended]:
    """The nodes of the ADDED and MODIFIED events of one watch from ``version``; returns how it ended.

    Raises :class:`KubeError` on a failed call other than 410.
    """
    try:
        text = kube.request(
            "GET", _NODES.path(), doing="watch nodes", accept="*/*", timeout_s=timeout_s + 10,
            query={"watch": "1", "resourceVersion": version, "timeoutSeconds": timeout_s,
                   "labelSelector": selector, "allowWatchBookmarks": "true"},
        )  # fmt: skip
    except KubeUnavailable as exc:
        # Every try of it cut or unanswered (a proxy that drops long requests, a restart): re-listed, and
        # a server that is down fails the list past its retries, so a real outage still ends the watcher.
        return _Ended(version, {"reason": _CUT, "message": str(exc)}, progressed=False)
    except KubeError as exc:
        if exc.status == 410:
            return _Ended(version, {"code": 410, "message": str(exc)}, progressed=False)
        raise
    progressed = False
    for line in str(text).splitlines():
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            # A stream cut mid-event: what came before counts, the rest is watched again.
            return _Ended(version, {"message": "the watch stream ended mid-event"}, progressed)
        obj = event.get("object") or {}
        if event.get("type") == "ERROR":
            return _Ended(version, obj, progressed)
        version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
        progressed = True
        if event.get("type") in ("ADDED", "MODIFIED"):
            yield obj
    return _Ended(version, None, progressed)


def _expired(status: dict[str, Any]) -> bool:
    return _code(status) == 410 or status.get("reason") in ("Expired", "Gone")


def _code(status: dict[str, Any]) -> int | None:
    code = status.get("code")
    return code if isinstance(code, int) else None


def _backoff(streak: int) -> float:
    """Seconds to wait after the ``streak``-th failed watch in a row: none after the first."""
    return 0.0 if streak <= 1 else min(_BACKOFF_CAP_S, _BACKOFF_S * 2 ** (streak - 2))


def _pause(seconds: float, stopped: Callable[[], bool]) -> None:
    deadline = time.monotonic() + seconds
    while not stopped() and (left := deadline - time.monotonic()) > 0:
        time.sleep(min(left, 0.05))


# --- nodes -------------------------------------------------------------------------------------------


def _identity(node: Node) -> tuple[str, str]:
    meta = node.get("metadata") or {}
    return str(meta.get("name") or ""), str(meta.get("uid") or "")




def _mark(kube: Kube, name: str, annotation: str, uid: str) -> None:
    """Annotate node ``name`` as announced under ``uid``; raises :class:`KubeError` unless it is gone."""
    # Gone since: nothing to mark, and a node that comes back has a new UID.
    with contextlib.suppress(KubeNotFound):
        kube.merge_patch("v1", "Node", name, {"metadata": {"annotations": {annotation: uid}}})
