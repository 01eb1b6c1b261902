"""Operate over three nights on the simulator, with local tickets in the store's folder (issue 6's bars): a
fault injected between two nights is caught by the second night with the right cause and a ticket of the
right kind; the same fault the next night updates that ticket instead of opening another; a remap failure
ends in a replacement ticket; ``gpucert release`` after the repair lifts the taint and resolves the ticket."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from blocks.cluster import GpuCluster
from blocks.store import BaselineStore
from flows.operate import operate
from gpucert.certify import CertifyOutcome
from gpucert.cli import main
from gpucert.fleet import Fault
from gpucert.kube import connect
from gpucert.operate import OnboardOutcome, OperateOutcome
from gpucert.sim import SimCluster
from gpucert.tickets import open_backend

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _night(sim: SimCluster, store: Path, *, rotation_days: float = 0.0) -> OperateOutcome:
    cluster = GpuCluster(kubeconfig=str(sim.kubeconfig_path))
    return asyncio.run(
        operate(
            cluster=cluster,
            store=BaselineStore(uri=store.as_uri()),
            rotation_days=rotation_days,
            scrape_interval_s=1.0,
        )
    )


def _certified(night: OperateOutcome) -> CertifyOutcome:
    assert night.certify is not None
    return night.certify


def test_three_nights_with_tickets_and_a_release(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SimCluster(nodes=8, preconfigured=True, seed=3) as sim:
        names = sim.fleet.node_names
        kube = connect(sim.kubeconfig_path)
        first = _night(sim, tmp_path)
        assert _certified(first).tainted == []

        sim.inject_fault(Fault("pcie_gen4", names[2], 4))
        sim.inject_fault(Fault("remap_failure", names[6], 1))
        second = _night(sim, tmp_path)
        assert _certified(second).tainted == [names[2], names[6]]
        tickets = {t.node: t for t in open_backend(tmp_path).tickets(state="open")}
        assert set(tickets) == {names[2], names[6]}
        assert (tickets[names[2]].cause, tickets[names[2]].kind) == ("pcie", "remediation")
        assert (tickets[names[6]].cause, tickets[names[6]].kind) == ("row_remap", "replacement")

        third = _night(sim, tmp_path)
        assert {e.kind for e in _certified(third).tickets if e.node == names[2]} == {"updated"}
        again = {t.node: t for t in open_backend(tmp_path).tickets(state="open")}
        assert again[names[2]].id == tickets[names[2]].id
        assert again[names[2]].occurrences == 2
        assert len(open_backend(tmp_path).tickets()) == 2  # no second ticket for the same fault

        sim.clear_faults(names[2])  # the technician reseated the GPU
        kubeconfig = str(sim.kubeconfig_path)
        assert main(["release", names[2], "--kubeconfig", kubeconfig, "--store", tmp_path.as_uri()]) == 0
        assert "gpucert.io/unhealthy" not in {
            t["key"] for t in kube.get("v1", "Node", names[2])["spec"].get("taints") or []
        }
        resolved = {t.node for t in open_backend(tmp_path).tickets(state="resolved")}
        assert resolved == {names[2]}
        assert main(["tickets", "list", "--store", tmp_path.as_uri(), "--state", "open"]) == 0
        listed = capsys.readouterr().out
        assert names[6] in listed
        assert "replacement" in listed


def test_telemetry_asks_for_a_node_that_is_not_due(tmp_path: Path) -> None:
    """Between rotations, a node whose DCGM telemetry fails a gate is re-certified that night — and only
    it; the certification, not the telemetry, taints it."""
    with SimCluster(nodes=6, preconfigured=True, seed=3) as sim:
        names = sim.fleet.node_names
        assert _certified(_night(sim, tmp_path)).tainted == []
        sim.inject_fault(Fault("pcie_gen4", names[4], 2))
        night = _night(sim, tmp_path, rotation_days=30.0)
        assert night.due == [names[4]]
        assert night.asked[names[4]].startswith("telemetry: ")
        assert _certified(night).tainted == [names[4]]


def test_the_operate_and_onboard_commands_run_their_flows_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with SimCluster(nodes=4, preconfigured=True, seed=3) as sim:
        common = ["--kubeconfig", str(sim.kubeconfig_path), "--store", tmp_path.as_uri()]
        assert main(["operate", *common, "--rotation-days", "0", "--scrape-interval", "1"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("# operate: tonight\n\n4 nodes re-certified")
        assert "tickets (local): no change" in out
        [new] = sim.add_nodes(1, uncertified_taint="gpucert.io/uncertified")
        assert main(["onboard", new, *common, "--json"]) == 0
        onboarded = OnboardOutcome.model_validate_json(capsys.readouterr().out)
        assert (onboarded.node, onboarded.state, onboarded.admitted) == (new, "certified", True)
        assert onboarded.configure is not None
        assert onboarded.configure.reused  # the fleet's recorded release, not the newest
