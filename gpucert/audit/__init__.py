"""The audit trail: every change gpucert makes, recorded twice — as a Kubernetes Event on the object it
touched, and as an entry of a hash-chained, append-only log in the store (``audit/``).

- :class:`AuditRecorder` collects a run's changes (every Kubernetes write, seen through
  :meth:`gpucert.kube.Kube.observe`, and the tickets and baselines it is told of) and flushes them.
- :class:`AuditLog` appends segments under a head moved by compare-and-swap, and checks the chain
  (:func:`check_chain`: a changed, removed or reordered entry is named).
- :class:`AuditAction` is one change as the code that made it describes it.
"""

from ._chain import GENESIS, ChainCheck, Segment, canonical_json, check_chain, entry_hash
from ._log import AUDIT_PREFIX, HEAD_KEY, AuditAction, AuditLog, select
from ._recorder import CONTROLLER, AuditRecorder, actions_of_change, event_of, ticket_action

__all__ = [
    "AUDIT_PREFIX",
    "CONTROLLER",
    "GENESIS",
    "HEAD_KEY",
    "AuditAction",
    "AuditLog",
    "AuditRecorder",
    "ChainCheck",
    "Segment",
    "actions_of_change",
    "canonical_json",
    "check_chain",
    "entry_hash",
    "event_of",
    "select",
    "ticket_action",
]
