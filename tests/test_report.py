"""The certify run's reports: the verdict table rows, the markdown summary and the HTML page.

Built on a night of the seeded fleet with faults of different kinds injected, judged by the real engine.
"""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpucert._frames import empty_results
from gpucert.report import (
    ROW_KEYS,
    decision_table,
    is_summary_row,
    md_escape,
    render_html,
    summary_markdown,
    verdict_rows,
)
from gpucert.store import empty_baseline
from gpucert.verdict import judge
from gpucert_sim.fleet import Fault, Fleet

from .conftest import T0, Seeded

PCIE = ("gpu-node-00003", 2)
THERMAL = ("gpu-node-00005", 1)
POWER_CAP = "gpu-node-00007"
OFF_BUS = ("gpu-node-00011", 6)
HOSTILE = "<script>alert(1)</script>"
SVG_NS = "{http://www.w3.org/2000/svg}"


class Night:
    def __init__(self, results: pd.DataFrame, verdicts: pd.DataFrame, baseline: pd.DataFrame) -> None:
        self.results, self.verdicts, self.baseline = results, verdicts, baseline


@pytest.fixture(scope="module")
def night(seeded: Seeded) -> Night:
    wave = seeded.night(
        faults=[
            Fault("pcie_gen4", PCIE[0], gpu=PCIE[1]),
            Fault("hw_thermal", THERMAL[0], gpu=THERMAL[1], params={"duty": 0.4}),
            Fault("power_cap", POWER_CAP),
            Fault("fallen_off_bus", OFF_BUS[0], gpu=OFF_BUS[1]),
            Fault("sbe_storm", "gpu-node-00015", gpu=4),
        ]
    )
    return Night(wave.results, seeded.judge(wave), seeded.baseline)


@pytest.fixture(scope="module")
def html(night: Night) -> str:
    return render_html(night.results, night.verdicts, run_id="night-1000", baseline=night.baseline)


def svgs(page: str) -> list[ET.Element]:
    """Every inline SVG of the page, parsed as XML: the pictures must be well-formed on their own."""
    return [ET.fromstring(m) for m in re.findall(r"<svg\b.*?</svg>", page, flags=re.S)]


def rename_node(frame: pd.DataFrame, old: str, new: str) -> pd.DataFrame:
    out = frame.copy()
    out["node"] = out["node"].astype(object).replace({old: new})
    return out


# --- the table artifact -------------------------------------------------------------------------------


def test_rows_are_json_and_ordered_fail_warn_inconclusive(night: Night) -> None:
    rows = verdict_rows(night.verdicts)
    json.dumps(rows, allow_nan=False)  # the artifact's payload: plain JSON, no NaN
    assert all(tuple(r) == ROW_KEYS for r in rows)
    listed = [r for r in rows if not is_summary_row(r)]
    order = {"fail": 0, "warn": 1, "inconclusive": 2}
    ranks = [order[r["verdict"]] for r in listed]
    assert ranks == sorted(ranks)
    assert {"fail", "warn"} <= {r["verdict"] for r in listed}
    assert len(listed) == int((night.verdicts["verdict"] != "pass").sum())
    pcie = next(r for r in listed if (r["node"], r["gpu"]) == PCIE)
    assert (pcie["cause"], pcie["verdict"], pcie["action"]) == ("pcie", "fail", "reboot_node")
    assert isinstance(pcie["gpu"], int)
    # Passing rows are counted, not listed.
    summary = rows[-1]
    assert is_summary_row(summary)
    assert summary["verdict"] == "pass"
    n_pass = int((night.verdicts["verdict"] == "pass").sum())
    assert summary["reasons"].startswith(f"{n_pass:,} passing rows not listed")


