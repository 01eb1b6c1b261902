"""The production path, end to end: an S3 store (SeaweedFS, a real S3 server), Jira (the REST v2 fake the
real ``jira`` client talks to), the simulated cluster, and the real flows under a Prefect server.

One fleet lives through nights of ``operate`` and the other entry points, and every one reaches the
same settled decision with the same policy and ticketing:

* a night with no ticketing configured records its tickets in the store and says so; the next night,
  with Jira configured in the ``CertificationPolicy`` block, opens them;
* each run's ``decisions.parquet`` in S3 agrees with the state label, the ``GpuCertified`` condition and
  the taint of every node;
* ``gpucert release`` on the S3 store records each repair on the Jira ticket; the fault coming back
  after 2 resets escalates the ticket to a replacement (REFERENCE §5), exactly as the local backend does;
  a release after the real repair resolves it (the Done transition);
* an onboarding whose node fails opens a ticket for it and keeps it out.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import pytest
from prefect_aws import AwsCredentials

from blocks.cluster import GpuCluster
from blocks.policy import CertificationPolicy
from blocks.store import BaselineStore
from blocks.ticketing import Ticketing
from flows.onboard import onboard
from flows.operate import operate
from gpucert.audit import AuditLog
from gpucert.certify import CertificationRun, CertifyOutcome
from gpucert.cli import main
from gpucert.fleet import Fault
from gpucert.kube import Kube, condition, connect, has_taint
from gpucert.sim import SimCluster

from .fakejira import AppThread, FakeJira
from .s3servers import ACCESS_KEY, REGION, SECRET_KEY, SeaweedFS, ServerDidNotStart

pytestmark = pytest.mark.usefixtures("prefect_harness")

BUCKET = "gpucert-prod"
USER, TOKEN = "gpucert-bot@example.com", "jira-token-e2e"


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    server = SeaweedFS(BUCKET)
    try:
        endpoint = server.start()
    except ServerDidNotStart as exc:
        pytest.skip(f"SeaweedFS could not start: {exc}")
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


def _store(endpoint: str) -> BaselineStore:
    credentials = AwsCredentials(
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=REGION
    )
    return BaselineStore(uri=f"s3://{BUCKET}/fleet", credentials=credentials, endpoint_url=endpoint)


def _ticketing(fake: FakeJira) -> Ticketing:
    return Ticketing(backend="jira", server=fake.base, user=USER, token=TOKEN, project="OPS")


def _night(sim: SimCluster, store: BaselineStore, policy: CertificationPolicy) -> CertifyOutcome:
    night = asyncio.run(operate(cluster=GpuCluster(kubeconfig=str(sim.kubeconfig_path)), store=store,
                                policy=policy, rotation_days=0.0, scrape_interval_s=1.0))  # fmt: skip
    assert night.certify is not None
    return night.certify


def _check_decisions_agree(kube: Kube, store: BaselineStore, outcome: CertifyOutcome) -> None:
    """The run's decisions.parquet in the store says what the nodes carry: label, condition, taint."""
    run = CertificationRun(store.open(), outcome.run_id, outcome.day)
    stored = pd.read_parquet(io.BytesIO(run.store.read_run_file(run.run_id, run.day, "decisions.parquet")))
    assert sorted(stored["node"]) == sorted(outcome.nodes)
    for row in stored.itertuples(index=False):
        node = kube.get("v1", "Node", str(row.node))
        if pd.isna(row.state):
            continue
        assert node["metadata"]["labels"]["gpucert.io/state"] == row.state, row.node
        cond = condition(node, "GpuCertified")
        assert cond is not None
        assert cond["status"] == ("True" if row.state == "certified" else "False")
        assert has_taint(node, "gpucert.io/unhealthy") == (row.taint in ("added", "kept")), row.node


def _issues(fake: FakeJira, node: str) -> list[dict[str, Any]]:
    return [i for i in fake.issues.values() if f"gpucert-node-{node}" in i["fields"]["labels"]]


def _release(sim: SimCluster, node: str, action: str, monkeypatch: pytest.MonkeyPatch, endpoint: str) -> int:
    # The command line reaches SeaweedFS the way a user reaches any S3 endpoint: boto3's own environment.
    for name, value in (("AWS_ACCESS_KEY_ID", ACCESS_KEY), ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
                        ("AWS_DEFAULT_REGION", REGION), ("AWS_ENDPOINT_URL_S3", endpoint)):  # fmt: skip
        monkeypatch.setenv(name, value)
    return main(["release", node, "--kubeconfig", str(sim.kubeconfig_path), "--store", f"s3://{BUCKET}/fleet",
                 "--ticketing", "ops-jira", "--action", action])  # fmt: skip


