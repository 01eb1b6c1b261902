"""gpucert's Kubernetes paths on both servers: ``gpucert sim`` and a real control plane (issue 29).

One runbook per server, from one parametrised fixture, each step checked as a platform team would check it:
configure a bare cluster (a second run writes nothing, an outside change is reverted), certify it with the
pair benchmarks on (the links step measured), a fault found and tainted, an observe-only run that writes
no taint, the Events in ``kubectl describe node``, every write under gpucert's field manager. On the real
server the audit log must show no request of gpucert's refused (no 422, no 403). Where the two servers
disagree, the real one is right.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucert.audit import AuditLog
from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.store import StoreLocation
from gpucert.certify import CertifyOutcome
from gpucert.flows.certify import certify
from gpucert.flows.configure import configure
from gpucert.flows.onboard import onboard
from gpucert.flows.operate import operate
from gpucert.flows.release import release
from gpucert.kube import FIELD_MANAGER, Kube, Reconnect, announce_joined_nodes, connect
from gpucert.store import open_store
from gpucert_sim.fleet import Fault

from .conftest import eventually
from .realcluster import SERVERS, open_cluster

pytestmark = pytest.mark.usefixtures("prefect_harness")

PAIRS = CertificationPolicy(policy={"network": {"pairs": True}})
_NODES = 8
_PREFIX = "gpucert.io"


@pytest.fixture(params=SERVERS)
def cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    with open_cluster(request.param, nodes=_NODES, nodes_per_leaf=4, seed=5) as opened:
        yield opened


def _certify(cluster: Any, store: Path, run_id: str, **kwargs: Any) -> CertifyOutcome:
    return asyncio.run(
        certify(
            cluster=GpuCluster(kubeconfig=str(cluster.kubeconfig_path)),
            store=StoreLocation(uri=f"file://{store}"),
            policy=PAIRS,
            run_id=run_id,
            **kwargs,
        )
    )


def _versions(kube: Kube) -> dict[tuple[str, str, str], str]:
    """Every object configure manages → its resourceVersion (Nodes: their labels, which configure writes;
    their status moves with every kubelet heartbeat on a real cluster)."""
    out: dict[tuple[str, str, str], str] = {}
    for api_version, kind in (
        ("v1", "ServiceAccount"),
        ("v1", "ConfigMap"),
        ("v1", "Service"),
        ("apps/v1", "DaemonSet"),
    ):
        for obj in kube.list_objects(api_version, kind, namespace="gpucert-system"):
            out[(kind, obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj["metadata"]["resourceVersion"]
    for node in kube.nodes():
        out[("Node", "", node["metadata"]["name"])] = str(sorted((node["metadata"].get("labels") or {}).items()))
    return out


def _node_events(kube: Kube, node: dict[str, Any]) -> list[dict[str, Any]]:
    """The Events ``kubectl describe node`` shows: its exact field selector (name, namespace, kind, uid)."""
    meta = node["metadata"]
    selector = (
        f"involvedObject.name={meta['name']},involvedObject.namespace=,"
        f"involvedObject.kind=Node,involvedObject.uid={meta['uid']}"
    )
    return kube.list_objects("v1", "Event", field_selector=selector)


def _refused(cluster: Any) -> list[str]:
    """gpucert's requests the real API server refused as invalid or forbidden (its audit log)."""
    if cluster.server != "real":
        return []
    return [
        f"{e['verb']} {e['requestURI']} → {e['responseStatus'].get('code')}"
        for e in cluster.plane.audit()
        if e.get("responseStatus", {}).get("code") in (400, 403, 422)
        and (e.get("user") or {}).get("username") == "gpucert-test-admin"
    ]


