"""Tickets: the lifecycle over the local SQLite backend (open, recur, escalate, resolve), and its file."""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpucert.blocks.ticketing import Ticketing
from gpucert.tickets import (
    TICKETS_FILE,
    EscalationPolicy,
    LocalTickets,
    RunEvidence,
    Ticket,
    TicketConfigError,
    TicketError,
    TicketEvent,
    TicketNotFound,
    local_path,
    open_backend,
    reconcile,
    record_remediation,
    record_repairs,
    tickets_list,
)
from gpucert.verdict import VERDICT_COLUMNS
from gpucert_sim.fleet import Fault

from .conftest import Seeded

T0 = dt.datetime(2026, 11, 1, 2, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)


def uuid(node: str, gpu: int) -> str:
    return f"GPU-{node}-{gpu}"


def verdicts(
    run_id: str, flagged: Sequence[Mapping[str, Any]] = (), *, nodes: Sequence[str] = ("n1", "n2"), gpus: int = 4
) -> pd.DataFrame:
    """A run's verdict table: every GPU and node row passes except the ``flagged`` ones.

    A flagged entry names ``node`` and ``gpu`` (None for the node row) and the columns it sets; the
    rest default to a failing remediation.
    """
    rows = []
    for node in nodes:
        rows += [{"node": node, "gpu": g, "gpu_uuid": uuid(node, g)} for g in range(gpus)]
        rows.append({"node": node, "gpu": None, "gpu_uuid": None, "metric": "nccl_allreduce_busbw_gbps"})
    table = pd.DataFrame(rows)
    table = table.assign(
        run_id=run_id,
        verdict="pass",
        value=np.nan,
        reference=np.nan,
        deviation_pct=np.nan,
        z=np.nan,
        reference_kind="",
        cause="",
        action="none",
        ticket="none",
        reasons="",
        gpu_model="NVIDIA H200",
        peer=None,
    )
    table["metric"] = table["metric"].fillna("")
    table["gpu"] = table["gpu"].astype("Int64")
    for change in flagged:
        where = (table["node"] == change["node"]) & (
            table["gpu"].isna() if change.get("gpu") is None else table["gpu"].eq(change["gpu"])
        )
        assert where.sum() == 1, change
        values = {"verdict": "fail", "ticket": "remediation", "action": "reset_gpu", "reasons": "something failed"}
        values |= {k: v for k, v in change.items() if k not in ("node", "gpu")}
        for column, value in values.items():
            table.loc[where, column] = value
    # The engine hands out categoricals for names; the lifecycle must not care.
    for column in ("node", "gpu_uuid", "gpu_model", "peer"):
        table[column] = table[column].astype("category")
    return table[list(VERDICT_COLUMNS)]


THERMAL = {
    "node": "n1",
    "gpu": 2,
    "cause": "thermal",
    "action": "check_cooling",
    "metric": "hw_slowdown_frac",
    "value": 0.31,
    "reasons": "HW thermal slowdown 31 % of the benchmark",
}


@pytest.fixture
def tickets(tmp_path: Path) -> LocalTickets:
    return LocalTickets(tmp_path / "tickets.sqlite")


def run(backend: LocalTickets, day: int, flagged: Sequence[Mapping[str, Any]] = (), **kwargs: Any) -> list[TicketEvent]:
    """Reconcile night ``day`` (its run id is ``night-<day>``)."""
    return reconcile(backend, verdicts(f"night-{day}", flagged), run_id=f"night-{day}", now=T0 + day * DAY, **kwargs)


def only(backend: LocalTickets) -> Ticket:
    found = backend.tickets()
    assert len(found) == 1, found
    return found[0]


# --- opening and recurring -------------------------------------------------------------------------------


