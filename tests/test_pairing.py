"""gpucert/network: the pairing plan (rounds by topology labels) and its localising judgement."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import pytest

from gpucert.errors import InputError, ResultsError
from gpucert.network import (
    FINDING_COLUMNS,
    INTER_LEAF,
    INTER_ZONE,
    INTRA_LEAF,
    PAIR_COLUMNS,
    UNLABELLED,
    ZONE_LABEL,
    PairFindings,
    PairingPlan,
    PairThresholds,
    link_verdicts,
    measured_plan,
    pair_findings,
    pair_references,
    plan_rounds,
    repairs,
    stored_plan,
)
from gpucert.policy import default_policy
from gpucert.verdict import VERDICT_COLUMNS

LEAF = "gpucert.io/leaf"


def _fleet(sizes: list[int], *, zones: list[str] | None = None, prefix: str = "node") -> pd.DataFrame:
    """One row per node: leaf ``leaf-i`` holds ``sizes[i]`` nodes (in zone ``zones[i]`` when given)."""
    rows = []
    k = 0
    for i, size in enumerate(sizes):
        for _ in range(size):
            row = {"node": f"{prefix}-{k:05d}", LEAF: f"leaf-{i}"}
            if zones is not None:
                row[ZONE_LABEL] = zones[i]
            rows.append(row)
            k += 1
    return pd.DataFrame(rows)


def _check_plan(plan: PairingPlan, nodes: pd.DataFrame, partners: int = 2, *, inter: bool = True) -> None:
    """The plan's promises: one pair per node per round, no pair twice, enough partners of each kind."""
    names = set(nodes["node"])
    assert set(plan.nodes.index) == names
    assert list(plan.pairs.columns) == list(PAIR_COLUMNS)
    pairs = plan.pairs
    assert (pairs["node"] != pairs["peer"]).all()
    assert set(pairs["node"]) | set(pairs["peer"]) <= names
    for r in range(plan.rounds):
        here = plan.round(r)
        ends = pd.concat([here["node"], here["peer"]])
        assert not ends.duplicated().any(), f"a node twice in round {r}"
        if (here["stage"] == "plan").all():
            idle = set(plan.idle.loc[plan.idle["round"] == r, "node"])
            assert idle == names - set(ends), f"round {r}: the idle nodes are the unpaired ones"
    key = pd.Series([tuple(sorted(p)) for p in zip(pairs["node"], pairs["peer"], strict=True)])
    assert not key.duplicated().any(), "a pair planned twice"
    group = plan.nodes["group"]
    same = group[pairs["node"]].to_numpy() == group[pairs["peer"]].to_numpy()
    assert ((pairs["kind"] == INTRA_LEAF).to_numpy() == same).all()
    counts = plan.partner_counts()
    sizes = group.value_counts()
    assert (counts["partners"] >= min(partners, len(names) - 1)).all()
    has_mate = group.map(sizes).to_numpy() >= 2
    assert (counts.loc[has_mate, "intra"] >= 1).all(), "a node without a partner in its own leaf"
    if group.nunique() >= 2 and inter:
        assert (counts["inter"] >= 1).all(), "a node without a partner in another leaf"


# --- the plan --------------------------------------------------------------------------------------


def test_64_nodes_in_8_leaves_two_perfect_rounds_meeting_every_pair_of_leaves() -> None:
    nodes = _fleet([8] * 8)
    plan = plan_rounds(nodes, leaf_label=LEAF, seed=7)
    _check_plan(plan, nodes)
    assert plan.rounds == 2
    assert (plan.pairs["stage"] == "plan").all()
    assert plan.idle.empty
    intra, inter = plan.round(0), plan.round(1)
    assert len(intra) == len(inter) == 32  # every node in exactly one pair per round
    assert (intra["kind"] == INTRA_LEAF).all()
    assert (inter["kind"] == INTER_LEAF).all()
    leaf_pairs = {tuple(sorted(p)) for p in zip(inter["node_group"], inter["peer_group"], strict=True)}
    assert len(leaf_pairs) == 28  # all 8·7/2 pairs of leaves meet in the one inter-leaf round
    counts = plan.partner_counts()
    assert (counts["partners"] == 2).all()
    assert (counts["intra"] == 1).all()
    assert (counts["inter"] == 1).all()
    assert plan.notes == (
        "round 0 (intra-leaf): 32 pairs (32 intra-leaf)",
        "round 1 (inter-leaf): 32 pairs (32 inter-leaf), meeting 28 of 28 pairs of leaves",
    )


