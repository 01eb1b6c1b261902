"""The nightly rotation (docs/design/operate.md, "The night, step by step"): every GPU node re-certified within
N days, asked nodes first, then never certified, then the longest since (``<prefix>/certified-at``); idle nodes
only, at most ``max_nodes``. A busy asked node is postponed, but not forever: each night records the ones it
postponed (``operate/busy/night=<date>.json``), and :func:`busy_overdue` names those postponed ``nights``
nights in a row, for a ticket asking for a maintenance window.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any

from .._text import counted
from ..store import ObjectStore

__all__ = ["BUSY_PREFIX", "DueNodes", "busy_overdue", "due_nodes"]

#: Where each night records the asked nodes it postponed for being busy.
BUSY_PREFIX = "operate/busy/"


@dataclass(frozen=True)
class DueNodes:
    """Tonight's choice and what was left for another night, with why."""

    chosen: list[str]
    postponed: dict[str, str] = field(default_factory=dict)
    #: The postponed nodes telemetry or drift asked about that are busy: node → why it was asked.
    busy_asked: dict[str, str] = field(default_factory=dict)


def _certified_at(node: Mapping[str, Any], prefix: str, now: datetime) -> datetime | None:
    raw = ((node.get("metadata") or {}).get("annotations") or {}).get(f"{prefix}/certified-at")
    if not raw:
        return None
    try:
        when = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    except ValueError:
        return None
    # An annotation is anyone's to write: a time without a zone is UTC (as gpucert writes it), and one more
    # than a day ahead (a typo, a skewed clock) is no certification, or it would keep the node out of rotation.
    when = when if when.tzinfo is not None else when.replace(tzinfo=UTC)
    return when if when <= now + timedelta(days=1) else None


def due_nodes(
    nodes: Iterable[Mapping[str, Any]],
    *,
    now: datetime,
    rotation_days: float,
    max_nodes: int,
    busy: Mapping[str, str],
    asked: Mapping[str, str] | None = None,
    prefix: str = "gpucert.io",
) -> DueNodes:
    """The nodes to certify tonight (see the module docstring); ``asked`` maps node → why it was asked."""
    asked = dict(asked or {})
    ranked: list[tuple[int, float, str]] = []
    postponed: dict[str, str] = {}
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name"))
        when = _certified_at(node, prefix, now)
        age = (now - when).total_seconds() if when else float("inf")
        if name in asked:
            ranked.append((0, -age, name))
        elif when is None:
            ranked.append((1, 0.0, name))
        elif now - when >= timedelta(days=rotation_days):
            ranked.append((2, -age, name))
    chosen: list[str] = []
    for _, _, name in sorted(ranked):
        if name in busy:
            postponed[name] = f"busy ({busy[name]} holds GPUs)"
        elif len(chosen) >= max_nodes:
            postponed[name] = f"over tonight's cap of {counted(max_nodes, 'node')}"
        else:
            chosen.append(name)
    busy_asked = {n: asked[n] for n in sorted(postponed) if n in asked and n in busy}
    return DueNodes(sorted(chosen), postponed, busy_asked)


def _busy_key(night: date) -> str:
    return f"{BUSY_PREFIX}night={night.isoformat()}.json"


def busy_overdue(objects: ObjectStore, *, night: date, busy_asked: Mapping[str, str], nights: int) -> dict[str, str]:
    """Record tonight's busy asked nodes in the store and return those busy for ``nights`` nights in a row,
    tonight included (node → why it was asked, and for how long it waited). Only nights operate ran count;
    a night a node was free (or not asked about) starts its count again. Raises
    :class:`~gpucert.errors.StoreError` when the store fails."""
    objects.put(_busy_key(night), json.dumps({"night": night.isoformat(), "nodes": dict(busy_asked)}).encode())
    if not busy_asked:
        return {}
    earlier = sorted(k for k in objects.list(BUSY_PREFIX) if k < _busy_key(night))
    newest_first = [_busy_nodes(objects, key) for key in reversed(earlier[len(earlier) - (nights - 1) :])]
    overdue = {}
    for node, why in sorted(busy_asked.items()):
        # Tonight, then each earlier night back to the first one it was not busy on.
        streak = 1 + next((i for i, busy in enumerate(newest_first) if node not in busy), len(newest_first))
        if streak >= nights:
            overdue[node] = f"{why}; busy {counted(streak, 'night')} in a row"
    return overdue


def _busy_nodes(objects: ObjectStore, key: str) -> set[str]:
    blob = objects.get(key)
    return set(json.loads(blob.data).get("nodes") or {}) if blob is not None else set()
