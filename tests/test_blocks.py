"""The Prefect blocks: Prefect's standard block checks, and each block reaching what it describes."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from prefect_kubernetes.credentials import KubernetesClusterConfig, KubernetesCredentials
from pydantic import ValidationError

from blocks.cluster import GpuCluster
from gpucert.errors import InputError
from gpucert.sim import SimCluster


class TestGpuClusterStandard(BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return GpuCluster


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=2, controllers=False) as cluster:
        yield cluster


def test_gpu_cluster_reaches_the_cluster_through_a_kubeconfig_file(sim: SimCluster) -> None:
    kube = GpuCluster(kubeconfig=str(sim.kubeconfig_path)).kube()
    assert len(kube.nodes("nvidia.com/gpu.present=true")) == 2


def test_gpu_cluster_reaches_the_cluster_through_prefect_kubernetes_credentials(sim: SimCluster) -> None:
    config = KubernetesClusterConfig.from_file(sim.kubeconfig_path)
    cluster = GpuCluster(credentials=KubernetesCredentials(cluster_config=config), kubeconfig="/nonexistent")
    assert len(cluster.kube().nodes()) == 2  # the credentials win over the kubeconfig path


def test_gpu_cluster_refuses_a_bad_label_prefix_and_names_a_missing_kubeconfig() -> None:
    with pytest.raises(ValidationError, match="label prefix"):
        GpuCluster(label_prefix="Not A Prefix/")
    with pytest.raises(InputError, match="no such file"):
        GpuCluster(kubeconfig="/nonexistent/kubeconfig").kube()


@pytest.mark.usefixtures("prefect_harness")
def test_gpu_cluster_saves_and_loads(sim: SimCluster) -> None:
    GpuCluster(kubeconfig=str(sim.kubeconfig_path), label_prefix="example.com").save("sim", overwrite=True)
    loaded = GpuCluster.load("sim")
    assert loaded.label_prefix == "example.com"
    assert len(loaded.kube().nodes()) == 2
