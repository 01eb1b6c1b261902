"""One wave of benchmark units: a Job per unit, at most N at once, each waited for with a deadline
(docs/design/certify-runbook.md, "Benchmark Jobs" and "One run per node").

A unit is a node (:func:`run_wave`) or a pair of nodes (:func:`run_pair_round`, the pairs of a round
disjoint). Both take one path: the unit's Leases taken (sorted, all or none: two runs asking for overlapping
pairs never each hold one node and wait on the other), its nodes tainted, its Job started or adopted, watched to
its end while the Leases are renewed, its pods' logs read, and whatever happens — an exception, the deadline,
the wave cancelled — an unfinished Job stopped, the taints lifted and the Leases released. Only what a unit is
differs (:class:`_NodeUnit`, :class:`_PairUnit`), and how the logs are validated (nodes in batches; a round's
pairs together, each pod's rows checked to name the other as ``peer``, both pods' rows kept).

Async, so that hundreds of units are waited on by one coroutine each and a Prefect task running it can be
cancelled at an ``await``; API calls are synchronous (the official client) and run in worker threads.

Job names are a function of (run id, unit), so a wave started again with the same run id adopts its Jobs, and
:func:`orphaned_jobs` finds those a killed run of another id left. A unit another run holds is asked for again,
with back-off and no slot held, until that run's benchmark must have ended, then left ``failed``/``leased``
(inconclusive, never a verdict).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Protocol, TypeVar

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
from ..metrics import METRICS
from ..results import concat_frames
from ._collect import CollectedResults, PodLog, read_pod_log, validate_pod_logs
from ._jobs import BenchmarkSettings, _pair, benchmark_job, job_name, owned_by, pair_job, pair_name
from ._names import COMPONENT
from ._outcome import JobOutcome, _latest, _true, abandon, classify, job_pods, observe

#: How long a Job may wait on an image it cannot pull or a node it cannot be scheduled on before the
#: wave gives up on it (a Job's own deadline counts only from its pod's start).
PENDING_GRACE_S = 120.0
#: How many nodes' logs a wave validates at once (see run_wave's ``validate``).
VALIDATE_EVERY = 64
#: The longest wait between two looks at a Job, or at a Lease another run holds.
_POLL_CAP_S = 10.0

_LOG = logging.getLogger("gpucert.certify")
_T = TypeVar("_T")
Pair = tuple[str, str]
#: The metrics measured between the two nodes of a pair (``peer`` set).
PAIR_METRICS = frozenset(name for name, m in METRICS.items() if m.level == "pair")


# --- outcomes -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class UnitRun:
    """How one unit's benchmark (a node's, or a pair's) ended: ``succeeded`` (``rows`` kept in the results) or
    why not."""

    nodes: tuple[str, ...]
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

    runs: dict[str, UnitRun] = field(default_factory=dict)
    results: list[pd.DataFrame] = field(default_factory=list)
    stacks: dict[str, dict[str, Any]] = field(default_factory=dict)
    leftovers: dict[str, str] = field(default_factory=dict)

    def frame(self) -> pd.DataFrame | None:
        """All results of the wave in one frame, or None when no node produced any."""
        parts = [p for p in self.results if len(p)]
        return pd.concat(parts, ignore_index=True) if parts else None

    def failed(self) -> dict[str, UnitRun]:
        return {n: r for n, r in self.runs.items() if r.state != "succeeded"}


@dataclass
class PairRound:
    """A round's outcome: per-pair runs (keyed by the sorted pair); the canonical results rows of the pairs
    that succeeded, both pods' rows (None when none gave any); and node → what could not be
    undone after its benchmark (a testing taint not lifted, a Lease not released; also logged)."""

    runs: dict[Pair, UnitRun] = field(default_factory=dict)
    results: pd.DataFrame | None = None
    leftovers: dict[str, str] = field(default_factory=dict)

    def failed(self) -> dict[Pair, UnitRun]:
        return {p: r for p, r in self.runs.items() if r.state != "succeeded"}


@dataclass(frozen=True)
class _Side:
    """One pod of a unit that succeeded: the node it ran on and its log, read but not validated."""

    node: str
    log: PodLog


#: What one unit's benchmark gives: how it ended and its pods' logs (none unless it succeeded).
_Result = tuple[UnitRun, list[_Side]]


def _ended(unit: _Unit, state: str, reason: str | None = None, message: str = "", rows: int = 0) -> UnitRun:
    return UnitRun(unit.nodes, unit.job, state, reason, message, rows)


# --- the units ------------------------------------------------------------------------------------------


class _Unit(Protocol):
    """What a wave needs of a benchmark unit; the rest of its life (Leases, taints, the watch, the
    clean-up) is the wave's, the same for every unit."""

    #: What a refused Lease says until another run's holder is known.
    busy: ClassVar[str]

    @property
    def nodes(self) -> tuple[str, ...]: ...  # sorted: the order their Leases are taken in

    @property
    def run_id(self) -> str: ...

    @property
    def job(self) -> str: ...  # the unit's Job's name

    @property
    def what(self) -> str: ...  # the unit as the run's log names it

    def check(self) -> None: ...  # ValueError for what is refused before any Lease is taken

    def start(self, kube: Kube, payload: Mapping[str, Any], settings: BenchmarkSettings) -> None: ...

    def look(self, kube: Kube, settings: BenchmarkSettings) -> JobOutcome: ...

    def read(self, kube: Kube, settings: BenchmarkSettings, outcome: JobOutcome) -> _Result: ...


