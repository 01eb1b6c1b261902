"""Settling a run: its first verdicts and its confirming re-runs → one :class:`SettledDecision` per node.

:func:`settle` is the one place the run's rules live, as a pure function (tested without a cluster):
confirmation, taints (and the clearing rule), the blast radius and observe-only, as
docs/design/certify-runbook.md ("Confirm", "Settle", "Blast radius") states them. :func:`settled_verdicts`
then makes the verdict table agree with the decisions, so labels, conditions, taints, tickets and the report,
all made from the same decision, can never disagree.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from typing import Any, Final, Literal

import pandas as pd

from ..kube import has_taint, node_name, taint_keys
from ..policy import Policy
from ..tickets import CAUSE_METRICS, not_measured
from ..tickets import measured as measured_on
from ..verdict import VERDICT_RANK
from ._decide import NodeDecision, decide_nodes, deficit_stands, fail_stands

TaintAction = Literal["added", "kept", "lifted", "refused", "none"]
#: The state each settled state reads as in a verdict table.
_VERDICT_OF: Final = {"certified": "pass", "degraded": "warn", "failed": "fail", None: "inconclusive"}
#: ``decisions.parquet``, one row per node (docs/design/data-contracts.md, "Decisions").
DECISION_COLUMNS: Final = (
    "run_id",
    "node",
    "state",
    "verdict",
    "cause",
    "hard_gate",
    "confirmed",
    "taint",
    "runs",
    "summary",
    "settled",
    "decided_at",
)


@dataclass(frozen=True)
class NodeTaints:
    """gpucert's taints a GPU node carries now, and the cause the ``unhealthy`` one was put on for."""

    unhealthy: bool = False
    uncertified: bool = False
    cause: str = ""


@dataclass(frozen=True)
class RunVerdicts:
    """One judged run: its id, its verdict table, and the nodes it benchmarked (a node with no row is
    inconclusive in it)."""

    run_id: str
    verdicts: pd.DataFrame
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class SettledDecision:
    """What a run, its re-runs included, concluded about one node."""

    node: str
    #: ``certified``, ``degraded``, ``failed``; None leaves the state as it was (inconclusive).
    state: str | None
    #: The taint's value on a fail: the cause of its worst row (``unknown`` when none).
    cause: str | None
    hard_gate: bool
    #: The fail stands: a hard gate, or 2 of the node's runs failed.
    confirmed: bool
    taint: TaintAction
    #: The runs the decision rests on, first run first.
    runs: tuple[str, ...]
    summary: str
    #: False when the node needs one more run before its decision is final.
    settled: bool = True

    @property
    def verdict(self) -> str:
        """The decision as a verdict: pass, warn, fail or inconclusive."""
        return _VERDICT_OF[self.state]


@dataclass(frozen=True)
class Settlement:
    """A run's decisions, node → :class:`SettledDecision`, and the incident that paused tainting."""

    run_id: str
    decisions: Mapping[str, SettledDecision]
    incident: str | None = None
    #: How many of gpucert's taints are in force after the run, and the blast radius's limit.
    in_force: int = 0
    limit: int = 0
    #: Node → why its taint was kept: this run passed it without measuring the taint's cause (clearing rule).
    unmeasured: Mapping[str, str] = field(default_factory=dict)

    @property
    def pending(self) -> list[str]:
        """Nodes that need one more run (their deficit is neither reproduced nor refuted yet)."""
        return sorted(n for n, d in self.decisions.items() if not d.settled)

    def reasons(self) -> dict[str, str]:
        """Node → why it is marked as it is (its state and summary), for the audit trail."""
        return {n: f"{d.state}: {d.summary}" if d.summary else str(d.state) for n, d in self.decisions.items()}

    def tally(self) -> dict[str, int]:
        """How many nodes of each state (``unchanged`` for inconclusive)."""
        return tally_states(d.state for d in self.decisions.values())

    def frame(self, decided_at: datetime | None = None) -> pd.DataFrame:
        """The decisions as ``decisions.parquet`` rows (DECISION_COLUMNS), by node; ``decided_at`` (UTC)
        stamps them, so decisions of many runs sort in time."""
        stamp = pd.Timestamp(decided_at) if decided_at is not None else pd.NaT
        rows = [
            {**asdict(d), "run_id": self.run_id, "verdict": d.verdict, "runs": ",".join(d.runs), "decided_at": stamp}
            for _, d in sorted(self.decisions.items())
        ]
        frame = pd.DataFrame(rows, columns=list(DECISION_COLUMNS))
        for column in ("run_id", "node", "state", "verdict", "cause", "taint", "runs", "summary"):
            frame[column] = frame[column].astype("string")
        frame["decided_at"] = pd.to_datetime(frame["decided_at"], utc=True)
        return frame.astype({"hard_gate": bool, "confirmed": bool, "settled": bool})


