"""The fault matrix: the flows run under each fault, and what they leave behind is checked.

Every row of :data:`MATRIX` names one fault and the promise a run under it keeps; the "Fault matrix"
table of docs/design/testing.md is this table (a test keeps the two the same). Each row runs a real flow — certify,
operate, onboard or configure, under the session's Prefect test server — against ``gpucert sim`` with
the fault injected; the rows whose ``servers`` say so run against a real control plane too (issue 29:
kube-apiserver, kube-controller-manager and kube-scheduler with the simulator's kubelets attached,
``tests/realcluster.py``), from the same parametrised fixture and the same test body. Each checks the
END STATE, not the absence of an exception: every node decided once in the run's ``decisions.parquet``,
its state label, ``GpuCertified`` condition and ``unhealthy`` taint as decided, no gpucert taint without
a recorded decision, no ``testing`` taint left, the run's files present, at most one Job per node, no
duplicate ticket, no extra or half-written baseline version.

Cost is kept down the way the suite's budget asks: clusters of 2 to 7 nodes with sub-second simulated
timing, a shared moto S3 server, one certify run carrying the six pod and node faults that do not
interfere (each its own node), one fork server (``flows.certify`` imported once) for the killed runs. The
real server's variants cost about three minutes on 2 busy cores: three control planes (API rows, the chaos
run, the watch rows), started one after another and each stopped before the next starts
(:data:`REAL_FIRST`), ~15 s to start and ~15 s to stop each, plus the runs (~80, ~45 and ~60 s in all).

How faults get in:

* Kubernetes API — :class:`gpucert_sim.ApiFaults` (500s, 429 with Retry-After, latency, dropped and
  expired watches); the simulator counts what it served, so a row fails if its fault never fired. On the
  real server the same policy object is injected by :class:`tests.apifaults_proxy.ApiFaultProxy`, a TLS
  reverse proxy in front of kube-apiserver that decides with the simulator's own ``FaultInjector`` and
  counts the same way;
* pods — node annotations the simulated kubelet honours (``sim.gpucert.io/image-pull-error``,
  ``exit-code`` + ``terminated-reason``, ``run-seconds``; the attached kubelets honour them on the real
  server), a foreign ``NoSchedule`` taint for a pod that cannot be scheduled, a node deleted (through the
  API, on the real server) or gone NotReady (its kubelet stops) while its Job runs;
* the store — :class:`tests.s3servers.FaultProxy` in front of moto: 5xx, a rival writer's 412,
  connections dropped after S3 acted, and an endpoint nothing listens on;
* a killed run — a forked process running the flow, killed with SIGKILL by the test once its Jobs run,
  or by :func:`gpucert._crashpoints.crashpoint` (``GPUCERT_TEST_CRASH_AT``) at a named step; the same
  run id then runs again here;
* Prefect — the session's Prefect server restarted while a certify run is in flight.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from multiprocessing.context import ForkServerContext
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pandas as pd
import pytest
import yaml

from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.store import StoreLocation
from gpucert.certify import JOBS_NAMESPACE, CertificationRun, CertifyOutcome
from gpucert.errors import StoreUnavailable
from gpucert.flows.certify import certify
from gpucert.flows.configure import configure
from gpucert.flows.onboard import onboard
from gpucert.flows.operate import operate
from gpucert.kube import Kube, RetryPolicy, announce_joined_nodes, condition, connect, taint_keys
from gpucert.store import BaselineStore as Store
from gpucert.store import S3ObjectStore, open_store
from gpucert.tickets import LocalTickets, local_path
from gpucert_sim import (
    EXIT_CODE_ANNOTATION,
    IMAGE_PULL_ERROR_ANNOTATION,
    RUN_SECONDS_ANNOTATION,
    TERMINATED_REASON_ANNOTATION,
    ApiFaults,
    SimCluster,
)
from gpucert_sim.fleet import Fault

from . import faultproc
from .conftest import stop_process
from .realcluster import SERVERS, open_cluster
from .s3servers import (
    ACCESS_KEY,
    DROP_AFTER,
    PASS,
    REGION,
    SECRET_KEY,
    FaultProxy,
    Rule,
    free_ports,
    moto_server,
    s3_client,
)

pytestmark = pytest.mark.usefixtures("prefect_harness")

ROOT = Path(__file__).resolve().parent.parent
PREFIX = "gpucert.io"
UNHEALTHY, UNCERTIFIED = taint_keys(PREFIX)
#: The taint a node carries while its benchmark runs (the certify wave's; lifted after it).
TESTING = f"{PREFIX}/testing"
NAMESPACE = JOBS_NAMESPACE


#: A row run on both servers: ``gpucert sim`` and the real control plane.
BOTH = tuple(SERVERS)


@dataclass(frozen=True)
class Row:
    """One row of the matrix: its id, the test that runs it, the flow, the fault in words, the promise, and
    the servers its test runs it on."""

    id: str
    test: str
    flow: str
    fault: str
    promise: str
    servers: tuple[str, ...] = ("sim",)


MATRIX: tuple[Row, ...] = (
    # --- the Kubernetes API ----------------------------------------------------------------------------
    Row(
        "api-500",
        "test_certify_rides_out_a_flaky_api",
        "certify",
        "10 % of API requests answered 500",
        "certify completes; every node decided once, labels, conditions and taints match decisions.parquet",
        BOTH,
    ),
    Row(
        "api-429",
        "test_certify_rides_out_a_flaky_api",
        "certify",
        "10 % of API requests answered 429 with Retry-After: 1",
        "certify waits as told and completes: every node decided and certified, as on a clean run",
        BOTH,
    ),
    Row(
        "api-429-operate",
        "test_operate_night_under_429s",
        "operate",
        "4 % of API requests answered 429 with Retry-After: 1, a whole night",
        "the night's telemetry, choice and certify complete; every due node decided, labels as decided",
    ),
    Row(
        "api-500-configure",
        "test_configure_rides_out_500s_and_a_second_run_writes_nothing",
        "configure",
        "10 % of API requests answered 500 and 2 % 429, two runs",
        "configure installs and verifies the whole stack on every node; a second run writes nothing",
    ),
    Row(
        "api-latency",
        "test_certify_rides_out_a_flaky_api",
        "certify",
        "2 s added to every API request while the Jobs run",
        "no call times out; certify completes and every node is decided",
        BOTH,
    ),
    Row(
        "watch-dropped",
        "test_watch_nodes_announces_a_join_once_and_onboard_admits_it",
        "onboard",
        "every node watch cut 0.3 s after it starts",
        "watch-nodes re-lists a cut watch and announces a node that joins meanwhile exactly once; onboard admits it",
        BOTH,
    ),
    Row(
        "watch-expired",
        "test_watch_nodes_announces_a_join_once_and_onboard_admits_it",
        "onboard",
        "every resumed node watch answered 410 Expired in the stream",
        "watch-nodes re-lists and announces each joined node exactly once, however often it re-lists",
        BOTH,
    ),
    Row(
        "node-deleted",
        "test_a_node_whose_benchmark_cannot_run_is_inconclusive",
        "certify",
        "a node deleted while its Job runs",
        "certify completes; the gone node is inconclusive and written nowhere, the others are decided",
        BOTH,
    ),
    Row(
        "node-not-ready",
        "test_a_node_whose_benchmark_cannot_run_is_inconclusive",
        "certify",
        "a node going NotReady while its Job runs",
        "its Job ends at the deadline: inconclusive, its state label untouched, no taint; the others decided",
        BOTH,
    ),
    Row(
        "job-image-pull",
        "test_a_node_whose_benchmark_cannot_run_is_inconclusive",
        "certify",
        "a node whose pods cannot pull their image",
        "inconclusive (image_pull), never a GPU verdict; no taint, no ticket, the state label untouched",
        BOTH,
    ),
    Row(
        "job-unschedulable",
        "test_a_node_whose_benchmark_cannot_run_is_inconclusive",
        "certify",
        "a node a foreign NoSchedule taint keeps the pod off",
        "inconclusive (unschedulable); the foreign taint stays, no gpucert taint is added",
        BOTH,
    ),
    Row(
        "job-oom",
        "test_a_node_whose_benchmark_cannot_run_is_inconclusive",
        "certify",
        "a node whose benchmark container is OOM-killed (exit 137)",
        "inconclusive (oom), never a GPU verdict; no taint, no ticket",
        BOTH,
    ),
    Row(
        "job-deadline",
        "test_a_node_whose_benchmark_cannot_run_is_inconclusive",
        "certify",
        "a node whose benchmark outlives the Job's deadline",
        "inconclusive (deadline); no pod of the run is left holding the node's GPUs",
        BOTH,
    ),
    # --- the store -------------------------------------------------------------------------------------
    Row(
        "store-5xx",
        "test_every_write_of_the_run_meets_the_fault_once",
        "certify",
        "the first PUT of every object the run writes answered 500 or 503",
        "every write is retried; the run's files are all there and exactly one baseline version is added",
    ),
    Row(
        "store-412",
        "test_store_412_a_rival_wins_the_race_and_both_updates_are_kept",
        "certify",
        "a rival writer moves baselines/current just before the run's conditional PUT",
        "the run's merge is redone on the rival's table: both updates kept, one linear history",
    ),
    Row(
        "store-dropped",
        "test_every_write_of_the_run_meets_the_fault_once",
        "certify",
        "the connection dropped after S3 acted, on every write the run makes",
        "retries land once: no duplicate baseline version, every run file complete",
    ),
    Row(
        "store-unreachable",
        "test_store_unreachable_the_run_fails_before_it_acts",
        "certify",
        "the store's endpoint refuses every connection for the whole run",
        "certify fails at its first write, before it acts: no gpucert label, annotation, condition or taint changes",
    ),
    # --- the flow process killed at each step, then started again with the same run id ----------------
    Row(
        "killed-jobs-started",
        "test_a_killed_run_started_again_completes_and_duplicates_nothing",
        "certify",
        "the flow process SIGKILLed while its Jobs run",
        "the same run id adopts its Jobs (one per node), lifts the testing taints and completes",
    ),
    Row(
        "killed-settled",
        "test_a_killed_run_started_again_completes_and_duplicates_nothing",
        "certify",
        "SIGKILL once the verdicts and decisions are stored",
        "started again: no duplicate Job, ticket, taint or baseline version; the run completes",
    ),
    Row(
        "killed-between-taints",
        "test_a_killed_run_started_again_completes_and_duplicates_nothing",
        "certify",
        "SIGKILL after the first of two taints is written",
        "started again: both failed nodes tainted once, the healthy one not; two tickets, one version",
    ),
    Row(
        "killed-baseline-write",
        "test_a_killed_run_started_again_completes_and_duplicates_nothing",
        "certify",
        "SIGKILL after a baseline version is written, before current moves",
        "the orphan version never counts; started again, exactly one version is added and made current",
    ),
    Row(
        "killed-between-tickets",
        "test_a_killed_run_started_again_completes_and_duplicates_nothing",
        "certify",
        "SIGKILL after the first of two tickets is opened",
        "started again: one ticket per fault, each naming the run once; no duplicate baseline version",
    ),
    # --- Prefect ---------------------------------------------------------------------------------------
    Row(
        "prefect-restarted",
        "test_prefect_server_restarted_mid_run",
        "certify",
        "the Prefect server restarted while a certify run is in flight",
        "the run rides out the restart and completes; Prefect records it COMPLETED; the end state is whole",
    ),
    Row(
        "worker-killed",
        "test_a_killed_workers_run_is_brought_back_by_prefect",
        "certify",
        "a certify in two shards on two process workers; one worker and its shard's process SIGKILLed "
        "together (its node lost)",
        "heartbeats stop; automations.yaml marks the shard crashed and schedules it again; the other worker "
        "completes it under the same run id, keeping its Jobs (one Job and one benchmark per node); the parent "
        "waits and judges every node once",
    ),
)
ROWS = {row.id: row for row in MATRIX}


def rows(*ids: str) -> list[Any]:
    """The rows ``ids`` as pytest parameters (ids shown in the test names)."""
    return [pytest.param(ROWS[i], id=i) for i in ids]


# --- running flows and reading what they left ----------------------------------------------------------


def _cluster(sim: Any) -> GpuCluster:
    """The flows' cluster block for ``sim`` (a SimCluster, or a RealCluster: then through its fault proxy)."""
    return GpuCluster(kubeconfig=str(sim.kubeconfig_path))


