"""Label and field selectors, parsed once per request and matched against stored objects.

They follow apimachinery's grammar: labels take ``=``/``==``/``!=``, ``in``/``notin`` sets and
(``!``)``key`` existence; fields take ``=``/``==``/``!=`` on the field labels each kind registers, and any
other field is refused with 400 as a real server does (a silently ignored selector is how kmock lets a
wrong test pass).
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


def _label_requirement(text: str) -> Predicate:
    if m := _SET.match(text):
        key, op = m.group(2), m.group(3)
        values = {v.strip() for v in m.group(4).split(",") if v.strip()}
        if op == "in":
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if m := _OP.match(text):
        key, op, value = m.groups()
        if op == "!=":
            return lambda labels: labels.get(key) != value
        return lambda labels: labels.get(key) == value
    if m := _EXISTS.match(text):
        negate, key = m.groups()
        if negate:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise bad_request(f"unable to parse requirement: {text.strip()!r}")


def _field_value(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _field_requirement(text: str, resource: ResourceType) -> Predicate:
    m = _OP.match(text)
    if not m:
        raise bad_request(f"invalid field selector: {text.strip()!r}")
    path, op, value = m.groups()
    if path not in ("metadata.name", "metadata.namespace", *resource.field_labels):
        raise bad_request(f'field label not supported: {path}')
    if op == "!=":
        return lambda obj: _field_value(obj, path) != value
    return lambda obj: _field_value(obj, path) == value


@dataclass(frozen=True)
class Selector:
    """The conjunction of a request's label and field selectors."""

    labels: tuple[Predicate, ...] = ()
    fields: tuple[Predicate, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.labels or self.fields)

    def matches(self, obj: Mapping[str, Any] | None) -> bool:
        if obj is None:
            return False
        labels = obj.get("metadata", {}).get("labels") or {}
        return all(p(labels) for p in self.labels) and all(p(obj) for p in self.fields)


def parse_selectors(label_selector: str | None, field_selector: str | None, resource: ResourceType) -> Selector:
    """The selector of a list, watch or deletecollection request; 400 on a malformed one."""
    return Selector(
        labels=tuple(_label_requirement(p) for p in _split(label_selector or "")),
        fields=tuple(_field_requirement(p, resource) for p in _split(field_selector or "")),
    )