def test_configure_certify_with_pairs_and_taint_on_both_servers(cluster: Any, tmp_path: Path) -> None:
    kube = connect(cluster.kubeconfig_path)
    names = cluster.fleet.node_names

    # configure: the stack on bare nodes, GPUs advertised; a second run writes nothing.
    configured = configure(cluster=GpuCluster(kubeconfig=str(cluster.kubeconfig_path)), rollout_timeout_s=240)
    assert configured.gpus_verified == _NODES * 8
    before = _versions(kube)
    configure(cluster=GpuCluster(kubeconfig=str(cluster.kubeconfig_path)), rollout_timeout_s=240)
    assert _versions(kube) == before

    # An outside change to a field gpucert owns is put back by the next run.
    plugin = next(
        d
        for d in kube.list_objects("apps/v1", "DaemonSet", namespace="gpucert-system")
        if "device-plugin" in d["metadata"]["name"]
    )
    image = plugin["spec"]["template"]["spec"]["containers"][0]["image"]
    kube.merge_patch(
        "apps/v1",
        "DaemonSet",
        plugin["metadata"]["name"],
        {
            "spec": {
                "template": {
                    "spec": {
                        "containers": [
                            {
                                "name": plugin["spec"]["template"]["spec"]["containers"][0]["name"],
                                "image": "example.invalid/hand-edited:1",
                            }
                        ]
                    }
                }
            }
        },
        namespace="gpucert-system",
    )
    configure(cluster=GpuCluster(kubeconfig=str(cluster.kubeconfig_path)), rollout_timeout_s=240)
    restored = kube.get("apps/v1", "DaemonSet", plugin["metadata"]["name"], namespace="gpucert-system")
    assert restored["spec"]["template"]["spec"]["containers"][0]["image"] == image

    # certify with pairs: every node decided, the pair benchmarks measured.
    clean = _certify(cluster, tmp_path, "real-clean")
    assert {d.node for d in clean.decisions} == set(names)
    assert clean.links, "the pair benchmarks ran and were judged"
    nodes = {n["metadata"]["name"]: n for n in kube.nodes()}
    decided = {d.node: d for d in clean.decisions}
    for name in names:
        labels = nodes[name]["metadata"]["labels"]
        assert labels.get(f"{_PREFIX}/state") in ("certified", "degraded", "failed"), (name, decided[name])
        conditions = {c["type"]: c for c in nodes[name]["status"].get("conditions") or ()}
        assert "GpuCertified" in conditions, name
        taints = {t["key"] for t in nodes[name]["spec"].get("taints") or ()}
        assert f"{_PREFIX}/testing" not in taints, (name, taints)

    # A fault in observe-only: reported, never tainted — not even while under test.
    sick = next(d.node for d in clean.decisions if d.state == "certified")
    cluster.inject_fault(Fault("hw_thermal", sick, 3))
    try:
        watched = _certify(cluster, tmp_path, "real-observe", nodes=[sick], observe_only=True)
        assert not watched.tainted
        # Not even while under test: the audit trail records every taint gpucert added, when it was added.
        trail = AuditLog(open_store(f"file://{tmp_path}").objects).history(node=sick)
        assert not [e for e in trail if e["run_id"] == "real-observe" and e["action"] == "taint.add"]
        assert [e for e in trail if e["run_id"] == "real-clean" and e["action"] == "taint.add"], (
            "the acting run's testing taint is in the trail (the check above can see one)"
        )
        assert not any(t["key"].startswith(_PREFIX) for t in kube.get("v1", "Node", sick)["spec"].get("taints") or ())
        events = _node_events(kube, kube.get("v1", "Node", sick))
        assert events, "gpucert's Events are listed by kubectl describe node's query"
        # The same run, acting: the fault is confirmed and tainted.
        acted = _certify(cluster, tmp_path, "real-night", nodes=[sick])
    finally:
        cluster.clear_faults()
    assert sick in acted.tainted, acted.decisions
    node = kube.get("v1", "Node", sick)
    assert any(t["key"] == f"{_PREFIX}/unhealthy" for t in node["spec"].get("taints") or ())

    if cluster.server == "real":
        # Every write of gpucert's is filed under its field manager, none under the client's user agent.
        managers = {m.get("manager") for m in node["metadata"].get("managedFields") or ()}
        assert FIELD_MANAGER in managers, managers
        assert not any(str(m).startswith("OpenAPI-Generator") for m in managers), managers
        assert not _refused(cluster), _refused(cluster)
        kubectl = shutil.which("kubectl")
        if kubectl:
            shown = subprocess.run(
                [kubectl, "--kubeconfig", str(cluster.kubeconfig_path), "describe", "node", sick],
                capture_output=True,
                text=True,
                timeout=60,
                check=True,
            ).stdout
            events_section = shown.split("Events:", 1)[1]
            assert "gpucert" in events_section, shown[-2000:]