def test_a_failing_gpu_opens_one_ticket_that_carries_its_evidence(tickets: LocalTickets) -> None:
    results = pd.DataFrame(
        {
            "node": ["n1", "n1", "n1", "n1", "n1", "n2"],
            "gpu_uuid": [uuid("n1", 2), uuid("n1", 2), uuid("n1", 2), uuid("n1", 2), None, uuid("n2", 0)],
            "metric": ["hw_slowdown_frac", "temp_max_c", "pcie_gen", "gemm_bf16_tflops", "gpu_count", "temp_max_c"],
            "value": [0.31, 91.0, 5.0, 640.0, 4.0, 60.0],
        }
    )
    evidence = RunEvidence(
        report="file:///srv/gpucert/runs/date=2026-11-02/run=night-1/report.html",
        stacks={"n1": {"driver": "570.86.15", "cuda": "12.8"}},
        results=results,
    )
    events = run(tickets, 1, [THERMAL], evidence=evidence)

    assert [e.kind for e in events] == ["opened"]
    ticket = events[0].ticket
    assert ticket == tickets.get(ticket.id)
    assert (ticket.node, ticket.gpu, ticket.gpu_uuid, ticket.cause) == ("n1", 2, uuid("n1", 2), "thermal")
    assert (ticket.kind, ticket.state, ticket.occurrences, ticket.action) == ("remediation", "open", 1, "check_cooling")
    assert ticket.title == "[remediation] n1 GPU 2 thermal: check_cooling"
    [seen] = ticket.evidence
    assert seen.run_id == "night-1"
    assert seen.verdicts[0]["metric"] == "hw_slowdown_frac"
    assert seen.verdicts[0]["value"] == pytest.approx(0.31)
    # The worst value of each telemetry metric, no performance numbers; only this GPU's and its node's.
    assert seen.telemetry == {
        uuid("n1", 2): {"hw_slowdown_frac": 0.31, "temp_max_c": 91.0, "pcie_gen": 5.0},
        "node": {"gpu_count": 4.0},
    }
    assert seen.stack == {"driver": "570.86.15", "cuda": "12.8"}
    assert seen.report.endswith("report.html")
    assert "report: file:///srv/gpucert" in ticket.body()
    assert "telemetry" in ticket.body()


def test_a_recurrence_updates_the_same_ticket_and_a_rerun_of_a_night_counts_once(tickets: LocalTickets) -> None:
    first = run(tickets, 1, [THERMAL])[0].ticket
    events = run(tickets, 2, [THERMAL | {"value": 0.4}])
    assert [e.kind for e in events] == ["updated"]
    again = events[0].ticket
    assert again.id == first.id
    assert again.occurrences == 2
    assert [e.run_id for e in again.evidence] == ["night-1", "night-2"]
    assert (again.created, again.updated) == (first.created, T0 + 2 * DAY)

    assert run(tickets, 2, [THERMAL]) == []  # a retried reconcile of night 2
    assert only(tickets).occurrences == 2


def test_the_evidence_kept_is_bounded_while_occurrences_keep_counting(tickets: LocalTickets) -> None:
    for day in range(1, 9):
        run(tickets, day, [THERMAL])
    ticket = only(tickets)
    assert ticket.occurrences == 8
    assert [e.run_id for e in ticket.evidence] == [f"night-{d}" for d in range(4, 9)]


def test_different_causes_on_one_gpu_and_missing_gpus_get_tickets_of_their_own(tickets: LocalTickets) -> None:
    xid = {"node": "n2", "cause": "xid", "action": "reboot_node"}
    flagged = [THERMAL, xid | {"gpu": 0}, xid | {"gpu": 1, "gpu_uuid": None}, xid | {"gpu": 3, "gpu_uuid": None}]
    table = verdicts("night-1", flagged)
    reconcile(tickets, table, run_id="night-1", now=T0)
    keys = sorted(t.fingerprint.key for t in tickets.tickets())
    assert keys == ["n1/GPU-n1-2/thermal", "n2/GPU-n2-0/xid", "n2/gpu1/xid", "n2/gpu3/xid"]


def test_rows_that_ask_for_no_ticket_open_none(tickets: LocalTickets) -> None:
    table = verdicts(
        "night-1",
        [
            {"node": "n1", "gpu": 0, "verdict": "inconclusive", "ticket": "remediation"},  # not the GPU's fault
            {"node": "n1", "gpu": 1, "verdict": "warn", "ticket": "none", "action": "retest"},  # re-run, no ticket
        ],
    )
    fleet = pd.DataFrame(
        [
            {
                "run_id": "night-1",
                "node": None,
                "gpu": None,
                "verdict": "warn",
                "cause": "config",
                "action": "fix_config",
                "ticket": "remediation",
                "reference_kind": "fleet",
                "reasons": "every GPU 2 % slower on the new driver",
            }
        ]
    )
    table = pd.concat([table.astype({"node": str}), fleet], ignore_index=True)
    assert reconcile(tickets, table, run_id="night-1", now=T0) == []
    assert tickets.tickets() == []


