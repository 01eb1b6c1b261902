"""The report's links: the run's two-node all-reduce pairs against their references, by the pairing plan.

:func:`link_view` draws the plan's facts (rounds, pairs planned, measured and missing); a partner × node
matrix (nodes on both axes by leaf then name, each measured pair one cell below the diagonal coloured by
``value / reference − 1`` on the heat map's scale, outlined where it or a node's network path did not pass,
a named uplink's or leaf's block outlined too); and a table per leaf (pairs within and across, their median
relative bandwidth, the fleet findings on it, the nodes named). Everything over the pairs is vectorised:
Python loops run only over what is drawn. The template writes every string, escaped by its autoescape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pandas as pd

from .._text import counted
from ..network import PAIR_METRIC, PairingPlan
from ._charts import _NAME_CHARS, HEAT_BINS, NO_VALUE_FILL, VERDICT_COLOURS, _fills, _short
from ._common import VERDICT_ORDER, entity_kinds

__all__ = [
    "AxisLabel",
    "Block",
    "LeafFinding",
    "LeafMark",
    "LeafRow",
    "LinkMatrix",
    "LinkView",
    "MatrixCell",
    "Segment",
    "link_view",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
ObjectArray = npt.NDArray[np.object_]

_PASS = VERDICT_ORDER["pass"]
_NONE = 9  # no verdict
_VERDICT_OF = {code: v for v, code in VERDICT_ORDER.items()}
_MATRIX_PX = 760.0  # the matrix's side at most, before labels
_MAX_CELL, _MIN_CELL = 14.0, 6.0
_LEAF_CHARS = 24
_NAMED_SHOWN = 6
_TITLE_CHARS = 240  # a reason quoted in a cell's title


@dataclass(frozen=True)
class MatrixCell:
    """A pair's cell (or a node's, on the diagonal): its corner, fill, outline (empty: none) and title."""

    x: float
    y: float
    fill: str
    outline: str
    verdict: str
    title: str


@dataclass(frozen=True)
class AxisLabel:
    y: float
    text: str
    title: str
    colour: str


@dataclass(frozen=True)
class Segment:
    x1: float
    y1: float
    x2: float
    y2: float


@dataclass(frozen=True)
class LeafMark:
    """A leaf's name, written right of its block on the diagonal (the empty upper triangle)."""

    x: float
    y: float
    text: str
    title: str


@dataclass(frozen=True)
class Block:
    """The outline of a named uplink's block (the rows of one leaf × the columns of the other) or leaf's."""

    x: float
    y: float
    width: float
    height: float
    colour: str
    title: str


@dataclass(frozen=True)
class LinkMatrix:
    width: int
    height: int
    cell: float
    left: float
    top: float
    font_px: float
    rows: list[AxisLabel]
    diagonal: list[MatrixCell]
    cells: list[MatrixCell]
    missing: list[MatrixCell]
    boundaries: list[Segment]
    leaves: list[LeafMark]
    blocks: list[Block]
    n_nodes: int
    n_drawn: int
    n_pairs_drawn: int
    note: str


@dataclass(frozen=True)
class LeafFinding:
    verdict: str
    colour: str
    text: str


@dataclass(frozen=True)
class LeafRow:
    """One leaf (the plan's group): its nodes, pairs measured within and across, their median relative
    bandwidth in percent (None without a pair), the fleet findings on it or its uplinks, the nodes named."""

    leaf: str
    verdict: str
    nodes: int
    intra: int
    inter: int
    intra_rel: float | None
    inter_rel: float | None
    findings: list[LeafFinding]
    named: list[str]
    named_more: int


@dataclass(frozen=True)
class LinkView:
    """What the report's "Links" section draws (:func:`link_view`)."""

    facts: list[str]
    missing: int
    matrix: LinkMatrix
    leaves: list[LeafRow]
    legend: list[tuple[str, str]]  # (fill, text)
    outlines: list[tuple[str, str]]  # (colour, verdict)


# --- the data ---------------------------------------------------------------------------------------


def _text(frame: pd.DataFrame, column: str) -> ObjectArray:
    """A column as str, ``""`` where it is NA or the frame lacks it."""
    if column not in frame.columns:
        return np.full(len(frame), "", dtype=object)
    values = frame[column].astype(object)
    return np.asarray(values.where(values.notna(), "").astype(str).to_numpy(dtype=object), dtype=object)


