"""Field ownership, as server-side apply keeps it in ``metadata.managedFields``.

A real API server records, per field manager, the set of fields that manager last wrote
(structured-merge-diff), and the sets decide three things gpucert depends on: a field an applier stops
applying is removed from the object unless another manager owns it; an apply that would change a field
another manager owns is a 409 conflict unless forced (forcing takes the field over); a write that is not
an apply (create, update, patch) takes over the fields it changes, filed under an ``Update`` entry.

A field set is read off the object itself, in the ``FieldsV1`` encoding: a map's keys are fields
(``f:<name>``), a list of the merge-key table of :mod:`gpucert_sim._patch` is a set of items keyed by
their merge key (``k:{"name":"c"}``; the item is a member itself, ``.``, next to its fields),
``finalizers`` a set of values (``v:"x"``), any other list and a LabelSelector atomic: one field, owned
whole. An apply owns what its configuration names; a write that is not an apply owns what it changed,
which includes a map (a field of the ``_MAPS`` table) or keyed list it created. What a server sets
(``apiVersion``, ``kind``, name, namespace, uid, resourceVersion …) is owned by nobody, and a write owns
only the part its endpoint changes (status through ``/status``, the rest through the main resource).
Checked against a real kube-apiserver (ConfigMaps, DaemonSets, Nodes, Leases: the same entries but for the
fields it defaults, the same conflicts). Simplifications: no schema, so maps are told from structs by field
name and a map or struct an applier's removal empties goes with it unless someone owns it; an atomic
LabelSelector is still merged as a strategic merge patch merges it; an item is keyed by one merge key
(the real server adds ``protocol`` to a port's); a conflict's causes are in a fixed order (the real
server's follows a Go map); a set is not converted between API versions (the events.k8s.io view of core
Events files its own field names).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from ._patch import merge_keys, set_list
from ._resources import ResourceType
from ._status import ApiError
from ._store import Obj, now_rfc3339

__all__ = ["managed_fields_entry", "track_apply", "track_update"]

Path = tuple[str, ...]
_SERVER_SET = frozenset({"apiVersion", "kind"})
_SERVER_SET_META = frozenset(
    {
        "name",
        "namespace",
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "selfLink",
        "managedFields",
    }
)
#: The value of an item's or a map's own path (``.``): present on both sides, it is unchanged as such.
_PRESENT = ("present",)
#: Fields that are maps (``map[string]string`` and the like) rather than structs: a write that creates
#: one owns the map itself too (``.``), as the real server's comparison of old and new finds it added (so
#: does a write that creates a keyed list).
_MAPS = frozenset(
    {
        "labels",
        "annotations",
        "data",
        "binaryData",
        "stringData",
        "matchLabels",
        "nodeSelector",
        "selector",
        "capacity",
        "allocatable",
        "limits",
        "requests",
    }
)
#: LabelSelector is an atomic struct: owned whole, wherever it is (a Service's ``selector`` is a map).
_SELECTORS = frozenset({"selector", "labelSelector", "namespaceSelector"})
_SELECTOR_FIELDS = frozenset({"matchLabels", "matchExpressions"})


@dataclass
class _Owner:
    """One ``managedFields`` entry and its field set."""

    entry: dict[str, Any]
    fields: set[Path]

    @property
    def key(self) -> tuple[str, str, str]:
        # The real server's manager identifier: an Update entry per apiVersion is not modelled.
        e = self.entry
        return (str(e.get("manager") or ""), str(e.get("operation") or ""), str(e.get("subresource") or ""))

    def describe(self) -> str:
        """The manager as a conflict names it (apimachinery's printManager)."""
        text = orjson.dumps(str(self.entry.get("manager") or "")).decode()
        if self.entry.get("subresource"):
            text += f' with subresource "{self.entry["subresource"]}"'
        if self.entry.get("operation") == "Update":
            text += f" using {self.entry.get('apiVersion')}"
        return text


def managed_fields_entry(
    manager: str, resource: ResourceType, obj: Mapping[str, Any], *, operation: str = "Apply", sub: str | None = None
) -> dict[str, Any]:
    """The entry of a manager that wrote all of ``obj`` (what a preconfigured cluster is seeded with)."""
    return _entry(manager, operation, resource, sub, set(_values(resource, sub, obj, applied=operation == "Apply")))


def track_update(
    resource: ResourceType, sub: str | None, current: Obj | None, new: dict[str, Any], manager: str
) -> dict[str, Any]:
    """``new`` (a create, update or patch of ``current``) with the fields it changed filed under
    ``manager``'s Update entry and taken from every other manager; its managedFields as they were when
    it changes nothing."""
    owners = _owners(current)
    before, after = _values(resource, sub, current or {}), _values(resource, sub, new)
    changed, removed = _diff(before, after)
    if not changed and not removed:
        return _with_entries(new, current, None)
    me = (manager, "Update", sub or "")
    for owner in owners:
        if owner.key != me:
            owner.fields -= changed | removed
    mine = next((o for o in owners if o.key == me), None)
    fields = ((mine.fields if mine else set()) - removed) | changed
    entry = _entry(manager, "Update", resource, sub, fields)
    return _with_entries(new, current, _replace(owners, mine, _Owner(entry, fields)))


def track_apply(
    resource: ResourceType,
    sub: str | None,
    current: Obj | None,
    config: Mapping[str, Any],
    merged: dict[str, Any],
    manager: str,
    *,
    force: bool,
) -> dict[str, Any]:
    """``merged`` (``config`` merged into ``current``) as server-side apply leaves it: what ``manager``
    applied last time and no longer applies removed unless another manager owns it, ``manager``'s Apply
    entry the fields of ``config``. A change to a field another manager owns is a 409 conflict unless
    ``force``, which takes the field over."""
    owners = _owners(current)
    me = (manager, "Apply", sub or "")
    mine = next((o for o in owners if o.key == me), None)
    applied = set(_values(resource, sub, config, applied=True))
    kept = applied.union(*(o.fields for o in owners if o is not mine))
    dropped = (mine.fields if mine else set()) - kept
    result = _remove(merged, dropped, kept) if dropped else merged
    changed, removed = _diff(_values(resource, sub, current or {}), _values(resource, sub, result))
    conflicts = sorted(
        ((o, p) for o in owners if o is not mine for p in o.fields & changed), key=lambda c: (c[0].key, c[1])
    )
    if conflicts and not force:
        raise _conflict(conflicts)
    for owner in owners:
        if owner is not mine:
            owner.fields -= changed | removed
    if mine is not None and mine.fields == applied and not changed and not removed:
        entry = mine.entry  # nothing written: the entry keeps its time, and the object its resourceVersion
    else:
        entry = _entry(manager, "Apply", resource, sub, applied)
    return _with_entries(result, current, _replace(owners, mine, _Owner(entry, applied)))


# --- field sets -------------------------------------------------------------------------------------


def _values(
    resource: ResourceType, sub: str | None, obj: Mapping[str, Any], *, applied: bool = False
) -> dict[Path, Any]:
    """Every field of ``obj`` a write through ``sub`` can own, with its value. ``applied``: the fields of an
    apply's configuration, which name a map's keys but not the map (what the real server records)."""
    out: dict[Path, Any] = {}
    for name, value in obj.items():
        if name in _SERVER_SET or value is None or name.startswith("$"):
            continue
        if sub == "status" and name != "status":
            continue
        if sub != "status" and name == "status" and resource.has_status:
            continue  # reset on a main-resource write: the status endpoint's
        if name == "metadata" and isinstance(value, Mapping):
            meta = {k: v for k, v in value.items() if k not in _SERVER_SET_META}
            _walk_map(meta, ("f:metadata",), out, applied)
        else:
            _walk(name, value, (f"f:{name}",), out, applied)
    return out


def _walk(name: str, value: Any, path: Path, out: dict[Path, Any], applied: bool) -> None:
    if isinstance(value, Mapping) and not (name in _SELECTORS and set(value) <= _SELECTOR_FIELDS):
        if name in _MAPS and not applied:
            out[path] = _PRESENT
        elif not value:
            out[path] = value
        _walk_map(value, path, out, applied)
        return
    items = _items(name, value) if isinstance(value, list) else None
    if items is None:
        out[path] = value  # a scalar, an atomic list or struct: one field
        return
    if not applied:
        out[path] = _PRESENT  # a keyed list, like a map, is owned by the write that creates it
    elif not items:
        out[path] = value
    for key, item in items:
        out[(*path, key)] = _PRESENT if isinstance(item, Mapping) else item
        if isinstance(item, Mapping):
            _walk_map(item, (*path, key), out, applied)


def _walk_map(value: Mapping[str, Any], path: Path, out: dict[Path, Any], applied: bool) -> None:
    for key, sub in value.items():
        if sub is not None and not key.startswith("$"):  # null and directives set nothing
            _walk(key, sub, (*path, f"f:{key}"), out, applied)


def _items(name: str, value: list[Any]) -> list[tuple[str, Any]] | None:
    """A list's items with their path element; None for an atomic list."""
    if set_list(name) and all(isinstance(v, str | int | float | bool) for v in value):
        return [(f"v:{_json(v)}", v) for v in value]
    keys = merge_keys(name)
    if not keys or not all(isinstance(i, Mapping) for i in value):
        return None
    out = []
    for item in value:
        key = next((k for k in keys if k in item), None)
        if key is None:
            return None
        out.append((f"k:{_json({key: item[key]})}", item))
    return out


def _diff(before: Mapping[Path, Any], after: Mapping[Path, Any]) -> tuple[set[Path], set[Path]]:
    """The fields added or modified, and those removed."""
    changed = {p for p, v in after.items() if p not in before or before[p] != v}
    return changed, set(before) - set(after)


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


# --- removal ----------------------------------------------------------------------------------------


def _remove(obj: dict[str, Any], paths: Iterable[Path], kept: set[Path]) -> dict[str, Any]:
    """``obj`` without the fields at ``paths``, nor the maps and lists that leaves empty; a path under
    which a kept field lies stays (another manager's field keeps its item)."""
    result = copy.deepcopy(obj)  # a merge shares its unpatched parts with the stored object
    above = {p[:i] for p in kept for i in range(1, len(p))}
    for path in sorted(paths, key=len):
        if path in above:
            continue
        trail = _locate(result, path)
        if trail is None:
            continue  # gone with a shorter path, or never there
        for depth in range(len(trail) - 1, -1, -1):
            container, key = trail[depth]
            del container[key]
            if depth == 0 or container or path[:depth] in kept or path[:depth] == ("f:metadata",):
                break
    return result


def _locate(obj: Any, path: Path) -> list[tuple[Any, Any]] | None:
    """The (container, key or index) of each step of ``path`` from the root; None where it is absent."""
    trail: list[tuple[Any, Any]] = []
    node = obj
    for element in path:
        kind, _, text = element.partition(":")
        if kind == "f" and isinstance(node, dict) and text in node:
            at: Any = text
        elif kind in ("k", "v") and isinstance(node, list):
            want = orjson.loads(text)
            at = next(
                (
                    i
                    for i, item in enumerate(node)
                    if (kind == "v" and item == want)
                    or (kind == "k" and isinstance(item, Mapping) and all(item.get(k) == v for k, v in want.items()))
                ),
                None,
            )
            if at is None:
                return None
        else:
            return None
        trail.append((node, at))
        node = node[at]
    return trail


# --- managedFields ----------------------------------------------------------------------------------


def _owners(obj: Obj | None) -> list[_Owner]:
    entries = ((obj or {}).get("metadata") or {}).get("managedFields") or []
    return [_Owner(dict(e), _decode(e.get("fieldsV1") or {})) for e in entries if isinstance(e, Mapping)]


def _entry(manager: str, operation: str, resource: ResourceType, sub: str | None, fields: set[Path]) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "manager": manager,
        "operation": operation,
        "apiVersion": resource.api_version,
        "time": now_rfc3339(),
        "fieldsType": "FieldsV1",
        "fieldsV1": _encode(fields),
    }
    if not manager:
        del entry["manager"]  # omitempty: a write with neither fieldManager nor User-Agent
    if sub:
        entry["subresource"] = sub
    return entry


