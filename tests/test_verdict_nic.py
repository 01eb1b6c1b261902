"""The RDMA NIC gates, the ``storage`` cause, the layer of each cause and the layer in the verdict's reasons.

Nights of a generated fleet get the node-level ``ib_*`` rows the payload writes (tests/test_bench_nic.py):
healthy nodes eight ports at 400 Gb/s with quiet counters, and one node at a time with a port down, a port
trained down, or a counter rising.
"""

from __future__ import annotations

import datetime as dt

import pandas as pd
import pytest

from gpucert.policy import load_policy
from gpucert.results import parse_results
from gpucert.store import empty_baseline
from gpucert.verdict import ACTION_FOR_CAUSE, LAYER_OF_CAUSE, LAYERS, judge, layer_of
from gpucert_sim.fleet import Fleet

from .conftest import T0, row, unexpected

HEALTHY = {
    "ib_ports": 8,
    "ib_ports_active": 8,
    "ib_rate_min_gbps": 400,
    "ib_rate_max_gbps": 400,
    "ib_symbol_errors": 0,
    "ib_link_downed": 0,
    "ib_rcv_errors": 0,
}


@pytest.fixture(scope="module")
def night() -> pd.DataFrame:
    fleet = Fleet.generate(nodes=12, seed=5)
    return fleet.run("nic-night", ts=T0 + dt.timedelta(days=1), seed=31).results


def with_nics(results: pd.DataFrame, changed: dict[str, dict[str, float]]) -> pd.DataFrame:
    """``results`` plus HEALTHY NIC rows on every node, with ``changed`` node → metric → value over them."""
    nodes = results.drop_duplicates("node")[["run_id", "node", "gpu_model", "ts"]]
    rows = [
        {**ident, "gpu": None, "gpu_uuid": None, "metric": metric, "value": float(value), "repeat": 0, "peer": None}
        for ident in nodes.astype(object).to_dict("records")
        for metric, value in {**HEALTHY, **changed.get(str(ident["node"]), {})}.items()
    ]
    extra = pd.DataFrame(rows)[list(results.columns)]
    plain = results.astype({c: object for c in results.columns if isinstance(results[c].dtype, pd.CategoricalDtype)})
    return parse_results(pd.concat([plain, extra], ignore_index=True), "test night")


def node_of(results: pd.DataFrame, i: int) -> str:
    return sorted(results["node"].astype(str).unique())[i]


def test_healthy_nics_flag_nothing(night: pd.DataFrame) -> None:
    verdicts = judge(with_nics(night, {}), empty_baseline())
    assert unexpected(verdicts).empty, unexpected(verdicts)[["node", "gpu", "reasons"]].to_string()


@pytest.mark.parametrize(
    ("change", "metric", "action", "words"),
    [
        ({"ib_ports_active": 7}, "ib_ports_active", "reseat_nic", "network: 1 of 8 RDMA ports down"),
        (
            {"ib_rate_min_gbps": 200},
            "ib_rate_min_gbps",
            "check_cable",
            "network: an RDMA port at 200 Gb/s, the others at up to 400: trained down",
        ),
        ({"ib_link_downed": 3}, "ib_link_downed", "check_cable", "network: link downed 3 times during the run"),
        ({"ib_link_downed": 1}, "ib_link_downed", "check_cable", "network: link downed once during the run"),
        ({"ib_symbol_errors": 12}, "ib_symbol_errors", "check_cable", "network: 12 symbol errors during the run"),
        ({"ib_rcv_errors": 11}, "ib_rcv_errors", "check_cable", "network: 11 packets received with errors"),
    ],
)
def test_each_nic_fault_fails_its_node_with_cause_network(
    night: pd.DataFrame, change: dict[str, float], metric: str, action: str, words: str
) -> None:
    node = node_of(night, 3)
    verdicts = judge(with_nics(night, {node: change}), empty_baseline())
    got = row(verdicts, node)
    assert (got["verdict"], got["cause"], got["metric"]) == ("fail", "network", metric), got["reasons"]
    assert (got["action"], got["ticket"], got["reference_kind"]) == (action, "remediation", "gate")
    assert got["reasons"].startswith(words), got["reasons"]
    assert got["value"] == change[metric]
    # The node's GPUs are not blamed for their node's NIC.
    gpus = verdicts[(verdicts["node"] == node) & verdicts["gpu"].notna()]
    assert not (gpus["cause"] == "network").any()
    others = unexpected(verdicts)
    assert (others["node"] == node).all(), others[["node", "gpu", "reasons"]].to_string()


