"""Findings about nodes that no single GPU or pair shows: a node whose GPUs all lose the same share, and
a node low in every pair it is in (docs/design/verdict-engine.md, "Node and pair findings")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..policy import Policy
from ._causes import ACTION_FOR_CAUSE
from ._compare import REF_WORDS, per_metric
from ._findings import concat_findings, make_findings
from ._index import METRIC_NAMES, N_METRICS, SCOPE_GPU, SCOPE_PAIR, RunIndex, group_rows
from ._repeats import nan_row_median

__all__ = ["node_wide_findings", "pair_node_findings"]

_MEDIAN_EFFICIENCY = 1.2533  # sd of a sample median / (sigma / sqrt(n)) for normal data
# Both pairs of a healthy node that low by chance: ~4e-5; one good pair of a bad node's neighbour: 0.6 %.
_PAIR_Z = 2.5


def node_wide_findings(run: RunIndex, table: pd.DataFrame, policy: Policy, gate_causes: pd.Series) -> pd.DataFrame:
    """Node findings where the GPUs of a node all lose about the same share on one metric: their median drop is
    far more precise than any one GPU's, so a node-wide cause is found at half the single-GPU warn drop."""
    eid = table["eid"].to_numpy()
    rows = np.flatnonzero((run.scope[eid] == SCOPE_GPU) & np.isfinite(table["d"].to_numpy()))
    if len(rows) == 0:
        return make_findings("node", [], severity="warn", rank="stat", reason=[])
    # Each node × metric a row of a matrix of its GPUs' values: medians by sorting short rows.
    key = run.node_code[eid[rows]] * N_METRICS + table["mcode"].to_numpy()[rows]
    grouping = group_rows(key, len(run.nodes) * N_METRICS)
    by_width = list(grouping.by_width())

    def median(column: str) -> np.ndarray:
        values = table[column].to_numpy(dtype=np.float64)[rows]
        out = np.empty(len(grouping.first))
        for groups, members in by_width:
            out[groups] = nan_row_median(values[members])
        return out

    group_key = key[grouping.first]
    agg = pd.DataFrame(
        {
            "node": group_key // N_METRICS,
            "mcode": group_key % N_METRICS,
            "d": median("d"),
            "sigma": median("sigma"),
            "n": grouping.counts,
            "x": median("x"),
            "ref": median("ref"),
            "own": np.bincount(grouping.ids, weights=table["has_own"].to_numpy()[rows]) / grouping.counts,
        }
    )
    mcode = agg["mcode"].to_numpy()
    cv_rep = per_metric(policy, "cv_rep")[mcode]
    n = agg["n"].to_numpy()
    node_sigma = np.sqrt((_MEDIAN_EFFICIENCY * agg["sigma"].to_numpy() / np.sqrt(n)) ** 2 + cv_rep**2)
    d = agg["d"].to_numpy()
    z = d / node_sigma
    warn_drop = per_metric(policy, "warn_drop_pct")[mcode] / 100 * policy.node_wide.drop_factor
    fail_drop = per_metric(policy, "fail_drop_pct")[mcode] / 100
    flagged = (n >= 3) & (d <= -warn_drop) & (z <= -policy.node_wide.z)
    if not flagged.any():
        return make_findings("node", [], severity="warn", rank="stat", reason=[])
    hit = agg[flagged]
    names = np.array(METRIC_NAMES, dtype=object)[hit["mcode"].to_numpy()]
    node_names = np.asarray(run.nodes, dtype=object)[hit["node"].to_numpy()]
    host = np.isin(names, ["h2d_gbps", "d2h_gbps"])
    gate = gate_causes.reindex(node_names).to_numpy(dtype=object)
    cause = np.where(pd.notna(gate), gate, np.where(host, "config", "unknown"))
    severity = np.where(d[flagged] <= -fail_drop[flagged], 3, 2)
    kinds = np.where(hit["own"].to_numpy() > 0.5, "own", "peer")
    words = {
        "config": "the host (CPU contention, NUMA binding, BIOS): fix the node's affinity and settings",
        "unknown": "no telemetry names it: re-test, then reboot the node",
    }
    reason = [
        f"{m}: all {k} GPUs of the node are {-dv * 100:.1f} % below {REF_WORDS[kd]} (median, z {zv:.1f}): "
        f"a node-wide cause — {words.get(c, c)}"
        for m, k, dv, kd, zv, c in zip(names, hit["n"], d[flagged], kinds, z[flagged], cause, strict=True)
    ]
    return make_findings(
        "node",
        node_names,
        severity=severity,
        rank="stat",
        metric=names,
        value=hit["x"].to_numpy(),
        reference=hit["ref"].to_numpy(),
        deviation_pct=d[flagged] * 100,
        z=z[flagged],
        reference_kind=kinds,
        cause=cause,
        action=np.where(severity >= 3, pd.Series(cause).map(ACTION_FOR_CAUSE).to_numpy(), "retest"),
        ticket=np.where(severity >= 3, "remediation", "none"),
        reason=reason,
    )


