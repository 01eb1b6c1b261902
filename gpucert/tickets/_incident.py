"""Tickets no single verdict row opens: a blast-radius incident, and a busy node's maintenance window.

A run that would taint more nodes than the blast radius allows taints none (the baseline, the benchmark or
the stack is the likelier culprit) and opens one ``incident`` ticket (one fingerprint: :data:`INCIDENT_NODE`,
cause ``blast_radius``) naming every node held back and its findings, hard gates first, so a row-remap
failure is never lost in the crowd. A node that telemetry or drift asked about, busy ``busy_nights`` nights
in a row, gets a ``maintenance_window`` ticket; its next passing certification resolves it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import partial

import pandas as pd

from ._causes import _text
from ._lifecycle import _occurred, _resolve
from ._model import Evidence, Fingerprint, Kind, Ticket, TicketBackend, TicketEvent

__all__ = [
    "INCIDENT_CAUSE",
    "INCIDENT_NODE",
    "MAINTENANCE_CAUSE",
    "ask_maintenance_window",
    "open_incident",
    "resolve_incident",
]

#: The incident ticket's "node": no Kubernetes node can have this name (``_`` is not allowed in one).
INCIDENT_NODE = "_fleet"
INCIDENT_CAUSE = "blast_radius"
MAINTENANCE_CAUSE = "maintenance_window"
#: The findings an incident ticket lists one by one (every node is named all the same).
_MAX_LISTED = 100
_INCIDENT = Fingerprint(node=INCIDENT_NODE, cause=INCIDENT_CAUSE)


def _finding_lines(findings: pd.DataFrame) -> list[str]:
    """One line per finding: ``node GPU 3: row_remap (hard gate): <first reason>``."""
    gpu = pd.to_numeric(findings["gpu"], errors="coerce").astype("Int64").astype("string")
    where = _text(findings["node"]) + (" GPU " + gpu).fillna("")
    gate = findings["hard_gate"].map({True: " (hard gate)", False: ""}).astype("string")
    reason = _text(findings["reasons"]).str.split(";").str[0].str.strip()
    lines = where + ": " + _text(findings["verdict"]) + " " + _text(findings["cause"]) + gate + ": " + reason
    return [str(x) for x in lines]


def open_incident(
    backend: TicketBackend, *, run_id: str, now: datetime, incident: str, findings: pd.DataFrame, report: str = ""
) -> TicketEvent | None:
    """Open (or update, or reopen) the one incident ticket for ``run_id``'s blast-radius incident.

    ``findings`` are the verdict rows held back (the refused nodes' fails and warns) with a boolean
    ``hard_gate`` column; they are listed hard gates first. Returns the event (None when this run was
    already counted). Raises what the backend raises.
    """
    ordered = findings.sort_values(["hard_gate", "node"], ascending=[False, True], kind="stable")
    nodes = list(dict.fromkeys(str(n) for n in _text(ordered["node"])))
    hard = int(ordered["hard_gate"].sum())
    lines = _finding_lines(ordered)
    shown = lines[:_MAX_LISTED] + ([f"… and {len(lines) - _MAX_LISTED} more"] if len(lines) > _MAX_LISTED else [])
    reasons = f"{incident}. Held back: {', '.join(nodes)}. Findings, hard gates first: " + "; ".join(shown)
    records = json.loads(ordered.head(_MAX_LISTED).to_json(orient="records", date_format="iso"))
    evidence = Evidence(run_id=run_id, at=now, verdicts=records, report=report)
    title = (
        f"[incident] blast radius: {len(nodes)} node{'s' * (len(nodes) != 1)} held back"
        f" ({hard} hard gate{'s' * (hard != 1)})"
    )
    return backend.change(
        _INCIDENT,
        partial(
            _occur_special,
            fingerprint=_INCIDENT,
            kind="incident",
            run_id=run_id,
            now=now,
            title=title,
            action="investigate the baseline, benchmark or stack; then gpucert release the real faults",
            reasons=reasons,
            evidence=evidence,
        ),
    )


def resolve_incident(backend: TicketBackend, *, run_id: str, now: datetime, nodes: Iterable[str]) -> TicketEvent | None:
    """Resolve the open incident ticket, if any, when ``run_id`` — settled within the blast radius —
    benchmarked every node the incident held back (``nodes``: the run's); a smaller run says nothing of
    the fleet-wide cause. None when nothing was resolved."""
    open_now = backend.tickets(state="open", nodes=[INCIDENT_NODE])
    if not open_now:
        return None
    latest = open_now[-1].evidence[-1].verdicts if open_now[-1].evidence else []
    held = {str(r.get("node")) for r in latest if r.get("node")}
    if not held or not held <= set(nodes):
        return None
    why = f"gpucert's taints in force are back within the blast radius, all {len(held)} held-back nodes re-measured"
    return backend.change(_INCIDENT, partial(_resolve, run_id=run_id, now=now, why=why))


def ask_maintenance_window(
    backend: TicketBackend, node: str, *, nights: int, why: str, run_id: str, now: datetime
) -> TicketEvent | None:
    """Open (or reopen) ``node``'s ticket asking for a maintenance window: telemetry or drift asked to
    re-certify it, and it was busy for ``nights`` nights in a row. None when it is already open."""
    fingerprint = Fingerprint(node=node, cause=MAINTENANCE_CAUSE)
    reasons = f"{why}; busy {nights} nights in a row, so never re-certified"
    evidence = Evidence(run_id=run_id, at=now)
    return backend.change(
        fingerprint,
        partial(
            _occur_special,
            fingerprint=fingerprint,
            kind="remediation",
            run_id=run_id,
            now=now,
            title=f"[remediation] {node} {MAINTENANCE_CAUSE}: drain it for a maintenance window to re-certify",
            action="maintenance_window",
            reasons=reasons,
            evidence=evidence,
            only_new=True,
        ),
    )


def _occur_special(
    current: Ticket | None,
    others: Sequence[Ticket],
    *,
    fingerprint: Fingerprint,
    kind: Kind,
    run_id: str,
    now: datetime,
    title: str,
    action: str,
    reasons: str,
    evidence: Evidence,
    only_new: bool = False,
) -> TicketEvent | None:
    """The change a special ticket's occurrence makes (a :data:`~gpucert.tickets.Change`)."""
    del others
    if current is not None and (run_id in current.runs or (only_new and current.state == "open")):
        return None
    ticket, event = _occurred(current, fingerprint, kind, run_id=run_id, now=now, evidence=evidence)
    ticket.title, ticket.action, ticket.reasons = title, action, reasons
    return TicketEvent(
        kind=event, ticket=ticket, previous=current, detail=f"{event} by run {run_id}: {reasons}", at=now
    )
