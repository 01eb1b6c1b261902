"""The findings of a pairing plan's results: which network component a low pair bandwidth points at
(docs/reference/causes-and-actions.md, "Inter-node network").

Each measured pair is compared with a reference: ``d = value / reference − 1`` and ``z = d / spread``. A pair
is *low* when ``d ≤ −warn`` (5 %) and ``z ≤ −z`` (3): the deviation gate alone would flag about one healthy
pair in twenty at the 4 % run-to-run noise of a two-node all-reduce, and a node low in two such pairs by chance
would then be blamed in most runs of a few hundred nodes. It is at *fail* level when ``d ≤ −fail`` (15 %). The
spread is the fleet's robust spread of ``d`` (1.4826·MAD, at least ``min_spread``), or ``default_spread`` with
fewer than ``min_pairs_for_spread`` pairs. Low pairs are explained most specific layer first:

1. **the link between two leaves** — an end of a low pair between leaves A and B is a *witness* when it is
   fine with its partners outside the other leaf (passing, or low only with a culprit of step 2). The link is
   named when at least two *clean* low pairs (both ends witnesses) cross it that no single node is in (a node
   low only towards one leaf is that node, not the link), and they are at least ``uplink_share`` of its clean
   low and passing pairs. A low pair across the named link is the link's unless it is well below the link's
   level, which a bad NIC behind the slow link makes it.
2. **a node's own network path** — the node is low with at least two partners that are not candidates
   themselves (a candidate: a node in two low pairs), counting the pairs no link and no other culprit explains
   (a NIC at half rate is low with every partner). A node between a culprit and one other low pair is
   re-paired, not blamed. Steps 1 and 2 depend on each other and are repeated until neither changes.
3. **a leaf** — at least ``leaf_min_nodes`` and ``leaf_share`` of a leaf's measured nodes come out of step 2:
   the leaf's switch or uplinks, not its nodes; step 2 runs again without the leaf's pairs.
4. **a single slow pair** — both nodes are *suspects*, blamed for nothing; :func:`repairs` pairs each with a
   known-good partner (across leaves, one of the *other* suspect's leaf, so the link is measured again by fresh
   ends). Judged again, a suspect low with its good partner too is named by step 2, a slow link now has disjoint
   clean low pairs for step 1, and a pair is *cleared* (a transient) once both its nodes passed a re-pairing
   after it and, across leaves, some pair between the same two leaves passed.

A culprit's pair across two leaves well below its other low pairs has a second cause, probably the link: it is
a *probe* until two re-pairings without a culprit have crossed that link. A node none of whose planned pairs
has a result is ``inconclusive``; pairs without results are ``missing``. The work is a handful of
``bincount``/``unique`` passes over the pairs; only the findings (few) get text.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from ..errors import InputError, Problem, ResultsError
from ..policy import Policy
from ._plan import PAIR_COLUMNS, BoolArray, IntArray, PairingPlan, _codes, _pair_keys, _pair_table

#: What a node's own-network-path finding asks of a person, the end of its reasons: the NIC side. A caller that
#: finds another cause for the node's low pairs (its own PCIe link, say) replaces it with that cause's.
NIC_ADVICE = (
    "Its own network path: check its NIC's port state, rate and error counters, then the cable, transceiver "
    "and switch port"
)

FloatArray = npt.NDArray[np.float64]

PAIR_METRIC = "nccl_pair_busbw_gbps"

#: A pair's status in :attr:`PairFindings.pairs`: no result, passed, or low and explained by a node, the
#: link between two leaves, a leaf, or nothing yet (a suspect), or cleared by its re-pairing.
PAIR_STATUSES: tuple[str, ...] = ("missing", "pass", "node", "uplink", "leaf", "suspect", "cleared")

#: One row per finding. ``scope`` is ``node``, ``pair`` or ``fleet`` (node empty); ``status`` is
#: ``culprit``, ``uplink``, ``leaf``, ``suspect``, ``probe``, ``cleared`` or ``unmeasured``; ``verdict``, ``cause``,
#: ``action``, ``ticket`` and ``reference_kind`` use the verdict contract's words
#: (docs/design/data-contracts.md); ``layer`` is ``network``; ``component`` is ``nic`` (the node's NIC, cable
#: or switch port), ``uplink`` (between the two leaves of ``location``), ``leaf`` (its switch or uplinks) or
#: ``pair``; ``location`` names the leaf, the two leaves (``A ↔ B``) or the pair; ``partners`` is how many
#: pairs the finding rests on; ``reasons`` is the evidence: every partner measured, in GB/s and % of the
#: reference.
FINDING_COLUMNS: tuple[str, ...] = (
    "scope",
    "status",
    "verdict",
    "node",
    "peer",
    "location",
    "layer",
    "component",
    "cause",
    "action",
    "ticket",
    "metric",
    "value",
    "reference",
    "deviation_pct",
    "z",
    "reference_kind",
    "partners",
    "reasons",
)

_SHOWN = ResultsError.SHOWN
#: A finding's numbers: the medians over the pairs it rests on.
_NUMBERS = ("value", "reference", "deviation_pct", "z")


@dataclass(frozen=True)
class PairThresholds:
    """The pair findings' thresholds (docs/reference/policy.md, "`network`"; :meth:`from_policy` takes the
    policy's own).

    ``warn_drop_pct`` / ``fail_drop_pct``: the deviation gates; ``z``: the statistical gate, in spreads;
    ``min_spread``, ``default_spread``, ``min_pairs_for_spread``: the spread (a fraction of the reference);
    ``uplink_share``: the least share of the measured pairs between two leaves that must be low to name
    their link; ``leaf_share`` and ``leaf_min_nodes``: how many of a leaf's nodes low with everyone make it
    the leaf's fault. Raises ``InputError`` for an impossible value.
    """

    warn_drop_pct: float = 5.0
    fail_drop_pct: float = 15.0
    z: float = 3.0
    min_spread: float = 0.02
    # The sd of a 3-repeat median at 4 % run-to-run noise (≈2.9 %) with both ends' node factors (≈1.4 %).
    default_spread: float = 0.035
    min_pairs_for_spread: int = 10
    uplink_share: float = 0.5
    leaf_share: float = 0.5
    leaf_min_nodes: int = 3

    def __post_init__(self) -> None:
        checks = {
            "warn_drop_pct": 0 < self.warn_drop_pct < 100,
            "fail_drop_pct": self.warn_drop_pct <= self.fail_drop_pct < 100,
            "z": self.z > 0,
            "min_spread": 0 < self.min_spread < 1,
            "default_spread": 0 < self.default_spread < 1,
            "min_pairs_for_spread": self.min_pairs_for_spread >= 2,
            "uplink_share": 0 < self.uplink_share <= 1,
            "leaf_share": 0 < self.leaf_share <= 1,
            "leaf_min_nodes": self.leaf_min_nodes >= 2,
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            if not (ok and np.isfinite(value)):
                raise InputError(f"pair threshold {name}={value!r} is impossible")

    @classmethod
    def from_policy(cls, policy: Policy) -> PairThresholds:
        """The thresholds of ``policy``'s ``nccl_pair_busbw_gbps`` entry (warn and fail drops, ``warn_z``), the
        rest the defaults."""
        entry = policy.metrics[PAIR_METRIC]
        return cls(warn_drop_pct=entry.warn_drop_pct, fail_drop_pct=entry.fail_drop_pct, z=entry.warn_z)


@dataclass(frozen=True)
class PairFindings:
    """A plan's pair results, localised: each pair's status and the findings.

    ``pairs``: one row per planned pair — the plan's :data:`PAIR_COLUMNS` plus ``samples``, ``value``
    (median GB/s), ``reference``, ``reference_kind``, ``deviation_pct``, ``z``, ``level`` (``pass``,
    ``warn``, ``fail``, ``missing``), ``status`` (:data:`PAIR_STATUSES`), ``blamed`` (the culprit a
    ``node`` pair is explained by) and ``probe`` (a culprit's pair whose link is to be measured again).
    ``findings``: :data:`FINDING_COLUMNS`. ``culprits``: the nodes named
    (their network path); ``suspects``: the nodes to re-pair; ``good``: the nodes all of whose measured
    pairs passed (the partners :func:`repairs` draws on); ``uplinks``: the pairs of leaves whose link is
    named; ``leaves``: the leaves named; ``cleared``: the nodes of cleared pairs; ``reference_note`` says
    where the reference came from; ``spread`` is the one used for ``z``.
    """

    pairs: pd.DataFrame
    findings: pd.DataFrame
    culprits: tuple[str, ...]
    suspects: tuple[str, ...]
    good: tuple[str, ...]
    uplinks: tuple[tuple[str, str], ...]
    leaves: tuple[str, ...]
    cleared: tuple[str, ...]
    reference_note: str
    spread: float

    def summary(self) -> list[str]:
        """The findings in a few lines, for a run's log and its markdown artifact."""
        counts = self.pairs["status"].value_counts()
        lines = [
            "pairs: " + ", ".join(f"{int(counts[s])} {s}" for s in PAIR_STATUSES if s in counts.index),
            f"reference: {self.reference_note}; spread {self.spread * 100:.1f} %",
        ]
        where = np.where(self.findings["node"] != "", self.findings["node"], self.findings["location"])
        lines += [
            f"{status} {place}: {reasons}"
            for status, place, reasons in zip(self.findings["status"], where, self.findings["reasons"], strict=True)
        ]
        return lines

    @property
    def pending(self) -> bool:
        """Whether a re-pairing round is wanted: a suspect pair, or a culprit's pair to probe."""
        return bool(self.suspects) or bool(self.pairs["probe"].any())


def pair_findings(
    results: pd.DataFrame,
    plan: PairingPlan,
    *,
    reference: float | None = None,
    reference_kind: str | None = None,
    thresholds: PairThresholds | None = None,
    source: str = "pair results",
) -> PairFindings:
    """Judge ``results`` against ``plan`` (the plan the pairs were measured by, with its re-pairing rounds:
    :meth:`PairingPlan.extended`).

    ``results``: rows with ``node``, ``peer`` and ``value`` (GB/s); optional ``repeat`` and ``run_id``
    (a sample is one (run_id, node, peer, repeat)), ``metric`` (rows of other metrics are left out) and
    ``reference`` (per row: the pair's own baseline or the model's reference; empty where there is none).
    Each pair's value is the median of its samples, both orientations together. The reference of a pair is
    its ``reference`` column, else ``reference`` (a scalar: the model's), else the fleet median of this
    run's healthy pairs (those within the warn drop of the median of all), as the evidence says;
    ``reference_kind`` overrides the contract's word for the first two (``own``, ``model``).

    Returns a :class:`PairFindings`. Raises ``ResultsError`` (an ``InputError``) naming the rows (1-based
    positions in the frame) and columns of every problem: a missing column, an empty or unknown node or
    peer, a node paired with itself, a pair the plan does not have, a missing, non-finite or negative value
    or reference, a repeated sample; ``InputError`` for an impossible ``reference``.
    """
    limits = thresholds or PairThresholds()
    nodes = plan.nodes.index
    n = len(nodes)
    code_a, code_b, value, row_ref = _validated(results, plan, source)
    if reference is not None and not (np.isfinite(reference) and reference > 0):
        raise InputError(f"reference {reference!r}: must be a positive, finite number of GB/s")

    # Per pair: the median of its samples (a pair is its two nodes in either order).
    key = np.minimum(code_a, code_b) * n + np.maximum(code_a, code_b)
    agg = (
        pd.DataFrame({"key": key, "value": value, "ref": row_ref})
        .groupby("key", sort=True)
        .agg(value=("value", "median"), samples=("value", "size"), ref=("ref", "median"))
    )
    planned = plan.pairs.reset_index(drop=True)
    pa, pb = _codes(nodes, planned["node"]), _codes(nodes, planned["peer"])
    a, b = np.minimum(pa, pb), np.maximum(pa, pb)
    at = agg.reindex(a * n + b)  # NaN where a planned pair has no sample
    measured = at["samples"].notna().to_numpy()
    v = at["value"].to_numpy(dtype=float)
    samples = at["samples"].fillna(0).to_numpy().astype(np.int64)
    ref_col = at["ref"].to_numpy(dtype=float)

    ref, ref_kind, note = _reference(v, measured, ref_col, reference, reference_kind, limits)
    d = v / ref - 1.0
    spread = _spread(d[measured], limits)
    z = d / spread
    low = measured & (d <= -limits.warn_drop_pct / 100) & (z <= -limits.z)
    failing = low & (d <= -limits.fail_drop_pct / 100)

    group_code, group_names = pd.factorize(plan.nodes["group"], sort=True)
    group = group_code.astype(np.int64)
    unlabelled = np.isin(np.arange(len(group_names)), group[plan.nodes["unlabelled"].to_numpy(dtype=bool)])
    stage = planned["stage"].to_numpy()
    rounds = planned["round"].to_numpy().astype(np.int64)

    loc = _localise(a, b, v, group, unlabelled, low, measured, n, len(group_names), spread, limits)
    explained = [loc.by_leaf, loc.by_uplink, loc.by_node]  # most specific first
    status = np.select([~measured, *explained], ["missing", "leaf", "uplink", "node"], "pass").astype(object)
    rest = low & ~(loc.by_node | loc.by_uplink | loc.by_leaf)
    # A pair is cleared once each of its nodes has passed a re-pairing after it and, across two leaves,
    # some pair between the same two leaves passed: neither node nor the link is slow.
    g = max(len(group_names), 1)
    passed = _last_pass(rounds, measured & ~low & (stage == "re-pair"), a, b, n)
    link_ok = _link_passes(a, b, group, g, measured & ~low)
    cleared = rest & (passed[a] > rounds) & (passed[b] > rounds) & link_ok
    status[rest & ~cleared] = "suspect"
    status[cleared] = "cleared"
    probe = _open_probes(a, b, group, g, rounds, measured & (stage == "re-pair"), loc)
    names = nodes.to_numpy(dtype=object)
    culprit = loc.culprit
    blamed = np.where(
        status == "node",
        np.where(culprit[a] & culprit[b], names[a] + ", " + names[b], np.where(culprit[a], names[a], names[b])),
        "",
    )

    level = np.where(~measured, "missing", np.where(failing, "fail", np.where(low, "warn", "pass")))
    table = planned[list(PAIR_COLUMNS)].copy()
    table["samples"] = samples
    table["value"] = v
    table["reference"] = ref
    table["reference_kind"] = ref_kind
    table["deviation_pct"] = d * 100
    table["z"] = z
    table["level"] = level.astype(str)
    table["status"] = status.astype(str)
    table["blamed"] = blamed.astype(str)
    table["probe"] = probe

    sus = status == "suspect"
    suspect_nodes = np.isin(np.arange(n), np.r_[a[sus], b[sus]]) & ~culprit
    ends_low = np.bincount(np.r_[a[low], b[low]], minlength=n)
    ends_meas = np.bincount(np.r_[a[measured], b[measured]], minlength=n)
    good = (ends_meas > 0) & (ends_low == 0) & ~culprit
    cleared_nodes = np.isin(np.arange(n), np.r_[a[cleared], b[cleared]])

    findings = _findings(table, a, b, group, names, np.asarray(group_names, dtype=object), loc, ends_meas, note, limits)
    return PairFindings(
        pairs=table,
        findings=findings,
        culprits=tuple(names[culprit].astype(str)),
        suspects=tuple(names[suspect_nodes].astype(str)),
        good=tuple(names[good].astype(str)),
        uplinks=tuple(
            (str(group_names[g // len(group_names)]), str(group_names[g % len(group_names)])) for g in loc.uplinks
        ),
        leaves=tuple(str(group_names[g]) for g in loc.leaves),
        cleared=tuple(names[cleared_nodes & ~culprit & ~suspect_nodes].astype(str)),
        reference_note=note,
        spread=float(spread),
    )


def repairs(found: PairFindings, plan: PairingPlan, *, seed: int = 0) -> PairingPlan:
    """The re-pairing round for ``found``'s suspects and probes, as a plan to append to ``plan``
    (``plan.extended(repairs(found, plan))``; ``plan`` is the one ``found`` was made on).

    Each suspect not yet re-paired meets one known-good partner (``found.good``) it has not met: for
    a slow pair across two leaves, a good node of the *other* suspect's leaf (so that link is measured
    again with fresh ends; these go first, since a node is re-paired once per round), for one within a
    leaf, a good node of that leaf; failing that, any good node outside its own leaf, then any good node.
    For a probe (a culprit's pair far below its others), the culprit's partner meets a good node of the
    culprit's leaf and two good nodes, one of each leaf, meet each other. Each node is in at most one pair
    of the round. The round is numbered after the plan's last; its notes name every pairing and whoever
    was left without a partner. Returns a plan without pairs when there is nothing to re-pair.
    """
    nodes = plan.nodes.index
    n = len(nodes)
    group_code, group_names = pd.factorize(plan.nodes["group"], sort=True)
    zone_code = pd.factorize(plan.nodes["zone"], sort=True)[0].astype(np.int64)
    group = group_code.astype(np.int64)
    table = found.pairs
    pa, pb = _codes(nodes, table["node"]), _codes(nodes, table["peer"])
    if (pa < 0).any() or (pb < 0).any() or len(table) != len(plan.pairs):
        raise InputError("these findings were not made on this plan: re-pair the plan they were made on")
    rounds = table["round"].to_numpy().astype(np.int64)
    culprit = nodes.isin(found.culprits)
    names = nodes.to_numpy(dtype=object)
    measured = table["level"].to_numpy() != "missing"
    stage = table["stage"].to_numpy()
    again = np.flatnonzero(measured & (stage == "re-pair"))
    passing = measured & (table["level"].to_numpy() == "pass")
    last = _last_pass(rounds, passing & (stage == "re-pair"), pa, pb, n)
    link_ok = _link_passes(pa, pb, group, max(len(group_names), 1), passing)

    def met_in(u: int, leaf: int) -> int:
        """How often ``u`` has been re-paired with a node of ``leaf``."""
        rows = again[(pa[again] == u) | (pb[again] == u)]
        return int(np.sum(group[np.where(pa[rows] == u, pb[rows], pa[rows])] == leaf))

    # The requests: (node or -1 for a probe, the leaf its partner should come from, the other leaf, why).
    status = table["status"].to_numpy()
    sus = np.flatnonzero(status == "suspect")
    sus = sus[np.lexsort((pa[sus], rounds[sus], group[pa[sus]] == group[pb[sus]]))]  # across leaves first
    requests: list[tuple[int, int, int, str]] = []
    for i in sus.tolist():
        for u, other in ((int(pa[i]), int(pb[i])), (int(pb[i]), int(pa[i]))):
            if culprit[u] or (last[u] > rounds[i] and link_ok[i]):
                continue  # a culprit, or it passed its re-pairing and only the other end is left
            across = group[other] != group[u]
            if across and met_in(u, int(group[other])) > met_in(u, int(group[u])):
                # Re-paired into that leaf already and still a suspect: a good node of its own leaf now
                # tells its own path from the link (and the next time, the other leaf again).
                across = False
                why = f"its own leaf, having met {group_names[group[other]]} again already"
            else:
                why = f"the leaf of its slow partner {names[other]}" if across else f"its own leaf, like {names[other]}"
            requests.append((u, int(group[other]) if across else int(group[u]), -1, why))
    for i in np.flatnonzero(table["probe"].to_numpy(dtype=bool)).tolist():
        x, y = (int(pa[i]), int(pb[i])) if culprit[pa[i]] else (int(pb[i]), int(pa[i]))
        why = f"the leaf of {names[x]}, whose pair with it is far below its others"
        requests.append((y, int(group[x]), -1, why))
        requests.append((-1, int(group[x]), int(group[y]), "a probe of the link between their leaves"))

    rng = np.random.default_rng(seed)
    pool = np.flatnonzero(nodes.isin(found.good) & ~nodes.isin(found.suspects))
    pool = pool[rng.permutation(len(pool))]
    used = np.isin(np.arange(n), [u for u, *_ in requests if u >= 0])
    ends_a, ends_b = np.r_[pa, pb], np.r_[pb, pa]
    sort = np.argsort(ends_a, kind="stable")
    ends_a, ends_b = ends_a[sort], ends_b[sort]

    def met(u: int) -> IntArray:
        return np.asarray(ends_b[np.searchsorted(ends_a, u) : np.searchsorted(ends_a, u, side="right")])

    def pick(target: int, avoid: int, *, exclude: IntArray, fallback: bool) -> int:
        free = pool[~used[pool] & ~np.isin(pool, exclude)]
        choice = free[group[free] == target]
        if not len(choice) and fallback:
            choice = free[group[free] != avoid] if avoid >= 0 else free
            if not len(choice):
                choice = free
        return int(choice[0]) if len(choice) else -1

    new_a: list[int] = []
    new_b: list[int] = []
    lines: list[str] = []
    missing: list[str] = []
    done: set[int] = set()
    for asked, target, other_leaf, reason in requests:
        u, why = asked, reason
        if u >= 0:
            if u in done:
                continue
            done.add(u)
            v = pick(target, int(group[u]) if target != group[u] else -1, exclude=np.r_[met(u), u], fallback=True)
            if v < 0:
                missing.append(str(names[u]))
                continue
            if group[v] != target:
                why = "no good node left there: " + ("another leaf" if group[v] != group[u] else "its own leaf")
        else:
            u = pick(target, -1, exclude=np.zeros(0, dtype=np.int64), fallback=False)
            if u < 0:
                missing.append(f"a probe of {group_names[target]} ↔ {group_names[other_leaf]}")
                continue
            used[u] = True
            v = pick(other_leaf, -1, exclude=np.r_[met(u), u], fallback=False)
            if v < 0:
                used[u] = False
                missing.append(f"a probe of {group_names[target]} ↔ {group_names[other_leaf]}")
                continue
        used[v] = True
        new_a.append(u)
        new_b.append(v)
        lines.append(f"{names[u]} with {names[v]} ({group_names[group[v]]}: {why})")
    a, b = np.asarray(new_a, dtype=np.int64), np.asarray(new_b, dtype=np.int64)
    rounds, stages = np.full(len(a), plan.rounds, dtype=np.int64), np.full(len(a), "re-pair", dtype=object)
    pairs = _pair_table(rounds, stages, a, b, names, group, zone_code, np.asarray(group_names, dtype=object))
    notes: list[str] = []
    if lines:
        shown = "; ".join(lines[:_SHOWN]) + (f"; and {len(lines) - _SHOWN} more" if len(lines) > _SHOWN else "")
        notes.append(
            f"round {plan.rounds} (re-pair): {len(lines)} pair{'s' if len(lines) != 1 else ''} with "
            f"known-good partners — {shown}"
        )
    if missing:
        notes.append(f"no known-good partner left for {', '.join(missing)}: they stay unresolved")
    idle = pd.DataFrame({"round": np.zeros(0, dtype=np.int64), "node": np.zeros(0, dtype=str)})
    return replace(plan, pairs=pairs, idle=idle, notes=tuple(notes), seed=seed)


def _last_pass(rounds: IntArray, rows: BoolArray, a: IntArray, b: IntArray, n: int) -> IntArray:
    """Per node, the last round of its ``rows`` (-1: none)."""
    last = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last, np.r_[a[rows], b[rows]], np.tile(rounds[rows], 2))
    return last


def _link_passes(a: IntArray, b: IntArray, group: IntArray, g: int, passing: BoolArray) -> BoolArray:
    """Per pair: within one leaf, or some passing pair crosses the same two leaves."""
    gp = _gp(a, b, group, g)
    across = group[a] != group[b]
    return np.asarray(~across | (np.bincount(gp[passing & across], minlength=g * g)[gp] > 0), dtype=bool)


def _open_probes(
    a: IntArray, b: IntArray, group: IntArray, g: int, rounds: IntArray, repaired: BoolArray, loc: _Located
) -> BoolArray:
    """The probes still open: a probe stands until two measured re-pairings without a culprit have crossed
    the same two leaves after it (enough, with the pair's other end, for the link's two disjoint pairs)."""
    probe = loc.probe.copy()
    gp = _gp(a, b, group, g)
    fresh = np.flatnonzero(repaired & ~(loc.culprit[a] | loc.culprit[b]) & (group[a] != group[b]))
    for i in np.flatnonzero(probe).tolist():  # probes are few: one per culprit behind a slow link at most
        probe[i] = int(np.sum((gp[fresh] == gp[i]) & (rounds[fresh] > rounds[i]))) < 2
    return probe


# --- input -----------------------------------------------------------------------------------------


def _validated(
    results: pd.DataFrame, plan: PairingPlan, source: str
) -> tuple[IntArray, IntArray, FloatArray, FloatArray]:
    """The pair samples of ``results`` as node codes, values and per-row references (NaN: none), or a
    ``ResultsError`` listing every problem (rows are 1-based positions in ``results``)."""
    missing = [c for c in ("node", "peer", "value") if c not in results.columns]
    if missing:
        raise ResultsError(source, [Problem("required column is missing", column=c) for c in missing])
    position = np.arange(len(results))
    frame = results
    if "metric" in results.columns:
        keep = (results["metric"].astype(object) == PAIR_METRIC).to_numpy(dtype=bool)
        frame, position = results[keep], position[keep]
    problems: list[Problem] = []
    total = 0

    def report(bad: BoolArray, column: str, message: Any) -> None:
        nonlocal total
        rows = np.flatnonzero(bad)
        total += len(rows)
        for i in rows[: max(0, _SHOWN - len(problems))]:
            problems.append(Problem(message(i), row=int(position[i]) + 1, column=column))

    index = plan.nodes.index
    codes = {}
    for column in ("node", "peer"):
        raw = frame[column]
        empty = raw.isna().to_numpy() | (raw.astype(str).str.strip() == "").to_numpy()
        text = raw.astype(str).to_numpy(dtype=object)
        code = _codes(index, text)
        report(empty, column, lambda i, c=column: f"{c} is empty")
        report(~empty & (code < 0), column, lambda i, t=text, c=column: f"{c} {t[i]!r} is not in the pairing plan")
        codes[column] = code
    a, b = codes["node"], codes["peer"]
    known = (a >= 0) & (b >= 0)
    report(known & (a == b), "peer", lambda i: "a node paired with itself")
    n = len(index)
    pk = np.unique(_pair_keys(index, plan.pairs["node"], plan.pairs["peer"]))
    key = np.minimum(a, b) * n + np.maximum(a, b)
    names = index.to_numpy(dtype=object)
    report(
        known & (a != b) & ~np.isin(key, pk),
        "peer",
        lambda i: f"the pair ({names[a[i]]}, {names[b[i]]}) is not in the pairing plan",
    )
    value = _numbers(frame["value"], "value", report, positive=False)
    ref = (
        _numbers(frame["reference"], "reference", report, positive=True, allow_empty=True)
        if "reference" in frame.columns
        else np.full(len(frame), np.nan)
    )
    if "repeat" in frame.columns:
        rep = pd.to_numeric(frame["repeat"], errors="coerce").to_numpy(dtype=float)
        report(
            ~np.isfinite(rep) | (rep < 0) | (rep != np.round(rep)),
            "repeat",
            lambda i: "repeat must be a whole number from 0",
        )
    subset = [c for c in ("run_id", "node", "peer", "repeat") if c in frame.columns]
    dup = frame.duplicated(subset=subset, keep="first").to_numpy(dtype=bool)
    report(
        dup,
        "repeat" if "repeat" in subset else "peer",
        lambda i: "a repeated sample: the same " + ", ".join(subset) + " as an earlier row",
    )
    if total:
        raise ResultsError(source, problems, total=total)
    return a, b, value, ref


def _numbers(column: pd.Series, name: str, report: Any, *, positive: bool, allow_empty: bool = False) -> FloatArray:
    numeric = pd.to_numeric(column, errors="coerce").to_numpy(dtype=float)
    absent = column.isna().to_numpy()
    if not allow_empty:
        report(absent, name, lambda i: f"{name} is empty")
    report(~absent & np.isnan(numeric), name, lambda i: f"{name} {column.iloc[i]!r} is not a number")
    report(np.isinf(numeric), name, lambda i: f"{name} {numeric[i]} is not finite")
    bad = (numeric <= 0) if positive else (numeric < 0)
    report(bad, name, lambda i: f"{name} {numeric[i]:g} must be {'above 0' if positive else 'at least 0'}")
    return numeric


# --- reference and spread ---------------------------------------------------------------------------


def _reference(
    v: FloatArray,
    measured: BoolArray,
    ref_col: FloatArray,
    reference: float | None,
    reference_kind: str | None,
    limits: PairThresholds,
) -> tuple[FloatArray, npt.NDArray[np.object_], str]:
    """Each pair's reference, its kind (the contract's word) and a sentence saying where it came from."""
    ref = ref_col.copy()
    kind = np.where(np.isfinite(ref_col), reference_kind or "own", "").astype(object)
    parts: list[str] = []
    given = int((np.isfinite(ref_col) & measured).sum())
    if given:
        parts.append(f"the pair's own reference for {given} pair{'s' if given != 1 else ''}")
    todo = ~np.isfinite(ref)
    if todo.any() and reference is not None:
        ref[todo] = reference
        kind[todo] = reference_kind or "model"
        parts.append(f"the model's reference {reference:.1f} GB/s")
    elif todo.any():
        values = v[measured]
        if len(values):
            first = float(np.median(values))
            healthy = values[values >= first * (1 - limits.warn_drop_pct / 100)]
            fleet = float(np.median(healthy))
            parts.append(f"the fleet median of {len(healthy)} healthy pairs in this run ({fleet:.1f} GB/s)")
        else:
            fleet = float("nan")
            parts.append("none (no pair measured)")
        ref[todo] = fleet
        kind[todo] = "peer"
    return ref, kind, ", else ".join(parts) if parts else "none"


def _spread(d: FloatArray, limits: PairThresholds) -> float:
    if len(d) < limits.min_pairs_for_spread:
        return max(limits.default_spread, limits.min_spread)
    mad = float(np.median(np.abs(d - np.median(d))))
    return max(1.4826 * mad, limits.min_spread)


# --- localisation ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Located:
    by_uplink: BoolArray
    by_leaf: BoolArray
    by_node: BoolArray
    probe: BoolArray  # per pair: explained by a culprit, but well below its other pairs (the link, too?)
    culprit: BoolArray  # per node
    uplinks: IntArray  # group-pair keys lo·G + hi
    leaves: IntArray  # group codes


def _localise(
    a: IntArray,
    b: IntArray,
    v: FloatArray,
    group: IntArray,
    unlabelled: BoolArray,
    low: BoolArray,
    measured: BoolArray,
    n: int,
    n_groups: int,
    spread: float,
    limits: PairThresholds,
) -> _Located:
    """Steps 1-3 of the module docstring. Links and culprits depend on each other (a culprit's pairs are
    no evidence about a link; a link's pairs no evidence about a node), so both are recomputed from the
    other's last answer until neither changes. A link's level is the median of its clean low pairs."""
    g = max(n_groups, 1)
    gp = _gp(a, b, group, g)
    gate = _second_cause_gate(spread, limits)
    culprit = np.zeros(n, dtype=bool)
    link = np.zeros(g * g, dtype=bool)
    by_uplink = np.zeros(len(a), dtype=bool)
    for _ in range(8):  # two or three passes settle every fleet seen; the cap only bounds a pathology
        clean, new_link = _links(a, b, group, unlabelled, low, measured, culprit, n, g, limits)
        named = clean & new_link[gp]
        level = np.full(g * g, np.nan)
        if named.any():
            per = pd.Series(v[named]).groupby(gp[named]).median()
            level[per.index.to_numpy()] = per.to_numpy()
        with np.errstate(invalid="ignore"):
            by_uplink = low & new_link[gp] & (group[a] != group[b]) & (v / level[gp] - 1 > -gate)
        by_uplink |= named
        new_culprit = _culprits(a, b, low & ~by_uplink, n)
        settled = np.array_equal(new_culprit, culprit) and np.array_equal(new_link, link)
        culprit, link = new_culprit, new_link
        if settled:
            break

    measured_nodes = np.bincount(group[np.unique(np.r_[a[measured], b[measured]])], minlength=g)
    bad = np.bincount(group[culprit], minlength=g)
    leaf = (bad >= limits.leaf_min_nodes) & (bad >= limits.leaf_share * measured_nodes) & ~unlabelled[:g]
    ga, gb = group[a], group[b]
    by_leaf = low & ~by_uplink & (leaf[ga] | leaf[gb])
    if by_leaf.any():
        culprit = _culprits(a, b, low & ~by_uplink & ~by_leaf, n)
    by_node = low & ~by_uplink & ~by_leaf & (culprit[a] | culprit[b])
    # A low pair between two leaves whose link is named, with no culprit at either end, is the link's too
    # (one end had another low pair, so it was no witness, but nothing else explains this one).
    by_uplink |= low & ~by_node & ~by_leaf & link[gp] & (ga != gb)
    probe = _deeper(a, b, v, low, by_node & (ga != gb) & (culprit[a] != culprit[b]), culprit, spread, limits)
    return _Located(
        by_uplink=by_uplink,
        by_leaf=by_leaf,
        by_node=by_node,
        probe=probe & ~link[gp],
        culprit=culprit,
        uplinks=np.flatnonzero(link).astype(np.int64),
        leaves=np.flatnonzero(leaf).astype(np.int64),
    )


def _second_cause_gate(spread: float, limits: PairThresholds) -> float:
    """How far below another pair of the same cause a pair must be to show a second cause: the warn drop,
    or ``z`` spreads of the difference of two pairs (√2 of one), whichever is more."""
    return float(max(limits.warn_drop_pct / 100, limits.z * spread * np.sqrt(2)))


def _gp(a: IntArray, b: IntArray, group: IntArray, g: int) -> IntArray:
    """Each pair's pair of leaves, as ``lo·G + hi``."""
    ga, gb = group[a], group[b]
    return np.asarray(np.minimum(ga, gb) * g + np.maximum(ga, gb), dtype=np.int64)


def _links(
    a: IntArray,
    b: IntArray,
    group: IntArray,
    unlabelled: BoolArray,
    low: BoolArray,
    measured: BoolArray,
    culprit: BoolArray,
    n: int,
    g: int,
    limits: PairThresholds,
) -> tuple[BoolArray, BoolArray]:
    """Step 1 of the module docstring: the *clean* low pairs (across two labelled leaves, both ends witnesses)
    and, per pair of leaves, whether its link is named. "No single node is in them" means, in a bipartite set,
    two disjoint ones."""
    ga, gb = group[a], group[b]
    ends = np.r_[a, b]
    partner = np.r_[b, a]
    pgroup = np.r_[gb, ga]
    against = np.tile(low, 2) & ~culprit[partner]  # a low pair the end cannot blame on its partner
    meas = np.tile(measured, 2)
    to = ends * g + pgroup
    against_all = np.bincount(ends[against], minlength=n)
    meas_all = np.bincount(ends[meas], minlength=n)
    against_to = _count_at(to[against], to)
    meas_to = _count_at(to[meas], to)
    witness = ~culprit[ends] & (meas_all[ends] - meas_to > 0) & (against_all[ends] - against_to == 0)
    m = len(a)
    inter = measured & (ga != gb) & ~unlabelled[ga] & ~unlabelled[gb]
    clean = inter & low & witness[:m] & witness[m:]
    gp = _gp(a, b, group, g)
    n_clean = np.bincount(gp[clean], minlength=g * g)
    n_pass = np.bincount(gp[inter & ~low], minlength=g * g)
    # The most clean low pairs of one leaf pair that share one node: all of them means a star.
    node_keys, per_node = np.unique(np.r_[gp[clean] * n + a[clean], gp[clean] * n + b[clean]], return_counts=True)
    star = np.zeros(g * g, dtype=np.int64)
    np.maximum.at(star, node_keys // n, per_node)
    share = n_clean / np.maximum(n_clean + n_pass, 1)
    link = (n_clean >= 2) & (star < n_clean) & (share >= limits.uplink_share)
    return clean, link


def _count_at(pool: IntArray, keys: IntArray) -> IntArray:
    """How often each of ``keys`` occurs in ``pool``."""
    values, counts = np.unique(pool, return_counts=True)
    if not len(values):
        return np.zeros(len(keys), dtype=np.int64)
    at = np.minimum(np.searchsorted(values, keys), len(values) - 1)
    return np.where(values[at] == keys, counts[at], 0).astype(np.int64)


def _culprits(a: IntArray, b: IntArray, low: BoolArray, n: int) -> BoolArray:
    """Step 2 of the module docstring: the culprits, counting only pairs no culprit already explains, repeated
    until nothing changes."""
    culprit = np.zeros(n, dtype=bool)
    for _ in range(8):  # each pass only removes evidence; two or three settle any fleet seen
        rest = low & ~(culprit[a] | culprit[b])
        ra, rb = a[rest], b[rest]
        count = np.bincount(np.r_[ra, rb], minlength=n)
        candidate = count >= 2
        ends, partners = np.r_[ra, rb], np.r_[rb, ra]
        clean = np.bincount(ends[~candidate[partners]], minlength=n)
        new = candidate & (clean >= 2) & ~culprit
        if not new.any():
            break
        culprit |= new
    return np.asarray(culprit, dtype=bool)


def _deeper(
    a: IntArray,
    b: IntArray,
    v: FloatArray,
    low: BoolArray,
    pick: BoolArray,
    culprit: BoolArray,
    spread: float,
    limits: PairThresholds,
) -> BoolArray:
    """The picked pairs (across leaves, one culprit end) well below the culprit's best other low pair: a
    bad NIC drags every pair to about the same level, so a pair much lower than that has a second cause —
    likely the link between the two leaves, to be probed with known-good nodes."""
    out = np.zeros(len(a), dtype=bool)
    idx = np.flatnonzero(pick)
    if not len(idx):
        return out
    owner = np.where(culprit[a[idx]], a[idx], b[idx])
    # Every culprit's low pairs, to find each picked pair's best *other* one.
    theirs = np.flatnonzero(low & (culprit[a] | culprit[b]))
    ends = np.r_[a[theirs], b[theirs]]
    vals = np.r_[v[theirs], v[theirs]]
    keep = culprit[ends]
    ends, vals = ends[keep], vals[keep]
    best = np.full(len(culprit), -np.inf)
    np.maximum.at(best, ends, vals)
    is_best = vals == best[ends]
    second = np.full(len(culprit), -np.inf)
    np.maximum.at(second, ends[~is_best], vals[~is_best])
    # Ties at the best value: the other one is as good as the best.
    ties = np.bincount(ends[is_best], minlength=len(culprit)) > 1
    second = np.where(ties, best, second)
    other = np.where(v[idx] >= best[owner], second[owner], best[owner])
    gate = _second_cause_gate(spread, limits)
    out[idx] = np.isfinite(other) & (v[idx] / other - 1 <= -gate)
    return out


# --- findings ----------------------------------------------------------------------------------------


def _findings(
    table: pd.DataFrame,
    a: IntArray,
    b: IntArray,
    group: IntArray,
    names: npt.NDArray[np.object_],
    group_names: npt.NDArray[np.object_],
    loc: _Located,
    ends_meas: IntArray,
    note: str,
    limits: PairThresholds,
) -> pd.DataFrame:
    """The findings, with their evidence text (few rows: only what is named, suspect or cleared)."""
    rows: list[dict[str, Any]] = []
    status = table["status"].to_numpy()
    level = table["level"].to_numpy()
    value = table["value"].to_numpy(dtype=float)
    ref = table["reference"].to_numpy(dtype=float)
    dev = table["deviation_pct"].to_numpy(dtype=float)
    z = table["z"].to_numpy(dtype=float)
    rkind = table["reference_kind"].to_numpy(dtype=object)
    rounds = table["round"].to_numpy()
    kind = table["kind"].to_numpy()

    def result(i: int) -> str:
        return f"{value[i]:.1f} GB/s = {value[i] / ref[i] * 100:.1f} % of {ref[i]:.1f}"

    def partner(i: int, me: int) -> str:
        other = b[i] if a[i] == me else a[i]
        mark = " low" if level[i] in ("warn", "fail") else ""
        return f"{names[other]} ({group_names[group[other]]}, {kind[i]}, round {rounds[i]}){mark}: {result(i)}"

    def base(**fields: Any) -> dict[str, Any]:
        row = dict.fromkeys(FINDING_COLUMNS, "")
        row.update(layer="network", cause="network", metric=PAIR_METRIC)
        row.update(fields)
        return row

    def stats(idx: IntArray) -> dict[str, Any]:
        medians = {c: float(np.median(x[idx])) for c, x in zip(_NUMBERS, (value, ref, dev, z), strict=True)}
        return {**medians, "reference_kind": str(rkind[idx[0]]), "partners": len(idx)}

    measured = level != "missing"
    # Only the pairs of culprits are read one by one, through an index of each node's pairs.
    ends = np.r_[a, b]
    pair_of = np.r_[np.arange(len(a)), np.arange(len(a))]
    sort = np.argsort(ends, kind="stable")
    ends, pair_of = ends[sort], pair_of[sort]

    def pairs_of(u: int) -> IntArray:
        idx = pair_of[np.searchsorted(ends, u) : np.searchsorted(ends, u, side="right")]
        return np.asarray(idx[measured[idx]], dtype=np.int64)

    for u in np.flatnonzero(loc.culprit).tolist():
        idx = pairs_of(int(u))
        mine = idx[status[idx] == "node"]  # u is a culprit, so each of its pairs explained by a node is its own
        fails = int((level[mine] == "fail").sum())
        evidence = "; ".join(partner(int(i), int(u)) for i in idx)
        rows.append(
            base(
                scope="node",
                status="culprit",
                verdict="fail" if fails >= 2 else "warn",
                node=str(names[u]),
                location=str(group_names[group[u]]),
                component="nic",
                # At warn level (its pairs low, but fewer than two at the fail drop) it is re-tested first
                # (docs/design/certify-runbook.md, "Confirm"); two failing pairs are the confirmation a fail needs.
                action="check_cable" if fails >= 2 else "retest",
                ticket="remediation" if fails >= 2 else "none",
                reasons=(
                    f"{names[u]} is low with {len(mine)} of its {len(idx)} partners — {evidence}. Reference: "
                    f"{note}. {NIC_ADVICE}"
                ),
                **stats(mine),
            )
        )
    g = max(len(group_names), 1)
    gp = np.minimum(group[a], group[b]) * g + np.maximum(group[a], group[b])
    for key in loc.uplinks:
        lo, hi = int(key) // g, int(key) % g
        between = np.flatnonzero(measured & (gp == key) & (group[a] != group[b]))
        low_here = between[status[between] == "uplink"]
        evidence = "; ".join(f"{names[a[i]]} – {names[b[i]]} (round {rounds[i]}): {result(int(i))}" for i in low_here)
        failing = float(np.median(dev[low_here])) <= -limits.fail_drop_pct
        rows.append(
            base(
                scope="fleet",
                status="uplink",
                verdict="fail" if failing else "warn",
                location=f"{group_names[lo]} ↔ {group_names[hi]}",
                component="uplink",
                action="check_switch_port",
                ticket="remediation" if failing else "none",
                reasons=(
                    f"the link between leaves {group_names[lo]} and {group_names[hi]}: {len(low_here)} of the "
                    f"{len(between)} pairs measured between them are low — {evidence}. Each side has nodes "
                    f"that pass with partners elsewhere, so no node is blamed. Reference: {note}. Check the "
                    "two leaves' uplinks and the spine ports between them (port errors, rate, ECMP)"
                ),
                **stats(low_here),
            )
        )
    for leaf in loc.leaves:
        members = np.flatnonzero(group == leaf)
        involved = np.flatnonzero((status == "leaf") & ((group[a] == leaf) | (group[b] == leaf)))
        low_nodes = np.unique(np.r_[a[involved], b[involved]])
        low_nodes = low_nodes[group[low_nodes] == leaf]
        rows.append(
            base(
                scope="fleet",
                status="leaf",
                verdict="fail",
                location=str(group_names[leaf]),
                component="leaf",
                action="check_switch_port",
                ticket="remediation",
                reasons=(
                    f"leaf {group_names[leaf]}: {len(low_nodes)} of its {int((ends_meas[members] > 0).sum())} "
                    f"measured nodes are low with partners in and out of the leaf ({len(involved)} low pairs, "
                    f"median {float(np.median(dev[involved])):.1f} %): its switch or its uplinks, not the "
                    f"nodes. Reference: {note}"
                ),
                **stats(involved),
            )
        )
    for i in np.flatnonzero((status == "suspect") | (status == "cleared")).tolist():
        u, w = int(a[i]), int(b[i])
        others = [
            f"{names[x]} with " + (", ".join(partner(int(j), x) for j in pairs_of(x) if j != i) or "no other partner")
            for x in (u, w)
        ]
        if status[i] == "suspect":
            fields = {
                "status": "suspect",
                "verdict": "warn",
                "action": "retest",
                "reasons": (
                    f"{names[u]} – {names[w]} ({kind[i]}, round {rounds[i]}) is low: {result(int(i))}, with no "
                    f"pattern ({'; '.join(others)}). Re-pair both with known-good partners before blaming either"
                ),
            }
        else:
            fields = {
                "status": "cleared",
                "verdict": "pass",
                "action": "none",
                "reasons": (
                    f"{names[u]} – {names[w]} ({kind[i]}, round {rounds[i]}) was low: {result(int(i))}; both "
                    f"passed when re-paired ({'; '.join(others)}): a transient, nobody is blamed"
                ),
            }
        rows.append(
            base(
                scope="pair",
                node=str(names[u]),
                peer=str(names[w]),
                location=f"{names[u]} – {names[w]}",
                component="pair",
                ticket="none",
                **fields,
                **stats(np.asarray([i])),
            )
        )
    probe = table["probe"].to_numpy(dtype=bool)
    for i in np.flatnonzero(probe).tolist():
        x, y = (int(a[i]), int(b[i])) if loc.culprit[a[i]] else (int(b[i]), int(a[i]))
        best = [partner(int(j), x) for j in pairs_of(x) if j != i and level[j] in ("warn", "fail")]
        rows.append(
            base(
                scope="pair",
                status="probe",
                verdict="warn",
                node=str(names[x]),
                peer=str(names[y]),
                location=f"{group_names[group[x]]} ↔ {group_names[group[y]]}",
                component="uplink",
                action="retest",
                ticket="none",
                reasons=(
                    f"{names[x]} – {names[y]} ({kind[i]}, round {rounds[i]}): {result(i)}, far below {names[x]}'s "
                    f"other low pairs ({'; '.join(best)}): its NIC explains part of it, the link between "
                    f"{group_names[group[x]]} and {group_names[group[y]]} may explain the rest. Re-pair "
                    f"{names[y]} with a known-good node of {group_names[group[x]]} and measure two known-good "
                    "nodes of the two leaves"
                ),
                **stats(np.asarray([i])),
            )
        )
    planned_ends = np.bincount(np.r_[a, b], minlength=len(names))
    for u in np.flatnonzero((planned_ends > 0) & (ends_meas == 0)).tolist():
        rows.append(
            base(
                scope="node",
                status="unmeasured",
                verdict="inconclusive",
                node=str(names[u]),
                location=str(group_names[group[u]]),
                component="nic",
                action="retest",
                ticket="none",
                partners=0,
                reasons="none of this node's planned pairs has a result: its pair Jobs did not run or wrote nothing",
                **dict.fromkeys(_NUMBERS, np.nan),
            )
        )
    frame = pd.DataFrame(rows, columns=list(FINDING_COLUMNS))
    for column in _NUMBERS:
        frame[column] = pd.to_numeric(frame[column]).astype(float)
    frame["partners"] = pd.to_numeric(frame["partners"]).astype(np.int64)
    return frame
