"""From one run's verdicts to what it says about each node: :class:`NodeDecision`, by pure functions.

The state is the worst row's (``fail`` → ``failed``, ``warn`` → ``degraded``, every row ``pass`` →
``certified``); a node with only ``pass`` and ``inconclusive`` rows keeps its state (an inconclusive run says
nothing about the GPUs). A fail needs a confirming re-run unless a hard gate backs it, a warn unless a
telemetry gate does (docs/design/certify-runbook.md, "Confirm"). Settling a run is :mod:`._settle`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from ..network import PAIR_METRIC
from ..verdict import VERDICT_OF, VERDICT_RANK

#: XIDs whose fail needs no confirming re-run (docs/design/certify-runbook.md, "Confirm"): row remap failure,
#: fallen off the bus, uncontained ECC error.
HARD_GATE_XIDS = frozenset({64, 79, 95})
#: A fail on these is measured, not a statistic, so it needs no confirming re-run either: a row-remap failure,
#: a double-bit ECC error, an RDMA port down, below its rate or with rising error counters
#: (docs/reference/causes-and-actions.md, "Gates").
_HARD_GATE_METRICS = frozenset(
    {
        "remapped_rows_failure",
        "ecc_dbe_volatile",
        "ib_ports_active",
        "ib_rate_min_gbps",
        "ib_symbol_errors",
        "ib_link_downed",
        "ib_rcv_errors",
    }
)
_STATE = {"pass": "certified", "warn": "degraded", "fail": "failed"}


@dataclass(frozen=True)
class NodeDecision:
    """What one run concluded about one node."""

    node: str
    #: ``certified``, ``degraded``, ``failed``, or None: leave the state label as it is (inconclusive).
    state: str | None
    #: The taint's value when ``state`` is ``failed``: the cause of its worst row (``unknown`` if none).
    cause: str | None
    #: A hard hardware gate fired: taint without a confirming re-run.
    hard_gate: bool
    #: One line for the node's annotation: what was found and what to do.
    summary: str
    #: A telemetry gate backs the worst rows (a warn that is a measured signal, not a statistic).
    corroborated: bool = False

    @property
    def needs_confirmation(self) -> bool:
        """A re-run must reproduce this before it marks the node: a fail without a hard gate, a warn
        without a telemetry gate behind it."""
        if self.state == "failed":
            return not self.hard_gate
        return self.state == "degraded" and not self.corroborated


def hard_gate_rows(rows: pd.DataFrame) -> pd.Series:
    """Which verdict rows fail a hard hardware gate (a row-remap failure, XID 64/79/95, a volatile DBE, an
    RDMA port down, a node's own network path): a fail that needs no confirming re-run."""
    metric = rows["metric"].astype("string")
    value = pd.to_numeric(rows["value"], errors="coerce")
    xid = (metric == "xid") & value.isin(list(HARD_GATE_XIDS))
    peer = rows["peer"] if "peer" in rows else pd.Series(pd.NA, index=rows.index)
    # A node's own network path named by its pairs: low with two partners that are fine elsewhere, after the
    # re-pairings (a confirming re-run of the node alone measures no pair).
    own_path = (metric == PAIR_METRIC) & peer.isna() & (rows["cause"].astype("string") == "network")
    return (rows["verdict"] == "fail") & (metric.isin(list(_HARD_GATE_METRICS)) | xid | own_path)


def _summary(verdict: str, gpu: object, reasons: object, action: object, flagged: int) -> str:
    """The node's one line from its deciding row (the first of its worst) and how many rows it flagged."""
    if verdict == "pass" or flagged == 0:
        return "all checks passed"
    where = f"GPU {int(gpu)}" if pd.notna(gpu) else "node"  # type: ignore[call-overload]
    reason = str(reasons).split(";")[0].strip() if pd.notna(reasons) else ""  # type: ignore[call-overload]
    act = str(action) if pd.notna(action) and action != "none" else ""  # type: ignore[call-overload]
    more = f" (+{flagged - 1} more)" if flagged > 1 else ""
    text = f"{verdict}: {where}: {reason}{more}"
    return f"{text}; action: {act}" if act else text


def decide_nodes(verdicts: pd.DataFrame, nodes: Iterable[str]) -> dict[str, NodeDecision]:
    """Node → :class:`NodeDecision` for each of ``nodes`` (a node with no row at all is inconclusive).

    Fleet rows (no node) flag nobody and are ignored here. Each node's figures come from group-wise
    operations over the whole table (10,000 nodes in well under a second); only the decisions themselves
    are built one by one.
    """
    rows = verdicts[verdicts["node"].notna()]
    rows = rows.assign(
        _rank=rows["verdict"].astype("string").map(VERDICT_RANK).astype("int64"), _hard=hard_gate_rows(rows)
    )
    # Worst rows first (stable: in the table's order among equals), so each node's first row decides.
    rows = rows.sort_values(["node", "_rank"], ascending=[True, False], kind="stable").reset_index(drop=True)
    node = rows["node"].astype("string").to_numpy(dtype=object)
    by_node = rows.groupby(node, sort=False)
    deciding = by_node.head(1)
    worst_rank = pd.Series(deciding["_rank"].to_numpy(), index=node[deciding.index])
    is_worst = rows["_rank"].to_numpy() == worst_rank.reindex(node).to_numpy()
    flagged = (rows["_rank"] > 0).groupby(node, sort=False).sum()
    hard = by_node["_hard"].any()
    cause = rows["cause"].astype("string").fillna("")
    named = ((rows["verdict"] == "fail") & (cause != "")).to_numpy()
    causes = cause[named].groupby(node[named], sort=False).first()
    gate = (
        rows["reference_kind"].astype("string").eq("gate").fillna(False).to_numpy(dtype=bool)
        if "reference_kind" in rows
        else np.zeros(len(rows), dtype=bool)
    )
    corroborated = set(node[is_worst & gate])
    decide = {
        str(name): (VERDICT_OF[rank], gpu, reasons, action)
        for name, rank, gpu, reasons, action in zip(
            node[deciding.index],
            deciding["_rank"],
            deciding["gpu"],
            deciding["reasons"],
            deciding["action"],
            strict=True,
        )
    }
    out: dict[str, NodeDecision] = {}
    for name in nodes:
        if name not in decide:
            out[name] = NodeDecision(name, None, None, False, "inconclusive: no result from this node")
            continue
        verdict, gpu, reasons, action = decide[name]
        out[name] = NodeDecision(
            name,
            _STATE.get(verdict),
            str(causes.get(name, "unknown")) if verdict == "fail" else None,
            bool(hard[name]),
            _summary(verdict, gpu, reasons, action, int(flagged[name])),
            corroborated=name in corroborated,
        )
    return out


def fail_stands(runs: Iterable[NodeDecision]) -> bool | None:
    """docs/design/certify-runbook.md, "Confirm", over a node's runs so far (first run first): True once 2
    have failed, False once 2 have not, None while undecided (run once more). An inconclusive re-run counts as
    neither."""
    return _reproduced(runs, ("failed",))


def deficit_stands(runs: Iterable[NodeDecision]) -> bool | None:
    """As :func:`fail_stands`, for a first run that warned: a warn or a fail is a deficit."""
    return _reproduced(runs, ("degraded", "failed"))


def _reproduced(runs: Iterable[NodeDecision], deficit: tuple[str, ...]) -> bool | None:
    """True once 2 runs are in ``deficit``, False once 2 are not (or 1 is not and none is), None while
    undecided; an inconclusive run (state None) counts as neither."""
    states = [d.state for d in runs if d.state is not None]
    bad = sum(state in deficit for state in states)
    good = len(states) - bad
    if bad >= 2:
        return True
    if good >= 2 or (good >= 1 and bad == 0):
        return False
    return None