@pytest.mark.parametrize(
    "sizes",
    [
        [9] * 7,  # odd leaves, odd fleet
        [8, 8, 8, 3],  # one small leaf, odd fleet
        [3, 4, 5, 6, 7],
        [1, 1, 1],  # every leaf one node: no intra pair possible
        [2, 2],
        [5, 5, 5, 5, 5, 5, 5, 5, 5],  # odd number of leaves
        [40, 3, 17, 1, 22, 9],
    ],
)
def test_uneven_fleets_still_get_their_partners(sizes: list[int]) -> None:
    nodes = _fleet(sizes)
    for seed in range(3):
        plan = plan_rounds(nodes, leaf_label=LEAF, seed=seed)
        _check_plan(plan, nodes)
        # The full rounds are (near-)perfect matchings; what they miss is a short makeup.
        full = plan.pairs[plan.pairs["stage"] == "plan"]
        assert full["round"].value_counts().min() >= (sum(sizes) - len(sizes)) // 2 - 2
        makeup = plan.pairs[plan.pairs["stage"] == "makeup"]
        assert makeup["round"].nunique() <= 2
        assert len(makeup) <= 2 * len(sizes) + 2


def test_a_leaf_too_small_to_meet_every_other_node_is_said() -> None:
    nodes = _fleet([1, 6])  # six nodes need another leaf, which one node can give one per round
    plan = plan_rounds(nodes, leaf_label=LEAF, seed=0)
    _check_plan(plan, nodes, inter=False)
    lacking = int((plan.partner_counts()["inter"] == 0).sum())
    assert lacking >= 1
    assert (
        f"{lacking} node{'s' if lacking > 1 else ''} still lack a partner in another leaf after the makeup rounds"
        in plan.notes
    )


def test_an_odd_fleet_says_which_node_sits_out() -> None:
    nodes = _fleet([8, 8, 8, 7])
    plan = plan_rounds(nodes, leaf_label=LEAF, seed=1)
    _check_plan(plan, nodes)
    assert len(plan.idle[plan.idle["round"] == 0]) >= 1
    assert any("odd number of nodes" in n and "never runs two pairs at once" in n for n in plan.notes)
    assert any(n.startswith("round 2 (makeup)") for n in plan.notes)


def test_one_leaf_every_round_intra_with_distinct_partners() -> None:
    nodes = _fleet([10])
    plan = plan_rounds(nodes, leaf_label=LEAF, seed=3, partners=3)
    _check_plan(plan, nodes, partners=3)
    assert (plan.pairs["kind"] == INTRA_LEAF).all()
    assert plan.rounds == 3
    assert (plan.pairs["stage"] == "plan").all()
    assert any("one leaf" in n for n in plan.notes)


def test_nodes_without_a_leaf_label_form_their_own_group() -> None:
    nodes = _fleet([6, 6])
    nodes.loc[[0, 4, 7], LEAF] = None
    nodes.loc[9, LEAF] = "  "
    plan = plan_rounds(nodes, leaf_label=LEAF, seed=2)
    _check_plan(plan, nodes)
    unlabelled = plan.nodes[plan.nodes["unlabelled"]]
    assert list(unlabelled.index) == ["node-00000", "node-00004", "node-00007", "node-00009"]
    assert (unlabelled["group"] == UNLABELLED).all()
    assert any("4 nodes carry no leaf label" in n and UNLABELLED in n for n in plan.notes)

    bare = plan_rounds(nodes.drop(columns=LEAF), leaf_label=LEAF)
    _check_plan(bare, nodes)
    assert (bare.nodes["group"] == UNLABELLED).all()
    assert any("no node carries the leaf label" in n for n in bare.notes)


def test_zones_are_the_tier_above_the_leaves() -> None:
    nodes = _fleet([4, 4, 4, 4], zones=["z-a", "z-a", "z-b", "z-b"])
    nodes.loc[0, LEAF] = None
    plan = plan_rounds(nodes, leaf_label=LEAF, seed=5)
    _check_plan(plan, nodes)
    assert set(plan.nodes["group"]) == {"z-a/leaf-0", "z-a/leaf-1", "z-b/leaf-2", "z-b/leaf-3", f"z-a/{UNLABELLED}"}
    zone = plan.nodes["zone"]
    crosses = zone[plan.pairs["node"]].to_numpy() != zone[plan.pairs["peer"]].to_numpy()
    assert ((plan.pairs["kind"] == INTER_ZONE).to_numpy() == crosses).all()
    assert crosses.any()


def test_the_plan_depends_on_the_nodes_and_the_seed_only() -> None:
    nodes = _fleet([8, 7, 9, 8])
    plan = plan_rounds(nodes, leaf_label=LEAF, seed=11)
    again = plan_rounds(nodes.sample(frac=1, random_state=3), leaf_label=LEAF, seed=11)
    pd.testing.assert_frame_equal(plan.pairs, again.pairs)
    pd.testing.assert_frame_equal(plan.idle, again.idle)
    assert plan.notes == again.notes
    other = plan_rounds(nodes, leaf_label=LEAF, seed=12)
    assert not plan.pairs[["node", "peer"]].equals(other.pairs[["node", "peer"]])


