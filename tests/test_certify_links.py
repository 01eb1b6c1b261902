"""A run's links judged with its pairing plan (``gpucert.certify._verdicts``), on the fleet model: the NIC
at half rate is its node's own network fault (a hard fail, no confirming re-run of the node alone), the
slow uplink one fleet row that blames nobody, every other node certified; the pairs' references are the
nodes' own link baselines once seeded; ``gpucert compare`` on the same file reaches the node's fault
without the plan."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pytest

from gpucert.baseline import build_baseline
from gpucert.certify import decide_nodes, link_findings, link_seed, verdicts_with_links
from gpucert.cli import main
from gpucert.network import PAIR_METRIC, PairingPlan, plan_rounds, repairs
from gpucert.policy import default_policy
from gpucert.results import parse_results, write_results
from gpucert.store import empty_baseline
from gpucert.tickets import fingerprints
from gpucert_sim.fleet import Fault, Fleet
from gpucert_sim.fleet._model import LEAF_LABEL

T0 = datetime(2026, 12, 1, 2, tzinfo=UTC)


def _both_ways(results: pd.DataFrame) -> pd.DataFrame:
    """Each pair's rows as both of its pods log them: the same values, each naming its own node."""
    pairs = results[results["metric"] == PAIR_METRIC]
    mirrored = pairs.assign(node=pairs["peer"].astype(str), peer=pairs["node"].astype(str))
    return parse_results(
        pd.concat([results.astype({"node": str, "peer": object}), mirrored], ignore_index=True), "the run's results"
    )


def _night(
    fleet: Fleet, run_id: str, ts: datetime, faults: list[Fault], baseline: pd.DataFrame
) -> tuple[pd.DataFrame, PairingPlan]:
    """certify's link step on the model: the plan's rounds, then the re-pairings the judgement asks for."""
    policy = default_policy()
    plan = plan_rounds(fleet.topology(), leaf_label=LEAF_LABEL, seed=link_seed(run_id))

    def measure(p: PairingPlan, seed: int) -> pd.DataFrame:
        pairs = list(zip(p.pairs["node"], p.pairs["peer"], strict=True))
        return _both_ways(fleet.run(run_id, ts=ts, seed=seed, faults=faults, pairs=pairs).results)

    results = measure(plan, 1)
    for attempt in range(policy.network.repair_rounds):
        pair_rows = results[results["metric"] == PAIR_METRIC]
        judgement = link_findings(pair_rows, plan, baseline, policy)
        if not judgement.pending:
            break
        more = repairs(judgement, plan, seed=attempt + 1)
        plan = plan.extended(more)
        extra = measure(more, 10 + attempt)
        results = parse_results(
            pd.concat([results, extra[extra["metric"] == PAIR_METRIC]], ignore_index=True), "the run's results"
        )
    return results, plan


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return Fleet.generate(nodes=32, seed=11)


def test_a_nic_and_an_uplink_are_named_to_the_network_and_nobody_else_is_blamed(fleet: Fleet) -> None:
    nic = fleet.node_names[9]
    faults = [Fault("nic_half_rate", nic), Fault("slow_uplink", params={"leaf_a": 1, "leaf_b": 3})]
    results, plan = _night(fleet, "night-1", T0, faults, empty_baseline())
    verdicts = verdicts_with_links(results, empty_baseline(), default_policy(), plan=plan)
    pair_rows = verdicts[verdicts["metric"] == PAIR_METRIC]
    flagged = pair_rows[pair_rows["verdict"] != "pass"]
    mine = flagged[flagged["node"] == nic]
    assert list(mine["cause"]) == ["network"]
    assert mine["peer"].isna().all()
    fleet_rows = flagged[flagged["reference_kind"] == "fleet"]
    assert len(fleet_rows) == 1
    assert fleet_rows["node"].isna().all()
    assert fleet.leaf_names[1] in fleet_rows["reasons"].iloc[0]
    assert fleet.leaf_names[3] in fleet_rows["reasons"].iloc[0]
    decided = decide_nodes(verdicts, fleet.node_names)
    network_failed = {n for n, d in decided.items() if d.cause == "network"}
    assert network_failed == {nic}
    assert decided[nic].hard_gate  # named by its pairs: a re-run of the node alone measures no pair
    # The generic engine judged no pair: a pair row of the engine would carry gpu_uuid/scope of its own.
    assert len(pair_rows) == len(flagged) + int((pair_rows["verdict"] == "pass").sum())


