"""Configure's tasks: each step of installing the GPU stack, with Prefect's retries and a name in the UI.

The work itself is in :mod:`gpucert.stack`; a task here adds a retry on a control plane that stayed
unavailable (:func:`tasks._retry.only_transient`), a timeout, and a visible step. Clients and plans are
passed by reference and never cached (``NO_CACHE``): a configure run must look at the cluster as it is.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from gpucert.kube import Kube
from gpucert.stack import (
    UPGRADE_FAILED,
    Applied,
    Manifest,
    NodeInfo,
    OperatorChange,
    StackPlan,
    StackRecord,
    StackRequest,
    StackSurvey,
    component_targets,
    desired_target_labels,
    desired_version_labels,
    drift_since_configure,
    gpu_shortfall,
    label_nodes,
    load_matrix,
    not_ready_nodes,
    observed_versions,
    operand_versions,
    operator_pods,
    pending_operands,
    plan_stack,
    prune_driver_variants,
    read_record,
    rollout_check,
    stack_pods,
    survey_stack,
    take_inventory,
    wait_until,
)
from gpucert.stack import apply_manifests as _apply

from ._retry import kube_task

__all__ = [
    "apply_step",
    "apply_to_operator",
    "choose_stack",
    "follow_driver_rollout",
    "inventory",
    "label_targets",
    "operator_versions",
    "prune_drivers",
    "record_versions",
    "recorded_stack",
    "stack_drift",
    "survey",
    "verify_gpus",
    "wait_for_component",
    "wait_for_operands",
]


@kube_task("inventory GPU nodes")
def inventory(kube: Kube, selector: str) -> list[NodeInfo]:
    """Every GPU node of the cluster as preflight sees it (GPU model, OS, kernel, runtime, kubelet, host driver)."""
    return take_inventory(kube, selector=selector, known_models=load_matrix().gpu_models)


@kube_task("read the recorded stack")
def recorded_stack(kube: Kube, namespace: str) -> StackRecord | None:
    """What the last full configure recorded in ``namespace`` (ConfigMap ``gpucert-stack``), None when none did.

    Raises ``InputError`` when the ConfigMap is there but is not a record this gpucert reads.
    """
    return read_record(kube, namespace)


@task(name="choose the stack", cache_policy=NO_CACHE)
def choose_stack(nodes: Sequence[NodeInfo], request: StackRequest, *, namespace: str, label_prefix: str) -> StackPlan:
    """The versions for each GPU model; raises ``StackConflict`` (naming each conflict) before any write."""
    return plan_stack(nodes, request, load_matrix(), namespace=namespace, label_prefix=label_prefix)


@kube_task("apply", "apply {step}")
def apply_step(kube: Kube, step: str, manifests: Sequence[Manifest]) -> list[Applied]:
    """Server-side apply the step's manifests (field manager ``gpucert``); returns what the server holds."""
    applied = _apply(kube, [m for m in manifests if m.step == step])
    get_run_logger().info("%s: %d objects applied", step, len(applied))
    return applied


@kube_task("label target nodes")
def label_targets(kube: Kube, plan: StackPlan) -> list[str]:
    """Mark the plan's nodes for the stack (and their driver variant); returns the nodes patched."""
    changed = label_nodes(kube, desired_target_labels(plan))
    get_run_logger().info("%d of %d target nodes labelled", len(changed), len(plan.nodes))
    return changed


@kube_task("wait for rollout", "wait for {component}")
def wait_for_component(
    kube: Kube, plan: StackPlan, component: str, labels: Mapping[str, Mapping[str, str]], timeout_s: float
) -> int:
    """Wait until ``component`` is Ready on every node that should run it; returns how many.

    Raises ``StackNotReady`` naming the nodes that were not, with why, when ``timeout_s`` runs out.
    """
    targets = component_targets(plan, component, labels)
    wait_until(
        lambda: not_ready_nodes(kube, plan, component, targets), what=component, total=len(targets), timeout_s=timeout_s
    )
    return len(targets)


@kube_task("prune old driver variants")
def prune_drivers(kube: Kube, plan: StackPlan) -> list[str]:
    """Delete driver DaemonSets no node uses any more (a driver upgrade's leftovers); returns their names."""
    pruned = prune_driver_variants(kube, plan)
    if pruned:
        get_run_logger().info("driver DaemonSets no node uses any more, deleted: %s", ", ".join(pruned))
    return pruned


@kube_task("verify GPUs advertised")
def verify_gpus(kube: Kube, plan: StackPlan, expected: Mapping[str, int], timeout_s: float) -> int:
    """Wait until every target node advertises its ``nvidia.com/gpu`` count; returns the GPUs in all.

    Raises ``StackNotReady`` naming each node short of GPUs when ``timeout_s`` runs out.
    """
    wait_until(
        lambda: gpu_shortfall(kube, expected),
        what="nvidia.com/gpu allocatable",
        total=len(expected),
        timeout_s=timeout_s,
    )
    return sum(expected.values())


