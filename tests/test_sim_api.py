"""The simulated API server, driven as gpucert drives a real one: the official client over HTTP.

One server serves the whole module; each test works in its own namespace or on its own nodes, so no
test sees another's objects. The simulator's internals are touched only to set up (seeding a pod log,
compacting the watch history, setting API faults from Python).
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from gpucert_sim import ApiFaults, SimCluster

from .conftest import eventually

NODES = 8


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    # The bare API: no controllers, so objects stay exactly as the tests write them.
    with SimCluster(nodes=NODES, gpus=8, model="NVIDIA H200", seed=3, controllers=False) as cluster:
        yield cluster


def raw(
    sim: SimCluster, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, Any]:
    """One HTTP request without the official client (nor urllib's default Content-Type)."""
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read().split(b"\n")[0]
        return response.status, response.headers, json.loads(data or b"null")
    finally:
        conn.close()


def cm(name: str, **data: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def pod(name: str, node: str | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def started(core: client.CoreV1Api, ns: str, name: str) -> None:
    """Its container running, as its kubelet would report (the bare API runs no kubelet): a kubelet serves
    no log of a container that has not started."""
    core.patch_namespaced_pod_status(
        name,
        ns,
        {
            "status": {
                "phase": "Running",
                "containerStatuses": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "imageID": "",
                        "ready": True,
                        "restartCount": 0,
                        "state": {"running": {"startedAt": "2026-12-06T00:00:00Z"}},
                    }
                ],
            }
        },
    )


# --- discovery ------------------------------------------------------------------------------------


def test_discovery_documents_are_at_the_real_paths_with_the_real_fields(sim: SimCluster) -> None:
    code, _, versions = raw(sim, "GET", "/api")
    assert (code, versions["kind"], versions["versions"]) == (200, "APIVersions", ["v1"])
    _, _, core_list = raw(sim, "GET", "/api/v1")
    assert core_list["groupVersion"] == "v1"
    by_name = {r["name"]: r for r in core_list["resources"]}
    assert by_name["nodes"]["shortNames"] == ["no"]
    assert by_name["nodes"]["namespaced"] is False
    assert by_name["pods"]["singularName"] == "pod"
    assert "watch" in by_name["pods"]["verbs"]
    assert by_name["pods/log"]["verbs"] == ["get"]
    assert "nodes/status" in by_name
    _, _, groups = raw(sim, "GET", "/apis")
    assert {g["name"] for g in groups["groups"]} == {
        "apps",
        "batch",
        "coordination.k8s.io",
        "events.k8s.io",
        "rbac.authorization.k8s.io",
    }
    _, _, apps = raw(sim, "GET", "/apis/apps/v1")
    assert apps["groupVersion"] == "apps/v1"
    assert {r["name"]: r.get("shortNames") for r in apps["resources"]}["daemonsets"] == ["ds"]
    assert raw(sim, "GET", "/apis/nope/v1")[0] == 404


def test_version_with_and_without_trailing_slash(sim: SimCluster, api: client.ApiClient) -> None:
    assert client.VersionApi(api).get_code().git_version.startswith("v1.")
    assert raw(sim, "GET", "/version")[2]["major"] == "1"


# --- nodes ----------------------------------------------------------------------------------------


def test_nodes_are_registered_from_the_fleet_with_gpu_labels(sim: SimCluster, core: client.CoreV1Api) -> None:
    nodes = core.list_node(label_selector="nvidia.com/gpu.product=NVIDIA-H200").items
    assert [n.metadata.name for n in nodes] == sim.fleet.node_names
    node = nodes[0]
    labels = node.metadata.labels
    assert labels["kubernetes.io/hostname"] == node.metadata.name
    assert labels["nvidia.com/gpu.count"] == "8"
    assert labels["node.kubernetes.io/instance-type"] == "p5e.48xlarge"
    assert "nvidia.com/gpu" not in node.status.capacity  # no device plugin yet
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
    assert node.status.node_info.kubelet_version.startswith("v1.")
    assert node.metadata.uid
    assert node.metadata.resource_version
    assert node.metadata.creation_timestamp
    assert not node.spec.taints


def test_preconfigured_nodes_advertise_their_gpus() -> None:
    with SimCluster(nodes=1, gpus=4, preconfigured=True, controllers=False) as small:
        node = client.CoreV1Api(small.api_client()).list_node().items[0]
        assert node.status.allocatable["nvidia.com/gpu"] == "4"
        assert small.kubeconfig_path.exists()
    assert not small_kubeconfig_left(small)


def small_kubeconfig_left(sim: SimCluster) -> bool:
    try:
        return sim.kubeconfig_path.exists()
    except RuntimeError:  # a temporary kubeconfig goes away with the server
        return False


# --- CRUD through every API group -----------------------------------------------------------------


def test_core_crud_and_list_kinds(sim: SimCluster, core: client.CoreV1Api, ns: str) -> None:
    created = core.create_namespaced_config_map(ns, cm("a", x="1"))
    assert created.metadata.uid
    assert created.metadata.creation_timestamp
    core.create_namespaced_service(ns, {"metadata": {"name": "svc"}, "spec": {"ports": [{"port": 80}]}})
    core.create_namespaced_service_account(ns, {"metadata": {"name": "sa"}})
    core.create_namespaced_endpoints(ns, {"metadata": {"name": "svc"}, "subsets": []})
    core.create_namespaced_event(
        ns,
        {
            "metadata": {"name": "e1"},
            "involvedObject": {"kind": "ConfigMap", "name": "a", "namespace": ns},
            "reason": "Certified",
            "type": "Normal",
        },
    )
    assert core.read_namespaced_config_map("a", ns).data == {"x": "1"}
    assert [s.metadata.name for s in core.list_namespaced_service(ns).items] == ["svc"]
    assert core.list_namespaced_event(ns, field_selector="reason=Certified").items[0].type == "Normal"
    _, _, body = raw(sim, "GET", f"/api/v1/namespaces/{ns}/configmaps")
    assert (body["kind"], body["apiVersion"]) == ("ConfigMapList", "v1")
    assert int(body["metadata"]["resourceVersion"]) >= int(created.metadata.resource_version)
    core.delete_namespaced_config_map("a", ns)
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("a", ns)
    assert err.value.status == 404
    assert json.loads(err.value.body)["reason"] == "NotFound"


def test_apps_batch_and_rbac_crud(api: client.ApiClient, ns: str) -> None:
    apps, batch, rbac = client.AppsV1Api(api), client.BatchV1Api(api), client.RbacAuthorizationV1Api(api)
    template = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "c", "image": "i"}]}}
    ds = apps.create_namespaced_daemon_set(
        ns,
        {
            "metadata": {"name": "dp", "labels": {"app.kubernetes.io/component": "device-plugin"}},
            "spec": {"selector": {"matchLabels": {"app": "x"}}, "template": template},
        },
    )
    assert ds.metadata.generation == 1
    assert ds.status.desired_number_scheduled == 0
    job = batch.create_namespaced_job(
        ns,
        {
            "metadata": {"name": "bench"},
            "spec": {
                "template": {**template, "spec": {**template["spec"], "restartPolicy": "Never"}},
                "backoffLimit": 0,
            },
        },
    )
    patched = batch.patch_namespaced_job_status("bench", ns, {"status": {"active": 1}})
    assert patched.status.active == 1
    assert job.metadata.resource_version != patched.metadata.resource_version
    patched.spec.backoff_limit = 1
    patched.status = None
    replaced = batch.replace_namespaced_job("bench", ns, patched)
    assert replaced.spec.backoff_limit == 1
    assert replaced.status.active == 1
    assert replaced.metadata.generation == 2
    rbac.create_namespaced_role(
        ns, {"metadata": {"name": "r"}, "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]}
    )
    rbac.create_namespaced_role_binding(
        ns,
        {
            "metadata": {"name": "rb"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "r"},
            "subjects": [],
        },
    )
    rbac.create_cluster_role({"metadata": {"name": f"gpucert:{ns}"}, "rules": []})
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": f"gpucert:{ns}"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": f"gpucert:{ns}"},
        }
    )
    assert rbac.read_namespaced_role("r", ns).rules[0].verbs == ["get"]
    assert f"gpucert:{ns}" in [r.metadata.name for r in rbac.list_cluster_role().items]
    rbac.delete_cluster_role_binding(f"gpucert:{ns}")
    rbac.delete_cluster_role(f"gpucert:{ns}")
    apps.delete_namespaced_daemon_set("dp", ns)
    assert not apps.list_namespaced_daemon_set(ns).items


