"""The pairing plan: which two nodes measure their two-node NCCL all-reduce together, round by round.

A node's pair bandwidth mixes its own network path, its partner's and the fabric between them. One pair cannot
tell them apart; a plan in which every node meets a partner in its own leaf *and* one in another leaf can
(docs/design/verdict-engine.md, "Node and pair findings").

The plan is built from *rounds*; in each round every node is in at most one pair, so a round is one batch
of two-node Jobs that keeps the whole fleet busy once. Rounds alternate between intra-leaf and inter-leaf
matchings, both made with the circle method of round-robin tournaments:

* intra-leaf round ``q``: the nodes of each leaf, in a random order, play round ``q`` of a round-robin
  among themselves; distinct ``q`` never repeat a partner;
* inter-leaf round ``q``: the leaves play round-robin, and the node of rank ``r`` in leaf ``i`` meets the
  node of the same rank in the leaf that ``i`` plays in tournament round ``r + q``. Successive ranks of
  a leaf meet successive leaves, so one round spreads a leaf's pairs over all the other leaves (every pair
  of leaves is measured at least once when leaves hold at least ``leaves − 1`` nodes), which is what lets
  a slow link between two leaves show at all.

Each node's partner is computed from its (leaf, rank) alone, so a round costs O(nodes) array work. Nodes
the circle leaves without a partner (the bye of an odd leaf, a rank the partner leaf does not have) are
paired among themselves across leaves in the same round. What the rounds still miss (an odd leaf has one
node without a partner in its own leaf, an odd fleet one idle node per round) a short *makeup* round adds,
pairing only those nodes; a third pairing inside a round is never planned, since a node in two pairs at
once would measure half its bandwidth in each.

Topology: the leaf of a node is ``(zone, leaf label)`` (``topology.kubernetes.io/zone`` and a configurable
rack or leaf label). Nodes without a leaf label form one group of their own, ``(unlabelled)`` (within their
zone, when they carry one); the plan pairs them like a leaf and says so in its notes, and the findings
never name a link or a switch for that group, since it is not one place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt
import pandas as pd

from .._text import counted
from ..errors import InputError

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

#: The well-known Kubernetes zone label: the tier above the leaves.
ZONE_LABEL = "topology.kubernetes.io/zone"
#: The group of the nodes that carry no leaf label.
UNLABELLED = "(unlabelled)"

INTRA_LEAF = "intra-leaf"
INTER_LEAF = "inter-leaf"
INTER_ZONE = "inter-zone"
#: What a pair crosses: its leaf switch only, the leaves' uplinks within a zone, or the tier above zones.
KINDS: tuple[str, ...] = (INTRA_LEAF, INTER_LEAF, INTER_ZONE)

#: The plan's pairs table, one row per pair (each unordered pair at most once in a plan); ``stage`` is ``plan``
#: (a full round), ``makeup`` (the few pairs the full rounds missed) or ``re-pair`` (:func:`repairs`).
PAIR_COLUMNS: tuple[str, ...] = ("round", "stage", "node", "peer", "kind", "node_group", "peer_group")

# Makeup rounds beyond the planned ones. A fleet needing more than this (one leaf holding most of the
# nodes, so its nodes cannot all meet another leaf) is told so in the notes rather than planned forever.
_MAX_MAKEUP = 3


@dataclass(frozen=True)
class PairingPlan:
    """A pairing plan: its nodes, its pairs round by round, the nodes idle in each full round, and notes.

    ``nodes`` is indexed by node name (sorted) with columns ``zone``, ``leaf``, ``group`` (the leaf's
    display name, ``zone/leaf`` when the node has a zone) and ``unlabelled``. ``pairs`` has
    :data:`PAIR_COLUMNS`; ``idle`` has ``round`` and ``node`` for the nodes of the fleet without a pair
    in a ``plan`` round (makeup and re-pair rounds run only the nodes they list). ``notes`` say, in
    words, what each round does and what the plan could not do.
    """

    nodes: pd.DataFrame
    pairs: pd.DataFrame
    idle: pd.DataFrame
    notes: tuple[str, ...]
    partners: int
    seed: int
    leaf_label: str = ""
    zone_label: str = ZONE_LABEL

    @property
    def rounds(self) -> int:
        """How many rounds the plan has (the next round's number)."""
        return int(self.pairs["round"].max()) + 1 if len(self.pairs) else 0

    def round(self, number: int) -> pd.DataFrame:
        """The pairs of one round (an empty frame for a round the plan does not have)."""
        return self.pairs[self.pairs["round"] == number].reset_index(drop=True)

    def partner_counts(self) -> pd.DataFrame:
        """Per node: ``partners`` (distinct), ``intra`` and ``inter`` (pairs of each kind; ``inter``
        counts inter-zone pairs too). Every node of the plan has a row."""
        ends = pd.DataFrame(
            {
                "node": np.r_[self.pairs["node"].to_numpy(), self.pairs["peer"].to_numpy()],
                "intra": np.tile(self.pairs["kind"].to_numpy() == INTRA_LEAF, 2),
            }
        )
        per = ends.groupby("node").agg(partners=("intra", "size"), intra=("intra", "sum"))
        per = per.reindex(self.nodes.index, fill_value=0).astype(np.int64)
        per["inter"] = per["partners"] - per["intra"]
        per.index.name = "node"
        return per

    def frames(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The plan's nodes (a ``node`` column) and pairs as plain tables, to store with a run
        (:func:`stored_plan` reads them back)."""
        return self.nodes.reset_index(names="node"), self.pairs.reset_index(drop=True)

    def extended(self, more: PairingPlan) -> PairingPlan:
        """This plan followed by ``more``'s rounds (a makeup or re-pair plan made for it). Raises
        ``InputError`` when ``more`` names nodes this plan lacks, repeats a round number or a pair."""
        unknown = more.nodes.index.difference(self.nodes.index)
        if len(unknown):
            raise InputError(f"the added rounds name nodes the plan does not have: {', '.join(unknown[:5])}")
        if len(more.pairs) and int(more.pairs["round"].min()) < self.rounds:
            raise InputError(
                f"the added rounds start at round {int(more.pairs['round'].min())}; the plan has {self.rounds}"
            )
        index = self.nodes.index
        key = _pair_keys(index, self.pairs["node"], self.pairs["peer"])
        added = _pair_keys(index, more.pairs["node"], more.pairs["peer"])
        if np.isin(added, key).any():
            raise InputError("the added rounds repeat a pair the plan already has")
        pairs = pd.concat([self.pairs, more.pairs], ignore_index=True)
        idle = pd.concat([self.idle, more.idle], ignore_index=True)
        return replace(self, pairs=pairs, idle=idle, notes=self.notes + more.notes)


def stored_plan(
    nodes: pd.DataFrame,
    pairs: pd.DataFrame,
    *,
    leaf_label: str,
    zone_label: str = ZONE_LABEL,
    partners: int = 2,
    seed: int = 0,
) -> PairingPlan:
    """The plan whose ``nodes`` (a ``node`` column and the plan's node columns) and ``pairs`` were stored with a
    run (:meth:`PairingPlan.frames`). Raises ``InputError`` naming a missing column."""
    for what, frame, columns in (
        ("nodes", nodes, ("node", "zone", "leaf", "group", "unlabelled")),
        ("pairs", pairs, PAIR_COLUMNS),
    ):
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise InputError(f"the stored pairing plan's {what} lack column(s) {', '.join(missing)}")
    return PairingPlan(
        nodes=nodes.set_index("node")[["zone", "leaf", "group", "unlabelled"]].sort_index(),
        pairs=pairs[list(PAIR_COLUMNS)].reset_index(drop=True),
        idle=pd.DataFrame({"round": pd.Series(dtype=np.int64), "node": pd.Series(dtype=object)}),
        notes=(),
        partners=partners,
        seed=seed,
        leaf_label=leaf_label,
        zone_label=zone_label,
    )


def measured_plan(pairs: pd.DataFrame) -> PairingPlan:
    """A plan of the pairs ``pairs`` (rows with ``node`` and ``peer``; both orientations are one pair) as if
    measured in one round by unlabelled nodes: what a results file without its run's plan allows (a node's
    own path can be named, no link or leaf can)."""
    a, b = pairs["node"].astype(str).to_numpy(), pairs["peer"].astype(str).to_numpy()
    low, high = np.minimum(a, b), np.maximum(a, b)
    unique = pd.DataFrame({"node": low, "peer": high}).drop_duplicates().sort_values(["node", "peer"])
    names = np.unique(np.r_[unique["node"].to_numpy(), unique["peer"].to_numpy()])
    nodes = pd.DataFrame({"node": names, "zone": "", "leaf": "", "group": UNLABELLED, "unlabelled": True})
    table = unique.assign(round=0, stage="plan", kind=INTRA_LEAF, node_group=UNLABELLED, peer_group=UNLABELLED)
    return stored_plan(nodes, table, leaf_label="")


def plan_rounds(
    nodes: pd.DataFrame, *, leaf_label: str, zone_label: str = ZONE_LABEL, partners: int = 2, seed: int = 0
) -> PairingPlan:
    """Plan pairing rounds for ``nodes``: one row per node, with its name in ``node`` and its labels
    in columns named by the label keys (``leaf_label``, ``zone_label``; a missing column or an empty value
    means the node does not carry that label).

    Returns a :class:`PairingPlan` of ``partners`` full rounds (intra-leaf first, then inter-leaf, then
    alternating; all intra-leaf when the fleet has one leaf) and, where they fall short, makeup rounds,
    such that every node meets at least ``partners`` distinct partners (at most the fleet's size less one),
    at least one in its own leaf when its leaf has another node, and at least one in another leaf when the
    fleet has another leaf. Every node is in at most one pair per round. The plan depends only on the set
    of nodes, their labels and ``seed`` (not on the frame's row order).

    Raises ``InputError`` when ``node`` is missing, a name is empty or repeated, or ``partners`` is
    below 1.
    """
    if isinstance(partners, bool) or not isinstance(partners, int | np.integer) or partners < 1:
        raise InputError(f"partners {partners!r}: must be a whole number of at least 1")
    if "node" not in nodes.columns:
        raise InputError("the node table has no column 'node' (one row per node, its name there)")
    names = nodes["node"]
    bad = names.isna().to_numpy() | (names.astype(str).str.strip() == "").to_numpy()
    if bad.any():
        raise InputError(f"row {int(np.flatnonzero(bad)[0]) + 1}, column 'node': empty node name")
    names = names.astype(str)
    repeated = names[names.duplicated()]
    if len(repeated):
        raise InputError(f"column 'node': node {repeated.iloc[0]!r} appears more than once")

    order = np.argsort(names.to_numpy(), kind="stable")
    frame = pd.DataFrame(
        {
            "node": names.to_numpy()[order],
            "zone": _label(nodes, zone_label)[order],
            "leaf": _label(nodes, leaf_label)[order],
        }
    )
    frame["unlabelled"] = frame["leaf"] == ""
    leaf_name = np.where(frame["unlabelled"], UNLABELLED, frame["leaf"])
    frame["group"] = np.where(frame["zone"] == "", leaf_name, frame["zone"] + "/" + leaf_name)
    group_code, group_names = pd.factorize(frame["group"], sort=True)
    zone_code = pd.factorize(frame["zone"], sort=True)[0]
    frame = frame.set_index("node")
    builder = _Builder(
        n=len(frame),
        group=group_code.astype(np.int64),
        zone=zone_code.astype(np.int64),
        n_groups=len(group_names),
        partners=int(partners),
        rng=np.random.default_rng(seed),
    )
    builder.full_rounds()
    builder.makeup()
    notes = _notes(builder, frame, leaf_label)
    return PairingPlan(
        nodes=frame[["zone", "leaf", "group", "unlabelled"]],
        pairs=builder.pairs_frame(frame.index, np.asarray(group_names, dtype=object)),
        idle=builder.idle_frame(frame.index),
        notes=tuple(notes),
        partners=int(partners),
        seed=seed,
        leaf_label=leaf_label,
        zone_label=zone_label,
    )


# --- the rounds ------------------------------------------------------------------------------------


def _circle(team: IntArray, t: IntArray, n: IntArray) -> IntArray:
    """The opponent of ``team`` in round ``t`` of the circle-method round-robin among ``n`` teams (``n``
    even; elementwise). Teams ``0..n-2`` rotate: ``i`` and ``j`` meet in round ``t`` when ``i + j ≡ t``
    (mod ``n − 1``); the one that would meet itself meets the fixed team ``n − 1`` instead. Each round is
    a perfect matching and no two rounds (``t`` mod ``n − 1``) share a match."""
    m = n - 1
    rot = team < m
    j = np.mod(t - team, m)
    j = np.where(rot & (j == team), m, j)
    # The fixed team meets the i with 2i ≡ t: i = t·(n/2) mod m, since 2·(n/2) = n ≡ 1 (mod m).
    return np.where(rot, j, np.mod(t * (n // 2), m))


class _Builder:
    """Builds a plan's rounds on node codes (nodes sorted by name), as arrays."""

    def __init__(
        self, *, n: int, group: IntArray, zone: IntArray, n_groups: int, partners: int, rng: np.random.Generator
    ) -> None:
        self.n, self.group, self.zone, self.n_groups, self.partners = n, group, zone, n_groups, partners
        self.size = np.bincount(group, minlength=n_groups).astype(np.int64)
        # A random leaf order and a random order of the nodes within each leaf: the plan's seed.
        self.team = rng.permutation(n_groups).astype(np.int64)[group]
        self.order = np.lexsort((rng.random(n), self.team)).astype(np.int64)  # nodes by (team, rank)
        team_size = np.bincount(self.team, minlength=n_groups).astype(np.int64)
        self.start = np.r_[0, np.cumsum(team_size)[:-1]].astype(np.int64)
        self.team_size = team_size
        self.rank = np.empty(n, dtype=np.int64)
        self.rank[self.order] = np.arange(n) - self.start[self.team[self.order]]
        self.rng = rng
        self.a: list[IntArray] = []
        self.b: list[IntArray] = []
        self.round_of: list[IntArray] = []
        self.stage_of: list[str] = []
        self.round_kind: list[str] = []
        self.idle: list[tuple[int, IntArray]] = []
        self.unmet: dict[str, int] = {}

    # -- full rounds --

    def full_rounds(self) -> None:
        one_leaf = self.n_groups < 2
        for r in range(self.partners):
            kind = INTRA_LEAF if one_leaf or r % 2 == 0 else INTER_LEAF  # alternating, intra-leaf first
            self.round_kind.append(kind)
            q = r if one_leaf else r // 2  # the round's number among the rounds of its kind
            self._add_round(self._intra(q) if kind == INTRA_LEAF else self._inter(q), r)

    def _intra(self, q: int) -> IntArray:
        s = self.team_size[self.team]
        n = s + (s % 2)  # an odd leaf plays with a dummy: its opponent sits the round out
        j = _circle(self.rank, np.full(self.n, q) % np.maximum(n - 1, 1), n)
        return np.where(j < s, self.order[self.start[self.team] + np.minimum(j, s - 1)], -1)

    def _inter(self, q: int) -> IntArray:
        g = self.n_groups
        n = g + (g % 2)
        t = np.mod(self.rank + q, n - 1)
        j = _circle(self.team, t, np.full(self.n, n))
        ok = j < g
        jj = np.where(ok, j, 0)
        ok &= self.rank < self.team_size[jj]
        return np.where(ok, self.order[self.start[jj] + np.minimum(self.rank, self.team_size[jj] - 1)], -1)

    def _add_round(self, partner: IntArray, r: int) -> None:
        """Record a round from each node's partner (-1: none): the circle's pairs not planned before,
        then the nodes left over paired among themselves across leaves; whoever is left is idle."""
        me = np.arange(self.n)
        first = (partner > me) & (partner >= 0)
        a, b = me[first], partner[first]
        fresh = ~np.isin(a * self.n + b, self._keys())
        a, b = a[fresh], b[fresh]
        busy = np.zeros(self.n, dtype=bool)
        busy[a] = busy[b] = True
        # The left-over nodes by (leaf, rank), each paired with the one half the list further on: that
        # crosses leaves unless one leaf holds more than half of them.
        rest = self.order[~busy[self.order]]
        half = len(rest) // 2
        ra, rb = rest[:half], rest[half : 2 * half]
        lo, hi = np.minimum(ra, rb), np.maximum(ra, rb)
        fresh = ~np.isin(lo * self.n + hi, self._keys())
        a, b = np.r_[a, lo[fresh]], np.r_[b, hi[fresh]]
        busy[a] = busy[b] = True
        self._append(a, b, r, "plan")
        self.idle.append((r, np.flatnonzero(~busy)))

    # -- makeup --

    def makeup(self) -> None:
        """Rounds of only the pairs the full rounds missed: a partner in the node's own leaf, one in
        another leaf, or enough distinct partners. Greedy over the few nodes that need one (an odd leaf
        has one, an odd fleet one per round), each served once per round, preferring partners that need
        one as well."""
        want = min(self.partners, self.n - 1)
        next_round = self.partners
        for _ in range(_MAX_MAKEUP):
            need_intra, need_inter, need_more = self._needs(want)
            needy = need_intra | need_inter | need_more
            if not needy.any():
                return
            ends_a, ends_b = self._ends()
            sort = np.argsort(ends_a, kind="stable")
            ends_a, ends_b = ends_a[sort], ends_b[sort]
            busy = np.zeros(self.n, dtype=bool)
            new_a: list[int] = []
            new_b: list[int] = []
            noise = self.rng.random(self.n)  # ties broken at random, by the seed
            everyone = np.arange(self.n)
            # The most constrained first: a partner in its own leaf, then in another leaf, then any.
            urgency = np.where(need_intra, 0, np.where(need_inter, 1, 2))
            for u in np.lexsort((noise, urgency))[: int(needy.sum())]:
                if busy[u]:
                    continue
                met = ends_b[np.searchsorted(ends_a, u) : np.searchsorted(ends_a, u, side="right")]
                if need_intra[u]:
                    lo = self.start[self.team[u]]
                    pool = self.order[lo : lo + self.team_size[self.team[u]]]
                else:
                    pool = everyone
                ok = ~busy[pool] & (pool != u) & ~np.isin(pool, met)
                if need_inter[u] and not need_intra[u]:
                    ok &= self.group[pool] != self.group[u]
                if not ok.any() and need_more[u]:
                    # No partner of the kind it lacks is free: at least another partner, of any kind.
                    pool = everyone
                    ok = ~busy[pool] & (pool != u) & ~np.isin(pool, met)
                if not ok.any():
                    continue
                # Best a partner whose own need this pair meets, then one that needs nothing, last one
                # whose need it does not meet (it would be busy for this round without being served).
                intra = self.group[pool] == self.group[u]
                served = np.where(intra, need_intra[pool], need_inter[pool]) | (
                    need_more[pool] & ~need_intra[pool] & ~need_inter[pool]
                )
                score = np.where(needy[pool], np.where(served, 0.0, 2.0), 1.0) + noise[pool]
                v = int(pool[np.argmin(np.where(ok, score, np.inf))])
                busy[u] = busy[v] = True
                new_a.append(min(int(u), v))
                new_b.append(max(int(u), v))
            if not new_a:
                break
            self._append(np.asarray(new_a, dtype=np.int64), np.asarray(new_b, dtype=np.int64), next_round, "makeup")
            self.round_kind.append("makeup")
            next_round += 1
        need_intra, need_inter, need_more = self._needs(want)
        self.unmet = {
            "a partner in its own leaf": int(need_intra.sum()),
            "a partner in another leaf": int(need_inter.sum()),
            f"{want} distinct partners": int(need_more.sum()),
        }

    def _needs(self, want: int) -> tuple[BoolArray, BoolArray, BoolArray]:
        a, b = self._ends()
        count = np.bincount(a, minlength=self.n)
        same = self.group[a] == self.group[b]
        intra = np.bincount(a[same], minlength=self.n)
        need_intra = (intra == 0) & (self.size[self.group] >= 2)
        need_inter = (count - intra == 0) & (self.n_groups >= 2)
        return need_intra, need_inter, count < want

    # -- storage --

    def _append(self, a: IntArray, b: IntArray, r: int, stage: str) -> None:
        self.a.append(a.astype(np.int64))
        self.b.append(b.astype(np.int64))
        self.round_of.append(np.full(len(a), r, dtype=np.int64))
        self.stage_of.append(stage)

    def _pairs(self) -> tuple[IntArray, IntArray]:
        if not self.a:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        return np.concatenate(self.a), np.concatenate(self.b)

    def _keys(self) -> IntArray:
        a, b = self._pairs()
        return a * self.n + b

    def _ends(self) -> tuple[IntArray, IntArray]:
        a, b = self._pairs()
        return np.r_[a, b], np.r_[b, a]

    def pairs_frame(self, index: pd.Index, group_names: npt.NDArray[np.object_]) -> pd.DataFrame:
        a, b = self._pairs()
        rounds = np.concatenate(self.round_of) if self.round_of else np.zeros(0, dtype=np.int64)
        stage = np.repeat(np.asarray(self.stage_of, dtype=object), [len(x) for x in self.a])
        names = index.to_numpy(dtype=object)
        frame = _pair_table(rounds, stage, a, b, names, self.group, self.zone, group_names)
        return frame.sort_values(["round", "node"], kind="stable").reset_index(drop=True)

    def idle_frame(self, index: pd.Index) -> pd.DataFrame:
        names = index.to_numpy(dtype=object)
        rounds = [np.full(len(nodes), r, dtype=np.int64) for r, nodes in self.idle]
        nodes = [names[n].astype(str) for _, n in self.idle]
        return pd.DataFrame(
            {
                "round": np.concatenate(rounds) if rounds else np.zeros(0, dtype=np.int64),
                "node": np.concatenate(nodes) if nodes else np.zeros(0, dtype=str),
            }
        )


def _pair_table(
    rounds: IntArray,
    stages: npt.NDArray[np.object_],
    a: IntArray,
    b: IntArray,
    names: npt.NDArray[np.object_],
    group: IntArray,
    zone: IntArray,
    group_names: npt.NDArray[np.object_],
) -> pd.DataFrame:
    """The pairs ``a``–``b`` (node codes) as :data:`PAIR_COLUMNS` rows; ``group`` and ``zone`` are each node's."""
    return pd.DataFrame(
        {
            "round": rounds,
            "stage": stages.astype(str),
            "node": names[a].astype(str),
            "peer": names[b].astype(str),
            "kind": _kinds(group[a], group[b], zone[a], zone[b]),
            "node_group": group_names[group[a]].astype(str),
            "peer_group": group_names[group[b]].astype(str),
        },
        columns=list(PAIR_COLUMNS),
    )


def _kinds(ga: IntArray, gb: IntArray, za: IntArray, zb: IntArray) -> npt.NDArray[np.str_]:
    return np.where(ga == gb, INTRA_LEAF, np.where(za == zb, INTER_LEAF, INTER_ZONE))


def _label(nodes: pd.DataFrame, label: str) -> npt.NDArray[np.object_]:
    """A label's values as strings, ``""`` where a node does not carry it (no column, null, blank)."""
    if not label or label not in nodes.columns:
        return np.full(len(nodes), "", dtype=object)
    values = nodes[label]
    text = values.astype(str).str.strip().to_numpy(dtype=object)
    return np.where(values.isna().to_numpy(), "", text)


def _codes(index: pd.Index, names: pd.Series | npt.NDArray[np.object_]) -> IntArray:
    """Each name's position in ``index`` (-1 where it is not there)."""
    return np.asarray(index.get_indexer(pd.Index(names)), dtype=np.int64)


def _pair_keys(index: pd.Index, a: pd.Series, b: pd.Series) -> IntArray:
    """Each pair's key, ``min·n + max`` of its nodes' codes: the same for both orientations."""
    ca, cb = _codes(index, a), _codes(index, b)
    return np.minimum(ca, cb) * len(index) + np.maximum(ca, cb)


def _notes(builder: _Builder, frame: pd.DataFrame, leaf_label: str) -> list[str]:
    """What the plan does, in words: one line per round, then what it could not do."""
    notes: list[str] = []
    unlabelled = int(frame["unlabelled"].sum())
    if unlabelled == len(frame) and len(frame):
        notes.append(
            f"no node carries the leaf label {leaf_label!r}: all {counted(len(frame), 'node')} form one group "
            f"{UNLABELLED!r}, so the plan cannot tell a leaf's uplink from a node"
        )
    elif unlabelled:
        notes.append(
            f"{unlabelled} node{'s' if unlabelled != 1 else ''} carry no leaf label {leaf_label!r}: they form "
            f"their own group {UNLABELLED!r}, paired like a leaf; no uplink or switch is named for it"
        )
    if builder.n_groups == 1 and builder.n >= 2:
        notes.append("one leaf: every round is intra-leaf, so no uplink between leaves can be measured")
    if builder.n % 2:
        notes.append(
            "an odd number of nodes: one node is idle in each full round, and the makeup round gives it "
            "the partners it missed (a node never runs two pairs at once)"
        )
    a, b = builder._pairs()
    rounds = np.concatenate(builder.round_of) if builder.round_of else np.zeros(0, dtype=np.int64)
    kinds = _kinds(builder.group[a], builder.group[b], builder.zone[a], builder.zone[b])
    g = builder.n_groups
    for r, what in enumerate(builder.round_kind):
        here = rounds == r
        counts = pd.Series(kinds[here]).value_counts()
        mix = ", ".join(f"{int(counts[k])} {k}" for k in KINDS if k in counts.index)
        line = f"round {r} ({what}): {counted(int(here.sum()), 'pair')} ({mix or 'none'})"
        if what == INTER_LEAF and g >= 2:
            ga, gb = builder.group[a[here]], builder.group[b[here]]
            cross = ga != gb
            covered = len(np.unique(np.minimum(ga, gb)[cross] * g + np.maximum(ga, gb)[cross]))
            line += f", meeting {covered} of {counted(g * (g - 1) // 2, 'pair')} of leaves"
        idle = next((len(n) for rr, n in builder.idle if rr == r), 0)
        if idle:
            line += f"; {idle} node{'s' if idle != 1 else ''} idle"
        notes.append(line)
    for need, count in builder.unmet.items():
        if count:
            notes.append(f"{count} node{'s' if count != 1 else ''} still lack {need} after the makeup rounds")
    if builder.n == 1:
        notes.append("one node: nothing to pair")
    return notes
