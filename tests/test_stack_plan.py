"""The stack planner: the release and drivers it picks, and every conflict it refuses before any write."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gpucert.errors import InputError, StackConflict
from gpucert.stack import (
    NODES_SHOWN,
    RELEASE_COMPONENTS,
    Matrix,
    NodeInfo,
    StackPlan,
    StackRequest,
    load_matrix,
    os_tag,
    plan_stack,
)
from gpucert.stack._matrix import driver_key, minor_key
from gpucert_sim._nodes import gpu_node

NS = "gpucert-stack"


@pytest.fixture(scope="module")
def matrix() -> Matrix:
    return load_matrix()


def sim_node(name: str, index: int, model: str = "NVIDIA H200") -> NodeInfo:
    """A NodeInfo read off the simulated cluster's Node object, as preflight would."""
    obj = gpu_node(name, index, model=model, gpus=8)
    info = obj["status"]["nodeInfo"]
    labels = obj["metadata"]["labels"]
    return NodeInfo(
        name=name,
        gpu_model=labels["nvidia.com/gpu.product"].replace("-", " "),
        gpu_count=int(labels["nvidia.com/gpu.count"]),
        kernel=info["kernelVersion"],
        os_image=info["osImage"],
        container_runtime=info["containerRuntimeVersion"],
        kubelet_version=info["kubeletVersion"],
        labels=labels,
    )


def node(name: str, model: str | None = "NVIDIA H200", **changes: object) -> NodeInfo:
    fields: dict[str, object] = {
        "gpu_count": 8,
        "kernel": "6.8.0-57-generic",
        "os_image": "Ubuntu 22.04.5 LTS",
        "container_runtime": "containerd://2.1.4",
        "kubelet_version": "v1.33.5",
    }
    fields.update(changes)
    return NodeInfo(name=name, gpu_model=model, **fields)  # type: ignore[arg-type]


def conflicts_of(nodes: list[NodeInfo], request: StackRequest, matrix: Matrix) -> StackConflict:
    with pytest.raises(StackConflict) as info:
        plan_stack(nodes, request, matrix, namespace=NS)
    assert isinstance(info.value, InputError)
    return info.value


def newest_covering(matrix: Matrix, minor: str) -> str:
    return next(r.name for r in matrix.releases_newest_first() if r.kubernetes.covers(minor_key(minor)))


# --- what gets chosen ----------------------------------------------------------------------------------


def test_the_sim_nodes_get_the_newest_release_that_accepts_their_kubelet(matrix: Matrix) -> None:
    nodes = [sim_node(f"gpu-node-{i:05d}", i, "NVIDIA H200" if i % 2 else "NVIDIA H100 80GB HBM3") for i in range(6)]
    plan = plan_stack(list(reversed(nodes)), StackRequest(), matrix, namespace=NS)
    release = matrix.find_release(plan.release)
    assert release is not None
    minor = ".".join(nodes[0].kubelet_version.lstrip("v").split(".")[:2])
    assert plan.release == newest_covering(matrix, minor)
    assert plan.nodes == tuple(sorted(n.name for n in nodes))
    assert plan.kubernetes_versions == (minor,)
    assert tuple(plan.versions) == RELEASE_COMPONENTS == tuple(plan.images)
    assert plan.versions == {c: release.version(c) for c in RELEASE_COMPONENTS}
    assert plan.images["device-plugin"] == f"nvcr.io/nvidia/k8s-device-plugin:{release.components['device-plugin'].tag}"
    assert plan.images["gpu-feature-discovery"].startswith("nvcr.io/nvidia/k8s-device-plugin:")
    assert plan.images["dcgm-exporter"].startswith("nvcr.io/nvidia/k8s/dcgm-exporter:" + plan.versions["dcgm-exporter"])
    default = release.driver.default
    variant_id = f"{default}-ubuntu22.04".replace(".", "-")
    assert [(v.id, v.version, v.os_tag, v.image) for v in plan.drivers] == [
        (variant_id, default, "ubuntu22.04", f"nvcr.io/nvidia/driver:{default}-ubuntu22.04")
    ]
    assert set(plan.node_driver.values()) == {variant_id}
    assert len(plan.node_driver) == 6
    assert plan.host_driver == {}
    assert plan.model_driver == {"NVIDIA H100 80GB HBM3": default, "NVIDIA H200": default}
    assert plan.expected_versions("gpu-node-00003")["driver"] == default
    assert (plan.namespace, plan.label_prefix) == (NS, "gpucert.io")


