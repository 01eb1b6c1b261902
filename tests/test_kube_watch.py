"""``announce_joined_nodes``: joins announced once — across 410s, selectors and restarts — over HTTP against
the simulator.

One simulated cluster serves the module; each test uses its own label prefix, so it sees only the nodes it
tainted with that prefix's ``uncertified`` key and no other test's announcements.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import Any

import pytest

from gpucert.kube import ANNOUNCED_ANNOTATION, Kube, RetryPolicy, announce_joined_nodes, connect
from gpucert.sim import ApiFaults, SimCluster, gpu_node
from tests.conftest import eventually

FAST = RetryPolicy(attempts=4, base_delay_s=0.001, max_delay_s=0.01)
GPU = "nvidia.com/gpu.present=true"
_prefixes = itertools.count()
_indexes = itertools.count(900)


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=2, controllers=False) as cluster:
        yield cluster


@pytest.fixture
def kube(sim: SimCluster) -> Iterator[Kube]:
    sim.set_faults(None)
    yield connect(sim.kubeconfig_path, retry=FAST)
    sim.set_faults(None)


@pytest.fixture
def prefix() -> str:
    return f"t{next(_prefixes)}.gpucert.test"


def join(sim: SimCluster, prefix: str) -> str:
    """A GPU node joining with ``prefix``'s uncertified taint; returns its name."""
    [name] = sim.add_nodes(1, uncertified_taint=f"{prefix}/uncertified")
    return name


def cpu_node(sim: SimCluster, prefix: str, **meta: Any) -> str:
    """A node outside the GPU selector, tainted uncertified all the same; returns its name."""
    index = next(_indexes)
    name = f"cpu-node-{index}"
    node = gpu_node(name, index, model="NVIDIA H200", gpus=0, uncertified_taint=f"{prefix}/uncertified")
    node["metadata"] = {"name": name, "labels": {"kubernetes.io/hostname": name, "pool": "cpu"}, **meta}
    sim.create(node)
    return name


def uid_of(kube: Kube, name: str) -> str:
    return str(kube.get("v1", "Node", name)["metadata"]["uid"])


def mark_of(kube: Kube, name: str, prefix: str) -> str | None:
    annotations = kube.get("v1", "Node", name)["metadata"].get("annotations") or {}
    return annotations.get(f"{prefix}/{ANNOUNCED_ANNOTATION}")


def announce_once(kube: Kube, prefix: str, selector: str | None = GPU) -> list[tuple[str, str]]:
    """What one pass (no follow) announces; checks the count it returns."""
    seen: list[tuple[str, str]] = []
    count = announce_joined_nodes(
        kube, prefix=prefix, selector=selector, emit=lambda n, u: seen.append((n, u)), follow=False
    )
    assert count == len(seen)
    return seen


class Follower:
    """``announce_joined_nodes`` following in a thread, stopped (and its result checked) on exit."""

    def __init__(self, kube: Kube, prefix: str, selector: str | None = GPU) -> None:
        self.emitted: list[tuple[str, str]] = []
        self._stop = threading.Event()
        self._result: int | BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(kube, prefix, selector), daemon=True)

    def _run(self, kube: Kube, prefix: str, selector: str | None) -> None:
        try:
            self._result = announce_joined_nodes(
                kube, prefix=prefix, selector=selector, emit=lambda n, u: self.emitted.append((n, u)),
                timeout_s=1, stop=self._stop.is_set,
            )  # fmt: skip
        except BaseException as exc:  # handed to the test thread in close()
            self._result = exc

    def names(self) -> list[str]:
        return [name for name, _ in self.emitted]

    def wait_for(self, name: str) -> None:
        def probe() -> bool:
            return name in self.names() or not self._thread.is_alive()

        eventually(probe, timeout_s=8)
        assert name in self.names(), f"the watcher ended early: {self._result!r}"

    def __enter__(self) -> Follower:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the watcher did not stop"
        if exc is None:
            if isinstance(self._result, BaseException):
                raise self._result
            assert self._result == len(self.emitted)


# --- 410: the simulator's fault, then the watcher --------------------------------------------------------


