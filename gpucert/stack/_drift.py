"""Drift: GPU nodes that do not run the versions configure chose, and why.

Configure lists them rather than failing: an opted-out component, a host driver other than the stack's
choice, a node configured earlier with other versions — each is a fact for a person to weigh.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ._labels import DEPLOY_PREFIX, MANAGED, stack_label, version_label
from ._model import COMPONENTS, NodeInfo, StackPlan

__all__ = ["Drift", "find_drift"]


@dataclass(frozen=True)
class Drift:
    """One component on one node off the chosen version."""

    node: str
    component: str
    expected: str
    found: str
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _target_drift(plan: StackPlan, info: NodeInfo, running: Mapping[str, str]) -> list[Drift]:
    out = []
    expected = plan.expected_versions(info.name)
    for component in COMPONENTS:
        want, have = expected[component], running.get(component, "")
        if info.labels.get(f"{DEPLOY_PREFIX}{component}") == "false":
            out.append(Drift(info.name, component, want, have, f"opted out ({DEPLOY_PREFIX}{component}=false)"))
        elif have != want:
            out.append(Drift(info.name, component, want, have, "runs another version" if have else "not running"))
    model = info.gpu_model
    if info.name in plan.host_driver and model is not None and model in plan.model_driver:
        chosen, host = plan.model_driver[model], plan.host_driver[info.name]
        if host != chosen:
            why = f"host driver kept; the stack's driver for {info.gpu_model} is {chosen}"
            out.append(Drift(info.name, "driver", chosen, host, why))
    return out


def _bystander_drift(plan: StackPlan, info: NodeInfo) -> list[Drift]:
    """A node configured by gpucert before but not in this run, whose recorded versions differ."""
    if info.labels.get(stack_label(plan.label_prefix)) != MANAGED:
        return []
    out = []
    for component, want in plan.versions.items():
        have = info.labels.get(version_label(plan.label_prefix, component), "")
        if have != want:
            out.append(Drift(info.name, component, want, have, "not in this run; configured with other versions"))
    return out


def find_drift(
    plan: StackPlan, inventory: Sequence[NodeInfo], observed: Mapping[str, Mapping[str, str]]
) -> list[Drift]:
    """Every component off its chosen version, on the plan's nodes and on the other managed GPU nodes of
    ``inventory`` (``observed``: node → component → running version), sorted by node and component."""
    targets = set(plan.nodes)
    out: list[Drift] = []
    for info in inventory:
        if info.name in targets:
            out += _target_drift(plan, info, observed.get(info.name, {}))
        else:
            out += _bystander_drift(plan, info)
    return sorted(out, key=lambda d: (d.node, COMPONENTS.index(d.component)))
