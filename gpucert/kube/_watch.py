"""Following nodes as they join: a list, then a watch from its resourceVersion, resumed after it ends.

What the watcher promises is in docs/design/onboard.md; the non-obvious parts of how:

* a 410 (too old a resourceVersion, as the HTTP status or, from a real API server, an ERROR event in a 200
  stream) is cured only by listing again; any other ERROR event is re-watched from the last good version
  with back-off, and a run of them that does not end is an error rather than a busy loop;
* the facade reads an answer whole, so each watch is short (``timeout_s``) and a stream cut mid-way loses
  what it carried: a watch that stays cut past the client's retries is answered by listing again;
* once the first list succeeded, what fails past the client's retries is followed by a list and a watch,
  retried with the :class:`~._retry.RetryPolicy`'s back-off for as long as it takes (401/403 only for
  :attr:`Reconnect.forbidden_s`: a restarted API server refuses while its RBAC loads); before it, only a
  401/403 is waited out (:attr:`Reconnect.start_forbidden_s`), so whoever started the watcher hears of a
  server that does not answer;
* emit first, mark second (``<prefix>/join-announced: <uid>``): a crash between the two announces a node
  twice (onboarding is idempotent per node UID), never zero times.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..errors import KubeError, KubeForbidden, KubeNotFound, KubeUnavailable, KubeUnreachable
from ._client import Kube, resource_of
from ._nodes import has_taint, mark_never_certified
from ._retry import RetryPolicy

__all__ = ["ANNOUNCED_ANNOTATION", "DEFAULT_RECONNECT", "Reconnect", "announce_joined_nodes"]

#: The annotation (under the label prefix) holding the UID of the node object last announced.
ANNOUNCED_ANNOTATION = "join-announced"

_PAGE = 500
#: Watches in a row ending in a non-410 ERROR before giving up (about 7 s of back-off in all).
_MAX_WATCH_ERRORS = 8
_BACKOFF_S = 0.1
_BACKOFF_CAP_S = 2.0
_NODES = resource_of("v1", "Node")
_LOG = logging.getLogger("gpucert.kube")

Node = dict[str, Any]
T = TypeVar("T")


@dataclass(frozen=True)
class Reconnect:
    """How a watcher rides out the API server going away (see the module): back-off and patience."""

    #: The first wait before listing again after a failed try (the first try is at once); each next doubles,
    #: jittered, up to ``max_delay_s``.
    base_delay_s: float = 0.5
    max_delay_s: float = 15.0
    #: How long 401/403 answers are taken for a restarted API server's RBAC still loading, from the first of a
    #: run of them (a refused connection between starts the run again: the server restarted again).
    forbidden_s: float = 60.0
    #: The same before the first list succeeded: shorter, since whoever started the watcher waits for it.
    start_forbidden_s: float = 10.0

    def policy(self) -> RetryPolicy:
        """The retry policy of the lists: no bound on attempts or time (``forbidden_s`` bounds a denial)."""
        return RetryPolicy(
            attempts=sys.maxsize,
            base_delay_s=self.base_delay_s,
            max_delay_s=self.max_delay_s,
            max_retry_after_s=self.max_delay_s,
            deadline_s=math.inf,
        )


#: What :func:`announce_joined_nodes` rides out with when not told (read at each call).
DEFAULT_RECONNECT = Reconnect()


def announce_joined_nodes(
    kube: Kube,
    *,
    prefix: str,
    selector: str | None,
    emit: Callable[[str, str], None],
    follow: bool = True,
    timeout_s: int = 5,
    stop: Callable[[], bool] | None = None,
    reconnect: Reconnect | None = None,
    log: Callable[[str], None] | None = None,
) -> int:
    """Call ``emit(name, uid)`` once per node waiting to be onboarded, then mark it announced; returns how
    many were announced.

    A node waits when it matches ``selector`` (None: every node), carries the ``<prefix>/uncertified`` taint
    and its ``<prefix>/join-announced`` annotation does not hold its current UID. With ``follow``, nodes are
    followed until ``stop()`` (checked within ``timeout_s``); ``log`` (default: the ``gpucert.kube`` logger) is
    told when an outage starts and ends. Raises whatever ``emit`` raises (that node is not marked),
    :class:`KubeError` when the first list fails or watches keep ending in errors, and :class:`KubeForbidden`
    when 401/403 lasts past ``reconnect``'s patience.
    """
    taint, annotation = f"{prefix}/uncertified", f"{prefix}/{ANNOUNCED_ANNOTATION}"
    # Also remembered here: events queued before our own patch still show the node unmarked.
    announced: set[str] = set()
    # Announced, but the mark failed (the API server went away): marked when the node is listed again.
    unmarked: set[str] = set()
    count = 0

    def seen(node: Node) -> None:
        nonlocal count
        name, uid = _identity(node)
        if not uid or not has_taint(node, taint):
            return
        if ((node.get("metadata") or {}).get("annotations") or {}).get(annotation) == uid:
            unmarked.discard(uid)  # a mark whose answer was lost did land
            return
        if uid in announced and uid not in unmarked:
            return
        if uid not in announced:
            # GpuCertified=Unknown until onboarding certifies it; best effort: the node is announced anyway.
            try:
                mark_never_certified(kube, node)
            except KubeError as exc:
                _LOG.warning("node %s: its GpuCertified condition (Unknown) was not written: %s", name, exc)
            emit(name, uid)
            announced.add(uid)
            unmarked.add(uid)
            count += 1
        # Gone since: nothing to mark, and a node that comes back has a new UID.
        with contextlib.suppress(KubeNotFound):
            kube.merge_patch("v1", "Node", name, {"metadata": {"annotations": {annotation: uid}}})
        unmarked.discard(uid)

    def listed(nodes: list[Node]) -> None:
        # A node the list no longer shows was deleted (or left the selection, and its mark speaks for it):
        # forgotten, so a watcher that runs for months holds only the nodes there are.
        present = {_identity(node)[1] for node in nodes}
        announced.intersection_update(present | unmarked)
        for node in nodes:
            seen(node)

    _follow(
        kube,
        selector=selector,
        follow=follow,
        timeout_s=timeout_s,
        stopped=stop or (lambda: False),
        reconnect=reconnect or DEFAULT_RECONNECT,
        log=log or _LOG.warning,
        listed=listed,
        seen=seen,
    )
    return count


# --- list and watch ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Ended:
    """How one watch ended: the version to resume from, and the ERROR status that ended it (None: cleanly)."""

    version: str
    error: dict[str, Any] | None
    progressed: bool


def _follow(
    kube: Kube,
    *,
    selector: str | None,
    follow: bool,
    timeout_s: int,
    stopped: Callable[[], bool],
    reconnect: Reconnect,
    log: Callable[[str], None],
    listed: Callable[[list[Node]], None],
    seen: Callable[[Node], None],
) -> None:
    """``listed(nodes)`` with every node matching ``selector``, then (``follow``) ``seen(node)`` with each
    node a watch event shows, and ``listed`` again after each 410 or outage, until ``stopped()``. Raises as
    :func:`announce_joined_nodes` says, and for a failure no retry cures (a 404, a 422)."""
    policy = reconnect.policy()

    def start() -> str:
        nodes, version = _list(kube, selector)
        listed(nodes)
        return version

    version = _retrying(policy, start, _Outage(reconnect.start_forbidden_s, None), stopped)
    if version is None or not follow:
        return
    outage = _Outage(reconnect.forbidden_s, log)

    def relist() -> _Ended:
        # The watch is part of the try: a list that succeeds while every watch fails (a 403 on watch only,
        # a proxy cutting each one) is the outage going on, backed off, not a busy loop of lists.
        nodes, version = _list(kube, selector)
        listed(nodes)
        return _watch(kube, selector, version, timeout_s, seen)

    streak = 0  # watches in a row that ended in an error with no event between
    again = False  # list again before watching
    while not stopped():
        ended: _Ended | None = None
        if not again:
            try:
                ended = _watch(kube, selector, version, timeout_s, seen)
            except KubeError as exc:
                if not outage.transient(exc):
                    raise
        if ended is None:
            ended = _retrying(policy, relist, outage, stopped)
            if ended is None:
                return
        version, again = ended.version, False
        if ended.error is None:
            streak = 0
            continue
        streak = 1 if ended.progressed else streak + 1
        _pause(_backoff(streak), stopped)
        if _expired(ended.error):
            again = True  # too old: only a fresh list has a version the server still knows
        elif streak >= _MAX_WATCH_ERRORS:
            raise KubeError(
                f"watch nodes: {streak} watches in a row ended in an error, the last: "
                f"{ended.error.get('message') or ended.error}",
                status=_code(ended.error),
            )


class _Outage:
    """Which failures are ridden out, and since when; says when an outage starts and when it ends."""

    def __init__(self, forbidden_s: float, log: Callable[[str], None] | None) -> None:
        self.forbidden_s = forbidden_s
        #: None before the first list: only a 401/403 is waited out (a server that is down is reported), and
        #: quietly, as the error that ends it (or nothing, once allowed) is all whoever started it needs.
        self.log = log
        self.since: float | None = None  # the outage's first failure (monotonic)
        self.forbidden_since: float | None = None  # the first 401/403 of the run of them going on
        self.failures = 0

    def transient(self, exc: KubeError) -> bool:
        """Whether to try again after ``exc``; when not, ``exc``'s message says why it is final."""
        now = time.monotonic()
        if isinstance(exc, KubeForbidden):
            self.forbidden_since = now if self.forbidden_since is None else self.forbidden_since
            lasted = now - self.forbidden_since
            if lasted >= self.forbidden_s:
                when = "at start" if self.log is None else "after it had been allowed"
                exc.args = (f"{exc} (refused for {lasted:.0f} s, {when})",)
                return False
        elif isinstance(exc, KubeUnavailable) and self.log is not None:
            if isinstance(exc, KubeUnreachable):
                self.forbidden_since = None  # the server went away again: its RBAC loads again
        else:
            return False
        if self.since is None:
            self.since = now
            if self.log is not None:
                self.log(
                    f"the API server is away or refusing: {exc}; listing the nodes again with back-off until "
                    f"it answers (as long as it takes; a 401/403 for up to {self.forbidden_s:g} s)"
                )
        self.failures += 1
        return True

    def over(self) -> None:
        """The try after failures succeeded: said once, and the next failure starts a new outage."""
        if self.since is not None and self.log is not None:
            tries = f"{self.failures} failed tr{'y' if self.failures == 1 else 'ies'}"
            self.log(
                f"the API server answers again after {time.monotonic() - self.since:.1f} s ({tries}); "
                f"the nodes were listed again, so what joined meanwhile is announced"
            )
        self.since = self.forbidden_since = None
        self.failures = 0


