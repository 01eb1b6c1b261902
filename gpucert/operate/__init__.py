"""operate's core: which nodes are due for re-certification tonight.

The rest of a night — telemetry (:mod:`gpucert.telemetry`), drift (:mod:`gpucert.telemetry`), tickets
(:mod:`gpucert.tickets`) — lives in its own package; this one holds the rotation.
"""

from ._due import DueNodes, due_nodes

__all__ = ["DueNodes", "due_nodes"]