def _restart(cluster: Any, down_s: float) -> None:
    """The API server away ``down_s`` seconds, then back with everything it held."""
    if cluster.server == "real":
        cluster.plane.restart_apiserver(down_s)
        return
    cluster.stop()
    time.sleep(down_s)
    cluster.start()


@pytest.fixture(params=SERVERS)
def configured(request: pytest.FixtureRequest) -> Iterator[Any]:
    with open_cluster(request.param, nodes=4, nodes_per_leaf=4, seed=6, preconfigured=True) as opened:
        yield opened


def test_a_join_through_a_restart_is_onboarded_and_a_repair_released_on_both_servers(
    configured: Any, tmp_path: Path
) -> None:
    cluster = configured
    kube = connect(cluster.kubeconfig_path)
    store = StoreLocation(uri=f"file://{tmp_path}")
    gpu_cluster = GpuCluster(kubeconfig=str(cluster.kubeconfig_path))

    # watch-nodes through an API server restart: what joined is announced once, nothing twice.
    announced: list[str] = []
    done = threading.Event()
    failed: list[BaseException] = []

    def follow() -> None:
        try:
            announce_joined_nodes(
                connect(cluster.kubeconfig_path),
                prefix=_PREFIX,
                selector=None,
                timeout_s=1,
                emit=lambda name, uid: announced.append(name),
                stop=done.is_set,
                reconnect=Reconnect(base_delay_s=0.2, max_delay_s=1.0),
            )
        except BaseException as exc:  # re-raised in the test's thread
            failed.append(exc)

    watcher = threading.Thread(target=follow, daemon=True)
    watcher.start()
    try:
        [first] = cluster.add_nodes(1, uncertified_taint=f"{_PREFIX}/uncertified")
        eventually(lambda: announced == [first], timeout_s=30)
        _restart(cluster, 2.0)
        [second] = cluster.add_nodes(1, uncertified_taint=f"{_PREFIX}/uncertified")
        eventually(lambda: second in announced, timeout_s=60)
        time.sleep(2)  # watched on: a second announcement of anything would come now
    finally:
        done.set()
        watcher.join(timeout=30)
    assert not failed, failed
    assert announced == [first, second]

    # onboard: the node joined bare is configured, certified and admitted.
    uid = kube.get("v1", "Node", second)["metadata"]["uid"]
    onboarded = asyncio.run(onboard(node=second, uid=uid, cluster=gpu_cluster, store=store))
    assert (onboarded.state, onboarded.admitted) == ("certified", True), onboarded
    node = kube.get("v1", "Node", second)
    assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert not [t for t in node["spec"].get("taints") or () if t["key"].startswith(f"{_PREFIX}/")]

    # A fault certified and tainted, repaired, released: the taint lifted by the re-certification.
    sick = cluster.fleet.node_names[1]
    cluster.inject_fault(Fault("pcie_gen4", sick, 2))
    try:
        night = asyncio.run(certify(cluster=gpu_cluster, store=store, run_id="real-fault"))
    finally:
        cluster.clear_faults()
    assert night.tainted == [sick], night.decisions
    released = asyncio.run(release(nodes=[sick], cluster=gpu_cluster, store=store))
    assert released.released == [sick]
    assert not [
        t for t in kube.get("v1", "Node", sick)["spec"].get("taints") or () if t["key"] == f"{_PREFIX}/unhealthy"
    ]

    # operate: a night's telemetry, every GPU node either read or named unread with its reason.
    night_out = asyncio.run(operate(cluster=gpu_cluster, store=store, rotation_days=0.0, scrape_interval_s=0.5))
    gpu_nodes = {n["metadata"]["name"] for n in kube.nodes()}
    read, unread = set(night_out.telemetry_read), set(night_out.unreadable)
    assert read | unread == gpu_nodes, (read, night_out.unreadable)
    if cluster.server == "sim":
        # Only the node that joined and was never onboarded: no stack, so no exporter there.
        assert unread == {first}, night_out.unreadable
        assert night_out.unreadable[first].startswith("no exporter")
        assert night_out.telemetry_missing is None
    else:
        # The attached kubelets' pods have loopback addresses, which the endpoint controllers refuse: the
        # exporter Service lists none, and operate says so instead of calling the night clean.
        assert not read
        assert night_out.telemetry_missing is not None
        assert "no DCGM exporter found" in night_out.telemetry_missing
    assert not _refused(cluster), _refused(cluster)
