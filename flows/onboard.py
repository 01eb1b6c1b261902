"""Onboard: a node that joined is configured and certified before it takes work.

Started by provisioning automation through the Prefect API (``create_flow_run`` on the ``onboard-node``
deployment with an idempotency key made of the node's name and UID: a caller retrying starts one run, a
node that rejoins with a new UID is onboarded again) or by the ``gpucert.node.joined`` event that
``gpucert watch-nodes`` emits. The node registered with ``gpucert.io/uncertified:NoSchedule`` (kubelet
``--register-with-taints``), so nothing lands on it meanwhile.

The runbook:

1. wait until the node is Ready (and is the node the caller meant: same UID);
2. configure the GPU stack there (the configure flow for that one node: the cluster's manifests are
   already applied, so only the node is labelled and waited for);
3. certify it against the fleet's baselines (a new GPU has no history: its peers and the spec judge it);
   a pass seeds its own baseline and lifts ``gpucert.io/uncertified``; a fail keeps the node out and is
   reported (and ticketed, where ticketing is configured).
"""

from typing import Any

from prefect import flow, get_run_logger

from blocks.cluster import GpuCluster
from blocks.store import BaselineStore
from flows.certify import certify
from flows.configure import configure
from tasks.nodes import wait_for_node

__all__ = ["idempotency_key", "onboard"]


def idempotency_key(node: str, uid: str) -> str:
    """The key a caller passes to ``create_flow_run``: one run per node incarnation."""
    return f"onboard-{node}-{uid}"


@flow(name="onboard-node", log_prints=False)
async def onboard(
    node: str,
    uid: str | None = None,
    cluster: GpuCluster | None = None,
    store: BaselineStore | None = None,
    ready_timeout_s: float = 900.0,
    pod_annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Configure and certify ``node`` (whose UID is ``uid``, when the caller knows it); returns what
    happened: the node's state, whether it was untainted, the configure and certify results."""
    log = get_run_logger()
    cluster = cluster or GpuCluster()
    kube = cluster.kube()
    wait_for_node(kube, node, uid, ready_timeout_s)
    configured = configure(cluster=cluster, nodes=[node])
    certified = await certify(
        cluster=cluster, store=store, nodes=[node], include_busy=True, pod_annotations=pod_annotations
    )
    labels = (kube.get("v1", "Node", node).get("metadata") or {}).get("labels") or {}
    state = labels.get(f"{cluster.label_prefix}/state")
    taints = [t.get("key") for t in (kube.get("v1", "Node", node).get("spec") or {}).get("taints") or []]
    admitted = state == "certified" and f"{cluster.label_prefix}/uncertified" not in taints
    log.info("%s: %s%s", node, state, " and admitted" if admitted else ", kept out")
    return {"node": node, "state": state, "admitted": admitted, "configure": configured, "certify": certified}
