"""One round of pair benchmarks: a two-node Job per pair, the pairs of a round disjoint, run like a wave.

The pair benchmark (:mod:`._pairjobs`) measures the network between two nodes with all their GPUs busy,
so it owns both nodes while it runs: no other benchmark, of this run or another, may share either. A
round is a set of disjoint pairs (a caller's schedule cuts all the pairs it wants into such rounds, each
node in at most one pair of a round), run the way :func:`run_wave` runs nodes, and with its helpers:

* **Both Leases, or none.** Before a pair's Job is created the round takes both nodes' Leases
  (:class:`~gpucert.kube.NodeLeases` under the run id), in sorted node order, and taints both nodes
  ``<prefix>/testing``. When another run holds either, the one taken is given back at once (never held
  while waiting, so two runs asking for overlapping pairs cannot each hold one node and wait on the
  other for ever) and the pair is asked for again with back-off, up to ``lease_wait_s``, then left
  ``failed`` with reason ``leased``. Both Leases are renewed while the Job runs; whatever the outcome —
  success, failure, an exception, the deadline, the round cancelled — the Job is stopped if unfinished,
  both taints lifted and both Leases released (a Lease another run took over is left to it).
* **Restart safety.** The Job and its headless Service are named by (run id, pair), so a round started
  again with the same run id adopts them (409 → the one there); the Service is made the Job's
  (:func:`~gpucert.certify._pairjobs.owned_by`) so it goes with the Job.
  :func:`~gpucert.certify.orphaned_jobs` finds the unfinished pair Jobs a killed run of another id
  left on these nodes; a Lease taken over from a
  crashed run has its node's orphans (node and pair Jobs) deleted before the pair's Job starts.
* **Stuck either side.** A pair Job's outcome is read from both pods: the pod that cannot pull its image
  or be scheduled may be either, and either gives the Job up after :data:`PENDING_GRACE_S`.
* **Two logs, one measurement.** Both pods log the same ``nccl_pair_busbw_gbps`` values (the one
  collective they ran together), each as its own node with the other as ``peer``. The round validates
  every log of the round together (:func:`validate_pod_logs`), checks each pod's pair rows name the
  other node, and keeps both pods' rows as logged: each node's own link baseline is made of the rows
  that name it, and :func:`gpucert.network.judge_pairs` pools a pair's two orientations into one pair.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pandas as pd

from ..errors import GpucertError, ResultsError
from ..kube import DEFAULT_LEASE_S, Claim, Kube, KubeConflict, KubeError, LeaseLost, NodeLeases, taint_testing
from ..metrics import METRICS
from ..results._relations import _concat
from ._collect import CollectedResults, PodLog, read_pod_log, validate_pod_logs
from ._jobs import BenchmarkSettings
from ._outcome import JobOutcome, _latest, classify, job_pods, observe
from ._pairjobs import PairJob, _pair, owned_by, pair_job, pair_name
from ._wave import (
    _LOG,
    PENDING_GRACE_S,
    _call,
    _let_go,
    _no_limit,
    _stop_job,
    _trouble,
    _until_free,
    _watch,
    sweep_orphans,
)

__all__ = ["PairRound", "PairRun", "run_pair_round"]

Pair = tuple[str, str]
#: The metrics measured between the two nodes of a pair (``peer`` set).
PAIR_METRICS = frozenset(name for name, m in METRICS.items() if m.level == "pair")


@dataclass(frozen=True)
class PairRun:
    """How one pair's benchmark ended: ``succeeded`` (``rows`` kept in the round's results) or why not."""

    nodes: tuple[str, str]
    job: str
    state: str
    reason: str | None = None
    message: str = ""
    rows: int = 0


@dataclass
class PairRound:
    """A round's outcome: per-pair runs (keyed by the sorted pair); the canonical results rows of the pairs
    that succeeded, both pods' rows (None when none gave any); and node → what could not be
    undone after its benchmark (a testing taint not lifted, a Lease not released; also logged)."""

    runs: dict[tuple[str, str], PairRun] = field(default_factory=dict)
    results: pd.DataFrame | None = None
    leftovers: dict[str, str] = field(default_factory=dict)

    def failed(self) -> dict[tuple[str, str], PairRun]:
        return {p: r for p, r in self.runs.items() if r.state != "succeeded"}


@dataclass(frozen=True)
class _Side:
    """One pod of a succeeded pair: the node it ran on and its log."""

    node: str
    log: PodLog


#: What one pair's benchmark gives: how it ended and its pods' logs, read but not validated.
_Result = tuple[PairRun, list[_Side]]


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


def _pair_gpus(pair: Pair, gpus: Mapping[str, int]) -> int:
    """The GPUs each pod of ``pair`` requests: all of a node's, as many on both (else ``ValueError``)."""
    a, b = gpus[pair[0]], gpus[pair[1]]
    if a != b:
        raise ValueError(f"nodes {pair[0]} and {pair[1]} have {a} and {b} GPUs: a pair's nodes have as many")
    return a