def _file_store(root: Path) -> StoreLocation:
    return StoreLocation(uri=f"file://{root}")


def run_certify(sim: Any, store: StoreLocation, **kwargs: Any) -> CertifyOutcome:
    """One certify flow run on ``sim``; returns its outcome."""
    outcome: CertifyOutcome = asyncio.run(certify(cluster=_cluster(sim), store=store, **kwargs))
    return outcome


def nodes_of(kube: Kube) -> dict[str, dict[str, Any]]:
    return {n["metadata"]["name"]: n for n in kube.nodes()}


def gpucert_taints(node: Mapping[str, Any]) -> dict[str, str]:
    """gpucert's taints on ``node``: key → value (only keys under the label prefix)."""
    return {
        t["key"]: t.get("value", "")
        for t in (node.get("spec") or {}).get("taints") or ()
        if str(t.get("key", "")).startswith(f"{PREFIX}/")
    }


def run_of(store: Store, outcome: CertifyOutcome) -> CertificationRun:
    return CertificationRun(store, outcome.run_id, outcome.day)


def check_end_state(
    kube: Kube,
    store: Store,
    outcome: CertifyOutcome,
    before: Mapping[str, Mapping[str, Any]],
    *,
    versions_before: int,
    new_versions: int | None = 1,
    gone: Sequence[str] = (),
) -> pd.DataFrame:
    """Check what a completed certify run left; returns its ``decisions.parquet``.

    ``before`` is every node as it was before the run; ``versions_before`` the baseline versions then, and
    ``new_versions`` how many the run may add (None: not checked); ``gone`` the nodes deleted meanwhile.
    """
    run = run_of(store, outcome)
    decisions = run.decisions()
    assert sorted(decisions["node"]) == sorted(outcome.nodes), "one decision per benchmarked node"
    measured = len(outcome.nodes) > len(outcome.inconclusive)
    for name in ("verdicts.parquet", "decisions.parquet", "stack.json", "report.html"):
        assert run.has(name), f"the run's {name} is missing"
    assert run.has("results.parquet") == measured
    now = nodes_of(kube)
    assert set(now) == set(before) - set(gone)
    by_node = {str(r.node): r for r in decisions.itertuples(index=False)}
    for name, node in now.items():
        labels = node["metadata"].get("labels") or {}
        taints, had = gpucert_taints(node), gpucert_taints(before[name])
        assert TESTING not in taints, f"{name} still carries the testing taint"
        row = by_node.get(name)
        if row is None:  # not in this run: nothing of it changed
            assert taints == had, name
            assert labels.get(f"{PREFIX}/state") == (before[name]["metadata"].get("labels") or {}).get(
                f"{PREFIX}/state"
            ), name
            continue
        state: Any = row.state
        if pd.isna(state):  # inconclusive: the state as it was, no taint added
            assert labels.get(f"{PREFIX}/state") == (before[name]["metadata"].get("labels") or {}).get(
                f"{PREFIX}/state"
            ), name
            assert (UNHEALTHY in taints) == (UNHEALTHY in had), name
            assert row.taint in ("none", "kept", "refused"), (name, row.taint)
            continue
        assert labels.get(f"{PREFIX}/state") == row.state, name
        assert (node["metadata"].get("annotations") or {}).get(f"{PREFIX}/last-run") == outcome.run_id, name
        cond = condition(node, "GpuCertified")
        assert cond is not None, name
        assert cond["status"] == ("True" if row.state == "certified" else "False"), name
        # No gpucert taint without a recorded decision: the unhealthy taint is there iff the run says so.
        assert (UNHEALTHY in taints) == (row.taint in ("added", "kept")), (name, row.taint, taints)
        if row.taint in ("added", "kept"):
            assert taints[UNHEALTHY] == (row.cause or "unknown"), name
    jobs = kube.list_objects("batch/v1", "Job", NAMESPACE, label_selector=f"{PREFIX}/run-id={outcome.run_id}")
    said = [(j["metadata"].get("annotations") or {}) for j in jobs]
    per_node = sorted(str(a[f"{PREFIX}/node"]) for a in said if f"{PREFIX}/node" in a)
    pairs = sorted(str(a[f"{PREFIX}/pair"]) for a in said if f"{PREFIX}/pair" in a)
    assert len(per_node) + len(pairs) == len(jobs), "a Job that is neither a node's nor a pair's"
    # At most one per node (a Job given up on is deleted), and one for every node that was measured; at
    # most one per pair of the links step, on measured nodes only.
    assert len(per_node) == len(set(per_node)), f"duplicate Jobs: {per_node}"
    assert set(outcome.nodes) - set(outcome.inconclusive) <= set(per_node) <= set(outcome.nodes), per_node
    assert len(pairs) == len(set(pairs)), f"duplicate pair Jobs: {pairs}"
    assert {n for p in pairs for n in p.split(",")} <= set(outcome.nodes) - set(outcome.inconclusive), pairs
    versions = store.versions()
    if new_versions is not None:
        assert len(versions) == versions_before + new_versions, [v.version for v in versions]
    if outcome.baseline_version is not None:
        assert store.current_version() == outcome.baseline_version
        assert store.read().equals(store.read(outcome.baseline_version))  # the table is whole and readable
    return decisions


