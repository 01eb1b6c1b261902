"""Operate over three nights on the simulator, with local tickets in the store's folder (issue 6's bars): a
fault injected between two nights is caught by the second night with the right cause and a ticket of the
right kind; the same fault the next night updates that ticket instead of opening another; a remap failure
ends in a replacement ticket; ``gpucert release`` after the repair lifts the taint and resolves the ticket.
And issue 29's: a night that found no DCGM exporter, or could not read a node, names each node unread
with why, and one that read no node at all is not a clean one (exit 4)."""

from __future__ import annotations

import asyncio
from datetime import UTC, date, datetime
from pathlib import Path

import pytest

from gpucert._frames import empty_results
from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.store import StoreLocation
from gpucert.certify import CertifyOutcome
from gpucert.cli import main
from gpucert.flows.operate import operate
from gpucert.kube import connect
from gpucert.operate import OnboardOutcome, OperateOutcome, telemetry_coverage
from gpucert.telemetry import EXPORTER_SELECTOR, ExporterScrape, Telemetry
from gpucert.tickets import open_backend
from gpucert_sim import STACK_NAMESPACE, SimCluster
from gpucert_sim.fleet import Fault

from .conftest import eventually

pytestmark = pytest.mark.usefixtures("prefect_harness")


def _certified_now(sim: SimCluster) -> None:
    """Every node certified a moment ago: with a rotation of days, a night has nothing due and only
    watches (an unconfigured simulator's nodes could not be certified anyway)."""
    kube = connect(sim.kubeconfig_path)
    stamp = datetime.now(UTC).isoformat()
    for name in sim.fleet.node_names:
        kube.merge_patch("v1", "Node", name, {"metadata": {"annotations": {"gpucert.io/certified-at": stamp}}})


def _night(sim: SimCluster, store: Path, *, rotation_days: float = 0.0) -> OperateOutcome:
    cluster = GpuCluster(kubeconfig=str(sim.kubeconfig_path))
    return asyncio.run(
        operate(
            cluster=cluster, store=StoreLocation(uri=store.as_uri()), rotation_days=rotation_days, scrape_interval_s=1.0
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


def test_a_night_without_any_dcgm_exporter_is_not_a_clean_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No exporter Service at all (the stack never configured): every GPU node is named unread, the night
    says it judged no telemetry, and the command exits 4 with one line, not "0 nodes asked, 0 unreadable"."""
    with SimCluster(nodes=4, seed=3) as sim:
        names = sim.fleet.node_names
        _certified_now(sim)
        night = _night(sim, tmp_path, rotation_days=30.0)
        assert night.due == []
        assert night.certify is None
        assert sorted(night.unreadable) == sorted(names)
        assert all(why.startswith("no exporter") for why in night.unreadable.values()), night.unreadable
        assert night.telemetry_read == []
        assert night.telemetry_missing == (
            "telemetry: no DCGM exporter found — looked for the Endpoints of Services labelled "
            f"{EXPORTER_SELECTOR} in namespace {STACK_NAMESPACE}; 4 GPU nodes unread"
        )
        report = night.markdown()
        assert report.startswith("# operate: tonight\n\n0 nodes re-certified\nNOT CLEAN: telemetry: no DCGM")
        assert "unread on 4 nodes: " in report

        common = ["--kubeconfig", str(sim.kubeconfig_path), "--store", tmp_path.as_uri()]
        capsys.readouterr()
        assert main(["operate", *common, "--rotation-days", "30", "--scrape-interval", "1"]) == 4
        out, err = capsys.readouterr()
        assert "NOT CLEAN: telemetry: no DCGM exporter found" in out
        assert all(name in out for name in names)
        said = [line for line in err.splitlines() if line.startswith("gpucert:")]
        assert said == [f"gpucert: operate: {night.telemetry_missing}"]
        assert "Traceback" not in err


def test_a_node_whose_exporter_cannot_be_read_is_named_and_the_others_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One node NotReady: its exporter is listed not ready and answers 404. It is named unread with that
    reason, the other three are read, and the night is judged (exit 0) — in the outcome, the JSON and the
    report, with the counts in the right number."""
    with SimCluster(nodes=4, preconfigured=True, seed=3) as sim:
        names = sim.fleet.node_names
        _certified_now(sim)
        sim.set_node_ready(names[0], False)
        scrape = ExporterScrape(connect(sim.kubeconfig_path), STACK_NAMESPACE)
        eventually(lambda: not next(t for t in scrape.targets() if t.node == names[0]).ready)
        common = [
            "--kubeconfig",
            str(sim.kubeconfig_path),
            "--store",
            tmp_path.as_uri(),
            "--rotation-days",
            "30",
            "--scrape-interval",
            "1",
        ]
        capsys.readouterr()
        assert main(["operate", *common, "--json"]) == 0
        night = OperateOutcome.model_validate_json(capsys.readouterr().out)
        assert night.due == []
        assert list(night.unreadable) == [names[0]]
        assert "(listed not ready)" in night.unreadable[names[0]]
        assert "HTTP 404" in night.unreadable[names[0]]
        assert night.telemetry_read == sorted(names[1:])
        assert night.telemetry_missing is None

        assert main(["operate", *common]) == 0
        out = capsys.readouterr().out
        assert "NOT CLEAN" not in out
        assert f"telemetry read on 3 nodes; unread on 1 node: {names[0]} (exporter " in out


def test_the_report_counts_in_the_right_number() -> None:
    one = OperateOutcome(night=date(2026, 11, 2), due=["gpu-node-00001"], telemetry_read=["gpu-node-00001"])
    assert one.markdown().startswith("# operate: tonight\n\n1 node re-certified\ntelemetry read on 1 node\n")
    two = OperateOutcome(night=date(2026, 11, 2), due=["a", "b"], unreadable={"c": "no exporter: …"})
    assert "2 nodes re-certified\ntelemetry read on 0 nodes; unread on 1 node: c (no exporter: …)" in two.markdown()


def test_exporters_found_but_no_node_read_is_not_clean_and_a_gap_is_only_partial() -> None:
    def reading(problems: dict[str, str], read: tuple[str, ...] = ()) -> Telemetry:
        return Telemetry(
            results=empty_results(),
            problems=problems,
            notes=(),
            start=None,
            end=datetime.now(UTC),
            source="DCGM exporters in gpucert-system",
            nodes=read,
        )

    refused = "exporter http://10.0.0.1:9400/metrics: unreachable: connection refused"
    blind = telemetry_coverage(reading({"a": refused}), ["a", "b"])
    assert blind.read == []
    assert blind.unread == {"a": refused, "b": "no telemetry of it from DCGM exporters in gpucert-system"}
    assert blind.missing == (
        "telemetry: no GPU node's telemetry could be read from DCGM exporters in gpucert-system; 2 GPU nodes unread"
    )
    gap = "failed one of two scrapes (timeout): rates and shares unknown"
    partly = telemetry_coverage(reading({"a": gap, "b": refused}, read=("a",)), ["a", "b"])
    assert partly.read == ["a"]
    assert partly.unread == {"b": refused}
    assert partly.partial == {"a": gap}
    assert partly.missing is None
