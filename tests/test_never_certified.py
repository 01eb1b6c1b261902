"""A node gpucert has not certified says so: the ``GpuCertified`` condition ``Unknown`` from the moment it is
admitted (the join watcher announces it, configure takes it on), never overwriting a decision; and a node
``explain --act`` cordons stops saying ``certified``: its state label becomes ``uncertified``."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from gpucert.audit import AuditLog, AuditRecorder
from gpucert.explain import act_on
from gpucert.explain._frames import Explanation, Suspect
from gpucert.kube import Kube, announce_joined_nodes, condition, connect
from gpucert.policy import default_policy
from gpucert.stack import label_nodes
from gpucert.store import open_store
from gpucert_sim import SimCluster

PREFIX = "gpucert.io"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=3, seed=8) as cluster:  # not configured: its nodes have no condition yet
        yield cluster


@pytest.fixture(scope="module")
def kube(sim: SimCluster) -> Kube:
    return connect(sim.kubeconfig_path)


def _certified(kube: Kube, node: str) -> dict[str, str] | None:
    found = condition(kube.get("v1", "Node", node), "GpuCertified")
    return {k: str(found[k]) for k in ("status", "reason")} if found is not None else None


def test_a_joining_node_is_announced_with_an_unknown_condition(sim: SimCluster, kube: Kube) -> None:
    [new] = sim.add_nodes(1, uncertified_taint=f"{PREFIX}/uncertified")
    assert _certified(kube, new) is None
    announced: list[str] = []
    announce_joined_nodes(kube, prefix=PREFIX, selector=None, emit=lambda n, u: announced.append(n), follow=False)
    assert announced == [new]
    assert _certified(kube, new) == {"status": "Unknown", "reason": "NotCertified"}


def test_configure_gives_its_nodes_an_unknown_condition_and_keeps_a_decision(sim: SimCluster, kube: Kube) -> None:
    decided, fresh = sim.fleet.node_names[0], sim.fleet.node_names[1]
    kube.patch_status(
        "v1",
        "Node",
        decided,
        {
            "status": {
                "conditions": [
                    {
                        "type": "GpuCertified",
                        "status": "True",
                        "reason": "Certified",
                        "message": "all passed",
                        "lastHeartbeatTime": "2026-12-01T00:00:00Z",
                        "lastTransitionTime": "2026-12-01T00:00:00Z",
                    }
                ]
            }
        },
    )
    assert _certified(kube, fresh) is None
    label_nodes(kube, {decided: {f"{PREFIX}/stack": "managed"}, fresh: {f"{PREFIX}/stack": "managed"}})
    assert _certified(kube, fresh) == {"status": "Unknown", "reason": "NotCertified"}
    assert _certified(kube, decided) == {"status": "True", "reason": "Certified"}  # a decision is never overwritten


def _explanation(node: str) -> Explanation:
    now = pd.Timestamp(datetime.now(UTC))
    suspect = Suspect(
        node=node,
        gpu=3,
        gpu_uuid=None,
        layer="gpu",
        score=9.0,
        onset=now,
        evidence=("GPU 3 ran 18 % slower than its peers, thermal violation 41 %",),
    )
    return Explanation(
        job="team/train",
        window=(now, now),
        verdict="gpu",
        suspects=(suspect,),
        step_change=None,
        events_of_note=(),
        answer=("", "", ""),
        recommendations=(),
        notes=(),
    )


def test_explain_act_labels_the_node_it_cordons_uncertified(sim: SimCluster, kube: Kube, tmp_path: Path) -> None:
    node = sim.fleet.node_names[2]
    kube.label_node(node, {f"{PREFIX}/state": "certified"})
    audit = AuditRecorder(AuditLog(open_store(tmp_path.as_uri()).objects), run_id="explain-1", trigger="test").watch(
        kube
    )
    done = act_on(
        _explanation(node),
        kube,
        policy=default_policy(),
        tickets=None,
        audit=audit,
        run_id="explain-1",
        now=datetime.now(UTC),
    )
    assert done.cordon == "added"
    labels = kube.get("v1", "Node", node)["metadata"]["labels"]
    assert labels[f"{PREFIX}/state"] == "uncertified"  # a tainted node no longer reads "certified"
    assert _certified(kube, node) == {"status": "Unknown", "reason": "Suspected"}
    again = act_on(
        _explanation(node),
        kube,
        policy=default_policy(),
        tickets=None,
        audit=audit,
        run_id="explain-2",
        now=datetime.now(UTC),
    )
    assert again.cordon == "kept"
    assert kube.get("v1", "Node", node)["metadata"]["labels"][f"{PREFIX}/state"] == "uncertified"
