"""Issue 30's ticket rules on the production configuration: an S3 store (SeaweedFS, a real S3 server), Jira
(the REST v2 fake the real ``jira`` client talks to), the simulated cluster and the real flows under a
Prefect server.

* a storage fault found by a certify that measured storage is not "resolved" by a certify that did not:
  its Jira issue stays open, its taint stays, and the run says so (outcome, audit trail); the certify that
  measures storage again resolves it;
* ``release --action`` refuses an action that does not fit the ticket's cause (exit 2, naming those that
  do), recording nothing;
* a blast-radius incident opens one Jira incident issue naming every node held back (the row-remap
  failure first), records ``incident.open`` in the store's audit trail, emits ``gpucert.incident.opened``
  and ends the command with exit status 5;
* a busy node telemetry asks about gets a Jira ticket asking for a maintenance window on its
  ``busy_nights``-th night in a row;
* ``tickets list`` shows Jira's tickets (``--ticketing``) and those an S3 store recorded for want of
  ticketing (``--store s3://…``).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from prefect_aws import AwsCredentials
from pydantic import SecretStr

from gpucert.audit import AuditLog
from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.store import StoreLocation
from gpucert.blocks.ticketing import Ticketing
from gpucert.certify import CertificationRun, CertifyOutcome, ticket_step
from gpucert.cli import main
from gpucert.flows.certify import certify
from gpucert.flows.operate import operate
from gpucert.kube import Kube, connect, has_taint
from gpucert.operate import BUSY_PREFIX
from gpucert.tickets import EscalationPolicy
from gpucert_sim import SimCluster
from gpucert_sim.fleet import Fault

from .conftest import eventually
from .fakejira import AppThread, FakeJira
from .s3servers import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS, ServerDidNotStart
from .unavailable import unavailable

pytestmark = pytest.mark.usefixtures("prefect_harness")

BUCKET = "gpucert-tickets"
USER, TOKEN = "gpucert-bot@example.com", "jira-token-30"
UNHEALTHY = "gpucert.io/unhealthy"


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    server = SeaweedFS(BUCKET)
    try:
        endpoint = server.start()
    except ServerDidNotStart as exc:
        if os.environ.get("CI") == "true":  # a real part that cannot start fails in CI, never skips
            pytest.fail(f"SeaweedFS could not start: {exc}")
        unavailable(f"SeaweedFS could not start: {exc}")
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture
def jira() -> Iterator[FakeJira]:
    fake = FakeJira(user=USER, token=TOKEN)
    with AppThread(fake.app()) as http:
        fake.base = http.url
        yield fake


@pytest.fixture
def cli_env(s3: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The command line reaches SeaweedFS as a user reaches any S3 endpoint: boto3's own environment."""
    for name, value in (
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ("AWS_DEFAULT_REGION", REGION),
        ("AWS_ENDPOINT_URL_S3", s3),
    ):
        monkeypatch.setenv(name, value)
    return s3


def _store(endpoint: str, prefix: str) -> StoreLocation:
    credentials = AwsCredentials(
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SecretStr(SECRET_KEY), region_name=REGION
    )
    return StoreLocation(uri=f"s3://{BUCKET}/{prefix}", credentials=credentials, endpoint_url=endpoint)


def _ticketing(fake: FakeJira, name: str) -> Ticketing:
    ticketing = Ticketing(backend="jira", server=fake.base, user=USER, token=SecretStr(TOKEN), project="OPS")
    ticketing.save(name, overwrite=True)
    return ticketing


def _issues(fake: FakeJira, label: str) -> list[dict[str, Any]]:
    return [i for i in fake.issues.values() if label in i["fields"]["labels"]]


def _certify(
    sim: SimCluster, store: StoreLocation, policy: CertificationPolicy, *, storage: bool, nodes: list[str] | None = None
) -> CertifyOutcome:
    cluster = GpuCluster(kubeconfig=str(sim.kubeconfig_path), storage_host_path="/mnt/datasets" if storage else None)
    return asyncio.run(certify(cluster=cluster, store=store, policy=policy, nodes=nodes))


def _tainted(kube: Kube, node: str) -> bool:
    return has_taint(kube.get("v1", "Node", node), UNHEALTHY)


