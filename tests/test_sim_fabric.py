"""The simulated cluster's fabric: nodes under leaves and zones, pair benchmarks that run as Indexed Jobs
and log both sides' rows, and the network and storage faults that show in what its pods log.

Each fault is measured twice with the same run id, healthy and then faulty (the Job deleted in between):
the simulator's seeds depend on the cluster, the run and the node or pair only, so the two differ by the
fault, as in the fleet model's own tests, and by the diurnal term between the two pods' start seconds
(under 1e-6 a second: hence ``SAME``).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pandas as pd
import pytest

from gpucert.certify import (
    BenchmarkSettings,
    benchmark_job,
    ensure_payload,
    job_name,
    pair_job,
    parse_pod_log,
    payload_configmap,
)
from gpucert.certify._collect import CollectedResults
from gpucert.certify._jobs import owned_by
from gpucert.errors import InputError
from gpucert.kube import Kube, RetryPolicy, connect
from gpucert.network import plan_rounds
from gpucert_sim import SimCluster
from gpucert_sim.fleet import LEAF_LABEL, ZONE_LABEL, Fault

from .conftest import eventually

PAIR = "nccl_pair_busbw_gbps"
INDEX = "batch.kubernetes.io/job-completion-index"
NIC_HEALTHY = {
    "ib_ports": 8,
    "ib_ports_active": 8,
    "ib_rate_min_gbps": 400,
    "ib_rate_max_gbps": 400,
    "ib_symbol_errors": 0,
    "ib_link_downed": 0,
    "ib_rcv_errors": 0,
}


#: Relative difference allowed between two measurements of one run made a few seconds apart (the diurnal
#: term moves by at most 5e-7 a second).
SAME = 1e-5


def node(i: int) -> str:
    return f"gpu-node-{i:05d}"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    # Leaves of 4: nodes 0-3 under leaf-00, 4-7 under leaf-01, 8-9 under leaf-02.
    with SimCluster(nodes=10, gpus=8, model="NVIDIA H200", seed=13, preconfigured=True, nodes_per_leaf=4) as cluster:
        yield cluster
        assert cluster.runtime is not None
        assert cluster.runtime.errors == []


@pytest.fixture(scope="module")
def kube(sim: SimCluster) -> Kube:
    return connect(sim.kubeconfig_path, retry=RetryPolicy(attempts=8, base_delay_s=0.001, max_delay_s=0.01))


@pytest.fixture(scope="module")
def cm(kube: Kube) -> dict[str, Any]:
    return ensure_payload(kube, payload_configmap(BenchmarkSettings()))


@pytest.fixture(autouse=True)
def no_faults(sim: SimCluster) -> Iterator[None]:
    yield
    sim.clear_faults()  # lift everything the test left
    for i in range(10):
        sim.set_node_ready(node(i), True)


def _gone(kube: Kube, kind: str, name: str, ns: str) -> None:
    kube.delete("batch/v1", kind, name, ns)
    eventually(lambda: kube.find("batch/v1", kind, name, ns) is None or None, 10.0)
    eventually(lambda: not kube.list_objects("v1", "Pod", ns, label_selector=f"job-name={name}") or None, 10.0)


def run_pair_logs(kube: Kube, cm: dict[str, Any], run_id: str, a: str, b: str) -> list[tuple[str, CollectedResults]]:
    """Run certify's pair Job for ``a`` and ``b`` in ``run_id`` to completion; each pod's log read as its
    node's. The Job is deleted afterwards, so the same run and pair can be measured again."""
    pair = pair_job(run_id, a, b, 8, payload=cm)
    ns = pair.job["metadata"]["namespace"]
    job = kube.create(pair.job)
    kube.create(owned_by(pair.service, job))
    try:

        def completed() -> dict[str, Any] | None:
            got = kube.get("batch/v1", "Job", pair.name, ns)
            conditions = (got.get("status") or {}).get("conditions") or ()
            return got if any(c["type"] == "Complete" for c in conditions) else None

        assert eventually(completed, 15.0)["status"]["completedIndexes"] == "0-1"
        sides = []
        for pod in kube.list_objects("v1", "Pod", ns, label_selector=f"job-name={pair.name}"):
            where = pod["spec"]["nodeName"]
            text = kube.pod_log(pod["metadata"]["name"], ns)
            sides.append((where, parse_pod_log(text, run_id=run_id, node=where, source=pod["metadata"]["name"])))
        return sides
    finally:
        _gone(kube, "Job", pair.name, ns)


