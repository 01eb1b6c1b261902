"""Label and field selectors, parsed once per request and matched against stored objects.

They follow apimachinery's grammar: labels take ``=``/``==``/``!=``, ``in``/``notin`` sets and
(``!``)``key`` existence; fields take ``=``/``==``/``!=`` on the field labels each kind registers, and any
other field is refused with 400 as a real server does (a silently ignored selector is how kmock lets a
wrong test pass).

Besides its predicates a selector keeps what pins a label to a set of values (``k=v``, ``k==v``,
``k in (a,b)``) and a name to one value (``metadata.name=x``): the store answers those from its indexes
instead of matching every object (a pod list by ``controller-uid`` among 80,000 pods reads one).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ._resources import ResourceType
from ._status import bad_request

__all__ = ["Selector", "parse_selectors"]

Predicate = Callable[[Mapping[str, Any]], bool]

_SET = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s+(in|notin)\s*\(([^)]*)\)\s*$")
_OP = re.compile(r"^\s*([A-Za-z0-9_./-]+)\s*(==|!=|=)\s*([A-Za-z0-9_.-]*)\s*$")
_EXISTS = re.compile(r"^\s*(!?)\s*([A-Za-z0-9_./-]+)\s*$")


def _split(selector: str) -> list[str]:
    """Split on the commas that are not inside an ``in (…)`` set."""
    parts: list[str] = []
    current: list[str] = []
    depth = 0
    for ch in selector:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return [p for p in parts if p.strip()]


#: A label key and the values it must have one of (what an index can answer).
Pinned = tuple[str, frozenset[str]]


def _label_requirement(text: str) -> tuple[Predicate, Pinned | None]:
    """The predicate of one requirement, and the label values it pins (None when it pins none)."""
    if m := _SET.match(text):
        key, op = m.group(2), m.group(3)
        values = frozenset(v.strip() for v in m.group(4).split(",") if v.strip())
        if op == "in":
            return (lambda labels: labels.get(key) in values), (key, values)
        return (lambda labels: labels.get(key) not in values), None
    if m := _OP.match(text):
        key, op, value = m.groups()
        if op == "!=":
            return (lambda labels: labels.get(key) != value), None
        return (lambda labels: labels.get(key) == value), (key, frozenset((value,)))
    if m := _EXISTS.match(text):
        negate, key = m.groups()
        if negate:
            return (lambda labels: key not in labels), None
        return (lambda labels: key in labels), None
    raise bad_request(f"unable to parse requirement: {text.strip()!r}")


def _field_value(obj: Mapping[str, Any], path: tuple[str, ...]) -> str:
    value: Any = obj
    for part in path:
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _source_of(component: tuple[str, ...], controller: tuple[str, ...]) -> Callable[[Mapping[str, Any]], str]:
    return lambda obj: _field_value(obj, component) or _field_value(obj, controller)


#: Field labels that are no plain path in the object, by resource: an Event's ``source`` is its source's
#: component, else its reporting controller (the API server's ToSelectableFields), in either API's shape.
_COMPUTED: dict[tuple[str, str], Callable[[Mapping[str, Any]], str]] = {
    # A node's ``spec.unschedulable`` is a bool the server prints: absent reads as "false", as it matches.
    ("v1/nodes", "spec.unschedulable"): lambda obj: str(bool((obj.get("spec") or {}).get("unschedulable"))).lower(),
    ("v1/events", "source"): _source_of(("source", "component"), ("reportingComponent",)),
    ("events.k8s.io/v1/events", "source"): _source_of(("deprecatedSource", "component"), ("reportingController",)),
}


def _computed_requirement(read: Callable[[Mapping[str, Any]], str], negate: bool, value: str) -> Predicate:
    if negate:
        return lambda obj: read(obj) != value
    return lambda obj: read(obj) == value


def _field_requirement(text: str, resource: ResourceType) -> tuple[Predicate, str | None]:
    """The predicate of one field requirement, and the name it pins (``metadata.name=x``), else None."""
    m = _OP.match(text)
    if not m:
        raise bad_request(f"invalid field selector: {text.strip()!r}")
    path, op, value = m.groups()
    if path not in ("metadata.name", "metadata.namespace", *resource.field_labels):
        raise bad_request(f"field label not supported: {path}")
    computed = _COMPUTED.get((resource.key, path))
    if computed is not None:
        return _computed_requirement(computed, op == "!=", value), None
    parts = tuple(path.split("."))  # split once per request, not once per object matched
    if op == "!=":
        return (lambda obj: _field_value(obj, parts) != value), None
    return (lambda obj: _field_value(obj, parts) == value), (value if path == "metadata.name" else None)


@dataclass(frozen=True)
class Selector:
    """The conjunction of a request's label and field selectors."""

    labels: tuple[Predicate, ...] = ()
    fields: tuple[Predicate, ...] = ()
    #: Label keys pinned to sets of values by the label requirements (an object must match each).
    pinned: tuple[Pinned, ...] = ()
    #: The name a ``metadata.name=`` requirement pins, if any.
    name: str | None = None

    def __bool__(self) -> bool:
        return bool(self.labels or self.fields)

    def matches(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(p(labels) for p in self.labels) and all(p(obj) for p in self.fields)


def parse_selectors(label_selector: str | None, field_selector: str | None, resource: ResourceType) -> Selector:
    """The selector of a list, watch or deletecollection request; 400 on a malformed one."""
    labels = [_label_requirement(p) for p in _split(label_selector or "")]
    fields = [_field_requirement(p, resource) for p in _split(field_selector or "")]
    names = [name for _, name in fields if name is not None]
    return Selector(
        labels=tuple(p for p, _ in labels),
        fields=tuple(p for p, _ in fields),
        pinned=tuple(pin for _, pin in labels if pin is not None),
        name=names[0] if names else None,
    )
