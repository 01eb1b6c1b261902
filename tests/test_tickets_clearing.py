"""Issue 30's ticket rules, without a cluster: a ticket and a taint are cleared only by a run that measured
what the fault was found on (the clearing rule), a repair must fit its ticket's cause, a blast-radius
incident is one ticket naming every node held back (hard gates first), a busy node telemetry keeps asking
about gets a ticket asking for a maintenance window after ``busy_nights`` nights, and the tickets a store
recorded for want of ticketing can be listed."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpucert.certify import CertificationRun, NodeTaints, RunVerdicts, recorded_tickets, settle, ticket_step
from gpucert.cli import main
from gpucert.metrics import METRICS, RESULT_COLUMNS
from gpucert.operate import busy_overdue
from gpucert.policy import default_policy
from gpucert.store import open_store
from gpucert.tickets import (
    INCIDENT_NODE,
    EscalationPolicy,
    LocalTickets,
    RunEvidence,
    TicketActionError,
    ask_maintenance_window,
    measured,
    open_incident,
    reconcile,
    record_repairs,
    resolve_incident,
)

from .test_tickets import DAY, T0, uuid, verdicts

STORAGE: Mapping[str, Any] = {
    "node": "n1",
    "gpu": None,
    "cause": "storage",
    "action": "check_storage_mount",
    "metric": "storage_read_gbps",
    "value": 1.1,
    "reasons": "storage: storage_read_gbps 1.1 GB/s, 70 % below the fleet",
}
NETWORK: Mapping[str, Any] = {
    "node": "n2",
    "gpu": None,
    "cause": "network",
    "action": "check_cable",
    "metric": "nccl_pair_busbw_gbps",
    "value": 20.0,
    "reasons": "network: low with every partner",
}
REMAP: Mapping[str, Any] = {
    "node": "n2",
    "gpu": 1,
    "cause": "row_remap",
    "action": "run_field_diag",
    "ticket": "replacement",
    "metric": "remapped_rows_failure",
    "value": 1.0,
    "reasons": "row_remap: remap failure",
}


def results(
    run_id: str, *, nodes: Sequence[str] = ("n1", "n2"), gpus: int = 4, storage: bool = True, pairs: bool = True
) -> pd.DataFrame:
    """A run's results table: every GPU metric on every GPU, the node metrics, and (optionally) the storage
    read of each node and one pair between the first two nodes."""
    gpu_metrics = [m for m, spec in METRICS.items() if spec.level == "gpu" and spec.kind != "event"]
    node_metrics = [m for m, spec in METRICS.items() if spec.level == "node" and (storage or m != "storage_read_gbps")]
    rows = [
        {"node": n, "gpu": g, "gpu_uuid": uuid(n, g), "metric": m}
        for n in nodes
        for g in range(gpus)
        for m in gpu_metrics
    ]
    rows += [{"node": n, "gpu": None, "gpu_uuid": None, "metric": m} for n in nodes for m in node_metrics]
    if pairs:
        rows.append(
            {"node": nodes[0], "gpu": None, "gpu_uuid": None, "metric": "nccl_pair_busbw_gbps", "peer": nodes[1]}
        )
    frame = pd.DataFrame(rows).assign(run_id=run_id, gpu_model="NVIDIA H200", value=1.0, repeat=0)
    frame["ts"] = pd.NaT
    frame["peer"] = frame.get("peer", pd.Series(None, index=frame.index))
    frame["gpu"] = frame["gpu"].astype("Int64")
    return frame[list(RESULT_COLUMNS)]


@pytest.fixture
def tickets(tmp_path: Path) -> LocalTickets:
    return LocalTickets(tmp_path / "tickets.sqlite")


def night(
    backend: LocalTickets,
    day: int,
    flagged: Sequence[Mapping[str, Any]] = (),
    *,
    storage: bool = True,
    pairs: bool = True,
) -> list[str]:
    """Reconcile night ``day`` with the results it measured; the events, as ``kind cause``."""
    run_id = f"night-{day}"
    measured_rows = results(run_id, storage=storage, pairs=pairs)
    events = reconcile(
        backend,
        verdicts(run_id, flagged),
        run_id=run_id,
        now=T0 + day * DAY,
        evidence=RunEvidence(results=measured_rows),
    )
    return [f"{e.kind} {e.ticket.cause}" for e in events]


# --- the clearing rule -----------------------------------------------------------------------------------


def test_a_storage_ticket_stays_open_through_a_pass_that_did_not_measure_storage(tickets: LocalTickets) -> None:
    assert night(tickets, 1, [STORAGE]) == ["opened storage"]
    assert night(tickets, 2, storage=False) == ["kept storage"]  # passed, but no storage location configured
    [ticket] = tickets.tickets(state="open")
    assert ticket.cause == "storage"
    assert night(tickets, 3, storage=True) == ["resolved storage"]  # measured this time, and it passes
    assert tickets.tickets(state="open") == []


def test_the_kept_event_says_what_was_not_measured_and_changes_nothing_stored(tickets: LocalTickets) -> None:
    night(tickets, 1, [STORAGE])
    [before] = tickets.tickets()
    events = reconcile(
        tickets,
        verdicts("night-2"),
        run_id="night-2",
        now=T0 + 2 * DAY,
        evidence=RunEvidence(results=results("night-2", storage=False)),
    )
    [kept] = events
    assert kept.kind == "kept"
    assert "did not measure storage (storage_read_gbps) on n1" in kept.detail
    [after] = tickets.tickets()
    assert after == before  # nothing stored, nothing announced
    assert [kind for _, kind, _ in tickets.events(after.id)] == ["opened"]


def test_a_network_ticket_found_by_pairs_needs_a_run_that_measured_pairs(tickets: LocalTickets) -> None:
    night(tickets, 1, [NETWORK])
    assert night(tickets, 2, pairs=False) == ["kept network"]
    assert night(tickets, 3, pairs=True) == ["resolved network"]  # n2 is the pair's peer: measured too


def test_measured_is_one_check_over_gpu_uuid_gpu_index_node_and_pair_peer() -> None:
    measured_rows = results("r", storage=False)
    replaced = measured_rows["gpu_uuid"].astype("string").eq(uuid("n1", 3))
    measured_rows.loc[replaced, "gpu_uuid"] = "GPU-new"  # GPU 3 of n1 replaced: a new UUID, same index
    faults = pd.DataFrame(
        {
            "node": ["n1", "n1", "n1", "n2", "n1", "n3"],
            "gpu_uuid": [uuid("n1", 0), uuid("n1", 3), "", "", "", ""],
            "gpu": pd.array([0, 3, None, None, None, None], dtype="Int64"),
            "metrics": [
                ("pcie_gen",),
                ("pcie_gen",),
                ("storage_read_gbps",),
                ("nccl_pair_busbw_gbps",),
                ("nvlink_down",),
                ("gemm_bf16_tflops",),
            ],
        }
    )
    assert measured(faults, measured_rows).tolist() == [True, True, False, True, True, False]
    assert measured(faults, None).tolist() == [False] * 6


# --- taints --------------------------------------------------------------------------------------------


def _settle(measured_rows: pd.DataFrame, cause: str = "storage") -> tuple[str | None, str, str]:
    run = RunVerdicts("night-2", verdicts("night-2"), ("n1", "n2"))
    fleet = {"n1": NodeTaints(unhealthy=True, cause=cause), "n2": NodeTaints()}
    settled = settle(run, [], fleet=fleet, policy=default_policy(), measured=measured_rows)
    d = settled.decisions["n1"]
    return d.state, d.taint, d.summary


def test_a_storage_taint_is_kept_by_a_pass_that_did_not_measure_storage() -> None:
    state, taint, summary = _settle(results("night-2", storage=False))
    assert (state, taint) == (None, "kept")  # the state label stays what it was (failed) with the taint
    assert "taint storage kept: this run did not measure storage (storage_read_gbps) on n1" in summary
    assert _settle(results("night-2", storage=True))[:2] == ("certified", "lifted")


def test_a_pcie_taint_is_lifted_by_any_run_that_read_the_gpus_links() -> None:
    assert _settle(results("night-2", storage=False), cause="pcie")[:2] == ("certified", "lifted")


# --- repairs that fit the cause ----------------------------------------------------------------------------


def test_a_gpu_reset_on_a_network_ticket_is_refused_naming_the_actions_that_fit(tickets: LocalTickets) -> None:
    night(tickets, 1, [NETWORK])
    refused = r"--action reset_gpu does not fit ticket 1 \(n2, cause network\): use one of check_cable, reseat_nic"
    with pytest.raises(TicketActionError, match=refused):
        record_repairs(tickets, ["n2"], T0 + DAY, action="reset_gpu")
    [ticket] = tickets.tickets()
    assert ticket.remediations == []  # nothing recorded, so nothing counts towards the reset rule
    [event] = record_repairs(tickets, ["n2"], T0 + DAY, action="reseat_nic")
    assert event.ticket.remediations[-1].action == "reseat_nic"
    # The ticket's own action always fits; and a GPU reset fits a GPU fault.
    night(tickets, 2, [REMAP, NETWORK])
    assert len(record_repairs(tickets, ["n2"], T0 + 2 * DAY)) == 2


# --- incidents --------------------------------------------------------------------------------------------


def _held_back() -> pd.DataFrame:
    table = verdicts("night-1", [STORAGE, REMAP])
    rows = table[table["verdict"] == "fail"].copy()
    rows["hard_gate"] = rows["cause"].eq("row_remap")
    return rows


def test_an_incident_is_one_ticket_naming_every_node_held_back_hard_gates_first(tickets: LocalTickets) -> None:
    event = open_incident(
        tickets,
        run_id="night-1",
        now=T0,
        incident="3 GPU nodes would carry …",
        findings=_held_back(),
        report="s3://b/report.html",
    )
    assert event is not None
    assert event.kind == "opened"
    [ticket] = tickets.tickets()
    assert (ticket.kind, ticket.node, ticket.cause) == ("incident", INCIDENT_NODE, "blast_radius")
    assert ticket.title == "[incident] blast radius: 2 nodes held back (1 hard gate)"
    assert "Held back: n2, n1." in ticket.reasons
    first, second = ticket.reasons.split("hard gates first: ")[1].split("; ")[:2]
    assert first.startswith("n2 GPU 1: fail row_remap (hard gate)")
    assert second.startswith("n1: fail storage")
    # The next run still past the radius updates the same ticket; a run that re-measured them resolves it.
    again = open_incident(tickets, run_id="night-2", now=T0 + DAY, incident="again", findings=_held_back())
    assert again is not None
    assert again.kind == "updated"
    assert resolve_incident(tickets, run_id="night-3", now=T0 + 2 * DAY, nodes=["n1"]) is None  # n2 not measured
    resolved = resolve_incident(tickets, run_id="night-3", now=T0 + 2 * DAY, nodes=["n1", "n2", "n3"])
    assert resolved is not None
    assert resolved.ticket.state == "resolved"


# --- busy nodes ---------------------------------------------------------------------------------------------


def test_a_busy_node_telemetry_asks_about_is_escalated_after_busy_nights(tmp_path: Path, tickets: LocalTickets) -> None:
    objects = open_store(tmp_path.as_uri()).objects
    asked = {"n1": "telemetry: pcie_gen 4 < 5"}
    first = dt.date(2026, 11, 1)
    overdue = [busy_overdue(objects, night=first + dt.timedelta(days=i), busy_asked=asked, nights=3) for i in range(4)]
    assert [sorted(o) for o in overdue] == [[], [], ["n1"], ["n1"]]
    assert overdue[2]["n1"] == "telemetry: pcie_gen 4 < 5; busy 3 nights in a row"
    # A night it was free starts the count again.
    busy_overdue(objects, night=first + dt.timedelta(days=4), busy_asked={}, nights=3)
    assert busy_overdue(objects, night=first + dt.timedelta(days=5), busy_asked=asked, nights=3) == {}

    event = ask_maintenance_window(tickets, "n1", nights=3, why=overdue[2]["n1"], run_id="operate-2026-11-03", now=T0)
    assert event is not None
    assert event.ticket.cause == "maintenance_window"
    assert ask_maintenance_window(tickets, "n1", nights=3, why="", run_id="operate-2026-11-04", now=T0 + DAY) is None
    # It asked for a window to re-certify: the certification that measures the node resolves it.
    assert night(tickets, 5) == ["resolved maintenance_window"]


# --- listing what a store recorded ---------------------------------------------------------------------------


def test_tickets_list_shows_what_a_store_without_ticketing_recorded(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store(tmp_path.as_uri())
    for run_id, day in (("night-1", "2026-11-01"), ("night-2", "2026-11-02")):
        folder = f"runs/date={day}/run={run_id}/"
        frame = verdicts(run_id, [STORAGE, REMAP])
        for column in ("node", "gpu_uuid", "gpu_model", "peer"):
            frame[column] = frame[column].astype("string")
        store.objects.put(folder + "verdicts.parquet", frame.to_parquet())
        store.objects.put(
            f"tickets/pending/run={run_id}.json", json.dumps({"run_id": run_id, "day": day, "tickets": 2}).encode()
        )
    assert main(["tickets", "list", "--store", tmp_path.as_uri(), "--state", "open"]) == 0
    out = capsys.readouterr().out
    assert "recorded in" in out
    lines = [line for line in out.splitlines() if line.startswith("recorded:")]
    assert len(lines) == 2
    assert any("replacement" in line and "row_remap" in line and " 2 " in line for line in lines)
    assert np.all(["storage" in out, "n1" in out])


def test_an_incident_recorded_without_ticketing_is_opened_as_one_ticket_by_the_next_run(
    tmp_path: Path, tickets: LocalTickets
) -> None:
    store = open_store(tmp_path.as_uri())
    incident_run = CertificationRun(store, "night-1", dt.date(2026, 11, 1))
    incident_run.write_table("verdicts.parquet", _strings(verdicts("night-1", [STORAGE, REMAP])))
    incident_run.write_table("decisions.parquet", pd.DataFrame({"node": ["n1", "n2"], "taint": ["refused", "refused"]}))
    recorded = ticket_step(None, incident_run, now=T0, escalation=EscalationPolicy(), incident="5 GPU nodes …")
    assert recorded.recorded == 1  # one incident ticket recorded, not one per fault
    [listed] = recorded_tickets(store)
    assert (listed.kind, listed.title) == ("incident", "[incident] 5 GPU nodes …")
    assert listed.reasons == "held back: n2, n1"  # the hard gate's node first

    later = CertificationRun(store, "night-2", dt.date(2026, 11, 2))
    later.write_table("verdicts.parquet", _strings(verdicts("night-2")))
    step = ticket_step(tickets, later, now=T0 + DAY, escalation=EscalationPolicy())
    assert step.caught_up == ["night-1"]
    [opened] = tickets.tickets()
    assert (opened.kind, opened.node) == ("incident", INCIDENT_NODE)
    assert recorded_tickets(store) == []


def _strings(frame: pd.DataFrame) -> pd.DataFrame:
    for column in ("node", "gpu_uuid", "gpu_model", "peer"):
        frame[column] = frame[column].astype("string")
    return frame
