"""Replaying a stored run: do its decisions follow from its results, its baseline and its policy?

:func:`replay` does what the certify flow did, with the functions it used, from the stored files alone; not
:func:`gpucert.certify.settle_offline`, which takes a run's nodes from its results (a node whose Job failed would
drop out) and a re-run's from what it measured rather than what the settlement asked for. Compared per node:
what follows from the verdicts alone (not the taint action, which depends on the cluster's taints at the time);
and the settled verdicts row by row, so a re-written ``verdicts.parquet`` is caught as well.
"""

from __future__ import annotations

import contextlib
import csv
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from ..certify import (
    NodeTaints,
    RunVerdicts,
    Settlement,
    job_failure_verdicts,
    rerun_verdicts,
    run_verdicts,
    settle,
    settled_verdicts,
)
from ..policy import Policy
from ._canonical import plain
from ._files import RunFiles

__all__ = ["Difference", "replay", "replay_differences"]

_COMPARED = ("state", "verdict", "cause", "hard_gate", "confirmed", "settled")
_ROW_KEY = ("node", "gpu", "peer", "metric", "reference_kind", "verdict", "cause")


class Difference(str):
    """One way the stored decisions do not follow from the stored results, in words naming the node."""

    __slots__ = ()


@contextlib.contextmanager
def _with_floors(policy: Policy, floors: Mapping[tuple[str, str], float]) -> Iterator[Policy]:
    """``policy`` judging by the recorded spec floors (not whatever floors this gpucert ships or the named
    file now holds): written to a temporary CSV the policy points at, as a policy's own floors are."""
    with tempfile.TemporaryDirectory(prefix="gpucert-floors-") as folder:
        path = Path(folder) / "spec_floors.csv"
        with path.open("w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out)
            writer.writerow(["gpu_model", "metric", "floor"])
            for (model, name), floor in sorted(floors.items()):
                writer.writerow([model, name, repr(floor)])
        yield policy.model_copy(update={"spec_floors_file": str(path)})


def replay(files: RunFiles) -> tuple[Settlement, pd.DataFrame, list[Difference]]:
    """The settlement and settled verdicts the run's stored results lead to, and what in the folder's
    re-runs does not fit the replay (a re-run stored that the settlement never asked for)."""
    record = files.policy()
    stored = files.decisions()
    first_results = files.results()
    measured = set(first_results["node"].astype(str)) if first_results is not None else set()
    # Every node the run benchmarked has a decision; one with results but no decision is a decision removed.
    nodes = tuple(sorted(set(stored["node"].astype(str)) | measured))
    problems: list[Difference] = []
    with _with_floors(record.policy, record.floors) as policy:
        # Nodes without results had a failed Job: one inconclusive row each, as the flow writes.
        failed = {n: (None, "") for n in nodes if n not in measured}
        first_verdicts = run_verdicts(
            files.run_id, first_results, failed, files.baseline(), policy, plan=files.links_plan(policy)
        )
        first = RunVerdicts(files.run_id, first_verdicts, nodes)
        fleet = {n: NodeTaints() for n in nodes}
        settlement = settle(first, [], fleet=fleet, policy=policy, observe_only=policy.observe_only)
        reruns: list[RunVerdicts] = []
        for attempt in files.reruns():
            pending = settlement.pending
            if not pending:
                problems.append(
                    Difference(
                        f"{files.key('verdicts.parquet', attempt)}: re-run {attempt} is stored, but the re-judgement "
                        "leaves no node pending before it"
                    )
                )
                break
            rerun_id = files.rerun_id(attempt)
            with _with_floors(files.policy(attempt).policy, files.policy(attempt).floors) as rerun_policy:
                results = files.results(attempt)
                if results is None or results.empty:
                    verdicts = job_failure_verdicts(rerun_id, {})
                else:
                    verdicts = rerun_verdicts(results, first_results, pending, files.baseline(attempt), rerun_policy)
            reruns.append(RunVerdicts(rerun_id, verdicts, tuple(pending)))
            settlement = settle(first, reruns, fleet=fleet, policy=policy, observe_only=policy.observe_only)
    return settlement, settled_verdicts(first_verdicts, settlement), problems


def _word(value: Any) -> str:
    found = plain(value)
    return "none" if found is None or found == "" else str(found)


def _row_keys(frame: pd.DataFrame) -> list[tuple[str, ...]]:
    columns = [c for c in _ROW_KEY if c in frame.columns]
    rows = frame[columns].astype(object).to_dict(orient="records")
    return sorted(tuple(_word(r[c]) for c in columns) for r in rows)


def replay_differences(files: RunFiles) -> list[Difference]:
    """Where the run's stored decisions (``decisions.parquet``) and settled verdicts (``verdicts.parquet``)
    differ from what its stored results, baseline and policy lead to; empty when they follow. Raises
    :class:`~._files.FileProblem` naming a stored file that is missing or cannot be read."""
    settlement, verdicts, problems = replay(files)
    stored = files.decisions()
    recorded = {str(r["node"]): r for r in stored.astype(object).to_dict(orient="records")}
    for node in sorted(set(recorded) | set(settlement.decisions)):
        mine = settlement.decisions.get(node)
        theirs = recorded.get(node)
        if mine is None or theirs is None:
            where = "decisions.parquet has no row for it" if theirs is None else "the re-judgement has no decision"
            problems.append(Difference(f"node {node}: {where}"))
            continue
        again = {name: getattr(mine, name) for name in _COMPARED} | {"runs": ",".join(mine.runs)}
        for name in again:
            if _word(theirs.get(name)) != _word(again[name]):
                problems.append(
                    Difference(
                        f"node {node}: decisions.parquet says {name} {_word(theirs.get(name))}, "
                        f"the re-judgement {_word(again[name])}"
                    )
                )
    stored_verdicts = files.verdicts()
    if stored_verdicts is None:
        problems.append(Difference(f"{files.key('verdicts.parquet')}: not in the store"))
        return problems
    theirs_rows, mine_rows = _row_keys(stored_verdicts), _row_keys(verdicts)
    if theirs_rows != mine_rows:
        extra = sorted(set(theirs_rows) - set(mine_rows)) or sorted(set(mine_rows) - set(theirs_rows))
        node = extra[0][0] if extra else "?"
        problems.append(
            Difference(
                f"node {node}: verdicts.parquet does not follow from the results "
                f"(first differing row: {', '.join(extra[0]) if extra else 'row counts differ'})"
            )
        )
    return problems