def test_rows_limit_says_how_many_were_left_out(night: Night) -> None:
    rows = verdict_rows(night.verdicts, limit=3)
    assert len(rows) == 5
    assert not any(is_summary_row(r) for r in rows[:3])
    note = rows[3]
    assert is_summary_row(note)
    assert note["verdict"] is None
    n_bad = int((night.verdicts["verdict"] != "pass").sum())
    assert note["reasons"].startswith(f"{n_bad - 3:,} more rows that did not pass are not listed")
    with pytest.raises(ValueError, match="limit"):
        verdict_rows(night.verdicts, limit=-1)
    with pytest.raises(ValueError, match="verdict"):
        verdict_rows(night.verdicts.drop(columns="verdict"))
    assert verdict_rows(night.verdicts.iloc[:0]) == []


def _decisions(n: int, *, failed: int) -> pd.DataFrame:
    states = ["failed"] * failed + ["certified"] * (n - failed)
    return pd.DataFrame(
        {
            "run_id": "night",
            "node": [f"gpu-node-{i:05d}" for i in range(n)],
            "state": states,
            "verdict": ["fail" if s == "failed" else "pass" for s in states],
            "cause": [("pcie" if s == "failed" else None) for s in states],
            "taint": ["added" if s == "failed" else "none" for s in states],
            "confirmed": [s == "failed" for s in states],
            "runs": "night",
            "summary": ["fail: GPU 2: PCIe Gen4" if s == "failed" else "all checks passed" for s in states],
            "settled": True,
            "decided_at": pd.Timestamp(T0),
        }
    )


def test_the_decisions_artifact_lists_every_node_column_wise_while_it_fits() -> None:
    table, left_out = decision_table(_decisions(10_000, failed=3))
    assert left_out == 0
    assert list(table) == ["node", "state", "verdict", "cause", "taint", "confirmed", "summary"]
    assert len(table["node"]) == 10_000
    size = len(json.dumps(table, allow_nan=False))
    assert size < 1_000_000  # under Prefect's event limit (1.5 MB): the artifact's event carries it whole
    assert table["cause"][:4] == ["pcie", "pcie", "pcie", None]


def test_the_decisions_artifact_of_a_fleet_too_large_leaves_out_the_quiet_nodes_and_says_how_many() -> None:
    decisions = _decisions(500, failed=7)
    decisions.loc[10, "taint"] = "kept"  # certified again but its taint kept: listed
    table, left_out = decision_table(decisions, max_bytes=5_000)
    assert left_out == 500 - 8
    assert table["node"] == [f"gpu-node-{i:05d}" for i in (*range(7), 10)]