def _numbers(frame: pd.DataFrame, column: str) -> FloatArray:
    if column not in frame.columns:
        return np.full(len(frame), np.nan)
    return np.asarray(pd.to_numeric(frame[column], errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan))


def _severity(verdict: ObjectArray) -> IntArray:
    return np.asarray(
        pd.Series(verdict, dtype=object).map(VERDICT_ORDER).fillna(VERDICT_ORDER["inconclusive"]), dtype=np.int64
    )


def _pair_results(results: pd.DataFrame) -> pd.DataFrame:
    if "peer" not in results.columns or "metric" not in results.columns:
        return results.iloc[:0]
    keep = (results["metric"].astype(object) == PAIR_METRIC).to_numpy(dtype=bool)
    rows = results[keep]
    pair_rows: pd.DataFrame = rows[_text(rows, "peer") != ""]
    return pair_rows


def _signed(value: float) -> str:
    """``+0.4 %`` / ``−48 %`` (a typographic minus; whole percents from 10 % on)."""
    return f"{value:+.{1 if abs(value) < 10 else 0}f}".replace("-", "−") + " %"


def _clip(text: str, limit: int = _TITLE_CHARS) -> str:
    """``text`` within ``limit`` characters: its start and its end (where a finding's reasons conclude)."""
    if len(text) <= limit:
        return text
    tail = limit // 3
    return text[: limit - tail - 3] + " … " + text[-tail:]


