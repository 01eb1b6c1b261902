"""A small dict-in, dict-out facade over the official client, with errors mapped and calls retried.

Why not the typed APIs: they build a pydantic model per object (a list of 1,000 nodes costs more to model
than to fetch), raise the client's exceptions, and need one method per kind. gpucert handles manifests as
plain mappings, so every call goes through one path here: the official ``ApiClient`` serialises and
authenticates the request (tokens, client certificates and exec plugins of the kubeconfig work), the answer
is parsed as JSON, a failure becomes a :class:`KubeError`, and a transient one is retried. Only the kinds
gpucert manages are known (:data:`KINDS`); anything else is a programming error.
"""

from __future__ import annotations

import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
import urllib3

from .._deadline import CONNECT_TIMEOUT_S, Deadline
from ..errors import KubeError, KubeNotFound, KubeUnreachable
from ._errors import from_api_exception, from_response
from ._retry import RetryPolicy

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

__all__ = ["FIELD_MANAGER", "KINDS", "Kube", "KubeChange", "Resource"]

#: The field manager of every write gpucert makes, server-side apply or not (issue 4): without one the API
#: server files a patch's fields under the client's user agent (``OpenAPI-Generator/…``), and nobody can
#: tell gpucert's labels and taints from anyone else's in ``managedFields``.
FIELD_MANAGER = "gpucert"
_APPLY = "application/apply-patch+yaml"
_MERGE = "application/merge-patch+json"
_STRATEGIC = "application/strategic-merge-patch+json"
_PAGE = 500


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the API."""

    api_version: str
    kind: str
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
        base = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{urllib.parse.quote(namespace, safe='')}"
        base += f"/{self.plural}"
        if name is not None:
            base += f"/{urllib.parse.quote(name, safe='')}"
        if sub is not None:
            base += f"/{sub}"
        return base


_RBAC = "rbac.authorization.k8s.io/v1"
KINDS: dict[tuple[str, str], Resource] = {
    (r.api_version, r.kind): r
    for r in (
        Resource("v1", "Namespace", "namespaces", False),
        Resource("v1", "Node", "nodes", False),
        Resource("v1", "Pod", "pods", True),
        Resource("v1", "Service", "services", True),
        Resource("v1", "Endpoints", "endpoints", True),
        Resource("v1", "ConfigMap", "configmaps", True),
        Resource("v1", "ServiceAccount", "serviceaccounts", True),
        Resource("v1", "Event", "events", True),
        Resource("events.k8s.io/v1", "Event", "events", True),
        Resource("apps/v1", "DaemonSet", "daemonsets", True),
        Resource("apps/v1", "Deployment", "deployments", True),
        # The NVIDIA GPU Operator's own resources: configure adopts a stack the operator runs (issue 32).
        Resource("nvidia.com/v1", "ClusterPolicy", "clusterpolicies", False),
        Resource("nvidia.com/v1alpha1", "NVIDIADriver", "nvidiadrivers", False),
        Resource("batch/v1", "Job", "jobs", True),
        Resource(_RBAC, "ClusterRole", "clusterroles", False),
        Resource(_RBAC, "ClusterRoleBinding", "clusterrolebindings", False),
        Resource(_RBAC, "Role", "roles", True),
        Resource(_RBAC, "RoleBinding", "rolebindings", True),
    )
}


def resource_of(api_version: str, kind: str) -> Resource:
    """The :class:`Resource` of a kind gpucert manages; raises ``ValueError`` for any other."""
    try:
        return KINDS[(api_version, kind)]
    except KeyError:
        raise ValueError(f"gpucert does not manage {api_version}/{kind}") from None


def _text(data: object) -> str:
    """An answer's body as text (bytes decoded, any bad byte replaced)."""
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else str(data or "")


