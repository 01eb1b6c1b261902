"""Certify: prove each GPU node performs as it should, and tell the cluster.

The runbook, top to bottom:

1. choose the nodes (given, or every GPU node; busy ones — a workload holds a GPU — skipped unless
   told), ship the benchmark payload as a ConfigMap, clear Jobs a killed run left behind;
2. benchmark: one Job per node with all its GPUs, at most ``max_parallel`` at once (and a slot of the
   Prefect concurrency limit ``gpucert-benchmarks``), each waited for with a deadline; a Job that fails
   for a reason outside the GPU (image pull, unschedulable, OOM, deadline) makes that node inconclusive;
3. judge the results against the store's current baseline (own history, peers, spec);
4. re-run the nodes that failed without a hard hardware gate: the fail stands when 2 of 3 runs fail;
5. act: state labels and annotations on every node; the ``unhealthy`` taint on confirmed fails — none
   at all when more nodes would be tainted than the blast-radius guard allows (one incident instead), and
   none under an observe-only policy; gpucert's taints lifted from nodes that now pass;
6. keep: the run's passing results merged into a new baseline version (own baselines seeded then held,
   re-seeded after a driver change; the model reference rebuilt), the run's files in the store, a
   verdict table, a markdown summary and a link to the HTML report as artifacts.
"""

import json
import secrets
from datetime import UTC, datetime
from typing import Any

from prefect import flow, get_run_logger

from blocks.cluster import GpuCluster
from blocks.store import BaselineStore as StoreBlock
from blocks.ticketing import Ticketing
from gpucert.certify import BenchmarkSettings, NodeDecision, blast_radius_limit, fail_stands, tally
from gpucert.policy import load_policy
from tasks.certify import act_on_nodes, benchmark, judge_wave, keep_baselines, prepare, select_nodes
from tasks.report import publish_report
from tasks.tickets import ticket_run

__all__ = ["certify", "new_run_id"]

#: How many confirming re-runs a fail may get (REFERENCE §4.6: 2 of 3 runs decide).
MAX_RERUNS = 2


def new_run_id(now: datetime | None = None) -> str:
    """A run id (a DNS label): ``cert-YYYYMMDD-HHMMSS-<6 hex>``."""
    moment = now or datetime.now(UTC)
    return f"cert-{moment:%Y%m%d-%H%M%S}-{secrets.token_hex(3)}"


