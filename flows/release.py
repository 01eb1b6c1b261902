"""Release: repaired nodes go back to work only once they pass a full certification again.

The runbook (``gpucert release NODE…``, or from the UI):

1. record the repair on each open ticket of the nodes — whatever the backend (local, Jira, webhook), so
   a fault that comes back counts its resets and escalates to a replacement by the rule of
   docs/reference/causes-and-actions.md, "Escalation"; an
   ``action`` that does not fit a ticket's cause (a GPU reset on a network ticket) is refused before
   anything is recorded, naming the actions that fit (exit 2);
2. certify the nodes (busy or not) with the fleet's policy and ticketing: a pass lifts gpucert's taints
   and resolves their tickets, a fail keeps them out.
"""

from datetime import UTC, datetime

from prefect import flow
from prefect.runtime import flow_run

from gpucert.audit import ticket_action
from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.store import StoreLocation
from gpucert.blocks.ticketing import Ticketing
from gpucert.flows._setup import resolve
from gpucert.flows.certify import certify
from gpucert.operate import ReleaseOutcome
from gpucert.stack import target_name
from gpucert.tasks.tickets import record_repairs_task

__all__ = ["release"]


def _run_name() -> str:
    """``release-<nodes>``: the run's name in the UI."""
    return f"release-{target_name(flow_run.parameters.get('nodes'))}"


@flow(name="release", flow_run_name=_run_name, log_prints=False)
async def release(
    nodes: list[str],
    cluster: GpuCluster | None = None,
    store: StoreLocation | None = None,
    policy: CertificationPolicy | None = None,
    ticketing: Ticketing | None = None,
    action: str | None = None,
    note: str = "",
    cluster_block: str | None = None,
    store_block: str | None = None,
    policy_block: str | None = None,
    ticketing_block: str | None = None,
) -> ReleaseOutcome:
    """Record the repair of ``nodes`` (``action``: what was done; default: what each ticket asked for) and
    re-certify them; returns what was recorded and which nodes were released."""
    setup = resolve(
        cluster,
        store,
        policy,
        ticketing,
        cluster_block=cluster_block,
        store_block=store_block,
        policy_block=policy_block,
        ticketing_block=ticketing_block,
    )
    recorded = record_repairs_task(setup.tickets, nodes, datetime.now(UTC), action=action, note=note)
    setup.audit.because("release: repair recorded")
    setup.audit.note(*(ticket_action(e) for e in recorded))
    setup.audit.flush()
    repairs = [f"{e.ticket.id}: {e.detail}" for e in recorded]
    certified = await certify(
        cluster=setup.cluster,
        store=setup.store_block,
        nodes=nodes,
        include_busy=True,
        policy=setup.policy,
        ticketing=setup.ticketing,
    )
    released = [d.node for d in certified.decisions if d.state == "certified"]
    return ReleaseOutcome(nodes=sorted(nodes), repairs=repairs, released=sorted(released), certify=certified)
