"""Configure: install the GPU stack on every GPU node, in the GPU Operator's order, from locked versions.

The runbook, top to bottom:

1. inventory the GPU nodes (model, OS, kernel, runtime, kubelet, a host driver);
2. a run for some nodes only (onboarding one that joined) takes the release, pinned versions and registry
   it was not given from what the last full configure recorded in the cluster (ConfigMap ``gpucert-stack``):
   the stack's DaemonSets serve every node, so rendering them otherwise would roll the whole fleet;
3. choose the stack for each GPU model from the compatibility matrix — an incompatible request fails
   here, before any write, with every conflict named;
4. render every manifest, and for a full run the record of what it applies (``--dry-run DIR`` writes them
   there and stops);
5. apply the namespace (and the record) and RBAC, mark the target nodes for the stack;
6. driver → container toolkit → device plugin → DCGM exporter → GPU feature discovery: apply each,
   then wait until it is Ready on every node that should run it (nodes with a host driver get no driver
   pod: their version was checked in step 3; driver DaemonSets an upgrade left unused are deleted);
7. verify every node advertises its GPUs, label each with the versions running there, and list the
   nodes off the chosen versions (drift) in a table artifact and the result.

Every write is a server-side apply or a label patch made only when needed, so running it again on a
configured cluster changes nothing.
"""

from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run

from blocks.cluster import GpuCluster
from blocks.store import BaselineStore
from flows._setup import check_attempts, publish_audit, run_trigger
from gpucert.audit import AuditLog, AuditRecorder
from gpucert.stack import (
    COMPONENTS,
    RECORD_NAME,
    ConfigureOutcome,
    StackRecord,
    StackRequest,
    component_targets,
    find_drift,
    follow_record,
    pick_targets,
    record_departures,
    render_stack,
    target_name,
    write_manifests,
)
from tasks.stack import (
    apply_step,
    choose_stack,
    inventory,
    label_targets,
    prune_drivers,
    record_versions,
    recorded_stack,
    verify_gpus,
    wait_for_component,
)

__all__ = ["configure"]


def _run_name() -> str:
    """``configure-all``, or ``configure-`` and the nodes asked for (shortened): the run's name in the UI."""
    return f"configure-{target_name(flow_run.parameters.get('nodes'))}"


@flow(name="configure", flow_run_name=_run_name, log_prints=False)
def configure(
    cluster: GpuCluster | None = None,
    release: str | None = None,
    versions: dict[str, str] | None = None,
    registry: str | None = None,
    nodes: list[str] | None = None,
    dry_run_dir: str | None = None,
    gpus_per_node: int = 8,
    rollout_timeout_s: float = 900.0,
    store: BaselineStore | None = None,
) -> ConfigureOutcome:
    """Install the GPU stack on the cluster's GPU nodes (all, or ``nodes``); returns what was done.

    ``release`` and ``versions`` (component → version) pin the stack, default the newest compatible;
    ``registry`` replaces the image registry. A run for ``nodes`` takes each of the three it is not given
    from the record of the last full configure, when there is one (``reused`` in the result names them).
    ``gpus_per_node`` is expected where a node has no ``nvidia.com/gpu.count`` label; each component has
    ``rollout_timeout_s`` to get Ready everywhere. Every object applied and node labelled is recorded in
    ``store``'s audit trail (default ``$GPUCERT_STORE``, else ``./gpucert-store``) and as an Event.
    """
    log = get_run_logger()
    check_attempts()
    cluster = cluster or GpuCluster()
    kube = cluster.kube()

    fleet = inventory(kube, cluster.gpu_node_selector)
    targets = pick_targets(fleet, nodes)
    request = StackRequest(release=release, versions=versions or {}, registry=registry)
    recorded: StackRecord | None = None
    reused: tuple[str, ...] = ()
    if nodes and request.unset():
        recorded = recorded_stack(kube, cluster.stack_namespace)
        request, reused = follow_record(request, recorded)
        if recorded is None:
            log.info("no full configure has recorded a stack yet: the newest compatible one is chosen")
        elif reused:
            log.info("taken from the fleet's record (ConfigMap %s): %s", RECORD_NAME, ", ".join(reused))
    plan = choose_stack(
        targets, request, namespace=cluster.stack_namespace, label_prefix=cluster.label_prefix
    )
    for change in record_departures(recorded, plan):
        log.warning("the DaemonSets of every node change, not only of the nodes asked for: %s", change)
    # Only a full run says what the whole fleet is configured with.
    manifests = render_stack(plan, record=not nodes)
    objects = tuple(f"{m.kind} {m.namespace + '/' if m.namespace else ''}{m.name}" for m in manifests)
    stack = ConfigureOutcome.stack_of(plan)
    log.info("release %s for %d nodes: %s", plan.release, len(plan.nodes), stack)
    chosen = ConfigureOutcome(
        release=plan.release,
        nodes=plan.nodes,
        stack=stack,
        objects=objects,
        pinned=dict(request.versions),
        registry=request.registry,
        reused=reused,
    )

    if dry_run_dir is not None:
        files = write_manifests(manifests, Path(dry_run_dir))
        outcome = chosen.model_copy(update={"dry_run_files": tuple(map(str, files))})
        _publish(outcome)
        return outcome

    audit = AuditRecorder(AuditLog((store or BaselineStore.default()).open(create=True).objects),
                          run_id=flow_run.name, trigger=run_trigger(),
                          default_why=f"configure release {plan.release}: {stack}").watch(kube)  # fmt: skip
    try:
        apply_step(kube, "namespace", manifests)
        apply_step(kube, "rbac", manifests)
        labelled = label_targets(kube, plan)
        labels = {info.name: info.labels for info in targets}
        for component in COMPONENTS:
            apply_step(kube, component, manifests)
            audit.flush()
            wait_for_component(kube, plan, component, labels, rollout_timeout_s)
            if component == "driver":
                prune_drivers(kube, plan)
    finally:
        audit.flush()  # what was applied, even when a component did not get Ready

    with_plugin = set(component_targets(plan, "device-plugin", labels))
    expected = {i.name: i.gpu_count or gpus_per_node for i in targets if i.name in with_plugin}
    gpus = verify_gpus(kube, plan, expected, rollout_timeout_s)
    observed = record_versions(kube, plan)
    drift = find_drift(plan, fleet, observed)

    outcome = chosen.model_copy(
        update={"labelled_nodes": tuple(labelled), "gpus_verified": gpus, "drift": tuple(drift)}
    )
    _publish(outcome)
    publish_audit(audit)
    return outcome


def _publish(outcome: ConfigureOutcome) -> None:
    """The run's artifacts: a markdown summary and, when there is any, the drift table."""
    create_markdown_artifact(key="configure-summary", markdown=outcome.markdown(), description="configure")
    if outcome.drift:
        create_table_artifact(
            key="configure-drift",
            table=[d.to_dict() for d in outcome.drift],
            description="GPU nodes off the chosen stack versions",
        )