@dataclass(frozen=True)
class _NodeUnit:
    """A node's benchmark: one Job on all the node's GPUs."""

    busy: ClassVar[str] = "another run holds its Lease"
    node: str
    gpus: int
    run_id: str

    @property
    def nodes(self) -> tuple[str, ...]:
        return (self.node,)

    @property
    def job(self) -> str:
        return job_name(self.run_id, self.node)

    @property
    def what(self) -> str:
        return f"node {self.node}"

    def check(self) -> None:
        pass  # the Job itself refuses a bad GPU count, once rendered

    def start(self, kube: Kube, payload: Mapping[str, Any], settings: BenchmarkSettings) -> None:
        job = benchmark_job(self.run_id, self.node, self.gpus, payload=payload, settings=settings)
        with contextlib.suppress(KubeConflict):  # the same run started again: adopt the Job that is there
            kube.create(job)

    def look(self, kube: Kube, settings: BenchmarkSettings) -> JobOutcome:
        return observe(kube, settings.namespace, self.job, node=self.node, label_prefix=settings.label_prefix)

    def read(self, kube: Kube, settings: BenchmarkSettings, outcome: JobOutcome) -> _Result:
        log = read_pod_log(kube, outcome, run_id=self.run_id)
        return _ended(self, "succeeded", rows=len(log.records)), [_Side(self.node, log)]


