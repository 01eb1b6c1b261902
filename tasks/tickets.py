"""The ticket step of a run: open, update, escalate or resolve one ticket per fault fingerprint."""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from datetime import UTC, datetime
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from gpucert.certify import read_run_results, read_run_verdicts
from gpucert.errors import StoreError
from gpucert.store import BaselineStore
from gpucert.tickets import RunEvidence, TicketBackend, reconcile

__all__ = ["ticket_run"]


@task(name="tickets", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=[2, 10])
def ticket_run(
    backend: TicketBackend,
    store: BaselineStore,
    run_id: str,
    day: datetime,
    *,
    unconfirmed: Collection[str],
    report: str,
    stacks: Mapping[str, Mapping[str, Any]],
) -> list[dict[str, Any]]:
    """Reconcile the tickets with the run's verdicts; returns the events (kind, ticket id, title, detail).

    A node whose fail was not confirmed by its re-runs opens no ticket (never a ticket on a guess) — but
    its rows still do not pass, so they resolve nothing either; passing rows resolve the open tickets of
    what they cover.
    """
    verdicts = read_run_verdicts(store, run_id, day.date())
    if unconfirmed:
        guess = verdicts["node"].isin(list(unconfirmed)) & (verdicts["verdict"] == "fail")
        verdicts = verdicts.assign(ticket=verdicts["ticket"].where(~guess, "none"))
    try:
        results = read_run_results(store, run_id, day.date())
    except StoreError:
        results = None
    evidence = RunEvidence(report=report, stacks=stacks, results=results)
    events = reconcile(backend, verdicts, run_id=run_id, now=datetime.now(UTC), evidence=evidence)
    out = [{"kind": e.kind, "ticket": e.ticket.id, "ticket_kind": e.ticket.kind, "node": e.ticket.node,
            "cause": e.ticket.cause, "detail": e.detail} for e in events]  # fmt: skip
    if out:
        get_run_logger().info("tickets: %s", json.dumps([(e["kind"], e["ticket"]) for e in out]))
    return out
