"""Baselines: seeded from passing runs, then held; the model reference trimmed the SuperBench way."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pytest

from gpucert.baseline import build_baseline, forget, trimmed_mean
from gpucert.fleet import Fault, Fleet
from gpucert.store import empty_baseline

from .conftest import T0, seed_waves


def own(table: pd.DataFrame, key: str, metric: str) -> pd.Series:
    hit = table[(table["key"] == key) & (table["metric"] == metric)]
    assert len(hit) == 1
    return hit.iloc[0]


def test_trimmed_mean_drops_rule_breakers_until_nothing_drops() -> None:
    samples = np.array([100.0] * 20 + [101.0] * 20 + [60.0, 150.0])
    center, spread, kept = trimmed_mean(samples, 5.0)
    assert kept == 40
    assert center == pytest.approx(100.5)
    assert spread == pytest.approx(np.std([100.0] * 20 + [101.0] * 20, ddof=1))
    assert trimmed_mean(np.array([np.nan]), 5.0)[2] == 0


def test_own_baselines_seed_over_five_passing_runs_then_hold() -> None:
    fleet = Fleet.generate(nodes=12, seed=3)
    table = empty_baseline()
    uuid = str(fleet.uuids[0])
    centers = []
    for i in range(7):
        wave = fleet.run(f"w-{i}", ts=T0 + dt.timedelta(days=i), seed=50 + i).results
        table, report = build_baseline(table, wave)
        row = own(table, uuid, "gemm_bf16_tflops")
        centers.append(row["center"])
        assert row["n"] == min(i + 1, 5)
    assert centers[5] == centers[4] == centers[6]  # held once five runs seeded it
    assert report.held > 0
    node = own(table, fleet.node_names[0], "nccl_allreduce_busbw_gbps")
    assert node["level"] == "node"
    assert node["n"] == 5
    gpu_row = own(table, uuid, "gemm_bf16_tflops")
    assert gpu_row["node"] == fleet.node_names[0]


def test_a_failing_gpu_never_teaches_its_baseline() -> None:
    fleet = Fleet.generate(nodes=12, seed=4)
    node = fleet.node_names[2]
    faulty = [Fault("slow_silicon", node=node, gpu=1, params={"gemm": 0.8, "hbm": 1.0})]
    waves = pd.concat(
        [
            fleet.run(f"w-{i}", ts=T0 + dt.timedelta(days=i), seed=60 + i, faults=faulty).results
            for i in range(3)
        ],
        ignore_index=True,
    )
    table, report = build_baseline(empty_baseline(), waves)
    uuid = str(fleet.uuids[2 * 8 + 1])
    assert table[(table["key"] == uuid)].empty
    assert report.rejected >= 3
    healthy = str(fleet.uuids[2 * 8 + 2])
    assert own(table, healthy, "gemm_bf16_tflops")["n"] == 3


def test_a_build_merges_keys_absent_from_its_input_keep_their_values() -> None:
    fleet = Fleet.generate(nodes=12, seed=5)
    first, _ = build_baseline(empty_baseline(), seed_waves(fleet, 2, seed=70))
    part = fleet.run("later", ts=T0 + dt.timedelta(days=9), seed=79, nodes=fleet.node_names[:10]).results
    merged, _ = build_baseline(first, part)
    absent = str(fleet.uuids[11 * 8])
    pd.testing.assert_series_equal(
        own(first, absent, "hbm_copy_gbps"), own(merged, absent, "hbm_copy_gbps"), check_names=False
    )
    present = str(fleet.uuids[0])
    assert own(merged, present, "hbm_copy_gbps")["n"] == 3


def test_the_model_reference_is_rebuilt_from_passing_results() -> None:
    fleet = Fleet.generate(nodes=16, seed=6)
    table, report = build_baseline(empty_baseline(), seed_waves(fleet, 2, seed=80))
    model = own(table, "NVIDIA H200", "gemm_bf16_tflops")
    assert model["level"] == "model"
    assert 700 < model["center"] < 760
    assert model["n"] > 100
    assert report.models >= 5


def test_forget_drops_a_nodes_own_baselines_and_its_gpus() -> None:
    fleet = Fleet.generate(nodes=12, seed=7)
    table, _ = build_baseline(empty_baseline(), seed_waves(fleet, 1, seed=90))
    node = fleet.node_names[3]
    kept, dropped = forget(table, [node])
    assert dropped == 8 * 4 + 1
    assert not kept["key"].eq(node).any()
    assert not kept["node"].eq(node).any()
    assert len(kept) == len(table) - dropped
