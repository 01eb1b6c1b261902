"""One run per node at a time, against ``gpucert sim``: :class:`gpucert.kube.NodeLeases` (acquire, held by
another run, a lapsed Lease taken over, a race lost, renew, release) and the certify wave under them
(the ``<prefix>/testing`` taint on while the Job runs and lifted after success, failure, an exception
or cancellation; a node another run holds waited for or skipped with the reason; a crashed run's Job
deleted on takeover; a live run's Job never an orphan)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import gpucert.kube
from gpucert.certify import BenchmarkSettings, benchmark_job, orphaned_jobs, payload_configmap, run_wave
from gpucert.kube import Kube, LeaseLost, NodeLeases, connect, lease_name, lift_testing_taint, taint_testing
from gpucert.stack import dns_subdomain_ok
from gpucert_sim._objects import NODES
from gpucert_sim._store import WatchEvent

from .conftest import eventually
from .realcluster import SERVERS, open_cluster

PREFIX = "gpucert.io"
TESTING = "gpucert.io/testing"  # the contract (README); testing_taint() must say the same
T0 = datetime(2026, 3, 1, 2, tzinfo=UTC)


@pytest.fixture(scope="module", params=SERVERS)
def sim(request: pytest.FixtureRequest) -> Iterator[Any]:
    """The simulator, and a real control plane with the simulator's kubelets (issue 29): one body, two servers."""
    with open_cluster(request.param, nodes=6, preconfigured=True, seed=4) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kube(sim: Any) -> Kube:
    return connect(sim.kubeconfig_path)


@pytest.fixture(scope="module")
def settings() -> BenchmarkSettings:
    return BenchmarkSettings()


@pytest.fixture(scope="module")
def payload(kube: Kube, settings: BenchmarkSettings) -> dict[str, Any]:
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": settings.namespace}})
    return kube.apply(payload_configmap(settings))


def node(sim: Any, i: int) -> str:
    return sim.fleet.node_names[i]


def leases(kube: Kube, holder: str, at: datetime | None = None, duration_s: int = 60) -> NodeLeases:
    clock = (lambda: at) if at is not None else (lambda: datetime.now(UTC))
    return NodeLeases(kube, holder, namespace=BenchmarkSettings().namespace, duration_s=duration_s, clock=clock)


def taints(kube: Kube, name: str) -> list[tuple[str, str]]:
    return [(t["key"], t.get("value", "")) for t in kube.get("v1", "Node", name)["spec"].get("taints") or ()]


def no_lease(kube: Kube, name: str) -> bool:
    return leases(kube, "probe").read(name) is None


# --- NodeLeases ---------------------------------------------------------------------------------------------


def test_lease_names_are_dns_subdomains_distinct_for_long_nodes() -> None:
    assert gpucert.kube.testing_taint(PREFIX) == TESTING  # through the module: pytest collects test* names
    assert lease_name("gpu-node-00001") == "gpucert-node-gpu-node-00001"
    long_a, long_b = "n" * 250 + ".a", "n" * 250 + ".b"
    names = {lease_name(long_a), lease_name(long_b)}
    assert len(names) == 2
    assert all(len(n) <= 253 and dns_subdomain_ok(n) for n in names)


def test_acquire_held_by_another_same_holder_again_and_release(sim: Any, kube: Kube) -> None:
    n = node(sim, 0)
    a, b = leases(kube, "run-a"), leases(kube, "run-b")
    first = a.acquire(n)
    assert first.held
    assert first.previous is None
    assert first.holder == "run-a"
    other = b.acquire(n)
    assert not other.held
    assert other.holder == "run-a"
    assert other.reason.startswith("benchmarked by run run-a (Lease gpucert-system/gpucert-node-")
    again = a.acquire(n)  # a run started again with its own id holds its own Lease
    assert again.held
    assert again.previous is None
    assert again.lease.acquired == first.lease.acquired
    assert b.release(n) is False  # never deleted under its holder
    assert a.live_holder(n) == "run-a"
    assert a.release(n) is True
    assert no_lease(kube, n)
    assert a.release(n) is False
    assert b.acquire(n).held
    assert b.release(n)