def _retrying(policy: RetryPolicy, fn: Callable[[], T], outage: _Outage, stopped: Callable[[], bool]) -> T | None:
    """``fn()``, tried again with ``policy``'s back-off while ``outage`` takes its failures for transient;
    None when ``stopped()`` before it succeeded."""

    def attempt() -> T | None:
        return None if stopped() else fn()

    result = policy.call(attempt, retry_if=outage.transient, sleep=lambda s: _pause(s, stopped))
    if result is not None:
        outage.over()
    return result


def _list(kube: Kube, selector: str | None) -> tuple[list[Node], str]:
    """The nodes matching ``selector`` and the resourceVersion to watch from; raises :class:`KubeError`."""
    while True:
        nodes: list[Node] = []
        version: str | None = None
        token: str | None = None
        try:
            while True:
                query = {"labelSelector": selector, "limit": _PAGE, "continue": token}
                page = kube.request("GET", _NODES.path(), doing="list nodes", query=query)
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


def _watch(kube: Kube, selector: str | None, version: str, timeout_s: int, seen: Callable[[Node], None]) -> _Ended:
    """``seen(node)`` with the node of each ADDED and MODIFIED event of one watch from ``version``; returns
    how it ended. Raises :class:`KubeError` on a failed call other than 410 (:class:`KubeUnavailable` when
    every try was cut or unanswered: a proxy that drops long requests, the API server going away)."""
    query = {"watch": "1", "resourceVersion": version, "timeoutSeconds": timeout_s, "labelSelector": selector}
    query["allowWatchBookmarks"] = "true"
    try:
        # The answer is read whole: the read waits past the server's own end of the watch.
        text = kube.request(
            "GET", _NODES.path(), doing="watch nodes", accept="*/*", timeout_s=timeout_s + 10, query=query
        )
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
            seen(obj)
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
