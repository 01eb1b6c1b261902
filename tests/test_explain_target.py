"""Finding the job to explain: its pods, nodes, GPUs and window, against ``gpucert sim`` over HTTP and against a
real control plane whose nodes are the simulator's kubelets (``tests/realcluster.py``), one body for both.

Neither server here serves the training operators' custom resources (``sim/gpucert_sim/_resources.py`` has no
CRDs), so a JobSet's and a PyTorchJob's pods are created as the JobSet and training-operator controllers would
create them: pods with their controller's labels. That is all :func:`resolve_target` reads (never the custom
object), so the path is the production one. A batch/v1 Job goes through the simulated Job controller.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
import pytest
from kubernetes import client

from gpucert.errors import InputError
from gpucert.explain import JobTarget, TargetPod, assign_gpus, holders_at, parse_job, parse_moment, resolve_target
from gpucert.kube import Kube

from .conftest import eventually
from .realcluster import SERVERS, open_cluster

NODES = 6


@pytest.fixture(scope="module", params=SERVERS)
def sim(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The simulator, and a real control plane with the simulator's kubelets (issue 29): one body, two servers."""
    with open_cluster(request.param, nodes=NODES, gpus=8, preconfigured=True, seed=5) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kube(sim: Any) -> Kube:
    return Kube(sim.api_client())


def gpu_pod(name: str, labels: dict[str, str], gpus: int = 8) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "restartPolicy": "Always",
            "containers": [
                {
                    "name": "train",
                    "image": "ghcr.io/example/train:1",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                }
            ],
        },
    }


def running(core: client.CoreV1Api, ns: str, selector: str, count: int) -> list[Any]:
    def probe() -> list[Any] | None:
        pods = core.list_namespaced_pod(ns, label_selector=selector).items
        ok = len(pods) == count and all(p.status.phase == "Running" and p.status.start_time for p in pods)
        return pods if ok else None

    return eventually(probe, timeout_s=10)


def test_a_job_is_found_by_its_controller_uid_with_its_nodes_and_window(
    kube: Kube, core: client.CoreV1Api, api: client.ApiClient, ns: str
) -> None:
    batch = client.BatchV1Api(api)
    template = gpu_pod("x", {"app": "pretrain"})
    template["spec"]["restartPolicy"] = "Never"
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "pretrain"},
        "spec": {
            "parallelism": 3,
            "completions": 3,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": {"app": "pretrain"}, "annotations": {"sim.gpucert.io/run-seconds": "600"}},
                "spec": template["spec"],
            },
        },
    }
    batch.create_namespaced_job(ns, job)
    pods = running(core, ns, "app=pretrain", 3)
    target = resolve_target(kube, f"{ns}/pretrain")
    assert (target.job, target.kind, target.namespace) == (f"{ns}/pretrain", "Job", ns)
    uid = batch.read_namespaced_job("pretrain", ns).metadata.uid
    assert target.selector == f"batch.kubernetes.io/controller-uid={uid}"
    assert sorted(p.name for p in target.pods) == sorted(p.metadata.name for p in pods)
    # One pod per node (each asks for all 8 GPUs), so the device plugin gave each all of its node's GPUs.
    assert len(target.nodes) == 3
    assert all(p.gpus == 8 and p.node_gpus == 8 and p.holds_node for p in target.pods)
    earliest = min(pd.Timestamp(p.status.start_time) for p in pods)
    assert target.window[0] == earliest
    # Still running: the window ends now.
    assert abs((target.window[1] - pd.Timestamp.now(tz=UTC)).total_seconds()) < 5


def test_a_jobset_and_a_pytorchjob_are_found_by_their_controllers_pod_labels(
    kube: Kube, core: client.CoreV1Api, ns: str
) -> None:
    for i in range(2):
        core.create_namespaced_pod(
            ns,
            gpu_pod(
                f"js-w-0-{i}", {"jobset.sigs.k8s.io/jobset-name": "llama", "jobset.sigs.k8s.io/replicatedjob-name": "w"}
            ),
        )
    kubeflow = {
        "training.kubeflow.org/job-name": "bert",
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-type": "worker",
    }
    core.create_namespaced_pod(ns, gpu_pod("bert-worker-0", kubeflow))
    running(core, ns, "jobset.sigs.k8s.io/jobset-name=llama", 2)
    running(core, ns, "training.kubeflow.org/job-name=bert", 1)
    jobset = resolve_target(kube, f"{ns}/llama")
    assert (jobset.kind, sorted(p.name for p in jobset.pods)) == ("JobSet", ["js-w-0-0", "js-w-0-1"])
    assert jobset.selector == "jobset.sigs.k8s.io/jobset-name=llama"
    pytorch = resolve_target(kube, f"{ns}/bert")
    assert (pytorch.kind, [p.name for p in pytorch.pods]) == ("PyTorchJob", ["bert-worker-0"])


def test_a_selector_takes_any_pods_in_one_namespace_or_all(kube: Kube, core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, gpu_pod("a-0", {"team": "vision"}, gpus=4))
    core.create_namespaced_pod(ns, gpu_pod("a-1", {"team": "vision"}, gpus=4))
    running(core, ns, "team=vision", 2)
    target = resolve_target(kube, ns, selector="team=vision")
    assert (target.kind, target.namespace, target.job) == ("pods", ns, "selector team=vision")
    assert sorted(p.name for p in target.pods) == ["a-0", "a-1"]
    # Half a node each: not the whole node, so the device plugin's fallback cannot tell which GPUs.
    assert not any(p.holds_node for p in target.pods)
    everywhere = resolve_target(kube, None, selector="team=vision")
    assert everywhere.namespace is None
    assert len(everywhere.pods) == 2
    with pytest.raises(InputError, match="no pods match the selector 'team=nobody'"):
        resolve_target(kube, ns, selector="team=nobody")
    with pytest.raises(InputError, match="is not a requirement"):
        resolve_target(kube, ns, selector="team in vision")


