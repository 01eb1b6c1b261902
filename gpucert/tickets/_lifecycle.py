"""The ticket lifecycle, as pure logic over a :class:`TicketBackend`: open, update, escalate, resolve.

:func:`reconcile` takes one run's verdict table: every ``fail`` or ``warn`` row asking for a ticket is an
occurrence of its fingerprint (a node-wide cause, written on every GPU row of the node, is one node-level
fingerprint); a row asking for a replacement, or an :class:`EscalationPolicy` rule, escalates a remediation.
An open ticket whose hardware passes — its GPU (or one replaced at the same index), every row of its node —
is resolved only when the run measured what the fault was found on (the clearing rule of :mod:`._causes`):
a pass that did not is reported as a ``kept`` event. A run reconciled twice changes nothing the second time.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, cast

import pandas as pd

from gpucert._crashpoints import crashpoint
from gpucert.metrics import METRICS
from gpucert.verdict import TICKET_RANK, VERDICT_RANK

from ._causes import _text, check_action, fault_metrics, measured, not_measured
from ._model import (
    MAX_EVIDENCE,
    MAX_HISTORY,
    EscalationPolicy,
    EventKind,
    Evidence,
    Fingerprint,
    Kind,
    Remediation,
    Ticket,
    TicketBackend,
    TicketError,
    TicketEvent,
    TicketNotFound,
)

__all__ = [
    "RunEvidence",
    "fingerprints",
    "reconcile",
    "record_remediation",
    "record_repairs",
    "recorded_tickets",
    "title_of",
]

_REQUIRED = ("node", "gpu", "gpu_uuid", "verdict", "cause", "action", "ticket", "reasons")
_FLAGGED = ("fail", "warn")
_TICKETED = ("remediation", "replacement")
#: Where an escalation's reason points its reader for the rule that fired.
_RULES = "docs/reference/causes-and-actions.md#escalation"
#: Telemetry and events copied into a ticket's evidence; for these a lower value is the worse one.
_TELEMETRY = tuple(m.name for m in METRICS.values() if m.kind in ("telemetry", "event"))
_WORST_IS_LOW = frozenset({"pcie_gen", "pcie_width", "gpu_count"})


@dataclass(frozen=True)
class RunEvidence:
    """What a run adds to each of its tickets besides the verdict rows: its results table (long format; the
    flagged GPUs' and nodes' telemetry and events are taken from it), each node's stack versions (the run's
    ``stack.json``) and a link to its HTML report."""

    report: str = ""
    stacks: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    results: pd.DataFrame | None = None


def title_of(ticket: Ticket) -> str:
    """A ticket's one-line title: ``[kind] node GPU i cause: action``."""
    if not ticket.gpu_uuid:
        gpu = ""
    elif ticket.gpu is not None:
        gpu = f" GPU {ticket.gpu}"
    else:
        gpu = f" {ticket.gpu_uuid}"
    action = f": {ticket.action}" if ticket.action else ""
    return f"[{ticket.kind}] {ticket.node}{gpu} {ticket.cause}{action}"


# --- reconcile -------------------------------------------------------------------------------------------


def reconcile(
    backend: TicketBackend,
    verdicts: pd.DataFrame,
    *,
    run_id: str,
    now: datetime,
    evidence: RunEvidence | None = None,
    policy: EscalationPolicy | None = None,
) -> list[TicketEvent]:
    """Bring the tickets in line with one run's verdicts; returns what changed, occurrences first. Raises
    :class:`TicketError` for a table without a needed column or a naive ``now``, and whatever the backend
    raises (each fingerprint's change is atomic: reconciling the run again finishes the rest)."""
    _check(verdicts, now)
    policy = policy or EscalationPolicy()
    evidence = evidence or RunEvidence()
    flagged = _flagged(verdicts)
    events: list[TicketEvent] = []
    if len(flagged):
        records = json.loads(
            flagged[[c for c in verdicts.columns if not c.startswith("_")]].to_json(orient="records", date_format="iso")
        )
        telemetry = _telemetry(evidence.results, set(flagged["_node"]))
        for _, rows in flagged.groupby("_key", sort=True):
            first = rows.iloc[0]
            fingerprint = Fingerprint(node=first["_node"], gpu_uuid=first["_uuid"], cause=first["_cause"])
            occurrence = _occurrence_of(
                fingerprint, rows, [records[i] for i in rows["_pos"]], telemetry, evidence, run_id, now, policy
            )
            event = backend.change(fingerprint, partial(_occur, occurrence=occurrence, policy=policy))
            if event is not None:
                events.append(event)
            crashpoint("between-tickets")
    events += _resolve_passing(
        backend, verdicts, set(flagged["_key"]), run_id=run_id, now=now, results=evidence.results
    )
    return events


