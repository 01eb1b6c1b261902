"""What a configure run did, as one value: the flow's result, its artifacts and the CLI's summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ._drift import Drift
from ._model import StackPlan

__all__ = ["ConfigureOutcome"]


@dataclass(frozen=True)
class ConfigureOutcome:
    """The result of configure: the stack chosen, what was written, and the drift left."""

    release: str
    nodes: tuple[str, ...]
    #: GPU model → component → version.
    stack: dict[str, dict[str, str]]
    #: ``Kind namespace/name`` of every object applied (or rendered, on a dry run).
    objects: tuple[str, ...]
    labelled_nodes: tuple[str, ...] = ()
    gpus_verified: int = 0
    drift: tuple[Drift, ...] = ()
    dry_run_files: tuple[str, ...] = field(default=())

    @staticmethod
    def stack_of(plan: StackPlan) -> dict[str, dict[str, str]]:
        """GPU model → component → version, from a plan."""
        return {
            model: {"driver": driver, **plan.versions} for model, driver in sorted(plan.model_driver.items())
        }

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (the flow's return value)."""
        return {
            "release": self.release,
            "nodes": list(self.nodes),
            "stack": self.stack,
            "objects": list(self.objects),
            "labelled_nodes": list(self.labelled_nodes),
            "gpus_verified": self.gpus_verified,
            "drift": [d.to_dict() for d in self.drift],
            "dry_run_files": list(self.dry_run_files),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ConfigureOutcome:
        """The inverse of :meth:`to_dict`."""
        return cls(
            release=data["release"],
            nodes=tuple(data["nodes"]),
            stack=data["stack"],
            objects=tuple(data["objects"]),
            labelled_nodes=tuple(data["labelled_nodes"]),
            gpus_verified=int(data["gpus_verified"]),
            drift=tuple(Drift(**d) for d in data["drift"]),
            dry_run_files=tuple(data["dry_run_files"]),
        )

    def markdown(self) -> str:
        """A short report for people: the stack per model, what changed, the drift."""
        dry = bool(self.dry_run_files)
        lines = [
            f"# configure: release {self.release}{' (dry run: nothing written)' if dry else ''}",
            "",
            f"{len(self.nodes)} GPU nodes; {len(self.objects)} objects {'rendered' if dry else 'applied'}"
            + (
                ""
                if dry
                else f"; {len(self.labelled_nodes)} nodes relabelled; {self.gpus_verified} GPUs advertised"
            ),
            "",
            "| GPU model | " + " | ".join(_components(self.stack)) + " |",
            "|---|" + "---|" * len(_components(self.stack)),
        ]
        for model, versions in self.stack.items():
            lines.append(
                f"| {model} | " + " | ".join(versions.get(c, "") for c in _components(self.stack)) + " |"
            )
        lines.append("")
        if self.drift:
            lines.append(
                f"**Drift**: {len(self.drift)} components off the chosen versions on "
                f"{len({d.node for d in self.drift})} nodes (see the table artifact)."
            )
        elif not dry:
            lines.append("No drift: every target node runs the chosen versions.")
        if dry:
            lines += ["", "Files:", *(f"- `{f}`" for f in self.dry_run_files)]
        return "\n".join(lines) + "\n"


def _components(stack: dict[str, dict[str, str]]) -> Sequence[str]:
    first = next(iter(stack.values()), {})
    return list(first)
