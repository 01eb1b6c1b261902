"""The report's "Links" section: a night's node pairs by their pairing plan, drawn as a partner × node
matrix and a table per leaf (gpucert/report/_links.py), in the run's HTML page.

A night of the seeded 24-node fleet with a GPU fault, plus its two-node all-reduce pairs over three leaves
(one with a hostile label value): one node at half rate, one slow link between two leaves, a transient
slow pair the re-pairing round clears. The pairs are judged by gpucert.network, as certify does.
"""

from __future__ import annotations

import html as html_lib
import re
import time
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest

from gpucert.network import PAIR_METRIC, PairingPlan, link_verdicts, pair_findings, plan_rounds, repairs
from gpucert.report import link_view, render_html
from gpucert.report._charts import VERDICT_COLOURS
from gpucert_sim.fleet import Fault

from .conftest import Seeded

LEAF = "gpucert.io/leaf"
HOSTILE_LEAF = 'leaf"<1>'
LEAVES = (HOSTILE_LEAF, "leaf-b", "leaf-c")
SLOW_NODE = "gpu-node-00010"  # leaf-b, its NIC at half rate
SLOW_LINK = frozenset((HOSTILE_LEAF, "leaf-c"))
RUN = "night-1000"
SVG_NS = "{http://www.w3.org/2000/svg}"


def _measure(pairs: pd.DataFrame, leaf: dict[str, str], rng: np.random.Generator) -> pd.DataFrame:
    """Pair results as certify stores them: 3 repeats, the orientation alternating between repeats."""
    a, b = pairs["node"].to_numpy(dtype=object), pairs["peer"].to_numpy(dtype=object)
    nic = np.where((a == SLOW_NODE) | (b == SLOW_NODE), 0.5, 1.0)
    link = np.array([0.6 if frozenset((leaf[x], leaf[y])) == SLOW_LINK else 1.0 for x, y in zip(a, b, strict=True)])
    values = 370.0 * (nic * link)[:, None] * (1 + rng.standard_normal((len(a), 3)) * 0.03)
    repeat = np.tile(np.arange(3), len(a))
    flip = repeat % 2 == 1
    na, nb = np.repeat(a, 3), np.repeat(b, 3)
    return pd.DataFrame(
        {
            "run_id": RUN,
            "node": np.where(flip, nb, na),
            "gpu": pd.array([pd.NA] * len(na), dtype="Int64"),
            "metric": PAIR_METRIC,
            "value": values.ravel(),
            "repeat": repeat,
            "peer": np.where(flip, na, nb),
        }
    )


class Linked:
    def __init__(
        self,
        results: pd.DataFrame,
        verdicts: pd.DataFrame,
        plan: PairingPlan,
        measured: int,
        transient: tuple[str, str],
    ) -> None:
        self.results, self.verdicts, self.plan = results, verdicts, plan
        self.measured, self.transient = measured, transient