def _check(verdicts: pd.DataFrame, now: datetime) -> None:
    missing = [c for c in _REQUIRED if c not in verdicts.columns]
    if missing:
        raise TicketError(f"the verdict table lacks column(s) {missing}: it is not a gpucert verdict table")
    if now.tzinfo is None or now.utcoffset() is None:
        raise TicketError("reconcile needs an aware time (UTC), got a naive datetime")


def recorded_tickets(verdicts: pd.DataFrame, *, run_id: str, at: datetime) -> list[Ticket]:
    """The tickets ``run_id``'s verdicts ask for, as a run without ticketing recorded them (not opened: no
    id, one occurrence each), by fingerprint."""
    flagged = _flagged(verdicts)
    if flagged.empty:
        return []
    order = flagged["ticket"].map(TICKET_RANK) * 10 + flagged["verdict"].map(VERDICT_RANK)
    worst = flagged.assign(_order=order).sort_values("_order", ascending=False, kind="stable")
    worst = worst.drop_duplicates("_key").sort_values("_key")
    replacement = set(flagged.loc[flagged["ticket"].eq("replacement"), "_key"])
    gpu = worst["gpu"].astype("Int64")
    out = []
    for key, node, uuid, cause, action, index in zip(
        worst["_key"], worst["_node"], worst["_uuid"], worst["_cause"], _text(worst["action"]), gpu, strict=True
    ):
        ticket = Ticket(
            id=f"recorded:{run_id}",
            node=node,
            gpu_uuid=uuid,
            cause=cause,
            action=action,
            gpu=int(index) if uuid and pd.notna(index) else None,
            kind="replacement" if key in replacement else "remediation",
            occurrences=1,
            seen=[at],
            runs=[run_id],
            created=at,
            updated=at,
        )
        out.append(ticket.model_copy(update={"title": title_of(ticket)}))
    return out


def fingerprints(verdicts: pd.DataFrame) -> list[str]:
    """The fingerprints (``node/uuid/cause``) whose tickets a run's verdicts would open or update."""
    return sorted(set(_flagged(verdicts)["_key"]) - {""})


def _flagged(verdicts: pd.DataFrame) -> pd.DataFrame:
    """The rows that ask for a ticket, with their fingerprint: ``_node``, ``_uuid``, ``_cause``, ``_key``."""
    node = _text(verdicts["node"])
    is_gpu = verdicts["gpu"].notna() & node.ne("")
    mask = verdicts["verdict"].isin(_FLAGGED) & verdicts["ticket"].isin(_TICKETED) & node.ne("")
    flagged = verdicts.loc[mask].copy()
    if flagged.empty:
        return flagged.assign(_node="", _uuid="", _cause="", _key="", _pos=0, _gpu=False)
    flagged["_node"] = node[mask]
    flagged["_gpu"] = is_gpu[mask]
    uuid = _text(flagged["gpu_uuid"])
    index = flagged["gpu"].astype("Int64").astype("string").fillna("")
    # A GPU that reports nothing has no UUID: its index on the node names it, so two never share a ticket.
    uuid = uuid.mask(flagged["_gpu"] & uuid.eq(""), "gpu" + index)
    flagged["_uuid"] = uuid.where(flagged["_gpu"], "")
    cause = _text(flagged["cause"])
    flagged["_cause"] = cause.mask(cause.eq(""), "unknown")

    # A cause on every GPU row of a node (two or more) is the node's: one ticket, not one per GPU.
    gpus_per_node = is_gpu.groupby(node).sum()
    gpu_rows = flagged[flagged["_gpu"]]
    per_cause = gpu_rows.groupby(["_node", "_cause"]).size()
    if len(per_cause):
        total = gpus_per_node.reindex(per_cause.index.get_level_values("_node")).to_numpy()
        wide = per_cause.index[(per_cause.to_numpy() == total) & (total >= 2)]
        if len(wide):
            pairs = pd.MultiIndex.from_arrays([flagged["_node"], flagged["_cause"]])
            flagged.loc[flagged["_gpu"].to_numpy() & pairs.isin(wide), "_uuid"] = ""
    # Fingerprint.key, vectorised.
    shown_uuid = flagged["_uuid"].mask(flagged["_uuid"].eq(""), "-")
    flagged["_key"] = flagged["_node"] + "/" + shown_uuid + "/" + flagged["_cause"]
    flagged["_pos"] = range(len(flagged))
    return flagged


