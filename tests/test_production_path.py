"""The production path, end to end: an S3 store (SeaweedFS, a real S3 server), Jira (the REST v2 fake the
real ``jira`` client talks to), the simulated cluster, and the real flows under a Prefect server.

One fleet lives through nights of ``operate`` and the other entry points, and every one reaches the
same settled decision with the same policy and ticketing:

* a night with no ticketing configured records its tickets in the store and says so; the next night,
  with Jira configured in the ``CertificationPolicy`` block, opens them;
* each run's ``decisions.parquet`` in S3 agrees with the state label, the ``GpuCertified`` condition and
  the taint of every node;
* ``gpucert release`` on the S3 store records each repair on the Jira ticket; the fault coming back
  after 2 resets escalates the ticket to a replacement (docs/reference/causes-and-actions.md, "Escalation"),
  exactly as the local backend does; a release after the real repair resolves it (the Done transition);
* an onboarding whose node fails opens a ticket for it and keeps it out.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
import yaml
from prefect_aws import AwsCredentials

from gpucert.audit import AuditLog
from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.store import StoreLocation
from gpucert.blocks.ticketing import Ticketing
from gpucert.certify import CertificationRun, CertifyOutcome
from gpucert.cli import main
from gpucert.flows.onboard import idempotency_key, onboard
from gpucert.flows.operate import operate
from gpucert.flows.teamsetup import SetupReport, ensure_pools, pool_names, replace_automations
from gpucert.kube import Kube, condition, connect, has_taint
from gpucert_sim import SimCluster
from gpucert_sim.fleet import Fault

from .conftest import stop_process
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
        if os.environ.get("CI") == "true":
            pytest.fail(f"SeaweedFS could not start: {exc}")
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


def _store(endpoint: str) -> StoreLocation:
    credentials = AwsCredentials(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=REGION)
    return StoreLocation(uri=f"s3://{BUCKET}/fleet", credentials=credentials, endpoint_url=endpoint)


def _ticketing(fake: FakeJira) -> Ticketing:
    return Ticketing(backend="jira", server=fake.base, user=USER, token=TOKEN, project="OPS")


def _night(sim: SimCluster, store: StoreLocation, policy: CertificationPolicy) -> CertifyOutcome:
    night = asyncio.run(
        operate(
            cluster=GpuCluster(kubeconfig=str(sim.kubeconfig_path)),
            store=store,
            policy=policy,
            rotation_days=0.0,
            scrape_interval_s=1.0,
        )
    )
    assert night.certify is not None
    return night.certify


def _check_decisions_agree(kube: Kube, store: StoreLocation, outcome: CertifyOutcome) -> None:
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
    for name, value in (
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY),
        ("AWS_DEFAULT_REGION", REGION),
        ("AWS_ENDPOINT_URL_S3", endpoint),
    ):
        monkeypatch.setenv(name, value)
    return main(
        [
            "release",
            node,
            "--kubeconfig",
            str(sim.kubeconfig_path),
            "--store",
            f"s3://{BUCKET}/fleet",
            "--ticketing",
            "ops-jira",
            "--action",
            action,
        ]
    )


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
        assert recorded.ticket_line() == "ticketing not configured: 1 ticket recorded, none opened"
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
        result = asyncio.run(
            onboard(
                node=new,
                cluster=GpuCluster(kubeconfig=str(sim.kubeconfig_path)),
                store=store,
                policy=policy,
                ready_timeout_s=60,
            )
        )
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
    credentials = AwsCredentials(aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY, region_name=REGION)
    store = StoreLocation(uri=f"s3://{BUCKET}/sharded", credentials=credentials, endpoint_url=s3)
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


# --- a team's day one: `gpucert setup`, `prefect deploy --all` from a clone, a worker, REST and the CLI -------
#
# One module-scoped set of servers for all of it (the session's Prefect server, SeaweedFS, the Jira fake, a
# simulated cluster, a process worker started in a clone of the repository), as a new team would run them.

TEAM = "gpucert"  # the name prefect.yaml's deployments give every block
PREFECT = str(Path(sys.executable).with_name("prefect"))
GPUCERT = str(Path(sys.executable).with_name("gpucert"))
ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Team:
    sim: SimCluster
    env: dict[str, str]
    clone: Path
    api: str
    jira: FakeJira
    setup_out: str
    setup_s: float


def _clone(source: Path, target: Path) -> None:
    """The repository's files as a fresh checkout has them (tracked and new, not ignored: no venv, no store)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=source,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        path = source / name
        if path.is_symlink():  # gpucert/flows → ../flows and its siblings: links, as git checks them out
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            (target / name).symlink_to(path.readlink())
        elif path.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / name)


