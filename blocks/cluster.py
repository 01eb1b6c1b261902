"""The ``GpuCluster`` block: which cluster gpucert works on, how to reach it, and its conventions."""

from __future__ import annotations

from typing import Any

from prefect.blocks.core import Block
from prefect_kubernetes.credentials import KubernetesCredentials
from pydantic import ConfigDict, Field, field_validator

from gpucert._names import check_label_selector, dns_label_ok
from gpucert.blocks._schema import block_schema_extra
from gpucert.errors import InputError
from gpucert.kube import Kube, connect
from gpucert.stack import DEFAULT_GPU_SELECTOR, STACK_NAMESPACE, check_label_prefix

__all__ = ["GpuCluster"]


class GpuCluster(Block):
    """A Kubernetes cluster of GPU nodes that gpucert configures, certifies and operates.

    How to reach it, in order: ``credentials`` (prefect-kubernetes' block, holding a kubeconfig and
    its context), else the ``kubeconfig`` file, else ``$KUBECONFIG`` / ``~/.kube/config``, else the
    in-cluster service account of the worker.

    Example:
        ```python
        from gpucert.blocks.cluster import GpuCluster
        cluster = GpuCluster.load("BLOCK_NAME")
        kube = cluster.kube()
        ```
    """

    model_config = ConfigDict(json_schema_extra=block_schema_extra)

    _block_type_name = "GPU Cluster"
    _block_type_slug = "gpucert-gpu-cluster"
    _documentation_url = "https://github.com/gpucert/gpucert#readme"  # type: ignore[assignment]
    _description = "A Kubernetes GPU cluster for gpucert: how to reach it, where its GPU stack lives, its label prefix."

    credentials: KubernetesCredentials | None = Field(
        default=None,
        description="prefect-kubernetes credentials (a kubeconfig and its context); wins over `kubeconfig`.",
    )
    kubeconfig: str | None = Field(
        default=None, description="Path to a kubeconfig file, used when no credentials block is set."
    )
    context: str | None = Field(default=None, description="The kubeconfig context to use (default: its current one).")
    stack_namespace: str = Field(
        default=STACK_NAMESPACE,
        description="Namespace of the GPU stack (driver, toolkit, device plugin, DCGM exporter).",
    )
    label_prefix: str = Field(
        default="gpucert.io", description="Prefix of gpucert's node labels, annotations and taints."
    )
    gpu_node_selector: str = Field(
        default=DEFAULT_GPU_SELECTOR, description="Label selector of the cluster's GPU nodes."
    )
    storage_claim: str | None = Field(
        default=None,
        description="A PersistentVolumeClaim (in gpucert-system) on the dataset's file system: each node's "
        "sequential read throughput from it is measured (storage_read_gbps), in a folder per node.",
    )
    storage_host_path: str | None = Field(
        default=None, description="Or a host path (a node's local dataset disk) to measure storage_read_gbps on."
    )

    @field_validator("label_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        return check_label_prefix(value)

    @field_validator("gpu_node_selector")
    @classmethod
    def _selector(cls, value: str) -> str:
        try:
            return check_label_selector(value)
        except InputError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("stack_namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        if not dns_label_ok(value):
            raise ValueError(f"namespace {value!r} is not a DNS label (a-z, 0-9 and '-', at most 63)")
        return value

    def kube(self) -> Kube:
        """A client for the cluster; raises ``gpucert.errors.InputError`` when the kubeconfig is unusable."""
        if self.credentials is not None and self.credentials.cluster_config is not None:
            config = self.credentials.cluster_config
            return connect(config_dict=config.config, context=config.context_name)
        return connect(self.kubeconfig, context=self.context)

    def describe(self) -> dict[str, Any]:
        """What a person needs to know about the target (no secrets)."""
        return {
            "kubeconfig": self.kubeconfig or ("credentials block" if self.credentials else "default"),
            "context": self.context,
            "stack_namespace": self.stack_namespace,
            "label_prefix": self.label_prefix,
            "gpu_node_selector": self.gpu_node_selector,
        }