def _telemetry(results: pd.DataFrame | None, nodes: set[str]) -> dict[tuple[str, str], dict[str, Any]]:
    """(node, GPU UUID or "") → {metric: worst value} for the flagged nodes; XIDs as a list of codes."""
    if results is None or results.empty or not nodes:
        return {}
    node = _text(results["node"])
    keep = node.isin(nodes) & results["metric"].isin(_TELEMETRY)
    if not keep.any():
        return {}
    rows = pd.DataFrame(
        {
            "node": node[keep],
            "uuid": _text(results.loc[keep, "gpu_uuid"]) if "gpu_uuid" in results else "",
            "metric": _text(results.loc[keep, "metric"]),
            "value": pd.to_numeric(results.loc[keep, "value"], errors="coerce"),
        }
    )
    out: dict[tuple[str, str], dict[str, Any]] = {}
    events = rows["metric"].isin(["xid"])
    gauges = rows[~events]
    grouped = gauges.groupby(["node", "uuid", "metric"])["value"]
    high, low = grouped.max(), grouped.min()
    worst = high.where(~high.index.get_level_values("metric").isin(list(_WORST_IS_LOW)), low)
    for key, v in worst.dropna().items():
        n, u, m = cast(tuple[str, str, str], key)
        out.setdefault((n, u), {})[m] = float(v)
    xids = rows[events].dropna(subset=["value"]).groupby(["node", "uuid"])["value"].unique()
    for key, codes in xids.items():
        n, u = cast(tuple[str, str], key)
        out.setdefault((n, u), {})["xid"] = sorted({int(c) for c in codes})
    return out


@dataclass(frozen=True)
class _Occurrence:
    """One fingerprint's rows in a run, reduced to what a ticket takes from them."""

    fingerprint: Fingerprint
    run_id: str
    now: datetime
    verdict: str
    kind: Kind
    action: str
    reasons: str
    gpu: int | None
    gpu_model: str
    reset_exempt: bool
    evidence: Evidence


def _occurrence_of(
    fingerprint: Fingerprint,
    rows: pd.DataFrame,
    records: list[dict[str, Any]],
    telemetry: Mapping[tuple[str, str], Mapping[str, Any]],
    run: RunEvidence,
    run_id: str,
    now: datetime,
    policy: EscalationPolicy,
) -> _Occurrence:
    # The worst row speaks for the fingerprint: a replacement over a remediation, a fail over a warn.
    order = rows["ticket"].map(TICKET_RANK) * 10 + rows["verdict"].map(VERDICT_RANK)
    worst = rows.iloc[int(order.to_numpy().argmax())]
    kind: Kind = "replacement" if (rows["ticket"] == "replacement").any() else "remediation"
    # Exempt from the reset rule only when every row is an exempt XID (Xid 94 with nothing worse).
    exempt = "metric" in rows and "value" in rows
    if exempt:
        is_xid = _text(rows["metric"]).eq("xid")
        codes = pd.to_numeric(rows["value"], errors="coerce")
        exempt = bool((is_xid & codes.isin(list(policy.reset_exempt_xids))).all())
    gpu = worst["gpu"]
    seen: dict[str, dict[str, Any]] = {}
    node = fingerprint.node
    if (node, "") in telemetry:
        seen["node"] = dict(telemetry[(node, "")])
    for uuid in sorted(set(_text(rows["gpu_uuid"])) - {""}):
        if (node, uuid) in telemetry:
            seen[uuid] = dict(telemetry[(node, uuid)])
    reasons = "; ".join(dict.fromkeys(r for r in _text(rows["reasons"]) if r))
    return _Occurrence(
        fingerprint=fingerprint,
        run_id=run_id,
        now=now,
        verdict=str(worst["verdict"]),
        kind=kind,
        action=str(worst["action"]) if pd.notna(worst["action"]) else "",
        reasons=reasons,
        gpu=int(gpu) if fingerprint.gpu_uuid and pd.notna(gpu) else None,
        gpu_model=str(worst["gpu_model"]) if "gpu_model" in rows and pd.notna(worst["gpu_model"]) else "",
        reset_exempt=exempt,
        evidence=Evidence(
            run_id=run_id,
            at=now,
            verdicts=records,
            telemetry=seen,
            stack=dict(run.stacks.get(node, {})),
            report=run.report,
        ),
    )


