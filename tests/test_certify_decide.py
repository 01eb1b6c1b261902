"""Verdicts → node decisions, the 2-of-3 rule, the blast radius, and the node patch they become."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pandas as pd
import pytest

from gpucert.certify import (
    NodeDecision,
    blast_radius_limit,
    decide_nodes,
    fail_stands,
    job_failure_verdicts,
    node_patch,
)

NOW = datetime(2026, 12, 2, 3, 0, tzinfo=UTC)


def _v(
    node: str,
    verdict: str,
    *,
    gpu: int | None = 0,
    metric: str = "",
    value: float = float("nan"),
    cause: str = "",
    action: str = "none",
    reasons: str = "",
) -> dict[str, Any]:
    return {"run_id": "r", "node": node, "gpu": gpu, "verdict": verdict, "metric": metric, "value": value,
            "cause": cause, "action": action, "reasons": reasons}  # fmt: skip


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    frame["gpu"] = frame["gpu"].astype("Int64")
    return frame


def test_states_causes_and_hard_gates() -> None:
    verdicts = _frame([
        _v("ok", "pass"), _v("ok", "pass", gpu=1),
        _v("slow", "pass"), _v("slow", "fail", gpu=3, metric="gemm_bf16_tflops", cause="pcie", action="reseat",
                                 reasons="GEMM 8 % below its own baseline; PCIe Gen4"),
        _v("remap", "fail", metric="remapped_rows_failure", value=1, cause="row_remap"),
        _v("xid79", "fail", metric="xid", value=79, cause="xid"),
        _v("xid13", "fail", metric="xid", value=13, cause=""),
        _v("meh", "warn", cause="thermal"),
        _v("unknown", "pass"), _v("unknown", "inconclusive", gpu=None),
        {**_v("", "warn", gpu=None), "node": None},  # a fleet row flags nobody
    ])  # fmt: skip
    d = decide_nodes(verdicts, ["ok", "slow", "remap", "xid79", "xid13", "meh", "unknown", "absent"])
    assert (d["ok"].state, d["ok"].summary) == ("certified", "all checks passed")
    assert (d["slow"].state, d["slow"].cause, d["slow"].needs_confirmation) == ("failed", "pcie", True)
    assert d["slow"].summary == "fail: GPU 3: GEMM 8 % below its own baseline; action: reseat"
    assert d["remap"].hard_gate
    assert not d["remap"].needs_confirmation
    assert d["xid79"].hard_gate
    assert not d["xid13"].hard_gate
    assert d["xid13"].cause == "unknown"
    assert d["meh"].state == "degraded"
    assert d["unknown"].state is None  # pass + inconclusive: leave the state as it was
    assert d["absent"].state is None


@pytest.mark.parametrize(
    ("states", "stands"),
    [
        (["failed"], None),
        (["failed", "failed"], True),
        (["failed", "certified"], None),
        (["failed", "certified", "failed"], True),
        (["failed", "certified", "degraded"], False),
        (["failed", None], None),
        (["failed", None, "failed"], True),
    ],
)
def test_a_fail_stands_when_two_of_three_runs_fail(states: list[str | None], stands: bool | None) -> None:
    runs = [NodeDecision("n", s, None, False, "") for s in states]
    assert fail_stands(runs) is stands


def test_blast_radius() -> None:
    assert blast_radius_limit(16, min_nodes=3, fraction=0.1) == 3
    assert blast_radius_limit(1000, min_nodes=3, fraction=0.1) == 100


def _node(taints: list[dict[str, str]] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "n", "resourceVersion": "7", "labels": labels or {}, "annotations": {}},
            "spec": {"taints": taints or []}}  # fmt: skip


OTHER = {"key": "team.example/maintenance", "effect": "NoSchedule"}


def test_a_confirmed_fail_is_tainted_and_other_taints_kept() -> None:
    failed = NodeDecision("n", "failed", "pcie", False, "fail: GPU 3")
    patch, change = node_patch(_node([OTHER]), failed, prefix="gpucert.io", run_id="r1", now=NOW, taint=True,
                               observe_only=False)  # fmt: skip
    assert patch is not None
    assert patch["metadata"]["resourceVersion"] == "7"  # a concurrent change makes the server answer 409
    assert patch["metadata"]["labels"] == {"gpucert.io/state": "failed"}
    assert patch["spec"]["taints"] == [
        OTHER,
        {"key": "gpucert.io/unhealthy", "value": "pcie", "effect": "NoSchedule"},
    ]
    assert change.taint == "added"
    untainted, _ = node_patch(_node(), failed, prefix="gpucert.io", run_id="r1", now=NOW, taint=False,
                              observe_only=False)  # fmt: skip
    assert untainted is not None
    assert "spec" not in untainted  # not confirmed or over the blast radius: labels only


def test_a_pass_lifts_gpucert_taints_and_observe_only_touches_none() -> None:
    mine = [{"key": "gpucert.io/unhealthy", "value": "pcie", "effect": "NoSchedule"},
            {"key": "gpucert.io/uncertified", "effect": "NoSchedule"}, OTHER]  # fmt: skip
    passed = NodeDecision("n", "certified", None, False, "all checks passed")
    patch, change = node_patch(_node(mine), passed, prefix="gpucert.io", run_id="r2", now=NOW, taint=False,
                               observe_only=False)  # fmt: skip
    assert patch is not None
    assert patch["spec"]["taints"] == [OTHER]
    assert patch["metadata"]["annotations"]["gpucert.io/certified-at"] == "2026-12-02T03:00:00Z"
    assert change.taint == "lifted"
    observed, change = node_patch(_node(mine), passed, prefix="gpucert.io", run_id="r2", now=NOW, taint=True,
                                  observe_only=True)  # fmt: skip
    assert observed is not None
    assert "spec" not in observed
    assert change.taint is None


def test_nothing_to_write_is_no_patch() -> None:
    passed = NodeDecision("n", "certified", None, False, "all checks passed")
    node = _node(labels={"gpucert.io/state": "certified"})
    node["metadata"]["annotations"] = {"gpucert.io/last-run": "r", "gpucert.io/summary": "all checks passed",
                                       "gpucert.io/certified-at": "2026-12-02T03:00:00Z"}  # fmt: skip
    patch, change = node_patch(node, passed, prefix="gpucert.io", run_id="r", now=NOW, taint=False,
                               observe_only=False)  # fmt: skip
    assert patch is None
    assert change.labels == {}


def test_failed_jobs_become_inconclusive_node_rows() -> None:
    rows = job_failure_verdicts("r", {"b": ("image_pull", "ErrImagePull"), "a": ("deadline", "")})
    assert list(rows["node"]) == ["a", "b"]
    assert set(rows["verdict"]) == {"inconclusive"}
    assert rows["gpu"].isna().all()
    assert rows.loc[1, "reasons"] == "the benchmark image could not be pulled: ErrImagePull"
    assert decide_nodes(rows, ["a"])["a"].state is None
