"""Time and peak memory of the pairing plan and its judgement (gpucert.network) on 1,000 and 10,000 nodes.

A fleet of leaves of ``--leaf-size`` nodes (the last one smaller when it does not divide), one NIC at half
rate per 100 nodes and one slow link between two leaves (×0.6); pair results are synthetic (three repeats
per pair, 4 % run-to-run noise, 1 % per node, 0.5 % transient bad samples), made outside the timed code.
Timed, each the best of ``--repeats``: ``plan_rounds``; ``pair_findings`` on the plan's results; ``repairs``;
and ``pair_findings`` again on the plan extended with the re-pairing round and its results (what certify
does after the re-pairing). Each size runs in a fresh process, so its peak RSS (``ru_maxrss``) is its own;
the RSS after the imports is printed beside it.

Bar (issue 14): the plan and its judgement add at most 2× today's certify time on 1,000 nodes, so they
must stay well under a second or two.

    python benchmarks/pairing_speed.py [--nodes 1000 10000] [--leaf-size 32] [--repeats 3] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from gpucert.network import pair_findings, plan_rounds, repairs

LEAF = "gpucert.io/leaf"


def _fleet(nodes: int, leaf_size: int) -> pd.DataFrame:
    index = np.arange(nodes)
    return pd.DataFrame({"node": [f"node-{i:05d}" for i in index], LEAF: [f"leaf-{i // leaf_size:03d}" for i in index]})


class _Fabric:
    """Pair bandwidth, vectorised: a base, both ends' node factors, the slower end's NIC, the leaves' link."""

    def __init__(self, nodes: pd.DataFrame, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.index = pd.Index(nodes["node"])
        n = len(nodes)
        self.factor = 1 + rng.standard_normal(n) * 0.01
        self.nic = np.ones(n)
        self.nic[rng.choice(n, max(1, n // 100), replace=False)] = 0.5
        self.leaf = pd.factorize(nodes[LEAF])[0]
        leaves = int(self.leaf.max()) + 1
        self.link = np.ones((leaves, leaves))
        a, b = rng.choice(leaves, 2, replace=False)
        self.link[a, b] = self.link[b, a] = 0.6
        self.slow_link = (int(a), int(b))

    def across_link(self, pairs: pd.DataFrame) -> int:
        """How many of ``pairs`` cross the slow link (none: it cannot be seen)."""
        a = self.leaf[self.index.get_indexer(pd.Index(pairs["node"]))]
        b = self.leaf[self.index.get_indexer(pd.Index(pairs["peer"]))]
        return int(
            np.sum(np.minimum(a, b) * 100_000 + np.maximum(a, b) == min(self.slow_link) * 100_000 + max(self.slow_link))
        )

    def measure(self, pairs: pd.DataFrame, repeats: int = 3) -> pd.DataFrame:
        a = self.index.get_indexer(pd.Index(pairs["node"]))
        b = self.index.get_indexer(pd.Index(pairs["peer"]))
        level = self.factor[a] * self.factor[b] * np.minimum(self.nic[a], self.nic[b])
        level *= self.link[self.leaf[a], self.leaf[b]]
        rep = 1 + self.rng.standard_normal((len(a), repeats)) * 0.04
        rep *= np.where(self.rng.random(rep.shape) < 0.005, self.rng.uniform(0.7, 0.95, rep.shape), 1.0)
        return pd.DataFrame(
            {
                "node": np.repeat(pairs["node"].to_numpy(), repeats),
                "peer": np.repeat(pairs["peer"].to_numpy(), repeats),
                "repeat": np.tile(np.arange(repeats), len(a)),
                "value": (370.0 * level[:, None] * rep).ravel(),
            }
        )


def _best(step: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    times, out = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        out = step()
        times.append(time.perf_counter() - started)
    return min(times), out


def measure(nodes: int, leaf_size: int, repeats: int, seed: int) -> dict[str, Any]:
    """One size: the timings, the counts, and the peak RSS of this process."""
    rss_imports = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    fleet = _fleet(nodes, leaf_size)
    fabric = _Fabric(fleet, seed)
    t_plan, plan = _best(lambda: plan_rounds(fleet, leaf_label=LEAF, seed=seed), repeats)
    results = fabric.measure(plan.pairs)
    t_judge, first = _best(lambda: pair_findings(results, plan), repeats)
    t_repairs, more = _best(lambda: repairs(first, plan, seed=seed), repeats)
    full = plan.extended(more)
    everything = pd.concat([results, fabric.measure(more.pairs)], ignore_index=True)
    t_again, final = _best(lambda: pair_findings(everything, full), repeats)
    return {
        "nodes": nodes,
        "leaves": int(fleet[LEAF].nunique()),
        "pairs": len(plan.pairs),
        "rounds": plan.rounds,
        "samples": len(results),
        "plan_s": t_plan,
        "judge_s": t_judge,
        "repairs_s": t_repairs,
        "rejudge_s": t_again,
        "total_s": t_plan + t_judge + t_repairs + t_again,
        "suspects": len(first.suspects),
        "repaired_pairs": len(more.pairs),
        "culprits": len(set(final.culprits) & set(fabric.index[fabric.nic < 1])),
        "healthy_named": len(set(final.culprits) - set(fabric.index[fabric.nic < 1])),
        "nics": int((fabric.nic < 1).sum()),
        "link_pairs": fabric.across_link(plan.pairs),
        "uplinks": len(final.uplinks),
        "still_pending": final.pending,
        "rss_imports_mib": rss_imports,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--leaf-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a child: one size, JSON out
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.nodes[0], args.leaf_size, args.repeats, args.seed)))
        return
    print(
        f"{'nodes':>6} {'leaves':>6} {'pairs':>6} {'rounds':>6} {'plan s':>7} {'judge s':>7} {'repair s':>8} "
        f"{'rejudge s':>9} {'total s':>7} {'RSS MiB':>15}  found"
    )
    for nodes in args.nodes:
        child = subprocess.run(
            [
                sys.executable,
                __file__,
                "--one",
                "--nodes",
                str(nodes),
                "--leaf-size",
                str(args.leaf_size),
                "--repeats",
                str(args.repeats),
                "--seed",
                str(args.seed),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        r = json.loads(child.stdout)
        print(
            f"{r['nodes']:>6} {r['leaves']:>6} {r['pairs']:>6} {r['rounds']:>6} {r['plan_s']:>7.3f} "
            f"{r['judge_s']:>7.3f} {r['repairs_s']:>8.3f} {r['rejudge_s']:>9.3f} {r['total_s']:>7.3f} "
            f"{r['peak_rss_mib']:>6.0f} ({r['rss_imports_mib']:.0f} base)  "
            f"{r['culprits']}/{r['nics']} NICs (+{r['healthy_named']} healthy), {r['uplinks']}/1 uplink "
            f"({r['link_pairs']} planned pairs cross it), re-pairing {r['repaired_pairs']} pairs for "
            f"{r['suspects']} suspects{'; still pending' if r['still_pending'] else ''}"
        )


if __name__ == "__main__":
    main()