@pytest.fixture(scope="module")
def linked(seeded: Seeded) -> Linked:
    wave = seeded.night(faults=[Fault("pcie_gen4", "gpu-node-00003", gpu=2)])
    verdicts = seeded.judge(wave)
    names = list(seeded.fleet.node_names)
    leaf = {n: LEAVES[i // 8] for i, n in enumerate(names)}
    plan = plan_rounds(pd.DataFrame({"node": names, LEAF: [leaf[n] for n in names]}), leaf_label=LEAF, seed=1)
    rng = np.random.default_rng(1)
    pairs = _measure(plan.pairs, leaf, rng)
    # A transient: one pair of leaf-b slow the first time only; the re-pairing round clears it.
    intra = plan.pairs[(plan.pairs["node_group"] == "leaf-b") & (plan.pairs["kind"] == "intra-leaf")]
    pick = intra[(intra["node"] != SLOW_NODE) & (intra["peer"] != SLOW_NODE)].iloc[0]
    transient = (str(pick["node"]), str(pick["peer"]))
    pairs.loc[pairs["node"].isin(transient) & pairs["peer"].isin(transient), "value"] *= 0.7
    first = pair_findings(pairs, plan)
    assert first.pending
    plan = plan.extended(repairs(first, plan, seed=1))
    pairs = pd.concat([pairs, _measure(plan.round(plan.rounds - 1), leaf, rng)], ignore_index=True)
    judgement = pair_findings(pairs, plan)
    assert judgement.culprits == (SLOW_NODE,)
    assert judgement.uplinks == ((HOSTILE_LEAF, "leaf-c"),)
    assert not judgement.pending
    links = link_verdicts(judgement, run_id=RUN, models=dict.fromkeys(names, "NVIDIA H200"))
    results = pd.concat([wave.results.astype({"run_id": object}), pairs], ignore_index=True)
    measured = int((judgement.pairs["status"] != "missing").sum())
    return Linked(results, pd.concat([verdicts, links], ignore_index=True), plan, measured, transient)


@pytest.fixture(scope="module")
def page(linked: Linked, seeded: Seeded) -> str:
    return render_html(linked.results, linked.verdicts, run_id=RUN, baseline=seeded.baseline, links=linked.plan)


def _links_svg(page: str) -> ET.Element:
    [svg] = [ET.fromstring(m) for m in re.findall(r'<svg class="links".*?</svg>', page, flags=re.S)]
    return svg


def _label(text: ET.Element) -> str:
    """An SVG text's own words, after its <title>."""
    title = text.find(f"{SVG_NS}title")
    return (title.tail if title is not None else text.text) or ""


def _section(page: str) -> str:
    return page.split('<section id="links">')[1].split("</section>", maxsplit=1)[0]


def _leaf_rows(page: str) -> dict[str, str]:
    """The per-leaf table's rows, by the leaf's name (unescaped), as their escaped HTML."""
    body = _section(page).split('<table class="leaves">')[1]
    rows = re.findall(r"<tr>\s*<td><code>(.*?)</code>(.*?)</tr>", body, flags=re.S)
    return {html_lib.unescape(name): rest for name, rest in rows}


def test_the_links_section_has_the_plan_s_facts(page: str, linked: Linked) -> None:
    section = _section(page)
    assert "<h2>Links</h2>" in section
    assert "24 nodes in 3 leaf groups" in section
    assert "3 rounds: 2 planned, 0 makeup, 1 re-pairing" in section
    planned = len(linked.plan.pairs)
    assert f"{planned} pairs planned: {linked.measured} measured, {planned - linked.measured} missing" in section
    # The slow link is a fleet-level finding, told apart from a cohort's shift.
    fleet = page.split('<section id="fleet">')[1].split("</section>", maxsplit=1)[0]
    assert "A finding on <code>nccl_pair_busbw_gbps</code> flags no node" in fleet
    assert "(see Links)" in fleet
    assert "a whole cohort moved" not in fleet
    assert "The fleet-level finding above moves every GPU" not in page
    # The rest of the page is still there, the links section after the GPU map.
    assert page.index('<section id="heatmap">') < page.index('<section id="links">') < page.index('id="metrics"')


def test_the_matrix_has_one_cell_per_measured_pair_with_its_title(page: str, linked: Linked) -> None:
    svg = _links_svg(page)
    cells = [r for r in svg.iter(f"{SVG_NS}rect") if "pair" in (r.get("class") or "").split()]
    assert len(cells) == linked.measured
    titles = [r.findtext(f"{SVG_NS}title") or "" for r in cells]
    assert all(
        re.fullmatch(r".+ – .+: \d+ GB/s, [+−]\d+(\.\d)? % of reference \(round \d, [a-z-]+\).*", t) for t in titles
    ), titles
    assert len(set(titles)) == len(titles)
    # Each cell once, below the diagonal: a pair of nodes is one cell whichever way its results were stored.
    corners = {(r.get("x"), r.get("y")) for r in cells}
    assert len(corners) == len(cells)
    diagonal = [r for r in svg.iter(f"{SVG_NS}rect") if "self" in (r.get("class") or "").split()]
    assert len(diagonal) == 24
    # The row labels: every node, ordered by leaf then name.
    rows = [_label(t) for t in svg.iter(f"{SVG_NS}text") if t.get("class") == "row"]
    names = sorted(linked.plan.nodes.index, key=lambda n: (linked.plan.nodes.loc[n, "group"], n))
    assert rows == names
    # The leaves: named once each, two boundaries (each a horizontal and a vertical line) between three.
    leaves = [_label(t) for t in svg.iter(f"{SVG_NS}text") if t.get("class") == "leaf"]
    assert sorted(leaves) == sorted(LEAVES)
    assert len([x for x in svg.iter(f"{SVG_NS}line") if x.get("class") == "boundary"]) == 4
    assert "All 24 nodes of the plan are drawn." in page


def test_the_slow_node_s_cells_are_flagged_and_the_slow_link_is_framed(page: str, linked: Linked) -> None:
    svg = _links_svg(page)
    cells = [r for r in svg.iter(f"{SVG_NS}rect") if "pair" in (r.get("class") or "").split()]
    mine = [r for r in cells if SLOW_NODE in (r.findtext(f"{SVG_NS}title") or "")]
    assert len(mine) >= 2
    for cell in mine:
        assert "flagged" in (cell.get("class") or "").split()
        assert cell.get("stroke") == VERDICT_COLOURS["fail"]
        title = cell.findtext(f"{SVG_NS}title") or ""
        assert re.search(r"GB/s, −(4|5)\d % of reference", title), title
        assert f"{SLOW_NODE}: fail (its network path)" in title
    # Only the slow node's pairs are outlined: the slow link names no node, the transient was cleared.
    flagged = [r for r in cells if "flagged" in (r.get("class") or "").split()]
    assert flagged == mine
    transient = next(
        r for r in cells if (r.findtext(f"{SVG_NS}title") or "").startswith(" – ".join(sorted(linked.transient)))
    )
    assert "a transient" in (transient.findtext(f"{SVG_NS}title") or "")
    # The slow link's pairs are coloured as slow (25 %+ below), and its block framed in the finding's colour.
    explained = "low, explained by the link between their leaves"
    link = [r for r in cells if explained in (r.findtext(f"{SVG_NS}title") or "")]
    assert len(link) >= 2
    assert {r.get("fill") for r in link} == {"#8a1c12"}
    [block] = [r for r in svg.iter(f"{SVG_NS}rect") if r.get("class") == "block"]
    assert block.get("stroke") == VERDICT_COLOURS["fail"]
    finding = f"fail: the link between leaves {HOSTILE_LEAF} and leaf-c"
    assert (block.findtext(f"{SVG_NS}title") or "").startswith(finding)
    # The diagonal cell of the slow node is outlined too.
    own = [
        r
        for r in svg.iter(f"{SVG_NS}rect")
        if (r.get("class") or "").startswith("self") and (r.findtext(f"{SVG_NS}title") or "").startswith(SLOW_NODE)
    ]
    assert [r.get("stroke") for r in own] == [VERDICT_COLOURS["fail"]]


def test_the_per_leaf_table_names_the_slow_link_s_two_leaves_and_the_slow_node(page: str) -> None:
    rows = _leaf_rows(page)
    assert set(rows) == set(LEAVES)
    for leaf in (HOSTILE_LEAF, "leaf-c"):
        assert "the link between leaves leaf&#34;&lt;1&gt; and leaf-c" in rows[leaf]
        assert SLOW_NODE not in rows[leaf]
    assert "the link between leaves" not in rows["leaf-b"]
    assert f"<code>{SLOW_NODE}</code>" in rows["leaf-b"]
    # Counts and medians: 8 nodes each, pairs within and across, the slow link's leaves low across.
    for leaf, row in rows.items():
        numbers = re.findall(r'<td class="num">([^<]*)</td>', row)
        assert numbers[0] == "8", leaf
        assert int(numbers[1]) >= 4, leaf
        assert int(numbers[2]) >= 4, leaf
        across = float(numbers[4].replace(" %", ""))
        assert (across < -15) == (leaf != "leaf-b"), (leaf, numbers)


def test_the_hostile_leaf_label_is_escaped_and_the_svg_still_parses(page: str) -> None:
    assert HOSTILE_LEAF not in page
    assert "leaf&#34;&lt;1&gt;" in page
    svg = _links_svg(page)  # parses as XML
    marks = [t for t in svg.iter(f"{SVG_NS}text") if t.get("class") == "leaf"]
    assert HOSTILE_LEAF in [_label(t) for t in marks]
    titles = [r.findtext(f"{SVG_NS}title") or "" for r in svg.iter(f"{SVG_NS}text") if r.get("class") == "row"]
    assert any(f"({HOSTILE_LEAF})" in t for t in titles)
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\(|src=", page, flags=re.I)


def test_without_pairs_or_plan_the_page_is_unchanged(linked: Linked, seeded: Seeded) -> None:
    is_pair = (linked.results["metric"] == PAIR_METRIC).to_numpy()
    is_pair_verdict = (
        linked.verdicts["peer"].notna().to_numpy()
        | (linked.verdicts["metric"].astype(object) == PAIR_METRIC).to_numpy()
    )
    results, verdicts = linked.results[~is_pair], linked.verdicts[~is_pair_verdict]
    plain = render_html(results, verdicts, run_id=RUN, baseline=seeded.baseline)
    assert 'id="links"' not in plain
    assert render_html(results, verdicts, run_id=RUN, baseline=seeded.baseline, links=linked.plan) == plain
    assert link_view(results, verdicts, linked.plan) is None
    # Pairs without their plan: no section either (nothing to place them by).
    no_plan = render_html(linked.results, linked.verdicts, run_id=RUN, baseline=seeded.baseline)
    assert 'id="links"' not in no_plan
    assert "svg.links" not in no_plan
    assert link_view(linked.results, linked.verdicts, None) is None


def test_a_pair_without_results_is_counted_missing_and_drawn_dashed(linked: Linked) -> None:
    first = linked.plan.pairs.iloc[0]
    gone = linked.results["node"].isin([first["node"], first["peer"]]) & linked.results["peer"].isin(
        [first["node"], first["peer"]]
    )
    verdicts = linked.verdicts.copy()
    ends = verdicts["node"].isin([first["node"], first["peer"]]) & verdicts["peer"].isin([first["node"], first["peer"]])
    view = link_view(linked.results[~gone.to_numpy()], verdicts[~ends.to_numpy()], linked.plan)
    assert view is not None
    planned = len(linked.plan.pairs)
    assert view.missing == planned - linked.measured + 1
    assert f"{planned} pairs planned: {linked.measured - 1} measured, {view.missing} missing" in view.facts
    assert view.matrix.n_pairs_drawn == linked.measured - 1
    assert [c.title for c in view.matrix.missing] == [
        f"{min(first['node'], first['peer'])} – {max(first['node'], first['peer'])}: no result "
        f"(round {first['round']}, {first['kind']})"
    ]


def test_above_max_nodes_the_matrix_draws_the_flagged_nodes_and_their_partners(linked: Linked) -> None:
    pairs = linked.plan.pairs
    partners = set(pairs.loc[pairs["node"] == SLOW_NODE, "peer"]) | set(pairs.loc[pairs["peer"] == SLOW_NODE, "node"])
    # Flagged: the GPU-faulted node and the slow node (verdicts other than pass), the ends of the low pairs
    # a finding explains (the slow node's partners, the slow link's) and the transient's two nodes.
    low = {
        n
        for row in linked.verdicts.itertuples()
        if row.peer is not None and isinstance(row.peer, str) and row.reasons
        for n in (row.node, row.peer)
    }
    flagged = {"gpu-node-00003", SLOW_NODE} | low
    assert partners | set(linked.transient) <= flagged
    view = link_view(linked.results, linked.verdicts, linked.plan, max_nodes=10)
    assert view is not None
    m = view.matrix
    assert m.n_drawn == len(m.rows) == 10
    drawn = {r.text for r in m.rows}
    assert {SLOW_NODE, "gpu-node-00003"} | partners <= drawn <= flagged  # the worst first
    assert m.note == (
        f"10 of 24 nodes are drawn: 10 (the worst of them) of the {len(flagged)} nodes with a verdict other "
        "than pass or a low pair; 14 nodes are left out. The per-leaf table counts every pair."
    )
    # Every cell drawn is a pair of two drawn nodes; the per-leaf table still counts every pair.
    assert all(c.title.split(":")[0].split(" – ")[0] in drawn for c in m.cells)
    assert sum(r.intra for r in view.leaves) + sum(r.inter for r in view.leaves) // 2 == linked.measured
    # Room for more: every flagged node, then partners of theirs.
    wide = link_view(linked.results, linked.verdicts, linked.plan, max_nodes=len(flagged) + 2).matrix  # type: ignore[union-attr]
    assert {r.text for r in wide.rows} >= flagged
    assert wide.n_drawn == len(flagged) + 2
    assert f"{len(flagged)} of the {len(flagged)} nodes" in wide.note
    assert "2 of their partners" in wide.note
    with pytest.raises(ValueError, match="max_nodes"):
        link_view(linked.results, linked.verdicts, linked.plan, max_nodes=1)


def test_a_thousand_node_plan_draws_fast_and_bounded() -> None:
    names = [f"n-{i:05d}" for i in range(1000)]
    plan = plan_rounds(
        pd.DataFrame({"node": names, LEAF: [f"leaf-{i // 32:02d}" for i in range(1000)]}), leaf_label=LEAF, seed=3
    )
    leaf = dict(zip(names, [f"leaf-{i // 32:02d}" for i in range(1000)], strict=True))
    pairs = _measure(plan.pairs, leaf, np.random.default_rng(3))
    verdicts = link_verdicts(pair_findings(pairs, plan), run_id=RUN, models={})
    link_view(pairs, verdicts, plan)
    started = time.perf_counter()
    view = link_view(pairs, verdicts, plan)
    elapsed = time.perf_counter() - started
    assert view is not None
    assert elapsed < 1.0, f"link_view took {elapsed:.2f} s for 1,000 nodes"
    assert 60 < view.matrix.n_drawn <= 120
    assert len(view.leaves) == 32
    assert f"{len(plan.pairs):,} pairs planned" in view.facts[2]


def test_publish_report_takes_the_plan_as_links() -> None:
    import inspect

    from gpucert.tasks.report import publish_report

    parameter = inspect.signature(publish_report.fn).parameters["links"]
    assert parameter.default is None
    assert parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
