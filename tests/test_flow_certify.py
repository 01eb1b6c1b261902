"""The certify flow end to end on ``gpucert sim``, under a real (temporary) Prefect server: the issue's
bars — five faults of different kinds on 64 nodes × 8 GPUs each get the right state, taint and cause
while every healthy node is certified; a run killed mid-way and started again leaves no duplicate
Jobs, no half-written baseline and no stale taint; observe-only and the blast radius taint nothing."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.store import StoreLocation
from gpucert.certify import BenchmarkSettings, CertifyOutcome, benchmark_job, payload_configmap
from gpucert.cli import main
from gpucert.flows.certify import certify
from gpucert.kube import Kube, connect
from gpucert.store import open_store
from gpucert_sim import SimCluster
from gpucert_sim.fleet import Fault

pytestmark = pytest.mark.usefixtures("prefect_harness")

FAULTS = {  # node index → (kind, gpu, expected taint cause)
    3: ("pcie_gen4", 2, "pcie"),
    11: ("remap_failure", 5, "row_remap"),
    20: ("hw_thermal", 1, "thermal"),
    37: ("nvlink_one_down", 6, "nvlink"),
    50: ("power_brake", None, "power"),
}


def _run(sim: SimCluster, store: Path, **kwargs: Any) -> CertifyOutcome:
    cluster = GpuCluster(kubeconfig=str(sim.kubeconfig_path))
    return asyncio.run(certify(cluster=cluster, store=StoreLocation(uri=f"file://{store}"), **kwargs))


def _node_jobs(kube: Kube, namespace: str) -> list[dict[str, Any]]:
    """The benchmark Jobs of single nodes (the links step's pair Jobs aside)."""
    return [
        j
        for j in kube.list_objects("batch/v1", "Job", namespace)
        if "gpucert.io/node" in (j["metadata"].get("annotations") or {})
    ]


def _taints(kube: Kube) -> dict[str, list[tuple[str, str]]]:
    return {
        n["metadata"]["name"]: [
            (t["key"], t.get("value", "")) for t in n["spec"].get("taints") or [] if t["key"].startswith("gpucert.io/")
        ]
        for n in kube.nodes()
    }


@pytest.fixture(scope="module")
def sim64() -> Iterator[SimCluster]:
    with SimCluster(nodes=64, preconfigured=True, seed=3) as cluster:
        yield cluster


def test_five_faults_on_64_nodes_get_the_right_state_taint_and_cause(sim64: SimCluster, tmp_path: Path) -> None:
    # A clean first run seeds the baselines, as after configure; the nodes it flags are the fleet's own
    # stragglers (the slow tail of silicon binning), which a faulty night must not be blamed for either.
    # Fixed run ids make the simulated measurements, and so this test, repeatable.
    clean = _run(sim64, tmp_path, run_id="cert-clean")
    stragglers = (
        set(clean.tainted)
        | set(clean.unconfirmed)
        | {d.node for d in clean.decisions if d.state in ("degraded", "failed")}
    )
    names = sim64.fleet.node_names
    faulty = {names[i]: cause for i, (_, _, cause) in FAULTS.items()}
    assert not stragglers & set(faulty)
    for index, (kind, gpu, _) in FAULTS.items():
        sim64.inject_fault(Fault(kind, names[index], gpu))
    try:
        result = _run(sim64, tmp_path, run_id="cert-night")
    finally:
        sim64.clear_faults()
    kube = connect(sim64.kubeconfig_path)
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in kube.nodes()}
    taints = _taints(kube)
    for node, cause in faulty.items():
        assert labels[node]["gpucert.io/state"] == "failed", node
        assert taints[node] == [("gpucert.io/unhealthy", cause)], node
    healthy = set(names) - set(faulty) - stragglers
    assert len(healthy) >= 55
    assert {labels[n]["gpucert.io/state"] for n in healthy} == {"certified"}
    assert all(taints[n] == [] for n in healthy)
    assert set(faulty) <= set(result.tainted)
    assert result.incident is None
    store = open_store(f"file://{tmp_path}")
    assert store.current_version() == result.baseline_version
    assert result.report is not None
    assert Path(result.report.removeprefix("file://")).read_text().startswith("<!DOCTYPE html>")