def test_a_warn_with_a_ticket_opens_a_remediation(tickets: LocalTickets) -> None:
    [event] = run(tickets, 1, [{"node": "n1", "gpu": 0, "verdict": "warn", "cause": "ecc", "action": "run_field_diag"}])
    assert (event.kind, event.ticket.kind, event.ticket.cause) == ("opened", "remediation", "ecc")


def test_a_node_wide_cause_is_one_node_ticket_not_one_per_gpu(tickets: LocalTickets) -> None:
    power = {"cause": "power", "action": "check_power", "reasons": "power brake on every GPU"}
    flagged = [{"node": "n1", "gpu": g, **power} for g in range(4)] + [{"node": "n1", "gpu": None, **power}]
    [event] = run(tickets, 1, flagged)
    assert event.ticket.fingerprint.key == "n1/-/power"
    assert len(event.ticket.evidence[0].verdicts) == 5
    assert (event.ticket.gpu, event.ticket.title) == (None, "[remediation] n1 power: check_power")
    # Three of four GPUs is not node-wide: those are GPU faults.
    events = run(tickets, 2, [{"node": "n2", "gpu": g, **power} for g in range(3)])
    opened = sorted(e.ticket.fingerprint.key for e in events if e.kind == "opened")
    assert opened == [f"n2/GPU-n2-{g}/power" for g in range(3)]


# --- escalation ------------------------------------------------------------------------------------------


def test_a_row_that_asks_for_replacement_opens_a_replacement_at_once(tickets: LocalTickets) -> None:
    remap = {
        "node": "n2",
        "gpu": 1,
        "cause": "row_remap",
        "action": "run_field_diag",
        "ticket": "replacement",
        "metric": "remapped_rows_failure",
        "value": 1.0,
        "reasons": "row-remap failure",
    }
    [event] = run(tickets, 1, [remap])
    assert (event.kind, event.ticket.kind) == ("opened", "replacement")
    assert "the verdict asks for a replacement" in event.ticket.escalation


def test_a_remediation_escalates_when_a_later_row_asks_for_replacement(tickets: LocalTickets) -> None:
    replay = {"node": "n1", "gpu": 0, "cause": "pcie", "action": "reseat"}
    run(tickets, 1, [replay])
    [event] = run(tickets, 2, [replay | {"ticket": "replacement", "reasons": "replays > 100/min"}])
    assert (event.kind, event.ticket.kind, event.previous and event.previous.kind) == (
        "escalated",
        "replacement",
        "remediation",
    )
    assert "escalated to replacement" in event.detail


def test_the_fault_recurring_after_two_resets_escalates_to_replacement(tickets: LocalTickets) -> None:
    xid = {"node": "n1", "gpu": 3, "cause": "xid", "action": "reset_gpu", "metric": "xid", "value": 79.0}
    ticket = run(tickets, 1, [xid])[0].ticket
    record_remediation(tickets, ticket.id, "reset_gpu", T0 + 1.5 * DAY, note="nvidia-smi -r", by="oncall")
    [after_one] = run(tickets, 2, [xid])
    assert (after_one.kind, after_one.ticket.kind) == ("updated", "remediation")  # one reset is not enough

    record_remediation(tickets, ticket.id, "reboot_node", T0 + 2.5 * DAY)
    [after_two] = run(tickets, 3, [xid])
    assert (after_two.kind, after_two.ticket.kind) == ("escalated", "replacement")
    assert "recurred after 2 resets or reboots" in after_two.ticket.escalation
    assert [r.action for r in after_two.ticket.remediations] == ["reset_gpu", "reboot_node"]
    assert after_two.ticket.remediations[0].by == "oncall"
    assert after_two.ticket.title.startswith("[replacement] n1 GPU 3 xid")


