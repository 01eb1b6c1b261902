"""Least privilege, checked on two servers: every flow runs as the ServiceAccount it runs as in production,
against the roles rendered from ``templates/stack/rbac.yaml.j2`` the way configure renders them (and, as
read back, the way configure applied them) — nothing refused, and nothing granted that no flow uses.

Who judges what:

* on ``gpucert sim`` (``[sim]``), which authenticates nobody and authorises everything, the simulator's
  request log (who asked, in RBAC's terms) is judged by gpucert's own RBAC evaluator
  (``sim/gpucert_sim/_rbac.py``): every request must be allowed by the roles, and every permission of the
  roles used by some request of an account bound to it;
* on a real control plane (``[real]``: kube-apiserver with ``--authorization-mode=Node,RBAC``, the GPU
  nodes the simulator's kubelets), the flows authenticate with TokenRequest tokens of the same
  ServiceAccounts and the REAL authorizer judges: no request of theirs in the API server's audit log
  answered 403 (a server-side apply that created its object answered 201, so its ``create`` check passed
  too). That every permission is used is read from the same audit log (matched to the rules as above).
  Then the two authorizers are compared on every request the audit log holds for those accounts — the
  real one's decision is the response code (403 refused, anything else allowed), the evaluator's is
  ``_rbac.py``'s under the same roles — and must agree on all, the allowed ones of the flows and
  :data:`PROBES`, requests the roles do not grant, which both must refuse. The simulator's request parser
  (``sim/gpucert_sim/_requests.py``) must also read each audited URI as the API server did (the audit's verb
  and ``objectRef``).

The exceptions, written out: the escalation guard (configure holds runtime's permissions in order to grant
them) and :data:`PENDING_GRANTS`.

Who runs as whom (docs/reference/labels-taints-conditions.md, "RBAC", and the template's header):

* ``gpucert-configure``: configure, and onboard-node — onboarding configures the stack on its node
  (namespace, RBAC, DaemonSets applied; the node labelled) before certifying it, which the runtime role
  may not do; configure's role holds every runtime permission as well (the escalation guard), so the
  same account certifies the node. Before configure can run as it, a cluster administrator applies its
  namespace (which holds the ServiceAccount, so configure never creates it), the ServiceAccount and its
  roles and bindings (:func:`_bootstrap`, on both servers); configure applies everything else, the
  runtime role included — on the real server past the API server's own escalation check;
* ``gpucert-runtime``: certify, operate, release and ``gpucert watch-nodes``, on a cluster whose stack
  (roles included) is already applied.

Each flow runs once per server on two clusters, over the paths that need a permission of their own: a
driver upgrade (a driver DaemonSet pruned), a killed run's Jobs deleted, a run started again adopting an
orphaned pair Service, a fault confirmed by a re-run and tainted, a release lifting the taint, a night of
operate finding the exporters through their Endpoints (on the real server their pods' loopback addresses
are in no Endpoints, so it names every node unread: its permissions are checked, not its readings), a join
announced by watch-nodes. The real variant takes about 100 s (two control planes, ~10 s each to start).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.store import StoreLocation
from gpucert.certify import BenchmarkSettings, benchmark_job, payload_configmap
from gpucert.flows.certify import certify
from gpucert.flows.configure import configure
from gpucert.flows.onboard import onboard
from gpucert.flows.operate import operate
from gpucert.flows.release import release
from gpucert.kube import Kube, KubeForbidden, announce_joined_nodes, connect
from gpucert.stack import StackRequest, load_matrix, node_info, plan_stack, render_stack
from gpucert_sim import STACK_NAMESPACE, SimCluster, kubeconfig_text
from gpucert_sim._rbac import DISCOVERY_RULES, grants_of, rule_allows, subject_groups
from gpucert_sim._requests import ApiRequest, request_info
from gpucert_sim.fleet import Fault

from .conftest import eventually
from .realcluster import SERVERS, open_cluster

pytestmark = pytest.mark.usefixtures("prefect_harness")

NS = STACK_NAMESPACE
PREFIX = "gpucert.io"
CONFIGURE = f"system:serviceaccount:{NS}:gpucert-configure"
RUNTIME = f"system:serviceaccount:{NS}:gpucert-runtime"
_RBAC = "rbac.authorization.k8s.io/v1"
_PART_OF = "app.kubernetes.io/part-of=gpucert"
#: An older driver to configure first, so that the default run after it upgrades the driver (the one
#: release whose Kubernetes range holds the kubelets' 1.36, with a driver of an older branch).
OLDER, OLDER_PINS = "26.7.0", {"driver": "580.126.20"}

#: Requests a flow makes that its role does not grant and should not need, found by this test and left to
#: the owners of that code; each entry must still occur (remove it once the flow is fixed).
#: (user, verb, API group, resource, namespace) → why it is wrong.
PENDING_VIOLATIONS: dict[tuple[str, str, str, str, str], str] = {}
#: Grants these runs do not exercise although a flow needs them: a Lease is updated to renew it (a
#: benchmark longer than a third of its duration) or to take over an expired one (a crashed run's), which
#: runs this short never do (tests/test_leases.py drives both); the GPU Operator's Deployment, ClusterPolicy
#: and NVIDIADrivers are read and written only where the operator runs (tests/test_gpu_operator.py).
PENDING_GRANTS: frozenset[tuple[str, str]] = frozenset(
    {
        ("coordination.k8s.io", "leases"),
        ("apps", "deployments"),
        ("nvidia.com", "clusterpolicies"),
        ("nvidia.com", "nvidiadrivers"),
    }
)
#: Requests gpucert's roles do not grant — a resource, a Role's rule outside its namespace, a verb, a
#: subresource's verb, a collection's delete, a watch where only list is granted, a URL — made as
#: gpucert-runtime on the real server after the flows, so that the evaluator's refusals are compared with
#: the real authorizer's too, not its grants alone. (On the simulator, which refuses nothing, they are not
#: sent.) ``{node}``: a node's name.
PROBES: tuple[tuple[str, str, dict[str, str]], ...] = (
    ("GET", f"/api/v1/namespaces/{NS}/secrets", {}),
    ("POST", "/apis/batch/v1/namespaces/default/jobs", {}),
    ("PUT", "/api/v1/nodes/{node}", {}),
    ("GET", "/api/v1/nodes/{node}/status", {}),
    ("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases", {}),
    ("GET", "/api/v1/pods", {"watch": "true"}),
    ("GET", "/metrics", {}),
)
_PROBING = "probes (refusals expected)"


@dataclass(frozen=True)
class Run:
    """One flow run: the account it ran as and every API request made as anyone while it ran (on the
    simulator: its request log) or as that account (on the real server: its audit log)."""

    flow: str
    user: str
    requests: tuple[ApiRequest, ...]
    #: The real authorizer's decision on each request (its audit log's response code: 403 is refused);
    #: ``None`` on the simulator, which authorises nothing.
    allowed: tuple[bool, ...] | None = None
    #: The audit log's response code of each request (the real server only).
    codes: tuple[int, ...] = ()


#: An RBAC verb → the HTTP method of its request (a non-resource request's verb is its method, lower-cased).
_METHODS = {
    "get": "GET",
    "list": "GET",
    "watch": "GET",
    "create": "POST",
    "update": "PUT",
    "patch": "PATCH",
    "delete": "DELETE",
    "deletecollection": "DELETE",
}
_USERS = (CONFIGURE, RUNTIME)


def _audited(event: Mapping[str, Any]) -> tuple[ApiRequest, str]:
    """An audit event's request as the simulator's log would record it (``request_info`` of its method and
    URI), and a line naming the difference when that is not what the API server's own RequestInfo said
    (the audit's verb and objectRef) — empty when they agree."""
    uri = urlsplit(event["requestURI"])
    query = {key: values[0] for key, values in parse_qs(uri.query).items()}
    ref = event.get("objectRef")
    verb = str(event["verb"])
    method = _METHODS.get(verb, verb.upper()) if ref else verb.upper()
    parsed = request_info(method, uri.path, query, event["user"]["username"])
    if ref is None:
        server = (verb, "", "", "", "", "")
    else:
        # The audit fills in a created object's name from its body, after authorization: not an attribute.
        name = "" if verb == "create" else ref.get("name", "")
        server = (
            verb,
            ref.get("apiGroup", ""),
            ref.get("resource", ""),
            ref.get("subresource", ""),
            ref.get("namespace", ""),
            name,
        )
    ours = (parsed.verb, parsed.group, parsed.resource, parsed.subresource, parsed.namespace, parsed.name)
    differs = ours != server or parsed.resource_request != (ref is not None)
    return parsed, f"{event['requestURI']}: the server's {server}, the simulator's {ours}" if differs else ""


def _received(event: Mapping[str, Any]) -> float:
    return dt.datetime.fromisoformat(str(event["requestReceivedTimestamp"]).replace("Z", "+00:00")).timestamp()


class _Recorder:
    """Each flow run's requests on either server: the simulator's request log cleared before a run and
    read after it; on the real server the audit log, read once at the end (:meth:`finish`, before the
    cluster stops) and split into runs by when each request was received."""

    def __init__(self, cluster: Any, folder: Path) -> None:
        self.cluster = cluster
        self.folder = folder
        self.real = cluster.server == "real"
        self.runs: list[Run] = []
        self._windows: list[tuple[str, str, float, float]] = []
        #: Requests the simulator's parser reads otherwise than the real server did.
        self.misparsed: list[str] = []

    def kubeconfig(self, user: str) -> Path:
        """A kubeconfig authenticating as ServiceAccount ``user``: a TokenRequest token on the real server;
        on the simulator a token that names the user, which its log records as who asked."""
        name = user.rsplit(":", 1)[-1]
        path = self.folder / f"{name}-{self.cluster.server}.kubeconfig"
        if self.real:
            return Path(self.cluster.plane.kubeconfig_for(NS, name, path))
        path.write_text(kubeconfig_text(self.cluster.url, user=user))
        return path

    def record(self, flow: str, user: str, body: Callable[[], Any]) -> None:
        if not self.real:
            self.cluster.clear_requests()
            body()
            assert self.cluster.request_log.dropped == 0, "the request log overflowed: the check would miss requests"
            self.runs.append(Run(flow, user, tuple(self.cluster.requests)))
            return
        began = time.time()
        body()
        self._windows.append((flow, user, began, time.time()))

    def watching(self, user: str, resource: str) -> bool:
        """Whether a watch of ``resource`` by ``user`` has started."""
        if not self.real:
            return any(r.verb == "watch" and r.resource == resource and r.user == user for r in self.cluster.requests)
        return any(
            e["verb"] == "watch"
            and (e.get("user") or {}).get("username") == user
            and (e.get("objectRef") or {}).get("resource") == resource
            for e in self.cluster.plane.audit()
        )

    def finish(self) -> list[Run]:
        """The runs recorded; on the real server read from its audit log now."""
        if self.real:
            self.runs = self._audited_runs()
        return self.runs

    def _audited_runs(self) -> list[Run]:
        # One event per request (a watch writes ResponseStarted, then ResponseComplete when it ends).
        events: dict[str, Mapping[str, Any]] = {}
        for event in self.cluster.plane.audit():
            if (event.get("user") or {}).get("username") not in _USERS or event["stage"] == "RequestReceived":
                continue
            if event["stage"] != "ResponseStarted" or event["auditID"] not in events:
                events[event["auditID"]] = event
        per_run: dict[tuple[str, str], list[tuple[ApiRequest, int]]] = {(f, u): [] for f, u, _, _ in self._windows}
        for event in sorted(events.values(), key=_received):
            user, at = event["user"]["username"], _received(event)
            flow = next(
                (f for f, u, began, ended in self._windows if u == user and began <= at <= ended), "between the flows"
            )
            request, misparsed = _audited(event)
            if misparsed:
                self.misparsed.append(misparsed)
            code = int((event.get("responseStatus") or {}).get("code") or 0)
            entries = per_run.setdefault((flow, user), [])
            entries.append((request, code))
            if request.verb == "patch" and code == 201:
                # A server-side apply that created its object was also authorised for create (the patch
                # handler's check); a refusal there would have answered 403 to the patch.
                entries.append((request._replace(verb="create"), code))
        return [
            Run(
                flow,
                user,
                tuple(r for r, _ in entries),
                tuple(c != 403 for _, c in entries),
                tuple(c for _, c in entries),
            )
            for (flow, user), entries in per_run.items()
        ]


def _bootstrap(cluster: Any, rendered: list[dict[str, Any]]) -> None:
    """What a cluster administrator applies before configure can run as its ServiceAccount (the template's
    "very first apply"): the namespace, which holds that ServiceAccount, the ServiceAccount, and its roles
    and their bindings, from configure's own rendering. configure applies everything else."""
    admin = connect(cluster.kubeconfig_path)
    for obj in rendered:
        if obj["kind"] == "Namespace" or obj["metadata"]["name"] == "gpucert-configure":
            admin.apply(obj)
    _await_authorised(cluster, CONFIGURE, [o for o in rendered if o["apiVersion"] == _RBAC])


def _await_authorised(cluster: Any, user: str, rbac: list[dict[str, Any]]) -> None:
    """On the real server, wait until its authorizer holds ``user``'s roles (its RBAC cache follows the
    objects within moments): asked as the administrator, so that no request of ``user`` is refused."""
    if cluster.server != "real":
        return
    from kubernetes import client

    bound = _bound(rbac)
    checks = []
    for obj in rbac:
        if obj["kind"] in ("Role", "ClusterRole") and user in bound.get((obj["kind"], obj["metadata"]["name"]), ()):
            rule = obj["rules"][0]
            resource, _, sub = rule["resources"][0].partition("/")
            checks.append(
                client.V1ResourceAttributes(
                    verb=rule["verbs"][0],
                    group=rule["apiGroups"][0],
                    resource=resource,
                    subresource=sub,
                    namespace=obj["metadata"].get("namespace", ""),
                )
            )
    assert checks, f"no role binds {user}"
    with cluster.api_client() as api:
        auth = client.AuthorizationV1Api(api)

        def allowed() -> bool:
            for check in checks:
                spec = client.V1SubjectAccessReviewSpec(
                    user=user, groups=list(subject_groups(user)), resource_attributes=check
                )
                answer = auth.create_subject_access_review(client.V1SubjectAccessReview(spec=spec))
                if answer.status is None or not answer.status.allowed:
                    return False
            return True

        eventually(allowed, timeout_s=30)


def _rbac_in(cluster: Any) -> list[dict[str, Any]]:
    """gpucert's RBAC objects on the cluster (a real one also holds its own)."""
    kube = connect(cluster.kubeconfig_path)
    kinds = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    # A real server's list leaves each item's kind and apiVersion out (they are the list's).
    return [
        {**o, "apiVersion": _RBAC, "kind": kind}
        for kind in kinds
        for o in kube.list_objects(_RBAC, kind, label_selector=_PART_OF)
    ]


def _configure_runs(
    server: str, folder: Path, rendered: list[dict[str, Any]], applied: list[dict[str, Any]]
) -> tuple[list[Run], list[str]]:
    with open_cluster(server, nodes=2, seed=3) as cluster:
        _bootstrap(cluster, rendered)
        rec = _Recorder(cluster, folder)
        gpus = GpuCluster(kubeconfig=str(rec.kubeconfig(CONFIGURE)))
        rec.record(
            "configure",
            CONFIGURE,
            lambda: configure(cluster=gpus, release=OLDER, versions=OLDER_PINS, rollout_timeout_s=60),
        )
        applied.extend(_rbac_in(cluster))
        rec.record("configure (driver upgrade)", CONFIGURE, lambda: configure(cluster=gpus, rollout_timeout_s=60))
        [new] = cluster.add_nodes(1, uncertified_taint=f"{PREFIX}/uncertified")
        store = StoreLocation(uri=(folder / "onboard-store").as_uri())
        rec.record(
            "onboard-node",
            CONFIGURE,
            lambda: asyncio.run(onboard(node=new, cluster=gpus, store=store, ready_timeout_s=30)),
        )
        return rec.finish(), rec.misparsed


def _runtime_runs(server: str, folder: Path, rendered: list[dict[str, Any]]) -> tuple[list[Run], list[str]]:
    with open_cluster(server, nodes=4, preconfigured=True, seed=3) as cluster:
        _await_authorised(cluster, RUNTIME, [o for o in rendered if o["apiVersion"] == _RBAC])
        rec = _Recorder(cluster, folder)
        names = cluster.fleet.node_names
        path = rec.kubeconfig(RUNTIME)
        gpus = GpuCluster(kubeconfig=str(path))
        store = StoreLocation(uri=(folder / "runtime-store").as_uri())
        admin = connect(cluster.kubeconfig_path)
        # The stack Ready on every node first (on the real server its DaemonSets' pods start after the
        # cluster does): a benchmark pod that ran before its node's driver pod reads no GPU model.
        eventually(lambda: _stack_ready(admin), timeout_s=90)
        # A killed run's Job still running (written by the test, not by a role): certify deletes it.
        settings = BenchmarkSettings(pod_annotations={"sim.gpucert.io/run-seconds": "3600"})
        leftover = benchmark_job("lp-killed", names[0], 8, payload=payload_configmap(settings), settings=settings)
        admin.create(leftover)
        # The clean run measures the links too: pair Jobs and their Services.
        pairs = CertificationPolicy(policy={"network": {"pairs": True}})
        rec.record(
            "certify", RUNTIME, lambda: asyncio.run(certify(cluster=gpus, store=store, run_id="lp-clean", policy=pairs))
        )
        # Started again under its id, it adopts its Jobs and Services; one Service has lost its owner (its Job
        # deleted with --cascade=orphan and made again, say) and is made the current Job's. (An owner of a
        # made-up uid would do on the simulator; a real garbage collector deletes such a Service at once.)
        [orphan, *_] = admin.list_objects("v1", "Service", NS, label_selector=f"{PREFIX}/pair-job")
        admin.merge_patch("v1", "Service", orphan["metadata"]["name"], {"metadata": {"ownerReferences": None}}, NS)
        rec.record(
            "certify (started again)",
            RUNTIME,
            lambda: asyncio.run(certify(cluster=gpus, store=store, run_id="lp-clean", policy=pairs)),
        )
        cluster.inject_fault(Fault("pcie_gen4", names[1], 2))  # a fail a re-run confirms, then a taint

        def faulty() -> None:
            outcome = asyncio.run(certify(cluster=gpus, store=store, run_id="lp-fault"))
            assert outcome.tainted == [names[1]]
            assert outcome.reruns

        rec.record("certify (fault, re-run, taint)", RUNTIME, faulty)
        cluster.clear_faults()

        def released() -> None:
            assert asyncio.run(release(nodes=[names[1]], cluster=gpus, store=store)).released == [names[1]]

        rec.record("release", RUNTIME, released)
        # On the real server the exporters' pods have loopback addresses, which no Endpoints list: operate
        # names every node unread (its permissions are what is checked here, not its readings).
        rec.record(
            "operate",
            RUNTIME,
            lambda: asyncio.run(operate(cluster=gpus, store=store, rotation_days=0.0, scrape_interval_s=0.5)),
        )
        announced: list[str] = []
        failed: list[BaseException] = []

        def follow() -> None:
            try:
                announce_joined_nodes(
                    connect(path),
                    prefix=PREFIX,
                    selector=None,
                    timeout_s=1,
                    emit=lambda name, uid: announced.append(name),
                    stop=lambda: bool(announced),
                )
            except BaseException as exc:  # re-raised in the test's thread
                failed.append(exc)

        def watch() -> None:
            # The watcher runs first and the node joins while it watches: the watch, not the list, finds it.
            watcher = threading.Thread(target=follow, daemon=True)
            watcher.start()
            eventually(lambda: rec.watching(RUNTIME, "nodes"), timeout_s=10)
            [joined] = cluster.add_nodes(1, uncertified_taint=f"{PREFIX}/uncertified")
            watcher.join(timeout=15)
            assert not failed, failed
            assert announced == [joined]

        rec.record("watch-nodes", RUNTIME, watch)
        if rec.real:
            rec.record(_PROBING, RUNTIME, lambda: _probe(connect(path), names[0]))
        return rec.finish(), rec.misparsed


def _stack_ready(kube: Kube) -> bool:
    """Whether every DaemonSet of the stack has a Ready pod on each node it should run on."""
    sets = kube.list_objects("apps/v1", "DaemonSet", NS)
    statuses = [ds.get("status") or {} for ds in sets]
    return bool(sets) and all(0 < st.get("desiredNumberScheduled", 0) == st.get("numberReady") for st in statuses)


def _probe(kube: Kube, node: str) -> None:
    """Send :data:`PROBES`; each must be refused (403) before its body is even read."""
    for method, path, query in PROBES:
        try:
            kube.request(
                method,
                path.format(node=node),
                doing="probe",
                query=query,
                body={} if method in ("POST", "PUT") else None,
            )
        except KubeForbidden:
            continue
        raise AssertionError(f"{method} {path} was not refused")


def _rendered() -> list[dict[str, Any]]:
    """gpucert's namespace and RBAC objects, planned and rendered as configure renders them (for a fleet of
    H200s)."""
    with SimCluster(nodes=1, controllers=False) as sim:
        nodes = connect(sim.kubeconfig_path).nodes()
    matrix = load_matrix()
    plan = plan_stack(
        [node_info(n, matrix.gpu_models) for n in nodes], StackRequest(), matrix, namespace=NS, label_prefix=PREFIX
    )
    return [dict(m.obj) for m in render_stack(plan) if m.step in ("namespace", "rbac")]


def _content(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], Any]:
    """(kind, namespace, name) → rules, or roleRef and subjects: what RBAC objects grant to whom."""
    return {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]): o.get(
            "rules", (o.get("roleRef"), o.get("subjects"))
        )
        for o in objects
    }