def test_a_storage_fault_stays_ticketed_and_tainted_until_a_run_measures_storage(
    s3: str, jira: FakeJira, cli_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _store(s3, "clearing")
    policy = CertificationPolicy(ticketing=_ticketing(jira, "ops-jira-30"))
    with SimCluster(nodes=4, preconfigured=True, seed=21) as sim:
        kube = connect(sim.kubeconfig_path)
        slow = sim.fleet.node_names[1]
        assert _certify(sim, store, policy, storage=True).tainted == []  # the clean run seeds the baselines

        sim.inject_fault(Fault("slow_storage", slow, None))
        caught = _certify(sim, store, policy, storage=True)
        assert caught.tainted == [slow]
        assert _tainted(kube, slow)
        [issue] = _issues(jira, f"gpucert-node-{slow}")
        assert "gpucert-cause-storage" in issue["fields"]["labels"]

        # A GPU reset is no repair of a storage mount: refused before anything is recorded, exit 2.
        release = [
            "release",
            slow,
            "--kubeconfig",
            str(sim.kubeconfig_path),
            "--store",
            f"s3://{BUCKET}/clearing",
            "--ticketing",
            "ops-jira-30",
        ]
        assert main([*release, "--action", "reset_gpu"]) == 2
        err = capsys.readouterr().err
        assert "--action reset_gpu does not fit ticket" in err
        assert "cause storage): use one of check_storage_mount" in err
        [ticket] = policy.ticketing.open().tickets(nodes=[slow])  # type: ignore[union-attr]
        assert ticket.remediations == []  # nothing recorded: nothing counts towards the reset rule

        # The CLI beside it, with no storage location: the node passes everything it measured, which is not
        # storage. Ticket and taint stay, and the run says why.
        blind = _certify(sim, store, policy, storage=False, nodes=[slow])
        decision = blind.decision(slow)
        assert decision is not None
        assert (decision.state, decision.taint) == (None, "kept")
        assert "did not measure storage (storage_read_gbps)" in decision.summary
        assert _tainted(kube, slow)
        [issue] = _issues(jira, f"gpucert-node-{slow}")
        assert issue["fields"]["status"]["name"] != "Done"
        [kept] = blind.kept
        assert "did not measure storage" in kept.detail
        assert f"ticket {kept.ticket} kept open by run {blind.run_id}" in blind.text()
        trail = AuditLog(store.open().objects).check()
        assert trail.ok, trail.problem
        kept_entries = [e for e in trail.entries if e["action"] == "ticket.keep"]
        assert [(e["after"]["node"], e["after"]["cause"]) for e in kept_entries] == [(slow, "storage")]

        # Repaired, and measured: now it is resolved and lifted.
        sim.clear_faults(slow)
        fixed = _certify(sim, store, policy, storage=True, nodes=[slow])
        lifted = fixed.decision(slow)
        assert lifted is not None
        assert lifted.taint == "lifted"
        assert not _tainted(kube, slow)
        [issue] = _issues(jira, f"gpucert-node-{slow}")
        assert issue["fields"]["status"]["name"] == "Done"

        # Jira's tickets listed through the saved block.
        assert main(["tickets", "list", "--ticketing", "ops-jira-30", "--state", "resolved"]) == 0
        listed = capsys.readouterr().out
        assert issue["key"] in listed
        assert "storage" in listed


def test_a_blast_radius_incident_opens_one_ticket_pages_audits_and_exits_5(
    s3: str, jira: FakeJira, cli_env: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prefect.settings import PREFECT_API_URL

    _ticketing(jira, "ops-jira-30")
    policy = tmp_path / "policy.yaml"
    policy.write_text("blast_radius:\n  min_nodes: 1\n  fraction: 0.0\n")
    with SimCluster(nodes=4, preconfigured=True, seed=21) as sim:
        kube = connect(sim.kubeconfig_path)
        names = sim.fleet.node_names
        sim.inject_fault(Fault("pcie_gen4", names[0], 2))
        sim.inject_fault(Fault("remap_failure", names[3], 1))
        code = main(
            [
                "certify",
                "--kubeconfig",
                str(sim.kubeconfig_path),
                "--store",
                f"s3://{BUCKET}/incident",
                "--ticketing",
                "ops-jira-30",
                "--policy",
                str(policy),
                "--json",
            ]
        )
        captured = capsys.readouterr()
        assert code == 5, captured.err
        outcome = CertifyOutcome.model_validate_json(captured.out)
        assert outcome.incident is not None
        assert "blast radius" in outcome.incident
        assert f"gpucert: incident (ticket {outcome.incident_ticket})" in captured.err
        assert not any(_tainted(kube, n) for n in names)  # nothing tainted, by design

        [issue] = _issues(jira, "gpucert-incident")
        assert issue["key"] == outcome.incident_ticket
        assert [i["key"] for i in jira.issues.values()] == [issue["key"]]  # one ticket, not one per fault
        description = issue["fields"]["description"]
        assert f"Held back: {names[3]}, {names[0]}." in description  # the hard gate first
        assert f"{names[3]} GPU 1: fail row_remap (hard gate)" in description
        assert f"{names[0]} GPU 2: fail pcie" in description

        trail = AuditLog(_store(s3, "incident").open().objects).check()
        assert trail.ok, trail.problem
        [entry] = [e for e in trail.entries if e["action"] == "incident.open"]
        assert entry["after"]["nodes"] == [names[3], names[0]]
        assert entry["after"]["ticket"] == issue["key"]

        api = str(PREFECT_API_URL.value()).rstrip("/")

        def paged() -> list[dict[str, Any]]:
            wanted = {"filter": {"event": {"name": ["gpucert.incident.opened"]}}}
            found = httpx.post(f"{api}/events/filter", json=wanted, timeout=10).json()["events"]
            return [e for e in found if e["payload"].get("run_id") == outcome.run_id]

        [event] = eventually(paged, timeout_s=30)
        assert event["payload"]["ticket"] == issue["key"]
        assert event["payload"]["findings"][0]["hard_gate"] is True


def test_a_busy_node_telemetry_asks_about_gets_a_maintenance_ticket_after_busy_nights(s3: str, jira: FakeJira) -> None:
    store = _store(s3, "busy")
    policy = CertificationPolicy(ticketing=_ticketing(jira, "ops-jira-30"), escalation={"busy_nights": 3})
    with SimCluster(nodes=4, preconfigured=True, seed=21) as sim:
        kube = connect(sim.kubeconfig_path)
        names = sim.fleet.node_names
        stamp = datetime.now(UTC).isoformat()
        for name in names:  # every node certified a moment ago: only what telemetry asks about is due
            kube.merge_patch("v1", "Node", name, {"metadata": {"annotations": {"gpucert.io/certified-at": stamp}}})
        busy = names[2]
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "training", "namespace": "default"},
                "spec": {
                    "nodeName": busy,
                    "containers": [{"name": "c", "image": "trainer", "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
                },
            }
        )
        sim.inject_fault(Fault("pcie_gen4", busy, 3))
        # The two nights before, as operate recorded them: the node was asked about, and busy.
        objects = store.open().objects
        today = datetime.now(UTC).date()
        for back in (2, 1):
            night = (today - timedelta(days=back)).isoformat()
            objects.put(
                f"{BUSY_PREFIX}night={night}.json",
                json.dumps({"night": night, "nodes": {busy: "telemetry: pcie"}}).encode(),
            )

        tonight = asyncio.run(
            operate(
                cluster=GpuCluster(kubeconfig=str(sim.kubeconfig_path)),
                store=store,
                policy=policy,
                rotation_days=30.0,
                scrape_interval_s=1.0,
            )
        )
        assert busy in tonight.asked
        assert busy in tonight.postponed
        assert busy not in tonight.due
        assert "busy 3 nights in a row" in tonight.maintenance[busy]
        [issue] = _issues(jira, "gpucert-cause-maintenance_window")
        assert f"gpucert-node-{busy}" in issue["fields"]["labels"]
        assert f"{busy} needs a maintenance window: ticket {issue['key']}" in tonight.markdown()


def test_tickets_list_shows_what_an_s3_store_recorded_for_want_of_ticketing(
    s3: str, cli_env: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from .test_tickets import verdicts
    from .test_tickets_clearing import REMAP, STORAGE

    store = _store(s3, "recorded").open()
    run = CertificationRun(store, "certify-20261101-0200", datetime(2026, 11, 1, tzinfo=UTC).date())
    frame = verdicts(run.run_id, [STORAGE, REMAP])
    for column in ("node", "gpu_uuid", "gpu_model", "peer"):
        frame[column] = frame[column].astype("string")
    run.write_table("verdicts.parquet", frame)
    step = ticket_step(None, run, now=datetime.now(UTC), escalation=EscalationPolicy())  # no ticketing: recorded
    assert step.recorded == 2

    assert main(["tickets", "list", "--store", f"s3://{BUCKET}/recorded"]) == 0
    out = capsys.readouterr().out
    assert f"recorded in s3://{BUCKET}/recorded by runs without ticketing" in out
    rows = [line.split() for line in out.splitlines() if line.startswith("recorded:")]
    assert sorted((r[2], r[3], r[5]) for r in rows) == [
        ("remediation", "n1", "storage"),
        ("replacement", "n2", "row_remap"),
    ]
