"""A run's links: the pairing plan it measures by, stored with it, and its pair results judged by that plan.

certify measures each node alone first (its GPUs, NVLink, host), then — when the policy's
``network.pairs`` is on — its links: rounds of two-node all-reduce Jobs (:func:`run_pair_round`) chosen
by the nodes' topology labels (:func:`link_plan`), then re-pairings of what nothing explains yet. The
plan is stored with the run (``links-nodes.parquet``, ``links-pairs.parquet``) and the pair rows join
the run's ``results.parquet``, so whoever judges the run again — a re-run's cohort, ``gpucert compare``,
a certificate's re-judgement — judges the links by the same plan.

Pair rows are judged by :func:`gpucert.network.judge_pairs`, never by the per-entity rules of
:func:`gpucert.verdict.judge`: a pair is two nodes, and which of them (or the link between) is at fault
is what the plan's other pairs tell (:func:`judge_with_links`). Each pair row's reference is its node's
own link baseline (:func:`gpucert.network.pair_references`), which the baseline keeps like a GPU's: the
``node``-level ``nccl_pair_busbw_gbps`` entry, seeded from the node's first passing runs, then held.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..network import (
    NIC_ADVICE,
    PAIR_METRIC,
    PairingPlan,
    PairJudgement,
    PairThresholds,
    judge_pairs,
    link_verdicts,
    measured_plan,
    pair_references,
    plan_rounds,
    stored_plan,
)
from ..policy import Policy
from ..verdict import judge, with_layer
from ._run import CertificationRun

__all__ = [
    "LINK_NODES",
    "LINK_PAIRS",
    "judge_links",
    "judge_with_links",
    "link_plan",
    "link_seed",
    "plan_of",
    "store_plan",
    "stored_plan_of",
]

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


def judge_links(pair_rows: pd.DataFrame, plan: PairingPlan, baseline: pd.DataFrame, policy: Policy) -> PairJudgement:
    """``pair_rows`` (results rows of ``nccl_pair_busbw_gbps``) judged by ``plan``, each against its node's
    own link baseline where it has one, else against the run's healthy pairs."""
    rows = pd.DataFrame(
        {
            "node": pair_rows["node"].astype(str).to_numpy(),
            "peer": pair_rows["peer"].astype(str).to_numpy(),
            "value": pair_rows["value"].to_numpy(dtype=float),
            "repeat": pair_rows["repeat"].to_numpy(),
            "run_id": pair_rows["run_id"].astype(str).to_numpy(),
        }
    )
    rows["reference"] = pair_references(rows, baseline).to_numpy()
    return judge_pairs(
        rows, plan, reference_kind="own", thresholds=PairThresholds.from_policy(policy), source="the run's pair results"
    )


def judge_with_links(
    results: pd.DataFrame, baseline: pd.DataFrame, policy: Policy, *, plan: PairingPlan | None = None
) -> pd.DataFrame:
    """The verdicts of a run: its GPU and node rows by :func:`gpucert.verdict.judge`, its pair rows by
    ``plan`` (the run's stored plan; without one, a plan of the pairs measured, which can name a node's own
    path but no link or leaf). Results in the canonical dtypes."""
    is_pair = (results["metric"] == PAIR_METRIC).to_numpy()
    if not is_pair.any():
        return judge(results, baseline, policy)
    verdicts = judge(_without(results, is_pair), baseline, policy)
    pairs = results[is_pair]
    judgement = judge_links(pairs, plan if plan is not None else measured_plan(pairs), baseline, policy)
    models = results.groupby("node", observed=True)["gpu_model"].first()
    links = link_verdicts(
        judgement, run_id=str(pairs["run_id"].iloc[0]), models={str(k): str(v) for k, v in models.items()}
    )
    return pd.concat([verdicts, _explained_by_the_node(links, verdicts)], ignore_index=True)


