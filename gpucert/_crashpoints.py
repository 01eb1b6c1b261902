"""Named crash points, for the fault matrix only: ``GPUCERT_TEST_CRASH_AT=<point>`` kills the process there.

``tests/test_fault_matrix.py`` proves that a run killed at any step and started again with the same run
id duplicates nothing and completes. Killing a process at a chosen step needs a seam in the code: each
seam is one line, ``crashpoint("<point>")``, which does nothing unless the variable names that very
point (one environment lookup). When it does, the process is killed with SIGKILL, as the OOM killer or
a lost node would end it: no ``finally``, no ``atexit``, no flush — the state left behind is exactly
what a real kill leaves.

The points (:data:`POINTS`), in the order a certify run passes them:

* ``judged`` — the first run's verdicts are stored, nothing is settled (``flows/certify.py``);
* ``between-taints`` — one node's ``unhealthy`` taint is written, the next node's is not
  (:func:`gpucert.certify.apply_decision`);
* ``baseline-written`` — a new baseline version is written, ``current`` not yet moved to it
  (:meth:`gpucert.store.BaselineStore.update`);
* ``between-tickets`` — one fault's ticket is changed, the next one's is not
  (:func:`gpucert.tickets.reconcile`).
"""

from __future__ import annotations

import os
import signal

__all__ = ["CRASH_ENV", "POINTS", "crashpoint"]

#: The environment variable naming the point to die at; unset (always, outside the fault matrix): none.
CRASH_ENV = "GPUCERT_TEST_CRASH_AT"
POINTS = frozenset({"judged", "between-taints", "baseline-written", "between-tickets"})


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
