"""The ticket model: what a ticket is, what happens to it, the rules that escalate it (a fingerprint's one
ticket for life: see :mod:`gpucert.tickets`), and the protocol every ticket backend implements."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gpucert.errors import TicketConfigError, TicketError, TicketNotFound

__all__ = [
    "MAX_EVIDENCE",
    "Change",
    "EscalationPolicy",
    "EventKind",
    "Evidence",
    "Fingerprint",
    "Kind",
    "Remediation",
    "State",
    "Ticket",
    "TicketBackend",
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
    """What happened to a ticket: its state after (``ticket``) and before (``previous``, None when new);
    ``kind`` names the most significant change (``escalated`` over ``updated`` or ``reopened``)."""

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
    """When a remediation ticket becomes a replacement: any one rule escalates. The rules, their defaults and
    their precedents (gpud, NVSentinel) are docs/reference/causes-and-actions.md, "Escalation"; a row whose
    ticket is already ``replacement`` needs none. ``busy_nights`` is no escalation: a node telemetry or drift
    asked about that stays busy that many nights gets a ticket asking for a maintenance window."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    resets: int = Field(default=2, ge=1, description="Resets or reboots after which a recurrence is hardware.")
    reset_actions: tuple[str, ...] = Field(
        # An RDMA port's remediations count too: when a reseat does not cure a port, it is replaced.
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


#: A change to one fingerprint's ticket: given its ticket (None if it never had one) and the other tickets
#: of its node (any state), the event to store, or None to change nothing. A change may raise to abort.
Change = Callable[[Ticket | None, Sequence[Ticket]], TicketEvent | None]


@runtime_checkable
class TicketBackend(Protocol):
    """Where tickets live. The lifecycle (:func:`gpucert.tickets.reconcile`) is written against this alone.

    ``change`` is the only write: the backend reads the fingerprint's ticket and its node's other tickets,
    calls the change, stores the event's ticket and announces it (a Jira comment, a webhook POST), as one
    step where the backend allows it (a SQLite transaction; Jira has none, see :class:`JiraTickets`).
    """

    def change(self, fingerprint: Fingerprint, change: Change) -> TicketEvent | None:
        """Apply ``change`` to the fingerprint's ticket; returns the stored event (its ticket carries the
        backend's id) or None when the change made none. Raises :class:`TicketError` when the backend fails
        (nothing is stored then) and whatever ``change`` raises."""
        ...

    def get(self, ticket_id: str) -> Ticket:
        """The ticket with this id; raises :class:`TicketNotFound` when there is none."""
        ...

    def tickets(self, *, state: State | None = None, nodes: Iterable[str] | None = None) -> list[Ticket]:
        """Every ticket (in ``state``, on ``nodes``, when given), oldest first."""
        ...