Pending = tuple[str, str, str, str, str]


def _refused(runs: list[Run], rbac: list[dict[str, Any]]) -> tuple[list[str], set[Pending]]:
    """Per flow, the requests refused — by the real authorizer where it judged them, else by the roles
    (``_rbac.py``) — or made as anyone else, and the entries of :data:`PENDING_VIOLATIONS` that no request
    needs any more."""
    refused: dict[tuple[str, str], set[str]] = {}
    pending_seen: set[Pending] = set()
    for run in runs:
        grants = grants_of(rbac, run.user, extra_cluster_rules=DISCOVERY_RULES)
        for i, r in enumerate(run.requests):
            if r.user != run.user:  # a request under another identity (a kubeconfig not the flow's)
                refused.setdefault((run.flow, run.user), set()).add(f"{r.describe()} as {r.user or 'anonymous'}")
                continue
            if run.allowed[i] if run.allowed is not None else grants.allows(r):
                continue
            pending = (r.user, r.verb, r.group, r.combined_resource, r.namespace)
            if pending in PENDING_VIOLATIONS:
                pending_seen.add(pending)
                continue
            refused.setdefault((run.flow, run.user), set()).add(r.describe())
    lines = [f"{flow} as {user}: {', '.join(sorted(keys))}" for (flow, user), keys in refused.items()]
    return lines, set(PENDING_VIOLATIONS) - pending_seen