def test_generate_name_and_duplicate_create(core: client.CoreV1Api, ns: str) -> None:
    a = core.create_namespaced_config_map(ns, {"metadata": {"generateName": "bench-"}})
    b = core.create_namespaced_config_map(ns, {"metadata": {"generateName": "bench-"}})
    assert a.metadata.name.startswith("bench-")
    assert len(a.metadata.name) == len("bench-") + 5
    assert a.metadata.name != b.metadata.name
    with pytest.raises(ApiException) as err:
        core.create_namespaced_config_map(ns, cm(a.metadata.name))
    assert err.value.status == 409
    assert json.loads(err.value.body)["reason"] == "AlreadyExists"


def test_replace_with_a_stale_resource_version_is_a_conflict(core: client.CoreV1Api, ns: str) -> None:
    first = core.create_namespaced_config_map(ns, cm("c", v="1"))
    first.data = {"v": "2"}
    second = core.replace_namespaced_config_map("c", ns, first)
    assert int(second.metadata.resource_version) > int(first.metadata.resource_version)
    first.data = {"v": "3"}  # still carries the first resourceVersion
    with pytest.raises(ApiException) as err:
        core.replace_namespaced_config_map("c", ns, first)
    assert err.value.status == 409
    assert json.loads(err.value.body)["reason"] == "Conflict"
    assert core.read_namespaced_config_map("c", ns).data == {"v": "2"}


