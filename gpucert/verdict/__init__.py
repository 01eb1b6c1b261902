"""The verdict engine: results and baselines in, one explained verdict per GPU, node and pair out.

Its stages, and the modules that hold them, are docs/design/verdict-engine.md's. Everything is vectorised over
the fleet; the only Python loops run over runs, metrics, cohorts, blocks of results, or the (few) flagged
entities. Steps that need only the run's index (the telemetry gates, the store's references) run on a second
thread beside the repeats: numpy leaves the interpreter to the other thread most of the time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .._background import in_background
from ..policy import Policy, default_policy, spec_floors
from ._assemble import VERDICT_COLUMNS, assemble, escalate_nodes, with_layer
from ._causes import ACTION_FOR_CAUSE, LAYER_OF_CAUSE, LAYERS, attribute_causes, layer_of
from ._compare import StoredReferences, compare_references
from ._findings import TICKET_RANK, VERDICT_OF, VERDICT_RANK, concat_findings
from ._gates import gate_findings, missing_findings, node_wide_gate_findings
from ._index import METRIC_NAMES, SCOPE_NAMES, RunIndex, index_run
from ._nodes import node_wide_findings, pair_node_findings
from ._repeats import reduce_repeats, repeat_matrix_stability

__all__ = [
    "ACTION_FOR_CAUSE",
    "LAYERS",
    "LAYER_OF_CAUSE",
    "TICKET_RANK",
    "VERDICT_COLUMNS",
    "VERDICT_OF",
    "VERDICT_RANK",
    "RunEvaluation",
    "evaluate_run",
    "judge",
    "judge_run",
    "layer_of",
    "repeat_matrix_stability",
    "with_layer",
]


@dataclass(frozen=True)
class RunEvaluation:
    """A run's verdicts, and the medians they were made from (what a baseline learns)."""

    verdicts: pd.DataFrame
    #: scope, node, gpu, gpu_uuid, gpu_model, peer, metric, x (median of repeats), n (repeats);
    #: empty unless asked for (only a baseline build needs them)
    medians: pd.DataFrame


def judge(
    results: pd.DataFrame,
    baseline: pd.DataFrame,
    policy: Policy | None = None,
    floors: dict[tuple[str, str], float] | None = None,
) -> pd.DataFrame:
    """Verdicts for every run in ``results`` (canonical dtypes) against ``baseline`` (the store's table)."""
    policy = policy or default_policy()
    floors = spec_floors(policy) if floors is None else floors
    run_ids = results["run_id"].unique()
    if len(run_ids) == 1:  # the usual case: no split, no copy of a fleet's rows
        runs = [judge_run(results, baseline, policy, floors)]
    else:
        runs = [
            judge_run(part, baseline, policy, floors) for _, part in results.groupby("run_id", observed=True, sort=True)
        ]
    if not runs:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in VERDICT_COLUMNS})
    return pd.concat(runs, ignore_index=True)


def judge_run(
    results: pd.DataFrame, baseline: pd.DataFrame, policy: Policy, floors: dict[tuple[str, str], float]
) -> pd.DataFrame:
    """Verdicts for one run."""
    return evaluate_run(results, baseline, policy, floors).verdicts


def evaluate_run(
    results: pd.DataFrame,
    baseline: pd.DataFrame,
    policy: Policy,
    floors: dict[tuple[str, str], float],
    *,
    with_medians: bool = False,
) -> RunEvaluation:
    """Verdicts (and, when asked, the medians they were judged on) for one run."""
    run = index_run(results)
    # What needs the run's index alone is made on a second thread while the repeats are reduced.
    beside = in_background(lambda: _from_the_index(run, baseline, policy), name="gpucert-judge")
    measured, repeat_findings = reduce_repeats(run, policy)
    references, gates, node_gates = beside()
    missing = in_background(lambda: missing_findings(run, measured), name="gpucert-judge")  # medians alone
    compared = compare_references(run, measured, references, policy, floors)
    gate_causes = (
        node_gates.drop_duplicates("node").set_index("node")["cause"] if len(node_gates) else pd.Series(dtype=object)
    )
    node_stats = node_wide_findings(run, compared.table, policy, gate_causes)
    node_causes = pd.concat([gate_causes, node_stats.drop_duplicates("node").set_index("node")["cause"]])
    node_causes = node_causes[~node_causes.index.duplicated()]
    findings = concat_findings([gates, node_gates, node_stats, repeat_findings, compared.findings, missing()])
    findings = attribute_causes(run, findings, node_causes, policy)
    findings = concat_findings(
        [findings, escalate_nodes(findings), pair_node_findings(run, compared.table, policy, findings), compared.fleet]
    )
    medians = _medians(run, measured) if with_medians else pd.DataFrame()
    return RunEvaluation(verdicts=assemble(run, findings), medians=medians)


def _from_the_index(
    run: RunIndex, baseline: pd.DataFrame, policy: Policy
) -> tuple[StoredReferences, pd.DataFrame, pd.DataFrame]:
    """The stored references keyed on the run's codes, its telemetry gates and its node-wide gates."""
    gates = gate_findings(run, policy)
    return StoredReferences.of(run, baseline), gates, node_wide_gate_findings(run, gates, policy)


def _medians(run: RunIndex, measured: pd.DataFrame) -> pd.DataFrame:
    eids = measured["eid"].to_numpy()
    return pd.DataFrame(
        {
            "scope": np.asarray(SCOPE_NAMES, dtype=object)[run.scope[eids]],
            "node": run.node_names(eids),
            "gpu": run.gpu[eids],
            "gpu_uuid": run.uuid_names(eids),
            "gpu_model": run.model_names(eids),
            "peer": run.peer_names(eids),
            "metric": np.asarray(METRIC_NAMES, dtype=object)[measured["mcode"].to_numpy()],
            "x": measured["x"].to_numpy(),
            "n": measured["n"].to_numpy(),
        }
    )
