"""The simulator's request log and the RBAC evaluator the least-privilege check rests on
(``sim/gpucert_sim/_requests.py``, ``sim/gpucert_sim/_rbac.py``): requests parsed into RBAC attributes the way
the API server parses them, recorded from the official client over HTTP with who asked, and judged by
RBAC's rules — verbs, groups, resources and subresources, resource names, wildcards, and the scope of
a RoleBinding against a ClusterRoleBinding."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpucert.kube import connect
from gpucert_sim import SimCluster, kubeconfig_text
from gpucert_sim._api import REQUESTS_PATH
from gpucert_sim._rbac import DISCOVERY_RULES, grants_of, rule_allows
from gpucert_sim._requests import ApiRequest, RequestLog, request_info

USER = "system:serviceaccount:tools:reader"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=2, controllers=False) as cluster:
        yield cluster


def _req(method: str, path: str, **query: str) -> ApiRequest:
    return request_info(method, path, query, USER)


def _attrs(r: ApiRequest) -> tuple[str, str, str, str, str, str]:
    return (r.verb, r.group, r.resource, r.subresource, r.namespace, r.name)


# --- parsing -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "query", "expected"),
    [
        ("GET", "/api/v1/nodes", {}, ("list", "", "nodes", "", "", "")),
        ("GET", "/api/v1/nodes", {"watch": "1"}, ("watch", "", "nodes", "", "", "")),
        ("GET", "/api/v1/nodes", {"watch": "false"}, ("list", "", "nodes", "", "", "")),
        ("GET", "/api/v1/nodes", {"fieldSelector": "metadata.name=n1"}, ("list", "", "nodes", "", "", "n1")),
        ("GET", "/api/v1/watch/nodes/n1", {}, ("watch", "", "nodes", "", "", "n1")),
        ("GET", "/api/v1/nodes/n1", {}, ("get", "", "nodes", "", "", "n1")),
        ("PATCH", "/api/v1/nodes/n1/status", {}, ("patch", "", "nodes", "status", "", "n1")),
        ("GET", "/api/v1/pods", {}, ("list", "", "pods", "", "", "")),
        ("GET", "/api/v1/namespaces/a/pods/p/log", {}, ("get", "", "pods", "log", "a", "p")),
        ("POST", "/apis/batch/v1/namespaces/a/jobs", {}, ("create", "batch", "jobs", "", "a", "")),
        ("PUT", "/apis/batch/v1/namespaces/a/jobs/j", {}, ("update", "batch", "jobs", "", "a", "j")),
        ("DELETE", "/apis/batch/v1/namespaces/a/jobs/j", {}, ("delete", "batch", "jobs", "", "a", "j")),
        ("DELETE", "/apis/batch/v1/namespaces/a/jobs", {}, ("deletecollection", "batch", "jobs", "", "a", "")),
        # A Namespace is its own namespace; its status and finalize are its subresources.
        ("PATCH", "/api/v1/namespaces/a", {}, ("patch", "", "namespaces", "", "a", "a")),
        ("PUT", "/api/v1/namespaces/a/finalize", {}, ("update", "", "namespaces", "finalize", "a", "a")),
        ("POST", "/api/v1/namespaces", {}, ("create", "", "namespaces", "", "", "")),
        # Discovery and the server's version are not resources.
        ("GET", "/api", {}, ("get", "", "", "", "", "")),
        ("GET", "/apis/apps/v1", {}, ("get", "", "", "", "", "")),
        ("GET", "/version", {}, ("get", "", "", "", "", "")),
    ],
)
def test_requests_are_parsed_as_the_api_server_parses_them(
    method: str, path: str, query: dict[str, str], expected: tuple[str, ...]
) -> None:
    parsed = request_info(method, path, query)
    assert _attrs(parsed) == expected
    assert parsed.resource_request == bool(expected[2])
    assert parsed.path == path


def test_a_request_describes_itself_in_rbac_terms() -> None:
    assert request_info("GET", "/api/v1/namespaces/a/pods/p/log", {}).describe() == "(get, core, pods/log, a)"
    assert request_info("PATCH", "/api/v1/nodes/n1", {}).describe() == "(patch, core, nodes, cluster scope)"
    assert request_info("GET", "/apis", {}).describe() == "(get, /apis)"


def test_the_log_keeps_its_newest_entries_and_counts_the_rest() -> None:
    log = RequestLog(capacity=2)
    for name in ("a", "b", "c"):
        log.add(_req("GET", f"/api/v1/nodes/{name}"))
    assert [r.name for r in log.entries()] == ["b", "c"]
    assert log.dropped == 1
    log.clear()
    assert (log.entries(), log.dropped) == ([], 0)


# --- recording, over HTTP ------------------------------------------------------------------------------


def _mine(sim: SimCluster) -> list[tuple[str, ...]]:
    return [(*_attrs(r)[:5],) for r in sim.requests if r.user == USER]


def test_the_log_records_what_the_client_asks_and_who_asked(sim: SimCluster, tmp_path: Path, ns: str) -> None:
    path = tmp_path / "kubeconfig"
    path.write_text(kubeconfig_text(sim.url, user=USER))
    kube = connect(path)
    core = client.CoreV1Api(kube.api_client)
    sim.clear_requests()
    cm: dict[str, Any] = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": ns}}
    kube.apply(cm)  # server-side apply of a missing object: patch, and the create it implies
    kube.apply({**cm, "data": {"k": "v"}})  # of an existing one: patch only
    core.read_namespaced_config_map("c", ns)
    where = f"/api/v1/namespaces/{ns}/configmaps"
    kube.request("PUT", f"{where}/c", doing="replace", body={**cm, "data": {"k": "w"}})
    core.list_config_map_for_all_namespaces()
    kube.request("GET", where, doing="watch", query={"watch": "true", "timeoutSeconds": 1}, accept="*/*")
    core.delete_namespaced_config_map("c", ns)
    core.delete_collection_namespaced_config_map(ns)
    client.VersionApi(kube.api_client).get_code()
    assert _mine(sim) == [
        ("patch", "", "configmaps", "", ns),
        ("create", "", "configmaps", "", ns),
        ("patch", "", "configmaps", "", ns),
        ("get", "", "configmaps", "", ns),
        ("update", "", "configmaps", "", ns),
        ("list", "", "configmaps", "", ""),
        ("watch", "", "configmaps", "", ns),
        ("delete", "", "configmaps", "", ns),
        ("deletecollection", "", "configmaps", "", ns),
        ("get", "", "", "", ""),
    ]
    assert sim.requests[-1].path == "/version/"  # as the client asks it
    assert not sim.requests[-1].resource_request


def test_the_log_is_served_and_cleared_over_http_and_skips_the_simulators_own_paths(sim: SimCluster) -> None:
    sim.clear_requests()
    node = sim.fleet.node_names[0]
    for path in (f"/api/v1/nodes/{node}", f"/dcgm/{node}/metrics", "/gpucert/faults"):
        status, _ = _http(sim, "GET", path)
        assert status == 200, path
    status, body = _http(sim, "GET", REQUESTS_PATH)
    assert status == 200
    assert body["dropped"] == 0
    assert [(i["verb"], i["resource"], i["name"], i["user"]) for i in body["items"]] == [("get", "nodes", node, "")]
    assert _http(sim, "DELETE", REQUESTS_PATH)[0] == 200
    assert sim.requests == []


def _http(sim: SimCluster, method: str, path: str) -> tuple[int, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=5)
    try:
        conn.request(method, path)
        response = conn.getresponse()
        text = response.read()
        return response.status, json.loads(text) if response.getheader("Content-Type", "").startswith(
            "application/json"
        ) else text
    finally:
        conn.close()


# --- the evaluator -------------------------------------------------------------------------------------


def test_a_rule_matches_verb_group_resource_and_name_with_wildcards() -> None:
    pods = {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}
    assert rule_allows(pods, _req("GET", "/api/v1/namespaces/a/pods/p"))
    assert rule_allows(pods, _req("GET", "/api/v1/pods"))
    assert not rule_allows(pods, _req("GET", "/api/v1/pods", watch="true"))  # watch is a verb of its own
    assert not rule_allows(pods, _req("DELETE", "/api/v1/namespaces/a/pods/p"))
    assert not rule_allows(pods, _req("GET", "/apis/batch/v1/namespaces/a/jobs"))  # another group
    # A subresource is granted by name only, never by its resource.
    log = _req("GET", "/api/v1/namespaces/a/pods/p/log")
    assert not rule_allows(pods, log)
    assert rule_allows({**pods, "resources": ["pods/log"]}, log)
    assert rule_allows({**pods, "resources": ["*/log"]}, log)
    assert not rule_allows({**pods, "resources": ["*/status"]}, log)
    assert rule_allows({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, log)
    # resourceNames: the named object only; a list or create names none (a field selector can).
    named = {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"], "resourceNames": ["x"]}
    assert rule_allows(named, _req("GET", "/api/v1/namespaces/a/configmaps/x"))
    assert not rule_allows(named, _req("GET", "/api/v1/namespaces/a/configmaps/y"))
    assert not rule_allows(named, _req("GET", "/api/v1/namespaces/a/configmaps"))
    assert rule_allows(named, _req("GET", "/api/v1/namespaces/a/configmaps", fieldSelector="metadata.name=x"))


def _sa_binding(
    kind: str, role_kind: str, name: str, namespace: str | None = None, subject: dict[str, str] | None = None
) -> dict[str, Any]:
    meta: dict[str, str] = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": name},
        "subjects": [subject or {"kind": "ServiceAccount", "name": "reader", "namespace": "tools"}],
    }


def _role(kind: str, name: str, rules: list[dict[str, Any]], namespace: str | None = None) -> dict[str, Any]:
    meta: dict[str, str] = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta, "rules": rules}


JOBS = {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["list"]}
NODES = {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}


def test_a_role_binding_grants_in_its_namespace_and_a_cluster_binding_everywhere() -> None:
    objects = [
        _role("Role", "jobs", [JOBS], "a"),
        _sa_binding("RoleBinding", "Role", "jobs", "a"),
        # A ClusterRole bound by a RoleBinding: its rules in that namespace only.
        _role("ClusterRole", "ns-nodes", [NODES, JOBS]),
        _sa_binding("RoleBinding", "ClusterRole", "ns-nodes", "b"),
    ]
    grants = grants_of(objects, USER)
    assert grants.allows(_req("GET", "/apis/batch/v1/namespaces/a/jobs"))
    assert grants.allows(_req("GET", "/apis/batch/v1/namespaces/b/jobs"))
    assert not grants.allows(_req("GET", "/apis/batch/v1/namespaces/c/jobs"))
    assert not grants.allows(_req("GET", "/apis/batch/v1/jobs"))  # across namespaces: cluster scope
    assert not grants.allows(_req("GET", "/api/v1/nodes/n1"))  # cluster-scoped: no RoleBinding reaches it
    cluster = [
        *objects,
        _role("ClusterRole", "nodes", [NODES]),
        _sa_binding("ClusterRoleBinding", "ClusterRole", "nodes"),
    ]
    assert grants_of(cluster, USER).allows(_req("GET", "/api/v1/nodes/n1"))
    assert grants_of(cluster, USER).allowing(_req("GET", "/api/v1/nodes/n1")) == [NODES]
    # The binding names the subject: another ServiceAccount, or the same name elsewhere, holds nothing.
    assert not grants_of(cluster, "system:serviceaccount:other:reader").allows(_req("GET", "/api/v1/nodes/n1"))
    assert not grants_of(cluster, "reader").allows(_req("GET", "/api/v1/nodes/n1"))
    # A ServiceAccount is in its namespace's group.
    group = {"kind": "Group", "name": "system:serviceaccounts:tools"}
    by_group = [
        _role("ClusterRole", "nodes", [NODES]),
        _sa_binding("ClusterRoleBinding", "ClusterRole", "nodes", subject=group),
    ]
    assert grants_of(by_group, USER).allows(_req("GET", "/api/v1/nodes/n1"))
    # A binding whose role does not exist grants nothing.
    assert not grants_of([_sa_binding("ClusterRoleBinding", "ClusterRole", "gone")], USER).allows(
        _req("GET", "/api/v1/nodes/n1")
    )


def test_a_role_in_a_namespace_reaches_that_namespace_object_only() -> None:
    rule = {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "patch"]}
    grants = grants_of([_role("Role", "own", [rule], "a"), _sa_binding("RoleBinding", "Role", "own", "a")], USER)
    assert grants.allows(_req("PATCH", "/api/v1/namespaces/a"))
    assert not grants.allows(_req("PATCH", "/api/v1/namespaces/b"))
    assert not grants.allows(_req("GET", "/api/v1/namespaces"))


def test_discovery_is_every_users_and_non_resource_urls_need_a_cluster_binding() -> None:
    grants = grants_of([], USER, extra_cluster_rules=DISCOVERY_RULES)
    for path in ("/api", "/api/v1", "/apis", "/apis/batch/v1", "/version", "/openapi/v2"):
        assert grants.allows(_req("GET", path)), path
    assert not grants.allows(_req("POST", "/apis"))
    assert not grants.allows(_req("GET", "/metrics"))
    assert not grants.allows(_req("GET", "/api/v1/nodes"))  # a resource, not discovery
    metrics = _role("ClusterRole", "metrics", [{"verbs": ["get"], "nonResourceURLs": ["/metrics"]}])
    in_ns = grants_of([metrics, _sa_binding("RoleBinding", "ClusterRole", "metrics", "a")], USER)
    assert not in_ns.allows(_req("GET", "/metrics"))
    everywhere = grants_of([metrics, _sa_binding("ClusterRoleBinding", "ClusterRole", "metrics")], USER)
    assert everywhere.allows(_req("GET", "/metrics"))
