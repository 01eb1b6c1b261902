"""Drift detection: how often it cries wolf, how soon it sees a real decline, and how fast it runs.

**Detection** (the fleet model, ``gpucert_sim.fleet``, judged the way operate judges): ``--stable`` stable
GPUs plus, per GPU metric, ``--drifting`` GPUs losing 0.5 % a night and ``--drifting`` with a 3 % step,
all on their own nodes. Baselines are built from five seeding waves by ``build_baseline`` (as
``gpucert baseline build`` does), then ``--nights`` nightly certifications of the whole fleet at a
varying hour (the diurnal term moves every GPU together) with a new driver from ``--shift-night`` on
that makes every GPU ``--shift`` slower. Every night ``drift_alarms`` runs on the history so far, with
the shipped policy. Printed: the false-alarm rate (share of stable GPUs ever flagged in the nights, on
any GPU metric; stable nodes on the all-reduce apart), and per metric the detection delay (median and
p90 nights, night 1 = the first drifted night) of the decline and of the step; then the same stable
fleet judged with the textbook k = 0.5, h = 5 (docs/design/operate.md, "Drift") and no one-run limit, and
without the fleet correction, to show what each part of the calibration buys.

**Speed** (synthetic, so that only the detector is timed; as before): 10,000 GPUs × 30 runs, 1,250
nodes × 8 GPUs → 41,250 series, 1.24 M history rows. Times, each the best of ``--repeats``:
``history_from_store`` reading the history back from 30 runs' ``results.parquet`` (3 repeats per
metric, 3.7 M result rows) in a ``file://`` store under ``--workdir``, and ``drift_alarms`` with the
CUSUM and the EWMA.

    python benchmarks/drift_speed.py [--stable 1000] [--drifting 40] [--nights 30] [--seed 1]
                                     [--gpus 10000] [--runs 30] [--repeats 5] [--workdir benchmarks/out/drift]
                                     [--only detection|speed]
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gpucert.baseline import build_baseline
from gpucert.metrics import METRICS
from gpucert.policy import Policy, default_policy, load_policy
from gpucert.store import BaselineStore, FileObjectStore, empty_baseline
from gpucert.telemetry import DRIFT_METRICS, drift_alarms, history_from_store, run_medians
from gpucert_sim.fleet import Fleet

T0 = dt.datetime(2026, 11, 1, 2, tzinfo=dt.UTC)
GPU_METRICS = tuple(m for m in DRIFT_METRICS if METRICS[m].level == "gpu")
CENTERS = {
    "gemm_bf16_tflops": 720.0,
    "hbm_copy_gbps": 4100.0,
    "h2d_gbps": 55.0,
    "d2h_gbps": 55.0,
    "nccl_allreduce_busbw_gbps": 440.0,
}


# --- detection on the fleet model ----------------------------------------------------------------------


def detection_fleet(
    stable: int, drifting: int, nights: int, seed: int, shift: float, shift_night: int
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The history of ``nights`` nightly runs, its baseline, and which GPU drifts how (``scenario``:
    ``stable``, ``decline`` or ``step``; ``metric``: the one that drifts)."""
    per_node = 8
    groups = [("stable", "", -(-stable // per_node))] + [
        (scenario, metric, -(-drifting // per_node)) for metric in GPU_METRICS for scenario in ("decline", "step")
    ]
    fleet = Fleet.generate(nodes=sum(n for _, _, n in groups), seed=seed)
    rows, first = [], 0
    for scenario, metric, count in groups:
        for node in fleet.node_names[first : first + count]:
            rows.append((node, scenario, metric))
        first += count
    plan = pd.DataFrame(rows, columns=["node", "scenario", "metric"])
    gpus = fleet.gpu_table().astype({"node": object}).merge(plan, on="node")

    rng = np.random.default_rng(seed)
    seeding = [
        fleet.run(f"seed-{i}", ts=T0 + dt.timedelta(days=i, minutes=int(rng.integers(0, 180))), seed=seed * 100 + i)
        for i in range(5)
    ]
    baseline, _ = build_baseline(
        empty_baseline(), pd.concat([w.results for w in seeding], ignore_index=True), policy=default_policy()
    )
    # A GPU the seeding runs did not pass (slow silicon warns against its peers) has no own baseline:
    # drift cannot judge it (the verdict engine's peer check does), so it is left out of every count.
    own = baseline.loc[baseline["level"] == "gpu", "key"].astype(object)
    gpus["has_baseline"] = gpus["gpu_uuid"].isin(own)

    drift_uuid = gpus[gpus["scenario"] != "stable"]
    parts = []
    for night in range(1, nights + 1):
        when = T0 + dt.timedelta(days=5 + night, minutes=int(rng.integers(0, 180)))
        wave = fleet.run(
            f"night-{night:03d}", ts=when, seed=seed * 1000 + night, fleet_shift=shift if night >= shift_night else 0.0
        )
        results = wave.results
        factor = np.ones(len(results))
        for scenario, rate in (("decline", 1 - 0.005 * night), ("step", 0.97)):
            for metric in GPU_METRICS:
                who = drift_uuid[(drift_uuid["scenario"] == scenario) & (drift_uuid["metric"] == metric)]
                hit = (results["metric"] == metric).to_numpy() & results["gpu_uuid"].isin(who["gpu_uuid"]).to_numpy()
                factor[hit] = rate
        results = results.assign(value=results["value"].to_numpy() * factor)
        parts.append(run_medians(results))
    history = pd.concat(parts, ignore_index=True)
    history = history.astype(dict.fromkeys(("run_id", "node", "gpu_uuid", "gpu_model", "metric"), "category"))
    return history, baseline, gpus


def first_flagged(history: pd.DataFrame, baseline: pd.DataFrame, policy: Policy) -> pd.DataFrame:
    """Run the detector every night on the history so far, as operate does: per series the first night
    (1-based) it was in alarm."""
    when = history["ts"].to_numpy()
    seen = []
    for n, night in enumerate(np.unique(when), start=1):
        alarms = drift_alarms(history[when <= night], baseline, policy=policy)
        seen.append(alarms[["node", "gpu_uuid", "metric"]].assign(night=n))
    every = pd.concat(seen, ignore_index=True).astype({"gpu_uuid": object, "node": object, "metric": object})
    return every.groupby(["node", "gpu_uuid", "metric"], dropna=False, as_index=False)["night"].min()


def false_alarms(first: pd.DataFrame, gpus: pd.DataFrame) -> tuple[float, int, int, int, int]:
    """(share of stable GPUs ever flagged, how many, of how many, stable nodes flagged on the node metric,
    of how many)."""
    stable = gpus[(gpus["scenario"] == "stable") & gpus["has_baseline"]]
    gpu_rows = first[first["gpu_uuid"].notna()]
    flagged = stable["gpu_uuid"].isin(gpu_rows["gpu_uuid"]).sum()
    stable_nodes = stable["node"].unique()
    node_rows = first[first["gpu_uuid"].isna()]
    nodes_flagged = int(pd.Series(stable_nodes).isin(node_rows["node"]).sum())
    return flagged / len(stable), int(flagged), len(stable), nodes_flagged, len(stable_nodes)


def delays(first: pd.DataFrame, gpus: pd.DataFrame, scenario: str, metric: str) -> tuple[float, float, int, int]:
    """(median, p90 of the first night the drifting metric alarmed, how many flagged, of how many);
    a GPU never flagged counts as later than every night."""
    who = gpus[(gpus["scenario"] == scenario) & (gpus["metric"] == metric) & gpus["has_baseline"]]
    hit = first[first["metric"] == metric].set_index("gpu_uuid")["night"]
    night = who["gpu_uuid"].map(hit).to_numpy(dtype=np.float64)
    late = np.where(np.isnan(night), np.inf, night)
    return float(np.median(late)), float(np.percentile(late, 90)), int(np.isfinite(night).sum()), len(who)


def nights_text(value: float) -> str:
    return "never" if not np.isfinite(value) else f"{value:.0f}"


def detection(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    history, baseline, gpus = detection_fleet(
        args.stable, args.drifting, args.nights, args.seed, args.shift, args.shift_night
    )
    print(
        f"fleet model: {len(gpus):,} GPUs on {gpus['node'].nunique()} nodes, {args.nights} nights, "
        f"a {args.shift * 100:+.1f} % fleet shift (new driver) from night {args.shift_night}; "
        f"{int((~gpus['has_baseline']).sum())} GPUs without an own baseline left out; "
        f"prepared in {time.perf_counter() - started:.1f} s"
    )
    policy = default_policy()
    d = policy.drift
    started = time.perf_counter()
    first = first_flagged(history, baseline, policy)
    took = time.perf_counter() - started
    rate, flagged, stable, nodes, n_nodes = false_alarms(first, gpus)
    print(
        f"policy {d.method} k = {d.k:g}, h = {d.h:g}, one-run limit {d.shewhart:g} σ "
        f"({args.nights} nightly checks in {took:.1f} s)"
    )
    print(
        f"  false alarms: {rate * 100:.2f} % of stable GPUs ever flagged in {args.nights} nights "
        f"({flagged} of {stable:,}); stable nodes on the all-reduce: {nodes} of {n_nodes}"
    )
    for scenario, words in (("decline", "-0.5 %/night"), ("step", "-3 % step")):
        for metric in GPU_METRICS:
            med, p90, hit, total = delays(first, gpus, scenario, metric)
            print(
                f"  {words:>12} {metric:<18} detection delay median {nights_text(med)}, "
                f"p90 {nights_text(p90)} nights ({hit} of {total} flagged)"
            )
    for label, overrides in (
        ("textbook k = 0.5, h = 5, no one-run limit", {"drift": {"k": 0.5, "h": 5.0, "shewhart": 1e9}}),
        ("without the fleet correction", {"fleet": {"min_gpus": 10**9, "min_nodes": 10**9}}),
    ):
        other = first_flagged(history, baseline, load_policy(None, overrides))
        rate, flagged, stable, nodes, n_nodes = false_alarms(other, gpus)
        print(
            f"  {label}: {rate * 100:.2f} % of stable GPUs ever flagged ({flagged} of {stable:,}); "
            f"stable nodes {nodes} of {n_nodes}"
        )


# --- speed on a synthetic history ----------------------------------------------------------------------


def fleet_history(gpus: int, runs: int, repeats: int, seed: int = 1) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Results rows (``repeats`` per metric and run) and the own baselines they are judged against."""
    rng = np.random.default_rng(seed)
    policy = default_policy()
    nodes = gpus // 8
    uuids = np.array([f"GPU-{g:08d}-0000-4000-8000-000000000000" for g in range(gpus)], dtype=object)
    node_names = np.array([f"gpu-node-{n:05d}" for n in range(nodes)], dtype=object)
    days = [T0 + dt.timedelta(days=r) for r in range(runs)]
    parts, base = [], []
    for metric in DRIFT_METRICS:
        center, cv = CENTERS[metric], policy.metrics[metric].cv_rep
        gpu_level = METRICS[metric].level == "gpu"
        count = gpus if gpu_level else nodes
        values = center * (1 + cv * rng.standard_normal((runs, count, repeats)))
        parts.append(
            pd.DataFrame(
                {
                    "run": np.repeat(np.arange(runs), count * repeats),
                    "node": np.tile(
                        np.repeat(node_names[np.arange(count) // 8] if gpu_level else node_names, repeats), runs
                    ),
                    "gpu": np.tile(np.repeat(np.arange(count) % 8, repeats), runs) if gpu_level else -1,
                    "gpu_uuid": np.tile(np.repeat(uuids, repeats), runs) if gpu_level else None,
                    "metric": metric,
                    "value": values.ravel(),
                    "repeat": np.tile(np.arange(repeats), runs * count),
                }
            )
        )
        base.append(
            pd.DataFrame(
                {
                    "level": "gpu" if gpu_level else "node",
                    "key": uuids if gpu_level else node_names,
                    "metric": metric,
                    "center": center,
                    "spread": center * cv,
                    "n": 5,
                    "first_ts": pd.Timestamp(T0),
                    "last_ts": pd.Timestamp(T0),
                    "stack": "{}",
                    "node": node_names[np.arange(gpus) // 8] if gpu_level else None,
                }
            )
        )
    results = pd.concat(parts, ignore_index=True)
    results["gpu"] = results["gpu"].astype("Int64").where(results["gpu"] >= 0)
    results["run_id"] = np.array([f"night-{r:03d}" for r in range(runs)], dtype=object)[results.pop("run")]
    results["ts"] = pd.to_datetime(
        np.array([d.replace(tzinfo=None) for d in days], dtype="datetime64[us]")[
            results["run_id"].str[-3:].astype(int)
        ],
        utc=True,
    )
    results["gpu_model"] = "NVIDIA H200"
    results["peer"] = None
    return results, pd.concat(base, ignore_index=True)


def best(repeats: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - started)
    return min(times), out


def speed(args: argparse.Namespace) -> None:
    started = time.perf_counter()
    results, baseline = fleet_history(args.gpus, args.runs, repeats=3)
    shutil.rmtree(args.workdir, ignore_errors=True)
    store = BaselineStore(FileObjectStore(args.workdir / "store"))
    for run_id, part in results.groupby("run_id", sort=True):
        buffer = io.BytesIO()
        part.to_parquet(buffer, index=False)
        store.write_run_file(str(run_id), part["ts"].iloc[0].date(), "results.parquet", buffer.getvalue())
    print(f"prepared {len(results):,} result rows in {args.runs} runs in {time.perf_counter() - started:.1f} s")

    t_read, history = best(max(1, args.repeats // 2), lambda: history_from_store(store, last_runs=args.runs))
    assert isinstance(history, pd.DataFrame)
    series = history.groupby(["node", "gpu", "metric"], observed=True, dropna=False).ngroups
    print(f"history_from_store: {len(history):,} rows, {series:,} series, best {t_read:.2f} s")
    for method in ("cusum", "ewma"):
        t, alarms = best(args.repeats, lambda m=method: drift_alarms(history, baseline, method=m))
        assert isinstance(alarms, pd.DataFrame)
        print(f"drift_alarms {method}: best {t * 1000:.0f} ms over {args.repeats}; {len(alarms)} series alarmed now")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--stable", type=int, default=1000, help="stable GPUs (detection)")
    parser.add_argument("--drifting", type=int, default=64, help="GPUs per metric and drift kind (detection)")
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--shift", type=float, default=-0.02, help="the fleet-wide shift of the new driver")
    parser.add_argument("--shift-night", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=10_000, help="GPUs (speed)")
    parser.add_argument("--runs", type=int, default=30, help="runs (speed)")
    parser.add_argument("--repeats", type=int, default=5, help="timing repeats (speed)")
    parser.add_argument("--workdir", type=Path, default=Path("benchmarks/out/drift"))
    parser.add_argument("--only", choices=["detection", "speed"])
    args = parser.parse_args()
    if args.only != "speed":
        detection(args)
    if args.only != "detection":
        speed(args)


if __name__ == "__main__":
    main()
