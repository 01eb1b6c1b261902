"""The ticket step of a run, so that no ticket decision is ever dropped.

With a ticket backend, a run reconciles its settled verdicts (open, update, escalate, resolve). Without
one (an S3 store and no ``Ticketing`` configured), the run records in the store that its tickets are
still to be opened — ``tickets/pending/run=<id>.json`` — and says so; the first run that has a backend
reconciles every pending run first, oldest first, and marks each done (``tickets/opened/run=<id>.json``;
both append-only, so two writers never lose each other's record). Reconciling a run twice changes
nothing, so a crash between the two steps only repeats work.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime

from ..store import BaselineStore
from ..tickets import EscalationPolicy, RunEvidence, TicketBackend, TicketEvent, fingerprints, reconcile
from ._run import REPORT, CertificationRun

__all__ = ["PENDING", "TicketStep", "pending_runs", "ticket_step"]

PENDING = "tickets/pending/"
_OPENED = "tickets/opened/"


@dataclass(frozen=True)
class TicketStep:
    """What the ticket step did: the events, and how many tickets were only recorded."""

    events: Sequence[TicketEvent]
    recorded: int = 0
    #: Earlier runs whose recorded tickets were opened now.
    caught_up: Sequence[str] = ()


def _marker(prefix: str, run: CertificationRun) -> str:
    return f"{prefix}run={run.run_id}.json"


def pending_runs(store: BaselineStore) -> list[CertificationRun]:
    """The runs whose tickets were recorded but not opened yet, oldest first."""
    opened = {key.removeprefix(_OPENED) for key in store.objects.list(_OPENED)}
    runs = []
    for key in store.objects.list(PENDING):
        if key.removeprefix(PENDING) in opened:
            continue
        blob = store.objects.get(key)
        if blob is None:
            continue
        record = json.loads(blob.data)
        runs.append(CertificationRun(store, str(record["run_id"]), date.fromisoformat(str(record["day"]))))
    return sorted(runs, key=lambda r: (r.day, r.run_id))


def _evidence(run: CertificationRun) -> RunEvidence:
    return RunEvidence(report=run.uri(REPORT), stacks=run.stack(), results=run.results_or_none())


def ticket_step(
    backend: TicketBackend | None,
    run: CertificationRun,
    *,
    now: datetime,
    escalation: EscalationPolicy,
) -> TicketStep:
    """Reconcile ``run``'s settled verdicts with ``backend`` (after the runs still pending), or record them
    when there is no backend. Raises what the backend raises (:class:`~gpucert.tickets.TicketError`)."""
    store = run.store
    if backend is None:
        wanted = len(fingerprints(run.verdicts()))
        record = {"run_id": run.run_id, "day": run.day.isoformat(), "tickets": wanted}
        store.objects.put(_marker(PENDING, run), json.dumps(record).encode())
        return TicketStep(events=(), recorded=wanted)
    events: list[TicketEvent] = []
    caught_up = []
    for earlier in pending_runs(store):
        if earlier.run_id != run.run_id:
            events += reconcile(backend, earlier.verdicts(), run_id=earlier.run_id, now=now,
                                evidence=_evidence(earlier), policy=escalation)  # fmt: skip
            caught_up.append(earlier.run_id)
        store.objects.put(_marker(_OPENED, earlier), b"{}")
    events += reconcile(backend, run.verdicts(), run_id=run.run_id, now=now, evidence=_evidence(run),
                        policy=escalation)  # fmt: skip
    return TicketStep(events=events, caught_up=caught_up)