@flow(name="certify", log_prints=False)
async def certify(
    cluster: GpuCluster | None = None,
    store: StoreBlock | None = None,
    nodes: list[str] | None = None,
    include_busy: bool = False,
    run_id: str | None = None,
    image: str | None = None,
    policy_file: str | None = None,
    observe_only: bool | None = None,
    max_parallel: int = 16,
    repeats: int = 3,
    deadline_s: int = 3600,
    pod_annotations: dict[str, str] | None = None,
    ticketing: Ticketing | None = None,
) -> dict[str, Any]:
    """Benchmark, judge and mark the cluster's GPU nodes (all, or ``nodes``); returns what was found/done.

    ``store`` defaults to ``$GPUCERT_STORE`` (else ``./gpucert-store``); ``observe_only`` overrides the
    policy's; ``pod_annotations`` go on every benchmark pod (the simulator reads ``sim.gpucert.io/…``);
    ``ticketing`` defaults to local tickets in a ``file://`` store's folder (none for an S3 store).
    """
    log = get_run_logger()
    cluster = cluster or GpuCluster()
    kube = cluster.kube()
    baseline_store = (store or StoreBlock.default()).open()
    policy = load_policy(policy_file)
    observe = policy.observe_only if observe_only is None else observe_only
    run_id = run_id or new_run_id()
    day = datetime.now(UTC)
    prefix = cluster.label_prefix
    settings_args: dict[str, Any] = {"label_prefix": prefix, "repeats": repeats, "deadline_s": deadline_s,
                                     "pod_annotations": pod_annotations or {}}  # fmt: skip
    if image:
        settings_args["image"] = image
    settings = BenchmarkSettings(**settings_args)

    # 1-2. choose, ship, benchmark
    gpus, skipped = select_nodes(
        kube, cluster.gpu_node_selector, nodes, include_busy=include_busy, prefix=prefix
    )
    payload = prepare(kube, settings, run_id, list(gpus))
    key, failed, stacks = await benchmark(
        kube, gpus, run_id, payload, settings, baseline_store, max_parallel=max_parallel, day=day
    )
    # 3. judge
    decisions = judge_wave(baseline_store, run_id, day, failed, list(gpus), policy)
    history: dict[str, list[NodeDecision]] = {n: [d] for n, d in decisions.items()}

    # 4. confirm fails that are not hard hardware gates
    for rerun in range(1, MAX_RERUNS + 1):
        pending = {
            n: gpus[n]
            for n, runs in history.items()
            if runs[0].needs_confirmation and fail_stands(runs) is None
        }
        if not pending:
            break
        confirm_id = f"{run_id[: 63 - 3]}-c{rerun}"
        log.info("re-running %d failed nodes to confirm (%s)", len(pending), confirm_id)
        _, confirm_failed, _ = await benchmark(
            kube, pending, confirm_id, payload, settings, baseline_store, max_parallel=max_parallel, day=day
        )
        # Judged among this run's other nodes: a re-run of a few nodes alone would be its own peer group.
        rejudged = judge_wave(
            baseline_store,
            confirm_id,
            day,
            confirm_failed,
            list(pending),
            policy,
            cohort_run=run_id if key else None,
        )
        for node, decision in rejudged.items():
            history[node].append(decision)

    confirmed = {n for n, runs in history.items() if runs[0].state == "failed"
                 and (runs[0].hard_gate or fail_stands(runs) is True)}  # fmt: skip
    final = {n: _final(runs) for n, runs in history.items()}

    # 5. act, within the blast radius: it counts the taints this run would add, not those already there
    gpu_nodes = kube.nodes(cluster.gpu_node_selector)
    unhealthy = f"{prefix}/unhealthy"
    already = {n["metadata"]["name"] for n in gpu_nodes
               if any(t.get("key") == unhealthy for t in (n.get("spec") or {}).get("taints") or ())}  # fmt: skip
    new_taints = confirmed - already
    limit = blast_radius_limit(
        len(gpu_nodes), min_nodes=policy.blast_radius.min_nodes, fraction=policy.blast_radius.fraction
    )
    incident = None
    may_taint = confirmed
    if len(new_taints) > limit:
        incident = (
            f"{len(new_taints)} nodes newly failed, more than the blast radius allows ({limit} of {len(gpu_nodes)}): "
            "the baseline, the benchmark or the stack is the likelier culprit; nothing was tainted"
        )
        log.error(incident)
        may_taint = confirmed & already  # taints already there stay; none is added
    actions = act_on_nodes(kube, final, may_taint, prefix=prefix, run_id=run_id, observe_only=observe)

    # 6. keep
    baseline_version: str | None = None
    reseeded: list[str] = []
    if key is not None:
        baseline_version, reseeded = keep_baselines(baseline_store, run_id, day, stacks, policy)
    baseline_store.write_run_file(
        run_id, day.date(), "stack.json", json.dumps(stacks, indent=2, sort_keys=True).encode()
    )
    report = publish_report(baseline_store, run_id, day, actions=actions, incident=incident)
    unconfirmed = sorted(n for n, runs in history.items() if runs[0].state == "failed" and n not in confirmed)
    tickets: list[dict[str, Any]] = []
    if ticketing is None and baseline_store.uri.startswith("file://"):
        # The embedded default: tickets.sqlite in the store's folder.
        ticketing = Ticketing(backend="local", path=baseline_store.uri)
    if ticketing is not None and not incident:
        backend = ticketing.open()
        tickets = ticket_run(
            backend, baseline_store, run_id, day, unconfirmed=unconfirmed, report=report, stacks=stacks
        )
    outcome = {
        "run_id": run_id,
        "nodes": sorted(gpus),
        "skipped": skipped,
        "states": tally(final),
        "tainted": sorted(n for n, a in actions.items() if "tainted" in a),
        "unconfirmed": unconfirmed,
        "tickets": tickets,
        "inconclusive": {n: f"{r}: {m}" for n, (r, m) in sorted(failed.items())},
        "actions": actions,
        "incident": incident,
        "observe_only": observe,
        "baseline_version": baseline_version,
        "reseeded": reseeded,
        "report": report,
    }
    return outcome


def _final(runs: list[NodeDecision]) -> NodeDecision:
    """The decision a node's runs add up to: the first run's, unless re-runs overturned its fail."""
    first = runs[0]
    if first.state != "failed" or first.hard_gate or len(runs) == 1:
        return first
    if fail_stands(runs) is True:
        return first
    # Not confirmed: never taint on a guess. Degraded says "look at me" without taking the node away.
    return NodeDecision(first.node, "degraded", None, False, f"{first.summary} (not confirmed by a re-run)")
