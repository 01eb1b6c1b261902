"""The deployments of prefect.yaml against a real Prefect server, run by a real process worker: the
onboarding REST call repeated three times with one idempotency key starts one run, which configures and
certifies the new simulated node and lifts its taint (issue 6's bar); a wrong parameter type is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from flows.onboard import idempotency_key
from gpucert.kube import connect
from gpucert.sim import SimCluster

from .conftest import stop_process

pytestmark = pytest.mark.usefixtures("prefect_harness")
ROOT = Path(__file__).resolve().parent.parent
PREFECT = str(Path(sys.executable).with_name("prefect"))


@pytest.fixture(scope="module")
def api_url() -> str:
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    assert url, "the Prefect test harness sets PREFECT_API_URL"
    return str(url).rstrip("/")


@pytest.fixture(scope="module")
def deployed(
    api_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[SimCluster, dict[str, str]]]:
    store = tmp_path_factory.mktemp("store")
    with SimCluster(nodes=3, preconfigured=True, seed=9) as sim:
        env = {**os.environ, "PREFECT_API_URL": api_url, "KUBECONFIG": str(sim.kubeconfig_path),
               "GPUCERT_STORE": f"file://{store}", "PREFECT_WORKER_QUERY_SECONDS": "1",
               "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}  # fmt: skip
        subprocess.run([PREFECT, "--no-prompt", "work-pool", "create", "gpucert", "--type", "process",
                        "--overwrite"], env=env, cwd=ROOT, check=True, capture_output=True)  # fmt: skip
        deploy = subprocess.run([PREFECT, "--no-prompt", "deploy", "--all"], env=env, cwd=ROOT,
                                capture_output=True, text=True, check=False)  # fmt: skip
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        worker = subprocess.Popen(
            [PREFECT, "worker", "start", "--pool", "gpucert", "--type", "process", "--limit", "2"],
            env=env,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            yield sim, env
        finally:
            stop_process(worker)


def _deployment_id(api_url: str, flow: str, name: str) -> str:
    answer = httpx.get(f"{api_url}/deployments/name/{flow}/{name}", timeout=10)
    answer.raise_for_status()
    return str(answer.json()["id"])


def _create_run(api_url: str, deployment: str, body: dict[str, object]) -> str:
    answer = httpx.post(f"{api_url}/deployments/{deployment}/create_flow_run", json=body, timeout=10)
    assert answer.status_code in (200, 201), f"{answer.status_code}: {answer.text}"
    return str(answer.json()["id"])


def test_every_deployment_is_registered(api_url: str, deployed: tuple[SimCluster, dict[str, str]]) -> None:
    for flow, name in [("configure", "configure"), ("certify", "certify"), ("certify-shard", "certify-shard"),
                       ("operate", "operate"), ("onboard-node", "onboard-node"), ("release", "release"),
                       ("explain-job", "explain-job")]:  # fmt: skip
        assert _deployment_id(api_url, flow, name)
    shard = httpx.get(f"{api_url}/deployments/{_deployment_id(api_url, 'certify-shard', 'certify-shard')}",
                      timeout=10).json()  # fmt: skip
    assert shard["work_queue_name"] == "shards"
    assert shard["job_variables"]["env"]["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30"
    operate = httpx.get(
        f"{api_url}/deployments/{_deployment_id(api_url, 'operate', 'operate')}", timeout=10
    ).json()
    assert operate["schedules"][0]["schedule"]["timezone"] == "Europe/Amsterdam"
    limit = operate.get("global_concurrency_limit") or {}
    assert (operate.get("concurrency_limit") or limit.get("limit")) == 1, sorted(operate)


def test_onboarding_through_the_rest_api_starts_one_run_that_admits_the_node(
    api_url: str, deployed: tuple[SimCluster, dict[str, str]]
) -> None:
    sim, _ = deployed
    [new] = sim.add_nodes(1, uncertified_taint="gpucert.io/uncertified")
    kube = connect(sim.kubeconfig_path)
    uid = kube.get("v1", "Node", new)["metadata"]["uid"]
    deployment = _deployment_id(api_url, "onboard-node", "onboard-node")
    body = {"parameters": {"node": new, "uid": uid}, "idempotency_key": idempotency_key(new, uid)}
    ids = {_create_run(api_url, deployment, body) for _ in range(3)}
    assert len(ids) == 1
    [run_id] = ids
    deadline = time.monotonic() + 240
    state = None
    while time.monotonic() < deadline:
        state = httpx.get(f"{api_url}/flow_runs/{run_id}", timeout=10).json()["state"]["type"]
        if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            break
        time.sleep(1)
    assert state == "COMPLETED"
    node = kube.get("v1", "Node", new)
    assert node["metadata"]["labels"]["gpucert.io/state"] == "certified"
    assert not [t for t in node["spec"].get("taints") or [] if t["key"].startswith("gpucert.io/")]
    runs = httpx.post(f"{api_url}/flow_runs/filter", json={"deployments": {"id": {"any_": [deployment]}}},
                      timeout=10).json()  # fmt: skip
    assert len(runs) == 1


def test_a_bad_parameter_type_is_refused(api_url: str, deployed: tuple[SimCluster, dict[str, str]]) -> None:
    deployment = _deployment_id(api_url, "onboard-node", "onboard-node")
    answer = httpx.post(f"{api_url}/deployments/{deployment}/create_flow_run",
                        json={"parameters": {"node": ["not", "a", "name"]}}, timeout=10)  # fmt: skip
    assert answer.status_code == 409


def test_a_node_joined_event_starts_an_onboarding_run(
    api_url: str, deployed: tuple[SimCluster, dict[str, str]]
) -> None:
    """``gpucert watch-nodes`` reports the join as a gpucert.node.joined event; the deployment's trigger
    (prefect.yaml) starts onboard-node for it, which admits the node."""
    sim, env = deployed
    [new] = sim.add_nodes(1, uncertified_taint="gpucert.io/uncertified")
    watcher = subprocess.run(
        [str(Path(sys.executable).with_name("gpucert")), "watch-nodes", "--once",
         "--kubeconfig", str(sim.kubeconfig_path)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert watcher.returncode == 0, watcher.stderr
    assert f"gpucert.node.joined {new}" in watcher.stdout
    kube = connect(sim.kubeconfig_path)
    deployment = _deployment_id(api_url, "onboard-node", "onboard-node")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        node = kube.get("v1", "Node", new)
        admitted = node["metadata"].get("labels", {}).get("gpucert.io/state") == "certified" and not [
            t for t in node["spec"].get("taints") or [] if t["key"].startswith("gpucert.io/")
        ]
        # The event started one run for the node, which ends completed (and leaves the worker idle, so
        # the module's teardown need not wait for a run still finishing).
        runs = [r for r in httpx.post(f"{api_url}/flow_runs/filter", timeout=10,
                                      json={"deployments": {"id": {"any_": [deployment]}}}).json()
                if r["parameters"].get("node") == new]  # fmt: skip
        states = [r["state"]["type"] for r in runs]
        assert len(runs) <= 1, f"the event started {len(runs)} runs for {new}: {states}"
        assert not set(states) & {"FAILED", "CRASHED", "CANCELLED"}, states
        if admitted and states == ["COMPLETED"]:
            return
        time.sleep(2)
    pytest.fail(f"{new} was not onboarded after its gpucert.node.joined event (its runs: {states})")