def _replace(owners: list[_Owner], old: _Owner | None, new: _Owner) -> list[_Owner]:
    """The owners with ``new`` in ``old``'s place (a new manager goes last)."""
    return [new if o is old else o for o in owners] if old is not None else [*owners, new]


def _with_entries(obj: dict[str, Any], current: Obj | None, owners: list[_Owner] | None) -> dict[str, Any]:
    """``obj`` with the owners' entries as its managedFields (``current``'s where ``owners`` is None); an
    owner left with no field goes, and so does its entry."""
    if owners is None:
        entries = ((current or {}).get("metadata") or {}).get("managedFields")
    else:
        entries = []
        for owner in owners:
            if not owner.fields:
                continue
            entry = owner.entry
            if _decode(entry.get("fieldsV1") or {}) != owner.fields:
                entry = {**entry, "fieldsV1": _encode(owner.fields)}  # it lost fields: its time stays
            entries.append(entry)
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    if entries:
        meta["managedFields"] = entries
    return {**obj, "metadata": meta}


def _encode(fields: set[Path]) -> dict[str, Any]:
    """The FieldsV1 of a set: a tree of path elements, ``.`` marking a member that has members below."""
    tree: dict[str, Any] = {}
    members: set[Path] = set()
    for path in fields:
        node = tree
        for element in path:
            node = node.setdefault(element, {})
        members.add(path)
    return _encode_node(tree, (), members)


