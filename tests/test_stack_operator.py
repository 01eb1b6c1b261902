"""The GPU Operator's side of configure, without a cluster: which installer, the operator's release in the
matrix, what is written to it, how a rollout and drift are read (issue 32). The same on the real operator:
``tests/test_gpu_operator.py``."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from gpucert.errors import InstallerConflict, KubeForbidden, KubeNotFound, StackConflict
from gpucert.stack import (
    UPGRADE_STATE,
    NodeInfo,
    OperatorStack,
    StackRequest,
    StackSurvey,
    choose_installer,
    configured_versions,
    drift_since_configure,
    load_matrix,
    normalise_version,
    operand_versions,
    operator_changes,
    operator_release,
    plan_stack,
    rollout_pending,
    survey_stack,
    untolerated_taints,
)

from .assets import FIXTURES as ASSET_FIXTURES

FIXTURES = ASSET_FIXTURES / "gpu-operator"


def _operator(**changes: Any) -> OperatorStack:
    fields: dict[str, Any] = {
        "version": "v26.7.0",
        "version_from": "ClusterPolicy cluster-policy labels",
        "policy": "cluster-policy",
        "state": "ready",
        "uses_nvidia_drivers": False,
        "auto_upgrade": True,
        "spec_versions": {
            "driver": "595.91.07",
            "container-toolkit": "v1.20.0",
            "device-plugin": "v0.20.0",
            "dcgm-exporter": "4.6.0-4.8.3",
            "gpu-feature-discovery": "v0.20.0",
        },
        "spec_tags": {},
        "daemonsets": ("gpu-operator/nvidia-driver-daemonset",),
    }
    return OperatorStack(**{**fields, **changes})


def _survey(
    operator: OperatorStack | None = None,
    own: tuple[str, ...] = (),
    other: tuple[str, ...] = (),
    nodes: dict[str, tuple[str, ...]] | None = None,
) -> StackSurvey:
    return StackSurvey(
        operator=operator, own_daemonsets=own, other_daemonsets=other, node_installers=nodes or {}, host_driver_nodes=()
    )


def _node(name: str, **labels: str) -> NodeInfo:
    return NodeInfo(
        name=name,
        gpu_model="NVIDIA H200",
        gpu_count=8,
        kernel="5.15.0-119-generic",
        os_image="Ubuntu 22.04.4 LTS",
        container_runtime="containerd://1.7.20",
        kubelet_version="v1.34.1",
        labels={"nvidia.com/gpu.present": "true", **labels},
    )


def _pod(
    node: str, labels: dict[str, str], image: str, *, ready: bool = True, created: str = "2026-12-07T00:00:00Z"
) -> dict[str, Any]:
    return {
        "metadata": {"labels": labels, "creationTimestamp": created},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": image}]},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def _driver_pod(node: str, version: str, **kwargs: Any) -> dict[str, Any]:
    labels = {"app.kubernetes.io/component": "nvidia-driver", "app.kubernetes.io/managed-by": "gpu-operator"}
    return _pod(node, labels, f"nvcr.io/nvidia/driver:{version}-ubuntu22.04", **kwargs)


def _k8s_node(name: str, labels: dict[str, str], unschedulable: bool = False) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"unschedulable": unschedulable},
        "status": {"nodeInfo": {}},
    }


@pytest.mark.parametrize(
    ("component", "raw", "want"),
    [
        ("driver", "580.105.08-ubuntu22.04", "580.105.08"),
        ("driver", "595.91.07", "595.91.07"),
        ("dcgm-exporter", "4.6.0-4.8.3-distroless", "4.6.0-4.8.3"),
        ("dcgm-exporter", "4.4.1-4.6.0-ubuntu22.04", "4.4.1-4.6.0"),
        ("container-toolkit", "v1.17.8-ubuntu20.04", "v1.17.8"),
        ("device-plugin", "v0.20.0", "v0.20.0"),
    ],
)
def test_versions_are_read_as_the_matrix_writes_them(component: str, raw: str, want: str) -> None:
    assert normalise_version(component, raw) == want


def test_the_operators_release_is_found_in_the_matrix() -> None:
    matrix = load_matrix()
    assert operator_release(matrix, "v26.7.0").name == "26.7.0"
    # A patch release the matrix does not list yet: its minor's newest listed release (v26.7.x covered).
    assert operator_release(matrix, "v26.7.1").name == "26.7.0"
    assert operator_release(matrix, "v25.10.1").name == "25.10.1"
    with pytest.raises(StackConflict, match=r"v27\.1\.0 is not in the compatibility matrix"):
        operator_release(matrix, "v27.1.0")
    with pytest.raises(StackConflict, match="release cannot be read"):
        operator_release(matrix, None)


def test_the_installer_is_chosen_or_refused() -> None:
    operator = _operator()
    assert choose_installer(_survey()) == "gpucert"  # nothing runs the stack: gpucert's own manifests
    assert choose_installer(_survey(operator)) == "gpu-operator"
    assert choose_installer(_survey(operator), "gpu-operator") == "gpu-operator"
    both = _survey(
        operator,
        own=("gpucert-system/gpucert-device-plugin",),
        nodes={"n1": ("gpu-operator", "gpucert"), "n2": ("gpu-operator",)},
    )
    with pytest.raises(InstallerConflict) as refused:
        choose_installer(both)
    text = str(refused.value)
    assert text.startswith("two installers run the GPU stack on this cluster: the GPU Operator and gpucert")
    assert "GPU Operator v26.7.0" in text
    assert "gpucert-system/gpucert-device-plugin" in text
    assert "(n1)" in text
    with pytest.raises(InstallerConflict, match="--installer gpucert refused"):
        choose_installer(_survey(operator), "gpucert")
    with pytest.raises(InstallerConflict, match="--installer gpu-operator refused"):
        choose_installer(_survey(), "gpu-operator")
    with pytest.raises(InstallerConflict, match="kube-system/nvidia-device-plugin"):
        choose_installer(_survey(other=("kube-system/nvidia-device-plugin",)))


def test_a_driver_change_goes_to_the_clusterpolicy_or_to_each_pools_nvidiadriver() -> None:
    nodes = [
        _node("a1", **{"nvidia.com/gpu-operator.driver.owner": "pool-a"}),
        _node("a2", **{"nvidia.com/gpu-operator.driver.owner": "pool-a"}),
        _node("b1", **{"nvidia.com/gpu-operator.driver.owner": "pool-b"}),
    ]
    matrix = load_matrix()
    plan = plan_stack(
        nodes, StackRequest(release="26.7.0", versions={"driver": "580.105.08"}), matrix, namespace="gpucert-system"
    )
    [policy] = operator_changes(_operator(), plan, {"driver": "580.105.08"}, nodes)
    assert policy.obj == {
        "apiVersion": "nvidia.com/v1",
        "kind": "ClusterPolicy",
        "metadata": {"name": "cluster-policy"},
        "spec": {"driver": {"version": "580.105.08"}},
    }
    assert policy.changes == {"driver": ("595.91.07", "580.105.08")}
    # Nothing asked: nothing written (adopting changes nothing of the operator's).
    assert operator_changes(_operator(), plan, {}, nodes) == []

    crd_mode = _operator(uses_nvidia_drivers=True, drivers={"pool-a": "595.91.07", "pool-b": "580.105.08"})
    [pool_a] = operator_changes(crd_mode, plan, {"driver": "580.105.08"}, nodes)
    assert pool_a.obj == {
        "apiVersion": "nvidia.com/v1alpha1",
        "kind": "NVIDIADriver",
        "metadata": {"name": "pool-a"},
        "spec": {"version": "580.105.08"},
    }
    assert pool_a.nodes == ("a1", "a2")
    # Only the pool of the nodes asked for.
    only_b = plan_stack(
        [nodes[2]],
        StackRequest(release="26.7.0", versions={"driver": "580.126.20"}),
        matrix,
        namespace="gpucert-system",
    )
    [pool_b] = operator_changes(crd_mode, only_b, {"driver": "580.126.20"}, nodes)
    assert pool_b.name == "NVIDIADriver pool-b"
    assert pool_b.nodes == ("b1",)


def test_the_chart_objects_parse_as_the_operator_writes_them() -> None:
    """The fixture's NVIDIADriver matches what operator_changes writes to (spec.version)."""
    nvd = yaml.safe_load((FIXTURES / "nvidiadriver.yaml").read_text())
    assert nvd["kind"] == "NVIDIADriver"
    assert nvd["spec"]["version"] == "595.91.07"