@kube_task("record stack versions")
def record_versions(kube: Kube, plan: StackPlan) -> dict[str, dict[str, str]]:
    """Label each target node with the versions verified running there; returns node → component → version."""
    observed = observed_versions(kube, plan)
    label_nodes(kube, desired_version_labels(plan, observed))
    return observed


@kube_task("survey the stack's installers")
def survey(kube: Kube, fleet: Sequence[NodeInfo]) -> StackSurvey:
    """What installs the GPU stack here (the GPU Operator, gpucert, another installer, host drivers)."""
    found = survey_stack(kube, fleet)
    for line in found.lines():
        get_run_logger().info("found: %s", line)
    return found


@kube_task("apply to the GPU operator")
def apply_to_operator(kube: Kube, changes: Sequence[OperatorChange]) -> list[str]:
    """Server-side apply each change (field manager ``gpucert``) to the operator's ClusterPolicy or
    NVIDIADrivers; returns what was changed, ``Kind name: component from → to``."""
    done = []
    for change in changes:
        obj = change.obj
        before = kube.find(str(obj["apiVersion"]), str(obj["kind"]), str(obj["metadata"]["name"]))
        kube.apply(obj, before=before)
        what = ", ".join(f"{c} {old or '(unset)'} → {new}" for c, (old, new) in change.changes.items())
        done.append(f"{change.name}: {what}")
        get_run_logger().info("applied to the operator: %s", done[-1])
    return done


@kube_task("follow the driver rollout")
def follow_driver_rollout(kube: Kube, nodes: Sequence[str], driver: str, timeout_s: float) -> dict[str, str]:
    """Follow the operator's driver upgrade node by node (``nvidia.com/gpu-driver-upgrade-state`` and the
    driver pod's version) until every node in ``nodes`` runs ``driver``; logs each node's every state
    change and names a node in ``upgrade-failed`` as soon as it is seen. Returns node → final state.

    Raises ``StackNotReady`` naming each node not done (a node stuck in ``upgrade-failed`` says so).
    """
    log = get_run_logger()
    seen: dict[str, str] = {}

    def pending() -> Mapping[str, str]:
        waiting = rollout_check(kube, nodes, driver)
        for node in nodes:
            state = waiting.get(node, "done")
            if seen.get(node) != state:
                done = sum(1 for n in nodes if n not in waiting)
                log.info("driver %s rollout: %s %s (%d of %d nodes done)", driver, node, state, done, len(nodes))
                if state.startswith(f"stuck in {UPGRADE_FAILED}"):
                    log.error(
                        "node %s is in %s: the operator could not upgrade its driver to %s",
                        node,
                        UPGRADE_FAILED,
                        driver,
                    )
                seen[node] = state
        return waiting

    wait_until(pending, what=f"driver {driver} rollout", total=len(nodes), timeout_s=timeout_s)
    states = {str(n["metadata"]["name"]): (n["metadata"].get("labels") or {}) for n in kube.nodes()}
    return {n: states.get(n, {}).get("nvidia.com/gpu-driver-upgrade-state", "") for n in nodes}


@kube_task("wait for the operator's operands")
def wait_for_operands(kube: Kube, wanted: Mapping[str, Mapping[str, str]], timeout_s: float) -> float:
    """Wait until every node runs the operand versions ``wanted`` (node → component → version) in Ready
    pods; returns the seconds it took. Raises ``StackNotReady`` naming each node and operand behind."""
    began = time.monotonic()
    wait_until(
        lambda: pending_operands(operator_pods(kube), wanted),
        what="the operator's operands",
        total=len(wanted),
        timeout_s=timeout_s,
    )
    return time.monotonic() - began


@kube_task("record the operator's versions")
def operator_versions(kube: Kube, plan: StackPlan) -> dict[str, dict[str, str]]:
    """Node → component → the version the operator's Ready pods run there (host drivers: the host's), and
    each node labelled with them as configure labels its own stack's nodes (what operate compares with)."""
    observed = operand_versions(operator_pods(kube), plan.nodes)
    for node, version in plan.host_driver.items():
        observed.setdefault(node, {})["driver"] = version
    label_nodes(kube, desired_version_labels(plan, observed))
    return observed


@kube_task("stack drift since configure")
def stack_drift(kube: Kube, selector: str, prefix: str) -> dict[str, str]:
    """Node → the stack versions that moved outside gpucert since configure verified them there (an operator
    or Helm upgrade, a hand edit), ``component configured → running`` each; logged as warnings."""
    drift = drift_since_configure(kube.nodes(selector), stack_pods(kube), prefix)
    out: dict[str, str] = {}
    for d in drift:
        text = f"{d.component} {d.expected} → {d.found or 'not running'} ({d.reason})"
        out[d.node] = f"{out[d.node]}; {text}" if d.node in out else text
    for node, text in sorted(out.items()):
        get_run_logger().warning("stack drift on %s: %s", node, text)
    return out
