"""The driver a simulated benchmark pod reports is the one its node runs, so a driver change is seen.

The payload's stack record (``gpucert-stack: {…}``) carries NVML's driver version; certify re-seeds a
node's own baselines when that version changes (``stack_changed_nodes``). Here the simulated cluster
starts with configure's stack, a node is moved to another driver the way configure moves it (a new
driver variant DaemonSet, the node relabelled for it), and benchmark Jobs made by certify's own
functions must report each node's driver, before and after, until the baseline update resets exactly
the upgraded node. A node without any driver must report none, as NVML would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpucert.bench._stability import RepeatRule
from gpucert.certify import (
    BenchmarkSettings,
    benchmark_job,
    collect_results,
    ensure_payload,
    observe,
    payload_configmap,
    update_baselines,
)
from gpucert.certify._collect import CollectedResults
from gpucert.kube import Kube, RetryPolicy, connect
from gpucert.policy import default_policy
from gpucert.stack import (
    StackRequest,
    apply_manifests,
    desired_target_labels,
    load_matrix,
    node_info,
    plan_stack,
    render_stack,
)
from gpucert.store import open_store
from gpucert_sim import STACK_NAMESPACE, SimCluster
from gpucert_sim._benchlogs import _extra_repeat_lines, node_driver, rows_jsonl
from gpucert_sim.fleet import GPU_PERF_METRICS, Fault, Fleet, NoiseModel

from .conftest import eventually

PREFIX = "gpucert.io"
NEW_DRIVER = "570.211.01"
DRIVER_PODS = "app.kubernetes.io/part-of=gpucert,app.kubernetes.io/component=driver"
BENCHMARKS = (*GPU_PERF_METRICS, "nccl_allreduce_busbw_gbps")


def node(i: int) -> str:
    return f"gpu-node-{i:05d}"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=2, gpus=8, model="NVIDIA H200", seed=21, preconfigured=True) as cluster:
        yield cluster
        assert cluster.runtime is not None
        assert cluster.runtime.errors == []


@pytest.fixture(scope="module")
def kube(sim: SimCluster) -> Kube:
    return connect(sim.kubeconfig_path, retry=RetryPolicy(attempts=8, base_delay_s=0.001, max_delay_s=0.01))


def benchmark(kube: Kube, run_id: str, target: str) -> CollectedResults:
    """Run certify's benchmark Job for ``run_id`` on ``target`` and read its pod's log."""
    settings = BenchmarkSettings()
    payload = ensure_payload(kube, payload_configmap(settings))
    job = kube.create(benchmark_job(run_id, target, 8, payload=payload, settings=settings))
    name = job["metadata"]["name"]
    outcome = eventually(
        lambda: o if (o := observe(kube, settings.namespace, name, node=target)).finished else None, 10
    )
    assert (outcome.state, outcome.reason) == ("succeeded", None), outcome.message
    return collect_results(kube, outcome)


def driver_pods(kube: Kube, target: str) -> list[dict[str, Any]]:
    pods = kube.list_objects("v1", "Pod", STACK_NAMESPACE, label_selector=DRIVER_PODS)
    return [p for p in pods if p["spec"].get("nodeName") == target]


def running_image(kube: Kube, target: str) -> str | None:
    """The image of the one running, undeleted driver pod on ``target`` (None while there is not one)."""
    live = [
        p
        for p in driver_pods(kube, target)
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    return str(live[0]["spec"]["containers"][0]["image"]) if len(live) == 1 else None


def seeded_driver(kube: Kube) -> str:
    """The driver version of the stack the preconfigured cluster was seeded with (its one driver DaemonSet)."""
    [ds] = kube.list_objects("apps/v1", "DaemonSet", STACK_NAMESPACE, label_selector=DRIVER_PODS)
    return str(ds["metadata"]["labels"]["app.kubernetes.io/version"])


def upgrade_driver(kube: Kube, target: str, version: str) -> None:
    """Move ``target`` to driver ``version`` as configure does: its variant's DaemonSet applied, the node
    relabelled for it (the old variant's DaemonSet leaves the node, the new one's pod starts there)."""
    matrix = load_matrix()
    info = node_info(kube.get("v1", "Node", target), matrix.gpu_models)
    plan = plan_stack(
        [info], StackRequest(versions={"driver": version}), matrix, namespace=STACK_NAMESPACE, label_prefix=PREFIX
    )
    apply_manifests(kube, render_stack(plan))
    driver_label = f"{PREFIX}/driver"
    kube.label_node(target, {driver_label: desired_target_labels(plan)[target][driver_label]})


def test_a_preconfigured_node_reports_its_seeded_driver(sim: SimCluster, kube: Kube) -> None:
    seeded = seeded_driver(kube)
    assert seeded != "550.90.07"  # what every simulated node used to report, whatever it ran
    target = node(1)
    assert kube.get("v1", "Node", target)["metadata"]["labels"][f"{PREFIX}/stack.driver"] == seeded
    eventually(lambda: running_image(kube, target))
    collected = benchmark(kube, "seeded-1", target)
    assert collected.stack is not None
    assert collected.stack["driver"] == seeded
    # The CUDA version of the driver's branch, per the compatibility matrix (580: 13.0); a branch the matrix
    # knows by its major only (595: 13) is not guessed at, and the record has none.
    branch = load_matrix().drivers[seeded.partition(".")[0]]
    assert collected.stack.get("cuda_driver") == (branch.cuda if "." in branch.cuda else None)
    assert "error" not in set(collected.results["metric"].astype(str))


def test_a_driver_upgrade_shows_in_the_next_benchmark_and_resets_that_nodes_baseline(
    sim: SimCluster, kube: Kube, tmp_path: Path
) -> None:
    upgraded, other = node(0), node(1)
    seeded = seeded_driver(kube)
    for target in (upgraded, other):
        eventually(lambda t=target: running_image(kube, t))  # type: ignore[misc]
    store = open_store(tmp_path.as_uri())
    policy = default_policy()

    before = {n: benchmark(kube, "drv-1", n) for n in (upgraded, other)}
    stacks = {n: dict(c.stack or {}) for n, c in before.items()}
    assert {n: s["driver"] for n, s in stacks.items()} == {upgraded: seeded, other: seeded}
    results = pd.concat([c.results for c in before.values()], ignore_index=True)
    _, reset = update_baselines(store, results, stacks, policy, run_id="drv-1")
    assert reset == []

    upgrade_driver(kube, upgraded, NEW_DRIVER)
    eventually(lambda: (running_image(kube, upgraded) or "").endswith(f":{NEW_DRIVER}-ubuntu22.04"), 10)
    assert running_image(kube, other) == f"nvcr.io/nvidia/driver:{seeded}-ubuntu22.04"

    after = {n: benchmark(kube, "drv-2", n) for n in (upgraded, other)}
    stacks = {n: dict(c.stack or {}) for n, c in after.items()}
    assert {n: s["driver"] for n, s in stacks.items()} == {upgraded: NEW_DRIVER, other: seeded}
    assert stacks[upgraded]["cuda_driver"] == "12.8"
    results = pd.concat([c.results for c in after.values()], ignore_index=True)
    # The certify flow's re-seed: the upgraded node's own baselines are forgotten, the other's kept.
    _, reset = update_baselines(store, results, stacks, policy, run_id="drv-2")
    assert reset == [upgraded]


def test_a_node_whose_driver_is_gone_reports_none_and_only_error_rows(sim: SimCluster, kube: Kube) -> None:
    target, label = node(1), f"{PREFIX}/driver"
    variant = kube.get("v1", "Node", target)["metadata"]["labels"][label]
    # The GPUs stay advertised (the device plugin still runs), but no driver runs on the node any more.
    kube.label_node(target, {label: "none"})
    try:
        eventually(lambda: not driver_pods(kube, target), 10)
        collected = benchmark(kube, "nodrv-1", target)
    finally:
        kube.label_node(target, {label: variant})
    eventually(lambda: running_image(kube, target), 10)
    assert collected.stack is not None
    assert not {"driver", "cuda_driver", "vbios.0"} & set(collected.stack)
    assert collected.stack["gpu_model"] == "unknown"
    rows = collected.results
    assert set(rows["metric"].astype(str)) == {"error", "gpu_count_expected"}
    assert rows["gpu"].isna().all()
    assert (rows["metric"] == "error").sum() == 6  # telemetry, GEMM, HBM, H2D, D2H, all-reduce
    assert any("Driver Not Loaded" in message for message in collected.errors)


def test_node_driver_reads_the_running_driver_pod_else_a_host_driver() -> None:
    def pod(image: str, *, phase: str = "Running", created: str = "2026-01-01T00:00:00Z", **meta: Any) -> Any:
        labels = {"app.kubernetes.io/part-of": "gpucert", "app.kubernetes.io/component": "driver"}
        labels.update(meta.pop("labels", {}))
        return {
            "metadata": {"labels": labels, "creationTimestamp": created, **meta},
            "spec": {"containers": [{"image": image}]},
            "status": {"phase": phase},
        }

    assert node_driver(None, [pod("nvcr.io/nvidia/driver:580.126.20-ubuntu22.04")]) == "580.126.20"
    assert node_driver(None, [pod("registry:5000/driver:570.211.01-rhel9.6@sha256:ab")]) == "570.211.01"
    # An image whose tag names no version: the pod's version label.
    labelled = pod("mirror.example.com/driver:latest", labels={"app.kubernetes.io/version": "535.309.01"})
    assert node_driver(None, [labelled]) == "535.309.01"
    # Pending (pulling, or cannot pull), going away, or another component: no driver loaded.
    assert node_driver(None, [pod("nvcr.io/nvidia/driver:580.126.20-ubuntu22.04", phase="Pending")]) is None
    gone = pod("nvcr.io/nvidia/driver:580.126.20-ubuntu22.04", deletionTimestamp="2026-01-01T00:00:01Z")
    assert node_driver(None, [gone]) is None
    plugin = pod("nvcr.io/nvidia/k8s-device-plugin:v0.19.0", labels={"app.kubernetes.io/component": "x"})
    assert node_driver(None, [plugin]) is None
    # Two running during a change of variant: the newer one.
    old = pod("nvcr.io/nvidia/driver:580.126.20-ubuntu22.04", created="2026-01-01T00:00:00Z")
    new = pod("nvcr.io/nvidia/driver:580.159.03-ubuntu22.04", created="2026-01-02T00:00:00Z")
    assert node_driver(None, [new, old]) == "580.159.03"
    # A host driver, as GPU feature discovery publishes it on a pre-installed node.
    host = {
        "metadata": {
            "labels": {
                "nvidia.com/gpu.deploy.driver": "pre-installed",
                "nvidia.com/cuda.driver-version.full": "550.163.01",
            }
        }
    }
    assert node_driver(host, []) == "550.163.01"
    assert node_driver({"metadata": {"labels": {}}}, []) is None


def test_a_simulated_payload_measures_again_when_a_transient_unsettles_its_repeats(sim: SimCluster, kube: Kube) -> None:
    """The simulated payload does what the real one does: repeats that disagree get more, up to the max."""
    calm = sim.fleet
    # The same GPUs (same seed: same identities), with transient bad repeats far more often than usual.
    sim.fleet = Fleet.generate(
        nodes=2, gpus_per_node=8, model="NVIDIA H200", seed=21, noise=NoiseModel(transient_rate=0.4)
    )
    try:
        adaptive, log = benchmark_with_log(kube, "rep-1", node(0), BenchmarkSettings())
        capped, _ = benchmark_with_log(kube, "rep-2", node(0), BenchmarkSettings(payload_args=("--max-repeats=3",)))
    finally:
        sim.fleet = calm
    perf = adaptive.results[adaptive.results["metric"].isin(BENCHMARKS)]
    counts = perf.groupby(["gpu", "metric"], observed=True, dropna=False)["repeat"].agg(["size", "max"])
    assert (counts["max"] == counts["size"] - 1).all()  # repeats numbered 0..n-1
    rule = RepeatRule()
    metric = counts.index.get_level_values("metric").astype(str)
    base = np.array([rule.base(m) for m in metric])
    assert ((counts["size"] >= base) & (counts["size"] <= [rule.ceiling(m) for m in metric])).all()
    assert (counts["size"] == base).any()
    extended = counts[counts["size"] > base]
    assert len(extended)
    # The log says so, as the payload does, once per result measured again; the collector reads it clean.
    said = [line for line in log.splitlines() if "repeats disagree" in line]
    assert len(said) == len(extended)
    assert not adaptive.warnings
    # --max-repeats 3 (a payload argument of the Job): no more than three.
    capped_perf = capped.results[capped.results["metric"].isin(BENCHMARKS)]
    assert (capped_perf["repeat"] < capped_perf["metric"].map(lambda m: rule.base(str(m))).astype(int)).all()


def test_a_simulated_log_has_each_row_as_json_dumps_writes_it_and_the_payloads_lines_between() -> None:
    """The log the simulator writes for a pod (cell by cell, not a dict a row) is the payload's: each row
    the text ``json.dumps`` makes of its dict (missing cells null, the stamp in the payload's format), an
    error row after the payload's line naming where the step failed, a line per result measured again."""
    fleet = Fleet.generate(nodes=3, gpus_per_node=8, seed=5, noise=NoiseModel(transient_rate=0.4))
    node = fleet.node_names[1]
    ts = pd.Timestamp("2026-11-01T02:03:04.5", tz="UTC").to_pydatetime()
    rule = RepeatRule()
    wave = fleet.run(
        "log-1",
        ts=ts,
        seed=7,
        nodes=[node],
        faults=[Fault("uncontained_ecc", node, gpu=3)],
        nic=True,
        storage=True,
        wave_draws=True,
    )
    rows = wave.results
    lines = rows_jsonl(rows).splitlines()
    records = [line for line in lines if line.startswith("{")]
    expected = []
    for row in rows.astype(object).where(rows.notna(), None).to_dict("records"):
        row["ts"] = "2026-11-01T02:03:04.500000Z"
        expected.append(json.dumps(row))
    assert records == expected
    said = [line for line in lines if not line.startswith("{")]
    assert said == [
        "gpucert-bench: error: benchmark step on GPU 3: the device reported a fault",
        "gpucert-bench: error: benchmark step on node: the device reported a fault",
    ]
    assert lines.index(said[0]) + 1 == lines.index(next(r for r in records if '"error"' in r))
    assert rows_jsonl(rows, with_errors=False).splitlines() == expected
    # One line per (GPU, metric) measured beyond its base repeats, GPU by GPU, the node's own last.
    measured = rows.dropna(subset=["repeat"])
    counts = measured.groupby(["gpu", "metric"], observed=True, dropna=False)["repeat"].max()
    beyond = [(g, str(m)) for (g, m), top in counts.items() if top + 1 > rule.base(str(m))]
    repeat_lines = _extra_repeat_lines(rows, rule).splitlines()
    assert len(repeat_lines) == len(beyond) > 0
    named = [line.split(": ")[1] for line in repeat_lines]
    assert named == [("node" if pd.isna(g) else f"GPU {int(g)}") for g, _ in beyond]


def benchmark_with_log(
    kube: Kube, run_id: str, target: str, settings: BenchmarkSettings
) -> tuple[CollectedResults, str]:
    """Like :func:`benchmark`, with the Job's settings, and the pod's log as well."""
    payload = ensure_payload(kube, payload_configmap(settings))
    job = kube.create(benchmark_job(run_id, target, 8, payload=payload, settings=settings))
    name = job["metadata"]["name"]
    outcome = eventually(
        lambda: o if (o := observe(kube, settings.namespace, name, node=target)).finished else None, 10
    )
    assert (outcome.state, outcome.reason) == ("succeeded", None), outcome.message
    assert outcome.pod is not None
    return collect_results(kube, outcome), kube.pod_log(outcome.pod, outcome.namespace)