def _encode_node(node: dict[str, Any], path: Path, members: set[Path]) -> dict[str, Any]:
    out: dict[str, Any] = {".": {}} if node and path in members else {}
    for element in sorted(node):
        out[element] = _encode_node(node[element], (*path, element), members)
    return out


def _decode(tree: Mapping[str, Any], path: Path = ()) -> set[Path]:
    out: set[Path] = set()
    for element, sub in tree.items():
        if element == ".":
            out.add(path)
        elif isinstance(sub, Mapping) and sub:
            out |= _decode(sub, (*path, element))
        else:
            out.add((*path, element))
    return out


# --- conflicts --------------------------------------------------------------------------------------


def _conflict(conflicts: list[tuple[_Owner, Path]]) -> ApiError:
    """409 Conflict as the API server words an apply's conflicts (apimachinery's NewConflictError)."""
    causes = [
        {"reason": "FieldManagerConflict", "message": f"conflict with {owner.describe()}", "field": _path_text(path)}
        for owner, path in conflicts
    ]
    if len(conflicts) == 1:
        owner, path = conflicts[0]
        message = f"Apply failed with 1 conflict: conflict with {owner.describe()}: {_path_text(path)}"
    else:
        by_manager: dict[str, list[str]] = {}
        for owner, path in conflicts:
            by_manager.setdefault(owner.describe(), []).append(_path_text(path))
        lines = [
            line
            for manager in sorted(by_manager)
            for line in (f"conflicts with {manager}:", *(f"- {p}" for p in by_manager[manager]))
        ]
        message = f"Apply failed with {len(conflicts)} conflicts: " + "\n".join(lines)
    return ApiError(409, message, reason="Conflict", details={"causes": causes})


def _path_text(path: Path) -> str:
    """A field path as structured-merge-diff prints it: ``.spec.containers[name="c"].image``."""
    out = []
    for element in path:
        kind, _, text = element.partition(":")
        if kind == "f":
            out.append(f".{text}")
        elif kind == "k":
            out.append("[" + ",".join(f"{k}={_json(v)}" for k, v in orjson.loads(text).items()) + "]")
        else:
            out.append(f"[={text}]")
    return "".join(out)