def test_the_sim_answers_a_resumed_watch_with_an_in_stream_410_on_demand(sim: SimCluster, kube: Kube) -> None:
    rv = kube.request("GET", "/api/v1/nodes", doing="list nodes")["metadata"]["resourceVersion"]
    sim.set_faults(ApiFaults(watch_expired_rate=1.0))
    query = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": 1}
    text = kube.request("GET", "/api/v1/nodes", doing="watch nodes", accept="*/*", query=query)
    [line] = text.splitlines()
    assert '"type":"ERROR"' in line
    assert '"code":410' in line
    assert "too old resource version" in line
    # A watch from no version cannot be too old: it starts with the current objects.
    fresh = kube.request("GET", "/api/v1/nodes", doing="watch nodes", accept="*/*",
                         query={"watch": "1", "timeoutSeconds": 0})  # fmt: skip
    assert '"type":"ADDED"' in fresh
    assert "ERROR" not in fresh


def test_an_in_stream_410_relists_and_still_reports_a_node_that_joined(
    sim: SimCluster, kube: Kube, prefix: str
) -> None:
    first = join(sim, prefix)
    sim.set_faults(ApiFaults(watch_expired_rate=1.0))  # every resumed watch: 410 in the stream
    with Follower(kube, prefix) as follower:
        follower.wait_for(first)  # listed: from here on only a re-list can see a join
        second = join(sim, prefix)
        follower.wait_for(second)
    assert follower.emitted == [(first, uid_of(kube, first)), (second, uid_of(kube, second))]


# --- the selector ------------------------------------------------------------------------------------------


def test_only_nodes_matching_the_selector_are_listed_watched_and_marked(
    sim: SimCluster, kube: Kube, prefix: str
) -> None:
    gpu, cpu = join(sim, prefix), cpu_node(sim, prefix)
    assert announce_once(kube, prefix) == [(gpu, uid_of(kube, gpu))]
    assert mark_of(kube, cpu, prefix) is None
    with Follower(kube, prefix) as follower:
        later_cpu = cpu_node(sim, prefix)
        later_gpu = join(sim, prefix)
        follower.wait_for(later_gpu)  # events come in order: the CPU node's came first
        kube.label_node(cpu, {"nvidia.com/gpu.present": "true"})  # enters the selection
        follower.wait_for(cpu)
    assert follower.names() == [later_gpu, cpu]
    assert mark_of(kube, later_cpu, prefix) is None
    # Without a selector every tainted node counts.
    assert announce_once(kube, prefix, selector=None) == [(later_cpu, uid_of(kube, later_cpu))]


# --- announcements survive restarts ----------------------------------------------------------------------


def test_a_restarted_watcher_does_not_announce_a_node_again(sim: SimCluster, kube: Kube, prefix: str) -> None:
    listed = join(sim, prefix)
    with Follower(kube, prefix) as follower:
        follower.wait_for(listed)
        watched = join(sim, prefix)
        follower.wait_for(watched)
        kube.label_node(watched, {"rack": "r7"})  # a later change is no second join
        eventually(lambda: kube.get("v1", "Node", watched)["metadata"]["labels"].get("rack"))
    assert follower.names() == [listed, watched]
    for name in (listed, watched):
        assert mark_of(kube, name, prefix) == uid_of(kube, name)
    assert announce_once(kube, prefix) == []
    with Follower(kube, prefix) as restarted:
        fresh = join(sim, prefix)
        restarted.wait_for(fresh)
    assert restarted.names() == [fresh]


def test_a_node_that_rejoined_under_a_new_uid_is_announced_again(
    sim: SimCluster, kube: Kube, prefix: str
) -> None:
    name = join(sim, prefix)
    [(_, old_uid)] = announce_once(kube, prefix)
    node = kube.get("v1", "Node", name)
    sim.delete_node(name)
    # The same machine registers again; even the stale mark carried over does not hide the new object.
    meta = {k: node["metadata"][k] for k in ("name", "labels", "annotations")}
    sim.create({**node, "metadata": meta})
    new_uid = uid_of(kube, name)
    assert new_uid != old_uid
    assert mark_of(kube, name, prefix) == old_uid
    assert announce_once(kube, prefix) == [(name, new_uid)]
    assert mark_of(kube, name, prefix) == new_uid


def test_a_failed_emit_marks_nothing_and_the_next_run_announces(
    sim: SimCluster, kube: Kube, prefix: str
) -> None:
    name = join(sim, prefix)

    def failing(node: str, uid: str) -> None:
        raise ConnectionError("Prefect API unreachable")

    with pytest.raises(ConnectionError):
        announce_joined_nodes(kube, prefix=prefix, selector=GPU, emit=failing, follow=False)
    assert mark_of(kube, name, prefix) is None
    assert announce_once(kube, prefix) == [(name, uid_of(kube, name))]