def _gbps(value: float) -> str:
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def link_view(
    results: pd.DataFrame, verdicts: pd.DataFrame, plan: PairingPlan | None, *, max_nodes: int = 120
) -> LinkView | None:
    """The "Links" section of the run's report, or None when there is nothing to draw (no plan, or neither a
    pair result nor a pair verdict row). ``plan`` is the plan the run measured its pairs by
    (``gpucert.certify.stored_plan_of``); above ``max_nodes`` nodes the matrix draws those that did not pass
    or have a low pair (worst first), then their partners, then a sample of other pairs' nodes. Raises
    ``ValueError`` for ``max_nodes`` below 2."""
    if max_nodes < 2:
        raise ValueError(f"max_nodes {max_nodes}: must be at least 2")
    if plan is None or plan.pairs.empty:
        return None
    pair_rows = _pair_results(results)
    kinds = entity_kinds(verdicts)
    is_pair_verdict = kinds == "pair"
    if "metric" in verdicts.columns:
        is_pair_verdict &= _text(verdicts, "metric") == PAIR_METRIC
    if pair_rows.empty and not is_pair_verdict.any():
        return None

    # The nodes, ordered by leaf then name, and the plan's pairs as codes into that order.
    node_names = plan.nodes.index.astype(str).to_numpy(dtype=object)
    node_groups = plan.nodes["group"].astype(str).to_numpy(dtype=object)
    order = np.lexsort((node_names, node_groups))
    names = node_names[order]
    groups = node_groups[order]
    index = pd.Index(names)
    n = len(names)
    group_names, group = np.unique(groups, return_inverse=True)
    group = np.asarray(group, dtype=np.int64)

    planned = plan.pairs
    pa = np.asarray(index.get_indexer(planned["node"].astype(str).to_numpy()), dtype=np.int64)
    pb = np.asarray(index.get_indexer(planned["peer"].astype(str).to_numpy()), dtype=np.int64)
    known = (pa >= 0) & (pb >= 0) & (pa != pb)
    planned = planned[known].reset_index(drop=True)
    lo, hi = np.minimum(pa[known], pb[known]), np.maximum(pa[known], pb[known])
    key = lo * n + hi
    first = ~pd.Index(key).duplicated()
    planned, lo, hi, key = planned[first].reset_index(drop=True), lo[first], hi[first], key[first]
    rounds = planned["round"].to_numpy(dtype=np.int64)
    kind = planned["kind"].astype(str).to_numpy(dtype=object)

    # Measured: the median of the pair's results (both orientations, every repeat) ...
    ra = np.asarray(index.get_indexer(pair_rows["node"].astype(str).to_numpy()), dtype=np.int64)
    rb = np.asarray(index.get_indexer(_text(pair_rows, "peer")), dtype=np.int64)
    rkey = np.where((ra >= 0) & (rb >= 0), np.minimum(ra, rb) * n + np.maximum(ra, rb), -1)
    medians = pd.Series(_numbers(pair_rows, "value")).groupby(rkey).median()
    outside = len(np.setdiff1d(rkey[rkey >= 0], key)) > 0 or bool((rkey < 0).any())
    value: FloatArray = np.asarray(medians.reindex(key).to_numpy(dtype=np.float64, na_value=np.nan))
    # ... and the verdict the judgement gave it (its value, reference and reasons), the worst per pair.
    pv = verdicts[is_pair_verdict]
    va = np.asarray(index.get_indexer(_text(pv, "node")), dtype=np.int64)
    vb = np.asarray(index.get_indexer(_text(pv, "peer")), dtype=np.int64)
    by_pair = (
        pd.DataFrame(
            {
                "key": np.where((va >= 0) & (vb >= 0), np.minimum(va, vb) * n + np.maximum(va, vb), -1),
                "sev": _severity(_text(pv, "verdict")),
                "value": _numbers(pv, "value"),
                "reference": _numbers(pv, "reference"),
                "reasons": _text(pv, "reasons"),
            }
        )
        .sort_values("sev", kind="stable")
        .drop_duplicates("key")
        .set_index("key")
        .reindex(key)
    )
    pair_sev = by_pair["sev"].fillna(_NONE).to_numpy(dtype=np.int64)
    v_value = by_pair["value"].to_numpy(dtype=np.float64)
    value = np.asarray(np.where(np.isfinite(v_value), v_value, value), dtype=np.float64)
    measured = np.isfinite(value)
    pair_sev = np.where(measured & (pair_sev == _NONE), _PASS, pair_sev)
    reasons = by_pair["reasons"].fillna("").to_numpy(dtype=object)
    reference = by_pair["reference"].to_numpy(dtype=np.float64)
    own_ref = np.isfinite(reference) & (reference > 0)
    run_median = float(np.median(value[measured])) if measured.any() else np.nan
    reference = np.where(own_ref, reference, run_median)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = (value / reference - 1.0) * 100.0

    # Per node: its network verdict (its own row on the pair metric, and the pairs it is in), its worst
    # verdict of any row, and whether a finding explains one of its low pairs.
    node_rows = kinds == "node"
    if "metric" in verdicts.columns:
        node_rows &= _text(verdicts, "metric") == PAIR_METRIC
    net_sev = np.full(n, _NONE, dtype=np.int64)
    nr = np.asarray(index.get_indexer(_text(verdicts[node_rows], "node")), dtype=np.int64)
    np.minimum.at(net_sev, nr[nr >= 0], _severity(_text(verdicts[node_rows], "verdict"))[nr >= 0])
    any_sev = np.full(n, _NONE, dtype=np.int64)
    vr = np.asarray(index.get_indexer(_text(verdicts, "node")), dtype=np.int64)
    np.minimum.at(any_sev, vr[vr >= 0], _severity(_text(verdicts, "verdict"))[vr >= 0])
    flagged_pair = pair_sev < _PASS
    for ends in (lo, hi):
        np.minimum.at(any_sev, ends[flagged_pair], pair_sev[flagged_pair])
    explained = measured & (pair_sev == _PASS) & (reasons != "")
    noted = np.zeros(n, dtype=bool)
    noted[lo[explained]] = noted[hi[explained]] = True
    worst_rel = np.full(n, np.inf)
    rel_or_inf = np.where(np.isfinite(rel), rel, np.inf)
    np.minimum.at(worst_rel, lo, rel_or_inf)
    np.minimum.at(worst_rel, hi, rel_or_inf)
    cell_sev = np.minimum(pair_sev, np.minimum(net_sev[lo], net_sev[hi]))

    fleet = _fleet_findings(verdicts, kinds, group_names)
    shown, note = _shown(n, lo, hi, measured, any_sev, net_sev, noted, worst_rel, max_nodes)
    matrix = _matrix(
        names=names,
        groups=groups,
        group=group,
        group_names=group_names,
        shown=shown,
        note=note,
        lo=lo,
        hi=hi,
        measured=measured,
        value=value,
        rel=rel,
        own_ref=own_ref,
        rounds=rounds,
        kind=kind,
        pair_sev=pair_sev,
        cell_sev=cell_sev,
        net_sev=net_sev,
        reasons=reasons,
        fleet=fleet,
    )
    leaves = _leaf_rows(names, group, group_names, lo, hi, measured, rel, net_sev, flagged_pair, fleet)

    stage = planned["stage"].astype(str).to_numpy()
    n_rounds = len(np.unique(rounds))
    repair_rounds = len(np.unique(rounds[stage == "re-pair"]))
    makeup_rounds = len(np.unique(rounds[stage == "makeup"]))
    n_measured = int(measured.sum())
    facts = [
        f"{counted(n, 'node')} in {counted(len(group_names), 'leaf group')}",
        f"{n_rounds:,} round{'s' if n_rounds != 1 else ''}: {n_rounds - repair_rounds - makeup_rounds:,} "
        f"planned, {makeup_rounds:,} makeup, {repair_rounds:,} re-pairing",
        f"{counted(len(key), 'pair')} planned: {n_measured:,} measured, {len(key) - n_measured:,} missing",
    ]
    by_kind = pd.Series(kind[measured]).value_counts()
    if len(by_kind):
        facts.append("measured: " + ", ".join(f"{int(c):,} {k}" for k, c in by_kind.items()))
    if (~own_ref & measured).any():
        facts.append(
            f"{int((~own_ref & measured).sum()):,} measured pairs have no reference of their own and are "
            f"compared with the run's median pair ({_gbps(run_median)} GB/s)"
        )
    if outside:
        facts.append("some pair results name pairs the plan does not have: they are not drawn")
    return LinkView(
        facts=facts,
        missing=len(key) - n_measured,
        matrix=matrix,
        leaves=leaves,
        legend=[(fill, text) for _, fill, text in HEAT_BINS] + [(NO_VALUE_FILL, "no reference")],
        outlines=[(VERDICT_COLOURS[v], v) for v in ("fail", "warn", "inconclusive")],
    )


