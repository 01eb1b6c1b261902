"""Implausible values never seed a baseline (physical bounds, high outliers), and the next healthy run passes.

A value 1000× its peers, one near the float limit, inf, NaN or a negative bandwidth: a results *file*
holding one is refused with the row and the column (exit 2 on the command line); a frame handed to
:func:`gpucert.baseline.build_baseline` in memory merges nothing of that GPU's run. A value possible for
some GPU but beyond this model's spec peak, or far above its peers within the bounds, is left out of the
baselines and reported. No numpy RuntimeWarning reaches the user on any of these paths.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpucert.baseline import BuildReport, build_baseline, update_store
from gpucert.cli import main
from gpucert.errors import ResultsError
from gpucert.policy import default_policy
from gpucert.results import read_results, write_results
from gpucert.store import empty_baseline, open_store
from gpucert.verdict import judge
from gpucert_sim.fleet import Fleet

from .conftest import T0, row, unexpected

pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

POLICY = default_policy()
FLEET = Fleet.generate(nodes=12, seed=31)
NODE, GPU = FLEET.node_names[4], 3
UUID = str(FLEET.uuids[4 * FLEET.gpus_per_node + GPU])


def wave(i: int) -> pd.DataFrame:
    return FLEET.run(f"wave-{i}", ts=T0 + dt.timedelta(days=i), seed=310 + i).results


@dataclass(frozen=True)
class Poison:
    """One way to spoil one value of a healthy wave, and how a build must account for it."""

    metric: str
    spoil: Callable[[np.ndarray], np.ndarray]
    counted: str  # the BuildReport field that counts it
    node_level: bool = False
    all_repeats: bool = True


POISONS = {
    "1000x": Poison("gemm_bf16_tflops", lambda v: v * 1000, "implausible"),
    "1000x one repeat": Poison("hbm_copy_gbps", lambda v: v * 1000, "implausible", all_repeats=False),
    "float max": Poison("h2d_gbps", lambda v: np.full_like(v, np.finfo(np.float64).max), "implausible"),
    "inf": Poison("d2h_gbps", lambda v: np.full_like(v, np.inf), "implausible"),
    "nan": Poison("gemm_bf16_tflops", lambda v: np.full_like(v, np.nan), "implausible"),
    "negative": Poison("h2d_gbps", lambda v: -v, "implausible"),
    "10x, possible for no H200": Poison("gemm_bf16_tflops", lambda v: v * 10, "implausible"),
    "node NCCL 1000x": Poison("nccl_allreduce_busbw_gbps", lambda v: v * 1000, "implausible", node_level=True),
    "20 % over its peers": Poison("h2d_gbps", lambda v: v * 1.2, "outliers"),
    "node NCCL 60 % over its peers": Poison("nccl_allreduce_busbw_gbps", lambda v: v * 1.6, "outliers", True),
}


def spoiled(results: pd.DataFrame, poison: Poison, gpu: int = GPU) -> pd.DataFrame:
    out = results.copy()
    hit = (out["node"] == NODE) & (out["metric"] == poison.metric)
    hit &= out["gpu"].isna() if poison.node_level else (out["gpu"] == gpu)
    if not poison.all_repeats:
        hit &= out["repeat"] == 0
    assert hit.any()
    out.loc[hit, "value"] = poison.spoil(out.loc[hit, "value"].to_numpy(dtype=float))
    return out


def own_rows(table: pd.DataFrame, poison: Poison) -> pd.DataFrame:
    key = NODE if poison.node_level else UUID
    return table[table["key"] == key].sort_values("metric").reset_index(drop=True)


@pytest.fixture(scope="module")
def seeding() -> pd.DataFrame:
    """Two healthy waves: every own baseline still being seeded (n = 2 of 5), so one more run moves it."""
    table, _ = build_baseline(empty_baseline(), pd.concat([wave(0), wave(1)], ignore_index=True), policy=POLICY)
    return table


@pytest.mark.parametrize("name", sorted(POISONS))
def test_a_spoiled_value_never_moves_a_baseline_and_the_next_healthy_run_passes(
    seeding: pd.DataFrame, name: str
) -> None:
    poison = POISONS[name]
    table, report = build_baseline(seeding, spoiled(wave(2), poison), policy=POLICY)
    counted = getattr(report, poison.counted)
    assert counted == 1, report
    assert any(NODE in note and poison.metric in note for note in report.notes), report.notes
    before, after = own_rows(seeding, poison), own_rows(table, poison)
    if poison.counted == "implausible":
        # Nothing of that entity's run is merged: a broken measurement says its benchmark was broken.
        pd.testing.assert_frame_equal(after, before)
    else:
        # Only the outlying metric is left out; the entity's other metrics take the run.
        spoilt = after["metric"] == poison.metric
        pd.testing.assert_frame_equal(after[spoilt], before[before["metric"] == poison.metric])
        assert (after.loc[~spoilt, "n"] == 3).all()
    # The model references stay where the healthy fleet puts them.
    clean, _ = build_baseline(seeding, wave(2), policy=POLICY)
    models = table[table["level"] == "model"].set_index(["key", "metric"])["center"]
    expected = clean[clean["level"] == "model"].set_index(["key", "metric"])["center"]
    pd.testing.assert_series_equal(models, expected, rtol=0.005)
    # The next healthy run passes that GPU or node, and flags nothing else.
    verdicts = judge(wave(3), table, POLICY)
    entity = row(verdicts, NODE) if poison.node_level else row(verdicts, NODE, GPU)
    assert entity["verdict"] == "pass", entity["reasons"]
    assert unexpected(verdicts).empty, unexpected(verdicts)[["node", "gpu", "reasons"]]


def test_the_first_run_ever_cannot_seed_a_spoiled_value() -> None:
    """With no baseline yet, a poisoned first run would set the GPU's baseline from that one value."""
    poison = POISONS["1000x"]
    table, report = build_baseline(empty_baseline(), spoiled(wave(0), poison), policy=POLICY)
    assert report.implausible == 1
    assert table[table["key"] == UUID].empty
    verdicts = judge(wave(1), table, POLICY)
    assert row(verdicts, NODE, GPU)["verdict"] == "pass"
    assert unexpected(verdicts).empty


