"""What the simulated cluster spends to write one benchmark pod's log, at fleet scale.

Each benchmark pod of the simulator runs a one-node wave of the fleet model (``Fleet.run(nodes=[node],
wave_draws=True)``, NIC telemetry on, as the payload reads it by default) and writes its rows as the
payload prints them (``benchmark_lines``: the "repeats disagree" lines, then the JSON lines). A
10,000-node certify does that 10,000 times in the simulator's one event loop, beside the pair pods, so a
cost that grows with the fleet makes the whole benchmark O(N²). Prints, per fleet size, the median over
three rounds of the time a pod takes (the wave, and the log apart), after one warm-up round.

Figures only, no asserts. Run: ``.venv/bin/python benchmarks/sim_pod_logs.py [--nodes 1000 10000]
[--pods 200]``
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time

from gpucert.bench._stability import RepeatRule
from gpucert_sim._benchlogs import benchmark_lines
from gpucert_sim.fleet import Fleet

TS = dt.datetime(2026, 11, 1, 2, tzinfo=dt.UTC)


def one_round(fleet: Fleet, nodes: list[str], rule: RepeatRule) -> tuple[float, float]:
    """Seconds a pod takes on average: (the one-node wave, its log)."""
    wave_s = log_s = 0.0
    for i, node in enumerate(nodes):
        t0 = time.perf_counter()
        rows = fleet.run(
            "bench-pods",
            ts=TS,
            seed=i,
            nodes=[node],
            wave_draws=True,
            nic=True,
            repeats=rule.repeats,
            max_repeats=rule.max_repeats,
            repeats_of=dict(rule.repeats_of),
        ).results
        t1 = time.perf_counter()
        benchmark_lines(rows, rule)
        wave_s += t1 - t0
        log_s += time.perf_counter() - t1
    return wave_s / len(nodes), log_s / len(nodes)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000], help="fleet sizes")
    parser.add_argument("--pods", type=int, default=200, help="pods timed per round")
    args = parser.parse_args()
    rule = RepeatRule()
    for size in args.nodes:
        fleet = Fleet.generate(nodes=size, seed=3)
        nodes = fleet.node_names[: min(args.pods, size)]
        one_round(fleet, nodes, rule)
        rounds = [one_round(fleet, nodes, rule) for _ in range(3)]
        wave = statistics.median(r[0] for r in rounds) * 1e3
        log = statistics.median(r[1] for r in rounds) * 1e3
        print(
            f"{size:>6,} nodes: {wave + log:5.2f} ms a pod (wave {wave:.2f}, log {log:.2f}), "
            f"median of 3 rounds of {len(nodes)} pods"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
