"""Verdicts → node decisions; settling a run (the 2-of-3 rule, taints, the blast radius over every taint
in force, observe-only); the node patch and the ``GpuCertified`` condition a decision becomes."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpucert.certify import (
    CONDITION,
    NodeDecision,
    NodeTaints,
    RunVerdicts,
    SettledDecision,
    condition_patch,
    decide_nodes,
    fail_stands,
    job_failure_verdicts,
    node_patch,
    settle,
    settled_verdicts,
)
from gpucert.policy import default_policy

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
    return {
        "run_id": "r",
        "node": node,
        "gpu": gpu,
        "verdict": verdict,
        "metric": metric,
        "value": value,
        "cause": cause,
        "action": action,
        "reasons": reasons,
    }


def _frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    frame = pd.DataFrame(rows)
    frame["gpu"] = frame["gpu"].astype("Int64")
    return frame


def _decide_one_by_one(verdicts: pd.DataFrame, node: str) -> tuple[Any, ...]:
    """The rules of decide_nodes for one node, written the plain way (the oracle of the property below)."""
    rows = verdicts[verdicts["node"] == node]
    if rows.empty:
        return (None, None, False, "inconclusive: no result from this node", False)
    order = ["pass", "inconclusive", "warn", "fail"]
    worst = max(rows["verdict"], key=order.index)
    ranked = sorted(range(len(rows)), key=lambda i: -order.index(rows["verdict"].iloc[i]))  # stable
    rows = rows.iloc[ranked]
    flagged = rows[rows["verdict"] != "pass"]
    if worst == "pass":
        summary = "all checks passed"
    else:
        first = flagged.iloc[0]
        where = f"GPU {int(first['gpu'])}" if pd.notna(first["gpu"]) else "node"
        more = f" (+{len(flagged) - 1} more)" if len(flagged) > 1 else ""
        summary = f"{first['verdict']}: {where}: {str(first['reasons']).split(';')[0].strip()}{more}"
        if first["action"] != "none":
            summary += f"; action: {first['action']}"
    named = rows[(rows["verdict"] == "fail") & (rows["cause"] != "")]["cause"]
    cause = (named.iloc[0] if len(named) else "unknown") if worst == "fail" else None
    hard = bool(
        (
            (rows["verdict"] == "fail") & rows["metric"].isin(["remapped_rows_failure", "ecc_dbe_volatile"])
            | ((rows["verdict"] == "fail") & (rows["metric"] == "xid") & rows["value"].isin([64, 79, 95]))
        ).any()
    )
    gate = bool(((rows["verdict"] == worst) & (rows["reference_kind"] == "gate")).any())
    return ({"pass": "certified", "warn": "degraded", "fail": "failed"}.get(worst), cause, hard, summary, gate)


@pytest.mark.parametrize("seed", range(6))
def test_decisions_made_for_the_whole_table_at_once_match_the_rules_node_by_node(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 400))
    nodes = [f"n{i:02d}" for i in rng.integers(0, 40, n)]
    verdicts = _frame(
        [
            {
                **_v(
                    node,
                    str(rng.choice(["pass", "pass", "pass", "warn", "fail", "inconclusive"])),
                    gpu=None if rng.random() < 0.2 else int(rng.integers(0, 8)),
                    metric=str(rng.choice(["gemm_bf16_tflops", "xid", "remapped_rows_failure", "h2d_gbps"])),
                    value=float(rng.choice([13, 64, 79, 1.0])),
                    cause=str(rng.choice(["", "pcie", "thermal"])),
                    action=str(rng.choice(["none", "reseat"])),
                    reasons=f"reason {i}; more",
                ),
                "reference_kind": str(rng.choice(["peer", "gate", "own"])),
            }
            for i, node in enumerate(nodes)
        ]
    )
    asked = [*sorted(set(nodes)), "absent"]
    decided = decide_nodes(verdicts, asked)
    for node in asked:
        d = decided[node]
        assert (d.state, d.cause, d.hard_gate, d.summary, d.corroborated) == _decide_one_by_one(verdicts, node)


def test_states_causes_and_hard_gates() -> None:
    verdicts = _frame(
        [
            _v("ok", "pass"),
            _v("ok", "pass", gpu=1),
            _v("slow", "pass"),
            _v(
                "slow",
                "fail",
                gpu=3,
                metric="gemm_bf16_tflops",
                cause="pcie",
                action="reseat",
                reasons="GEMM 8 % below its own baseline; PCIe Gen4",
            ),
            _v("remap", "fail", metric="remapped_rows_failure", value=1, cause="row_remap"),
            _v("xid79", "fail", metric="xid", value=79, cause="xid"),
            _v("xid13", "fail", metric="xid", value=13, cause=""),
            _v("meh", "warn", cause="thermal"),
            _v("unknown", "pass"),
            _v("unknown", "inconclusive", gpu=None),
            {**_v("", "warn", gpu=None), "node": None},  # a fleet row flags nobody
        ]
    )
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


def test_blast_radius_limit() -> None:
    policy = default_policy()
    assert policy.max_tainted_nodes(16) == 3
    assert policy.max_tainted_nodes(1000) == 100


# --- settling a run --------------------------------------------------------------------------------------

FAIL_ROW = {
    "metric": "gemm_bf16_tflops",
    "cause": "slow_silicon",
    "reasons": "GEMM 9 % below its peers",
    "ticket": "remediation",
}


def _run(run_id: str, rows: dict[str, str]) -> RunVerdicts:
    """A judged run: node → its one GPU row's verdict (fail rows carry a statistical fail, no hard gate)."""
    frame = _frame(
        [
            {
                **_v(n, v),
                **(FAIL_ROW if v == "fail" else {}),
                "run_id": run_id,
                "ticket": FAIL_ROW["ticket"] if v == "fail" else "none",
            }
            for n, v in rows.items()
        ]
    )
    return RunVerdicts(run_id, frame, tuple(rows))


