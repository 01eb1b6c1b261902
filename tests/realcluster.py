"""One cluster fixture, two servers: ``gpucert sim`` and a real control plane with the simulator's kubelets.

:func:`open_cluster` gives either, behind the few methods the Kubernetes-facing tests use (the kubeconfig,
an official client, the fleet model, GPU faults, a node's kubelet stopping), so one test body runs on
both; where the two disagree the real server is right (issue 29). ``real`` is a
:class:`~tests.controlplane.ControlPlane` (etcd, kube-apiserver with RBAC and an audit log,
kube-controller-manager, kube-scheduler) with :class:`gpucert_sim._attach.AttachedKubelets` holding its GPU
nodes. In CI (``CI=true``) a control plane that cannot start fails the test; elsewhere it is skipped with
the reason.

``open_cluster(..., api_faults=True)`` gives the real server the simulator's API faults too: a
:class:`~tests.apifaults_proxy.ApiFaultProxy` stands in front of its kube-apiserver, the cluster's
``kubeconfig_path`` points at the proxy, and ``set_faults``, ``faults`` (``.served``) and ``requests`` answer
as :class:`~gpucert_sim.SimCluster`'s do (the simulator has them always). The attached kubelets, the
controllers and the scheduler talk to kube-apiserver directly, as the simulator's own never meet its faults.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from gpucert_sim import ApiFaults, SimCluster
from gpucert_sim._attach import AttachedKubelets
from gpucert_sim._faults import FaultInjector
from gpucert_sim._requests import ApiRequest
from gpucert_sim.fleet import Fault, Fleet

from .apifaults_proxy import ApiFaultProxy
from .controlplane import ControlPlane, ControlPlaneUnavailable
from .unavailable import unavailable

__all__ = ["SERVERS", "Cluster", "RealCluster", "open_cluster", "require_control_plane"]

#: The parameters of a two-server fixture.
SERVERS = ("sim", "real")


class Cluster(Protocol):
    """What a test asks of a cluster, on either server."""

    @property
    def kubeconfig_path(self) -> Path: ...

    @property
    def fleet(self) -> Fleet: ...

    def api_client(self) -> Any: ...

    def inject_fault(self, fault: Fault) -> None: ...

    def clear_faults(self, node: str | None = None) -> int: ...

    def set_node_ready(self, node: str, ready: bool) -> None: ...

    def delete_node(self, node: str) -> None: ...

    def add_nodes(self, count: int = 1, *, uncertified_taint: str | None = None) -> list[str]: ...

    # API faults: the simulator's always; the real server's with ``open_cluster(..., api_faults=True)``.

    @property
    def faults(self) -> FaultInjector: ...

    def set_faults(self, faults: ApiFaults | None) -> None: ...

    @property
    def requests(self) -> list[ApiRequest]: ...


class RealCluster:
    """A real control plane whose GPU nodes are the simulator's kubelets."""

    server = "real"

    def __init__(self, plane: ControlPlane, kubelets: AttachedKubelets, proxy: ApiFaultProxy | None = None) -> None:
        self.plane = plane
        self.kubelets = kubelets
        #: The API fault proxy in front of kube-apiserver (``api_faults=True``), else None.
        self.proxy = proxy

    @property
    def kubeconfig_path(self) -> Path:
        """The admin's kubeconfig: through the API fault proxy when there is one, else straight to the server."""
        return self.proxy.kubeconfig_path if self.proxy is not None else self.plane.admin_kubeconfig

    @property
    def fleet(self) -> Fleet:
        return self.kubelets.fleet

    def api_client(self) -> Any:
        return self.plane.api_client(self.kubeconfig_path)

    @property
    def store(self) -> Any:
        """The kubelets' mirror of the real server's nodes and bound pods (a test may subscribe to it)."""
        return self.kubelets.store

    def inject_fault(self, fault: Fault) -> None:
        self.kubelets.inject_fault(fault)

    def clear_faults(self, node: str | None = None) -> int:
        return self.kubelets.clear_faults(node)

    def set_node_ready(self, node: str, ready: bool) -> None:
        self.kubelets.set_node_ready(node, ready)

    def delete_node(self, node: str) -> None:
        """Delete the Node through the API, as when a machine is removed (straight to kube-apiserver, never
        faulted). What follows is the real controllers': its pods are left to pod GC (which waits 40 s for
        an orphan), a Job's deletion of them confirmed by the attached kubelets."""
        from kubernetes import client

        with self.plane.api_client() as api:
            client.CoreV1Api(api).delete_node(node)

    @property
    def faults(self) -> FaultInjector:
        return self._proxy().faults

    def set_faults(self, faults: ApiFaults | None) -> None:
        self._proxy().set_faults(faults)

    @property
    def requests(self) -> list[ApiRequest]:
        """The requests that came through the API fault proxy (the kubelets' and controllers' do not)."""
        return self._proxy().requests

    def _proxy(self) -> ApiFaultProxy:
        if self.proxy is None:
            raise RuntimeError("no API fault proxy: open the real cluster with api_faults=True")
        return self.proxy

    def add_nodes(self, count: int = 1, *, uncertified_taint: str | None = None) -> list[str]:
        return self.kubelets.add_nodes(count, uncertified_taint=uncertified_taint)


def require_control_plane(exc: ControlPlaneUnavailable) -> None:
    """A control plane that cannot start: a failure in CI, a skip with the reason elsewhere."""
    unavailable(f"no real control plane here: {exc}")


@contextmanager
def open_cluster(server: str, *, api_faults: bool = False, **kwargs: Any) -> Iterator[Any]:
    """A started cluster on ``server`` (``sim`` or ``real``) of the SimCluster arguments ``kwargs``;
    ``api_faults``: the real server behind an :class:`ApiFaultProxy` (the simulator injects them itself)."""
    if server == "sim":
        # A kubeconfig of the test's, not the simulator's own temporary one: it stays where it is when the
        # simulated API server is stopped and started again (a restart).
        with (
            tempfile.TemporaryDirectory(prefix="gpucert-sim-") as folder,
            SimCluster(kubeconfig=Path(folder) / "kubeconfig", **kwargs) as sim,
        ):
            sim.server = "sim"  # type: ignore[attr-defined]
            yield sim
        return
    plane = ControlPlane()
    try:
        plane.start()
    except ControlPlaneUnavailable as exc:
        require_control_plane(exc)
    proxy = ApiFaultProxy.for_plane(plane) if api_faults else None
    try:
        if proxy is not None:
            proxy.start()
        with AttachedKubelets(plane.admin_kubeconfig, **kwargs) as kubelets:
            yield RealCluster(plane, kubelets, proxy)
            assert not kubelets.errors, kubelets.errors
    finally:
        if proxy is not None:
            proxy.stop()
        plane.stop()
