"""The simulator's indexes (issue 17: 10,000 nodes) answer exactly what a scan of every object would.

The store keeps its keys sorted and an index of label values and of owners; lists, pages, garbage
collection and the scheduler read them instead of scanning. Each test here churns objects through the
official client over HTTP and checks the indexed answer against an oracle computed from an unfiltered
list, so an index a step behind (a label changed, removed, an object deleted) fails it.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from gpucert_sim import SimCluster
from tests.conftest import eventually

NODES = 6


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    # The bare API: objects stay exactly as written, so the oracle sees what the indexes index.
    with SimCluster(nodes=NODES, gpus=8, seed=5, controllers=False) as cluster:
        yield cluster


def _names(items: list[Any]) -> list[str]:
    return [i.metadata.name for i in items]


def _oracle(pods: list[Any], want: dict[str, set[str] | None]) -> list[str]:
    """Names of the pods whose labels hold, for each key, one of its values (None: the key is absent)."""
    out = []
    for pod in pods:
        labels = pod.metadata.labels or {}
        if all((labels.get(k) in v) if v is not None else k not in labels for k, v in want.items()):
            out.append(pod.metadata.name)
    return sorted(out)


def test_label_selected_lists_follow_every_label_change_and_delete(core: client.CoreV1Api, ns: str) -> None:
    rng = random.Random(7)
    colours, sizes = ["red", "blue", "green"], ["s", "m"]
    for i in range(40):
        core.create_namespaced_pod(
            ns,
            {
                "metadata": {"name": f"p{i:02d}", "labels": {"colour": rng.choice(colours), "size": rng.choice(sizes)}},
                "spec": {"containers": [{"name": "c", "image": "pause"}]},
            },
        )
    for i in rng.sample(range(40), 15):  # change, drop and add labels; delete some pods
        labels: dict[str, str | None] = {"colour": rng.choice(colours)}
        if i % 3 == 0:
            labels["size"] = None
        if i % 4 == 0:
            labels["extra"] = "yes"
        core.patch_namespaced_pod(f"p{i:02d}", ns, {"metadata": {"labels": labels}})
    for i in rng.sample(range(40), 8):
        core.delete_namespaced_pod(f"p{i:02d}", ns)
    every = core.list_namespaced_pod(ns).items
    cases: list[tuple[str, dict[str, set[str] | None]]] = [
        ("colour=red", {"colour": {"red"}}),
        ("colour in (blue,green),size=m", {"colour": {"blue", "green"}, "size": {"m"}}),
        ("colour==green,!size", {"colour": {"green"}, "size": None}),
        ("extra=yes", {"extra": {"yes"}}),
        ("colour=purple", {"colour": {"purple"}}),
    ]
    for selector, want in cases:
        assert sorted(_names(core.list_namespaced_pod(ns, label_selector=selector).items)) == _oracle(every, want), (
            selector
        )
    # Across namespaces, the same answer: no other namespace has these labels.
    assert sorted(_names(core.list_pod_for_all_namespaces(label_selector="colour=red").items)) == _oracle(
        every, {"colour": {"red"}}
    )


def test_pages_of_a_selected_list_are_the_whole_list_and_count_what_remains_only_unselected(
    core: client.CoreV1Api, ns: str
) -> None:
    for i in range(9):
        core.create_namespaced_config_map(
            ns, {"metadata": {"name": f"cm{i}", "labels": {"parity": "even" if i % 2 == 0 else "odd"}}}
        )
    pages, token = [], None
    while True:
        page = core.list_namespaced_config_map(ns, label_selector="parity=even", limit=2, _continue=token)
        pages.append(_names(page.items))
        # The API server leaves remainingItemCount out when a selector filters the list.
        assert page.metadata.remaining_item_count is None
        token = page.metadata._continue
        if not token:
            break
    assert pages == [["cm0", "cm2"], ["cm4", "cm6"], ["cm8"]]
    first = core.list_namespaced_config_map(ns, limit=4)
    assert _names(first.items) == ["cm0", "cm1", "cm2", "cm3"]
    assert first.metadata.remaining_item_count == 5
    rest = core.list_namespaced_config_map(ns, limit=10, _continue=first.metadata._continue)
    assert _names(rest.items) == [f"cm{i}" for i in range(4, 9)]
    assert rest.metadata._continue is None


def test_a_node_list_by_name_or_label_reads_the_one_node(sim: SimCluster, core: client.CoreV1Api) -> None:
    name = sim.fleet.node_names[2]
    assert _names(core.list_node(field_selector=f"metadata.name={name}").items) == [name]
    assert _names(core.list_node(label_selector=f"kubernetes.io/hostname={name}").items) == [name]
    assert core.list_node(field_selector="metadata.name=no-such-node").items == []


def test_garbage_collection_finds_dependents_by_owner_and_orphans_keep_them(core: client.CoreV1Api, ns: str) -> None:
    owner = core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    for i in range(3):
        core.create_namespaced_config_map(ns, {"metadata": {"name": f"dep{i}", "ownerReferences": [ref]}})
    core.create_namespaced_config_map(ns, {"metadata": {"name": "free"}})
    # One dependent stops naming the owner before it goes: the index must forget that edge.
    core.patch_namespaced_config_map("dep2", ns, {"metadata": {"ownerReferences": None}})
    core.delete_namespaced_config_map("owner", ns)
    assert sorted(_names(core.list_namespaced_config_map(ns).items)) == ["dep2", "free"]
    other = core.create_namespaced_config_map(ns, {"metadata": {"name": "owner2"}})
    ref2 = {**ref, "name": "owner2", "uid": other.metadata.uid}
    core.create_namespaced_config_map(ns, {"metadata": {"name": "kept", "ownerReferences": [ref2]}})
    core.delete_namespaced_config_map("owner2", ns, propagation_policy="Orphan")
    assert "kept" in _names(core.list_namespaced_config_map(ns).items)


# --- with the controllers: the scheduler and the DaemonSet controller read the indexes too ----------------


@pytest.fixture(scope="module")
def live() -> Iterator[SimCluster]:
    with SimCluster(nodes=4, gpus=8, seed=6, preconfigured=True) as cluster:
        yield cluster


def test_a_pod_waiting_for_a_label_binds_once_a_node_gets_it(live: SimCluster) -> None:
    core = client.CoreV1Api(live.api_client())
    core.create_namespace({"metadata": {"name": "waits"}})
    node = live.fleet.node_names[3]
    try:
        core.create_namespaced_pod(
            "waits",
            {
                "metadata": {"name": "picky"},
                "spec": {
                    "nodeSelector": {"example.com/pool": "fast"},
                    "containers": [{"name": "c", "image": "pause", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
                },
            },
        )

        def pending_message() -> str | None:
            conditions = core.read_namespaced_pod("picky", "waits").status.conditions or []
            return next((c.message for c in conditions if c.type == "PodScheduled" and c.status == "False"), None)

        assert (
            eventually(pending_message)
            == "0/4 nodes are available: 4 node(s) didn't match Pod's node affinity/selector."
        )
        core.patch_node(node, {"metadata": {"labels": {"example.com/pool": "fast"}}})
        assert eventually(lambda: core.read_namespaced_pod("picky", "waits").spec.node_name) == node
        # A second 8-GPU pod for the same pool finds the node's GPUs taken: the full scan says why.
        core.create_namespaced_pod(
            "waits",
            {
                "metadata": {"name": "second"},
                "spec": {
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                                ]
                            }
                        }
                    },
                    "containers": [{"name": "c", "image": "pause", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
                },
            },
        )

        def second_message() -> str | None:
            conditions = core.read_namespaced_pod("second", "waits").status.conditions or []
            return next((c.message for c in conditions if c.type == "PodScheduled" and c.status == "False"), None)

        assert eventually(second_message) == (
            "0/4 nodes are available: 1 Insufficient nvidia.com/gpu, "
            "3 node(s) didn't match Pod's node affinity/selector."
        )
    finally:
        core.patch_node(node, {"metadata": {"labels": {"example.com/pool": None}}})
        core.delete_namespace("waits")
    assert live.runtime is not None
    assert live.runtime.errors == []


def test_a_daemonset_pod_leaves_a_node_relabelled_out_and_stays_under_a_noschedule_taint(live: SimCluster) -> None:
    api = live.api_client()
    core = client.CoreV1Api(api)
    node = live.fleet.node_names[1]
    selector = "app.kubernetes.io/component=dcgm-exporter"

    def exporter_nodes() -> list[str]:
        pods = core.list_namespaced_pod("gpucert-system", label_selector=selector).items
        return sorted(p.spec.node_name for p in pods if not p.metadata.deletion_timestamp)

    every = sorted(live.fleet.node_names)
    assert eventually(lambda: exporter_nodes() == every)
    opt_out = "nvidia.com/gpu.deploy.dcgm-exporter"  # the stack's affinity: NotIn [false]
    try:
        # A NoSchedule taint does not evict a running DaemonSet pod; opting the node out takes it away.
        core.patch_node(node, {"spec": {"taints": [{"key": "example.com/busy", "effect": "NoSchedule"}]}})
        core.patch_node(node, {"metadata": {"labels": {opt_out: "false"}}})
        assert eventually(lambda: exporter_nodes() == [n for n in every if n != node])
        # Opting back in under the NoSchedule taint brings no pod (a new pod must tolerate it) ...
        core.patch_node(node, {"metadata": {"labels": {opt_out: None}}})
        apps = client.AppsV1Api(api)
        eventually(
            lambda: (
                apps.read_namespaced_daemon_set_status(
                    "nvidia-dcgm-exporter", "gpucert-system"
                ).status.desired_number_scheduled
                == len(every) - 1
            )
        )
        assert exporter_nodes() == [n for n in every if n != node]
        # ... and lifting the taint does.
        core.patch_node(node, {"spec": {"taints": None}})
        assert eventually(lambda: exporter_nodes() == every)
    finally:
        core.patch_node(node, {"spec": {"taints": None}, "metadata": {"labels": {opt_out: None}}})
    assert live.runtime is not None
    assert live.runtime.errors == []
