"""The report's "What was done" section: ``report.html`` — the link people share — says what the run did,
not only what it measured: each node's settled decision, the taints and labels written, the tickets."""

from __future__ import annotations

import asyncio
import html as htmllib
import re
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.store import StoreLocation
from gpucert.report import done_view, render_html
from gpucert.store import open_store
from gpucert.tickets import Ticket, TicketEvent
from gpucert_sim import SimCluster
from gpucert_sim.fleet import Fault

NOW = datetime(2026, 12, 1, 3, tzinfo=UTC)


def _decisions() -> pd.DataFrame:
    rows = [
        ("node-a", "failed", "fail", "row_remap", "row_remap", True, "GPU 0 row remap failure"),
        ("node-b", "certified", "pass", None, "none", False, "all checks passed"),
        ("node-c", "certified", "pass", None, "none", False, "all checks passed"),
        ("node-d", None, "inconclusive", None, "none", False, "the Job failed: deadline"),
    ]
    columns = ["node", "state", "verdict", "cause", "taint", "confirmed", "summary"]
    return pd.DataFrame(rows, columns=columns).astype({"state": "string", "cause": "string"})


def _event(kind: str, node: str, ticket_id: str) -> TicketEvent:
    ticket = Ticket(
        id=ticket_id,
        node=node,
        gpu_uuid="GPU-a0",
        gpu=0,
        cause="row_remap",
        title="row remap",
        created=NOW,
        updated=NOW,
    )
    return TicketEvent(kind=kind, ticket=ticket, previous=None, detail=f"{kind} for {node}", at=NOW)  # type: ignore[arg-type]


def _section(page: str) -> str:
    found = re.search(r'<section id="done">(.*?)</section>', page, re.S)
    assert found is not None, "no 'What was done' section"
    return htmllib.unescape(found.group(1))


def test_the_section_lists_decisions_taints_and_tickets() -> None:
    actions = {
        "node-a": "gpucert.io/state=failed; tainted gpucert.io/unhealthy=row_remap:NoSchedule",
        "node-c": "gpucert taints lifted",
    }
    done = done_view(_decisions(), actions=actions, tickets=[_event("opened", "node-a", "GPUCERT-7")])
    empty = pd.DataFrame(columns=["node", "gpu", "metric", "value"])
    verdicts = pd.DataFrame(columns=["verdict", "node", "gpu", "reference_kind"])
    section = _section(render_html(empty, verdicts, run_id="night-1", done=done))
    headline = "4 nodes decided (1 failed, 2 certified, 1 unchanged); 1 taint added, 1 lifted; 1 ticket event: 1 opened"
    assert headline in section
    assert "tainted gpucert.io/unhealthy=row_remap:NoSchedule" in section
    assert "gpucert taints lifted" in section  # node-c: certified, but the run changed it
    assert "node-b" not in section  # certified and left alone: counted only
    assert "1 node certified and left as they were" in section
    assert "GPUCERT-7" in section
    assert "node-a GPU 0 (GPU-a0)" in section
    assert section.index("node-a") < section.index("node-c") < section.index("node-d")  # worst first


def test_the_section_says_when_tickets_were_only_recorded_and_names_an_incident() -> None:
    done = done_view(_decisions(), tickets_recorded=2, incident="blast radius: 5 of 6 nodes failed")
    section = _section(
        render_html(
            pd.DataFrame(columns=["node", "gpu", "metric", "value"]),
            pd.DataFrame(columns=["verdict", "node", "gpu", "reference_kind"]),
            run_id="night-1",
            done=done,
        )
    )
    assert "Incident: blast radius: 5 of 6 nodes failed" in re.sub(r"<[^>]+>", "", section)
    assert "no node changed; no ticket changed" in section
    assert "2 tickets recorded in the store, none opened" in section


@pytest.mark.usefixtures("prefect_harness")
def test_a_certify_run_s_report_shows_its_taint_and_its_ticket(tmp_path: Path) -> None:
    """End to end: the report.html certify stores names the node it tainted and the ticket it opened."""
    from gpucert.flows.certify import certify

    store = tmp_path / "store"
    with SimCluster(nodes=6, preconfigured=True, seed=6) as sim:
        bad = sim.fleet.node_names[0]
        sim.inject_fault(Fault("remap_failure", bad, 0))  # a hard gate: tainted without a re-run
        outcome = asyncio.run(
            certify(
                cluster=GpuCluster(kubeconfig=str(sim.kubeconfig_path)),
                store=StoreLocation(uri=store.as_uri()),
                run_id="done-1",
            )
        )
    assert outcome.tainted == [bad]
    opened = [t for t in outcome.tickets if t.kind == "opened"]
    assert opened, outcome.tickets
    stored = open_store(store.as_uri(), create=False)
    ((day, _),) = stored.list_runs()
    section = _section(stored.read_run_file("done-1", day, "report.html").decode("utf-8"))
    assert "tainted gpucert.io/unhealthy=" in section
    assert bad in section
    assert opened[0].ticket in section