def run_pair(kube: Kube, cm: dict[str, Any], run_id: str, a: str, b: str) -> dict[str, CollectedResults]:
    """:func:`run_pair_logs` of a pair whose pods ran one on each node, by node."""
    sides = dict(run_pair_logs(kube, cm, run_id, a, b))
    assert set(sides) == {a, b}
    return sides


def values(got: CollectedResults) -> list[float]:
    rows = got.results
    return [float(v) for v in rows.loc[rows["metric"].astype(str) == PAIR, "value"]]


def run_benchmark(kube: Kube, cm: dict[str, Any], run_id: str, target: str, *args: str) -> pd.DataFrame:
    settings = BenchmarkSettings(payload_args=args)
    ns = settings.namespace
    kube.create(benchmark_job(run_id, target, 8, payload=cm, settings=settings))
    name = job_name(run_id, target)
    try:

        def ended() -> dict[str, Any] | None:
            pods = kube.list_objects("v1", "Pod", ns, label_selector=f"job-name={name}")
            return pods[0] if pods and pods[0].get("status", {}).get("phase") == "Succeeded" else None

        pod = eventually(ended, 15.0)
        text = kube.pod_log(pod["metadata"]["name"], ns)
        return parse_pod_log(text, run_id=run_id, node=target, source=name).results
    finally:
        _gone(kube, "Job", name, ns)


def by_metric(rows: pd.DataFrame) -> dict[str, list[float]]:
    node_rows = rows[rows["gpu"].isna()]
    return {str(m): [float(v) for v in g["value"]] for m, g in node_rows.groupby("metric", observed=True)}


# --- topology ---------------------------------------------------------------------------------------------


def test_nodes_carry_their_zone_and_leaf_and_the_pairing_plan_reads_them(sim: SimCluster, kube: Kube) -> None:
    nodes = kube.list_objects("v1", "Node", None)
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in nodes}
    assert {name: (lab[ZONE_LABEL], lab[LEAF_LABEL]) for name, lab in labels.items()} == {
        node(i): ("zone-a", f"leaf-{i // 4:02d}") for i in range(10)
    }
    under = kube.list_objects("v1", "Node", None, label_selector=f"{LEAF_LABEL}=leaf-01")
    assert sorted(n["metadata"]["name"] for n in under) == [node(i) for i in range(4, 8)]
    table = pd.DataFrame([{"node": name, **lab} for name, lab in labels.items()])
    plan = plan_rounds(table, leaf_label=LEAF_LABEL, seed=1)
    assert set(plan.nodes["leaf"]) == {"leaf-00", "leaf-01", "leaf-02"}
    # A node that joins fills the last leaf.
    [joined] = sim.add_nodes(1)
    try:
        got = kube.get("v1", "Node", joined)["metadata"]["labels"]
        assert (joined, got[LEAF_LABEL], got[ZONE_LABEL]) == (node(10), "leaf-02", "zone-a")
    finally:
        sim.delete_node(joined)


# --- pairs ------------------------------------------------------------------------------------------------


