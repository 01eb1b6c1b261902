"""certify's tasks: choose nodes, benchmark them (async, bounded), make verdicts, settle, act, keep the baseline.

Large data stays out of task boundaries: a wave's results go to the store, and the tasks after it get
the :class:`~gpucert.certify.CertificationRun` that addresses them (and keeps what it read), as
docs/design/architecture.md, "Layers" asks ("data crosses tasks as small values or store keys").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from gpucert._frames import empty_results
from gpucert._memory import release_freed_memory
from gpucert._text import counted
from gpucert.certify import (
    DECISIONS,
    RESULTS,
    VERDICTS,
    BenchmarkSettings,
    CertificationRules,
    CertificationRun,
    NodeTaints,
    RunVerdicts,
    Settlement,
    apply_decision,
    busy_nodes,
    choose_nodes,
    delete_jobs,
    fleet_taints,
    orphaned_jobs,
    payload_configmap,
    run_verdicts,
    run_wave,
    settle,
    settled_verdicts,
    stored_plan_of,
    update_baselines,
    write_shard,
)
from gpucert.errors import InputError
from gpucert.kube import Kube, KubeNotFound
from gpucert.policy import Policy
from gpucert.store import empty_baseline

from ._retry import kube_task
from ._slots import benchmark_slot

__all__ = [
    "act_on_nodes",
    "benchmark",
    "fleet_state",
    "keep_baselines",
    "make_verdicts",
    "prepare",
    "record_settlement",
    "select_nodes",
    "settle_run",
]


@kube_task("select nodes")
def select_nodes(
    kube: Kube, selector: str, asked: Sequence[str] | None, *, include_busy: bool, prefix: str
) -> tuple[dict[str, int], dict[str, str]]:
    """The nodes to benchmark (node → GPUs it advertises) and node → why each other one is skipped.

    Raises ``InputError`` naming the asked-for nodes the cluster does not have at all (a typo).
    """
    nodes = {n["metadata"]["name"]: n for n in kube.nodes(selector)}
    unknown = sorted(set(asked or ()) - set(nodes))
    if unknown:
        every = {n["metadata"]["name"] for n in kube.nodes()}
        missing = [n for n in unknown if n not in every]
        if missing:
            raise InputError(f"no node named {', '.join(missing)} in the cluster")
    busy = busy_nodes(kube, prefix=prefix) if not include_busy else {}
    chosen, skipped = choose_nodes(sorted(nodes), asked, busy, include_busy=include_busy)
    gpus: dict[str, int] = {}
    for name in chosen:
        advertised = str(((nodes[name].get("status") or {}).get("allocatable") or {}).get("nvidia.com/gpu", "0"))
        if advertised.isdigit() and int(advertised) > 0:
            gpus[name] = int(advertised)
        else:
            skipped[name] = "advertises no nvidia.com/gpu (is the stack configured? run gpucert configure)"
    log = get_run_logger()
    log.info("%s to benchmark, %d skipped", counted(len(gpus), "node"), len(skipped))
    return gpus, skipped


@kube_task("ship the payload, clear leftovers")
def prepare(kube: Kube, settings: BenchmarkSettings, run_id: str, nodes: Sequence[str]) -> dict[str, Any]:
    """Apply the payload ConfigMap and delete unfinished Jobs a killed run of another id left on these nodes;
    returns the ConfigMap as stored.

    The Jobs' namespace is configure's (it carries the Pod Security level the stack needs, and the runtime
    role may not write namespaces): it is created here only where it is missing, a cluster certify runs
    on unconfigured (the simulator's, a test's)."""
    configmap = payload_configmap(settings)
    try:
        # Read first: a payload already there is not a change (the audit trail records none).
        before = kube.find("v1", "ConfigMap", configmap["metadata"]["name"], settings.namespace)
        stored = kube.apply(configmap, before=before)
    except KubeNotFound:
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "Namespace",
                "metadata": {"name": settings.namespace, "labels": {"app.kubernetes.io/part-of": "gpucert"}},
            }
        )
        stored = kube.apply(configmap)
    orphans = orphaned_jobs(kube, settings, run_id, nodes)
    if orphans:
        get_run_logger().warning(
            "deleting %s a killed run left behind: %s", counted(len(orphans), "Job"), ", ".join(orphans)
        )
        delete_jobs(kube, settings, orphans)
    return stored


@task(name="benchmark", task_run_name="benchmark {run.run_id}", cache_policy=NO_CACHE)
async def benchmark(
    kube: Kube,
    nodes: Mapping[str, int],
    run: CertificationRun,
    payload: Mapping[str, Any],
    settings: BenchmarkSettings,
    *,
    max_parallel: int,
    shard: int | None = None,
) -> tuple[dict[str, tuple[str | None, str]], dict[str, dict[str, Any]]]:
    """Run the wave and store its results as the run's ``results.parquet`` (when any node produced some),
    or as shard ``shard``'s files for the parent run to join (``gpucert.certify.write_shard``).

    Returns node → (reason, message) for each node whose Job failed, and node → stack record.
    """
    slot = await benchmark_slot()
    wave = await run_wave(kube, nodes, run.run_id, payload, settings, max_parallel=max_parallel, slot=slot)
    frame = wave.frame()
    failed = {n: (r.reason, r.message) for n, r in wave.failed().items()}
    if shard is not None:
        write_shard(run, shard, frame, failed, wave.stacks)
    elif frame is not None:
        run.write_table(RESULTS, frame)
    get_run_logger().info(
        "%s: %s measured, %d without results%s",
        run.run_id,
        counted(len(nodes) - len(failed), "node"),
        len(failed),
        f" ({', '.join(sorted({str(r) for r, _ in failed.values()}))})" if failed else "",
    )
    return failed, wave.stacks


@task(name="verdicts", task_run_name="verdicts of {run.run_id}", cache_policy=NO_CACHE)
def make_verdicts(
    run: CertificationRun,
    failed: Mapping[str, tuple[str | None, str]],
    nodes: Sequence[str],
    policy: Policy,
    *,
    cohort: CertificationRun | None = None,
) -> RunVerdicts:
    """Judge the run's results against the current baseline (plus an inconclusive row per failed Job), store
    its ``policy.json`` (the policy and baseline version judged by) and return the verdicts. A re-run's
    verdicts are stored here; the first run's only once settled (:func:`record_settlement`).

    A confirming re-run measures a few nodes: judged alone, its peers would be just those nodes. With
    ``cohort`` (the first run) the other nodes' results of that run join as peers, and only ``nodes``
    are judged.
    """
    # One version, read by id and recorded with the policy (policy.json), so the decision can be re-judged.
    version = run.store.current_version()
    run.write_policy(policy, baseline_version=version)
    results, peers, baseline = None, None, empty_baseline()
    if len(failed) < len(nodes):
        if version is not None:
            baseline = run.store.read(version)
        results = run.results()
        release_freed_memory()  # the Parquet decoding's buffers, before the judge's own come on top
        if cohort is not None and cohort.has(RESULTS):
            peers = cohort.results()
    rerun = cohort is not None
    plan = stored_plan_of(run, policy) if not rerun and results is not None else None
    verdicts = run_verdicts(
        run.run_id, results, failed, baseline, policy, plan=plan, cohort=peers, nodes=nodes if rerun else None
    )
    if rerun:
        run.write_table(VERDICTS, verdicts)
    return RunVerdicts(run.run_id, verdicts, tuple(nodes))


@kube_task("read the fleet's taints")
def fleet_state(kube: Kube, selector: str, *, prefix: str) -> dict[str, NodeTaints]:
    """Every GPU node → gpucert's taints on it now (what the blast radius counts)."""
    return fleet_taints(kube.nodes(selector), prefix=prefix)


