"""What a night's telemetry covered: the GPU nodes in scope it read, those it could not read and why, and
whether it judged any telemetry at all (a night that read nothing is not a clean night: it says so).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .._text import counted
from ..telemetry import Telemetry

__all__ = ["TelemetryCoverage", "telemetry_coverage"]


@dataclass(frozen=True)
class TelemetryCoverage:
    """``read``: the GPU nodes in scope whose telemetry was read. ``unread``: node → why none of its
    telemetry was (every GPU node in scope without telemetry, and any other node whose exporter failed).
    ``partial``: node → what of a read node's telemetry is missing. ``missing``: why the night judged no
    telemetry at all (no exporter found, no GPU node read), else None."""

    read: list[str] = field(default_factory=list)
    unread: dict[str, str] = field(default_factory=dict)
    partial: dict[str, str] = field(default_factory=dict)
    missing: str | None = None


def telemetry_coverage(telemetry: Telemetry, gpu_nodes: Iterable[str]) -> TelemetryCoverage:
    """Which of ``gpu_nodes`` (the GPU nodes in scope) ``telemetry`` read, which it did not and why."""
    scope = sorted(set(gpu_nodes))
    seen = set(telemetry.nodes)
    read = [node for node in scope if node in seen]
    unread = {
        node: telemetry.problems.get(node) or f"no telemetry of it from {telemetry.source}"
        for node in scope
        if node not in seen
    }
    partial: dict[str, str] = {}
    for node, why in telemetry.problems.items():
        (partial if node in seen else unread).setdefault(node, why)
    missing = None
    if scope and not read:
        # Every GPU node is unread: name the cause once, the source's own when it found nothing at all.
        cause = telemetry.absent or f"no GPU node's telemetry could be read from {telemetry.source}"
        missing = f"telemetry: {cause}; {counted(len(scope), 'GPU node')} unread"
    return TelemetryCoverage(read, dict(sorted(unread.items())), partial, missing)