def _fleet(n: int, tainted: tuple[str, ...] = ()) -> dict[str, NodeTaints]:
    return {f"n{i}": NodeTaints(unhealthy=f"n{i}" in tainted) for i in range(n)}


def test_a_statistical_fail_needs_a_rerun_and_stands_when_two_runs_fail() -> None:
    first = _run("r", {"n0": "fail", "n1": "pass", "n2": "fail"})
    pending = settle(first, [], fleet=_fleet(40), policy=default_policy())
    assert pending.pending == ["n0", "n2"]
    assert pending.decisions["n0"].taint == "none"  # never a taint on a guess
    assert pending.decisions["n0"].state is None  # undecided: inconclusive, the label stays as it was
    rerun = _run("r-c1", {"n0": "fail", "n2": "pass"})
    after = settle(first, [rerun], fleet=_fleet(40), policy=default_policy())
    n0, n2 = after.decisions["n0"], after.decisions["n2"]
    assert (n0.state, n0.confirmed, n0.taint, n0.runs) == ("failed", True, "added", ("r", "r-c1"))
    assert "confirmed by r-c1" in n0.summary
    assert after.pending == ["n2"]  # 1 fail, 1 pass: one more run decides
    third = settle(first, [rerun, _run("r-c2", {"n2": "pass"})], fleet=_fleet(40), policy=default_policy())
    n2 = third.decisions["n2"]
    assert (n2.state, n2.confirmed, n2.taint, n2.settled) == ("certified", False, "none", True)
    assert "not reproduced" in n2.summary  # a one-off: the node passes, nothing marks it
    assert third.pending == []
    assert third.tally() == {"failed": 1, "certified": 2}


def test_a_statistical_warn_is_degraded_only_when_a_rerun_reproduces_it() -> None:
    first = _run("r", {"n0": "warn", "n1": "warn", "n2": "fail"})
    assert settle(first, [], fleet=_fleet(40), policy=default_policy()).pending == ["n0", "n1", "n2"]
    rerun = _run("r-c1", {"n0": "warn", "n1": "pass", "n2": "warn"})
    after = settle(first, [rerun], fleet=_fleet(40), policy=default_policy())
    n0, n2 = after.decisions["n0"], after.decisions["n2"]
    assert (n0.state, n0.confirmed, n0.settled) == ("degraded", True, True)  # a reproduced deficit
    assert after.pending == ["n1", "n2"]
    done = settle(first, [rerun, _run("r-c2", {"n1": "pass", "n2": "warn"})], fleet=_fleet(40), policy=default_policy())
    assert done.decisions["n1"].state == "certified"  # warned once, passed twice
    n2 = done.decisions["n2"]
    assert (n2.state, n2.confirmed, n2.taint) == ("degraded", True, "none")  # failed once, warned twice


def test_a_warn_backed_by_a_telemetry_gate_needs_no_rerun() -> None:
    frame = _frame(
        [
            {
                **_v("n0", "warn", metric="ecc_sbe_volatile", value=500, cause="ecc"),
                "reference_kind": "gate",
                "ticket": "remediation",
            }
        ]
    )
    out = settle(RunVerdicts("r", frame, ("n0",)), [], fleet=_fleet(20), policy=default_policy())
    assert out.pending == []
    assert (out.decisions["n0"].state, out.decisions["n0"].confirmed) == ("degraded", True)


