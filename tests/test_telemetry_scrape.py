"""ExporterScrape: the DCGM exporters scraped directly, found through the exporter Service's Endpoints.

Against the simulated cluster (its exporters on its own port, paths from the Endpoints' annotation) with
injected faults, and against small local servers for what a simulator does not do: an exporter at a real
exporter's ``/metrics`` with an address that names no node, a port nobody listens on, one that accepts
and never answers, and one that answers something that is not Prometheus text. A target that fails is a
problem of its node, and its node gets no number.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pandas as pd
import pytest

from gpucert.kube import connect
from gpucert.results import parse_results
from gpucert.store import empty_baseline
from gpucert.telemetry import METRICS_PATH_ANNOTATION, ExporterScrape, TelemetryError
from gpucert.verdict import judge
from gpucert_sim import STACK_NAMESPACE, SimCluster
from gpucert_sim.fleet import Fault

from .conftest import eventually


def node(i: int) -> str:
    return f"gpu-node-{i:05d}"


NODES = [node(i) for i in range(4)]
RATES = {"pcie_replays_per_min", "nvlink_crc_errors", "hw_slowdown_frac"}


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=4, gpus=8, model="NVIDIA H200", preconfigured=True, seed=21) as cluster:
        cluster.inject_fault(Fault("pcie_gen4", node(1), gpu=2))
        cluster.inject_fault(Fault("remap_failure", node(3), gpu=4))
        yield cluster


@pytest.fixture(scope="module")
def kube(sim: SimCluster) -> Any:
    return connect(sim.kubeconfig_path)


def value(results: pd.DataFrame, where: str, gpu: int | None, metric: str) -> float:
    if gpu is None:
        hit = results[(results["node"] == where) & results["gpu"].isna() & (results["metric"] == metric)]
    else:
        hit = results[(results["node"] == where) & (results["gpu"] == gpu) & (results["metric"] == metric)]
    assert len(hit) == 1, f"{where} {gpu} {metric}: {len(hit)} rows"
    return float(hit["value"].iloc[0])


def test_targets_come_from_the_exporter_endpoints(sim: SimCluster, kube: Any) -> None:
    targets = ExporterScrape(kube, STACK_NAMESPACE).targets()
    assert [t.node for t in targets] == NODES
    assert targets[1].url == f"http://127.0.0.1:{sim.port}/dcgm/{node(1)}/metrics"
    assert all(t.ready and t.node_known for t in targets)


def test_every_gpu_is_read_and_the_faults_show(sim: SimCluster, kube: Any) -> None:
    # Active for the first 36 s of every minute from now on: the whole of the scrape interval below.
    sim.inject_fault(Fault("hw_thermal", node(2), gpu=0, params={"duty": 0.6}))
    try:
        seen = ExporterScrape(kube, STACK_NAMESPACE).read(
            run_id="operate-1", interval_s=1.0, expected_gpus=dict.fromkeys(NODES, 8)
        )
    finally:
        sim.clear_faults(node(2))
    r = seen.results
    pd.testing.assert_frame_equal(parse_results(r, "again"), r)
    assert seen.problems == {}
    assert seen.start is not None
    assert 0.9 < (seen.end - seen.start).total_seconds() < 5
    assert r[r["metric"] == "pcie_gen"]["gpu_uuid"].nunique() == 32
    assert {str(u) for u in r["gpu_uuid"].dropna()} == {str(u) for u in sim.fleet.uuids[:32]}
    for name in NODES:
        assert value(r, name, None, "gpu_count") == 8
        assert value(r, name, None, "gpu_count_expected") == 8
    assert value(r, node(1), 2, "pcie_gen") == 4
    assert value(r, node(1), 2, "pcie_gen_max") == 5
    assert value(r, node(0), 2, "pcie_gen") == 5
    assert value(r, node(3), 4, "remapped_rows_failure") == 1
    xid = r[(r["metric"] == "xid") & (r["node"] == node(3)) & (r["gpu"] == 4)]
    assert 64 in set(xid["value"].astype(int))  # the exporter counted it: injected within its 5 minutes
    assert value(r, node(2), 0, "hw_slowdown_frac") > 0.9
    assert int(value(r, node(2), 0, "clocks_event_reasons")) & 0x48 == 0x48
    assert value(r, node(2), 1, "hw_slowdown_frac") == 0
    assert set(r[r["metric"] == "pcie_replays_per_min"]["node"]) == set(NODES)

    verdicts = judge(r, empty_baseline())
    failed = verdicts[(verdicts["verdict"] == "fail") & verdicts["gpu"].notna()]
    assert {(n, int(g), c) for n, g, c in zip(failed["node"], failed["gpu"], failed["cause"], strict=True)} == {
        (node(1), 2, "pcie"),
        (node(2), 0, "thermal"),
        (node(3), 4, "row_remap"),
    }


def test_a_node_whose_exporter_does_not_answer_is_a_problem_not_a_number(sim: SimCluster, kube: Any) -> None:
    scrape = ExporterScrape(kube, STACK_NAMESPACE)
    sim.set_node_ready(node(0), False)
    try:
        eventually(lambda: not next(t for t in scrape.targets() if t.node == node(0)).ready)
        seen = scrape.read(run_id="operate-2", interval_s=0, expected_gpus=dict.fromkeys(NODES, 8))
    finally:
        sim.set_node_ready(node(0), True)
    assert list(seen.problems) == [node(0)]
    assert "(listed not ready)" in seen.problems[node(0)]
    assert "HTTP 404" in seen.problems[node(0)]
    assert seen.absent is None
    r = seen.results
    assert node(0) not in set(r["node"].astype(str))  # neither telemetry nor a GPU count of 0
    assert set(r["node"].astype(str)) == set(NODES[1:])


def test_a_single_scrape_leaves_out_what_needs_two(sim: SimCluster, kube: Any) -> None:
    seen = ExporterScrape(kube, STACK_NAMESPACE).read(run_id="operate-3", interval_s=0)
    assert seen.start is None
    assert not (set(seen.results["metric"].astype(str)) & RATES)
    assert any("single scrape" in note for note in seen.notes)
    assert value(seen.results, node(1), 2, "pcie_gen") == 4


# --- targets a simulator does not make ------------------------------------------------------------------


class _Lister:
    """The one call ExporterScrape makes, answering fixed Endpoints (or raising)."""

    def __init__(self, endpoints: list[dict[str, Any]] | Exception) -> None:
        self.endpoints = endpoints
        self.calls: list[tuple[str, str, str | None, str | None]] = []

    def list_objects(
        self,
        api_version: str,
        kind: str,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> list[dict[str, Any]]:
        self.calls.append((api_version, kind, namespace, label_selector))
        if isinstance(self.endpoints, Exception):
            raise self.endpoints
        return self.endpoints


def endpoints(
    port: int, addresses: list[dict[str, str]], annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    return {
        "metadata": {"name": f"dcgm-{port}", "namespace": "gpu-monitoring", "annotations": dict(annotations or {})},
        "subsets": [{"addresses": addresses, "ports": [{"name": "gpu-metrics", "port": port, "protocol": "TCP"}]}],
    }


@pytest.fixture(scope="module")
def exporter_text(sim: SimCluster) -> str:
    """A node's exporter text as an older dcgm-exporter prints it: host label ``Hostname``."""
    text = sim.dcgm.scrape(node(1))
    assert text is not None
    return text.replace("hostname=", "Hostname=").replace(node(1), "dgx-17")


