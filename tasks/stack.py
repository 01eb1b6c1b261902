"""Configure's tasks: each step of installing the GPU stack, with Prefect's retries and a name in the UI.

The work itself is in :mod:`gpucert.stack`; a task here adds a retry on a control plane that stayed
unavailable (:func:`tasks._retry.only_transient`), a timeout, and a visible step. Clients and plans are
passed by reference and never cached (``NO_CACHE``): a configure run must look at the cluster as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from gpucert.kube import Kube
from gpucert.stack import (
    Applied,
    Manifest,
    NodeInfo,
    StackPlan,
    StackRecord,
    StackRequest,
    component_targets,
    desired_target_labels,
    desired_version_labels,
    gpu_shortfall,
    label_nodes,
    load_matrix,
    not_ready_nodes,
    observed_versions,
    plan_stack,
    prune_driver_variants,
    read_record,
    take_inventory,
    wait_until,
)
from gpucert.stack import apply_manifests as _apply

from ._retry import kube_task

__all__ = [
    "apply_step",
    "choose_stack",
    "inventory",
    "label_targets",
    "prune_drivers",
    "record_versions",
    "recorded_stack",
    "verify_gpus",
    "wait_for_component",
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
def choose_stack(
    nodes: Sequence[NodeInfo], request: StackRequest, *, namespace: str, label_prefix: str
) -> StackPlan:
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
        lambda: not_ready_nodes(kube, plan, component, targets),
        what=component,
        total=len(targets),
        timeout_s=timeout_s,
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
        lambda: gpu_shortfall(kube, plan, expected),
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
