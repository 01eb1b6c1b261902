"""The GPU stack a ``--preconfigured`` cluster starts with: exactly what ``gpucert configure`` would apply.

The simulator does not keep a stack of its own: it plans and renders the configure stage's templates
(:func:`gpucert.stack.plan_stack`, :func:`gpucert.stack.render_stack`, the newest release of the
compatibility matrix that fits its nodes) and seeds the objects as if gpucert had server-side applied
them (its field manager in ``managedFields``), and its nodes with the labels configure writes
(``<prefix>/stack=managed``, the driver variant, the verified versions). So configure run on a
preconfigured cluster finds nothing to change, and the simulated controllers — which key on the stack
labels of docs/reference/labels-taints-conditions.md (``app.kubernetes.io/part-of: gpucert`` and
``app.kubernetes.io/component``) — run the same DaemonSets, Service and Endpoints a configured cluster has.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpucert.stack import (
    StackRequest,
    desired_target_labels,
    desired_version_labels,
    load_matrix,
    node_info,
    plan_stack,
    render_stack,
)

__all__ = ["preconfigured_stack"]


def preconfigured_stack(
    nodes: Sequence[Mapping[str, Any]], *, namespace: str, label_prefix: str
) -> tuple[list[dict[str, Any]], dict[str, dict[str, str]]]:
    """The stack's objects for ``nodes`` (Node objects), in install order, and node → labels to add."""
    matrix = load_matrix()
    infos = [node_info(node, matrix.gpu_models) for node in nodes]
    plan = plan_stack(infos, StackRequest(), matrix, namespace=namespace, label_prefix=label_prefix)
    objects = [dict(m.obj) for m in render_stack(plan)]
    running = {node: plan.expected_versions(node) for node in plan.nodes}
    # Each of these maps every node: computed once, not once per node (quadratic at 10,000 nodes).
    targets, versions = desired_target_labels(plan), desired_version_labels(plan, running)
    labels: dict[str, dict[str, str]] = {}
    for node in plan.nodes:
        merged = {**targets[node], **versions[node]}
        labels[node] = {k: v for k, v in merged.items() if v is not None}
    return objects, labels