def test_a_lapsed_lease_is_taken_over_and_its_holder_loses_it(sim: Any, kube: Kube) -> None:
    n = node(sim, 1)
    crashed = leases(kube, "run-crashed", at=T0, duration_s=30)
    old = crashed.acquire(n)
    assert old.held
    assert leases(kube, "run-late", at=T0 + timedelta(seconds=29), duration_s=30).acquire(n).held is False
    late = leases(kube, "run-late", at=T0 + timedelta(seconds=31), duration_s=30)
    taken = late.acquire(n)
    assert taken.held
    assert taken.previous == "run-crashed"
    assert taken.lease.transitions == old.lease.transitions + 1
    with pytest.raises(LeaseLost, match="now held by run run-late"):
        crashed.renew(old)
    assert crashed.release(n) is False
    assert late.release(n) is True


def test_renew_moves_renew_time_and_a_deleted_lease_is_lost(sim: Any, kube: Kube) -> None:
    n = node(sim, 1)
    now = [T0]
    mine = NodeLeases(kube, "run-r", namespace=BenchmarkSettings().namespace, duration_s=30, clock=lambda: now[0])
    claim = mine.acquire(n)
    now[0] = T0 + timedelta(seconds=20)
    renewed = mine.renew(claim)
    assert renewed.lease.renewed == now[0]
    assert renewed.lease.acquired == T0
    assert int(renewed.lease.resource_version) > int(claim.lease.resource_version)
    now[0] = T0 + timedelta(seconds=45)  # 25 s after the renewal: still live for another run
    assert leases(kube, "run-x", at=now[0]).acquire(n).held is False
    assert mine.release(n)
    with pytest.raises(LeaseLost, match="deleted"):
        mine.renew(renewed)


class _Racing(Kube):
    """The real client, with another run's write landing just before this one's first update (the moment
    between reading a lapsed Lease and taking it over)."""

    def __init__(self, base: Kube, before_update: Any) -> None:
        super().__init__(base.api_client, base.retry)
        self._before_update = before_update

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        if method == "PUT" and self._before_update is not None:
            hook, self._before_update = self._before_update, None
            hook()
        return super().request(method, path, **kwargs)


def test_two_runs_racing_for_a_lapsed_lease_one_wins_the_other_sees_it(sim: Any, kube: Kube) -> None:
    n = node(sim, 2)
    leases(kube, "run-gone", at=T0, duration_s=30).acquire(n)
    later = T0 + timedelta(minutes=5)
    winner = leases(kube, "run-fast", at=later)
    won: list[bool] = []
    slow = NodeLeases(
        _Racing(kube, lambda: won.append(winner.acquire(n).held)),
        "run-slow",
        namespace=BenchmarkSettings().namespace,
        clock=lambda: later,
    )
    lost = slow.acquire(n)
    assert won == [True]
    assert not lost.held
    assert lost.holder == "run-fast"
    assert winner.release(n)


def test_testing_taint_replaces_a_stale_one_and_keeps_other_taints(sim: Any, kube: Kube) -> None:
    n = node(sim, 3)
    kube.merge_patch(
        "v1",
        "Node",
        n,
        {
            "spec": {
                "taints": [
                    {"key": "example.com/other", "value": "x", "effect": "NoSchedule"},
                    {"key": TESTING, "value": "run-crashed", "effect": "NoSchedule"},
                ]
            }
        },
    )
    assert taint_testing(kube, n, prefix=PREFIX, run_id="run-t")
    assert taints(kube, n) == [("example.com/other", "x"), (TESTING, "run-t")]
    assert taint_testing(kube, n, prefix=PREFIX, run_id="run-t") is False  # already so: nothing written
    assert lift_testing_taint(kube, n, prefix=PREFIX)
    assert taints(kube, n) == [("example.com/other", "x")]
    assert lift_testing_taint(kube, n, prefix=PREFIX) is False
    kube.merge_patch("v1", "Node", n, {"spec": {"taints": None}})


# --- the wave under leases ----------------------------------------------------------------------------------


