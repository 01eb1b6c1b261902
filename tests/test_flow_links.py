"""Network, storage or one GPU, on ``gpucert sim`` under a real (temporary) Prefect server: issue 14's bar.

64 nodes in 8 leaves, a storage location configured and the policy's pairs on; one of each fault injected
— a slow GPU, one NVLink down, a NIC at half rate, a slow uplink between two leaves, a slow storage mount —
and each is named to its layer and component: the GPU's and the NVLink's node by their own benchmark, the
NIC's node by its pairs (and its port telemetry), the uplink as one fleet row that blames no node, the
storage mount as its node's storage. No healthy node is blamed, and the link step ends within the plan's
2 rounds plus its re-pairings.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.store import StoreLocation
from gpucert.certify import CertifyOutcome
from gpucert.flows.certify import certify
from gpucert.store import open_store
from gpucert_sim import SimCluster
from gpucert_sim.fleet import Fault

pytestmark = pytest.mark.usefixtures("prefect_harness")

PAIRS = CertificationPolicy(policy={"network": {"pairs": True}})
UPLINK = (2, 5)  # the leaves (by number) whose link is slow


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=64, preconfigured=True, seed=7, nodes_per_leaf=8) as cluster:
        yield cluster


def _run(sim: SimCluster, store: Path, run_id: str, **kwargs: Any) -> CertifyOutcome:
    cluster = GpuCluster(kubeconfig=str(sim.kubeconfig_path), storage_host_path="/mnt/datasets")
    return asyncio.run(
        certify(cluster=cluster, store=StoreLocation(uri=f"file://{store}"), policy=PAIRS, run_id=run_id, **kwargs)
    )


def _verdicts(store: Path, outcome: CertifyOutcome) -> pd.DataFrame:
    opened = open_store(f"file://{store}")
    return pd.read_parquet(io.BytesIO(opened.read_run_file(outcome.run_id, outcome.day, "verdicts.parquet")))


def test_each_fault_is_named_to_its_layer_and_no_healthy_node_is_blamed(sim: SimCluster, tmp_path: Path) -> None:
    clean = _run(sim, tmp_path, "links-clean")
    stragglers = {d.node for d in clean.decisions if d.state in ("degraded", "failed")} | set(clean.tainted)
    assert clean.links, "the clean run measured its links"
    names = sim.fleet.node_names
    healthy = [n for n in names if n not in stragglers]
    gpu_node, nvlink_node, nic_node, storage_node = healthy[3], healthy[12], healthy[21], healthy[40]
    faults = [
        Fault("hw_thermal", gpu_node, 2),
        Fault("nvlink_one_down", nvlink_node, 5),
        Fault("nic_half_rate", nic_node),
        Fault("slow_uplink", params={"leaf_a": UPLINK[0], "leaf_b": UPLINK[1]}),
        Fault("slow_storage", storage_node),
    ]
    for fault in faults:
        sim.inject_fault(fault)
    try:
        night = _run(sim, tmp_path, "links-night")
    finally:
        sim.clear_faults()
    decided = {d.node: d for d in night.decisions}
    expected = {gpu_node: "thermal", nvlink_node: "nvlink", nic_node: "network", storage_node: "storage"}
    for node, cause in expected.items():
        assert decided[node].state in ("degraded", "failed"), (node, decided[node])
        assert decided[node].cause == cause or cause in decided[node].summary, (node, cause, decided[node])
    blamed = {n for n, d in decided.items() if d.state in ("degraded", "failed")}
    assert blamed - stragglers <= set(expected), blamed - stragglers - set(expected)

    verdicts = _verdicts(tmp_path, night)
    fleet_rows = verdicts[verdicts["reference_kind"] == "fleet"]
    uplink = fleet_rows[fleet_rows["metric"] == "nccl_pair_busbw_gbps"]
    assert len(uplink) == 1, fleet_rows["reasons"].tolist()
    leaves = [sim.fleet.leaf_names[i] for i in UPLINK]
    assert all(leaf in uplink["reasons"].iloc[0] for leaf in leaves)
    assert uplink["node"].isna().all()
    # Nobody under the slow uplink is blamed for it: their pair rows pass, saying what explains them.
    under = {n for n, leaf in zip(names, sim.fleet.leaf_index, strict=True) if leaf in UPLINK}
    network_blamed = set(
        verdicts.loc[
            (verdicts["cause"] == "network") & verdicts["node"].notna() & (verdicts["verdict"] != "pass"), "node"
        ]
    )
    assert network_blamed == {nic_node}
    assert not (under - {nic_node}) & network_blamed
    head = night.links[0]
    rounds = int(head.split(" rounds")[0].split()[-1])
    assert rounds <= 2, head