def test_more_partners_more_rounds() -> None:
    nodes = _fleet([8] * 6)
    plan = plan_rounds(nodes, leaf_label=LEAF, seed=1, partners=4)
    _check_plan(plan, nodes, partners=4)
    assert plan.rounds == 4
    assert list(plan.pairs.groupby("round")["kind"].first()) == [INTRA_LEAF, INTER_LEAF, INTRA_LEAF, INTER_LEAF]
    assert (plan.partner_counts()["partners"] == 4).all()


@pytest.mark.parametrize("count", [0, 1, 2, 3])
def test_tiny_fleets(count: int) -> None:
    nodes = _fleet([count]) if count else pd.DataFrame({"node": pd.Series([], dtype=str)})
    plan = plan_rounds(nodes, leaf_label=LEAF)
    if count:
        _check_plan(plan, nodes)
    assert len(plan.pairs) == {0: 0, 1: 0, 2: 1, 3: 3}[count]


def test_ten_thousand_nodes() -> None:
    rng = np.random.default_rng(5)
    sizes = [int(s) for s in rng.integers(18, 44, size=320)]
    nodes = _fleet(sizes)
    plan = plan_rounds(nodes, leaf_label=LEAF, seed=9)
    assert len(plan.nodes) == sum(sizes) > 9_000
    pairs = plan.pairs
    for _, here in pairs.groupby("round"):
        assert not pd.concat([here["node"], here["peer"]]).duplicated().any()
    counts = plan.partner_counts()
    assert counts["partners"].min() >= 2
    assert counts["intra"].min() >= 1
    assert counts["inter"].min() >= 1
    assert plan.rounds <= 3  # two full rounds and one makeup for the odd leaves


def test_bad_node_tables() -> None:
    with pytest.raises(InputError, match="no column 'node'"):
        plan_rounds(pd.DataFrame({"name": ["a", "b"]}), leaf_label=LEAF)
    with pytest.raises(InputError, match="node 'a' appears more than once"):
        plan_rounds(pd.DataFrame({"node": ["a", "b", "a"]}), leaf_label=LEAF)
    with pytest.raises(InputError, match="row 2, column 'node': empty node name"):
        plan_rounds(pd.DataFrame({"node": ["a", None, "c"]}), leaf_label=LEAF)
    with pytest.raises(InputError, match="partners 0"):
        plan_rounds(_fleet([4]), leaf_label=LEAF, partners=0)


# --- a fabric for the judgement ---------------------------------------------------------------------


