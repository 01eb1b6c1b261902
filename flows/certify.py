"""Certify: prove each GPU node performs as it should, and tell the cluster.

The runbook, top to bottom:

1. **choose** the nodes (given, or every GPU node; busy ones — a workload holds a GPU — skipped unless
   told) and **ship** the benchmark payload as a ConfigMap, clearing Jobs a killed run left behind;
2. **benchmark**: one Job per node with all its GPUs, at most ``max_parallel`` at once (and a slot of the
   Prefect concurrency limit ``gpucert-benchmarks``); a Job that fails for a reason outside the GPU (image
   pull, unschedulable, OOM, deadline) makes that node inconclusive. More nodes than the policy's
   ``shard_size``: the benchmarks run as ``certify-shard`` flow runs on the pool's workers (``max_parallel``
   each), joined before judging (``tasks/shards.py``);
3. **links** (the policy's ``network.pairs``, on by default): the measured nodes in two-node all-reduce
   pairs, round by round, chosen by their leaf and zone labels, then re-paired where nothing explains a
   low pair yet (``tasks/links.py``);
4. **verdicts**: the results judged against the store's current baseline (own history, peers, spec), the
   pairs by the run's pairing plan;
5. **confirm**: re-run the nodes whose fail no hard gate backs, judged among this run's other nodes;
6. **settle**: one decision per node — the fail stands when 2 of 3 runs fail; taints added, kept, lifted
   or refused by the blast radius (gpucert's taints in force, all runs together); observe-only taints
   nothing — stored once, with the verdicts made to agree: ``decisions.parquet``, ``verdicts.parquet``;
7. **act**: state labels, annotations, the ``GpuCertified`` condition and the taint, from the decision;
8. **keep**: the run's passing results merged into a new baseline version, ``stack.json`` stored;
9. **report**: ``report.html``, the verdict and decision tables, a summary and a link, as artifacts;
10. **ticket**: one ticket per fault, opened, updated, escalated or resolved — resolved only when the run
   measured what the fault was found on, else kept open and said so (recorded in the store when no
   ticketing is configured, and opened by the next run that has it); a run past the blast radius opens one
   incident ticket naming every node held back instead, audits it and emits ``gpucert.incident.opened``
   (the command exits 5).
"""

from datetime import UTC, date, datetime
from typing import Any

from prefect import flow
from prefect.events import emit_event

from gpucert._crashpoints import crashpoint
from gpucert._memory import release_freed_memory
from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.store import StoreLocation
from gpucert.blocks.ticketing import Ticketing
from gpucert.certify import (
    CertificationRun,
    CertifyOutcome,
    TicketChange,
    incident_summary,
    plan_shards,
    stored_plan_of,
    ticket_audit,
)
from gpucert.flows._setup import Setup, apublish_audit, benchmark_settings, certify_run_id, resolve
from gpucert.tasks.certify import (
    act_on_nodes,
    benchmark,
    fleet_state,
    keep_baselines,
    make_verdicts,
    prepare,
    record_settlement,
    select_nodes,
    settle_run,
)
from gpucert.tasks.links import measure_links
from gpucert.tasks.report import publish_report
from gpucert.tasks.shards import run_shards
from gpucert.tasks.tickets import ticket_run

__all__ = ["certify", "certify_shard"]


