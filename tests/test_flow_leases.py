"""The bar of "one run per node at a time": two certify flows (a nightly and a manual run, say) started
over the same 16 simulated nodes, overlapping, under a real (temporary) Prefect server. The simulated
API server's own record of every Job, in resourceVersion order, shows each node benchmarked by one run
at a time, each Job created while its node carried its own run's ``gpucert.io/testing`` taint; both runs
complete with every node measured, the node labels agree with the decisions they were written from, and
both runs' results are in the baseline (neither update lost)."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.store import StoreLocation
from gpucert.certify import CertifyOutcome, latest_decisions
from gpucert.flows.certify import certify
from gpucert.kube import LEASE, connect
from gpucert.store import open_store
from gpucert_sim import SimCluster
from gpucert_sim._objects import NODES
from gpucert_sim._store import WatchEvent

pytestmark = pytest.mark.usefixtures("prefect_harness")

PREFIX = "gpucert.io"
TESTING = f"{PREFIX}/testing"


@dataclass
class Span:
    """One benchmark Job's life, in the store's resourceVersions: created, and finished or deleted."""

    node: str
    run: str
    start: int
    testing: str | None  # the value of the node's testing taint when the Job was created
    end: int | None = None


class JobRecord:
    """Every benchmark Job the simulated cluster stored, from its store's event stream (a listener sees
    each event under the store's lock, in resourceVersion order, so nothing is missed or reordered)."""

    def __init__(self, sim: SimCluster, first_job_of: str) -> None:
        self.sim, self.first_job_of = sim, first_job_of
        self.spans: dict[str, Span] = {}
        self.started = threading.Event()

    def __call__(self, event: WatchEvent) -> None:
        if event.resource != "batch/v1/jobs":
            return
        meta = event.obj["metadata"]
        if event.type == "ADDED":
            node = meta["annotations"][f"{PREFIX}/node"]
            node_obj = self.sim.store.get(NODES, None, node) or {}
            testing = next(
                (t.get("value") for t in (node_obj.get("spec") or {}).get("taints") or () if t["key"] == TESTING), None
            )
            run = meta["labels"][f"{PREFIX}/run-id"]
            self.spans[meta["name"]] = Span(node, run, event.rv, testing)
            if run == self.first_job_of:
                self.started.set()
            return
        span = self.spans.get(meta["name"])
        finished = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in (event.obj.get("status") or {}).get("conditions") or ()
        )
        if span is not None and span.end is None and (event.type == "DELETED" or finished):
            span.end = event.rv


@pytest.fixture(scope="module")
def sim16() -> Iterator[SimCluster]:
    with SimCluster(nodes=16, preconfigured=True, seed=9) as cluster:
        yield cluster


def test_two_overlapping_certify_runs_benchmark_each_node_once_at_a_time(sim16: SimCluster, tmp_path: Path) -> None:
    cluster = GpuCluster(kubeconfig=str(sim16.kubeconfig_path))
    store = StoreLocation(uri=f"file://{tmp_path}")
    names = sim16.fleet.node_names
    record = JobRecord(sim16, first_job_of="night-a")
    outcomes: dict[str, CertifyOutcome] = {}
    errors: list[BaseException] = []

    def run(run_id: str) -> None:
        try:  # each its own thread and event loop, as two flow runs on two workers would be
            outcomes[run_id] = asyncio.run(
                certify(
                    cluster=cluster,
                    store=store,
                    run_id=run_id,
                    max_parallel=8,
                    # Long enough that the second run starts while the first still benchmarks.
                    pod_annotations={"sim.gpucert.io/run-seconds": "1.5"},
                )
            )
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    sim16.store.subscribe(record)
    try:
        first = threading.Thread(target=run, args=("night-a",))
        first.start()
        assert record.started.wait(60), "the first run never created a Job"
        second = threading.Thread(target=run, args=("manual-b",))  # while the first run is benchmarking
        second.start()
        first.join(180)
        second.join(180)
    finally:
        sim16.store.unsubscribe(record)
    if errors:
        raise errors[0]
    a, b = outcomes["night-a"], outcomes["manual-b"]

    # Both runs complete, every node measured by each (the second waited for the nodes the first held).
    for outcome in (a, b):
        assert outcome.nodes == sorted(names)
        assert outcome.inconclusive == {}, outcome.inconclusive
        assert {d.node for d in outcome.decisions} == set(names)

    # Once at a time: on every node, each Job ends before the next one starts, whatever its run.
    spans = list(record.spans.values())
    assert all(s.end is not None for s in spans)
    for node in names:
        mine = sorted((s for s in spans if s.node == node), key=lambda s: s.start)
        assert {s.run for s in mine} >= {"night-a", "manual-b"}, node
        for before, after in itertools.pairwise(mine):
            assert before.end is not None
            assert before.end < after.start, (node, before, after)
    # Each Job was started under its own run's testing taint (its Lease held), which the pods tolerated.
    assert all(s.testing == s.run for s in spans), [s for s in spans if s.testing != s.run]
    # And the runs did overlap: each benchmarked while the other had nodes under test.
    window = {
        r: (min(s.start for s in spans if s.run == r), max(s.end or 0 for s in spans if s.run == r))
        for r in ("night-a", "manual-b")
    }
    assert window["manual-b"][0] < window["night-a"][1]
    assert window["night-a"][0] < window["manual-b"][1]

    # Nothing left behind: no testing taint, no Lease.
    kube = connect(sim16.kubeconfig_path)
    nodes = {n["metadata"]["name"]: n for n in kube.nodes()}
    assert not [n for n, obj in nodes.items() if any(t["key"] == TESTING for t in obj["spec"].get("taints") or ())]
    assert kube.request("GET", LEASE.path("gpucert-system"), doing="list leases")["items"] == []

    # Labels agree with the decision of the run that wrote them last (one patch writes both).
    decided: dict[tuple[str, str], Any] = {(d.node, o.run_id): d.state for o in (a, b) for d in o.decisions}
    for name, obj in nodes.items():
        meta = obj["metadata"]
        last = meta["annotations"][f"{PREFIX}/last-run"]
        assert last in ("night-a", "manual-b"), name
        assert meta["labels"][f"{PREFIX}/state"] == decided[(name, last)], name
    opened = open_store(f"file://{tmp_path}")
    latest = latest_decisions(opened)
    assert set(latest["node"]) == set(names)
    # Baselines: one version per run, the current one holding both runs' passing results.
    assert {a.baseline_version, b.baseline_version} <= {v.version for v in opened.versions()}
    assert opened.current_version() in (a.baseline_version, b.baseline_version)
    table = opened.read()
    own = table[table["level"].isin(["gpu", "node"])]
    assert set(own.loc[own["level"] == "node", "key"]) == set(names)
    assert set(own["n"]) == {2}, own["n"].value_counts()  # seeded from both runs, whichever merged first
    assert {tuple(sorted(json.loads(r))) for r in own["runs"]} == {("manual-b", "night-a")}
    assert (own["first_ts"] <= own["last_ts"]).all()
