"""Findings: every check the engine makes that is not a plain pass, one row each.

Each rule (a telemetry gate, a statistical comparison, a missing result) returns findings for the entities
it flags; :mod:`._assemble` reduces them to one verdict per entity. Keeping rules apart from the reduction
is what lets a GPU carry several reasons while the verdict names one deciding comparison and one cause.
Findings are few (only flagged entities have any), so building their text is cheap even at 100,000 GPUs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from ._index import SCOPE_NAMES, RunIndex

__all__ = [
    "CAUSE_SPECIFICITY",
    "FINDING_COLUMNS",
    "RANK",
    "SEVERITY",
    "TICKET_RANK",
    "VERDICT_OF",
    "VERDICT_RANK",
    "concat_findings",
    "entity_findings",
    "make_findings",
]

#: A finding's weight in the verdict: a note never changes a pass, a signal beats missing data.
SEVERITY = {"note": 0, "inconclusive": 1, "warn": 2, "fail": 3}
VERDICT_OF = {0: "pass", 1: "inconclusive", 2: "warn", 3: "fail"}
#: How bad each verdict is, worst highest: the one ranking of verdicts (decisions and tickets sort by it).
VERDICT_RANK = {verdict: rank for rank, verdict in VERDICT_OF.items()}

#: Which finding decides among those of equal severity: a rule on telemetry over an absolute floor over
#: a statistical comparison. (The cause is chosen separately, by specificity.)
RANK = {"gate": 4, "missing": 3, "spec": 2, "stat": 1, "note": 0}

#: docs/design/data-contracts.md, "Verdicts": "the most specific telemetry names the cause" — a row-remap
#: failure over the ECC error that caused it over the XID that reported it; a statistical finding without a
#: signature comes last.
CAUSE_SPECIFICITY = {
    "row_remap": 10,
    "ecc": 9,
    "nvlink": 8,
    "pcie": 8,
    "power": 7,
    "thermal": 7,
    "config": 6,
    "xid": 5,
    "network": 4,
    "storage": 4,
    "slow_silicon": 2,
    "unknown": 1,
    "": 0,
}

TICKET_RANK = {"none": 0, "remediation": 1, "replacement": 2}

FINDING_COLUMNS = (
    "scope",  # gpu | node | pair | fleet
    "node",
    "gpu",  # int, -1 when not a GPU
    "peer",
    "severity",
    "rank",
    "metric",
    "value",
    "reference",
    "deviation_pct",
    "z",
    "reference_kind",
    "cause",
    "action",
    "ticket",
    "reason",
)


def make_findings(
    scope: Any,
    node: Any,
    *,
    gpu: Any = -1,
    peer: Any = "",
    severity: Any,
    rank: str,
    reason: Any,
    metric: Any = "",
    value: Any = np.nan,
    reference: Any = np.nan,
    deviation_pct: Any = np.nan,
    z: Any = np.nan,
    reference_kind: Any = "",
    cause: Any = "",
    action: Any = "none",
    ticket: Any = "none",
) -> pd.DataFrame:
    """Findings for the entities in ``node`` (and ``gpu``/``peer``); scalars broadcast to every row."""
    nodes = pd.Series(node, dtype=object).reset_index(drop=True) if not isinstance(node, str) else None
    count = len(nodes) if nodes is not None else 1
    if count == 0:
        return empty_findings()

    def col(value_: Any) -> Any:
        return value_.to_numpy() if isinstance(value_, pd.Series) else value_

    def text(value_: Any) -> pd.Series:
        # Kept as Python objects: pandas would turn each text column of each of the engine's few dozen
        # small frames into Arrow strings, a conversion that costs more than the findings themselves.
        if isinstance(value_, str) or value_ is None:
            values = np.full(count, value_, dtype=object)
        else:
            values = np.asarray(col(value_), dtype=object)
        return pd.Series(values, index=index, dtype=object, copy=False)

    def int64(value_: Any) -> Any:
        # Typed before the frame is built: astype on the frame would copy every column.
        return np.broadcast_to(np.asarray(col(value_), dtype=np.int64), (count,))

    index = pd.RangeIndex(count)
    frame = pd.DataFrame(
        {
            "scope": text(scope),
            "node": text(nodes if nodes is not None else node),
            "gpu": int64(gpu),
            "peer": text(peer),
            "severity": int64(severity if isinstance(severity, (pd.Series, np.ndarray)) else SEVERITY[severity]),
            "rank": int64(RANK[rank]),
            "metric": text(metric),
            "value": col(value),
            "reference": col(reference),
            "deviation_pct": col(deviation_pct),
            "z": col(z),
            "reference_kind": text(reference_kind),
            "cause": text(cause),
            "action": text(action),
            "ticket": text(ticket),
            "reason": text(reason),
        },
        index=index,
    )
    return frame


def entity_findings(run: RunIndex, eids: np.ndarray, **fields: Any) -> pd.DataFrame:
    """:func:`make_findings` for the run's entities ``eids``: their scope, node, GPU index and peer."""
    scope = np.asarray(SCOPE_NAMES, dtype=object)[run.scope[eids]]
    return make_findings(scope, run.node_names(eids), gpu=run.gpu[eids], peer=run.peer_names(eids), **fields)


def empty_findings() -> pd.DataFrame:
    frame = pd.DataFrame({c: pd.Series(dtype=object) for c in FINDING_COLUMNS})
    return frame.astype({"gpu": "int64", "severity": "int64", "rank": "int64"})


def concat_findings(parts: Sequence[pd.DataFrame]) -> pd.DataFrame:
    parts = [p for p in parts if len(p)]
    if not parts:
        return empty_findings()
    return pd.concat(parts, ignore_index=True)
