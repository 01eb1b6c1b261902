"""A pair judgement as verdict rows (docs/design/data-contracts.md, "Verdicts"), and the pair references a
baseline gives.

What each finding of :func:`gpucert.network.judge_pairs` becomes:

* a node's own network path (``culprit``) and a node none of whose pairs ran (``unmeasured``): one node
  row, ``peer`` empty, the evidence (every partner, in GB/s and % of the reference) in ``reasons``;
* the link between two leaves, or a leaf: one fleet row (``node`` empty, ``reference_kind`` ``fleet``): it
  flags no node, as docs/design/data-contracts.md says of fleet findings;
* a suspect pair (low, nothing explains it, the re-pairings spent), a culprit's pair still to probe, a
  cleared transient: one pair row, oriented as the finding names it;
* every other measured pair: a ``pass`` pair row; a low pair that a finding explains says which.

So a node is failed for its network only by a finding that rests on at least two partners, never by a
pair row a partner's fault put it in. Each row with a cause names its layer first, as the verdict
engine's do (``network: …``).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from ..verdict import VERDICT_COLUMNS, with_layer
from ._judge import PAIR_METRIC, PairJudgement

__all__ = ["link_verdicts", "pair_references"]

_EXPLAINED = {"node": "the node's own network path", "uplink": "the link between their leaves", "leaf": "their leaf"}


def link_verdicts(judgement: PairJudgement, *, run_id: str, models: Mapping[str, str]) -> pd.DataFrame:
    """The verdict rows of ``judgement`` (see the module docstring); ``models`` maps a node to its GPU model
    (the report's cohort), empty where unknown."""
    findings = judgement.findings
    fleet = findings["scope"] == "fleet"
    from_findings = pd.DataFrame(
        {
            "node": findings["node"].where(~fleet & (findings["node"] != ""), None),
            "verdict": findings["verdict"],
            "metric": PAIR_METRIC,
            "value": findings["value"],
            "reference": findings["reference"],
            "deviation_pct": findings["deviation_pct"],
            "z": findings["z"],
            "reference_kind": np.where(fleet, "fleet", findings["reference_kind"]),
            "cause": findings["cause"],
            "action": findings["action"],
            "ticket": findings["ticket"],
            "reasons": findings["reasons"],
            "peer": findings["peer"].where(findings["scope"] == "pair", None),
        }
    )
    pairs = judgement.pairs
    ends = (findings["node"].astype(str), findings["peer"].astype(str))
    listed = pd.MultiIndex.from_arrays(ends).append(pd.MultiIndex.from_arrays(ends[::-1]))
    named = pd.MultiIndex.from_arrays([pairs["node"].astype(str), pairs["peer"].astype(str)]).isin(listed)
    measured = pairs["status"].isin(["pass", *_EXPLAINED]).to_numpy()
    passing = pairs[measured & ~named]
    explained = passing["status"].map(_EXPLAINED)
    from_pairs = pd.DataFrame(
        {
            "node": passing["node"].astype(str),
            "verdict": "pass",
            "metric": PAIR_METRIC,
            "value": passing["value"],
            "reference": passing["reference"],
            "deviation_pct": passing["deviation_pct"],
            "z": passing["z"],
            "reference_kind": passing["reference_kind"],
            "cause": "",
            "action": "none",
            "ticket": "none",
            "reasons": np.where(explained.notna(), "low, explained by " + explained.fillna("") + " (its own row)", ""),
            "peer": passing["peer"].astype(str),
        }
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