def test_an_rdma_port_down_again_after_two_reseats_escalates_to_replacement(tickets: LocalTickets) -> None:
    """docs/reference/causes-and-actions.md, "Remediation playbook": an RDMA port down, slow or flapping is
    brought up, its cable or transceiver reseated; when it persists, replaced. The node row carries it (a NIC
    is the node's), one ticket for the node."""
    port = {
        "node": "n2",
        "gpu": None,
        "cause": "network",
        "action": "reseat_nic",
        "metric": "ib_ports_active",
        "value": 7.0,
        "reasons": "network: 1 of 8 RDMA ports down",
    }
    ticket = run(tickets, 1, [port])[0].ticket
    assert (ticket.kind, ticket.gpu_uuid, ticket.cause, ticket.action) == ("remediation", "", "network", "reseat_nic")
    record_remediation(tickets, ticket.id, "reseat_nic", T0 + 1.5 * DAY)
    assert run(tickets, 2, [port])[0].ticket.kind == "remediation"
    record_remediation(tickets, ticket.id, "check_cable", T0 + 2.5 * DAY, note="transceiver replaced")
    [event] = run(tickets, 3, [port | {"action": "check_cable"}])
    assert (event.kind, event.ticket.kind) == ("escalated", "replacement")
    assert "reseat_nic" in event.ticket.escalation
    assert "check_cable" in event.ticket.escalation


def test_a_contained_ecc_xid_94_never_escalates_on_resets(tickets: LocalTickets) -> None:
    xid94 = {"node": "n1", "gpu": 0, "cause": "xid", "action": "restart_app", "metric": "xid", "value": 94.0}
    ticket = run(tickets, 1, [xid94])[0].ticket
    for hours in (30, 40, 50):
        record_remediation(tickets, ticket.id, "reset_gpu", T0 + dt.timedelta(hours=hours))
    assert only(tickets).kind == "remediation"
    [event] = run(tickets, 3, [xid94])
    assert event.ticket.kind == "remediation"


def test_five_remediations_on_a_node_within_a_week_escalate_its_next_fault(tickets: LocalTickets) -> None:
    flagged = [{"node": "n1", "gpu": g, "cause": "pcie", "action": "reseat"} for g in range(3)]
    opened = {e.ticket.gpu: e.ticket for e in run(tickets, 1, flagged)}
    # Five remediations across the node's tickets, the oldest eight days before night 10 (outside the window).
    record_remediation(tickets, opened[0].id, "reseat", T0 + 2 * DAY)
    for g, day in ((1, 5), (2, 6), (1, 7), (0, 8)):
        record_remediation(tickets, opened[g].id, "reseat", T0 + day * DAY)
    events = run(tickets, 10, flagged[:1])
    assert events[0].ticket.kind == "remediation"  # four within 7 days
    record_remediation(tickets, opened[1].id, "reseat", T0 + 9 * DAY)
    [event] = run(tickets, 11, flagged[:1])
    assert (event.kind, event.ticket.kind) == ("escalated", "replacement")
    assert "5 remediations on n1 within 7 days" in event.ticket.escalation


def test_the_same_xid_in_five_separate_bursts_within_a_day_escalates(tickets: LocalTickets) -> None:
    xid = {"node": "n2", "gpu": 2, "cause": "xid", "action": "reset_gpu", "metric": "xid", "value": 48.0}
    table = verdicts("x", [xid])

    def at(minutes: float, run_id: str) -> TicketEvent:
        [event] = reconcile(tickets, table, run_id=run_id, now=T0 + dt.timedelta(minutes=minutes))
        return event

    # Within three minutes of each other: one burst, however many runs saw it.
    assert [at(m, f"b{m}").ticket.kind for m in (0, 1, 2)] == ["remediation"] * 3
    assert [at(m, f"b{m}").ticket.kind for m in (60, 120, 180)] == ["remediation"] * 3
    assert at(240, "b240").kind == "escalated"


def test_a_node_that_fails_again_after_passing_three_times_in_two_weeks_escalates(tickets: LocalTickets) -> None:
    flagged = [THERMAL]
    kinds = []
    for day in range(0, 8):
        events = run(tickets, day, flagged if day % 2 == 0 else [])
        kinds.append(events[0].kind)
    assert kinds == ["opened", "resolved", "reopened", "resolved", "reopened", "resolved", "escalated", "resolved"]
    assert "flapping" in only(tickets).escalation