@flow(name="certify", flow_run_name=certify_run_id, log_prints=False)
async def certify(
    cluster: GpuCluster | None = None,
    store: StoreLocation | None = None,
    nodes: list[str] | None = None,
    include_busy: bool = False,
    run_id: str | None = None,
    image: str | None = None,
    policy: CertificationPolicy | None = None,
    ticketing: Ticketing | None = None,
    observe_only: bool | None = None,
    max_parallel: int = 16,
    deadline_s: int = 3600,
    pod_annotations: dict[str, str] | None = None,
    payload_args: list[str] | None = None,
    cluster_block: str | None = None,
    store_block: str | None = None,
    policy_block: str | None = None,
    ticketing_block: str | None = None,
) -> CertifyOutcome:
    """Benchmark, judge and mark the cluster's GPU nodes (all, or ``nodes``); returns the settled outcome.

    ``store`` defaults to ``$GPUCERT_STORE`` (else ``./gpucert-store``); ``observe_only`` overrides the
    policy's; ``pod_annotations`` go on every benchmark pod (the simulator reads ``sim.gpucert.io/…``);
    ``payload_args`` are extra options of the benchmark payload; tickets go to ``ticketing``, else the
    policy's, else local tickets in a ``file://`` store (recorded only, for an S3 store). ``*_block`` name
    saved blocks to use where the block is not given (prefect.yaml's deployment names ``gpucert``'s).
    """
    setup = resolve(
        cluster,
        store,
        policy,
        ticketing,
        observe_only=observe_only,
        cluster_block=cluster_block,
        store_block=store_block,
        policy_block=policy_block,
        ticketing_block=ticketing_block,
    )
    kube, prefix, rules = setup.kube, setup.cluster.label_prefix, setup.rules
    run = CertificationRun(setup.store, run_id or certify_run_id(), datetime.now(UTC).date())
    audit = setup.audit
    audit.run_id = run.run_id
    audit.because(f"certify {run.run_id}: benchmark")
    settings = benchmark_settings(
        setup, image=image, deadline_s=deadline_s, pod_annotations=pod_annotations, payload_args=payload_args
    )

    gpus, skipped = select_nodes(kube, setup.cluster.gpu_node_selector, nodes, include_busy=include_busy, prefix=prefix)
    payload = prepare(kube, settings, run.run_id, list(gpus))
    shards = plan_shards(gpus, setup.policy.shard_size)
    if len(shards) == 1:
        failed, stacks = await benchmark(kube, gpus, run, payload, settings, max_parallel=max_parallel)
    else:
        shard: dict[str, Any] = {
            "cluster": cluster,
            "store": store,
            "policy": policy,
            "image": image,
            "max_parallel": max_parallel,
            "deadline_s": deadline_s,
            "pod_annotations": pod_annotations,
            "payload_args": payload_args,
            "cluster_block": cluster_block,
            "store_block": store_block,
            "policy_block": policy_block,
        }
        failed, stacks = await _benchmark_in_shards(run, shards, setup, shard)
    measured = {node: count for node, count in gpus.items() if node not in failed}
    links = await measure_links(
        kube, run, setup.cluster.gpu_node_selector, measured, payload, settings, rules.policy, max_parallel=max_parallel
    )
    audit.flush()  # the Jobs created and deleted
    release_freed_memory()  # what the waves parsed, before the whole fleet is judged at once
    first = make_verdicts(run, failed, list(gpus), rules.policy)

    fleet = fleet_state(kube, setup.cluster.gpu_node_selector, prefix=prefix)
    settlement = settle_run(run, first, [], fleet, rules)
    reruns = []
    for attempt in range(1, rules.max_reruns + 1):
        if not settlement.pending:
            break
        rerun, pending = run.rerun(attempt), {n: gpus[n] for n in settlement.pending}
        rerun_failed, _ = await benchmark(kube, pending, rerun, payload, settings, max_parallel=max_parallel)
        reruns.append(make_verdicts(rerun, rerun_failed, list(pending), rules.policy, cohort=run))
        settlement = settle_run(run, first, reruns, fleet, rules)
    record_settlement(run, first, settlement)
    crashpoint("settled")

    audit.flush()
    audit.because(f"certify {run.run_id}: decision", per_object=settlement.reasons())
    actions = act_on_nodes(kube, settlement, prefix=prefix)
    audit.flush()
    audit.because(f"certify {run.run_id}: passing results merged")
    release_freed_memory()  # the verdicts' and the settling's, before the merge takes the medians again
    version, reseeded = keep_baselines(run, stacks, rules.policy)
    audit.flush()
    release_freed_memory()  # the merge's, before the report draws the fleet
    tickets = ticket_run(setup.tickets, run, rules.escalation, incident=settlement.incident)
    # After the tickets: the report says what the run did, tickets included (they link to its known key).
    report, link = publish_report(run, settlement, actions, links=stored_plan_of(run, rules.policy), tickets=tickets)
    incident = incident_summary(run, settlement.incident, tickets) if settlement.incident else None
    audit.note(*ticket_audit(tickets, incident))
    if incident is not None:
        _page(incident)
    await apublish_audit(audit)
    return CertifyOutcome.of(
        settlement,
        day=run.day,
        store=setup.store.uri,
        nodes=sorted(gpus),
        skipped=skipped,
        reruns=[r.run_id for r in reruns],
        inconclusive={n: f"{r}: {m}" for n, (r, m) in sorted(failed.items())},
        observe_only=rules.observe_only,
        baseline_version=version,
        reseeded=reseeded,
        report=report,
        links=links.lines(),
        report_link=link,
        ticketing=setup.ticketing_name,
        actions=actions,
        tickets=[TicketChange.of(e) for e in tickets.events],
        tickets_recorded=tickets.recorded,
        incident_ticket=incident["ticket"] if incident else None,
        audited=len(audit.entries),
        audit_seconds=round(audit.seconds, 3),
    )


