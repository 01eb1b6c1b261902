"""``announce_joined_nodes``: joins announced once — across 410s, selectors, its own restarts and the API
server's — over HTTP against the simulator.

One simulated cluster serves the module; each test uses its own label prefix, so it sees only the nodes it
tainted with that prefix's ``uncertified`` key and no other test's announcements. A test that restarts the
API server has a cluster of its own: :class:`SimCluster` stopped and started again serves the same store on
the same port, as an API server restarted in front of the same etcd.
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import pytest

from gpucert.cli import main
from gpucert.kube import (
    ANNOUNCED_ANNOTATION,
    Kube,
    KubeForbidden,
    Reconnect,
    RetryPolicy,
    _watch,
    announce_joined_nodes,
    connect,
)
from gpucert_sim import ApiFaults, SimCluster, gpu_node
from tests.conftest import eventually

FAST = RetryPolicy(attempts=4, base_delay_s=0.001, max_delay_s=0.01)
#: The back-off of an outage in tens of milliseconds, not seconds; 401/403 waited out for 5 s.
RIDE_OUT = Reconnect(base_delay_s=0.02, max_delay_s=0.1, forbidden_s=5.0, start_forbidden_s=5.0)
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

    def __init__(self, kube: Kube, prefix: str, selector: str | None = GPU, *, reconnect: Reconnect = RIDE_OUT) -> None:
        self.emitted: list[tuple[str, str]] = []
        #: What it said about outages (``log``).
        self.said: list[str] = []
        #: Called after each announcement (from the watcher's thread), before the node is marked.
        self.on_emit: Callable[[str], None] = lambda name: None
        self._stop = threading.Event()
        self._result: int | BaseException | None = None
        self._handed = False
        self._thread = threading.Thread(target=self._run, args=(kube, prefix, selector, reconnect), daemon=True)

    def _run(self, kube: Kube, prefix: str, selector: str | None, reconnect: Reconnect) -> None:
        def emit(name: str, uid: str) -> None:
            self.emitted.append((name, uid))
            self.on_emit(name)

        try:
            self._result = announce_joined_nodes(
                kube,
                prefix=prefix,
                selector=selector,
                emit=emit,
                timeout_s=1,
                stop=self._stop.is_set,
                reconnect=reconnect,
                log=self.said.append,
            )
        except BaseException as exc:  # handed to the test thread in close()
            self._result = exc

    def ended(self, timeout_s: float) -> int | BaseException | None:
        """What the watcher returned or raised, once it ended by itself within ``timeout_s``; handed to the
        test, so leaving the ``with`` block no longer raises it."""
        self._thread.join(timeout=timeout_s)
        assert not self._thread.is_alive(), "the watcher is still running"
        self._handed = True
        return self._result

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

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the watcher did not stop"
        if exc is None and not self._handed:
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
    fresh = kube.request(
        "GET", "/api/v1/nodes", doing="watch nodes", accept="*/*", query={"watch": "1", "timeoutSeconds": 0}
    )
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


def test_a_node_that_rejoined_under_a_new_uid_is_announced_again(sim: SimCluster, kube: Kube, prefix: str) -> None:
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


def test_a_failed_emit_marks_nothing_and_the_next_run_announces(sim: SimCluster, kube: Kube, prefix: str) -> None:
    name = join(sim, prefix)

    def failing(node: str, uid: str) -> None:
        raise ConnectionError("Prefect API unreachable")

    with pytest.raises(ConnectionError):
        announce_joined_nodes(kube, prefix=prefix, selector=GPU, emit=failing, follow=False)
    assert mark_of(kube, name, prefix) is None
    assert announce_once(kube, prefix) == [(name, uid_of(kube, name))]


# --- the API server going away: a restart, RBAC loading, a compacted history ----------------------------


@pytest.fixture
def own_sim() -> Iterator[SimCluster]:
    """A cluster of the test's own, to stop and start again."""
    with SimCluster(nodes=1, controllers=False) as cluster:
        yield cluster


def restart(sim: SimCluster, down_s: float, meanwhile: Callable[[], None] = lambda: None) -> None:
    """The API server away for ``down_s`` (its port refusing connections), ``meanwhile()`` done to its store,
    then serving the same store on the same port again."""
    port = sim.port
    sim.stop()
    meanwhile()
    time.sleep(down_s)
    sim.start()
    assert sim.port == port


def test_a_restart_of_the_api_server_is_ridden_out_and_what_joined_meanwhile_announced_once(
    own_sim: SimCluster, prefix: str
) -> None:
    kube = connect(own_sim.kubeconfig_path, retry=FAST)
    before, gone = join(own_sim, prefix), join(own_sim, prefix)
    uids = {name: uid_of(kube, name) for name in (before, gone)}
    joined: list[str] = []

    def meanwhile() -> None:
        joined.append(join(own_sim, prefix))
        fleeting = join(own_sim, prefix)
        own_sim.delete_node(fleeting)  # joined and left within the outage: nothing to announce
        own_sim.delete_node(gone)  # announced before the outage, deleted during it: forgotten

    with Follower(kube, prefix) as follower:
        follower.wait_for(gone)
        restart(own_sim, 2.0, meanwhile)  # many tries of the watcher's, all refused
        follower.wait_for(joined[0])
        time.sleep(1.5)  # watched on: a second announcement of anything would come now
    [new] = joined
    assert follower.emitted == [(before, uids[before]), (gone, uids[gone]), (new, uid_of(kube, new))]
    assert mark_of(kube, new, prefix) == uid_of(kube, new)
    # Said once when it started and once when it ended, however many tries there were between.
    [lost, back] = follower.said
    assert "away or refusing" in lost
    assert "cannot connect" in lost
    assert "answers again after" in back


