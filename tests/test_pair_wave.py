"""One round of pair benchmarks against ``gpucert sim`` (:func:`gpucert.certify.run_pair_round`): disjoint pairs
run as Indexed Jobs with both nodes' Leases and testing taints, one orientation of each pair's rows kept; a
pair another run holds a node of ends ``leased`` while the others run; a round started again adopts its Jobs;
another run's unfinished pair Job is an orphan unless its run holds both Leases; a round cancelled or failing
leaves no taint and no Lease; rows naming the wrong peer fail their pair."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pandas as pd
import pytest

from gpucert._frames import RESULT_DTYPES
from gpucert.certify import (
    BenchmarkSettings,
    PairRound,
    orphaned_jobs,
    pair_job,
    pair_name,
    payload_configmap,
    run_pair_round,
    split_pod_log,
)
from gpucert.certify._jobs import owned_by
from gpucert.certify._wave import UnitRun, _round_results, _Side
from gpucert.kube import Kube, NodeLeases, RetryPolicy, connect
from gpucert_sim import SimCluster

from .conftest import eventually

PREFIX = "gpucert.io"
TESTING = f"{PREFIX}/testing"
METRIC = "nccl_pair_busbw_gbps"
GPUS = 8


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=8, gpus=GPUS, model="NVIDIA H200", seed=7, preconfigured=True) as cluster:
        yield cluster
        assert cluster.runtime is not None
        assert cluster.runtime.errors == []


@pytest.fixture(scope="module")
def kube(sim: SimCluster) -> Kube:
    return connect(sim.kubeconfig_path, retry=RetryPolicy(attempts=8, base_delay_s=0.001, max_delay_s=0.01))


@pytest.fixture(scope="module")
def payload(kube: Kube) -> dict[str, Any]:
    settings = BenchmarkSettings()
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": settings.namespace}})
    return kube.apply(payload_configmap(settings))


def node(sim: SimCluster, i: int) -> str:
    return sim.fleet.node_names[i]


def settings_with(**annotations: str) -> BenchmarkSettings:
    return BenchmarkSettings(pod_annotations=dict(annotations))


def run_round(
    kube: Kube,
    pairs: Sequence[tuple[str, str]],
    run_id: str,
    payload: Mapping[str, Any],
    settings: BenchmarkSettings | None = None,
    **kwargs: Any,
) -> Any:
    nodes = {n for pair in pairs for n in pair}
    return run_pair_round(
        kube,
        pairs,
        run_id,
        payload,
        settings or BenchmarkSettings(),
        gpus=dict.fromkeys(nodes, GPUS),
        poll_s=0.05,
        **kwargs,
    )


def leases(kube: Kube, holder: str, at: datetime | None = None) -> NodeLeases:
    clock = (lambda: at) if at is not None else (lambda: datetime.now(UTC))
    return NodeLeases(kube, holder, namespace=BenchmarkSettings().namespace, duration_s=60, clock=clock)


def taints(kube: Kube, name: str) -> list[str]:
    return [t["key"] for t in kube.get("v1", "Node", name)["spec"].get("taints") or ()]


def free(kube: Kube, *names: str) -> bool:
    """No testing taint and no Lease on any of ``names``."""
    probe = leases(kube, "probe")
    return all(TESTING not in taints(kube, n) and probe.read(n) is None for n in names)


def jobs(kube: Kube, run_id: str) -> list[dict[str, Any]]:
    return kube.list_objects(
        "batch/v1", "Job", BenchmarkSettings().namespace, label_selector=f"{PREFIX}/run-id={run_id}"
    )


def services(kube: Kube, run_id: str) -> list[dict[str, Any]]:
    return kube.list_objects("v1", "Service", BenchmarkSettings().namespace, label_selector=f"{PREFIX}/run-id={run_id}")


def pair_rows(rnd: PairRound) -> pd.DataFrame:
    assert rnd.results is not None
    return rnd.results[rnd.results["metric"].astype(str) == METRIC]


# --- on the simulated cluster ---------------------------------------------------------------------------------


def test_a_round_of_three_disjoint_pairs_keeps_both_pods_rows_each_naming_its_own_node(
    sim: SimCluster, kube: Kube, payload: dict[str, Any]
) -> None:
    n = [node(sim, i) for i in range(6)]
    asked = [(n[1], n[0]), (n[2], n[3]), (n[5], n[4])]  # either way round: a pair is its sorted nodes
    rnd = asyncio.run(run_round(kube, asked, "pw-three", payload))
    pairs = [(n[0], n[1]), (n[2], n[3]), (n[4], n[5])]
    assert sorted(rnd.runs) == pairs
    assert rnd.failed() == {}
    assert {r.job for r in rnd.runs.values()} == {pair_name("pw-three", *p) for p in pairs}
    rows = pair_rows(rnd)
    # Both orientations, as the two pods logged them, with the same values: one collective measured.
    oriented = set(zip(rows["node"].astype(str), rows["peer"].astype(str), strict=True))
    assert oriented == set(pairs) | {(b, a) for a, b in pairs}
    assert not rows.duplicated(["node", "peer", "metric", "repeat"]).any()
    for pair, run in rnd.runs.items():
        mine = rows[rows["node"].astype(str) == pair[0]].sort_values("repeat")["value"].to_numpy()
        theirs = rows[rows["node"].astype(str) == pair[1]].sort_values("repeat")["value"].to_numpy()
        assert len(mine) >= BenchmarkSettings().repeats
        assert mine == pytest.approx(theirs, rel=1e-5)
        assert run.rows == int((rnd.results["node"].astype(str).isin(pair)).sum())
    assert {c: str(t) for c, t in rnd.results.dtypes.items()} == {c: str(t) for c, t in RESULT_DTYPES.items()}
    assert set(rnd.results["run_id"].astype(str)) == {"pw-three"}
    assert len(jobs(kube, "pw-three")) == 3
    assert free(kube, *n)
    assert rnd.leftovers == {}


def test_a_pair_whose_node_another_run_holds_ends_leased_and_the_others_still_run(
    sim: SimCluster, kube: Kube, payload: dict[str, Any]
) -> None:
    n = [node(sim, i) for i in range(4)]
    other = leases(kube, "run-other")
    assert other.acquire(n[3]).held
    try:
        rnd = asyncio.run(run_round(kube, [(n[0], n[1]), (n[2], n[3])], "pw-leased", payload, lease_wait_s=0))
    finally:
        assert other.release(n[3])
    held = rnd.runs[(n[2], n[3])]
    assert (held.state, held.reason) == ("failed", "leased")
    assert held.message.startswith("benchmarked by run run-other")
    assert rnd.runs[(n[0], n[1])].state == "succeeded"
    assert [j["metadata"]["name"] for j in jobs(kube, "pw-leased")] == [pair_name("pw-leased", n[0], n[1])]
    assert set(zip(pair_rows(rnd)["node"].astype(str), pair_rows(rnd)["peer"].astype(str), strict=True)) == {
        (n[0], n[1]),
        (n[1], n[0]),
    }
    assert free(kube, *n)  # n[2]'s Lease, taken first, was given back


def test_a_round_started_again_adopts_its_jobs(sim: SimCluster, kube: Kube, payload: dict[str, Any]) -> None:
    n = [node(sim, i) for i in range(2)]
    # A killed round left its Job and Service behind, still running.
    left = pair_job(
        "pw-again", n[0], n[1], GPUS, payload=payload, settings=settings_with(**{"sim.gpucert.io/run-seconds": "1"})
    )
    created = kube.create(left.job)
    kube.create(owned_by(left.service, created))
    first = asyncio.run(run_round(kube, [(n[1], n[0])], "pw-again", payload))
    again = asyncio.run(run_round(kube, [(n[0], n[1])], "pw-again", payload))  # its Job completed meanwhile
    for rnd in (first, again):
        assert rnd.failed() == {}
        assert len(pair_rows(rnd)) >= BenchmarkSettings().repeats
    found = jobs(kube, "pw-again")
    assert [j["metadata"]["uid"] for j in found] == [created["metadata"]["uid"]]  # adopted, never duplicated
    assert len(services(kube, "pw-again")) == 1
    assert free(kube, *n)


def test_a_node_in_two_pairs_of_one_round_is_refused(sim: SimCluster, kube: Kube, payload: dict[str, Any]) -> None:
    n = [node(sim, i) for i in range(3)]
    with pytest.raises(ValueError, match=f"node {n[1]} is in two pairs"):
        asyncio.run(run_round(kube, [(n[0], n[1]), (n[2], n[1])], "pw-twice", payload))
    with pytest.raises(ValueError, match=f"node {n[0]} is in two pairs"):
        asyncio.run(run_round(kube, [(n[0], n[1]), (n[1], n[0])], "pw-twice", payload))
    assert jobs(kube, "pw-twice") == []
    assert free(kube, *n)


def test_orphaned_jobs_are_other_runs_unfinished_ones_whose_run_lost_a_lease(
    sim: SimCluster, kube: Kube, payload: dict[str, Any]
) -> None:
    n = [node(sim, i) for i in range(6, 8)]
    settings = BenchmarkSettings()
    long_run = settings_with(**{"sim.gpucert.io/run-seconds": "3600"})
    dead = kube.create(pair_job("pw-dead", n[0], n[1], GPUS, payload=payload, settings=long_run).job)
    name = dead["metadata"]["name"]
    crashed = leases(kube, "pw-dead", at=datetime.now(UTC))
    assert all(crashed.acquire(x).held for x in n)
    assert orphaned_jobs(kube, settings, "pw-live", [n[1]]) == []  # its run holds both nodes
    assert orphaned_jobs(kube, settings, "pw-dead", n) == []  # a run's own Jobs are never its orphans
    assert orphaned_jobs(kube, settings, "pw-live", [node(sim, 0)]) == []  # on other nodes
    crashed.release(n[0])  # its run holds one of the two nodes only: the pair's measurement is void
    assert orphaned_jobs(kube, settings, "pw-live", [n[0]]) == [name]
    # The run crashed: an hour later its Lease on n[1] has long lapsed; a round taking it over deletes its Job.
    leases(kube, "pw-dead", at=datetime.now(UTC) - timedelta(hours=1)).acquire(n[1])
    assert orphaned_jobs(kube, settings, "pw-live", [n[1]]) == [name]
    rnd = asyncio.run(run_round(kube, [(n[0], n[1])], "pw-live", payload))
    assert rnd.failed() == {}
    assert kube.find("batch/v1", "Job", name, settings.namespace) is None
    assert orphaned_jobs(kube, settings, "pw-live", n) == []
    assert free(kube, *n)


def test_a_round_cancelled_mid_benchmark_leaves_no_job_taint_or_lease(
    sim: SimCluster, kube: Kube, payload: dict[str, Any]
) -> None:
    n = [node(sim, i) for i in range(4)]
    slow = settings_with(**{"sim.gpucert.io/run-seconds": "60"})

    async def cut_short() -> None:
        task = asyncio.ensure_future(run_round(kube, [(n[0], n[1]), (n[2], n[3])], "pw-cut", payload, slow))
        await asyncio.to_thread(
            eventually, lambda: len(jobs(kube, "pw-cut")) == 2 and all(TESTING in taints(kube, x) for x in n), 10.0
        )
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cut_short())
    assert jobs(kube, "pw-cut") == []
    assert free(kube, *n)


def test_a_failed_pair_job_is_failed_with_its_reason_and_lets_its_nodes_go(
    sim: SimCluster, kube: Kube, payload: dict[str, Any]
) -> None:
    n = [node(sim, i) for i in range(2)]
    broken = settings_with(**{"sim.gpucert.io/exit-code": "1"})
    rnd = asyncio.run(run_round(kube, [(n[0], n[1])], "pw-fail", payload, broken))
    run = rnd.runs[(n[0], n[1])]
    assert (run.state, run.reason) == ("failed", "error")
    assert rnd.results is None
    assert free(kube, *n)


# --- the round's rows, without a cluster ----------------------------------------------------------------------


def side(node: str, peer: str | None, values: Sequence[float], *, metric: str = METRIC) -> _Side:
    rows = [
        {
            "run_id": "pw-rows",
            "node": node,
            "gpu": None,
            "gpu_uuid": None,
            "gpu_model": "NVIDIA H200",
            "metric": metric,
            "value": v,
            "repeat": i,
            "peer": peer,
            "ts": "2026-03-01T02:00:00Z",
        }
        for i, v in enumerate(values)
    ]
    text = "\n".join(json.dumps(r) for r in rows)
    source = f"log of Pod ns/pod-{node} (Job j, node {node})"
    return _Side(node, split_pod_log(text, run_id="pw-rows", node=node, source=source))


def test_a_pair_job_names_each_node_in_a_node_selector_term_of_its_own() -> None:
    # A real API server refuses (422) a matchFields requirement on metadata.name with more than one value.
    pair = pair_job("pw-terms", "node-b", "node-a", GPUS, payload=payload_configmap(BenchmarkSettings()))
    required = pair.job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert all(len(req["values"]) == 1 for term in required["nodeSelectorTerms"] for req in term["matchFields"])
    assert required["nodeSelectorTerms"] == [  # ORed: either node
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-b"]}]},
    ]
    assert pair.nodes == ("node-a", "node-b")
    # A Job an older gpucert wrote, one term naming both nodes, still reads as its pair.
    required["nodeSelectorTerms"] = [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a", "node-b"]}]}
    ]
    assert pair.nodes == ("node-a", "node-b")


def test_both_pods_rows_are_kept_as_logged_error_rows_too() -> None:
    pair = ("node-a", "node-b")
    sides = [side("node-a", "node-b", [10.0, 11.0]), side("node-b", "node-a", [10.0, 11.0])]
    errors = side("node-a", None, [1.0], metric="error")
    sides[0] = _Side(
        "node-a",
        split_pod_log(
            "\n".join([json.dumps(r) for r in sides[0].log.records] + [json.dumps(errors.log.records[0])]),
            run_id="pw-rows",
            node="node-a",
            source=sides[0].log.source,
        ),
    )
    runs = {pair: UnitRun(pair, "j", "succeeded")}
    kept = _round_results(runs, {pair: sides})
    assert kept is not None
    measured = kept[kept["metric"].astype(str) == METRIC]
    assert sorted(zip(measured["node"].astype(str), measured["peer"].astype(str), measured["value"], strict=True)) == [
        ("node-a", "node-b", 10.0),
        ("node-a", "node-b", 11.0),
        ("node-b", "node-a", 10.0),
        ("node-b", "node-a", 11.0),
    ]
    assert kept[kept["metric"].astype(str) == "error"]["node"].astype(str).tolist() == ["node-a"]
    assert runs[pair].rows == 5


def test_a_pod_whose_rows_name_another_peer_fails_its_pair_with_bad_results() -> None:
    good, wrong = ("node-a", "node-b"), ("node-c", "node-d")
    logs = {
        good: [side("node-a", "node-b", [5.0]), side("node-b", "node-a", [5.0])],
        wrong: [side("node-c", "node-d", [5.0]), side("node-d", "node-x", [5.0])],
    }
    runs = {p: UnitRun(p, "j", "succeeded") for p in logs}
    kept = _round_results(runs, logs)
    assert (runs[wrong].state, runs[wrong].reason) == ("failed", "bad_results")
    assert "pod-node-d" in runs[wrong].message
    assert "peer node-x" in runs[wrong].message
    assert runs[good].state == "succeeded"
    assert kept is not None
    assert set(kept["node"].astype(str)) == {"node-a", "node-b"}  # the good pair only, both its pods


def test_a_pod_stuck_on_its_image_gives_the_pair_up_whichever_pod_it_is(
    sim: SimCluster, kube: Kube, payload: dict[str, Any]
) -> None:
    n = [node(sim, i) for i in range(2)]
    pull = "sim.gpucert.io/image-pull-error"
    # Node rank 0's node cannot pull: the Job's newest pod (rank 1's) runs, the other waits on its image.
    kube.merge_patch("v1", "Node", n[0], {"metadata": {"annotations": {pull: "ImagePullBackOff"}}})
    ticks = iter(range(10**6))

    def clock() -> float:  # 30 s a look: past the pending grace within a few polls
        return 30.0 * next(ticks)

    try:
        rnd = asyncio.run(run_round(kube, [(n[0], n[1])], "pw-pull", payload, clock=clock))
    finally:
        kube.merge_patch("v1", "Node", n[0], {"metadata": {"annotations": {pull: None}}})
    run = rnd.runs[(n[0], n[1])]
    assert (run.state, run.reason) == ("failed", "image_pull")
    assert "ImagePullBackOff" in run.message
    eventually(lambda: jobs(kube, "pw-pull") == [], 10.0)  # given up: deleted
    assert free(kube, *n)
