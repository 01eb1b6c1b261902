"""Drift detection on each GPU's own history (REFERENCE.md §4.8): lower CUSUM and EWMA.

Synthetic histories check the statistics against the REFERENCE's run lengths: a GPU losing 0.5 % a night
is flagged within the runs a sustained 1σ drop takes, and a stable fleet raises no more alarms than its
in-control ARL allows. A store filled with the fleet model's nightly waves checks the whole path:
results in the store → per-run medians → alarms, against baselines built the way ``baseline build`` does.
"""

from __future__ import annotations

import datetime as dt
import io
import math

import numpy as np
import pandas as pd
import pytest

from gpucert.errors import StoreError
from gpucert.fleet import Fleet
from gpucert.store import BASELINE_COLUMNS, BaselineStore, FileObjectStore
from gpucert.telemetry import (
    DRIFT_COLUMNS,
    HISTORY_COLUMNS,
    drift_alarms,
    ewma_limit,
    history_from_store,
    run_medians,
)

from .conftest import T0, Seeded

METRIC = "gemm_bf16_tflops"
CV = 0.007  # the policy's cv_rep for GEMM: σ0 = max(spread, cv_rep · centre)
MU = 1000.0
#: REFERENCE §4.8: in-control ARL and runs to flag a sustained 1σ drop, for the default parameters.
ARL0 = {"cusum": 930.0, "ewma": 1130.0}
ARL1 = {"cusum": 10.4, "ewma": 10.8}


