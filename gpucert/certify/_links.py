"""A run's links: the pairing plan it measures by, stored with it so that whoever judges the run again — a
re-run's cohort, ``gpucert compare``, a certificate's replay — judges the links by the same plan.

certify measures each node alone first, then — when the policy's ``network.pairs`` is on — its links: rounds
of two-node all-reduce Jobs (:func:`run_pair_round`) chosen by the nodes' topology labels (:func:`link_plan`),
then re-pairings of what nothing explains yet. The plan is stored with the run (``links-nodes.parquet``,
``links-pairs.parquet``); the pair rows join the run's ``results.parquet`` and are judged by
:func:`gpucert.certify.verdicts_with_links`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from ..network import PairingPlan, plan_rounds, stored_plan
from ..policy import Policy
from ._run import CertificationRun

LINK_NODES = "links-nodes.parquet"
LINK_PAIRS = "links-pairs.parquet"


def link_seed(run_id: str) -> int:
    """The plan's seed for ``run_id``: the same run plans the same pairs when started again, and each night
    draws other partners (so over nights every pair of leaves is crossed)."""
    return int(hashlib.sha256(run_id.encode()).hexdigest()[:8], 16)


def link_plan(
    node_objects: Sequence[Mapping[str, Any]], nodes: Sequence[str], *, policy: Policy, run_id: str
) -> PairingPlan:
    """The pairing plan of ``nodes`` (those of ``node_objects``, Kubernetes Node objects, that are named),
    by the leaf and zone labels the policy names (``network``)."""
    wanted = set(nodes)
    labels = (policy.network.leaf_label, policy.network.zone_label)
    rows = [
        {
            "node": obj["metadata"]["name"],
            **{key: ((obj["metadata"].get("labels") or {}).get(key) or "") for key in labels},
        }
        for obj in node_objects
        if obj["metadata"]["name"] in wanted
    ]
    table = pd.DataFrame(rows, columns=["node", *labels])
    return plan_rounds(
        table, leaf_label=labels[0], zone_label=labels[1], partners=policy.network.partners, seed=link_seed(run_id)
    )


def plan_of(nodes: pd.DataFrame, pairs: pd.DataFrame, policy: Policy) -> PairingPlan:
    """The plan stored with a run (its ``links-*.parquet`` tables)."""
    return stored_plan(
        nodes,
        pairs,
        leaf_label=policy.network.leaf_label,
        zone_label=policy.network.zone_label,
        partners=policy.network.partners,
    )


def store_plan(run: CertificationRun, plan: PairingPlan) -> None:
    """Keep ``plan`` with ``run`` (``links-nodes.parquet``, ``links-pairs.parquet``)."""
    nodes, pairs = plan.frames()
    run.write_table(LINK_NODES, nodes)
    run.write_table(LINK_PAIRS, pairs)


def stored_plan_of(run: CertificationRun, policy: Policy) -> PairingPlan | None:
    """The plan ``run`` measured its links by, None when it measured none."""
    if not run.has(LINK_PAIRS):
        return None
    return plan_of(run.table(LINK_NODES), run.table(LINK_PAIRS), policy)
