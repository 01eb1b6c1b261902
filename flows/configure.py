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

import time
from pathlib import Path

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.runtime import flow_run
from prefect.utilities.asyncutils import run_coro_as_sync

from gpucert.audit import AuditLog, AuditRecorder
from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.store import StoreLocation
from gpucert.flows._setup import check_attempts, cluster_of, publish_audit, run_trigger, store_of
from gpucert.kube import Kube
from gpucert.stack import (
    COMPONENTS,
    GPU_OPERATOR,
    OWN,
    RECORD_NAME,
    ConfigureOutcome,
    NodeInfo,
    OperatorChange,
    StackRecord,
    StackRequest,
    StackSurvey,
    choose_installer,
    component_targets,
    configured_versions,
    find_drift,
    follow_record,
    load_matrix,
    operator_changes,
    operator_drift,
    operator_release,
    pick_targets,
    record_departures,
    render_stack,
    target_name,
    untolerated_taints,
    write_manifests,
    write_operator_changes,
)
from gpucert.tasks.stack import (
    apply_step,
    apply_to_operator,
    choose_stack,
    follow_driver_rollout,
    inventory,
    label_targets,
    operator_versions,
    prune_drivers,
    record_versions,
    recorded_stack,
    survey,
    verify_gpus,
    wait_for_component,
    wait_for_operands,
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
    store: StoreLocation | None = None,
    cluster_block: str | None = None,
    store_block: str | None = None,
    installer: str = "auto",
    certify_changed: bool = True,
) -> ConfigureOutcome:
    """Install the GPU stack on the cluster's GPU nodes (all, or ``nodes``); returns what was done.

    ``release`` and ``versions`` (component → version) pin the stack, default the newest compatible;
    ``registry`` replaces the image registry. A run for ``nodes`` takes each of the three it is not given
    from the record of the last full configure, when there is one (``reused`` in the result names them).
    ``gpus_per_node`` is expected where a node has no ``nvidia.com/gpu.count`` label; each component has
    ``rollout_timeout_s`` to get Ready everywhere. Every object applied and node labelled is recorded in
    ``store``'s audit trail (default ``$GPUCERT_STORE``, else ``./gpucert-store``) and as an Event.
    ``installer``: ``auto`` adopts the NVIDIA GPU Operator where it runs the stack and installs gpucert's own
    manifests where nothing does; ``gpucert`` or ``gpu-operator`` insist on one (refused, exit 2, where the
    other runs). Where the operator's driver changed, ``certify_changed`` certifies the nodes it changed.
    ``cluster_block`` and ``store_block`` name saved blocks to use where the block is not given (a
    deployed run needs both, or the variables: see ``flows/_setup.py``).
    """
    log = get_run_logger()
    check_attempts()
    cluster = cluster_of(cluster, cluster_block)
    # Now, not after the plan: a deployed run without a store fails before it looks at a node.
    trail = store_of(store, store_block) if dry_run_dir is None else None
    kube = cluster.kube()

    fleet = inventory(kube, cluster.gpu_node_selector)
    targets = pick_targets(fleet, nodes)
    request = StackRequest(release=release, versions=versions or {}, registry=registry)
    # Never a second stack beside another installer's: adopt the GPU Operator where it runs it.
    found = survey(kube, fleet)
    if choose_installer(found, installer) == GPU_OPERATOR:
        return _adopt(
            kube,
            cluster,
            found,
            fleet,
            targets,
            request,
            trail=trail,
            dry_run_dir=dry_run_dir,
            gpus_per_node=gpus_per_node,
            timeout_s=rollout_timeout_s,
            certify_changed=certify_changed,
        )
    recorded: StackRecord | None = None
    reused: tuple[str, ...] = ()
    if nodes and request.unset():
        recorded = recorded_stack(kube, cluster.stack_namespace)
        request, reused = follow_record(request, recorded)
        if recorded is None:
            log.info("no full configure has recorded a stack yet: the newest compatible one is chosen")
        elif reused:
            log.info("taken from the fleet's record (ConfigMap %s): %s", RECORD_NAME, ", ".join(reused))
    plan = choose_stack(targets, request, namespace=cluster.stack_namespace, label_prefix=cluster.label_prefix)
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
        installer=OWN,
        found=tuple(found.lines()),
    )

    if dry_run_dir is not None:
        files = write_manifests(manifests, Path(dry_run_dir))
        outcome = chosen.model_copy(update={"dry_run_files": tuple(map(str, files))})
        _publish(outcome)
        return outcome

    assert trail is not None  # a dry run returned above
    audit = AuditRecorder(
        AuditLog(trail.open(create=True).objects),
        run_id=flow_run.name,
        trigger=run_trigger(),
        default_why=f"configure release {plan.release}: {stack}",
    ).watch(kube)
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