@dataclass
class Fabric:
    """Pair bandwidth as the fleet model makes it (sim/gpucert_sim/fleet/_model.py): a base, a node factor at each
    end (1 %), the slower end's NIC, the link between the ends' leaves, 4 % run-to-run noise per repeat,
    and rare transient bad samples."""

    nodes: pd.DataFrame
    seed: int = 0
    base: float = 370.0
    nic: dict[str, float] = field(default_factory=dict)
    uplink: dict[frozenset[str], float] = field(default_factory=dict)
    slow: dict[frozenset[str], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = np.random.default_rng(self.seed)
        self.factor = dict(zip(self.nodes["node"], 1 + self.rng.standard_normal(len(self.nodes)) * 0.01, strict=True))
        self.leaf = dict(zip(self.nodes["node"], self.nodes[LEAF], strict=True))

    def measure(self, pairs: pd.DataFrame, repeats: int = 3) -> pd.DataFrame:
        a, b = pairs["node"].to_numpy(), pairs["peer"].to_numpy()
        level = np.array(
            [
                self.factor[x]
                * self.factor[y]
                * min(self.nic.get(x, 1.0), self.nic.get(y, 1.0))
                * self.uplink.get(frozenset((self.leaf[x], self.leaf[y])), 1.0)
                * self.slow.get(frozenset((x, y)), 1.0)
                for x, y in zip(a, b, strict=True)
            ]
        )
        rep = 1 + self.rng.standard_normal((len(a), repeats)) * 0.04
        rep *= np.where(self.rng.random(rep.shape) < 0.005, self.rng.uniform(0.7, 0.95, rep.shape), 1.0)
        return pd.DataFrame(
            {
                "run_id": "cert-1",
                "node": np.repeat(a, repeats),
                "metric": "nccl_pair_busbw_gbps",
                "value": (self.base * level[:, None] * rep).ravel(),
                "repeat": np.tile(np.arange(repeats), len(a)),
                "peer": np.repeat(b, repeats),
            }
        )


@dataclass
class Run:
    plan: PairingPlan
    judgement: PairFindings
    first: PairFindings
    repairs: int


def _certify(fabric: Fabric, *, seed: int = 1, max_repairs: int = 2, **judge: object) -> Run:
    """Plan, measure, judge, and re-pair while the judgement asks for it: what certify will do."""
    plan = plan_rounds(fabric.nodes, leaf_label=LEAF, seed=seed)
    results = fabric.measure(plan.pairs)
    first = judgement = pair_findings(results, plan, **judge)  # type: ignore[arg-type]
    done = 0
    while judgement.pending and done < max_repairs:
        more = repairs(judgement, plan, seed=seed)
        assert len(more.pairs), "a pending judgement gets a re-pairing round"
        plan = plan.extended(more)
        results = pd.concat([results, fabric.measure(more.pairs)], ignore_index=True)
        judgement = pair_findings(results, plan, **judge)  # type: ignore[arg-type]
        done += 1
    return Run(plan, judgement, first, done)


def _blamed(j: PairFindings) -> set[str]:
    f = j.findings
    return set(f.loc[(f["scope"] == "node") & f["verdict"].isin(["warn", "fail"]), "node"])


NODES = _fleet([8] * 8)


def _leaf(i: int) -> str:
    return f"leaf-{i}"


# --- the judgement ----------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_nic_at_half_rate_is_named_and_nobody_else(seed: int) -> None:
    fabric = Fabric(NODES, seed=seed)
    bad = f"node-{(seed * 13) % 64:05d}"
    fabric.nic[bad] = 0.5
    run = _certify(fabric, seed=seed)
    j = run.judgement
    assert j.culprits == (bad,)
    assert _blamed(j) == {bad}
    assert not j.uplinks
    assert not j.leaves
    assert not j.pending
    row = j.findings[j.findings["node"] == bad].iloc[0]
    assert (row["scope"], row["status"], row["verdict"], row["layer"], row["component"], row["cause"]) == (
        "node",
        "culprit",
        "fail",
        "network",
        "nic",
        "network",
    )
    assert row["action"] == "check_cable"
    assert row["ticket"] == "remediation"
    assert -55 < row["deviation_pct"] < -45
    # The evidence: every partner, in GB/s and % of the reference, and where the reference came from.
    partners = run.plan.pairs.query("node == @bad or peer == @bad")
    for other in set(partners["node"]) | set(partners["peer"]) - {bad}:
        assert other in row["reasons"]
    assert " GB/s = " in row["reasons"]
    assert "% of " in row["reasons"]
    assert "fleet median of" in row["reasons"]
    assert "NIC" in row["reasons"]
    assert run.repairs <= 1


@pytest.mark.parametrize(("seed", "leaves"), [(1, (2, 5)), (2, (0, 1)), (3, (3, 7)), (4, (1, 6))])
def test_a_slow_uplink_is_one_fleet_finding_and_no_node_is_blamed(seed: int, leaves: tuple[int, int]) -> None:
    fabric = Fabric(NODES, seed=seed)
    fabric.uplink[frozenset(map(_leaf, leaves))] = 0.6
    run = _certify(fabric, seed=seed)
    j = run.judgement
    assert j.uplinks == (tuple(map(_leaf, leaves)),)
    assert not j.culprits
    assert not _blamed(j)
    assert not j.pending
    fleet = j.findings[j.findings["scope"] == "fleet"]
    assert len(fleet) == 1
    row = fleet.iloc[0]
    assert (row["status"], row["component"], row["layer"], row["node"], row["verdict"]) == (
        "uplink",
        "uplink",
        "network",
        "",
        "fail",
    )
    assert row["location"] == f"{_leaf(leaves[0])} ↔ {_leaf(leaves[1])}"
    assert "no node is blamed" in row["reasons"]
    assert " GB/s = " in row["reasons"]
    assert run.plan.rounds <= 3  # two pairing rounds plus, at most, the re-pairing of the suspects
    assert set(j.pairs.loc[j.pairs["status"] == "uplink", "kind"]) == {INTER_LEAF}


def test_the_bar_a_nic_and_an_uplink_each_named() -> None:
    fabric = Fabric(NODES, seed=8)
    fabric.nic["node-00019"] = 0.5
    fabric.uplink[frozenset((_leaf(4), _leaf(6)))] = 0.65
    run = _certify(fabric, seed=8)
    j = run.judgement
    assert j.culprits == ("node-00019",)
    assert _blamed(j) == {"node-00019"}
    assert j.uplinks == ((_leaf(4), _leaf(6)),)
    assert not j.pending
    assert run.plan.rounds <= 3


def test_a_nic_behind_the_slow_uplink_is_probed_and_both_are_named() -> None:
    """The NIC's only pair across leaves crosses the slow link: it explains the NIC and the link hides
    behind it, until the pair's other end and two known-good nodes measure the link again."""
    plan = plan_rounds(NODES, leaf_label=LEAF, seed=1)
    x, y = plan.round(1).iloc[0][["node", "peer"]]
    leaf = dict(zip(NODES["node"], NODES[LEAF], strict=True))
    fabric = Fabric(NODES, seed=4)
    fabric.nic[x] = 0.5
    fabric.uplink[frozenset((leaf[x], leaf[y]))] = 0.5
    run = _certify(fabric, seed=1)
    assert run.first.culprits == (x,)
    assert not run.first.uplinks
    probe = run.first.findings[run.first.findings["status"] == "probe"]
    assert list(probe["node"]) == [x]
    assert list(probe["peer"]) == [y]
    j = run.judgement
    assert j.culprits == (x,)
    assert _blamed(j) == {x}
    assert j.uplinks == (tuple(sorted((leaf[x], leaf[y]))),)
    assert run.repairs == 1
    assert not j.pending


def _one_slow_pair(seed: int) -> tuple[Fabric, str, str]:
    plan = plan_rounds(NODES, leaf_label=LEAF, seed=1)
    x, y = plan.round(1).iloc[5][["node", "peer"]]
    fabric = Fabric(NODES, seed=seed)
    fabric.slow[frozenset((x, y))] = 0.6
    return fabric, x, y


def test_a_single_slow_pair_is_re_paired_with_good_partners_then_cleared() -> None:
    fabric, x, y = _one_slow_pair(5)
    plan = plan_rounds(NODES, leaf_label=LEAF, seed=1)
    j = pair_findings(fabric.measure(plan.pairs), plan)
    assert set(j.suspects) == {x, y}
    assert not j.culprits
    assert not _blamed(j)
    sus = j.findings[j.findings["status"] == "suspect"].iloc[0]
    assert {sus["node"], sus["peer"]} == {x, y}
    assert sus["verdict"] == "warn"
    assert sus["action"] == "retest"
    assert "before blaming either" in sus["reasons"]

    more = repairs(j, plan, seed=1)
    assert more.rounds == 3
    assert (more.pairs["stage"] == "re-pair").all()
    assert len(more.pairs) == 2
    leaf = plan.nodes["group"]
    for _, pair in more.pairs.iterrows():
        suspect, partner = (pair["node"], pair["peer"]) if pair["node"] in (x, y) else (pair["peer"], pair["node"])
        assert partner in j.good
        assert partner not in (x, y)
        other = y if suspect == x else x
        assert leaf[partner] == leaf[other]  # across leaves: a good node of the other suspect's leaf
    assert any(n.startswith("round 2 (re-pair): 2 pairs") for n in more.notes)

    full = plan.extended(more)
    results = pd.concat([fabric.measure(plan.pairs), fabric.measure(more.pairs)], ignore_index=True)
    after = pair_findings(results, full)
    assert not after.culprits
    assert not after.suspects
    assert not _blamed(after)
    assert not after.pending
    assert set(after.cleared) == {x, y}
    cleared = after.findings[after.findings["status"] == "cleared"].iloc[0]
    assert cleared["verdict"] == "pass"
    assert "transient" in cleared["reasons"]
    assert after.pairs.loc[after.pairs["status"] == "cleared", ["node", "peer"]].shape == (1, 2)


def test_a_single_slow_pair_whose_node_stays_slow_with_a_good_partner_is_that_node() -> None:
    fabric, x, y = _one_slow_pair(6)
    plan = plan_rounds(NODES, leaf_label=LEAF, seed=1)
    results = fabric.measure(plan.pairs)
    j = pair_findings(results, plan)
    assert set(j.suspects) == {x, y}
    more = repairs(j, plan, seed=1)
    fabric.nic[x] = 0.6  # x's path is what was slow: it is slow with its known-good partner too
    after = pair_findings(pd.concat([results, fabric.measure(more.pairs)]), plan.extended(more))
    assert after.culprits == (x,)
    assert _blamed(after) == {x}
    assert y not in after.suspects
    assert not after.pending
    row = after.findings[after.findings["node"] == x].iloc[0]
    assert "low with 2 of its 3 partners" in row["reasons"]


@pytest.mark.parametrize("seed", range(8))
def test_a_healthy_fleet_blames_nobody(seed: int) -> None:
    run = _certify(Fabric(NODES, seed=100 + seed), seed=seed)
    j = run.judgement
    assert not j.culprits
    assert not j.uplinks
    assert not j.leaves
    assert not _blamed(j)
    assert not j.pending
    assert run.repairs <= 1
    assert set(j.pairs["status"]) <= {"pass", "cleared"}
    assert set(j.findings["status"]) <= {"cleared"}


def test_a_whole_leaf_low_is_the_leaf_not_its_nodes() -> None:
    fabric = Fabric(NODES, seed=9)
    for i in range(24, 32):
        fabric.nic[f"node-{i:05d}"] = 0.6
    run = _certify(fabric, seed=2)
    j = run.judgement
    assert j.leaves == (_leaf(3),)
    assert not j.culprits
    assert not _blamed(j)
    row = j.findings[j.findings["status"] == "leaf"].iloc[0]
    assert (row["scope"], row["component"], row["location"]) == ("fleet", "leaf", _leaf(3))


def test_two_bad_nics_are_two_nodes_not_an_uplink() -> None:
    fabric = Fabric(NODES, seed=10)
    fabric.nic["node-00003"] = fabric.nic["node-00005"] = 0.5
    j = _certify(fabric, seed=3).judgement
    assert set(j.culprits) == {"node-00003", "node-00005"} == _blamed(j)
    assert not j.uplinks
    assert not j.leaves


def test_the_reference_is_given_or_the_fleets_median() -> None:
    fabric = Fabric(NODES, seed=11)
    plan = plan_rounds(NODES, leaf_label=LEAF, seed=1)
    results = fabric.measure(plan.pairs)
    fleet = pair_findings(results, plan)
    assert re.fullmatch(r"the fleet median of \d\d healthy pairs in this run \(3\d\d\.\d GB/s\)", fleet.reference_note)
    assert set(fleet.pairs["reference_kind"]) == {"peer"}
    # The model says 400: every pair is 7.5 % below it, beyond the warn drop but within 3 spreads.
    model = pair_findings(results, plan, reference=400.0)
    assert set(model.pairs["reference_kind"]) == {"model"}
    assert "400.0 GB/s" in model.reference_note
    assert model.pairs["deviation_pct"].median() == pytest.approx(-7.5, abs=1.0)
    # A reference per row; where it is empty, the scalar.
    rows = results.assign(reference=np.where(results["node"] == "node-00000", 370.0, np.nan))
    mixed = pair_findings(rows, plan, reference=300.0)
    kinds = mixed.pairs.set_index(["node", "peer"])["reference_kind"]
    assert (kinds.xs("node-00000", level="node") == "own").all()
    assert (mixed.pairs["reference"] == 300.0).sum() == len(plan.pairs) - ((plan.pairs["node"] == "node-00000").sum())
    with pytest.raises(InputError, match="reference -1"):
        pair_findings(results, plan, reference=-1)


def test_policy_thresholds_and_tighter_gates() -> None:
    limits = PairThresholds.from_policy(default_policy())
    assert (limits.warn_drop_pct, limits.fail_drop_pct, limits.z) == (5.0, 15.0, 3.0)
    with pytest.raises(InputError, match="fail_drop_pct"):
        PairThresholds(warn_drop_pct=10, fail_drop_pct=5)
    fabric = Fabric(NODES, seed=12)
    fabric.nic["node-00010"] = 0.9  # 10 % slow: low with both partners, but not at fail level
    plan = plan_rounds(NODES, leaf_label=LEAF, seed=1)
    j = pair_findings(fabric.measure(plan.pairs, repeats=5), plan, thresholds=PairThresholds(z=2.0))
    assert j.culprits == ("node-00010",)
    row = j.findings[j.findings["node"] == "node-00010"].iloc[0]
    assert row["verdict"] == "warn"
    assert row["ticket"] == "none"


def test_a_node_without_results_is_inconclusive() -> None:
    fabric = Fabric(NODES, seed=13)
    plan = plan_rounds(NODES, leaf_label=LEAF, seed=1)
    results = fabric.measure(plan.pairs)
    results = results[(results["node"] != "node-00020") & (results["peer"] != "node-00020")]
    j = pair_findings(results, plan)
    row = j.findings[j.findings["node"] == "node-00020"].iloc[0]
    assert (row["status"], row["verdict"]) == ("unmeasured", "inconclusive")
    assert set(j.pairs.loc[j.pairs["level"] == "missing", "status"]) == {"missing"}
    assert (j.pairs["level"] == "missing").sum() == 2
    assert "node-00020" not in j.good
    assert not j.culprits
    assert list(j.findings.columns) == list(FINDING_COLUMNS)


def test_both_orientations_and_repeats_pool_into_one_pair() -> None:
    fabric = Fabric(NODES, seed=14)
    plan = plan_rounds(NODES, leaf_label=LEAF, seed=1)
    results = fabric.measure(plan.pairs)
    flipped = results.rename(columns={"node": "peer", "peer": "node"}).assign(repeat=results["repeat"] + 3)
    j = pair_findings(pd.concat([results, flipped], ignore_index=True), plan)
    assert (j.pairs["samples"] == 6).all()
    other = results[results["metric"] == "nccl_pair_busbw_gbps"].assign(metric="gemm_bf16_tflops", peer=None)
    assert (pair_findings(pd.concat([results, other]), plan).pairs["samples"] == 3).all()


def _results() -> tuple[pd.DataFrame, PairingPlan]:
    plan = plan_rounds(_fleet([4, 4]), leaf_label=LEAF, seed=1)
    return Fabric(_fleet([4, 4])).measure(plan.pairs).reset_index(drop=True), plan


def _once(frame: pd.DataFrame) -> pd.DataFrame:
    """One sample per pair, without a ``repeat`` column: each row is then the pair's only sample."""
    return frame[frame["repeat"] == 0].drop(columns="repeat").reset_index(drop=True)


def _set(frame: pd.DataFrame, row: int, column: str, value: Any) -> pd.DataFrame:
    out = frame.copy()
    out[column] = out[column].astype(object)
    out.loc[row, column] = value
    return out


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r.drop(columns="value"), "column 'value': required column is missing"),
        (lambda r: r.drop(columns=["node", "peer"]), "2 problems"),
        (lambda r: _set(r, 3, "value", np.nan), "row 4, column 'value': value is empty"),
        (lambda r: _set(r, 3, "value", np.inf), "row 4, column 'value': value inf is not finite"),
        (lambda r: _set(r, 3, "value", -2.0), "row 4, column 'value': value -2 must be at least 0"),
        (lambda r: _set(r, 3, "value", "fast"), "row 4, column 'value': value 'fast' is not a number"),
        (
            lambda r: _set(r, 6, "peer", "node-99999"),
            "row 7, column 'peer': peer 'node-99999' is not in the pairing plan",
        ),
        (lambda r: _set(r, 6, "node", None), "row 7, column 'node': node is empty"),
        (lambda r: _set(r, 2, "peer", r.loc[2, "node"]), "row 3, column 'peer': a node paired with itself"),
        (lambda r: pd.concat([r, r.iloc[[4]]], ignore_index=True), "row 25, column 'repeat': a repeated sample"),
        (lambda r: _once(r).pipe(lambda o: pd.concat([o, o.iloc[[4]]], ignore_index=True)), "row 9, column 'peer'"),
        (lambda r: r.assign(reference=370.0).pipe(_set, 1, "reference", 0.0), "row 2, column 'reference'"),
        (lambda r: _set(r, 0, "repeat", 1.5), "row 1, column 'repeat': repeat must be a whole number"),
    ],
)
def test_bad_results_name_the_row_and_field(change: object, message: str) -> None:
    results, plan = _results()
    with pytest.raises(ResultsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pair_findings(change(results), plan)  # type: ignore[operator]


def test_a_pair_the_plan_does_not_have() -> None:
    results, plan = _results()
    planned = {frozenset(p) for p in zip(plan.pairs["node"], plan.pairs["peer"], strict=True)}
    stranger = next(
        p
        for p in plan.nodes.index
        if p != results.loc[0, "node"] and frozenset((results.loc[0, "node"], p)) not in planned
    )
    with pytest.raises(ResultsError, match=r"row 1, column 'peer': the pair \(.*\) is not in the pairing plan"):
        pair_findings(_set(results, 0, "peer", stranger), plan)


def test_extending_a_plan_refuses_what_does_not_fit() -> None:
    results, plan = _results()
    j = pair_findings(results, plan)
    assert not j.pending
    assert repairs(j, plan).pairs.empty
    with pytest.raises(InputError, match="repeat a pair"):
        plan.extended(PairingPlan(plan.nodes, plan.pairs.assign(round=9), plan.idle, (), 2, 0))
    with pytest.raises(InputError, match="start at round 0"):
        plan.extended(PairingPlan(plan.nodes, plan.pairs.iloc[:1], plan.idle, (), 2, 0))


def test_the_judgement_reads_as_lines() -> None:
    fabric = Fabric(NODES, seed=15)
    fabric.nic["node-00033"] = 0.5
    plan = plan_rounds(NODES, leaf_label=LEAF, seed=1)
    lines = pair_findings(fabric.measure(plan.pairs), plan).summary()
    assert lines[0].startswith("pairs: ")
    assert "2 node" in lines[0]
    assert lines[1].startswith("reference: the fleet median")
    assert any(line.startswith("culprit node-00033: node-00033 is low with 2 of its 2 partners") for line in lines)


def test_the_partner_of_a_bad_nic_with_one_other_slow_pair_is_re_paired_not_blamed() -> None:
    """Low with a culprit and with one other partner is no evidence against a node: it is re-paired."""
    plan = plan_rounds(NODES, leaf_label=LEAF, seed=1)
    x, h = plan.round(0).iloc[3][["node", "peer"]]
    z = next(p for p in plan.round(1)[["node", "peer"]].itertuples(index=False) if h in p)
    fabric = Fabric(NODES, seed=16)
    fabric.nic[x] = 0.5
    fabric.slow[frozenset(z)] = 0.6  # h's other pair: a transient
    run = _certify(fabric, seed=1)
    assert h in run.first.suspects
    assert h not in run.first.culprits
    j = run.judgement
    assert j.culprits == (x,)
    assert _blamed(j) == {x}
    assert h in j.cleared
    assert not j.pending


def test_a_suspect_pair_half_re_paired_stays_suspect_and_only_the_rest_is_re_paired() -> None:
    fabric, x, y = _one_slow_pair(5)
    plan = plan_rounds(NODES, leaf_label=LEAF, seed=1)
    results = fabric.measure(plan.pairs)
    more = repairs(pair_findings(results, plan), plan, seed=1)
    again = more.pairs[(more.pairs["node"] == x) | (more.pairs["peer"] == x)]  # y's re-pairing never ran
    full = plan.extended(more)
    after = pair_findings(pd.concat([results, fabric.measure(again)], ignore_index=True), full)
    assert set(after.suspects) == {x, y}
    assert not after.cleared
    assert after.pending
    last = repairs(after, full, seed=2)
    assert len(last.pairs) == 1
    assert y in set(last.pairs[["node", "peer"]].to_numpy().ravel())
    assert x not in set(last.pairs[["node", "peer"]].to_numpy().ravel())
    assert int(last.pairs["round"].iloc[0]) == full.rounds


# --- verdict rows, references, stored plans ---------------------------------------------------------------


def test_the_judgement_as_verdicts_fails_the_nic_flags_the_uplink_at_fleet_level_and_passes_the_rest() -> None:
    fabric = Fabric(NODES, seed=8)
    fabric.nic["node-00019"] = 0.5
    fabric.uplink[frozenset((_leaf(4), _leaf(6)))] = 0.65
    run = _certify(fabric, seed=8)
    rows = link_verdicts(run.judgement, run_id="cert-1", models=dict.fromkeys(NODES["node"], "NVIDIA H200"))
    assert list(rows.columns) == list(VERDICT_COLUMNS)
    flagged = rows[rows["verdict"] != "pass"]
    nic = flagged[flagged["node"] == "node-00019"]
    assert (len(nic), nic["peer"].isna().all(), set(nic["cause"])) == (1, True, {"network"})
    assert nic["verdict"].iloc[0] == "fail"
    assert "partner" in nic["reasons"].iloc[0] or "with" in nic["reasons"].iloc[0]
    [uplink] = flagged[flagged["reference_kind"] == "fleet"].itertuples()
    assert pd.isna(uplink.node)
    assert uplink.cause == "network"
    assert _leaf(4) in uplink.reasons
    assert _leaf(6) in uplink.reasons
    # No other node has a row that is not a pass: a node is failed only by a finding resting on 2 partners.
    assert set(flagged["node"].dropna()) == {"node-00019"}
    passing = rows[rows["verdict"] == "pass"]
    assert passing["peer"].notna().all()
    assert (passing["gpu_model"] == "NVIDIA H200").all()
    # Every measured pair is one row: a pass (saying what explains it when it was low) or its own finding.
    measured = int((run.judgement.pairs["status"] != "missing").sum())
    assert len(passing) + int((run.judgement.findings["scope"] == "pair").sum()) == measured
    explained = passing[passing["reasons"] != ""]
    assert explained["reasons"].str.startswith("low, explained by").all()
    assert {"node-00019"} <= set(explained["node"]) | set(explained["peer"])


def test_a_pairs_reference_is_its_nodes_own_link_baseline() -> None:
    pair, nccl = "nccl_pair_busbw_gbps", "nccl_allreduce_busbw_gbps"
    baseline = pd.DataFrame(
        {
            "level": ["node", "node", "gpu", "node"],
            "key": ["a", "b", "a", "c"],
            "metric": [pair, pair, pair, nccl],
            "center": [360.0, 372.0, 1.0, 480.0],
        }
    )
    rows = pd.DataFrame({"node": ["a", "b", "c"], "peer": ["b", "a", "a"]})
    refs = pair_references(rows, baseline)
    assert refs.iloc[:2].tolist() == [360.0, 372.0]
    assert np.isnan(refs.iloc[2])


def test_a_stored_plan_reads_back_and_a_results_file_alone_gives_a_plan_of_its_pairs() -> None:
    plan = plan_rounds(NODES, leaf_label=LEAF, seed=3)
    back = stored_plan(*plan.frames(), leaf_label=LEAF, partners=plan.partners, seed=plan.seed)
    pd.testing.assert_frame_equal(back.nodes, plan.nodes)
    pd.testing.assert_frame_equal(back.pairs, plan.pairs)
    results = Fabric(NODES, seed=3).measure(plan.pairs)
    mirrored = pd.concat([results, results.rename(columns={"node": "peer", "peer": "node"})], ignore_index=True)
    alone = measured_plan(mirrored)
    assert len(alone.pairs) == len(plan.pairs)
    assert alone.nodes["unlabelled"].all()
    assert pair_findings(mirrored, alone).culprits == ()
    with pytest.raises(InputError, match="lack column"):
        stored_plan(plan.nodes.reset_index(), plan.pairs.drop(columns=["round"]), leaf_label=LEAF)
