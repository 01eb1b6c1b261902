"""certify's tasks: choose nodes, benchmark them (async, bounded), judge, act, keep the baseline.

Large data stays out of task boundaries: a wave's results go to the store and the tasks after it get
the run's key, as DESIGN.md asks ("data crosses tasks as small values or store keys").
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pandas as pd
from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.concurrency.asyncio import concurrency

from gpucert.certify import (
    BenchmarkSettings,
    NodeDecision,
    apply_decision,
    busy_nodes,
    choose_nodes,
    decide_nodes,
    delete_jobs,
    job_failure_verdicts,
    orphaned_jobs,
    payload_configmap,
    read_run_results,
    run_wave,
    update_baselines,
    write_run_table,
)
from gpucert.kube import Kube
from gpucert.policy import Policy
from gpucert.results import parse_results
from gpucert.store import BaselineStore
from gpucert.verdict import judge

from ._retry import kube_task

__all__ = [
    "act_on_nodes",
    "benchmark",
    "judge_wave",
    "keep_baselines",
    "prepare",
    "select_nodes",
]

#: The Prefect global concurrency limit every benchmark Job holds a slot of while it runs; create it
#: (``prefect gcl create gpucert-benchmarks --limit N``) to bound Jobs across concurrent certify runs.
CONCURRENCY_LIMIT = "gpucert-benchmarks"


@kube_task("select nodes")
def select_nodes(
    kube: Kube, selector: str, asked: Sequence[str] | None, *, include_busy: bool, prefix: str
) -> tuple[dict[str, int], dict[str, str]]:
    """The nodes to benchmark (node → GPUs it advertises) and node → why each other one is skipped."""
    nodes = {n["metadata"]["name"]: n for n in kube.nodes(selector)}
    busy = busy_nodes(kube, prefix=prefix) if not include_busy else {}
    chosen, skipped = choose_nodes(sorted(nodes), asked, busy, include_busy=include_busy)
    gpus: dict[str, int] = {}
    for name in chosen:
        advertised = str(
            ((nodes[name].get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", "0")
        )
        if advertised.isdigit() and int(advertised) > 0:
            gpus[name] = int(advertised)
        else:
            skipped[name] = "advertises no nvidia.com/gpu (is the stack configured? run gpucert configure)"
    log = get_run_logger()
    log.info("%d nodes to benchmark, %d skipped", len(gpus), len(skipped))
    return gpus, skipped


@kube_task("ship the payload, clear leftovers")
def prepare(kube: Kube, settings: BenchmarkSettings, run_id: str, nodes: Sequence[str]) -> dict[str, Any]:
    """Apply the payload ConfigMap (namespace first) and delete unfinished Jobs a killed run of another id
    left on these nodes; returns the ConfigMap as stored."""
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": settings.namespace,
                "labels": {"app.kubernetes.io/part-of": "gpucert"}}})  # fmt: skip
    stored = kube.apply(payload_configmap(settings))
    orphans = orphaned_jobs(kube, settings, run_id, nodes)
    if orphans:
        get_run_logger().warning(
            "deleting %d Jobs a killed run left behind: %s", len(orphans), ", ".join(orphans)
        )
        delete_jobs(kube, settings, orphans)
    return stored


async def _limit_exists() -> bool:
    """Whether the global concurrency limit was created (else Prefect would warn once per Job)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    async with get_client() as client:
        try:
            await client.read_global_concurrency_limit_by_name(CONCURRENCY_LIMIT)
        except ObjectNotFound:
            return False
    return True


@contextlib.asynccontextmanager
async def _slot() -> AsyncIterator[None]:
    async with concurrency(CONCURRENCY_LIMIT, occupy=1, strict=False):
        yield