def _disagreements(runs: list[Run], rbac: list[dict[str, Any]]) -> list[str]:
    """The requests the real authorizer judged otherwise than ``_rbac.py`` judges them under the same roles."""
    out: set[str] = set()
    for run in runs:
        if run.allowed is None:
            continue
        grants = grants_of(rbac, run.user, extra_cluster_rules=DISCOVERY_RULES)
        for r, real, code in zip(run.requests, run.allowed, run.codes, strict=True):
            if grants.allows(r) != real:
                said = "allowed" if real else "refused"
                out.add(
                    f"{run.flow}: {r.describe()} {r.name or r.path} as {r.user}: the API server {said} it "
                    f"({code}), the evaluator did not"
                )
    return sorted(out)


def _bound(rbac: list[dict[str, Any]]) -> dict[tuple[str, str], set[str]]:
    """(role kind, role name) → the ServiceAccounts bound to it (as users)."""
    users: dict[tuple[str, str], set[str]] = {}
    for obj in rbac:
        if obj["kind"].endswith("Binding"):
            ref = obj["roleRef"]
            users.setdefault((ref["kind"], ref["name"]), set()).update(
                f"system:serviceaccount:{s['namespace']}:{s['name']}" for s in obj["subjects"]
            )
    return users


def _items(role: Mapping[str, Any]) -> Iterator[tuple[str, str, str, Mapping[str, Any]]]:
    """(group, resource, verb, the one-item rule) for every permission a role's rules spell out."""
    for rule in role.get("rules") or ():
        for group, resource, verb in itertools.product(rule["apiGroups"], rule["resources"], rule["verbs"]):
            single = {
                "apiGroups": [group],
                "resources": [resource],
                "verbs": [verb],
                "resourceNames": rule.get("resourceNames") or [],
            }
            yield group, resource, verb, single


