"""Recording a run's changes (docs/design/certificate-and-audit.md, "Audit trail"): every Kubernetes write as
it succeeds, seen through :meth:`gpucert.kube.Kube.observe` (a node patch split into its taints, labels,
annotations and cordon, with what each was before where the caller passed the node it read); tickets and
baselines as they are told (:meth:`AuditRecorder.note`). :meth:`AuditRecorder.flush` appends them to the trail
and sends each as an Event on the object it touched, named after its entry's hash so a retried step never sends
one twice, and naming its uid (``kubectl describe node`` shows only those): the uid the write answered with, so
it costs no request. Leases and Events are not recorded: a Lease is coordination, not a change to the cluster.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from ..kube import Kube, KubeChange, KubeConflict, KubeError
from ..store import BaselineChange, BaselineStore
from ..tickets import Ticket, TicketEvent
from ._log import AuditAction, AuditLog, node_of

__all__ = ["CONTROLLER", "AuditRecorder", "actions_of_change", "ticket_action"]

#: ``reportingController`` of every Event gpucert sends.
CONTROLLER = "gpucert"
_NOTE_MAX = 1024
_UNRECORDED_KINDS = frozenset({"Event", "Lease"})
#: Entries whose object is not a Kubernetes object: their Event goes to the node they are about.
_OFF_CLUSTER = frozenset({"Ticket", "Baseline"})
_WARNING_ACTIONS = frozenset({"taint.add", "cordon", "ticket.open", "ticket.escalate", "baseline.rollback"})
_REASONS = {
    "taint.add": "TaintAdded",
    "taint.lift": "TaintLifted",
    "taint.set": "TaintsSet",
    "label": "Labelled",
    "annotate": "Annotated",
    "condition": "ConditionSet",
    "cordon": "Cordoned",
    "uncordon": "Uncordoned",
    "job.create": "JobCreated",
    "job.delete": "JobDeleted",
    "apply": "Applied",
    "create": "Created",
    "delete": "Deleted",
    "ticket.open": "TicketOpened",
    "ticket.update": "TicketUpdated",
    "ticket.escalate": "TicketEscalated",
    "ticket.resolve": "TicketResolved",
}


class AuditRecorder:
    """Collects one run's changes and writes them to the trail and as Events; thread-safe.

    ``why`` gives the reason of a change to a named object (a node's decision, say) and falls back to
    ``default_why``; both may be updated as the run goes (:meth:`because`).
    """

    def __init__(
        self, log: AuditLog | None, *, run_id: str | None, trigger: str, actor: str | None = None, default_why: str = ""
    ) -> None:
        self.log = log
        self.run_id = run_id
        self.trigger = trigger
        self.actor = actor or f"gpucert@{socket.gethostname()}"
        self.default_why = default_why
        self._why: dict[str, str] = {}
        self._pending: list[AuditAction] = []
        self._lock = threading.Lock()
        self._kube: Kube | None = None
        self._stops: list[Callable[[], None]] = []
        #: Every entry this recorder appended, in order.
        self.entries: list[dict[str, Any]] = []
        #: Events that could not be sent (the cluster refused or did not answer).
        self.event_failures = 0
        #: Seconds spent writing the trail and sending Events (what recording costs the run).
        self.seconds = 0.0
        #: (kind, namespace or "", name) → uid of the objects written, for their Events.
        self._uids: dict[tuple[str, str, str], str] = {}

    # --- collecting -------------------------------------------------------------------------------

    def watch(self, kube: Kube | None = None, store: BaselineStore | None = None) -> AuditRecorder:
        """Record every write made through ``kube`` (and send Events through it) and every baseline
        version ``store`` makes current, from now on."""
        if kube is not None:
            self._kube = kube
            self._stops.append(kube.observe(self._on_change))
        if store is not None:
            self._stops.append(store.observe(self._on_baseline))
        return self

    def unwatch(self) -> None:
        """Stop recording (what was collected stays pending until flushed)."""
        for stop in self._stops:
            stop()
        self._stops.clear()

    def because(self, why: str | None = None, *, per_object: Mapping[str, str] | None = None) -> None:
        """Set the reason of what follows: for every change, and (``per_object``) for named objects.

        ``why`` names the run's step as well: every change recorded from now on carries it as its ``step``,
        and, when neither its writer nor ``per_object`` says more, as its ``why``."""
        with self._lock:
            if why is not None:
                self.default_why = why
            if per_object:
                self._why.update(per_object)

    def note(self, *actions: AuditAction) -> None:
        """Record changes that are not Kubernetes writes (tickets, baselines), stamped now unless they say
        when they happened."""
        at = datetime.now(UTC)
        with self._lock:
            self._pending += [_stamped(a, a.why or self._why_of(a.name), self.default_why, a.at or at) for a in actions]

    def _why_of(self, name: str) -> str:
        return self._why.get(name, self.default_why)

    def _on_change(self, change: KubeChange) -> None:
        if change.kind in _UNRECORDED_KINDS:
            return
        uid = _uid_of(change)
        if uid:
            with self._lock:
                self._uids[(change.kind, change.namespace or "", change.name)] = uid
        if change.unchanged:
            return
        at = datetime.now(UTC)  # when the write succeeded, not when the step's changes are flushed
        with self._lock:
            why = change.why or self._why_of(change.name)
            self._pending += [_stamped(a, why, self.default_why, at) for a in actions_of_change(change)]

    def _on_baseline(self, change: BaselineChange) -> None:
        action = "baseline.rollback" if change.action == "rollback" else "baseline.write"
        why = f"{self.default_why} ({change.message})" if self.default_why else change.message
        before, after = {"version": change.previous}, {"version": change.version}
        self.note(AuditAction(action, "Baseline", change.version, before=before, after=after, why=why))

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    # --- writing ----------------------------------------------------------------------------------

    def flush(self, *, now: datetime | None = None, events: bool = True) -> list[dict[str, Any]]:
        """Append what was collected as one segment and send its Events; returns the entries appended.
        Raises :class:`~gpucert.errors.StoreError` when the trail cannot be written (the actions stay
        pending, so a later flush still records them)."""
        with self._lock:
            actions, self._pending = self._pending, []
        if not actions or self.log is None:
            return []
        started = time.perf_counter()
        try:
            entries = self.log.append(actions, run_id=self.run_id, trigger=self.trigger, actor=self.actor, now=now)
        except Exception:
            with self._lock:
                self._pending = actions + self._pending
            raise
        self.entries += entries
        if events and self._kube is not None:
            self._send_events(self._kube, entries)
        self.seconds += time.perf_counter() - started
        return entries

    def _send_events(self, kube: Kube, entries: Sequence[Mapping[str, Any]]) -> None:
        instance = f"{self.actor}"[:128]
        about = [(entry, ref) for entry in entries if (ref := _regarding(entry)) is not None]
        if not about:
            return

        def send(body: dict[str, Any]) -> bool:
            try:
                kube.create(body)
            except KubeConflict:
                return True  # sent before: the same entry, the same name
            except KubeError:
                return False
            return True

        with ThreadPoolExecutor(max_workers=min(8, len(about)), thread_name_prefix="gpucert-events") as pool:
            with self._lock:
                unseen = sorted(
                    {str(ref["name"]) for _, ref in about if ref["kind"] == "Node" and _ref_key(ref) not in self._uids}
                )
            # A node no write of this run answered with (a ticket's): read once, for its uid.
            read = dict(zip(unseen, pool.map(lambda name: _node_uid(kube, name), unseen), strict=True))
            with self._lock:
                self._uids.update({("Node", "", name): uid for name, uid in read.items() if uid})
                bodies = [_event(entry, ref, instance, self._uids.get(_ref_key(ref))) for entry, ref in about]
            failed = sum(not ok for ok in pool.map(send, bodies))
        self.event_failures += failed


def _uid_of(change: KubeChange) -> str | None:
    """The uid of the object written: the server's answer's, else that of the object the caller read."""
    for obj in (change.result, change.before):
        uid = ((obj or {}).get("metadata") or {}).get("uid")
        if uid:
            return str(uid)
    return None


def _stamped(action: AuditAction, why: str, step: str, at: datetime) -> AuditAction:
    """``action`` with its reason (its own first), the step that made it and when it happened."""
    return replace(action, why=action.why or why, step=action.step or step, at=action.at or at)


# --- tickets ---------------------------------------------------------------------------------------------

_TICKET_ACTIONS = {
    "opened": "ticket.open",
    "reopened": "ticket.open",
    "escalated": "ticket.escalate",
    "resolved": "ticket.resolve",
}


def _ticket_side(ticket: Ticket | None) -> dict[str, Any] | None:
    if ticket is None:
        return None
    return {
        "node": ticket.node,
        "gpu_uuid": ticket.gpu_uuid or None,
        "cause": ticket.cause,
        "kind": ticket.kind,
        "state": ticket.state,
        "external_key": ticket.external_key or None,
    }


def ticket_action(event: TicketEvent) -> AuditAction:
    """The audit action of one ticket event (opened, reopened, updated, escalated, resolved, remediated)."""
    return AuditAction(
        _TICKET_ACTIONS.get(event.kind, "ticket.update"),
        "Ticket",
        event.ticket.id or event.ticket.title,
        api_version="gpucert.io/v1",
        before=_ticket_side(event.previous),
        after=_ticket_side(event.ticket),
        why=event.detail,
    )


# --- a Kubernetes write as audit actions ----------------------------------------------------------------


def actions_of_change(change: KubeChange) -> list[AuditAction]:
    """The audit actions one write stands for: a node patch split into taints, labels, annotations and
    cordon; a Job created or deleted; anything else applied, created or deleted."""

    def act(action: str, *, before: Any = None, after: Any = None) -> AuditAction:
        return AuditAction(action, change.kind, change.name, change.namespace, change.api_version, before, after)

    if change.kind == "Node" and change.verb == "patch":
        return _node_actions(change, act)
    if change.kind == "Node" and change.verb == "patch_status":
        conditions = ((change.body or {}).get("status") or {}).get("conditions")
        return [act("condition", after=conditions)]
    if change.kind == "Job" and change.verb in ("create", "delete"):
        annotations = ((change.body or {}).get("metadata") or {}).get("annotations") or {}
        node = next((v for k, v in annotations.items() if k.endswith("/node")), None)
        return [act(f"job.{change.verb}", after={"node": node} if node else None)]
    return [act("apply" if change.verb in ("apply", "patch", "patch_status") else change.verb)]


def _node_actions(change: KubeChange, act: Callable[..., AuditAction]) -> list[AuditAction]:
    patch = change.body or {}
    before = change.before or {}
    meta, old_meta = patch.get("metadata") or {}, before.get("metadata") or {}
    spec, old_spec = patch.get("spec") or {}, before.get("spec") or {}
    out: list[AuditAction] = []
    if "taints" in spec and change.before is None:
        # What the list replaced is unknown: recorded as it now is, never guessed as added or lifted.
        out.append(act("taint.set", after=spec.get("taints")))
    elif "taints" in spec:
        new, old = _taints(spec.get("taints")), _taints(old_spec.get("taints"))
        out += [act("taint.add", after=new[key]) for key in sorted(new.keys() - old.keys())]
        out += [act("taint.lift", before=old[key]) for key in sorted(old.keys() - new.keys())]
    for field, action in (("labels", "label"), ("annotations", "annotate")):
        changed = meta.get(field)
        if changed:
            old_values = old_meta.get(field) or {}
            was = {k: old_values.get(k) for k in changed} if change.before is not None else None
            out.append(act(action, before=was, after=dict(changed)))
    if "unschedulable" in spec:
        action = "cordon" if spec["unschedulable"] else "uncordon"
        out.append(
            act(action, before=old_spec.get("unschedulable") if change.before else None, after=spec["unschedulable"])
        )
    return out or [act("apply", after=dict(patch))]


def _taints(taints: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Each taint by its (key, effect), as the trail records it: its key, value and effect."""
    listed = [t for t in taints or () if isinstance(t, Mapping)]
    return {
        (str(t.get("key")), str(t.get("effect"))): {k: t[k] for k in ("key", "value", "effect") if k in t}
        for t in listed
    }


# --- an entry as an Event ------------------------------------------------------------------------------


def _regarding(entry: Mapping[str, Any]) -> dict[str, Any] | None:
    """The reference to the object an entry's Event is about (a ticket's node), without its uid; None when
    there is no Kubernetes object to put it on (a baseline)."""
    obj = dict(entry.get("object") or {})
    if obj.get("kind") in _OFF_CLUSTER:
        node = node_of(entry)
        if node is None:
            return None
        obj = {"apiVersion": "v1", "kind": "Node", "name": node, "namespace": None}
    regarding = {"apiVersion": obj.get("apiVersion") or "v1", "kind": obj.get("kind"), "name": obj.get("name")}
    if obj.get("namespace"):
        regarding["namespace"] = obj["namespace"]
    return regarding


def _ref_key(ref: Mapping[str, Any]) -> tuple[str, str, str]:
    return (str(ref.get("kind")), str(ref.get("namespace") or ""), str(ref.get("name")))


def _node_uid(kube: Kube, name: str) -> str | None:
    try:
        node = kube.get("v1", "Node", name)
    except KubeError:
        return None  # gone, or not to be read: the Event goes without (best effort, as Events are)
    return str((node.get("metadata") or {}).get("uid") or "") or None


def _event(entry: Mapping[str, Any], regarding: dict[str, Any], instance: str, uid: str | None) -> dict[str, Any]:
    action = str(entry.get("action", ""))
    if uid:
        regarding = {**regarding, "uid": uid}
    run, ts = entry.get("run_id"), str(entry.get("ts", ""))
    note = f"{entry.get('why') or action}" + (f" (run {run}" if run else " (") + f", audit #{entry.get('seq')})"
    name = f"{str(regarding.get('name'))[:200]}.{str(entry.get('hash'))[:16]}"
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        # Node events live in "default", as the kubelet's do.
        "metadata": {
            "name": name,
            "namespace": regarding.get("namespace") or "default",
            "labels": {"app.kubernetes.io/managed-by": CONTROLLER},
        },
        "eventTime": ts if ts.endswith("Z") else ts + "Z",  # a MicroTime: 2026-12-03T14:00:00.000000Z
        "reportingController": CONTROLLER,
        "reportingInstance": instance,
        "action": action[:128],
        "reason": _REASONS.get(action, "Changed"),
        "type": "Warning" if action in _WARNING_ACTIONS else "Normal",
        "note": note[:_NOTE_MAX],
        "regarding": regarding,
    }
