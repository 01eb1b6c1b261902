"""Time and peak memory of ``gpucert compare`` on 100,000 GPUs × 3 repeats, beside the read it is held to.

Builds, once, a 12,500-node × 8-GPU fleet's baseline (one seeding wave through ``build_baseline``, so
every GPU and node has its own baseline, plus the model reference) in a ``file://`` store, and a night's
results as Parquet with 100 injected faults (4.8 M rows: the payload's default repeats, 12 for the copy
engines). Then times, as whole commands in fresh processes, interleaved round by round so that the load of
a shared machine weighs on both alike:

* ``python -c "import pandas; pandas.read_parquet(RESULTS)"`` — the floor the bar is relative to;
* ``gpucert compare RESULTS --baselines STORE --out verdicts.parquet`` (and ``.csv``);
* compare's read alone (:data:`_READ_ALONE`): the same process set-up, imports, policy, baseline read and
  results read with every value checked, then exit. compare's time beyond it is its judging and writing,
  "the work beyond reading the input" of issue 17 when the reading is the checked one the contracts ask.

Each round gives one ratio per output (compare's wall time over that round's floor); the median ratio,
its spread over the rounds, compare's median over the fastest floor, the median wall times and CPU times
(user + system) and the largest peak RSS (``/usr/bin/time``) are printed, with the load average before
and after. Bars: compare ≤ 5 s, ≤ 2 GB, and ≤ 1.5 × the floor (issue 17: the work beyond reading the
input at most half the read itself).

On the project's 2-core KVM guest the floor swings between about 0.7 s (0.2 s of system time) and
1.2-1.6 s (0.8-0.9 s of it) for the same 26,000 page faults, most of them huge pages (950 MB): what a
fault costs the guest depends on the host at that moment (probably backing freed guest memory again).
Compare faults in small pages into one heap it reuses (``gpucert._memory.keep_freed_memory``), so its
own time is steadier (1.55-1.9 s) and its ratio swings with the floor's: read the fastest-floor ratio
beside the median.

    python benchmarks/compare_speed.py [--gpus 100000] [--runs 11] [--workdir benchmarks/out/speed]
                                       [--against TREE]

``--against TREE`` times, in the same rounds, the gpucert of another checkout (``git worktree add
/tmp/before HEAD~1``) writing Parquet, and prints this tree's time over that one's, round by round: the
A/B a change needs, since one run's wall time drifts by more than most changes move it. Both trees then
run through the same ``python -c`` launcher, taking turns to go first. (``PYTHONPATH`` cannot do this:
the editable install's finder comes before it, so both would run this tree.)
"""

from __future__ import annotations

import argparse
import compileall
import datetime as dt
import os
import shutil
import statistics
import subprocess
import sys
import time
from importlib.util import find_spec
from pathlib import Path

T0 = dt.datetime(2026, 11, 1, 2, tzinfo=dt.UTC)

#: ``python -c`` that runs the gpucert command line of the checkout named by its first argument.
_FROM_TREE = (
    "import sys; tree = sys.argv.pop(1); "
    "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in getattr(f, '__module__', '')]; "
    "sys.path.insert(0, tree); import gpucert.cli as cli; "
    "cli.console() if hasattr(cli, 'console') else sys.exit(cli.main())"
)


#: ``python -c`` that does what ``gpucert compare RESULTS --baselines STORE`` does before it judges (the
#: allocator kept, the Parquet read ahead, the same imports, the default policy, the baseline read beside
#: the results' checked read), and nothing after.
_READ_ALONE = """
import gc, sys
from gpucert import _memory, _prefetch
results, store = sys.argv[1:]
_memory.keep_freed_memory()
_prefetch.prefetch_parquet([results])
from gpucert import commands
gc.freeze()
from gpucert._background import in_background
from gpucert.policy import load_policy
from gpucert.results import results_checked_alongside
from gpucert.store import open_store
load_policy(None)
baseline = in_background(lambda: open_store(store, create=False).read(None))
with results_checked_alongside([results]):
    baseline()
"""


def prepare(workdir: Path, gpus: int) -> tuple[Path, str]:
    from gpucert.baseline import build_baseline
    from gpucert.results import write_results
    from gpucert.store import empty_baseline, open_store
    from gpucert_sim.fleet import Fleet, random_faults

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
    night = fleet.run("night-1", ts=T0 + dt.timedelta(days=1), seed=2, faults=random_faults(fleet, 100, seed=3))
    write_results(night.results, results)
    marker.touch()
    print(
        f"prepared {len(night.results):,} result rows and {len(baseline):,} baseline rows in "
        f"{time.perf_counter() - started:.1f} s",
        flush=True,
    )
    return results, store_dir.as_uri()