def test_the_rollout_is_followed_node_by_node_and_a_failed_node_named() -> None:
    targets = ["n1", "n2", "n3", "n4"]
    nodes = [
        _k8s_node("n1", {UPGRADE_STATE: "upgrade-done"}),
        _k8s_node("n2", {UPGRADE_STATE: "pod-restart-required"}, unschedulable=True),
        _k8s_node("n3", {UPGRADE_STATE: "upgrade-failed"}, unschedulable=True),
        _k8s_node("n4", {UPGRADE_STATE: "upgrade-done"}),
    ]
    pods = [
        _driver_pod("n1", "580.105.08"),
        _driver_pod("n2", "595.91.07"),
        _driver_pod("n3", "595.91.07"),
        # n4: the label says done (from before the change) but its pod still runs the old driver.
        _driver_pod("n4", "595.91.07"),
    ]
    pending = rollout_pending(nodes, pods, targets, "580.105.08")
    assert sorted(pending) == ["n2", "n3", "n4"]
    assert pending["n2"] == "pod-restart-required; driver 595.91.07, not 580.105.08"
    assert pending["n3"].startswith("stuck in upgrade-failed")
    assert pending["n4"] == "upgrade-done; driver 595.91.07, not 580.105.08"
    # The new pod Ready but the node still cordoned in uncordon-required: not done yet.
    nodes[1] = _k8s_node("n2", {UPGRADE_STATE: "uncordon-required"}, unschedulable=True)
    pods[1] = _driver_pod("n2", "580.105.08")
    assert rollout_pending(nodes, pods, ["n2"], "580.105.08") == {"n2": "uncordon-required; driver 580.105.08 running"}