def test_nightly_operate_on_s3_and_jira_opens_escalates_and_resolves_tickets(
    s3: str, jira: FakeJira, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _store(s3)
    ticketing = _ticketing(jira)
    ticketing.save("ops-jira", overwrite=True)
    with SimCluster(nodes=8, preconfigured=True, seed=3) as sim:
        names = sim.fleet.node_names
        kube = connect(sim.kubeconfig_path)
        assert _night(sim, store, CertificationPolicy()).tainted == []  # the clean night seeds the baselines

        # No ticketing configured on an S3 store: nothing is dropped, it is recorded and said.
        sim.inject_fault(Fault("pcie_gen4", names[2], 4))
        recorded = _night(sim, store, CertificationPolicy())
        assert recorded.tainted == [names[2]]
        assert recorded.ticketing == "not configured"
        assert recorded.tickets_recorded == 1
        assert recorded.ticket_line() == "ticketing not configured: 1 tickets recorded, none opened"
        assert jira.issues == {}
        _check_decisions_agree(kube, store, recorded)

        # Jira configured in the policy: the next night opens the recorded ticket (and updates it).
        policy = CertificationPolicy(ticketing=ticketing)
        opened = _night(sim, store, policy)
        [issue] = _issues(jira, names[2])
        assert "gpucert-remediation" in issue["fields"]["labels"]
        assert "gpucert-cause-pcie" in issue["fields"]["labels"]
        assert {t.kind for t in opened.tickets} >= {"opened"}
        assert opened.ticketing == "jira"
        _check_decisions_agree(kube, store, opened)

        # Two resets recorded through `gpucert release` on the S3 store, the fault still there: escalated.
        assert _release(sim, names[2], "reset_gpu", monkeypatch, s3) == 3
        assert _release(sim, names[2], "reset_gpu", monkeypatch, s3) == 3
        out = capsys.readouterr().out
        assert "reset_gpu recorded" in out
        [issue] = _issues(jira, names[2])
        assert "gpucert-replacement" in issue["fields"]["labels"]
        assert "after 2 resets" in issue["fields"]["description"]

        # The GPU replaced: the release passes, lifts the taint, resolves the ticket in Jira.
        sim.clear_faults(names[2])
        assert _release(sim, names[2], "replace_gpu", monkeypatch, s3) == 0
        [issue] = _issues(jira, names[2])
        assert issue["fields"]["status"]["name"] == "Done"
        assert not has_taint(kube.get("v1", "Node", names[2]), "gpucert.io/unhealthy")

        # An onboarding whose node fails: a ticket for it, and the node kept out.
        [new] = sim.add_nodes(1, uncertified_taint="gpucert.io/uncertified")
        sim.inject_fault(Fault("remap_failure", new, 3))
        result = asyncio.run(onboard(node=new, cluster=GpuCluster(kubeconfig=str(sim.kubeconfig_path)),
                                     store=store, policy=policy, ready_timeout_s=60))  # fmt: skip
        assert (result.state, result.admitted) == ("failed", False)
        [issue] = _issues(jira, new)
        assert "gpucert-replacement" in issue["fields"]["labels"]
        assert has_taint(kube.get("v1", "Node", new), "gpucert.io/uncertified")
        assert result.certify is not None
        _check_decisions_agree(kube, store, result.certify)
        assert datetime.now(UTC).date() == result.certify.day

        # Every change of those nights, the release and the onboarding, recorded twice: in the S3 store's
        # hash-chained trail, and as Events on the nodes.
        checked = AuditLog(store.open().objects).check()
        assert checked.ok, checked.problem
        mine = {(e["action"], e["object"]["name"]) for e in checked.entries}
        assert {("taint.add", names[2]), ("taint.lift", names[2]), ("taint.add", new)} <= mine
        actions = {e["action"] for e in checked.entries}
        assert {"job.create", "label", "condition", "baseline.write", "ticket.open", "ticket.resolve"} <= actions
        events = kube.list_objects("events.k8s.io/v1", "Event", namespace="default")
        assert {e["regarding"]["name"] for e in events if e.get("reason") == "TaintAdded"} >= {names[2], new}


def test_a_sharded_night_on_s3_and_jira_measures_every_node_and_tickets_the_fault(s3: str, jira: FakeJira) -> None:
    """operate over shards of 2 nodes (issue 17's path: each shard's files in S3, joined by the parent,
    judged once over the whole fleet) reaches the same end as a night in one piece: the faulty node
    tainted and ticketed in Jira, every other node certified, decisions.parquet agreeing with the nodes."""
    credentials = AwsCredentials(
        aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=REGION
    )
    store = BaselineStore(uri=f"s3://{BUCKET}/sharded", credentials=credentials, endpoint_url=s3)
    policy = CertificationPolicy(shard_size=2, ticketing=_ticketing(jira))
    with SimCluster(nodes=8, preconfigured=True, seed=5) as sim:
        names = sim.fleet.node_names
        kube = connect(sim.kubeconfig_path)
        clean = _night(sim, store, policy)
        assert clean.tainted == []
        sim.inject_fault(Fault("pcie_gen4", names[5], 1))
        night = _night(sim, store, policy)
        assert night.tainted == [names[5]]
        [issue] = _issues(jira, names[5])
        assert "gpucert-cause-pcie" in issue["fields"]["labels"]
        _check_decisions_agree(kube, store, night)

        run = CertificationRun(store.open(), night.run_id, night.day)
        shard_rows = [
            pd.read_parquet(io.BytesIO(run.store.read_run_file(run.run_id, run.day, f"shard{k}-results.parquet")))
            for k in range(4)
        ]
        assert [sorted(set(f["node"])) for f in shard_rows] == [names[k : k + 2] for k in range(0, 8, 2)]
        joined = run.results()
        own = joined[joined["metric"] != "nccl_pair_busbw_gbps"]  # the parent's links step adds the pairs
        assert len(own) == sum(len(f) for f in shard_rows)
        assert sorted(joined["node"].astype(str).unique()) == sorted(names)
