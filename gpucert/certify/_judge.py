"""Judging a run and its confirming re-runs, and settling them offline: the one path certify, the
certificate's re-judgement and ``gpucert compare --rerun`` share.

A run's verdicts are made in one place, :func:`run_verdicts`: its results judged (pairs by the run's
pairing plan) and an ``inconclusive`` row for each node whose benchmark gave none.

A confirming re-run measures a few nodes; judged alone, its peers would be just those nodes (and a slow
GPU would "pass" among the other suspects). So a re-run is judged with the first run's other nodes as
its cohort (:func:`judge_rerun`), and only its own nodes' rows are kept.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from ..errors import InputError
from ..network import PAIR_METRIC, PairingPlan
from ..policy import Policy
from ..results import concat_results
from ._links import judge_with_links
from ._record import job_failure_verdicts
from ._settle import NodeTaints, RunVerdicts, Settlement, settle, settled_verdicts

__all__ = ["judge_rerun", "run_verdicts", "settle_offline"]


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

    A first run is judged with its pairs by ``plan`` (:func:`judge_with_links`); a confirming re-run, given
    its ``nodes``, among the first run's results (``cohort``, :func:`judge_rerun`) for those nodes only.
    """
    parts = [job_failure_verdicts(run_id, failed)]
    if results is not None and len(results):
        if nodes is None:
            judged = judge_with_links(results, baseline, policy, plan=plan)
        else:
            judged = judge_rerun(results, cohort, nodes, baseline, policy)
        parts.insert(0, judged)
    filled = [part for part in parts if len(part)]
    return pd.concat(filled, ignore_index=True) if filled else parts[0]


def judge_rerun(
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
    judged = judge_with_links(results, baseline, policy)
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
