"""One wave of benchmarks: a Job per node, at most N at once, each waited for with a deadline.

Async so that hundreds of nodes are waited on together by one coroutine each, and so a Prefect task
running it can be cancelled at an ``await`` (a blocking wait could not be). API calls are synchronous
(the official client) and run in worker threads.

Restart safety: Job names are a function of (run id, node), so a wave started again with the same run id
adopts the Jobs already there instead of creating duplicates, and :func:`orphaned_jobs` finds the Jobs a
killed run of another id left behind on these nodes, for the caller to delete before starting.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from ..errors import GpucertError, ResultsError
from ..kube import Kube, KubeConflict
from ._collect import CollectedResults, collect_results
from ._jobs import BenchmarkSettings, benchmark_job, job_name
from ._outcome import JobOutcome, abandon, observe

__all__ = ["NodeRun", "Wave", "delete_jobs", "orphaned_jobs", "run_wave"]

#: How long a Job may wait on an image it cannot pull or a node it cannot be scheduled on before the
#: wave gives up on it (a Job's own deadline counts only from its pod's start).
PENDING_GRACE_S = 120.0


@dataclass(frozen=True)
class NodeRun:
    """How one node's benchmark ended: ``succeeded`` with results, or why not."""

    node: str
    job: str
    state: str
    reason: str | None = None
    message: str = ""
    rows: int = 0


@dataclass
class Wave:
    """A wave's outcome: per-node runs, the results of the nodes that succeeded, their stack records."""

    runs: dict[str, NodeRun] = field(default_factory=dict)
    results: list[pd.DataFrame] = field(default_factory=list)
    stacks: dict[str, dict[str, Any]] = field(default_factory=dict)

    def frame(self) -> pd.DataFrame | None:
        """All results of the wave in one frame, or None when no node produced any."""
        parts = [p for p in self.results if len(p)]
        return pd.concat(parts, ignore_index=True) if parts else None

    def failed(self) -> dict[str, NodeRun]:
        return {n: r for n, r in self.runs.items() if r.state != "succeeded"}


@contextlib.asynccontextmanager
async def _no_limit() -> AsyncIterator[None]:
    yield


def orphaned_jobs(kube: Kube, settings: BenchmarkSettings, run_id: str, nodes: Sequence[str]) -> list[str]:
    """Names of unfinished benchmark Jobs of *other* runs on ``nodes`` (a killed run's leftovers)."""
    wanted = set(nodes)
    prefix = settings.label_prefix
    out = []
    for job in kube.list_objects(
        "batch/v1", "Job", settings.namespace, label_selector="app.kubernetes.io/component=benchmark"
    ):
        meta = job["metadata"]
        labels = meta.get("labels") or {}
        node = (meta.get("annotations") or {}).get(f"{prefix}/node")
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in (job.get("status") or {}).get("conditions") or ()
        )
        if labels.get(f"{prefix}/run-id") != run_id and node in wanted and not finished:
            out.append(str(meta["name"]))
    return out


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


async def _one_node(
    kube: Kube,
    node: str,
    gpus: int,
    run_id: str,
    payload: Mapping[str, Any],
    settings: BenchmarkSettings,
    *,
    poll_s: float,
    clock: Callable[[], float],
) -> tuple[NodeRun, pd.DataFrame | None, dict[str, Any] | None]:
    job = benchmark_job(run_id, node, gpus, payload=payload, settings=settings)
    name = job["metadata"]["name"]
    with contextlib.suppress(KubeConflict):  # the same run started again: adopt the Job that is there
        await _call(kube.create, job)
    started = clock()
    # The wave's own deadline: the Job's (counted from its pod's start) plus time to schedule and pull.
    deadline = started + settings.deadline_s + PENDING_GRACE_S
    wait = poll_s
    while True:
        outcome: JobOutcome = await _call(
            observe, kube, settings.namespace, name, node=node, label_prefix=settings.label_prefix
        )
        if outcome.state in ("succeeded", "failed"):
            break
        stuck = outcome.reason in ("image_pull", "unschedulable") and clock() - started >= PENDING_GRACE_S
        if stuck or clock() >= deadline:
            outcome = await _call(abandon, kube, replace(outcome, reason=outcome.reason or "deadline"))
            break
        await asyncio.sleep(wait)
        wait = min(wait * 1.5, 10.0)
    if outcome.state != "succeeded":
        return NodeRun(node, name, "failed", outcome.reason, outcome.message), None, None
    collected: CollectedResults = await _call(collect_results, kube, outcome, run_id=run_id)
    return NodeRun(node, name, "succeeded", rows=len(collected.results)), collected.results, collected.stack


async def run_wave(
    kube: Kube,
    nodes: Mapping[str, int],
    run_id: str,
    payload: Mapping[str, Any],
    settings: BenchmarkSettings,
    *,
    max_parallel: int = 8,
    poll_s: float = 0.5,
    slot: Callable[[], contextlib.AbstractAsyncContextManager[Any]] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Wave:
    """Benchmark ``nodes`` (node → GPUs to request) with at most ``max_parallel`` Jobs at once.

    ``slot`` is entered around each Job's life (the caller's cross-run limit, e.g. a Prefect global
    concurrency limit). A node whose Job fails, times out or whose results do not validate gets a
    ``failed`` :class:`NodeRun` with the reason; it never raises for one node's trouble.
    """
    gate = asyncio.Semaphore(max(1, max_parallel))
    wave = Wave()
    enter = slot or _no_limit

    async def one(node: str, gpus: int) -> None:
        async with gate, enter():
            try:
                run, frame, stack = await _one_node(
                    kube, node, gpus, run_id, payload, settings, poll_s=poll_s, clock=clock
                )
            except (GpucertError, ValueError) as exc:  # one node's trouble costs that node its verdict only
                reason = "bad_results" if isinstance(exc, ResultsError) else "error"
                run, frame, stack = (
                    NodeRun(node, job_name(run_id, node), "failed", reason, str(exc)),
                    None,
                    None,
                )
        wave.runs[node] = run
        if frame is not None:
            wave.results.append(frame)
        if stack is not None:
            wave.stacks[node] = stack

    await asyncio.gather(*(one(node, gpus) for node, gpus in nodes.items()))
    return wave


def delete_jobs(kube: Kube, settings: BenchmarkSettings, names: Sequence[str]) -> int:
    """Delete these Jobs (and their pods, in the background); returns how many were there."""
    return sum(kube.delete("batch/v1", "Job", name, settings.namespace) for name in names)
