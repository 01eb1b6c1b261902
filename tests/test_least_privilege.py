"""Least privilege, checked: every flow runs on ``gpucert sim`` as the ServiceAccount it runs as in
production, and every API request it makes (the simulator's request log) is judged by Kubernetes RBAC
(``gpucert/sim/_rbac.py``) against the roles rendered from ``templates/stack/rbac.yaml.j2`` the way
configure renders them — nothing the role does not grant, and nothing granted that no flow uses.

Who runs as whom (DESIGN.md "Kubernetes conventions", the template's header):

* ``gpucert-configure``: configure, and onboard-node — onboarding configures the stack on its node
  (namespace, RBAC, DaemonSets applied; the node labelled) before certifying it, which the runtime role
  may not do; configure's role holds every runtime permission as well (the escalation guard), so the
  same account certifies the node;
* ``gpucert-runtime``: certify, operate, release and ``gpucert watch-nodes``.

Each flow runs once on shared simulated clusters, over the paths that need a permission of their own: a
driver upgrade (a driver DaemonSet pruned), a killed run's Jobs deleted, a fault confirmed by a re-run
and tainted, a release lifting the taint, a night of operate scraping the exporters it finds through
their Endpoints, a join announced by watch-nodes.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from blocks.cluster import GpuCluster
from blocks.policy import CertificationPolicy
from blocks.store import BaselineStore
from flows.certify import certify
from flows.configure import configure
from flows.onboard import onboard
from flows.operate import operate
from flows.release import release
from gpucert.certify import BenchmarkSettings, benchmark_job, payload_configmap
from gpucert.fleet import Fault
from gpucert.kube import announce_joined_nodes, connect
from gpucert.sim import STACK_NAMESPACE, SimCluster, kubeconfig_text
from gpucert.sim._rbac import DISCOVERY_RULES, grants_of, rule_allows
from gpucert.sim._requests import ApiRequest
from gpucert.stack import StackRequest, load_matrix, node_info, plan_stack, render_stack

from .conftest import eventually

pytestmark = pytest.mark.usefixtures("prefect_harness")

NS = STACK_NAMESPACE
PREFIX = "gpucert.io"
CONFIGURE = f"system:serviceaccount:{NS}:gpucert-configure"
RUNTIME = f"system:serviceaccount:{NS}:gpucert-runtime"
_RBAC = "rbac.authorization.k8s.io/v1"
#: An older release and driver to configure first, so that the default run after it upgrades the driver.
OLDER, OLDER_PINS = "25.10.0", {"driver": "570.195.03"}

#: Requests a flow makes that its role does not grant and should not need, found by this test and left to
#: the owners of that code; each entry must still occur (remove it once the flow is fixed).
#: (user, verb, API group, resource, namespace) → why it is wrong.
PENDING_VIOLATIONS: dict[tuple[str, str, str, str, str], str] = {}
#: Grants these runs do not exercise although a flow needs them: a Lease is updated to renew it (a
#: benchmark longer than a third of its duration) or to take over an expired one (a crashed run's), which
#: runs this short never do; tests/test_leases.py drives both.
PENDING_GRANTS: frozenset[tuple[str, str]] = frozenset({("coordination.k8s.io", "leases")})


@dataclass(frozen=True)
class Run:
    """One flow run: the account it ran as and every API request the simulator served meanwhile."""

    flow: str
    user: str
    requests: tuple[ApiRequest, ...]


def _as(sim: SimCluster, user: str, folder: Path) -> Path:
    """A kubeconfig whose token names ``user``: the simulator records it as who asked."""
    path = folder / f"{user.rsplit(':', 1)[-1]}-{sim.port}.kubeconfig"
    path.write_text(kubeconfig_text(sim.url, user=user))
    return path


def _record(sim: SimCluster, flow: str, user: str, body: Callable[[], Any]) -> Run:
    sim.clear_requests()
    body()
    assert sim.request_log.dropped == 0, "the request log overflowed: the check would miss requests"
    return Run(flow, user, tuple(sim.requests))


def _rbac_in(sim: SimCluster) -> list[dict[str, Any]]:
    kube = connect(sim.kubeconfig_path)
    kinds = ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")
    return [o for kind in kinds for o in kube.list_objects(_RBAC, kind)]


def _configure_runs(folder: Path, applied: list[dict[str, Any]]) -> Iterator[Run]:
    with SimCluster(nodes=2, seed=3) as sim:
        cluster = GpuCluster(kubeconfig=str(_as(sim, CONFIGURE, folder)))
        yield _record(sim, "configure", CONFIGURE, lambda: configure(
            cluster=cluster, release=OLDER, versions=OLDER_PINS, rollout_timeout_s=60))  # fmt: skip
        applied.extend(_rbac_in(sim))
        yield _record(sim, "configure (driver upgrade)", CONFIGURE,
                      lambda: configure(cluster=cluster, rollout_timeout_s=60))  # fmt: skip
        [new] = sim.add_nodes(1, uncertified_taint=f"{PREFIX}/uncertified")
        store = BaselineStore(uri=(folder / "onboard-store").as_uri())
        yield _record(sim, "onboard-node", CONFIGURE, lambda: asyncio.run(
            onboard(node=new, cluster=cluster, store=store, ready_timeout_s=30)))  # fmt: skip


def _runtime_runs(folder: Path) -> Iterator[Run]:
    with SimCluster(nodes=4, preconfigured=True, seed=3) as sim:
        names = sim.fleet.node_names
        path = _as(sim, RUNTIME, folder)
        cluster = GpuCluster(kubeconfig=str(path))
        store = BaselineStore(uri=(folder / "runtime-store").as_uri())
        # A killed run's Job still running (written by the test, not by a role): certify deletes it.
        settings = BenchmarkSettings(pod_annotations={"sim.gpucert.io/run-seconds": "3600"})
        leftover = benchmark_job("lp-killed", names[0], 8, payload=payload_configmap(settings), settings=settings)
        connect(sim.kubeconfig_path).create(leftover)
        # The clean run measures the links too: pair Jobs and their Services.
        pairs = CertificationPolicy(policy={"network": {"pairs": True}})
        yield _record(sim, "certify", RUNTIME, lambda: asyncio.run(
            certify(cluster=cluster, store=store, run_id="lp-clean", policy=pairs)))  # fmt: skip
        # Started again under its id, it adopts its Jobs and Services; one Service still names an earlier
        # Job of its name (its garbage collection pending) and is made the current Job's.
        admin = connect(sim.kubeconfig_path)
        [stale, *_] = admin.list_objects("v1", "Service", STACK_NAMESPACE, label_selector=f"{PREFIX}/pair-job")
        owner = {**stale["metadata"]["ownerReferences"][0], "uid": "0d1e5a1e-0000-4000-8000-000000000000"}
        admin.merge_patch("v1", "Service", stale["metadata"]["name"], {"metadata": {"ownerReferences": [owner]}},
                          STACK_NAMESPACE)  # fmt: skip
        yield _record(sim, "certify (started again)", RUNTIME, lambda: asyncio.run(
            certify(cluster=cluster, store=store, run_id="lp-clean", policy=pairs)))  # fmt: skip
        sim.inject_fault(Fault("pcie_gen4", names[1], 2))  # a fail a re-run confirms, then a taint

        def faulty() -> None:
            outcome = asyncio.run(certify(cluster=cluster, store=store, run_id="lp-fault"))
            assert outcome.tainted == [names[1]]
            assert outcome.reruns

        yield _record(sim, "certify (fault, re-run, taint)", RUNTIME, faulty)
        sim.clear_faults()

        def released() -> None:
            assert asyncio.run(release(nodes=[names[1]], cluster=cluster, store=store)).released == [names[1]]

        yield _record(sim, "release", RUNTIME, released)
        yield _record(sim, "operate", RUNTIME, lambda: asyncio.run(
            operate(cluster=cluster, store=store, rotation_days=0.0, scrape_interval_s=0.5)))  # fmt: skip
        announced: list[str] = []
        failed: list[BaseException] = []

        def follow() -> None:
            try:
                announce_joined_nodes(connect(path), prefix=PREFIX, selector=None, timeout_s=1,
                                      emit=lambda name, uid: announced.append(name), stop=lambda: bool(announced))
            except BaseException as exc:  # re-raised in the test's thread
                failed.append(exc)

        def watch() -> None:
            # The watcher runs first and the node joins while it watches: the watch, not the list, finds it.
            watcher = threading.Thread(target=follow, daemon=True)
            watcher.start()
            eventually(lambda: any(r.verb == "watch" for r in sim.requests), timeout_s=10)
            [joined] = sim.add_nodes(1, uncertified_taint=f"{PREFIX}/uncertified")
            watcher.join(timeout=15)
            assert not failed, failed
            assert announced == [joined]

        yield _record(sim, "watch-nodes", RUNTIME, watch)


def _rendered_rbac() -> list[dict[str, Any]]:
    """gpucert's RBAC objects, planned and rendered as configure renders them (for a fleet of H200s)."""
    with SimCluster(nodes=1, controllers=False) as sim:
        nodes = connect(sim.kubeconfig_path).nodes()
    matrix = load_matrix()
    plan = plan_stack([node_info(n, matrix.gpu_models) for n in nodes], StackRequest(), matrix,
                      namespace=NS, label_prefix=PREFIX)  # fmt: skip
    return [dict(m.obj) for m in render_stack(plan) if m.step == "rbac" and m.obj["apiVersion"] == _RBAC]


