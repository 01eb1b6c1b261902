"""Tickets: one per fault, opened, updated, escalated and resolved from each run's verdicts.

A ticket stands for a :class:`Fingerprint` — (node, GPU UUID or ``""`` for a node-level fault, cause) — for
life: a recurrence updates it, a recurrence after it was resolved reopens it, so its history is what the
escalation rules (docs/reference/causes-and-actions.md, "Escalation") count. It is resolved only by a run
that measured what its fault was found on (:func:`measured`, the clearing rule).

The lifecycle (:func:`reconcile`) is plain logic over any :class:`TicketBackend`: :class:`LocalTickets` (a
SQLite file, the default: ``tickets.sqlite`` in the store root), :class:`JiraTickets` (one issue per
fingerprint) or :class:`WebhookTickets` (a local file, every change POSTed as Slack-compatible JSON).
Secrets (the Jira token, the webhook URL, headers and signing secret) are ``SecretStr`` and never appear
in messages or logs; every error is a :class:`TicketError`.
"""

from __future__ import annotations

from ._causes import CAUSE_METRICS, TicketActionError, measured, not_measured
from ._cli import DEFAULT_TICKETS, TICKETS_FILE, format_tickets, local_path, open_backend, tickets_list
from ._incident import INCIDENT_CAUSE, INCIDENT_NODE, ask_maintenance_window, open_incident, resolve_incident
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
    EscalationPolicy,
    Fingerprint,
    Kind,
    Remediation,
    Ticket,
    TicketBackend,
    TicketConfigError,
    TicketError,
    TicketEvent,
    TicketNotFound,
)
from ._webhook import WebhookTickets

__all__ = [
    "CAUSE_METRICS",
    "DEFAULT_TICKETS",
    "INCIDENT_CAUSE",
    "INCIDENT_NODE",
    "TICKETS_FILE",
    "EscalationPolicy",
    "Fingerprint",
    "JiraTickets",
    "Kind",
    "LocalTickets",
    "Remediation",
    "RunEvidence",
    "Ticket",
    "TicketActionError",
    "TicketBackend",
    "TicketConfigError",
    "TicketError",
    "TicketEvent",
    "TicketNotFound",
    "WebhookTickets",
    "ask_maintenance_window",
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
    "tickets_list",
    "title_of",
]