def test_list_pages_with_limit_and_continue(core: client.CoreV1Api, ns: str) -> None:
    for i in range(5):
        core.create_namespaced_config_map(ns, cm(f"p{i}"))
    names, token = [], None
    while True:
        page = core.list_namespaced_config_map(ns, limit=2, _continue=token)
        names += [c.metadata.name for c in page.items]
        token = page.metadata._continue
        if not token:
            break
    assert names == [f"p{i}" for i in range(5)]


# --- selectors ------------------------------------------------------------------------------------


def test_label_and_field_selectors(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("a", "gpu-node-00001", {"run": "r1", "tier": "x"}))
    core.create_namespaced_pod(ns, pod("b", "gpu-node-00002", {"run": "r1"}))
    core.create_namespaced_pod(ns, pod("c", "gpu-node-00001", {"run": "r2"}))
    core.patch_namespaced_pod_status("c", ns, {"status": {"phase": "Running"}})

    def names(**kw: str) -> list[str]:
        return [p.metadata.name for p in core.list_namespaced_pod(ns, **kw).items]

    assert names(label_selector="run=r1") == ["a", "b"]
    assert names(label_selector="run in (r1,r2),!tier") == ["b", "c"]
    assert names(label_selector="run!=r1") == ["c"]
    assert names(label_selector="tier") == ["a"]
    assert names(field_selector="spec.nodeName=gpu-node-00001") == ["a", "c"]
    assert names(field_selector="status.phase=Running") == ["c"]
    assert names(field_selector="metadata.name!=a,spec.nodeName=gpu-node-00001") == ["c"]
    with pytest.raises(ApiException) as err:
        core.list_namespaced_pod(ns, field_selector="spec.image=x")
    assert err.value.status == 400
    assert "field label not supported" in json.loads(err.value.body)["message"]


# --- watch ----------------------------------------------------------------------------------------


def test_watch_replays_from_a_resource_version_and_ends_at_the_timeout(core: client.CoreV1Api, ns: str) -> None:
    rv = core.create_namespaced_config_map(ns, cm("w", v="1")).metadata.resource_version
    core.patch_namespaced_config_map("w", ns, {"data": {"v": "2"}})
    core.create_namespaced_config_map(ns, cm("other"))
    core.delete_namespaced_config_map("w", ns)
    started = time.monotonic()
    events = list(
        watch.Watch().stream(
            core.list_namespaced_config_map,
            ns,
            resource_version=rv,
            timeout_seconds=1,
            field_selector="metadata.name=w",
        )
    )
    assert [(e["type"], e["object"].data) for e in events] == [("MODIFIED", {"v": "2"}), ("DELETED", {"v": "2"})]
    assert 0.9 < time.monotonic() - started < 3


def test_watch_sees_objects_enter_and_leave_a_label_selector(core: client.CoreV1Api, ns: str) -> None:
    rv = core.list_namespaced_config_map(ns).metadata.resource_version
    core.create_namespaced_config_map(ns, {"metadata": {"name": "m", "labels": {"state": "a"}}})
    core.patch_namespaced_config_map("m", ns, {"metadata": {"labels": {"state": "b"}}})
    core.patch_namespaced_config_map("m", ns, {"metadata": {"labels": {"state": "a"}}})
    events = list(
        watch.Watch().stream(
            core.list_namespaced_config_map, ns, resource_version=rv, timeout_seconds=1, label_selector="state=a"
        )
    )
    assert [e["type"] for e in events] == ["ADDED", "DELETED", "ADDED"]


def test_watch_from_a_forgotten_resource_version_is_410_gone(sim: SimCluster, core: client.CoreV1Api, ns: str) -> None:
    old = core.create_namespaced_config_map(ns, cm("g")).metadata.resource_version
    core.patch_namespaced_config_map("g", ns, {"data": {"v": "2"}})
    sim.store.compact()
    with pytest.raises(ApiException) as err:
        list(watch.Watch().stream(core.list_namespaced_config_map, ns, resource_version=old, timeout_seconds=1))
    assert err.value.status == 410
    _, _, line = raw(sim, "GET", f"/api/v1/namespaces/{ns}/configmaps?watch=true&resourceVersion={old}")
    assert line["type"] == "ERROR"
    assert line["object"]["code"] == 410
    assert "too old resource version" in line["object"]["message"]


