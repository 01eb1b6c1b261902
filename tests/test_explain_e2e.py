"""``gpucert explain`` end to end: the simulated cluster runs training jobs, the real Prometheus holds their
history, the answer is judged from what gpucert reads back over HTTP.

Three jobs run at once in one simulated cluster (``sim/gpucert_sim/_training.py``), each begun 90 minutes ago
(``sim.gpucert.io/training-start``, how the simulator compresses time): a 16-node job one of whose GPUs
throttles thermally from minute 45, a 4-node job whose input pipeline slows from minute 45 with healthy
GPUs, and a 4-node job one of whose pods is evicted at minute 45. Their 90 minutes of 15 s telemetry, step
times and NCCL metrics (``SimCluster.training_history``) go through ``promtool tsdb create-blocks-from
openmetrics`` into a Prometheus started on them (the helpers of ``tests/test_telemetry_prometheus.py``), so
gathering runs its real range queries. The pods, their nodes and their events are read from the simulated
API server with the official client.

``--act`` runs the explain-job flow under the Prefect test harness: the suspect node gets gpucert's taint,
a ticket opens in the default file backend (a ``file://`` store), both in the audit trail; the same action
code with the Jira backend opens the issue in the fake Jira of ``tests/fakejira.py``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from kubernetes import client
from pydantic import SecretStr

from gpucert.audit import AuditLog, AuditRecorder
from gpucert.cli import main
from gpucert.explain import ExplainOutcome, JobExplanation, act_on, explain_job, resolve_target
from gpucert.kube import Kube, has_taint
from gpucert.policy import default_policy
from gpucert.store import open_store
from gpucert.telemetry import PrometheusSource
from gpucert.tickets import JiraTickets, open_backend
from gpucert_sim import SimCluster

from .conftest import eventually
from .fakejira import AppThread, FakeJira
from .test_telemetry_prometheus import IDLE_CONFIG, PromBins, prom_bins, running_prometheus  # noqa: F401

STEP_S = 15
MINUTES = 90
ONSET_MINUTE = 45
NODES = 26  # 16 + 4 + 4 training nodes, and room for the evicted pod's replacement
JIRA_USER, JIRA_TOKEN = "gpucert-bot@example.com", "jira-token-e2e"


@dataclass(frozen=True)
class World:
    sim: SimCluster
    kube: Kube
    prometheus: str
    start: datetime
    end: datetime
    #: job → (node, gpu) of its fault, or the node of the evicted pod (gpu None).
    faults: dict[str, tuple[str, int | None]]


def training_job(name: str, pods: int, start: datetime) -> dict[str, Any]:
    annotations = {
        "sim.gpucert.io/training": "true",
        "sim.gpucert.io/training-start": start.isoformat(),
        "sim.gpucert.io/step-seconds": "1.0",
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "parallelism": pods,
            "completions": pods,
            "backoffLimit": 4,
            "template": {
                "metadata": {"annotations": annotations, "labels": {"app": name}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [
                        {
                            "name": "train",
                            "image": "ghcr.io/example/train:1",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}},
                        }
                    ],
                },
            },
        },
    }


def job_nodes(core: client.CoreV1Api, ns: str, name: str, count: int) -> list[str]:
    def probe() -> list[str] | None:
        pods = core.list_namespaced_pod(ns, label_selector=f"job-name={name}").items
        nodes = sorted(p.spec.node_name for p in pods if p.spec.node_name and p.status.phase == "Running")
        return nodes if len(nodes) == count else None

    return eventually(probe, timeout_s=20)


@pytest.fixture(scope="module")
def world(prom_bins: PromBins, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:  # noqa: F811
    end = datetime.fromtimestamp((int(datetime.now(UTC).timestamp()) - 600) // 60 * 60, UTC)
    start = end - timedelta(minutes=MINUTES)
    work = tmp_path_factory.mktemp("explain-prom")
    with SimCluster(nodes=NODES, gpus=8, preconfigured=True, seed=15) as sim:
        api = sim.api_client()
        core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
        for ns in ("thermal", "input", "evict"):
            core.create_namespace({"metadata": {"name": ns}})
        batch.create_namespaced_job("thermal", training_job("pretrain", 16, start))
        batch.create_namespaced_job("input", training_job("finetune", 4, start))
        batch.create_namespaced_job("evict", training_job("sft", 4, start))
        hot = job_nodes(core, "thermal", "pretrain", 16)[5]
        evicted = job_nodes(core, "evict", "sft", 4)[1]
        job_nodes(core, "input", "finetune", 4)
        sim.inject(
            {
                "training": [
                    {
                        "kind": "gpu_throttle",
                        "job": "thermal/pretrain",
                        "node": hot,
                        "gpu": 5,
                        "from_minute": ONSET_MINUTE,
                        "params": {"clock_frac": 0.5},
                    },
                    {
                        "kind": "slow_input",
                        "job": "input/finetune",
                        "from_minute": ONSET_MINUTE,
                        "params": {"factor": 1.6},
                    },
                    {"kind": "evict", "job": "evict/sft", "node": evicted, "at_minute": ONSET_MINUTE},
                ]
            }
        )

        # The evicted pod's replacement is the Job controller's, in real time: wait for it before the history.
        def replaced() -> bool:
            pods = core.list_namespaced_pod("evict", label_selector="job-name=sft").items
            phases = sorted((p.status.phase, p.status.reason or "") for p in pods)
            return phases == [("Failed", "Evicted"), *[("Running", "")] * 4]

        eventually(replaced, timeout_s=20)
        for i, job in enumerate(("thermal/pretrain", "input/finetune", "evict/sft")):
            (work / f"job{i}.om").write_text(sim.training_history(job, start, end, step_s=STEP_S), encoding="utf-8")
            made = subprocess.run(
                [str(prom_bins.promtool), "tsdb", "create-blocks-from", "openmetrics", f"job{i}.om", "data"],
                cwd=work,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
            assert made.returncode == 0, made.stderr
        with running_prometheus(prom_bins, work, IDLE_CONFIG) as url:
            yield World(
                sim=sim,
                kube=Kube(api),
                prometheus=url,
                start=start,
                end=end,
                faults={"thermal/pretrain": (hot, 5), "evict/sft": (evicted, None)},
            )


def explained(world: World, job: str, **kwargs: Any) -> JobExplanation:
    return explain_job(
        world.kube, PrometheusSource(world.prometheus), job, since=world.start, until=world.end, **kwargs
    )


@pytest.fixture(scope="module")
def thermal(world: World) -> JobExplanation:
    return explained(world, "thermal/pretrain")


def test_a_throttling_gpu_is_named_first_with_its_onset_and_the_step_time_change(
    world: World, thermal: JobExplanation
) -> None:
    node, gpu = world.faults["thermal/pretrain"]
    e = thermal.explanation
    assert e.verdict == "gpu"
    first = e.suspects[0]
    assert (first.node, first.gpu) == (node, gpu)
    onset = pd.Timestamp(world.start + timedelta(minutes=ONSET_MINUTE))
    assert first.onset is not None
    assert abs((first.onset - onset).total_seconds()) <= STEP_S
    assert e.step_change is not None
    assert e.step_change.change_pct > 20
    assert abs((e.step_change.at - onset).total_seconds()) <= 4 * STEP_S
    assert node in e.answer[0]
    assert f"GPU {gpu}" in " ".join(e.answer)
    # What was gathered: the job's 128 GPUs only, at the scrape step, each sample given to its pod.
    tel = thermal.gathered.telemetry
    assert thermal.gathered.step_s == STEP_S
    assert tel.groupby(["node", "gpu"], observed=True).ngroups == 128
    assert tel["pod"].notna().all()
    assert set(tel["node"].astype(str)) == set(thermal.target.nodes)
    assert len(thermal.gathered.steps) > 0
    # NCCL Inspector's real labels (hostname = the pod, GPU<n> = its n-th GPU, rank): every rank tied to its GPU.
    coll = thermal.gathered.collectives
    assert coll.groupby(["node", "gpu"], observed=True).ngroups == 128
    assert coll["rank"].notna().all()
    assert not [n for n in thermal.explanation.notes if n.startswith("NCCL series")]
    assert "<html" in thermal.html.lower()
    # Without --since the window is the job's lifetime: its pods report the (compressed) start.
    assert resolve_target(world.kube, "thermal/pretrain").window[0] == pd.Timestamp(world.start)


def test_a_slow_input_pipeline_with_healthy_gpus_blames_no_gpu(world: World) -> None:
    e = explained(world, "input/finetune").explanation
    assert e.verdict == "elsewhere", (e.answer, e.suspects)
    assert not [s for s in e.suspects if s.layer in ("gpu", "nvlink")]
    assert e.step_change is not None
    assert e.step_change.change_pct > 20


def test_an_evicted_pod_is_named_as_the_event(world: World) -> None:
    node, _ = world.faults["evict/sft"]
    done = explained(world, "evict/sft")
    e = done.explanation
    events = done.gathered.events
    evicted = events[events["reason"] == "Evicted"]
    assert len(evicted) >= 1
    assert set(evicted["node"]) == {node}
    assert e.verdict == "event", (e.answer, e.suspects)
    assert any("Evicted" in line for line in (*e.events_of_note, *e.answer))


# --- the command line -----------------------------------------------------------------------------------


def test_the_cli_prints_the_answer_and_writes_the_timeline(
    world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "t.html"
    code = main(
        [
            "explain",
            "thermal/pretrain",
            "--prometheus",
            world.prometheus,
            "--kubeconfig",
            str(world.sim.kubeconfig_path),
            "--since",
            world.start.isoformat(),
            "--until",
            world.end.isoformat(),
            "--out",
            str(out),
            "--json",
        ]
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err
    outcome = ExplainOutcome.model_validate_json(printed.out)
    node, gpu = world.faults["thermal/pretrain"]
    assert (outcome.suspects[0].node, outcome.suspects[0].gpu) == (node, gpu)
    assert outcome.timeline == str(out)
    assert "<html" in out.read_text().lower()
    assert not has_taint(world.kube.get("v1", "Node", node), "gpucert.io/unhealthy")  # never on its own


def test_the_cli_takes_the_label_mapping(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The simulated exporters label as a plain scrape keeps dcgm-exporter's labels: ``--labels plain`` (and the
    node's label, told) reads the same answer as detection."""
    code = main(
        [
            "explain",
            "thermal/pretrain",
            "--prometheus",
            world.prometheus,
            "--kubeconfig",
            str(world.sim.kubeconfig_path),
            "--since",
            world.start.isoformat(),
            "--until",
            world.end.isoformat(),
            "--out",
            str(tmp_path / "t.html"),
            "--labels",
            "plain,node=hostname",
            "--json",
        ]
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err
    outcome = ExplainOutcome.model_validate_json(printed.out)
    assert (outcome.suspects[0].node, outcome.suspects[0].gpu) == world.faults["thermal/pretrain"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["ghost/none"], "unknown job ghost/none"),
        (["thermal"], "write NAMESPACE/NAME"),
        (["thermal/pretrain", "--since", "yesterday"], "--since 'yesterday'"),
        (["thermal/pretrain", "--since", "1h", "--until", "2h"], "is empty"),
        (["thermal/pretrain", "--prometheus", "http://127.0.0.1:9"], "--prometheus http://127.0.0.1:9"),
        (["thermal/pretrain", "--out", "timeline.txt"], "write an .html file"),
        # Issue 31: a window with no data in it is judged by nobody: one line, exit 2 (not "elsewhere", exit 0).
        (["thermal/pretrain", "--since", "20h", "--until", "19h"], "explain thermal/pretrain: nothing to judge from"),
        (["thermal/pretrain", "--prometheus-user", "gpucert"], "--prometheus-user needs a password"),
        (["thermal/pretrain", "--labels", "pod=workload_pod"], "--labels 'pod=workload_pod': give pod=LABEL and"),
    ],
)
def test_bad_input_exits_2_with_one_line(
    world: World, args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["--kubeconfig", str(world.sim.kubeconfig_path)]
    if "--prometheus" not in args:
        base += ["--prometheus", world.prometheus]
    if "--out" not in args:
        base += ["--out", str(tmp_path / "x.html")]
    code = main(["explain", *args, *base])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1, err


def test_a_job_without_pods_exits_2(world: World, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    batch = client.BatchV1Api(world.sim.api_client())
    job = training_job("paused", 1, world.start)
    job["spec"]["suspend"] = True
    batch.create_namespaced_job("thermal", job)
    code = main(
        ["explain", "thermal/paused", "--prometheus", world.prometheus, "--kubeconfig", str(world.sim.kubeconfig_path)]
    )
    assert code == 2
    assert "has no pods" in capsys.readouterr().err


@pytest.mark.usefixtures("prefect_harness")
def test_the_deployed_flow_fails_a_window_with_no_data_with_the_clis_line(world: World, tmp_path: Path) -> None:
    """The explain-job flow is the deployed way in: a window with nothing in it fails its run with the line the
    CLI exits 2 with, never a Completed run whose verdict is ``no-data``."""
    import asyncio

    from gpucert import _flowcli
    from gpucert.errors import InputError
    from gpucert.flows.explain import explain_job as explain_flow

    inputs = _flowcli.flow_inputs(
        kubeconfig=str(world.sim.kubeconfig_path),
        context=None,
        label_prefix="gpucert.io",
        selector="nvidia.com/gpu.present=true",
        store=(tmp_path / "store").as_uri(),
    )
    state = asyncio.run(
        explain_flow(
            job="thermal/pretrain",
            since="20h",
            until="19h",
            prometheus=_flowcli._prometheus(world.prometheus),
            cluster=inputs.cluster,
            store=inputs.store,
            return_state=True,
        )
    )
    assert state.is_failed(), state
    with pytest.raises(InputError, match=r"^explain thermal/pretrain: nothing to judge from .* UTC: "):
        state.result()


# --- --act: through certify's code, audited ---------------------------------------------------------------


@pytest.mark.usefixtures("prefect_harness")
def test_act_cordons_the_suspect_and_tickets_it_locally_and_in_jira(
    world: World, thermal: JobExplanation, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node, gpu = world.faults["thermal/pretrain"]
    store = tmp_path / "store"
    code = main(
        [
            "explain",
            "thermal/pretrain",
            "--act",
            "--prometheus",
            world.prometheus,
            "--kubeconfig",
            str(world.sim.kubeconfig_path),
            "--since",
            world.start.isoformat(),
            "--until",
            world.end.isoformat(),
            "--store",
            store.as_uri(),
            "--out",
            str(tmp_path / "t.html"),
        ]
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err
    taints = world.kube.get("v1", "Node", node)["spec"]["taints"]
    assert {"key": "gpucert.io/unhealthy", "value": "thermal", "effect": "NoSchedule"} in taints
    [ticket] = open_backend(store.as_uri()).tickets(state="open")
    assert (ticket.node, ticket.gpu, ticket.cause) == (node, gpu, "thermal")
    assert "thermal/pretrain" in ticket.reasons
    assert "busy" in printed.out  # the job still holds the node: re-certified by the next certify
    actions = [e["action"] for e in AuditLog(open_store(store.as_uri()).objects).history(node=node)]
    assert "taint.add" in actions
    assert "ticket.open" in actions

    # The same action code with Jira as the backend (the flow's task calls it; certify opens its tickets
    # through the same backend): the node is tainted already, so the cordon is kept; the issue opens in Jira.
    fake = FakeJira(user=JIRA_USER, token=JIRA_TOKEN)
    with AppThread(fake.app()) as http:
        jira = JiraTickets(http.url, JIRA_USER, SecretStr(JIRA_TOKEN), "OPS")
        audit_store = open_store((tmp_path / "store2").as_uri())
        audit = AuditRecorder(AuditLog(audit_store.objects), run_id="explain-jira", trigger="test").watch(world.kube)
        done = act_on(
            thermal.explanation,
            world.kube,
            policy=default_policy(),
            tickets=jira,
            audit=audit,
            run_id="explain-jira",
            now=datetime.now(UTC),
            evidence_link="file:///timeline.html",
        )
    assert (done.node, done.gpu, done.cordon) == (node, gpu, "kept")
    [key] = done.tickets
    issue = fake.issues[key]["fields"]
    assert node in issue["summary"]
    assert "thermal" in issue["summary"]
    assert "thermal/pretrain" in issue["description"]
    assert [e["action"] for e in audit.entries] == ["ticket.open"]
