"""From one run's verdicts to what it says about each node: :class:`NodeDecision`, by pure functions.

* state: any ``fail`` → ``failed``; else any ``warn`` → ``degraded``; else every row ``pass`` →
  ``certified``; a node whose rows are only ``pass`` and ``inconclusive`` keeps the state it had (an
  inconclusive run says nothing about the GPUs);
* a hard hardware gate (row-remap failure, XID 64/79/95, a volatile double-bit ECC error) needs no
  confirming re-run; any other fail does, and so does a warn that no telemetry gate backs (a statistical
  deficit, or repeats too unstable to judge): only a reproducible result marks a node —
  :func:`deficit_stands` counts REFERENCE §4.6's 2 of 3.

Settling a run — its re-runs, taints, the blast radius — is :mod:`._settle`'s.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pandas as pd

from ..verdict import VERDICT_RANK

__all__ = ["HARD_GATE_XIDS", "NodeDecision", "decide_nodes", "deficit_stands", "fail_stands"]

#: XIDs whose fail needs no confirming re-run (REFERENCE §4.6): row remap failure, fallen off the bus,
#: uncontained ECC error.
HARD_GATE_XIDS = frozenset({64, 79, 95})
_HARD_GATE_METRICS = frozenset({"remapped_rows_failure", "ecc_dbe_volatile"})
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


def _hard_gate(rows: pd.DataFrame) -> pd.Series:
    metric = rows["metric"].astype("string")
    value = pd.to_numeric(rows["value"], errors="coerce")
    xid = (metric == "xid") & value.isin(list(HARD_GATE_XIDS))
    return (rows["verdict"] == "fail") & (metric.isin(list(_HARD_GATE_METRICS)) | xid)


def _summary(node_rows: pd.DataFrame, worst: str) -> str:
    flagged = node_rows[node_rows["verdict"].isin(["fail", "warn", "inconclusive"])]
    if worst == "pass" or flagged.empty:
        return "all checks passed"
    first = flagged.iloc[0]
    where = f"GPU {int(first['gpu'])}" if pd.notna(first["gpu"]) else "node"
    reason = str(first["reasons"]).split(";")[0].strip() if pd.notna(first["reasons"]) else ""
    action = str(first["action"]) if pd.notna(first["action"]) and first["action"] != "none" else ""
    more = f" (+{len(flagged) - 1} more)" if len(flagged) > 1 else ""
    text = f"{first['verdict']}: {where}: {reason}{more}"
    return f"{text}; action: {action}" if action else text


def decide_nodes(verdicts: pd.DataFrame, nodes: Iterable[str]) -> dict[str, NodeDecision]:
    """Node → :class:`NodeDecision` for each of ``nodes`` (a node with no row at all is inconclusive).

    Fleet rows (no node) flag nobody and are ignored here.
    """
    rows = verdicts[verdicts["node"].notna()].copy()
    rows["rank"] = rows["verdict"].astype("string").map(VERDICT_RANK).astype("int64")
    rows["hard"] = _hard_gate(rows)
    # Worst rows first, so each node's first row is its deciding one.
    rows = rows.sort_values(["node", "rank"], ascending=[True, False], kind="stable")
    out: dict[str, NodeDecision] = {}
    groups = {str(node): part for node, part in rows.groupby("node", observed=True, sort=False)}
    for node in nodes:
        part = groups.get(node)
        if part is None or part.empty:
            out[node] = NodeDecision(node, None, None, False, "inconclusive: no result from this node")
            continue
        ranks = set(part["verdict"].astype("string"))
        if "fail" in ranks:
            worst = "fail"
        elif "warn" in ranks:
            worst = "warn"
        elif ranks == {"pass"}:
            worst = "pass"
        else:
            worst = "inconclusive"
        cause = None
        if worst == "fail":
            fails = part[part["verdict"] == "fail"]
            causes = fails["cause"].dropna().astype("string")
            causes = causes[causes != ""]
            cause = str(causes.iloc[0]) if len(causes) else "unknown"
        worst_rows = part[part["verdict"] == worst]
        out[node] = NodeDecision(
            node,
            _STATE.get(worst),
            cause,
            bool(part["hard"].any()),
            _summary(part, worst),
            corroborated=bool(worst_rows["reference_kind"].astype("string").eq("gate").any())
            if "reference_kind" in worst_rows
            else False,
        )
    return out


def deficit_stands(runs: Iterable[NodeDecision]) -> bool | None:
    """REFERENCE §4.6 over a node's runs so far (first run first), for a first run that warned or failed:
    True once 2 runs found a deficit as bad as the first's (a fail for a fail; a warn or fail for a warn),
    False once 2 did not, None while undecided. An inconclusive run counts as neither."""
    history = list(runs)
    if not history:
        return None
    if history[0].state == "failed":
        return fail_stands(history)
    deficit = sum(1 for d in history if d.state in ("degraded", "failed"))
    clean = sum(1 for d in history if d.state == "certified")
    if deficit >= 2:
        return True
    if clean >= 2 or (clean >= 1 and deficit == 0):
        return False
    return None


def fail_stands(runs: Iterable[NodeDecision]) -> bool | None:
    """REFERENCE §4.6 over a node's runs so far (first run first): True once 2 have failed, False once 2
    have not, None while undecided (run once more). An inconclusive re-run counts as neither."""
    failed = passed = 0
    for decision in runs:
        if decision.state == "failed":
            failed += 1
        elif decision.state is not None:
            passed += 1
    if failed >= 2:
        return True
    if passed >= 2 or (passed >= 1 and failed == 0):
        return False
    return None
