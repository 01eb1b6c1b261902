"""The simulator against the real API server: the same requests to both, the answers compared (issue 29).

Each case sends raw requests (the official client's transport, no gpucert code in between) to ``gpucert sim``
and to a real kube-apiserver with the simulator's kubelets attached, and reduces each answer to what gpucert
and the tests rely on — the status code, the Status reason, the kinds and types of what comes back. The two
must agree; where the real server is right and the simulator does not model it, the case is listed in
:data:`KNOWN_DIFFERENCES` with the reason it does not matter to gpucert, and the test fails if such a case
starts to agree (the list must shrink, never hide a fixed case).
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpucert_sim._attach import _Refused, _Remote

from .realcluster import open_cluster

_names = itertools.count()
Answer = dict[str, Any]
Case = Callable[[_Remote, str], Answer]

#: Case → why the simulator may answer otherwise, and why gpucert does not depend on it.
KNOWN_DIFFERENCES: dict[str, str] = {
    "openapi_documents": "the simulator serves no OpenAPI documents (404): gpucert never reads them (its manifests "
    "are checked against the schemas by kubernetes-validate in the tests, and by the server's own validation), "
    "and kubectl validates through the server's fieldValidation, which the simulator implements"
}


@pytest.fixture(scope="module")
def servers() -> Iterator[dict[str, tuple[_Remote, Any]]]:
    with open_cluster("sim", nodes=1, seed=2) as sim, open_cluster("real", nodes=1, seed=2) as real:
        yield {"sim": (_Remote(str(sim.kubeconfig_path)), sim), "real": (_Remote(str(real.kubeconfig_path)), real)}


def _answer(remote: _Remote, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
    try:
        answer = remote.call(method, path, **kwargs)
    except _Refused as refused:
        body = refused.body
        status = refused.status
    else:
        body = answer.read()
        status = answer.status
    try:
        return status, json.loads(body) if body else None
    except ValueError:
        return status, body.decode(errors="replace")


def _status(code: int, body: Any) -> Answer:
    """A refusal as gpucert reads it: the code and the Status reason."""
    return {"code": code, "reason": body.get("reason") if isinstance(body, dict) else None}


def _namespace(remote: _Remote) -> str:
    name = f"conf{next(_names)}"
    remote.json("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    return name


def _pod(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "c", "image": "busybox"}], **spec},
    }


# --- the cases -----------------------------------------------------------------------------------------


def job_without_spec(remote: _Remote, node: str) -> Answer:
    ns = _namespace(remote)
    return _status(
        *_answer(
            remote,
            "POST",
            f"/apis/batch/v1/namespaces/{ns}/jobs",
            body={"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "j"}},
        )
    )


def two_values_in_match_fields(remote: _Remote, node: str) -> Answer:
    ns = _namespace(remote)
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node, "other"]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    return _status(*_answer(remote, "POST", f"/api/v1/namespaces/{ns}/pods", body=_pod("p", affinity=affinity)))


def one_term_per_node(remote: _Remote, node: str) -> Answer:
    ns = _namespace(remote)
    terms = [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [n]}]} for n in (node, "other")]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    code, _ = _answer(remote, "POST", f"/api/v1/namespaces/{ns}/pods", body=_pod("p", affinity=affinity))
    return {"code": code}


def unschedulable_false_selects_nodes(remote: _Remote, node: str) -> Answer:
    code, body = _answer(remote, "GET", "/api/v1/nodes", query={"fieldSelector": "spec.unschedulable=false"})
    return {"code": code, "nodes": sorted(i["metadata"]["name"] for i in body["items"])}


def events_are_one_store(remote: _Remote, node: str) -> Answer:
    ns = _namespace(remote)
    name = f"e{next(_names)}"
    event = {
        "apiVersion": "events.k8s.io/v1",
        "kind": "Event",
        "metadata": {"name": name},
        "eventTime": "2026-12-06T10:00:00.000000Z",
        "reportingController": "gpucert.io/certify",
        "reportingInstance": "gpucert",
        "action": "Certify",
        "reason": "Certified",
        "type": "Normal",
        "note": "all GPUs pass",
        "regarding": {"apiVersion": "v1", "kind": "Node", "name": node},
    }
    # About a Node, an Event lives in "default": elsewhere it is refused.
    elsewhere = _status(*_answer(remote, "POST", f"/apis/events.k8s.io/v1/namespaces/{ns}/events", body=event))
    created, _ = _answer(remote, "POST", "/apis/events.k8s.io/v1/namespaces/default/events", body=event)
    code, core = _answer(remote, "GET", f"/api/v1/namespaces/default/events/{name}")
    return {
        "elsewhere": elsewhere,
        "created": created,
        "code": code,
        "message": core.get("message"),
        "involved": (core.get("involvedObject") or {}).get("name"),
        "reason": core.get("reason"),
        "component": core.get("reportingComponent"),
    }


def log_of_a_waiting_container(remote: _Remote, node: str) -> Answer:
    ns = _namespace(remote)
    # Bound to a node, its image never pulled: the API server refuses the log itself (400).
    remote.json(
        "POST",
        f"/api/v1/namespaces/{ns}/pods",
        body=_pod("p", nodeName=node, containers=[{"name": "c", "image": "example.invalid/does-not-exist"}]),
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        pod = remote.json("GET", f"/api/v1/namespaces/{ns}/pods/p")
        if (pod.get("status") or {}).get("containerStatuses"):
            break
        time.sleep(0.2)
    return _status(*_answer(remote, "GET", f"/api/v1/namespaces/{ns}/pods/p/log"))


def status_patch_keeps_labels(remote: _Remote, node: str) -> Answer:
    ns = _namespace(remote)
    remote.json(
        "POST",
        f"/api/v1/namespaces/{ns}/services",
        body={"metadata": {"name": "s", "labels": {"a": "1"}}, "spec": {"ports": [{"port": 80}]}},
    )
    code, body = _answer(
        remote,
        "PATCH",
        f"/api/v1/namespaces/{ns}/services/s/status",
        body={"metadata": {"labels": {"a": "2"}}, "status": {}},
        content_type="application/merge-patch+json",
    )
    return {"code": code, "label": (body.get("metadata") or {}).get("labels", {}).get("a")}


def log_before_start(remote: _Remote, node: str) -> Answer:
    ns = _namespace(remote)
    # Bound to no node that exists: it never starts, so there is no container log to read.
    remote.json("POST", f"/api/v1/namespaces/{ns}/pods", body=_pod("p", nodeSelector={"none": "such"}))
    return _status(*_answer(remote, "GET", f"/api/v1/namespaces/{ns}/pods/p/log"))


def job_conditions_when_done(remote: _Remote, node: str) -> Answer:
    ns = _namespace(remote)
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "j"},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c", "image": "busybox"}]}}},
    }
    remote.json("POST", f"/apis/batch/v1/namespaces/{ns}/jobs", body=job)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        got = remote.json("GET", f"/apis/batch/v1/namespaces/{ns}/jobs/j")
        types = sorted(c["type"] for c in (got.get("status") or {}).get("conditions") or () if c["status"] == "True")
        if "Complete" in types:
            return {"conditions": types, "succeeded": got["status"].get("succeeded")}
        time.sleep(0.2)
    return {"conditions": "not complete within 60 s"}


def table_output(remote: _Remote, node: str) -> Answer:
    params = remote.api.param_serialize(
        "GET",
        "/api/v1/nodes",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        auth_settings=["BearerToken"],
    )
    got = remote.api.call_api(*params, _request_timeout=30)
    body = json.loads(got.read())
    # The columns differ by kind (a real server prints nodes' Status, Roles, Age …); the first is the name.
    return {
        "code": got.status,
        "kind": body.get("kind"),
        "first_column": [c["name"] for c in body.get("columnDefinitions") or ()][:1],
        "rows": len(body.get("rows") or ()),
    }


def put_of_a_missing_object(remote: _Remote, node: str) -> Answer:
    """PUT of an object that is not there: created for the kinds whose strategy allows create-on-update."""
    ns = _namespace(remote)
    objects = {
        "leases": (
            "/apis/coordination.k8s.io/v1",
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "spec": {"holderIdentity": "x"}},
        ),
        "configmaps": ("/api/v1", {"apiVersion": "v1", "kind": "ConfigMap", "data": {"a": "1"}}),
        "endpoints": ("/api/v1", {"apiVersion": "v1", "kind": "Endpoints"}),
        "roles": (
            "/apis/rbac.authorization.k8s.io/v1",
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "rules": []},
        ),
        "serviceaccounts": ("/api/v1", {"apiVersion": "v1", "kind": "ServiceAccount"}),
    }
    codes = {}
    for plural, (prefix, partial) in objects.items():
        body = {**partial, "metadata": {"name": "x", "namespace": ns}}
        codes[plural] = _answer(remote, "PUT", f"{prefix}/namespaces/{ns}/{plural}/x", body=body)[0]
    return codes


def openapi_documents(remote: _Remote, node: str) -> Answer:
    return {"v3": _answer(remote, "GET", "/openapi/v3")[0]}


def kubelet_version_within_the_skew_policy(remote: _Remote, node: str) -> Answer:
    """A kubelet is never newer than its API server, and at most three minors older (the skew policy)."""

    def minor(version: str) -> int:
        return int(version.lstrip("v").split(".")[1])

    server = minor(remote.json("GET", "/version")["gitVersion"])
    kubelet = minor(remote.json("GET", f"/api/v1/nodes/{node}")["status"]["nodeInfo"]["kubeletVersion"])
    return {"within": server - 3 <= kubelet <= server}


def _watch_lines(remote: _Remote, path: str, query: dict[str, Any], count: int) -> tuple[int, list[Any]]:
    """The status and the first ``count`` events of a watch (it is closed after them, or at its timeout)."""
    try:
        answer = remote.call("GET", path, query={"watch": "1", "timeoutSeconds": 5, **query}, timeout=(5, 15))
    except _Refused as refused:
        return refused.status, [json.loads(refused.body)]
    events: list[Any] = []
    try:
        buffer = b""
        for chunk in answer.response.stream(4096):
            buffer += chunk
            *done, buffer = buffer.split(b"\n")
            events += [json.loads(line) for line in done if line.strip()]
            if len(events) >= count:
                break
    finally:
        answer.response.release_conn()
    return answer.status, events[:count]


def watch_from_a_compacted_version(remote: _Remote, node: str) -> Answer:
    # "1": older than anything a server that has run a while still holds (etcd's compaction, the watch cache).
    code, events = _watch_lines(remote, "/api/v1/namespaces", {"resourceVersion": "1"}, 1)
    first = events[0] if events else {}
    obj = first.get("object") or first
    return {"code": code, "type": first.get("type"), "status_code": obj.get("code"), "reason": obj.get("reason")}


def initial_events_end_with_a_bookmark(remote: _Remote, node: str) -> Answer:
    ns = _namespace(remote)
    # Services: a new namespace has none of its own (ConfigMaps: the controller-manager's kube-root-ca.crt).
    for name in ("a", "b"):
        remote.json(
            "POST",
            f"/api/v1/namespaces/{ns}/services",
            body={"metadata": {"name": name}, "spec": {"ports": [{"port": 80}]}},
        )
    code, events = _watch_lines(
        remote,
        f"/api/v1/namespaces/{ns}/services",
        {"sendInitialEvents": "true", "resourceVersionMatch": "NotOlderThan", "allowWatchBookmarks": "true"},
        3,
    )
    bookmark = events[-1] if events else {}
    notes = ((bookmark.get("object") or {}).get("metadata") or {}).get("annotations") or {}
    return {
        "code": code,
        "types": [e.get("type") for e in events],
        "names": sorted((e.get("object") or {}).get("metadata", {}).get("name") for e in events[:2]),
        "initial_events_end": notes.get("k8s.io/initial-events-end"),
    }


CASES: dict[str, Case] = {
    f.__name__: f
    for f in (
        job_without_spec,
        two_values_in_match_fields,
        one_term_per_node,
        unschedulable_false_selects_nodes,
        events_are_one_store,
        status_patch_keeps_labels,
        log_before_start,
        log_of_a_waiting_container,
        job_conditions_when_done,
        table_output,
        kubelet_version_within_the_skew_policy,
        watch_from_a_compacted_version,
        put_of_a_missing_object,
        openapi_documents,
        initial_events_end_with_a_bookmark,
    )
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_simulator_answers_as_the_real_server(servers: dict[str, tuple[_Remote, Any]], case: str) -> None:
    answers = {}
    for server, (remote, cluster) in servers.items():
        answers[server] = CASES[case](remote, cluster.fleet.node_names[0])
    if case in KNOWN_DIFFERENCES:
        assert answers["sim"] != answers["real"], f"{case} now agrees: drop it from KNOWN_DIFFERENCES"
        return
    assert answers["sim"] == answers["real"], answers