def test_operand_versions_take_the_newest_ready_pod() -> None:
    pods = [
        _driver_pod("n1", "595.91.07", created="2026-12-07T00:00:00Z"),
        _driver_pod("n1", "580.105.08", created="2026-12-07T00:05:00Z"),
        _driver_pod("n2", "580.105.08", ready=False),
        _pod("n1", {"app": "nvidia-dcgm-exporter"}, "nvcr.io/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless"),
    ]
    assert operand_versions(pods, ["n1", "n2"]) == {
        "n1": {"driver": "580.105.08", "dcgm-exporter": "4.6.0-4.8.3"},
        "n2": {},
    }


def test_drift_since_configure_names_what_moved_outside_gpucert() -> None:
    configured = {"gpucert.io/stack.driver": "580.105.08", "gpucert.io/stack.device-plugin": "v0.20.0"}
    host = {
        "gpucert.io/stack.driver": "570.195.03",
        "nvidia.com/gpu.deploy.driver": "pre-installed",
        "nvidia.com/cuda.driver-version.full": "570.211.01",
    }
    nodes = [_k8s_node("op", configured), _k8s_node("own", configured), _k8s_node("host", host), _k8s_node("never", {})]
    own = {
        "app.kubernetes.io/part-of": "gpucert",
        "app.kubernetes.io/component": "driver",
        "app.kubernetes.io/version": "580.105.08",
    }
    plugin = {
        "app.kubernetes.io/part-of": "gpucert",
        "app.kubernetes.io/component": "device-plugin",
        "app.kubernetes.io/version": "v0.19.0",
    }
    pods = [
        _driver_pod("op", "595.91.07"),  # the operator upgraded it (a Helm upgrade, say)
        _pod("op", {"app": "nvidia-device-plugin-daemonset"}, "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"),
        _pod("own", own, "x"),
        _pod("own", plugin, "y"),
    ]
    drift = {
        (d.node, d.component): (d.expected, d.found, d.reason) for d in drift_since_configure(nodes, pods, "gpucert.io")
    }
    assert drift == {
        ("op", "driver"): ("580.105.08", "595.91.07", "moved outside gpucert since configure"),
        ("own", "device-plugin"): ("v0.20.0", "v0.19.0", "moved outside gpucert since configure"),
        ("host", "driver"): ("570.195.03", "570.211.01", "moved outside gpucert since configure"),
    }


