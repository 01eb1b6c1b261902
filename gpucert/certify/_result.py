"""What a certify run returns: :class:`CertifyOutcome`, a pydantic model Prefect stores as the flow's result.

Everything in it is made from the run's settled decisions (``decisions.parquet``), so operate, onboard,
the command line and the demo read the same fields the labels and the report were made from.
"""

from __future__ import annotations

from dataclasses import asdict
from datetime import date
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from .._text import counted
from ..tickets import TicketEvent
from ._settle import Settlement, tally_states


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class NodeOutcome(_Model):
    """One node's settled decision (a row of ``decisions.parquet``)."""

    node: str
    state: str | None = Field(description="certified, degraded, failed; None: left as it was (inconclusive)")
    verdict: str
    cause: str | None = None
    hard_gate: bool = False
    confirmed: bool = False
    taint: str = Field(description="added, kept, lifted, refused (blast radius) or none")
    runs: list[str]
    summary: str
    settled: bool = True


class TicketChange(_Model):
    """A ticket the run opened, updated, escalated or resolved."""

    kind: str
    ticket: str
    ticket_kind: str
    node: str
    cause: str
    detail: str

    @classmethod
    def of(cls, event: TicketEvent) -> TicketChange:
        """The change a :class:`~gpucert.tickets.TicketEvent` made."""
        t = event.ticket
        return cls(kind=event.kind, ticket=t.id, ticket_kind=t.kind, node=t.node, cause=t.cause, detail=event.detail)


class CertifyOutcome(_Model):
    """The result of one certification run."""

    run_id: str
    day: date
    store: str
    nodes: list[str] = Field(description="the nodes benchmarked")
    skipped: dict[str, str] = Field(default_factory=dict, description="node → why it was not benchmarked")
    decisions: list[NodeOutcome] = Field(default_factory=list)
    reruns: list[str] = Field(default_factory=list, description="the confirming re-runs' ids")
    inconclusive: dict[str, str] = Field(default_factory=dict, description="node → why its Job gave no result")
    incident: str | None = None
    incident_ticket: str | None = Field(
        default=None, description="the blast-radius incident's ticket (None: no incident, or only recorded)"
    )
    observe_only: bool = False
    baseline_version: str | None = None
    reseeded: list[str] = Field(default_factory=list, description="nodes re-seeded after a driver change")
    report: str | None = Field(default=None, description="the report's URI in the store")
    report_link: str | None = Field(default=None, description="a link a browser opens")
    ticketing: str = Field(default="not configured", description="the ticket backend, or 'not configured'")
    tickets: list[TicketChange] = Field(default_factory=list)
    tickets_recorded: int = Field(default=0, description="tickets recorded in the store for want of ticketing")
    actions: dict[str, str] = Field(default_factory=dict, description="node → what was written to it, in words")
    links: list[str] = Field(
        default_factory=list,
        description="the link step: rounds and re-pairings, pairs measured, what the pairs named (empty: no pairs)",
    )
    audited: int = Field(default=0, description="changes recorded in the audit trail (and as Events)")
    audit_seconds: float = Field(default=0.0, description="time spent recording them")

    @classmethod
    def of(cls, settlement: Settlement, **fields: Any) -> CertifyOutcome:
        """The outcome of a settled run; ``fields`` fill the rest."""
        decisions = [
            NodeOutcome(**{**asdict(d), "runs": list(d.runs)}, verdict=d.verdict)
            for _, d in sorted(settlement.decisions.items())
        ]
        return cls(run_id=settlement.run_id, decisions=decisions, incident=settlement.incident, **fields)

    # --- views ----------------------------------------------------------------------------------------

    def decision(self, node: str) -> NodeOutcome | None:
        """The node's decision, or None when it was not benchmarked."""
        return next((d for d in self.decisions if d.node == node), None)

    @property
    def states(self) -> dict[str, int]:
        """How many nodes of each state (``unchanged`` for inconclusive)."""
        return tally_states(d.state for d in self.decisions)

    def with_taint(self, *actions: str) -> list[str]:
        """The nodes whose taint action is one of ``actions``."""
        return sorted(d.node for d in self.decisions if d.taint in actions)

    @property
    def tainted(self) -> list[str]:
        """The nodes this run tainted."""
        return self.with_taint("added")

    @property
    def unconfirmed(self) -> list[str]:
        """The nodes whose first run's deficit the re-runs did not reproduce (or have not yet)."""
        return sorted(d.node for d in self.decisions if len(d.runs) > 1 and not d.confirmed)

    def ticket_line(self) -> str:
        """What happened to tickets, in one line."""
        if self.incident and self.ticketing == "not configured":
            return "ticketing not configured: the incident ticket recorded, not opened; no ticket per fault"
        if self.incident:
            return (
                f"tickets ({self.ticketing}): incident ticket {self.incident_ticket or 'unchanged'} "
                "(no ticket per fault: the blast radius held them back)"
            )
        if self.ticketing == "not configured":
            return f"ticketing not configured: {counted(self.tickets_recorded, 'ticket')} recorded, none opened"
        if not self.tickets:
            return f"tickets ({self.ticketing}): no change"
        changes = ", ".join(f"{t.kind} {t.ticket} ({t.node} {t.cause})" for t in self.tickets)
        return f"tickets ({self.ticketing}): {changes}"

    @property
    def kept(self) -> list[TicketChange]:
        """The tickets left open because the run passed their hardware without measuring their fault."""
        return [t for t in self.tickets if t.kind == "kept"]

    def text(self) -> str:
        """The outcome for a person, a few lines."""
        states = ", ".join(f"{n} {state}" for state, n in sorted(self.states.items())) or "nothing"
        lines = [f"certify {self.run_id}: {counted(len(self.nodes), 'node')} benchmarked: {states}"]
        if self.skipped:
            lines.append(f"skipped: {', '.join(f'{n} ({why})' for n, why in sorted(self.skipped.items()))}")
        for node, why in sorted(self.inconclusive.items()):
            lines.append(f"inconclusive {node}: {why}")
        for d in self.decisions:
            if d.state in ("failed", "degraded") or d.taint in ("added", "lifted", "refused"):
                lines.append(f"{d.node}: {d.state}, taint {d.taint}: {d.summary}")
        if self.reruns:
            lines.append(f"confirming re-runs: {', '.join(self.reruns)}")
        for t in self.kept:
            lines.append(f"ticket {t.ticket} {t.detail}")
        if self.incident:
            lines.append(f"INCIDENT: {self.incident}")
        if self.observe_only:
            lines.append("observe-only: nothing was tainted or untainted")
        lines.append(self.ticket_line())
        lines.append(f"baseline version: {self.baseline_version}; report: {self.report_link or self.report}")
        return "\n".join(lines) + "\n"