def _wave(
    kube: Kube,
    nodes: Mapping[str, int],
    run_id: str,
    payload: Mapping[str, Any],
    annotations: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> Any:
    settings = BenchmarkSettings(pod_annotations=dict(annotations or {}))
    return run_wave(kube, nodes, run_id, payload, settings, poll_s=0.05, **kwargs)


def _jobs(kube: Kube, run_id: str) -> list[dict[str, Any]]:
    return kube.list_objects(
        "batch/v1", "Job", BenchmarkSettings().namespace, label_selector=f"{PREFIX}/run-id={run_id}"
    )


def test_the_testing_taint_is_on_while_the_pod_is_bound_and_lifted_after(
    sim: Any, kube: Kube, payload: dict[str, Any]
) -> None:
    n = node(sim, 0)
    bound: list[list[str]] = []

    def on_event(event: WatchEvent) -> None:  # the node's taints at the moment the scheduler binds the pod
        spec = event.obj.get("spec") or {}
        was = (event.old or {}).get("spec") or {}
        bound_now = event.type != "DELETED" and spec.get("nodeName") == n and not was.get("nodeName")
        if event.resource == "v1/pods" and bound_now:
            node_obj = sim.store.get(NODES, None, n)
            bound.append([t["key"] for t in (node_obj or {}).get("spec", {}).get("taints") or ()])

    sim.store.subscribe(on_event)
    try:
        wave = asyncio.run(_wave(kube, {n: 8}, "lease-ok", payload))
    finally:
        sim.store.unsubscribe(on_event)
    assert wave.runs[n].state == "succeeded"
    assert bound == [[TESTING]]  # tainted when scheduled, and the benchmark pod tolerated it
    assert taints(kube, n) == []
    assert no_lease(kube, n)
    assert wave.leftovers == {}


@pytest.mark.parametrize("how", ["failure", "exception", "cancelled"])
def test_the_taint_is_lifted_and_the_lease_released_whatever_the_outcome(
    sim: Any, kube: Kube, payload: dict[str, Any], how: str
) -> None:
    n = node(sim, 4)
    run_id = f"lease-{how}"
    if how == "failure":  # the benchmark container exits 1: the Job fails
        wave = asyncio.run(_wave(kube, {n: 8}, run_id, payload, {"sim.gpucert.io/exit-code": "1"}))
        assert (wave.runs[n].state, wave.runs[n].reason) == ("failed", "error")
    elif how == "exception":  # the Job cannot be rendered (a ConfigMap that carries no payload)
        broken = {"metadata": {"name": "not-a-payload"}, "data": {}}
        wave = asyncio.run(_wave(kube, {n: 8}, run_id, broken))
        assert (wave.runs[n].state, wave.runs[n].reason) == ("failed", "error")
        assert "carries no payload" in wave.runs[n].message
    else:  # the wave cancelled mid-benchmark (a task timeout): its Job goes too, the node is free

        async def cut_short() -> None:
            task = asyncio.ensure_future(_wave(kube, {n: 8}, run_id, payload, {"sim.gpucert.io/run-seconds": "60"}))
            await asyncio.to_thread(eventually, lambda: _jobs(kube, run_id) and TESTING in dict(taints(kube, n)))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cut_short())
        assert _jobs(kube, run_id) == []
    assert taints(kube, n) == []
    assert no_lease(kube, n)


def test_a_node_another_run_holds_is_waited_for_then_benchmarked(sim: Any, kube: Kube, payload: dict[str, Any]) -> None:
    n = node(sim, 5)
    other = leases(kube, "run-other")
    assert other.acquire(n).held
    held_until = other.read(n).expires  # type: ignore[union-attr]
    threading.Timer(0.5, other.release, (n,)).start()  # the other run's benchmark ends
    said: list[str] = []
    wave = asyncio.run(_wave(kube, {n: 8}, "lease-wait", payload, lease_wait_s=20, say=said.append))
    assert wave.runs[n].state == "succeeded"
    # The wait is in the run's log, once (not at every look): who holds the Lease, until when, then its end.
    assert len(said) == 2, said
    assert said[0].startswith(f"node {n}: waiting up to 20 s for its Lease: benchmarked by run run-other")
    assert f"held until {held_until:%Y-%m-%dT%H:%M:%SZ}" in said[0]
    assert said[1].startswith(f"node {n}: its Lease is free after ")
    assert len(_jobs(kube, "lease-wait")) == 1
    assert no_lease(kube, n)
    assert taints(kube, n) == []


