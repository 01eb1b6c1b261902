"""When a Prefect task is worth retrying: only for failures that may pass (gpucert's KubeUnavailable).

Calls are already retried one by one inside :class:`gpucert.kube.Kube`; a task retry is the outer
layer for a control plane that stayed unavailable longer than those back-offs. A 4xx, a conflict in
the stack plan or a node that never got ready would fail again the same way, so they are not retried.
"""

from __future__ import annotations

from typing import Any

from gpucert.kube import KubeUnavailable

__all__ = ["only_transient"]


def only_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry only when the task failed with :class:`KubeUnavailable`."""
    try:
        state.result(raise_on_failure=True)
    except KubeUnavailable:
        return True
    except Exception:
        return False
    return False
