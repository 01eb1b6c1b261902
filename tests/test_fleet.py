"""The fleet model: the results contract, healthy statistics, and every fault of the catalog.

Fault tests compare a faulty wave with the healthy wave of the same seed: the model draws its noise
before it applies faults, so the two differ exactly where the fault acts, and a test can check both
that the effect is there and that nothing else moved.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np
import pandas as pd
import pytest

from gpucert._frames import RESULT_DTYPES
from gpucert.fleet import (
    FAULTS,
    GPU_PERF_METRICS,
    GPU_TELEMETRY_METRICS,
    MODELS,
    Fault,
    Fleet,
    NoiseModel,
    Wave,
    random_faults,
)
from gpucert.fleet import _faults as catalog
from gpucert.metrics import EVENT_METRICS, METRICS, PERF_METRICS, RESULT_COLUMNS

GEMM, HBM, H2D, D2H = GPU_PERF_METRICS
NCCL, PAIR = "nccl_allreduce_busbw_gbps", "nccl_pair_busbw_gbps"
MIDNIGHT = datetime(2025, 3, 1, 0, 0, tzinfo=UTC)  # the diurnal term is zero at 00:00 UTC
KEYS = ["node", "gpu", "metric", "repeat", "peer"]


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return Fleet.generate(nodes=4, seed=11)


def plain(df: pd.DataFrame) -> pd.DataFrame:
    """Keys as plain strings (empty for missing), so frames with different categories merge."""
    out = df.copy()
    for c in ("node", "peer", "gpu_uuid", "metric"):
        out[c] = out[c].astype(object).where(out[c].notna(), "").astype(str)
    out["gpu"] = out["gpu"].fillna(-1).astype(int)
    return out


def rows(df: pd.DataFrame, *, node: str | None = None, gpu: int | None = None, metric: str) -> pd.DataFrame:
    sel = df["metric"] == metric
    if node is not None:
        sel &= df["node"] == node
    if gpu is not None:
        sel &= df["gpu"] == gpu
    return df[sel.fillna(False)]


def one(df: pd.DataFrame, **kw: object) -> float:
    r = rows(df, **kw)  # type: ignore[arg-type]
    assert len(r) == 1, r
    return float(r["value"].iloc[0])


def perf_ratio(faulty: pd.DataFrame, clean: pd.DataFrame) -> pd.DataFrame:
    """faulty / clean for every performance sample present in both."""
    f, c = plain(faulty), plain(clean)
    f, c = (x[x["metric"].isin(PERF_METRICS)] for x in (f, c))
    m = f.merge(c, on=KEYS, suffixes=("_f", "_c"), validate="one_to_one")
    m["ratio"] = m["value_f"] / m["value_c"]
    return m


def xids(df: pd.DataFrame, node: str, gpu: int) -> Counter[int]:
    return Counter(rows(df, node=node, gpu=gpu, metric="xid")["value"].astype(int))


# --- the contract ------------------------------------------------------------------------------------


def test_columns_and_dtypes_match_the_contract(fleet: Fleet) -> None:
    faults = [Fault("fallen_off_bus", fleet.node_names[0], 1), Fault("power_brake", fleet.node_names[2])]
    for wave in (
        fleet.run("r1", ts=MIDNIGHT, seed=1),
        fleet.run("r2", ts=MIDNIGHT, seed=1, faults=faults, pairs=True),
        fleet.run("r3", ts=MIDNIGHT, seed=1, nodes=[]),
    ):
        df = wave.results
        assert tuple(df.columns) == RESULT_COLUMNS
        assert {c: df[c].dtype for c in df.columns} == RESULT_DTYPES
        assert set(df["metric"].dropna()) <= set(METRICS)


def test_identity_columns_follow_the_metric_levels(fleet: Fleet) -> None:
    df = fleet.run("r1", ts=MIDNIGHT, seed=1, pairs=True).results
    level = df["metric"].map({m: METRICS[m].level for m in METRICS}).astype(str)
    gpu_rows = level == "gpu"
    assert df.loc[gpu_rows, "gpu"].notna().all()
    assert df.loc[gpu_rows, "gpu_uuid"].notna().all()
    assert df.loc[~gpu_rows, "gpu"].isna().all()
    assert df.loc[~gpu_rows, "gpu_uuid"].isna().all()
    assert df.loc[level == "pair", "peer"].notna().all()
    assert df.loc[level != "pair", "peer"].isna().all()
    assert (df.loc[df["metric"].isin(GPU_TELEMETRY_METRICS), "repeat"] == 0).all()
    assert set(df.loc[df["metric"] == GEMM, "repeat"]) == {0, 1, 2}
    assert (df["gpu_model"] == "NVIDIA H200").all()
    assert (df["run_id"] == "r1").all()
    assert (df["ts"] == pd.Timestamp(MIDNIGHT)).all()
    # Each GPU index on a node has exactly one UUID, and UUIDs are unique across the fleet.
    per_gpu = df.dropna(subset=["gpu"]).groupby(["node", "gpu"], observed=True)["gpu_uuid"].nunique()
    assert (per_gpu == 1).all()


def test_no_duplicate_samples_except_events(fleet: Fleet) -> None:
    big = Fleet.generate(nodes=30, seed=3)
    faults = random_faults(big, 40, seed=4)
    df = big.run("dup", ts=MIDNIGHT, seed=9, faults=faults, pairs=True).results
    samples = plain(df[~df["metric"].isin(EVENT_METRICS)])
    assert not samples.duplicated(["run_id", *KEYS]).any()
    # ... and the events do repeat (sbe storms log several XID 92).
    assert plain(df[df["metric"] == "xid"]).duplicated(["node", "gpu", "value"]).any()


def test_same_seeds_give_the_same_frame() -> None:
    faults = [Fault("hw_thermal", "gpu-node-00001", 2), Fault("host_contention", "gpu-node-00002")]

    def wave(run_seed: int) -> Wave:
        return Fleet.generate(nodes=5, seed=7).run("d", ts=MIDNIGHT, seed=run_seed, faults=faults, pairs=True)

    a, b, c = wave(1), wave(1), wave(2)
    pd.testing.assert_frame_equal(a.results, b.results)
    pd.testing.assert_frame_equal(a.truth, b.truth)
    assert not np.array_equal(a.results["value"], c.results["value"])
    assert Fleet.generate(nodes=5, seed=7).uuids.tolist() == Fleet.generate(nodes=5, seed=7).uuids.tolist()
    assert Fleet.generate(nodes=5, seed=7).uuids.tolist() != Fleet.generate(nodes=5, seed=8).uuids.tolist()


def test_uuids_look_like_nvml_uuids_and_are_unique() -> None:
    f = Fleet.generate(nodes=50, seed=0)
    pattern = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
    assert all(pattern.match(u) for u in f.uuids)
    assert len(set(f.uuids)) == f.n_gpus == 400
    assert f.node_names[:2] == ["gpu-node-00000", "gpu-node-00001"]


def test_a_node_subset_measures_what_the_full_wave_measures(fleet: Fleet) -> None:
    full = plain(fleet.run("s", ts=MIDNIGHT, seed=3).results)
    part = plain(fleet.run("s", ts=MIDNIGHT, seed=3, nodes=[fleet.node_names[2]]).results)
    assert set(part["node"]) == {fleet.node_names[2]}
    expected = full[full["node"] == fleet.node_names[2]].reset_index(drop=True)
    pd.testing.assert_frame_equal(part.reset_index(drop=True), expected)


def test_wave_draws_measure_one_node_from_draws_of_its_own() -> None:
    """The simulator's pods (a seed per run and node) draw for their node only: the same shape of rows and
    the same faults as the whole-fleet draw, other noise, the same values every time, whatever the fleet's
    size; the whole-fleet draw of a bigger fleet would cost ~N times as much per node."""
    small, big = Fleet.generate(nodes=4, seed=11), Fleet.generate(nodes=400, seed=11)
    node = small.node_names[2]
    fault = [Fault("pcie_gen4", node, 3)]

    def rows(fleet: Fleet, **kw: object) -> pd.DataFrame:
        return plain(fleet.run("s", ts=MIDNIGHT, seed=9, nodes=[node], faults=fault, **kw).results)  # type: ignore[arg-type]

    own, whole = rows(small, wave_draws=True), rows(small)
    pd.testing.assert_frame_equal(own, rows(small, wave_draws=True))  # deterministic
    pd.testing.assert_frame_equal(own, rows(big, wave_draws=True))  # the rest of the fleet does not matter
    key = ["node", "gpu", "metric"]
    assert set(map(tuple, own[key].astype(str).to_numpy())) == set(map(tuple, whole[key].astype(str).to_numpy()))
    perf = own["metric"].isin(PERF_METRICS)
    assert not np.allclose(own.loc[perf, "value"].to_numpy()[:50], whole.loc[perf, "value"].to_numpy()[:50])
    gen = own[(own["metric"] == "pcie_gen") & (own["gpu"] == 3)]["value"]
    assert set(gen) == {4.0}  # the fault shows in the node's own draw too


# --- healthy statistics --------------------------------------------------------------------------------


def test_healthy_medians_and_spreads_follow_the_noise_model() -> None:
    noise = NoiseModel(transient_rate=0.0, slow_silicon_rate=0.0)
    f = Fleet.generate(nodes=40, seed=5, noise=noise)  # 320 GPUs
    df = f.run("h", ts=MIDNIGHT, seed=6, repeats=10).results
    base = MODELS["NVIDIA H200"].base
    for m in GPU_PERF_METRICS:
        v = rows(df, metric=m)
        assert v["value"].median() == pytest.approx(base[m], rel=0.006), m
        per_gpu = v.groupby(["node", "gpu"], observed=True)["value"]
        cv_rep = np.sqrt((per_gpu.std() / per_gpu.mean()).pow(2).mean())
        assert cv_rep == pytest.approx(noise.cv_rep[m], rel=0.1), m
        expected_between = np.sqrt(noise.cv_unit[m] ** 2 + noise.cv_node[m] ** 2 + noise.cv_rep[m] ** 2 / 10)
        means = per_gpu.mean()
        assert means.std() / means.mean() == pytest.approx(expected_between, rel=0.2), m
    nccl = rows(df, metric=NCCL).groupby("node", observed=True)["value"]
    assert nccl.median().median() == pytest.approx(base[NCCL], rel=0.01)
    cv_rep = np.sqrt((nccl.std() / nccl.mean()).pow(2).mean())
    assert cv_rep == pytest.approx(noise.cv_rep[NCCL], rel=0.15)
    # rep_scale shrinks run-to-run noise and nothing else.
    half = Fleet.generate(nodes=40, seed=5, noise=NoiseModel(transient_rate=0.0, slow_silicon_rate=0.0,
                                                             rep_scale=0.5))
    g = rows(half.run("h", ts=MIDNIGHT, seed=6, repeats=10).results, metric=GEMM)
    per_gpu = g.groupby(["node", "gpu"], observed=True)["value"]
    assert np.sqrt((per_gpu.std() / per_gpu.mean()).pow(2).mean()) == pytest.approx(0.0035, rel=0.1)


def test_healthy_telemetry_and_events() -> None:
    f = Fleet.generate(nodes=50, seed=2)
    df = f.run("t", ts=MIDNIGHT, seed=3).results
    tele = df[df["metric"].isin(GPU_TELEMETRY_METRICS)].pivot_table(
        index=["node", "gpu"], columns="metric", values="value", observed=True
    )
    assert len(tele) == f.n_gpus
    assert tele.notna().all().all()
    assert (tele["pcie_gen"] == 5).all()
    assert (tele["pcie_width"] == 16).all()
    assert (tele["pcie_gen_max"] == 5).all()
    assert (tele["pcie_width_max"] == 16).all()
    assert set(tele["clocks_event_reasons"]) == {0, 4}  # SwPowerCap is normal at TDP
    assert tele["temp_max_c"].between(45, 80).all()
    assert (tele["temp_slowdown_c"] == 89).all()
    assert (tele["power_limit_w"] == tele["power_limit_default_w"]).all()
    assert (tele["pcie_replays_per_min"] < 1).all()
    for m in ("hw_slowdown_frac", "ecc_dbe_volatile", "remapped_rows_pending", "remapped_rows_failure",
              "nvlink_down", "nvlink_crc_errors"):
        assert (tele[m] == 0).all(), m
    assert (rows(df, metric="gpu_count")["value"] == 8).all()
    assert (rows(df, metric="gpu_count_expected")["value"] == 8).all()
    assert rows(df, metric="error").empty
    # Application XIDs happen to healthy GPUs and are of the application class only.
    noisy = Fleet.generate(nodes=50, seed=2, noise=NoiseModel(app_xid_rate=0.2))
    x = rows(noisy.run("t", ts=MIDNIGHT, seed=3).results, metric="xid")
    assert 40 <= len(x) <= 120
    assert set(x["value"]) <= {13, 31, 43}


def test_diurnal_swing_and_fleet_shift_scale_perf_values(fleet: Fleet) -> None:
    clean = fleet.run("a", ts=MIDNIGHT, seed=4, pairs=True).results
    noon = perf_ratio(fleet.run("a", ts=MIDNIGHT.replace(hour=12), seed=4, pairs=True).results, clean)
    assert noon["ratio"].to_numpy() == pytest.approx(1 - 0.015)
    slower = fleet.run("a", ts=MIDNIGHT, seed=4, pairs=True, fleet_shift=-0.02).results
    r = perf_ratio(slower, clean)
    assert set(r["metric"]) == {*GPU_PERF_METRICS, NCCL, PAIR}
    assert r["ratio"].to_numpy() == pytest.approx(0.98)
    tele = ~clean["metric"].isin(PERF_METRICS)
    pd.testing.assert_frame_equal(slower[~slower["metric"].isin(PERF_METRICS)], clean[tele])
    only_hbm = perf_ratio(fleet.run("a", ts=MIDNIGHT, seed=4, fleet_shift={HBM: 0.05}).results, clean)
    assert only_hbm.loc[only_hbm["metric"] == HBM, "ratio"].to_numpy() == pytest.approx(1.05)
    assert (only_hbm.loc[only_hbm["metric"] != HBM, "ratio"] == 1).all()


def test_slow_silicon_is_baked_into_the_identity() -> None:
    f = Fleet.generate(nodes=2, seed=1, noise=NoiseModel(slow_silicon_rate=1.0))
    normal = Fleet.generate(nodes=2, seed=1, noise=NoiseModel(slow_silicon_rate=0.0))
    assert f.slow_silicon.min() >= 0.90
    assert f.slow_silicon.max() <= 0.97
    assert (normal.slow_silicon == 1).all()
    assert set(f.gpu_table()["slow_silicon"]) == set(f.slow_silicon)
    # Same seed, same noise draws: the lemon's GEMM is lower by its factor on each repeat.
    slow = f.run("x", ts=MIDNIGHT, seed=2).results
    ok = normal.run("x", ts=MIDNIGHT, seed=2).results
    r = perf_ratio(slow, ok)
    gemm = r[r["metric"] == GEMM]
    assert gemm["ratio"].to_numpy() == pytest.approx(np.repeat(f.slow_silicon, 3))
    assert (r.loc[r["metric"].isin([H2D, D2H]), "ratio"] == 1).all()


# --- fleet changes -------------------------------------------------------------------------------------


def test_replace_gpus_swaps_exactly_the_expected_share() -> None:
    f = Fleet.generate(nodes=25, seed=1)  # 200 GPUs
    g = f.replace_gpus(0.1, seed=2)
    changed = f.uuids != g.uuids
    assert changed.sum() == 20
    assert (f.unit_factors[changed] != g.unit_factors[changed]).all()
    assert (f.unit_factors[~changed] == g.unit_factors[~changed]).all()
    assert g.node_names == f.node_names
    assert (g.node_factors == f.node_factors).all()
    assert len(set(g.uuids)) == g.n_gpus
    assert (f.replace_gpus(0.0, seed=2).uuids == f.uuids).all()
    assert (f.replace_gpus(1.0, seed=2).uuids != f.uuids).all()


def test_add_nodes_extends_the_fleet() -> None:
    f = Fleet.generate(nodes=3, seed=1)
    g = f.add_nodes(2, seed=5)
    assert g.node_names == [*f.node_names, "gpu-node-00003", "gpu-node-00004"]
    assert g.n_gpus == 40
    assert (g.uuids[:24] == f.uuids).all()
    assert len(set(g.uuids)) == 40
    assert (g.unit_factors[:24] == f.unit_factors).all()
    # The old nodes measure the same in the bigger fleet.
    old = plain(f.run("a", ts=MIDNIGHT, seed=3).results)
    new = plain(g.run("a", ts=MIDNIGHT, seed=3, nodes=f.node_names).results)
    pd.testing.assert_frame_equal(new, old)


# --- faults ----------------------------------------------------------------------------------------------


def has_bits(bits: int) -> Callable[[float], bool]:
    return lambda v: int(v) & bits == bits


def equals(x: float) -> Callable[[float], bool]:
    return lambda v: v == x


def between(lo: float, hi: float) -> Callable[[float], bool]:
    return lambda v: lo <= v <= hi


# kind → (telemetry that names it, metrics it lowers, XIDs it logs on its GPU, params that keep it alive)
EXPECT: dict[str, tuple[dict[str, Callable[[float], bool]], set[str], Counter[int], dict[str, float]]] = {
    "hw_thermal": ({"clocks_event_reasons": has_bits(0x48), "hw_slowdown_frac": between(0.05, 0.6),
                    "temp_max_c": between(89, 93)}, {GEMM, HBM, NCCL}, Counter(), {}),
    "sw_thermal": ({"clocks_event_reasons": has_bits(0x20), "temp_max_c": between(84, 88)}, {GEMM, HBM},
                   Counter(), {}),
    "power_brake": ({"clocks_event_reasons": has_bits(0x88), "hw_slowdown_frac": between(0.05, 0.6)},
                    {GEMM, HBM, NCCL}, Counter(), {}),
    "power_cap": ({"clocks_event_reasons": has_bits(0x04), "power_limit_w": between(400, 600)}, {GEMM},
                  Counter(), {}),
    "pcie_gen4": ({"pcie_gen": equals(4), "pcie_gen_max": equals(5)}, {H2D, D2H, PAIR}, Counter(), {}),
    "pcie_width": ({"pcie_width": lambda v: v in (4, 8)}, {H2D, D2H, PAIR}, Counter(), {}),
    "pcie_replay": ({"pcie_replays_per_min": between(10, 1000)}, {H2D, D2H, PAIR}, Counter(), {}),
    "nvlink_access_lost": ({"nvlink_down": equals(18)}, {NCCL}, Counter(), {}),
    "nvlink_one_down": ({"nvlink_down": equals(1)}, {NCCL}, Counter({74: 1}), {}),
    "nvswitch_degraded": ({"nvlink_down": between(1, 18)}, {NCCL}, Counter(), {}),
    "nvlink_crc": ({"nvlink_crc_errors": between(60, 60_000)}, {NCCL}, Counter(), {}),
    "sbe_storm": ({"ecc_sbe_volatile": between(100, 5000)}, {HBM}, Counter({92: 3}), {"xid92_rows": 3}),
    "remap_pending": ({"ecc_dbe_volatile": equals(1), "remapped_rows_pending": equals(1)}, set(),
                      Counter({48: 1, 63: 1}), {"crash": 0}),
    "remap_failure": ({"remapped_rows_failure": equals(1)}, set(), Counter({64: 1}), {"crash": 0}),
    "uncontained_ecc": ({"ecc_dbe_volatile": between(1, 4)}, set(), Counter({95: 1}), {}),
    "fallen_off_bus": ({}, set(), Counter({79: 1}), {}),
    "gsp_timeout": ({}, set(), Counter({120: 1}), {"hang": 0, "xid": 120}),
    "slow_silicon": ({}, {GEMM, HBM}, Counter(), {}),
    "host_contention": ({}, {H2D, D2H, PAIR}, Counter(), {}),
    "ib_port_down": ({}, {PAIR}, Counter(), {}),
    "ib_downshift": ({}, {PAIR}, Counter(), {}),
}


def test_every_catalog_kind_has_an_expectation() -> None:
    assert set(EXPECT) == set(FAULTS)
    # Silent data corruption is left out, and the catalog says why.
    assert "silent data corruption" in (catalog.__doc__ or "").lower()


@pytest.mark.parametrize("kind", list(FAULTS))
def test_each_fault_emits_its_telemetry_and_effect(fleet: Fleet, kind: str) -> None:
    spec = FAULTS[kind]
    telemetry, lowered, expected_xids, pin = EXPECT[kind]
    node, gpu = fleet.node_names[1], (3 if spec.scope == "gpu" else None)
    fault = Fault(kind, node, gpu, pin)
    clean = fleet.run("f", ts=MIDNIGHT, seed=8, pairs=True).results
    faulty = fleet.run("f", ts=MIDNIGHT, seed=8, pairs=True, faults=[fault]).results
    targets = [gpu] if gpu is not None else list(range(fleet.gpus_per_node))

    for t in targets:
        for m, ok in telemetry.items():
            assert ok(one(faulty, node=node, gpu=t, metric=m)), (m, one(faulty, node=node, gpu=t, metric=m))
        assert xids(faulty, node, t) - xids(clean, node, t) == expected_xids

    # The effect where it belongs, and nothing else moved.
    r = perf_ratio(faulty, clean)
    on_node, on_pair = r["node"] == node, (r["node"] == node) | (r["peer"] == node)
    hit = (
        (on_node & r["gpu"].isin(targets) & r["metric"].isin(lowered & set(GPU_PERF_METRICS)))
        | (on_node & (r["metric"] == NCCL) & (NCCL in lowered))
        | (on_pair & (r["metric"] == PAIR) & (PAIR in lowered))
    )
    assert hit.any() == bool(lowered)
    assert (r.loc[hit, "ratio"] < 1).all(), r[hit]
    assert (r.loc[~hit, "ratio"] == 1).all(), r[~hit & (r["ratio"] != 1)]
    # Telemetry of every other GPU is untouched.
    others = ~((faulty["node"] == node) & faulty["gpu"].isin(targets).fillna(False))
    tele = faulty["metric"].isin(GPU_TELEMETRY_METRICS)
    clean_others = ~((clean["node"] == node) & clean["gpu"].isin(targets).fillna(False))
    pd.testing.assert_frame_equal(
        plain(faulty[others & tele]).reset_index(drop=True),
        plain(clean[clean_others & clean["metric"].isin(GPU_TELEMETRY_METRICS)]).reset_index(drop=True),
    )


@pytest.mark.parametrize(
    ("kind", "pin", "gpu_steps", "node_error"),
    [
        ("remap_pending", {"crash": 1}, {GEMM}, False),
        ("remap_failure", {"crash": 1}, {GEMM}, False),
        ("uncontained_ecc", {}, {GEMM}, True),
        ("gsp_timeout", {"hang": 1}, {GEMM}, True),
    ],
)
def test_crashes_write_error_rows_instead_of_values(
    fleet: Fleet, kind: str, pin: dict[str, float], gpu_steps: set[str], node_error: bool
) -> None:
    node = fleet.node_names[2]
    wave = fleet.run("c", ts=MIDNIGHT, seed=5, pairs=True, faults=[Fault(kind, node, 4, pin)])
    df = wave.results
    for m in gpu_steps:
        assert rows(df, node=node, gpu=4, metric=m).empty
    assert len(rows(df, node=node, gpu=4, metric="error")) == len(gpu_steps)
    assert len(rows(df, node=node, gpu=4, metric=HBM)) == 3  # the steps that ran keep their values
    node_errors = rows(df, node=node, metric="error")
    node_errors = node_errors[node_errors["gpu"].isna() & node_errors["peer"].isna()]
    assert len(node_errors) == int(node_error)
    assert rows(df, node=node, metric=NCCL).empty == node_error
    assert wave.truth["cost"].tolist() == [1.0]
    if node_error:  # the node's multi-node jobs die with it: its pairs have no value (and no error row,
        # which DESIGN.md allows at GPU or node level only)
        pairs = plain(df[df["metric"] == PAIR])
        assert node not in set(pairs["node"]) | set(pairs["peer"])
        assert df[(df["metric"] == "error") & df["peer"].notna()].empty


@pytest.mark.parametrize("kind", ["remap_pending", "remap_failure", "gsp_timeout"])
def test_probabilistic_crashes_happen_at_their_rate(kind: str) -> None:
    f = Fleet.generate(nodes=100, seed=1)
    faults = [Fault(kind, n, 0) for n in f.node_names]
    wave = f.run("p", ts=MIDNIGHT, seed=2, faults=faults)
    crashed = (wave.truth["cost"] == 1.0).mean()
    p = {"remap_pending": 0.3, "remap_failure": 0.5, "gsp_timeout": 0.5}[kind]
    assert crashed == pytest.approx(p, abs=0.15)
    errors = rows(wave.results, metric="error").dropna(subset=["gpu"])
    assert len(errors) == (wave.truth["cost"] == 1.0).sum()


def test_fallen_off_bus_removes_the_gpu(fleet: Fleet) -> None:
    node = fleet.node_names[3]
    wave = fleet.run("b", ts=MIDNIGHT, seed=5, faults=[Fault("fallen_off_bus", node, 6)])
    df = wave.results
    gone = rows(df, node=node, gpu=6, metric=GEMM)
    assert gone.empty
    left = df[(df["node"] == node) & (df["gpu"] == 6).fillna(False)]
    assert left["metric"].astype(str).tolist() == ["xid"]
    assert left["value"].tolist() == [79]
    assert left["gpu_uuid"].astype(str).tolist() == [str(fleet.uuids[3 * 8 + 6])]
    assert one(df, node=node, metric="gpu_count") == 7
    assert one(df, node=node, metric="gpu_count_expected") == 8
    assert rows(df, node=node, metric=NCCL).empty
    assert one(df, node=node, metric="error") == 1
    assert len(rows(df, node=node, metric=GEMM)) == 7 * 3


def test_node_nccl_follows_the_slowest_gpu(fleet: Fleet) -> None:
    node = fleet.node_names[0]
    clean = fleet.run("n", ts=MIDNIGHT, seed=1).results
    both = [Fault("nvlink_access_lost", node, 1, {"nccl": 0.05}), Fault("nvlink_one_down", node, 2)]
    worst = perf_ratio(fleet.run("n", ts=MIDNIGHT, seed=1, faults=both).results, clean)
    at_node = (worst["metric"] == NCCL) & (worst["node"] == node)
    assert worst.loc[at_node, "ratio"].to_numpy() == pytest.approx(0.05)
    stacked = [Fault("nvlink_one_down", node, 2), Fault("power_brake", node, params={"duty": 0.5})]
    r = perf_ratio(fleet.run("n", ts=MIDNIGHT, seed=1, faults=stacked).results, clean)
    nccl = r.loc[(r["metric"] == NCCL) & (r["node"] == node), "ratio"].to_numpy()
    assert nccl == pytest.approx(17 / 18 * 0.9)


def test_truth_table(fleet: Fleet) -> None:
    faults = [
        Fault("hw_thermal", fleet.node_names[0], 1, {"duty": 0.3}),
        Fault("pcie_width", fleet.node_names[0], 2, {"width": 4}),
        Fault("power_cap", fleet.node_names[1], params={"limit_w": 500}),
        Fault("ib_port_down", fleet.node_names[2]),
        Fault("fallen_off_bus", fleet.node_names[3], 0),
        Fault("remap_failure", fleet.node_names[3], 1, {"crash": 0}),
    ]
    t = fleet.run("t", ts=MIDNIGHT, seed=1, faults=faults).truth
    assert list(t.columns) == ["kind", "node", "gpu", "gpu_uuid", "scope", "expected_cause", "signature",
                               "cost", "params"]
    assert t["gpu"].dtype == "Int64"
    assert t["signature"].dtype == bool
    assert t["kind"].tolist() == [f.kind for f in faults]
    assert t["cost"].tolist() == pytest.approx([0.15, 0.75, 1 - (0.75 + 0.17 * 0.5), 1 / 8, 1.0, 0.0])
    assert t["expected_cause"].tolist() == ["thermal", "pcie", "config", "network", "xid", "row_remap"]
    assert t["signature"].tolist() == [True, True, True, False, True, True]
    assert t["scope"].tolist() == ["gpu", "gpu", "node", "node", "gpu", "gpu"]
    assert t["gpu"].isna().tolist() == [False, False, True, True, False, False]
    assert t["gpu_uuid"].isna().tolist() == t["gpu"].isna().tolist()
    assert t.loc[0, "gpu_uuid"] == fleet.uuids[1]
    assert t.loc[0, "params"]["duty"] == 0.3
    assert 0 <= t.loc[0, "params"]["over_c"] <= 4
    for kind in FAULTS:
        assert FAULTS[kind].signature == (kind not in {"slow_silicon", "host_contention", "ib_port_down",
                                                       "ib_downshift"})
    # Faults on nodes outside the wave were not observed.
    part = fleet.run("t", ts=MIDNIGHT, seed=1, faults=faults, nodes=[fleet.node_names[2]]).truth
    assert part["kind"].tolist() == ["ib_port_down"]


def test_fault_parameters_are_drawn_per_fault_and_pinned_on_request(fleet: Fleet) -> None:
    a = Fault("hw_thermal", fleet.node_names[0], 1)
    b = Fault("sw_thermal", fleet.node_names[1], 5)
    alone = fleet.run("q", ts=MIDNIGHT, seed=3, faults=[a]).truth
    with_b = fleet.run("q", ts=MIDNIGHT, seed=3, faults=[b, a]).truth
    assert alone.loc[0, "params"] == with_b.loc[1, "params"]
    other_night = fleet.run("q", ts=MIDNIGHT, seed=4, faults=[a]).truth
    assert other_night.loc[0, "params"] != alone.loc[0, "params"]
    assert 0.05 <= alone.loc[0, "params"]["duty"] <= 0.6


def test_bad_faults_and_arguments_are_refused(fleet: Fleet) -> None:
    node = fleet.node_names[0]
    for bad in (
        Fault("meltdown", node, 0),
        Fault("hw_thermal", "nowhere", 0),
        Fault("hw_thermal", node),
        Fault("hw_thermal", node, 8),
        Fault("power_brake", node, 0),
        Fault("hw_thermal", node, 0, {"dutty": 0.3}),
    ):
        with pytest.raises(ValueError, match=r"."):
            fleet.run("x", ts=MIDNIGHT, seed=1, faults=[bad])
    with pytest.raises(ValueError, match="DNS label"):
        fleet.run("Not_A_Label", ts=MIDNIGHT, seed=1)
    with pytest.raises(ValueError, match="not in the fleet"):
        fleet.run("x", ts=MIDNIGHT, seed=1, nodes=["nowhere"])
    with pytest.raises(ValueError, match="not performance metrics"):
        fleet.run("x", ts=MIDNIGHT, seed=1, fleet_shift={"temp_max_c": 0.1})
    with pytest.raises(ValueError, match="unknown GPU model"):
        Fleet.generate(nodes=1, model="NVIDIA A100")


def test_random_faults_spread_kinds_over_distinct_targets() -> None:
    f = Fleet.generate(nodes=60, seed=1)
    faults = random_faults(f, 63, seed=2)
    assert faults == random_faults(f, 63, seed=2)
    counts = Counter(x.kind for x in faults)
    assert set(counts) == set(FAULTS)
    assert max(counts.values()) - min(counts.values()) <= 1
    node_faults = [x for x in faults if FAULTS[x.kind].scope == "node"]
    gpu_faults = [x for x in faults if FAULTS[x.kind].scope == "gpu"]
    assert len({x.node for x in node_faults}) == len(node_faults)
    assert not {x.node for x in node_faults} & {x.node for x in gpu_faults}
    assert len({(x.node, x.gpu) for x in gpu_faults}) == len(gpu_faults)
    assert all(x.gpu is not None for x in gpu_faults)
    assert all(x.gpu is None for x in node_faults)
    only = random_faults(f, 10, seed=2, kinds=["pcie_gen4", "power_brake"])
    assert Counter(x.kind for x in only) == {"pcie_gen4": 5, "power_brake": 5}
    with pytest.raises(ValueError, match="do not fit"):
        random_faults(Fleet.generate(nodes=2, seed=1), 3, seed=1, kinds=["power_brake"])
    truth = f.run("r", ts=MIDNIGHT, seed=3, faults=faults).truth
    assert len(truth) == 63


@pytest.mark.slow
def test_a_hundred_thousand_gpus_take_seconds() -> None:
    start = time.perf_counter()
    f = Fleet.generate(nodes=12_500, seed=1)
    generated = time.perf_counter()
    wave = f.run("big", ts=MIDNIGHT, seed=2, faults=random_faults(f, 500, seed=3), pairs=True)
    done = time.perf_counter()
    print(f"\n100,000 GPUs: generate {generated - start:.2f} s, run {done - generated:.2f} s, "
          f"{len(wave.results):,} rows")
    assert f.n_gpus == 100_000
    assert len(wave.truth) == 500
    assert done - start < 30  # a Python loop over GPUs or rows would take minutes, not seconds


# --- the payload's adaptive repeats ---------------------------------------------------------------------


def test_repeats_that_disagree_are_drawn_again_as_the_payload_does() -> None:
    from gpucert.bench._stability import RepeatRule

    f = Fleet.generate(nodes=16, seed=4, noise=NoiseModel(transient_rate=0.3))
    adaptive = plain(f.run("a", ts=MIDNIGHT, seed=8, pairs=True).results)
    fixed = plain(f.run("a", ts=MIDNIGHT, seed=8, pairs=True, max_repeats=3).results)
    perf = adaptive[adaptive["metric"].isin(PERF_METRICS)]
    # The base repeats (three; twelve for the host copies) are the fixed wave's, to the bit; the rest too.
    rule = RepeatRule()
    base = perf["metric"].map(lambda m: rule.base(str(m))).astype(int)
    first = perf[perf["repeat"] < base].reset_index(drop=True)
    pd.testing.assert_frame_equal(first, fixed[fixed["metric"].isin(PERF_METRICS)].reset_index(drop=True))
    rest = adaptive[~adaptive["metric"].isin(PERF_METRICS)].reset_index(drop=True)
    pd.testing.assert_frame_equal(rest, fixed[~fixed["metric"].isin(PERF_METRICS)].reset_index(drop=True))
    seen: Counter[tuple[str, bool]] = Counter()
    for (_node, _gpu, metric, _peer), result in perf.groupby(["node", "gpu", "metric", "peer"]):
        values = result["value"].tolist()
        n = len(values)
        assert result["repeat"].tolist() == list(range(n))
        b, top = rule.base(metric), rule.ceiling(metric)
        assert b <= n <= top
        # More only where the base repeats disagreed; it stops once they agree, or at the maximum.
        assert rule.judge(metric, values[:b]).unstable == (n > b)
        assert not rule.judge(metric, values).unstable or n == top
        seen[metric, n > b] += 1
    assert seen[GEMM, True] > 0
    assert seen[NCCL, True] > 0
    assert seen[GEMM, False] > seen[GEMM, True]
    # One repeat (the simulated cluster's DCGM and fault checks) is never judged, so never extended.
    one = f.run("a", ts=MIDNIGHT, seed=8, repeats=1, repeats_of={}).results
    assert (one["repeat"] == 0).all()