def _content(objects: list[dict[str, Any]]) -> dict[tuple[str, str, str], Any]:
    """(kind, namespace, name) → rules, or roleRef and subjects: what RBAC objects grant to whom."""
    return {
        (o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]):
            o.get("rules", (o.get("roleRef"), o.get("subjects")))
        for o in objects
    }  # fmt: skip


Pending = tuple[str, str, str, str, str]


def _refused(runs: list[Run], rbac: list[dict[str, Any]]) -> tuple[list[str], set[Pending]]:
    """Per flow, the requests its role does not grant (or made as anyone else), and the entries of
    :data:`PENDING_VIOLATIONS` that no request needs any more."""
    refused: dict[str, set[str]] = {}
    pending_seen: set[Pending] = set()
    for run in runs:
        grants = grants_of(rbac, run.user, extra_cluster_rules=DISCOVERY_RULES)
        for r in run.requests:
            if r.user != run.user:  # a request under another identity (a kubeconfig not the flow's)
                refused.setdefault(run.flow, set()).add(f"{r.describe()} as {r.user or 'anonymous'}")
                continue
            if grants.allows(r):
                continue
            pending = (r.user, r.verb, r.group, r.combined_resource, r.namespace)
            if pending in PENDING_VIOLATIONS:
                pending_seen.add(pending)
                continue
            refused.setdefault(run.flow, set()).add(r.describe())
    users = {run.flow: run.user for run in runs}
    lines = [f"{flow} as {users[flow]}: {', '.join(sorted(keys))}" for flow, keys in refused.items()]
    return lines, set(PENDING_VIOLATIONS) - pending_seen


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
            single = {"apiGroups": [group], "resources": [resource], "verbs": [verb],
                      "resourceNames": rule.get("resourceNames") or []}  # fmt: skip
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
                r.user in users and _in_scope(role, r) and rule_allows(single, r)
                for run in runs
                for r in run.requests
            )
            # Escalation guard: configure writes and binds runtime's roles, so it holds their permissions
            # in the same kind of role, used or not by configure itself (runtime's own use is checked).
            guard = name == "gpucert-configure" and (group, resource, verb) in runtime_holds[kind]
            if not used and not guard and (group, resource) not in PENDING_GRANTS:
                unused.append(f"{kind} {name}: {verb} {group or 'core'}/{resource}")
    return unused


def test_each_flow_asks_only_what_its_role_grants_and_uses_all_it_grants(tmp_path: Path) -> None:
    """One test, not three: the flows run once (a module fixture would run once per xdist worker)."""
    applied: list[dict[str, Any]] = []
    runs = [*_configure_runs(tmp_path, applied), *_runtime_runs(tmp_path)]
    rbac = _rendered_rbac()
    # What is checked is what configure applied: every role and binding, as rendered.
    assert _content(applied) == _content(rbac)
    assert all(run.requests for run in runs), [run.flow for run in runs if not run.requests]
    refused, fixed = _refused(runs, rbac)
    unused = _unused(runs, rbac)
    problems = [
        *(["requests the role does not grant:", *refused] if refused else []),
        *(["granted but used by no flow:", *unused] if unused else []),
        *([f"no flow makes these requests any more, remove them from PENDING_VIOLATIONS: {sorted(fixed)}"]
          if fixed else []),
    ]  # fmt: skip
    assert not problems, "\n  ".join(["", *problems])
