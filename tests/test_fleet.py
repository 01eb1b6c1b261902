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
from gpucert.metrics import EVENT_METRICS, METRICS, PERF_METRICS, RESULT_COLUMNS
from gpucert_sim.fleet import (
    FAULTS,
    GPU_PERF_METRICS,
    GPU_TELEMETRY_METRICS,
    LEAF_LABEL,
    MODELS,
    NIC_METRICS,
    ZONE_LABEL,
    Fault,
    Fleet,
    NoiseModel,
    Wave,
    random_faults,
)
from gpucert_sim.fleet import _faults as catalog

GEMM, HBM, H2D, D2H = GPU_PERF_METRICS
NCCL, PAIR, STORAGE = "nccl_allreduce_busbw_gbps", "nccl_pair_busbw_gbps", "storage_read_gbps"
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
    half = Fleet.generate(nodes=40, seed=5, noise=NoiseModel(transient_rate=0.0, slow_silicon_rate=0.0, rep_scale=0.5))
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
    for m in (
        "hw_slowdown_frac",
        "ecc_dbe_volatile",
        "remapped_rows_pending",
        "remapped_rows_failure",
        "nvlink_down",
        "nvlink_crc_errors",
    ):
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
    "hw_thermal": (
        {"clocks_event_reasons": has_bits(0x48), "hw_slowdown_frac": between(0.05, 0.6), "temp_max_c": between(89, 93)},
        {GEMM, HBM, NCCL},
        Counter(),
        {},
    ),
    "sw_thermal": ({"clocks_event_reasons": has_bits(0x20), "temp_max_c": between(84, 88)}, {GEMM, HBM}, Counter(), {}),
    "power_brake": (
        {"clocks_event_reasons": has_bits(0x88), "hw_slowdown_frac": between(0.05, 0.6)},
        {GEMM, HBM, NCCL},
        Counter(),
        {},
    ),
    "power_cap": ({"clocks_event_reasons": has_bits(0x04), "power_limit_w": between(400, 600)}, {GEMM}, Counter(), {}),
    "pcie_gen4": ({"pcie_gen": equals(4), "pcie_gen_max": equals(5)}, {H2D, D2H, PAIR}, Counter(), {}),
    "pcie_width": ({"pcie_width": lambda v: v in (4, 8)}, {H2D, D2H, PAIR}, Counter(), {}),
    "pcie_replay": ({"pcie_replays_per_min": between(10, 1000)}, {H2D, D2H, PAIR}, Counter(), {}),
    "nvlink_access_lost": ({"nvlink_down": equals(18)}, {NCCL}, Counter(), {}),
    "nvlink_one_down": ({"nvlink_down": equals(1)}, {NCCL}, Counter({74: 1}), {}),
    "nvswitch_degraded": ({"nvlink_down": between(1, 18)}, {NCCL}, Counter(), {}),
    "nvlink_crc": ({"nvlink_crc_errors": between(60, 60_000)}, {NCCL}, Counter(), {}),
    "sbe_storm": ({"ecc_sbe_volatile": between(100, 5000)}, {HBM}, Counter({92: 3}), {"xid92_rows": 3}),
    "remap_pending": (
        {"ecc_dbe_volatile": equals(1), "remapped_rows_pending": equals(1)},
        set(),
        Counter({48: 1, 63: 1}),
        {"crash": 0},
    ),
    "remap_failure": ({"remapped_rows_failure": equals(1)}, set(), Counter({64: 1}), {"crash": 0}),
    "uncontained_ecc": ({"ecc_dbe_volatile": between(1, 4)}, set(), Counter({95: 1}), {}),
    "fallen_off_bus": ({}, set(), Counter({79: 1}), {}),
    "gsp_timeout": ({}, set(), Counter({120: 1}), {"hang": 0, "xid": 120}),
    "slow_silicon": ({}, {GEMM, HBM}, Counter(), {}),
    "host_contention": ({}, {H2D, D2H, PAIR}, Counter(), {}),
    "ib_port_down": ({"ib_ports_active": equals(7), "ib_ports": equals(8)}, {PAIR}, Counter(), {}),
    "ib_downshift": ({"ib_rate_min_gbps": equals(200), "ib_rate_max_gbps": equals(400)}, {PAIR}, Counter(), {}),
    "nic_half_rate": (
        {"ib_rate_min_gbps": equals(200), "ib_rate_max_gbps": equals(400), "ib_ports_active": equals(8)},
        {PAIR},
        Counter(),
        {},
    ),
    "ib_flapping_port": (
        {
            "ib_link_downed": between(1, 12),
            "ib_symbol_errors": between(10, 10_000),
            "ib_rcv_errors": between(1, 200),
            "ib_rate_min_gbps": equals(400),
        },
        {PAIR},
        Counter(),
        {},
    ),
    "slow_storage": ({}, {STORAGE}, Counter(), {}),
    # A fabric fault: on no node; test_a_slow_uplink_slows_only_the_pairs_between_its_two_leaves.
    "slow_uplink": ({}, {PAIR}, Counter(), {"leaf_a": 0, "leaf_b": 1}),
}
NIC_HEALTHY = {
    "ib_ports": 8,
    "ib_ports_active": 8,
    "ib_rate_min_gbps": 400,
    "ib_rate_max_gbps": 400,
    "ib_symbol_errors": 0,
    "ib_link_downed": 0,
    "ib_rcv_errors": 0,
}