def test_an_unknown_model_is_guarded_by_its_peers(seeding: pd.DataFrame) -> None:
    """No spec peak is known for this model: 10× is possible for some GPU, so its peers decide."""
    renamed = spoiled(wave(2), POISONS["10x, possible for no H200"])
    renamed["gpu_model"] = renamed["gpu_model"].cat.rename_categories({"NVIDIA H200": "NVIDIA X900"})
    table, report = build_baseline(seeding, renamed, policy=POLICY)
    assert (report.implausible, report.outliers) == (0, 1), report
    assert own_rows(table, POISONS["10x, possible for no H200"]).query("metric == 'gemm_bf16_tflops'")[
        "n"
    ].tolist() == [2]


def test_a_results_file_with_a_spoiled_value_is_refused_naming_its_row(tmp_path: Path) -> None:
    results = wave(2)
    # Written as a healthy file, then one line spoiled the way a broken benchmark or a bad edit would.
    path = tmp_path / "wave-2.csv"
    write_results(results, path)
    lines = path.read_text().splitlines()
    victim = next(
        i
        for i, line in enumerate(lines)
        if f",{NODE},{GPU}," in line and ",gemm_bf16_tflops," in line and ",0,," in line
    )
    fields = lines[victim].split(",")
    fields[6] = repr(float(fields[6]) * 1000)
    lines[victim] = ",".join(fields)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ResultsError) as caught:
        read_results(path)
    problem = caught.value.problems[0]
    assert (problem.row, problem.column) == (victim + 1, "value")  # the header is line 1
    assert "physical range of 'gemm_bf16_tflops'" in str(caught.value)


def test_baseline_build_of_a_spoiled_file_exits_2_and_changes_nothing(
    tmp_path: Path, seeding: pd.DataFrame, capsys: pytest.CaptureFixture[str]
) -> None:
    store = open_store((tmp_path / "store").as_uri())
    before = update_store(store, pd.concat([wave(0), wave(1)], ignore_index=True), message="seed").version
    near_max = Poison("hbm_copy_gbps", lambda v: np.full_like(v, 1.7e308), "implausible", all_repeats=False)
    spoilt = spoiled(wave(2), near_max)
    path = tmp_path / "spoilt.parquet"
    # Written around the validator (as a foreign tool would): write_results refuses to write it.
    spoilt.to_parquet(path, index=False)
    assert main(["baseline", "build", str(path), "--store", store.uri]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert str(path) in err
    assert "column 'value'" in err
    assert "row " in err
    assert "Traceback" not in err
    assert store.current_version() == before
    pd.testing.assert_frame_equal(store.read(), seeding)


def test_a_build_reports_what_it_left_out() -> None:
    both = spoiled(spoiled(wave(2), POISONS["1000x"]), POISONS["20 % over its peers"], gpu=GPU + 1)
    _, report = build_baseline(empty_baseline(), both, policy=POLICY)
    assert isinstance(report, BuildReport)
    assert (report.implausible, report.outliers) == (1, 1)
    implausible, outlier = report.notes
    assert implausible.startswith(f"run wave-2, node {NODE} GPU {GPU}: gemm_bf16_tflops ")
    assert "outside its physical range for NVIDIA H200 (0 to 1071)" in implausible
    assert outlier.startswith(f"run wave-2, node {NODE} GPU {GPU + 1}: h2d_gbps ")
    assert "above the median of its 96 peers" in outlier
