"""Fault injection into the simulated cluster: a YAML file at start, HTTP at run time, ``gpucert sim inject``.

Each way must change what gpucert would see, through the interfaces it would see it by: a node's
benchmark pod log (read with the official client) and its DCGM exporter series (scraped over HTTP), and
node events through a watch. Bad documents fail whole, naming the file and the entry, with exit 2.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes import client, config, watch

from gpucert.cli import main
from gpucert_sim import INJECT_PATH, SimCluster

from .conftest import eventually

T = TypeVar("T")
ENV = {**os.environ, "PYTHONUNBUFFERED": "1"}


def node(i: int) -> str:
    return f"gpu-node-{i:05d}"


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=6, gpus=8, seed=11, preconfigured=True) as cluster:
        yield cluster
        assert cluster.runtime is not None
        assert cluster.runtime.errors == []


@pytest.fixture(scope="module")
def core(sim: SimCluster) -> client.CoreV1Api:
    return client.CoreV1Api(sim.api_client())


def request(
    url: str, method: str = "GET", body: bytes | None = None, content_type: str = "application/json"
) -> tuple[int, str]:
    req = urllib.request.Request(url, data=body, method=method, headers={"Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def dcgm(url: str, name: str, metric: str, gpu: int) -> float | None:
    """One series of a node's exporter, from the raw text; None when absent or no exporter answers."""
    code, text = request(f"{url}/dcgm/{name}/metrics")
    if code != 200:
        return None
    for line in text.splitlines():
        if line.startswith(metric + "{") and f'gpu="{gpu}",' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def bench_rows(core: client.CoreV1Api, target: str, run_id: str) -> list[dict[str, Any]]:
    """Run a benchmark pod on ``target`` and return its result rows (what the payload printed)."""
    namespace = "default"
    name = f"bench-{run_id}"
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {
                "name": name,
                "labels": {"app.kubernetes.io/managed-by": "gpucert", "gpucert.io/run-id": run_id},
            },
            "spec": {
                "nodeName": target,
                "restartPolicy": "Never",
                "containers": [{"name": "bench", "image": "ghcr.io/gpucert/payload:0.1"}],
            },
        },
    )
    eventually(lambda: core.read_namespaced_pod_status(name, namespace).status.phase == "Succeeded")
    log = core.read_namespaced_pod_log(name, namespace)
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


def value(rows: list[dict[str, Any]], metric: str, gpu: int) -> float:
    return next(float(r["value"]) for r in rows if r["metric"] == metric and r["gpu"] == gpu)


def ready(core: client.CoreV1Api, name: str) -> str:
    conditions = core.read_node_status(name).status.conditions
    return next(c.status for c in conditions if c.type == "Ready")