def test_nodes_every_release_accepts_get_the_newest_release(matrix: Matrix) -> None:
    newest = matrix.newest_release()
    kubelet = f"v{newest.kubernetes.max}.2"
    plan = plan_stack([node("a", kubelet_version=kubelet)], StackRequest(), matrix, namespace=NS)
    assert plan.release == newest.name
    assert plan.model_driver == {"NVIDIA H200": newest.driver.default}


def test_a_requested_release_and_driver_are_used(matrix: Matrix) -> None:
    release = matrix.find_release("25.10")
    assert release is not None
    driver = next(d for d in matrix.drivers["570"].releases if d != release.driver.default)
    request = StackRequest(release="25.10", versions={"driver": driver})
    plan = plan_stack([node("a"), node("b", "NVIDIA L40S")], request, matrix, namespace=NS)
    assert plan.release == release.name
    assert plan.model_driver == {"NVIDIA H200": driver, "NVIDIA L40S": driver}
    assert [v.id for v in plan.drivers] == [f"{driver}-ubuntu22.04".replace(".", "-")]


def test_a_volta_node_falls_back_to_a_branch_that_still_drives_it(matrix: Matrix) -> None:
    # A matrix whose newest release defaults to a driver past R580 must fall back to R580 for Volta.
    newest = matrix.newest_release()
    post_volta = max((b for b in newest.driver.branches if not matrix.supports(b, "volta")), key=int)
    patched = newest.model_copy(
        update={"driver": newest.driver.model_copy(update={"default": matrix.newest_driver(post_volta)})}
    )
    custom = matrix.model_copy(update={"releases": [patched]})
    kubelet = f"v{newest.kubernetes.max}.0"
    nodes = [node("v", "Tesla V100-SXM2-32GB", kubelet_version=kubelet), node("h", kubelet_version=kubelet)]
    plan = plan_stack(nodes, StackRequest(), custom, namespace=NS)
    volta_branch = max((b for b in newest.driver.branches if matrix.supports(b, "volta")), key=int)
    assert plan.model_driver["NVIDIA H200"] == matrix.newest_driver(post_volta)
    assert plan.model_driver["Tesla V100-SXM2-32GB"] == matrix.newest_driver(volta_branch)
    assert len(plan.drivers) == 2


def test_mixed_os_images_get_one_driver_variant_each(matrix: Matrix) -> None:
    nodes = [
        node("u22-a"),
        node("u22-b"),
        node("u24-a", os_image="Ubuntu 24.04.1 LTS"),
        node("rhel-a", os_image="Red Hat Enterprise Linux 9.4 (Plow)"),
    ]
    plan = plan_stack(nodes, StackRequest(), matrix, namespace=NS)
    driver = plan.model_driver["NVIDIA H200"]
    dashed = driver.replace(".", "-")
    assert [(v.id, v.os_tag) for v in plan.drivers] == [
        (f"{dashed}-rhel9-4", "rhel9.4"),
        (f"{dashed}-ubuntu22-04", "ubuntu22.04"),
        (f"{dashed}-ubuntu24-04", "ubuntu24.04"),
    ]
    assert plan.node_driver == {
        "rhel-a": f"{dashed}-rhel9-4",
        "u22-a": f"{dashed}-ubuntu22-04",
        "u22-b": f"{dashed}-ubuntu22-04",
        "u24-a": f"{dashed}-ubuntu24-04",
    }
    assert {v.image for v in plan.drivers} == {
        f"nvcr.io/nvidia/driver:{driver}-{tag}" for tag in ("rhel9.4", "ubuntu22.04", "ubuntu24.04")
    }


def test_a_compatible_host_driver_is_kept(matrix: Matrix) -> None:
    host = matrix.drivers["570"].releases[0]
    nodes = [node("host", host_driver=host), node("managed")]
    plan = plan_stack(nodes, StackRequest(), matrix, namespace=NS)
    assert plan.host_driver == {"host": host}
    assert "host" not in plan.node_driver
    assert "managed" in plan.node_driver
    assert plan.nodes == ("host", "managed")
    assert plan.expected_versions("host")["driver"] == host
    # A host-driver node does not need a driver image for its OS.
    flatcar = node("host", host_driver=host, os_image="Flatcar Container Linux 4152.2.3")
    odd = plan_stack([flatcar], StackRequest(), matrix, namespace=NS)
    assert odd.host_driver == {"host": host}
    assert odd.drivers == ()
    assert odd.model_driver == {}


