"""The ticket step of a run: open, update, escalate or resolve one ticket per fault fingerprint — or, with
no ticket backend, record them in the store for the next run that has one. A blast-radius incident opens
one incident ticket instead; a busy node telemetry asked about for too many nights, one asking for a
maintenance window."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from gpucert.certify import CertificationRun, TicketStep, ticket_step
from gpucert.tickets import EscalationPolicy, TicketBackend, TicketEvent, ask_maintenance_window, record_repairs

from ._retry import may_pass

__all__ = ["maintenance_tickets", "record_repairs_task", "ticket_run"]


@task(name="tickets", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=may_pass)
def ticket_run(
    backend: TicketBackend | None, run: CertificationRun, escalation: EscalationPolicy, incident: str | None = None
) -> TicketStep:
    """Reconcile the tickets with the run's settled verdicts (an unconfirmed fail asks for none; passing rows
    resolve what they cover and measured), after any runs whose tickets were only recorded — or, for a run
    that hit the blast radius (``incident``), open its one incident ticket; returns what was done."""
    step = ticket_step(backend, run, now=datetime.now(UTC), escalation=escalation, incident=incident)
    log = get_run_logger()
    if backend is None:
        log.warning("ticketing not configured: %d tickets recorded in the store, none opened", step.recorded)
    if step.caught_up:
        log.info("opened the tickets recorded by %s", ", ".join(step.caught_up))
    if step.changes:
        log.info("tickets: %s", ", ".join(f"{e.kind} {e.ticket.id}" for e in step.changes))
    for kept in step.kept:
        log.warning("ticket %s: %s", kept.ticket.id, kept.detail)
    if step.incident is not None:
        log.error("incident ticket %s: %s", step.incident.ticket.id, step.incident.ticket.title)
    return step


@task(
    name="maintenance tickets",
    cache_policy=NO_CACHE,
    retries=2,
    retry_delay_seconds=[2, 10],
    retry_condition_fn=may_pass,
)
def maintenance_tickets(
    backend: TicketBackend | None, overdue: Mapping[str, str], *, nights: int, run_id: str
) -> list[TicketEvent]:
    """Ask for a maintenance window on each ``overdue`` node (node → why telemetry or drift asked, busy
    ``nights`` nights in a row); returns the tickets opened (none already open is opened twice)."""
    if not overdue:
        return []
    log = get_run_logger()
    if backend is None:
        log.warning("ticketing not configured: no ticket asks for a maintenance window on %s", ", ".join(overdue))
        return []
    now = datetime.now(UTC)
    asked = (
        ask_maintenance_window(backend, node, nights=nights, why=why, run_id=run_id, now=now)
        for node, why in sorted(overdue.items())
    )
    events = [e for e in asked if e is not None]
    for event in events:
        log.warning("ticket %s: %s", event.ticket.id, event.ticket.title)
    return events


@task(name="record repairs", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=may_pass)
def record_repairs_task(
    backend: TicketBackend | None, nodes: Sequence[str], now: datetime, *, action: str | None, note: str
) -> list[TicketEvent]:
    """Record a repair on every open ticket of ``nodes``; returns the ticket events (none without a
    backend: there are no tickets to record on). An action that does not fit a ticket's cause is refused
    (``TicketActionError``, never retried) before anything is recorded."""
    if backend is None:
        get_run_logger().warning("ticketing not configured: no ticket to record the repair on")
        return []
    return record_repairs(backend, nodes, now, action=action, note=note, by="gpucert release")
