"""``gpucert sim kubelets``: the simulator's GPU nodes on a real API server, as a program (issue 29).

The attached kubelets are what every real-control-plane test stands on (``tests/realcluster.py``); here the
command itself: it registers Ready GPU nodes with their Leases, serves a pod's log through the real server's
path, stops on SIGTERM with exit 0, and refuses a kubeconfig it cannot use with exit 2 and one line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpucert.kube import connect

from .conftest import eventually
from .controlplane import ControlPlane, ControlPlaneUnavailable
from .realcluster import require_control_plane

_GPUCERT = [sys.executable, "-m", "gpucert.cli"]


@pytest.fixture(scope="module")
def plane() -> Iterator[ControlPlane]:
    control = ControlPlane()
    try:
        control.start()
    except ControlPlaneUnavailable as exc:
        require_control_plane(exc)
    try:
        yield control
    finally:
        control.stop()


def _ready_gpu_nodes(kube: Any) -> list[str]:
    return [
        n["metadata"]["name"]
        for n in kube.nodes()
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions") or ())
        and n["status"].get("allocatable", {}).get("nvidia.com/gpu") == "8"
    ]


def test_the_command_attaches_ready_gpu_nodes_and_stops_on_sigterm(plane: ControlPlane) -> None:
    process = subprocess.Popen(
        [*_GPUCERT, "sim", "kubelets", "--kubeconfig", str(plane.admin_kubeconfig), "--nodes", "2", "--preconfigured"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        kube = connect(plane.admin_kubeconfig)
        nodes = eventually(lambda: _ready_gpu_nodes(kube) if len(_ready_gpu_nodes(kube)) == 2 else None, timeout_s=60)

        def leases() -> set[str]:
            return {
                item["metadata"]["name"]
                for item in kube.request(
                    "GET", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", doing="list"
                )["items"]
            }

        eventually(lambda: set(nodes) <= leases(), timeout_s=30)
        node = kube.get("v1", "Node", nodes[0])
        assert node["status"]["nodeInfo"]["kubeletVersion"] == kube.version()["gitVersion"]
        assert node["status"]["addresses"][0] == {"type": "InternalIP", "address": "127.0.0.1"}
        # A pod on the node runs, and its log comes through the API server from the kubelet endpoint.
        kube.create(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "hello", "namespace": "default"},
                "spec": {
                    "nodeName": nodes[0],
                    "restartPolicy": "Never",
                    "containers": [{"name": "c", "image": "busybox"}],
                },
            }
        )
        eventually(
            lambda: kube.get("v1", "Pod", "hello", "default").get("status", {}).get("phase") == "Succeeded",
            timeout_s=30,
        )
        assert "simulated container c (busybox) started" in kube.pod_log("hello", "default")
    finally:
        process.send_signal(signal.SIGTERM)
        out, err = process.communicate(timeout=30)
    assert process.returncode == 0, err[-2000:]
    assert "attached to https://127.0.0.1:" in out
    assert "Traceback" not in err


def test_a_kubeconfig_it_cannot_use_is_exit_2_with_one_line(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.kubeconfig"
    answer = subprocess.run(
        [*_GPUCERT, "sim", "kubelets", "--kubeconfig", str(missing), "--nodes", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert answer.returncode == 2, answer.stderr
    lines = answer.stderr.strip().splitlines()
    assert len(lines) == 1, answer.stderr
    assert str(missing) in lines[0]
    assert "Traceback" not in answer.stderr
