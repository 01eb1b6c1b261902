"""The simulated kubelets and controllers, driven as gpucert drives a cluster: the official client over HTTP.

Two clusters serve the module: ``sim`` starts preconfigured (GPUs advertised, as if configure had run)
for scheduling and Jobs; ``bare`` starts without, for the device plugin and DaemonSets. Each test works
in its own namespace and on nodes of its own, so tests do not see each other's pods. The simulator's
internals are touched only to set up (injecting a GPU fault, a node joining) and, at the end, to check
that no controller hit an error.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client, watch

from gpucert.results import read_results
from gpucert_sim import (
    EXIT_CODE_ANNOTATION,
    IMAGE_PULL_ERROR_ANNOTATION,
    RUN_SECONDS_ANNOTATION,
    TERMINATED_REASON_ANNOTATION,
    UNPULLABLE_IMAGE,
    SimCluster,
    SimTiming,
)
from gpucert_sim.fleet import Fault

from .conftest import eventually

T = TypeVar("T")
NODES = 8
_UNCERTIFIED = "gpucert.io/uncertified"
_UNHEALTHY = "gpucert.io/unhealthy"
_GPUCERT_TOLERATIONS = [
    {"key": _UNCERTIFIED, "operator": "Exists", "effect": "NoSchedule"},
    {"key": _UNHEALTHY, "operator": "Exists", "effect": "NoSchedule"},
]


def node(i: int) -> str:
    return f"gpu-node-{i:05d}"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=NODES, gpus=8, model="NVIDIA H200", seed=3, preconfigured=True, controllers=True) as cluster:
        yield cluster
        assert cluster.runtime is not None
        assert cluster.runtime.errors == []


@pytest.fixture(scope="module")
def bare() -> Iterator[SimCluster]:
    with SimCluster(
        nodes=3, gpus=8, model="NVIDIA H200", seed=4, controllers=True, timing=SimTiming(pod_ready_s=0.2)
    ) as cluster:
        yield cluster
        assert cluster.runtime is not None
        assert cluster.runtime.errors == []


@pytest.fixture
def batch(api: client.ApiClient) -> client.BatchV1Api:
    return client.BatchV1Api(api)


def container(gpus: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "main", "image": "ghcr.io/gpucert/payload:0.1"}
    if gpus:
        spec["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    return spec


def pod(
    name: str,
    *,
    gpus: int = 0,
    hostname: str | None = None,
    hosts: list[str] | None = None,
    tolerations: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [container(gpus)]}
    if hostname:
        spec["nodeSelector"] = {"kubernetes.io/hostname": hostname}
    if hosts:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": hosts}]}
                    ]
                }
            }
        }
    if tolerations:
        spec["tolerations"] = tolerations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def bench_job(
    name: str,
    target: str,
    run_id: str,
    *,
    annotations: dict[str, str] | None = None,
    deadline_s: int = 600,
    ttl_s: int = 3600,
    gpus: int = 8,
) -> dict[str, Any]:
    """A benchmark Job as docs/reference/labels-taints-conditions.md shapes it."""
    labels = {"app.kubernetes.io/managed-by": "gpucert", "gpucert.io/run-id": run_id}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": deadline_s,
            "ttlSecondsAfterFinished": ttl_s,
            "template": {
                "metadata": {"labels": labels, "annotations": annotations or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"kubernetes.io/hostname": target},
                    "tolerations": _GPUCERT_TOLERATIONS,
                    "containers": [container(gpus)],
                },
            },
        },
    }


def finished(batch: client.BatchV1Api, ns: str, name: str, timeout_s: float = 5.0) -> client.V1Job:
    def probe() -> client.V1Job | None:
        job = batch.read_namespaced_job_status(name, ns)
        done = [c for c in job.status.conditions or () if c.type in ("Complete", "Failed") and c.status == "True"]
        return job if done else None

    return eventually(probe, timeout_s)


def job_pods(core: client.CoreV1Api, ns: str, job: str) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(ns, label_selector=f"job-name={job}").items)


def pod_phase(core: client.CoreV1Api, ns: str, name: str) -> str:
    return str(core.read_namespaced_pod_status(name, ns).status.phase)


def scheduled_condition(core: client.CoreV1Api, ns: str, name: str) -> client.V1PodCondition | None:
    conditions = core.read_namespaced_pod_status(name, ns).status.conditions or ()
    return next((c for c in conditions if c.type == "PodScheduled"), None)


def unschedulable(core: client.CoreV1Api, ns: str, name: str) -> client.V1PodCondition:
    def probe() -> client.V1PodCondition | None:
        cond = scheduled_condition(core, ns, name)
        return cond if cond is not None and cond.status == "False" else None

    cond = eventually(probe)
    assert cond.reason == "Unschedulable"
    return cond


# --- benchmark Jobs -----------------------------------------------------------------------------------


def test_benchmark_job_runs_on_its_node_and_logs_that_nodes_rows(
    sim: SimCluster, core: client.CoreV1Api, batch: client.BatchV1Api, ns: str, tmp_path: Path
) -> None:
    target = node(0)
    # A new node carries the uncertified taint: the benchmark's tolerations must let it through.
    core.patch_node(target, {"spec": {"taints": [{"key": _UNCERTIFIED, "effect": "NoSchedule"}]}})
    try:
        batch.create_namespaced_job(ns, bench_job("bench-0", target, "night-1"))
        job = finished(batch, ns, "bench-0")
    finally:
        core.patch_node(target, {"spec": {"taints": None}})
    assert [c.type for c in job.status.conditions] == ["SuccessCriteriaMet", "Complete"]
    assert job.status.succeeded == 1
    assert not job.status.active
    assert not job.status.failed
    assert job.status.start_time is not None
    assert job.status.completion_time is not None

    [p] = job_pods(core, ns, "bench-0")
    assert p.metadata.name.startswith("bench-0-")
    assert p.spec.node_name == target
    assert p.status.phase == "Succeeded"
    assert p.status.container_statuses[0].state.terminated.exit_code == 0
    assert p.status.start_time is not None
    assert p.status.pod_ip
    [ref] = p.metadata.owner_references
    assert (ref.kind, ref.name, ref.uid, ref.controller) == ("Job", "bench-0", job.metadata.uid, True)
    assert p.metadata.labels["controller-uid"] == job.metadata.uid
    assert p.metadata.labels["batch.kubernetes.io/job-name"] == "bench-0"

    log = core.read_namespaced_pod_log(p.metadata.name, ns)
    stack = next(line for line in log.splitlines() if line.startswith("gpucert-stack: "))
    assert json.loads(stack.removeprefix("gpucert-stack: "))["node"] == target
    path = tmp_path / "bench-0.jsonl"
    path.write_text(log, encoding="utf-8")
    rows = read_results(path)
    assert set(rows["node"].astype(str)) == {target}
    assert set(rows["run_id"].astype(str)) == {"night-1"}
    assert set(rows["gpu_model"].astype(str)) == {"NVIDIA H200"}
    index = sim.fleet.node_index[target]
    uuids = {str(u) for u in sim.fleet.uuids[index * 8 : (index + 1) * 8]}
    assert set(rows["gpu_uuid"].dropna().astype(str)) == uuids
    assert "error" not in set(rows["metric"].astype(str))
    assert {"gemm_bf16_tflops"} <= set(rows["metric"].astype(str))


def test_an_injected_gpu_fault_shows_in_the_rows_and_the_pod_still_succeeds(
    sim: SimCluster, core: client.CoreV1Api, batch: client.BatchV1Api, ns: str, tmp_path: Path
) -> None:
    target = node(1)
    sim.inject_fault(Fault("uncontained_ecc", target, gpu=2))
    try:
        batch.create_namespaced_job(ns, bench_job("bench-1", target, "night-2"))
        job = finished(batch, ns, "bench-1")
    finally:
        assert sim.clear_faults(target) == 1
    # The payload exits 0 with error rows for a crashed GPU: the Job completes, the rows tell.
    assert job.status.succeeded == 1
    [p] = job_pods(core, ns, "bench-1")
    path = tmp_path / "bench-1.jsonl"
    path.write_text(core.read_namespaced_pod_log(p.metadata.name, ns), encoding="utf-8")
    rows = read_results(path)
    errors = rows[rows["metric"].astype(str) == "error"]
    assert len(errors) >= 1
    assert set(errors["gpu"].dropna().astype(int)) == {2}


# --- scheduling ---------------------------------------------------------------------------------------


def test_a_pod_asking_for_gpus_held_by_another_stays_pending(core: client.CoreV1Api, ns: str) -> None:
    target = node(2)
    core.create_namespaced_pod(ns, pod("holder", gpus=4, hostname=target))
    eventually(lambda: pod_phase(core, ns, "holder") == "Running")
    core.create_namespaced_pod(ns, pod("whole-node", gpus=8, hostname=target))
    cond = unschedulable(core, ns, "whole-node")
    assert cond.message.startswith(f"0/{NODES} nodes are available: ")
    assert "1 Insufficient nvidia.com/gpu" in cond.message
    assert pod_phase(core, ns, "whole-node") == "Pending"
    assert core.read_namespaced_pod("whole-node", ns).spec.node_name is None
    events = core.list_namespaced_event(ns, field_selector="reason=FailedScheduling").items
    assert [e.involved_object.name for e in events] == ["whole-node"]
    assert events[0].type == "Warning"
    # The GPUs come free: the waiting pod is scheduled without being touched.
    core.delete_namespaced_pod("holder", ns)
    eventually(lambda: pod_phase(core, ns, "whole-node") == "Running")
    assert core.read_namespaced_pod("whole-node", ns).spec.node_name == target


def test_a_tainted_node_is_skipped_without_a_toleration(core: client.CoreV1Api, ns: str) -> None:
    tainted, clean = node(3), node(4)
    core.patch_node(tainted, {"spec": {"taints": [{"key": _UNHEALTHY, "value": "pcie", "effect": "NoSchedule"}]}})
    try:
        core.create_namespaced_pod(ns, pod("either", gpus=8, hosts=[tainted, clean]))
        eventually(lambda: pod_phase(core, ns, "either") == "Running")
        assert core.read_namespaced_pod("either", ns).spec.node_name == clean
        core.create_namespaced_pod(ns, pod("only-tainted", hostname=tainted))
        cond = unschedulable(core, ns, "only-tainted")
        assert f"1 node(s) had untolerated taint {{{_UNHEALTHY}: pcie}}" in cond.message
        # An Equal toleration of another value does not help; the matching one does.
        core.create_namespaced_pod(
            ns,
            pod(
                "wrong-value",
                hostname=tainted,
                tolerations=[{"key": _UNHEALTHY, "operator": "Equal", "value": "xid", "effect": "NoSchedule"}],
            ),
        )
        unschedulable(core, ns, "wrong-value")
        core.create_namespaced_pod(
            ns,
            pod(
                "tolerant",
                hostname=tainted,
                tolerations=[{"key": _UNHEALTHY, "operator": "Equal", "value": "pcie", "effect": "NoSchedule"}],
            ),
        )
        eventually(lambda: pod_phase(core, ns, "tolerant") == "Running")
    finally:
        core.patch_node(tainted, {"spec": {"taints": None}})


def test_a_cordoned_node_is_skipped_until_uncordoned(core: client.CoreV1Api, ns: str) -> None:
    target = node(5)
    core.patch_node(target, {"spec": {"unschedulable": True}})
    try:
        core.create_namespaced_pod(ns, pod("waits", hostname=target))
        cond = unschedulable(core, ns, "waits")
        assert "1 node(s) were unschedulable" in cond.message
    finally:
        core.patch_node(target, {"spec": {"unschedulable": None}})
    eventually(lambda: pod_phase(core, ns, "waits") == "Running")
    running = core.read_namespaced_pod_status("waits", ns).status
    assert running.container_statuses[0].ready is True
    assert {c.type: c.status for c in running.conditions}["Ready"] == "True"


# --- Job failure, deadline and clean-up ---------------------------------------------------------------


def test_a_failed_pod_fails_a_job_with_backoff_limit_0(
    core: client.CoreV1Api, batch: client.BatchV1Api, ns: str
) -> None:
    batch.create_namespaced_job(
        ns, bench_job("crash", node(6), "night-3", gpus=0, annotations={EXIT_CODE_ANNOTATION: "1"})
    )
    job = finished(batch, ns, "crash")
    target, cond = job.status.conditions  # as the real controller: the target reached, then the outcome
    assert (target.type, target.reason) == ("FailureTarget", cond.reason)
    assert (cond.type, cond.reason) == ("Failed", "BackoffLimitExceeded")
    assert job.status.failed == 1
    assert not job.status.succeeded
    [p] = job_pods(core, ns, "crash")  # no second try with backoffLimit 0
    assert p.status.phase == "Failed"
    assert p.status.container_statuses[0].state.terminated.exit_code == 1


def test_a_job_past_its_deadline_fails_and_its_pod_goes(
    core: client.CoreV1Api, batch: client.BatchV1Api, ns: str
) -> None:
    batch.create_namespaced_job(
        ns, bench_job("slow", node(6), "night-4", gpus=0, deadline_s=1, annotations={RUN_SECONDS_ANNOTATION: "60"})
    )
    eventually(lambda: [p for p in job_pods(core, ns, "slow") if p.status.phase == "Running"])
    started = time.monotonic()
    job = finished(batch, ns, "slow")
    assert 0.5 <= time.monotonic() - started < 3
    target, cond = job.status.conditions  # as the real controller: the target reached, then the outcome
    assert (target.type, target.reason) == ("FailureTarget", cond.reason)
    assert (cond.type, cond.reason) == ("Failed", "DeadlineExceeded")
    assert cond.message == "Job was active longer than specified deadline"
    assert not job.status.active
    assert job_pods(core, ns, "slow") == []


def test_ttl_after_finished_deletes_the_job_and_its_pods(
    core: client.CoreV1Api, batch: client.BatchV1Api, ns: str
) -> None:
    start = core.list_namespaced_pod(ns).metadata.resource_version
    batch.create_namespaced_job(ns, bench_job("brief", node(7), "night-5", ttl_s=0))
    seen: list[tuple[str, list[str]]] = []
    for event in watch.Watch().stream(
        client.BatchV1Api(core.api_client).list_namespaced_job, ns, resource_version=start, timeout_seconds=5
    ):
        conditions = [c.type for c in event["object"].status.conditions or ()]
        seen.append((event["type"], conditions))
        if event["type"] == "DELETED":
            break
    assert seen[0] == ("ADDED", [])
    assert ("MODIFIED", ["SuccessCriteriaMet", "Complete"]) in seen
    assert seen[-1][0] == "DELETED"
    eventually(lambda: job_pods(core, ns, "brief") == [])


def test_an_oom_killed_container_fails_its_pod_with_reason_oomkilled(
    core: client.CoreV1Api, batch: client.BatchV1Api, ns: str
) -> None:
    annotations = {EXIT_CODE_ANNOTATION: "137", TERMINATED_REASON_ANNOTATION: "OOMKilled"}
    batch.create_namespaced_job(ns, bench_job("oom", node(6), "night-6", gpus=0, annotations=annotations))
    job = finished(batch, ns, "oom")
    target, cond = job.status.conditions  # as the real controller: the target reached, then the outcome
    assert (target.type, target.reason) == ("FailureTarget", cond.reason)
    assert (cond.type, cond.reason) == ("Failed", "BackoffLimitExceeded")
    [p] = job_pods(core, ns, "oom")
    assert p.status.phase == "Failed"
    ended = p.status.container_statuses[0].state.terminated
    assert (ended.exit_code, ended.reason) == (137, "OOMKilled")
    # Without the annotation a non-zero exit reads "Error", as before.
    batch.create_namespaced_job(
        ns, bench_job("kill", node(6), "night-6", gpus=0, annotations={EXIT_CODE_ANNOTATION: "137"})
    )
    finished(batch, ns, "kill")
    [k] = job_pods(core, ns, "kill")
    assert k.status.container_statuses[0].state.terminated.reason == "Error"


def waiting_reason(core: client.CoreV1Api, ns: str, job: str) -> tuple[client.V1Pod, str]:
    def probe() -> tuple[client.V1Pod, str] | None:
        for p in job_pods(core, ns, job):
            for cs in p.status.container_statuses or ():
                if cs.state.waiting is not None:
                    return p, str(cs.state.waiting.reason)
        return None

    return eventually(probe)


def test_an_image_that_cannot_be_pulled_keeps_the_pod_pending_until_the_deadline(
    core: client.CoreV1Api, batch: client.BatchV1Api, ns: str
) -> None:
    manifest = bench_job("no-image", node(5), "night-7", gpus=8, deadline_s=1)
    [c] = manifest["spec"]["template"]["spec"]["containers"]
    c["image"] = f"registry.example.com/{UNPULLABLE_IMAGE}:1"
    batch.create_namespaced_job(ns, manifest)
    p, reason = waiting_reason(core, ns, "no-image")
    assert reason == "ErrImagePull"
    assert p.status.phase == "Pending"
    assert p.spec.node_name == node(5)  # bound: its GPUs are held, as on a real node
    [cs] = p.status.container_statuses
    assert UNPULLABLE_IMAGE in cs.state.waiting.message
    assert cs.ready is False
    assert cs.image_id == ""
    conditions = {c.type: c.status for c in p.status.conditions}
    assert conditions["PodScheduled"] == conditions["Initialized"] == "True"
    assert conditions["Ready"] == "False"
    time.sleep(0.2)
    assert pod_phase(core, ns, p.metadata.name) == "Pending"  # it never starts on its own
    job = finished(batch, ns, "no-image")
    target, cond = job.status.conditions  # as the real controller: the target reached, then the outcome
    assert (target.type, target.reason) == ("FailureTarget", cond.reason)
    assert (cond.type, cond.reason) == ("Failed", "DeadlineExceeded")
    assert job_pods(core, ns, "no-image") == []


def test_an_image_pull_error_can_be_asked_for_by_annotation(
    core: client.CoreV1Api, batch: client.BatchV1Api, ns: str
) -> None:
    batch.create_namespaced_job(
        ns,
        bench_job("backoff", node(6), "night-8", gpus=0, annotations={IMAGE_PULL_ERROR_ANNOTATION: "ImagePullBackOff"}),
    )
    batch.create_namespaced_job(
        ns, bench_job("bad-ref", node(6), "night-8", gpus=0, annotations={IMAGE_PULL_ERROR_ANNOTATION: "yes"})
    )
    assert waiting_reason(core, ns, "backoff")[1] == "ImagePullBackOff"
    assert waiting_reason(core, ns, "bad-ref")[1] == "ErrImagePull"
    batch.delete_namespaced_job("backoff", ns, propagation_policy="Background")
    batch.delete_namespaced_job("bad-ref", ns, propagation_policy="Background")
    eventually(lambda: job_pods(core, ns, "backoff") == job_pods(core, ns, "bad-ref") == [])


# --- DaemonSets and the device plugin -----------------------------------------------------------------


def daemonset(
    name: str,
    *,
    image: str = "nvcr.io/nvidia/k8s-device-plugin:v0.16.2",
    component: str = "device-plugin",
    node_selector: dict[str, str] | None = None,
) -> dict[str, Any]:
    labels = {"app.kubernetes.io/part-of": "gpucert", "app.kubernetes.io/component": component}
    spec: dict[str, Any] = {
        "containers": [{"name": component, "image": image}],
        "tolerations": [{"key": "gpucert.io", "operator": "Exists"}, *_GPUCERT_TOLERATIONS],
    }
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def rolled_out(apps: client.AppsV1Api, ns: str, name: str, nodes: int) -> client.V1DaemonSet:
    def probe() -> client.V1DaemonSet | None:
        ds = apps.read_namespaced_daemon_set_status(name, ns)
        s = ds.status
        done = (
            s.observed_generation == ds.metadata.generation
            and s.desired_number_scheduled == nodes
            and s.current_number_scheduled
            == s.number_ready
            == s.number_available
            == s.updated_number_scheduled
            == nodes
        )
        return ds if done else None

    return eventually(probe)


def test_device_plugin_daemonset_rolls_out_and_nodes_advertise_gpus(bare: SimCluster) -> None:
    api = bare.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    core.create_namespace({"metadata": {"name": "gpu-stack"}})
    core.create_namespace({"metadata": {"name": "bench"}})
    names = [n.metadata.name for n in core.list_node().items]
    assert all("nvidia.com/gpu" not in n.status.allocatable for n in core.list_node().items)

    # Before the device plugin, no node has GPUs to give: a GPU pod waits.
    core.create_namespaced_pod("bench", pod("early", gpus=8, hostname=names[0]))
    assert "1 Insufficient nvidia.com/gpu" in unschedulable(core, "bench", "early").message

    nodes_rv = core.list_node().metadata.resource_version
    started = time.monotonic()
    apps.create_namespaced_daemon_set("gpu-stack", daemonset("nvidia-device-plugin"))
    ds = rolled_out(apps, "gpu-stack", "nvidia-device-plugin", len(names))
    assert time.monotonic() - started >= 0.2  # each node's pod takes pod_ready_s to get Ready
    assert ds.status.number_misscheduled == 0
    assert ds.status.number_unavailable is None
    pods = core.list_namespaced_pod("gpu-stack").items
    assert sorted(p.spec.node_name for p in pods) == sorted(names)
    assert {p.status.phase for p in pods} == {"Running"}  # a DaemonSet pod runs until deleted

    advertised: set[str] = set()
    for event in watch.Watch().stream(core.list_node, resource_version=nodes_rv, timeout_seconds=5):
        if event["type"] == "MODIFIED" and (event["object"].status.allocatable or {}).get("nvidia.com/gpu") == "8":
            advertised.add(event["object"].metadata.name)
            if advertised == set(names):
                break
    assert advertised == set(names)
    assert {n.status.capacity["nvidia.com/gpu"] for n in core.list_node().items} == {"8"}
    eventually(lambda: pod_phase(core, "bench", "early") == "Running")

    # A template change is a new generation, rolled to every node.
    ds.spec.template.spec.containers[0].image = "nvcr.io/nvidia/k8s-device-plugin:v0.17.0"
    apps.replace_namespaced_daemon_set("nvidia-device-plugin", "gpu-stack", ds)
    ds = rolled_out(apps, "gpu-stack", "nvidia-device-plugin", len(names))
    assert ds.metadata.generation == 2
    assert ds.status.observed_generation == 2
    pods = core.list_namespaced_pod("gpu-stack").items
    assert len(pods) == len(names)
    assert {p.spec.containers[0].image for p in pods} == {"nvcr.io/nvidia/k8s-device-plugin:v0.17.0"}
    assert {p.metadata.labels["pod-template-generation"] for p in pods} == {"2"}

    # A node joins, tainted uncertified: the stack's tolerations put a pod there, and it gets GPUs.
    [joined] = bare.add_nodes(1, uncertified_taint=_UNCERTIFIED)
    ds = rolled_out(apps, "gpu-stack", "nvidia-device-plugin", len(names) + 1)
    assert joined in {p.spec.node_name for p in core.list_namespaced_pod("gpu-stack").items}
    eventually(lambda: core.read_node(joined).status.allocatable.get("nvidia.com/gpu") == "8")


def test_a_daemonset_skips_nodes_its_selector_or_tolerations_exclude(bare: SimCluster) -> None:
    api = bare.api_client()
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    core.create_namespace({"metadata": {"name": "picky"}})
    names = sorted(n.metadata.name for n in core.list_node().items)
    core.patch_node(names[0], {"metadata": {"labels": {"gpucert.io/exporter": "yes"}}})
    core.patch_node(
        names[1],
        {
            "metadata": {"labels": {"gpucert.io/exporter": "yes"}},
            "spec": {"taints": [{"key": "example.com/private", "effect": "NoExecute"}]},
        },
    )
    try:
        apps.create_namespaced_daemon_set(
            "picky", daemonset("exporter", component="dcgm-exporter", node_selector={"gpucert.io/exporter": "yes"})
        )
        rolled_out(apps, "picky", "exporter", 1)
        assert [p.spec.node_name for p in core.list_namespaced_pod("picky").items] == [names[0]]
        # Labelling another node brings the DaemonSet there.
        core.patch_node(names[2], {"metadata": {"labels": {"gpucert.io/exporter": "yes"}}})
        rolled_out(apps, "picky", "exporter", 2)
    finally:
        core.patch_node(names[1], {"spec": {"taints": None}})
        core.delete_namespace("picky")


def test_a_preconfigured_cluster_runs_the_whole_stack_on_every_gpu_node() -> None:
    """As if configure had run: the stack's DaemonSets (docs/reference/labels-taints-conditions.md, "GPU stack
    (configure)") roll out everywhere."""
    with SimCluster(nodes=4, gpus=8, preconfigured=True) as sim:
        apps = client.AppsV1Api(sim.api_client())
        core = client.CoreV1Api(sim.api_client())
        components = {"driver", "container-toolkit", "device-plugin", "dcgm-exporter", "gpu-feature-discovery"}

        def rolled_out() -> list[Any] | None:
            sets = apps.list_namespaced_daemon_set(
                "gpucert-system", label_selector="app.kubernetes.io/part-of=gpucert"
            ).items
            done = [d for d in sets if (d.status.number_ready or 0) == 4]
            return sets if len(done) == len(components) else None

        sets = eventually(rolled_out)
        assert {d.metadata.labels["app.kubernetes.io/component"] for d in sets} == components
        for node in core.list_node().items:
            assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert sim.runtime is not None
        assert sim.runtime.errors == []


def test_a_node_gone_not_ready_keeps_its_daemonset_pods_but_gets_no_new_ones() -> None:
    """The real controller leaves a pod on a node whose NoSchedule taints appeared after it (not-ready);
    only a new pod needs them tolerated."""
    with SimCluster(nodes=2, gpus=8) as sim:
        apps = client.AppsV1Api(sim.api_client())
        core = client.CoreV1Api(sim.api_client())
        core.create_namespace({"metadata": {"name": "stay"}})
        apps.create_namespaced_daemon_set("stay", daemonset("early"))
        rolled_out(apps, "stay", "early", 2)
        down = sim.fleet.node_names[1]
        sim.set_node_ready(down, False)
        apps.create_namespaced_daemon_set("stay", daemonset("late", component="dcgm-exporter"))
        eventually(lambda: (apps.read_namespaced_daemon_set_status("late", "stay").status.number_ready or 0) == 1)
        pods = core.list_namespaced_pod("stay").items
        assert sorted((p.metadata.name.rsplit("-", 1)[0], p.spec.node_name) for p in pods) == sorted(
            [("early", sim.fleet.node_names[0]), ("early", down), ("late", sim.fleet.node_names[0])]
        )