def test_an_unsupported_host_driver_branch_is_a_conflict(matrix: Matrix) -> None:
    newest = matrix.newest_release()
    release_branches = set(newest.driver.branches)
    outside = next(b for b in matrix.drivers if b not in release_branches)
    host = matrix.drivers[outside].releases[0]
    error = conflicts_of([node("old-host", host_driver=host)], StackRequest(release=newest.name), matrix)
    assert error.conflicts == [
        f"host driver {host}: GPU Operator {newest.name} does not support branch {outside} "
        f"(it supports {', '.join(newest.driver.branches)}) (on old-host)"
    ]


def test_a_host_driver_that_cannot_drive_the_gpus_is_a_conflict(matrix: Matrix) -> None:
    host = matrix.drivers["535"].releases[0]
    error = conflicts_of([node("b2", "NVIDIA B200", host_driver=host)], StackRequest(release="25.10.1"), matrix)
    assert error.conflicts == [f"host driver {host} does not support blackwell (NVIDIA B200 on b2)"]


# --- what gets refused -----------------------------------------------------------------------------------


def test_blackwell_with_a_535_driver_names_the_model_and_nodes(matrix: Matrix) -> None:
    nodes = [node("gpu-node-00002", "NVIDIA B200"), node("gpu-node-00001", "NVIDIA B200"), node("h")]
    # 26.3.1 still supports branch 535, so what refuses the request there is the architecture.
    error = conflicts_of(nodes, StackRequest(release="26.3.1", versions={"driver": "535.274.02"}), matrix)
    assert "driver 535.274.02 does not support blackwell (NVIDIA B200 on gpu-node-00001, gpu-node-00002)" in (
        error.conflicts
    )
    # Asked of no release, every release refuses it, and the newest's refusal is the one told.
    error = conflicts_of(nodes, StackRequest(versions={"driver": "535.274.02"}), matrix)
    assert str(error).splitlines()[0].startswith("no release of the compatibility matrix accepts")
    assert f"GPU Operator {matrix.newest_release().name}" in str(error).splitlines()[0]


def test_a_driver_older_than_a_model_needs_is_a_conflict(matrix: Matrix) -> None:
    first = matrix.min_driver("NVIDIA B200")
    assert first is not None
    older = next(d for d in matrix.drivers["570"].releases if driver_key(d) < driver_key(first))
    error = conflicts_of(
        [node("b", "NVIDIA B200")], StackRequest(release="25.10.1", versions={"driver": older}), matrix
    )
    assert error.conflicts == [f"driver {older} is older than {first}, the first for NVIDIA B200 (NVIDIA B200 on b)"]


def test_an_unknown_model_is_named_with_its_nodes(matrix: Matrix) -> None:
    nodes = [node("x2", "NVIDIA Z9000"), node("x1", "NVIDIA Z9000"), node("ok")]
    error = conflicts_of(nodes, StackRequest(), matrix)
    assert error.conflicts == ["unknown GPU model 'NVIDIA Z9000': not in the compatibility matrix (on x1, x2)"]


def test_a_node_without_a_model_label_is_a_conflict(matrix: Matrix) -> None:
    error = conflicts_of([node("blank", None), node("ok")], StackRequest(), matrix)
    assert error.conflicts == ["cannot tell the GPU model: no nvidia.com/gpu.product label (on blank)"]


@pytest.mark.parametrize("side", ["old", "new"])
def test_a_kubelet_outside_the_range_is_a_conflict(matrix: Matrix, side: str) -> None:
    release = matrix.newest_release()
    low, high = minor_key(release.kubernetes.min), minor_key(release.kubernetes.max)
    minor = (low[0], low[1] - 1) if side == "old" else (high[0], high[1] + 1)
    kubelet = f"v{minor[0]}.{minor[1]}.3"
    error = conflicts_of([node("k", kubelet_version=kubelet)], StackRequest(release=release.name), matrix)
    others = [r.name for r in matrix.releases_newest_first() if r.kubernetes.covers(minor)]
    way_out = f"supported by {', '.join(others)}" if others else "no release of the matrix supports it"
    assert error.conflicts == [
        f"kubelet {minor[0]}.{minor[1]} is outside the Kubernetes versions GPU Operator {release.name} supports "
        f"({release.kubernetes.min}–{release.kubernetes.max}; {way_out}) (on k)"
    ]


