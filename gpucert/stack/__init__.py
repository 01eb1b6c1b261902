"""The GPU stack configure installs: what a node is, which stack fits it, its manifests, its rollout.

Layers, each importing only those above it:

* :mod:`._model` — the shared values: :class:`NodeInfo`, :class:`StackRequest`, :class:`StackPlan`, …;
* :mod:`._matrix` — the compatibility matrix (``gpucert/data/compatibility.yaml``) and :func:`load_matrix`;
* :mod:`._plan` — :func:`plan_stack`, preflight's decision, which refuses an incompatible request with a
  :class:`~gpucert.errors.StackConflict` before anything is written;
* :mod:`._render` — :func:`render_stack` (``templates/stack``, strict and injection-proof) and
  :func:`write_manifests` for ``--dry-run``;
* :mod:`._labels`, :mod:`._inventory` — the node labels read and written; :func:`take_inventory`;
* :mod:`._rollout` — apply, label, wait per node, verify GPUs, observe versions (through :mod:`gpucert.kube`);
* :mod:`._record` — what the fleet was configured with, kept in the cluster (ConfigMap ``gpucert-stack``),
  which a configure limited to some nodes follows;
* :mod:`._drift`, :mod:`._outcome` — what is off the chosen versions; what a run did.
"""

from __future__ import annotations

from ..errors import MatrixError, StackConflict, StackNotReady
from ._drift import Drift, find_drift
from ._inventory import DEFAULT_GPU_SELECTOR, node_info, pick_targets, take_inventory
from ._labels import (
    check_label_prefix,
    dns_label_ok,
    dns_subdomain_ok,
    driver_label,
    label_value_ok,
    release_label,
    stack_label,
    version_label,
)
from ._matrix import (
    RELEASE_COMPONENTS,
    ComponentPin,
    DriverBranch,
    DriverChoice,
    KubernetesRange,
    Matrix,
    Release,
    load_matrix,
)
from ._model import COMPONENTS, DriverVariant, Manifest, NodeInfo, StackPlan, StackRequest
from ._outcome import TARGET_CHARS, ConfigureOutcome, target_name
from ._plan import NODES_SHOWN, os_tag, plan_stack
from ._record import RECORD_NAME, StackRecord, follow_record, read_record, record_departures
from ._render import StackRenderError, load_manifests, record_manifest, render_stack, write_manifests
from ._rollout import (
    Applied,
    apply_manifests,
    component_targets,
    desired_target_labels,
    desired_version_labels,
    gpu_shortfall,
    label_nodes,
    not_ready_nodes,
    observed_versions,
    prune_driver_variants,
    wait_until,
)

#: The namespace of the GPU stack unless a cluster says otherwise.
STACK_NAMESPACE = "gpucert-system"

__all__ = [
    "COMPONENTS",
    "DEFAULT_GPU_SELECTOR",
    "NODES_SHOWN",
    "RECORD_NAME",
    "RELEASE_COMPONENTS",
    "STACK_NAMESPACE",
    "TARGET_CHARS",
    "Applied",
    "ComponentPin",
    "ConfigureOutcome",
    "Drift",
    "DriverBranch",
    "DriverChoice",
    "DriverVariant",
    "KubernetesRange",
    "Manifest",
    "Matrix",
    "MatrixError",
    "NodeInfo",
    "Release",
    "StackConflict",
    "StackNotReady",
    "StackPlan",
    "StackRecord",
    "StackRenderError",
    "StackRequest",
    "apply_manifests",
    "check_label_prefix",
    "component_targets",
    "desired_target_labels",
    "desired_version_labels",
    "dns_label_ok",
    "dns_subdomain_ok",
    "driver_label",
    "find_drift",
    "follow_record",
    "gpu_shortfall",
    "label_nodes",
    "label_value_ok",
    "load_manifests",
    "load_matrix",
    "node_info",
    "not_ready_nodes",
    "observed_versions",
    "os_tag",
    "pick_targets",
    "plan_stack",
    "prune_driver_variants",
    "read_record",
    "record_departures",
    "record_manifest",
    "release_label",
    "render_stack",
    "stack_label",
    "take_inventory",
    "target_name",
    "version_label",
    "wait_until",
    "write_manifests",
]
