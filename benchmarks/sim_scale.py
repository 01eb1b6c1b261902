"""The simulated cluster at fleet scale (issue 17, item 6): start, memory, list and watch at 10,000 nodes.

Starts ``gpucert sim up --nodes N --preconfigured`` as its own process (default N = 10,000 × 8 GPUs) and
measures it from outside, as a client would see it:

* start: from launching the command to the kubeconfig written (the API answers), and to the stack's
  DaemonSets reporting every pod Ready (the simulated controllers have nothing left to do) — bar ≤ 60 s;
* memory: the sim process's peak RSS (``VmHWM`` in ``/proc``), after start and at the end — bar ≤ 4 GB;
* list all nodes: one unpaged GET (seconds, bytes), and through gpucert's own client (:class:`gpucert.kube.Kube`,
  pages of 500, JSON parsed), best and median of several;
* a watch of nodes receiving a burst of N label patches (one per node, from several connections at once):
  latency from sending a patch to its MODIFIED event arriving on the watch, p50/p99/max, the longest gap
  between two events during the burst and whether every event arrived (no stall);
* pods by label selector among every pod of the cluster: all the exporter DaemonSet's pods (N of them,
  paged), one pod by a label only it has (what certify asks of each Job it waits on), and one node's pods
  by ``fieldSelector=spec.nodeName``.

Prints what it measured; asserts nothing. Run (on 2 cores a 10,000-node run takes a few minutes):
``.venv/bin/python benchmarks/sim_scale.py [--nodes 10000] [--gpus 8] [--repeats 5]``
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

_NAMESPACE = "gpucert-system"  # the stack's namespace in a preconfigured cluster (gpucert_sim.STACK_NAMESPACE)
_BURST_LABEL = "bench.gpucert.io/burst"
_PROBE_LABEL = "bench.gpucert.io/probe"
_PROBE_NAMESPACE = "gpucert-bench"


class Sim:
    """A ``gpucert sim up`` process and a way to talk to it."""

    def __init__(self, nodes: int, gpus: int, workdir: Path, seed: int | None = None) -> None:
        self.kubeconfig = workdir / "kubeconfig"
        self.log = (workdir / "sim.log").open("w")
        command = [
            sys.executable,
            "-c",
            "import sys; from gpucert.cli import main; sys.exit(main())",
            "sim",
            "up",
            "--nodes",
            str(nodes),
            "--gpus",
            str(gpus),
            "--preconfigured",
            "--kubeconfig",
            str(self.kubeconfig),
            *(["--seed", str(seed)] if seed is not None else []),
        ]
        self.launched = time.perf_counter()
        self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
        self.port = 0

    def wait_for_kubeconfig(self, timeout_s: float) -> float:
        """Seconds from launch until the kubeconfig exists (the server answers by then)."""
        end = time.perf_counter() + timeout_s
        while not self.kubeconfig.exists():
            if self.proc.poll() is not None:
                self.log.flush()
                tail = Path(self.log.name).read_text(errors="replace").strip().splitlines()[-5:]
                raise SystemExit(f"sim_scale: gpucert sim up exited {self.proc.returncode}: " + " | ".join(tail))
            if time.perf_counter() > end:
                raise SystemExit(f"sim_scale: no kubeconfig after {timeout_s:.0f} s")
            time.sleep(0.05)
        took = time.perf_counter() - self.launched
        server = yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        self.port = int(urllib.parse.urlparse(server).port or 80)
        return took

    def conn(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def peak_rss_mb(self) -> float:
        return _status_kb(self.proc.pid, "VmHWM") / 1024

    def rss_mb(self) -> float:
        return _status_kb(self.proc.pid, "VmRSS") / 1024

    def cpu_s(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def _status_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/{pid}/status")


def _get(conn: http.client.HTTPConnection, path: str) -> bytes:
    conn.request("GET", path)
    response = conn.getresponse()
    body = response.read()
    if response.status != 200:
        raise RuntimeError(f"GET {path}: {response.status} {body[:200]!r}")
    return body


def _send(conn: http.client.HTTPConnection, method: str, path: str, body: Any, content_type: str) -> bytes:
    conn.request(method, path, body=orjson.dumps(body), headers={"Content-Type": content_type})
    response = conn.getresponse()
    data = response.read()
    if response.status >= 300:
        raise RuntimeError(f"{method} {path}: {response.status} {data[:200]!r}")
    return data


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def _rolled_out(sim: Sim, nodes: int, timeout_s: float) -> tuple[float, int]:
    """Seconds from launch until every DaemonSet of the stack has all its ``nodes`` pods Ready, and how many
    DaemonSets there are."""
    end = time.perf_counter() + timeout_s
    conn = sim.conn()
    while True:
        items = orjson.loads(_get(conn, f"/apis/apps/v1/namespaces/{_NAMESPACE}/daemonsets"))["items"]
        statuses = [d.get("status") or {} for d in items]
        if items and all(
            s.get("desiredNumberScheduled") == s.get("numberReady") and s.get("desiredNumberScheduled", 0) > 0
            for s in statuses
        ):
            conn.close()
            return time.perf_counter() - sim.launched, len(items)
        if time.perf_counter() > end:
            raise SystemExit(f"sim_scale: DaemonSets not rolled out after {timeout_s:.0f} s: {statuses}")
        time.sleep(0.25)


def _idle(sim: Sim, timeout_s: float) -> float:
    """Seconds from launch until the sim uses under 5 % of a core over half a second."""
    end = time.perf_counter() + timeout_s
    before = sim.cpu_s()
    while time.perf_counter() < end:
        time.sleep(0.5)
        now = sim.cpu_s()
        if now - before < 0.025:
            return time.perf_counter() - sim.launched - 0.5
        before = now
    return float("nan")


def _list_nodes(sim: Sim, nodes: int, repeats: int) -> dict[str, Any]:
    from gpucert.kube import connect

    conn = sim.conn()
    raw, size = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        body = _get(conn, "/api/v1/nodes")
        raw.append(time.perf_counter() - t0)
        size = len(body)
        count = len(orjson.loads(body)["items"])
        if count != nodes:
            raise SystemExit(f"sim_scale: listed {count} nodes, expected {nodes}")
    conn.close()
    kube = connect(sim.kubeconfig)
    paged = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        count = len(kube.list_objects("v1", "Node"))
        paged.append(time.perf_counter() - t0)
        if count != nodes:
            raise SystemExit(f"sim_scale: Kube listed {count} nodes, expected {nodes}")
    return {"raw": raw, "bytes": size, "kube": paged}


def _watch_burst(sim: Sim, names: Sequence[str], senders: int, timeout_s: float) -> dict[str, Any]:
    """Patch every node's labels once while a watch of nodes reads the events; latencies per node."""
    conn = sim.conn()
    rv = orjson.loads(_get(conn, "/api/v1/nodes?limit=1"))["metadata"]["resourceVersion"]
    mark = f"b{time.monotonic_ns()}"
    sent: dict[str, float] = {}
    received: dict[str, float] = {}
    arrivals: list[float] = []
    opened = threading.Event()
    failure: list[BaseException] = []

    def watch() -> None:
        try:
            wconn = sim.conn()
            wconn.request("GET", f"/api/v1/nodes?watch=true&resourceVersion={rv}&timeoutSeconds={int(timeout_s)}")
            response = wconn.getresponse()
            opened.set()
            while len(received) < len(names):
                line = response.readline()
                if not line:
                    return
                at = time.perf_counter()
                event = orjson.loads(line)
                obj = event["object"]
                labels = (obj.get("metadata") or {}).get("labels") or {}
                if event["type"] == "MODIFIED" and labels.get(_BURST_LABEL) == mark:
                    received.setdefault(obj["metadata"]["name"], at)
                    arrivals.append(at)
            wconn.close()
        except BaseException as exc:
            failure.append(exc)
            opened.set()

    reader = threading.Thread(target=watch, name="sim-scale-watch", daemon=True)
    reader.start()
    opened.wait(30)
    patch = {"metadata": {"labels": {_BURST_LABEL: mark}}}

    def send(chunk: Sequence[str]) -> None:
        pconn = sim.conn()
        for name in chunk:
            sent[name] = time.perf_counter()
            _send(pconn, "PATCH", f"/api/v1/nodes/{name}", patch, "application/merge-patch+json")
        pconn.close()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(senders) as pool:
        list(pool.map(send, [names[i::senders] for i in range(senders)]))
    patched = time.perf_counter() - t0
    reader.join(timeout_s)
    drained = time.perf_counter() - t0
    if failure:
        raise SystemExit(f"sim_scale: the watch failed: {failure[0]!r}")
    latencies = [received[n] - sent[n] for n in names if n in received]
    gaps = [b - a for a, b in itertools.pairwise(arrivals)]
    return {
        "patched_s": patched,
        "drained_s": drained,
        "received": len(received),
        "latencies": latencies,
        "max_gap": max(gaps, default=0.0),
    }


