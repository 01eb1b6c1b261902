"""The HTTP surface: routing, discovery, content types, Status errors and API faults, on aiohttp.

Kubernetes paths are parsed by hand rather than by route patterns, because ``/api/v1/namespaces/x`` is a
Namespace while ``/api/v1/namespaces/x/pods`` is a collection in it; one parser that knows the resource
table tells them apart. Every failure leaves as a ``Status`` body: an :class:`ApiError` with its code,
and anything unexpected as a 500 ``InternalError`` (logged), never a bare traceback or a hung request.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
import yaml
from aiohttp import web

from gpucert._yaml import UniqueKeyLoader
from gpucert.errors import InputError

from ._faults import ApiFaults, FaultInjector
from ._kubelet import log_refusal
from ._requests import RequestLog, bearer_user, request_info
from ._resources import api_group, api_group_list, api_resource_list, api_versions, lookup, version_info
from ._status import ApiError, bad_request, status_body
from ._store import Store
from ._verbs import PATCH_TYPES, Reply, Target, Verbs
from ._watch import serve_watch

__all__ = ["FAULTS_PATH", "REQUESTS_PATH", "build_app"]

FAULTS_PATH = "/gpucert/faults"
#: The request log (``_requests.py``): GET lists it as JSON, DELETE clears it.
REQUESTS_PATH = "/gpucert/requests"
#: Paths that are not the Kubernetes API (control endpoints, DCGM exporters): API faults leave them alone.
_NOT_KUBERNETES = ("/gpucert/", "/dcgm/")
_LOG = logging.getLogger("gpucert_sim")
_NOT_FOUND = "the server could not find the requested resource"
_MAX_BODY = 64 * 1024 * 1024
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _json(body: Any, code: int = 200, warnings: tuple[str, ...] = ()) -> web.Response:
    response = web.Response(body=orjson.dumps(body), status=code, content_type="application/json")
    for warning in warnings:
        # RFC 7234 warn-code 299 with a quoted text, as the API server writes it.
        response.headers.add("Warning", f"299 - {orjson.dumps(warning).decode()}")
    return response


def _error(exc: ApiError) -> web.Response:
    response = _json(exc.body(), exc.code)
    response.headers.update(exc.headers)
    return response


@web.middleware
async def _status_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        return _error(exc)
    except web.HTTPException as exc:  # aiohttp's own (no route, method not allowed): still a Status
        reason = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status, "BadRequest")
        message = _NOT_FOUND if exc.status == 404 else exc.reason
        return _json(status_body(exc.status, reason, message), exc.status)
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        _LOG.exception("simulated API server: unhandled error on %s %s", request.method, request.path)
        return _json(status_body(500, "InternalError", f"Internal error occurred: {exc}"), 500)


def _fault_middleware(faults: FaultInjector) -> Any:
    @web.middleware
    async def inject(request: web.Request, handler: Handler) -> web.StreamResponse:
        # The simulator's own endpoints are never faulted; with no faults, nothing to parse.
        if request.path.startswith(_NOT_KUBERNETES) or not faults.policy.active:
            return await handler(request)
        info = request_info(
            request.method, request.path, request.query, bearer_user(request.headers.get("Authorization"))
        )
        decision = faults.decide(resource_request=info.resource_request)
        if decision.latency_s:
            await asyncio.sleep(decision.latency_s)
        if decision.status == 429:
            raise ApiError(
                429,
                "Too many requests, please try again later.",
                details={"retryAfterSeconds": decision.retry_after_s},
                headers={"Retry-After": str(decision.retry_after_s)},
            )
        if decision.status == 500:
            raise ApiError(500, "Internal error occurred: injected by gpucert sim")
        if decision.status == 403:
            # The API server's wording (an RBAC denial), so a client's message reads as on a real cluster.
            scope = f'in the namespace "{info.namespace}"' if info.namespace else "at the cluster scope"
            raise ApiError(
                403,
                f'{info.combined_resource} is forbidden: User "{info.user or "system:anonymous"}" '
                f'cannot {info.verb} resource "{info.combined_resource}" in API group '
                f'"{info.group}" {scope}: injected by gpucert sim',
            )
        return await handler(request)

    return inject


def _recording_middleware(log: RequestLog) -> Any:
    @web.middleware
    async def record(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path.startswith(_NOT_KUBERNETES):  # not the Kubernetes API: nothing to authorize
            return await handler(request)
        # Recorded on arrival, so a watch that stays open is in the log while it runs.
        info = request_info(
            request.method, request.path, request.query, bearer_user(request.headers.get("Authorization"))
        )
        log.add(info)
        response = await handler(request)
        if info.verb == "patch" and response.status == 201:
            # An apply that created its object: the API server checks ``create`` too (_requests.py).
            log.add(info._replace(verb="create"))
        return response

    return record


class _Routes:
    """Request handlers bound to one store and fault injector."""

    def __init__(self, store: Store, faults: FaultInjector, bookmark_interval_s: float) -> None:
        self.store = store
        self.verbs = Verbs(store)
        self.faults = faults
        self.bookmark_interval_s = bookmark_interval_s

    # --- discovery ----------------------------------------------------------------------------------

    async def version(self, request: web.Request) -> web.Response:
        return _json(version_info())

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def api_root(self, request: web.Request) -> web.Response:
        return _json(api_versions(request.host))

    async def apis_root(self, request: web.Request) -> web.Response:
        return _json(api_group_list())

    # --- resources ----------------------------------------------------------------------------------

    async def core(self, request: web.Request) -> web.StreamResponse:
        parts = _segments(request.match_info["tail"])
        if not parts:
            return _json(api_versions(request.host))
        if len(parts) == 1:
            return _json(_found(api_resource_list("", parts[0])))
        return await self._resource(request, _target("", parts[0], parts[1:]))

    async def groups(self, request: web.Request) -> web.StreamResponse:
        parts = _segments(request.match_info["tail"])
        if not parts:
            return _json(api_group_list())
        if len(parts) == 1:
            return _json(_found(api_group(parts[0])))
        if len(parts) == 2:
            return _json(_found(api_resource_list(parts[0], parts[1])))
        return await self._resource(request, _target(parts[0], parts[1], parts[2:]))

    async def _resource(self, request: web.Request, target: Target) -> web.StreamResponse:
        method, query = request.method, request.query
        agent = request.headers.get("User-Agent", "")  # a write's field manager when it names none
        if method == "GET":
            if target.sub == "log":
                if not self._log_due(target, query.get("container")):
                    return web.Response(status=204)
                return web.Response(text=self.verbs.log(target, query), content_type="text/plain")
            if query.get("watch") in ("true", "1"):
                return await serve_watch(
                    request, target, self.store, self.faults, bookmark_interval_s=self.bookmark_interval_s
                )
            reply = self.verbs.get(target) if target.name else self.verbs.list(target, query)
            if "as=Table" in request.headers.get("Accept", ""):
                return _json(as_table(reply.body))
        elif target.sub == "log":
            raise ApiError(405, "the server does not allow this method on the requested resource")
        elif method == "POST" and target.name is None:
            reply = self.verbs.create(target, query, await _object_body(request), agent=agent)
        elif method == "PUT" and target.name is not None:
            reply = self.verbs.replace(target, query, await _object_body(request), agent=agent)
        elif method == "PATCH" and target.name is not None:
            kind, patch = await _patch_body(request)
            reply = self.verbs.patch(target, query, kind, patch, agent=agent)
        elif method == "DELETE" and target.sub is None:
            reply = self.verbs.delete(target, query, await _optional_body(request))
        else:
            raise ApiError(405, "the server does not allow this method on the requested resource")
        return _reply(reply)

    def _log_due(self, target: Target, container: str | None) -> bool:
        """Whether a pod's log can be read yet: a pod bound to no node answers 204 and nothing (the API
        server asks no kubelet); a container that has not started is the kubelet's 400 naming its wait."""
        pod = self.verbs.get(target).body
        if not (pod.get("spec") or {}).get("nodeName"):
            return False
        refusal = log_refusal(pod, container)
        if refusal is not None:
            raise bad_request(refusal)
        return True

    # --- faults -------------------------------------------------------------------------------------

    async def get_faults(self, request: web.Request) -> web.Response:
        return _json(self.faults.policy.to_mapping())

    async def set_faults(self, request: web.Request) -> web.Response:
        body = _decode_json(await request.read())
        if not isinstance(body, dict):
            raise bad_request("the fault policy must be a JSON object")
        try:
            self.faults.set(ApiFaults.from_mapping(body))
        except InputError as exc:
            raise bad_request(str(exc)) from exc
        return _json(self.faults.policy.to_mapping())

    async def clear_faults(self, request: web.Request) -> web.Response:
        self.faults.clear()
        return _json(self.faults.policy.to_mapping())


