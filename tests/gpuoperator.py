"""The real NVIDIA GPU Operator (v26.7.0) against the real control plane, for the tests that adopt it.

What ``gpu-operator/README.md`` of the tests' assets (tests/assets.py) says a harness needs, done once per test:

* the binary and its ``/opt/gpu-operator`` assets unpacked with Python's lzma into a cache (as ``.ci/run``
  unpacks the control plane's), the binary checked against ``SHA256SUMS``;
* the operator's CRDs (``fixtures/gpu-operator/crds`` of the assets) server-side applied and Established, the
  namespace ``gpu-operator`` and the chart's own RBAC (``operator-rbac.yaml``);
* the GPU nodes labelled as Node Feature Discovery would (PCI vendor 10de, OS, kernel);
* the operator run as its chart's ServiceAccount (a TokenRequest kubeconfig) in a private mount namespace
  (``unshare``) whose ``/opt/gpu-operator`` is the unpacked assets: the host's ``/opt`` is never touched;
* the chart's default ClusterPolicy, applied by "helm" (its own field manager, as a Helm install writes it).

A part that cannot start raises :class:`OperatorUnavailable`; the test turns it into a failure in CI and a
skip elsewhere (``tests.realcluster.require_control_plane``'s rule).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import lzma
import os
import shutil
import subprocess
import tarfile
import time
import urllib.request
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import yaml

from .assets import ASSETS
from .assets import FIXTURES as _FIXTURES
from .s3servers import free_ports

__all__ = [
    "CLUSTER_POLICY",
    "OPERATOR_VERSION",
    "UPGRADE_STATE",
    "GpuOperator",
    "OperatorUnavailable",
    "cluster_policy",
]

SHARED_OPERATOR = ASSETS / "gpu-operator"
FIXTURES = _FIXTURES / "gpu-operator"
OPERATOR_VERSION = "v26.7.0"
_CACHE_HOME = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
CACHE = _CACHE_HOME / "gpucert" / f"gpu-operator-{OPERATOR_VERSION}"
NAMESPACE = "gpu-operator"
CLUSTER_POLICY = "cluster-policy"
UPGRADE_STATE = "nvidia.com/gpu-driver-upgrade-state"
#: What NFD puts on the simulated nodes (they report Ubuntu 22.04.4, kernel 5.15.0-119-generic).
NFD_LABELS = {
    "feature.node.kubernetes.io/pci-10de.present": "true",
    "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID": "22.04",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID.major": "22",
    "feature.node.kubernetes.io/system-os_release.VERSION_ID.minor": "04",
    "feature.node.kubernetes.io/kernel-version.full": "5.15.0-119-generic",
    "feature.node.kubernetes.io/kernel-version.major": "5",
    "feature.node.kubernetes.io/kernel-version.minor": "15",
    "feature.node.kubernetes.io/kernel-version.revision": "0",
}


class OperatorUnavailable(RuntimeError):
    """The operator's files are missing, or it did not come up; the message says which and why."""