# --- the fleet findings -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Fleet:
    """The fleet rows on the pair metric and the leaves each names (codes into the group names)."""

    verdict: list[str]
    reasons: list[str]
    leaves: list[tuple[int, ...]]


def _fleet_findings(verdicts: pd.DataFrame, kinds: ObjectArray, group_names: ObjectArray) -> _Fleet:
    """The leaves each fleet finding on the pair metric names, read from its reasons: ``leaf A: …`` for a
    leaf, ``the link between leaves A and B: …`` for an uplink (gpucert.network's wording). The longest
    group name that fits wins, so ``leaf-1`` never matches ``leaf-10``'s finding."""
    rows = kinds == "fleet"
    if "metric" in verdicts.columns:
        rows &= _text(verdicts, "metric") == PAIR_METRIC
    part = verdicts[rows]
    # The layer the verdict names first (``network: …``) is not part of the finding's own words.
    reasons = pd.Series(_text(part, "reasons"), dtype=object).astype(str).str.removeprefix("network: ")
    verdict = _text(part, "verdict")
    by_length = sorted(range(len(group_names)), key=lambda g: -len(str(group_names[g])))
    leaf_of = np.full(len(part), -1, dtype=np.int64)
    first_of = np.full(len(part), -1, dtype=np.int64)
    uplink = reasons.str.startswith("the link between leaves ").to_numpy(dtype=bool)
    rest = reasons.str.slice(len("the link between leaves ")).where(uplink, "")
    for g in by_length:  # over the few leaves, vectorised over the findings
        name = str(group_names[g])
        hit = reasons.str.startswith(f"leaf {name}: ").to_numpy(dtype=bool) & (leaf_of < 0) & ~uplink
        leaf_of[hit] = g
        hit = uplink & rest.str.startswith(f"{name} and ").to_numpy(dtype=bool) & (first_of < 0)
        first_of[hit] = g
    second_of = np.full(len(part), -1, dtype=np.int64)
    tail = pd.Series(
        [r[len(str(group_names[f])) + 5 :] if f >= 0 else "" for r, f in zip(rest, first_of, strict=True)], dtype=object
    ).astype(str)
    for g in by_length:
        hit = (first_of >= 0) & tail.str.startswith(f"{group_names[g]}: ").to_numpy(dtype=bool) & (second_of < 0)
        second_of[hit] = g
    leaves: list[tuple[int, ...]] = [
        (int(lf),) if lf >= 0 else ((int(a), int(b)) if a >= 0 and b >= 0 else ())
        for lf, a, b in zip(leaf_of, first_of, second_of, strict=True)
    ]
    return _Fleet(verdict=[str(v) for v in verdict], reasons=[str(r) for r in reasons], leaves=leaves)