def check_tickets(store_root: Path, run_id: str, expected: int) -> list[Any]:
    """The local tickets of a ``file://`` store: ``expected`` of them, one per fingerprint, each naming
    ``run_id`` at most once; returns them."""
    tickets = LocalTickets(local_path(f"file://{store_root}")).tickets()
    keys = [t.fingerprint.key for t in tickets]
    assert len(keys) == len(set(keys)), f"two tickets for one fault: {keys}"
    assert len(tickets) == expected, keys
    for ticket in tickets:
        assert ticket.runs.count(run_id) <= 1, (ticket.id, ticket.runs)
    return tickets


def _while_running(
    kube: Kube, nodes: Sequence[str], act: Callable[[str], None], timeout_s: float = 30.0
) -> threading.Thread:
    """Start a thread that calls ``act(node)`` once for each of ``nodes``, as soon as that node's
    benchmark pod is Running."""

    def watch() -> None:
        todo, deadline = set(nodes), time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            for pod in kube.list_objects("v1", "Pod", NAMESPACE, label_selector=f"{PREFIX}/run-id"):
                node = (pod.get("spec") or {}).get("nodeName")
                if node in todo and (pod.get("status") or {}).get("phase") == "Running":
                    todo.discard(node)
                    act(node)
            time.sleep(0.05)

    thread = threading.Thread(target=watch, name="fault-while-running", daemon=True)
    thread.start()
    return thread


# --- both servers ----------------------------------------------------------------------------------------

#: The fixtures' servers, the real one first. pytest ends a module-scoped parametrised fixture's instance
#: only when the next parameter of that same fixture is set up (or the module ends): real then sim, each
#: real control plane is stopped before the next fixture starts its own — one at a time on the machine.
REAL_FIRST = tuple(sorted(BOTH, key=lambda server: server != "real"))
#: The fixtures that give each test using them both servers (a test of a ``BOTH`` row must use one).
SERVER_FIXTURES = ("api_cluster", "chaos", "onboard_cluster")


@contextlib.contextmanager
def faulty_cluster(server: str, **kwargs: Any) -> Iterator[Any]:
    """A cluster on ``server`` that takes API faults: the simulator, or a real control plane behind the API
    fault proxy (``set_faults``, ``faults.served`` and ``requests`` alike on both); faults off at the end."""
    with open_cluster(server, api_faults=True, **kwargs) as cluster:
        try:
            yield cluster
        finally:
            cluster.set_faults(None)


# --- the Kubernetes API --------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=REAL_FIRST)
def api_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    with faulty_cluster(request.param, nodes=3, preconfigured=True, seed=21) as cluster:
        yield cluster


def _slow_while_jobs_run(sim: Any, kube: Kube, run_id: str, timeout_s: float = 60.0) -> None:
    """Add 2 s to every API request from the first benchmark pod of ``run_id`` Running until every one of
    them has ended."""

    def phases() -> list[str]:
        return [str((p.get("status") or {}).get("phase")) for p in _run_pods(kube, run_id)]

    deadline = time.monotonic() + timeout_s
    while "Running" not in phases() and time.monotonic() < deadline:
        time.sleep(0.05)
    sim.set_faults(ApiFaults(latency_s=2.0))
    while (not (now := phases()) or any(p in ("Pending", "Running") for p in now)) and time.monotonic() < deadline:
        time.sleep(0.05)
    sim.set_faults(None)


@pytest.mark.parametrize("row", rows("api-500", "api-429", "api-latency"))
def test_certify_rides_out_a_flaky_api(row: Row, api_cluster: Any, tmp_path: Path) -> None:
    api_sim = api_cluster
    kube = connect(api_sim.kubeconfig_path)
    before, served = nodes_of(kube), api_sim.faults.served
    faults = {
        "api-500": ApiFaults(error_rate=0.1, seed=5),
        "api-429": ApiFaults(throttle_rate=0.1, retry_after_s=1, seed=6),
    }.get(row.id)
    block = _file_store(tmp_path)
    started = time.monotonic()
    try:
        if faults is not None:
            api_sim.set_faults(faults)
            outcome = run_certify(api_sim, block, run_id=f"fm-{row.id}")
        else:  # 2 s per call while the Jobs run: polls, Lease renewals, log reads all slow
            watcher = threading.Thread(target=_slow_while_jobs_run, args=(api_sim, kube, f"fm-{row.id}"), daemon=True)
            watcher.start()
            outcome = run_certify(api_sim, block, run_id=f"fm-{row.id}", pod_annotations={RUN_SECONDS_ANNOTATION: "3"})
            watcher.join(10)
    finally:
        api_sim.set_faults(None)
    took = time.monotonic() - started
    kind = {"api-500": "500", "api-429": "429", "api-latency": "slow"}[row.id]
    fired = api_sim.faults.served.get(kind, 0) - served.get(kind, 0)
    assert fired > 0, f"the fault of {row.id} never fired"
    decisions = check_end_state(kube, open_store(block.uri), outcome, before, versions_before=0)
    assert set(decisions["state"]) == {"certified"}, decisions[["node", "state", "summary"]]
    print(f"{row.id} on {api_sim.server}: {fired} faults served, certify took {took:.1f} s")


# --- pods that never run, a node deleted or gone NotReady mid-run: one certify run, a node each ---------

#: The chaos run's nodes by index: what happens to each (the last one is healthy).
CHAOS = {
    0: "job-image-pull",
    1: "job-unschedulable",
    2: "job-oom",
    3: "job-deadline",
    4: "node-deleted",
    5: "node-not-ready",
}
#: The reason each chaos node's Job is recorded with.
CHAOS_REASON = {
    "job-image-pull": "image_pull",
    "job-unschedulable": "unschedulable",
    "job-oom": "oom",
    "job-deadline": "deadline",
    "node-deleted": None,
    "node-not-ready": "deadline",
}
FOREIGN_TAINT = {"key": "maintenance", "value": "firmware", "effect": "NoSchedule"}