def as_table(body: dict[str, Any]) -> dict[str, Any]:
    """A ``meta.k8s.io/v1`` Table of an object or a list, with the columns the API server gives a kind it
    has no printer for (Name, Created At): what ``kubectl get`` asks for, and prints."""
    items = body.get("items") if "items" in body else [body]
    rows = [
        {
            "cells": [(o.get("metadata") or {}).get("name"), (o.get("metadata") or {}).get("creationTimestamp")],
            "object": {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": o.get("metadata") or {},
            },
        }
        for o in items or ()
    ]
    columns = [
        {
            "name": "Name",
            "type": "string",
            "format": "name",
            "description": "Name must be unique within a namespace.",
            "priority": 0,
        },
        {
            "name": "Created At",
            "type": "date",
            "format": "",
            "description": "CreationTimestamp is a "
            "timestamp representing the server time when this object was created.",
            "priority": 0,
        },
    ]
    meta = {k: v for k, v in (body.get("metadata") or {}).items() if k in ("resourceVersion", "continue")}
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": meta if "items" in body else {},
        "columnDefinitions": columns,
        "rows": rows,
    }


def _reply(reply: Reply) -> web.Response:
    return _json(reply.body, reply.code, reply.warnings)


def _segments(tail: str) -> list[str]:
    return [p for p in tail.split("/") if p]