def synthetic(
    gpus: int, runs: int, *, seed: int, drift_per_run: dict[int, float] | None = None, sd: float = CV * MU
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A history of ``gpus`` × ``runs`` GEMM medians (noise ``sd``) and the baseline it is judged against.

    ``drift_per_run``: GPU index → relative change per run (−0.005: −0.5 % a night, from the first run).
    """
    rng = np.random.default_rng(seed)
    values = MU + sd * rng.standard_normal((gpus, runs))
    for g, rate in (drift_per_run or {}).items():
        values[g] *= 1 + rate * np.arange(1, runs + 1)
    uuids = np.array([f"GPU-{g:06d}" for g in range(gpus)], dtype=object)
    nodes = np.array([f"node-{g // 8:05d}" for g in range(gpus)], dtype=object)
    days = pd.date_range(T0, periods=runs, freq="D")
    history = pd.DataFrame(
        {
            "run_id": np.tile([f"night-{r:03d}" for r in range(runs)], gpus),
            "ts": np.tile(days, gpus),
            "node": np.repeat(nodes, runs),
            "gpu": np.repeat(np.arange(gpus) % 8, runs),
            "gpu_uuid": np.repeat(uuids, runs),
            "gpu_model": "NVIDIA H200",
            "metric": METRIC,
            "value": values.ravel(),
            "n": 3,
        }
    )
    baseline = pd.DataFrame(
        {
            "level": "gpu",
            "key": uuids,
            "metric": METRIC,
            "center": MU,
            "spread": sd,
            "n": 5,
            "first_ts": days[0],
            "last_ts": days[0],
            "stack": "{}",
            "node": nodes,
        }
    )
    return history, baseline


def nightly(history: pd.DataFrame, baseline: pd.DataFrame, method: str) -> dict[str, str]:
    """Run the detector every night on the history so far, as operate does: GPU → the night first alarmed."""
    first: dict[str, str] = {}
    for night in sorted(history["run_id"].unique()):
        alarms = drift_alarms(history[history["run_id"] <= night], baseline, method=method)  # type: ignore[arg-type]
        for uuid in alarms["gpu_uuid"]:
            first.setdefault(uuid, night)
    return first


@pytest.mark.parametrize("method", ["cusum", "ewma"])
def test_a_gpu_losing_half_a_percent_a_night_is_flagged_within_the_expected_runs(method: str) -> None:
    # 40 GPUs drift, 160 stay put. −0.5 % a night is 0.71 σ0 a night: the drop passes 1σ after two nights,
    # so REFERENCE's "ARL to a sustained 1σ drop" plus those two nights bounds the run that must flag it.
    drifting = dict.fromkeys(range(40), -0.005)
    history, baseline = synthetic(200, 20, seed=3, drift_per_run=drifting)
    first = nightly(history, baseline, method)
    bound = math.ceil(1 / (0.005 / CV)) + ARL1[method]
    flagged_at = [int(first[f"GPU-{g:06d}"].split("-")[1]) + 1 for g in drifting if f"GPU-{g:06d}" in first]
    assert len(flagged_at) == len(drifting), f"{len(drifting) - len(flagged_at)} drifting GPUs never flagged"
    assert max(flagged_at) <= bound, (max(flagged_at), bound)
    print(
        f"{method}: drifting GPUs flagged after {np.median(flagged_at):.0f} runs (max {max(flagged_at)}, bound {bound})"
    )

    alarms = drift_alarms(history, baseline, method=method)  # type: ignore[arg-type]
    assert list(alarms.columns) == list(DRIFT_COLUMNS)
    row = alarms[alarms["gpu_uuid"] == "GPU-000000"].iloc[0]
    assert row["alarm"]
    assert row["action"] == "recertify"
    assert row["node"] == "node-00000"
    assert row["gpu"] == 0
    assert row["metric"] == METRIC
    assert row["runs"] == 20
    assert row["last_run"] == "night-019"
    # Since the onset the GPU sat several percent below its baseline (−0.5 % a night for 20 nights).
    assert -10 < row["deviation_pct"] < -2
    assert "re-certification" in row["reason"]
    assert "drains nothing" in row["reason"]
    assert row["first_run_over"] is not None
    assert row["onset_run"] <= row["first_run_over"] <= row["last_run"]


@pytest.mark.parametrize("method", ["cusum", "ewma"])
def test_a_stable_noisy_fleet_raises_no_more_alarms_than_its_arl_allows(method: str) -> None:
    # 1,000 GPUs × 30 runs of pure noise against their true baselines. Over 30 runs a series alarms with
    # probability at most 1 − (1 − 1/ARL0)^30 (the run length is at least as long as a geometric one from a
    # zero start), so the expected number of GPUs ever flagged is about 1,000 × 30 / ARL0: ≈32 (CUSUM h=5)
    # or ≈27 (EWMA L=3). Allow 50 % on top for the binomial spread.
    history, baseline = synthetic(1000, 30, seed=11)
    flagged = nightly(history, baseline, method)
    expected = 1000 * (1 - (1 - 1 / ARL0[method]) ** 30)
    rate = len(flagged) / 1000
    print(
        f"{method}: {len(flagged)} of 1,000 stable GPUs flagged in 30 runs (ARL-based expectation {expected:.0f})"
    )
    assert len(flagged) <= 1.5 * expected, (rate, expected)
    assert len(flagged) > 0, "a chart that never alarms on 30,000 noisy runs is not running"


def test_all_series_reports_every_statistic_and_the_limits_are_the_reference_ones() -> None:
    history, baseline = synthetic(16, 10, seed=5, drift_per_run={3: -0.01})
    every = drift_alarms(history, baseline, all_series=True)
    assert len(every) == 16
    assert every["alarm"].sum() == 1
    assert every.iloc[0]["gpu_uuid"] == "GPU-000003"  # worst first
    assert (every[~every["alarm"]]["action"] == "none").all()
    assert (every[~every["alarm"]]["reason"] == "").all()
    assert (every["statistic"] >= 0).all()
    assert (every["threshold"] == 5.0).all()
    ewma = drift_alarms(history, baseline, method="ewma", all_series=True)
    assert ewma["threshold"].iloc[0] == pytest.approx(ewma_limit(0.2, 3.0))
    assert ewma_limit(0.2, 3.0) == pytest.approx(-1.0)
    assert ewma_limit(0.2, 2.7) == pytest.approx(-0.9)


def test_one_wild_night_does_not_raise_a_drift_alarm_but_a_lasting_drop_does() -> None:
    history, baseline = synthetic(8, 15, seed=2, sd=1e-9)  # noise-free, to see the statistic alone
    values = history["value"].to_numpy().copy()
    gpu0 = (history["gpu_uuid"] == "GPU-000000").to_numpy()
    gpu1 = (history["gpu_uuid"] == "GPU-000001").to_numpy()
    night5 = (history["run_id"] == "night-005").to_numpy()
    values[gpu0 & night5] = MU * 0.5  # a link trained down for one night: the gates' business, not drift
    values[gpu1 & (history["run_id"] >= "night-010").to_numpy()] = MU * 0.97  # a lasting 3 % (4.3 σ0) drop
    history["value"] = values
    alarms = drift_alarms(history, baseline)
    assert list(alarms["gpu_uuid"]) == ["GPU-000001"]
    assert alarms.iloc[0]["onset_run"] == "night-010"
    assert alarms.iloc[0]["first_run_over"] == "night-011"  # (4.3 − 0.5) · 2 > 5 after two runs
    assert alarms.iloc[0]["deviation_pct"] == pytest.approx(-3.0, abs=1e-6)
    unclipped = drift_alarms(history, baseline, clip=1e9)
    assert "GPU-000000" in set(unclipped["gpu_uuid"])  # why the clip: 70 σ would hang over h for months


def test_runs_before_a_rebaseline_are_not_this_gpus_history() -> None:
    history, baseline = synthetic(8, 12, seed=4, sd=1e-9)
    early = (history["gpu_uuid"] == "GPU-000002").to_numpy() & (history["run_id"] < "night-006").to_numpy()
    history.loc[early, "value"] = MU * 0.9  # slow before its repair …
    assert "GPU-000002" in set(drift_alarms(history, baseline)["gpu_uuid"])
    rebaselined = baseline.copy()
    rebaselined.loc[rebaselined["key"] == "GPU-000002", "first_ts"] = pd.Timestamp(T0 + dt.timedelta(days=6))
    after = drift_alarms(history, rebaselined, all_series=True)  # … and re-baselined after it
    row = after[after["gpu_uuid"] == "GPU-000002"].iloc[0]
    assert not row["alarm"]
    assert row["runs"] == 6


def test_node_metrics_are_keyed_by_node_and_series_without_a_baseline_are_left_out() -> None:
    runs = 12
    days = pd.date_range(T0, periods=runs, freq="D")
    history = pd.DataFrame(
        {
            "run_id": [f"night-{r:03d}" for r in range(runs)] * 2,
            "ts": list(days) * 2,
            "node": ["node-a"] * runs + ["node-b"] * runs,
            "gpu": pd.array([None] * 2 * runs, dtype="Int64"),
            "gpu_uuid": [None] * 2 * runs,
            "gpu_model": "NVIDIA H200",
            "metric": "nccl_allreduce_busbw_gbps",
            "value": [440.0 * (1 - 0.01 * r) for r in range(runs)] + [440.0] * runs,
            "n": 3,
        }
    )
    baseline = pd.DataFrame(
        [("node", "node-a", "nccl_allreduce_busbw_gbps", 440.0, 1.0, 5, days[0], days[0], "{}", None)],
        columns=list(BASELINE_COLUMNS),
    )
    alarms = drift_alarms(history, baseline, all_series=True)
    assert list(alarms["node"]) == ["node-a"]  # node-b has no baseline: nothing to drift from
    row = alarms.iloc[0]
    assert row["alarm"]
    assert pd.isna(row["gpu"])
    assert row["gpu_uuid"] is None
    assert row["sigma"] == pytest.approx(0.01 * 440.0)  # spread 1 floored at the policy's cv_rep 1 %
    assert "this node's own baseline" in row["reason"]


def test_bad_parameters_and_empty_inputs() -> None:
    history, baseline = synthetic(2, 3, seed=1)
    with pytest.raises(ValueError, match="method"):
        drift_alarms(history, baseline, method="bayes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lam"):
        drift_alarms(history, baseline, method="ewma", lam=1.5)
    with pytest.raises(ValueError, match="h must be positive"):
        drift_alarms(history, baseline, h=0)
    empty = drift_alarms(history.iloc[0:0], baseline)
    assert list(empty.columns) == list(DRIFT_COLUMNS)
    assert empty.empty
    assert drift_alarms(history, baseline.iloc[0:0]).empty


# --- the store: results of nightly runs → history → alarms ----------------------------------------------


def _store_wave(store: BaselineStore, results: pd.DataFrame, run_id: str, day: dt.date) -> None:
    buffer = io.BytesIO()
    results.to_parquet(buffer, index=False)
    store.write_run_file(run_id, day, "results.parquet", buffer.getvalue())


def _drifted(results: pd.DataFrame, uuid: str, factor: float) -> pd.DataFrame:
    out = results.copy()
    hit = ((out["gpu_uuid"] == uuid) & (out["metric"] == METRIC)).to_numpy()
    values = out["value"].to_numpy().copy()
    values[hit] *= factor
    out["value"] = values
    return out


@pytest.fixture(scope="module")
def nightly_store(
    seeded: Seeded, tmp_path_factory: pytest.TempPathFactory
) -> tuple[BaselineStore, str, Fleet]:
    """The seeded fleet's five baseline waves and twenty nights after, one GPU losing 0.5 % a night."""
    store = BaselineStore(FileObjectStore(tmp_path_factory.mktemp("store")))
    fleet = seeded.fleet
    victim = str(fleet.uuids[37])
    for i in range(5):  # the waves the baseline was built from (conftest.seed_waves)
        wave = fleet.run(f"seed-{i}", ts=T0 + dt.timedelta(days=i), seed=100 + i)
        _store_wave(store, wave.results, f"seed-{i}", (T0 + dt.timedelta(days=i)).date())
    for night in range(1, 21):
        when = T0 + dt.timedelta(days=4 + night)
        wave = fleet.run(f"night-{night:02d}", ts=when, seed=500 + night)
        _store_wave(
            store, _drifted(wave.results, victim, 1 - 0.005 * night), f"night-{night:02d}", when.date()
        )
    store.objects.put("runs/date=2026-12-01/run=crashed/stack.json", b"{}")  # a run that left no results
    return store, victim, fleet


def test_history_from_the_store_feeds_the_detector(
    nightly_store: tuple[BaselineStore, str, Fleet], seeded: Seeded
) -> None:
    store, victim, _ = nightly_store
    history = history_from_store(store, last_runs=30)
    assert list(history.columns) == list(HISTORY_COLUMNS)
    assert history["run_id"].nunique() == 25
    assert set(history["metric"]) == {
        "gemm_bf16_tflops",
        "hbm_copy_gbps",
        "h2d_gbps",
        "d2h_gbps",
        "nccl_allreduce_busbw_gbps",
    }
    assert (history["n"] == 3).all()
    assert history["ts"].is_monotonic_increasing
    one = history[(history["gpu_uuid"] == victim) & (history["metric"] == METRIC)]
    assert len(one) == 25

    alarms = drift_alarms(history, seeded.baseline)
    hit = alarms[(alarms["gpu_uuid"] == victim) & (alarms["metric"] == METRIC)]
    assert len(hit) == 1
    # Everything else is the fleet model's healthy noise against baselines seeded from five runs. A centre
    # estimated from five runs sits ~0.3 σ0 off now and then, so a few series do cross; REFERENCE's
    # expectation (series × runs / ARL0, every series in control) still bounds them, with the same margin
    # as the synthetic fleet above.
    others = alarms[alarms["gpu_uuid"] != victim]
    series = history.groupby(["node", "gpu", "metric"], observed=True, dropna=False).ngroups
    expected = series * (1 - (1 - 1 / ARL0["cusum"]) ** 25)
    print(
        f"store: {len(others)} other series over h at the last night, of {series} (ARL bound {expected:.0f})"
    )
    assert len(others) <= 1.5 * expected, others[["node", "gpu", "metric", "statistic"]]


def test_history_is_capped_and_filtered_by_time(nightly_store: tuple[BaselineStore, str, Fleet]) -> None:
    store, _, _ = nightly_store
    last = history_from_store(store, last_runs=7, metrics=[METRIC])
    assert sorted(last["run_id"].unique()) == [f"night-{n:02d}" for n in range(14, 21)]
    assert set(last["metric"]) == {METRIC}
    since_day = history_from_store(store, since=(T0 + dt.timedelta(days=20)).date())
    assert sorted(since_day["run_id"].unique()) == [
        "night-16",
        "night-17",
        "night-18",
        "night-19",
        "night-20",
    ]
    since_time = history_from_store(store, since=T0 + dt.timedelta(days=20, hours=1))
    assert sorted(since_time["run_id"].unique()) == ["night-17", "night-18", "night-19", "night-20"]
    with pytest.raises(ValueError, match="last_runs"):
        history_from_store(store, last_runs=0)


def test_a_corrupt_results_file_is_a_store_error_naming_the_run(tmp_path: object) -> None:
    store = BaselineStore(FileObjectStore(tmp_path))  # type: ignore[arg-type]
    store.write_run_file("night-01", T0.date(), "results.parquet", b"not parquet at all")
    with pytest.raises(StoreError, match="night-01"):
        history_from_store(store)
    assert history_from_store(BaselineStore(FileObjectStore(tmp_path / "empty"))).empty  # type: ignore[operator]


def test_run_medians_take_the_median_of_repeats(seeded: Seeded) -> None:
    wave = seeded.night(seed=77)
    medians = run_medians(wave.results)
    sample = wave.results[(wave.results["metric"] == METRIC)]
    first = sample[(sample["node"] == sample["node"].iloc[0]) & (sample["gpu"] == 0)]
    got = medians[
        (medians["node"] == first["node"].iloc[0]) & (medians["gpu"] == 0) & (medians["metric"] == METRIC)
    ]
    assert got["value"].iloc[0] == pytest.approx(float(np.median(first["value"])))
    nccl = medians[medians["metric"] == "nccl_allreduce_busbw_gbps"]
    assert len(nccl) == seeded.fleet.n_nodes
    assert nccl["gpu"].isna().all()