def _occur(
    current: Ticket | None, others: Sequence[Ticket], *, occurrence: _Occurrence, policy: EscalationPolicy
) -> TicketEvent | None:
    """The change one occurrence makes to its fingerprint's ticket (a :data:`Change`)."""
    o = occurrence
    if current is not None and o.run_id in current.runs:
        return None  # this run was already counted
    ticket, kind = _occurred(current, o.fingerprint, "remediation", run_id=o.run_id, now=o.now, evidence=o.evidence)
    detail = f"opened: {o.verdict} in run {o.run_id}"
    if current is not None:
        what = f"reopened: {o.verdict} again" if kind == "reopened" else f"recurred: {o.verdict}"
        detail = f"{what} in run {o.run_id} (occurrence {ticket.occurrences})"
    ticket.action = o.action
    ticket.reasons = o.reasons
    ticket.gpu = o.gpu if o.gpu is not None else ticket.gpu
    ticket.gpu_model = o.gpu_model or ticket.gpu_model
    if ticket.kind == "remediation":
        why = _escalation_reason(ticket, others, occurrence=o, recurrence=current is not None, policy=policy)
        if why:
            ticket.kind = "replacement"
            ticket.escalation = why
            if kind != "opened":
                kind = "escalated"
            detail = f"{detail}; escalated to replacement: {why}"
    ticket.title = title_of(ticket)
    if o.reasons:
        detail = f"{detail}: {o.reasons}"
    return TicketEvent(kind=kind, ticket=ticket, previous=current, detail=detail, at=o.now)


def _occurred(
    current: Ticket | None, fingerprint: Fingerprint, kind: Kind, *, run_id: str, now: datetime, evidence: Evidence
) -> tuple[Ticket, EventKind]:
    """The fingerprint's ticket with one more occurrence — new (of ``kind``), again, or reopened when it was
    resolved — and which of these it is; its history kept to the last :data:`MAX_HISTORY`."""
    event: EventKind = "opened"
    if current is None:
        ticket = Ticket(
            node=fingerprint.node,
            gpu_uuid=fingerprint.gpu_uuid,
            cause=fingerprint.cause,
            kind=kind,
            created=now,
            updated=now,
        )
    else:
        ticket = current.model_copy(deep=True)
        event = "updated"
        if current.state == "resolved":
            ticket.state, ticket.resolved, event = "open", None, "reopened"
            ticket.reopened = [*ticket.reopened, now][-MAX_HISTORY:]
    ticket.occurrences += 1
    ticket.seen = [*ticket.seen, now][-MAX_HISTORY:]
    ticket.runs = [*ticket.runs, run_id][-MAX_HISTORY:]
    ticket.evidence = [*ticket.evidence, evidence][-MAX_EVIDENCE:]
    ticket.updated = now
    return ticket, event


def _escalation_reason(
    ticket: Ticket, others: Sequence[Ticket], *, occurrence: _Occurrence, recurrence: bool, policy: EscalationPolicy
) -> str:
    """Why ``ticket`` (already counting this occurrence) must become a replacement, or ``""``."""
    now = occurrence.now
    if occurrence.kind == "replacement":
        return f"the verdict asks for a replacement ({occurrence.action or 'replace'})"
    resets = [r for r in ticket.remediations if r.action in policy.reset_actions and r.at <= now]
    if recurrence and not occurrence.reset_exempt and len(resets) >= policy.resets:
        done = ", ".join(f"{r.action} {r.at:%Y-%m-%d %H:%M}" for r in resets[-policy.resets :])
        return f"the fault recurred after {len(resets)} resets or reboots ({done}); {_RULES}"
    recent = [r for t in (ticket, *others) for r in t.remediations if now - policy.node_window < r.at <= now]
    if len(recent) >= policy.node_remediations:
        days = policy.node_window.total_seconds() / 86400
        return f"{len(recent)} remediations on {ticket.node} within {days:g} days; {_RULES}"
    if ticket.cause in policy.burst_causes:
        bursts = _bursts([t for t in ticket.seen if now - policy.burst_window < t <= now], policy)
        if bursts >= policy.burst_count:
            hours = policy.burst_window.total_seconds() / 3600
            return f"seen in {bursts} separate bursts within {hours:g} h; {_RULES}"
    flaps = [t for t in ticket.reopened if now - policy.flap_window < t <= now]
    if len(flaps) >= policy.flaps:
        days = policy.flap_window.total_seconds() / 86400
        return f"it failed again after passing {len(flaps)} times within {days:g} days (flapping); {_RULES}"
    return ""


