"""operate's core: which nodes are due for re-certification tonight, and what a night (an onboarding, a
release) returns.

The rest of a night — telemetry (:mod:`gpucert.telemetry`), drift (:mod:`gpucert.telemetry`), tickets
(:mod:`gpucert.tickets`) — lives in its own package; this one holds the rotation, what the night's
telemetry covered (:func:`telemetry_coverage`) and the outcomes.
"""

from .._text import counted
from ._coverage import TelemetryCoverage, telemetry_coverage
from ._due import BUSY_PREFIX, DueNodes, busy_overdue, due_nodes
from ._outcome import OnboardOutcome, OperateOutcome, ReleaseOutcome

__all__ = [
    "BUSY_PREFIX",
    "DueNodes",
    "OnboardOutcome",
    "OperateOutcome",
    "ReleaseOutcome",
    "TelemetryCoverage",
    "busy_overdue",
    "counted",
    "due_nodes",
    "telemetry_coverage",
]
