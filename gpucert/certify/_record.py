"""What a certify run keeps: verdict rows for nodes that could not be judged, and the baseline update.

A node whose Job failed (an image that cannot be pulled, no room to schedule, OOM, a deadline) has no results:
it gets one node-level ``inconclusive`` row that says why, never a GPU verdict. Baselines are updated in one
conditional write of a new version (:meth:`gpucert.store.BaselineStore.update`), so a run killed mid-way leaves
the previous version current, never half a table.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import pandas as pd

from ..baseline import update_store
from ..policy import Policy
from ..store import BaselineStore
from ..verdict import VERDICT_COLUMNS

_WHY = {
    "image_pull": "the benchmark image could not be pulled",
    "unschedulable": "the benchmark pod could not be scheduled on the node",
    "oom": "the benchmark was killed for memory (OOM)",
    "deadline": "the benchmark did not finish before its deadline",
    "vanished": "the benchmark Job was deleted before it finished",
    "bad_results": "the benchmark printed results that do not follow the contract",
    "leased": "another run was benchmarking the node (it holds the node's Lease)",
    "lease_lost": "another run took the node's Lease over mid-benchmark",
}


def job_failure_verdicts(run_id: str, failed: Mapping[str, tuple[str | None, str]]) -> pd.DataFrame:
    """One ``inconclusive`` node row per node whose benchmark did not produce results; ``failed`` maps node →
    (reason, message) as the wave classified it."""
    every = {  # what each such row says; only its node and why differ
        **dict.fromkeys(("gpu_uuid", "gpu_model", "peer")),
        **dict.fromkeys(("value", "reference", "deviation_pct", "z"), float("nan")),
        **dict.fromkeys(("metric", "reference_kind", "cause"), ""),
        "run_id": run_id,
        "gpu": pd.NA,
        "verdict": "inconclusive",
        "action": "retest",
        "ticket": "none",
    }
    rows = []
    for node, (reason, message) in sorted(failed.items()):
        why = _WHY.get(reason or "", "the benchmark Job failed")
        rows.append({**every, "node": node, "reasons": f"{why}{': ' + message if message else ''}"})
    frame = pd.DataFrame(rows, columns=list(VERDICT_COLUMNS))
    frame["gpu"] = frame["gpu"].astype("Int64")
    return frame


def common_stack(stacks: Mapping[str, Mapping[str, Any]]) -> dict[str, str]:
    """The stack record every node agrees on (a key the nodes disagree on reads ``mixed``)."""
    out: dict[str, str] = {}
    keys = sorted({k for s in stacks.values() for k in s})
    for key in keys:
        values = {json.dumps(s.get(key), sort_keys=True) for s in stacks.values()}
        if len(values) == 1:
            value = next(iter(stacks.values())).get(key)
            out[key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
        else:
            out[key] = "mixed"
    return out


def stack_changed_nodes(table: pd.DataFrame, stacks: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Nodes whose driver now differs from the one their own GPU baselines were measured on."""
    own = table[(table["level"] == "gpu") & table["node"].notna()][["node", "stack"]].drop_duplicates("node")
    changed = []
    for node, stack_json in zip(own["node"], own["stack"], strict=True):
        now = (stacks.get(str(node)) or {}).get("driver")
        try:
            then = json.loads(stack_json or "{}").get("driver")
        except (TypeError, ValueError):
            then = None
        if now and then and then not in ("mixed", now):
            changed.append(str(node))
    return sorted(changed)


def update_baselines(
    store: BaselineStore, results: pd.DataFrame, stacks: Mapping[str, Mapping[str, Any]], policy: Policy, *, run_id: str
) -> tuple[str, list[str]]:
    """Merge what the run's passing results teach into a new current baseline version.

    A node whose driver changed since its own baseline was taken has that baseline forgotten first, to
    be re-established from this and the next passing runs. Returns the new version and those nodes.
    """
    reset: list[str] = []

    def changed(table: pd.DataFrame) -> list[str]:
        reset[:] = stack_changed_nodes(table, stacks) if len(table) else []
        return reset

    done = update_store(
        store, results, message=f"certify {run_id}", policy=policy, stack=common_stack(stacks), forget_nodes=changed
    )
    return done.version, list(reset)