def test_watch_live_events_arrive(core: client.CoreV1Api, ns: str) -> None:
    w = watch.Watch()
    core.create_namespaced_config_map(ns, cm("live"))
    seen = []
    for event in w.stream(core.list_namespaced_config_map, ns, timeout_seconds=3):
        seen.append((event["type"], event["object"].metadata.name))
        if event["type"] == "ADDED" and len(seen) == 1:
            core.patch_namespaced_config_map("live", ns, {"data": {"k": "v"}})
        elif event["type"] == "MODIFIED":
            w.stop()
    assert seen == [("ADDED", "live"), ("MODIFIED", "live")]


# --- patches and apply ----------------------------------------------------------------------------


def test_merge_and_strategic_patches_of_labels_and_taints(core: client.CoreV1Api) -> None:
    name = "gpu-node-00003"
    core.patch_node(
        name,
        {
            "metadata": {"labels": {"gpucert.io/state": "failed", "x": "1"}},
            "spec": {
                "taints": [
                    {"key": "gpucert.io/unhealthy", "value": "xid", "effect": "NoSchedule"},
                    {"key": "b", "effect": "NoSchedule"},
                ]
            },
        },
    )
    node = core.patch_node(
        name, {"metadata": {"labels": {"x": None}}, "spec": {"taints": [{"key": "b", "effect": "NoSchedule"}]}}
    )
    assert "x" not in node.metadata.labels
    assert node.metadata.labels["gpucert.io/state"] == "failed"
    assert [t.key for t in node.spec.taints] == ["b"]  # taints are an atomic list: replaced
    node = core.patch_node(
        name,
        {"metadata": {"labels": {"gpucert.io/state": None}}, "spec": {"taints": None}},
        _content_type="application/merge-patch+json",
    )
    assert "gpucert.io/state" not in node.metadata.labels
    assert not node.spec.taints


def test_strategic_patch_merges_conditions_by_type(core: client.CoreV1Api) -> None:
    name = "gpu-node-00004"
    node = core.patch_node_status(
        name,
        {
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "KubeletNotReady"},
                    {"type": "GpuHealthy", "status": "True"},
                ]
            }
        },
    )
    conditions = {c.type: (c.status, c.reason) for c in node.status.conditions}
    assert conditions["Ready"] == ("False", "KubeletNotReady")
    assert conditions["MemoryPressure"][0] == "False"
    assert conditions["GpuHealthy"] == ("True", None)
    core.patch_node_status(name, {"status": {"conditions": [{"type": "Ready", "status": "True"}]}})


def test_json_patch_and_status_split(core: client.CoreV1Api) -> None:
    name = "gpu-node-00005"
    node = core.patch_node(name, [{"op": "add", "path": "/spec/unschedulable", "value": True}])
    assert node.spec.unschedulable is True
    ignored = core.patch_node(name, {"status": {"capacity": {"nvidia.com/gpu": "8"}}})
    assert "nvidia.com/gpu" not in ignored.status.capacity  # status changes only through /status
    with pytest.raises(ApiException) as err:
        core.patch_node(name, [{"op": "replace", "path": "/spec/nothing/here", "value": 1}])
    assert err.value.status == 422
    core.patch_node(name, [{"op": "remove", "path": "/spec/unschedulable"}])


def test_server_side_apply_creates_and_an_identical_apply_changes_nothing(core: client.CoreV1Api, ns: str) -> None:
    manifest = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "stack", "namespace": ns, "labels": {"app.kubernetes.io/part-of": "gpucert"}},
        "data": {"driver": "570.86"},
    }
    kw = {"field_manager": "gpucert", "_content_type": "application/apply-patch+yaml"}
    created = core.patch_namespaced_config_map("stack", ns, manifest, **kw)
    again = core.patch_namespaced_config_map("stack", ns, manifest, **kw)
    assert again.metadata.resource_version == created.metadata.resource_version
    assert created.metadata.managed_fields[0].manager == "gpucert"
    changed = core.patch_namespaced_config_map("stack", ns, {**manifest, "data": {"driver": "575.51"}}, **kw)
    assert changed.data == {"driver": "575.51"}
    assert int(changed.metadata.resource_version) > int(created.metadata.resource_version)
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map("stack", ns, manifest, _content_type="application/apply-patch+yaml")
    assert err.value.status == 400  # apply needs a field manager


APPLY = "application/apply-patch+yaml"


