"""Onboard: a node that joined is configured and certified before it takes work.

Started by provisioning automation through the Prefect API (``create_flow_run`` on the ``onboard-node``
deployment with an idempotency key made of the node's name and UID: a caller retrying starts one run, a
node that rejoins with a new UID is onboarded again) or by the ``gpucert.node.joined`` event that
``gpucert watch-nodes`` emits. The node registered with ``gpucert.io/uncertified:NoSchedule`` (kubelet
``--register-with-taints``), so nothing lands on it meanwhile.

The runbook:

1. wait until the node is Ready (and is the node the caller meant: same UID);
2. configure the GPU stack there (the configure flow for that one node, with the release, pins and
   registry the fleet was configured with: only the node is labelled and waited for);
3. certify it against the fleet's baselines with the fleet's policy and ticketing (a new GPU has no
   history: its peers and the spec judge it); a pass seeds its own baseline and lifts
   ``gpucert.io/uncertified``; a fail keeps the node out and is ticketed.
"""

from prefect import flow
from prefect.runtime import flow_run

from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.store import StoreLocation
from gpucert.blocks.ticketing import Ticketing
from gpucert.flows._setup import resolve
from gpucert.flows.certify import certify
from gpucert.flows.configure import configure
from gpucert.operate import OnboardOutcome
from gpucert.tasks.nodes import admitted, wait_for_node

__all__ = ["idempotency_key", "onboard"]


def idempotency_key(node: str, uid: str) -> str:
    """The key a caller passes to ``create_flow_run``: one run per node incarnation."""
    return f"onboard-{node}-{uid}"


def _run_name() -> str:
    """``onboard-<node>``: the run's name in the UI."""
    return f"onboard-{flow_run.parameters.get('node')}"


@flow(name="onboard-node", flow_run_name=_run_name, log_prints=False)
async def onboard(
    node: str,
    uid: str | None = None,
    cluster: GpuCluster | None = None,
    store: StoreLocation | None = None,
    policy: CertificationPolicy | None = None,
    ticketing: Ticketing | None = None,
    ready_timeout_s: float = 900.0,
    pod_annotations: dict[str, str] | None = None,
    cluster_block: str | None = None,
    store_block: str | None = None,
    policy_block: str | None = None,
    ticketing_block: str | None = None,
) -> OnboardOutcome:
    """Configure and certify ``node`` (whose UID is ``uid``, when the caller knows it); returns its state,
    whether it was admitted, and the configure and certify outcomes. ``*_block`` name saved blocks to use
    where the block is not given: the deployment names ``gpucert``'s, so the ``gpucert.node.joined``
    automation, which passes only the node and its UID, onboards with the team's cluster, store, policy
    and ticketing."""
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
    seen_uid = wait_for_node(setup.kube, node, uid, ready_timeout_s)
    # The same store as the certify: configure's audit trail belongs with the rest of the node's record.
    configured = configure(cluster=setup.cluster, nodes=[node], store=setup.store_block)
    certified = await certify(
        cluster=setup.cluster,
        store=setup.store_block,
        nodes=[node],
        include_busy=True,
        policy=setup.policy,
        ticketing=setup.ticketing,
        pod_annotations=pod_annotations,
    )
    decision = certified.decision(node)
    state = decision.state if decision else None
    return OnboardOutcome(
        node=node,
        uid=seen_uid,
        state=state,
        configure=configured,
        certify=certified,
        admitted=admitted(setup.kube, node, prefix=setup.cluster.label_prefix),
    )