@dataclass(frozen=True)
class _PairUnit:
    """A pair's benchmark: an Indexed Job of two pods, one on each node with all its GPUs, and the headless
    Service of their rendezvous."""

    busy: ClassVar[str] = "another run holds a Lease of the pair"
    nodes: Pair
    gpus: Mapping[str, int]
    run_id: str

    @property
    def job(self) -> str:
        return pair_name(self.run_id, *self.nodes)

    @property
    def what(self) -> str:
        return f"pair {self.nodes[0]} – {self.nodes[1]}"

    def check(self) -> None:
        self._gpus()

    def _gpus(self) -> int:
        """The GPUs each pod requests: all of a node's, as many on both (else ``ValueError``)."""
        (a, b), gpus = self.nodes, self.gpus
        if gpus[a] != gpus[b]:
            raise ValueError(f"nodes {a} and {b} have {gpus[a]} and {gpus[b]} GPUs: a pair's nodes have as many")
        return gpus[a]

    def start(self, kube: Kube, payload: Mapping[str, Any], settings: BenchmarkSettings) -> None:
        """Create the pair's Job, then its Service owned by it; either one there already (the same run
        started again) is adopted, a Service left by an earlier Job of the name made this one's."""
        pair = pair_job(self.run_id, *self.nodes, self._gpus(), payload=payload, settings=settings)
        namespace = pair.job["metadata"]["namespace"]
        try:
            job = kube.create(pair.job)
        except KubeConflict:
            job = kube.get("batch/v1", "Job", pair.name, namespace)
        service = owned_by(pair.service, job)
        try:
            kube.create(service)
            return
        except KubeConflict:
            there = kube.find("v1", "Service", pair.name, namespace)
        owners = service["metadata"]["ownerReferences"]
        if there is None:  # collected between the create and the read (an earlier Job's): make it again
            with contextlib.suppress(KubeConflict):
                kube.create(service)
        elif [o.get("uid") for o in there["metadata"].get("ownerReferences") or ()] != [owners[0]["uid"]]:
            kube.merge_patch("v1", "Service", pair.name, {"metadata": {"ownerReferences": owners}}, namespace)

    def look(self, kube: Kube, settings: BenchmarkSettings) -> JobOutcome:
        """:func:`observe` for a pair Job: the Job's outcome, or while it is on its way the trouble of either
        pod (the Job's outcome reads its newest pod; the other may be the one that cannot start)."""
        namespace, name, prefix = settings.namespace, self.job, settings.label_prefix
        job = kube.find("batch/v1", "Job", name, namespace)
        if job is None:
            return observe(kube, namespace, name, label_prefix=prefix)  # says how it is gone
        pods = job_pods(kube, job)
        whole = classify(job, pods, label_prefix=prefix)
        if whole.finished or whole.stuck:
            return whole
        each = (classify(job, [pod], label_prefix=prefix) for pod in pods)
        return next((o for o in each if o.stuck), whole)

    def read(self, kube: Kube, settings: BenchmarkSettings, outcome: JobOutcome) -> _Result:
        """A completed pair Job's two pods' logs, one per node (where the pod was bound), unvalidated."""
        namespace, name = settings.namespace, self.job
        job = kube.find("batch/v1", "Job", name, namespace)
        pods = job_pods(kube, job) if job is not None else []
        sides = []
        for node in self.nodes:
            done = [
                p
                for p in pods
                if (p.get("status") or {}).get("phase") == "Succeeded" and (p.get("spec") or {}).get("nodeName") == node
            ]
            pod = _latest(done)
            if pod is None:
                why = f"Job {namespace}/{name} completed but its pod on {node} is gone: its rows cannot be read"
                return _ended(self, "failed", "vanished", why), []
            side = JobOutcome(
                node=node,
                job=name,
                state="succeeded",
                namespace=namespace,
                pod=str(pod["metadata"]["name"]),
                run_id=self.run_id,
            )
            sides.append(_Side(node, read_pod_log(kube, side, run_id=self.run_id)))
        return _ended(self, "succeeded", rows=sum(len(s.log.records) for s in sides)), sides


# --- orphans --------------------------------------------------------------------------------------------


def _finished(job: Mapping[str, Any]) -> bool:
    return _true(job, "Complete") is not None or _true(job, "Failed") is not None


