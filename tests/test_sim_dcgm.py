"""The simulated DCGM exporters, scraped over HTTP as Prometheus would and parsed by prometheus_client.

Names, types and labels are checked exactly (dcgm-exporter's, docs/reference/telemetry.md, "DCGM exporter");
values against the fleet model: a healthy GPU looks healthy, each injected fault shows its signature
(docs/design/simulator.md, "Fault catalogue"), and counters grow between two scrapes so ``rate()`` works. The
exporters are found through the exporter Service's Endpoints, read with the official client, as operate finds
them.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any, TypeVar

import pytest
from kubernetes import client
from prometheus_client.parser import text_string_to_metric_families

from gpucert.errors import InputError
from gpucert_sim import METRICS_PATH_ANNOTATION, STACK_NAMESPACE, SimCluster
from gpucert_sim._dcgm import METRICS
from gpucert_sim.fleet import Fault

from .conftest import eventually

T = TypeVar("T")
Series = dict[tuple[str, int], float]  # (metric, gpu) → value
LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname", "DCGM_FI_DRIVER_VERSION"}


def node(i: int) -> str:
    return f"gpu-node-{i:05d}"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=6, gpus=8, model="NVIDIA H200", seed=5, preconfigured=True) as cluster:
        yield cluster
        assert cluster.runtime is not None
        assert cluster.runtime.errors == []


def fetch(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.headers["Content-Type"], exc.read().decode()


def scrape(sim: SimCluster, name: str) -> tuple[str, list[Any]]:
    code, content_type, text = fetch(f"{sim.url}/dcgm/{name}/metrics")
    assert code == 200, text
    assert content_type.startswith("text/plain; version=0.0.4")
    return text, list(text_string_to_metric_families(text))


def samples(families: list[Any]) -> list[tuple[str, dict[str, str], float]]:
    """(name as exposed, labels, value); prometheus_client's parser appends "_total" to counter samples."""
    return [(f.name if s.name == f.name + "_total" else s.name, s.labels, s.value) for f in families for s in f.samples]


def values(families: list[Any]) -> Series:
    return {(name, int(labels["gpu"])): value for name, labels, value in samples(families)}


def test_names_types_and_labels_are_dcgm_exporters(sim: SimCluster) -> None:
    text, families = scrape(sim, node(0))
    types = {f.name: f.type for f in families}
    always = {name: kind for name, kind, _ in METRICS if not name.startswith("DCGM_EXP_")}
    # prometheus_client names a counter family without a "_total" it does not have; the samples keep the name.
    assert {name: types.get(name) for name in always} == always
    for name, kind, help_text in METRICS:
        if name in always:
            assert f"# HELP {name} {help_text}\n# TYPE {name} {kind}\n" in text
    for name in always:  # DCGM's exact names: no "_total" added to the counters
        assert f'\n{name}{{gpu="0",UUID=' in text
    assert "_total" not in text
    found = samples(families)
    assert {name for name, _, _ in found} >= set(always)
    uuids = {str(u) for u in sim.fleet.uuids[8:16]}
    for _, labels, _ in found:
        assert set(labels) - {"xid", "clock_event", "window_size_in_ms"} == LABELS, labels
        assert labels["hostname"] == node(0)
        assert labels["modelName"] == "NVIDIA H200"
        assert labels["device"] == f"nvidia{labels['gpu']}"
        assert labels["UUID"] == str(sim.fleet.uuids[int(labels["gpu"])])
        assert labels["UUID"] not in uuids
    assert sorted({labels["pci_bus_id"] for _, labels, _ in found}) == sorted(
        f"00000000:{b}:00.0" for b in ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
    )


