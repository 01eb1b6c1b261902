"""When a Prefect task is worth retrying: only for failures that may pass (gpucert's KubeUnavailable).

Calls are already retried one by one inside :class:`gpucert.kube.Kube`; a task retry is the outer
layer for a control plane that stayed unavailable longer than those back-offs. A 4xx, a conflict in
the stack plan or a node that never got ready would fail again the same way, so they are not retried.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from gpucert.errors import InputError
from gpucert.kube import KubeUnavailable
from gpucert.telemetry import PrometheusAuthError

__all__ = ["kube_task", "may_pass", "only_transient"]

P = ParamSpec("P")
R = TypeVar("R")


def may_pass(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn`` for a task that reads Prometheus: retry unless the failure would repeat
    as it is (credentials refused, unusable input); a server that did not answer may answer the next time."""
    try:
        state.result(raise_on_failure=True)
    except (PrometheusAuthError, InputError):
        return False
    except Exception:
        return True
    return False


def only_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry only when the task failed with :class:`KubeUnavailable`."""
    try:
        state.result(raise_on_failure=True)
    except KubeUnavailable:
        return True
    except Exception:
        return False
    return False


def kube_task(name: str, task_run_name: str | None = None) -> Callable[[Callable[P, R]], Task[P, R]]:
    """A task that talks to the API server: retried twice when the control plane stayed unavailable,
    never cached (it must see the cluster as it is)."""
    return task(
        name=name,
        task_run_name=task_run_name,
        retries=2,
        retry_delay_seconds=[2, 10],
        retry_condition_fn=only_transient,
        cache_policy=NO_CACHE,
    )
