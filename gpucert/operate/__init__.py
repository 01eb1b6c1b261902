"""operate's core: which nodes are due for re-certification tonight, what the night's telemetry covered,
and what a night (an onboarding, a release) returns. Telemetry and drift are :mod:`gpucert.telemetry`'s.
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
