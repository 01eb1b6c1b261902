"""One wave of benchmarks: a Job per node, at most N at once, each waited for with a deadline.

Async so that hundreds of nodes are waited on together by one coroutine each, and so a Prefect task
running it can be cancelled at an ``await`` (a blocking wait could not be). API calls are synchronous
(the official client) and run in worker threads.

Restart safety: Job names are a function of (run id, node), so a wave started again with the same run id
adopts the Jobs already there instead of creating duplicates, and :func:`orphaned_jobs` finds the Jobs a
killed run of another id left behind on these nodes, for the caller to delete before starting.

One run per node at a time (:mod:`gpucert.kube._lease`): before a node's Job is created, the wave takes
the node's Lease under its run id and taints the node ``<prefix>/testing=<run id>:NoSchedule`` (the Job
tolerates it; no workload lands there mid-benchmark); the polling loop renews the Lease; whatever the
outcome — success, failure, an exception, the deadline, the wave cancelled — the taint is lifted and the
Lease released. A node whose Lease another run holds is waited for, outside the wave's parallel slots,
until that run's benchmark must have ended (its Job's deadline, the pending grace and one Lease
duration, unless ``lease_wait_s`` says otherwise), then left ``failed`` with reason ``leased`` and
"benchmarked by run X" (inconclusive for this run, never a verdict). The same run started again holds
its own Leases under the same identity; a crashed run's Leases lapse and are taken over, its unfinished
Job on the node deleted first. The Jobs of a run that still holds its node's Lease are never orphans.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import pandas as pd

from ..errors import GpucertError, ResultsError
from ..kube import (
    DEFAULT_LEASE_S,
    Claim,
    Kube,
    KubeConflict,
    KubeError,
    KubeUnavailable,
    LeaseLost,
    NodeLeases,
    lift_testing_taint,
    taint_testing,
)
from ._collect import PodLog, read_pod_log, validate_pod_logs
from ._jobs import BenchmarkSettings, benchmark_job, job_name
from ._names import COMPONENT
from ._outcome import JobOutcome, abandon, observe

__all__ = ["NodeRun", "Wave", "delete_jobs", "orphaned_jobs", "run_wave", "sweep_orphans"]

#: How long a Job may wait on an image it cannot pull or a node it cannot be scheduled on before the
#: wave gives up on it (a Job's own deadline counts only from its pod's start).
PENDING_GRACE_S = 120.0
#: How many nodes' logs a wave validates at once (see run_wave's ``validate``).
VALIDATE_EVERY = 64
#: The longest wait between two looks at a Job, or at a Lease another run holds.
_POLL_CAP_S = 10.0

_LOG = logging.getLogger("gpucert.certify")
_T = TypeVar("_T")


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
    """A wave's outcome: per-node runs, the results of the nodes that succeeded, their stack records, and
    node → what could not be undone after its benchmark (a testing taint not lifted, a Lease not
    released: the API failed past its retries; also logged)."""

    runs: dict[str, NodeRun] = field(default_factory=dict)
    results: list[pd.DataFrame] = field(default_factory=list)
    stacks: dict[str, dict[str, Any]] = field(default_factory=dict)
    leftovers: dict[str, str] = field(default_factory=dict)

    def frame(self) -> pd.DataFrame | None:
        """All results of the wave in one frame, or None when no node produced any."""
        parts = [p for p in self.results if len(p)]
        return pd.concat(parts, ignore_index=True) if parts else None

    def failed(self) -> dict[str, NodeRun]:
        return {n: r for n, r in self.runs.items() if r.state != "succeeded"}


#: What one node's benchmark gives: how it ended and its log, read but not validated (None without).
_Result = tuple[NodeRun, PodLog | None]


@contextlib.asynccontextmanager
async def _no_limit() -> AsyncIterator[None]:
    yield


def _finished(job: Mapping[str, Any]) -> bool:
    return any(
        c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
        for c in (job.get("status") or {}).get("conditions") or ()
    )


def orphaned_jobs(
    kube: Kube,
    settings: BenchmarkSettings,
    run_id: str,
    nodes: Sequence[str],
    *,
    leases: NodeLeases | None = None,
) -> list[str]:
    """Names of unfinished benchmark and pair Jobs of *other* runs on any of ``nodes`` (a killed run's
    leftovers).

    A Job whose run still holds the Leases of all its nodes (one, or a pair's two) belongs to a live run
    benchmarking them now (a certify and the nightly overlapping): it is no orphan. ``leases`` reads them
    (default: this run's).
    """
    wanted = set(nodes)
    prefix = settings.label_prefix
    leases = leases or NodeLeases(kube, run_id, namespace=settings.namespace)
    out = []
    for job in kube.list_objects(
        "batch/v1", "Job", settings.namespace, label_selector=f"app.kubernetes.io/component={COMPONENT}"
    ):
        meta = job["metadata"]
        on = _job_nodes(job, prefix)
        owner = (meta.get("labels") or {}).get(f"{prefix}/run-id")
        if owner == run_id or wanted.isdisjoint(on) or _finished(job):
            continue
        if owner is None or any(leases.live_holder(node) != owner for node in on):
            out.append(str(meta["name"]))
    return out


def _job_nodes(job: Mapping[str, Any], prefix: str) -> tuple[str, ...]:
    """The nodes a benchmark Job is on: its ``<prefix>/node`` annotation's, or the two a pair Job's
    ``<prefix>/pair`` annotation names; () for neither."""
    annotations = (job.get("metadata") or {}).get("annotations") or {}
    if node := annotations.get(f"{prefix}/node"):
        return (str(node),)
    return tuple(n for n in str(annotations.get(f"{prefix}/pair") or "").split(",") if n)


def sweep_orphans(
    kube: Kube, settings: BenchmarkSettings, run_id: str, nodes: Sequence[str], leases: NodeLeases
) -> int:
    """Delete the unfinished Jobs, node and pair, that crashed runs left on ``nodes``."""
    return delete_jobs(kube, settings, orphaned_jobs(kube, settings, run_id, nodes, leases=leases))


async def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await asyncio.to_thread(fn, *args, **kwargs)


async def _watch(
    kube: Kube,
    look: Callable[[], JobOutcome],
    *,
    deadline_s: float,
    poll_s: float,
    clock: Callable[[], float],
    renew: Callable[[], Awaitable[None]] | None = None,
    renew_every_s: float = DEFAULT_LEASE_S / 4,
) -> JobOutcome:
    """Look at a Job just created (``look``, in a worker thread) until it ends, and return how it ended.

    It is given up (:func:`abandon`) when its pod is stuck on an image pull or unschedulable for
    :data:`PENDING_GRACE_S`, or once the Job's ``deadline_s`` (counted from its pod's start) and that grace
    have passed. ``renew`` renews the Leases every ``renew_every_s`` meanwhile; when it raises
    :class:`~gpucert.kube.LeaseLost` the Job is given up and that error raised again.
    """
    started = clock()
    # The wave's own deadline: the Job's (counted from its pod's start) plus time to schedule and pull.
    deadline = started + deadline_s + PENDING_GRACE_S
    wait, renewed = poll_s, started
    while True:
        outcome: JobOutcome = await _call(look)
        if outcome.state in ("succeeded", "failed"):
            return outcome
        stuck = outcome.reason in ("image_pull", "unschedulable") and clock() - started >= PENDING_GRACE_S
        if stuck or clock() >= deadline:
            given_up = replace(outcome, reason=outcome.reason or "deadline")
            gone: JobOutcome = await _call(abandon, kube, given_up)
            return gone
        if renew is not None and clock() - renewed >= renew_every_s:
            try:
                await renew()
                renewed = clock()
            except LeaseLost:  # another run has the node now: our measurement would share it
                await _call(abandon, kube, outcome)
                raise
            except KubeUnavailable:
                pass  # tried again at the next poll: the Lease outlasts a few misses
        await asyncio.sleep(wait)
        wait = min(wait * 1.5, _POLL_CAP_S)


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
    renew: Callable[[], Awaitable[None]] | None = None,
    renew_every_s: float = DEFAULT_LEASE_S / 4,
) -> _Result:
    job = benchmark_job(run_id, node, gpus, payload=payload, settings=settings)
    name = job["metadata"]["name"]
    with contextlib.suppress(KubeConflict):  # the same run started again: adopt the Job that is there
        await _call(kube.create, job)
    prefix = settings.label_prefix
    look = functools.partial(observe, kube, settings.namespace, name, node=node, label_prefix=prefix)
    try:
        outcome = await _watch(kube, look, deadline_s=settings.deadline_s, poll_s=poll_s, clock=clock,
                               renew=renew, renew_every_s=renew_every_s)  # fmt: skip
    except LeaseLost as exc:
        return NodeRun(node, name, "failed", "lease_lost", str(exc)), None
    if outcome.state != "succeeded":
        return NodeRun(node, name, "failed", outcome.reason, outcome.message), None
    log: PodLog = await _call(read_pod_log, kube, outcome, run_id=run_id)
    return NodeRun(node, name, "succeeded", rows=len(log.records)), log


def _stop_job(kube: Kube, namespace: str, name: str) -> None:
    """Delete the Job ``name`` unless it finished (a finished one keeps its pod's log for people)."""
    job = kube.find("batch/v1", "Job", name, namespace)
    if job is not None and not _finished(job):
        kube.delete("batch/v1", "Job", name, namespace)


def _let_go(kube: Kube, leases: NodeLeases, node: str, settings: BenchmarkSettings, job: str | None) -> str:
    """Stop ``job`` when given (a benchmark cut short: a node released must be free), lift the testing taint
    off ``node`` and release its Lease, each step tried even when another fails; returns what could not be
    done (``""`` when all was)."""
    problems = []
    if job is not None:
        try:
            _stop_job(kube, settings.namespace, job)
        except KubeError as exc:
            problems.append(f"its Job {job} was not stopped: {exc}")
    try:
        lift_testing_taint(kube, node, prefix=settings.label_prefix)
    except KubeError as exc:
        problems.append(f"the testing taint was not lifted: {exc}")
    try:
        leases.release(node)
    except KubeError as exc:  # it lapses on its own within one Lease duration
        problems.append(f"the Lease was not released: {exc}")
    if problems:
        _LOG.warning("node %s: %s", node, "; ".join(problems))
    return "; ".join(problems)


async def _leased_node(
    kube: Kube,
    leases: NodeLeases,
    claim: Claim,
    gpus: int,
    run_id: str,
    payload: Mapping[str, Any],
    settings: BenchmarkSettings,
    *,
    poll_s: float,
    clock: Callable[[], float],
    leftovers: dict[str, str],
) -> _Result:
    """Benchmark ``claim.node`` under the Lease we hold: taint it, run its Job (renewing the Lease), and
    whatever happens lift the taint and release the Lease (unless another run took it over)."""
    node, prefix = claim.node, settings.label_prefix
    held, lost, ended = claim, False, False

    async def renew() -> None:
        nonlocal held, lost
        try:
            held = await _call(leases.renew, held)
        except LeaseLost:
            lost = True
            raise

    try:
        if settings.taint_under_test:
            await _call(taint_testing, kube, node, prefix=prefix, run_id=run_id)
        if claim.previous is not None:
            # A crashed run's lapsed Lease: its Job may still hold the node's GPUs; it goes before ours.
            await _call(sweep_orphans, kube, settings, run_id, [node], leases)
        result = await _one_node(kube, node, gpus, run_id, payload, settings, poll_s=poll_s, clock=clock,
                                 renew=renew, renew_every_s=leases.duration_s / 4)  # fmt: skip
        ended = True  # its Job finished or was given up on: nothing of it is left running
        return result
    finally:
        if not lost:  # a Lease taken over is the new holder's, and so is the taint on the node now
            job = None if ended else job_name(run_id, node)
            try:
                problem = await _call(_let_go, kube, leases, node, settings, job)
            except asyncio.CancelledError:
                # Cancelled here (a task timeout cancels every await of its scope): finish the cleanup in
                # this thread. A node left tainted is worse than a loop held for a few calls, and every
                # step is idempotent should the worker thread's attempt have run too.
                leftovers[node] = _let_go(kube, leases, node, settings, job)
                raise
            if problem:
                leftovers[node] = problem


def _trouble(exc: BaseException) -> str:
    """The reason a benchmark that raised ``exc`` failed with: rows that break the contract, or an error."""
    return "bad_results" if isinstance(exc, ResultsError) else "error"


async def _until_free(
    attempt: Callable[[], Awaitable[_T | None]], *, wait_s: float, poll_s: float, clock: Callable[[], float]
) -> _T | None:
    """``attempt()`` until it gives something (None: another run holds what it needs) or ``wait_s`` has
    passed (None then), looking again with back-off and nothing held in between."""
    give_up, wait = clock() + wait_s, poll_s
    while True:
        got = await attempt()
        if got is not None or clock() >= give_up:
            return got
        # Another run is benchmarking the node: look again later, holding no slot meanwhile.
        await asyncio.sleep(max(0.0, min(wait, give_up - clock())))
        wait = min(wait * 1.5, _POLL_CAP_S)


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
    lease_s: int = DEFAULT_LEASE_S,
    lease_wait_s: float | None = None,
) -> Wave:
    """Benchmark ``nodes`` (node → GPUs to request) with at most ``max_parallel`` Jobs at once.

    ``slot`` is entered around each Job's life (the caller's cross-run limit, e.g. a Prefect global
    concurrency limit). A node whose Job fails, times out or whose results do not validate gets a
    ``failed`` :class:`NodeRun` with the reason; it never raises for one node's trouble.

    Each node is benchmarked under its Lease (``lease_s`` long, renewed; see the module docstring). A node
    another run holds is asked for again, with back-off and no slot held, for ``lease_wait_s`` (default:
    the Job's deadline, :data:`PENDING_GRACE_S` and one ``lease_s``: what the holder's benchmark may last;
    0: skip it at once), then left ``failed`` with reason ``leased``.
    """
    gate = asyncio.Semaphore(max(1, max_parallel))
    wave = Wave()
    enter = slot or _no_limit
    leases = NodeLeases(kube, run_id, namespace=settings.namespace, duration_s=lease_s)
    wait_s = settings.deadline_s + PENDING_GRACE_S + lease_s if lease_wait_s is None else lease_wait_s

    async def one(node: str, gpus: int) -> None:
        refused = "another run holds its Lease"

        async def attempt() -> _Result | None:
            nonlocal refused
            async with gate, enter():
                try:
                    claim = await _call(leases.acquire, node)
                    if not claim.held:
                        refused = claim.reason
                        return None
                    return await _leased_node(kube, leases, claim, gpus, run_id, payload, settings,
                                              poll_s=poll_s, clock=clock, leftovers=wave.leftovers)  # fmt: skip
                except (GpucertError, ValueError) as exc:  # one node's trouble costs that node its verdict only
                    return NodeRun(node, job_name(run_id, node), "failed", _trouble(exc), str(exc)), None

        result = await _until_free(attempt, wait_s=wait_s, poll_s=poll_s, clock=clock)
        if result is None:
            why = f"{refused}; waited {wait_s:.0f} s"
            result = NodeRun(node, job_name(run_id, node), "failed", "leased", why), None
        run, log = result
        wave.runs[node] = run
        if log is not None:
            logs[node] = log
            if len(logs) >= VALIDATE_EVERY:
                batch = dict(logs)
                logs.clear()  # before the await: no other node's coroutine takes the same batch
                await validate(batch)

    async def validate(batch: Mapping[str, PodLog]) -> None:
        # Logs validated together: the contract's checks cost about the same on one log as on many. In
        # batches, so that a wave of a thousand nodes holds at most a batch of logs as parsed records
        # (about 1 MB a node), the rest as compact frames.
        checked = await _call(validate_pod_logs, list(batch.values()))
        for node, got in zip(batch, checked, strict=True):
            if isinstance(got, ResultsError):  # one node's bad rows cost that node its verdict only
                wave.runs[node] = NodeRun(node, wave.runs[node].job, "failed", "bad_results", str(got))
                continue
            wave.results.append(got.results)
            if got.stack is not None:
                wave.stacks[node] = got.stack

    logs: dict[str, PodLog] = {}
    await asyncio.gather(*(one(node, gpus) for node, gpus in nodes.items()))
    await validate(logs)
    return wave


def delete_jobs(kube: Kube, settings: BenchmarkSettings, names: Sequence[str]) -> int:
    """Delete these Jobs (and their pods, in the background); returns how many were there."""
    return sum(kube.delete("batch/v1", "Job", name, settings.namespace) for name in names)