# --- both Leases ----------------------------------------------------------------------------------------


def _give_back(leases: NodeLeases, claims: Sequence[Claim]) -> None:
    for claim in claims:
        try:
            leases.release(claim.node)
        except KubeError as exc:  # ours still: it lapses within one Lease duration, or is ours again
            _LOG.warning("node %s: its Lease was not given back: %s", claim.node, exc)


def _take_pair(leases: NodeLeases, pair: Pair, lapsed: set[str]) -> tuple[list[Claim], str]:
    """Both nodes' Leases, taken in sorted order: the two claims, or none and why (a Lease taken is given
    back when the other is another run's). Nodes whose Lease was taken over from a crashed run are added
    to ``lapsed``: their orphans go before the pair's Job, even when that Lease is given back meanwhile."""
    taken: list[Claim] = []
    try:
        for node in pair:
            claim = leases.acquire(node)
            if not claim.held:
                _give_back(leases, taken)
                return [], claim.reason
            if claim.previous is not None:
                lapsed.add(node)
            taken.append(claim)
    except BaseException:
        _give_back(leases, taken)
        raise
    return taken, ""


def _let_go_pair(
    kube: Kube, leases: NodeLeases, nodes: Sequence[str], settings: BenchmarkSettings, job: str | None
) -> dict[str, str]:
    """Stop ``job`` when given, lift the testing taint off ``nodes`` and release their Leases, each step
    tried even when another fails; returns node → what could not be done."""
    problems = {}
    for i, node in enumerate(nodes):
        if problem := _let_go(kube, leases, node, settings, job if i == 0 else None):
            problems[node] = problem
    if job is not None and not nodes:  # both Leases lost: the Job is still ours to stop
        with contextlib.suppress(KubeError):
            _stop_job(kube, settings.namespace, job)
    return problems


# --- one pair -------------------------------------------------------------------------------------------


def _start(kube: Kube, pair: PairJob) -> None:
    """Create the pair's Job, then its Service owned by it; either one there already (the same run started
    again) is adopted, a Service left by an earlier Job of the name made this one's."""
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


def _observe_pair(kube: Kube, namespace: str, name: str, *, label_prefix: str) -> JobOutcome:
    """:func:`observe` for a pair Job: the Job's outcome, or while it is on its way the trouble of either
    pod (the Job's outcome reads its newest pod; the other may be the one that cannot start)."""
    job = kube.find("batch/v1", "Job", name, namespace)
    if job is None:
        return observe(kube, namespace, name, label_prefix=label_prefix)  # says how it is gone
    pods = job_pods(kube, job)
    whole = classify(job, pods, label_prefix=label_prefix)
    if whole.finished or whole.stuck:
        return whole
    each = (classify(job, [pod], label_prefix=label_prefix) for pod in pods)
    return next((o for o in each if o.stuck), whole)