def pair_node_findings(run: RunIndex, table: pd.DataFrame, policy: Policy, findings: pd.DataFrame) -> pd.DataFrame:
    """A node whose every pair is low is the likelier culprit (docs/design/verdict-engine.md, "Node and pair findings").

    The node's evidence is the *best* of its pairs: a bad port drags down every pair the node is in, while each
    of its partners keeps one good pair. A node between two partners flagged themselves (candidates of this rule,
    or with findings of their own) cannot be told apart by its pairs alone: a note asks to re-pair it instead.
    """
    pair_rows = table[run.scope[table["eid"].to_numpy()] == SCOPE_PAIR]
    pair_rows = pair_rows[np.isfinite(pair_rows["d"])]
    if pair_rows.empty:
        return make_findings("node", [], severity="warn", rank="stat", reason=[])
    eids = pair_rows["eid"].to_numpy()
    # Each pair seen from both of its ends.
    measured = {c: pair_rows[c].to_numpy() for c in ("d", "sigma", "mcode")}
    one = pd.DataFrame({"node": run.node_names(eids), "partner": run.peer_names(eids), **measured})
    ends = pd.concat([one, one.rename(columns={"node": "partner", "partner": "node"})], ignore_index=True)
    ends = ends[ends["node"] != ""]
    per = (
        ends.groupby(["node", "mcode"], sort=False)
        .agg(
            pairs=("d", "size"),
            best=("d", "max"),
            worst=("d", "min"),
            sigma=("sigma", "median"),
            partners=("partner", lambda p: ", ".join(sorted(p))),
        )
        .reset_index()
    )
    mcode = per["mcode"].to_numpy()
    warn_drop = per_metric(policy, "warn_drop_pct")[mcode] / 100
    fail_drop = per_metric(policy, "fail_drop_pct")[mcode] / 100
    best = per["best"].to_numpy()
    z = best / per["sigma"].to_numpy()
    flagged = (per["pairs"].to_numpy() >= 2) & (best <= -warn_drop) & (z <= -_PAIR_Z)
    if not flagged.any():
        return make_findings("node", [], severity="warn", rank="stat", reason=[])

    # A candidate keeps the blame when at least one partner is clean: neither flagged on its own nor a
    # candidate itself. (Two adjacent culprits each still have a clean partner on their other side.)
    candidates = set(per.loc[flagged, "node"])
    flagged_on_own = set(findings.loc[(findings["scope"] != "pair") & (findings["severity"] >= 2), "node"])
    low = ends[ends["node"].isin(candidates)]
    clean = ~low["partner"].isin(candidates | flagged_on_own)
    kept_nodes = set(low.loc[clean, "node"])
    keep = flagged & per["node"].isin(kept_nodes).to_numpy()
    doubtful = flagged & ~keep
    hit = per[keep]
    severity = np.where(best[keep] <= -fail_drop[keep], 3, 2)
    names = np.array(METRIC_NAMES, dtype=object)[hit["mcode"].to_numpy()]
    blamed = make_findings(
        "node",
        hit["node"],
        severity=severity,
        rank="stat",
        metric=names,
        deviation_pct=best[keep] * 100,
        z=z[keep],
        reference_kind="peer",
        cause="network",
        action=ACTION_FOR_CAUSE["network"],
        ticket=np.where(severity >= 3, "remediation", "none"),
        reason=[
            f"{m}: every pair of this node is low (best {b * 100:.1f} %, worst {w * 100:.1f} % against the "
            f"pairs' median; partners {p}): its network path — check its IB ports' state, rate and "
            "error counters, then cables and transceivers"
            for m, b, w, p in zip(names, best[keep], hit["worst"], hit["partners"], strict=True)
        ],
    )
    unsure = per[doubtful]
    noted = make_findings(
        "node",
        unsure["node"],
        severity="note",
        rank="note",
        reason=[
            f"every pair of this node is low, but its partners ({p}) are flagged themselves: re-pair it "
            "with a known-good node to clear it"
            for p in unsure["partners"]
        ],
    )
    return concat_findings([blamed, noted])