def test_a_kubelet_newer_than_every_release_refuses_them_all(matrix: Matrix) -> None:
    error = conflicts_of([node("k", kubelet_version="v1.99.0")], StackRequest(), matrix)
    assert len(error.conflicts) == 1
    assert error.conflicts[0].startswith("kubelet 1.99 is outside")


def test_cri_o_is_accepted_and_docker_is_not(matrix: Matrix) -> None:
    plan = plan_stack([node("c", container_runtime="cri-o://1.33.2")], StackRequest(), matrix, namespace=NS)
    assert plan.nodes == ("c",)
    error = conflicts_of([node("d", container_runtime="docker://28.0.1")], StackRequest(), matrix)
    assert error.conflicts == [
        f"container runtime docker is not supported by GPU Operator {matrix.newest_release().name} "
        "(supported: containerd, cri-o) (on d)"
    ]


def test_an_unsupported_os_is_a_conflict(matrix: Matrix) -> None:
    error = conflicts_of(
        [node("flat", os_image="Flatcar Container Linux by Kinvolk 4152.2.3 (Oklo)")], StackRequest(), matrix
    )
    assert error.conflicts == [
        "no driver image for OS 'Flatcar Container Linux by Kinvolk 4152.2.3 (Oklo)': gpucert knows Ubuntu, "
        "RHEL and Rocky Linux (on flat)"
    ]
    rocky = conflicts_of([node("r", os_image="Rocky Linux 9.7 (Blue Onyx)")], StackRequest(), matrix)
    newest = matrix.newest_release().name
    assert rocky.conflicts[0].startswith(f"GPU Operator {newest} has no driver image for rocky9.7")


def test_many_nodes_are_named_up_to_five_then_counted(matrix: Matrix) -> None:
    nodes = [node(f"n{i:02d}", "NVIDIA Z9000") for i in range(NODES_SHOWN + 7)]
    error = conflicts_of(nodes, StackRequest(), matrix)
    assert error.conflicts == [
        "unknown GPU model 'NVIDIA Z9000': not in the compatibility matrix (on n00, n01, n02, n03, n04 and 7 more)"
    ]


def test_all_conflicts_are_reported_together(matrix: Matrix) -> None:
    nodes = [
        node("blank", None),
        node("alien", "NVIDIA Z9000"),
        node("docker", container_runtime="docker://28.0.1"),
        node("ancient", kubelet_version="v1.20.1"),
        node("b", "NVIDIA B200"),
    ]
    # 26.3.1: a release that still supports branch 535, so the B200's architecture is what refuses it.
    request = StackRequest(release="26.3.1", versions={"driver": "535.274.02", "cuda": "13.0"})
    error = conflicts_of(nodes, request, matrix)
    text = "\n".join(error.conflicts)
    for piece in (
        "unknown component 'cuda'",
        "no nvidia.com/gpu.product label (on blank)",
        "unknown GPU model 'NVIDIA Z9000'",
        "container runtime docker",
        "kubelet 1.20 is outside",
        "driver 535.274.02 does not support blackwell (NVIDIA B200 on b)",
    ):
        assert piece in text
    assert len(error.conflicts) == 6
    assert str(error).splitlines()[0] == "the GPU stack cannot be planned: 6 conflicts"
    assert [line.removeprefix("  - ") for line in str(error).splitlines()[1:]] == error.conflicts


def test_an_unknown_release_lists_the_known_ones(matrix: Matrix) -> None:
    error = conflicts_of([node("a")], StackRequest(release="19.1"), matrix)
    known = ", ".join(r.name for r in matrix.releases_newest_first())
    assert error.conflicts == [f"unknown release '19.1' (the matrix knows {known})"]


def test_an_unknown_requested_driver_is_a_conflict(matrix: Matrix) -> None:
    error = conflicts_of([node("a")], StackRequest(versions={"driver": "580.1.1"}), matrix)
    assert error.conflicts[0].startswith("requested driver 580.1.1 is not a known release of branch 580")
    error = conflicts_of([node("a")], StackRequest(versions={"driver": "latest"}), matrix)
    assert error.conflicts[0] == "requested driver 'latest' is not a driver version (like 580.95.05)"


# --- component overrides and the registry -----------------------------------------------------------------


