"""The audit trail: every change gpucert makes, recorded twice — as a Kubernetes Event on the object it
touched, and as an entry of a hash-chained, append-only log in the store (docs/design/certificate-and-audit.md).
:class:`AuditRecorder` collects a run's changes and flushes them; :class:`AuditLog` appends and checks the chain
(:func:`check_chain`); :class:`AuditAction` is one change as the code that made it describes it.
"""

from ._chain import ChainCheck, Segment, canonical_json, check_chain, entry_hash
from ._log import AuditAction, AuditLog
from ._recorder import CONTROLLER, AuditRecorder, ticket_action

__all__ = [
    "CONTROLLER",
    "AuditAction",
    "AuditLog",
    "AuditRecorder",
    "ChainCheck",
    "Segment",
    "canonical_json",
    "check_chain",
    "entry_hash",
    "ticket_action",
]