def orphaned_jobs(
    kube: Kube, settings: BenchmarkSettings, run_id: str, nodes: Sequence[str], *, leases: NodeLeases | None = None
) -> list[str]:
    """Names of unfinished benchmark and pair Jobs of *other* runs on any of ``nodes`` (a killed run's
    leftovers). A Job whose run still holds the Leases of all its nodes belongs to a live run benchmarking them
    now (a certify and the nightly overlapping): it is no orphan. ``leases`` reads them (default: this run's).
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


def delete_jobs(kube: Kube, settings: BenchmarkSettings, names: Sequence[str]) -> int:
    """Delete these Jobs (and their pods, in the background); returns how many were there."""
    return sum(kube.delete("batch/v1", "Job", name, settings.namespace) for name in names)


# --- one unit -------------------------------------------------------------------------------------------


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


async def _run_unit(
    kube: Kube,
    unit: _Unit,
    payload: Mapping[str, Any],
    settings: BenchmarkSettings,
    *,
    poll_s: float,
    clock: Callable[[], float],
    renew: Callable[[], Awaitable[None]],
    renew_every_s: float,
) -> _Result:
    """Start ``unit``'s Job (or adopt it), watch it to its end and read its pods' logs when it succeeded."""
    await _call(unit.start, kube, payload, settings)
    look = functools.partial(unit.look, kube, settings)
    try:
        outcome = await _watch(
            kube,
            look,
            deadline_s=settings.deadline_s,
            poll_s=poll_s,
            clock=clock,
            renew=renew,
            renew_every_s=renew_every_s,
        )
    except LeaseLost as exc:
        return _ended(unit, "failed", "lease_lost", str(exc)), []
    if outcome.state != "succeeded":
        return _ended(unit, "failed", outcome.reason, outcome.message), []
    result: _Result = await _call(unit.read, kube, settings, outcome)
    return result


# --- Leases and taints ----------------------------------------------------------------------------------


def _give_back(leases: NodeLeases, claims: Sequence[Claim]) -> None:
    for claim in claims:
        try:
            leases.release(claim.node)
        except KubeError as exc:  # ours still: it lapses within one Lease duration, or is ours again
            _LOG.warning("node %s: its Lease was not given back: %s", claim.node, exc)


def _take(leases: NodeLeases, nodes: Sequence[str], lapsed: set[str]) -> tuple[list[Claim], Claim | None]:
    """All of ``nodes``' Leases, taken in their (sorted) order: the claims, or none and the claim another run
    holds (the Leases taken are given back when one is another run's). Nodes whose Lease was taken over
    from a crashed run are added to ``lapsed``: their orphans go before the unit's Job, even when that
    Lease is given back meanwhile."""
    taken: list[Claim] = []
    try:
        for node in nodes:
            claim = leases.acquire(node)
            if not claim.held:
                _give_back(leases, taken)
                return [], claim
            if claim.previous is not None:
                lapsed.add(node)
            taken.append(claim)
    except BaseException:
        _give_back(leases, taken)
        raise
    return taken, None


def _let_go(
    kube: Kube, leases: NodeLeases, nodes: Sequence[str], settings: BenchmarkSettings, job: str | None
) -> dict[str, str]:
    """Stop ``job`` when given (a benchmark cut short: a node released must be free), lift the testing taint
    off ``nodes`` and release their Leases, each step tried even when another fails; returns node → what
    could not be done (also logged)."""
    problems: dict[str, list[str]] = {node: [] for node in nodes}
    if job is not None:
        try:  # unless it finished: a finished one keeps its pod's log for people
            found = kube.find("batch/v1", "Job", job, settings.namespace)
            if found is not None and not _finished(found):
                kube.delete("batch/v1", "Job", job, settings.namespace)
        except KubeError as exc:
            if nodes:  # with every Lease lost there is no node of ours to tell it of
                problems[nodes[0]].append(f"its Job {job} was not stopped: {exc}")
    for node in nodes:
        try:
            lift_testing_taint(kube, node, prefix=settings.label_prefix)
        except KubeError as exc:
            problems[node].append(f"the testing taint was not lifted: {exc}")
        try:
            leases.release(node)
        except KubeError as exc:  # it lapses on its own within one Lease duration
            problems[node].append(f"the Lease was not released: {exc}")
    said = {node: "; ".join(found) for node, found in problems.items() if found}
    for node, what in said.items():
        _LOG.warning("node %s: %s", node, what)
    return said


async def _leased(
    kube: Kube,
    leases: NodeLeases,
    unit: _Unit,
    claims: Sequence[Claim],
    payload: Mapping[str, Any],
    settings: BenchmarkSettings,
    *,
    lapsed: Sequence[str],
    poll_s: float,
    clock: Callable[[], float],
    leftovers: dict[str, str],
) -> _Result:
    """Benchmark ``unit`` under the Leases we hold (``claims``): taint its nodes, clear the ``lapsed`` nodes'
    orphans, run its Job (renewing the Leases), and whatever happens lift the taints and release the Leases
    (unless another run took them over)."""
    held = list(claims)
    lost: set[str] = set()
    ended = False

    async def renew() -> None:
        for i, claim in enumerate(held):
            try:
                held[i] = await _call(leases.renew, claim)
            except LeaseLost:
                lost.add(claim.node)
                raise

    try:
        for node in unit.nodes if settings.taint_under_test else ():
            await _call(taint_testing, kube, node, prefix=settings.label_prefix, run_id=unit.run_id)
        if lapsed:  # a crashed run's Job may still hold a node's GPUs: it goes before ours
            orphans = await _call(orphaned_jobs, kube, settings, unit.run_id, lapsed, leases=leases)
            await _call(delete_jobs, kube, settings, orphans)
        result = await _run_unit(
            kube, unit, payload, settings, poll_s=poll_s, clock=clock, renew=renew, renew_every_s=leases.duration_s / 4
        )
        ended = True  # its Job finished or was given up on: nothing of it is left running
        return result
    finally:
        job = None if ended else unit.job
        free = [n for n in unit.nodes if n not in lost]  # a Lease taken over is the new holder's, and its taint
        try:
            leftovers.update(await _call(_let_go, kube, leases, free, settings, job))
        except asyncio.CancelledError:
            # Cancelled here (a task timeout cancels every await of its scope): finish the cleanup in
            # this thread. A node left tainted is worse than a loop held for a few calls, and every
            # step is idempotent should the worker thread's attempt have run too.
            leftovers.update(_let_go(kube, leases, free, settings, job))
            raise


class LeaseWait:
    """What one node's (or pair's) wait for another run's Lease tells the run's log, so a run that seems
    stuck says why: who holds the Lease and until when, when the wait starts and whenever the holder
    changes, and how long it took once the Lease is free. ``say`` takes one line."""

    def __init__(self, what: str, wait_s: float, say: Callable[[str], object], clock: Callable[[], float]) -> None:
        self.what, self.wait_s, self.say, self.clock = what, wait_s, say, clock
        self._holder: str | None = None
        self._since: float | None = None

    def refused(self, claim: Claim) -> None:
        """Another run holds ``claim``'s Lease: said when the wait starts or the holder changed."""
        if self._since is None:
            self._since = self.clock()
        if claim.holder != self._holder:
            self._holder = claim.holder
            self.say(f"{self.what}: waiting up to {self.wait_s:.0f} s for its Lease: {claim.reason}")

    def taken(self) -> None:
        """The Lease is ours: said only after a wait."""
        if self._since is not None:
            self.say(f"{self.what}: its Lease is free after {self.clock() - self._since:.0f} s of waiting")
            self._since = None


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