def test_an_escalation_policy_can_be_tuned(tickets: LocalTickets) -> None:
    xid = {"node": "n1", "gpu": 3, "cause": "xid", "action": "reset_gpu", "metric": "xid", "value": 79.0}
    ticket = run(tickets, 1, [xid])[0].ticket
    record_remediation(tickets, ticket.id, "reset_gpu", T0 + 1.5 * DAY)
    [event] = run(tickets, 2, [xid], policy=EscalationPolicy(resets=1))
    assert event.ticket.kind == "replacement"
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        EscalationPolicy(resets=0)


# --- resolution ------------------------------------------------------------------------------------------


def test_a_gpu_that_passes_again_resolves_its_ticket_and_a_recurrence_reopens_it(tickets: LocalTickets) -> None:
    opened = run(tickets, 1, [THERMAL])[0].ticket
    [resolved] = run(tickets, 2)
    assert (resolved.kind, resolved.ticket.state, resolved.ticket.resolved) == ("resolved", "resolved", T0 + 2 * DAY)
    assert "n1 GPU 2 (GPU-n1-2) passes" in resolved.detail
    assert run(tickets, 3) == []  # nothing open any more

    [reopened] = run(tickets, 4, [THERMAL])
    assert (reopened.kind, reopened.ticket.id, reopened.ticket.state) == ("reopened", opened.id, "open")
    assert (reopened.ticket.occurrences, reopened.ticket.resolved) == (2, None)
    assert [k for _, k, _ in tickets.events(opened.id)] == ["opened", "resolved", "reopened"]


def test_only_judged_hardware_is_resolved(tickets: LocalTickets) -> None:
    run(tickets, 1, [THERMAL])
    # A run of n2 alone says nothing about n1.
    assert reconcile(tickets, verdicts("night-2", nodes=["n2"]), run_id="night-2", now=T0 + 2 * DAY) == []
    # A GPU that is judged but not passing (inconclusive, or another cause without a ticket) stays open.
    other = {"node": "n1", "gpu": 2, "verdict": "warn", "ticket": "none", "cause": "", "action": "retest"}
    assert run(tickets, 3, [other]) == []
    assert only(tickets).state == "open"


def test_a_replaced_gpu_seen_under_a_new_uuid_resolves_its_ticket(tickets: LocalTickets) -> None:
    remap = {"node": "n2", "gpu": 1, "cause": "row_remap", "ticket": "replacement", "action": "replace_gpu"}
    run(tickets, 1, [remap])
    table = verdicts("night-2")
    table["gpu_uuid"] = table["gpu_uuid"].cat.rename_categories({uuid("n2", 1): "GPU-brand-new"})
    [event] = reconcile(tickets, table, run_id="night-2", now=T0 + 2 * DAY)
    assert event.kind == "resolved"
    assert "new UUID (replaced)" in event.detail


def test_a_node_ticket_resolves_only_when_every_check_of_the_node_passes(tickets: LocalTickets) -> None:
    nccl = {
        "node": "n1",
        "gpu": None,
        "cause": "nvlink",
        "action": "reboot_node",
        "metric": "nccl_allreduce_busbw_gbps",
    }
    run(tickets, 1, [nccl])
    assert run(tickets, 2, [{"node": "n1", "gpu": 0, "verdict": "warn", "ticket": "none", "action": "retest"}]) == []
    [event] = run(tickets, 3)
    assert event.kind == "resolved"
    assert "every check of n1 passes" in event.detail


def test_release_records_the_repairs_so_a_recurrence_counts_after_them(tickets: LocalTickets) -> None:
    xid = {"node": "n1", "gpu": 3, "cause": "xid", "action": "reboot_node", "metric": "xid", "value": 79.0}
    run(tickets, 1, [xid, {"node": "n2", "gpu": 0, "cause": "pcie", "action": "reseat"}])
    events = record_repairs(tickets, ["n1"], T0 + 1.5 * DAY, note="released after repair", by="gpucert release")
    assert [(e.kind, e.ticket.node, e.ticket.remediations[-1].action) for e in events] == [
        ("remediated", "n1", "reboot_node")
    ]
    record_repairs(tickets, ["n1"], T0 + 2.5 * DAY, action="reset_gpu")
    [event] = [e for e in run(tickets, 3, [xid]) if e.ticket.node == "n1"]
    assert (event.kind, event.ticket.kind) == ("escalated", "replacement")


