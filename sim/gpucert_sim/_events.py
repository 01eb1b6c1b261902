"""One Event, two APIs: core ``v1`` Events and ``events.k8s.io/v1`` Events are the same objects.

A real API server keeps Events in one store, in the core shape, and serves ``events.k8s.io/v1`` by
converting each object on its way in and out (``pkg/apis/events/v1/conversion.go``): an Event created
through either API is listed, watched, patched and deleted through both, under one uid and one
resourceVersion. ``kubectl describe`` reads core Events only, so an Event gpucert writes through
``events.k8s.io/v1`` is on a node's page only because of this.

The fields map one to one, so a round trip loses nothing: ``regarding`` ↔ ``involvedObject``, ``note`` ↔
``message``, ``reportingController`` ↔ ``reportingComponent``, ``deprecatedSource`` ↔ ``source``,
``deprecated{First,Last}Timestamp`` ↔ ``{first,last}Timestamp``, ``deprecatedCount`` ↔ ``count``, and
``eventTime``, ``series``, ``reportingInstance``, ``action``, ``reason``, ``related``, ``type`` as they are.
The server fills nothing in: a core Event written by a legacy recorder (no ``eventTime``) reads back
through ``events.k8s.io/v1`` with ``eventTime: null``, as it does from a real server.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["to_core", "to_events_v1"]

#: (events.k8s.io/v1 field, core v1 field) of the fields whose names differ.
_RENAMED = (
    ("regarding", "involvedObject"),
    ("note", "message"),
    ("reportingController", "reportingComponent"),
    ("deprecatedSource", "source"),
    ("deprecatedFirstTimestamp", "firstTimestamp"),
    ("deprecatedLastTimestamp", "lastTimestamp"),
    ("deprecatedCount", "count"),
)
_SAME = ("eventTime", "series", "reportingInstance", "action", "reason", "related", "type")


def _convert(event: Mapping[str, Any], api_version: str, renames: tuple[tuple[str, str], ...]) -> dict[str, Any]:
    out: dict[str, Any] = {"apiVersion": api_version, "kind": "Event", "metadata": event.get("metadata") or {}}
    for source, target in renames:
        if source in event:
            out[target] = event[source]
    for name in _SAME:
        if name in event:
            out[name] = event[name]
    return out


def to_core(event: Mapping[str, Any]) -> dict[str, Any]:
    """The core ``v1`` Event of an ``events.k8s.io/v1`` one (the shape the store keeps)."""
    out = _convert(event, "v1", _RENAMED)
    out.setdefault("involvedObject", {})  # required in core v1; the server writes {} when none was given
    return out


def to_events_v1(event: Mapping[str, Any]) -> dict[str, Any]:
    """The ``events.k8s.io/v1`` Event of a core ``v1`` one."""
    out = _convert(event, "events.k8s.io/v1", tuple((core, new) for new, core in _RENAMED))
    out.setdefault("eventTime", None)  # not omitempty in events.k8s.io/v1: null when the writer set none
    return out