def tally_states(states: Iterable[str | None]) -> dict[str, int]:
    """How many of each state (``unchanged`` for None: an inconclusive node keeps its label)."""
    return dict(Counter(state or "unchanged" for state in states))


def _conclude(history: Sequence[tuple[str, NodeDecision]]) -> tuple[NodeDecision, bool, bool, tuple[str, ...]]:
    """(the decision, confirmed, settled, the runs it rests on) from a node's runs, first run first
    (docs/design/certify-runbook.md, "Confirm")."""
    runs = tuple(run for run, _ in history)
    first = history[0][1]
    if not first.needs_confirmation:
        return first, first.state in ("failed", "degraded"), True, runs[:1]
    decisions = [d for _, d in history]
    reruns = ", ".join(runs[1:]) or "none yet"
    if first.state == "failed":
        stands = fail_stands(decisions)
        if stands is True:
            return first, True, True, runs
        if stands is None:
            return _undecided(first, reruns), False, False, runs
    stands = deficit_stands(decisions)  # a fail not reproduced as one may still be a reproduced deficit
    if stands is None:
        return _undecided(first, reruns), False, False, runs
    if stands:
        text = f"{first.summary} (reproduced as a warn by its re-runs: {reruns})"
        return NodeDecision(first.node, "degraded", None, False, text), True, True, runs
    text = f"passed its re-runs ({reruns}); not reproduced: {first.summary}"
    return NodeDecision(first.node, "certified", None, False, text), False, True, runs


def _undecided(first: NodeDecision, reruns: str) -> NodeDecision:
    text = f"{first.summary} (not reproduced or refuted yet; re-runs so far: {reruns})"
    return NodeDecision(first.node, None, None, False, text)


def _taint_action(
    state: str | None, *, confirmed: bool, settled: bool, taints: NodeTaints, observe: bool
) -> TaintAction:
    if observe or state is None or not settled:
        return "kept" if taints.unhealthy else "none"
    if state == "failed":  # confirmed by then: an unconfirmed fail is degraded or undecided
        return "kept" if taints.unhealthy else ("added" if confirmed else "none")
    # Passing lifts both of gpucert's taints (an onboarded node is admitted); degraded only the unhealthy one.
    lift = taints.unhealthy or (state == "certified" and taints.uncertified)
    return "lifted" if lift else "none"


def settle(
    first: RunVerdicts,
    reruns: Iterable[RunVerdicts],
    *,
    fleet: Mapping[str, NodeTaints],
    policy: Policy,
    observe_only: bool = False,
    measured: pd.DataFrame | None = None,
) -> Settlement:
    """Each of ``first.nodes``'s final decision (see the module docstring).

    ``reruns`` are the confirming re-runs so far, in order; ``fleet`` maps every GPU node of the cluster
    to gpucert's taints on it now (the blast radius counts the fleet's ``unhealthy`` taints, not this
    run's); ``observe_only`` changes nothing but the taint actions. ``measured`` is what the run measured
    (its results table): a taint whose cause it did not measure on the node is kept, never lifted
    (:func:`gpucert.tickets.measured`); None skips that check (no results table to tell).
    """
    histories: dict[str, list[tuple[str, NodeDecision]]] = {
        n: [(first.run_id, d)] for n, d in decide_nodes(first.verdicts, first.nodes).items()
    }
    for rerun in reruns:
        for node, decision in decide_nodes(rerun.verdicts, rerun.nodes).items():
            if node in histories:
                histories[node].append((rerun.run_id, decision))

    decisions: dict[str, SettledDecision] = {}
    for node, history in histories.items():
        decision, confirmed, settled, runs = _conclude(history)
        action = _taint_action(
            decision.state,
            confirmed=confirmed,
            settled=settled,
            taints=fleet.get(node, NodeTaints()),
            observe=observe_only,
        )
        summary = decision.summary
        if confirmed and len(runs) > 1:
            summary = f"{summary} (confirmed by {', '.join(runs[1:])})"
        decisions[node] = SettledDecision(
            node, decision.state, decision.cause, decision.hard_gate, confirmed, action, runs, summary, settled
        )

    unmeasured = _keep_unmeasured(decisions, fleet, measured) if measured is not None else {}
    lifted = {n for n, d in decisions.items() if d.taint == "lifted"}
    added = {n for n, d in decisions.items() if d.taint == "added"}
    in_force = ({n for n, t in fleet.items() if t.unhealthy} - lifted) | added
    limit = policy.max_tainted_nodes(len(fleet))
    incident = None
    if len(in_force) > limit:
        incident = (
            f"{len(in_force)} GPU nodes would carry gpucert's unhealthy taint ({len(added)} new), more than the "
            f"blast radius allows ({limit} of {len(fleet)}): the baseline, the benchmark or the stack is the "
            "likelier culprit; no taint was added"
        )
        for node in added:
            d = decisions[node]
            decisions[node] = replace(d, taint="refused", summary=f"{d.summary} (not tainted: blast radius reached)")
        in_force -= added
    return Settlement(first.run_id, decisions, incident, len(in_force), limit, unmeasured)