def test_remediation_errors_name_the_problem(tickets: LocalTickets) -> None:
    ticket = run(tickets, 1, [THERMAL])[0].ticket
    with pytest.raises(TicketNotFound, match="no ticket '99'"):
        record_remediation(tickets, "99", "reset_gpu", T0)
    with pytest.raises(TicketNotFound, match="numbers"):
        tickets.get("OPS-1")
    with pytest.raises(TicketError, match="needs an action"):
        record_remediation(tickets, ticket.id, " ", T0)
    with pytest.raises(TicketError, match="naive"):
        record_remediation(tickets, ticket.id, "reset_gpu", dt.datetime(2026, 11, 2))
    with pytest.raises(TicketError, match="naive"):
        reconcile(tickets, verdicts("r"), run_id="r", now=dt.datetime(2026, 11, 2))
    with pytest.raises(TicketError, match=r"lacks column\(s\) \['ticket'\]"):
        reconcile(tickets, verdicts("r").drop(columns="ticket"), run_id="r", now=T0)


# --- a real night judged by the engine -------------------------------------------------------------------


def test_a_judged_night_opens_the_tickets_it_asks_for_and_a_clean_night_resolves_them(
    seeded: Seeded, tmp_path: Path
) -> None:
    fleet = seeded.fleet
    brake, remap = fleet.node_names[3], fleet.node_names[5]
    wave = seeded.night([Fault("power_brake", brake, params={"duty": 0.4}), Fault("remap_failure", remap, 2)])
    table = seeded.judge(wave)
    backend = open_backend(tmp_path)
    run_id = str(table["run_id"].iloc[0])
    events = reconcile(
        backend,
        table,
        run_id=run_id,
        now=T0 + 20 * DAY,
        evidence=RunEvidence(results=wave.results, report="file:///r/report.html"),
    )
    by_key = {e.ticket.fingerprint.key: e.ticket for e in events}
    assert f"{brake}/-/power" in by_key  # the power brake on all GPUs: one node ticket
    remapped = [t for t in by_key.values() if t.node == remap and t.cause == "row_remap"]
    assert [(t.kind, t.gpu) for t in remapped] == [("replacement", 2)]
    assert remapped[0].evidence[0].telemetry[remapped[0].gpu_uuid]["remapped_rows_failure"] == 1.0
    assert not [t for t in by_key.values() if t.node not in (brake, remap)]

    clean = seeded.night(seed=2000)
    resolved = reconcile(backend, seeded.judge(clean), run_id="night-2000", now=T0 + 21 * DAY)
    assert {e.kind for e in resolved} == {"resolved"}
    assert backend.tickets(state="open") == []


# --- the file, and concurrent writers --------------------------------------------------------------------


def test_two_threads_reconciling_at_once_never_duplicate_a_fingerprint(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    start = threading.Barrier(8)

    def night(i: int) -> None:
        backend = LocalTickets(path)  # each its own connection, as two processes would have
        start.wait()
        reconcile(backend, verdicts(f"n{i}", [THERMAL]), run_id=f"n{i}", now=T0 + i * DAY)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(night, range(8)))
    ticket = only(LocalTickets(path))
    assert (ticket.occurrences, len(set(ticket.runs))) == (8, 8)


#: A child process: wait for the start signal, then reconcile one night of a GPU failing on n1.
_CHILD = """
import datetime as dt, os, sys, time
import pandas as pd
from gpucert.tickets import LocalTickets, reconcile
path, go, i = sys.argv[1], sys.argv[2], int(sys.argv[3])
table = pd.DataFrame([{"node": "n1", "gpu": 2, "gpu_uuid": "GPU-n1-2", "verdict": "fail", "cause": "thermal",
                       "action": "check_cooling", "ticket": "remediation", "reasons": "hot"}])
backend = LocalTickets(path)
open(f"{go}-ready-{i}", "w").close()
while not os.path.exists(go):
    time.sleep(0.005)
now = dt.datetime(2026, 11, 1, tzinfo=dt.UTC) + dt.timedelta(days=i)
print(len(reconcile(backend, table, run_id=f"p{i}", now=now)))
"""


