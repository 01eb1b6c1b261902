"""Onboarding end to end: a node joins the simulated cluster tainted uncertified; the ``onboard-node``
deployment, started through Prefect's REST API three times with the same idempotency key, runs once —
executed by a real process worker — configures and certifies the node and lifts its taint. Also
``gpucert watch-nodes`` reporting the join."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpucert.blocks.cluster import GpuCluster
from gpucert.flows.onboard import idempotency_key, onboard
from gpucert.kube import announce_joined_nodes, connect
from gpucert_sim import SimCluster

pytestmark = pytest.mark.usefixtures("prefect_harness")
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=4, preconfigured=True, seed=8) as cluster:
        yield cluster


def test_watch_nodes_reports_nodes_waiting_to_be_onboarded(sim: SimCluster) -> None:
    kube = connect(sim.kubeconfig_path)
    [new] = sim.add_nodes(1, uncertified_taint="gpucert.io/uncertified")
    found: list[tuple[str, str]] = []
    announce_joined_nodes(
        kube, prefix="gpucert.io", selector=None, emit=lambda n, u: found.append((n, u)), follow=False
    )
    assert [name for name, _ in found] == [new]
    assert found[0][1] == kube.get("v1", "Node", new)["metadata"]["uid"]


def test_onboard_configures_certifies_and_admits_a_new_node(sim: SimCluster, tmp_path: Path) -> None:
    [new] = sim.add_nodes(1, uncertified_taint="gpucert.io/uncertified")
    kube = connect(sim.kubeconfig_path)
    uid = kube.get("v1", "Node", new)["metadata"]["uid"]
    from gpucert.blocks.store import StoreLocation

    result = asyncio.run(
        onboard(
            node=new,
            uid=uid,
            cluster=GpuCluster(kubeconfig=str(sim.kubeconfig_path)),
            store=StoreLocation(uri=f"file://{tmp_path}"),
        )
    )
    assert result.state == "certified"
    assert result.admitted is True
    node = kube.get("v1", "Node", new)
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("gpucert.io/")]
    assert idempotency_key(new, uid) == f"onboard-{new}-{uid}"