def timed(command: list[str]) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds: user + system, peak RSS MB) of one whole command."""
    proc = subprocess.run(["/usr/bin/time", "-f", "%e %U %S %M", *command], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    wall, user, system, rss_kb = proc.stderr.strip().splitlines()[-1].split()
    return float(wall), float(user) + float(system), int(rss_kb) / 1024


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f} (min {min(values):.2f}, max {max(values):.2f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", type=int, default=100_000)
    # Eleven rounds: the floor swings by 2x from one round to the next (see above), so fewer leave the
    # median ratio to chance.
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--workdir", default="benchmarks/out/speed")
    parser.add_argument("--against", metavar="TREE", help="another checkout's gpucert, timed beside this one")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir).resolve()
    against = Path(args.against).resolve() if args.against else None
    if against is not None and not (against / "gpucert" / "cli.py").is_file():
        parser.error(f"--against {args.against}: no gpucert/cli.py there; name a checkout of this repository")
    results, store = prepare(workdir, args.gpus)
    # gpucert's bytecode, as an installed package has it: where PYTHONDONTWRITEBYTECODE is set (a development
    # checkout on this image) every run would compile the package again, ~0.1 s no user pays.
    spec = find_spec("gpucert")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("gpucert is not installed")
    compileall.compile_dir(spec.submodule_search_locations[0], quiet=1)
    if against is not None:
        compileall.compile_dir(against / "gpucert", quiet=1)
    python = sys.executable
    gpucert = str(Path(python).with_name("gpucert"))
    size = os.path.getsize(results) / 2**20
    floor_cmd = [python, "-c", f"import pandas; pandas.read_parquet({str(results)!r})"]
    read_cmd = [python, "-c", _READ_ALONE, str(results), store]
    suffixes = (".parquet", ".csv")
    compare_cmds = {
        suffix: [gpucert, "compare", str(results), "--baselines", store, "--out", str(workdir / f"verdicts{suffix}")]
        for suffix in suffixes
    }
    if against is not None:
        # Both trees through the same launcher; the console script's own start is not what is compared.
        this_tree = Path(spec.submodule_search_locations[0]).parent
        arguments = compare_cmds[".parquet"][1:]
        compare_cmds[".parquet"] = [python, "-c", _FROM_TREE, str(this_tree), *arguments]
        compare_cmds["against"] = [python, "-c", _FROM_TREE, str(against), *arguments[:-1]]
        compare_cmds["against"].append(str(workdir / "verdicts-against.parquet"))
    load_before = os.getloadavg()
    floors: list[tuple[float, float, float]] = []
    reads: list[tuple[float, float, float]] = []
    compares: dict[str, list[tuple[float, float, float]]] = {name: [] for name in compare_cmds}
    for round_number in range(args.runs):
        floors.append(timed(floor_cmd))
        reads.append(timed(read_cmd))
        # The two trees take turns going first: what ran just before weighs on a run (see above).
        names = list(compare_cmds)
        if round_number % 2:
            names.reverse()
        for name in names:
            compares[name].append(timed(compare_cmds[name]))
    load_after = os.getloadavg()
    print(
        f"pandas floor      : wall {_spread([f[0] for f in floors])} s, CPU {_spread([f[1] for f in floors])} s, "
        f"peak {max(f[2] for f in floors):.0f} MB  ({size:.1f} MB Parquet)"
    )
    print(
        f"compare's read    : wall {_spread([r[0] for r in reads])} s, CPU {_spread([r[1] for r in reads])} s, "
        f"peak {max(r[2] for r in reads):.0f} MB; × the floor of its round: "
        f"{_spread([r[0] / f[0] for r, f in zip(reads, floors, strict=True)])}"
    )
    for suffix in suffixes:
        runs = compares[suffix]
        ratios = [c[0] / f[0] for c, f in zip(runs, floors, strict=True)]
        beyond = [(c[0] - r[0]) / r[0] for c, r in zip(runs, reads, strict=True)]
        print(
            f"compare → {suffix:<8}: wall {_spread([c[0] for c in runs])} s, CPU {_spread([c[1] for c in runs])} s, "
            f"peak {max(c[2] for c in runs):.0f} MB; × the floor of its round: {_spread(ratios)} "
            f"{[round(r, 2) for r in ratios]}; × the fastest floor: "
            f"{statistics.median(c[0] for c in runs) / min(f[0] for f in floors):.2f}; "
            f"beyond its own read, × that read: {_spread(beyond)}"
        )
    if against is not None:
        runs, before = compares[".parquet"], compares["against"]
        paired = [c[0] / b[0] for c, b in zip(runs, before, strict=True)]
        print(
            f"compare of {against} → .parquet: wall {_spread([b[0] for b in before])} s, "
            f"CPU {_spread([b[1] for b in before])} s, peak {max(b[2] for b in before):.0f} MB; "
            f"this tree's time over it: {_spread(paired)} {[round(r, 3) for r in paired]}"
        )
    print(
        f"load average (1, 5, 15 min): before {', '.join(f'{x:.2f}' for x in load_before)}; "
        f"after {', '.join(f'{x:.2f}' for x in load_after)} on {os.cpu_count()} CPUs"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
