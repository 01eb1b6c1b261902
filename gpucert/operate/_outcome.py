"""What a night of operate and an onboarding return: pydantic models Prefect stores as the flows' results."""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel, ConfigDict, Field

from .._text import counted
from ..certify import CertifyOutcome
from ..stack import ConfigureOutcome

__all__ = ["OnboardOutcome", "OperateOutcome", "ReleaseOutcome"]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class OperateOutcome(_Model):
    """One night: what was watched, chosen and found."""

    night: date
    due: list[str] = Field(default_factory=list, description="the nodes re-certified tonight")
    postponed: dict[str, str] = Field(default_factory=dict, description="node → why it waits")
    asked: dict[str, str] = Field(default_factory=dict, description="node → why telemetry or drift asked")
    drift: dict[str, str] = Field(default_factory=dict)
    unreadable: dict[str, str] = Field(
        default_factory=dict,
        description="node → why its telemetry was unread: every GPU node in scope without telemetry (no "
        "exporter, a failed scrape, no series in Prometheus' window)",
    )
    telemetry_read: list[str] = Field(default_factory=list, description="the GPU nodes whose telemetry was read")
    telemetry_partial: dict[str, str] = Field(
        default_factory=dict, description="node → what of its telemetry, read otherwise, is missing"
    )
    telemetry_missing: str | None = Field(
        default=None,
        description="why the night judged no telemetry at all (no DCGM exporter found, no GPU node read); "
        "None when it read some: such a night is not a clean one",
    )
    maintenance: dict[str, str] = Field(
        default_factory=dict,
        description="node → the ticket asking for a maintenance window: telemetry or drift asked about it and it "
        "stayed busy for the policy's escalation.busy_nights nights in a row",
    )
    stack_drift: dict[str, str] = Field(
        default_factory=dict,
        description="node → the GPU stack versions that moved outside gpucert since configure verified them "
        "(an operator or Helm upgrade, a hand edit): component configured → running",
    )
    certify: CertifyOutcome | None = None

    def markdown(self) -> str:
        """The night as a short fleet report."""
        lines = ["# operate: tonight", "", f"{counted(len(self.due), 'node')} re-certified"]
        if self.telemetry_missing:
            lines.append(f"NOT CLEAN: {self.telemetry_missing}")
        lines += [f"- {node} asked: {why}" for node, why in sorted(self.asked.items())]
        if self.telemetry_read or self.unreadable:
            line = f"telemetry read on {counted(len(self.telemetry_read), 'node')}"
            if self.unreadable:
                unread = ", ".join(f"{n} ({w})" for n, w in sorted(self.unreadable.items()))
                line += f"; unread on {counted(len(self.unreadable), 'node')}: {unread}"
            lines.append(line)
        if self.telemetry_partial:
            partial = ", ".join(f"{n} ({w})" for n, w in sorted(self.telemetry_partial.items()))
            lines.append(f"telemetry partial: {partial}")
        if self.certify is not None:
            states = ", ".join(f"{n} {s}" for s, n in sorted(self.certify.states.items()))
            lines.append(f"states: {states}; tainted: {', '.join(self.certify.tainted) or 'none'}")
            if self.certify.incident:
                lines.append(f"INCIDENT: {self.certify.incident}")
            lines.append(self.certify.ticket_line())
            lines.append(f"report: {self.certify.report_link or self.certify.report}")
        if self.postponed:
            lines.append(f"postponed: {', '.join(f'{n} ({w})' for n, w in sorted(self.postponed.items()))}")
        lines += [f"- {node} needs a maintenance window: {what}" for node, what in sorted(self.maintenance.items())]
        lines += [f"- {node} stack drift: {what}" for node, what in sorted(self.stack_drift.items())]
        return "\n".join(lines) + "\n"


class OnboardOutcome(_Model):
    """A node's onboarding: its state after certification and whether it was admitted."""

    node: str
    uid: str
    state: str | None = None
    admitted: bool = False
    configure: ConfigureOutcome | None = None
    certify: CertifyOutcome | None = None

    def text(self) -> str:
        """One line, then the certification's lines."""
        head = f"onboard {self.node} ({self.uid}): {self.state or 'not judged'}, "
        head += "admitted" if self.admitted else "kept out (tainted uncertified)"
        return head + "\n" + (self.certify.text() if self.certify is not None else "")


class ReleaseOutcome(_Model):
    """Repaired nodes released: the repairs recorded on their tickets, and the re-certification."""

    nodes: list[str]
    repairs: list[str] = Field(default_factory=list, description="ticket id: what was recorded")
    released: list[str] = Field(default_factory=list, description="the nodes that passed and were untainted")
    certify: CertifyOutcome | None = None

    def text(self) -> str:
        """What was recorded and what passed."""
        lines = [*self.repairs]
        if not self.repairs:
            lines.append("no open ticket of these nodes to record the repair on")
        lines.append(self.certify.text() if self.certify is not None else "")
        kept = sorted(set(self.nodes) - set(self.released))
        lines.append(f"released: {', '.join(self.released) or 'none'}; still out: {', '.join(kept) or 'none'}")
        return "\n".join(line for line in lines if line) + "\n"
