"""What a configure run did, as one value: the flow's result, its artifacts and the CLI's summary."""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, ConfigDict, Field

from .._text import counted
from ._drift import Drift
from ._model import StackPlan
from ._record import RECORD_NAME

__all__ = ["TARGET_CHARS", "ConfigureOutcome", "target_name"]

#: How long the node list in a configure run's name may get (``configure-<target>``).
TARGET_CHARS = 60


class ConfigureOutcome(BaseModel):
    """The result of configure: the stack chosen and from what, what was written, and the drift left."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    release: str
    #: The target nodes, sorted.
    nodes: tuple[str, ...]
    #: GPU model → component → version.
    stack: dict[str, dict[str, str]]
    #: ``Kind namespace/name`` of every object applied (or rendered, on a dry run).
    objects: tuple[str, ...]
    labelled_nodes: tuple[str, ...] = ()
    gpus_verified: int = 0
    drift: tuple[Drift, ...] = ()
    dry_run_files: tuple[str, ...] = ()
    #: Component → version pinned (asked for, or taken from the cluster's record).
    pinned: dict[str, str] = Field(default_factory=dict)
    #: The registry images came from; None: the compatibility matrix's.
    registry: str | None = None
    #: Which of ``release``, ``versions``, ``registry`` were taken from the cluster's record of the
    #: last full configure (a run limited to some nodes that was not given them).
    reused: tuple[str, ...] = ()
    #: Who installs the stack: ``gpucert`` (its own manifests) or ``gpu-operator`` (adopted, issue 32).
    installer: str = "gpucert"
    #: What the inventory found installing the stack, one sentence each.
    found: tuple[str, ...] = ()
    #: The version changes made through the operator, ``ClusterPolicy cluster-policy: driver A → B``.
    operator_changes: tuple[str, ...] = ()
    #: Node → its driver upgrade state when the rollout was followed to its end.
    rollout: dict[str, str] = Field(default_factory=dict)
    #: Seconds from the change to the last node's ``upgrade-done``.
    rollout_s: float = 0.0
    #: Node → its certification state after the change (the nodes whose driver changed).
    certified: dict[str, str] = Field(default_factory=dict)
    #: The nodes whose own baselines certify re-seeded after the driver change.
    reseeded: tuple[str, ...] = ()
    #: The nodes that failed certification after their driver changed, each with that change as its likeliest cause.
    suspects: tuple[str, ...] = ()

    @staticmethod
    def stack_of(plan: StackPlan) -> dict[str, dict[str, str]]:
        """GPU model → component → version, from a plan."""
        return {model: {"driver": driver, **plan.versions} for model, driver in sorted(plan.model_driver.items())}

    def markdown(self) -> str:
        """A short report for people: the stack per model and where it came from, what changed, the drift."""
        dry = bool(self.dry_run_files)
        lines = [
            f"# configure: release {self.release}{' (dry run: nothing written)' if dry else ''}",
            "",
            f"{counted(len(self.nodes), 'GPU node')}; {counted(len(self.objects), 'object')} "
            f"{'rendered' if dry else 'applied'}"
            + (
                ""
                if dry
                else f"; {counted(len(self.labelled_nodes), 'node')} relabelled; "
                f"{counted(self.gpus_verified, 'GPU')} advertised"
            ),
            "",
        ]
        if self.found:
            lines += [f"Installer: **{self.installer}**. Found: " + "; ".join(self.found) + ".", ""]
        if self.installer != "gpucert" or self.operator_changes:
            changes = "; ".join(self.operator_changes) or "nothing (adopted as it runs)"
            lines += [f"{'Would change' if dry else 'Changed'} through the operator: {changes}.", ""]
        if self.rollout:
            lines += [
                f"Driver rollout followed on {len(self.rollout)} nodes to "
                f"{', '.join(sorted(set(self.rollout.values())))} in {self.rollout_s:.1f} s.",
                "",
            ]
        if self.certified:
            states = ", ".join(f"{n} {s}" for n, s in sorted(self.certified.items()))
            lines += [
                f"Certified after the change: {states}."
                + (f" Own baselines re-seeded: {', '.join(self.reseeded)}." if self.reseeded else ""),
                "",
            ]
        lines += [f"- {s}" for s in self.suspects] + ([""] if self.suspects else [])
        if self.reused:
            lines += [f"Taken from the fleet's record (ConfigMap {RECORD_NAME}): {', '.join(self.reused)}.", ""]
        if self.registry or self.pinned:
            pins = ", ".join(f"{c} {v}" for c, v in self.pinned.items())
            lines += [f"Registry {self.registry or 'of the compatibility matrix'}; pinned: {pins or 'nothing'}.", ""]
        components = list(next(iter(self.stack.values()), {}))
        lines += ["| GPU model | " + " | ".join(components) + " |", "|---|" + "---|" * len(components)]
        for model, versions in self.stack.items():
            lines.append(f"| {model} | " + " | ".join(versions.get(c, "") for c in components) + " |")
        lines.append("")
        if self.drift:
            lines.append(
                f"**Drift**: {counted(len(self.drift), 'component')} off the chosen versions on "
                f"{counted(len({d.node for d in self.drift}), 'node')} (see the table artifact)."
            )
        elif not dry:
            lines.append("No drift: every target node runs the chosen versions.")
        if dry:
            lines += ["", "Files:", *(f"- `{f}`" for f in self.dry_run_files)]
        return "\n".join(lines) + "\n"


def target_name(nodes: Sequence[str] | None, limit: int = TARGET_CHARS) -> str:
    """What a configure run is for, for its name: ``all`` when ``nodes`` is None or empty, else the nodes
    sorted and joined with commas, the ones past ``limit`` characters counted (``a,b,+12``)."""
    names = sorted(set(nodes or ()))
    if not names:
        return "all"
    kept: list[str] = []
    used = 0
    for i, name in enumerate(names):
        after = len(names) - i - 1
        cost = len(name) + (1 if kept else 0)
        # Room for this name and for the count of those after it, should none of them fit.
        if used + cost + (len(f",+{after}") if after else 0) > limit:
            break
        kept.append(name)
        used += cost
    rest = len(names) - len(kept)
    if kept:
        return ",".join(kept) + (f",+{rest}" if rest else "")
    # Not even the first name fits (names run to 253 characters): its start, marked as cut.
    tail = f"…,+{rest - 1}" if rest > 1 else "…"
    return names[0][: max(1, limit - len(tail))] + tail