@dataclass(frozen=True)
class Chaos:
    sim: Any  # a SimCluster or a RealCluster
    kube: Kube
    store: Store
    root: Path
    outcome: CertifyOutcome
    decisions: pd.DataFrame
    before: dict[str, dict[str, Any]]

    def node(self, row: str) -> str:
        return self.sim.fleet.node_names[next(i for i, r in CHAOS.items() if r == row)]


@pytest.fixture(scope="module", params=REAL_FIRST)
def chaos(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Chaos]:
    """One certify run of 7 nodes, six of them each under one of the faults of :data:`CHAOS`, on each server.

    On the real server the faults take the real paths: the attached kubelets honour the same node
    annotations, the real scheduler leaves the tainted node's pod Pending (Unschedulable), the real Job
    controller ends the Jobs at their ``activeDeadlineSeconds`` and the attached kubelets confirm the pods'
    deletion; the deleted node is deleted through the API (its pod is left to pod GC, which waits 40 s, so
    its Job too ends at its deadline), the NotReady one's kubelet stops (Ready False, no Lease renewed; the
    node lifecycle controller taints it)."""
    root = tmp_path_factory.mktemp(f"chaos-store-{request.param}")
    with (
        open_cluster(request.param, nodes=7, preconfigured=True, seed=22) as sim,
        pytest.MonkeyPatch.context() as patch,
    ):
        names, kube = sim.fleet.node_names, connect(sim.kubeconfig_path)
        shaped = {
            0: {IMAGE_PULL_ERROR_ANNOTATION: "ErrImagePull"},
            2: {EXIT_CODE_ANNOTATION: "137", TERMINATED_REASON_ANNOTATION: "OOMKilled"},
            3: {RUN_SECONDS_ANNOTATION: "600"},
        }
        for index, notes in shaped.items():
            kube.merge_patch("v1", "Node", names[index], {"metadata": {"annotations": notes}})
        kube.merge_patch("v1", "Node", names[1], {"spec": {"taints": [FOREIGN_TAINT]}})
        before = nodes_of(kube)
        # A pod that cannot start is given up on after 1 s instead of 120 (the wave's grace, a timing knob).
        patch.setattr("gpucert.certify._wave.PENDING_GRACE_S", 1.0)
        deleted, down = names[4], names[5]
        watcher = _while_running(
            kube, [deleted, down], lambda n: sim.delete_node(n) if n == deleted else sim.set_node_ready(n, False)
        )
        block = _file_store(root)
        outcome = run_certify(
            sim, block, run_id="fm-chaos", deadline_s=4, pod_annotations={RUN_SECONDS_ANNOTATION: "1.5"}
        )
        watcher.join(5)
        store = open_store(block.uri)
        decisions = check_end_state(kube, store, outcome, before, versions_before=0, gone=[deleted])
        yield Chaos(sim, kube, store, root, outcome, decisions, before)


@pytest.mark.parametrize(
    "row", rows("job-image-pull", "job-unschedulable", "job-oom", "job-deadline", "node-deleted", "node-not-ready")
)
def test_a_node_whose_benchmark_cannot_run_is_inconclusive(row: Row, chaos: Chaos) -> None:
    node = chaos.node(row.id)
    outcome, names = chaos.outcome, chaos.sim.fleet.node_names
    print(f"{row.id} on {chaos.sim.server}: {outcome.inconclusive.get(node)}")
    # The run completed and decided every node: the healthy one certified, whatever the others did.
    assert outcome.states == {"certified": 1, "unchanged": len(CHAOS)}, outcome.states
    assert outcome.decision(names[6]).state == "certified"  # type: ignore[union-attr]
    decision = chaos.decisions.set_index("node").loc[node]
    assert pd.isna(decision["state"]), decision.to_dict()
    assert decision["verdict"] == "inconclusive", decision.to_dict()
    assert decision["taint"] in ("none", "refused"), decision.to_dict()
    reason = CHAOS_REASON[row.id]
    why = outcome.inconclusive[node]
    if reason is not None:
        assert why.startswith(f"{reason}:"), why
    # Never a GPU verdict: the node's only verdict row is the node-level inconclusive one.
    verdicts = run_of(chaos.store, outcome).verdicts()
    mine = verdicts[verdicts["node"] == node]
    assert list(mine["verdict"]) == ["inconclusive"], mine
    assert mine["gpu"].isna().all(), mine
    assert not check_tickets(chaos.root, outcome.run_id, expected=0)
    if row.id == "node-deleted":
        assert chaos.kube.find("v1", "Node", node) is None
        return
    now = chaos.kube.get("v1", "Node", node)
    assert UNHEALTHY not in gpucert_taints(now)
    pods = chaos.kube.list_objects("v1", "Pod", NAMESPACE, label_selector=f"{PREFIX}/run-id={outcome.run_id}")
    holding = [
        p["metadata"]["name"]
        for p in pods
        if (p.get("spec") or {}).get("nodeName") == node
        and (p.get("status") or {}).get("phase") in ("Pending", "Running")
    ]
    assert holding == [], f"{node}: pods still holding its GPUs: {holding}"
    if row.id == "job-unschedulable":
        assert FOREIGN_TAINT in now["spec"]["taints"]
    if row.id == "node-not-ready":
        cond = condition(now, "GpuCertified")
        assert cond is not None
        assert cond["status"] == "Unknown", cond


# --- the store: S3 (moto) behind the fault proxy --------------------------------------------------------

BUCKET = "gpucert-matrix"


@dataclass
class FirstTryProxy(FaultProxy):
    """The fault proxy answering the first try of every request of ``methods`` with ``action`` and letting
    its retry pass (a request on the same path that follows a faulted one is taken for its retry), so
    every call the store makes meets the fault exactly once."""

    methods: tuple[str, ...] = ()
    action: str | int = PASS
    code: str = "InternalError"

    def __post_init__(self) -> None:
        super().__post_init__()
        self._faulted: set[str] = set()
        self.faulted: list[str] = []

    def _match(self, method: str, path: str) -> Rule | None:
        if method not in self.methods:
            return super()._match(method, path)
        where = f"{method} {unquote(path.partition('?')[0])}"
        with self._lock:
            if where in self._faulted:
                self._faulted.discard(where)
                return None
            self._faulted.add(where)
            self.faulted.append(where)
        return Rule(method, path, self.action, code=self.code, hits=1)


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    pytest.importorskip("moto.server", reason="moto[server] is not installed (the test extra)")
    with moto_server() as endpoint:
        s3_client(endpoint).create_bucket(Bucket=BUCKET)
        yield endpoint


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Nothing from the host's ~/.aws; botocore's back-off cut to 10 ms (the tests need the tries only)."""
    from botocore.retries.standard import ExponentialBackoff

    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "GPUCERT_S3_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # For the test's own clients (a rival writer); the flows get theirs from the AwsCredentials block.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setattr(ExponentialBackoff, "delay_amount", lambda self, context: 0.01)


@pytest.fixture(scope="module")
def store_sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=2, preconfigured=True, seed=23) as sim:
        yield sim


def _s3_block(endpoint: str, prefix: str) -> StoreLocation:
    from prefect_aws import AwsCredentials
    from pydantic import SecretStr

    credentials = AwsCredentials(
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SecretStr(SECRET_KEY), region_name=REGION
    )
    return StoreLocation(uri=f"s3://{BUCKET}/{prefix}", credentials=credentials, endpoint_url=endpoint)


def _writes(proxy: FaultProxy, prefix: str) -> list[str]:
    """The objects the run PUT, as keys under the store's root (each once)."""
    root = f"/{BUCKET}/{prefix}/"
    keys = [unquote(s.path.partition("?")[0]).removeprefix(root) for s in proxy.seen if s.method == "PUT"]
    return sorted(set(keys))


