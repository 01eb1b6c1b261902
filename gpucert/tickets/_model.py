"""The ticket model: what a ticket is, what happens to it, and the rules that escalate it.

A ticket stands for one fault on one piece of hardware: its :class:`Fingerprint` is (node, GPU UUID — empty
for a node-level fault —, cause). A fingerprint has exactly one ticket over its whole life: a recurrence
updates it, a recurrence after it was resolved reopens it, so its history (occurrences, remediations,
reopenings) is what the escalation rules count (docs/reference/causes-and-actions.md, "Escalation").
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gpucert.errors import TicketConfigError, TicketError, TicketNotFound

__all__ = [
    "MAX_EVIDENCE",
    "EscalationPolicy",
    "EventKind",
    "Evidence",
    "Fingerprint",
    "Kind",
    "Remediation",
    "State",
    "Ticket",
    "TicketConfigError",
    "TicketError",
    "TicketEvent",
    "TicketNotFound",
]

#: ``incident``: one ticket for a blast-radius incident, naming every node and finding held back.
Kind = Literal["remediation", "replacement", "incident"]
State = Literal["open", "resolved"]
#: ``kept``: the ticket's hardware passed in a run that did not measure its fault; reported, never stored.
EventKind = Literal["opened", "updated", "reopened", "escalated", "resolved", "remediated", "kept"]

#: A ticket keeps the evidence of its latest occurrences only; ``occurrences`` still counts them all.
#: (A Jira description holds at most 32,767 characters, and a flapping GPU would otherwise grow without end.)
MAX_EVIDENCE = 5
#: How many occurrence times, run ids and reopen times a ticket remembers: far more than any rule looks at.
MAX_HISTORY = 200


class Fingerprint(BaseModel):
    """Which fault on which hardware: (node, GPU UUID or ``""`` for a node-level fault, cause)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str
    gpu_uuid: str = ""
    cause: str

    @property
    def key(self) -> str:
        """The fingerprint as one string, ``node/uuid/cause`` (``-`` for a node-level fault); unique."""
        return f"{self.node}/{self.gpu_uuid or '-'}/{self.cause}"

    @property
    def digest(self) -> str:
        """A short, label-safe hash of :attr:`key` (Jira labels admit no spaces and few characters)."""
        return hashlib.sha256(self.key.encode()).hexdigest()[:16]

    def __str__(self) -> str:
        return self.key


class Remediation(BaseModel):
    """Something done to the hardware: ``reset_gpu``, ``reboot_node``, ``reseat``, ``replace_gpu``…"""

    model_config = ConfigDict(extra="forbid")

    action: str
    at: AwareDatetime
    note: str = ""
    by: str = ""


class Evidence(BaseModel):
    """What one occurrence was seen with: the run, its verdict rows, telemetry, stack and report."""

    model_config = ConfigDict(extra="forbid")

    run_id: str
    at: AwareDatetime
    #: The verdict rows of this fingerprint in the run, as JSON objects (docs/design/data-contracts.md, "Verdicts").
    verdicts: list[dict[str, Any]] = Field(default_factory=list)
    #: Telemetry and events of the run, worst value per metric: ``{"node" | GPU UUID: {metric: value}}``.
    telemetry: dict[str, dict[str, Any]] = Field(default_factory=dict)
    #: The stack versions the node was measured on (the run's ``stack.json`` entry for the node).
    stack: dict[str, Any] = Field(default_factory=dict)
    #: A link to the run's HTML report.
    report: str = ""


class Ticket(BaseModel):
    """One fault's ticket. Backends store the whole record; ``id`` is theirs (a row id, a Jira key)."""

    model_config = ConfigDict(extra="forbid")

    id: str = ""
    node: str
    gpu_uuid: str = ""
    cause: str
    gpu: int | None = None
    gpu_model: str = ""
    kind: Kind = "remediation"
    state: State = "open"
    title: str = ""
    #: What the latest verdict asks a technician to do, and its reasons, in words.
    action: str = ""
    reasons: str = ""
    #: Why the ticket became a replacement (empty while it is a remediation).
    escalation: str = ""
    occurrences: int = 0
    seen: list[AwareDatetime] = Field(default_factory=list)
    runs: list[str] = Field(default_factory=list)
    reopened: list[AwareDatetime] = Field(default_factory=list)
    remediations: list[Remediation] = Field(default_factory=list)
    evidence: list[Evidence] = Field(default_factory=list)
    created: AwareDatetime
    updated: AwareDatetime
    resolved: AwareDatetime | None = None
    #: The ticket's key in an outside system (a Jira issue key); empty for a local ticket.
    external_key: str = ""

    @property
    def fingerprint(self) -> Fingerprint:
        """The ticket's fingerprint (node, GPU UUID, cause)."""
        return Fingerprint(node=self.node, gpu_uuid=self.gpu_uuid, cause=self.cause)

    @property
    def where(self) -> str:
        """The hardware in words: ``node``, or ``node GPU 3 (GPU-…)``."""
        if not self.gpu_uuid:
            return self.node
        index = f" GPU {self.gpu}" if self.gpu is not None else ""
        return f"{self.node}{index} ({self.gpu_uuid})"

    def body(self) -> str:
        """The ticket in plain text for a person: what, why, what to do, what was done, the latest evidence."""
        lines = [
            f"{self.kind} ticket for {self.where}: cause {self.cause}, action {self.action or 'none'}",
            f"state {self.state}; seen {self.occurrences} time(s), first {self.created:%Y-%m-%d %H:%M} UTC, "
            f"last {self.updated:%Y-%m-%d %H:%M} UTC",
        ]
        if self.escalation:
            lines.append(f"escalated to replacement: {self.escalation}")
        if self.reasons:
            lines.append(f"reasons: {self.reasons}")
        if self.remediations:
            done = ", ".join(f"{r.action} at {r.at:%Y-%m-%d %H:%M}" for r in self.remediations[-10:])
            lines.append(f"remediations: {done}")
        if self.evidence:
            last = self.evidence[-1]
            lines.append(f"latest run: {last.run_id} at {last.at:%Y-%m-%d %H:%M} UTC")
            if last.report:
                lines.append(f"report: {last.report}")
            if last.stack:
                lines.append("stack: " + ", ".join(f"{k}={v}" for k, v in sorted(last.stack.items())))
            for entity, metrics in sorted(last.telemetry.items()):
                shown = ", ".join(f"{k}={_short(v)}" for k, v in sorted(metrics.items()))
                lines.append(f"telemetry {entity}: {shown}")
        return "\n".join(lines)


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


