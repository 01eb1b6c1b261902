"""The nightly rotation: every GPU node re-certified within N days, a cap on nodes under test at once.

Order of priority: nodes telemetry or drift asked about (``asked``), then nodes never certified, then the
longest since certification; idle nodes only (a busy node waits for the next night), and no more than
``max_nodes``. The date comes from the ``<prefix>/certified-at`` annotation certify writes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from .._text import counted

__all__ = ["DueNodes", "due_nodes"]


@dataclass(frozen=True)
class DueNodes:
    """Tonight's choice and what was left for another night, with why."""

    chosen: list[str]
    postponed: dict[str, str] = field(default_factory=dict)


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
    return DueNodes(sorted(chosen), postponed)
