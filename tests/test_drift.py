"""Drift detection on each GPU's own history (docs/design/operate.md, "Drift"): a calibrated lower CUSUM or EWMA.

Synthetic fleets (seeded numpy: each GPU's own level, repeats at the policy's cv_rep, baselines set from
five runs the way ``baseline build`` sets them) check the bar the detector is tuned to: a stable fleet
rarely flagged over 30 nights, a GPU losing 0.5 % a night flagged within a median of 6 nights, a 3 %
step the first night, a fleet-wide shift flagging no one, an alarm clearing when the GPU is back at its
baseline. A store filled with the fleet model's nightly waves checks the whole path — results in the store
→ each GPU's own last N runs → alarms — including a rotation that measures each node one night in six.
"""

from __future__ import annotations

import datetime as dt
import io
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from gpucert.errors import StoreError
from gpucert.policy import Policy, default_policy, load_policy
from gpucert.store import BASELINE_COLUMNS, BaselineStore, FileObjectStore
from gpucert.telemetry import (
    DRIFT_COLUMNS,
    HISTORY_COLUMNS,
    TRACE_COLUMNS,
    check_drift,
    drift_alarms,
    drift_trace,
    ewma_limit,
    history_from_store,
    run_medians,
)
from gpucert_sim.fleet import Fleet

from .conftest import T0, Seeded

GEMM = "gemm_bf16_tflops"
GPU_METRICS = ("gemm_bf16_tflops", "hbm_copy_gbps", "h2d_gbps", "d2h_gbps")
LEVEL = {"gemm_bf16_tflops": 730.0, "hbm_copy_gbps": 4010.0, "h2d_gbps": 52.0, "d2h_gbps": 52.0}
NIGHT0 = T0 + dt.timedelta(days=6)
#: The textbook chart (docs/design/operate.md, "Drift"), without the one-run limit.
REFERENCE_K05 = {"drift": {"k": 0.5, "h": 5.0, "shewhart": 1e9}}


