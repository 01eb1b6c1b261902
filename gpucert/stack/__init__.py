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
* :mod:`._operator` — the NVIDIA GPU Operator a cluster already runs: what installs the stack, adopting the
  operator (its release against the matrix, version changes through its ClusterPolicy or NVIDIADrivers,
  the driver rollout followed node by node);
* :mod:`._drift`, :mod:`._outcome` — what is off the chosen versions; what a run did.
"""

from __future__ import annotations

from ..errors import InstallerConflict, MatrixError, StackConflict, StackNotReady
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
from ._operator import (
    GPU_OPERATOR,
    INSTALLERS,
    OWN,
    UPGRADE_DONE,
    UPGRADE_FAILED,
    UPGRADE_STATE,
    OperatorChange,
    OperatorStack,
    StackSurvey,
    choose_installer,
    configured_versions,
    drift_since_configure,
    exporter_sources,
    normalise_version,
    operand_versions,
    operator_changes,
    operator_drift,
    operator_pods,
    operator_release,
    pending_operands,
    rollout_check,
    rollout_pending,
    stack_pods,
    survey_stack,
    untolerated_taints,
    write_operator_changes,
)
from ._outcome import TARGET_CHARS, ConfigureOutcome, target_name
from ._plan import NODES_SHOWN, os_tag, plan_stack
from ._record import RECORD_NAME, StackRecord, follow_record, read_record, record_departures
from ._render import (
    StackRenderError,
    check_output_dir,
    load_manifests,
    record_manifest,
    render_rbac,
    render_stack,
    write_manifests,
)
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
    "GPU_OPERATOR",
    "INSTALLERS",
    "NODES_SHOWN",
    "OWN",
    "RECORD_NAME",
    "RELEASE_COMPONENTS",
    "STACK_NAMESPACE",
    "TARGET_CHARS",
    "UPGRADE_DONE",
    "UPGRADE_FAILED",
    "UPGRADE_STATE",
    "Applied",
    "ComponentPin",
    "ConfigureOutcome",
    "Drift",
    "DriverBranch",
    "DriverChoice",
    "DriverVariant",
    "InstallerConflict",
    "KubernetesRange",
    "Manifest",
    "Matrix",
    "MatrixError",
    "NodeInfo",
    "OperatorChange",
    "OperatorStack",
    "Release",
    "StackConflict",
    "StackNotReady",
    "StackPlan",
    "StackRecord",
    "StackRenderError",
    "StackRequest",
    "StackSurvey",
    "apply_manifests",
    "check_label_prefix",
    "check_output_dir",
    "choose_installer",
    "component_targets",
    "configured_versions",
    "desired_target_labels",
    "desired_version_labels",
    "dns_label_ok",
    "dns_subdomain_ok",
    "drift_since_configure",
    "driver_label",
    "exporter_sources",
    "find_drift",
    "follow_record",
    "gpu_shortfall",
    "label_nodes",
    "label_value_ok",
    "load_manifests",
    "load_matrix",
    "node_info",
    "normalise_version",
    "not_ready_nodes",
    "observed_versions",
    "operand_versions",
    "operator_changes",
    "operator_drift",
    "operator_pods",
    "operator_release",
    "os_tag",
    "pending_operands",
    "pick_targets",
    "plan_stack",
    "prune_driver_variants",
    "read_record",
    "record_departures",
    "record_manifest",
    "release_label",
    "render_rbac",
    "render_stack",
    "rollout_check",
    "rollout_pending",
    "stack_label",
    "stack_pods",
    "survey_stack",
    "take_inventory",
    "target_name",
    "untolerated_taints",
    "version_label",
    "wait_until",
    "write_manifests",
    "write_operator_changes",
]
