"""The request log: every Kubernetes API request the simulator serves, in the terms RBAC judges it by.

Each request is parsed the way the API server's ``RequestInfoFactory`` parses it
(k8s.io/apiserver/pkg/endpoints/request/requestinfo.go) — before routing, so a request for a resource the
simulator does not serve is recorded too, as a real authorizer would see it:

* a resource request (``/api/v1/…``, ``/apis/<group>/<version>/…``) gets an RBAC verb: ``get``, ``list``
  (a GET on a collection), ``watch`` (a GET with ``?watch=true``), ``create``, ``update`` (PUT),
  ``patch``, ``delete``, ``deletecollection`` (a DELETE on a collection); its API group, resource,
  subresource, namespace (for a Namespace object, the namespace is its own name, as the API server sets it)
  and name (also from a ``fieldSelector=metadata.name=…`` of a list or watch);
* anything else (``/api``, ``/apis``, ``/apis/<group>/<version>``, ``/version``, ``/openapi/…``) is a
  non-resource request, whose verb is the lower-cased HTTP method and which RBAC judges by its path.

A server-side apply (PATCH) that creates its object is also checked for ``create`` by the API server
(apiserver's patch handler, ``withAuthorization``): the log records that check as a second entry, verb
``create``, after the PATCH answered 201.

Who asked: the simulator authenticates nobody, so the bearer token of a request is taken as the name of
its user (a test writes a kubeconfig whose token is, say, ``system:serviceaccount:gpucert-system:
gpucert-runtime``); a request without one has user ``""``. The simulator's own endpoints (``/gpucert/``,
the DCGM exporters' ``/dcgm/``) are not the Kubernetes API and are not recorded.

The log costs one append under a lock per request; it keeps the newest :data:`DEFAULT_CAPACITY` entries
and counts the ones it dropped, so a long ``gpucert sim up`` stays bounded and a test can tell when its
log is incomplete.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["DEFAULT_CAPACITY", "ApiRequest", "RequestLog", "bearer_user", "request_info"]

DEFAULT_CAPACITY = 50_000
_API_PREFIXES = ("api", "apis")
_VERBS_BY_METHOD = {
    "POST": "create",
    "GET": "get",
    "HEAD": "get",
    "PUT": "update",
    "PATCH": "patch",
    "DELETE": "delete",
}
# Path verbs of the old API (``/api/v1/watch/pods``); ``proxy`` names no subresource.
_SPECIAL_VERBS = ("proxy", "watch")
# Subresources of a Namespace, which keep the path's ``namespaces/<name>`` as the resource.
_NAMESPACE_SUBRESOURCES = ("status", "finalize")
# strconv.ParseBool's true values: what the API server's parameter codec reads ``watch=`` with.
_TRUE = ("1", "t", "T", "TRUE", "true", "True")


class ApiRequest(NamedTuple):
    """One API request in RBAC's terms (for a non-resource request, only ``verb`` and ``path`` count).

    A named tuple: the log holds many, so each is small and quick to make.
    """

    verb: str
    group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    path: str
    user: str = ""
    resource_request: bool = True

    @property
    def combined_resource(self) -> str:
        """``resource/subresource`` (``pods/log``), or the resource alone: what an RBAC rule names."""
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource

    def describe(self) -> str:
        """``(verb, group, resource[/sub], namespace)`` for messages; ``(verb, path)`` when non-resource."""
        if not self.resource_request:
            return f"({self.verb}, {self.path})"
        where = self.namespace or "cluster scope"
        return f"({self.verb}, {self.group or 'core'}, {self.combined_resource}, {where})"

    def to_dict(self) -> dict[str, Any]:
        return dict(self._asdict())


def _exact_name(field_selector: str | None) -> str:
    """The name a ``metadata.name=…`` term of a field selector pins, else ``""`` (RequiresExactMatch)."""
    for term in (field_selector or "").split(","):
        key, sep, value = term.partition("=")  # ``metadata.name!=x`` leaves the key ``metadata.name!``
        name = value.removeprefix("=").strip()  # ``==`` means ``=``
        if sep and key.strip() == "metadata.name":
            # IsValidPathSegmentName: a name that could not be a path segment is not taken as one.
            return "" if name in (".", "..") or "/" in name or "%" in name else name
    return ""


def request_info(method: str, path: str, query: Mapping[str, str], user: str = "") -> ApiRequest:
    """The RBAC attributes of a request, as the API server derives them from its method, path and query."""
    parts = [p for p in path.strip("/").split("/") if p]
    plain = ApiRequest(method.lower(), "", "", "", "", "", path, user, resource_request=False)
    if len(parts) < 3 or parts[0] not in _API_PREFIXES:
        return plain
    rest = parts[1:]
    group = ""
    if parts[0] == "apis":
        if len(rest) < 3:  # /apis/<group>/<version>: discovery
            return plain
        group, rest = rest[0], rest[1:]
    rest = rest[1:]  # the version
    if rest[0] in _SPECIAL_VERBS:
        if len(rest) < 2:
            return plain
        verb, rest = rest[0], rest[1:]
    else:
        verb = _VERBS_BY_METHOD.get(method.upper(), "")
    namespace = ""
    if rest[0] == "namespaces" and len(rest) > 1:
        namespace = rest[1]
        if len(rest) > 2 and rest[2] not in _NAMESPACE_SUBRESOURCES:
            rest = rest[2:]
    resource = rest[0]
    name = rest[1] if len(rest) >= 2 else ""
    sub = rest[2] if len(rest) >= 3 and verb != "proxy" else ""
    if not name and verb == "get":
        verb = "watch" if query.get("watch", "") in _TRUE else "list"
    if not name and verb in ("list", "watch"):
        name = _exact_name(query.get("fieldSelector"))
    if not name and verb == "delete":
        verb = "deletecollection"
    return ApiRequest(verb, group, resource, sub, namespace, name, path, user)


def bearer_user(authorization: str | None) -> str:
    """The user a request names: its bearer token (the simulator has no authentication), else ``""``."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class RequestLog:
    """The requests served, oldest first; thread-safe (the server's loop appends, tests read)."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._entries: deque[ApiRequest] = deque(maxlen=capacity)
        self._lock = threading.Lock()
        self._dropped = 0

    def add(self, request: ApiRequest) -> None:
        with self._lock:
            if len(self._entries) == self._entries.maxlen:
                self._dropped += 1
            self._entries.append(request)

    def entries(self) -> list[ApiRequest]:
        """A copy of the entries, oldest first."""
        with self._lock:
            return list(self._entries)

    @property
    def dropped(self) -> int:
        """How many of the oldest entries fell out since the last :meth:`clear` (0: the log is complete)."""
        with self._lock:
            return self._dropped

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._dropped = 0