@task(name="benchmark", task_run_name="benchmark {run_id}", cache_policy=NO_CACHE)
async def benchmark(
    kube: Kube,
    nodes: Mapping[str, int],
    run_id: str,
    payload: Mapping[str, Any],
    settings: BenchmarkSettings,
    store: BaselineStore,
    *,
    max_parallel: int,
    day: datetime,
) -> tuple[str | None, dict[str, tuple[str | None, str]], dict[str, dict[str, Any]]]:
    """Run the wave; store its results as ``results.parquet`` of ``run_id``.

    Returns the results' store key (None when no node produced any), node → (reason, message) for each
    node whose Job failed, and node → stack record.
    """
    slot = _slot if await _limit_exists() else None
    wave = await run_wave(kube, nodes, run_id, payload, settings, max_parallel=max_parallel, slot=slot)
    frame = wave.frame()
    key = None
    if frame is not None:
        key = write_run_table(store, run_id, day.date(), "results.parquet", frame)
    failed = {n: (r.reason, r.message) for n, r in wave.failed().items()}
    get_run_logger().info(
        "%s: %d nodes measured, %d without results%s", run_id, len(nodes) - len(failed), len(failed),
        f" ({', '.join(sorted({str(r) for r, _ in failed.values()}))})" if failed else "",
    )  # fmt: skip
    return key, failed, wave.stacks


@task(name="judge", task_run_name="judge {run_id}", cache_policy=NO_CACHE)
def judge_wave(
    store: BaselineStore,
    run_id: str,
    day: datetime,
    failed: Mapping[str, tuple[str | None, str]],
    nodes: Sequence[str],
    policy: Policy,
    *,
    cohort_run: str | None = None,
) -> dict[str, NodeDecision]:
    """Judge the wave's results against the current baseline (plus an inconclusive row per failed Job),
    store ``verdicts.parquet``; returns node → decision.

    A confirming re-run measures a few nodes: judged alone, its peers would be just those nodes. With
    ``cohort_run`` the other nodes' results of that run join as peers, and only ``nodes`` are decided.
    """
    parts = [job_failure_verdicts(run_id, failed)]
    if len(failed) < len(nodes):
        results = read_run_results(store, run_id, day.date())
        if cohort_run is not None:
            cohort = read_run_results(store, cohort_run, day.date())
            cohort = cohort[~cohort["node"].isin(list(nodes))].assign(run_id=run_id)
            results = parse_results(
                pd.concat([results, cohort], ignore_index=True), f"results of run {run_id}"
            )
        judged = judge(results, store.read(), policy)
        if cohort_run is not None:
            judged = judged[judged["node"].isin(list(nodes)) | judged["node"].isna()]
        parts.insert(0, judged)
    filled = [p for p in parts if len(p)]
    verdicts = pd.concat(filled, ignore_index=True) if filled else parts[0]
    write_run_table(store, run_id, day.date(), "verdicts.parquet", verdicts)
    return decide_nodes(verdicts, nodes)


@kube_task("act on nodes")
def act_on_nodes(
    kube: Kube,
    decisions: Mapping[str, NodeDecision],
    may_taint: set[str],
    *,
    prefix: str,
    run_id: str,
    observe_only: bool,
) -> dict[str, str]:
    """Label, annotate and (for ``may_taint``) taint each node; returns node → what changed, in words."""
    now = datetime.now(UTC)
    done: dict[str, str] = {}
    for node, decision in sorted(decisions.items()):
        change = apply_decision(
            kube,
            decision,
            prefix=prefix,
            run_id=run_id,
            now=now,
            taint=node in may_taint,
            observe_only=observe_only,
        )
        words = []
        if change.labels:
            words.append(", ".join(f"{k}={v}" for k, v in change.labels.items()))
        if change.taint == "added":
            words.append(f"tainted {prefix}/unhealthy={decision.cause}:NoSchedule")
        elif change.taint == "lifted":
            words.append("gpucert taints lifted")
        if words:
            done[node] = "; ".join(words)
    return done


@task(name="keep baselines", cache_policy=NO_CACHE)
def keep_baselines(
    store: BaselineStore, run_id: str, day: datetime, stacks: Mapping[str, Mapping[str, Any]], policy: Policy
) -> tuple[str, list[str]]:
    """Merge the run's passing results into a new baseline version; returns it and the nodes re-seeded
    after a driver change."""
    results = read_run_results(store, run_id, day.date())
    return update_baselines(store, results, stacks, policy, run_id=run_id)