# --- the wave -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Limits:
    """How a wave runs its units: the keyword arguments :func:`run_wave` and :func:`run_pair_round` share."""

    max_parallel: int
    poll_s: float
    slot: Callable[[], contextlib.AbstractAsyncContextManager[Any]] | None
    clock: Callable[[], float]
    lease_wait_s: float | None
    say: Callable[[str], object]


async def _run_units(
    kube: Kube,
    units: Sequence[_Unit],
    run_id: str,
    payload: Mapping[str, Any],
    settings: BenchmarkSettings,
    limits: _Limits,
    *,
    leftovers: dict[str, str],
    done: Callable[[_Result], Awaitable[None]],
) -> None:
    """Benchmark ``units`` with at most ``limits.max_parallel`` Jobs at once, each under its nodes' Leases;
    ``done`` gets each unit's result as it ends. One unit's trouble costs that unit alone: it ends
    ``failed`` with the reason, nothing is raised for it."""
    gate = asyncio.Semaphore(max(1, limits.max_parallel))
    enter = limits.slot or contextlib.nullcontext
    clock = limits.clock
    leases = NodeLeases(kube, run_id, namespace=settings.namespace, duration_s=DEFAULT_LEASE_S)
    wait_s = limits.lease_wait_s
    if wait_s is None:  # what the holder's benchmark may last
        wait_s = settings.deadline_s + PENDING_GRACE_S + DEFAULT_LEASE_S

    async def one(unit: _Unit) -> None:
        refused = unit.busy
        lapsed: set[str] = set()
        waiting = LeaseWait(unit.what, wait_s, limits.say, clock)

        async def attempt() -> _Result | None:
            nonlocal refused
            async with gate, enter():
                try:
                    unit.check()
                    claims, other = await _call(_take, leases, unit.nodes, lapsed)
                    if other is not None:
                        refused = other.reason
                        waiting.refused(other)
                        return None
                    waiting.taken()
                    return await _leased(
                        kube,
                        leases,
                        unit,
                        claims,
                        payload,
                        settings,
                        lapsed=sorted(lapsed),
                        poll_s=limits.poll_s,
                        clock=clock,
                        leftovers=leftovers,
                    )
                except (GpucertError, ValueError) as exc:  # one unit's trouble costs that unit its verdict only
                    reason = "bad_results" if isinstance(exc, ResultsError) else "error"
                    return _ended(unit, "failed", reason, str(exc)), []

        result = await _until_free(attempt, wait_s=wait_s, poll_s=limits.poll_s, clock=clock)
        if result is None:
            result = _ended(unit, "failed", "leased", f"{refused}; waited {wait_s:.0f} s"), []
        await done(result)

    await asyncio.gather(*(one(unit) for unit in units))


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
    lease_wait_s: float | None = None,
    say: Callable[[str], object] = _LOG.info,
) -> Wave:
    """Benchmark ``nodes`` (node → GPUs to request) with at most ``max_parallel`` Jobs at once.

    ``slot`` is entered around each Job's life (the caller's cross-run limit, e.g. a Prefect global
    concurrency limit). A node whose Job fails, times out or whose results do not validate gets a
    ``failed`` :class:`UnitRun` with the reason; it never raises for one node's trouble.

    Each node is benchmarked under its Lease (renewed). A node another run holds is asked for again for
    ``lease_wait_s`` (default: the Job's deadline, :data:`PENDING_GRACE_S` and one Lease duration: what the
    holder's benchmark may last; 0: skip it at once), then left ``failed`` with reason ``leased``; ``say`` gets
    a line when such a wait starts, when the Lease changes hands and when it ends.
    """
    wave = Wave()
    logs: dict[str, PodLog] = {}
    limits = _Limits(max_parallel, poll_s, slot, clock, lease_wait_s, say)

    async def done(result: _Result) -> None:
        run, sides = result
        wave.runs[run.nodes[0]] = run
        for side in sides:
            logs[side.node] = side.log
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
                wave.runs[node] = replace(
                    wave.runs[node], state="failed", reason="bad_results", message=str(got), rows=0
                )
                continue
            wave.results.append(got.results)
            if got.stack is not None:
                wave.stacks[node] = got.stack

    units = [_NodeUnit(node, gpus, run_id) for node, gpus in nodes.items()]
    await _run_units(kube, units, run_id, payload, settings, limits, leftovers=wave.leftovers, done=done)
    await validate(logs)
    return wave