def _adopt(
    kube: Kube,
    cluster: GpuCluster,
    found: StackSurvey,
    fleet: list[NodeInfo],
    targets: list[NodeInfo],
    request: StackRequest,
    *,
    trail: StoreLocation | None,
    dry_run_dir: str | None,
    gpus_per_node: int,
    timeout_s: float,
    certify_changed: bool,
) -> ConfigureOutcome:
    """The GPU Operator runs the stack: plan against its release, change it through it, follow, verify, certify.

    1. the operator's release (its Deployment or labels) is found in the compatibility matrix, and the
       nodes, the versions it runs and the ones asked for are checked against that release;
    2. what was asked and differs is written to the operator — its ClusterPolicy's component versions, or
       the NVIDIADriver of each affected node pool — by server-side apply (field manager ``gpucert``);
       never its DaemonSets (``--dry-run DIR`` writes these objects there and stops);
    3. a driver change is followed node by node through the upgrade controller's state labels to
       ``upgrade-done``; other operands until their pods run the new versions;
    4. verify as for gpucert's own stack: GPUs advertised, versions per node (labelled), drift against
       what the operator was told;
    5. the nodes whose driver changed are certified (their own baselines re-seeded by certify); one that
       fails is named with the driver change as the likeliest cause.
    """
    log = get_run_logger()
    operator = found.operator
    assert operator is not None  # choose_installer adopts only an operator with a ClusterPolicy
    release = operator_release(load_matrix(), operator.version)
    current = operator.spec_versions.get("driver") or next(iter(sorted(operator.drivers.values())), None)
    pins = {**({"driver": current} if current else {}), **request.versions}
    plan = choose_stack(
        targets,
        StackRequest(release=release.name, versions=pins, registry=request.registry),
        namespace=cluster.stack_namespace,
        label_prefix=cluster.label_prefix,
    )
    changes = operator_changes(operator, plan, request.versions, fleet)
    log.info(
        "adopting %s, planned against release %s (version from %s): %s",
        operator.describe(),
        release.name,
        operator.version_from,
        "; ".join(c.name for c in changes) or "nothing to change",
    )
    chosen = ConfigureOutcome(
        release=plan.release,
        nodes=plan.nodes,
        stack=ConfigureOutcome.stack_of(plan),
        objects=tuple(c.name for c in changes),
        pinned=dict(request.versions),
        registry=request.registry,
        installer=GPU_OPERATOR,
        found=tuple(found.lines()),
        operator_changes=tuple(
            f"{c.name}: " + ", ".join(f"{k} {a or '(unset)'} → {b}" for k, (a, b) in c.changes.items()) for c in changes
        ),
    )
    if dry_run_dir is not None:
        files = write_operator_changes(changes, Path(dry_run_dir))
        outcome = chosen.model_copy(update={"dry_run_files": tuple(map(str, files))})
        _publish(outcome)
        return outcome

    if any("driver" in c.changes for c in changes):
        for node, taints in untolerated_taints(kube.nodes(cluster.gpu_node_selector), operator.tolerations).items():
            log.warning(
                "node %s has taints the operator's DaemonSets do not tolerate (%s): its upgrade controller "
                "stops for every node until they go or spec.daemonsets.tolerations covers them",
                node,
                taints,
            )
    assert trail is not None
    audit = AuditRecorder(
        AuditLog(trail.open(create=True).objects),
        run_id=flow_run.name,
        trigger=run_trigger(),
        default_why=f"configure: adopt the GPU Operator {operator.version}",
    ).watch(kube)
    began = time.monotonic()
    try:
        apply_to_operator(kube, changes)
    finally:
        audit.flush()  # what was applied, even when an apply failed half-way
    driver_nodes = sorted({n for c in changes if "driver" in c.changes for n in c.nodes} - set(plan.host_driver))
    rollout: dict[str, str] = {}
    if driver_nodes:
        rollout = follow_driver_rollout(
            kube, driver_nodes, plan.expected_versions(driver_nodes[0])["driver"], timeout_s
        )
    configured = configured_versions(operator, plan, fleet)
    for change in changes:  # what the operator was told now, not what it ran before
        for node in change.nodes:
            configured[node].update({c: new for c, (_old, new) in change.changes.items()})
    changed_components = {c for ch in changes for c in ch.changes if c != "driver"}
    if changed_components:
        wait_for_operands(kube, {n: {c: configured[n][c] for c in changed_components} for n in plan.nodes}, timeout_s)
    rollout_s = time.monotonic() - began
    labels = {info.name: info.labels for info in targets}
    with_plugin = [
        n
        for n in plan.nodes
        if labels.get(n, {}).get("nvidia.com/gpu.deploy.device-plugin") != "false"
        and "device-plugin" not in operator.disabled
    ]
    expected = {i.name: i.gpu_count or gpus_per_node for i in targets if i.name in with_plugin}
    gpus = verify_gpus(kube, plan, expected, timeout_s)
    observed = operator_versions(kube, plan)
    drift = operator_drift(configured, observed, fleet)
    outcome = chosen.model_copy(
        update={
            "gpus_verified": gpus,
            "drift": tuple(drift),
            "rollout": rollout,
            "rollout_s": round(rollout_s, 1) if changes else 0.0,
        }
    )
    if driver_nodes and certify_changed:
        outcome = _certify_changed(cluster, trail, outcome, driver_nodes, changes)
    _publish(outcome)
    publish_audit(audit)
    return outcome


