"""Issue 32: the GPU Operator a cluster already runs is adopted, never doubled.

On the real control plane (kube-apiserver, controller manager, scheduler), with the real NVIDIA GPU Operator
v26.7.0 (its CRDs, its chart's RBAC and ClusterPolicy, its assets: :mod:`tests.gpuoperator`) running the
stack on 4 simulated GPU nodes labelled as NFD would:

* ``gpucert configure`` adopts it: exit 0, no DaemonSet added, nothing of the operator's written;
* ``configure --dry-run DIR --set driver=…`` says the path and writes the ClusterPolicy change it would apply;
* a cluster where gpucert's own DaemonSets run beside the operator is refused with exit 2 naming both;
* ``configure --set driver=580.105.08`` changes the driver through the ClusterPolicy (server-side apply,
  field manager gpucert), follows the operator's rollout to ``upgrade-done`` on each of the 4 nodes, and
  certifies them, in one run (its time printed: ``-s`` shows it).

The ClusterPolicy's upgrade policy lets all 4 nodes upgrade at once (``maxParallelUpgrades: 0``,
``maxUnavailable: 100%``): with the chart's default (one node at a time) the operator's upgrade controller
takes the next node only at its 2-minute poll. A part that cannot start fails the test in CI and skips it
elsewhere.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucert.cli import main
from gpucert.kube import connect
from gpucert.stack import exporter_sources, render_rbac
from gpucert.telemetry import OPERATOR_EXPORTER_SELECTOR, ExporterScrape, ExporterSource, TelemetryError
from gpucert_sim.fleet import Fault

from .controlplane import ControlPlaneUnavailable
from .gpuoperator import CLUSTER_POLICY, UPGRADE_STATE, GpuOperator, OperatorUnavailable, cluster_policy, wait_for
from .realcluster import open_cluster, require_control_plane

pytestmark = pytest.mark.usefixtures("prefect_harness")

NODES = 4
NEW_DRIVER = "580.105.08"
OLD_DRIVER = "595.91.07"
#: Every node may upgrade at once (the chart's default, 1 at a time, waits 2 minutes per node).
PARALLEL_UPGRADES = {"maxParallelUpgrades": 0, "maxUnavailable": "100%"}


class Operated:
    def __init__(self, cluster: Any, operator: GpuOperator) -> None:
        self.cluster = cluster
        self.operator = operator
        self.kubeconfig = str(cluster.kubeconfig_path)

    def daemonsets(self) -> dict[str, str]:
        """``namespace/name`` → uid of every DaemonSet."""
        return {
            f"{d['metadata']['namespace']}/{d['metadata']['name']}": d["metadata"]["uid"]
            for d in self.operator.daemonsets()
        }

    def policy(self) -> dict[str, Any]:
        return self.operator.get("nvidia.com/v1", "ClusterPolicy", CLUSTER_POLICY)


@pytest.fixture(scope="module")
def operated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operated]:
    """4 GPU nodes whose stack the real GPU Operator runs, its ClusterPolicy ``ready``."""
    try:
        with open_cluster("real", nodes=NODES, seed=32) as cluster:
            operator = GpuOperator(cluster.plane, tmp_path_factory.mktemp("gpu-operator"))
            try:
                operator.prepare([n["metadata"]["name"] for n in operator.nodes()])
                operator.start()
                operator.apply(cluster_policy(upgradePolicy=PARALLEL_UPGRADES))
                ready_s = operator.wait_ready()
                print(f"\nClusterPolicy ready {ready_s:.1f} s after it was applied")
                yield Operated(cluster, operator)
            except OperatorUnavailable as exc:
                require_control_plane(ControlPlaneUnavailable(str(exc)))
            finally:
                operator.stop()
    except ControlPlaneUnavailable as exc:
        require_control_plane(exc)


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("GPUCERT_STORE", str(tmp_path / "store"))
    return tmp_path / "store"


def _configure(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any] | None, str]:
    """``gpucert configure ARGS --json``: (exit status, the result, stderr)."""
    capsys.readouterr()
    code = main(["configure", *args, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def test_configure_adopts_the_operator_and_adds_nothing(
    operated: Operated, store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    daemonsets, policy = operated.daemonsets(), operated.policy()
    assert len(daemonsets) == 8, daemonsets  # the operator's 8, nothing of gpucert's

    code, result, err = _configure(capsys, "--kubeconfig", operated.kubeconfig)

    assert code == 0, err
    assert result is not None
    assert result["installer"] == "gpu-operator"
    assert any("NVIDIA GPU Operator v26.7.0" in line for line in result["found"]), result["found"]
    assert result["release"] == "26.7.0"
    assert result["objects"] == []
    assert result["operator_changes"] == []
    assert result["gpus_verified"] == NODES * 8
    assert result["drift"] == []
    assert operated.daemonsets() == daemonsets  # no DaemonSet added, none replaced
    after = operated.policy()
    assert after["metadata"]["resourceVersion"] == policy["metadata"]["resourceVersion"]


def test_dry_run_shows_the_operator_path_and_the_change(
    operated: Operated, store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = operated.policy()["metadata"]["resourceVersion"]

    code, result, err = _configure(
        capsys, "--kubeconfig", operated.kubeconfig, "--set", f"driver={NEW_DRIVER}", "--dry-run", str(tmp_path / "out")
    )

    assert code == 0, err
    assert result is not None
    assert result["installer"] == "gpu-operator"
    assert result["operator_changes"] == [f"ClusterPolicy {CLUSTER_POLICY}: driver {OLD_DRIVER} → {NEW_DRIVER}"]
    [written] = result["dry_run_files"]
    objects = [d for d in yaml.safe_load_all(Path(written).read_text()) if d]
    assert objects == [
        {
            "apiVersion": "nvidia.com/v1",
            "kind": "ClusterPolicy",
            "metadata": {"name": CLUSTER_POLICY},
            "spec": {"driver": {"version": NEW_DRIVER}},
        }
    ]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["gpu-operator-changes.yaml"]
    assert operated.policy()["metadata"]["resourceVersion"] == before


def test_both_installers_are_refused_with_exit_2(
    operated: Operated, store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # gpucert's own device plugin left from before the operator came: two installers of the stack.
    own = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {
            "name": "nvidia-device-plugin",
            "namespace": "default",
            "labels": {"app.kubernetes.io/part-of": "gpucert", "app.kubernetes.io/component": "device-plugin"},
        },
        "spec": {
            "selector": {"matchLabels": {"app": "gpucert-device-plugin"}},
            "template": {
                "metadata": {"labels": {"app": "gpucert-device-plugin", "app.kubernetes.io/part-of": "gpucert"}},
                "spec": {"containers": [{"name": "plugin", "image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"}]},
            },
        },
    }
    operated.operator.apply(own, manager="test")
    before = operated.policy()["metadata"]["resourceVersion"]
    try:
        code, _, err = _configure(capsys, "--kubeconfig", operated.kubeconfig, "--set", f"driver={NEW_DRIVER}")
        assert code == 2
        assert "GPU Operator v26.7.0" in err, err
        assert "gpucert's own stack (default/nvidia-device-plugin)" in err, err
        assert "two installers run the GPU stack on this cluster: the GPU Operator and gpucert" in err

        code, _, err = _configure(capsys, "--kubeconfig", operated.kubeconfig, "--installer", "gpucert")
        assert code == 2
        assert "GPU Operator" in err, err
    finally:
        from kubernetes import client

        with operated.cluster.plane.api_client() as api:
            client.AppsV1Api(api).delete_namespaced_daemon_set("nvidia-device-plugin", "default")
    assert operated.policy()["metadata"]["resourceVersion"] == before  # nothing written


def test_driver_change_through_the_operator_rolls_out_and_certifies(
    operated: Operated, store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    daemonsets = operated.daemonsets()
    # The fleet certified on the old driver (own baselines seeded), then one node goes bad.
    assert main(["certify", "--kubeconfig", operated.kubeconfig, "--store", str(store), "--json"]) == 0
    names = sorted(operated.operator.upgrade_states())
    broken = names[-1]
    operated.cluster.inject_fault(Fault("remap_failure", broken, 0))

    began = time.monotonic()
    code, result, err = _configure(
        capsys, "--kubeconfig", operated.kubeconfig, "--set", f"driver={NEW_DRIVER}", "--timeout", "300"
    )
    took = time.monotonic() - began

    assert code == 0, err
    assert result is not None
    print(
        f"\nconfigure --set driver={NEW_DRIVER}: {took:.1f} s in all; rollout {result['rollout_s']} s "
        f"(change to the last upgrade-done); certified {result['certified']}"
    )
    # Through the operator: its ClusterPolicy, gpucert the field's manager; its DaemonSet not touched by gpucert.
    policy = operated.policy()
    assert policy["spec"]["driver"]["version"] == NEW_DRIVER
    owners = {
        m["manager"]
        for m in policy["metadata"]["managedFields"]
        if "f:version" in ((m.get("fieldsV1") or {}).get("f:spec", {}).get("f:driver") or {})
    }
    assert owners == {"gpucert"}, owners
    assert operated.daemonsets() == daemonsets
    [driver_ds] = [d for d in operated.operator.daemonsets() if d["metadata"]["name"] == "nvidia-driver-daemonset"]
    assert driver_ds["spec"]["template"]["spec"]["containers"][0]["image"].endswith(f":{NEW_DRIVER}-ubuntu22.04")
    assert "gpucert" not in {m["manager"] for m in driver_ds["metadata"]["managedFields"]}
    # Followed to upgrade-done on each node, then certified, in the one run.
    assert result["rollout"] == dict.fromkeys(result["nodes"], "upgrade-done")
    assert len(result["nodes"]) == NODES
    assert set(operated.operator.upgrade_states().values()) == {"upgrade-done"}
    assert result["certified"] == {n: "failed" if n == broken else "certified" for n in names}
    # Their own baselines were taken on the old driver: re-seeded after the change.
    assert set(result["reseeded"]) >= set(names) - {broken}, result["reseeded"]
    [suspect] = result["suspects"]
    assert suspect.startswith(f"{broken} failed certification after its driver changed {OLD_DRIVER} → {NEW_DRIVER}")
    assert "the version change is the likeliest cause" in suspect
    assert result["drift"] == []
    nodes = {n["metadata"]["name"]: n["metadata"]["labels"] for n in operated.operator.nodes()}
    assert {labels["gpucert.io/stack.driver"] for labels in nodes.values()} == {NEW_DRIVER}
    assert all(labels[UPGRADE_STATE] == "upgrade-done" for labels in nodes.values())


def test_operate_reports_a_driver_moved_outside_gpucert(
    operated: Operated, store: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """After configure verified 580.105.08 (the test before), a hand edit of the ClusterPolicy puts the
    operator's driver back to 595.91.07: the night's operate names every node whose driver moved."""
    names = sorted(operated.operator.upgrade_states())
    labels = {n["metadata"]["name"]: n["metadata"]["labels"] for n in operated.operator.nodes()}
    assert {labels[n].get("gpucert.io/stack.driver") for n in names} == {NEW_DRIVER}  # configure verified it
    from kubernetes import client

    # The failed node repaired first: while gpucert's NoSchedule taint is on it, the operator's driver
    # DaemonSet (no toleration for it) would not place a driver pod there again once it is deleted.
    operated.cluster.clear_faults()
    with operated.cluster.plane.api_client() as api:
        core = client.CoreV1Api(api)
        for name in names:
            taints = api.sanitize_for_serialization(core.read_node(name))["spec"].get("taints") or []
            kept = [t for t in taints if t["key"] != "gpucert.io/unhealthy"]
            core.patch_node(name, {"spec": {"taints": kept or None}})
    # A hand edit, not gpucert: `kubectl edit clusterpolicy` (auto-upgrade off, the old driver), then
    # `kubectl delete pod` of the driver pods (its DaemonSet is always OnDelete) — not the upgrade controller,
    # whose fixed 2-minute poll would make this test wait up to two minutes for nothing it checks.
    with operated.cluster.plane.api_client() as api:
        client.CustomObjectsApi(api).patch_cluster_custom_object(
            "nvidia.com",
            "v1",
            "clusterpolicies",
            CLUSTER_POLICY,
            {"spec": {"driver": {"version": OLD_DRIVER, "upgradePolicy": {"autoUpgrade": False}}}},
            field_manager="kubectl-edit",
        )
    old_image = f":{OLD_DRIVER}-ubuntu22.04"

    def driver_daemonset_moved() -> bool:
        return any(
            d["metadata"]["name"].startswith("nvidia-driver-daemonset")
            and d["spec"]["template"]["spec"]["containers"][0]["image"].endswith(old_image)
            for d in operated.operator.daemonsets()
        )

    wait_for(
        driver_daemonset_moved,
        120,
        "the operator's driver DaemonSet on the old driver",
        tail=operated.operator.log_tail,
    )
    with operated.cluster.plane.api_client() as api:
        client.CoreV1Api(api).delete_collection_namespaced_pod(
            OPERATOR_NAMESPACE, label_selector="app.kubernetes.io/component=nvidia-driver"
        )

    def moved() -> bool:
        images = operated.operator.driver_images()
        return sorted(images) == names and all(i.endswith(old_image) for i in images.values())

    wait_for(moved, 120, "driver pods on the old driver on every node", tail=operated.operator.log_tail)

    capsys.readouterr()
    code = main(
        [
            "operate",
            "--kubeconfig",
            operated.kubeconfig,
            "--store",
            str(store),
            "--scrape-interval",
            "1",
            "--max-nodes",
            "1",
            "--json",
        ]
    )
    out, err = capsys.readouterr()
    # 4, not a clean night, and only because this is a real API server: it refuses loopback addresses in
    # Endpoints ("may not be in the loopback range"), and the simulated exporter pods' are loopback, so the
    # operator's exporter Service lists none. operate looked for it where the operator runs it, which every
    # unread node's reason says (the exporter read on every node: tests/test_exporter_sources.py, on the sim).
    assert code == 4, err
    night = json.loads(out)
    assert sorted(night["unreadable"]) == names, night["unreadable"]
    for node in names:
        assert OPERATOR_NAMESPACE in night["unreadable"][node], night["unreadable"]
    assert f"{OPERATOR_EXPORTER_SELECTOR} in namespace {OPERATOR_NAMESPACE}" in night["telemetry_missing"]
    assert sorted(night["stack_drift"]) == names, night["stack_drift"]
    for node in names:
        assert night["stack_drift"][node].startswith(f"driver {NEW_DRIVER} → {OLD_DRIVER}"), night["stack_drift"]


OPERATOR_NAMESPACE = "gpu-operator"
STACK_NAMESPACE = "gpucert-system"


def test_operate_finds_the_operators_exporter_with_the_runtime_roles_only(operated: Operated, tmp_path: Path) -> None:
    """The real operator's exporter is where operate looks (its pods' namespace, its Service's label and
    port), and gpucert-runtime may list its Endpoints there with the Role configure renders for it — and
    not without it (the real authorizer judges)."""
    admin = connect(operated.kubeconfig)
    sources = exporter_sources(admin, STACK_NAMESPACE)
    assert ExporterSource(OPERATOR_NAMESPACE, OPERATOR_EXPORTER_SELECTOR) in sources, sources
    services = admin.list_objects("v1", "Service", OPERATOR_NAMESPACE, label_selector=OPERATOR_EXPORTER_SELECTOR)
    assert [(s["metadata"]["name"], [(p.get("name"), p["port"]) for p in s["spec"]["ports"]]) for s in services] == [
        ("nvidia-dcgm-exporter", [("gpu-metrics", 9400)])
    ]

    rbac = [m.obj for m in render_rbac(STACK_NAMESPACE, OPERATOR_NAMESPACE)]
    admin.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": STACK_NAMESPACE}})
    runtime_objects = [o for o in rbac if o["metadata"]["name"] == "gpucert-runtime"]
    exporter_role = [o for o in rbac if o["metadata"]["name"] == "gpucert-runtime-exporters"]
    assert len(exporter_role) == 2  # the Role and its binding, in the operator's namespace
    for obj in runtime_objects:
        admin.apply(obj)
    runtime = connect(
        operated.cluster.plane.kubeconfig_for(STACK_NAMESPACE, "gpucert-runtime", tmp_path / "runtime.kubeconfig")
    )
    own = ExporterSource(STACK_NAMESPACE)

    def runtime_roles_held() -> bool:
        try:
            ExporterScrape(runtime, sources=[own]).targets()
        except TelemetryError:
            return False
        return exporter_sources(runtime, STACK_NAMESPACE) == sources

    _within(20, runtime_roles_held)  # the authorizer's RBAC cache follows the objects within moments
    # The runtime roles alone: the operator's namespace is found (its pods, listed cluster-wide), its
    # Endpoints refused.
    operator = ExporterSource(OPERATOR_NAMESPACE, OPERATOR_EXPORTER_SELECTOR)
    with pytest.raises(TelemetryError, match=f"(?i)namespace '{OPERATOR_NAMESPACE}'.*forbidden"):
        ExporterScrape(runtime, sources=[operator]).targets()
    # Beside gpucert's own place, which it may list, the refusal costs the operator's exporters, named
    # with each node, not the night.
    night = ExporterScrape(runtime, sources=sources).read(run_id="operate-refused", interval_s=0, nodes=["n1"])
    assert "forbidden" in night.problems["n1"].lower(), night.problems
    assert f"namespace '{OPERATOR_NAMESPACE}'" in night.problems["n1"], night.problems
    for obj in exporter_role:
        admin.apply(obj)

    def exporters_listed() -> bool:
        try:
            night = ExporterScrape(runtime, sources=sources).read(run_id="operate-held", interval_s=0, nodes=["n1"])
        except TelemetryError:
            return False
        # No source refused: no loopback address is listed, so no exporter, and nothing forbidden.
        return "forbidden" not in night.problems["n1"].lower()

    _within(20, exporters_listed)


def _within(seconds: float, probe: Any) -> None:
    deadline = time.monotonic() + seconds
    while not probe():
        assert time.monotonic() < deadline, f"not within {seconds} s: {probe.__name__}"
        time.sleep(0.2)