@pytest.mark.usefixtures("s3_env")
@pytest.mark.parametrize("row", rows("store-5xx", "store-dropped"))
def test_every_write_of_the_run_meets_the_fault_once(row: Row, moto_endpoint: str, store_sim: SimCluster) -> None:
    kube, prefix = connect(store_sim.kubeconfig_path), f"m/{row.id}"
    before = nodes_of(kube)
    if row.id == "store-5xx":
        proxy = FirstTryProxy(moto_endpoint, methods=("PUT", "GET", "HEAD"), action=500)
    else:  # S3 did what was asked, the answer never came back: the retry must not do it twice
        proxy = FirstTryProxy(moto_endpoint, methods=("PUT",), action=DROP_AFTER)
    try:
        outcome = run_certify(store_sim, _s3_block(proxy.endpoint, prefix), run_id=f"fm-{row.id}")
        faulted, writes = list(proxy.faulted), _writes(proxy, prefix)
    finally:
        proxy.close()
    store = _s3_block(moto_endpoint, prefix).open()
    check_end_state(kube, store, outcome, before, versions_before=0)
    # Every object the run wrote had its first PUT faulted: the results, verdicts, decisions, stack and
    # report, the baseline version (table, meta), the pointer and its marker, the recorded tickets.
    assert {w.rsplit("/", 1)[-1] for w in writes} >= {
        "results.parquet",
        "verdicts.parquet",
        "decisions.parquet",
        "stack.json",
        "report.html",
        "baseline.parquet",
        "meta.json",
        "current",
        "made-current",
        f"run={outcome.run_id}.json",
    }, writes
    faulted_puts = {f.removeprefix(f"PUT /{BUCKET}/{prefix}/") for f in faulted if f.startswith("PUT")}
    assert faulted_puts == set(writes), sorted(set(writes) - faulted_puts)
    run = run_of(store, outcome)
    for name in ("results.parquet", "verdicts.parquet", "decisions.parquet"):
        assert len(run.table(name)), f"{name} is empty"
    assert outcome.ticketing == "not configured"
    assert outcome.tickets_recorded == 0  # no fault: nothing to record


@pytest.mark.usefixtures("s3_env")
def test_store_412_a_rival_wins_the_race_and_both_updates_are_kept(moto_endpoint: str, store_sim: SimCluster) -> None:
    from .test_store import add_key, keys_of

    kube, prefix = connect(store_sim.kubeconfig_path), "m/store-412"
    before = nodes_of(kube)
    rival = Store(S3ObjectStore(BUCKET, prefix, endpoint_url=moto_endpoint, region=REGION))
    proxy = FaultProxy(moto_endpoint)
    won: list[str] = []
    # The rival moves current after the run read it and just before the run's conditional PUT lands.
    proxy.inject(
        "PUT",
        "/baselines/current",
        PASS,
        before=lambda: won.append(rival.update(add_key("GPU-rival"), message="rival")),
    )
    try:
        outcome = run_certify(store_sim, _s3_block(proxy.endpoint, prefix), run_id="fm-store-412")
        pointer = [s.outcome for s in proxy.seen if s.method == "PUT" and s.path.endswith("/baselines/current")]
    finally:
        proxy.close()
    assert pointer == ["412", "200"], pointer
    store = _s3_block(moto_endpoint, prefix).open()
    check_end_state(kube, store, outcome, before, versions_before=0, new_versions=2)
    [rival_version] = won
    history = {v.version: v.parent for v in store.versions()}
    assert history == {rival_version: None, outcome.baseline_version: rival_version}, history
    kept = keys_of(store.read())
    assert "GPU-rival" in kept
    assert {str(u) for u in store_sim.fleet.uuids} <= kept, "the run's own baselines were lost"


def _marks(node: Mapping[str, Any]) -> tuple[Any, ...]:
    """What gpucert writes on a node: its labels and annotations under the prefix, its taints, its
    ``GpuCertified`` condition."""
    meta = node.get("metadata") or {}
    mine = {
        k: v
        for k, v in {**(meta.get("labels") or {}), **(meta.get("annotations") or {})}.items()
        if k.startswith(f"{PREFIX}/")
    }
    return mine, (node.get("spec") or {}).get("taints") or [], condition(node, "GpuCertified")


@pytest.mark.usefixtures("s3_env")
def test_store_unreachable_the_run_fails_before_it_acts(store_sim: SimCluster) -> None:
    row = ROWS["store-unreachable"]
    kube = connect(store_sim.kubeconfig_path)
    before = {name: _marks(node) for name, node in nodes_of(kube).items()}
    [port] = free_ports(1)  # nothing listens there: every connection is refused, retries included
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}|{BUCKET}"):
        run_certify(store_sim, _s3_block(f"http://127.0.0.1:{port}", f"m/{row.id}"), run_id="fm-store-down")
    # Nothing was acted on: no label, annotation, condition or taint of gpucert's, the testing taint gone.
    assert {name: _marks(node) for name, node in nodes_of(kube).items()} == before


# --- the flow process killed at a step, then started again with the same run id ------------------------

#: The row → the crash point the process dies at (None: the test kills it once its Jobs run).
KILLED = {
    "killed-jobs-started": None,
    "killed-settled": "settled",
    "killed-between-taints": "between-taints",
    "killed-baseline-write": "baseline-written",
    "killed-between-tickets": "between-tickets",
}


@pytest.fixture(scope="module")
def forks() -> ForkServerContext:
    return faultproc.fork_server()


@pytest.fixture(scope="module")
def api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    assert url, "the Prefect test harness sets PREFECT_API_URL"
    return str(url)


def _run_pods(kube: Kube, run_id: str) -> list[dict[str, Any]]:
    """The run's benchmark pods, one per node's Job (the links step's pair pods aside)."""
    pods = kube.list_objects("v1", "Pod", NAMESPACE, label_selector=f"{PREFIX}/run-id={run_id}")
    return [p for p in pods if f"{PREFIX}/node" in (p["metadata"].get("annotations") or {})]


@pytest.mark.parametrize("row", rows(*KILLED))
def test_a_killed_run_started_again_completes_and_duplicates_nothing(
    row: Row, forks: ForkServerContext, api_url: str, tmp_path: Path
) -> None:
    run_id, crash_at = f"fm-{row.id}", KILLED[row.id]
    # Two nodes with a hard-gate fault (tainted and ticketed without a re-run), one healthy one.
    with SimCluster(nodes=3, preconfigured=True, seed=24) as sim:
        names, kube = sim.fleet.node_names, connect(sim.kubeconfig_path)
        failing = names[:2]
        for node in failing:
            sim.inject_fault(Fault("remap_failure", node, 0))
        before, root = nodes_of(kube), tmp_path / "store"
        kwargs = {"pod_annotations": {RUN_SECONDS_ANNOTATION: "2" if crash_at is None else "0"}}
        args = (api_url, str(sim.kubeconfig_path), f"file://{root}", run_id, crash_at, kwargs)
        child = forks.Process(target=faultproc.certify_in_child, args=args, daemon=True)
        child.start()
        if crash_at is None:  # killed from outside, every Job running
            deadline = time.monotonic() + 60
            while sum(p["status"].get("phase") == "Running" for p in _run_pods(kube, run_id)) < len(names):
                assert child.is_alive(), "the run ended before its Jobs all ran"
                assert time.monotonic() < deadline, "the Jobs never all ran"
                time.sleep(0.05)
            os.kill(child.pid, signal.SIGKILL)  # type: ignore[arg-type]
        child.join(120)
        assert child.exitcode == -signal.SIGKILL, f"the run was not killed at {crash_at}: exit {child.exitcode}"
        store = open_store(f"file://{root}")
        _what_the_kill_left(row.id, kube, store, root, run_id, failing)

        outcome = run_certify(sim, _file_store(root), run_id=run_id, **kwargs)
        check_end_state(kube, store, outcome, before, versions_before=0, new_versions=1)
        # Each failed node tainted once: by the killed run (kept now) or by this one (added).
        assert sorted(outcome.with_taint("added") + outcome.with_taint("kept")) == sorted(failing)
        assert {d.node: d.state for d in outcome.decisions} == {
            n: "failed" if n in failing else "certified" for n in names
        }
        tickets = check_tickets(root, run_id, expected=len(failing))
        assert sorted(t.node for t in tickets) == sorted(failing)
        assert [(t.runs, t.occurrences) for t in tickets] == [([run_id], 1)] * len(failing)