def test_a_few_received_errors_pass_and_the_gates_come_from_the_policy(night: pd.DataFrame) -> None:
    node = node_of(night, 2)
    results = with_nics(night, {node: {"ib_rcv_errors": 10, "ib_rate_min_gbps": 200, "ib_rate_max_gbps": 200}})
    assert row(judge(results, empty_baseline()), node)["verdict"] == "pass"
    strict = load_policy(overrides={"gates": {"ib_rcv_errors": 0, "ib_rate_gbps": 400}})
    got = row(judge(results, empty_baseline(), policy=strict), node)
    assert got["verdict"] == "fail"
    assert "an RDMA port at 200 Gb/s, below the expected 400" in got["reasons"]
    assert "10 packets received with errors during the run (gate 0" in got["reasons"]


def test_an_expected_rate_replaces_the_comparison_within_the_node(night: pd.DataFrame) -> None:
    node, mixed = node_of(night, 4), node_of(night, 7)
    # One node trained down; one whose storage NIC runs at 200 Gb/s by design next to 400 Gb/s compute NICs.
    results = with_nics(
        night, {node: {"ib_rate_min_gbps": 100, "ib_rate_max_gbps": 200}, mixed: {"ib_rate_min_gbps": 200}}
    )
    policy = load_policy(overrides={"gates": {"ib_rate_gbps": 200}})
    verdicts = judge(results, empty_baseline(), policy=policy)
    got = row(verdicts, node)
    assert (got["metric"], got["value"], got["reference"]) == ("ib_rate_min_gbps", 100, 200)
    assert got["reasons"].count("Gb/s") == 1  # one finding, not one per comparison
    assert row(verdicts, mixed)["verdict"] == "pass"
    assert row(judge(results, empty_baseline()), mixed)["verdict"] == "fail"  # without it, within the node


def test_a_node_without_rdma_rows_is_not_judged_on_them(night: pd.DataFrame) -> None:
    """A node without InfiniBand writes no ib_* row: nothing is missing, nothing is inconclusive."""
    results = with_nics(night, {})
    node = node_of(night, 5)
    results = results[~((results["node"] == node) & results["metric"].astype(str).str.startswith("ib_"))]
    assert row(judge(results, empty_baseline()), node)["verdict"] == "pass"


def test_a_slow_storage_read_is_cause_storage(night: pd.DataFrame) -> None:
    nodes = sorted(night["node"].astype(str).unique())
    template = night[night["metric"] == "nccl_allreduce_busbw_gbps"].drop_duplicates("node")
    reads = []
    for repeat in range(3):
        part = template.copy()
        part["metric"] = "storage_read_gbps"
        part["repeat"] = repeat
        part["value"] = [5.0 * (1 + 0.001 * (i % 5 - 2)) for i in range(len(part))]
        reads.append(part)
    frame = pd.concat(reads, ignore_index=True)
    slow = frame["node"] == nodes[6]
    frame.loc[slow, "value"] = 2.0
    plain = [
        f.astype({c: object for c in f.columns if isinstance(f[c].dtype, pd.CategoricalDtype)}) for f in (night, frame)
    ]
    results = parse_results(pd.concat(plain, ignore_index=True), "test night")
    got = row(judge(results, empty_baseline()), nodes[6])
    assert (got["verdict"], got["cause"], got["metric"]) == ("fail", "storage", "storage_read_gbps")
    assert got["action"] == "check_storage_mount"
    assert got["reasons"].startswith("storage: ")


def test_every_cause_has_a_layer_and_an_action() -> None:
    assert set(LAYER_OF_CAUSE.values()) == set(LAYERS)
    assert {layer_of(c) for c in ("thermal", "power", "ecc", "row_remap", "xid", "slow_silicon", "pcie")} == {"gpu"}
    assert (layer_of("nvlink"), layer_of("network"), layer_of("storage")) == ("nvlink", "network", "storage")
    assert (layer_of("config"), layer_of("unknown"), layer_of(""), layer_of("gremlins")) == (
        "stack",
        "unknown",
        "unknown",
        "unknown",
    )
    assert ACTION_FOR_CAUSE["network"] == "check_cable"
    assert ACTION_FOR_CAUSE["storage"] == "check_storage_mount"


def test_the_fleet_vocabulary_knows_every_cause_the_verdict_names() -> None:
    from gpucert_sim.fleet import CAUSES

    assert set(LAYER_OF_CAUSE) <= set(CAUSES) | {"unknown"}