@task(name="settle", task_run_name="settle {run.run_id}", cache_policy=NO_CACHE)
def settle_run(
    run: CertificationRun,
    first: RunVerdicts,
    reruns: Sequence[RunVerdicts],
    fleet: Mapping[str, NodeTaints],
    rules: CertificationRules,
) -> Settlement:
    """Settle the run (:func:`gpucert.certify.settle`) on its verdicts so far; returns the settlement (its
    ``pending`` nodes need a re-run). Nothing is stored: :func:`record_settlement` does, once."""
    measured = run.results_or_none()  # what the run measured, per node and GPU: the clearing rule's input
    return settle(
        first,
        reruns,
        fleet=fleet,
        policy=rules.policy,
        observe_only=rules.observe_only,
        measured=measured if measured is not None else empty_results(),
    )


@task(name="record the decisions", task_run_name="record {settlement.run_id}", cache_policy=NO_CACHE)
def record_settlement(run: CertificationRun, first: RunVerdicts, settlement: Settlement) -> None:
    """Store what the run concluded, once: ``verdicts.parquet`` (the first run's verdicts made to agree with
    the decisions) and ``decisions.parquet``."""
    run.write_table(VERDICTS, settled_verdicts(first.verdicts, settlement))
    run.write_table(DECISIONS, settlement.frame(datetime.now(UTC)))
    log = get_run_logger()
    for node, why in sorted(settlement.unmeasured.items()):
        log.warning("%s: %s", node, why)
    if settlement.incident:
        log.error(settlement.incident)


@kube_task("act on nodes")
def act_on_nodes(kube: Kube, settlement: Settlement, *, prefix: str) -> dict[str, str]:
    """Write each node's decision (labels, annotations, taint, condition); returns node → what changed."""
    now = datetime.now(UTC)
    done: dict[str, str] = {}
    for node, decision in sorted(settlement.decisions.items()):
        try:
            change = apply_decision(kube, decision, prefix=prefix, run_id=settlement.run_id, now=now)
        except KubeNotFound:  # deleted since its benchmark: nothing to write to; the other nodes still are
            get_run_logger().warning("node %s is gone: its decision is recorded, not written to it", node)
            done[node] = "node gone: nothing written"
            continue
        words = []
        if change.labels:
            words.append(", ".join(f"{k}={v}" for k, v in change.labels.items()))
        if change.taint == "added":
            words.append(f"tainted {prefix}/unhealthy={decision.cause}:NoSchedule")
        elif change.taint == "lifted":
            words.append("gpucert taints lifted")
        if change.condition is not None:
            words.append(f"GpuCertified={change.condition}")
        if words:
            done[node] = "; ".join(words)
    return done


@task(name="keep baselines", cache_policy=NO_CACHE)
def keep_baselines(
    run: CertificationRun, stacks: Mapping[str, Mapping[str, Any]], policy: Policy
) -> tuple[str | None, list[str]]:
    """Store the run's ``stack.json`` and merge its passing results into a new baseline version; returns
    the version (None when no node produced results) and the nodes re-seeded after a driver change."""
    run.write_stack(stacks)
    results = run.results_or_none()
    if results is None:
        return None, []
    return update_baselines(run.store, results, stacks, policy, run_id=run.run_id)