def _team_file(path: Path, sim: SimCluster, endpoint: str, jira: FakeJira) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "cluster": {"kubeconfig": str(sim.kubeconfig_path), "storage_claim": "datasets"},
                "store": {
                    "uri": f"s3://{BUCKET}/team",
                    "endpoint_url": endpoint,
                    "aws_access_key_id": ACCESS_KEY,
                    "aws_secret_access_key": SECRET_KEY,
                    "region_name": REGION,
                },
                "ticketing": {"backend": "jira", "server": jira.base, "user": USER, "token": TOKEN, "project": "OPS"},
            }
        )
    )
    return path


def _setup(team_file: Path, clone: Path, env: dict[str, str], *options: str) -> tuple[str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [GPUCERT, "setup", "--file", str(team_file), "--project", str(clone), *options],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout, time.monotonic() - started


@pytest.fixture(scope="module")
def team(prefect_harness: None, s3: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Team]:
    from prefect.settings import PREFECT_API_URL

    api = str(PREFECT_API_URL.value()).rstrip("/")
    fake = FakeJira(user=USER, token=TOKEN)
    clone = tmp_path_factory.mktemp("team") / "gpucert"
    _clone(ROOT, clone)
    # The worker knows only the Prefect server: no store, kubeconfig or S3 keys of its own to fall back on.
    env = {k: v for k, v in os.environ.items() if k not in ("GPUCERT_STORE", "KUBECONFIG") and not k.startswith("AWS_")}
    env.update(
        {
            "PREFECT_API_URL": api,
            "PREFECT_WORKER_QUERY_SECONDS": "1",
            "DO_NOT_TRACK": "1",
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "HOME": str(clone.parent),
        }
    )
    with AppThread(fake.app()) as http, SimCluster(nodes=4, preconfigured=True, seed=21) as sim:
        fake.base = http.url
        out, seconds = _setup(_team_file(clone.parent / "team.yaml", sim, s3, fake), clone, env)
        worker = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", "gpucert", "--type", "process", "--limit", "2"],
            env=env,
            cwd=clone,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            yield Team(sim=sim, env=env, clone=clone, api=api, jira=fake, setup_out=out, setup_s=seconds)
        finally:
            stop_process(worker)


def _deployment(api: str, flow: str, name: str | None = None) -> dict[str, Any]:
    answer = httpx.get(f"{api}/deployments/name/{flow}/{name or flow}", timeout=10)
    answer.raise_for_status()
    return dict(answer.json())


def _create_run(api: str, deployment: str, body: dict[str, Any]) -> httpx.Response:
    """POST create_flow_run (create_flow_run_from_deployment, as the UI and scripts start a run)."""
    for attempt in range(6):  # the session's SQLite server answers 503 now and then while the worker writes
        answer = httpx.post(f"{api}/deployments/{deployment}/create_flow_run", json=body, timeout=30)
        if answer.status_code < 500:
            break
        time.sleep(1 + attempt)
    return answer


def _start(api: str, flow: str, parameters: dict[str, Any]) -> str:
    """A flow run of ``flow``'s deployment with ``parameters`` over the deployment's."""
    answer = _create_run(api, _deployment(api, flow)["id"], {"parameters": parameters})
    assert answer.status_code in (200, 201), answer.text
    return str(answer.json()["id"])


def _finished(api: str, run_id: str, timeout_s: float = 300.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    run: dict[str, Any] = {}
    while time.monotonic() < deadline:
        answer = httpx.get(f"{api}/flow_runs/{run_id}", timeout=10)
        if answer.status_code >= 500:  # busy: ask again
            time.sleep(1)
            continue
        run = answer.json()
        if run["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return dict(run)
        time.sleep(1)
    pytest.fail(f"flow run {run_id} did not finish in {timeout_s} s: {run.get('state')}")


def _team_store() -> StoreLocation:
    loaded = StoreLocation.load(TEAM)
    assert isinstance(loaded, StoreLocation)
    return loaded


def _storage_rows(store: StoreLocation, run_id: str, day: Any) -> pd.DataFrame:
    results = CertificationRun(store.open(), run_id, day).results()
    return results[results["metric"] == "storage_read_gbps"]


def test_setup_saves_the_named_blocks_deploys_and_runs_again_unchanged(team: Team) -> None:
    """`gpucert setup` registered every block type, saved the blocks prefect.yaml names, created the pool,
    deployed and created the automations; run again, it leaves one of each."""
    assert "registered block types: GPU Cluster" in team.setup_out, team.setup_out
    cluster = GpuCluster.load(TEAM)
    assert isinstance(cluster, GpuCluster)
    assert cluster.storage_claim == "datasets"
    assert cluster.credentials is not None  # the kubeconfig's contents, saved: any worker reaches the cluster
    assert _team_store().uri == f"s3://{BUCKET}/team"
    policy = CertificationPolicy.load(TEAM)
    assert isinstance(policy, CertificationPolicy)
    assert policy.ticketing is not None
    assert policy.ticketing.backend == "jira"
    certify = _deployment(team.api, "certify")
    assert certify["parameters"] == {"cluster_block": TEAM, "store_block": TEAM, "policy_block": TEAM}
    # Deployed from the clone: the worker runs the flows there.
    assert str(team.clone) in json.dumps(certify["pull_steps"]), certify["pull_steps"]
    assert _deployment(team.api, "configure")["parameters"] == {"cluster_block": TEAM, "store_block": TEAM}

    def automations() -> list[str]:
        found = httpx.post(f"{team.api}/automations/filter", json={}, timeout=10).json()
        return sorted(a["name"] for a in found)

    before = automations()
    for name in ("gpucert-unresponsive-runs-crash", "gpucert-crashed-runs-come-back"):
        assert before.count(name) == 1, before
    # Again: the blocks overwritten in place, the pool kept, each automation replaced, not added. (The
    # deployments' own `prefect deploy --all` updates them; it is not run twice here, for the time.)
    out, seconds = _setup(team.clone.parent / "team.yaml", team.clone, team.env, "--no-deploy")
    assert f"saved StoreLocation {TEAM!r}: s3://{BUCKET}/team" in out
    again = SetupReport()
    asyncio.run(ensure_pools(pool_names(team.clone), again))
    asyncio.run(replace_automations(team.clone, again))
    assert again.lines == [
        "work pool 'gpucert': there already (process)",
        "automations: 2 from automations.yaml (2 of the same names replaced)",
    ]
    assert automations() == before
    print(f"gpucert setup: {team.setup_s:.1f} s the first time; again without deploying {seconds:.1f} s")


def test_every_deployment_is_registered_as_prefect_yaml_says(team: Team) -> None:
    for flow, name in [
        ("configure", "configure"),
        ("certify", "certify"),
        ("certify-shard", "certify-shard"),
        ("operate", "operate"),
        ("onboard-node", "onboard-node"),
        ("release", "release"),
        ("explain-job", "explain-job"),
    ]:
        assert _deployment(team.api, flow, name)["parameters"]["store_block"] == TEAM
    shard = _deployment(team.api, "certify-shard")
    assert shard["work_queue_name"] == "shards"
    assert shard["job_variables"]["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30"
    operate = _deployment(team.api, "operate")
    assert operate["schedules"][0]["schedule"]["timezone"] == "Europe/Amsterdam"
    limit = operate.get("global_concurrency_limit") or {}
    assert (operate.get("concurrency_limit") or limit.get("limit")) == 1, sorted(operate)
    # A wrong parameter type is refused at the door (enforce_parameter_schema).
    onboard = _deployment(team.api, "onboard-node")["id"]
    refused = _create_run(team.api, onboard, {"parameters": {"node": ["not", "a", "name"]}})
    assert refused.status_code == 409


def test_onboarding_through_the_rest_api_starts_one_run_that_admits_the_node(team: Team) -> None:
    """The provisioning call repeated three times with one idempotency key starts one run (issue 6's bar),
    which configures and certifies the new node with the team's blocks and lifts its taint."""
    [new] = team.sim.add_nodes(1, uncertified_taint="gpucert.io/uncertified")
    kube = connect(team.sim.kubeconfig_path)
    uid = kube.get("v1", "Node", new)["metadata"]["uid"]
    deployment = _deployment(team.api, "onboard-node")["id"]
    body = {"parameters": {"node": new, "uid": uid}, "idempotency_key": idempotency_key(new, uid)}
    ids = set()
    for _ in range(3):
        answer = _create_run(team.api, deployment, body)
        assert answer.status_code in (200, 201), answer.text
        ids.add(answer.json()["id"])
    [run_id] = ids
    assert _finished(team.api, run_id)["state"]["type"] == "COMPLETED"
    node = kube.get("v1", "Node", new)
    assert node["metadata"]["labels"]["gpucert.io/state"] == "certified"
    assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("gpucert.io/")]


def test_certify_over_rest_takes_the_blocks_and_the_cli_beside_it_measures_the_same(team: Team) -> None:
    """A certify started over REST with no parameter works on the saved blocks: S3 store, Jira, the
    GpuCluster's storage claim measured. A storage fault it catches is ticketed; the CLI naming the same
    blocks measures storage too, so its certify of that node keeps the taint and the ticket open."""
    store = _team_store()
    kube = connect(team.sim.kubeconfig_path)
    names = [str(n["metadata"]["name"]) for n in kube.nodes("nvidia.com/gpu.present=true")]
    seeded = _finished(team.api, _start(team.api, "certify", {}))
    assert seeded["state"]["type"] == "COMPLETED", seeded["state"]
    day = datetime.now(UTC).date()
    assert sorted(_storage_rows(store, seeded["name"], day)["node"].unique()) == sorted(names)

    slow = names[1]
    team.sim.inject_fault(Fault("slow_storage", slow, None))
    caught = _finished(team.api, _start(team.api, "certify", {}))
    assert caught["state"]["type"] == "COMPLETED", caught["state"]
    assert has_taint(kube.get("v1", "Node", slow), "gpucert.io/unhealthy")
    [issue] = _issues(team.jira, slow)
    assert issue["fields"]["status"]["name"] != "Done"

    cli = subprocess.run(
        [
            GPUCERT,
            "certify",
            "--cluster-block",
            TEAM,
            "--store-block",
            TEAM,
            "--policy-block",
            TEAM,
            "--node",
            slow,
            "--json",
        ],
        env=team.env,
        cwd=team.clone,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert cli.returncode == 0, cli.stderr
    outcome = CertifyOutcome.model_validate_json(cli.stdout)
    assert outcome.store == f"s3://{BUCKET}/team"
    assert outcome.ticketing == "jira"
    assert list(_storage_rows(store, outcome.run_id, outcome.day)["node"].unique()) == [slow]
    assert has_taint(kube.get("v1", "Node", slow), "gpucert.io/unhealthy")
    [issue] = _issues(team.jira, slow)
    assert issue["fields"]["status"]["name"] != "Done"
    assert not (team.clone / "gpucert-store").exists()


def test_a_node_joined_event_starts_an_onboarding_that_completes_with_the_blocks(team: Team) -> None:
    [new] = team.sim.add_nodes(1, uncertified_taint="gpucert.io/uncertified")
    watcher = subprocess.run(
        [GPUCERT, "watch-nodes", "--once", "--kubeconfig", str(team.sim.kubeconfig_path)],
        env=team.env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert watcher.returncode == 0, watcher.stderr
    deployment = _deployment(team.api, "onboard-node")["id"]
    deadline = time.monotonic() + 300
    runs: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        runs = [
            r
            for r in httpx.post(
                f"{team.api}/flow_runs/filter", timeout=10, json={"deployments": {"id": {"any_": [deployment]}}}
            ).json()
            if r["parameters"].get("node") == new
        ]
        if runs and runs[0]["state"]["type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            break
        time.sleep(2)
    assert [r["state"]["type"] for r in runs] == ["COMPLETED"], [r["state"] for r in runs]
    node = connect(team.sim.kubeconfig_path).get("v1", "Node", new)
    assert node["metadata"]["labels"]["gpucert.io/state"] == "certified"
    assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("gpucert.io/")]
    trail = AuditLog(_team_store().open().objects).check()  # configure and certify wrote to the team's S3 store
    assert {("label", new)} <= {(e["action"], e["object"]["name"]) for e in trail.entries}
    assert not (team.clone / "gpucert-store").exists()


def test_a_deployed_run_without_its_store_fails_at_once_naming_it(team: Team) -> None:
    unnamed = _start(team.api, "certify", {"store_block": None})
    unsaved = _start(team.api, "operate", {"store_block": "no-such-store"})
    for run_id, says in (
        (unnamed, "no store: a deployed run takes it from the store parameter or store_block"),
        (unsaved, "store_block 'no-such-store': no gpucert Baseline Store block"),
    ):
        run = _finished(team.api, run_id, timeout_s=120)
        assert run["state"]["type"] == "FAILED", run["state"]
        assert says in run["state"]["message"], run["state"]["message"]
    assert not (team.clone / "gpucert-store").exists()
