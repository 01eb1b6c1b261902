"""Findings reduced to the verdict table of DESIGN.md: one row per GPU, node and pair, plus fleet rows.

The verdict is the worst severity among an entity's findings; the deciding comparison is the
highest-ranked finding of that severity (a gate over a floor over a statistic); the cause is the most
specific one among them (``row_remap`` over ``ecc`` over ``xid``…), with its action and the heaviest
ticket; ``reasons`` lists every finding, worst first, notes (transients, application XIDs) last.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ._findings import CAUSE_SPECIFICITY, SEVERITY, TICKET_RANK, VERDICT_OF
from ._index import SCOPE_NAMES, RunIndex

__all__ = ["VERDICT_COLUMNS", "assemble", "escalate_nodes"]

VERDICT_COLUMNS = (
    "run_id",
    "node",
    "gpu",
    "gpu_uuid",
    "verdict",
    "metric",
    "value",
    "reference",
    "deviation_pct",
    "z",
    "reference_kind",
    "cause",
    "action",
    "ticket",
    "reasons",
    # gpucert's additions to the contract: the cohort, and the other node of a pair row
    "gpu_model",
    "peer",
)

_KEY = ["scope", "node", "gpu", "peer"]


def escalate_nodes(findings: pd.DataFrame) -> pd.DataFrame:
    """Node findings for nodes whose node benchmark could not run because one of their GPUs failed.

    DESIGN.md: inconclusive is for reasons outside the GPU; an NCCL job that died with a GPU that fails a
    hard gate is explained by that GPU, so the node row fails with its cause instead.
    """
    node_blocked = findings[(findings["scope"] == "node") & (findings["severity"] == SEVERITY["inconclusive"])]
    gpu_fails = findings[(findings["scope"] == "gpu") & (findings["severity"] == SEVERITY["fail"])
                         & (findings["rank"] >= 3)]
    if node_blocked.empty or gpu_fails.empty:
        return findings.iloc[:0]
    gpu_fails = gpu_fails.assign(spec=gpu_fails["cause"].map(CAUSE_SPECIFICITY))
    worst = (gpu_fails.sort_values(["node", "spec"], ascending=[True, False])
             .drop_duplicates("node").set_index("node"))
    nodes = pd.Index(node_blocked["node"].unique()).intersection(worst.index)
    if nodes.empty:
        return findings.iloc[:0]
    picked = worst.loc[nodes]
    out = picked.reset_index()[list(findings.columns)].copy()
    out["scope"] = "node"
    out["gpu"] = -1
    out["metric"] = "error"
    out["value"] = np.nan
    out["reference"] = np.nan
    out["reason"] = [f"the node benchmark could not complete because GPU {g} failed: {r}"
                     for g, r in zip(picked["gpu"], picked["reason"], strict=True)]
    return out


def _entities(run: RunIndex, findings: pd.DataFrame) -> pd.DataFrame:
    eids = np.arange(run.n_entities)
    base = pd.DataFrame(
        {
            "scope": np.asarray(SCOPE_NAMES, dtype=object)[run.scope],
            "node": run.node_names(eids),
            "gpu": run.gpu,
            "peer": run.peer_names(eids),
            "gpu_uuid": run.uuid_names(eids),
            "gpu_model": run.model_names(eids),
        }
    )
    entity_findings = findings[findings["scope"] != "fleet"]
    extra = entity_findings[_KEY].drop_duplicates().merge(base[_KEY], how="left", indicator=True)
    extra = extra[extra["_merge"] == "left_only"].drop(columns="_merge")
    if len(extra):
        # GPUs that report nothing still get a row; their model is their node's.
        node_model = base.drop_duplicates("node").set_index("node")["gpu_model"]
        extra = extra.assign(gpu_uuid=None, gpu_model=node_model.reindex(extra["node"]).to_numpy())
        base = pd.concat([base, extra], ignore_index=True)
    return base


def assemble(run: RunIndex, findings: pd.DataFrame) -> pd.DataFrame:
    base = _entities(run, findings)
    entity = findings[findings["scope"] != "fleet"].copy()
    entity["spec"] = entity["cause"].map(CAUSE_SPECIFICITY).fillna(0).astype(int)
    entity["tkt"] = entity["ticket"].map(TICKET_RANK).fillna(0).astype(int)
    entity = entity.sort_values(_KEY + ["severity", "rank"], ascending=[True] * 4 + [False, False], kind="stable")
    top = entity.groupby(_KEY, sort=False)["severity"].transform("max")
    at_top = entity[entity["severity"] == top]

    deciding = at_top.drop_duplicates(_KEY).set_index(_KEY)
    by_cause = at_top.sort_values(_KEY + ["spec", "rank"], ascending=[True] * 4 + [False, False],
                                  kind="stable").drop_duplicates(_KEY).set_index(_KEY)
    ticket = at_top.groupby(_KEY, sort=False)["tkt"].max()
    reasons = entity.groupby(_KEY, sort=False)["reason"].agg("; ".join)

    summary = deciding[["severity", "metric", "value", "reference", "deviation_pct", "z", "reference_kind"]].copy()
    summary["cause"] = by_cause["cause"]
    summary["action"] = by_cause["action"]
    summary["ticket"] = ticket.reindex(summary.index).map({v: k for k, v in TICKET_RANK.items()})
    summary["reasons"] = reasons.reindex(summary.index)

    out = base.merge(summary.reset_index(), on=_KEY, how="left")
    severity = out["severity"].fillna(0).astype(int)
    out["verdict"] = severity.map(VERDICT_OF)
    passing = severity.to_numpy() <= 0
    for column in ("metric", "reference_kind", "cause"):
        out[column] = out[column].where(~passing, "").fillna("")
    for column in ("value", "reference", "deviation_pct", "z"):
        out[column] = out[column].where(~passing)
    inconclusive = severity.to_numpy() == SEVERITY["inconclusive"]
    out["action"] = np.where(passing, "none", out["action"].fillna("retest"))
    out.loc[inconclusive, "cause"] = ""
    out.loc[inconclusive, "action"] = "retest"
    out["ticket"] = np.where(passing | inconclusive, "none", out["ticket"].fillna("none"))
    out["reasons"] = out["reasons"].fillna("")
    out.loc[out["metric"].isin(["", "error"]) & ~pd.Series(passing), "metric"] = out["metric"]
    out["gpu"] = out["gpu"].where(out["scope"] == "gpu").astype("Int64")
    out["peer"] = out["peer"].replace("", None)
    out["node"] = out["node"].astype(object)

    fleet = findings[findings["scope"] == "fleet"]
    if len(fleet):
        rows = pd.DataFrame(
            {
                "node": None, "gpu": pd.array([pd.NA] * len(fleet), dtype="Int64"), "gpu_uuid": None,
                "verdict": fleet["severity"].map(VERDICT_OF).to_numpy(),
                "metric": fleet["metric"].to_numpy(), "value": fleet["value"].to_numpy(),
                "reference": fleet["reference"].to_numpy(), "deviation_pct": fleet["deviation_pct"].to_numpy(),
                "z": np.nan, "reference_kind": "fleet", "cause": fleet["cause"].to_numpy(),
                "action": fleet["action"].to_numpy(), "ticket": "none", "reasons": fleet["reason"].to_numpy(),
                "gpu_model": None, "peer": None, "scope": "fleet",
            }
        )
        out = pd.concat([out, rows], ignore_index=True)
    out["run_id"] = run.run_id
    order = {"gpu": 0, "node": 1, "pair": 2, "fleet": 3}
    out = out.assign(_o=out["scope"].map(order)).sort_values(["_o", "node", "gpu", "peer"], kind="stable")
    return out[list(VERDICT_COLUMNS)].reset_index(drop=True)
