"""Time of drift detection on a fleet's history: 10,000 GPUs × 30 runs (issue 6's "well under a second").

Synthetic, so that only the detector is timed: per GPU the median of each of the four GPU performance
metrics per run, per node the all-reduce median, noise at the policy's cv_rep against known baselines
(1,250 nodes × 8 GPUs → 41,250 series, 1.24 M history rows). Times, each the best of ``--repeats``:

* ``drift_alarms`` with the lower CUSUM (k = 0.5, h = 5) and the lower EWMA (λ = 0.2, L = 3);
* ``history_from_store``: the same history read back from 30 runs' ``results.parquet`` (3 repeats per
  metric, 3.7 M result rows) in a ``file://`` store under ``--workdir``.

It also prints how many series alarm on the last run (pure noise: about series × P(RL ≤ 30) / ARL0 ever,
fewer at once). No bar is asserted; the figures are for the report.

    python benchmarks/drift_speed.py [--gpus 10000] [--runs 30] [--repeats 5] [--workdir benchmarks/out/drift]
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd

from gpucert.metrics import METRICS
from gpucert.policy import default_policy
from gpucert.store import BaselineStore, FileObjectStore
from gpucert.telemetry import DRIFT_METRICS, drift_alarms, history_from_store

T0 = dt.datetime(2026, 11, 1, 2, tzinfo=dt.UTC)
CENTERS = {
    "gemm_bf16_tflops": 720.0,
    "hbm_copy_gbps": 4100.0,
    "h2d_gbps": 55.0,
    "d2h_gbps": 55.0,
    "nccl_allreduce_busbw_gbps": 440.0,
}


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
                        np.repeat(node_names[np.arange(count) // 8] if gpu_level else node_names, repeats),
                        runs,
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


def best(repeats: int, fn: object) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        out = fn()  # type: ignore[operator]
        times.append(time.perf_counter() - started)
    return min(times), out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workdir", type=Path, default=Path("benchmarks/out/drift"))
    args = parser.parse_args()

    started = time.perf_counter()
    results, baseline = fleet_history(args.gpus, args.runs, repeats=3)
    shutil.rmtree(args.workdir, ignore_errors=True)
    store = BaselineStore(FileObjectStore(args.workdir / "store"))
    for run_id, part in results.groupby("run_id", sort=True):
        buffer = io.BytesIO()
        part.to_parquet(buffer, index=False)
        store.write_run_file(str(run_id), part["ts"].iloc[0].date(), "results.parquet", buffer.getvalue())
    print(
        f"prepared {len(results):,} result rows in {args.runs} runs in {time.perf_counter() - started:.1f} s"
    )

    t_read, history = best(max(1, args.repeats // 2), lambda: history_from_store(store, last_runs=args.runs))
    assert isinstance(history, pd.DataFrame)
    series = history.groupby(["node", "gpu", "metric"], observed=True, dropna=False).ngroups
    print(f"history_from_store: {len(history):,} rows, {series:,} series, best {t_read:.2f} s")
    for method in ("cusum", "ewma"):
        t, alarms = best(args.repeats, lambda m=method: drift_alarms(history, baseline, method=m))
        assert isinstance(alarms, pd.DataFrame)
        print(
            f"drift_alarms {method}: best {t * 1000:.0f} ms over {args.repeats}; {len(alarms)} series alarmed now"
        )


if __name__ == "__main__":
    main()
