"""Patch semantics: JSON merge patch, strategic merge patch, JSON patch.

Strategic merge is what the official client sends for a dict body and kubectl for ``cordon``/``taint``.
Its meaning depends on the Go struct tags of each list: ``conditions`` merge by ``type``, ``containers``
by ``name``, ``finalizers`` are a set, while ``taints`` and ``tolerations`` carry no strategy and are
replaced whole. The simulator has no Go structs, so the tags of the fields the project touches are the
small table below, keyed by field name (the same name has the same tag wherever it appears in the kinds
served). Lists not in the table are replaced, as the real server does for atomic lists.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import jsonpatch

from ._status import ApiError, bad_request

__all__ = ["json_patch", "merge_keys", "merge_patch", "set_list", "strategic_merge_patch"]

# patchMergeKey of the list fields the project patches; ``ports`` is keyed by containerPort in a
# container and by port in a Service, so a list may name candidates, tried in order.
_MERGE_KEYS: dict[str, tuple[str, ...]] = {
    "conditions": ("type",),
    "containers": ("name",),
    "initContainers": ("name",),
    "ephemeralContainers": ("name",),
    "env": ("name",),
    "volumes": ("name",),
    "volumeMounts": ("mountPath",),
    "ports": ("containerPort", "port"),
    "ownerReferences": ("uid",),
    "imagePullSecrets": ("name",),
    "addresses": ("type",),
}
# patchStrategy:"merge" on a list of scalars: a set union.
_PRIMITIVE_MERGE = frozenset({"finalizers"})
_DELETE_FROM = "$deleteFromPrimitiveList/"


def merge_keys(field: str) -> tuple[str, ...] | None:
    """The merge key candidates of a list field; None for an atomic list. Server-side apply keys the
    items it owns by them too (:mod:`gpucert_sim._fields`)."""
    return _MERGE_KEYS.get(field)


def set_list(field: str) -> bool:
    """Whether a list field of scalars is a set (merged by union, owned value by value)."""
    return field in _PRIMITIVE_MERGE


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge recursively, ``null`` deletes, everything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """Kubernetes strategic merge patch for the fields in the merge-key table (see module docstring)."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if key.startswith(_DELETE_FROM):
            field = key[len(_DELETE_FROM) :]
            result[field] = [v for v in result.get(field) or [] if v not in value]
        elif key.startswith("$"):
            continue  # $setElementOrder, $retainKeys: ordering hints the simulator does not need
        elif value is None or (isinstance(value, Mapping) and value.get("$patch") == "delete"):
            result.pop(key, None)
        elif isinstance(value, list):
            result[key] = _merge_list(key, result.get(key), value)
        else:
            result[key] = strategic_merge_patch(result.get(key), value)
    return result


def _merge_list(field: str, current: Any, patch: list[Any]) -> list[Any]:
    live = list(current) if isinstance(current, list) else []
    if any(isinstance(i, Mapping) and i.get("$patch") == "replace" for i in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, Mapping) and "$patch" in i)]
    if field in _PRIMITIVE_MERGE:
        return live + [v for v in patch if v not in live]
    keys = _MERGE_KEYS.get(field)
    items = [i for i in patch if isinstance(i, Mapping)]
    if keys is None or len(items) != len(patch):
        return copy.deepcopy(patch)
    for item in items:
        key = next((k for k in keys if k in item), None)
        if key is None:
            raise ApiError(422, f"map: {dict(item)} does not contain declared merge key: {keys[0]}")
        at = next((i for i, old in enumerate(live) if isinstance(old, Mapping) and old.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del live[at]
        elif at is None:
            live.append(strategic_merge_patch({}, item))
        else:
            live[at] = strategic_merge_patch(live[at], item)
    return live


def json_patch(target: Mapping[str, Any], operations: Any) -> Any:
    """RFC 6902; a malformed patch is a 400, one that does not apply (missing path, failed test) a 422."""
    if not isinstance(operations, list):
        raise bad_request("json patch must be a list of operations")
    try:
        patch = jsonpatch.JsonPatch(operations)
        return patch.apply(copy.deepcopy(dict(target)))
    except jsonpatch.InvalidJsonPatch as exc:
        raise bad_request(f"invalid json patch: {exc}") from exc
    except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError, IndexError, TypeError) as exc:
        raise ApiError(422, f"the json patch does not apply: {exc}") from exc
