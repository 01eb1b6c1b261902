"""How fast the simulated cluster starts and answers at fleet scale (issue 3's bars).

Prints, for a 1,000-node × 8-GPU simulator (change with --nodes/--gpus):
* time until ready: from constructing the cluster (fleet model, Node objects) to a served kubeconfig
  (bar ≤ 10 s);
* peak RSS of this process, server and client together (bar ≤ 1 GB);
* a full node list through the official client, deserialized into V1Node objects (bar ≤ 0.5 s), best and
  median of several runs, with the raw HTTP time apart so the client's share is visible.

Figures only, no asserts: the closing note of the issue records them. Run:
``.venv/bin/python benchmarks/sim_api.py``
"""

from __future__ import annotations

import argparse
import http.client
import resource
import statistics
import sys
import time


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 / 1024 if sys.platform == "darwin" else peak / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    started = time.perf_counter()
    from kubernetes import client

    from gpucert.sim import SimCluster

    imported = time.perf_counter()
    sim = SimCluster(nodes=args.nodes, gpus=args.gpus, model="NVIDIA H200").start()
    ready = time.perf_counter()
    try:
        core = client.CoreV1Api(sim.api_client())
        lists, raws = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            items = core.list_node().items
            lists.append(time.perf_counter() - t0)
            assert len(items) == args.nodes
            conn = http.client.HTTPConnection("127.0.0.1", sim.port)
            t0 = time.perf_counter()
            conn.request("GET", "/api/v1/nodes")
            size = len(conn.getresponse().read())
            raws.append(time.perf_counter() - t0)
            conn.close()
    finally:
        sim.stop()

    print(f"simulated cluster: {args.nodes:,} nodes × {args.gpus} GPUs")
    print(f"  ready after construction : {ready - imported:6.2f} s   (bar ≤ 10 s; imports took "
          f"{imported - started:.2f} s more)")
    print(f"  peak RSS                 : {_peak_rss_mb():6.0f} MB  (bar ≤ 1024 MB)")
    print(f"  list nodes, client       : {min(lists):6.3f} s best, {statistics.median(lists):.3f} s median "
          f"of {args.repeats}  (bar ≤ 0.5 s)")
    print(f"  list nodes, raw HTTP     : {min(raws):6.3f} s best ({size / 1e6:.1f} MB of JSON)")


if __name__ == "__main__":
    main()
