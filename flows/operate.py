"""Operate: the nightly round — watch, re-certify what is due or suspect, ticket, report.

The runbook:

1. read the passive DCGM telemetry since the last night (the ``Prometheus`` block when configured, else
   the exporters scraped directly) and judge it by the gates: a node whose telemetry fails asks to be
   re-certified; every GPU node whose telemetry could not be read is named with why, and a night that
   read none (no DCGM exporter found, every scrape failed) says so in ``telemetry_missing``;
2. look for slow drift on each GPU's own history (CUSUM): a drifting GPU asks to be re-certified too —
   neither telemetry nor drift acts alone; and report the GPU stack versions that moved outside gpucert
   since configure verified them (an operator or Helm upgrade, a hand edit);
3. choose tonight's nodes: those that asked first, then every GPU node due within the policy's rotation;
   idle nodes only; no more than the policy's ``max_nodes``; a node that asked but stayed busy for the
   policy's ``escalation.busy_nights`` nights in a row gets a ticket asking for a maintenance window;
4. certify them, with the same policy and ticketing (benchmarks, verdicts, decisions, labels, confirmed
   taints, baselines, tickets, report);
5. leave a fleet report.
"""

from datetime import UTC, datetime

from prefect import flow
from prefect.artifacts import acreate_markdown_artifact
from prefect.runtime import flow_run

from gpucert.audit import ticket_action
from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.prometheus import Prometheus
from gpucert.blocks.store import StoreLocation
from gpucert.blocks.ticketing import Ticketing
from gpucert.certify import busy_nodes
from gpucert.flows._setup import resolve
from gpucert.flows.certify import certify
from gpucert.operate import OperateOutcome, busy_overdue, due_nodes
from gpucert.tasks.stack import stack_drift
from gpucert.tasks.telemetry import drift_check, telemetry_check
from gpucert.tasks.tickets import maintenance_tickets
from gpucert.tickets import TicketEvent

__all__ = ["operate"]


def _maintenance(overdue: dict[str, str], opened: list[TicketEvent]) -> dict[str, str]:
    """Node → the ticket asking for its maintenance window (or why none was opened), for the night's report."""
    tickets = {e.ticket.node: e.ticket.id for e in opened}
    none = "no new ticket (one is open already, or no ticketing)"
    return {n: f"ticket {tickets[n]}: {why}" if n in tickets else f"{none}: {why}" for n, why in overdue.items()}


def _night() -> str:
    """``operate-YYYY-MM-DD``: the night, the run's name in the UI."""
    start = flow_run.scheduled_start_time or datetime.now(UTC)
    return f"operate-{start.astimezone(UTC):%Y-%m-%d}"


@flow(name="operate", flow_run_name=_night, log_prints=False)
async def operate(
    cluster: GpuCluster | None = None,
    store: StoreLocation | None = None,
    policy: CertificationPolicy | None = None,
    ticketing: Ticketing | None = None,
    prometheus: Prometheus | None = None,
    observe_only: bool | None = None,
    rotation_days: float | None = None,
    max_nodes: int | None = None,
    telemetry_hours: float = 24.0,
    scrape_interval_s: float = 60.0,
    pod_annotations: dict[str, str] | None = None,
    cluster_block: str | None = None,
    store_block: str | None = None,
    policy_block: str | None = None,
    ticketing_block: str | None = None,
) -> OperateOutcome:
    """One night (see the module docstring); returns what was watched, chosen and found.

    ``rotation_days`` and ``max_nodes`` override the policy's; ``prometheus`` reads the telemetry of the
    last ``telemetry_hours``; without it the exporters are scraped twice, ``scrape_interval_s`` apart.
    ``*_block`` name saved blocks to use where the block is not given (prefect.yaml names ``gpucert``'s).
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
    kube, rules, prefix = setup.kube, setup.rules, setup.cluster.label_prefix
    now = datetime.now(UTC)
    gpu_nodes = kube.nodes(setup.cluster.gpu_node_selector)
    asked, coverage = telemetry_check(
        kube,
        setup.store,
        run_id=f"telemetry-{now:%Y%m%d-%H%M%S}",
        namespace=setup.cluster.stack_namespace,
        prometheus=prometheus.source() if prometheus else None,
        since_h=telemetry_hours,
        scrape_interval_s=scrape_interval_s,
        policy=rules.policy,
        gpu_nodes=[str(n["metadata"]["name"]) for n in gpu_nodes],
    )
    drifting = drift_check(setup.store, rules.policy)
    moved = stack_drift(kube, setup.cluster.gpu_node_selector, prefix)  # versions changed outside gpucert
    for node, why in drifting.items():
        asked.setdefault(node, why)
    due = due_nodes(
        gpu_nodes,
        now=now,
        asked=asked,
        busy=busy_nodes(kube, prefix=prefix),
        rotation_days=rules.rotation_days if rotation_days is None else rotation_days,
        max_nodes=max_nodes or rules.max_nodes,
        prefix=prefix,
    )
    nights = rules.escalation.busy_nights
    overdue = busy_overdue(setup.store.objects, night=now.date(), busy_asked=due.busy_asked, nights=nights)
    maintenance = maintenance_tickets(setup.tickets, overdue, nights=nights, run_id=f"operate-{now:%Y-%m-%d}")
    setup.audit.because("operate: a node asked about stayed busy; a maintenance window is asked for")
    setup.audit.note(*(ticket_action(e) for e in maintenance))
    setup.audit.flush()
    certified = None
    if due.chosen:
        certified = await certify(
            cluster=setup.cluster,
            store=setup.store_block,
            nodes=due.chosen,
            policy=setup.policy,
            ticketing=setup.ticketing,
            pod_annotations=pod_annotations,
        )
    night = OperateOutcome(
        night=now.date(),
        due=due.chosen,
        postponed=due.postponed,
        asked=asked,
        drift=drifting,
        unreadable=coverage.unread,
        telemetry_read=coverage.read,
        telemetry_partial=coverage.partial,
        telemetry_missing=coverage.missing,
        maintenance=_maintenance(overdue, maintenance),
        stack_drift=moved,
        certify=certified,
    )
    await acreate_markdown_artifact(key="operate-night", markdown=night.markdown(), description="operate")
    return night