def _unpack() -> tuple[Path, Path]:
    """(binary, assets folder) in the cache, unpacked once (beside, then renamed: never half-written)."""
    for name in ("gpu-operator.xz", "opt-gpu-operator.tar.xz", "SHA256SUMS"):
        if not (SHARED_OPERATOR / name).is_file():
            raise OperatorUnavailable(f"no {SHARED_OPERATOR / name}")
    CACHE.mkdir(parents=True, exist_ok=True)
    binary, assets = CACHE / "gpu-operator", CACHE / "opt-gpu-operator"
    if not os.access(binary, os.X_OK):
        part = CACHE / f".gpu-operator.{os.getpid()}"
        with lzma.open(SHARED_OPERATOR / "gpu-operator.xz") as src, part.open("wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
        sums = dict(line.split()[::-1] for line in (SHARED_OPERATOR / "SHA256SUMS").read_text().splitlines() if line)
        digest = hashlib.sha256(part.read_bytes()).hexdigest()
        if digest != sums.get("gpu-operator"):
            part.unlink()
            raise OperatorUnavailable(f"gpu-operator.xz unpacks to sha256 {digest}, not SHA256SUMS' {sums}")
        part.chmod(0o755)
        part.replace(binary)
    if not (assets / "state-driver").is_dir():
        part_dir = CACHE / f".assets.{os.getpid()}"
        with lzma.open(SHARED_OPERATOR / "opt-gpu-operator.tar.xz") as src, tarfile.open(fileobj=src) as tar:
            tar.extractall(part_dir, filter="data")
        shutil.rmtree(assets, ignore_errors=True)
        (part_dir / "opt-gpu-operator").replace(assets)
        shutil.rmtree(part_dir, ignore_errors=True)
    return binary, assets


def _documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def cluster_policy(**driver: Any) -> dict[str, Any]:
    """The chart's default ClusterPolicy with ``spec.driver`` fields replaced (``upgradePolicy`` merged)."""
    policy = _documents(FIXTURES / "clusterpolicy.yaml")[0]
    policy = copy.deepcopy(policy)
    for key, value in driver.items():
        if isinstance(value, Mapping) and isinstance(policy["spec"]["driver"].get(key), Mapping):
            policy["spec"]["driver"][key] = {**policy["spec"]["driver"][key], **value}
        else:
            policy["spec"]["driver"][key] = value
    return policy


class GpuOperator:
    """The operator on a started control plane (``plane``: a :class:`tests.controlplane.ControlPlane`)."""

    def __init__(self, plane: Any, folder: Path) -> None:
        self.plane = plane
        self.folder = folder
        self.process: subprocess.Popen[bytes] | None = None
        self.log = folder / "gpu-operator.log"
        self.health_port = 0

    # --- API helpers ----------------------------------------------------------------------------------

    def dynamic(self) -> Any:
        from kubernetes.dynamic import DynamicClient

        return DynamicClient(self.plane.api_client())  # type: ignore[no-untyped-call]

    def apply(self, obj: Mapping[str, Any], *, manager: str = "helm") -> dict[str, Any]:
        """Server-side apply ``obj`` as ``manager`` (default: as a Helm install would own it)."""
        client = self.dynamic()
        resource = client.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
        meta = obj["metadata"]
        answer = client.server_side_apply(
            resource,
            body=dict(obj),
            name=meta["name"],
            namespace=meta.get("namespace"),
            field_manager=manager,
            force_conflicts=True,
        )
        return dict(answer.to_dict())

    def get(self, api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
        client = self.dynamic()
        resource = client.resources.get(api_version=api_version, kind=kind)
        return dict(resource.get(name=name, namespace=namespace).to_dict())

    def nodes(self) -> list[dict[str, Any]]:
        from kubernetes import client

        with self.plane.api_client() as api:
            return [api.sanitize_for_serialization(n) for n in client.CoreV1Api(api).list_node().items]

    def daemonsets(self) -> list[dict[str, Any]]:
        from kubernetes import client

        with self.plane.api_client() as api:
            items = client.AppsV1Api(api).list_daemon_set_for_all_namespaces().items
            return [api.sanitize_for_serialization(d) for d in items]

    # --- life -----------------------------------------------------------------------------------------

    def prepare(self, nodes: list[str]) -> None:
        """CRDs, namespace, RBAC, NFD's labels on ``nodes``."""
        from kubernetes import client

        for path in sorted((FIXTURES / "crds").glob("*.yaml")):
            for crd in _documents(path):
                self.apply(crd)
        for path in sorted((FIXTURES / "crds").glob("*.yaml")):
            for crd in _documents(path):
                name = str(crd["metadata"]["name"])
                wait_for(functools.partial(_established, self, name), 30, f"CRD {name}")
        self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        for obj in _documents(SHARED_OPERATOR / "operator-rbac.yaml"):
            self.apply(obj)
        with self.plane.api_client() as api:
            core = client.CoreV1Api(api)
            for node in nodes:
                core.patch_node(node, {"metadata": {"labels": NFD_LABELS}})

    def start(self) -> GpuOperator:
        """Run the operator; returns once its ``/readyz`` answers. Raises :class:`OperatorUnavailable`."""
        if not shutil.which("unshare") or os.geteuid() != 0:
            raise OperatorUnavailable("running the operator needs unshare(1) and root (a private mount namespace)")
        binary, assets = _unpack()
        kubeconfig = self.plane.kubeconfig_for(NAMESPACE, "gpu-operator", self.folder / "operator.kubeconfig")
        metrics_port, self.health_port = free_ports(2)
        argv = [
            str(binary),
            "--leader-elect",
            f"--leader-elect-namespace={NAMESPACE}",
            "--zap-time-encoding=epoch",
            "--zap-log-level=info",
            f"--metrics-bind-address=127.0.0.1:{metrics_port}",
            f"--health-probe-bind-address=127.0.0.1:{self.health_port}",
        ]
        script = (
            "mount -t tmpfs -o size=1m tmpfs /opt && mkdir /opt/gpu-operator "
            '&& mount --bind "$ASSETS" /opt/gpu-operator && exec "$@"'
        )
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "ASSETS": str(assets),
            "KUBECONFIG": str(kubeconfig),
            "OPERATOR_NAMESPACE": NAMESPACE,
            "WATCH_NAMESPACE": "",
            "DRIVER_MANAGER_IMAGE": "nvcr.io/nvidia/cloud-native/k8s-driver-manager:v0.12.0",
            "VALIDATOR_IMAGE": f"nvcr.io/nvidia/gpu-operator:{OPERATOR_VERSION}",
        }
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", *argv],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            wait_for(self._ready, 30, "the operator's /readyz")
        except OperatorUnavailable:
            self.stop()
            raise OperatorUnavailable(f"the GPU operator did not get ready; its log ends: {self.log_tail()}") from None
        return self

    def _ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise OperatorUnavailable(f"the GPU operator exited ({self.process.returncode}): {self.log_tail()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def log_tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else "(no log)"

    def stop(self) -> None:
        """Stop the operator by its PID (SIGTERM, then SIGKILL after 5 s)."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)

    # --- what a test waits for ------------------------------------------------------------------------

    def policy_state(self) -> str:
        policy = self.get("nvidia.com/v1", "ClusterPolicy", CLUSTER_POLICY)
        return str((policy.get("status") or {}).get("state") or "")

    def wait_ready(self, timeout_s: float = 120.0) -> float:
        """Wait until the ClusterPolicy is ``ready``; returns the seconds it took."""
        began = time.monotonic()
        wait_for(lambda: self.policy_state() == "ready", timeout_s, "ClusterPolicy ready", tail=self.log_tail)
        return time.monotonic() - began

    def driver_images(self) -> dict[str, str]:
        """Node → the image of the Ready, not deleted driver pod there (the operator's, either mode)."""
        from kubernetes import client

        with self.plane.api_client() as api:
            items = (
                client.CoreV1Api(api)
                .list_namespaced_pod(NAMESPACE, label_selector="app.kubernetes.io/component=nvidia-driver")
                .items
            )
            pods = [api.sanitize_for_serialization(p) for p in items]
        return {
            str(p["spec"]["nodeName"]): str(p["spec"]["containers"][0]["image"])
            for p in pods
            if p["spec"].get("nodeName")
            and not p["metadata"].get("deletionTimestamp")
            and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or ())
        }

    def upgrade_states(self) -> dict[str, str]:
        """Node → its ``nvidia.com/gpu-driver-upgrade-state`` (empty when unlabelled), GPU nodes only."""
        return {
            str(n["metadata"]["name"]): str((n["metadata"].get("labels") or {}).get(UPGRADE_STATE, ""))
            for n in self.nodes()
            if (n["metadata"].get("labels") or {}).get("nvidia.com/gpu.present") == "true"
        }


def _established(operator: GpuOperator, name: str) -> bool:
    crd = operator.get("apiextensions.k8s.io/v1", "CustomResourceDefinition", name)
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)


def wait_for(check: Callable[[], bool], timeout_s: float, what: str, *, tail: Callable[[], str] | None = None) -> None:
    """Poll ``check`` every 0.2 s; raises :class:`OperatorUnavailable` naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.2)
    raise OperatorUnavailable(f"{what}: not within {timeout_s:.0f} s" + (f"; operator log: {tail()}" if tail else ""))
