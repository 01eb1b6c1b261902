"""What ``explain --act`` does, by what the explanation found (issue 31), on a real API server (the simulated
cluster): hardware DCGM shows is cordoned and ticketed (``tests/test_never_certified.py``,
``tests/test_explain_e2e.py``); a silent straggler — named by the job's own timings, its telemetry showing no
cause — is only re-certified: no taint, no ticket, no state change on a guess; a transient or a hang earns no
action at all."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from gpucert.audit import AuditLog, AuditRecorder
from gpucert.explain import ActOutcome, act_on
from gpucert.explain._frames import Explanation, Suspect
from gpucert.kube import Kube, connect, has_taint
from gpucert.policy import default_policy
from gpucert.store import open_store
from gpucert.tickets import open_backend
from gpucert_sim import SimCluster

PREFIX = "gpucert.io"
UNHEALTHY = f"{PREFIX}/unhealthy"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=3, gpus=8, preconfigured=True, seed=31) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kube(sim: SimCluster) -> Kube:
    return connect(sim.kubeconfig_path)


def _explanation(verdict: str, suspect: Suspect) -> Explanation:
    now = pd.Timestamp(datetime.now(UTC))
    return Explanation(
        job="team/train",
        window=(now - pd.Timedelta(hours=1), now),
        verdict=verdict,
        suspects=(suspect,),
        step_change=None,
        events_of_note=(),
        answer=("", "", ""),
        recommendations=(),
        notes=(),
    )


def _silent(node: str) -> Explanation:
    """What the judgement says of issue 31's scene: rank 21's peers wait for it; its DCGM signals are in line."""
    return _explanation(
        "gpu",
        Suspect(
            node=node,
            gpu=5,
            gpu_uuid="GPU-5",
            layer="gpu",
            score=0.3,
            onset=pd.Timestamp(datetime.now(UTC)),
            evidence=(
                "NCCL: rank 21 (pod train-2) spends −32 % the time of its peers in each collective from 10:30:00: "
                "it arrives last, every other rank waits for it; 100 % of the instants since",
                "its telemetry shows no cause: every DCGM signal of it is in line with its peers'",
            ),
            silent=True,
        ),
    )


def _act(explanation: Explanation, kube: Kube, tmp_path: Path) -> tuple[ActOutcome, AuditRecorder, str]:
    store = (tmp_path / "store").as_uri()
    audit = AuditRecorder(AuditLog(open_store(store).objects), run_id="explain-31", trigger="test").watch(kube)
    done = act_on(
        explanation,
        kube,
        policy=default_policy(),
        tickets=open_backend(store),
        audit=audit,
        run_id="explain-31",
        now=datetime.now(UTC),
        prefix=PREFIX,
        gpu_node_selector=None,
    )
    return done, audit, store


def test_a_silent_straggler_is_re_certified_never_cordoned_or_ticketed(
    sim: SimCluster, kube: Kube, tmp_path: Path
) -> None:
    node = sim.fleet.node_names[0]
    kube.label_node(node, {f"{PREFIX}/state": "certified"})
    done, audit, store = _act(_silent(node), kube, tmp_path)
    assert (done.node, done.gpu, done.cordon, done.recertify) == (node, 5, "none", "due")  # idle: certify it now
    assert done.tickets == ()
    assert not has_taint(kube.get("v1", "Node", node), UNHEALTHY)
    assert kube.get("v1", "Node", node)["metadata"]["labels"][f"{PREFIX}/state"] == "certified"  # no guess
    assert open_backend(store).tickets() == []
    assert audit.entries == []
    assert done.lines()[0].startswith(f"no cordon, no ticket for {node} GPU 5: its telemetry shows no cause")
    assert done.lines()[1] == "re-certify: due"


def test_a_silent_straggler_still_running_the_job_is_left_for_the_next_certify(
    sim: SimCluster, kube: Kube, tmp_path: Path
) -> None:
    node = sim.fleet.node_names[1]
    kube.create(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "train-1", "namespace": "default"},
            "spec": {
                "nodeName": node,
                "containers": [
                    {
                        "name": "train",
                        "image": "ghcr.io/example/train:1",
                        "resources": {"limits": {"nvidia.com/gpu": "8"}},
                    }
                ],
            },
        }
    )
    done, _, store = _act(_silent(node), kube, tmp_path)
    assert done.recertify.startswith("busy: default/train-1 holds its GPUs")
    assert done.cordon == "none"
    assert not has_taint(kube.get("v1", "Node", node), UNHEALTHY)
    assert open_backend(store).tickets() == []


@pytest.mark.parametrize(
    ("verdict", "layer", "why"),
    [("transient", "transient", "the departure recovered (transient)"), ("hang", "hang", "the job is hung")],
)
def test_a_transient_or_a_hang_earns_no_action(
    sim: SimCluster, kube: Kube, tmp_path: Path, verdict: str, layer: str, why: str
) -> None:
    node = sim.fleet.node_names[2]
    suspect = Suspect(
        node=node,
        gpu=3 if layer == "transient" else None,
        gpu_uuid=None,
        layer=layer,
        score=0.5,
        onset=pd.Timestamp(datetime.now(UTC)),
        evidence=(
            "transient: departed 10:30:00–10:32:00 (2.0 min), then ran in line with its peers",
            "SM clock 1,200 MHz vs peers' 1,980 (−39 %) with HW thermal slowdown (0x40)",
        ),
    )
    done, audit, store = _act(_explanation(verdict, suspect), kube, tmp_path)
    assert done.node is None
    assert done.why.startswith(why)
    assert done.recertify == ""
    assert not has_taint(kube.get("v1", "Node", node), UNHEALTHY)
    assert open_backend(store).tickets() == []
    assert audit.entries == []