def _reason(exc: BaseException) -> str:
    """Why nothing answered, in a few words: urllib3's message repeats the pool and the URL."""
    if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
        return "read timed out"
    # NewConnectionError derives from ConnectTimeoutError in urllib3: the refused connection first.
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        return f"cannot connect ({str(exc).rsplit(': ', 1)[-1]})"
    if isinstance(exc, urllib3.exceptions.ConnectTimeoutError):
        return "connect timed out"
    return str(exc) or type(exc).__name__


def describe(obj: Mapping[str, Any]) -> str:
    """``Kind namespace/name`` of an object, for messages."""
    meta = obj.get("metadata") or {}
    return _named(obj.get("kind"), meta.get("name"), meta.get("namespace"))


def _named(kind: object, name: object, namespace: object) -> str:
    return f"{kind} {f'{namespace}/' if namespace else ''}{name}"


@dataclass(frozen=True)
class KubeChange:
    """One write that succeeded, as the observers of a :class:`Kube` see it (the audit trail's source)."""

    #: ``apply``, ``create``, ``patch``, ``patch_status`` or ``delete``.
    verb: str
    api_version: str
    kind: str
    name: str
    namespace: str | None
    #: What was sent: the object, the patch (None for a delete).
    body: Mapping[str, Any] | None
    #: The object as the caller last read it, when it passed it (what a patch changed it from).
    before: Mapping[str, Any] | None = None
    #: The object as the server answered (None for a delete): its uid is what an Event about it names.
    result: Mapping[str, Any] | None = None
    #: Why the caller made this write, when it said (the audit trail's ``why``; else the run's step).
    why: str | None = None

    @property
    def unchanged(self) -> bool:
        """An apply that wrote nothing: the caller read the object first and its resourceVersion stayed."""
        if self.verb != "apply" or self.before is None or self.result is None:
            return False
        version = (self.before.get("metadata") or {}).get("resourceVersion")
        return version is not None and version == (self.result.get("metadata") or {}).get("resourceVersion")