def test_a_hard_gate_taints_without_a_rerun() -> None:
    frame = _frame(
        [{**_v("n0", "fail", metric="remapped_rows_failure", value=1, cause="row_remap"), "ticket": "replacement"}]
    )
    out = settle(RunVerdicts("r", frame, ("n0",)), [], fleet=_fleet(20), policy=default_policy())
    d = out.decisions["n0"]
    assert (d.state, d.hard_gate, d.confirmed, d.taint, d.cause, out.pending) == (
        "failed",
        True,
        True,
        "added",
        "row_remap",
        [],
    )


def test_the_blast_radius_counts_every_taint_in_force_not_one_runs() -> None:
    # 40 GPU nodes: the limit is max(3, 4) = 4. Three are tainted from earlier nights and stay so (not
    # in tonight's run); two more fail tonight: 5 would be in force — nothing is added, one incident.
    frame = _frame([{**_v(n, "fail", metric="xid", value=79, cause="xid")} for n in ("n10", "n11")])
    run = RunVerdicts("r", frame, ("n10", "n11"))
    fleet = _fleet(40, tainted=("n0", "n1", "n2"))
    out = settle(run, [], fleet=fleet, policy=default_policy())
    assert out.incident is not None
    assert "blast radius" in out.incident
    assert {d.taint for d in out.decisions.values()} == {"refused"}
    assert out.in_force == 3
    # The same two alone on a clean fleet are within the limit.
    clean = settle(run, [], fleet=_fleet(40), policy=default_policy())
    assert clean.incident is None
    assert {d.taint for d in clean.decisions.values()} == {"added"}
    # A node that passes tonight lifts its taint, and that makes room.
    frame = pd.concat([frame, _frame([_v("n0", "pass")])], ignore_index=True)
    room = settle(RunVerdicts("r", frame, ("n0", "n10", "n11")), [], fleet=fleet, policy=default_policy())
    assert room.decisions["n0"].taint == "lifted"
    assert room.incident is None
    assert room.in_force == 4


def test_observe_only_settles_states_and_touches_no_taint() -> None:
    frame = _frame([_v("n0", "fail", metric="xid", value=79, cause="xid"), _v("n1", "pass")])
    out = settle(
        RunVerdicts("r", frame, ("n0", "n1")),
        [],
        fleet=_fleet(20, tainted=("n1",)),
        policy=default_policy(),
        observe_only=True,
    )
    assert out.decisions["n0"].state == "failed"
    assert (out.decisions["n0"].taint, out.decisions["n1"].taint) == ("none", "kept")


def test_settled_verdicts_agree_with_the_decisions() -> None:
    first = _run("r", {"n0": "fail", "n1": "fail", "n2": "pass"})
    reruns = [_run("r-c1", {"n0": "fail", "n1": "pass"}), _run("r-c2", {"n1": "pass"})]
    out = settle(first, reruns, fleet=_fleet(30), policy=default_policy())
    verdicts = settled_verdicts(first.verdicts, out)
    by_node = dict(zip(verdicts["node"], verdicts["verdict"], strict=True))
    assert by_node == {"n0": "fail", "n1": "pass", "n2": "pass"}
    assert verdicts.loc[verdicts["node"] == "n1", "ticket"].item() == "none"
    assert "not reproduced by the re-runs: r-c1, r-c2" in verdicts.loc[verdicts["node"] == "n1", "reasons"].item()
    # A fail reproduced only as a warn reads warn; an undecided one inconclusive.
    mixed = settle(
        _run("r", {"n0": "fail", "n1": "fail"}),
        [_run("r-c1", {"n0": "warn"})],
        fleet=_fleet(30),
        policy=default_policy(),
    )
    capped = settled_verdicts(_run("r", {"n0": "fail", "n1": "fail"}).verdicts, mixed)
    assert dict(zip(capped["node"], capped["verdict"], strict=True)) == {"n0": "inconclusive", "n1": "inconclusive"}
    frame = out.frame()
    assert list(frame.columns)[:4] == ["run_id", "node", "state", "verdict"]
    assert dict(zip(frame["node"], frame["verdict"], strict=True)) == by_node  # the same decision everywhere
    assert frame.loc[frame["node"] == "n0", "runs"].item() == "r,r-c1"


# --- writing a decision to the node ----------------------------------------------------------------------


def _decision(state: str | None, taint: str = "none", cause: str | None = None) -> SettledDecision:
    summary = "all checks passed" if state == "certified" else f"{state}: GPU 3"
    return SettledDecision("n", state, cause, False, state == "failed", taint, ("r1",), summary)  # type: ignore[arg-type]