def _bursts(times: Sequence[datetime], policy: EscalationPolicy) -> int:
    """How many bursts ``times`` make: a time within ``burst_merge`` of the burst's start joins it."""
    count = 0
    start: datetime | None = None
    for t in sorted(times):
        if start is None or t - start >= policy.burst_merge:
            count += 1
            start = t
    return count


# --- resolution ------------------------------------------------------------------------------------------


def _resolve_passing(
    backend: TicketBackend,
    verdicts: pd.DataFrame,
    recurring: set[str],
    *,
    run_id: str,
    now: datetime,
    results: pd.DataFrame | None,
) -> list[TicketEvent]:
    """Resolve the open tickets whose hardware passes in this run and that the run measured (the clearing
    rule, :func:`gpucert.tickets.measured`, when ``results`` says what it measured); returns the events,
    a ``kept`` one (stored nowhere) for each ticket that passed unmeasured."""
    node = _text(verdicts["node"])
    judged = node.ne("")
    if not judged.any():
        return []
    passing = verdicts["verdict"].eq("pass")
    is_gpu = verdicts["gpu"].notna() & judged
    uuid = _text(verdicts["gpu_uuid"])
    seen_uuids = set(uuid[is_gpu]) - {""}
    passing_uuids = set(uuid[is_gpu & passing]) - {""}
    index = verdicts["gpu"].astype("Int64")
    passing_slots = set(zip(node[is_gpu & passing], index[is_gpu & passing].astype(int), strict=True))
    node_flagged = (~passing[judged]).groupby(node[judged]).any()
    nodes_passing = set(node_flagged.index[~node_flagged.to_numpy()])

    passing_tickets = []
    for ticket in backend.tickets(state="open", nodes=set(node[judged])):
        if ticket.fingerprint.key in recurring:
            continue
        why = _passes(ticket, seen_uuids, passing_uuids, passing_slots, nodes_passing)
        if why:
            passing_tickets.append((ticket, why))
    events: list[TicketEvent] = []
    for (ticket, why), seen in zip(passing_tickets, _measured(passing_tickets, results), strict=True):
        if not seen:
            events.append(_kept(ticket, run_id=run_id, now=now))
            continue
        event = backend.change(ticket.fingerprint, partial(_resolve, run_id=run_id, now=now, why=why))
        if event is not None:
            events.append(event)
    return events


def _measured(passing: Sequence[tuple[Ticket, str]], results: pd.DataFrame | None) -> list[bool]:
    """Whether the run measured each ticket's fault (all True when the caller has no results table to say:
    its verdict rows alone decide, as before the clearing rule)."""
    if results is None:
        return [True] * len(passing)
    faults = pd.DataFrame(
        {
            "node": [t.node for t, _ in passing],
            "gpu_uuid": [t.gpu_uuid for t, _ in passing],
            "gpu": pd.array([t.gpu for t, _ in passing], dtype="Int64"),
            "metrics": [fault_metrics(t) for t, _ in passing],
        }
    )
    return [bool(x) for x in measured(faults, results)]


def _kept(ticket: Ticket, *, run_id: str, now: datetime) -> TicketEvent:
    """A ticket whose hardware passed in a run that did not measure its fault: it stays open, and the run
    says so (the event is reported, never stored)."""
    why = not_measured(ticket.cause, ticket.where, fault_metrics(ticket))
    detail = f"kept open by run {run_id}: it passed, but {why}; a run that measures it resolves it"
    return TicketEvent(kind="kept", ticket=ticket, previous=ticket, detail=detail, at=now)