@dataclass(frozen=True)
class TicketEvent:
    """What happened to a ticket: its state after (``ticket``) and before (``previous``, None when new).

    ``kind`` names the most significant change: ``opened`` (a new ticket, possibly a replacement straight
    away), ``reopened`` (a resolved fault recurred), ``escalated`` (remediation → replacement),
    ``updated`` (another occurrence), ``resolved`` (re-certification passed and measured the fault),
    ``remediated`` (work recorded), ``kept`` (its hardware passed in a run that did not measure the fault:
    left open, and only reported).
    """

    kind: EventKind
    ticket: Ticket
    previous: Ticket | None
    detail: str
    at: datetime

    def as_dict(self) -> dict[str, Any]:
        """The event as JSON-ready data: kind, detail, time and the ticket (its latest evidence only)."""
        ticket = self.ticket.model_dump(mode="json", exclude={"evidence"})
        ticket["evidence"] = [e.model_dump(mode="json") for e in self.ticket.evidence[-1:]]
        return {"event": self.kind, "detail": self.detail, "at": self.at.isoformat(), "ticket": ticket}


class EscalationPolicy(BaseModel):
    """When a remediation ticket becomes a replacement (docs/reference/causes-and-actions.md, "Escalation").

    Any one rule escalates:

    - the same fault recurs after ``resets`` resets or reboots recorded on its ticket (gpud's
      ``DefaultRebootThreshold = 2``), except for the XIDs in ``reset_exempt_xids`` (Xid 94, a contained
      ECC error the application survives); an RDMA port's reseats count alike (``reseat_nic``,
      ``check_cable``: docs/reference/causes-and-actions.md, "Remediation playbook": a port that persists is replaced);
    - ``node_remediations`` remediations on one node within ``node_window`` (NVSentinel's
      health-events analyser: ≥ 5 within 7 days);
    - a fault of a cause in ``burst_causes`` seen ``burst_count`` times within ``burst_window``, occurrences
      closer than ``burst_merge`` counting once (NVSentinel: the same fatal XID 5× in 24 h, 3-minute bursts);
    - the fault reopens ``flaps`` times within ``flap_window``: the node alternates pass and fail
      (docs/reference/causes-and-actions.md, "Escalation"; project default: ≥ 3 times in 14 days is escalated,
      not returned).

    And one that is not about a fault's kind: a node telemetry or drift asked about that stays busy
    ``busy_nights`` nights in a row gets a ticket asking for a maintenance window (operate would otherwise
    postpone it forever).

    A verdict row whose ``ticket`` is already ``replacement`` (a row-remap failure, an NVLink baseboard
    fault) needs no rule: its ticket is a replacement from the start.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    resets: int = Field(default=2, ge=1, description="Resets or reboots after which a recurrence is hardware.")
    reset_actions: tuple[str, ...] = Field(
        # An RDMA port's remediations count too: a port down, slow or flapping is brought up, its cable or
        # transceiver reseated; when it persists, replaced (docs/reference/causes-and-actions.md, "Remediation
        # playbook").
        default=("reset_gpu", "reboot_node", "power_cycle", "reseat_nic", "check_cable"),
        description="Remediations that count as a reset (or, for a NIC, a reseat).",
    )
    reset_exempt_xids: tuple[int, ...] = Field(default=(94,), description="XIDs whose recurrence never escalates.")
    node_remediations: int = Field(default=5, ge=1, description="Remediations on one node that escalate.")
    node_window: timedelta = Field(default=timedelta(days=7), description="The window they are counted in.")
    burst_causes: tuple[str, ...] = Field(default=("xid",), description="Causes the burst rule applies to.")
    burst_count: int = Field(default=5, ge=1, description="Occurrences within the burst window that escalate.")
    burst_window: timedelta = Field(default=timedelta(hours=24), description="The burst window.")
    burst_merge: timedelta = Field(default=timedelta(minutes=3), description="Occurrences this close count once.")
    flaps: int = Field(default=3, ge=1, description="Reopenings within the flap window that escalate.")
    flap_window: timedelta = Field(default=timedelta(days=14), description="The flap window.")
    busy_nights: int = Field(
        default=3,
        ge=1,
        description="Nights in a row a node telemetry or drift asked about may stay busy (and so "
        "unre-certified) before operate opens a ticket asking for a maintenance window.",
    )