def test_an_operand_of_another_release_is_allowed_when_it_covers_the_kubelets(matrix: Matrix) -> None:
    newest = matrix.newest_release()
    # The newest minor both the newest release and an older one support.
    other = next(
        r
        for r in matrix.releases_newest_first()
        if r is not newest and r.kubernetes.covers(minor_key(newest.kubernetes.min))
    )
    shared = min(minor_key(newest.kubernetes.max), minor_key(other.kubernetes.max))
    kubelet = f"v{shared[0]}.{shared[1]}.1"
    wanted = other.version("container-toolkit").removeprefix("v")
    plan = plan_stack(
        [node("a", kubelet_version=kubelet)], StackRequest(versions={"container-toolkit": wanted}), matrix, namespace=NS
    )
    assert plan.release == newest.name
    assert plan.versions["container-toolkit"] == other.version("container-toolkit")
    assert plan.images["container-toolkit"].endswith(":" + other.components["container-toolkit"].tag)
    assert plan.versions["device-plugin"] == newest.version("device-plugin")


def test_an_operand_no_release_pairs_with_the_kubelets_is_refused(matrix: Matrix) -> None:
    newest = matrix.newest_release()
    oldest = matrix.releases_newest_first()[-1]
    kubelet = f"v{newest.kubernetes.max}.1"
    assert not oldest.kubernetes.covers(minor_key(newest.kubernetes.max))
    wanted = oldest.version("dcgm-exporter")
    request = StackRequest(release=newest.name, versions={"dcgm-exporter": wanted})
    error = conflicts_of([node("a", kubelet_version=kubelet)], request, matrix)
    assert error.conflicts == [
        f"dcgm-exporter {wanted} comes only with GPU Operator {oldest.name}, whose Kubernetes range does not "
        f"cover the nodes' {newest.kubernetes.max}"
    ]
    error = conflicts_of([node("a")], StackRequest(versions={"device-plugin": "v9.9.9"}), matrix)
    assert error.conflicts[0].startswith("device-plugin v9.9.9 is not in the compatibility matrix")


def test_a_registry_replaces_the_host_of_every_image(matrix: Matrix) -> None:
    nodes = [node("a"), node("b", os_image="Ubuntu 24.04.1 LTS")]
    plain = plan_stack(nodes, StackRequest(), matrix, namespace=NS)
    mirrored = plan_stack(nodes, StackRequest(registry="registry.local:5000/mirror/"), matrix, namespace=NS)
    for component, image in plain.images.items():
        assert mirrored.images[component] == image.replace("nvcr.io/", "registry.local:5000/mirror/", 1)
    assert [v.image for v in mirrored.drivers] == [
        v.image.replace("nvcr.io/", "registry.local:5000/mirror/", 1) for v in plain.drivers
    ]
    assert all(i.startswith("registry.local:5000/mirror/nvidia/") for i in mirrored.images.values())
    error = conflicts_of(nodes, StackRequest(registry="https://registry.local"), matrix)
    assert error.conflicts[0].startswith("registry 'https://registry.local' is not a registry host")


# --- small parts -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("image", "tag"),
    [
        ("Ubuntu 22.04.4 LTS", "ubuntu22.04"),
        ("Ubuntu 24.04.1 LTS", "ubuntu24.04"),
        ("Ubuntu 24.04 LTS", "ubuntu24.04"),
        ("Red Hat Enterprise Linux 9.4 (Plow)", "rhel9.4"),
        ("Red Hat Enterprise Linux 8.10 (Ootpa)", "rhel8.10"),
        ("Rocky Linux 9.7 (Blue Onyx)", "rocky9.7"),
        ("Red Hat Enterprise Linux CoreOS 418.94.202501221327-0", None),
        ("Container-Optimized OS from Google", None),
    ],
)
def test_os_tags_from_os_images(image: str, tag: str | None) -> None:
    assert os_tag(image) == tag


def test_planning_is_linear_enough_for_a_large_fleet(matrix: Matrix) -> None:
    nodes = [
        replace(node(f"gpu-{i:05d}"), gpu_model="NVIDIA H100 80GB HBM3" if i % 3 else "NVIDIA H200")
        for i in range(5000)
    ]
    plan = plan_stack(nodes, StackRequest(), matrix, namespace=NS)
    assert isinstance(plan, StackPlan)
    assert len(plan.node_driver) == 5000
    assert len(plan.drivers) == 1


def test_duplicate_and_missing_nodes_are_conflicts(matrix: Matrix) -> None:
    assert conflicts_of([], StackRequest(), matrix).conflicts == ["no GPU nodes to configure"]
    error = conflicts_of([node("a"), node("a")], StackRequest(), matrix)
    assert error.conflicts == ["node a is listed more than once"]