def test_a_node_another_run_holds_is_skipped_with_the_reason(
    sim: Any, kube: Kube, payload: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    n = node(sim, 5)
    other = leases(kube, "run-other")
    other.acquire(n)
    taint_testing(kube, n, prefix=PREFIX, run_id="run-other")
    try:
        with caplog.at_level("INFO", logger="gpucert.certify"):
            wave = asyncio.run(_wave(kube, {n: 8}, "lease-skip", payload, lease_wait_s=0.3))
    finally:
        lift_testing_taint(kube, n, prefix=PREFIX)
        assert other.release(n)
    run = wave.runs[n]
    assert (run.state, run.reason) == ("failed", "leased")
    assert run.message.startswith("benchmarked by run run-other")
    waits = [r.getMessage() for r in caplog.records if "waiting up to" in r.getMessage()]
    assert waits == [f"node {n}: waiting up to 0 s for its Lease: {run.message.split('; waited')[0]}"], waits
    assert _jobs(kube, "lease-skip") == []  # nothing was started on it
    assert wave.frame() is None


def test_a_pair_waiting_for_a_nodes_lease_says_who_holds_it(sim: Any, kube: Kube, payload: dict[str, Any]) -> None:
    from gpucert.certify import run_pair_round

    a, b = node(sim, 3), node(sim, 4)
    other = leases(kube, "run-other")
    assert other.acquire(b).held
    said: list[str] = []
    try:
        done = asyncio.run(
            run_pair_round(
                kube,
                [(a, b)],
                "pair-wait",
                payload,
                BenchmarkSettings(),
                gpus={a: 8, b: 8},
                poll_s=0.05,
                lease_wait_s=0.3,
                say=said.append,
            )
        )
    finally:
        assert other.release(b)
    assert done.runs[(a, b)].reason == "leased"
    assert len(said) == 1, said
    assert said[0].startswith(f"pair {a} – {b}: waiting up to 0 s for its Lease: benchmarked by run run-other")
    assert lease_name(b) in said[0]


def test_a_crashed_runs_job_is_no_orphan_while_it_holds_the_lease_and_goes_on_takeover(
    sim: Any, kube: Kube, settings: BenchmarkSettings, payload: dict[str, Any]
) -> None:
    n = node(sim, 2)
    crashed = leases(kube, "run-dead", at=datetime.now(UTC))
    crashed.acquire(n)
    long_run = BenchmarkSettings(pod_annotations={"sim.gpucert.io/run-seconds": "3600"})
    dead_job = kube.create(benchmark_job("run-dead", n, 8, payload=payload, settings=long_run))["metadata"]["name"]
    assert orphaned_jobs(kube, settings, "lease-new", [n]) == []  # its run still holds the node
    # The run crashed: it renews no more, and an hour later its Lease has long lapsed.
    leases(kube, "run-dead", at=datetime.now(UTC) - timedelta(hours=1)).acquire(n)
    assert orphaned_jobs(kube, settings, "lease-new", [n]) == [dead_job]
    wave = asyncio.run(_wave(kube, {n: 8}, "lease-new", payload))
    assert wave.runs[n].state == "succeeded"
    assert kube.find("batch/v1", "Job", dead_job, settings.namespace) is None
    assert no_lease(kube, n)
    assert taints(kube, n) == []


def test_a_wave_larger_than_a_validation_batch_keeps_every_nodes_results(
    sim: Any, kube: Kube, payload: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("gpucert.certify._wave.VALIDATE_EVERY", 2)  # 5 nodes: batches of 2, 2, then 1
    nodes = {node(sim, i): 8 for i in range(5)}
    wave = asyncio.run(_wave(kube, nodes, "lease-batches", payload, max_parallel=5))
    assert {n: r.state for n, r in wave.runs.items()} == dict.fromkeys(nodes, "succeeded")
    frame = wave.frame()
    assert frame is not None
    assert sorted(frame["node"].astype(str).unique()) == sorted(nodes)
    assert sorted(wave.stacks) == sorted(nodes)
    assert not frame.duplicated(["node", "gpu", "metric", "repeat", "peer"]).any()