@pytest.fixture(scope="module")
def local_exporter(exporter_text: str) -> Iterator[int]:
    """``/metrics`` the exporter text; ``/garbage`` an HTML page; ``/other`` valid text without DCGM."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = {
                "/metrics": exporter_text,
                "/garbage": "<html><body>login required</body></html>\n",
                "/other": "# TYPE up gauge\nup 1\n",
            }.get(self.path)
            if body is None:
                self.send_error(404)
                return
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield int(server.server_address[1])
    server.shutdown()
    server.server_close()


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        yield int(s.getsockname()[1])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_real_exporter_path_the_old_host_label_and_every_kind_of_failure(
    local_exporter: int, silent_port: int
) -> None:
    closed = _closed_port()
    lister = _Lister(
        [
            # A real exporter: /metrics, and no nodeName on the address (the series' Hostname names the node).
            endpoints(local_exporter, [{"ip": "127.0.0.1"}]),
            endpoints(closed, [{"ip": "127.0.0.1", "nodeName": "node-closed"}]),
            endpoints(silent_port, [{"ip": "127.0.0.1", "nodeName": "node-silent"}]),
            endpoints(
                local_exporter, [{"ip": "127.0.0.1", "nodeName": "node-html"}], {METRICS_PATH_ANNOTATION: "/garbage"}
            ),
            endpoints(
                local_exporter, [{"ip": "127.0.0.1", "nodeName": "node-other"}], {METRICS_PATH_ANNOTATION: "/other"}
            ),
        ]
    )
    scrape = ExporterScrape(lister, "gpu-monitoring", timeout_s=0.5)
    seen = scrape.read(run_id="operate-4", interval_s=0, expected_gpus={"dgx-17": 8, "node-gone": 8})
    assert lister.calls == [
        (
            "v1",
            "Endpoints",
            "gpu-monitoring",
            "app.kubernetes.io/part-of=gpucert,app.kubernetes.io/component=dcgm-exporter",
        )
    ]
    r = seen.results
    assert set(r["node"].astype(str)) == {"dgx-17"}
    assert value(r, "dgx-17", 2, "pcie_gen") == 4  # node 1's fault, served under the old label
    assert value(r, "dgx-17", None, "gpu_count") == 8
    problems = seen.problems
    assert set(problems) == {"node-closed", "node-silent", "node-html", "node-other", "node-gone"}
    assert "unreachable: connection refused" in problems["node-closed"]
    assert "no complete answer within 0.5 s" in problems["node-silent"]
    assert "not Prometheus exposition" in problems["node-html"]
    assert "no DCGM GPU series" in problems["node-other"]
    assert problems["node-gone"].startswith("no exporter: no DCGM exporter address")
    assert seen.absent is None
    assert all("127.0.0.1:" in p for n, p in problems.items() if n != "node-gone")  # each names its URL


def test_no_exporters_and_a_failed_listing() -> None:
    seen = ExporterScrape(_Lister([]), "gpu-monitoring").read(run_id="operate-5", interval_s=5)
    assert seen.results.empty
    assert any("no DCGM exporter listed" in note for note in seen.notes)
    assert seen.absent == (
        "no DCGM exporter found — looked for the Endpoints of Services labelled "
        "app.kubernetes.io/part-of=gpucert,app.kubernetes.io/component=dcgm-exporter in namespace gpu-monitoring"
    )
    # The GPU nodes in scope are each a problem, not silently absent.
    none = ExporterScrape(_Lister([]), "gpu-monitoring")
    seen = none.read(run_id="operate-5", interval_s=0, nodes=["a", "b"])
    why = "no exporter: no DCGM exporter Endpoints in namespace gpu-monitoring"
    assert seen.problems == {"a": why, "b": why}
    with pytest.raises(TelemetryError, match=r"cannot list the DCGM exporters' Endpoints in namespace 'x'.*forbidden"):
        ExporterScrape(_Lister(PermissionError("forbidden")), "x").read(run_id="operate-5")
    with pytest.raises(ValueError, match="interval_s"):
        ExporterScrape(_Lister([]), "x").read(run_id="operate-5", interval_s=-1)