def _in_scope(role: Mapping[str, Any], r: ApiRequest) -> bool:
    """Whether a role's rules are in force where ``r`` is: a ClusterRole's (bound cluster-wide, as all of
    gpucert's are) everywhere, a Role's in its namespace only."""
    if role["kind"] == "ClusterRole":
        return True
    return r.resource_request and r.namespace == role["metadata"]["namespace"]


def _unused(runs: list[Run], rbac: list[dict[str, Any]]) -> list[str]:
    """Every permission of gpucert's roles that no request of a ServiceAccount bound to it uses."""
    bound = _bound(rbac)
    roles = {(o["kind"], o["metadata"]["name"]): o for o in rbac if o["kind"] in ("ClusterRole", "Role")}
    assert set(roles) == {(k, n) for k in ("ClusterRole", "Role") for n in ("gpucert-configure", "gpucert-runtime")}
    runtime_holds = {
        kind: {(g, r, v) for g, r, v, _ in _items(roles[(kind, "gpucert-runtime")])} for kind in ("ClusterRole", "Role")
    }
    unused: list[str] = []
    for (kind, name), role in roles.items():
        users = bound.get((kind, name), set())
        assert users, f"{kind} {name} is bound to nobody"
        for group, resource, verb, single in _items(role):
            used = any(
                r.user in users and _in_scope(role, r) and rule_allows(single, r) for run in runs for r in run.requests
            )
            # Escalation guard: configure writes and binds runtime's roles, so it holds their permissions
            # in the same kind of role, used or not by configure itself (runtime's own use is checked).
            guard = name == "gpucert-configure" and (group, resource, verb) in runtime_holds[kind]
            if not used and not guard and (group, resource) not in PENDING_GRANTS:
                unused.append(f"{kind} {name}: {verb} {group or 'core'}/{resource}")
    return unused


