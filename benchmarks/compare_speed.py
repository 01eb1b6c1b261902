"""Time and peak memory of ``gpucert compare`` on 100,000 GPUs × 3 repeats (issue 2's speed bar).

Builds, once, a 12,500-node × 8-GPU fleet's baseline (one seeding wave through ``build_baseline``, so
every GPU and node has its own baseline, plus the model reference) in a ``file://`` store, and a night's
results as Parquet with 100 injected faults. Then times, as whole commands in fresh processes:

* ``python -c "import pandas; pandas.read_parquet(RESULTS)"`` — the floor the bar is relative to;
* ``gpucert compare RESULTS --baselines STORE --out verdicts.parquet`` (and ``.csv``).

Each is run ``--runs`` times; the median wall time and the largest peak RSS (``/usr/bin/time``) are printed.
Bars: compare ≤ 5 s, ≤ 2 GB, and ≤ 5 × the pandas floor.

    python benchmarks/compare_speed.py [--gpus 100000] [--runs 3] [--workdir benchmarks/out/speed]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

T0 = dt.datetime(2026, 11, 1, 2, tzinfo=dt.UTC)


def prepare(workdir: Path, gpus: int) -> tuple[Path, str]:
    from gpucert.baseline import build_baseline
    from gpucert.fleet import Fleet, random_faults
    from gpucert.results import write_results
    from gpucert.store import empty_baseline, open_store

    results = workdir / "night.parquet"
    store_dir = workdir / "store"
    marker = workdir / f"ready-{gpus}"
    if marker.exists():
        return results, store_dir.as_uri()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    started = time.perf_counter()
    fleet = Fleet.generate(nodes=gpus // 8, seed=42)
    seed_wave = fleet.run("seed-1", ts=T0, seed=1).results
    baseline, _ = build_baseline(empty_baseline(), seed_wave)
    store = open_store(store_dir.as_uri())
    store.update(lambda _: baseline, message="speed benchmark")
    night = fleet.run(
        "night-1", ts=T0 + dt.timedelta(days=1), seed=2, faults=random_faults(fleet, 100, seed=3)
    )
    write_results(night.results, results)
    marker.touch()
    print(
        f"prepared {len(night.results):,} result rows and {len(baseline):,} baseline rows in "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )
    return results, store_dir.as_uri()


def timed(command: list[str], runs: int) -> tuple[float, float, list[float]]:
    """(median wall seconds, peak RSS MB over the runs, every wall time) of a whole command."""
    walls, peaks = [], []
    for _ in range(runs):
        proc = subprocess.run(
            ["/usr/bin/time", "-f", "%e %M", *command], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        wall, rss_kb = proc.stderr.strip().splitlines()[-1].split()
        walls.append(float(wall))
        peaks.append(int(rss_kb) / 1024)
    return statistics.median(walls), max(peaks), walls


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workdir", default="benchmarks/out/speed")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    results, store = prepare(workdir, args.gpus)
    python = sys.executable
    gpucert = str(Path(python).with_name("gpucert"))
    size = os.path.getsize(results) / 2**20

    floor, floor_rss, floor_walls = timed(
        [python, "-c", f"import pandas; pandas.read_parquet({str(results)!r})"], args.runs
    )
    print(
        f"pandas floor   : {floor:.2f} s median {floor_walls}, peak {floor_rss:.0f} MB  ({size:.1f} MB Parquet)"
    )
    for suffix in (".parquet", ".csv"):
        out = workdir / f"verdicts{suffix}"
        wall, rss, walls = timed(
            [gpucert, "compare", str(results), "--baselines", store, "--out", str(out)], args.runs
        )
        print(
            f"compare → {suffix:<8}: {wall:.2f} s median {walls}, peak {rss:.0f} MB, "
            f"{wall / floor:.2f} × the pandas floor"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