# --- which nodes are drawn ----------------------------------------------------------------------------


def _shown(
    n: int,
    lo: IntArray,
    hi: IntArray,
    measured: npt.NDArray[np.bool_],
    any_sev: IntArray,
    net_sev: IntArray,
    noted: npt.NDArray[np.bool_],
    worst_rel: FloatArray,
    max_nodes: int,
) -> tuple[IntArray, str]:
    """The codes of the nodes drawn, and a sentence saying which."""
    if n <= max_nodes:
        return np.arange(n, dtype=np.int64), f"All {counted(n, 'node')} of the plan {'is' if n == 1 else 'are'} drawn."
    interesting = np.flatnonzero((any_sev < _PASS) | noted)
    interesting = interesting[
        np.lexsort((interesting, worst_rel[interesting], any_sev[interesting], net_sev[interesting]))
    ]
    core = interesting[:max_nodes]
    chosen = np.zeros(n, dtype=bool)
    chosen[core] = True
    # Their partners, those meeting the most of them first.
    touching = chosen[lo] ^ chosen[hi]
    other = np.where(chosen[lo[touching]], hi[touching], lo[touching])
    counts = np.bincount(other, minlength=n)
    partners = np.flatnonzero(counts)
    partners = partners[np.lexsort((partners, -counts[partners]))][: max_nodes - len(core)]
    chosen[partners] = True
    # Room left: both ends of other measured pairs, evenly spaced through the plan.
    room = max_nodes - int(chosen.sum())
    n_sample = 0
    if room >= 2:
        rest = np.flatnonzero(measured & ~chosen[lo] & ~chosen[hi])
        if len(rest):
            take = rest[np.unique(np.linspace(0, len(rest) - 1, min(room // 2, len(rest))).round().astype(np.int64))]
            ends = pd.unique(np.column_stack([lo[take], hi[take]]).ravel())[:room]
            chosen[ends] = True
            n_sample = len(ends)
    shown = np.flatnonzero(chosen).astype(np.int64)
    parts = []
    if len(interesting):
        worst = " (the worst of them)" if len(core) < len(interesting) else ""
        parts.append(
            f"{len(core):,}{worst} of the {len(interesting):,} nodes with a verdict other than pass or a low pair"
        )
        if len(partners):
            parts.append(f"{len(partners):,} of their partners")
    if n_sample:
        parts.append(f"{n_sample:,} nodes of other pairs, evenly spaced through the plan")
    note = (
        f"{len(shown):,} of {n:,} nodes are drawn: " + ", ".join(parts) + f"; {n - len(shown):,} nodes are left "
        "out. The per-leaf table counts every pair."
    )
    return shown, note


# --- the matrix -------------------------------------------------------------------------------------


def _matrix(
    *,
    names: ObjectArray,
    groups: ObjectArray,
    group: IntArray,
    group_names: ObjectArray,
    shown: IntArray,
    note: str,
    lo: IntArray,
    hi: IntArray,
    measured: npt.NDArray[np.bool_],
    value: FloatArray,
    rel: FloatArray,
    own_ref: npt.NDArray[np.bool_],
    rounds: IntArray,
    kind: ObjectArray,
    pair_sev: IntArray,
    cell_sev: IntArray,
    net_sev: IntArray,
    reasons: ObjectArray,
    fleet: _Fleet,
) -> LinkMatrix:
    n = len(names)
    m = len(shown)
    pos = np.full(n, -1, dtype=np.int64)
    pos[shown] = np.arange(m)  # shown is sorted by code, and codes are in (leaf, name) order
    cell = float(np.clip(np.floor(_MATRIX_PX / max(m, 1)), _MIN_CELL, _MAX_CELL))
    font = round(min(10.5, cell - 1.0), 1)
    longest = max((min(_NAME_CHARS, len(str(names[c]))) for c in shown), default=4)
    left = round(8.0 + 0.62 * font * longest, 1)
    top = 6.0
    longest_leaf = max((min(_LEAF_CHARS, len(str(g))) for g in group_names), default=4)
    width = int(left + m * cell + 10 + 6.2 * longest_leaf)
    height = int(top + m * cell + 6)

    def at(p: int) -> float:
        return round(p * cell, 1)

    # The shown pairs: one cell below the diagonal, row the later node, column the earlier one.
    drawn = np.flatnonzero((pos[lo] >= 0) & (pos[hi] >= 0))
    fills = _fills(np.where(measured[drawn], rel[drawn], np.nan))
    cells: list[MatrixCell] = []
    missing: list[MatrixCell] = []
    for k, i in enumerate(drawn.tolist()):
        a, b = int(lo[i]), int(hi[i])
        row, col = int(pos[hi[i]]), int(pos[lo[i]])
        where = f"(round {int(rounds[i])}, {kind[i]})"
        x, y = left + at(col), top + at(row)
        if not measured[i]:
            missing.append(
                MatrixCell(
                    x=x,
                    y=y,
                    fill="none",
                    outline="",
                    verdict="missing",
                    title=f"{names[a]} – {names[b]}: no result {where}",
                )
            )
            continue
        title = f"{names[a]} – {names[b]}: {_gbps(float(value[i]))} GB/s"
        if np.isfinite(rel[i]):
            title += f", {_signed(float(rel[i]))} of {'reference' if own_ref[i] else 'the run median'}"
        title += f" {where}"
        if pair_sev[i] < _PASS:
            title += f" — {_VERDICT_OF[int(pair_sev[i])]}"
        for end in (a, b):
            if net_sev[end] < _PASS:
                title += f"; {names[end]}: {_VERDICT_OF[int(net_sev[end])]} (its network path)"
        if reasons[i] and pair_sev[i] >= _PASS:
            title += f"; {_clip(str(reasons[i]))}"
        sev = int(cell_sev[i])
        verdict = _VERDICT_OF.get(sev, "pass")
        cells.append(
            MatrixCell(
                x=x,
                y=y,
                fill=str(fills[k]),
                outline=VERDICT_COLOURS[verdict] if sev < _PASS else "",
                verdict=verdict,
                title=title,
            )
        )

    rows: list[AxisLabel] = []
    diagonal: list[MatrixCell] = []
    for p, c in enumerate(shown.tolist()):
        name = str(names[c])
        sev = int(net_sev[c])
        verdict = _VERDICT_OF.get(sev, "pass")
        colour = VERDICT_COLOURS[verdict] if sev < _PASS else "#333"
        status = f"{verdict} (its network path)" if sev < _PASS else "no network finding"
        rows.append(
            AxisLabel(
                y=round(top + at(p) + cell * 0.78, 1),
                text=_short(name, _NAME_CHARS),
                title=f"{name} ({groups[c]}): {status}",
                colour=colour,
            )
        )
        diagonal.append(
            MatrixCell(
                x=left + at(p),
                y=top + at(p),
                fill="#fff",
                outline=colour if sev < _PASS else "",
                verdict=verdict,
                title=f"{name} ({groups[c]}): {status}; its column is its pairs below",
            )
        )

    # Leaves: where each starts and ends among the shown nodes, its boundary lines and its name.
    shown_group = group[shown]
    starts = np.flatnonzero(np.r_[True, shown_group[1:] != shown_group[:-1]]) if m else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], m].astype(np.int64)
    span = {int(shown_group[s]): (int(s), int(e)) for s, e in zip(starts, ends, strict=True)}
    boundaries = []
    marks = []
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        name = str(group_names[shown_group[s]])
        if s > 0:
            boundaries.append(Segment(left, top + at(s), left + at(s), top + at(s)))
            boundaries.append(Segment(left + at(s), top + at(s), left + at(s), top + at(m)))
        marks.append(
            LeafMark(
                x=left + at(e) + 4,
                y=round(top + at(s) + min(cell, 10.0) * 0.9, 1),
                text=_short(name, _LEAF_CHARS),
                title=f"leaf {name}: {e - s:,} nodes drawn",
            )
        )
    blocks = []
    for verdict, text, leaves in zip(fleet.verdict, fleet.reasons, fleet.leaves, strict=True):
        colour = VERDICT_COLOURS.get(verdict, VERDICT_COLOURS["inconclusive"])
        if len(leaves) == 1 and leaves[0] in span:
            s, e = span[leaves[0]]
            blocks.append(Block(left + at(s), top + at(s), at(e - s), at(e - s), colour, f"{verdict}: {text}"))
        elif len(leaves) == 2 and leaves[0] in span and leaves[1] in span:
            (s1, e1), (s2, e2) = sorted((span[leaves[0]], span[leaves[1]]))
            blocks.append(Block(left + at(s1), top + at(s2), at(e1 - s1), at(e2 - s2), colour, f"{verdict}: {text}"))
    return LinkMatrix(
        width=width,
        height=height,
        cell=cell,
        left=left,
        top=top,
        font_px=font,
        rows=rows,
        diagonal=diagonal,
        cells=cells,
        missing=missing,
        boundaries=boundaries,
        leaves=marks,
        blocks=blocks,
        n_nodes=n,
        n_drawn=m,
        n_pairs_drawn=len(cells),
        note=note,
    )


# --- per leaf ---------------------------------------------------------------------------------------


def _leaf_rows(
    names: ObjectArray,
    group: IntArray,
    group_names: ObjectArray,
    lo: IntArray,
    hi: IntArray,
    measured: npt.NDArray[np.bool_],
    rel: FloatArray,
    net_sev: IntArray,
    flagged_pair: npt.NDArray[np.bool_],
    fleet: _Fleet,
) -> list[LeafRow]:
    g = len(group_names)
    ga, gb = group[lo], group[hi]
    intra = ga == gb
    nodes = np.bincount(group, minlength=g)
    n_intra = np.bincount(ga[measured & intra], minlength=g)
    cross = measured & ~intra
    n_inter = np.bincount(ga[cross], minlength=g) + np.bincount(gb[cross], minlength=g)
    ok = measured & np.isfinite(rel)
    intra_rel = pd.Series(rel[ok & intra]).groupby(ga[ok & intra]).median()
    across = ok & ~intra
    inter_rel = pd.Series(np.r_[rel[across], rel[across]]).groupby(np.r_[ga[across], gb[across]]).median()
    # The nodes named: a network verdict other than pass of their own, or an end of a pair that did not pass.
    named = net_sev < _PASS
    named[lo[flagged_pair]] = named[hi[flagged_pair]] = True
    named_codes = np.flatnonzero(named)
    named_by_group = pd.Series(names[named_codes]).groupby(group[named_codes]).agg(list)
    per_leaf: dict[int, list[LeafFinding]] = {}
    worst: dict[int, int] = {}
    for verdict, text, leaves in zip(fleet.verdict, fleet.reasons, fleet.leaves, strict=True):
        for leaf in leaves:
            per_leaf.setdefault(leaf, []).append(
                LeafFinding(verdict, VERDICT_COLOURS.get(verdict, VERDICT_COLOURS["inconclusive"]), text)
            )
            worst[leaf] = min(worst.get(leaf, _NONE), VERDICT_ORDER.get(verdict, VERDICT_ORDER["inconclusive"]))
    worst_named = np.full(g, _NONE, dtype=np.int64)
    np.minimum.at(worst_named, group, np.where(named, np.minimum(net_sev, VERDICT_ORDER["warn"]), _NONE))
    rows = []
    for k in range(g):
        listed = [str(x) for x in named_by_group.get(k, [])]
        sev = min(worst.get(k, _NONE), int(worst_named[k]))
        rows.append(
            LeafRow(
                leaf=str(group_names[k]),
                verdict=_VERDICT_OF.get(sev, "pass"),
                nodes=int(nodes[k]),
                intra=int(n_intra[k]),
                inter=int(n_inter[k]),
                intra_rel=round(float(intra_rel[k]), 1) if k in intra_rel.index else None,
                inter_rel=round(float(inter_rel[k]), 1) if k in inter_rel.index else None,
                findings=per_leaf.get(k, []),
                named=listed[:_NAMED_SHOWN],
                named_more=max(0, len(listed) - _NAMED_SHOWN),
            )
        )
    return rows