def _disjoint(pairs: Sequence[Pair], gpus: Mapping[str, int]) -> list[Pair]:
    """The round's pairs, each sorted; ``ValueError`` for a node in two pairs, a bad pair or a node
    without a GPU count."""
    seen: dict[str, Pair] = {}
    out = []
    for a, b in pairs:
        pair = _pair(a, b)
        for node in pair:
            if node in seen:
                raise ValueError(f"node {node} is in two pairs of one round: {seen[node]} and {pair}")
            if node not in gpus:
                raise ValueError(f"node {node} has no GPU count in gpus")
            seen[node] = pair
        out.append(pair)
    return out


async def run_pair_round(
    kube: Kube,
    pairs: Sequence[tuple[str, str]],
    run_id: str,
    payload: Mapping[str, Any],
    settings: BenchmarkSettings,
    *,
    gpus: Mapping[str, int],
    max_parallel: int = 8,
    poll_s: float = 0.5,
    slot: Callable[[], contextlib.AbstractAsyncContextManager[Any]] | None = None,
    clock: Callable[[], float] = time.monotonic,
    lease_wait_s: float | None = None,
    say: Callable[[str], object] = _LOG.info,
) -> PairRound:
    """Benchmark each of ``pairs`` (disjoint: ``ValueError`` naming a node in two) with at most
    ``max_parallel`` pair Jobs at once; ``gpus`` is node → GPUs (a pod requests all of its node's).

    A pair whose Job fails, times out or whose logs do not validate gets a ``failed`` :class:`UnitRun` with
    the reason; it never raises for one pair's trouble. ``slot``, Leases, taints and waiting are those of
    :func:`run_wave` (a pair waits while another run holds either node).
    """
    round_pairs = _disjoint(pairs, gpus)
    outcome = PairRound()
    logs: dict[Pair, list[_Side]] = {}
    limits = _Limits(max_parallel, poll_s, slot, clock, lease_wait_s, say)

    async def done(result: _Result) -> None:
        run, sides = result
        pair = (run.nodes[0], run.nodes[1])
        outcome.runs[pair] = run
        if sides:
            logs[pair] = sides

    units = [_PairUnit(pair, gpus, run_id) for pair in round_pairs]
    await _run_units(kube, units, run_id, payload, settings, limits, leftovers=outcome.leftovers, done=done)
    # In the order asked for, not the order they ended in: the same round gives the same frame.
    outcome.runs = {pair: outcome.runs[pair] for pair in round_pairs}
    ordered = {pair: logs[pair] for pair in round_pairs if pair in logs}
    outcome.results = await _call(_round_results, outcome.runs, ordered)
    return outcome


