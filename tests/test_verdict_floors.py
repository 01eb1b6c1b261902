"""Spec floors (docs/reference/reference-values.md, "Initial hard floors"): a floor miss fails only with
something behind it, host-side metrics under a floor on a whole node are the node's config finding, and every
shipped floor sits outside healthy noise."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from gpucert.baseline import build_baseline
from gpucert.metrics import METRICS
from gpucert.policy import default_policy, spec_floors
from gpucert.store import empty_baseline
from gpucert.verdict import judge
from gpucert_sim.fleet import DEFAULT_NOISE, GPU_PERF_METRICS, MODELS, Fault, Fleet, NoiseModel

from .conftest import T0, row

MODEL = "NVIDIA H200"
#: Every metric with a shipped floor, plus storage (host-side, node level) with a floor set by the test.
FLOORED = sorted({m for (_, m) in spec_floors()} | {"storage_read_gbps"})
GPU_LEVEL = [m for m in FLOORED if METRICS[m].level == "gpu"]
HOST_GPU = ["h2d_gbps", "d2h_gbps"]


def _with_synthetic(results: pd.DataFrame, seed: int) -> pd.DataFrame:
    """The fleet model measures neither FP8 GEMM nor storage: derive them (FP8 from each GPU's BF16
    GEMM, storage from each node's all-reduce) with noise of their own, so every floor is exercised."""
    rng = np.random.default_rng(seed)
    frame = results.astype({"metric": str})
    gemm = frame[frame["metric"] == "gemm_bf16_tflops"]
    fp8 = gemm.assign(
        metric="gemm_fp8_tflops", value=gemm["value"] * 1.8 * (1 + 0.005 * rng.standard_normal(len(gemm)))
    )
    nccl = frame[frame["metric"] == "nccl_allreduce_busbw_gbps"]
    storage = nccl.assign(
        metric="storage_read_gbps", value=nccl["value"] / 480 * 25 * (1 + 0.01 * rng.standard_normal(len(nccl)))
    )
    out = pd.concat([frame, fp8, storage], ignore_index=True)
    out["metric"] = out["metric"].astype("category")
    return out


@dataclass(frozen=True)
class Floors:
    fleet: Fleet
    baseline: pd.DataFrame

    def night(
        self, faults: list[Fault] | None = None, *, seed: int = 900, fleet_shift: Mapping[str, float] | float = 0.0
    ) -> pd.DataFrame:
        wave = self.fleet.run(
            f"night-{seed}", ts=T0 + dt.timedelta(days=20), seed=seed, faults=faults or [], fleet_shift=fleet_shift
        )
        return _with_synthetic(wave.results, seed)


@pytest.fixture(scope="module")
def floors_fleet() -> Floors:
    fleet = Fleet.generate(nodes=12, seed=31)
    waves = pd.concat(
        [
            _with_synthetic(fleet.run(f"seed-{i}", ts=T0 + dt.timedelta(days=i), seed=300 + i).results, i)
            for i in range(5)
        ],
        ignore_index=True,
    )
    waves["metric"] = waves["metric"].astype("category")
    baseline, _ = build_baseline(empty_baseline(), waves, policy=default_policy())
    return Floors(fleet, baseline)


def _medians(results: pd.DataFrame, metric: str) -> pd.DataFrame:
    """The median of each entity's repeats on ``metric`` (what the engine compares), with its UUID."""
    part = results[(results["metric"] == metric) & results["peer"].isna()]
    return (
        part.groupby(["node", "gpu", "gpu_uuid"], observed=True, dropna=False)["value"]
        .median()
        .reset_index()
        .astype({"node": str})
    )


def _lowest_with_history(results: pd.DataFrame, baseline: pd.DataFrame, metric: str) -> pd.Series:
    """The entity with the lowest median on ``metric`` among those with an own baseline for it."""
    medians = _medians(results, metric)
    level = METRICS[metric].level
    keys = set(baseline.loc[(baseline["level"] == level) & (baseline["metric"] == metric), "key"])
    key = medians["gpu_uuid"] if level == "gpu" else medians["node"]
    return medians[key.isin(keys)].sort_values("value").iloc[0]


def _floors_with(metric: str, value: float) -> dict[tuple[str, str], float]:
    return {**spec_floors(), (MODEL, metric): value}


def _gpu_of(target: pd.Series) -> int | None:
    return None if pd.isna(target["gpu"]) else int(target["gpu"])


def _target(verdicts: pd.DataFrame, target: pd.Series) -> pd.Series:
    return row(verdicts, str(target["node"]), _gpu_of(target))


def _scale(
    results: pd.DataFrame, metric: str, factor: float, node: str, gpu: int | None = None, *, all_gpus: bool = False
) -> pd.DataFrame:
    """``metric`` × ``factor`` on one node's row (``gpu`` None), one GPU, or all its GPUs."""
    out = results.copy()
    hit = (out["metric"] == metric) & (out["node"] == node) & out["peer"].isna()
    if all_gpus:
        hit &= out["gpu"].notna()
    else:
        hit &= out["gpu"].isna() if gpu is None else (out["gpu"] == gpu)
    out.loc[hit, "value"] = out.loc[hit, "value"] * factor
    return out


# --- the rule, metric by metric ------------------------------------------------------------------------


@pytest.mark.parametrize("metric", FLOORED)
def test_a_floor_miss_its_own_history_and_node_agree_with_only_warns(floors_fleet: Floors, metric: str) -> None:
    night = floors_fleet.night()
    target = _lowest_with_history(night, floors_fleet.baseline, metric)
    verdicts = judge(night, floors_fleet.baseline, floors=_floors_with(metric, target["value"] * 1.0005))
    got = _target(verdicts, target)
    assert got["verdict"] == "warn", got["reasons"]
    assert got["reference_kind"] == "spec"
    assert "noise at the floor" in got["reasons"]
    # Nothing else fails for it: a GPU that never seeded a baseline (a lemon) and is under too may.
    fails = verdicts[verdicts["verdict"] == "fail"]
    assert fails["reasons"].str.contains("no history of its own").all(), fails["reasons"].tolist()


@pytest.mark.parametrize("metric", FLOORED)
def test_a_floor_miss_with_a_drop_against_its_own_history_fails(floors_fleet: Floors, metric: str) -> None:
    night = floors_fleet.night(seed=901)
    target = _lowest_with_history(night, floors_fleet.baseline, metric)
    drop = 1 - 1.5 * default_policy().metrics[metric].warn_drop_pct / 100
    dropped = _scale(night, metric, drop, str(target["node"]), _gpu_of(target))
    got = _target(judge(dropped, floors_fleet.baseline, floors=_floors_with(metric, target["value"] * 1.0005)), target)
    assert got["verdict"] == "fail", got["reasons"]
    assert got["reference_kind"] == "spec"
    assert "below its own baseline" in got["reasons"]
    if metric == "storage_read_gbps":
        # A node's storage reads are its storage path's (the mount, the volume), not the NVLink fabric's.
        assert got["cause"] == "storage"
        assert got["action"] == "check_storage_mount"


@pytest.mark.parametrize("metric", FLOORED)
def test_a_floor_miss_without_history_fails(floors_fleet: Floors, metric: str) -> None:
    night = floors_fleet.night(seed=902)
    target = _lowest_with_history(night, floors_fleet.baseline, metric)
    got = _target(judge(night, empty_baseline(), floors=_floors_with(metric, target["value"] * 1.0005)), target)
    assert got["verdict"] == "fail", got["reasons"]
    assert got["reference_kind"] == "spec"
    assert "no history" in got["reasons"]


@pytest.mark.parametrize("metric", GPU_LEVEL)
def test_a_floor_miss_its_node_peers_disagree_with_fails(floors_fleet: Floors, metric: str) -> None:
    """Its own history agrees, but the other GPUs of its node, against theirs, are well ahead of it."""
    night = floors_fleet.night(seed=903)
    target = _lowest_with_history(night, floors_fleet.baseline, metric)
    up = 1 + 1.5 * default_policy().metrics[metric].warn_drop_pct / 100
    node = str(target["node"])
    for gpu in range(floors_fleet.fleet.gpus_per_node):
        if gpu != _gpu_of(target):
            night = _scale(night, metric, up, node, gpu)
    got = _target(judge(night, floors_fleet.baseline, floors=_floors_with(metric, target["value"] * 1.0005)), target)
    assert got["verdict"] == "fail", got["reasons"]
    assert "behind the other GPUs of its node" in got["reasons"]


def test_a_fleet_shift_under_the_warn_drop_backs_no_floor_miss(floors_fleet: Floors) -> None:
    """A new driver 4.5 % slower on NCCL for every node: a fleet row, and the lowest node under a floor
    just above it is noise at the floor, judged against its own baseline after the shift."""
    night = floors_fleet.night(seed=908, fleet_shift={"nccl_allreduce_busbw_gbps": -0.045})
    target = _lowest_with_history(night, floors_fleet.baseline, "nccl_allreduce_busbw_gbps")
    floors = _floors_with("nccl_allreduce_busbw_gbps", target["value"] * 1.0005)
    got = _target(judge(night, floors_fleet.baseline, floors=floors), target)
    assert got["verdict"] == "warn", got["reasons"]
    assert "noise at the floor" in got["reasons"]


# --- host-side metrics -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("signal", "value"), [("pcie_gen", 4.0), ("pcie_width", 8.0), ("pcie_replays_per_min", 50.0)])
def test_an_h2d_floor_miss_with_a_pcie_signature_fails_pcie(floors_fleet: Floors, signal: str, value: float) -> None:
    night = floors_fleet.night(seed=904)
    target = _lowest_with_history(night, floors_fleet.baseline, "h2d_gbps")
    tele = (night["metric"] == signal) & (night["node"] == target["node"]) & (night["gpu"] == target["gpu"])
    night.loc[tele, "value"] = value
    got = _target(
        judge(night, floors_fleet.baseline, floors=_floors_with("h2d_gbps", target["value"] * 1.0005)), target
    )
    assert got["verdict"] == "fail"
    assert got["cause"] == "pcie"
    assert "h2d_gbps" in got["reasons"]
    assert "with its PCIe link below spec" in got["reasons"]


def test_a_node_under_a_host_floor_is_a_node_config_finding_not_a_gpu_fail(floors_fleet: Floors) -> None:
    node = floors_fleet.fleet.node_names[4]
    night = floors_fleet.night([Fault("host_contention", node=node, params={"h2d": 0.65})], seed=905)
    verdicts = judge(night, floors_fleet.baseline)
    got = row(verdicts, node)
    assert got["verdict"] == "fail", got["reasons"]
    assert (got["cause"], got["action"], got["ticket"]) == ("config", "fix_config", "remediation")
    assert got["reference_kind"] == "spec"
    assert got["metric"] in HOST_GPU
    assert "the host, not the GPUs" in got["reasons"]
    gpus = verdicts[(verdicts["node"] == node) & verdicts["gpu"].notna()]
    assert (gpus["verdict"] == "warn").all(), gpus[["gpu", "verdict", "reasons"]].to_string()
    assert (gpus["cause"] == "config").all()
    assert (gpus["action"] == "fix_config").all()
    # ... and a GPU of that node whose own link trained down still fails, on the link.
    tele = (night["metric"] == "pcie_gen") & (night["node"] == node) & (night["gpu"] == 3)
    night.loc[tele, "value"] = 4.0
    verdicts = judge(night, floors_fleet.baseline)
    assert (row(verdicts, node, 3)["verdict"], row(verdicts, node, 3)["cause"]) == ("fail", "pcie")
    others = verdicts[(verdicts["node"] == node) & verdicts["gpu"].notna() & (verdicts["gpu"] != 3)]
    assert (others["verdict"] == "warn").all()


def test_a_node_that_always_measured_under_a_host_floor_warns_config(floors_fleet: Floors) -> None:
    """Its GPUs' own baselines hold the low values (the floor rose, or the host was always misbound): no
    fail anywhere, a node warn naming the host."""
    node = floors_fleet.fleet.node_names[6]
    uuids = set(floors_fleet.fleet.gpu_table().query("node == @node")["gpu_uuid"])
    baseline = floors_fleet.baseline.copy()
    theirs = (baseline["level"] == "gpu") & baseline["key"].isin(uuids) & (baseline["metric"] == "h2d_gbps")
    baseline.loc[theirs, "center"] *= 0.8
    night = _scale(floors_fleet.night(seed=906), "h2d_gbps", 0.8, node, all_gpus=True)
    verdicts = judge(night, baseline, floors=_floors_with("h2d_gbps", 43.0))
    got = row(verdicts, node)
    assert got["verdict"] == "warn", got["reasons"]
    assert (got["cause"], got["action"], got["reference_kind"]) == ("config", "fix_config", "spec")
    assert "always measured this low" in got["reasons"]
    assert not (verdicts["verdict"] == "fail").any()


def test_a_fleet_collapsing_under_a_host_floor_fails_its_nodes_never_its_gpus(floors_fleet: Floors) -> None:
    night = floors_fleet.night(seed=907, fleet_shift={"h2d_gbps": -0.3})
    verdicts = judge(night, floors_fleet.baseline)
    nodes = verdicts[verdicts["gpu"].isna() & verdicts["peer"].isna() & verdicts["node"].notna()]
    assert (nodes["verdict"] == "fail").all()
    assert (nodes["cause"] == "config").all()
    gpus = verdicts[verdicts["gpu"].notna()]
    assert not (gpus["verdict"] == "fail").any()


# --- the floors themselves -------------------------------------------------------------------------------

#: The healthy extremes a floor must clear: the benchmark's noisiest repeats, a −2 % fleet shift, the
#: diurnal trough.
REP_SCALE, SHIFT, MARGIN_SIGMA = 1.7, -0.02, 5.0


@pytest.mark.parametrize(("model", "metric"), sorted(spec_floors()))
def test_every_shipped_floor_sits_outside_healthy_noise(model: str, metric: str) -> None:
    floor = spec_floors()[(model, metric)]
    base = MODELS[model].base.get(metric)
    if base is None:
        # FP8: the fleet model does not measure it. docs/reference/reference-values.md, "Healthy reference
        # values": cuBLASLt 1,290-1,377 TFLOPS; with BF16 GEMM's noise the floor must clear the lowest of them
        # as BF16's does its base.
        assert metric == "gemm_fp8_tflops"
        base, metric_noise = 1290.1, "gemm_bf16_tflops"
    else:
        metric_noise = metric
    noise = DEFAULT_NOISE
    unit = noise.cv_unit.get(metric_noise, 0.0) if metric_noise in GPU_PERF_METRICS else 0.0
    rep = 1.2533 * noise.cv_rep[metric_noise] * REP_SCALE / math.sqrt(3)  # the median of 3 repeats
    sigma = math.sqrt(unit**2 + noise.cv_node[metric_noise] ** 2 + rep**2)
    healthy_low = (1 + SHIFT) * (1 - noise.diurnal_amplitude)
    margin = (healthy_low - floor / base) / sigma
    assert margin >= MARGIN_SIGMA, f"{model} {metric}: floor {floor} only {margin:.1f} σ under healthy"


def test_a_healthy_fleet_at_the_trough_after_a_shift_meets_no_floor() -> None:
    fleet = Fleet.generate(nodes=64, seed=41, noise=NoiseModel(rep_scale=REP_SCALE, slow_silicon_rate=0.0))
    wave = fleet.run("noon", ts=T0.replace(hour=12), seed=4100, fleet_shift=SHIFT)
    verdicts = judge(wave.results, empty_baseline())
    assert not (verdicts["reference_kind"] == "spec").any()
