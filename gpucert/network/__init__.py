"""Inter-node network localisation (docs/design/verdict-engine.md, "Node and pair findings").

* :mod:`._plan` — :func:`plan_rounds`: rounds of two-node pairs chosen by the nodes' topology labels, so every
  node meets partners in its own leaf and in another (:class:`PairingPlan`);
* :mod:`._findings` — :func:`pair_findings`: a plan's pair results localised to a node's network path, the link
  between two leaves, a leaf, or a pair to re-pair (:class:`PairFindings`); :func:`repairs` plans that
  re-pairing with known-good partners;
* :mod:`._verdicts` — :func:`link_verdicts`: the findings as verdict rows; :func:`pair_references`: each pair's
  reference from the nodes' link baselines.

Pure pandas/numpy, vectorised over pairs; nothing here imports Prefect or the Kubernetes client.
"""

from ._findings import FINDING_COLUMNS, NIC_ADVICE, PAIR_METRIC, PairFindings, PairThresholds, pair_findings, repairs
from ._plan import (
    INTER_LEAF,
    INTER_ZONE,
    INTRA_LEAF,
    KINDS,
    PAIR_COLUMNS,
    UNLABELLED,
    ZONE_LABEL,
    PairingPlan,
    measured_plan,
    plan_rounds,
    stored_plan,
)
from ._verdicts import link_verdicts, pair_references

__all__ = [
    "FINDING_COLUMNS",
    "INTER_LEAF",
    "INTER_ZONE",
    "INTRA_LEAF",
    "KINDS",
    "NIC_ADVICE",
    "PAIR_COLUMNS",
    "PAIR_METRIC",
    "UNLABELLED",
    "ZONE_LABEL",
    "PairFindings",
    "PairThresholds",
    "PairingPlan",
    "link_verdicts",
    "measured_plan",
    "pair_findings",
    "pair_references",
    "plan_rounds",
    "repairs",
    "stored_plan",
]
