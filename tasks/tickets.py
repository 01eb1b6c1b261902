"""The ticket step of a run: open, update, escalate or resolve one ticket per fault fingerprint — or, with
no ticket backend, record them in the store for the next run that has one."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from gpucert.certify import CertificationRun, TicketStep, ticket_step
from gpucert.tickets import EscalationPolicy, TicketBackend, TicketEvent, record_repairs

__all__ = ["record_repairs_task", "ticket_run"]


@task(name="tickets", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 10])
def ticket_run(
    backend: TicketBackend | None, run: CertificationRun, escalation: EscalationPolicy
) -> TicketStep:
    """Reconcile the tickets with the run's settled verdicts (an unconfirmed fail asks for none; passing rows
    resolve what they cover), after any runs whose tickets were only recorded; returns what was done."""
    step = ticket_step(backend, run, now=datetime.now(UTC), escalation=escalation)
    log = get_run_logger()
    if backend is None:
        log.warning("ticketing not configured: %d tickets recorded in the store, none opened", step.recorded)
    if step.caught_up:
        log.info("opened the tickets recorded by %s", ", ".join(step.caught_up))
    if step.events:
        log.info("tickets: %s", ", ".join(f"{e.kind} {e.ticket.id}" for e in step.events))
    return step


@task(name="record repairs", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 10])
def record_repairs_task(
    backend: TicketBackend | None, nodes: Sequence[str], now: datetime, *, action: str | None, note: str
) -> list[TicketEvent]:
    """Record a repair on every open ticket of ``nodes``; returns the ticket events (none without a
    backend: there are no tickets to record on)."""
    if backend is None:
        get_run_logger().warning("ticketing not configured: no ticket to record the repair on")
        return []
    return record_repairs(backend, nodes, now, action=action, note=note, by="gpucert release")
