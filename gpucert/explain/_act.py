"""Acting on an explanation — never automatically (``gpucert explain --act``, the ``explain-job`` flow's ``act``),
through the code certify acts with; docs/design/explain.md, "What --act does", has the whole table.

The first suspect that blames hardware (:data:`ACTABLE_LAYERS`) is cordoned with gpucert's ``unhealthy``
NoSchedule taint inside the policy's blast radius (not a drain: the running pods finish), its state label set to
``uncertified`` (an explanation is no certification), ticketed with the evidence, and re-certified once idle by
the flow. A silent straggler, named by the job's own timings while its telemetry shows no cause, is only
re-certified: a taint or a ticket on a guess would blame hardware nothing shows. Every write is recorded by the
caller's :class:`~gpucert.audit.AuditRecorder`, as certify's are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

import pandas as pd

from ..audit import AuditRecorder, ticket_action
from ..certify import CONDITION, SettledDecision, apply_decision, busy_nodes, fleet_taints
from ..kube import Kube, has_taint, taint_keys
from ..policy import Policy
from ..tickets import EscalationPolicy, RunEvidence, TicketBackend, TicketEvent, reconcile
from ..verdict import ACTION_FOR_CAUSE, VERDICT_COLUMNS
from ._frames import Explanation, Suspect

__all__ = ["ACTABLE_LAYERS", "ActOutcome", "act_on", "cause_of", "suspect_to_act_on"]

#: The layers whose suspect is hardware that a taint, a ticket and a re-certification can do something about.
ACTABLE_LAYERS = frozenset({"gpu", "nvlink", "network", "node"})
#: Words of the evidence → the verdict engine's cause, first match wins.
_CAUSE_WORDS = (
    ("thermal", "thermal"),
    ("temperature", "thermal"),
    ("power", "power"),
    ("pcie", "pcie"),
    ("ecc", "ecc"),
    ("xid", "xid"),
    ("nvlink", "nvlink"),
)
_SUMMARY_MAX = 400
#: The state label of a node explain cordoned: no longer certified, awaiting its re-certification.
UNCERTIFIED = "uncertified"


@dataclass(frozen=True)
class ActOutcome:
    """What ``--act`` did about one explanation."""

    node: str | None
    gpu: int | None = None
    #: ``added``, ``kept`` (it was tainted already), ``refused`` (blast radius, observe-only) or ``none``.
    cordon: str = "none"
    #: Why it was not done, or what was done, in words.
    why: str = ""
    tickets: tuple[str, ...] = ()
    ticket_events: tuple[TicketEvent, ...] = field(default=(), repr=False)
    #: ``due`` (the node is idle: certify it now) or ``busy: ns/pod`` (left for the next certify); ``""``.
    recertify: str = ""
    #: The suspect was named by the job's timings alone: re-certified only, never cordoned or ticketed.
    silent: bool = False

    def lines(self) -> list[str]:
        """The outcome in a few lines, for the CLI and the artifact."""
        if self.node is None:
            return [f"nothing done: {self.why}"]
        where = f"{self.node}" + (f" GPU {self.gpu}" if self.gpu is not None else "")
        if self.silent:
            return [f"no cordon, no ticket for {where}: {self.why}", f"re-certify: {self.recertify}"]
        out = [f"cordon {where}: {self.cordon}" + (f" ({self.why})" if self.why else "")]
        out.append(f"tickets: {', '.join(self.tickets)}" if self.tickets else "tickets: none opened")
        if self.recertify:
            out.append(f"re-certify: {self.recertify}")
        return out


def suspect_to_act_on(explanation: Explanation) -> Suspect | None:
    """The first suspect whose layer is hardware (see the module docstring), or None."""
    if explanation.verdict not in ("gpu", "network"):
        return None
    return next((s for s in explanation.suspects if s.layer in ACTABLE_LAYERS), None)


def cause_of(suspect: Suspect) -> str:
    """The verdict engine's cause for a suspect: its layer for the interconnects, else what its evidence
    names (``thermal``, ``power``, ``pcie``, ``ecc``, ``xid``), else ``unknown``."""
    if suspect.layer in ("nvlink", "network"):
        return suspect.layer
    text = " ".join(suspect.evidence).lower()
    return next((cause for word, cause in _CAUSE_WORDS if word in text), "unknown")


def act_on(
    explanation: Explanation,
    kube: Kube,
    *,
    policy: Policy,
    tickets: TicketBackend | None,
    audit: AuditRecorder,
    run_id: str,
    now: datetime,
    prefix: str = "gpucert.io",
    gpu_node_selector: str | None = None,
    evidence_link: str = "",
    escalation: EscalationPolicy | None = None,
) -> ActOutcome:
    """Cordon and ticket the explanation's first hardware suspect (see the module docstring); returns what
    was done. ``run_id`` names the action in the audit trail and the ticket; ``evidence_link`` (the
    timeline) goes into the ticket.

    Raises the :class:`~gpucert.kube.KubeError` of a write that failed and what the ticket backend raises
    (:class:`~gpucert.tickets.TicketError`); nothing is retried here.
    """
    suspect = suspect_to_act_on(explanation)
    if suspect is None:
        return ActOutcome(node=None, why=_NOTHING_TO_DO.get(explanation.verdict, "no hardware suspect"))
    if suspect.silent:
        return _recertify_only(suspect, kube, prefix=prefix)
    cause = cause_of(suspect)
    summary = f"explain {explanation.job}: {'; '.join(suspect.evidence)}"[:_SUMMARY_MAX]
    audit.because(f"explain {explanation.job}: {run_id}", per_object={suspect.node: summary})

    # 1. the cordon, inside the blast radius
    fleet_nodes = kube.nodes(gpu_node_selector)
    fleet = fleet_taints(fleet_nodes, prefix=prefix)
    unhealthy, _ = taint_keys(prefix)
    mine = (n for n in fleet_nodes if (n.get("metadata") or {}).get("name") == suspect.node)
    node_obj = next(mine, None) or kube.get("v1", "Node", suspect.node)
    in_force = {n for n, t in fleet.items() if t.unhealthy}
    limit = policy.max_tainted_nodes(len(fleet))
    if has_taint(node_obj, unhealthy):
        cordon, why = "kept", "it carries gpucert's unhealthy taint already"
    elif policy.observe_only:
        cordon, why = "refused", "the policy is observe-only: gpucert taints nothing"
    elif len(in_force) + 1 > limit:
        cordon = "refused"
        why = (
            f"blast radius: {len(in_force)} of {len(fleet)} GPU nodes carry gpucert's taint already, the policy "
            f"allows {limit}; the likelier culprit is elsewhere"
        )
    else:
        decision = SettledDecision(
            node=suspect.node,
            state=None,
            cause=cause,
            hard_gate=False,
            confirmed=True,
            taint="added",
            runs=(run_id,),
            summary=summary,
        )
        apply_decision(kube, decision, prefix=prefix, run_id=run_id, now=now)
        _suspected(kube, suspect.node, prefix=prefix, summary=summary, now=now)
        cordon, why = "added", f"{unhealthy}={cause}:NoSchedule"
    audit.flush(now=now)

    # 2. the ticket, with the evidence
    events: list[TicketEvent] = []
    if tickets is not None:
        verdicts = _verdict_row(explanation, suspect, cause, run_id)
        events = reconcile(
            tickets, verdicts, run_id=run_id, now=now, policy=escalation, evidence=RunEvidence(report=evidence_link)
        )
        audit.note(*(ticket_action(e) for e in events))
        audit.flush(now=now)
    return ActOutcome(
        node=suspect.node,
        gpu=suspect.gpu,
        cordon=cordon,
        why=why,
        tickets=tuple(dict.fromkeys(e.ticket.external_key or e.ticket.id for e in events)),
        ticket_events=tuple(events),
        recertify=_recertify(kube, suspect.node, prefix),
    )


#: Why nothing is done about an explanation without a hardware suspect, by its verdict.
_NOTHING_TO_DO = {
    "elsewhere": "the GPUs and nodes show nothing: the slowdown is elsewhere",
    "event": "the slowdown follows a Kubernetes event, not a node's hardware",
    "transient": "the departure recovered (transient): no cordon, no ticket; re-certify the node if it recurs",
    "hang": "the job is hung: a restart, not a node taken out; nothing is cordoned or ticketed",
    "healthy": "the job is healthy",
    "no-data": "there was nothing to judge",
}


def _recertify_only(suspect: Suspect, kube: Kube, *, prefix: str) -> ActOutcome:
    """A silent straggler: no taint and no ticket on a guess (nothing is written, so nothing is audited here);
    the re-certification (idle nodes only) is the action, and its verdict settles the cause."""
    return ActOutcome(
        node=suspect.node,
        gpu=suspect.gpu,
        cordon="none",
        silent=True,
        why="its telemetry shows no cause: re-certifying it settles one; a cordon or a ticket now would be a guess",
        recertify=_recertify(kube, suspect.node, prefix),
    )


def _recertify(kube: Kube, node: str, prefix: str) -> str:
    """``due`` for an idle node, else which pod holds its GPUs: a node still running the job waits for it."""
    busy = busy_nodes(kube, prefix=prefix).get(node)
    return f"busy: {busy} holds its GPUs; certify it once the job left" if busy else "due"


def _suspected(kube: Kube, node: str, *, prefix: str, summary: str, now: datetime) -> None:
    """Label the cordoned ``node`` ``<prefix>/state=uncertified`` and set its ``GpuCertified`` condition
    ``Unknown`` (reason ``Suspected``, the evidence as message): the taint says it is held back, and its
    state must not go on saying ``certified`` until a certification says so again."""
    kube.label_node(node, {f"{prefix}/state": UNCERTIFIED})
    stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    entry = {"type": CONDITION, "status": "Unknown", "reason": "Suspected", "message": summary}
    entry |= dict.fromkeys(("lastHeartbeatTime", "lastTransitionTime"), stamp)
    kube.patch_status("v1", "Node", node, {"status": {"conditions": [entry]}})


def _verdict_row(explanation: Explanation, suspect: Suspect, cause: str, run_id: str) -> pd.DataFrame:
    """The suspect as one verdict row: what the ticket lifecycle takes (a fail asking for remediation)."""
    onset = f" from {suspect.onset:%Y-%m-%d %H:%M:%S} UTC" if suspect.onset is not None else ""
    reasons = f"job {explanation.job} slowed{onset}: " + "; ".join(suspect.evidence)
    if explanation.step_change is not None:
        change = explanation.step_change
        reasons += (
            f"; step time {change.before_s:.3g} s → {change.after_s:.3g} s "
            f"({change.change_pct:+.0f} %) at {change.at:%H:%M:%S}"
        )
    row = dict.fromkeys(VERDICT_COLUMNS)
    row.update(
        {
            "run_id": run_id,
            "node": suspect.node,
            "gpu": suspect.gpu,
            "gpu_uuid": suspect.gpu_uuid,
            "verdict": "fail",
            "metric": "",
            **dict.fromkeys(("value", "reference", "deviation_pct", "z"), float("nan")),
            "reference_kind": "peer",
            "cause": cause,
            "action": ACTION_FOR_CAUSE.get(cause, "retest"),
            "ticket": "remediation",
            "reasons": reasons,
        }
    )
    frame = pd.DataFrame([row], columns=list(VERDICT_COLUMNS))
    frame["gpu"] = frame["gpu"].astype("Int64")
    return frame
