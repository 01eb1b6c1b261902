"""gpucert.stack's cluster-facing steps on their own: inventory, targeting labels, readiness per node,
version records, drift, and the clock of ``wait_until``."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest

from gpucert.errors import InputError, StackNotReady
from gpucert.kube import Kube, connect
from gpucert.stack import (
    Drift,
    NodeInfo,
    StackRequest,
    apply_manifests,
    component_targets,
    desired_target_labels,
    find_drift,
    label_nodes,
    load_matrix,
    node_info,
    not_ready_nodes,
    observed_versions,
    pick_targets,
    plan_stack,
    prune_driver_variants,
    render_stack,
    take_inventory,
    wait_until,
)
from gpucert_sim import SimCluster

NS = "gpucert-system"


def _node(labels: dict[str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": "n1", "labels": labels},
        "status": {
            "conditions": [{"type": "Ready", "status": "False"}],
            "nodeInfo": {
                "kernelVersion": "6.8.0",
                "osImage": "Ubuntu 24.04.1 LTS",
                "containerRuntimeVersion": "containerd://2.0.0",
                "kubeletVersion": "v1.33.1",
            },
        },
    }


def test_node_info_reads_the_product_label_against_known_models() -> None:
    models = load_matrix().gpu_models
    info = node_info(_node({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8"}), models)
    assert info.gpu_model == "NVIDIA A100-SXM4-80GB"  # the dash that was a dash stays one
    assert info.gpu_count == 8
    assert info.ready is False
    assert (info.os_image, info.kubelet_version) == ("Ubuntu 24.04.1 LTS", "v1.33.1")
    unknown = node_info(_node({"nvidia.com/gpu.product": "Acme-X1"}), models)
    assert unknown.gpu_model == "Acme X1"
    assert node_info(_node({"nvidia.com/gpu.count": "eight"}), models).gpu_count is None


@pytest.mark.parametrize(
    ("labels", "driver"),
    [
        ({}, None),
        ({"nvidia.com/gpu.deploy.driver": "false"}, None),
        (
            {"nvidia.com/gpu.deploy.driver": "pre-installed", "nvidia.com/cuda.driver-version.full": "570.195.03"},
            "570.195.03",
        ),
        (
            {
                "nvidia.com/gpu.deploy.driver": "pre-installed",
                "nvidia.com/cuda.driver.major": "550",
                "nvidia.com/cuda.driver.minor": "163",
                "nvidia.com/cuda.driver.rev": "01",
            },
            "550.163.01",
        ),
        ({"nvidia.com/gpu.deploy.driver": "pre-installed"}, ""),  # a host driver of unknown version
    ],
)
def test_node_info_finds_a_host_driver(labels: dict[str, str], driver: str | None) -> None:
    assert node_info(_node(labels)).host_driver == driver


def test_a_host_driver_of_unknown_version_is_refused_by_the_planner() -> None:
    info = node_info(
        _node({"nvidia.com/gpu.product": "NVIDIA-H200", "nvidia.com/gpu.deploy.driver": "pre-installed"}),
        load_matrix().gpu_models,
    )
    with pytest.raises(InputError, match="n1"):
        plan_stack([info], StackRequest(), load_matrix(), namespace=NS)


def test_pick_targets_names_what_is_not_a_gpu_node() -> None:
    infos = [
        NodeInfo(
            name=n,
            gpu_model="NVIDIA H200",
            gpu_count=8,
            kernel="",
            os_image="",
            container_runtime="",
            kubelet_version="",
        )
        for n in ("a", "b")
    ]
    assert [i.name for i in pick_targets(infos, None)] == ["a", "b"]
    assert [i.name for i in pick_targets(infos, ["b", "b"])] == ["b"]
    with pytest.raises(InputError, match="not GPU nodes of this cluster: c, d"):
        pick_targets(infos, ["d", "a", "c"])


def test_wait_until_polls_then_names_what_is_left() -> None:
    now = [0.0]
    answers = [{"a": "x", "b": "y"}, {"b": "still y"}, {"b": "still y"}, {"b": "still y"}]
    sleeps: list[float] = []

    def sleep(s: float) -> None:
        sleeps.append(s)
        now[0] += s

    with pytest.raises(StackNotReady) as caught:
        wait_until(
            lambda: answers.pop(0) if len(answers) > 1 else answers[0],
            what="device-plugin",
            total=2,
            timeout_s=1.0,
            poll_s=0.4,
            clock=lambda: now[0],
            sleep=sleep,
        )
    assert caught.value.nodes == {"b": "still y"}
    assert str(caught.value) == "device-plugin not ready after 1 s on 1 of 2 nodes: b (still y)"
    assert sleeps[1] > sleeps[0]  # polls slow down
    wait_until(lambda: {}, what="x", total=1, timeout_s=0, sleep=sleep)  # ready at once: no timeout


# --- against the simulator -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=3) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kube(sim: SimCluster) -> Kube:
    return connect(sim.kubeconfig_path)


def test_a_driver_upgrade_moves_nodes_to_the_new_variant_and_prunes_the_old(kube: Kube) -> None:
    matrix = load_matrix()
    inventory = take_inventory(kube, known_models=matrix.gpu_models)
    labels = {i.name: dict(i.labels) for i in inventory}
    release = matrix.newest_release()
    default = release.driver.default
    older = next(v for v in matrix.drivers[default.partition(".")[0]].releases if v != default)
    for driver in (older, default):
        plan = plan_stack(inventory, StackRequest(versions={"driver": driver}), matrix, namespace=NS)
        manifests = render_stack(plan)
        apply_manifests(kube, [m for m in manifests if m.step in ("namespace", "rbac", "driver")])
        label_nodes(kube, desired_target_labels(plan))
        targets = component_targets(plan, "driver", labels)
        wait_until(
            lambda p=plan, t=targets: not_ready_nodes(kube, p, "driver", t),  # type: ignore[misc]
            what="driver",
            total=len(targets),
            timeout_s=10,
        )
        prune_driver_variants(kube, plan)
        names = {d["metadata"]["name"] for d in kube.list_objects("apps/v1", "DaemonSet", NS)}
        assert names == {f"nvidia-driver-{v.id}" for v in plan.drivers}
        assert {n: v["driver"] for n, v in observed_versions(kube, plan).items()} == dict.fromkeys(plan.nodes, driver)


def test_find_drift_reports_opt_outs_host_drivers_and_bystanders() -> None:
    matrix = load_matrix()
    base = NodeInfo(
        name="a",
        gpu_model="NVIDIA H200",
        gpu_count=8,
        kernel="5.15.0",
        os_image="Ubuntu 22.04.4 LTS",
        container_runtime="containerd://1.7.20",
        kubelet_version="v1.33.5",
    )
    nodes = [
        base,
        replace(base, name="b", labels={"nvidia.com/gpu.deploy.dcgm-exporter": "false"}),
        replace(base, name="c", host_driver="570.195.03"),
    ]
    plan = plan_stack(nodes, StackRequest(), matrix, namespace=NS)
    running = {n: plan.expected_versions(n) for n in plan.nodes}
    del running["b"]["dcgm-exporter"]
    bystander = replace(
        base, name="d", labels={"gpucert.io/stack": "managed", "gpucert.io/stack.device-plugin": "v0.14.0"}
    )
    drift = find_drift(plan, [*nodes, bystander], running)
    rows = {(d.node, d.component): d for d in drift}
    assert rows[("b", "dcgm-exporter")].reason.startswith("opted out")
    assert rows[("c", "driver")].found == "570.195.03"
    assert rows[("d", "device-plugin")].found == "v0.14.0"
    assert ("a", "driver") not in rows
    assert all(isinstance(d, Drift) for d in drift)


def _ds_pod(node: str, generation: int, revision: str, uid: str = "ds-1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"p-{node}",
            "labels": {"pod-template-generation": str(generation), "controller-revision-hash": revision},
            "ownerReferences": [{"kind": "DaemonSet", "uid": uid, "controller": True}],
        },
        "spec": {"nodeName": node},
    }


def test_a_template_changed_and_changed_back_counts_the_pods_never_replaced_as_current() -> None:
    """Found on a real control plane: an outside edit rolled a DaemonSet part way, configure put the template
    back (generation 3, the revision of generation 1 again), and the DaemonSet controller left the pod it had
    not yet replaced — generation 1, the current revision — where it was. It is current, as the controller
    judges (IsPodUpdated: generation or revision hash); a pod of the edited template is not."""
    from gpucert.stack._rollout import _current_pods_by_node, _Template

    pods = [_ds_pod("a", 3, "h1"), _ds_pod("b", 1, "h1"), _ds_pod("c", 2, "h2")]
    rolling = {"ds-1": _Template(generation=3, all_updated=False)}
    assert sorted(_current_pods_by_node(rolling, pods)) == ["a", "b"]
    # No pod made at this generation yet: the controller's own count (all updated) is what says so.
    settled = {"ds-1": _Template(generation=3, all_updated=True)}
    assert sorted(_current_pods_by_node(settled, [_ds_pod("b", 1, "h1")])) == ["b"]
    assert _current_pods_by_node(rolling, [_ds_pod("b", 1, "h1")]) == {}
