"""The report's "What was done" section: the run's settled decisions, what it changed on each node (labels,
taints, the condition) and what it did to tickets — the part of the page a person who gets the link needs
first, because it says what the run left behind in the cluster and in the ticket system."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from .._text import counted
from ._common import json_value, require_columns
from ._rows import DECISION_KEYS

if TYPE_CHECKING:
    from ..tickets import TicketEvent

__all__ = ["DoneView", "done_view"]

#: The states in the order the page counts them, worst first.
_STATES = ("failed", "degraded", "inconclusive", "certified")


@dataclass(frozen=True)
class DoneView:
    """What the section shows: one line of counts, the rows of decided nodes worth reading, the ticket
    events, and notes (the incident, nodes left out, tickets only recorded)."""

    headline: str
    decisions: list[dict[str, Any]]
    tickets: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)
    incident: str = ""


def done_view(
    decisions: pd.DataFrame,
    *,
    actions: Mapping[str, str] | None = None,
    tickets: Sequence[TicketEvent] | None = None,
    tickets_recorded: int = 0,
    incident: str = "",
    max_rows: int = 500,
) -> DoneView:
    """The section from the settled ``decisions`` (``decisions.parquet`` rows), ``actions`` (node → what the
    run changed on it), its ticket events (``tickets``), how many tickets were only recorded (no backend) and
    the blast-radius ``incident``: every node changed or not certified listed (worst first, at most
    ``max_rows``), the rest counted. Raises ``ValueError`` when ``decisions`` lacks a column it reads."""
    require_columns(decisions, DECISION_KEYS, "decisions")
    actions = dict(actions or {})
    frame = decisions.loc[:, list(DECISION_KEYS)].copy()
    state = frame["state"].astype("string").fillna("unchanged")
    frame["done"] = frame["node"].astype(object).map(actions).astype("string").fillna("")
    quiet = (state == "certified") & (frame["done"] == "")
    shown = frame[~quiet.to_numpy()]
    order = pd.Categorical(shown["state"].astype("string").fillna("unchanged"), [*_STATES, "unchanged"], ordered=True)
    shown = shown.assign(_order=order).sort_values(["_order", "node"], kind="stable").drop(columns="_order")
    rows = [{str(k): json_value(v) for k, v in r.items()} for r in shown.head(max_rows).to_dict("records")]
    notes = []
    if len(shown) > max_rows:
        notes.append(f"{counted(len(shown) - max_rows, 'more node')} not listed: decisions.parquet has them all.")
    if quiet.any():
        notes.append(f"{counted(int(quiet.sum()), 'node')} certified and left as they were: not listed.")
    events = [_ticket_row(e) for e in tickets or ()]
    if tickets_recorded:
        notes.append(
            f"Ticketing is not configured: {counted(tickets_recorded, 'ticket')} recorded in the store, "
            "none opened; the next run with a ticket backend opens them."
        )
    return DoneView(
        headline=_headline(state, frame, actions, events),
        decisions=rows,
        tickets=events,
        notes=notes,
        incident=incident,
    )


def _headline(state: pd.Series, frame: pd.DataFrame, actions: Mapping[str, str], events: list[dict[str, Any]]) -> str:
    counts = state.value_counts()
    decided = ", ".join(f"{int(counts[s]):,} {s}" for s in (*_STATES, "unchanged") if s in counts)
    parts = [f"{counted(len(frame), 'node')} decided" + (f" ({decided})" if decided else "")]
    done = pd.Series(list(actions.values()), dtype="string")
    tainted, lifted = int(done.str.contains("tainted ").sum()), int(done.str.contains("taints lifted").sum())
    parts.append(f"{counted(tainted, 'taint')} added, {lifted:,} lifted" if len(done) else "no node changed")
    if events:
        kinds = pd.Series([e["event"] for e in events]).value_counts()
        parts.append(counted(len(events), "ticket event") + ": " + ", ".join(f"{n:,} {k}" for k, n in kinds.items()))
    else:
        parts.append("no ticket changed")
    return "; ".join(parts) + "."


def _ticket_row(event: TicketEvent) -> dict[str, Any]:
    ticket = event.ticket
    return {
        "event": event.kind,
        "ticket": ticket.external_key or ticket.id,
        "where": ticket.where,
        "kind": ticket.kind,
        "state": ticket.state,
        "cause": ticket.cause,
        "detail": event.detail or ticket.title,
    }