def test_an_unknown_job_and_bad_names_are_one_line_input_errors(kube: Kube, ns: str) -> None:
    with pytest.raises(InputError, match=f"unknown job {ns}/ghost: no Job of that name"):
        resolve_target(kube, f"{ns}/ghost")
    for bad in ("no-slash", "/x", "Team/x", f"{ns}/a/b"):
        with pytest.raises(InputError, match="job"):
            parse_job(bad)
    with pytest.raises(InputError, match="NAMESPACE/NAME"):
        resolve_target(kube, None)


def test_the_window_given_as_times_or_durations_and_an_empty_one_refused(
    kube: Kube, core: client.CoreV1Api, ns: str
) -> None:
    core.create_namespaced_pod(ns, gpu_pod("w-0", {"training.kubeflow.org/job-name": "win"}))
    running(core, ns, "training.kubeflow.org/job-name=win", 1)
    now = datetime.now(UTC)
    target = resolve_target(kube, f"{ns}/win", since="2h", until="30m", now=now)
    assert target.window == (pd.Timestamp(now - timedelta(hours=2)), pd.Timestamp(now - timedelta(minutes=30)))
    # No zone is UTC; a zone is honoured.
    given = resolve_target(kube, f"{ns}/win", since="2026-01-01T10:00:00", until="2026-01-01T11:30:00+01:00", now=now)
    assert given.window == (pd.Timestamp("2026-01-01T10:00:00Z"), pd.Timestamp("2026-01-01T10:30:00Z"))
    with pytest.raises(InputError, match="is empty"):
        resolve_target(kube, f"{ns}/win", since="2026-01-01T10:00:00", until="2026-01-01T11:00:00+01:00", now=now)
    with pytest.raises(InputError, match="--since 'yesterday'"):
        resolve_target(kube, f"{ns}/win", since="yesterday", now=now)
    assert parse_moment("1.5h", now=now) == pd.Timestamp(now - timedelta(minutes=90))
    assert parse_moment("2026-03-01 12:00", now=now) == pd.Timestamp("2026-03-01T12:00:00Z")


def test_a_finished_jobs_window_ends_with_its_last_container(
    kube: Kube, core: client.CoreV1Api, api: client.ApiClient, ns: str
) -> None:
    batch = client.BatchV1Api(api)
    spec = gpu_pod("x", {})["spec"]
    spec["restartPolicy"] = "Never"
    batch.create_namespaced_job(
        ns,
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": "short"},
            "spec": {
                "backoffLimit": 0,
                "template": {"metadata": {"annotations": {"sim.gpucert.io/run-seconds": "1.5"}}, "spec": spec},
            },
        },
    )

    def done() -> Any:
        pods = core.list_namespaced_pod(ns, label_selector="job-name=short").items
        return pods if pods and all(p.status.phase == "Succeeded" for p in pods) else None

    [pod] = eventually(done, timeout_s=10)
    time.sleep(0.2)
    target = resolve_target(kube, f"{ns}/short")
    finished = pd.Timestamp(pod.status.container_statuses[0].state.terminated.finished_at)
    assert target.window == (pd.Timestamp(pod.status.start_time), finished)


# --- which GPUs each pod holds (pure: the labels are what dcgm-exporter writes) ----------------------


def _pod(name: str, node: str, gpus: int, started: str) -> TargetPod:
    return TargetPod(
        namespace="ml",
        name=name,
        uid=name,
        node=node,
        phase="Running",
        reason="",
        gpus=gpus,
        node_gpus=8,
        started=pd.Timestamp(started),
        ended=None,
    )


def test_gpus_come_from_dcgm_pod_labels_else_the_device_plugins_allocation() -> None:
    pods = (
        _pod("w-0", "n0", 8, "2026-01-01T00:00Z"),
        _pod("w-1", "n1", 8, "2026-01-01T00:00Z"),
        _pod("w-1b", "n1", 8, "2026-01-01T02:00Z"),
        _pod("half", "n2", 4, "2026-01-01T00:00Z"),
    )
    window = (pd.Timestamp("2026-01-01T00:00Z"), pd.Timestamp("2026-01-01T06:00Z"))
    target = JobTarget(job="ml/j", kind="Job", namespace="ml", selector="", pods=pods, window=window)
    labels = [
        ("n0", 0, {"pod": "w-0", "namespace": "ml", "container": "train"}),  # Kubernetes mode on n0
        ("n0", 1, {}),  # a GPU the job does not hold
        ("n1", 0, {}),
        ("n1", 1, {}),  # no pod labels on n1
        ("n2", 0, {}),
    ]
    whole, notes = assign_gpus(target, labels)
    assert set(whole) == {"n1"}  # n0 is told by its labels; n2's pod asked for half of it
    assert [p.name for p in whole["n1"]] == ["w-1", "w-1b"]
    moments = np.array([pd.Timestamp(t).timestamp() for t in ("2026-01-01T01:00Z", "2026-01-01T03:00Z")])
    assert [whole["n1"][i].name for i in holders_at(whole["n1"], moments)] == ["w-1", "w-1b"]
    [note] = notes
    assert "which GPUs 1 pod(s) hold is unknown" in note
    assert "half" in note
    _, silent = assign_gpus(target, labels[:2])
    assert any("no DCGM series in Prometheus for 2 node(s)" in n for n in silent)