def test_403s_while_rbac_loads_after_a_restart_are_ridden_out(own_sim: SimCluster, prefix: str) -> None:
    kube = connect(own_sim.kubeconfig_path, retry=FAST)
    first = join(own_sim, prefix)
    refused = own_sim.faults.served.get("403", 0)
    joined: list[str] = []

    def meanwhile() -> None:
        joined.append(join(own_sim, prefix))
        own_sim.set_faults(ApiFaults(forbidden_rate=1.0))  # it comes back refusing every list and watch

    with Follower(kube, prefix) as follower:
        follower.wait_for(first)
        restart(own_sim, 0.3, meanwhile)
        eventually(lambda: own_sim.faults.served.get("403", 0) >= refused + 3, timeout_s=5)
        time.sleep(0.5)  # a second of 403s in all, well within the 5 s they are waited out
        own_sim.set_faults(None)  # the roles are loaded
        follower.wait_for(joined[0])
        time.sleep(1.5)
    [new] = joined
    assert follower.emitted == [(first, uid_of(kube, first)), (new, uid_of(kube, new))]
    assert mark_of(kube, new, prefix) == uid_of(kube, new)
    assert len(follower.said) == 2


def test_a_403_that_outlasts_the_wait_ends_the_watcher(sim: SimCluster, kube: Kube, prefix: str) -> None:
    first = join(sim, prefix)
    patience = Reconnect(base_delay_s=0.02, max_delay_s=0.1, forbidden_s=0.5)
    with Follower(kube, prefix, reconnect=patience) as follower:
        follower.wait_for(first)
        sim.set_faults(ApiFaults(forbidden_rate=1.0))  # the identity's permission taken away
        # The watch in flight runs out first (up to its 5 s), then 0.5 s of patience: 30 s on a loaded machine.
        error = follower.ended(timeout_s=30)
    assert isinstance(error, KubeForbidden)
    assert re.search(r"nodes is forbidden: .*refused for \d+ s, after it had been allowed", str(error)), error
    assert len(follower.said) == 1  # the outage started and never ended


def test_watch_nodes_refused_at_start_exits_2_with_one_line(
    sim: SimCluster, kube: Kube, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # Set by the command for Prefect, restored after the test.
    for name in (
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
        "GPUCERT_TRIGGER",
        "PREFECT_SERVER_ANALYTICS_ENABLED",
    ):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_watch, "DEFAULT_RECONNECT", Reconnect(base_delay_s=0.02, start_forbidden_s=0.5))
    sim.set_faults(ApiFaults(forbidden_rate=1.0))  # /version answers: the identity may not list nodes
    start = time.monotonic()
    code = main(["watch-nodes", "--kubeconfig", str(sim.kubeconfig_path), "--once"])
    assert code == 2
    [line] = capsys.readouterr().err.splitlines()
    assert 'cannot list resource "nodes"' in line
    assert "at start" in line
    assert "gpucert-runtime" in line
    assert time.monotonic() - start < 20


def test_a_restart_that_compacted_the_history_relists_on_410_without_duplicates(
    own_sim: SimCluster, prefix: str
) -> None:
    kube = connect(own_sim.kubeconfig_path, retry=FAST)
    first = join(own_sim, prefix)
    expired = own_sim.faults.served.get("expired", 0)
    joined: list[str] = []

    def meanwhile() -> None:
        joined.append(join(own_sim, prefix))
        own_sim.set_faults(ApiFaults(watch_expired_rate=1.0))  # every watch from a version: 410 in the stream

    with Follower(kube, prefix) as follower:
        follower.wait_for(first)
        restart(own_sim, 0.5, meanwhile)
        follower.wait_for(joined[0])
        eventually(lambda: own_sim.faults.served.get("expired", 0) >= expired + 3, timeout_s=5)  # re-listed again
        later = join(own_sim, prefix)  # found by a re-list
        follower.wait_for(later)
        time.sleep(1.0)
    [new] = joined
    assert follower.emitted == [(name, uid_of(kube, name)) for name in (first, new, later)]


def test_a_mark_lost_to_an_outage_is_made_after_it_and_the_node_not_announced_again(
    own_sim: SimCluster, prefix: str
) -> None:
    kube = connect(own_sim.kubeconfig_path, retry=FAST)
    first = join(own_sim, prefix)
    with Follower(kube, prefix) as follower:
        follower.wait_for(first)  # listed: what joins now comes by the watch

        def away(name: str) -> None:  # the API server goes away between the announcement and the mark
            follower.on_emit = lambda name: None
            own_sim.stop()
            threading.Timer(0.5, own_sim.start).start()

        follower.on_emit = away
        new = join(own_sim, prefix)
        follower.wait_for(new)
        eventually(lambda: len(follower.said) == 2, timeout_s=8)  # it went away and came back
        assert mark_of(kube, new, prefix) == uid_of(kube, new)
        time.sleep(1.0)
    assert follower.emitted == [(first, uid_of(kube, first)), (new, uid_of(kube, new))]