# --- a round's rows -------------------------------------------------------------------------------------


def _wrong_peer(side: _Side, rows: pd.DataFrame, other: str) -> str:
    """What is wrong with the peers ``side``'s rows name (``""``: nothing): each pair row, and every row
    that names a peer, must name ``other``, the pod's partner."""
    named = rows["metric"].isin(PAIR_METRICS).to_numpy() | rows["peer"].notna().to_numpy()
    peers = rows["peer"].astype(object)[named]
    bad = peers[peers.isna() | (peers != other)]
    if bad.empty:
        return ""
    said = sorted({"no peer" if pd.isna(p) else f"peer {p}" for p in bad})
    return f"{side.log.source}: {len(bad)} pair row(s) name {', '.join(said)}, but this pod's peer is {other}"


def _peers_wrong(pair: Pair, sides: Sequence[_Side], got: Sequence[CollectedResults]) -> str:
    """What the first pod whose rows name the wrong peer says is wrong (``""`` when none does)."""
    for side, collected in zip(sides, got, strict=True):
        other = pair[1] if side.node == pair[0] else pair[0]
        if wrong := _wrong_peer(side, collected.results, other):
            return wrong
    return ""


def _round_results(runs: dict[Pair, UnitRun], logs: Mapping[Pair, list[_Side]]) -> pd.DataFrame | None:
    """Validate every log of the round together and keep each good pair's rows; a pair with a bad log, or
    a row naming the wrong peer, is ``failed``/``bad_results`` in ``runs``. A good pair keeps every row of
    both pods as they logged them, each pair row naming its own node (both orientations: the node's own
    link baseline is keyed on the rows that name it, and the pair findings pool them into one pair)."""
    checked = iter(validate_pod_logs([side.log for sides in logs.values() for side in sides]))
    parts = []
    for pair, sides in logs.items():
        got = [next(checked) for _ in sides]
        good = [g for g in got if isinstance(g, CollectedResults)]
        unread = next((str(g) for g in got if isinstance(g, ResultsError)), "")
        bad = unread or _peers_wrong(pair, sides, good)
        if bad:
            runs[pair] = replace(runs[pair], state="failed", reason="bad_results", message=bad, rows=0)
            continue
        kept = concat_frames([collected.results for collected in good])
        runs[pair] = replace(runs[pair], rows=len(kept))
        parts.append(kept)
    return concat_frames(parts) if parts else None