def _what_the_kill_left(row: str, kube: Kube, store: Store, root: Path, run_id: str, failing: Sequence[str]) -> None:
    """Check the state a kill at ``row``'s step left: the step's half-done work, and nothing after it."""
    taints = {name: gpucert_taints(node) for name, node in nodes_of(kube).items()}
    tainted = sorted(n for n, t in taints.items() if UNHEALTHY in t)
    tickets = LocalTickets(local_path(f"file://{root}")).tickets() if (root / "tickets.sqlite").exists() else []
    on_disk = sorted(p.parent.name for p in root.glob("baselines/v=*/meta.json"))
    # What each kill leaves: (nodes tainted, tickets, baseline versions on disk).
    left = (tainted, len(tickets), len(on_disk))
    if row == "killed-jobs-started":
        assert {t.get(TESTING) for t in taints.values()} == {run_id}, "the Jobs ran under the testing taint"
        assert left == ([], 0, 0)
    elif row == "killed-settled":
        run = CertificationRun(store, run_id, _today())
        assert run.has("verdicts.parquet")
        assert run.has("decisions.parquet")
        assert left == ([], 0, 0)
    elif row == "killed-between-taints":
        assert left == ([failing[0]], 0, 0)  # one taint written, the other not
    elif row == "killed-baseline-write":
        assert left == (sorted(failing), 0, 1)  # a version written, but never made current: it does not count
        assert store.current_version() is None
        assert store.versions() == []
    else:
        assert left == (sorted(failing), 1, 1), [t.fingerprint.key for t in tickets]  # one opened, one not


def _today() -> date:
    from datetime import UTC, datetime

    return datetime.now(UTC).date()


# --- watches: watch-nodes announcing joins to onboard, under dropped and expired watches ----------------


@pytest.fixture(scope="module", params=REAL_FIRST)
def onboard_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    with faulty_cluster(request.param, nodes=2, preconfigured=True, seed=25) as cluster:
        yield cluster


def _announce_while(sim: Any, faults: ApiFaults, settle_s: float) -> tuple[str, list[tuple[str, str]]]:
    """Run watch-nodes' loop under ``faults``; after ``settle_s`` a node joins; returns that node and what
    was announced (node, uid) by the time it was seen, plus a little more watching (a second announcement
    would show)."""
    # The client's retries shortened (a knob of the facade), so a watch cut on every try gives up in about
    # a second rather than the default's several: the fallback is what the row is about.
    kube = connect(sim.kubeconfig_path, retry=RetryPolicy(attempts=3, base_delay_s=0.05, max_delay_s=0.2))
    announced: list[tuple[str, str]] = []
    done = threading.Event()
    errors: list[BaseException] = []

    def watch() -> None:
        try:
            announce_joined_nodes(
                kube,
                prefix=PREFIX,
                selector=None,
                emit=lambda n, u: announced.append((n, u)),
                timeout_s=2,
                stop=done.is_set,
            )
        except BaseException as exc:
            errors.append(exc)

    sim.set_faults(faults)
    thread = threading.Thread(target=watch, name="watch-nodes", daemon=True)
    thread.start()
    try:
        time.sleep(settle_s)  # the watch has been cut (or answered 410) at least once by now
        [new] = sim.add_nodes(1, uncertified_taint=UNCERTIFIED)
        deadline = time.monotonic() + 20
        while not any(n == new for n, _ in announced) and not errors and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.6)  # watched on a little: a duplicate announcement would come now
    finally:
        done.set()
        thread.join(10)
        sim.set_faults(None)
    assert not errors, f"watch-nodes died: {errors[0]!r}"
    return new, announced


@pytest.mark.parametrize("row", rows("watch-dropped", "watch-expired"))
def test_watch_nodes_announces_a_join_once_and_onboard_admits_it(
    row: Row, onboard_cluster: Any, tmp_path: Path
) -> None:
    onboard_sim = onboard_cluster
    kube = connect(onboard_sim.kubeconfig_path)
    served, watches = onboard_sim.faults.served, _watch_requests(onboard_sim)
    cut = onboard_sim.proxy.cut if onboard_sim.server == "real" else 0
    faults = ApiFaults(drop_watch_after_s=0.3) if row.id == "watch-dropped" else ApiFaults(watch_expired_rate=1.0)
    new, announced = _announce_while(onboard_sim, faults, settle_s=0.8)
    joined = kube.get("v1", "Node", new)
    uid = joined["metadata"]["uid"]
    assert announced == [(new, uid)], announced  # exactly once, and nothing else
    assert joined["metadata"]["annotations"][f"{PREFIX}/join-announced"] == uid
    if row.id == "watch-dropped":  # cut watches were watched again (more than the ~2 s watches would need)
        assert _watch_requests(onboard_sim) - watches >= 4
        if onboard_sim.server == "real":  # the fault proxy also counts the watches it cut
            assert onboard_sim.proxy.cut > cut, "no watch was cut"
    else:
        assert onboard_sim.faults.served.get("expired", 0) > served.get("expired", 0)
    # The announcement starts onboard-node (its deployment trigger); run it as the trigger would.
    before = nodes_of(kube)
    result = asyncio.run(
        onboard(node=new, uid=uid, cluster=_cluster(onboard_sim), store=_file_store(tmp_path), ready_timeout_s=30)
    )
    assert (result.state, result.admitted) == ("certified", True)
    assert result.certify is not None
    check_end_state(kube, open_store(f"file://{tmp_path}"), result.certify, before, versions_before=0)
    assert UNCERTIFIED not in gpucert_taints(kube.get("v1", "Node", new))


def _watch_requests(sim: Any) -> int:
    return sum(1 for r in sim.requests if r.verb == "watch" and r.resource == "nodes")


# --- operate and configure under a flaky API -------------------------------------------------------------


@pytest.fixture(scope="module")
def api_sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=3, preconfigured=True, seed=21) as sim:
        yield sim
        sim.set_faults(None)


def test_operate_night_under_429s(api_sim: SimCluster, tmp_path: Path) -> None:
    # Not in issue 29's set of two-server rows: on the real server the attached kubelets' pods have loopback
    # addresses, which the endpoint controllers refuse, so operate finds no DCGM exporter and its telemetry
    # step reads nothing — the row's promise ("the night's telemetry ... complete") cannot be kept there.
    row = ROWS["api-429-operate"]
    kube = connect(api_sim.kubeconfig_path)
    before, served = nodes_of(kube), api_sim.faults.served.get("429", 0)
    api_sim.set_faults(ApiFaults(throttle_rate=0.04, retry_after_s=1, seed=7))
    try:
        night = asyncio.run(
            operate(cluster=_cluster(api_sim), store=_file_store(tmp_path), rotation_days=0.0, scrape_interval_s=0.2)
        )
    finally:
        api_sim.set_faults(None)
    assert api_sim.faults.served.get("429", 0) > served, f"the fault of {row.id} never fired"
    assert sorted(night.due) == sorted(api_sim.fleet.node_names), night.due  # every node due (rotation 0)
    assert night.certify is not None
    decisions = check_end_state(kube, open_store(f"file://{tmp_path}"), night.certify, before, versions_before=0)
    assert set(decisions["state"]) == {"certified"}


