"""The verbs of the generic resource path: list, get, create, replace, patch, apply, delete.

Each takes a parsed request (which resource, namespace, name and subresource; the query; the decoded body)
and returns the body to send, so the same code serves every kind in the resource table. Only HTTP
framing (routing, content types, streaming) lives in ``_api.py``.

What a real API server does that the simulator does too: the spec/status split (a main-resource write
keeps the stored status; a ``/status`` write changes only status), identity checks between URL and body,
name validation (422), a few rules of object validation (422, :mod:`gpucert_sim._validation`), field
validation of unknown fields (Warn by default, Strict → 400, Ignore), and server-side apply that creates a
missing object and writes nothing when the result is unchanged. Every write keeps per-field ownership in
``managedFields`` (:mod:`gpucert_sim._fields`): an apply files its fields under its manager's Apply entry,
removes a field it applied before and no longer applies unless another manager owns it, and answers 409
Conflict where it would change another manager's field, unless ``force=true`` takes the field over; a
create, update or patch files the fields it changes under an Update entry of its ``fieldManager`` (else
of its User-Agent's product, ``OpenAPI-Generator`` for the official client) and takes them from the rest.
Limits: field validation knows top-level and ``metadata`` fields only (deeper unknown fields are stored
as sent); apply merges like a strategic merge patch, and ownership is read off the object with no schema
(see ``_fields.py``); ``dryRun`` is not supported.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ._fields import track_apply, track_update
from ._patch import json_patch, merge_patch, strategic_merge_patch
from ._resources import ResourceType
from ._selectors import parse_selectors
from ._status import ApiError, bad_request, invalid, not_found
from ._store import Obj, Store
from ._validation import validate

__all__ = ["PATCH_TYPES", "Reply", "Target", "Verbs"]

#: The kinds whose real strategy allows create-on-update (a PUT of a missing object creates it); the others
#: answer 404. Read off a real kube-apiserver v1.36 (tests/test_conformance.py, put_of_a_missing_object).
_CREATE_ON_UPDATE = frozenset(
    {
        ("coordination.k8s.io", "leases"),
        ("", "endpoints"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("rbac.authorization.k8s.io", "clusterroles"),
        ("rbac.authorization.k8s.io", "clusterrolebindings"),
    }
)

PATCH_TYPES = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
    "application/apply-patch+yaml": "apply",
}
_KNOWN_METADATA = frozenset(
    {
        "name",
        "generateName",
        "namespace",
        "selfLink",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "labels",
        "annotations",
        "ownerReferences",
        "finalizers",
        "managedFields",
    }
)
# What a real server resets status to on create (its strategies' PrepareForCreate); the official
# client refuses a DaemonSetStatus without its four counters, so they are spelled out.
_INITIAL_STATUS: dict[str, dict[str, Any]] = {
    "Pod": {"phase": "Pending"},
    "Namespace": {"phase": "Active"},
    "Service": {"loadBalancer": {}},
    "DaemonSet": {"currentNumberScheduled": 0, "desiredNumberScheduled": 0, "numberMisscheduled": 0, "numberReady": 0},
    "Job": {},
}
_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_FIELD_VALIDATION = ("Ignore", "Warn", "Strict")


@dataclass(frozen=True)
class Target:
    """Which objects a request addresses, parsed from its path."""

    resource: ResourceType
    namespace: str | None
    name: str | None
    sub: str | None


@dataclass
class Reply:
    """A JSON body to send, its status code, and ``Warning`` headers."""

    body: Any
    code: int = 200
    warnings: tuple[str, ...] = ()


def _name_error(resource: ResourceType, name: str) -> str | None:
    """The validation message for a bad object name, as apimachinery words it; None when valid."""
    if resource.group == "rbac.authorization.k8s.io":
        bad = name in (".", "..") or "/" in name or "%" in name
        return 'may not contain "/" or "%", or be "." or ".."' if bad else None
    if resource.kind in ("Namespace", "Service"):
        if len(name) <= 63 and _LABEL.match(name):
            return None
        return (
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', "
            "and must start and end with an alphanumeric character"
        )
    if len(name) <= 253 and _SUBDOMAIN.match(name):
        return None
    return (
        "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
        "and must start and end with an alphanumeric character"
    )


def _metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise bad_request("metadata must be an object")
    return meta


class Verbs:
    """The generic verbs over one :class:`Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    # --- reading ------------------------------------------------------------------------------------

    def get(self, target: Target) -> Reply:
        obj = self._existing(target)
        return Reply(obj)

    def list(self, target: Target, query: Mapping[str, str]) -> Reply:
        resource = target.resource
        selector = parse_selectors(query.get("labelSelector"), query.get("fieldSelector"), resource)
        start = _decode_continue(query["continue"]) if query.get("continue") else None
        limit = _int_param(query, "limit")
        page = self.store.page(resource, target.namespace, selector=selector, after=start, limit=limit)
        meta: dict[str, Any] = {"resourceVersion": str(page.rv)}
        if page.more:
            meta["continue"] = _encode_continue(_sort_key(page.items[-1]))
            if page.remaining is not None:  # the API server counts what is left only without selectors
                meta["remainingItemCount"] = page.remaining
        return Reply(
            {"kind": f"{resource.kind}List", "apiVersion": resource.api_version, "metadata": meta, "items": page.items}
        )

    def log(self, target: Target, query: Mapping[str, str]) -> str:
        pod = self._existing(target)
        names = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
        container = query.get("container")
        if container is None and len(names) > 1:
            raise bad_request(
                f"a container name must be specified for pod {target.name}, "
                f"choose one of: [{' '.join(str(n) for n in names)}]"
            )
        if container is not None and names and container not in names:
            raise bad_request(f"container {container} is not valid for pod {target.name}")
        text = self.store.get_log(target.namespace or "", target.name or "", container)
        tail = _int_param(query, "tailLines")
        if tail is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-tail:]) if tail else ""
        limit = _int_param(query, "limitBytes")
        return text[:limit] if limit else text

    # --- writing ------------------------------------------------------------------------------------

    def create(self, target: Target, query: Mapping[str, str], body: Any, *, agent: str = "") -> Reply:
        resource = target.resource
        obj = self._identity(target, body, creating=True)
        obj, warnings = _prune(resource, obj, query)
        meta = _metadata(obj)
        if not meta.get("name") and not meta.get("generateName"):
            raise invalid(
                resource.kind,
                resource.group,
                "",
                "metadata.name",
                "FieldValueRequired",
                "Required value: name or generateName is required",
            )
        if meta.get("name"):
            self._check_name(resource, meta["name"])
        validate(resource, obj)
        obj = track_update(resource, None, None, obj, _manager(query, agent))
        if resource.kind in _INITIAL_STATUS:
            obj = {**obj, "status": dict(_INITIAL_STATUS[resource.kind])}
        stored = self.store.create(resource, obj)
        if not meta.get("name"):
            self._check_name(resource, stored["metadata"]["name"])
        return Reply(stored, 201, warnings)

    def replace(self, target: Target, query: Mapping[str, str], body: Any, *, agent: str = "") -> Reply:
        resource = target.resource
        obj = self._identity(target, body, creating=False)
        obj, warnings = _prune(resource, obj, query)
        with self.store.lock:
            if (
                target.sub is None
                and (resource.group, resource.plural) in _CREATE_ON_UPDATE
                and self.store.get(resource, target.namespace, target.name or "") is None
            ):
                # What these kinds' strategies allow: a PUT of a missing object creates it (even with a
                # resourceVersion in the body, which a renewal of a deleted Lease carries).
                meta = {k: v for k, v in _metadata(obj).items() if k != "resourceVersion"}
                created = self.create(
                    dataclasses.replace(target, name=None), query, {**obj, "metadata": meta}, agent=agent
                )
                return Reply(created.body, 201, (*warnings, *created.warnings))
            current = self._existing(target)
            new = self._split(target, current, obj)
            new = track_update(resource, target.sub, current, new, _manager(query, agent))
            self._validate(target, new)
            return Reply(
                self.store.update(resource, new, expect_rv=_metadata(obj).get("resourceVersion")), 200, warnings
            )

    def patch(self, target: Target, query: Mapping[str, str], kind: str, patch: Any, *, agent: str = "") -> Reply:
        if kind == "apply":
            return self._apply(target, query, patch)
        resource = target.resource
        with self.store.lock:
            current = self._existing(target)
            if kind == "json":
                patched = json_patch(current, patch)
            elif not isinstance(patch, Mapping):
                raise bad_request(f"{kind} patch must be a JSON object")
            else:
                patched = (merge_patch if kind == "merge" else strategic_merge_patch)(current, patch)
            if not isinstance(patched, dict):
                raise ApiError(422, "the patched object is not a JSON object")
            self._immutable(target, current, patched)
            patched, warnings = _prune(resource, patched, query)
            new = self._split(target, current, patched)
            new = track_update(resource, target.sub, current, new, _manager(query, agent))
            self._validate(target, new)
            expect = _metadata(patched).get("resourceVersion")
            return Reply(self.store.update(resource, new, expect_rv=expect), 200, warnings)

    def delete(self, target: Target, query: Mapping[str, str], body: Any) -> Reply:
        resource = target.resource
        options = body if isinstance(body, Mapping) else {}
        propagation = query.get("propagationPolicy") or options.get("propagationPolicy") or "Background"
        if options.get("orphanDependents") is True:
            propagation = "Orphan"
        pre = options.get("preconditions") or {}
        if target.name is None:
            return self._delete_collection(target, query, propagation)
        obj, pending = self.store.delete(
            resource,
            target.namespace,
            target.name,
            propagation=propagation,
            expect_uid=pre.get("uid"),
            expect_rv=pre.get("resourceVersion"),
        )
        if pending or resource.returns_deleted_object:
            return Reply(obj)
        return Reply(_success(resource, obj))

    # --- helpers ------------------------------------------------------------------------------------

    def _existing(self, target: Target) -> Obj:
        obj = self.store.get(target.resource, target.namespace, target.name or "")
        if obj is None:
            raise not_found(target.resource.group, target.resource.plural, target.name or "")
        return obj

    def _delete_collection(self, target: Target, query: Mapping[str, str], propagation: str) -> Reply:
        resource = target.resource
        selector = parse_selectors(query.get("labelSelector"), query.get("fieldSelector"), resource)
        gone = []
        for obj in self.store.page(resource, target.namespace, selector=selector).items:
            if selector.matches(obj):
                meta = obj["metadata"]
                if self.store.get(resource, meta.get("namespace"), meta["name"]) is not None:
                    gone.append(
                        self.store.delete(resource, meta.get("namespace"), meta["name"], propagation=propagation)[0]
                    )
        return Reply(
            {
                "kind": f"{resource.kind}List",
                "apiVersion": resource.api_version,
                "metadata": {"resourceVersion": str(self.store.resource_version)},
                "items": gone,
            }
        )

    def _check_name(self, resource: ResourceType, name: str) -> None:
        problem = _name_error(resource, name)
        if problem:
            raise invalid(
                resource.kind,
                resource.group,
                name,
                "metadata.name",
                "FieldValueInvalid",
                f'Invalid value: "{name}": {problem}',
            )

    def _identity(self, target: Target, body: Any, *, creating: bool) -> dict[str, Any]:
        """The body as an object of the URL's kind, namespace and name; 400 where they disagree."""
        resource = target.resource
        if not isinstance(body, dict):
            raise bad_request("the body of the request must be a JSON object")
        api_version, kind = body.get("apiVersion"), body.get("kind")
        if api_version and api_version != resource.api_version:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected "
                f"API version ({resource.api_version})"
            )
        if kind and kind != resource.kind:
            raise bad_request(f"the kind in the data ({kind}) does not match the expected kind ({resource.kind})")
        meta = dict(_metadata(body))
        if resource.namespaced:
            if meta.get("namespace") and meta["namespace"] != target.namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            meta["namespace"] = target.namespace
        else:
            meta.pop("namespace", None)
        if not creating:
            if meta.get("name") and meta["name"] != target.name:
                raise bad_request(
                    f"the name of the object ({meta['name']}) does not match the name on the URL ({target.name})"
                )
            meta["name"] = target.name
        return {**body, "apiVersion": resource.api_version, "kind": resource.kind, "metadata": meta}

    @staticmethod
    def _validate(target: Target, new: Obj) -> None:
        # A status write is checked for its status only on a real server: the spec it keeps was checked.
        if target.sub != "status":
            validate(target.resource, new)

    def _immutable(self, target: Target, current: Obj, patched: Obj) -> None:
        before, after = current["metadata"], _metadata(patched)
        for key in ("name", "namespace", "uid"):
            if after.get(key) != before.get(key):
                raise invalid(
                    target.resource.kind,
                    target.resource.group,
                    target.name or "",
                    f"metadata.{key}",
                    "FieldValueInvalid",
                    "field is immutable",
                )

    def _split(self, target: Target, current: Obj, new: Obj) -> Obj:
        """Apply the spec/status split: which part of ``new`` a write through ``target`` may change."""
        if target.sub == "status":
            # The real status strategies reset the spec (and a pod's owner references and deletion stamp),
            # not the rest of the metadata: labels and annotations written through /status are kept.
            meta = {**current["metadata"]}
            for key in ("labels", "annotations"):
                if key in new.get("metadata", {}):
                    meta[key] = new["metadata"][key]
            return {**current, "metadata": meta, "status": new.get("status")}
        if target.resource.has_status:
            kept = {k: v for k, v in new.items() if k != "status"}
            if "status" in current:
                kept["status"] = current["status"]
            return kept
        return new

    def _apply(self, target: Target, query: Mapping[str, str], body: Any) -> Reply:
        resource = target.resource
        manager = query.get("fieldManager")
        if not manager:
            raise bad_request("PATCH with apply requires a fieldManager parameter")
        force = query.get("force", "").lower() in ("1", "t", "true")  # Go's ParseBool, as the server reads it
        obj = self._identity(target, body, creating=False)
        obj, warnings = _prune(resource, obj, query)
        with self.store.lock:
            current = self.store.get(resource, target.namespace, target.name or "")
            if current is None:
                if target.sub:
                    raise not_found(resource.group, resource.plural, target.name or "")
                self._check_name(resource, target.name or "")
                validate(resource, obj)
                fresh = track_apply(resource, None, None, obj, dict(obj), manager, force=force)
                if resource.kind in _INITIAL_STATUS:
                    fresh["status"] = dict(_INITIAL_STATUS[resource.kind])
                return Reply(self.store.create(resource, fresh), 201, warnings)
            patch = {**obj, "metadata": {k: v for k, v in obj["metadata"].items() if k != "managedFields"}}
            merged = strategic_merge_patch(current, patch)
            merged = self._split(target, current, merged)
            # Unchanged fields and ownership leave it equal to ``current``: the store writes nothing then.
            merged = track_apply(resource, target.sub, current, patch, merged, manager, force=force)
            self._validate(target, merged)
            expect = _metadata(obj).get("resourceVersion")
            return Reply(self.store.update(resource, merged, expect_rv=expect), 200, warnings)


def _manager(query: Mapping[str, str], agent: str) -> str:
    """The field manager of a write that is not an apply: ``fieldManager``, else what the API server takes
    from the User-Agent, its product (``OpenAPI-Generator`` of ``OpenAPI-Generator/31.0.0/python``)."""
    return query.get("fieldManager") or agent.split("/", 1)[0]


def _success(resource: ResourceType, obj: Obj) -> dict[str, Any]:
    meta = obj["metadata"]
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": meta["name"], "group": resource.group, "kind": resource.plural, "uid": meta["uid"]},
    }


def _prune(
    resource: ResourceType, obj: dict[str, Any], query: Mapping[str, str]
) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Field validation: drop unknown top-level and metadata fields (Warn/Ignore) or refuse (Strict)."""
    mode = query.get("fieldValidation") or "Warn"
    if mode not in _FIELD_VALIDATION:
        raise bad_request(f"fieldValidation must be one of {', '.join(_FIELD_VALIDATION)}, got {mode!r}")
    meta = _metadata(obj)
    unknown = [k for k in obj if k not in resource.known_fields]
    unknown_meta = [k for k in meta if k not in _KNOWN_METADATA]
    if not unknown and not unknown_meta:
        return obj, ()
    names = [*unknown, *(f"metadata.{k}" for k in unknown_meta)]
    if mode == "Strict":
        raise bad_request("strict decoding error: " + ", ".join(f'unknown field "{n}"' for n in names))
    pruned = {k: v for k, v in obj.items() if k not in unknown}
    if unknown_meta:
        pruned["metadata"] = {k: v for k, v in meta.items() if k not in unknown_meta}
    warnings = tuple(f'unknown field "{n}"' for n in names) if mode == "Warn" else ()
    return pruned, warnings


def _sort_key(obj: Obj) -> tuple[str, str]:
    meta = obj["metadata"]
    return (meta.get("namespace", ""), meta["name"])


def _encode_continue(key: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(orjson.dumps({"start": list(key)})).decode()


def _decode_continue(token: str) -> tuple[str, str]:
    try:
        start = orjson.loads(base64.urlsafe_b64decode(token.encode()))["start"]
        return (str(start[0]), str(start[1]))
    except (binascii.Error, orjson.JSONDecodeError, KeyError, IndexError, TypeError, ValueError) as exc:
        raise bad_request("continue key is not valid: incorrect encoded start resourceVersion") from exc


def _int_param(query: Mapping[str, str], name: str) -> int | None:
    raw = query.get(name)
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError as exc:
        raise bad_request(f"invalid value for {name}: {raw!r}") from exc
    if value < 0:
        raise bad_request(f"{name} must be >= 0")
    return value