def settled_verdicts(verdicts: pd.DataFrame, settlement: Settlement) -> pd.DataFrame:
    """``verdicts`` (the first run's) made to agree with ``settlement``: no row of a node is worse than its
    decision — a fail its re-runs reproduced only as a warn reads ``warn``, a deficit they did not
    reproduce ``pass``, one still undecided ``inconclusive`` — and a lowered row asks for no ticket and
    says why. Other rows are unchanged."""
    node = verdicts["node"].astype("string")
    cap = node.map({n: VERDICT_RANK[d.verdict] for n, d in settlement.decisions.items()})
    rank = verdicts["verdict"].astype("string").map(VERDICT_RANK)
    rows = (cap.notna() & (rank > cap)).fillna(False).astype(bool)
    if not rows.any():
        return verdicts
    # Categorical columns may lack the new values: plain strings from here on.
    out = verdicts.astype({"verdict": "string", "ticket": "string", "reasons": "string"})
    why = {
        n: ("not reproduced by the re-runs: " + (", ".join(d.runs[1:]) or "none"))
        if d.settled
        else f"not settled yet: re-runs so far {', '.join(d.runs[1:]) or 'none'}"
        for n, d in settlement.decisions.items()
    }
    note = " (" + node[rows].map(why).astype(str) + ")"
    out.loc[rows, "reasons"] = out.loc[rows, "reasons"].fillna("") + note
    out.loc[rows, "verdict"] = node[rows].map({n: d.verdict for n, d in settlement.decisions.items()})
    out.loc[rows, "ticket"] = "none"
    return out


def fleet_taints(nodes: Iterable[Mapping[str, Any]], *, prefix: str) -> dict[str, NodeTaints]:
    """GPU node name → gpucert's taints on it, from the Node objects."""
    unhealthy, uncertified = taint_keys(prefix)
    return {
        node_name(n): NodeTaints(
            unhealthy=has_taint(n, unhealthy), uncertified=has_taint(n, uncertified), cause=_taint_value(n, unhealthy)
        )
        for n in nodes
    }


def _taint_value(node: Mapping[str, Any], key: str) -> str:
    return next(
        (str(t.get("value") or "") for t in (node.get("spec") or {}).get("taints") or () if t.get("key") == key), ""
    )


def _keep_unmeasured(
    decisions: dict[str, SettledDecision], fleet: Mapping[str, NodeTaints], measured_rows: pd.DataFrame
) -> dict[str, str]:
    """The clearing rule for taints: a taint a decision would lift stays, and the node's state with it, when
    the run did not measure the taint's cause on the node (a storage fault, and no storage location
    configured this time); its summary says so. One vectorised check over every such node. Returns node →
    why, for each taint kept."""
    lifting = [n for n, d in sorted(decisions.items()) if d.taint == "lifted" and fleet.get(n, NodeTaints()).unhealthy]
    if not lifting:
        return {}
    causes = [fleet[n].cause or "unknown" for n in lifting]
    metrics = [CAUSE_METRICS.get(c, CAUSE_METRICS["unknown"]) for c in causes]
    faults = pd.DataFrame(
        {"node": lifting, "gpu_uuid": "", "gpu": pd.array([None] * len(lifting), dtype="Int64"), "metrics": metrics}
    )
    seen = measured_on(faults, measured_rows)
    kept: dict[str, str] = {}
    for node, cause, wanted, ok in zip(lifting, causes, metrics, seen, strict=True):
        if ok:
            continue
        d = decisions[node]
        kept[node] = f"taint {cause} kept: {not_measured(cause, node, wanted)}"
        decisions[node] = replace(d, state=None, taint="kept", summary=f"{d.summary}; {kept[node]}")
    return kept