def _without(results: pd.DataFrame, rows: np.ndarray) -> pd.DataFrame:
    """``results`` less ``rows``. The links step appends its rows after the nodes' (a run's stored
    results), so those usually end the table: then a slice, not a copy of a fleet's rows."""
    first = int(np.argmax(rows))
    if not rows[:first].any() and rows[first:].all():
        return results.iloc[:first]
    return results[~rows].reset_index(drop=True)


#: Causes of a node's own benchmark that also slow its pairs (docs/design/simulator.md, "Fault catalogue": a
#: PCIe link down a generation halves that GPUDirect rail; a GPU held back by heat, power or an error slows
#: the ring it is in).
_NODE_CAUSES_OF_PAIRS = frozenset({"pcie", "nvlink", "thermal", "power", "ecc", "row_remap", "xid", "config"})


def _explained_by_the_node(links: pd.DataFrame, verdicts: pd.DataFrame) -> pd.DataFrame:
    """The link rows, a node's own network path named where its own benchmark found a cause that slows its
    pairs too made that cause's: the node's GPU rows carry the action and the ticket, and the link row
    says why it asks for none (one fault, one ticket) and gives that fault's advice, not the NIC's — a
    node low with every partner because its own PCIe link trained down needs its GPU reseated, not its
    cable. The passing pairs its fault explains say so too."""
    flagged = verdicts[verdicts["verdict"].isin(["warn", "fail"]) & verdicts["node"].notna()]
    flagged = flagged[flagged["cause"].isin(list(_NODE_CAUSES_OF_PAIRS))]
    if flagged.empty:
        return links
    # The node's worst such row speaks for it: a fail before a warn.
    worst = flagged.assign(_fail=flagged["verdict"] != "fail").sort_values("_fail", kind="stable")
    by_node = worst.groupby(worst["node"].astype(str), sort=False)
    cause_of, action_of = by_node["cause"].first(), by_node["action"].first()
    own_path = (links["peer"].isna() & (links["cause"] == "network") & links["node"].notna()).to_numpy()
    node_cause = links["node"].astype("string").map(cause_of).to_numpy(dtype=object)
    explained = own_path & pd.notna(node_cause)
    if not explained.any():
        return links
    out = links.copy()
    causes = node_cause[explained].astype(str)
    actions = out.loc[explained, "node"].astype(str).map(action_of).fillna("none").astype(str).to_numpy(dtype=object)
    out.loc[explained, "cause"] = causes
    out.loc[explained, "action"] = "none"
    out.loc[explained, "ticket"] = "none"
    pairs_said = (
        out.loc[explained, "reasons"]
        .astype(str)
        .str.removeprefix("network: ")
        .str.replace(f". {NIC_ADVICE}", "", regex=False)
        .to_numpy(dtype=object)
    )
    said = (
        "explained by this node's own "
        + causes
        + " fault (its own rows): "
        + pairs_said
        + ". Not its NIC: its "
        + causes
        + " fault slows every pair it is in; do what its own rows ask ("
        + actions
        + "), then its links are measured again with it"
    )
    out.loc[explained, "reasons"] = with_layer(causes.astype(object), said)
    return _partners_explained(out, dict(zip(out.loc[explained, "node"].astype(str), causes, strict=True)))


def _partners_explained(links: pd.DataFrame, cause_of: Mapping[str, str]) -> pd.DataFrame:
    """The passing pair rows low because of a node whose own fault (``cause_of``: node → cause) explains its
    pairs: they name that node and fault, not "the node's own network path"."""
    blamed = "low, explained by the node's own network path (its own row)"
    node, peer = links["node"].astype("string"), links["peer"].astype("string")
    culprit = node.map(cause_of).notna()
    who = node.where(culprit, peer)
    cause = who.map(cause_of)
    rows = ((links["reasons"].astype("string") == blamed) & cause.notna()).fillna(False).to_numpy()
    if not rows.any():
        return links
    links.loc[rows, "reasons"] = (
        "low, explained by " + who[rows] + "'s own " + cause[rows] + " fault (its own rows)"
    ).astype(object)
    return links


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