def owned(obj: client.V1ConfigMap | client.V1DaemonSet) -> dict[tuple[str, str], Any]:
    """(manager, operation) → the fieldsV1 it owns."""
    return {(m.manager, m.operation): m.fields_v1 for m in obj.metadata.managed_fields or ()}


def test_apply_removes_what_its_manager_stopped_applying_unless_another_owns_it(
    core: client.CoreV1Api, ns: str
) -> None:
    # configure's stack record: a pin left out of the next apply is gone, not read back stale.
    stack = {"pinned.driver": "570.86", "version.driver": "570.86", "version.toolkit": "1.17"}
    core.patch_namespaced_config_map(
        "stack",
        ns,
        {**cm("stack", **stack), "metadata": {"name": "stack", "labels": {"app": "gpucert", "tier": "stack"}}},
        field_manager="gpucert",
        _content_type=APPLY,
    )
    # Another writer's key (a merge patch), and a key another applier applies with the same value.
    core.patch_namespaced_config_map(
        "stack", ns, {"data": {"note": "kept"}}, field_manager="editor", _content_type="application/merge-patch+json"
    )
    core.patch_namespaced_config_map(
        "stack", ns, cm("stack", **{"version.toolkit": "1.17"}), field_manager="auditor", _content_type=APPLY
    )
    again = core.patch_namespaced_config_map(
        "stack",
        ns,
        {**cm("stack", **{"version.driver": "570.86"}), "metadata": {"name": "stack", "labels": {"app": "gpucert"}}},
        field_manager="gpucert",
        _content_type=APPLY,
    )
    assert again.data == {"version.driver": "570.86", "version.toolkit": "1.17", "note": "kept"}
    assert again.metadata.labels == {"app": "gpucert"}
    fields = owned(again)
    assert fields[("gpucert", "Apply")] == {
        "f:data": {"f:version.driver": {}},
        "f:metadata": {"f:labels": {"f:app": {}}},
    }
    assert fields[("editor", "Update")] == {"f:data": {"f:note": {}}}
    assert fields[("auditor", "Apply")] == {"f:data": {"f:version.toolkit": {}}}
    # Applying it all again changes nothing; an applier that stops applying everything leaves no entry.
    same = core.patch_namespaced_config_map(
        "stack",
        ns,
        {**cm("stack", **{"version.driver": "570.86"}), "metadata": {"name": "stack", "labels": {"app": "gpucert"}}},
        field_manager="gpucert",
        _content_type=APPLY,
    )
    assert same.metadata.resource_version == again.metadata.resource_version
    bare = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "stack"}}
    gone = core.patch_namespaced_config_map("stack", ns, bare, field_manager="auditor", _content_type=APPLY)
    assert "version.toolkit" not in gone.data
    assert {m for m, _ in owned(gone)} == {"gpucert", "editor"}


def test_apply_of_a_field_another_manager_owns_is_a_conflict_unless_forced(
    sim: SimCluster, core: client.CoreV1Api, ns: str
) -> None:
    core.patch_namespaced_config_map("c", ns, cm("c", key="a", other="a"), field_manager="a", _content_type=APPLY)
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map("c", ns, cm("c", key="b"), field_manager="b", _content_type=APPLY)
    assert err.value.status == 409
    status = json.loads(err.value.body)
    assert (status["reason"], status["message"]) == (
        "Conflict",
        'Apply failed with 1 conflict: conflict with "a": .data.key',
    )
    assert status["details"]["causes"] == [
        {"reason": "FieldManagerConflict", "message": 'conflict with "a"', "field": ".data.key"}
    ]
    # A writer that is not an applier is named with its API version; two conflicts are listed by manager.
    core.patch_namespaced_config_map("c", ns, {"data": {"other": "edited"}}, field_manager="editor")
    code, _, body = raw(
        sim,
        "PATCH",
        f"/api/v1/namespaces/{ns}/configmaps/c?fieldManager=b",
        json.dumps(cm("c", key="b", other="b")).encode(),
        {"Content-Type": APPLY},
    )
    assert (code, body["reason"]) == (409, "Conflict")
    assert body["message"] == (
        'Apply failed with 2 conflicts: conflicts with "a":\n- .data.key\n'
        'conflicts with "editor" using v1:\n- .data.other'
    )
    assert core.read_namespaced_config_map("c", ns).data == {"key": "a", "other": "edited"}
    # The same value is no conflict: both own the field.
    shared = core.patch_namespaced_config_map("c", ns, cm("c", key="a"), field_manager="b", _content_type=APPLY)
    assert owned(shared)[("b", "Apply")] == {"f:data": {"f:key": {}}}
    assert owned(shared)[("a", "Apply")] == {"f:data": {"f:key": {}}}  # the editor's patch took "other"
    forced = core.patch_namespaced_config_map(
        "c", ns, cm("c", key="b"), field_manager="b", force=True, _content_type=APPLY
    )
    assert forced.data == {"key": "b", "other": "edited"}
    # "a" lost the field it was forced off, its last: its entry goes.
    assert owned(forced) == {
        ("editor", "Update"): {"f:data": {"f:other": {}}},
        ("b", "Apply"): {"f:data": {"f:key": {}}},
    }
    # "a" applying its old value again is now the conflict, with "b".
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map("c", ns, cm("c", key="a"), field_manager="a", _content_type=APPLY)
    assert json.loads(err.value.body)["message"] == 'Apply failed with 1 conflict: conflict with "b": .data.key'