def test_every_catalog_kind_has_an_expectation() -> None:
    assert set(EXPECT) == set(FAULTS)
    # Silent data corruption is left out, and the catalog says why.
    assert "silent data corruption" in (catalog.__doc__ or "").lower()


def test_the_nic_telemetry_is_the_registry_s() -> None:
    assert set(NIC_METRICS) == set(NIC_HEALTHY)
    assert all(METRICS[m].level == "node" and METRICS[m].kind == "telemetry" for m in NIC_METRICS)


@pytest.mark.parametrize("kind", [k for k in FAULTS if FAULTS[k].scope != "fabric"])
def test_each_fault_emits_its_telemetry_and_effect(fleet: Fleet, kind: str) -> None:
    spec = FAULTS[kind]
    telemetry, lowered, expected_xids, pin = EXPECT[kind]
    node, gpu = fleet.node_names[1], (3 if spec.scope == "gpu" else None)
    fault = Fault(kind, node, gpu, pin)
    clean = fleet.run("f", ts=MIDNIGHT, seed=8, pairs=True, storage=True, nic=True).results
    faulty = fleet.run("f", ts=MIDNIGHT, seed=8, pairs=True, storage=True, nic=True, faults=[fault]).results
    targets = [gpu] if gpu is not None else list(range(fleet.gpus_per_node))
    nic = {m: ok for m, ok in telemetry.items() if m in NIC_METRICS}

    for t in targets:
        for m, ok in telemetry.items():
            if m not in nic:
                assert ok(one(faulty, node=node, gpu=t, metric=m)), (m, one(faulty, node=node, gpu=t, metric=m))
        assert xids(faulty, node, t) - xids(clean, node, t) == expected_xids
    for m, ok in nic.items():
        assert ok(one(faulty, node=node, metric=m)), (m, one(faulty, node=node, metric=m))
    # Every node's NIC telemetry but what the fault names is the healthy reading.
    nic_rows = plain(faulty[faulty["metric"].isin(NIC_METRICS)])
    untouched = nic_rows[~((nic_rows["node"] == node) & nic_rows["metric"].isin(list(nic)))]
    assert (untouched["value"] == untouched["metric"].map(NIC_HEALTHY)).all()
    assert len(nic_rows) == fleet.n_nodes * len(NIC_METRICS)

    # The effect where it belongs, and nothing else moved.
    r = perf_ratio(faulty, clean)
    on_node, on_pair = r["node"] == node, (r["node"] == node) | (r["peer"] == node)
    hit = (
        (on_node & r["gpu"].isin(targets) & r["metric"].isin(lowered & set(GPU_PERF_METRICS)))
        | (on_node & (r["metric"] == NCCL) & (NCCL in lowered))
        | (on_node & (r["metric"] == STORAGE) & (STORAGE in lowered))
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
        # which docs/design/data-contracts.md, "Results", allows at GPU or node level only)
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
    assert list(t.columns) == [
        "kind",
        "node",
        "gpu",
        "gpu_uuid",
        "scope",
        "expected_cause",
        "signature",
        "cost",
        "params",
    ]
    assert t["gpu"].dtype == "Int64"
    assert t["signature"].dtype == bool
    assert t["kind"].tolist() == [f.kind for f in faults]
    assert t["cost"].tolist() == pytest.approx([0.15, 0.75, 1 - (0.75 + 0.17 * 0.5), 1 / 8, 1.0, 0.0])
    assert t["expected_cause"].tolist() == ["thermal", "pcie", "config", "network", "xid", "row_remap"]
    assert t["signature"].tolist() == [True, True, True, True, True, True]
    assert t["scope"].tolist() == ["gpu", "gpu", "node", "node", "gpu", "gpu"]
    assert t["gpu"].isna().tolist() == [False, False, True, True, False, False]
    assert t["gpu_uuid"].isna().tolist() == t["gpu"].isna().tolist()
    assert t.loc[0, "gpu_uuid"] == fleet.uuids[1]
    assert t.loc[0, "params"]["duty"] == 0.3
    assert 0 <= t.loc[0, "params"]["over_c"] <= 4
    for kind in FAULTS:
        assert FAULTS[kind].signature == (
            kind not in {"slow_silicon", "host_contention", "slow_uplink", "slow_storage"}
        )
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
    # Every kind a default wave observes: not the fabric's (no node to land on), nor storage's (unmeasured).
    assert set(counts) == set(FAULTS) - {"slow_uplink", "slow_storage"}
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
    assert {x.kind for x in random_faults(f, 4, seed=2, kinds=["slow_storage"])} == {"slow_storage"}
    with pytest.raises(ValueError, match="placed by hand"):
        random_faults(f, 2, seed=2, kinds=["slow_uplink"])
    truth = f.run("r", ts=MIDNIGHT, seed=3, faults=faults).truth
    assert len(truth) == 63


@pytest.mark.slow
def test_a_hundred_thousand_gpus_take_seconds() -> None:
    start = time.perf_counter()
    f = Fleet.generate(nodes=12_500, seed=1)
    generated = time.perf_counter()
    wave = f.run("big", ts=MIDNIGHT, seed=2, faults=random_faults(f, 500, seed=3), pairs=True)
    done = time.perf_counter()
    print(
        f"\n100,000 GPUs: generate {generated - start:.2f} s, run {done - generated:.2f} s, {len(wave.results):,} rows"
    )
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
        assert rule.stability(metric, values[:b]).unstable == (n > b)
        assert not rule.stability(metric, values).unstable or n == top
        seen[metric, n > b] += 1
    assert seen[GEMM, True] > 0
    assert seen[NCCL, True] > 0
    assert seen[GEMM, False] > seen[GEMM, True]
    # One repeat (the simulated cluster's DCGM and fault checks) is never judged, so never extended.
    one = f.run("a", ts=MIDNIGHT, seed=8, repeats=1, repeats_of={}).results
    assert (one["repeat"] == 0).all()


# --- the fabric: leaves, listed pairs, links between leaves, NICs and storage ---------------------------


def pair_values(df: pd.DataFrame) -> dict[frozenset[str], list[float]]:
    """Each pair's values in repeat order, keyed by its two nodes whichever way round the rows name them."""
    p = plain(df[df["metric"] == PAIR]).sort_values(["node", "peer", "repeat"])
    return {frozenset((a, b)): list(g["value"]) for (a, b), g in p.groupby(["node", "peer"])}


def test_nodes_sit_under_leaves_and_zones_the_pairing_plan_reads() -> None:
    from gpucert.network import plan_rounds

    f = Fleet.generate(nodes=70, seed=1)
    topo = f.topology()
    assert list(topo.columns) == ["node", ZONE_LABEL, LEAF_LABEL]
    assert (ZONE_LABEL, LEAF_LABEL) == ("topology.kubernetes.io/zone", "gpucert.io/leaf")
    assert topo["node"].tolist() == f.node_names
    assert topo[LEAF_LABEL].value_counts().to_dict() == {**{f"leaf-{k:02d}": 8 for k in range(8)}, "leaf-08": 6}
    assert topo.groupby(ZONE_LABEL)[LEAF_LABEL].nunique().to_dict() == {"zone-a": 4, "zone-b": 4, "zone-c": 1}
    assert (f.leaf_of("gpu-node-00017"), f.zone_of("gpu-node-00017")) == ("leaf-02", "zone-a")
    assert f.leaf_number("leaf-08") == f.leaf_number(8.0) == 8
    with pytest.raises(ValueError, match="no leaf"):
        f.leaf_number("leaf-09")
    # Configurable, and kept by nodes that join: they fill the last leaf, then new ones.
    g = Fleet.generate(nodes=5, seed=1, nodes_per_leaf=4, leaves_per_zone=1).add_nodes(4, seed=2)
    assert g.topology()[LEAF_LABEL].tolist() == ["leaf-00"] * 4 + ["leaf-01"] * 4 + ["leaf-02"]
    assert g.topology()[ZONE_LABEL].tolist() == ["zone-a"] * 4 + ["zone-b"] * 4 + ["zone-c"]
    plan = plan_rounds(topo, leaf_label=LEAF_LABEL, seed=3)
    assert set(plan.nodes["leaf"]) == {f"leaf-{k:02d}" for k in range(9)}
    assert set(plan.pairs["kind"]) >= {"intra-leaf", "inter-leaf"}


def test_listed_pairs_measure_the_same_whichever_way_round_and_wherever_they_stand() -> None:
    f = Fleet.generate(nodes=24, seed=4)
    n = f.node_names
    listed = [(n[0], n[9]), (n[3], n[4]), (n[20], n[1])]
    wave = pair_values(f.run("p", ts=MIDNIGHT, seed=6, pairs=listed).results)
    assert set(wave) == {frozenset(p) for p in listed}
    # Reversed, reordered, alone, in a wave of only its two nodes: the same values every time.
    other = pair_values(f.run("p", ts=MIDNIGHT, seed=6, pairs=[(b, a) for a, b in reversed(listed)]).results)
    assert other == wave
    for a, b in listed:
        alone = f.run("p", ts=MIDNIGHT, seed=6, nodes=[a, b], pairs=[(b, a)], wave_draws=True).results
        assert pair_values(alone) == {frozenset((a, b)): wave[frozenset((a, b))]}
    # Rows name the first node of the pair as listed, the other as peer.
    df = plain(f.run("p", ts=MIDNIGHT, seed=6, pairs=listed).results)
    pairs = df[df["metric"] == PAIR]
    assert set(zip(pairs["node"], pairs["peer"], strict=True)) == set(listed)
    assert (pairs.groupby(["node", "peer"])["repeat"].apply(list) == [[0, 1, 2]] * 3).all()
    # Another seed measures afresh; noise and level as the ring's: 4 % run-to-run around ≈370 GB/s.
    assert pair_values(f.run("p", ts=MIDNIGHT, seed=7, pairs=listed).results) != wave
    many = [(n[i], n[j]) for i in range(24) for j in range(i + 1, 24)]
    values = plain(f.run("p", ts=MIDNIGHT, seed=6, pairs=many).results)
    values = values.loc[values["metric"] == PAIR, "value"]
    assert values.median() == pytest.approx(370, rel=0.02)
    assert values.std() / values.mean() == pytest.approx(0.04 * 1.1, rel=0.3)  # rep ⊕ both ends' node factor


def test_listed_pairs_that_are_no_pairs_are_refused(fleet: Fleet) -> None:
    a, b, c = fleet.node_names[:3]
    for bad, kind in (
        ([(a, a)], ValueError),
        ([(a, "nowhere")], ValueError),
        ([(a, b), (b, a)], ValueError),
        ([(a, b, c)], TypeError),
        ((a, b), TypeError),
    ):
        with pytest.raises(kind):
            fleet.run("x", ts=MIDNIGHT, seed=1, pairs=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="wave's nodes"):
        fleet.run("x", ts=MIDNIGHT, seed=1, nodes=[a, b], pairs=[(a, c)])
    assert fleet.run("x", ts=MIDNIGHT, seed=1, pairs=[]).results["metric"].ne(PAIR).all()


def test_a_slow_uplink_slows_only_the_pairs_between_its_two_leaves() -> None:
    f = Fleet.generate(nodes=24, seed=4)  # leaves 0, 1, 2
    n = f.node_names
    every = [(n[i], n[j]) for i in range(24) for j in range(i + 1, 24)]
    uplink = Fault("slow_uplink", params={"leaf_a": 2, "leaf_b": 0})
    clean = f.run("u", ts=MIDNIGHT, seed=2, pairs=every).results
    wave = f.run("u", ts=MIDNIGHT, seed=2, pairs=every, faults=[uplink])
    r = perf_ratio(wave.results, clean)
    leaf = {"": -1, **{name: f.leaf_index[i] for i, name in enumerate(n)}}
    crossing = np.array([{leaf[a], leaf[b]} == {0, 2} for a, b in zip(r["node"], r["peer"], strict=True)])
    factor = wave.truth.loc[0, "params"]["factor"]
    assert 0.4 <= factor <= 0.6
    assert r.loc[crossing & (r["metric"] == PAIR), "ratio"].to_numpy() == pytest.approx(factor)
    assert crossing.sum() == 8 * 8 * 3
    assert (r.loc[~crossing, "ratio"] == 1).all()  # every other pair, and every node's own benchmark
    t = wave.truth.iloc[0]
    assert (t["kind"], t["scope"], t["expected_cause"], t["signature"]) == ("slow_uplink", "fabric", "network", False)
    assert pd.isna(t["node"])
    assert pd.isna(t["gpu"])
    assert pd.isna(t["gpu_uuid"])
    assert (t["params"]["leaf_a"], t["params"]["leaf_b"]) == (2, 0)
    assert t["cost"] == pytest.approx(1 - factor)
    # Named leaves work as numbers do; observed only by a wave with nodes under both leaves.
    named = f.run(
        "u",
        ts=MIDNIGHT,
        seed=2,
        pairs=every,
        faults=[Fault("slow_uplink", params={"leaf_a": f.leaf_number("leaf-02"), "leaf_b": 0, "factor": 0.5})],
    )
    assert named.truth.loc[0, "params"]["factor"] == 0.5
    assert f.run("u", ts=MIDNIGHT, seed=2, nodes=n[:16], faults=[uplink]).truth.empty
    for bad in (
        Fault("slow_uplink", params={"leaf_a": 1}),
        Fault("slow_uplink", params={"leaf_a": 1, "leaf_b": 1}),
        Fault("slow_uplink", params={"leaf_a": 1, "leaf_b": 7}),
        Fault("slow_uplink", n[0], params=uplink.params),
    ):
        with pytest.raises(ValueError, match=r"."):
            f.run("u", ts=MIDNIGHT, seed=2, faults=[bad])


def test_a_nic_at_half_rate_halves_every_pair_of_its_node_and_shows_in_its_port_rates() -> None:
    f = Fleet.generate(nodes=16, seed=4)
    n = f.node_names
    every = [(n[i], n[j]) for i in range(16) for j in range(i + 1, 16)]
    fault = Fault("nic_half_rate", n[5])
    clean = f.run("h", ts=MIDNIGHT, seed=3, pairs=every, nic=True).results
    faulty = f.run("h", ts=MIDNIGHT, seed=3, pairs=every, nic=True, faults=[fault])
    r = perf_ratio(faulty.results, clean)
    mine = ((r["node"] == n[5]) | (r["peer"] == n[5])) & (r["metric"] == PAIR)
    assert mine.sum() == 15 * 3
    assert r.loc[mine, "ratio"].to_numpy() == pytest.approx(faulty.truth.loc[0, "params"]["pair"])
    assert r.loc[mine, "ratio"].between(0.45, 0.55).all()
    assert (r.loc[~mine, "ratio"] == 1).all()
    assert one(faulty.results, node=n[5], metric="ib_rate_min_gbps") == 200
    assert one(faulty.results, node=n[5], metric="ib_rate_max_gbps") == 400
    assert (rows(faulty.results, metric="ib_rate_min_gbps").set_index("node")["value"].drop(n[5]) == 400).all()


def test_a_slow_storage_mount_shows_on_that_node_s_storage_read_only() -> None:
    f = Fleet.generate(nodes=40, seed=4)
    node = f.node_names[7]
    clean = f.run("s", ts=MIDNIGHT, seed=3, storage=True).results
    faulty = f.run("s", ts=MIDNIGHT, seed=3, storage=True, faults=[Fault("slow_storage", node)])
    r = perf_ratio(faulty.results, clean)
    on = (r["node"] == node) & (r["metric"] == STORAGE)
    assert on.sum() == 3
    assert r.loc[on, "ratio"].between(0.25, 0.35).all()
    assert (r.loc[~on, "ratio"] == 1).all()
    t = faulty.truth.iloc[0]
    assert (t["scope"], t["expected_cause"], t["signature"]) == ("node", "storage", False)
    storage = rows(clean, metric=STORAGE)
    assert storage["gpu"].isna().all()
    assert storage["peer"].isna().all()
    medians = storage.groupby("node", observed=True)["value"].median()
    assert medians.median() == pytest.approx(10.0, rel=0.03)  # the 10 GB/s estimate, ±3 % node to node
    assert 0.015 < medians.std() / medians.mean() < 0.05
    # Asked for only: a default wave has no storage rows and measures the same as before.
    plain_wave = f.run("s", ts=MIDNIGHT, seed=3).results
    assert rows(plain_wave, metric=STORAGE).empty
    pd.testing.assert_frame_equal(plain(plain_wave), plain(clean[clean["metric"] != STORAGE]).reset_index(drop=True))
