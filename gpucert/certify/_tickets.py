"""The ticket step of a run, so that no ticket decision is ever dropped (docs/design/certify-runbook.md, step
10, and "Blast radius").

With a ticket backend, a run reconciles its settled verdicts (open, update, escalate, resolve). Without one, it
records ``tickets/pending/run=<id>.json`` in the store; the first run that has a backend reconciles every pending
run first, oldest first, and marks each done (``tickets/opened/run=<id>.json``; both append-only, so two writers
never lose each other's record). Reconciling a run twice changes nothing, so a crash between the two steps only
repeats work. A run that hit the blast radius opens one ``incident`` ticket instead (:func:`held_back`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time
from typing import Any

import pandas as pd

from ..audit import AuditAction, ticket_action
from ..store import BaselineStore
from ..tickets import (
    INCIDENT_CAUSE,
    INCIDENT_NODE,
    EscalationPolicy,
    RunEvidence,
    Ticket,
    TicketBackend,
    TicketEvent,
    fingerprints,
    open_incident,
    reconcile,
    resolve_incident,
)
from ..tickets import recorded_tickets as recorded_from_verdicts
from ._decide import hard_gate_rows
from ._run import DECISIONS, REPORT, CertificationRun

PENDING = "tickets/pending/"
_OPENED = "tickets/opened/"


@dataclass(frozen=True)
class TicketStep:
    """What the ticket step did: the events, and how many tickets were only recorded."""

    events: Sequence[TicketEvent]
    recorded: int = 0
    #: Earlier runs whose recorded tickets were opened now.
    caught_up: Sequence[str] = ()
    #: The incident ticket's event, when the run hit the blast radius and a backend opened it.
    incident: TicketEvent | None = None

    @property
    def changes(self) -> list[TicketEvent]:
        """The events that changed a ticket (``kept`` ones change none)."""
        return [e for e in self.events if e.kind != "kept"]

    @property
    def kept(self) -> list[TicketEvent]:
        """The tickets kept open because the run passed their hardware without measuring their fault."""
        return [e for e in self.events if e.kind == "kept"]


def held_back(run: CertificationRun) -> pd.DataFrame:
    """The findings a blast-radius incident held back: the verdict rows (fail or warn) of the nodes whose
    taint the run refused, with a ``hard_gate`` column, hard gates first."""
    decisions = run.decisions()
    refused = set(decisions.loc[decisions["taint"].astype("string").eq("refused"), "node"].astype(str))
    verdicts = run.verdicts()
    rows = verdicts[
        verdicts["node"].astype("string").isin(refused) & verdicts["verdict"].astype("string").isin(["fail", "warn"])
    ].copy()
    rows["hard_gate"] = hard_gate_rows(rows).to_numpy(dtype=bool)
    return rows.sort_values(["hard_gate", "node"], ascending=[False, True], kind="stable").reset_index(drop=True)


def _marker(prefix: str, run: CertificationRun) -> str:
    return f"{prefix}run={run.run_id}.json"


def _pending(store: BaselineStore) -> list[tuple[CertificationRun, str | None]]:
    """The pending runs, oldest first, each with the incident it hit (None when none)."""
    opened = {key.removeprefix(_OPENED) for key in store.objects.list(_OPENED)}
    runs = []
    for key in store.objects.list(PENDING):
        if key.removeprefix(PENDING) in opened:
            continue
        blob = store.objects.get(key)
        if blob is None:
            continue
        record = json.loads(blob.data)
        run = CertificationRun(store, str(record["run_id"]), date.fromisoformat(str(record["day"])))
        runs.append((run, str(record["incident"]) if record.get("incident") else None))
    return sorted(runs, key=lambda r: (r[0].day, r[0].run_id))


def recorded_tickets(store: BaselineStore) -> list[Ticket]:
    """The tickets runs without ticketing recorded in ``store`` and no run has opened yet, one per
    fingerprint (its occurrences counted over those runs), an incident as one ``incident`` ticket per run."""
    merged: dict[str, Ticket] = {}
    for run, incident in _pending(store):
        at = datetime.combine(run.day, time(), tzinfo=UTC)
        if incident:
            findings = held_back(run)
            nodes = ", ".join(dict.fromkeys(findings["node"].astype(str)))
            merged[f"incident:{run.run_id}"] = Ticket(
                id=f"recorded:{run.run_id}",
                node=INCIDENT_NODE,
                cause=INCIDENT_CAUSE,
                kind="incident",
                title=f"[incident] {incident}",
                reasons=f"held back: {nodes}",
                occurrences=1,
                runs=[run.run_id],
                created=at,
                updated=at,
            )
            continue
        for found in recorded_from_verdicts(run.verdicts(), run_id=run.run_id, at=at):
            key = found.fingerprint.key
            before = merged.get(key)
            merged[key] = found
            if before is not None:  # recorded by an earlier run too: one ticket, one more occurrence
                more = {"occurrences": before.occurrences + 1, "runs": [*before.runs, run.run_id]}
                merged[key] = found.model_copy(update={**more, "created": before.created})
    return list(merged.values())


def _evidence(run: CertificationRun) -> RunEvidence:
    return RunEvidence(report=run.uri(REPORT), stacks=run.stack(), results=run.results_or_none())


def ticket_step(
    backend: TicketBackend | None,
    run: CertificationRun,
    *,
    now: datetime,
    escalation: EscalationPolicy,
    incident: str | None = None,
) -> TicketStep:
    """Reconcile ``run``'s settled verdicts with ``backend`` (after the runs still pending), or record them
    when there is no backend; a run that hit the blast radius (``incident``) opens one incident ticket
    instead. Raises what the backend raises (:class:`~gpucert.tickets.TicketError`)."""
    store = run.store
    if backend is None:
        wanted = 1 if incident else len(fingerprints(run.verdicts()))
        record = {"run_id": run.run_id, "day": run.day.isoformat(), "tickets": wanted, "incident": incident}
        store.objects.put(_marker(PENDING, run), json.dumps(record).encode())
        return TicketStep(events=(), recorded=wanted)
    events: list[TicketEvent] = []
    caught_up = []
    for earlier, earlier_incident in _pending(store):
        if earlier.run_id != run.run_id:
            events += _tickets_of(backend, earlier, earlier_incident, now=now, escalation=escalation)
            caught_up.append(earlier.run_id)
        store.objects.put(_marker(_OPENED, earlier), b"{}")
    own = _tickets_of(backend, run, incident, now=now, escalation=escalation)
    opened = next((e for e in own if e.ticket.kind == "incident" and e.kind != "resolved"), None)
    return TicketStep(events=events + own, caught_up=caught_up, incident=opened)


def _tickets_of(
    backend: TicketBackend, run: CertificationRun, incident: str | None, *, now: datetime, escalation: EscalationPolicy
) -> list[TicketEvent]:
    """One run's ticket events: its incident ticket when it hit the blast radius, else one per fault (and
    an incident it measured its way out of resolved)."""
    if incident:
        event = open_incident(
            backend, run_id=run.run_id, now=now, incident=incident, findings=held_back(run), report=run.uri(REPORT)
        )
        return [event] if event is not None else []
    events = reconcile(backend, run.verdicts(), run_id=run.run_id, now=now, evidence=_evidence(run), policy=escalation)
    benchmarked = set(run.decisions()["node"].astype(str)) if run.has(DECISIONS) else set()
    resolved = resolve_incident(backend, run_id=run.run_id, now=now, nodes=benchmarked)
    return events + ([resolved] if resolved is not None else [])


def incident_summary(run: CertificationRun, incident: str, step: TicketStep | None) -> dict[str, Any]:
    """The incident as JSON-ready data — for the audit trail and the ``gpucert.incident.opened`` event an
    automation pages on: the run, what happened, the ticket (or that it was only recorded), every node held
    back and its findings, hard gates first."""
    findings = held_back(run)
    ticket = step.incident.ticket if step is not None and step.incident is not None else None
    return {
        "run_id": run.run_id,
        "incident": incident,
        "ticket": (ticket.external_key or ticket.id) if ticket is not None else None,
        "ticket_recorded": ticket is None,
        "nodes": list(dict.fromkeys(findings["node"].astype(str))),
        "hard_gates": int(findings["hard_gate"].sum()),
        "findings": _listed(findings.head(50)),
        "report": run.uri(REPORT),
    }


def _listed(findings: pd.DataFrame) -> list[dict[str, Any]]:
    """The findings as JSON objects: node, GPU index (None for a node row), verdict, cause, hard gate."""
    gpu = pd.to_numeric(findings["gpu"], errors="coerce").astype("Int64")
    cause = findings["cause"].astype("string").fillna("")
    rows = zip(findings["node"], gpu, findings["verdict"], cause, findings["hard_gate"], strict=True)
    return [
        {
            "node": str(n),
            "gpu": None if pd.isna(g) else int(g),
            "verdict": str(v),
            "cause": str(c),
            "hard_gate": bool(h),
        }
        for n, g, v, c, h in rows
    ]


def ticket_audit(step: TicketStep, incident: Mapping[str, Any] | None) -> list[AuditAction]:
    """What the ticket step adds to the audit trail: each ticket changed, each kept open for want of a
    measurement (``ticket.keep``, on its node), and the incident (``incident.open``: it names no single
    node, so it sends no Event — the ``gpucert.incident.opened`` Prefect event is its page)."""
    actions = [ticket_action(e) for e in step.changes if e.ticket.kind != "incident"]
    actions += [
        AuditAction(
            "ticket.keep",
            "Ticket",
            e.ticket.id or e.ticket.title,
            api_version="gpucert.io/v1",
            after={"node": e.ticket.node, "cause": e.ticket.cause, "state": "open"},
            why=e.detail,
        )
        for e in step.kept
    ]
    if incident is not None:
        actions.append(
            AuditAction(
                "incident.open",
                "Incident",
                str(incident["run_id"]),
                api_version="gpucert.io/v1",
                after=dict(incident),
                why=str(incident["incident"]),
            )
        )
    return actions