def _certify_changed(
    cluster: GpuCluster,
    store: StoreLocation,
    outcome: ConfigureOutcome,
    nodes: list[str],
    changes: list[OperatorChange],
) -> ConfigureOutcome:
    """Certify the nodes whose driver changed (the seed's configure → certify); a node that fails is
    named with the driver change as its likeliest cause."""
    from gpucert.flows.certify import certify  # configure is imported by certify's callers: no cycle at import

    log = get_run_logger()
    certified = run_coro_as_sync(certify(cluster=cluster, store=store, nodes=nodes))
    assert certified is not None
    states = {
        n: (d.state or "inconclusive")
        if (d := certified.decision(n))
        else f"not benchmarked ({certified.skipped.get(n, 'skipped')})"
        for n in nodes
    }
    driver = next(v for c in changes for k, v in c.changes.items() if k == "driver")
    suspects = tuple(
        f"{n} {state} certification after its driver changed {driver[0] or '(unset)'} → "
        f"{driver[1]}: the version change is the likeliest cause"
        for n, state in sorted(states.items())
        if state in ("failed", "degraded")
    )
    for line in suspects:
        log.error("%s", line)
    return outcome.model_copy(
        update={"certified": states, "suspects": suspects, "reseeded": tuple(sorted(certified.reseeded))}
    )


def _publish(outcome: ConfigureOutcome) -> None:
    """The run's artifacts: a markdown summary and, when there is any, the drift table."""
    create_markdown_artifact(key="configure-summary", markdown=outcome.markdown(), description="configure")
    if outcome.drift:
        create_table_artifact(
            key="configure-drift",
            table=[d.to_dict() for d in outcome.drift],
            description="GPU nodes off the chosen stack versions",
        )