def test_managed_fields_after_a_forced_reapply(api: client.ApiClient, ns: str) -> None:
    apps = client.AppsV1Api(api)

    def daemonset(*containers: str) -> dict[str, Any]:
        return {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "ds", "labels": {"app": "x"}},
            "spec": {
                "selector": {"matchLabels": {"app": "x"}},
                "template": {
                    "metadata": {"labels": {"app": "x"}},
                    "spec": {"containers": [{"name": c, "image": "i:1"} for c in containers]},
                },
            },
        }

    apps.patch_namespaced_daemon_set(
        "ds", ns, daemonset("main", "sidecar"), field_manager="gpucert", _content_type=APPLY
    )
    # Someone else changes the image (the official client with no fieldManager: its User-Agent's product).
    apps.patch_namespaced_daemon_set(
        "ds", ns, {"spec": {"template": {"spec": {"containers": [{"name": "main", "image": "i:2"}]}}}}
    )
    edited = apps.read_namespaced_daemon_set("ds", ns)
    assert owned(edited)[("OpenAPI-Generator", "Update")] == {
        "f:spec": {"f:template": {"f:spec": {"f:containers": {'k:{"name":"main"}': {"f:image": {}}}}}}
    }
    with pytest.raises(ApiException) as err:
        apps.patch_namespaced_daemon_set("ds", ns, daemonset("main"), field_manager="gpucert", _content_type=APPLY)
    assert (
        json.loads(err.value.body)["details"]["causes"][0]["field"]
        == '.spec.template.spec.containers[name="main"].image'
    )
    forced = apps.patch_namespaced_daemon_set(
        "ds", ns, daemonset("main"), field_manager="gpucert", force=True, _content_type=APPLY
    )
    assert [(c.name, c.image) for c in forced.spec.template.spec.containers] == [("main", "i:1")]
    [entry] = forced.metadata.managed_fields  # the other writer lost its only field: no entry left
    assert (entry.manager, entry.operation, entry.api_version, entry.fields_type) == (
        "gpucert",
        "Apply",
        "apps/v1",
        "FieldsV1",
    )
    assert entry.time is not None
    assert entry.fields_v1 == {
        "f:metadata": {"f:labels": {"f:app": {}}},
        "f:spec": {
            "f:selector": {},
            "f:template": {  # a LabelSelector is owned whole
                "f:metadata": {"f:labels": {"f:app": {}}},
                "f:spec": {"f:containers": {'k:{"name":"main"}': {".": {}, "f:image": {}, "f:name": {}}}},
            },
        },
    }


# --- deletion -------------------------------------------------------------------------------------


def test_owner_deletion_collects_dependents_and_finalizers_hold_deletion(
    api: client.ApiClient, core: client.CoreV1Api, ns: str
) -> None:
    batch = client.BatchV1Api(api)
    job = batch.create_namespaced_job(
        ns,
        {
            "metadata": {"name": "j"},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Never"}}},
        },
    )
    owned = pod("j-1")
    owned["metadata"]["ownerReferences"] = [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": job.metadata.uid}
    ]
    core.create_namespaced_pod(ns, owned)
    batch.delete_namespaced_job("j", ns)
    assert not core.list_namespaced_pod(ns).items
    core.create_namespaced_config_map(ns, {"metadata": {"name": "f", "finalizers": ["gpucert.io/hold"]}})
    core.delete_namespaced_config_map("f", ns)
    held = core.read_namespaced_config_map("f", ns)
    assert held.metadata.deletion_timestamp is not None
    core.patch_namespaced_config_map(
        "f", ns, {"metadata": {"finalizers": None}}, _content_type="application/merge-patch+json"
    )
    with pytest.raises(ApiException) as err:
        core.read_namespaced_config_map("f", ns)
    assert err.value.status == 404


# --- bad requests ---------------------------------------------------------------------------------


