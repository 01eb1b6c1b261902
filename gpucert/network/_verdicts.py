"""Pair findings as verdict rows (docs/design/data-contracts.md, "Verdicts"), and the pair references a
baseline gives.

A node's own network path and an unmeasured node are one node row each (``peer`` empty, the evidence in
``reasons``); a link between two leaves and a leaf are one fleet row each (``node`` empty: it flags no node); a
suspect, probed or cleared pair is one pair row; every other measured pair a ``pass`` pair row (a low one says
which finding explains it). So a node is failed for its network only by a finding that rests on at least two
partners, never by a pair row a partner's fault put it in. Each row with a cause names its layer first.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ..verdict import VERDICT_COLUMNS, with_layer
from ._findings import _NUMBERS, PAIR_METRIC, PairFindings

_EXPLAINED = {"node": "the node's own network path", "uplink": "the link between their leaves", "leaf": "their leaf"}


def link_verdicts(found: PairFindings, *, run_id: str, models: Mapping[str, str]) -> pd.DataFrame:
    """The verdict rows of ``found`` (see the module docstring); ``models`` maps a node to its GPU model
    (the report's cohort), empty where unknown."""
    findings = found.findings
    fleet = findings["scope"] == "fleet"
    from_findings = findings[["verdict", *_NUMBERS, "cause", "action", "ticket", "reasons"]].assign(
        node=findings["node"].where(~fleet & (findings["node"] != ""), None),
        metric=PAIR_METRIC,
        reference_kind=np.where(fleet, "fleet", findings["reference_kind"]),
        peer=findings["peer"].where(findings["scope"] == "pair", None),
    )
    pairs = found.pairs
    ends = (findings["node"].astype(str), findings["peer"].astype(str))
    listed = pd.MultiIndex.from_arrays(ends).append(pd.MultiIndex.from_arrays(ends[::-1]))
    named = pd.MultiIndex.from_arrays([pairs["node"].astype(str), pairs["peer"].astype(str)]).isin(listed)
    measured = pairs["status"].isin(["pass", *_EXPLAINED]).to_numpy()
    passing = pairs[measured & ~named]
    explained = passing["status"].map(_EXPLAINED)
    from_pairs = passing[[*_NUMBERS, "reference_kind"]].assign(
        node=passing["node"].astype(str),
        verdict="pass",
        metric=PAIR_METRIC,
        cause="",
        action="none",
        ticket="none",
        reasons=np.where(explained.notna(), "low, explained by " + explained.fillna("") + " (its own row)", ""),
        peer=passing["peer"].astype(str),
    )
    rows = pd.concat([from_findings, from_pairs], ignore_index=True)
    rows["reasons"] = with_layer(rows["cause"].to_numpy(dtype=object), rows["reasons"].to_numpy(dtype=object))
    rows["run_id"] = run_id
    rows["gpu"] = pd.array([pd.NA] * len(rows), dtype="Int64")
    rows["gpu_uuid"] = None
    rows["gpu_model"] = rows["node"].map(dict(models)).where(rows["node"].notna(), None)
    return rows[list(VERDICT_COLUMNS)].reset_index(drop=True)


def pair_references(pair_rows: pd.DataFrame, baseline: pd.DataFrame) -> pd.Series:
    """Each pair row's reference: its node's own link baseline (the ``node``-level ``nccl_pair_busbw_gbps``
    entry the baseline keeps for it, seeded from its first passing runs and then held), NaN where the node
    has none yet. A pair judged on two such rows is held to the median of its two nodes' baselines."""
    own = baseline[(baseline["level"] == "node") & (baseline["metric"] == PAIR_METRIC)]
    centers = pd.Series(own["center"].to_numpy(dtype=float), index=own["key"].astype(str).to_numpy())
    centers = centers[~centers.index.duplicated()]
    return pd.Series(
        pair_rows["node"].astype(str).map(centers).to_numpy(dtype=float), index=pair_rows.index, name="reference"
    )