def _read_pair(kube: Kube, settings: BenchmarkSettings, run_id: str, name: str, nodes: Pair) -> _Result:
    """A completed pair Job's two pods' logs, one per node (where the pod was bound), unvalidated."""
    namespace = settings.namespace
    job = kube.find("batch/v1", "Job", name, namespace)
    pods = job_pods(kube, job) if job is not None else []
    sides = []
    for node in nodes:
        done = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"
                and (p.get("spec") or {}).get("nodeName") == node]  # fmt: skip
        pod = _latest(done)
        if pod is None:
            why = f"Job {namespace}/{name} completed but its pod on {node} is gone: its rows cannot be read"
            return PairRun(nodes, name, "failed", "vanished", why), []
        outcome = JobOutcome(node=node, job=name, state="succeeded", namespace=namespace,
                             pod=str(pod["metadata"]["name"]), run_id=run_id)  # fmt: skip
        sides.append(_Side(node, read_pod_log(kube, outcome, run_id=run_id)))
    return PairRun(nodes, name, "succeeded", rows=sum(len(s.log.records) for s in sides)), sides


async def _one_pair(
    kube: Kube,
    nodes: Pair,
    gpus: int,
    run_id: str,
    payload: Mapping[str, Any],
    settings: BenchmarkSettings,
    *,
    poll_s: float,
    clock: Callable[[], float],
    renew: Callable[[], Awaitable[None]],
    renew_every_s: float,
) -> _Result:
    pair = pair_job(run_id, *nodes, gpus, payload=payload, settings=settings)
    await _call(_start, kube, pair)
    prefix = settings.label_prefix
    look = functools.partial(_observe_pair, kube, settings.namespace, pair.name, label_prefix=prefix)
    try:
        outcome = await _watch(kube, look, deadline_s=settings.deadline_s, poll_s=poll_s, clock=clock,
                               renew=renew, renew_every_s=renew_every_s)  # fmt: skip
    except LeaseLost as exc:
        return PairRun(nodes, pair.name, "failed", "lease_lost", str(exc)), []
    if outcome.state != "succeeded":
        return PairRun(nodes, pair.name, "failed", outcome.reason, outcome.message), []
    result: _Result = await _call(_read_pair, kube, settings, run_id, pair.name, nodes)
    return result


async def _leased_pair(
    kube: Kube,
    leases: NodeLeases,
    claims: Sequence[Claim],
    gpus: int,
    run_id: str,
    payload: Mapping[str, Any],
    settings: BenchmarkSettings,
    *,
    lapsed: Sequence[str],
    poll_s: float,
    clock: Callable[[], float],
    leftovers: dict[str, str],
) -> _Result:
    """Benchmark the pair under both Leases we hold: taint both nodes, clear the ``lapsed`` nodes' orphans,
    run its Job (renewing both Leases), and whatever happens let both nodes go (see :func:`_leased_node`)."""
    nodes: Pair = (claims[0].node, claims[1].node)
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
        for node in nodes if settings.taint_under_test else ():
            await _call(taint_testing, kube, node, prefix=settings.label_prefix, run_id=run_id)
        if lapsed:  # a crashed run's Job may still hold a node's GPUs: it goes before ours
            await _call(sweep_orphans, kube, settings, run_id, lapsed, leases)
        result = await _one_pair(kube, nodes, gpus, run_id, payload, settings, poll_s=poll_s, clock=clock,
                                 renew=renew, renew_every_s=leases.duration_s / 4)  # fmt: skip
        ended = True  # its Job finished or was given up on: nothing of it is left running
        return result
    finally:
        job = None if ended else pair_name(run_id, *nodes)
        free = [n for n in nodes if n not in lost]  # a Lease taken over is the new holder's, and its taint
        try:
            problems = await _call(_let_go_pair, kube, leases, free, settings, job)
        except asyncio.CancelledError:  # finish the cleanup in this thread (see _leased_node)
            leftovers.update(_let_go_pair(kube, leases, free, settings, job))
            raise
        leftovers.update(problems)