def _passes(
    ticket: Ticket,
    seen_uuids: set[str],
    passing_uuids: set[str],
    passing_slots: set[tuple[str, int]],
    nodes_passing: set[str],
) -> str:
    """Why the ticket's hardware passes in this run, or ``""`` when it does not (or was not judged)."""
    if not ticket.gpu_uuid:
        return f"every check of {ticket.node} passes" if ticket.node in nodes_passing else ""
    if ticket.gpu_uuid in passing_uuids:
        return f"{ticket.where} passes"
    # A replaced GPU comes back under a new UUID at the same index; a GPU that reported nothing has no UUID.
    if ticket.gpu_uuid not in seen_uuids and ticket.gpu is not None and (ticket.node, ticket.gpu) in passing_slots:
        return f"GPU {ticket.gpu} of {ticket.node} passes under a new UUID (replaced)"
    return ""


def _resolve(
    current: Ticket | None, others: Sequence[Ticket], *, run_id: str, now: datetime, why: str
) -> TicketEvent | None:
    del others
    if current is None or current.state != "open" or run_id in current.runs:
        return None  # resolved meanwhile, or it recurred in this very run
    ticket = current.model_copy(update={"state": "resolved", "resolved": now, "updated": now})
    return TicketEvent(
        kind="resolved", ticket=ticket, previous=current, detail=f"resolved by run {run_id}: {why}", at=now
    )


# --- remediations ----------------------------------------------------------------------------------------


def record_remediation(
    backend: TicketBackend, ticket_id: str, action: str, now: datetime, *, note: str = "", by: str = ""
) -> TicketEvent:
    """Record that ``action`` (``reset_gpu``, ``reboot_node``, ``reseat``…) was done for a ticket at ``now``,
    so that a later recurrence counts as one after it; returns the event. Raises :class:`TicketNotFound`
    for an unknown id and :class:`TicketError` for an empty action or a naive time."""
    if not action.strip():
        raise TicketError("a remediation needs an action (reset_gpu, reboot_node, reseat, …)")
    if now.tzinfo is None:
        raise TicketError("a remediation needs an aware time (UTC), got a naive datetime")
    ticket = backend.get(ticket_id)
    event = backend.change(
        ticket.fingerprint, partial(_remediate, action=action.strip(), now=now, note=note, by=by, ticket_id=ticket_id)
    )
    if event is None:  # pragma: no cover - _remediate always returns an event or raises
        raise TicketError(f"ticket {ticket_id}: the remediation was not recorded")
    return event


def record_repairs(
    backend: TicketBackend,
    nodes: Iterable[str],
    now: datetime,
    *,
    action: str | None = None,
    note: str = "",
    by: str = "",
) -> list[TicketEvent]:
    """Record a repair on every open ticket of ``nodes`` (``gpucert release``: repaired, about to be
    re-certified); ``action`` defaults to what each ticket asked for. Raises :class:`TicketError` for a naive
    time, and :class:`~gpucert.tickets.TicketActionError` (nothing recorded) when ``action`` does not fit a
    ticket's cause: a GPU reset is no repair of a network fault, and would count towards the reset rule."""
    if now.tzinfo is None:
        raise TicketError("a repair needs an aware time (UTC), got a naive datetime")
    open_tickets = backend.tickets(state="open", nodes=nodes)
    if action:
        check_action(open_tickets, action)
    events = []
    for ticket in open_tickets:
        done = action or ticket.action or "repair"
        event = backend.change(
            ticket.fingerprint, partial(_remediate, action=done, now=now, note=note, by=by, ticket_id=ticket.id)
        )
        if event is not None:
            events.append(event)
    return events


def _remediate(
    current: Ticket | None, others: Sequence[Ticket], *, action: str, now: datetime, note: str, by: str, ticket_id: str
) -> TicketEvent:
    del others
    if current is None:
        raise TicketNotFound(f"no ticket {ticket_id!r}")
    ticket = current.model_copy(deep=True)
    ticket.remediations.append(Remediation(action=action, at=now, note=note, by=by))
    ticket.updated = now
    detail = f"{action} recorded" + (f" by {by}" if by else "") + (f": {note}" if note else "")
    return TicketEvent(kind="remediated", ticket=ticket, previous=current, detail=detail, at=now)
