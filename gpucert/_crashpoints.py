"""Named crash points, for the fault matrix only: ``GPUCERT_TEST_CRASH_AT=<point>`` kills the process there.

``tests/test_fault_matrix.py`` proves that a run killed at any step and started again with the same run id
duplicates nothing and completes. Each seam is one line, ``crashpoint("<point>")``, which does nothing
unless the variable names that point; then the process dies by SIGKILL, as the OOM killer or a lost node
would end it: no ``finally``, no ``atexit``, no flush. The points, in the order a certify run passes them:
``judged`` (the first run's verdicts stored, nothing settled), ``between-taints`` (one node's taint
written, the next one's not), ``baseline-written`` (a new version written, ``current`` not yet moved),
``between-tickets`` (one fault's ticket changed, the next one's not).
"""

from __future__ import annotations

import os
import signal

__all__ = ["CRASH_ENV", "POINTS", "crashpoint"]

#: The environment variable naming the point to die at; unset (always, outside the fault matrix): none.
CRASH_ENV = "GPUCERT_TEST_CRASH_AT"
POINTS = frozenset({"settled", "between-taints", "baseline-written", "between-tickets"})


def crashpoint(point: str, *, when: bool = True) -> None:
    """Kill this process with SIGKILL if ``$GPUCERT_TEST_CRASH_AT`` is ``point`` and ``when`` holds; else
    return at once. Raises ``ValueError`` for a point not in :data:`POINTS` (a typo at a call site)."""
    chosen = os.environ.get(CRASH_ENV)
    if not chosen:
        return
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: {sorted(POINTS)}")
    if chosen == point and when:
        os.kill(os.getpid(), signal.SIGKILL)
