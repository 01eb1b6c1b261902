"""Events in the simulated API server: one store served through core ``v1`` and ``events.k8s.io/v1``.

As on a real server, an Event is one object whichever API wrote it: read, listed, watched, patched and
deleted through the other with its fields converted (``regarding`` ↔ ``involvedObject``, ``note`` ↔
``message`` …), under one uid and resourceVersion, and each API's field selectors are the server's.
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from gpucert_sim import SimCluster

_EVENTS_V1 = "/apis/events.k8s.io/v1"
#: Where an Event about a Node lives: the API server refuses it in any namespace but "default".
NODE_EVENTS = "default"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    # The bare API: no controllers, so the only Events are the tests' own.
    with SimCluster(nodes=2, controllers=False) as cluster:
        yield cluster


@pytest.fixture
def events(api: client.ApiClient) -> client.EventsV1Api:
    return client.EventsV1Api(api)


def raw(
    sim: SimCluster, method: str, path: str, body: Any = None, content_type: str = "application/json"
) -> tuple[int, Any]:
    """One request without the official client (which refuses an events.k8s.io Event with no eventTime,
    as a real server serves a legacy core Event); the first JSON line of the answer."""
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=5)
    try:
        data = json.dumps(body).encode() if body is not None else None
        conn.request(method, path, body=data, headers={"Content-Type": content_type} if data else {})
        response = conn.getresponse()
        return response.status, json.loads(response.read().split(b"\n")[0] or b"null")
    finally:
        conn.close()


def _node_ref(core: client.CoreV1Api, name: str) -> dict[str, Any]:
    node = core.read_node(name)
    return {"apiVersion": "v1", "kind": "Node", "name": name, "uid": node.metadata.uid}


def _new_event(name: str, ns: str, regarding: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": ns},
        "eventTime": "2026-12-03T14:00:00.123456Z",
        "reportingController": "gpucert",
        "reportingInstance": "gpucert@host",
        "action": "taint.add",
        "reason": "TaintAdded",
        "type": "Warning",
        "note": "failed: row remap pending on GPU 3",
        "regarding": regarding,
        **fields,
    }


def test_an_events_k8s_io_event_is_a_core_event_with_its_fields_converted(
    sim: SimCluster, core: client.CoreV1Api, events: client.EventsV1Api
) -> None:
    ns = NODE_EVENTS
    ref = _node_ref(core, "gpu-node-00001")
    made = events.create_namespaced_event(
        ns, _new_event("n1.taint", ns, ref, series={"count": 3, "lastObservedTime": "2026-12-03T14:05:00.000000Z"})
    )
    same = core.read_namespaced_event("n1.taint", ns)
    assert (same.metadata.uid, same.metadata.resource_version) == (made.metadata.uid, made.metadata.resource_version)
    assert (same.involved_object.kind, same.involved_object.name, same.involved_object.uid) == (
        "Node",
        "gpu-node-00001",
        ref["uid"],
    )
    assert same.message == "failed: row remap pending on GPU 3"
    assert (same.reporting_component, same.reporting_instance) == ("gpucert", "gpucert@host")
    assert (same.type, same.reason, same.action) == ("Warning", "TaintAdded", "taint.add")
    assert same.event_time == datetime(2026, 12, 3, 14, 0, 0, 123456, tzinfo=UTC)
    assert same.series.count == 3
    assert same.count is None  # no deprecatedCount, no count
    _, body = raw(sim, "GET", f"/api/v1/namespaces/{ns}/events/n1.taint")
    assert body["apiVersion"] == "v1"
    assert not {"regarding", "note", "reportingController"} & set(body)

    # kubectl describe node's query: core v1, every namespace, the node's kind, name, namespace and uid.
    query = (
        f"involvedObject.kind=Node,involvedObject.name=gpu-node-00001,involvedObject.namespace=,"
        f"involvedObject.uid={ref['uid']}"
    )
    assert [e.metadata.name for e in core.list_event_for_all_namespaces(field_selector=query).items] == ["n1.taint"]
    other = query.replace(ref["uid"], "gpu-node-00001")  # kubectl's other query: the name as uid (the kubelet's)
    assert core.list_event_for_all_namespaces(field_selector=other).items == []
    events.delete_namespaced_event("n1.taint", ns)


def test_a_core_event_is_an_events_k8s_io_event_with_its_fields_converted(
    sim: SimCluster, core: client.CoreV1Api, events: client.EventsV1Api, ns: str
) -> None:
    code, _ = raw(
        sim,
        "POST",
        f"/api/v1/namespaces/{ns}/events",
        {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": "pod.evicted"},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": "train-0",
                "namespace": ns,
                "uid": "u-1",
                "fieldPath": "spec.containers{main}",
            },
            "reason": "Evicted",
            "message": "low on resource: memory",
            "type": "Warning",
            "source": {"component": "kubelet", "host": "gpu-node-00000"},
            "reportingComponent": "kubelet",
            "reportingInstance": "gpu-node-00000",
            "firstTimestamp": "2026-12-03T14:00:00Z",
            "lastTimestamp": "2026-12-03T14:02:00Z",
            "count": 2,
        },
    )
    assert code == 201
    code, event = raw(sim, "GET", f"{_EVENTS_V1}/namespaces/{ns}/events/pod.evicted")
    assert code == 200
    assert event["apiVersion"] == "events.k8s.io/v1"
    assert event["regarding"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "name": "train-0",
        "namespace": ns,
        "uid": "u-1",
        "fieldPath": "spec.containers{main}",
    }
    assert event["note"] == "low on resource: memory"
    assert event["deprecatedSource"] == {"component": "kubelet", "host": "gpu-node-00000"}
    assert (event["deprecatedFirstTimestamp"], event["deprecatedLastTimestamp"], event["deprecatedCount"]) == (
        "2026-12-03T14:00:00Z",
        "2026-12-03T14:02:00Z",
        2,
    )
    assert (event["reportingController"], event["reportingInstance"]) == ("kubelet", "gpu-node-00000")
    assert event["eventTime"] is None  # a legacy recorder sets none, and the server fills none in
    assert not {"involvedObject", "message", "source", "count", "reportingComponent"} & set(event)
    code, listed = raw(sim, "GET", f"{_EVENTS_V1}/namespaces/{ns}/events")
    assert [e["metadata"]["name"] for e in listed["items"]] == ["pod.evicted"]
    assert listed["apiVersion"] == "events.k8s.io/v1"
    # A core write the events.k8s.io API reads back changed, and the other way round.
    core.patch_namespaced_event("pod.evicted", ns, {"message": "evicted: memory"})
    assert raw(sim, "GET", f"{_EVENTS_V1}/namespaces/{ns}/events/pod.evicted")[1]["note"] == "evicted: memory"
    code, _ = raw(
        sim,
        "PATCH",
        f"{_EVENTS_V1}/namespaces/{ns}/events/pod.evicted",
        {"note": "evicted"},
        "application/merge-patch+json",
    )
    assert code == 200
    assert core.read_namespaced_event("pod.evicted", ns).message == "evicted"


def test_field_selectors_are_the_servers_in_either_api(
    sim: SimCluster, core: client.CoreV1Api, events: client.EventsV1Api
) -> None:
    ns = NODE_EVENTS
    ref = _node_ref(core, "gpu-node-00000")
    events.create_namespaced_event(ns, _new_event("mine", ns, ref))
    core.create_namespaced_event(
        ns,
        {
            "metadata": {"name": "kubelets"},
            "reason": "NodeReady",
            "type": "Normal",
            "involvedObject": {"kind": "Node", "name": "gpu-node-00000", "uid": "gpu-node-00000"},
            "source": {"component": "kubelet", "host": "gpu-node-00000"},
        },
    )

    def core_names(selector: str) -> list[str]:
        return [e.metadata.name for e in core.list_namespaced_event(ns, field_selector=selector).items]

    def v1_names(selector: str) -> list[str]:
        code, body = raw(sim, "GET", f"{_EVENTS_V1}/namespaces/{ns}/events?fieldSelector={selector}")
        assert code == 200, body
        return [e["metadata"]["name"] for e in body["items"]]

    assert core_names(f"involvedObject.uid={ref['uid']}") == ["mine"]
    assert core_names("involvedObject.kind=Node,involvedObject.apiVersion=v1") == ["mine"]
    assert core_names("reportingComponent=gpucert") == ["mine"]
    # ``source`` is the source's component, else the reporting controller (the API server's rule).
    assert core_names("source=gpucert") == ["mine"]
    assert core_names("source=kubelet") == ["kubelets"]
    assert core_names("type=Warning,reason=TaintAdded") == ["mine"]
    assert v1_names(f"regarding.uid={ref['uid']}") == ["mine"]
    assert v1_names("regarding.kind=Node,regarding.name=gpu-node-00000") == ["kubelets", "mine"]
    assert v1_names("reportingController=gpucert") == ["mine"]
    assert v1_names("source=kubelet") == ["kubelets"]
    assert v1_names("type!=Warning") == ["kubelets"]
    # Each API's own names only: a real server refuses the other's with 400.
    for path, selector in (
        (f"/api/v1/namespaces/{ns}/events", "regarding.kind=Node"),
        (f"{_EVENTS_V1}/namespaces/{ns}/events", "involvedObject.kind=Node"),
        (f"{_EVENTS_V1}/namespaces/{ns}/events", "note=x"),
    ):
        code, status = raw(sim, "GET", f"{path}?fieldSelector={selector}")
        assert (code, status["reason"]) == (400, "BadRequest"), selector
    for name in ("mine", "kubelets"):
        core.delete_namespaced_event(name, ns)


def test_one_object_watched_and_deleted_through_either_api(
    sim: SimCluster, core: client.CoreV1Api, events: client.EventsV1Api, ns: str
) -> None:
    since = core.list_namespaced_event(ns).metadata.resource_version
    core.create_namespaced_event(
        ns,
        {
            "metadata": {"name": "seen"},
            "reason": "Started",
            "message": "started",
            "involvedObject": {"kind": "Pod", "name": "p", "namespace": ns},
        },
    )
    code, line = raw(
        sim, "GET", f"{_EVENTS_V1}/namespaces/{ns}/events?watch=true&resourceVersion={since}&timeoutSeconds=1"
    )
    assert code == 200
    assert (line["type"], line["object"]["apiVersion"], line["object"]["note"]) == (
        "ADDED",
        "events.k8s.io/v1",
        "started",
    )
    # The same name through the other API is the same object: it exists already.
    with pytest.raises(ApiException) as taken:
        events.create_namespaced_event(ns, _new_event("seen", ns, {"kind": "Pod", "name": "p", "namespace": ns}))
    assert taken.value.status == 409
    assert "events.events.k8s.io" in json.loads(taken.value.body)["message"]
    events.delete_namespaced_event("seen", ns)
    assert core.list_namespaced_event(ns).items == []
    code, status = raw(sim, "DELETE", f"/api/v1/namespaces/{ns}/events/seen")
    assert (code, status["reason"]) == (404, "NotFound")