def test_faults_from_yaml_at_start(tmp_path: Path) -> None:
    faults = tmp_path / "faults.yaml"
    faults.write_text(f"""
api:
  latency_s: 0.0
gpu:
  - {{kind: pcie_gen4, node: {node(1)}, gpu: 2}}
nodes:
  - {{event: not_ready, node: {node(0)}}}
""")
    kubeconfig = tmp_path / "kubeconfig"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpucert.cli",
            "sim",
            "up",
            "--nodes",
            "3",
            "--preconfigured",
            "--faults",
            str(faults),
            "--kubeconfig",
            str(kubeconfig),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    try:
        eventually(lambda: kubeconfig.exists() or proc.poll() is not None, 30)
        assert kubeconfig.exists(), proc.stderr.read() if proc.stderr else ""
        core = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))  # type: ignore[no-untyped-call]
        url = core.api_client.configuration.host
        assert ready(core, node(0)) == "False"
        assert dcgm(url, node(0), "DCGM_FI_DEV_GPU_TEMP", 0) is None  # NotReady: no exporter answers
        assert dcgm(url, node(1), "DCGM_FI_DEV_PCIE_LINK_GEN", 2) == 4
        assert dcgm(url, node(1), "DCGM_FI_DEV_PCIE_LINK_GEN", 1) == 5
        rows = bench_rows(core, node(1), "start-1")
        assert value(rows, "pcie_gen", 2) == 4
        assert value(rows, "h2d_gbps", 2) < 0.6 * value(rows, "h2d_gbps", 1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
    assert proc.returncode == 0


def test_http_injection_changes_the_benchmark_log_and_the_dcgm_series(sim: SimCluster, core: client.CoreV1Api) -> None:
    target = node(2)
    before = bench_rows(core, target, "http-0")
    assert value(before, "pcie_width", 3) == 16
    body = {"gpu": [{"kind": "pcie_width", "node": target, "gpu": 3, "params": {"width": 4}}]}
    code, text = request(sim.url + INJECT_PATH, "POST", json.dumps(body).encode())
    assert code == 200, text
    assert json.loads(text)["gpu"][0]["kind"] == "pcie_width"
    after = bench_rows(core, target, "http-1")
    assert value(after, "pcie_width", 3) == 4
    assert value(after, "h2d_gbps", 3) < 0.3 * value(before, "h2d_gbps", 3)
    assert dcgm(sim.url, target, "DCGM_FI_DEV_PCIE_LINK_WIDTH", 3) == 4
    state = json.loads(request(sim.url + INJECT_PATH)[1])
    assert [f["node"] for f in state["gpu"]] == [target]

    # YAML works as well, and DELETE with a node lifts that node's faults.
    code, text = request(
        sim.url + INJECT_PATH,
        "POST",
        f"gpu:\n  - {{kind: power_cap, node: {node(3)}, params: {{limit_w: 500}}}}\n".encode(),
        "application/yaml",
    )
    assert code == 200, text
    assert dcgm(sim.url, node(3), "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 0) == 500
    assert request(f"{sim.url}{INJECT_PATH}?node={target}", "DELETE")[0] == 200
    assert dcgm(sim.url, target, "DCGM_FI_DEV_PCIE_LINK_WIDTH", 3) == 16
    assert dcgm(sim.url, node(3), "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 0) == 500
    assert request(sim.url + INJECT_PATH, "DELETE")[0] == 200
    assert dcgm(sim.url, node(3), "DCGM_FI_DEV_ENFORCED_POWER_LIMIT", 0) == 700


def test_a_bad_document_over_http_changes_nothing(sim: SimCluster) -> None:
    body = {
        "gpu": [{"kind": "pcie_gen4", "node": node(4), "gpu": 1}, {"kind": "pcie_gen4", "node": node(4), "gpu": 99}],
        "nodes": [{"event": "not_ready", "node": node(4)}],
    }
    code, text = request(sim.url + INJECT_PATH, "POST", json.dumps(body).encode())
    assert code == 400
    assert "gpu[1]" in json.loads(text)["error"]
    assert sim.gpu_faults.on_node(node(4)) == []
    code, text = request(sim.url + INJECT_PATH, "POST", b"gpu: [unclosed")
    assert code == 400
    assert "not valid YAML" in json.loads(text)["error"]


def test_gpucert_sim_inject_against_a_running_cluster(sim: SimCluster, core: client.CoreV1Api) -> None:
    target, other = node(4), node(5)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpucert.cli",
            "sim",
            "inject",
            "--kubeconfig",
            str(sim.kubeconfig_path),
            "--gpu",
            "hw_thermal",
            target,
            "6",
            "duty=0.5",
            "--not-ready",
            other,
        ],
        check=False,
        capture_output=True,
        text=True,
        env=ENV,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    try:
        assert int(dcgm(sim.url, target, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 6) or 0) & 0x40
        assert ready(core, other) == "False"
        assert (
            next(c.reason for c in core.read_node_status(other).status.conditions if c.type == "Ready")
            == "KubeletNotReady"
        )
    finally:
        cleared = subprocess.run(
            [sys.executable, "-m", "gpucert.cli", "sim", "inject", "--kubeconfig", str(sim.kubeconfig_path), "--clear"],
            check=False,
            capture_output=True,
            text=True,
            env=ENV,
            timeout=60,
        )
    assert cleared.returncode == 0, cleared.stderr
    assert ready(core, other) == "True"
    assert not int(dcgm(sim.url, target, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", 6) or 0) & 0x40


def test_gpucert_sim_inject_reads_the_kubeconfig_env_var(
    sim: SimCluster,
    core: client.CoreV1Api,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """No --kubeconfig: the simulator is the one $KUBECONFIG names (its first file, as kubectl reads it)."""
    target = node(3)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.kube/config to fall back on
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert main(["sim", "inject", "--not-ready", target]) == 2
    assert "give --kubeconfig PATH or set $KUBECONFIG" in capsys.readouterr().err
    monkeypatch.setenv("KUBECONFIG", os.pathsep.join([str(sim.kubeconfig_path), str(tmp_path / "other")]))
    try:
        assert main(["sim", "inject", "--not-ready", target]) == 0
        assert ready(core, target) == "False"
    finally:
        assert main(["sim", "inject", "--ready", target]) == 0
    assert ready(core, target) == "True"


def test_gpucert_sim_kubelets_takes_the_kubeconfig_from_the_environment_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No --kubeconfig: $KUBECONFIG names the API server, as for kubectl (here a file that is no kubeconfig:
    the one-line error names it, so the variable was read)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    assert main(["sim", "kubelets", "--nodes", "1"]) == 2
    assert "give --kubeconfig PATH or set $KUBECONFIG" in capsys.readouterr().err
    named = tmp_path / "from-env.yaml"
    named.write_text("- not\n- a kubeconfig\n")
    monkeypatch.setenv("KUBECONFIG", str(named))
    assert main(["sim", "kubelets", "--nodes", "1"]) == 2
    assert str(named) in capsys.readouterr().err


def test_node_events_seen_through_a_watch(tmp_path: Path) -> None:
    with SimCluster(nodes=3, gpus=8, seed=12, preconfigured=True) as small:
        core = client.CoreV1Api(small.api_client())
        pod = {
            "metadata": {"name": "sleeper"},
            "spec": {"nodeName": node(2), "containers": [{"name": "c", "image": "busybox"}]},
        }
        core.create_namespaced_pod("default", pod)
        eventually(lambda: core.read_namespaced_pod_status("sleeper", "default").status.phase == "Running")
        rv = core.list_node().metadata.resource_version

        small.inject(
            {
                "nodes": [
                    {"event": "not_ready", "node": node(0)},
                    {"event": "delete", "node": node(2)},
                    {"event": "join", "count": 2},
                ]
            }
        )
        # A pod bound to the NotReady node does not start.
        core.create_namespaced_pod(
            "default", {**pod, "metadata": {"name": "waiting"}, "spec": {**pod["spec"], "nodeName": node(0)}}
        )
        seen: list[tuple[str, str, Any]] = []
        wanted = {("MODIFIED", node(0)), ("DELETED", node(2)), ("ADDED", node(3)), ("ADDED", node(4))}
        # Read until every expected event came (a node may be MODIFIED more than once on the way).
        for event in watch.Watch().stream(core.list_node, resource_version=rv, timeout_seconds=5):
            seen.append((event["type"], event["object"].metadata.name, event["object"]))
            if wanted <= {(t, n) for t, n, _ in seen}:
                break
        kinds = [(t, n) for t, n, _ in seen]
        assert ("MODIFIED", node(0)) in kinds
        assert ("DELETED", node(2)) in kinds
        assert ("ADDED", node(3)) in kinds
        assert ("ADDED", node(4)) in kinds

        def ready_condition(obj: Any) -> Any:
            return next(c for c in obj.status.conditions if c.type == "Ready")

        not_ready = next(o for t, n, o in seen if n == node(0) and ready_condition(o).status == "False")
        assert ready_condition(not_ready).reason == "KubeletNotReady"
        assert {(t.key, t.effect) for t in not_ready.spec.taints} == {
            ("node.kubernetes.io/not-ready", "NoSchedule"),
            ("node.kubernetes.io/not-ready", "NoExecute"),
        }
        joined = next(o for t, n, o in seen if n == node(3))
        assert [(t.key, t.effect) for t in joined.spec.taints] == [("gpucert.io/uncertified", "NoSchedule")]
        eventually(lambda: not [p for p in core.list_namespaced_pod("default").items if p.metadata.name == "sleeper"])
        time.sleep(0.1)
        assert core.read_namespaced_pod_status("waiting", "default").status.phase == "Pending"
        small.set_node_ready(node(0), True)
        eventually(lambda: core.read_namespaced_pod_status("waiting", "default").status.phase == "Running")
        assert small.runtime is not None
        assert small.runtime.errors == []


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("gpu:\n  - {kind: nosuch, node: gpu-node-00000, gpu: 0}\n", "gpu[0]: unknown fault kind 'nosuch'"),
        ("gpu:\n  - {kind: pcie_gen4, node: gpu-node-00000}\n", "gpu[0]"),
        ("gpu:\n  - {kind: pcie_gen4, node: gpu-node-00000, gpu: 0, params: {bogus: 1}}\n", "bogus"),
        ("nodes:\n  - {event: not_ready, node: gpu-node-00099}\n", "nodes[0]: no node 'gpu-node-00099'"),
        ("nodes:\n  - {event: explode, node: gpu-node-00000}\n", "nodes[0]: unknown node event 'explode'"),
        ("nodes:\n  - {event: join, count: 0}\n", "nodes[0]: 'count'"),
        ("api:\n  error_rate: 2\n", "api:"),
        ("disks: []\n", "unknown keys ['disks']"),
        ("gpu: [unclosed\n", "not valid YAML"),
    ],
)
def test_a_bad_fault_file_is_exit_2_naming_the_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expect: str
) -> None:
    faults = tmp_path / "bad.yaml"
    faults.write_text(text)
    kubeconfig = tmp_path / "kubeconfig"
    code = main(["sim", "up", "--nodes", "1", "--faults", str(faults), "--kubeconfig", str(kubeconfig)])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--faults {faults}" in err
    assert expect in err
    assert "Traceback" not in err
    assert not kubeconfig.exists()  # nothing served


def test_gpucert_sim_inject_rejects_bad_input_with_exit_2(
    sim: SimCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("gpu:\n  - {kind: pcie_gen4, node: gpu-node-00000, gpu: zero}\n")
    assert main(["sim", "inject", "--kubeconfig", str(sim.kubeconfig_path), str(bad)]) == 2
    assert f"{bad}: gpu[0]: 'gpu' must be a GPU index" in capsys.readouterr().err
    # Checked by the server: a node the fleet does not have.
    assert main(["sim", "inject", "--kubeconfig", str(sim.kubeconfig_path), "--gpu", "pcie_gen4", "nope", "1"]) == 2
    assert "gpu[0]" in capsys.readouterr().err
    assert main(["sim", "inject", "--kubeconfig", str(sim.kubeconfig_path)]) == 2
    assert "nothing to inject" in capsys.readouterr().err


def test_a_fault_document_with_a_duplicate_key_or_too_deep_is_refused(tmp_path: Path) -> None:
    from gpucert.errors import InputError
    from gpucert_sim._inject import decode, load_fault_plan

    faults = tmp_path / "faults.yaml"
    faults.write_text("api:\n  latency_s: 0.001\napi:\n  latency_s: 0.002\n")
    with pytest.raises(InputError, match="duplicate key 'api'") as info:
        load_fault_plan(faults)
    assert "\n" not in str(info.value)
    with pytest.raises(InputError, match="duplicate key 'kind'"):
        decode('{"gpu": [{"kind": "pcie_gen4", "kind": "hw_thermal", "node": "n"}]}', "POST")
    with pytest.raises(InputError, match="POST: not valid YAML or JSON: nested too deeply"):
        decode(b"[" * 100_000 + b"]" * 100_000, "POST")
    faults.write_bytes(b"api: {} # caf\xe9\n")
    with pytest.raises(InputError, match="not UTF-8"):
        load_fault_plan(faults)


def test_sim_inject_names_a_kubeconfig_it_cannot_use_on_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    for data, words in (
        (b"apiVersion: v1\x00\nkind: Config\n", "holds NUL bytes"),
        (b"current-context: caf\xe9\n", "not UTF-8"),
        (json.dumps(_PORT_OUT_OF_RANGE).encode(), "Port out of range"),
    ):
        kubeconfig.write_bytes(data)
        assert main(["sim", "inject", "--kubeconfig", str(kubeconfig), "--clear"]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1, lines
        assert f"--kubeconfig {kubeconfig}: " in lines[0], lines[0]
        assert words in lines[0], lines[0]


_PORT_OUT_OF_RANGE = {
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:99999"}}],
    "contexts": [{"name": "c", "context": {"cluster": "c"}}],
    "current-context": "c",
}