def _found(document: dict[str, Any] | None) -> dict[str, Any]:
    if document is None:
        raise ApiError(404, _NOT_FOUND, details={})
    return document


def _target(group: str, version: str, rest: list[str]) -> Target:
    """Which resource, namespace, name and subresource a path below a group version addresses."""
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        inner = lookup(group, version, rest[2])
        if inner is not None and inner.namespaced:
            namespace, rest = rest[1], rest[2:]
    if len(rest) > 3:
        raise ApiError(404, _NOT_FOUND, details={})
    resource = lookup(group, version, rest[0])
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    if resource is None or (sub is not None and sub not in resource.subresources):
        raise ApiError(404, _NOT_FOUND, details={})
    if resource.namespaced and namespace is None and name is not None:
        raise ApiError(404, _NOT_FOUND, details={})
    return Target(resource, namespace, name, sub)


def _decode_json(raw: bytes) -> Any:
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"couldn't get version/kind; json parse error: {exc}") from exc


async def _object_body(request: web.Request) -> Any:
    """A create/replace body: JSON (also when no Content-Type is sent, as a real server reads it) or YAML."""
    content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    raw = await request.read()
    if content_type in ("", "application/json", "*/*"):
        return _decode_json(raw)
    if content_type in ("application/yaml", "application/x-yaml"):
        return _decode_yaml(raw)
    raise ApiError(
        415,
        "the body of the request was in an unknown format - accepted media types include: "
        "application/json, application/yaml",
    )


async def _optional_body(request: web.Request) -> Any:
    raw = await request.read()
    return _decode_json(raw) if raw.strip() else None


async def _patch_body(request: web.Request) -> tuple[str, Any]:
    content_type = request.headers.get("Content-Type", "").split(";")[0].strip().lower()
    kind = PATCH_TYPES.get(content_type)
    if kind is None:
        raise ApiError(
            415,
            "the body of the request was in an unknown format - accepted media types include: "
            + ", ".join(PATCH_TYPES),
        )
    raw = await request.read()
    return kind, (_decode_yaml(raw) if kind == "apply" else _decode_json(raw))


def _decode_yaml(raw: bytes) -> Any:
    try:
        # The project's loader: an alias bomb posted to the simulator is refused, not expanded.
        return yaml.load(raw, Loader=UniqueKeyLoader)
    except yaml.YAMLError as exc:  # an AliasBomb is one
        raise bad_request(f"error decoding YAML: {exc}") from exc


def build_app(
    store: Store,
    faults: FaultInjector,
    *,
    bookmark_interval_s: float = 5.0,
    extra_routes: Sequence[tuple[str, str, Handler]] = (),
    request_log: RequestLog | None = None,
) -> web.Application:
    """The aiohttp application of one simulated API server; ``extra_routes``: (method, path, handler);
    ``request_log``, when given, records every API request (and is served at :data:`REQUESTS_PATH`)."""
    routes = _Routes(store, faults, bookmark_interval_s)
    # Recording outermost: a request an injected fault refuses was still asked for.
    recording = [] if request_log is None else [_recording_middleware(request_log)]
    app = web.Application(
        middlewares=[*recording, _status_errors, _fault_middleware(faults)], client_max_size=_MAX_BODY
    )
    add = app.router.add_route
    for path in ("/version", "/version/"):
        add("GET", path, routes.version)
    for path in ("/healthz", "/readyz", "/livez"):
        add("GET", path, routes.health)
    add("GET", "/api", routes.api_root)
    add("GET", "/apis", routes.apis_root)
    add("*", "/api/{tail:.*}", routes.core)
    add("*", "/apis/{tail:.*}", routes.groups)
    add("GET", FAULTS_PATH, routes.get_faults)
    add("POST", FAULTS_PATH, routes.set_faults)
    add("PUT", FAULTS_PATH, routes.set_faults)
    add("DELETE", FAULTS_PATH, routes.clear_faults)
    if request_log is not None:
        log = request_log

        async def list_requests(request: web.Request) -> web.Response:
            return _json({"dropped": log.dropped, "items": [r.to_dict() for r in log.entries()]})

        async def clear_requests(request: web.Request) -> web.Response:
            log.clear()
            return _json({"dropped": 0, "items": []})

        add("GET", REQUESTS_PATH, list_requests)
        add("DELETE", REQUESTS_PATH, clear_requests)
    for method, path, handler in extra_routes:
        add(method, path, handler)
    return app