def test_an_indexed_pair_job_runs_one_pod_on_each_node_and_both_log_the_same_pair(
    kube: Kube, cm: dict[str, Any]
) -> None:
    pair = pair_job("fab-1", node(6), node(2), 8, payload=cm)
    ns = pair.job["metadata"]["namespace"]
    job = kube.create(pair.job)
    kube.create(owned_by(pair.service, job))
    try:

        def ended() -> list[dict[str, Any]] | None:
            pods = kube.list_objects("v1", "Pod", ns, label_selector=f"job-name={pair.name}")
            return pods if len(pods) == 2 and all(p["status"].get("phase") == "Succeeded" for p in pods) else None

        pods = eventually(ended, 15.0)
        by_index = {int(p["metadata"]["annotations"][INDEX]): p for p in pods}
        assert set(by_index) == {0, 1}
        # Both on the pair's nodes, one each (the required anti-affinity on the hostname), with their index.
        assert sorted(p["spec"]["nodeName"] for p in pods) == [node(2), node(6)]
        for i, pod in by_index.items():
            assert pod["spec"]["hostname"] == f"{pair.name}-{i}"
            env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
            field = env["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
            assert field == f"metadata.annotations['{INDEX}']"
        sides = {}
        for pod in pods:
            where = pod["spec"]["nodeName"]
            log = kube.pod_log(pod["metadata"]["name"], ns)
            assert f"pair run fab-1 on {where}" in log
            assert f"rendezvous at {pair.master}" in log
            sides[where] = parse_pod_log(log, run_id="fab-1", node=where, source=pod["metadata"]["name"])
        for here, there in ((node(2), node(6)), (node(6), node(2))):
            rows = sides[here].results
            assert set(rows["metric"].astype(str)) == {PAIR}
            assert (rows["node"].astype(str) == here).all()
            assert (rows["peer"].astype(str) == there).all()
            assert rows["gpu"].isna().all()
            assert list(rows["repeat"]) == list(range(len(rows)))
            stack = sides[here].stack
            assert stack is not None
            assert stack["node"] == here
        assert values(sides[node(2)]) == values(sides[node(6)])
        assert 300 < sum(values(sides[node(2)])) / len(values(sides[node(2)])) < 440
    finally:
        _gone(kube, "Job", pair.name, ns)


def test_a_pair_measures_the_same_again_in_one_run_and_afresh_in_another(kube: Kube, cm: dict[str, Any]) -> None:
    first = run_pair(kube, cm, "fab-2", node(0), node(5))
    again = run_pair(kube, cm, "fab-2", node(5), node(0))
    other = run_pair(kube, cm, "fab-3", node(0), node(5))
    assert values(again[node(0)]) == values(again[node(5)])
    assert values(first[node(0)]) == pytest.approx(values(again[node(0)]), rel=SAME)
    assert values(other[node(0)]) != values(first[node(0)])


def test_a_nic_at_half_rate_halves_its_node_s_pairs_and_shows_in_its_benchmark(
    sim: SimCluster, kube: Kube, cm: dict[str, Any]
) -> None:
    healthy = run_pair(kube, cm, "fab-4", node(1), node(2))
    bench = by_metric(run_benchmark(kube, cm, "fab-4", node(1)))
    assert {m: v for m, v in bench.items() if m in NIC_HEALTHY} == {m: [v] for m, v in NIC_HEALTHY.items()}
    sim.inject({"gpu": [{"kind": "nic_half_rate", "node": node(1), "params": {"pair": 0.5}}]})
    slow = run_pair(kube, cm, "fab-4", node(1), node(2))
    for side in (node(1), node(2)):
        assert values(slow[side]) == pytest.approx([0.5 * v for v in values(healthy[side])], rel=SAME)
    bench = by_metric(run_benchmark(kube, cm, "fab-4", node(1)))
    assert (bench["ib_rate_min_gbps"], bench["ib_rate_max_gbps"], bench["ib_ports_active"]) == ([200], [400], [8])
    # Another pair, without the node, is untouched.
    alone = values(run_pair(kube, cm, "fab-4", node(3), node(2))[node(3)])
    assert alone == pytest.approx(values(run_pair(kube, cm, "fab-4", node(2), node(3))[node(2)]), rel=SAME)


def test_a_flapping_port_slows_its_pairs_and_its_counters_rise(sim: SimCluster, kube: Kube, cm: dict[str, Any]) -> None:
    healthy = values(run_pair(kube, cm, "fab-5", node(7), node(4))[node(7)])
    sim.inject({"gpu": [{"kind": "ib_flapping_port", "node": node(4)}]})
    slow = values(run_pair(kube, cm, "fab-5", node(7), node(4))[node(7)])
    ratios = {round(s / h, 4) for s, h in zip(slow, healthy, strict=False)}
    assert len(ratios) == 1
    assert 0.6 <= ratios.pop() <= 0.9
    bench = by_metric(run_benchmark(kube, cm, "fab-5", node(4)))
    assert bench["ib_link_downed"][0] > 0
    assert bench["ib_symbol_errors"][0] > 0
    assert bench["ib_rcv_errors"][0] > 0


def test_a_slow_uplink_slows_only_the_pairs_between_its_two_leaves(
    sim: SimCluster, kube: Kube, cm: dict[str, Any]
) -> None:
    pairs = {"across": (node(0), node(4)), "within": (node(1), node(2)), "elsewhere": (node(3), node(8))}
    healthy = {k: values(run_pair(kube, cm, "fab-6", a, b)[a]) for k, (a, b) in pairs.items()}
    with pytest.raises(InputError, match="no leaf"):
        sim.inject({"gpu": [{"kind": "slow_uplink", "params": {"leaf_a": "leaf-00", "leaf_b": "leaf-07"}}]})
    with pytest.raises(InputError, match="names no node"):
        sim.inject({"gpu": [{"kind": "slow_uplink", "node": node(0), "params": {"leaf_a": 0, "leaf_b": 1}}]})
    applied = sim.inject(
        {"gpu": [{"kind": "slow_uplink", "params": {"leaf_a": "leaf-01", "leaf_b": "leaf-00", "factor": 0.5}}]}
    )
    assert applied["gpu"] == [
        {"kind": "slow_uplink", "node": None, "gpu": None, "params": {"leaf_a": 1.0, "leaf_b": 0.0, "factor": 0.5}}
    ]
    faulty = {k: values(run_pair(kube, cm, "fab-6", a, b)[a]) for k, (a, b) in pairs.items()}
    assert faulty["across"] == pytest.approx([0.5 * v for v in healthy["across"]], rel=SAME)
    assert faulty["within"] == pytest.approx(healthy["within"], rel=SAME)
    assert faulty["elsewhere"] == pytest.approx(healthy["elsewhere"], rel=SAME)
    # No node is faulty: clearing one node's faults leaves the link slow; clearing all lifts it.
    sim.clear_faults(node(0))
    assert values(run_pair(kube, cm, "fab-6", node(0), node(4))[node(0)]) == pytest.approx(faulty["across"], rel=SAME)
    sim.clear_faults()
    assert values(run_pair(kube, cm, "fab-6", node(0), node(4))[node(0)]) == pytest.approx(healthy["across"], rel=SAME)


def test_a_pair_whose_peer_cannot_run_or_dies_logs_an_error_row(
    sim: SimCluster, kube: Kube, cm: dict[str, Any]
) -> None:
    # The peer's node is down: no pod starts there, and this side's rendezvous never completes. Once the
    # first pod has ended, the second goes to the same node (the anti-affinity holds against running pods
    # only, as kube-scheduler's does) and fails alike: every log is an error row of the node that ran it.
    sim.set_node_ready(node(9), False)
    sides = run_pair_logs(kube, cm, "fab-7", node(8), node(9))
    assert [where for where, _ in sides] == [node(8), node(8)]
    for _, got in sides:
        rows = got.results
        assert list(rows["metric"].astype(str)) == ["error"]
        assert rows["peer"].isna().all()
        assert rows["gpu"].isna().all()
        [message] = got.errors
        assert message.startswith(f"{PAIR} on node: ")
        assert f"rendezvous with {node(9)}" in message
    sim.set_node_ready(node(9), True)
    # A rank dies (an uncontained ECC error on the peer's GPU 3): both sides have an error row, no value.
    sim.inject_fault(Fault("uncontained_ecc", node(9), 3))
    died = run_pair(kube, cm, "fab-7", node(8), node(9))
    for side in (node(8), node(9)):
        assert list(died[side].results["metric"].astype(str)) == ["error"]
        assert f"a rank died on {node(9)}" in died[side].errors[0]


# --- storage ----------------------------------------------------------------------------------------------


def test_a_benchmark_with_a_storage_path_reads_it_and_a_slow_mount_shows(
    sim: SimCluster, kube: Kube, cm: dict[str, Any]
) -> None:
    plain = by_metric(run_benchmark(kube, cm, "fab-8", node(3)))
    assert "storage_read_gbps" not in plain
    healthy = by_metric(run_benchmark(kube, cm, "fab-8", node(3), "--storage-path", "/data"))["storage_read_gbps"]
    assert len(healthy) >= 3
    assert 8 < sum(healthy) / len(healthy) < 12
    sim.inject_fault(Fault("slow_storage", node(3), params={"storage": 0.3}))
    slow = by_metric(run_benchmark(kube, cm, "fab-8", node(3), "--storage-path", "/data"))["storage_read_gbps"]
    assert slow == pytest.approx([0.3 * v for v in healthy], rel=1e-12)  # a host benchmark: no diurnal term
    skipped = by_metric(
        run_benchmark(kube, cm, "fab-8", node(3), "--storage-path", "/data", "--skip", "storage", "--skip", "nic")
    )
    assert "storage_read_gbps" not in skipped
    assert "ib_ports" not in skipped


# --- documents and the command line -----------------------------------------------------------------------


def test_a_fabric_fault_reads_from_a_document_and_from_the_command_line() -> None:
    from gpucert.cli import _parser
    from gpucert_sim import parse_fault_plan
    from gpucert_sim._inject import fault_mapping, gpu_option

    plan = parse_fault_plan(
        {
            "gpu": [
                {"kind": "slow_uplink", "params": {"leaf_a": "leaf-02", "leaf_b": 0}},
                {"kind": "slow_storage", "node": node(1)},
            ]
        },
        "doc",
    )
    assert plan.gpu == (Fault("slow_uplink", params={"leaf_a": 2, "leaf_b": 0}), Fault("slow_storage", node(1)))
    # What the state and the summary show reads back as the same fault.
    assert parse_fault_plan({"gpu": [fault_mapping(plan.gpu[0])]}, "again").gpu == plan.gpu[:1]
    entry = gpu_option(["slow_uplink", "leaf_a=leaf-00", "leaf_b=leaf-03", "factor=0.5"])
    assert entry == {"kind": "slow_uplink", "params": {"leaf_a": "leaf-00", "leaf_b": "leaf-03", "factor": 0.5}}
    assert parse_fault_plan({"gpu": [entry]}, "cli").gpu[0].params == {"leaf_a": 0, "leaf_b": 3, "factor": 0.5}
    for bad, words in (({"leaf_a": "rack-1", "leaf_b": 0}, "neither a leaf name"), ({"leaf_a": True}, "numbers")):
        with pytest.raises(InputError, match=words):
            parse_fault_plan({"gpu": [{"kind": "slow_uplink", "params": bad}]}, "doc")
    args = _parser().parse_args(["sim", "up", "--kubeconfig", "k", "--nodes-per-leaf", "16"])
    assert args.nodes_per_leaf == 16
    assert _parser().parse_args(["sim", "up", "--kubeconfig", "k"]).nodes_per_leaf == 8