def test_configure_rides_out_500s_and_a_second_run_writes_nothing() -> None:
    from .test_flow_configure import _versions

    row = ROWS["api-500-configure"]
    with SimCluster(nodes=2, faults=ApiFaults(error_rate=0.1, throttle_rate=0.02, retry_after_s=1, seed=8)) as sim:
        result = configure(cluster=_cluster(sim), rollout_timeout_s=60)
        assert sim.faults.served.get("500", 0) > 0, f"the fault of {row.id} never fired"
        assert result.gpus_verified == 2 * 8
        kube = connect(sim.kubeconfig_path)
        written = _versions(kube)  # every object configure may touch → its resourceVersion
        again = configure(cluster=_cluster(sim), rollout_timeout_s=60)
        changed = sorted(k for k, v in _versions(kube).items() if written.get(k) != v)
        assert changed == [], f"the second run wrote {changed}"
        assert again.gpus_verified == 2 * 8
        assert again.drift == ()
        sim.set_faults(None)
        for node in kube.nodes():
            labels = node["metadata"]["labels"]
            assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
            assert labels[f"{PREFIX}/stack"] == "managed"
            assert {f"{PREFIX}/stack.{c}" for c in ("driver", "device-plugin", "dcgm-exporter")} <= set(labels)
        daemonsets = kube.list_objects("apps/v1", "DaemonSet")
        assert len(daemonsets) == len({(d["metadata"]["namespace"], d["metadata"]["name"]) for d in daemonsets})
        assert all(d["status"].get("numberReady") == d["status"].get("desiredNumberScheduled") for d in daemonsets)


# --- Prefect: its server restarted mid-run; a killed worker's run ----------------------------------------