def test_bad_requests_get_the_status_a_real_server_gives(sim: SimCluster, ns: str) -> None:
    path = f"/api/v1/namespaces/{ns}/configmaps"
    json_ct = {"Content-Type": "application/json"}
    code, _, body = raw(sim, "POST", path, b'{"metadata": {', json_ct)
    assert (code, body["kind"], body["reason"]) == (400, "Status", "BadRequest")
    code, _, body = raw(sim, "POST", path, json.dumps(cm("no-ct")).encode())  # no Content-Type: JSON
    assert code == 201
    assert body["metadata"]["name"] == "no-ct"
    code, _, body = raw(sim, "GET", "/api/v1/widgets")
    assert (code, body["reason"]) == (404, "NotFound")
    code, _, body = raw(sim, "POST", path, json.dumps({**cm("x"), "apiVersion": "apps/v1"}).encode(), json_ct)
    assert code == 400
    assert "API version" in body["message"]
    code, _, body = raw(sim, "POST", path, json.dumps({"metadata": {}}).encode(), json_ct)
    assert (code, body["reason"]) == (422, "Invalid")
    assert body["details"]["causes"][0]["field"] == "metadata.name"
    code, _, body = raw(sim, "POST", path, json.dumps(cm("Bad_Name")).encode(), json_ct)
    assert code == 422
    code, _, body = raw(sim, "POST", "/api/v1/namespaces/missing/configmaps", json.dumps(cm("y")).encode())
    assert code == 404
    assert 'namespaces "missing" not found' in body["message"]
    code, _, body = raw(sim, "PATCH", f"{path}/no-ct", b'{"data": {}}')  # a patch must name its type
    assert code == 415