def test_a_healthy_node_looks_healthy(sim: SimCluster) -> None:
    _, families = scrape(sim, node(1))
    v = values(families)
    for g in range(8):
        assert v["DCGM_FI_DEV_PCIE_LINK_GEN", g] == v["DCGM_FI_DEV_PCIE_MAX_LINK_GEN", g] == 5
        assert v["DCGM_FI_DEV_PCIE_LINK_WIDTH", g] == v["DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", g] == 16
        assert int(v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS", g]) & (0x08 | 0x20 | 0x40 | 0x80) == 0
        assert 45 <= v["DCGM_FI_DEV_GPU_TEMP", g] < v["DCGM_FI_DEV_SLOWDOWN_TEMP", g] == 89
        assert v["DCGM_FI_DEV_ENFORCED_POWER_LIMIT", g] == v["DCGM_FI_DEV_POWER_MGMT_LIMIT", g] == 700
        assert 0 < v["DCGM_FI_DEV_POWER_USAGE", g] <= 700
        assert v["DCGM_FI_DEV_SM_CLOCK", g] >= 1900
        for name in (
            "DCGM_FI_DEV_THERMAL_VIOLATION",
            "DCGM_FI_DEV_POWER_VIOLATION",
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "DCGM_FI_DEV_ROW_REMAP_PENDING",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        ):
            assert v[name, g] == 0, name
        assert v["DCGM_FI_DEV_XID_ERRORS", g] in (0, 13, 31, 43)  # at most an application XID


def test_fault_signatures_and_counters_that_grow(sim: SimCluster) -> None:
    target = node(2)
    sim.inject_fault(Fault("pcie_gen4", target, gpu=2))
    sim.inject_fault(Fault("hw_thermal", target, gpu=0, params={"duty": 0.5}))
    sim.inject_fault(Fault("pcie_replay", target, gpu=3, params={"replays_per_min": 6000.0}))
    sim.inject_fault(Fault("nvlink_crc", target, gpu=4, params={"crc_per_s": 500.0}))
    try:
        # The counters count from the fault's start: a scrape within a few ms of it may read 0 replays yet.
        time.sleep(0.1)
        _, first = scrape(sim, target)
        time.sleep(0.3)
        _, second = scrape(sim, target)
    finally:
        sim.clear_faults(target)
    a, b = values(first), values(second)
    assert b["DCGM_FI_DEV_PCIE_LINK_GEN", 2] == 4 < b["DCGM_FI_DEV_PCIE_MAX_LINK_GEN", 2] == 5
    assert int(b["DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 0]) & 0x48 == 0x48  # HW thermal + HW slowdown
    assert b["DCGM_FI_DEV_GPU_TEMP", 0] >= b["DCGM_FI_DEV_SLOWDOWN_TEMP", 0]
    assert b["DCGM_FI_DEV_SM_CLOCK", 0] <= 1000  # halved while the slowdown is active
    assert b["DCGM_FI_DEV_THERMAL_VIOLATION", 0] > a["DCGM_FI_DEV_THERMAL_VIOLATION", 0] > 0
    events = {
        labels["clock_event"]: value
        for name, labels, value in samples(second)
        if name == "DCGM_EXP_CLOCK_EVENTS_COUNT" and labels["gpu"] == "0"
    }
    assert events["hw_thermal"] > 0
    assert b["DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 3] > a["DCGM_FI_DEV_PCIE_REPLAY_COUNTER", 3] > 0
    crc = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    assert b[crc, 4] > a[crc, 4] > 0
    for g in (1, 5, 6, 7):  # the other GPUs are untouched
        assert b["DCGM_FI_DEV_PCIE_LINK_GEN", g] == 5
        assert b["DCGM_FI_DEV_THERMAL_VIOLATION", g] == 0
    after = values(scrape(sim, target)[1])
    assert after["DCGM_FI_DEV_PCIE_LINK_GEN", 2] == 5  # lifted: repaired


def test_row_remap_xids_and_a_gpu_off_the_bus(sim: SimCluster) -> None:
    target = node(3)
    sim.inject_fault(Fault("remap_pending", target, gpu=1, params={"crash": 0.0}))
    sim.inject_fault(Fault("fallen_off_bus", target, gpu=5))
    try:
        _, families = scrape(sim, target)
    finally:
        sim.clear_faults(target)
    v = values(families)
    assert {g for _, g in v} == {0, 1, 2, 3, 4, 6, 7}  # the lost GPU's series are gone
    assert v["DCGM_FI_DEV_ROW_REMAP_PENDING", 1] == 1
    assert v["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", 1] == 1
    assert v["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", 1] == 1
    assert v["DCGM_FI_DEV_XID_ERRORS", 1] == 63  # the last XID: 48 then 63
    xids = {
        labels["xid"]: value
        for name, labels, value in samples(families)
        if name == "DCGM_EXP_XID_ERRORS_COUNT" and labels["gpu"] == "1"
    }
    assert xids["48"] == xids["63"] == 1


def test_no_exporter_on_a_missing_or_not_ready_node(sim: SimCluster) -> None:
    assert fetch(f"{sim.url}/dcgm/no-such-node/metrics")[0] == 404
    sim.set_node_ready(node(4), False)
    try:
        assert fetch(f"{sim.url}/dcgm/{node(4)}/metrics")[0] == 404
    finally:
        sim.set_node_ready(node(4), True)
    assert fetch(f"{sim.url}/dcgm/{node(4)}/metrics")[0] == 200


def _drivers(sim: SimCluster, name: str) -> set[str | None]:
    return {labels.get("DCGM_FI_DRIVER_VERSION") for _, labels, _ in samples(scrape(sim, name)[1])}


def test_the_exporter_reports_the_driver_the_node_runs() -> None:
    """The driver configure installed (seeded on a preconfigured cluster), and after an upgrade the new one
    on that node only — never a fixed version; a node with no driver loaded carries no driver label."""
    from gpucert.kube import connect

    from .test_sim_benchlogs import NEW_DRIVER, running_image, seeded_driver, upgrade_driver

    with SimCluster(nodes=2, gpus=8, model="NVIDIA H200", seed=21, preconfigured=True) as sim:
        kube = connect(sim.kubeconfig_path)
        seeded = seeded_driver(kube)
        for target in (node(0), node(1)):
            eventually(lambda t=target: running_image(kube, t))  # type: ignore[misc]
            assert _drivers(sim, target) == {seeded}
        upgrade_driver(kube, node(0), NEW_DRIVER)
        eventually(lambda: (running_image(kube, node(0)) or "").endswith(f":{NEW_DRIVER}-ubuntu22.04"), 10)
        assert _drivers(sim, node(0)) == {NEW_DRIVER}
        assert _drivers(sim, node(1)) == {seeded}
    with SimCluster(nodes=1, gpus=2, seed=3) as bare:  # not configured: no driver loaded anywhere
        assert _drivers(bare, node(0)) == {None}


def test_the_older_hostname_label() -> None:
    with SimCluster(nodes=1, gpus=2, controllers=False, dcgm_host_label="Hostname") as small:
        _, families = scrape(small, node(0))
        assert all(s.labels["Hostname"] == node(0) and "hostname" not in s.labels for f in families for s in f.samples)
    with pytest.raises(InputError, match="host label"):
        SimCluster(nodes=1, dcgm_host_label="host")


def _targets(endpoints: client.V1Endpoints) -> tuple[list[str], list[str]]:
    subsets = endpoints.subsets or []
    ready = [a.node_name for s in subsets for a in s.addresses or ()]
    not_ready = [a.node_name for s in subsets for a in s.not_ready_addresses or ()]
    return ready, not_ready


def test_preconfigured_endpoints_list_every_node_and_lead_to_its_exporter(sim: SimCluster) -> None:
    core = client.CoreV1Api(sim.api_client())
    found = core.list_namespaced_endpoints(
        STACK_NAMESPACE, label_selector="app.kubernetes.io/part-of=gpucert,app.kubernetes.io/component=dcgm-exporter"
    )
    assert [e.metadata.name for e in found.items] == ["nvidia-dcgm-exporter"]
    endpoints = found.items[0]
    ready, _ = _targets(endpoints)
    assert ready == [node(i) for i in range(6)]
    template = endpoints.metadata.annotations[METRICS_PATH_ANNOTATION]
    subset = endpoints.subsets[0]
    assert [p.port for p in subset.ports] == [sim.port]
    for address in subset.addresses:
        url = f"http://{address.ip}:{subset.ports[0].port}{template.format(node=address.node_name)}"
        assert fetch(url)[0] == 200

    sim.set_node_ready(node(5), False)
    try:

        def moved() -> bool:
            r, n = _targets(core.read_namespaced_endpoints("nvidia-dcgm-exporter", STACK_NAMESPACE))
            return node(5) not in r and n == [node(5)]

        eventually(moved)
    finally:
        sim.set_node_ready(node(5), True)


def test_endpoints_follow_the_exporter_daemonset_when_applied() -> None:
    with SimCluster(nodes=3, gpus=8, seed=9) as bare:
        api = bare.api_client()
        core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
        labels = {"app.kubernetes.io/part-of": "gpucert", "app.kubernetes.io/component": "dcgm-exporter"}
        pod_labels = {"app": "dcgm-exporter"}
        core.create_namespace({"metadata": {"name": "gpu-stack"}})
        core.create_namespaced_service(
            "gpu-stack",
            {
                "metadata": {"name": "dcgm-exporter", "labels": labels},
                "spec": {"selector": pod_labels, "ports": [{"name": "gpu-metrics", "port": 9400}]},
            },
        )
        apps.create_namespaced_daemon_set(
            "gpu-stack",
            {
                "metadata": {"name": "dcgm-exporter", "labels": labels},
                "spec": {
                    "selector": {"matchLabels": pod_labels},
                    "template": {
                        "metadata": {"labels": {**pod_labels, **labels}},
                        "spec": {
                            "containers": [{"name": "exporter", "image": "nvcr.io/nvidia/k8s/dcgm-exporter:4.2.3"}]
                        },
                    },
                },
            },
        )

        def listed() -> client.V1Endpoints | None:
            try:
                endpoints = core.read_namespaced_endpoints("dcgm-exporter", "gpu-stack")
            except client.ApiException:
                return None
            return endpoints if _targets(endpoints)[0] == [node(i) for i in range(3)] else None

        endpoints = eventually(listed)
        refs = [a.target_ref for a in endpoints.subsets[0].addresses]
        assert all(r.kind == "Pod" and r.name.startswith("dcgm-exporter-") for r in refs)
        assert endpoints.subsets[0].ports[0].name == "gpu-metrics"
        assert endpoints.subsets[0].ports[0].port == bare.port

        bare.inject({"nodes": [{"event": "join", "count": 1}]})
        # The joining node is tainted uncertified: the exporter DaemonSet (no toleration) skips it.
        time.sleep(0.2)
        assert _targets(core.read_namespaced_endpoints("dcgm-exporter", "gpu-stack"))[0] == [node(i) for i in range(3)]
        # A real API server answers a Service delete with the Service, as the client expects.
        deleted = core.delete_namespaced_service("dcgm-exporter", "gpu-stack")
        assert deleted.metadata.name == "dcgm-exporter"
        eventually(lambda: not core.list_namespaced_endpoints("gpu-stack").items)
        assert bare.runtime is not None
        assert bare.runtime.errors == []
