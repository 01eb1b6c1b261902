"""How fast the simulated cluster starts and answers at fleet scale (issue 3's bars).

Prints, for a 1,000-node × 8-GPU simulator (change with --nodes/--gpus):
* time until ready: from constructing the cluster (fleet model, Node objects) to a served kubeconfig
  (bar ≤ 10 s);
* peak RSS of this process, server and client together (bar ≤ 1 GB);
* a full node list through the official client, deserialized into V1Node objects (bar ≤ 0.5 s), best and
  median of several runs, with the raw HTTP time apart so the client's share is visible;
* a benchmark Job (docs/reference/labels-taints-conditions.md shape: 8 GPUs, a hostname selector, gpucert's
  tolerations) from create, through the simulated scheduler, kubelet and Job controller, to Succeeded as seen
  by a watch, and its log read and parsed as results rows (bar ≤ 1 s), best and median over several nodes.

The cluster runs with its controllers and starts preconfigured (GPUs advertised), as ``gpucert sim up
--preconfigured`` serves it.

Figures only, no asserts: the closing note of the issue records them. Run:
``.venv/bin/python benchmarks/sim_api.py``
"""

from __future__ import annotations

import argparse
import http.client
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 1024 / 1024 if sys.platform == "darwin" else peak / 1024


def _bench_job(name: str, node: str, run_id: str) -> dict[str, Any]:
    labels = {"app.kubernetes.io/managed-by": "gpucert", "gpucert.io/run-id": run_id}
    tolerations = [
        {"key": k, "operator": "Exists", "effect": "NoSchedule"}
        for k in ("gpucert.io/uncertified", "gpucert.io/unhealthy")
    ]
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "backoffLimit": 0,
            "activeDeadlineSeconds": 600,
            "ttlSecondsAfterFinished": 3600,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "Never",
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "tolerations": tolerations,
                    "containers": [
                        {
                            "name": "bench",
                            "image": "ghcr.io/gpucert/payload:0.1",
                            "resources": {"limits": {"nvidia.com/gpu": "8"}},
                        }
                    ],
                },
            },
        },
    }


def _job_to_rows(api: Any, namespace: str, name: str, node: str) -> tuple[float, int]:
    """Seconds from creating one benchmark Job to its log parsed as rows, and the number of rows."""
    from kubernetes import client, watch

    from gpucert.results import read_results

    batch, core = client.BatchV1Api(api), client.CoreV1Api(api)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{name}.jsonl"
        t0 = time.perf_counter()
        created = batch.create_namespaced_job(namespace, _bench_job(name, node, name))
        for event in watch.Watch().stream(
            batch.list_namespaced_job,
            namespace,
            field_selector=f"metadata.name={name}",
            resource_version=created.metadata.resource_version,
            timeout_seconds=30,
        ):
            conditions = {c.type: c.status for c in event["object"].status.conditions or ()}
            if conditions.get("Complete") == "True":
                break
            if conditions.get("Failed") == "True":
                raise RuntimeError(f"benchmark Job {name} failed: {event['object'].status}")
        [pod] = core.list_namespaced_pod(namespace, label_selector=f"job-name={name}").items
        path.write_text(core.read_namespaced_pod_log(pod.metadata.name, namespace), encoding="utf-8")
        rows = len(read_results(path))
        return time.perf_counter() - t0, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    started = time.perf_counter()
    from kubernetes import client

    from gpucert_sim import SimCluster

    imported = time.perf_counter()
    sim = SimCluster(
        nodes=args.nodes, gpus=args.gpus, model="NVIDIA H200", preconfigured=True, controllers=True
    ).start()
    ready = time.perf_counter()
    try:
        api = sim.api_client()
        core = client.CoreV1Api(api)
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
        core.create_namespace({"metadata": {"name": "gpucert-bench"}})
        jobs, rows = [], 0
        step = max(1, args.nodes // args.repeats)
        for k in range(args.repeats):
            node = sim.fleet.node_names[(k * step) % args.nodes]
            took, rows = _job_to_rows(api, "gpucert-bench", f"bench-{k}", node)
            jobs.append(took)
    finally:
        sim.stop()

    print(f"simulated cluster: {args.nodes:,} nodes × {args.gpus} GPUs")
    print(
        f"  ready after construction : {ready - imported:6.2f} s   (bar ≤ 10 s; imports took "
        f"{imported - started:.2f} s more)"
    )
    print(f"  peak RSS                 : {_peak_rss_mb():6.0f} MB  (bar ≤ 1024 MB)")
    print(
        f"  list nodes, client       : {min(lists):6.3f} s best, {statistics.median(lists):.3f} s median "
        f"of {args.repeats}  (bar ≤ 0.5 s)"
    )
    print(f"  list nodes, raw HTTP     : {min(raws):6.3f} s best ({size / 1e6:.1f} MB of JSON)")
    print(
        f"  benchmark Job → rows     : {min(jobs):6.3f} s best, {statistics.median(jobs):.3f} s median "
        f"of {args.repeats}, {rows} rows a node  (bar ≤ 1 s)"
    )


if __name__ == "__main__":
    main()