def test_taints_the_operators_daemonsets_do_not_tolerate_are_named() -> None:
    chart = [{"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}]
    nodes: list[dict[str, Any]] = [
        {"metadata": {"name": "ok"}, "spec": {"taints": [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]}},
        {
            "metadata": {"name": "failed"},
            "spec": {
                "taints": [
                    {"key": "gpucert.io/unhealthy", "value": "remap_failure", "effect": "NoSchedule"},
                    {"key": "soft", "effect": "PreferNoSchedule"},
                ]
            },
        },
        {"metadata": {"name": "plain"}, "spec": {}},
    ]
    assert untolerated_taints(nodes, chart) == {"failed": "gpucert.io/unhealthy=remap_failure:NoSchedule"}
    tolerant = [*chart, {"key": "gpucert.io/unhealthy", "operator": "Exists"}]
    assert untolerated_taints(nodes, tolerant) == {}


def test_no_stack_pods_at_all_reads_as_not_running() -> None:
    """A cluster with no stack pod (every exporter gone): each configured component is named, no crash."""
    nodes = [_k8s_node("n1", {"gpucert.io/stack.driver": "580.105.08"})]
    [drift] = drift_since_configure(nodes, [], "gpucert.io")
    assert (drift.node, drift.component, drift.found, drift.reason) == (
        "n1",
        "driver",
        "",
        "not running since configure",
    )
    assert operand_versions([], ["n1"]) == {"n1": {}}


def test_what_the_operator_was_told_per_node_in_nvidiadriver_mode() -> None:
    nodes = [
        _node("a1", **{"nvidia.com/gpu-operator.driver.owner": "pool-a"}),
        _node("b1", **{"nvidia.com/gpu-operator.driver.owner": "pool-b"}),
    ]
    plan = plan_stack(
        nodes,
        StackRequest(release="26.7.0", versions={"driver": "580.105.08"}),
        load_matrix(),
        namespace="gpucert-system",
    )
    crd_mode = _operator(uses_nvidia_drivers=True, drivers={"pool-a": "595.91.07", "pool-b": "580.105.08"})
    told = configured_versions(crd_mode, plan, nodes)
    assert told["a1"]["driver"] == "595.91.07"
    assert told["b1"]["driver"] == "580.105.08"
    assert told["a1"]["device-plugin"] == "v0.20.0"
    assert configured_versions(_operator(), plan, nodes)["a1"]["driver"] == "595.91.07"  # ClusterPolicy mode


class _RefusingKube:
    """A cluster where gpucert may list nodes but not what installs the stack (RBAC left out)."""

    def list_objects(self, api_version: str, kind: str, **_: Any) -> list[dict[str, Any]]:
        if kind == "ClusterPolicy":
            raise KubeNotFound("list ClusterPolicy: the server could not find the requested resource", status=404)
        raise KubeForbidden(f"list {kind}: forbidden", status=403)


def test_a_survey_that_may_not_look_is_an_error_never_no_installer() -> None:
    """A survey that could not list the DaemonSets must not read as "nothing runs the stack here": configure
    would install a second stack beside the operator's. A missing CRD (404) is simply no operator."""
    with pytest.raises(KubeForbidden, match="DaemonSet"):
        survey_stack(_RefusingKube(), [_node("gpu-1")])  # type: ignore[arg-type]
