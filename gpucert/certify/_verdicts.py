"""A run's verdicts, made in one place (:func:`run_verdicts`), and settled offline the way certify does: the
one path certify, the certificate's replay and ``gpucert compare --rerun`` share.

A run's results are judged by :func:`gpucert.verdict.judge`, its pair rows by the run's pairing plan
(:func:`verdicts_with_links`), and each node whose benchmark gave nothing gets an ``inconclusive`` row. Pair
rows never go through the per-entity rules of ``judge``: a pair is two nodes, and which of them (or the link
between) is at fault is what the plan's other pairs tell (:func:`gpucert.network.pair_findings`); each pair
row's reference is its node's own link baseline (:func:`gpucert.network.pair_references`).

A confirming re-run measures a few nodes; judged alone, its peers would be just those nodes (and a slow GPU
would "pass" among the other suspects). So a re-run is judged with the first run's other nodes as its cohort
(:func:`rerun_verdicts`), and only its own nodes' rows are kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from ..errors import InputError
from ..network import (
    NIC_ADVICE,
    PAIR_METRIC,
    PairFindings,
    PairingPlan,
    PairThresholds,
    link_verdicts,
    measured_plan,
    pair_findings,
    pair_references,
)
from ..policy import Policy
from ..results import concat_results
from ..verdict import judge, with_layer
from ._record import job_failure_verdicts
from ._settle import NodeTaints, RunVerdicts, Settlement, settle, settled_verdicts


def run_verdicts(
    run_id: str,
    results: pd.DataFrame | None,
    failed: Mapping[str, tuple[str | None, str]],
    baseline: pd.DataFrame,
    policy: Policy,
    *,
    plan: PairingPlan | None = None,
    cohort: pd.DataFrame | None = None,
    nodes: Sequence[str] | None = None,
) -> pd.DataFrame:
    """The verdicts of run ``run_id``: its ``results`` judged (None or empty: nothing to judge), then one
    ``inconclusive`` row per node of ``failed`` (node → the wave's reason and message).

    A first run is judged with its pairs by ``plan`` (:func:`verdicts_with_links`); a confirming re-run, given
    its ``nodes``, among the first run's results (``cohort``, :func:`rerun_verdicts`) for those nodes only.
    """
    parts = [job_failure_verdicts(run_id, failed)]
    if results is not None and len(results):
        if nodes is None:
            judged = verdicts_with_links(results, baseline, policy, plan=plan)
        else:
            judged = rerun_verdicts(results, cohort, nodes, baseline, policy)
        parts.insert(0, judged)
    filled = [part for part in parts if len(part)]
    return pd.concat(filled, ignore_index=True) if filled else parts[0]


def rerun_verdicts(
    rerun: pd.DataFrame, cohort: pd.DataFrame | None, nodes: Sequence[str], baseline: pd.DataFrame, policy: Policy
) -> pd.DataFrame:
    """The verdicts of ``rerun``'s ``nodes``, judged against ``baseline`` with the first run's other nodes
    (``cohort``, its results) as their peers. Both tables are results in the canonical dtypes."""
    run_ids = rerun["run_id"].astype("string").unique()
    results = rerun
    if cohort is not None and len(cohort) and len(run_ids) == 1:
        # The first run's pairs stay its own: a re-run measures its nodes alone, among their peers.
        peers = cohort[~cohort["node"].isin(list(nodes)) & (cohort["metric"] != PAIR_METRIC)]
        as_rerun = pd.Categorical.from_codes(
            np.zeros(len(peers), dtype=np.int8), categories=pd.Index([run_ids[0]], dtype="str")
        )
        results = concat_results([rerun, peers.assign(run_id=as_rerun)], f"results of run {run_ids[0]}")
        del peers  # a copy of the fleet's rows: gone before the judge's arrays come
    judged = verdicts_with_links(results, baseline, policy)
    return judged[judged["node"].isin(list(nodes)) | judged["node"].isna()].reset_index(drop=True)


def _one_run(results: pd.DataFrame, what: str) -> str:
    run_ids = sorted(results["run_id"].astype("string").unique())
    if len(run_ids) != 1:
        raise InputError(f"{what}: holds {len(run_ids)} runs ({', '.join(run_ids[:5])}); give one run per file")
    return str(run_ids[0])


def settle_offline(
    first: pd.DataFrame,
    reruns: Sequence[pd.DataFrame],
    baseline: pd.DataFrame,
    policy: Policy,
    *,
    fleet: Mapping[str, NodeTaints] | None = None,
    plan: PairingPlan | None = None,
) -> tuple[pd.DataFrame, Settlement]:
    """Judge ``first`` (one run's results) and each re-run among its cohort, and settle them as certify
    does; returns the settled verdicts and the settlement (``decisions.parquet`` is its ``frame()``).

    ``fleet`` is the cluster's GPU nodes and their taints; offline it defaults to the run's nodes, none
    tainted. ``plan`` is the pairing plan the run's pairs were measured by (its ``links-*.parquet``); without
    it the pairs are judged as measured, which names a node's own path but no link. Raises ``InputError``
    when a file holds more than one run or a re-run measures a node the first run did not.
    """
    first_id = _one_run(first, "the first run")
    nodes = tuple(sorted(first["node"].astype("string").unique()))
    judged = RunVerdicts(first_id, run_verdicts(first_id, first, {}, baseline, policy, plan=plan), nodes)
    judged_reruns = []
    for index, rerun in enumerate(reruns, start=1):
        rerun_id = _one_run(rerun, f"re-run {index}")
        rerun_nodes = tuple(sorted(rerun["node"].astype("string").unique()))
        stray = sorted(set(rerun_nodes) - set(nodes))
        if stray:
            raise InputError(f"re-run {index} ({rerun_id}) measured nodes the first run did not: {', '.join(stray)}")
        verdicts = run_verdicts(rerun_id, rerun, {}, baseline, policy, cohort=first, nodes=rerun_nodes)
        judged_reruns.append(RunVerdicts(rerun_id, verdicts, rerun_nodes))
    taints = fleet if fleet is not None else {n: NodeTaints() for n in nodes}
    settlement = settle(judged, judged_reruns, fleet=taints, policy=policy, observe_only=policy.observe_only)
    return settled_verdicts(judged.verdicts, settlement), settlement


def link_findings(pair_rows: pd.DataFrame, plan: PairingPlan, baseline: pd.DataFrame, policy: Policy) -> PairFindings:
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
    return pair_findings(
        rows, plan, reference_kind="own", thresholds=PairThresholds.from_policy(policy), source="the run's pair results"
    )


def verdicts_with_links(
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
    found = link_findings(pairs, plan if plan is not None else measured_plan(pairs), baseline, policy)
    models = {str(k): str(v) for k, v in results.groupby("node", observed=True)["gpu_model"].first().items()}
    links = link_verdicts(found, run_id=str(pairs["run_id"].iloc[0]), models=models)
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
    out.loc[explained, ["action", "ticket"]] = "none"
    pairs_said = (
        out.loc[explained, "reasons"]
        .astype(str)
        .str.removeprefix("network: ")
        .str.replace(f". {NIC_ADVICE}", "", regex=False)
        .to_numpy(dtype=object)
    )
    said = [
        f"explained by this node's own {cause} fault (its own rows): {pairs}. Not its NIC: its {cause} fault slows "
        f"every pair it is in; do what its own rows ask ({action}), then its links are measured again with it"
        for cause, pairs, action in zip(causes, pairs_said, actions, strict=True)
    ]
    out.loc[explained, "reasons"] = with_layer(causes.astype(object), np.asarray(said, dtype=object))
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
