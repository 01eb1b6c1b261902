"""Tickets: one per fault, opened, updated, escalated and resolved from each run's verdicts.

A ticket stands for a :class:`Fingerprint` — (node, GPU UUID or ``""`` for a node-level fault, cause) — and
that fingerprint has one ticket for life: a recurrence updates it, a recurrence after it was resolved
reopens it. Its kind is ``remediation`` (reset, reboot, reseat, config, cooling) or ``replacement`` (an
RMA), escalated from one to the other by the rules of docs/reference/causes-and-actions.md, "Escalation"
(:class:`EscalationPolicy`); each carries
its evidence: the verdict rows, the telemetry, the stack versions and a link to the run's report.

Backends (:class:`TicketBackend`):

- :class:`LocalTickets` — a SQLite file, the embedded default (``tickets.sqlite`` in the store root);
- :class:`JiraTickets` — one Jira issue per fingerprint, through the ``jira`` client (REST v2);
- :class:`WebhookTickets` — a local file for the state, every change POSTed as Slack-compatible JSON.

The lifecycle is plain logic over any of them::

    tickets = open_backend("/srv/gpucert")                  # /srv/gpucert/tickets.sqlite
    events = reconcile(tickets, verdicts, run_id=run_id, now=now,
                       evidence=RunEvidence(report=report_uri, stacks=stacks, results=results))
    record_remediation(tickets, events[0].ticket.id, "reset_gpu", now)   # what a technician did
    print(tickets_list(tickets, "open"))

A ticket is resolved only by a run that measured what its fault was found on (:func:`measured`, the
clearing rule); a repair recorded on it must fit its cause (:func:`check_action`). A blast-radius incident
is one ``incident`` ticket (:func:`open_incident`); a busy node telemetry asked about for
``EscalationPolicy.busy_nights`` nights gets one asking for a maintenance window
(:func:`ask_maintenance_window`).

Secrets (the Jira token, the webhook URL, headers and signing secret) are ``SecretStr`` and never appear
in messages or logs; every error is a :class:`TicketError`.
"""

from __future__ import annotations

from ._backend import Change, TicketBackend
from ._causes import (
    CAUSE_ACTIONS,
    CAUSE_METRICS,
    TicketActionError,
    allowed_actions,
    check_action,
    fault_metrics,
    measured,
    not_measured,
)
from ._cli import DEFAULT_TICKETS, TICKETS_FILE, format_tickets, local_path, open_backend, tickets_list
from ._incident import (
    INCIDENT_CAUSE,
    INCIDENT_NODE,
    MAINTENANCE_CAUSE,
    ask_maintenance_window,
    open_incident,
    resolve_incident,
)
from ._jira import JiraTickets
from ._lifecycle import (
    RunEvidence,
    fingerprints,
    reconcile,
    record_remediation,
    record_repairs,
    recorded_tickets,
    title_of,
)
from ._local import LocalTickets
from ._model import (
    MAX_EVIDENCE,
    EscalationPolicy,
    EventKind,
    Evidence,
    Fingerprint,
    Kind,
    Remediation,
    State,
    Ticket,
    TicketConfigError,
    TicketError,
    TicketEvent,
    TicketNotFound,
)
from ._webhook import WebhookTickets, slack_payload

__all__ = [
    "CAUSE_ACTIONS",
    "CAUSE_METRICS",
    "DEFAULT_TICKETS",
    "INCIDENT_CAUSE",
    "INCIDENT_NODE",
    "MAINTENANCE_CAUSE",
    "MAX_EVIDENCE",
    "TICKETS_FILE",
    "Change",
    "EscalationPolicy",
    "EventKind",
    "Evidence",
    "Fingerprint",
    "JiraTickets",
    "Kind",
    "LocalTickets",
    "Remediation",
    "RunEvidence",
    "State",
    "Ticket",
    "TicketActionError",
    "TicketBackend",
    "TicketConfigError",
    "TicketError",
    "TicketEvent",
    "TicketNotFound",
    "WebhookTickets",
    "allowed_actions",
    "ask_maintenance_window",
    "check_action",
    "fault_metrics",
    "fingerprints",
    "format_tickets",
    "local_path",
    "measured",
    "not_measured",
    "open_backend",
    "open_incident",
    "reconcile",
    "record_remediation",
    "record_repairs",
    "recorded_tickets",
    "resolve_incident",
    "slack_payload",
    "tickets_list",
    "title_of",
]