def synthetic(
    gpus: int,
    nights: int,
    *,
    seed: int,
    metrics: Sequence[str] = (GEMM,),
    repeats: int = 3,
    factor: Mapping[int, Callable[[np.ndarray], np.ndarray]] | None = None,
    fleet: Callable[[np.ndarray], np.ndarray] | None = None,
    noise: float = 1.0,
    policy: Policy | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A history of ``nights`` per-run medians (``repeats`` repeats at ``noise`` × the policy's cv_rep)
    of ``gpus`` GPUs, 8 to a node, and the baseline set from five earlier runs of the same GPUs.

    ``factor``: GPU index → the multiplier of its first metric per night (nights 1..N as an array);
    ``fleet``: the same for every GPU and metric (a new driver, a warm night).
    """
    policy = policy or default_policy()
    rng = np.random.default_rng(seed)
    uuids = np.array([f"GPU-{g:06d}" for g in range(gpus)], dtype=object)
    nodes = np.array([f"node-{g // 8:04d}" for g in range(gpus)], dtype=object)
    night = np.arange(1, nights + 1)
    common = fleet(night) if fleet is not None else np.ones(nights)
    history, base = [], []
    for i, metric in enumerate(metrics):
        cv = policy.metrics[metric].cv_rep * noise
        level = LEVEL[metric] * (1 + 0.015 * rng.standard_normal(gpus))
        seeding = level[:, None, None] * (1 + cv * rng.standard_normal((gpus, 5, repeats)))
        medians = np.median(seeding, axis=2)
        base.append(
            pd.DataFrame(
                {
                    "level": "gpu",
                    "key": uuids,
                    "metric": metric,
                    "center": medians.mean(axis=1),
                    "spread": medians.std(axis=1, ddof=1),
                    "n": 5,
                    "first_ts": pd.Timestamp(T0),
                    "last_ts": pd.Timestamp(T0 + dt.timedelta(days=4)),
                    "stack": "{}",
                    "node": nodes,
                }
            )
        )
        scale = np.tile(common, (gpus, 1))
        for g, f in (factor or {}).items():
            if i == 0:
                scale[g] *= f(night)
        reps = (level[:, None] * scale)[:, :, None] * (1 + cv * rng.standard_normal((gpus, nights, repeats)))
        history.append(
            pd.DataFrame(
                {
                    "run_id": np.tile([f"night-{n:03d}" for n in night], gpus),
                    "ts": np.tile(pd.date_range(NIGHT0, periods=nights, freq="D"), gpus),
                    "node": np.repeat(nodes, nights),
                    "gpu": np.repeat(np.arange(gpus) % 8, nights),
                    "gpu_uuid": np.repeat(uuids, nights),
                    "gpu_model": "NVIDIA H200",
                    "metric": metric,
                    "value": np.median(reps, axis=2).ravel(),
                    "n": repeats,
                    "rep_sd": reps.std(axis=2, ddof=1).ravel(),
                }
            )
        )
    frame = pd.concat(history, ignore_index=True)
    frame = frame.astype(dict.fromkeys(("run_id", "node", "gpu_uuid", "gpu_model", "metric"), "category"))
    return frame, pd.concat(base, ignore_index=True)


def decline(rate: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda night: 1 + rate * night


def step(size: float, first: int = 1, last: int | None = None) -> Callable[[np.ndarray], np.ndarray]:
    return lambda night: np.where((night >= first) & (night <= (last or night.max())), 1 + size, 1.0)


def uuid(g: int) -> str:
    return f"GPU-{g:06d}"


def runs(frame: pd.DataFrame) -> np.ndarray:
    """The run ids as text, to compare (the history's are categorical)."""
    return frame["run_id"].astype(str).to_numpy()


def ever_flagged(history: pd.DataFrame, baseline: pd.DataFrame, policy: Policy | None = None) -> set[str]:
    """GPUs in alarm on any night. One pass over the whole history gives the statistic every night would
    have computed (the chart is causal); only the noise estimate pools all nights instead of those so far."""
    trace = drift_trace(history, baseline, policy=policy)
    return set(trace.loc[trace["alarm"], "gpu_uuid"].dropna())


def nightly(history: pd.DataFrame, baseline: pd.DataFrame, **kwargs: object) -> dict[str, int]:
    """Run the detector every night on the history so far, as operate does: GPU → first night in alarm."""
    first: dict[str, int] = {}
    ts = history["ts"].to_numpy()
    for n, night in enumerate(np.unique(ts), start=1):
        alarms = drift_alarms(history[ts <= night], baseline, **kwargs)  # type: ignore[arg-type]
        for g in alarms["gpu_uuid"].dropna():
            first.setdefault(str(g), n)
    return first


# --- the bar: false alarms, a decline, a step ----------------------------------------------------------


def test_a_stable_fleet_is_rarely_flagged_in_thirty_nights() -> None:
    # 1,000 stable GPUs × 4 metrics × 30 nights, baselines from five runs: at most 0.5 % ever flagged.
    # The textbook k = 0.5, h = 5 assumes centres known exactly; the centre's own error (σ/√5, the same
    # every night) walks that chart into alarm on a large share of the same fleet.
    history, baseline = synthetic(1000, 30, seed=0, metrics=GPU_METRICS)
    flagged = ever_flagged(history, baseline)
    reference = ever_flagged(history, baseline, load_policy(None, REFERENCE_K05))
    print(f"stable fleet: {len(flagged)} of 1,000 flagged; with the textbook k = 0.5, h = 5: {len(reference)}")
    assert len(flagged) <= 5
    assert len(reference) > 10 * max(len(flagged), 1)


@pytest.mark.parametrize("method", ["cusum", "ewma"])
def test_a_decline_is_flagged_within_six_nights_and_a_step_the_first_night(method: str) -> None:
    # 40 GPUs lose 0.5 % of GEMM a night, 40 drop 3 % at once, 120 stay put; operate checks every night.
    declining, stepping = range(40), range(40, 80)
    drifts = {g: decline(-0.005) for g in declining} | {g: step(-0.03) for g in stepping}
    history, baseline = synthetic(200, 15, seed=3, factor=drifts)
    first = nightly(history, baseline, method=method)
    found_decline = [first.get(uuid(g), 99) for g in declining]
    found_step = [first.get(uuid(g), 99) for g in stepping]
    print(f"{method}: decline flagged after {np.median(found_decline):.0f} nights, steps {sorted(found_step)}")
    assert np.median(found_decline) <= 6
    assert max(found_decline) <= 8
    assert sum(n == 1 for n in found_step) >= 36  # 9 in 10 the first night
    assert max(found_step) <= 3
    assert not {uuid(g) for g in range(80, 200)} & set(first)

    alarms = drift_alarms(history, baseline, method=method)  # type: ignore[arg-type]
    assert list(alarms.columns) == list(DRIFT_COLUMNS)
    row = alarms[alarms["gpu_uuid"] == uuid(0)].iloc[0]
    assert row["alarm"]
    assert row["action"] == "recertify"
    assert (row["node"], row["gpu"], row["metric"]) == ("node-0000", 0, GEMM)
    assert row["runs"] == 15
    assert row["last_run"] == "night-015"
    assert -10 < row["deviation_pct"] < -2  # −0.5 % a night for 15 nights, averaged since the onset
    assert "re-certification" in row["reason"]
    assert "drains nothing" in row["reason"]
    assert row["onset_run"] <= row["first_run_over"] <= row["last_run"]


def test_a_fleet_wide_shift_is_not_drift_of_each_gpu() -> None:
    # A new driver makes every GPU 2 % slower from night 8; nights also wander ±0.5 % together (a warm
    # hall). One GPU loses 3 % more from night 12: it alone is drift.
    wander = np.random.default_rng(9).normal(0, 0.005, 20)
    fleet = lambda night: np.where(night >= 8, 0.98, 1.0) * (1 + wander[night - 1])  # noqa: E731
    history, baseline = synthetic(200, 20, seed=5, fleet=fleet, factor={7: step(-0.03, first=12)})
    flagged = ever_flagged(history, baseline)
    assert flagged == {uuid(7)}
    alarms = drift_alarms(history, baseline)
    row = alarms.iloc[0]
    assert row["gpu_uuid"] == uuid(7)
    assert row["fleet_pct"] == pytest.approx((0.98 * (1 + wander[-1]) - 1) * 100, abs=0.3)
    assert row["deviation_pct"] == pytest.approx(-3.0, abs=0.6)  # beyond the fleet's own shift
    assert "fleet's own" in row["reason"]
    # Without the correction (too small a cohort to estimate it) the driver alone flags most of the fleet.
    uncorrected = load_policy(None, {"fleet": {"min_gpus": 10**6, "min_nodes": 10**6}})
    assert len(ever_flagged(history, baseline, uncorrected)) > 150


def test_an_alarm_clears_when_the_gpu_is_back_at_its_baseline() -> None:
    # GPU 3 is 3 % slow on nights 5–9 (a throttling fan), repaired and re-certified at its baseline on
    # night 10; GPU 4 has one wild night (a link down for a night) and is fine the next.
    history, baseline = synthetic(80, 14, seed=2, factor={3: step(-0.03, 5, 9), 4: step(-0.5, 6, 6)})
    trace = drift_trace(history, baseline)
    assert list(trace.columns) == list(TRACE_COLUMNS)
    gpu3 = trace[trace["gpu_uuid"] == uuid(3)].set_index("run_id")
    assert list(gpu3.index[gpu3["raised"]]) == ["night-005"]
    assert list(gpu3.index[gpu3["alarm"]]) == [f"night-{n:03d}" for n in range(5, 10)]
    assert list(gpu3.index[gpu3["cleared"]]) == ["night-010"]
    assert gpu3.loc["night-010", "statistic"] == 0.0  # the chart restarts from the baseline
    gpu4 = trace[trace["gpu_uuid"] == uuid(4)].set_index("run_id")
    assert list(gpu4.index[gpu4["alarm"]]) == ["night-006"]
    assert gpu4.loc["night-006", "u"] == -default_policy().drift.clip  # one night counts at most `clip` σ
    assert list(gpu4.index[gpu4["cleared"]]) == ["night-007"]

    on_night_9 = drift_alarms(history[runs(history) <= "night-009"], baseline)
    row = on_night_9[on_night_9["gpu_uuid"] == uuid(3)].iloc[0]
    assert (row["onset_run"], row["first_run_over"]) == ("night-005", "night-005")
    assert row["deviation_pct"] == pytest.approx(-3.0, abs=0.5)
    assert uuid(3) not in set(drift_alarms(history, baseline)["gpu_uuid"])  # cleared by night 14


def test_a_replaced_gpu_s_old_history_asks_for_nothing() -> None:
    # GPU 0 drifts and is replaced (an RMA) after night 10: its old UUID is no longer on its node.
    history, baseline = synthetic(80, 14, seed=4, factor={0: decline(-0.01)})
    old = (history["gpu_uuid"] == uuid(0)).to_numpy() & (runs(history) > "night-010")
    replaced = history.copy()
    replaced["gpu_uuid"] = replaced["gpu_uuid"].cat.add_categories(["GPU-new"])
    replaced.loc[old, "gpu_uuid"] = "GPU-new"
    before = drift_alarms(replaced[runs(replaced) <= "night-010"], baseline)
    assert uuid(0) in set(before["gpu_uuid"])
    assert uuid(0) not in set(drift_alarms(replaced, baseline)["gpu_uuid"])


def test_all_series_reports_every_statistic_and_the_limits_are_the_policy_s() -> None:
    history, baseline = synthetic(16, 10, seed=5, factor={3: decline(-0.01)})
    every = drift_alarms(history, baseline, all_series=True)
    assert len(every) == 16
    assert every["alarm"].sum() == 1
    assert every.iloc[0]["gpu_uuid"] == uuid(3)  # alarms first, worst first
    assert (every[~every["alarm"]]["action"] == "none").all()
    assert (every[~every["alarm"]]["reason"] == "").all()
    assert (every["statistic"] >= 0).all()
    assert (every["threshold"] == default_policy().drift.h).all()
    ewma = drift_alarms(history, baseline, method="ewma", all_series=True)
    drift = default_policy().drift
    assert ewma["threshold"].iloc[0] == pytest.approx(ewma_limit(drift.lam, drift.L))
    assert ewma_limit(0.2, 3.0) == pytest.approx(-1.0)
    assert ewma_limit(0.2, 2.7) == pytest.approx(-0.9)
    # σ is the median's noise from the repeats and the centre's uncertainty: a little under cv_rep here.
    ratio = every["sigma"] / every["center"] / default_policy().metrics[GEMM].cv_rep
    assert ratio.between(0.6, 0.95).all(), ratio.describe()


def test_runs_before_a_rebaseline_are_not_this_gpus_history() -> None:
    history, baseline = synthetic(8, 12, seed=4, factor={2: step(-0.1, 1, 5)})  # slow before its repair …
    before = drift_trace(history, baseline)
    assert before[before["gpu_uuid"] == uuid(2)]["alarm"].any()
    rebaselined = baseline.copy()
    rebaselined.loc[rebaselined["key"] == uuid(2), "first_ts"] = pd.Timestamp(NIGHT0 + dt.timedelta(days=5))
    after = drift_trace(history, rebaselined)  # … and re-baselined after it
    gpu2 = after[after["gpu_uuid"] == uuid(2)]
    assert gpu2["run_id"].astype(str).min() == "night-006"
    assert not gpu2["alarm"].any()
    row = drift_alarms(history, rebaselined, all_series=True).query("gpu_uuid == @uuid(2)").iloc[0]
    assert row["runs"] == 7


def test_each_series_is_its_own_last_n_runs() -> None:
    history, baseline = synthetic(8, 20, seed=6, factor={1: step(-0.5, 1, 10)})
    assert uuid(1) in set(drift_trace(history, baseline).query("alarm")["gpu_uuid"])
    recent = drift_alarms(history, baseline, window=8, all_series=True)
    assert (recent["runs"] == 8).all()
    assert uuid(1) not in set(recent.loc[recent["alarm"], "gpu_uuid"])  # its bad nights left the window


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
    )  # no rep_sd: the policy's cv_rep stands in for the repeats' spread
    baseline = pd.DataFrame(
        [("node", "node-a", "nccl_allreduce_busbw_gbps", 440.0, 1.0, 5, days[0], days[0], "{}")],
        columns=["level", "key", "metric", "center", "spread", "n", "first_ts", "last_ts", "stack"],
    ).reindex(columns=list(BASELINE_COLUMNS))
    alarms = drift_alarms(history, baseline, all_series=True)
    assert list(alarms["node"]) == ["node-a"]  # node-b has no baseline: nothing to drift from
    row = alarms.iloc[0]
    assert row["alarm"]
    assert pd.isna(row["gpu"])
    assert row["gpu_uuid"] is None
    assert 0.005 * 440 < row["sigma"] < 0.01 * 440  # cv_rep 1 %, for a median of 3, with the centre's error
    assert row["fleet_pct"] == 0.0  # one node: too few to estimate a fleet factor
    assert "this node's own baseline" in row["reason"]


def test_a_baseline_still_being_seeded_is_not_judged() -> None:
    history, baseline = synthetic(8, 10, seed=7, factor={0: step(-0.2)})
    young = baseline.assign(n=np.where(baseline["key"] == uuid(0), 2, baseline["n"]))
    assert uuid(0) in set(drift_alarms(history, baseline)["gpu_uuid"])
    assert uuid(0) not in set(drift_alarms(history, young, all_series=True)["gpu_uuid"])


def test_bad_parameters_and_empty_inputs() -> None:
    history, baseline = synthetic(2, 3, seed=1)
    with pytest.raises(ValueError, match="method"):
        drift_alarms(history, baseline, method="bayes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lam"):
        drift_alarms(history, baseline, method="ewma", lam=1.5)
    with pytest.raises(ValueError, match="h must be positive"):
        drift_alarms(history, baseline, h=0)
    with pytest.raises(ValueError, match="clear"):
        drift_alarms(history, baseline, clear=-1)
    empty = drift_alarms(history.iloc[0:0], baseline)
    assert list(empty.columns) == list(DRIFT_COLUMNS)
    assert empty.empty
    assert drift_alarms(history, baseline.iloc[0:0]).empty
    assert list(drift_trace(history.iloc[0:0], baseline).columns) == list(TRACE_COLUMNS)
    assert drift_trace(history, baseline, pd.DataFrame({"node": [], "gpu_uuid": [], "metric": []})).empty


# --- the store: results of nightly runs → each GPU's own history → alarms --------------------------------


def _store_wave(store: BaselineStore, results: pd.DataFrame, run_id: str, day: dt.date) -> None:
    buffer = io.BytesIO()
    results.to_parquet(buffer, index=False)
    store.write_run_file(run_id, day, "results.parquet", buffer.getvalue())


def _drifted(results: pd.DataFrame, uuids: str | Sequence[str], factor: float) -> pd.DataFrame:
    out = results.copy()
    wanted = [uuids] if isinstance(uuids, str) else list(uuids)
    hit = (out["gpu_uuid"].isin(wanted) & (out["metric"] == GEMM)).to_numpy()
    values = out["value"].to_numpy().copy()
    values[hit] *= factor
    out["value"] = values
    return out


@pytest.fixture(scope="module")
def nightly_store(seeded: Seeded, tmp_path_factory: pytest.TempPathFactory) -> tuple[BaselineStore, str, Fleet]:
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
        _store_wave(store, _drifted(wave.results, victim, 1 - 0.005 * night), f"night-{night:02d}", when.date())
    store.objects.put("runs/date=2026-12-01/run=crashed/stack.json", b"{}")  # a run that left no results
    store.update(lambda _: seeded.baseline, message="the seeded baseline")
    return store, victim, fleet


def test_history_from_the_store_feeds_the_detector(
    nightly_store: tuple[BaselineStore, str, Fleet], seeded: Seeded
) -> None:
    store, victim, _ = nightly_store
    history = history_from_store(store, last_runs=30)
    assert list(history.columns) == list(HISTORY_COLUMNS)
    assert history["run_id"].nunique() == 25
    assert set(history["metric"]) == set(GPU_METRICS) | {"nccl_allreduce_busbw_gbps"}
    assert (history["n"] >= 3).all()
    assert (history["rep_sd"] > 0).all()
    assert history["ts"].is_monotonic_increasing
    one = history[(history["gpu_uuid"] == victim) & (history["metric"] == GEMM)]
    assert len(one) == 25

    alarms = drift_alarms(history, seeded.baseline)
    hit = alarms[(alarms["gpu_uuid"] == victim) & (alarms["metric"] == GEMM)]
    assert len(hit) == 1
    # Everything else is the fleet model's healthy noise (transient bad repeats included) against
    # baselines seeded from five runs: 192 GPUs and 24 nodes, a handful of series at most.
    others = alarms[alarms["gpu_uuid"] != victim]
    assert len(others) <= 1, others[["node", "gpu", "metric", "statistic", "reason"]]
    assert check_drift(store).asked() == {hit.iloc[0]["node"]: "drift: " + hit.iloc[0]["reason"]}


def test_history_is_capped_per_gpu_and_filtered_by_time(nightly_store: tuple[BaselineStore, str, Fleet]) -> None:
    store, _, _ = nightly_store
    last = history_from_store(store, last_runs=7, metrics=[GEMM])
    assert sorted(last["run_id"].unique()) == [f"night-{n:02d}" for n in range(14, 21)]
    assert set(last["metric"]) == {GEMM}
    assert (last.groupby("gpu_uuid", observed=True).size() == 7).all()
    since_day = history_from_store(store, since=(T0 + dt.timedelta(days=20)).date())
    assert sorted(since_day["run_id"].unique()) == [f"night-{n:02d}" for n in range(16, 21)]
    since_time = history_from_store(store, since=T0 + dt.timedelta(days=20, hours=1))
    assert sorted(since_time["run_id"].unique()) == ["night-17", "night-18", "night-19", "night-20"]
    recent = history_from_store(store, max_days=3)
    assert sorted(recent["run_id"].unique()) == [f"night-{n:02d}" for n in range(17, 21)]
    with pytest.raises(ValueError, match="last_runs"):
        history_from_store(store, last_runs=0)


@pytest.fixture(scope="module")
def rotation_store(seeded: Seeded, tmp_path_factory: pytest.TempPathFactory) -> tuple[BaselineStore, str, list[str]]:
    """72 nights of a 6-night rotation (4 of the 24 nodes a night: every GPU certified 12 times), one GPU
    1.5 % slow from its 4th certification on."""
    store = BaselineStore(FileObjectStore(tmp_path_factory.mktemp("rotation")))
    fleet = seeded.fleet
    victim = str(fleet.uuids[9])  # on node 1: nights 1, 7, 13, 19, …
    for night in range(72):
        nodes = [n for i, n in enumerate(fleet.node_names) if i % 6 == night % 6]
        when = T0 + dt.timedelta(days=5 + night)
        wave = fleet.run(f"night-{night:03d}", ts=when, seed=900 + night, nodes=nodes)
        slow = _drifted(wave.results, victim, 0.985) if night >= 18 else wave.results
        _store_wave(store, slow, f"night-{night:03d}", when.date())
    return store, victim, fleet.node_names


def test_with_a_rotation_each_gpu_gets_its_own_last_n_certifications(
    rotation_store: tuple[BaselineStore, str, list[str]], seeded: Seeded, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, victim, _ = rotation_store
    read: list[str] = []
    real = store.read_run_file

    def counting(run_id: str, day: dt.date, name: str) -> bytes:
        read.append(run_id)
        return real(run_id, day, name)

    monkeypatch.setattr(store, "read_run_file", counting)
    history = history_from_store(store, last_runs=5, baseline=seeded.baseline, workers=4)
    per_series = history.groupby(["node", "gpu", "metric"], observed=True, dropna=False).size()
    assert (per_series == 5).all()  # five of its own certifications, over 30 of the store's nights
    assert history["run_id"].nunique() == 30
    assert len(read) <= 30 + 8  # newest first, stopping once every GPU has five: not all 72 files

    # The store-wide window of old (the last 30 runs) gave each GPU 5 points; its own last 12 find the drop.
    everything = history_from_store(store, last_runs=12, baseline=seeded.baseline)
    assert everything[everything["gpu_uuid"] == victim]["run_id"].nunique() == 12
    alarms = drift_alarms(everything, seeded.baseline)
    assert victim in set(alarms["gpu_uuid"])
    assert len(alarms) <= 2, alarms[["node", "gpu", "metric", "reason"]]  # the fleet model's rare wild night
    bounded = history_from_store(store, last_runs=12, max_days=17)
    assert bounded[bounded["gpu_uuid"] == victim]["run_id"].nunique() == 3  # 18 days: nights 55, 61, 67


def test_a_corrupt_results_file_is_a_store_error_naming_the_run(tmp_path: Path) -> None:
    store = BaselineStore(FileObjectStore(tmp_path))
    store.write_run_file("night-01", T0.date(), "results.parquet", b"not parquet at all")
    with pytest.raises(StoreError, match="night-01"):
        history_from_store(store)
    assert history_from_store(BaselineStore(FileObjectStore(tmp_path / "empty"))).empty


def test_run_medians_take_the_median_and_spread_of_repeats(seeded: Seeded) -> None:
    wave = seeded.night(seed=77)
    medians = run_medians(wave.results)
    sample = wave.results[(wave.results["metric"] == GEMM)]
    first = sample[(sample["node"] == sample["node"].iloc[0]) & (sample["gpu"] == 0)]
    got = medians[(medians["node"] == first["node"].iloc[0]) & (medians["gpu"] == 0) & (medians["metric"] == GEMM)]
    assert got["value"].iloc[0] == pytest.approx(float(np.median(first["value"])))
    assert got["rep_sd"].iloc[0] == pytest.approx(float(np.std(first["value"], ddof=1)))
    assert got["n"].iloc[0] == len(first)
    nccl = medians[medians["metric"] == "nccl_allreduce_busbw_gbps"]
    assert len(nccl) == seeded.fleet.n_nodes
    assert nccl["gpu"].isna().all()
