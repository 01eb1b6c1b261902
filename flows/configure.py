"""Configure: install the GPU stack on every GPU node, in the GPU Operator's order, from locked versions.

The runbook, top to bottom:

1. inventory the GPU nodes (model, OS, kernel, runtime, kubelet, a host driver) and choose the stack
   for each GPU model from the compatibility matrix — an incompatible request fails here, before any
   write, with every conflict named;
2. render every manifest (``--dry-run DIR`` writes them there and stops);
3. apply the namespace and RBAC, mark the target nodes for the stack;
4. driver → container toolkit → device plugin → DCGM exporter → GPU feature discovery: apply each,
   then wait until it is Ready on every node that should run it (nodes with a host driver get no driver
   pod: their version was checked in step 1; driver DaemonSets an upgrade left unused are deleted);
5. verify every node advertises its GPUs, label each with the versions running there, and list the
   nodes off the chosen versions (drift) in a table artifact and the result.

Every write is a server-side apply or a label patch made only when needed, so running it again on a
configured cluster changes nothing.
"""

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from blocks.cluster import GpuCluster
from gpucert.stack import (
    COMPONENTS,
    ConfigureOutcome,
    StackRequest,
    component_targets,
    find_drift,
    pick_targets,
    render_stack,
    write_manifests,
)
from tasks.stack import (
    apply_step,
    choose_stack,
    inventory,
    label_targets,
    prune_drivers,
    record_versions,
    verify_gpus,
    wait_for_component,
)

__all__ = ["configure"]


@flow(name="configure", log_prints=False)
def configure(
    cluster: GpuCluster | None = None,
    release: str | None = None,
    versions: dict[str, str] | None = None,
    registry: str | None = None,
    nodes: list[str] | None = None,
    dry_run_dir: str | None = None,
    gpus_per_node: int = 8,
    rollout_timeout_s: float = 900.0,
) -> dict[str, Any]:
    """Install the GPU stack on the cluster's GPU nodes (all, or ``nodes``); returns what was done.

    ``release`` and ``versions`` (component → version) pin the stack, default the newest compatible;
    ``registry`` replaces the image registry; ``gpus_per_node`` is expected where a node has no
    ``nvidia.com/gpu.count`` label; each component has ``rollout_timeout_s`` to get Ready everywhere.
    """
    log = get_run_logger()
    cluster = cluster or GpuCluster()
    kube = cluster.kube()

    fleet = inventory(kube, cluster.gpu_node_selector)
    targets = pick_targets(fleet, nodes)
    request = StackRequest(release=release, versions=versions or {}, registry=registry)
    plan = choose_stack(
        targets, request, namespace=cluster.stack_namespace, label_prefix=cluster.label_prefix
    )
    manifests = render_stack(plan)
    objects = tuple(f"{m.kind} {m.namespace + '/' if m.namespace else ''}{m.name}" for m in manifests)
    stack = ConfigureOutcome.stack_of(plan)
    log.info("release %s for %d nodes: %s", plan.release, len(plan.nodes), stack)

    if dry_run_dir is not None:
        files = write_manifests(manifests, Path(dry_run_dir))
        outcome = ConfigureOutcome(
            plan.release, plan.nodes, stack, objects, dry_run_files=tuple(map(str, files))
        )
        _publish(outcome)
        return outcome.to_dict()

    apply_step(kube, "namespace", manifests)
    apply_step(kube, "rbac", manifests)
    labelled = label_targets(kube, plan)
    labels = {info.name: info.labels for info in targets}
    for component in COMPONENTS:
        apply_step(kube, component, manifests)
        wait_for_component(kube, plan, component, labels, rollout_timeout_s)
        if component == "driver":
            prune_drivers(kube, plan)

    with_plugin = set(component_targets(plan, "device-plugin", labels))
    expected = {i.name: i.gpu_count or gpus_per_node for i in targets if i.name in with_plugin}
    gpus = verify_gpus(kube, plan, expected, rollout_timeout_s)
    observed = record_versions(kube, plan)
    drift = find_drift(plan, fleet, observed)

    outcome = ConfigureOutcome(plan.release, plan.nodes, stack, objects, tuple(labelled), gpus, tuple(drift))
    _publish(outcome)
    return outcome.to_dict()


def _publish(outcome: ConfigureOutcome) -> None:
    """The run's artifacts: a markdown summary and, when there is any, the drift table."""
    create_markdown_artifact(key="configure-summary", markdown=outcome.markdown(), description="configure")
    if outcome.drift:
        create_table_artifact(
            key="configure-drift",
            table=[d.to_dict() for d in outcome.drift],
            description="GPU nodes off the chosen stack versions",
        )