@pytest.mark.parametrize("server", SERVERS)
def test_each_flow_asks_only_what_its_role_grants_and_uses_all_it_grants(server: str, tmp_path: Path) -> None:
    """One test per server, not three: the flows run once (a module fixture would run once per xdist worker)."""
    began = time.monotonic()
    rendered = _rendered()
    rbac = [o for o in rendered if o["apiVersion"] == _RBAC]
    applied: list[dict[str, Any]] = []
    configured, misparsed = _configure_runs(server, tmp_path, rendered, applied)
    operated, also_misparsed = _runtime_runs(server, tmp_path, rendered)
    probes = [run for run in operated if run.flow == _PROBING]
    runs = [run for run in (*configured, *operated) if run.flow != _PROBING]
    # What is checked is what configure applied: every role and binding, as rendered.
    assert _content(applied) == _content(rbac)
    assert all(run.requests for run in runs), [run.flow for run in runs if not run.requests]
    if server == "real":
        [probed] = probes
        assert len(probed.requests) == len(PROBES), probed
        assert not any(probed.allowed or ()), probed
    refused, fixed = _refused(runs, rbac)
    unused = _unused(runs, rbac)
    disagree = _disagreements([*runs, *probes], rbac)
    problems = [
        *(["requests refused:", *refused] if refused else []),
        *(["granted but used by no flow:", *unused] if unused else []),
        *(
            [f"no flow makes these requests any more, remove them from PENDING_VIOLATIONS: {sorted(fixed)}"]
            if fixed
            else []
        ),
        *(["the real authorizer and sim/gpucert_sim/_rbac.py disagree:", *disagree] if disagree else []),
        *(
            [
                "the simulator's request parser reads these otherwise than the API server:",
                *sorted(set(misparsed + also_misparsed)),
            ]
            if misparsed or also_misparsed
            else []
        ),
    ]
    assert not problems, "\n  ".join(["", *problems])
    if server == "real":
        judged = sum(len(run.requests) for run in (*runs, *probes))
        print(f"real server: {judged} requests judged by both authorizers in {time.monotonic() - began:.0f} s")