def _probe_pods(sim: Sim, names: Sequence[str], count: int) -> list[str]:
    """Create ``count`` pods, each with a label only it has, on the first nodes; returns their label values."""
    conn = sim.conn()
    _send(
        conn,
        "POST",
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": _PROBE_NAMESPACE}},
        "application/json",
    )
    values = []
    for i in range(count):
        value = f"p{i:04d}"
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": f"probe-{i:04d}", "labels": {_PROBE_LABEL: value}},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": names[i % len(names)]},
                "containers": [{"name": "probe", "image": "registry.k8s.io/pause:3.9"}],
            },
        }
        _send(conn, "POST", f"/api/v1/namespaces/{_PROBE_NAMESPACE}/pods", pod, "application/json")
        values.append(value)
    conn.close()
    return values


def _timed_get(conn: http.client.HTTPConnection, path: str) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    body = _get(conn, path)
    return time.perf_counter() - t0, orjson.loads(body)


def _pod_lists(sim: Sim, names: Sequence[str], probes: Sequence[str], repeats: int) -> dict[str, Any]:
    conn = sim.conn()
    t0 = time.perf_counter()
    body = _get(conn, "/api/v1/pods")
    took = time.perf_counter() - t0
    total, size = len(orjson.loads(body)["items"]), len(body)
    selector = urllib.parse.quote("app.kubernetes.io/component=dcgm-exporter")
    paged, matched = [], 0
    for _ in range(repeats):
        t0, token, matched = time.perf_counter(), "", 0
        while True:
            query = f"labelSelector={selector}&limit=500" + (f"&continue={token}" if token else "")
            page = orjson.loads(_get(conn, f"/api/v1/pods?{query}"))
            matched += len(page["items"])
            token = page["metadata"].get("continue") or ""
            if not token:
                break
        paged.append(time.perf_counter() - t0)
    one = []
    for value in probes:
        path = (
            f"/api/v1/namespaces/{_PROBE_NAMESPACE}/pods?labelSelector="
            + urllib.parse.quote(f"{_PROBE_LABEL}={value}")
            + "&limit=500"
        )
        seconds, page = _timed_get(conn, path)
        if len(page["items"]) != 1:
            raise SystemExit(f"sim_scale: {_PROBE_LABEL}={value} listed {len(page['items'])} pods, expected 1")
        one.append(seconds)
    by_node = []
    for name in names[:: max(1, len(names) // repeats)][:repeats]:
        seconds, page = _timed_get(conn, f"/api/v1/pods?fieldSelector=spec.nodeName%3D{name}")
        by_node.append(seconds)
    conn.close()
    return {
        "all_s": took,
        "all_bytes": size,
        "total": total,
        "exporters": matched,
        "paged": paged,
        "one": one,
        "by_node": by_node,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--senders", type=int, default=8, help="connections patching nodes at once")
    parser.add_argument(
        "--burst",
        type=int,
        default=None,
        metavar="K",
        help="patch only the first K nodes in the watch burst (default: every node)",
    )
    parser.add_argument("--probes", type=int, default=50, help="pods listed one at a time by their own label")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds any one phase may take")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="sim-scale-") as tmp:
        sim = Sim(args.nodes, args.gpus, Path(tmp))
        try:
            api_up = sim.wait_for_kubeconfig(args.timeout)
            rolled, daemonsets = _rolled_out(sim, args.nodes, args.timeout)
            idle = _idle(sim, args.timeout)
            rss_started, peak_started = sim.rss_mb(), sim.peak_rss_mb()
            lists = _list_nodes(sim, args.nodes, args.repeats)
            names = [str(n["metadata"]["name"]) for n in orjson.loads(_get(sim.conn(), "/api/v1/nodes"))["items"]]
            burst = _watch_burst(sim, names[: args.burst], args.senders, args.timeout)
            probes = _probe_pods(sim, names, args.probes)
            pods = _pod_lists(sim, names, probes, args.repeats)
            rss_end, peak_end = sim.rss_mb(), sim.peak_rss_mb()
        finally:
            sim.stop()

    lat = burst["latencies"]
    print(f"gpucert sim up --preconfigured: {args.nodes:,} nodes × {args.gpus} GPUs, {daemonsets} DaemonSets")
    print(f"  start: API answering     {api_up:7.1f} s after launch")
    print(f"         stack rolled out  {rolled:7.1f} s (every DaemonSet pod Ready; bar ≤ 60 s)")
    print(f"         controllers idle  {idle:7.1f} s")
    print(
        f"  memory: RSS {rss_started:,.0f} MB once started (peak {peak_started:,.0f} MB); "
        f"peak {peak_end:,.0f} MB at the end, RSS {rss_end:,.0f} MB (bar ≤ 4096 MB)"
    )
    print(
        f"  list all nodes, one GET  : {min(lists['raw']):6.3f} s best, {statistics.median(lists['raw']):.3f} s "
        f"median of {args.repeats}; {lists['bytes'] / 1e6:.1f} MB of JSON"
    )
    print(
        f"  list all nodes, Kube     : {min(lists['kube']):6.3f} s best, {statistics.median(lists['kube']):.3f} s "
        f"median (pages of 500, parsed)"
    )
    patched = len(names[: args.burst])
    print(
        f"  watch, burst of {patched:,} label patches from {args.senders} connections: "
        f"sent in {burst['patched_s']:.1f} s ({patched / burst['patched_s']:,.0f}/s), "
        f"{burst['received']:,}/{patched:,} events received by {burst['drained_s']:.1f} s"
    )
    if lat:
        print(
            f"    patch → event latency p50 {_pct(lat, 50) * 1e3:.1f} ms, p99 {_pct(lat, 99) * 1e3:.1f} ms, "
            f"max {max(lat) * 1e3:.1f} ms; longest gap between events {burst['max_gap'] * 1e3:.1f} ms"
            + ("" if burst["received"] == patched else "  (STALLED: events missing)")
        )
    print(f"  pods: {pods['total']:,} in all, one unpaged GET {pods['all_s']:.3f} s ({pods['all_bytes'] / 1e6:.1f} MB)")
    print(
        f"    component=dcgm-exporter ({pods['exporters']:,} pods, pages of 500): "
        f"{min(pods['paged']):.3f} s best, {statistics.median(pods['paged']):.3f} s median"
    )
    print(
        f"    one pod by its own label ({len(pods['one'])} lists): p50 {_pct(pods['one'], 50) * 1e3:.2f} ms, "
        f"p99 {_pct(pods['one'], 99) * 1e3:.2f} ms"
    )
    print(
        f"    one node's pods by fieldSelector spec.nodeName: p50 {_pct(pods['by_node'], 50) * 1e3:.1f} ms, "
        f"max {max(pods['by_node']) * 1e3:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