# --- the round's rows -----------------------------------------------------------------------------------


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


def _kept(got: Sequence[CollectedResults]) -> pd.DataFrame:
    """The pair's rows for the round: every row of both pods as it logged them, each pair row naming its
    own node (both orientations: the node's own link baseline is keyed on the rows that name it, and the
    judgement pools a pair's two orientations into one pair)."""
    return _concat([collected.results for collected in got])


def _round_results(runs: dict[Pair, PairRun], logs: Mapping[Pair, list[_Side]]) -> pd.DataFrame | None:
    """Validate every log of the round together and keep each good pair's rows; a pair with a bad log, or
    a row naming the wrong peer, is ``failed``/``bad_results`` in ``runs``."""
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
        kept = _kept(good)
        runs[pair] = replace(runs[pair], rows=len(kept))
        parts.append(kept)
    return _concat(parts) if parts else None


# --- the round ------------------------------------------------------------------------------------------


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
    lease_s: int = DEFAULT_LEASE_S,
    lease_wait_s: float | None = None,
) -> PairRound:
    """Benchmark each of ``pairs`` (disjoint: ``ValueError`` naming a node in two) with at most
    ``max_parallel`` pair Jobs at once; ``gpus`` is node → GPUs (a pod requests all of its node's).

    ``slot`` is entered around each pair Job's life (the caller's cross-run limit). A pair whose Job fails,
    times out or whose logs do not validate gets a ``failed`` :class:`PairRun` with the reason; it never
    raises for one pair's trouble. Leases, taints and waiting are those of :func:`run_wave` (see the module
    docstring): a pair another run holds either node of is asked for again for ``lease_wait_s`` (default:
    the Job's deadline, :data:`PENDING_GRACE_S` and one ``lease_s``; 0: skip it at once), then ``leased``.
    """
    round_pairs = _disjoint(pairs, gpus)
    gate = asyncio.Semaphore(max(1, max_parallel))
    outcome = PairRound()
    enter = slot or _no_limit
    leases = NodeLeases(kube, run_id, namespace=settings.namespace, duration_s=lease_s)
    wait_s = settings.deadline_s + PENDING_GRACE_S + lease_s if lease_wait_s is None else lease_wait_s
    logs: dict[Pair, list[_Side]] = {}

    async def one(pair: Pair) -> None:
        refused = "another run holds a Lease of the pair"
        lapsed: set[str] = set()
        name = pair_name(run_id, *pair)

        async def attempt() -> _Result | None:
            nonlocal refused
            async with gate, enter():
                try:
                    count = _pair_gpus(pair, gpus)
                    claims, why = await _call(_take_pair, leases, pair, lapsed)
                    if not claims:
                        refused = why
                        return None
                    return await _leased_pair(kube, leases, claims, count, run_id, payload, settings,
                                              lapsed=sorted(lapsed), poll_s=poll_s, clock=clock,
                                              leftovers=outcome.leftovers)  # fmt: skip
                except (GpucertError, ValueError) as exc:  # one pair's trouble costs that pair alone
                    return PairRun(pair, name, "failed", _trouble(exc), str(exc)), []

        result = await _until_free(attempt, wait_s=wait_s, poll_s=poll_s, clock=clock)
        if result is None:
            result = PairRun(pair, name, "failed", "leased", f"{refused}; waited {wait_s:.0f} s"), []
        run, sides = result
        outcome.runs[pair] = run
        if sides:
            logs[pair] = sides

    await asyncio.gather(*(one(pair) for pair in round_pairs))
    # In the order asked for, not the order they ended in: the same round gives the same frame.
    outcome.runs = {pair: outcome.runs[pair] for pair in round_pairs}
    ordered = {pair: logs[pair] for pair in round_pairs if pair in logs}
    outcome.results = await _call(_round_results, outcome.runs, ordered)
    return outcome
