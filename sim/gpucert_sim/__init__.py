"""``gpucert sim``: a simulated Kubernetes cluster of GPU nodes that real clients drive over HTTP.

No real API server or GPU exists where gpucert is built and tested, yet every flow must run its real
code path (the official ``kubernetes`` client, and kubectl) against something that behaves like one.
This package is that server: one generic code path for every resource in ``RESOURCES``, watches,
patches, server-side apply, Kubernetes ``Status`` errors, and injectable API faults; and (unless
``controllers=False``) simulated kubelets, a scheduler, Job and DaemonSet controllers and the device
plugin's effect, so Jobs run and benchmark pods log what gpucert's payload would print::

    with SimCluster(nodes=16, gpus=8, model="NVIDIA H200") as sim:
        api = kubernetes.client.CoreV1Api(sim.api_client())
        sim.set_faults(ApiFaults(throttle_rate=0.2))
        sim.inject_fault(Fault("pcie_gen4", "gpu-node-00003", gpu=2))
        sim.inject({"nodes": [{"event": "not_ready", "node": "gpu-node-00004"}]})
        sim.inject({"gpu": [{"kind": "slow_uplink", "params": {"leaf_a": "leaf-00", "leaf_b": "leaf-01"}}]})
        requests.get(f"{sim.url}/dcgm/gpu-node-00003/metrics")   # DCGM exporter text, fault included

Nodes carry their zone and leaf (``topology.kubernetes.io/zone``, ``gpucert.io/leaf``; ``nodes_per_leaf``),
Indexed Jobs run as kube-controller-manager runs them, and the pods of certify's pair Job log both sides of
one two-node all-reduce, the fabric's faults included (``_benchlogs.py``).

Pods annotated ``sim.gpucert.io/training: "true"`` run a simulated training job (``_training.py``): step
times in their logs, busy GPUs with pod labels in the exporters, faults from the ``training:`` section of a
fault document, and the job's history for a Prometheus backfill (:meth:`SimCluster.training_history`).

It never imports Prefect. Why an own server and not kmock: README.md, "Architecture notes".
"""

from ._benchlogs import MANAGED_BY, rows_jsonl
from ._controllers import SimTiming
from ._dcgm import DCGM_PATH, HOST_LABELS
from ._deviceplugin import DEVICE_PLUGIN_LABELS
from ._endpoints import EXPORTER_LABELS, METRICS_PATH_ANNOTATION, OPERATOR_EXPORTER_LABELS
from ._faults import ApiFaults
from ._inject import INJECT_PATH, FaultPlan, NodeEvent, load_fault_plan, parse_fault_plan
from ._kubelet import (
    EXIT_CODE_ANNOTATION,
    IMAGE_PULL_ERROR_ANNOTATION,
    RUN_SECONDS_ANNOTATION,
    TERMINATED_REASON_ANNOTATION,
    UNPULLABLE_IMAGE,
)
from ._nodes import gpu_node
from ._resources import RESOURCES, ResourceType, by_kind, lookup
from ._server import STACK_NAMESPACE, SimCluster, kubeconfig_text, serve
from ._store import Store
from ._training import (
    INFINIBAND_PATH,
    STEP_SECONDS_ANNOTATION,
    TRAINING_ANNOTATION,
    TRAINING_FAULT_KINDS,
    TRAINING_METRICS_PATH,
    TRAINING_SECONDS_ANNOTATION,
    TRAINING_START_ANNOTATION,
    TrainingFault,
    TrainingModel,
    parse_training_fault,
)

__all__ = [
    "DCGM_PATH",
    "DEVICE_PLUGIN_LABELS",
    "EXIT_CODE_ANNOTATION",
    "EXPORTER_LABELS",
    "HOST_LABELS",
    "IMAGE_PULL_ERROR_ANNOTATION",
    "INFINIBAND_PATH",
    "INJECT_PATH",
    "MANAGED_BY",
    "METRICS_PATH_ANNOTATION",
    "OPERATOR_EXPORTER_LABELS",
    "RESOURCES",
    "RUN_SECONDS_ANNOTATION",
    "STACK_NAMESPACE",
    "STEP_SECONDS_ANNOTATION",
    "TERMINATED_REASON_ANNOTATION",
    "TRAINING_ANNOTATION",
    "TRAINING_FAULT_KINDS",
    "TRAINING_METRICS_PATH",
    "TRAINING_SECONDS_ANNOTATION",
    "TRAINING_START_ANNOTATION",
    "UNPULLABLE_IMAGE",
    "ApiFaults",
    "FaultPlan",
    "NodeEvent",
    "ResourceType",
    "SimCluster",
    "SimTiming",
    "Store",
    "TrainingFault",
    "TrainingModel",
    "by_kind",
    "gpu_node",
    "kubeconfig_text",
    "load_fault_plan",
    "lookup",
    "parse_fault_plan",
    "parse_training_fault",
    "rows_jsonl",
    "serve",
]