def _page(incident: dict[str, Any]) -> None:
    """Emit ``gpucert.incident.opened``: the event an automation pages on (its payload names the run, the
    ticket, every node held back and its findings, hard gates first)."""
    emit_event(
        event="gpucert.incident.opened",
        resource={
            "prefect.resource.id": f"gpucert.incident.{incident['run_id']}",
            "prefect.resource.name": f"blast-radius incident of {incident['run_id']}",
        },
        related=[
            {"prefect.resource.id": f"gpucert.node.{n}", "prefect.resource.role": "node"}
            for n in incident["nodes"][:50]
        ],
        payload=incident,
    )


async def _benchmark_in_shards(
    run: CertificationRun, shards: list[dict[str, int]], setup: Setup, given: dict[str, Any]
) -> tuple[dict[str, tuple[str | None, str]], dict[str, dict[str, Any]]]:
    """The benchmark step of a run larger than one shard: ``certify-shard`` flow runs on the pool's workers
    (the blocks ``given`` to certify go by reference), else here as sub-flows with the resolved ones."""
    common = {**given, "run_id": run.run_id, "day": run.day.isoformat()}

    def here(index: int, nodes: dict[str, int]) -> Any:
        resolved = {
            "cluster": setup.cluster,
            "store": setup.store_block,
            "policy": setup.policy,
            "cluster_block": None,
            "store_block": None,
            "policy_block": None,
        }
        return certify_shard(**{**common, **resolved}, index=index, nodes=nodes)

    parts = await run_shards(run, shards, common, local=here, wait_s=2 * given["deadline_s"] + 600)
    return parts.failed, parts.stacks


@flow(name="certify-shard", flow_run_name="{run_id}-shard-{index}", log_prints=False)
async def certify_shard(
    run_id: str,
    day: str,
    index: int,
    nodes: dict[str, int],
    cluster: GpuCluster | None = None,
    store: StoreLocation | None = None,
    policy: CertificationPolicy | None = None,
    image: str | None = None,
    max_parallel: int = 16,
    deadline_s: int = 3600,
    pod_annotations: dict[str, str] | None = None,
    payload_args: list[str] | None = None,
    cluster_block: str | None = None,
    store_block: str | None = None,
    policy_block: str | None = None,
) -> dict[str, int]:
    """Benchmark shard ``index`` of certify run ``run_id`` (started on ``day``, ISO): ``nodes`` (node → GPUs),
    under the run's id, so a shard started again adopts its Jobs; its results, failed Jobs and stacks go to
    the run's folder for the parent to join. Returns how many nodes it measured and how many Jobs failed."""
    setup = resolve(
        cluster, store, policy, None, cluster_block=cluster_block, store_block=store_block, policy_block=policy_block
    )
    run = CertificationRun(setup.store, run_id, date.fromisoformat(day))
    setup.audit.run_id = run_id
    setup.audit.because(f"certify {run_id}: benchmark, shard {index}")
    settings = benchmark_settings(
        setup, image=image, deadline_s=deadline_s, pod_annotations=pod_annotations, payload_args=payload_args
    )
    payload = prepare(setup.kube, settings, run_id, list(nodes))
    failed, _ = await benchmark(setup.kube, nodes, run, payload, settings, max_parallel=max_parallel, shard=index)
    await apublish_audit(setup.audit)
    return {"nodes": len(nodes), "failed": len(failed)}
