"""Inter-node network localisation: the pairing plan and its judgement (docs/design/verdict-engine.md, "Node
and pair findings").

* :mod:`._plan` — :func:`plan_rounds`: rounds of two-node pairs chosen by the nodes' topology labels, so
  every node meets partners in its own leaf and in another; a :class:`PairingPlan`;
* :mod:`._judge` — :func:`judge_pairs`: the ``nccl_pair_busbw_gbps`` results of a plan localised to a
  node's network path, the link between two leaves, a leaf, or a single pair to re-pair
  (:class:`PairJudgement`); :func:`repairs` plans that re-pairing with known-good partners;
* :mod:`._verdicts` — :func:`link_verdicts`: a judgement as verdict rows (a node failed only by a finding
  resting on two partners); :func:`pair_references`: each pair's reference from the nodes' link baselines.

Pure pandas/numpy, vectorised over pairs; nothing here imports Prefect or the Kubernetes client.
"""

from ._judge import (
    FINDING_COLUMNS,
    NIC_ADVICE,
    PAIR_METRIC,
    PAIR_STATUSES,
    PairJudgement,
    PairThresholds,
    judge_pairs,
    repairs,
)
from ._plan import (
    INTER_LEAF,
    INTER_ZONE,
    INTRA_LEAF,
    KINDS,
    PAIR_COLUMNS,
    STAGES,
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
    "PAIR_STATUSES",
    "STAGES",
    "UNLABELLED",
    "ZONE_LABEL",
    "PairJudgement",
    "PairThresholds",
    "PairingPlan",
    "judge_pairs",
    "link_verdicts",
    "measured_plan",
    "pair_references",
    "plan_rounds",
    "repairs",
    "stored_plan",
]