def _flow_run_states(name: str) -> list[str]:
    """The state types of the flow runs named ``name`` on the Prefect server, oldest first."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName
    from prefect.client.schemas.sorting import FlowRunSort

    async def read() -> list[str]:
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])), sort=FlowRunSort.START_TIME_ASC
            )
        return [str(r.state.type.value) if r.state else "NONE" for r in runs]

    return asyncio.run(read())


def test_prefect_server_restarted_mid_run(tmp_path: Path) -> None:
    """The session's Prefect server (the test harness's) is stopped and started again — same port, same
    SQLite database — while a certify run waits on its Jobs; Prefect's client rides it out (it retries a
    refused connection once it has connected before)."""
    from prefect.server.api.server import SubprocessASGIServer

    row = ROWS["prefect-restarted"]
    server = SubprocessASGIServer._instances.get(None)
    assert server is not None, "the Prefect test harness runs a server of its own"
    assert server.running
    run_id = f"fm-{row.id}"
    with SimCluster(nodes=2, preconfigured=True, seed=26) as sim:
        kube, block = connect(sim.kubeconfig_path), _file_store(tmp_path)
        before = nodes_of(kube)
        done: dict[str, Any] = {}

        def run() -> None:
            try:
                done["outcome"] = run_certify(sim, block, run_id=run_id, pod_annotations={RUN_SECONDS_ANNOTATION: "2"})
            except BaseException as exc:
                done["error"] = exc

        thread = threading.Thread(target=contextvars.copy_context().run, args=(run,), daemon=True)
        thread.start()
        deadline = time.monotonic() + 60
        while not any(p["status"].get("phase") == "Running" for p in _run_pods(kube, run_id)):
            assert thread.is_alive(), done.get("error")
            assert time.monotonic() < deadline, "the run's Jobs never ran"
            time.sleep(0.05)
        down = time.monotonic()
        server.stop()
        server.start(timeout=120)
        print(f"{row.id}: the Prefect server was down {time.monotonic() - down:.1f} s")
        thread.join(180)
        assert not thread.is_alive(), "the run never ended"
        assert "error" not in done, f"the run did not survive the restart: {done['error']!r}"
        outcome: CertifyOutcome = done["outcome"]
        decisions = check_end_state(kube, open_store(block.uri), outcome, before, versions_before=0)
        assert set(decisions["state"]) == {"certified"}
    assert _flow_run_states(run_id) == ["COMPLETED"]


#: The zombie automation's ``within`` here: above one 30 s heartbeat with room for a loaded machine, yet half
#: of automations.yaml's 90 s, so the test waits less. Everything else is the file's, verbatim.
ZOMBIE_WITHIN_S = 45
PREFECT = str(Path(sys.executable).with_name("prefect"))


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid``, read from /proc (a process worker starts each flow run in a session of
    its own, so the worker's process group would miss them)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):  # a process that ended while we read
            continue
        children.setdefault(parent, []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _prefect(env: Mapping[str, str], *args: str) -> str:
    done = subprocess.run(
        [PREFECT, "--no-prompt", *args], env=env, cwd=ROOT, capture_output=True, text=True, check=False, timeout=120
    )
    assert done.returncode == 0, f"prefect {' '.join(args)}: {done.stdout}{done.stderr}"
    return done.stdout


@contextlib.contextmanager
def process_worker(env: Mapping[str, str], queue: str, log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A real ``prefect worker start`` on the ``gpucert`` process pool's ``queue``, one run at a time; what it
    and its flow runs print goes to ``log`` (kept with the test's temporary files, for a failure)."""
    with log.open("wb") as out:
        worker = subprocess.Popen(
            [
                PREFECT,
                "worker",
                "start",
                "--pool",
                "gpucert",
                "--type",
                "process",
                "--limit",
                "1",
                "--work-queue",
                queue,
            ],
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        try:
            yield worker
        finally:
            stop_process(worker)


def _run_job_uids(kube: Kube, run_id: str) -> dict[str, str]:
    """The run's benchmark Jobs, one per node (its links' pair Jobs aside): name → uid (a Job deleted and
    made again has a new uid)."""
    jobs = kube.list_objects("batch/v1", "Job", NAMESPACE, label_selector=f"{PREFIX}/run-id={run_id}")
    return {
        j["metadata"]["name"]: j["metadata"]["uid"]
        for j in jobs
        if f"{PREFIX}/node" in (j["metadata"].get("annotations") or {})
    }


def _automations_for_the_test() -> list[dict[str, Any]]:
    """automations.yaml's automations, the zombie rule's ``within`` shortened to :data:`ZOMBIE_WITHIN_S`."""
    automations: list[dict[str, Any]] = yaml.safe_load((ROOT / "automations.yaml").read_text())["automations"]
    for automation in automations:
        if automation["trigger"]["posture"] == "Proactive":
            automation["trigger"]["within"] = ZOMBIE_WITHIN_S
    return automations


def _flow_run(flow_run_id: Any) -> Any:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(flow_run_id)


def _shard_runs(run_id: str) -> list[Any]:
    """The ``certify-shard`` flow runs of certify run ``run_id`` (named ``<run id>-shard-<k>``)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(like_=f"{run_id}-shard-")))


def _running_on(worker: subprocess.Popen[bytes], run_id: str) -> Any:
    """The shard of ``run_id`` whose flow run process is a child of ``worker`` (the process worker records it
    as the flow run's ``infrastructure_pid``, ``<host>:<pid>``), or None."""
    below = set(_descendants(worker.pid))
    return next(
        (
            r
            for r in _shard_runs(run_id)
            if r.state
            and r.state.is_running()
            and r.infrastructure_pid
            and int(str(r.infrastructure_pid).rpartition(":")[2]) in below
        ),
        None,
    )


def _node_pods(kube: Kube, run_id: str, node: str) -> list[dict[str, Any]]:
    return [p for p in _run_pods(kube, run_id) if (p.get("spec") or {}).get("nodeName") == node]


def _error_logs(flow_run_id: Any, last: int = 5) -> list[str]:
    """The flow run's last ``last`` log lines at WARNING or above, for a failure's message."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId, LogFilterLevel

    with get_client(sync_client=True) as client:
        logs = client.read_logs(
            LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]), level=LogFilterLevel(ge_=30))
        )
    return [f"{log.name}: {log.message[:600]}" for log in sorted(logs, key=lambda g: g.timestamp)[-last:]]


def _state_history(flow_run_id: Any) -> list[str]:
    """The flow run's states, oldest first, as ``TYPE`` or ``TYPE(name)`` where the name is not the type's."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        states = sorted(client.read_flow_run_states(flow_run_id), key=lambda s: s.timestamp)
    return [s.type.value + (f"({s.name})" if s.name and s.name.upper() != s.type.value else "") for s in states]


def test_a_killed_workers_run_is_brought_back_by_prefect(api_url: str, tmp_path: Path) -> None:
    """A certify of 4 nodes in shards of 2 (issue 17), started through its deployment: the parent on one
    process worker, one shard on each of two more (``--limit 1`` each, so the shards land on both). Once
    every Job exists, one shard's worker and its flow run's process are SIGKILLed together (its node
    lost). Heartbeats stop; automations.yaml's rules mark that shard crashed and schedule it again; the
    other worker picks it up — the same flow run, so the same run id — it keeps the Jobs it made, and
    the parent, which waited, judges the whole run and completes."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment

    row = ROWS["worker-killed"]
    with SimCluster(nodes=4, preconfigured=True, seed=27) as sim:
        kube, store_uri = connect(sim.kubeconfig_path), f"file://{tmp_path / 'store'}"
        before = nodes_of(kube)
        env = {
            **os.environ,
            "PREFECT_API_URL": api_url,
            "KUBECONFIG": str(sim.kubeconfig_path),
            "GPUCERT_STORE": store_uri,
            "PREFECT_WORKER_QUERY_SECONDS": "1",
        }
        _prefect(env, "work-pool", "create", "gpucert", "--type", "process", "--overwrite")
        _prefect(env, "deploy", "--name", "certify", "--name", "certify-shard")
        _prefect(env, "automation", "create", "--from-json", json.dumps(_automations_for_the_test()))
        policy = CertificationPolicy(shard_size=2)
        policy_ref = {"$ref": {"block_document_id": str(policy.save("fm-shards", overwrite=True))}}
        try:
            # No saved team blocks here: the names prefect.yaml gives are cleared, so the workers' $KUBECONFIG
            # and $GPUCERT_STORE say where (flows/_setup.py).
            flow_run = run_deployment(
                "certify/certify",
                timeout=0,
                parameters={
                    "policy": policy_ref,
                    "pod_annotations": {RUN_SECONDS_ANNOTATION: "5"},
                    "cluster_block": None,
                    "store_block": None,
                    "policy_block": None,
                },
            )
            assert isinstance(flow_run, FlowRun)
            with (
                process_worker(env, "default", tmp_path / "parent.log"),
                process_worker(env, "shards", tmp_path / "doomed.log") as doomed,
                process_worker(env, "shards", tmp_path / "other.log"),
            ):
                deadline = time.monotonic() + 300  # generous: on a loaded machine a flow run takes a while to start
                while not (doomed_shard := _running_on(doomed, run_id := _flow_run(flow_run.id).name)) or any(
                    not _node_pods(kube, run_id, n) for n in doomed_shard.parameters["nodes"]
                ):
                    assert doomed.poll() is None, "a worker died on its own"
                    parent = _flow_run(flow_run.id)
                    assert not (parent.state and parent.state.is_final()), (
                        f"the parent ended before any shard ran: {_state_history(flow_run.id)}; "
                        f"{parent.state.message}; its last errors: {_error_logs(flow_run.id)}"
                    )
                    assert time.monotonic() < deadline, f"no shard's Jobs ran: {_state_history(flow_run.id)}"
                    time.sleep(0.2)
                jobs = _run_job_uids(kube, run_id)
                for pid in [doomed.pid, *_descendants(doomed.pid)]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                doomed.wait(timeout=30)
                down = time.monotonic()
                deadline = down + ZOMBIE_WITHIN_S + 150
                while (state := _flow_run(flow_run.id).state.type.value) != "COMPLETED":
                    assert state not in ("FAILED", "CANCELLED", "CRASHED"), _state_history(flow_run.id)
                    assert time.monotonic() < deadline, f"never completed: {_state_history(flow_run.id)}"
                    time.sleep(0.5)
            print(f"{row.id}: the run completed {time.monotonic() - down:.0f} s after the kill")
        finally:
            _prefect(env, "automation", "delete", "--all")
        shards = {s.id: s for s in _shard_runs(run_id)}
        killed, spared = _state_history(doomed_shard.id), _state_history(*(set(shards) - {doomed_shard.id}))
        assert "CRASHED" not in spared, spared  # the other worker's shard ran once
        assert spared[-1] == "COMPLETED", spared
        assert "CRASHED" in killed, killed  # the killed one: crashed, scheduled again, completed
        assert killed.index("CRASHED") < killed.index("SCHEDULED(AwaitingRetry)"), killed
        assert killed[-1] == "COMPLETED", killed
        assert shards[doomed_shard.id].run_count == 2
        assert _flow_run(flow_run.id).run_count == 1, "the parent waited: it never crashed"

        # The end state of a whole run: every node decided once, the killed shard's Jobs kept.
        run = CertificationRun(open_store(store_uri), run_id, _today())
        decisions = run.decisions()
        assert sorted(decisions["node"]) == sorted(before)
        assert set(decisions["state"]) == {"certified"}
        for name, node in nodes_of(kube).items():
            assert TESTING not in gpucert_taints(node), f"{name} still carries the testing taint"
            assert (node["metadata"].get("labels") or {}).get(f"{PREFIX}/state") == "certified", name
        after = _run_job_uids(kube, run_id)
        assert jobs.items() <= after.items(), "the killed shard's Jobs were made again"
        assert len(after) == len(before), "one Job per node"
        assert len(_run_pods(kube, run_id)) == len(before), "a node was benchmarked twice"


# --- the table itself ------------------------------------------------------------------------------------


def docs_table() -> list[str]:
    """The matrix as docs/design/testing.md's "Fault matrix" table (markdown lines)."""
    lines = ["| row | fault | promise checked | servers | test |", "|---|---|---|---|---|"]
    for row in MATRIX:
        cell = row.test + (f"[{row.id}]" if _row_ids(row.test) else "")
        servers = " and ".join(f"`{s}`" for s in row.servers)
        lines.append(f"| `{row.id}` | {row.fault} | {row.promise} | {servers} | {row.flow}: `{cell}` |")
    return lines


def _row_ids(test: str) -> list[str]:
    """The row ids a test function is parametrised over (none for a test of one row)."""
    marks = getattr(globals()[test], "pytestmark", [])
    return [p.id for m in marks if m.name == "parametrize" for p in m.args[1]]


def test_every_row_has_its_test_and_the_docs_show_the_matrix() -> None:
    import inspect

    for row in MATRIX:
        assert callable(globals().get(row.test)), f"{row.id}: no test {row.test}"
        ids = _row_ids(row.test)
        assert not ids or row.id in ids, f"{row.test} does not run {row.id}"
        # A row said to run on both servers is run by a test using a fixture of both; no other is.
        fixtures = set(inspect.signature(globals()[row.test]).parameters) & set(SERVER_FIXTURES)
        assert row.servers in (("sim",), BOTH), (row.id, row.servers)
        assert bool(fixtures) == (row.servers == BOTH), f"{row.id}: servers {row.servers}, fixtures {fixtures}"
    assert len(ROWS) == len(MATRIX), "two rows share an id"
    testing_doc = (ROOT / "docs" / "design" / "testing.md").read_text(encoding="utf-8")
    section = testing_doc[testing_doc.index("## Fault matrix") :]
    table = [line for line in section.splitlines() if line.startswith("|")]
    assert table[: len(MATRIX) + 2] == docs_table(), "docs/design/testing.md's fault matrix is not this file's"