def _node(taints: list[dict[str, str]] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "n", "resourceVersion": "7", "labels": labels or {}, "annotations": {}},
        "spec": {"taints": taints or []},
    }


OTHER = {"key": "team.example/maintenance", "effect": "NoSchedule"}


def test_a_confirmed_fail_is_tainted_and_other_taints_kept() -> None:
    patch, change = node_patch(
        _node([OTHER]), _decision("failed", "added", "pcie"), prefix="gpucert.io", run_id="r1", now=NOW
    )
    assert patch is not None
    assert patch["metadata"]["resourceVersion"] == "7"  # a concurrent change makes the server answer 409
    assert patch["metadata"]["labels"] == {"gpucert.io/state": "failed"}
    assert patch["spec"]["taints"] == [OTHER, {"key": "gpucert.io/unhealthy", "value": "pcie", "effect": "NoSchedule"}]
    assert change.taint == "added"
    refused, _ = node_patch(_node(), _decision("failed", "refused", "pcie"), prefix="gpucert.io", run_id="r1", now=NOW)
    assert refused is not None
    assert "spec" not in refused  # over the blast radius: labels only


def test_a_pass_lifts_gpucert_taints_and_kept_touches_none() -> None:
    mine = [
        {"key": "gpucert.io/unhealthy", "value": "pcie", "effect": "NoSchedule"},
        {"key": "gpucert.io/uncertified", "effect": "NoSchedule"},
        OTHER,
    ]
    patch, change = node_patch(_node(mine), _decision("certified", "lifted"), prefix="gpucert.io", run_id="r2", now=NOW)
    assert patch is not None
    assert patch["spec"]["taints"] == [OTHER]
    assert patch["metadata"]["annotations"]["gpucert.io/certified-at"] == "2026-12-02T03:00:00Z"
    assert change.taint == "lifted"
    observed, change = node_patch(
        _node(mine), _decision("certified", "kept"), prefix="gpucert.io", run_id="r2", now=NOW
    )
    assert observed is not None
    assert "spec" not in observed
    assert change.taint is None


def test_nothing_to_write_is_no_patch() -> None:
    node = _node(labels={"gpucert.io/state": "certified"})
    node["metadata"]["annotations"] = {
        "gpucert.io/last-run": "r",
        "gpucert.io/summary": "all checks passed",
        "gpucert.io/certified-at": "2026-12-02T03:00:00Z",
    }
    patch, change = node_patch(node, _decision("certified"), prefix="gpucert.io", run_id="r", now=NOW)
    assert patch is None
    assert change.labels == {}


def test_the_condition_follows_the_decision_and_keeps_its_transition_time() -> None:
    failed = condition_patch(_node(), _decision("failed", "added", "row_remap"), now=NOW)
    assert failed is not None
    [entry] = failed["status"]["conditions"]
    assert (entry["type"], entry["status"], entry["reason"]) == (CONDITION, "False", "RowRemap")
    assert entry["message"] == "failed: GPU 3"
    node = {**_node(), "status": {"conditions": [{"type": "Ready", "status": "True"}, entry]}}
    assert condition_patch(node, _decision("failed", "added", "row_remap"), now=NOW) is None  # unchanged
    later = datetime(2026, 12, 3, 3, 0, tzinfo=UTC)
    degraded = condition_patch(node, _decision("degraded"), now=later)
    assert degraded is not None
    assert degraded["status"]["conditions"][0]["lastTransitionTime"] == entry["lastTransitionTime"]  # still False
    certified = condition_patch(node, _decision("certified"), now=later)
    assert certified is not None
    assert certified["status"]["conditions"][0]["status"] == "True"
    assert certified["status"]["conditions"][0]["lastTransitionTime"] == "2026-12-03T03:00:00Z"
    assert condition_patch(node, _decision(None), now=later) is None  # inconclusive leaves it as it was
    never = condition_patch(_node(), _decision(None), now=later)  # …and a node never certified is Unknown
    assert never is not None
    assert (never["status"]["conditions"][0]["status"], never["status"]["conditions"][0]["reason"]) == (
        "Unknown",
        "NotCertified",
    )


def test_failed_jobs_become_inconclusive_node_rows() -> None:
    rows = job_failure_verdicts("r", {"b": ("image_pull", "ErrImagePull"), "a": ("deadline", "")})
    assert list(rows["node"]) == ["a", "b"]
    assert set(rows["verdict"]) == {"inconclusive"}
    assert rows["gpu"].isna().all()
    assert rows.loc[1, "reasons"] == "the benchmark image could not be pulled: ErrImagePull"
    assert decide_nodes(rows, ["a"])["a"].state is None