class Kube:
    """The Kubernetes API as gpucert uses it; every method may raise a :class:`KubeError`. Every write that
    succeeds is told to the observers (:meth:`observe`) as a :class:`KubeChange`, so that no change escapes
    the audit trail however deep the code that made it."""

    def __init__(self, api_client: ApiClient, retry: RetryPolicy | None = None) -> None:
        self.api_client = api_client
        self.retry = retry or RetryPolicy()
        self._observers: list[Callable[[KubeChange], None]] = []
        self._observers_lock = threading.Lock()

    def observe(self, observer: Callable[[KubeChange], None]) -> Callable[[], None]:
        """Call ``observer`` after every successful write; returns the function that stops it."""
        with self._observers_lock:
            self._observers.append(observer)

        def stop() -> None:
            with self._observers_lock:
                if observer in self._observers:
                    self._observers.remove(observer)

        return stop

    def _changed(self, change: KubeChange) -> None:
        with self._observers_lock:
            observers = list(self._observers)
        for observer in observers:
            observer(change)

    # --- the one request path --------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        doing: str,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        accept: str = "application/json",
        timeout_s: float = 30.0,
        deadline_s: float | None = None,
    ) -> Any:
        """One API call, retried while transient; returns the parsed JSON body (text when not JSON).

        ``timeout_s`` bounds one attempt's wait for the answer; all attempts together take at most the retry
        policy's deadline, or ``deadline_s`` when that is shorter, each attempt cut to what is left of it.
        Raises :class:`KubeError` (:class:`KubeUnreachable` naming the server when nothing answered).
        """
        deadline = self.retry.start()
        if deadline_s is not None and deadline_s < deadline.seconds:
            deadline = Deadline(deadline_s, deadline.started)

        def once() -> Any:
            headers = {"Accept": accept} | ({"Content-Type": content_type} if content_type else {})
            params = self.api_client.param_serialize(
                method,
                path,
                query_params=[(k, v) for k, v in (query or {}).items() if v is not None],
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            from kubernetes.client.exceptions import ApiException

            # (connect, read): a short connect so that a server that is down fails fast; the read cut to
            # what is left of the deadline, so the last attempt ends with it.
            timeouts = (deadline.cap(CONNECT_TIMEOUT_S), deadline.cap(timeout_s))
            try:
                response = self.api_client.call_api(*params, _request_timeout=timeouts)
                data = response.read()  # type: ignore[no-untyped-call]
            except ApiException as exc:
                raise from_api_exception(exc, doing) from exc
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise KubeUnreachable(f"{doing}: no answer from the API server {self.host}: {_reason(exc)}") from exc
            if not 200 <= response.status <= 299:
                raise from_response(response.status, _text(data), response.headers, doing)
            if accept != "application/json":
                return _text(data)
            try:
                # orjson, straight from the bytes (no decoded copy of a page of 500 pods): a list of 10,000
                # nodes parses in a third of the standard library's time.
                return orjson.loads(data) if data else None
            except ValueError as exc:
                raise KubeError(f"{doing}: the API server answered something that is not JSON") from exc

        return self.retry.call(once, deadline=deadline)

    @property
    def host(self) -> str:
        """The API server's URL, as the kubeconfig gave it."""
        return str(getattr(self.api_client.configuration, "host", "") or "(no server)")

    # --- verbs ----------------------------------------------------------------------------------------

    def version(self, *, within_s: float = 10.0) -> dict[str, Any]:
        """The server's ``/version`` (which every client may read), asked within ``within_s`` at most: what a
        command asks before any work, so that a server that is down or never answers fails it in seconds."""
        return dict(self.request("GET", "/version", doing="read the server's version", deadline_s=within_s))

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        """The object; raises :class:`KubeNotFound` when it does not exist."""
        path = resource_of(api_version, kind).path(namespace, name)
        return dict(self.request("GET", path, doing=f"get {_named(kind, name, namespace)}"))

    def find(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            return self.get(api_version, kind, name, namespace)
        except KubeNotFound:
            return None

    def list_objects(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        """Every matching object (all namespaces when ``namespace`` is None), paged by ``limit``/``continue``."""
        return list(
            self.iter_objects(
                api_version, kind, namespace, label_selector=label_selector, field_selector=field_selector
            )
        )

    def iter_objects(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Iterator[dict[str, Any]]:
        """:meth:`list_objects`, one page in memory at a time: for a scan of every pod of a fleet (50,000
        at 10,000 nodes, over a gigabyte parsed at once), whose objects the caller does not keep."""
        res = resource_of(api_version, kind)
        selectors = {"labelSelector": label_selector, "fieldSelector": field_selector}
        token: str | None = None
        while True:
            query = {**selectors, "limit": _PAGE, "continue": token}
            page = self.request("GET", res.path(namespace), doing=f"list {res.plural}", query=query)
            yield from page.get("items") or ()
            token = (page.get("metadata") or {}).get("continue") or None
            if not token:
                return

    def apply(self, obj: Mapping[str, Any], *, before: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Server-side apply of ``obj`` (forcing ownership of its fields); returns the object as stored.

        Applying what is already there writes nothing, so its ``resourceVersion`` stays put; ``before`` (the
        object as the caller read it) lets the observers tell such an apply from a change.
        """
        res = resource_of(str(obj.get("apiVersion")), str(obj.get("kind")))
        name, namespace = obj["metadata"]["name"], obj["metadata"].get("namespace")
        stored = self._write("PATCH", res.path(namespace, name), f"apply {describe(obj)}", obj, _APPLY, force="true")
        self._changed(KubeChange("apply", res.api_version, res.kind, name, namespace, obj, before, stored))
        return stored

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Create ``obj``; raises :class:`KubeConflict` when it exists."""
        res = resource_of(str(obj.get("apiVersion")), str(obj.get("kind")))
        namespace = (obj.get("metadata") or {}).get("namespace")
        stored = self._write("POST", res.path(namespace), f"create {describe(obj)}", obj)
        name = str((stored.get("metadata") or {}).get("name") or (obj.get("metadata") or {}).get("name"))
        self._changed(KubeChange("create", res.api_version, res.kind, name, namespace, obj, result=stored))
        return stored

    def merge_patch(
        self,
        api_version: str,
        kind: str,
        name: str,
        patch: Mapping[str, Any],
        namespace: str | None = None,
        *,
        before: Mapping[str, Any] | None = None,
        why: str | None = None,
    ) -> dict[str, Any]:
        """JSON merge patch (RFC 7386): ``None`` deletes a key. Returns the patched object. ``before``: the
        object as the caller read it, for the observers (what the patch changed); ``why``: the reason the
        observers record for it (the audit trail)."""
        return self._patch("patch", api_version, kind, name, namespace, patch, before=before, why=why)

    def patch_status(
        self, api_version: str, kind: str, name: str, patch: Mapping[str, Any], namespace: str | None = None
    ) -> dict[str, Any]:
        """Strategic merge patch of the ``status`` subresource: a list keyed by the API's merge key
        (``conditions`` by ``type``) keeps the entries the patch does not name, so writing one condition
        never drops the kubelet's. Returns the patched object."""
        return self._patch("patch_status", api_version, kind, name, namespace, patch)

    def _patch(
        self,
        verb: str,
        api_version: str,
        kind: str,
        name: str,
        namespace: str | None,
        patch: Mapping[str, Any],
        *,
        before: Mapping[str, Any] | None = None,
        why: str | None = None,
    ) -> dict[str, Any]:
        res = resource_of(api_version, kind)
        status = verb == "patch_status"
        path = res.path(namespace, name, "status" if status else None)
        doing = f"{'patch the status of' if status else 'patch'} {_named(kind, name, namespace)}"
        stored = self._write("PATCH", path, doing, patch, _STRATEGIC if status else _MERGE)
        self._changed(KubeChange(verb, res.api_version, res.kind, name, namespace, patch, before, stored, why))
        return stored

    def _write(
        self, method: str, path: str, doing: str, body: Mapping[str, Any], content_type: str | None = None, **query: str
    ) -> dict[str, Any]:
        """A write under gpucert's field manager (``query``: more parameters); returns the object as stored."""
        query = {"fieldManager": FIELD_MANAGER, **query}
        return dict(self.request(method, path, doing=doing, query=query, body=dict(body), content_type=content_type))

    def delete(
        self, api_version: str, kind: str, name: str, namespace: str | None = None, *, propagation: str = "Background"
    ) -> bool:
        """Delete the object; True when it was there, False when it was already gone."""
        res = resource_of(api_version, kind)
        try:
            self.request(
                "DELETE",
                res.path(namespace, name),
                doing=f"delete {_named(kind, name, namespace)}",
                body={"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": propagation},
            )
        except KubeNotFound:
            return False
        self._changed(KubeChange("delete", res.api_version, res.kind, name, namespace, None))
        return True

    # --- nodes and pods -------------------------------------------------------------------------------

    def nodes(self, label_selector: str | None = None) -> list[dict[str, Any]]:
        """Every Node matching ``label_selector``."""
        return self.list_objects("v1", "Node", label_selector=label_selector)

    def label_node(
        self, name: str, labels: Mapping[str, str | None], *, before: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        """Set (or, with None, remove) labels on a node; returns the node."""
        return self.merge_patch("v1", "Node", name, {"metadata": {"labels": dict(labels)}}, before=before)

    def pod_log(self, name: str, namespace: str, *, container: str | None = None) -> str:
        """The log of a pod's container (the first one unless named)."""
        path = resource_of("v1", "Pod").path(namespace, name, "log")
        doing = f"read the log of Pod {namespace}/{name}"
        return str(self.request("GET", path, doing=doing, query={"container": container}, accept="*/*"))