@pytest.mark.parametrize("seed", range(8))
def test_rows_property_random_tables(seed: int) -> None:
    """Any mix of verdicts: severity order holds, nothing is lost between listed and counted rows."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 200))
    limit = int(rng.integers(0, 60))
    verdict = rng.choice(["pass", "fail", "warn", "inconclusive"], size=n, p=[0.6, 0.15, 0.15, 0.1])
    frame = pd.DataFrame(
        {
            "run_id": "r",
            "node": [f"n{i % 17}" for i in range(n)],
            "gpu": pd.array(np.where(rng.random(n) < 0.2, -1, rng.integers(0, 8, n)), dtype="Int64"),
            "gpu_uuid": None,
            "verdict": verdict,
            "metric": [None if v == "pass" else "gemm_bf16_tflops" for v in verdict],
            "value": np.where(rng.random(n) < 0.1, np.nan, rng.random(n) * 700),
            "reference": np.nan,
            "deviation_pct": rng.normal(size=n),
            "z": np.inf,
            "reference_kind": np.where(verdict == "pass", "", "own"),
            "cause": "",
            "action": "retest",
            "ticket": "none",
            "reasons": "x",
        }
    )
    frame.loc[frame["gpu"] == -1, "gpu"] = pd.NA
    rows = verdict_rows(frame, limit=limit)
    json.dumps(rows, allow_nan=False)
    listed = [r for r in rows if not is_summary_row(r)]
    bad = int((verdict != "pass").sum())
    assert len(listed) == min(limit, bad)
    rank = {"fail": 0, "warn": 1, "inconclusive": 2}
    assert [rank[r["verdict"]] for r in listed] == sorted(rank[r["verdict"]] for r in listed)
    notes = [r for r in rows if is_summary_row(r)]
    assert len(notes) == int(bad > limit) + int(bad < n)
    if bad > limit:
        assert notes[0]["reasons"].startswith(f"{bad - limit:,} more")
    if bad < n:
        assert notes[-1]["reasons"].startswith(f"{n - bad:,} passing")


# --- the markdown summary -----------------------------------------------------------------------------


def test_summary_names_what_failed_why_and_what_to_do(night: Night) -> None:
    md = summary_markdown(
        night.verdicts,
        run_id="night-1000",
        report_link="s3://bucket/runs/date=2026-11-21/run=night-1000/report.html",
        actions_taken={PCIE[0]: "tainted gpucert.io/unhealthy=pcie:NoSchedule"},
    )
    assert md.startswith("# gpucert run night-1000\n")
    n_bad = int((night.verdicts["verdict"] != "pass").sum())
    assert f"**{n_bad} of {len(night.verdicts)} checks did not pass:**" in md
    assert "(s3://bucket/runs/date=2026-11-21/run=night-1000/report.html)" in md
    assert "### fail" in md
    assert "### warn" in md
    table = [line for line in md.splitlines() if line.startswith("| ")]
    # The PCIe GPU: its node, its index, the cause, the action and the reason a technician reads.
    pcie_row = next(line for line in table if line.startswith(f"| {PCIE[0]} | {PCIE[1]} |"))
    assert "| pcie |" in pcie_row
    assert md_escape("reboot_node") in pcie_row
    assert "PCIe link trained down to Gen4" in pcie_row
    thermal = next(line for line in table if line.startswith(f"| {THERMAL[0]} | {THERMAL[1]} |"))
    assert "| thermal |" in thermal
    assert md_escape("check_cooling") in thermal
    assert any(line.startswith(f"| {OFF_BUS[0]} | {OFF_BUS[1]} | xid |") for line in table)
    # What to do: the power-capped node's eight GPUs and its own row under one action.
    todo = md.split("## What to do")[1]
    assert f"{POWER_CAP} (GPUs 0–7, node)" in todo
    assert md_escape("fix_config") in todo
    assert "## Actions taken on nodes" in md
    assert f"| {PCIE[0]} | tainted gpucert.io/unhealthy=pcie:NoSchedule |" in md


def test_summary_escapes_table_breakers(night: Night) -> None:
    hostile = night.verdicts.copy()
    bad = hostile.index[(hostile["verdict"] == "fail").to_numpy()][0]
    hostile["node"] = hostile["node"].astype(object)
    hostile["reasons"] = hostile["reasons"].astype(object)
    hostile.loc[bad, "node"] = "evil|node\nsecond line"
    hostile.loc[bad, "reasons"] = "a | b\r\nc <img src=x> [link](javascript:x)"
    md = summary_markdown(hostile, run_id="night-1000", actions_taken={"n|1\n": "did | this\nand that"})
    table = [line for line in md.splitlines() if line.startswith("|") and "---" not in line]
    row = next(line for line in table if "evil" in line)
    assert len(re.split(r"(?<!\\)\|", row)) == 9  # seven cells: no escaped | splits one
    assert "evil\\|node second line" in row
    assert not re.search(r"(?<!\\)[<\[]", md.split("## What did not pass")[1])  # no raw HTML or link
    assert "\\<img src=x\\> \\[link\\](javascript:x)" in row
    assert "| n\\|1 | did \\| this and that |" in md


def test_summary_of_a_quiet_night(seeded: Seeded) -> None:
    verdicts = seeded.judge(seeded.night(seed=1001))
    quiet = verdicts[verdicts["reasons"].astype(str) == ""]  # a night without even a transient warn
    md = summary_markdown(quiet, run_id="night-1001")
    assert f"**All {len(quiet):,} checks passed.**" in md
    assert "## What to do" not in md
    assert "No verdicts" in summary_markdown(verdicts.iloc[:0], run_id="night-1001")


# --- the HTML page ------------------------------------------------------------------------------------


def test_html_has_the_pictures(html: str) -> None:
    pictures = svgs(html)
    strips = [s for s in pictures if s.get("class") == "strip"]
    heat = [s for s in pictures if s.get("class") == "heat"]
    assert len(strips) == 5  # GEMM, HBM, H2D, D2H, the node's NCCL all-reduce
    for metric in ("gemm_bf16_tflops", "hbm_copy_gbps", "h2d_gbps", "d2h_gbps", "nccl_allreduce_busbw_gbps"):
        assert f'id="chart-{metric}"' in html
    assert heat, "no heat map"
    for strip in strips:
        assert strip.findall(f".//{SVG_NS}rect"), "a strip chart without its histogram"
    # Stragglers: the PCIe GPU on the copy charts, the thermal one on GEMM, labelled node/gpu.
    h2d = html.split('id="chart-h2d_gbps"')[1].split("</figure>", maxsplit=1)[0]
    assert re.search(rf"{PCIE[0]}/{PCIE[1]} -(49|50)\.\d %", h2d)
    gemm = html.split('id="chart-gemm_bf16_tflops"')[1].split("</figure>", maxsplit=1)[0]
    assert re.search(rf"{THERMAL[0]}/{THERMAL[1]} -\d+\.\d %", gemm)
    assert f"{POWER_CAP}/0 " in gemm
    assert 'class="straggler fail"' in gemm
    # The heat map: the failed nodes drawn, a cell per GPU plus the node column, and its legend.
    cells = heat[0].findall(f".//{SVG_NS}g[@class='cell']")
    assert len(cells) >= 8
    titles = " ".join(c.findtext(f"{SVG_NS}title") or "" for c in cells)
    assert f"{PCIE[0]}/{PCIE[1]}: fail" in titles
    assert f"{OFF_BUS[0]}/{OFF_BUS[1]}: fail, no value" in titles
    assert "more than 25 % slower" in html
    assert "no value measured" in html
    assert "All 24 nodes are drawn" in html
    # The non-pass table, with reasons.
    assert "PCIe link trained down to Gen4" in html
    assert "its own baseline (held from its first passing runs)" in html


def test_html_is_self_contained(html: str) -> None:
    assert html.startswith("<!DOCTYPE html>")
    without_ns = html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert not re.search(r"https?://", without_ns)
    assert not re.search(r"<script|<link|<img|<iframe|@import|url\(|src=", html, flags=re.I)


def test_html_escapes_hostile_values(night: Night) -> None:
    node = PCIE[0]
    results = rename_node(night.results, node, HOSTILE)
    verdicts = rename_node(night.verdicts, node, HOSTILE)
    verdicts["reasons"] = verdicts["reasons"].astype(object)
    verdicts.loc[(verdicts["node"] == HOSTILE).to_numpy(), "reasons"] = 'say "hi" <b>&</b>'
    page = render_html(results, verdicts, run_id="night-1000", baseline=night.baseline, title="<i>t</i>")
    assert HOSTILE not in page
    assert "<script" not in page
    assert "<b>&" not in page
    assert "<i>t</i>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "say &#34;hi&#34; &lt;b&gt;&amp;&lt;/b&gt;" in page
    for svg in svgs(page):  # the escaped name inside SVG text and titles still parses
        assert svg is not None
    label = html_label(page, "h2d_gbps")
    assert "&lt;script&gt;alert(1)&lt;/scr" in label  # the straggler label, shortened, and escaped
    md = summary_markdown(verdicts, run_id="night-1000")
    assert HOSTILE not in md
    assert "\\<script\\>alert(1)\\</script\\>" in md


def html_label(page: str, metric: str) -> str:
    return page.split(f'id="chart-{metric}"')[1].split("</figure>", maxsplit=1)[0]


def test_html_from_tables_read_back_from_parquet(night: Night, tmp_path: Path) -> None:
    """The certify flow reads the tables back from the store: other dtypes, the same page."""
    night.verdicts.to_parquet(tmp_path / "verdicts.parquet")
    verdicts = pd.read_parquet(tmp_path / "verdicts.parquet")
    page = render_html(night.results, verdicts, run_id="night-1000", baseline=night.baseline)
    assert re.search(rf"{PCIE[0]}/{PCIE[1]} -(49|50)\.\d %", html_label(page, "h2d_gbps"))
    assert summary_markdown(verdicts, run_id="night-1000") == summary_markdown(night.verdicts, run_id="night-1000")
    assert verdict_rows(verdicts) == verdict_rows(night.verdicts)


def test_html_without_baseline_uses_the_run_median(night: Night) -> None:
    page = render_html(night.results, night.verdicts, run_id="night-1000")
    assert "No baseline was given to this report" in page
    assert "the median of its GPU model in this run (" in page
    assert re.search(rf"{PCIE[0]}/{PCIE[1]} -(49|50)\.\d %", html_label(page, "h2d_gbps"))


def test_html_of_other_runs_and_empty_tables(night: Night) -> None:
    other = night.results.assign(run_id="other-run")
    both = pd.concat([night.results.astype({"run_id": object}), other.astype({"run_id": object})])
    page = render_html(both, night.verdicts, run_id="night-1000", baseline=night.baseline)
    assert "All 24 nodes are drawn" in page
    empty = render_html(night.results.iloc[:0], night.verdicts.iloc[:0], run_id="night-1000")
    assert "No node was measured or judged" in empty
    assert "Every GPU, node and pair passed." in empty
    # A run where no node produced results: the verdicts still draw, every cell without a value.
    no_results = render_html(empty_results(), night.verdicts, run_id="night-1000")
    assert "All 24 nodes are drawn" in no_results
    assert f"{OFF_BUS[0]}/{OFF_BUS[1]}: fail, no value" in no_results
    with pytest.raises(ValueError, match="results table lacks"):
        render_html(night.results.drop(columns="value"), night.verdicts, run_id="night-1000")


def test_heat_map_caps_a_large_fleet() -> None:
    fleet = Fleet.generate(nodes=300, seed=5)
    faults = [Fault("pcie_gen4", fleet.node_names[i], gpu=i % 8) for i in range(0, 300, 20)]
    wave = fleet.run("night-7", ts=T0, seed=7, faults=faults)
    verdicts = judge(wave.results, empty_baseline())
    flagged_nodes = verdicts.loc[verdicts["verdict"] != "pass", "node"].astype(str).nunique()
    page = render_html(wave.results, verdicts, run_id="night-7", max_heatmap_nodes=40)
    rows = sum(len(s.findall(f"{SVG_NS}text[@class='row']")) for s in svgs(page) if s.get("class") == "heat")
    assert rows == 40
    assert f"40 of 300 nodes are drawn: all {flagged_nodes} with a verdict other than pass" in page
    few = render_html(wave.results, verdicts, run_id="night-7", max_heatmap_nodes=5)
    assert f"the 5 worst of the {flagged_nodes} nodes with a verdict other than pass" in few


@pytest.mark.slow
def test_render_a_thousand_nodes_fast() -> None:
    fleet = Fleet.generate(nodes=1000, seed=42)
    wave = fleet.run("night-1", ts=T0, seed=2, repeats=10, faults=[Fault("pcie_gen4", "gpu-node-00500", gpu=1)])
    verdicts = judge(wave.results, empty_baseline())
    assert len(wave.results) > 450_000
    render_html(wave.results, verdicts, run_id="night-1")  # compiles the template once
    started = time.perf_counter()
    page = render_html(wave.results, verdicts, run_id="night-1")
    elapsed = time.perf_counter() - started
    assert elapsed < 2.0, f"render_html took {elapsed:.2f} s for 1,000 nodes"
    assert len(page) < 2_000_000


# --- the drift view: each drifting GPU's own history ---------------------------------------------------


def _drifting_fleet() -> tuple[pd.DataFrame, pd.DataFrame]:
    """80 GPUs over 14 nights: GPU 0 loses 0.5 % of GEMM a night, GPU 1 drops 3 % from night 6."""
    from .test_drift import decline, step, synthetic

    return synthetic(80, 14, seed=21, factor={0: decline(-0.005), 1: step(-0.03, first=6)})


def test_drift_view_draws_each_alarmed_gpu_s_own_history() -> None:
    from gpucert.report import drift_view, render_drift_html
    from gpucert.telemetry import drift_alarms

    history, baseline = _drifting_fleet()
    alarms = drift_alarms(history, baseline)
    assert {"GPU-000000", "GPU-000001"} <= set(alarms["gpu_uuid"])
    view = drift_view(alarms, history, baseline)
    assert view.n_alarms == len(alarms)
    assert len(view.charts) == len(alarms)
    titles = [c.title for c in view.charts]
    assert "node-0000/1 · gemm_bf16_tflops" in titles
    stepped = view.charts[titles.index("node-0000/1 · gemm_bf16_tflops")]
    assert len(stepped.points) == 14  # every night's value
    assert [m.text for m in stepped.markers] == ["alarm"]  # raised on the first night of the step
    alarm_x = stepped.markers[0].x
    assert [p.x for p in stepped.points][5] == alarm_x
    reds = [p for p in stepped.points if p.colour == "#c62828"]
    assert len(reds) == 9  # in alarm from night 6 on
    assert min(p.x for p in reds) == alarm_x
    assert all(p.y > stepped.zero_y for p in reds)  # below its own baseline

    page = render_drift_html(alarms, history, baseline, title="drift <night>")
    assert page.startswith("<!DOCTYPE html>")
    assert "drift &lt;night&gt;" in page
    assert 'id="drift"' in page
    charts = [s for s in svgs(page) if s.get("class") == "drift"]
    assert len(charts) == len(alarms)
    circles = charts[0].findall(f"{SVG_NS}circle")
    assert len(circles) >= 14 + 1  # the nights, and the alarm's ring
    assert "% of its own baseline" in page
    assert not re.search(r"<script|<link|<img|@import|url\(|src=", page, flags=re.I)


def test_drift_view_in_the_certify_report_and_with_nothing_to_draw(night: Night) -> None:
    from gpucert.report import drift_view, render_drift_html
    from gpucert.telemetry import drift_alarms

    history, baseline = _drifting_fleet()
    alarms = drift_alarms(history, baseline)
    page = render_html(
        night.results,
        night.verdicts,
        run_id="night-1000",
        baseline=night.baseline,
        drift=drift_view(alarms, history, baseline, max_series=1),
    )
    assert "Drift on each GPU's own history" in page
    assert f"{len(alarms)} series in alarm on 1 node; the worst 1 are drawn." in page
    assert len([s for s in svgs(page) if s.get("class") == "drift"]) == 1
    assert 'id="drift"' not in render_html(night.results, night.verdicts, run_id="night-1000")
    quiet = render_drift_html(alarms.iloc[:0], history, baseline)
    assert "No GPU or node is drifting from its own baseline." in quiet


def test_drift_view_escapes_hostile_names() -> None:
    from gpucert.report import render_drift_html
    from gpucert.telemetry import drift_alarms

    history, baseline = _drifting_fleet()
    history["node"] = history["node"].cat.rename_categories({"node-0000": HOSTILE})
    alarms = drift_alarms(history, baseline)
    page = render_drift_html(alarms, history, baseline)
    assert HOSTILE not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;/1 · gemm_bf16_tflops" in page
    assert all(svg is not None for svg in svgs(page))