def test_a_killed_run_leaves_no_duplicate_jobs_no_half_baseline_no_stale_taint(tmp_path: Path) -> None:
    with SimCluster(nodes=4, preconfigured=True, seed=5) as sim:
        kube = connect(sim.kubeconfig_path)
        names = sim.fleet.node_names
        # A run killed mid-way: its Jobs still running on two nodes, nothing judged, nothing written.
        settings = BenchmarkSettings(pod_annotations={"sim.gpucert.io/run-seconds": "3600"})
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": settings.namespace}})
        payload = kube.apply(payload_configmap(settings))
        for node in names[:2]:
            kube.create(benchmark_job("cert-killed", node, 8, payload=payload, settings=settings))
        # An earlier run's taint on a node that was since repaired.
        kube.merge_patch(
            "v1",
            "Node",
            names[3],
            {"spec": {"taints": [{"key": "gpucert.io/unhealthy", "value": "pcie", "effect": "NoSchedule"}]}},
        )

        result = _run(sim, tmp_path, run_id="cert-again")
        jobs = _node_jobs(kube, settings.namespace)
        runs = sorted(j["metadata"]["labels"]["gpucert.io/run-id"] for j in jobs)
        assert runs == ["cert-again"] * 4  # the killed run's Jobs are gone, one Job per node
        assert _taints(kube) == {key: [] for key in names}  # the repaired node is untainted on its pass
        store = open_store(f"file://{tmp_path}")
        assert [v.version for v in store.versions()] == [result.baseline_version]

        pair_jobs = len(kube.list_objects("batch/v1", "Job", settings.namespace)) - len(jobs)
        again = _run(sim, tmp_path, run_id="cert-again")  # the same run id again adopts, duplicates nothing
        assert len(_node_jobs(kube, settings.namespace)) == 4
        assert len(kube.list_objects("batch/v1", "Job", settings.namespace)) == 4 + pair_jobs
        assert again.states == {"certified": 4}


def test_observe_only_and_the_blast_radius_taint_nothing(tmp_path: Path) -> None:
    with SimCluster(nodes=6, preconfigured=True, seed=6) as sim:
        names = sim.fleet.node_names
        sim.inject_fault(Fault("remap_failure", names[0], 0))
        observed = _run(sim, tmp_path / "a", observe_only=True)
        kube = connect(sim.kubeconfig_path)
        assert observed.tainted == []
        assert kube.get("v1", "Node", names[0])["metadata"]["labels"]["gpucert.io/state"] == "failed"
        for node in names[1:5]:  # 5 of 6 nodes fail: more than max(3, 10 %) — the baseline is suspect
            sim.inject_fault(Fault("remap_failure", node, 1))
        guarded = _run(sim, tmp_path / "b")
        assert guarded.tainted == []
        assert guarded.incident is not None
        assert "blast radius" in guarded.incident
        assert all(t == [] for t in _taints(kube).values())


def test_command_line_certify(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SimCluster(nodes=2, preconfigured=True, seed=7) as sim:
        kubeconfig = str(sim.kubeconfig_path)
        bad = tmp_path / "policy.yaml"
        bad.write_text("peers:\n  no_such_key: 1\n")
        store = f"file://{tmp_path / 'store'}"
        assert main(["certify", "--kubeconfig", kubeconfig, "--store", store, "--policy", str(bad)]) == 2
        assert "no_such_key" in capsys.readouterr().err
        assert main(["certify", "--kubeconfig", kubeconfig, "--store", store, "--run-id", "cli-run"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("certify cli-run: 2 nodes benchmarked: 2 certified")
        assert "report: file://" in out


def _flow_run_names(run_id: str) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    async def names() -> list[str]:
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[run_id])))
        return [r.name for r in runs]

    return asyncio.run(names())


def test_the_flow_and_compare_with_its_reruns_settle_alike(tmp_path: Path) -> None:
    """``gpucert compare FIRST --rerun SECOND … --decisions D`` reaches the decision the flow recorded, from
    the run's own files: the same judging of re-runs among the cohort, the same settle. (And a generated
    run id is the flow run's name: the UI's run list reads without opening each run.)"""
    store = open_store(f"file://{tmp_path}")
    with SimCluster(nodes=12, preconfigured=True, seed=3) as sim:
        seeded = _run(sim, tmp_path)
        assert seeded.run_id.startswith("cert-")
        assert _flow_run_names(seeded.run_id) == [seeded.run_id]
        before = store.current_version()
        sim.inject_fault(Fault("pcie_gen4", sim.fleet.node_names[2], 4))  # a fail that a re-run must confirm
        outcome = _run(sim, tmp_path, run_id="cert-pair")
    assert outcome.reruns
    folder = tmp_path / f"runs/date={outcome.day}/run=cert-pair"
    reruns = [
        arg for i in range(1, len(outcome.reruns) + 1) for arg in ("--rerun", str(folder / f"results-c{i}.parquet"))
    ]
    out, decisions = tmp_path / "v.parquet", tmp_path / "d.parquet"
    argv = [
        "compare",
        str(folder / "results.parquet"),
        *reruns,
        "--baselines",
        f"file://{tmp_path}",
        "--baseline-version",
        str(before),
        "--out",
        str(out),
        "--decisions",
        str(decisions),
    ]
    assert main(argv) == 0
    columns = ["node", "state", "verdict", "cause", "hard_gate", "confirmed", "taint", "runs", "summary", "settled"]
    offline = pd.read_parquet(decisions)[columns].reset_index(drop=True)
    recorded = pd.read_parquet(folder / "decisions.parquet")[columns].reset_index(drop=True)
    pd.testing.assert_frame_equal(offline, recorded, check_dtype=False)
    assert offline.loc[offline["node"] == sim.fleet.node_names[2], "state"].item() == "failed"
    settled = pd.read_parquet(out)
    stored = pd.read_parquet(folder / "verdicts.parquet")
    assert list(settled["verdict"]) == list(stored["verdict"])