def test_the_pairs_are_held_to_the_nodes_own_link_baselines_once_seeded(fleet: Fleet) -> None:
    policy = default_policy()
    seed_results, plan = _night(fleet, "seed-1", T0, [], empty_baseline())
    baseline, _ = build_baseline(empty_baseline(), seed_results, policy=policy)
    own = baseline[(baseline["level"] == "node") & (baseline["metric"] == PAIR_METRIC)]
    assert set(own["key"]) == set(fleet.node_names)  # every node's own link baseline, from both orientations
    results, plan = _night(
        fleet, "night-2", T0 + timedelta(days=1), [Fault("nic_half_rate", fleet.node_names[20])], baseline
    )
    verdicts = verdicts_with_links(results, baseline, policy, plan=plan)
    pairs = verdicts[(verdicts["metric"] == PAIR_METRIC) & verdicts["peer"].notna()]
    assert set(pairs["reference_kind"]) == {"own"}
    [row] = verdicts[
        (verdicts["node"] == fleet.node_names[20]) & (verdicts["metric"] == PAIR_METRIC) & verdicts["peer"].isna()
    ].itertuples()
    assert (row.verdict, row.cause, row.reference_kind) == ("fail", "network", "own")


def test_compare_judges_a_results_file_with_pairs_as_certify_does(
    fleet: Fleet, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nic = fleet.node_names[4]
    results, _ = _night(fleet, "night-3", T0, [Fault("nic_half_rate", nic)], empty_baseline())
    path = tmp_path / "night.parquet"
    write_results(results, path)
    (tmp_path / "store").mkdir()  # an empty store: judged by peers alone
    out = tmp_path / "verdicts.parquet"
    assert main(["compare", str(path), "--baselines", f"file://{tmp_path / 'store'}", "--out", str(out)]) == 0
    verdicts = pd.read_parquet(out)
    named = verdicts[(verdicts["metric"] == PAIR_METRIC) & (verdicts["verdict"] == "fail")]
    assert set(named["node"].dropna()) == {nic}
    assert "wrote" in capsys.readouterr().out


def test_a_node_slow_in_its_pairs_for_its_own_pcie_fault_is_that_fault_one_ticket_not_two(fleet: Fleet) -> None:
    node = fleet.node_names[14]
    results, plan = _night(fleet, "night-4", T0, [Fault("pcie_gen4", node, 3)], empty_baseline())
    verdicts = verdicts_with_links(results, empty_baseline(), default_policy(), plan=plan)
    [link] = verdicts[
        (verdicts["node"] == node) & (verdicts["metric"] == PAIR_METRIC) & verdicts["peer"].isna()
    ].itertuples()
    assert (link.cause, link.ticket, link.action) == ("pcie", "none", "none")
    assert link.reasons.startswith("gpu: explained by this node's own pcie fault")
    # Its advice is the PCIe fault's, not the NIC's: nobody is sent to check a cable that is fine.
    assert "NIC's port state" not in link.reasons
    assert "cable" not in link.reasons
    own = verdicts[(verdicts["node"] == node) & (verdicts["cause"] == "pcie") & verdicts["gpu"].notna()]
    assert f"do what its own rows ask ({own['action'].iloc[0]})" in link.reasons
    # Its partners' pairs, low but passing, name its PCIe fault, not "the node's own network path".
    pairs = verdicts[
        (verdicts["metric"] == PAIR_METRIC)
        & verdicts["peer"].notna()
        & ((verdicts["node"] == node) | (verdicts["peer"] == node))
    ]
    assert not pairs["reasons"].str.contains("network path").any(), list(pairs["reasons"])
    assert pairs["reasons"].str.contains(f"explained by {node}'s own pcie fault").any()
    assert decide_nodes(verdicts, [node])[node].cause == "pcie"
    assert "NIC" not in decide_nodes(verdicts, [node])[node].summary
    assert {key.split("/")[-1] for key in fingerprints(verdicts) if key.startswith(node)} == {"pcie"}