def test_processes_reconciling_at_once_never_duplicate_a_fingerprint(tmp_path: Path) -> None:
    path, go = tmp_path / "t.sqlite", tmp_path / "go"
    children = [
        subprocess.Popen([sys.executable, "-c", _CHILD, str(path), str(go), str(i)], stdout=subprocess.PIPE, text=True)
        for i in range(3)
    ]
    deadline = time.monotonic() + 120
    while not all(Path(f"{go}-ready-{i}").exists() for i in range(3)) and time.monotonic() < deadline:
        time.sleep(0.01)
    go.touch()  # all three imported and waiting: now they race
    outputs = [child.communicate(timeout=120)[0].strip() for child in children]
    assert [child.returncode for child in children] == [0] * 3
    assert outputs == ["1"] * 3
    ticket = only(LocalTickets(path))
    assert ticket.occurrences == 3
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert db.execute("SELECT count(*) FROM events").fetchone()[0] == 3


def test_a_change_that_raises_stores_nothing(tickets: LocalTickets) -> None:
    run(tickets, 1, [THERMAL])

    def broken(current: Ticket | None, others: Sequence[Ticket]) -> TicketEvent | None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        tickets.change(only(tickets).fingerprint, broken)
    assert only(tickets).occurrences == 1


def test_a_ticket_file_from_a_newer_gpucert_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.sqlite"
    LocalTickets(path).tickets()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(TicketError, match="schema 99, newer"):
        LocalTickets(path).tickets()


def test_an_unwritable_ticket_file_is_a_ticket_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    with pytest.raises(TicketError, match="cannot open the ticket file"):
        LocalTickets(tmp_path / "a-file" / "t.sqlite").tickets()


# --- the command line's side: locations and the table ----------------------------------------------------


def test_ticket_locations_name_a_file_or_a_store_root(tmp_path: Path) -> None:
    assert local_path("sqlite:///srv/gpucert/t.sqlite") == Path("/srv/gpucert/t.sqlite")
    assert local_path("file:///srv/gpucert") == Path("/srv/gpucert") / TICKETS_FILE
    assert local_path(tmp_path) == tmp_path / TICKETS_FILE
    assert local_path("rel/tickets.db") == Path("rel/tickets.db")
    for bad, message in (
        ("s3://bucket/prefix", "needs a local path"),
        ("https://jira", "unknown scheme"),
        ("", "empty"),
        ("file://host/x", "three slashes"),
    ):
        with pytest.raises(TicketConfigError, match=message):
            local_path(bad)


def test_tickets_list_shows_the_table_by_state(tmp_path: Path) -> None:
    backend = open_backend(f"file://{tmp_path}")
    assert tickets_list(f"file://{tmp_path}") == "no tickets"
    run(backend, 1, [THERMAL, {"node": "n2", "gpu": None, "cause": "nvlink", "action": "reboot_node"}])
    run(backend, 2, [{"node": "n2", "gpu": None, "cause": "nvlink", "action": "reboot_node"}])  # n1 passes

    text = tickets_list(str(tmp_path))
    header, *lines = text.splitlines()
    assert header.split() == [
        "ID",
        "STATE",
        "KIND",
        "NODE",
        "GPU",
        "CAUSE",
        "ACTION",
        "SEEN",
        "FIXES",
        "UPDATED",
        "ESCALATION",
    ]
    assert lines[0].split()[:8] == ["1", "resolved", "remediation", "n1", "2", "thermal", "check_cooling", "1"]
    assert lines[1].split()[:8] == ["2", "open", "remediation", "n2", "-", "nvlink", "reboot_node", "2"]
    assert tickets_list(backend, "open").splitlines()[1].split()[0] == "2"
    assert tickets_list(backend, "resolved", nodes=["n2"]) == "no resolved tickets"
    with pytest.raises(TicketConfigError, match="unknown ticket state 'closed'"):
        tickets_list(backend, "closed")


def test_the_ticketing_block_opens_the_local_file_by_default(tmp_path: Path) -> None:
    backend = Ticketing(path=str(tmp_path)).open()
    assert isinstance(backend, LocalTickets)
    assert backend.path == tmp_path / TICKETS_FILE
    assert Ticketing().path == "gpucert-store/tickets.sqlite"