def test_specs_a_real_server_refuses_are_422_invalid(sim: SimCluster, api: client.ApiClient, ns: str) -> None:
    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    json_ct = {"Content-Type": "application/json"}
    # A Job without its spec (nor so its pod template).
    code, _, body = raw(
        sim,
        "POST",
        f"/apis/batch/v1/namespaces/{ns}/jobs",
        json.dumps({"metadata": {"name": "bare"}}).encode(),
        json_ct,
    )
    assert (code, body["reason"]) == (422, "Invalid")
    assert body["details"]["causes"][0]["field"].startswith("spec.template")

    # One matchFields requirement on metadata.name naming two nodes: the real server wants one value
    # (a pod for either of two nodes takes two terms, which are ORed).
    def affinity(*values: list[str]) -> dict[str, Any]:
        terms = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": v}]} for v in values]
        return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}

    a, b = "gpu-node-00001", "gpu-node-00002"
    spec = {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Never"}
    with pytest.raises(ApiException) as err:
        batch.create_namespaced_job(
            ns, {"metadata": {"name": "both"}, "spec": {"template": {"spec": {**spec, "affinity": affinity([a, b])}}}}
        )
    assert err.value.status == 422
    status = json.loads(err.value.body)
    assert status["reason"] == "Invalid"
    [cause] = status["details"]["causes"]
    assert cause["field"] == (
        "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchFields[0].values"
    )
    assert "must be only one value" in cause["message"]
    with pytest.raises(ApiException) as err:
        core.create_namespaced_pod(ns, {**pod("both"), "spec": {**spec, "affinity": affinity([a], [])}})
    assert err.value.status == 422
    assert json.loads(err.value.body)["details"]["causes"][0]["field"] == (
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[1].matchFields[0].values"
    )
    assert batch.list_namespaced_job(ns).items == []
    # One single-value term per node is the valid form; a later write that breaks it is refused too.
    job = batch.create_namespaced_job(
        ns, {"metadata": {"name": "either"}, "spec": {"template": {"spec": {**spec, "affinity": affinity([a], [b])}}}}
    )
    assert job.metadata.name == "either"
    with pytest.raises(ApiException) as err:
        batch.patch_namespaced_job(
            "either",
            ns,
            {"spec": {"template": {"spec": {"affinity": affinity([a, b])}}}},
            _content_type="application/merge-patch+json",
        )
    assert err.value.status == 422


def test_unknown_fields_warn_by_default_and_fail_when_strict(core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_config_map(ns, cm("u"))
    obj, _, headers = core.patch_namespaced_config_map_with_http_info(
        "u", ns, {"spce": {"x": 1}}, _content_type="application/merge-patch+json"
    )
    assert 'unknown field \\"spce\\"' in headers["Warning"] or 'unknown field "spce"' in headers["Warning"]
    assert "spce" not in core.api_client.sanitize_for_serialization(obj)
    with pytest.raises(ApiException) as err:
        core.patch_namespaced_config_map(
            "u", ns, {"spce": {"x": 1}}, field_validation="Strict", _content_type="application/merge-patch+json"
        )
    assert err.value.status == 400
    assert "strict decoding error" in json.loads(err.value.body)["message"]


# --- pod logs -------------------------------------------------------------------------------------


def test_pod_log(sim: SimCluster, core: client.CoreV1Api, ns: str) -> None:
    core.create_namespaced_pod(ns, pod("bench-0", "gpu-node-00000"))
    started(core, ns, "bench-0")
    sim.store.set_log(ns, "bench-0", 'line 1\nline 2\n{"metric": "gemm_tflops"}\n')
    assert core.read_namespaced_pod_log("bench-0", ns).endswith('{"metric": "gemm_tflops"}\n')
    assert core.read_namespaced_pod_log("bench-0", ns, tail_lines=1) == '{"metric": "gemm_tflops"}\n'
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod_log("ghost", ns)
    assert err.value.status == 404


def test_a_pod_log_is_kept_whole_and_goes_with_its_pod(sim: SimCluster, core: client.CoreV1Api, ns: str) -> None:
    """A benchmark-sized log (kept compressed) reads back as written; deleting the pod deletes its log, so
    a pod made again under the name starts with none, and a log written for a pod that is gone is dropped."""
    core.create_namespaced_pod(ns, pod("bench-1", "gpu-node-00000"))
    started(core, ns, "bench-1")
    text = "".join(f'{{"metric": "gemm_tflops", "value": {700 + i % 50}.5, "repeat": {i}}}\n' for i in range(2000))
    sim.store.set_log(ns, "bench-1", text, compress=True)
    assert core.read_namespaced_pod_log("bench-1", ns) == text
    core.delete_namespaced_pod("bench-1", ns, grace_period_seconds=0)
    eventually(lambda: not core.list_namespaced_pod(ns, field_selector="metadata.name=bench-1").items, 10)
    sim.store.set_log(ns, "bench-1", "written after the pod was deleted\n")
    core.create_namespaced_pod(ns, pod("bench-1", "gpu-node-00000"))
    assert sim.store.get_log(ns, "bench-1", None) == ""


# --- API faults -----------------------------------------------------------------------------------


def test_throttling_is_a_429_with_retry_after(sim: SimCluster, core: client.CoreV1Api, ns: str) -> None:
    sim.set_faults(ApiFaults(throttle_rate=1.0, retry_after_s=3))
    try:
        started = time.monotonic()
        with pytest.raises(ApiException) as err:  # a POST is not retried by the client
            core.create_namespaced_config_map(ns, cm("t"))
        assert time.monotonic() - started < 1
        assert err.value.status == 429
        assert err.value.headers["Retry-After"] == "3"
        assert json.loads(err.value.body)["details"]["retryAfterSeconds"] == 3
        # The official client (urllib3's default Retry) retries a GET after Retry-After, then gives up.
        sim.set_faults(ApiFaults(throttle_rate=1.0, retry_after_s=0))
        with pytest.raises(ApiException) as err:
            core.list_node()
        assert err.value.status == 429
    finally:
        sim.set_faults(None)
    assert core.list_node().items


def test_faults_over_http_errors_latency_and_dropped_watches(sim: SimCluster, core: client.CoreV1Api, ns: str) -> None:
    ct = {"Content-Type": "application/json"}
    code, _, policy = raw(sim, "POST", "/gpucert/faults", json.dumps({"error_rate": 1.0}).encode(), ct)
    assert code == 200
    assert policy["error_rate"] == 1.0
    try:
        with pytest.raises(ApiException) as err:
            core.list_namespace()
        assert err.value.status == 500
        raw(sim, "POST", "/gpucert/faults", json.dumps({"latency_s": 0.2, "drop_watch_after_s": 0.3}).encode(), ct)
        started = time.monotonic()
        core.list_namespace()
        assert time.monotonic() - started >= 0.2
        with pytest.raises(urllib3.exceptions.ProtocolError):
            list(watch.Watch().stream(core.list_namespaced_config_map, ns, timeout_seconds=5))
        assert raw(sim, "POST", "/gpucert/faults", b'{"bogus": 1}', ct)[0] == 400
    finally:
        assert raw(sim, "DELETE", "/gpucert/faults")[0] == 200
    assert not sim.faults.policy.active


# --- the command line -----------------------------------------------------------------------------


def test_sim_up_serves_until_sigterm(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpucert.cli",
            "sim",
            "up",
            "--nodes",
            "2",
            "--gpus",
            "8",
            "--model",
            "NVIDIA H200",
            "--kubeconfig",
            str(kubeconfig),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 30
        while not kubeconfig.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert kubeconfig.exists(), proc.stderr.read() if proc.stderr else ""
        from kubernetes import config

        api = config.new_client_from_config(config_file=str(kubeconfig))  # type: ignore[no-untyped-call]
        assert len(client.CoreV1Api(api).list_node().items) == 2
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert str(kubeconfig) in out
