"""``gpucert sim kubelets``: the simulator's GPU nodes attached to a real Kubernetes API server.

The simulator's own API server is a model, and a model drifts. Here the real control plane (kube-apiserver,
kube-controller-manager, kube-scheduler) does everything a control plane does — validation, RBAC, admission,
the Job and DaemonSet controllers, scheduling, garbage collection, node lifecycle — and only what a real
cluster keeps on its nodes is simulated: the kubelets, the device plugin's effect, the DCGM exporters, the
benchmark and training pods' logs. They are the same controllers as in ``gpucert sim up``
(:class:`~._kubelet.Kubelets`, :class:`~._deviceplugin.DevicePlugin`, :class:`~._benchlogs.PodLogs`,
:class:`~._training.TrainingModel`), run on a local *mirror* of the real server's state:

* **registration**: the fleet's Node objects are created on the real server (their status by the status
  subresource, as a kubelet posts it), with ``InternalIP`` 127.0.0.1 and the kubelet port of this process's
  log server, and their ``kube-node-lease`` Leases are renewed every :data:`LEASE_RENEW_S` while the node is
  Ready — the node lifecycle controller judges them as it judges real kubelets;
* **mirror**: Nodes, Pods bound to these nodes, DaemonSets and Namespaces are listed and watched from the
  real server (re-listed after a 410 or a lost connection) into a local :class:`~._store.Store`; the real
  server owns metadata and spec, the kubelets own status, so a mirrored object keeps the status the local
  kubelets wrote;
* **status**: what the local controllers write — a pod's phase, conditions and container states, a node's
  conditions and advertised GPUs — is patched onto the real objects' ``status`` subresources (coalesced: the
  latest state of an object is sent, never a queue of stale ones); Events they record are created there;
* **deletion**: a pod the real server marks for deletion (a Job's deadline, garbage collection, a namespace
  going) is confirmed as a kubelet confirms it, by a delete with grace period 0 and the pod's uid as
  precondition;
* **logs**: a TLS server answers the API server's ``/containerLogs/<ns>/<pod>/<container>`` from the local
  logs, so ``kubectl logs`` and the client's ``read_namespaced_pod_log`` take the real server's path
  (which refuses, itself, the log of a container that has not started);
* **exporters**: the DCGM exporters and the training jobs' metrics are served on loopback
  (:attr:`AttachedKubelets.metrics_url`), as ``gpucert sim up`` serves them.

It never imports Prefect.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import queue
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web

from gpucert._text import counted
from gpucert.errors import InputError
from gpucert.kube import FIELD_MANAGER, never_certified_patch

from ._controllers import Runtime, SimTiming
from ._dcgm import DcgmExporters
from ._dcgm import routes as dcgm_routes
from ._deviceplugin import DevicePlugin
from ._gpufaults import GpuFaults
from ._kubelet import loaded_driver, log_refusal, node_kubelets
from ._loop import run_loop
from ._nodes import register_nodes
from ._objects import DAEMONSETS, NODES, PODS, deleting, ready_condition, set_condition
from ._resources import KUBERNETES_VERSION, ResourceType, by_kind, lookup
from ._stack import preconfigured_stack
from ._store import Obj, Store, WatchEvent, now_rfc3339
from ._training import TrainingModel
from ._training import routes as training_routes
from .fleet import Fault, Fleet

__all__ = ["KUBELET_VERSION", "LEASE_RENEW_S", "AttachedKubelets"]

_LOG = logging.getLogger("gpucert_sim.attach")
_HOST = "127.0.0.1"
#: What the simulated kubelets report: the control plane's own version (no version skew to explain).
KUBELET_VERSION = KUBERNETES_VERSION
#: How often a Ready node's Lease is renewed (a kubelet's default is 10 s of a 40 s lease).
LEASE_RENEW_S = 10.0
_LEASE_DURATION_S = 40
_NAMESPACES = lookup("", "v1", "namespaces")
_LEASES = lookup("coordination.k8s.io", "v1", "leases")
assert _NAMESPACES is not None
assert _LEASES is not None
NAMESPACES, LEASES = _NAMESPACES, _LEASES
#: A watch ends after this and is opened again: a dead connection is noticed within it.
_WATCH_TIMEOUT_S = 60
_RETRY_S = 1.0
_STACK_NAMESPACE = "gpucert-system"


def _micro_time() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _mirror_view(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` as the local store keeps it: without the server's bookkeeping that changes on every write."""
    meta = {k: v for k, v in (obj.get("metadata") or {}).items() if k not in ("managedFields", "resourceVersion")}
    return {**obj, "metadata": meta}


class _Remote:
    """The few raw calls the attachment makes, as JSON, through the official client's transport and auth."""

    def __init__(self, kubeconfig: str) -> None:
        from kubernetes import client, config

        configuration = client.Configuration()
        try:
            config.load_kube_config(
                config_file=kubeconfig,  # type: ignore[no-untyped-call]
                client_configuration=configuration,
            )
        except Exception as exc:  # the client raises ConfigException, OSError, yaml errors …
            raise InputError(f"sim kubelets: cannot load --kubeconfig {kubeconfig}: {exc}") from exc
        self.api = client.ApiClient(configuration)
        self.host = configuration.host

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Mapping[str, Any] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | tuple[float, float] = 30.0,
    ) -> Any:
        """The raw answer (``.status``, ``.read()``, ``.response`` to stream); :class:`_Refused` for a non-2xx."""
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        params = self.api.param_serialize(
            method,
            path,
            query_params=list((query or {}).items()),
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        answer = self.api.call_api(*params, _request_timeout=timeout)
        if not 200 <= answer.status <= 299:
            raise _Refused(answer.status, answer.read())  # type: ignore[no-untyped-call]
        return answer

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        data = self.call(method, path, **kwargs).read()
        return json.loads(data) if data else None

    def close(self) -> None:
        self.api.close()  # type: ignore[no-untyped-call]


class AttachedKubelets:
    """The simulated GPU nodes of ``fleet`` kept on the real API server ``kubeconfig`` names; see the module
    docstring. A context manager; :meth:`start` returns once every node is registered and Ready."""

    def __init__(
        self,
        kubeconfig: str | Path,
        *,
        nodes: int,
        gpus: int = 8,
        model: str = "NVIDIA H200",
        seed: int = 0,
        preconfigured: bool = False,
        timing: SimTiming | None = None,
        label_prefix: str = "gpucert.io",
        nodes_per_leaf: int = 8,
        dcgm_host_label: str = "hostname",
    ) -> None:
        try:
            self.fleet = Fleet.generate(
                nodes=nodes, gpus_per_node=gpus, model=model, seed=seed, nodes_per_leaf=nodes_per_leaf
            )
        except ValueError as exc:
            raise InputError(f"sim kubelets: {exc}") from exc
        self.kubeconfig = str(kubeconfig)
        self.seed = seed
        self.preconfigured = preconfigured
        self.timing = timing or SimTiming()
        self.label_prefix = label_prefix
        self.gpu_faults = GpuFaults(lambda: self.fleet)
        #: The local mirror the simulated controllers run on.
        self.store = Store()
        self.dcgm = DcgmExporters(
            self.store,
            lambda: self.fleet,
            self.gpu_faults,
            seed=seed,
            started_at=time.monotonic(),
            host_label=dcgm_host_label,
        )
        self.training = TrainingModel(self.store, lambda: self.fleet, self.dcgm.readings, seed=seed)
        self.dcgm.training = self.training.gpus_now
        self.runtime: Runtime | None = None
        #: Failures talking to the real server that were not retried away (for tests to assert none).
        self.errors: list[str] = []
        self._remote: _Remote | None = None
        self._mirroring = threading.local()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._pending: dict[tuple[str, str, str], None] = {}
        self._pending_lock = threading.Condition()
        self._outbox: queue.Queue[tuple[ResourceType, Obj]] = queue.Queue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runners: list[web.AppRunner] = []
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._not_ready: set[str] = set()
        #: The open watch of each mirrored resource, to shut down at stop.
        self._watches: dict[str, Any] = {}
        self.kubelet_port = 0
        self.metrics_port = 0

    # --- life ---------------------------------------------------------------------------------------

    def start(self) -> AttachedKubelets:
        self._remote = _Remote(self.kubeconfig)
        ready = threading.Event()
        failure: list[BaseException] = []
        thread = threading.Thread(target=self._serve, args=(ready, failure), name="sim-kubelets-loop", daemon=True)
        thread.start()
        self._threads.append(thread)
        if not ready.wait(30) or failure:
            self.stop()
            raise InputError(f"sim kubelets: cannot serve on {_HOST}: {failure[0] if failure else 'timeout'}")
        try:
            names = self._register(self.fleet.node_names)
            if self.preconfigured:
                self._apply_stack(names)
        except Exception:
            self.stop()
            raise
        for target, name in (
            (self._mirror_loop, "nodes"),
            (self._mirror_loop, "pods"),
            (self._mirror_loop, "daemonsets"),
            (self._push_loop, "push"),
            (self._lease_loop, "leases"),
        ):
            t = threading.Thread(target=target, args=(name,), name=f"sim-kubelets-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        if self.preconfigured:
            try:
                self._wait_for_stack()
            except Exception:
                self.stop()
                raise
        return self

    def _wait_for_stack(self, timeout_s: float = 120.0) -> None:
        """Return once the stack applied at start runs on every node, as ``gpucert sim up --preconfigured``
        starts: a benchmark started at once must find each node's driver loaded, not a driver pod on its way."""
        assert self._remote is not None
        deadline = time.monotonic() + timeout_s
        pending: list[str] = []
        while time.monotonic() < deadline:
            listed = self._remote.json("GET", DAEMONSETS.path(_STACK_NAMESPACE))
            pending = []
            for ds in listed.get("items") or ():
                status, meta = ds.get("status") or {}, ds["metadata"]
                desired = int(status.get("desiredNumberScheduled") or 0)
                if (
                    int(status.get("observedGeneration") or 0) < int(meta.get("generation") or 1)
                    or desired == 0
                    or int(status.get("numberReady") or 0) < desired
                ):
                    pending.append(meta["name"])
            if listed.get("items") and not pending:
                return
            self._stop.wait(0.2)
        raise InputError(
            f"sim kubelets: the preconfigured stack is not ready within {timeout_s:.0f} s "
            f"({', '.join(pending) or 'no DaemonSet'})"
        )

    def stop(self) -> None:
        self._stop.set()
        with self._pending_lock:
            self._pending_lock.notify_all()
        # A watch blocks in its socket's read until the server sends something: shut the sockets down so the
        # mirror threads end now, not at their join timeouts.
        for response in list(self._watches.values()):
            response.shutdown()
        loop = self._loop
        if loop is not None:

            async def _close() -> None:
                if self.runtime is not None:
                    await self.runtime.stop()
                for runner in self._runners:
                    await runner.cleanup()

            asyncio.run_coroutine_threadsafe(_close(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
        for thread in self._threads:
            thread.join(timeout=5)
        self._threads.clear()
        self._loop = None
        if self._remote is not None:
            self._remote.close()
            self._remote = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> AttachedKubelets:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what a test or a rehearsal does to the nodes --------------------------------------------------

    @property
    def server(self) -> str:
        """The real API server's URL."""
        return self._remote.host if self._remote is not None else "(not attached)"

    @property
    def metrics_url(self) -> str:
        """Where the DCGM exporters (``/dcgm/<node>/metrics``) and the training metrics are served."""
        return f"http://{_HOST}:{self.metrics_port}"

    def inject_fault(self, fault: Fault) -> None:
        self.gpu_faults.inject(fault)

    def clear_faults(self, node: str | None = None) -> int:
        return self.gpu_faults.clear(node)

    def set_node_ready(self, node: str, ready: bool) -> None:
        """Node ``node``'s kubelet stops (False) or resumes (True) posting Ready and renewing its Lease."""
        with self.store.lock:
            obj = self.store.get(NODES, None, node)
            if obj is None:
                raise InputError(f"sim kubelets: no node {node!r}")
            status = dict(obj.get("status") or {})
            status["conditions"] = set_condition(status.get("conditions"), ready_condition(ready, now_rfc3339()))
            (self._not_ready.discard if ready else self._not_ready.add)(node)
            self.store.update(NODES, {**obj, "status": status})

    def add_nodes(self, count: int = 1, *, uncertified_taint: str | None = None) -> list[str]:
        """New GPU nodes join (registered bare: no GPUs advertised until the device plugin runs there)."""
        with self.store.lock:
            before = self.fleet.n_nodes
            self.fleet = self.fleet.add_nodes(count, seed=self.seed * 1_000_003 + before)
        return self._register(self.fleet.node_names[before:], uncertified_taint=uncertified_taint, preconfigured=False)

    # --- registration -------------------------------------------------------------------------------

    def _register(
        self, names: list[str], *, uncertified_taint: str | None = None, preconfigured: bool | None = None
    ) -> list[str]:
        """Create the Nodes ``names`` locally and on the real server, their status posted, their Leases held."""
        assert self._remote is not None
        with self.store.lock, self._as_mirror():
            register_nodes(
                self.store,
                self.fleet,
                names=names,
                uncertified_taint=uncertified_taint,
                preconfigured=self.preconfigured if preconfigured is None else preconfigured,
                label_prefix=self.label_prefix,
            )
            local = [self._as_attached(name) for name in names]
        for node in local:
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {k: v for k, v in node["metadata"].items() if k in ("name", "labels", "annotations")},
                "spec": node.get("spec") or {},
            }
            try:
                self._remote.json("POST", "/api/v1/nodes", body=body, query={"fieldManager": "kubelet"})
            except Exception as exc:
                if getattr(exc, "status", None) != 409:
                    raise InputError(
                        f"sim kubelets: cannot register node {node['metadata']['name']}: {_reason(exc)}"
                    ) from exc
            self._push_status(NODES, node)
            self._renew_lease(node["metadata"]["name"])
        return names

    def _as_attached(self, name: str) -> Obj:
        """The local Node ``name`` as a kubelet of this process reports it: reachable at 127.0.0.1 on the log
        server's port, at the control plane's version."""
        node = self.store.get(NODES, None, name)
        assert node is not None
        # Pod addresses on loopback, never a routable range: the simulated pods answer nowhere, and a client
        # that dials one (a scraper reading Endpoints) must reach this machine only. The endpoint controllers
        # refuse loopback addresses, so an exporter Service lists none: operate says it found no exporter.
        index = self.fleet.node_index[name]
        cidr = f"127.{64 + index // 256 % 64}.{index % 256}.0/24"
        spec = {**(node.get("spec") or {}), "podCIDR": cidr, "podCIDRs": [cidr]}
        status = dict(node["status"])
        status["addresses"] = [{"type": "InternalIP", "address": _HOST}, {"type": "Hostname", "address": name}]
        status["daemonEndpoints"] = {"kubeletEndpoint": {"Port": self.kubelet_port}}
        status["nodeInfo"] = {
            **status["nodeInfo"],
            "kubeletVersion": KUBELET_VERSION,
            "kubeProxyVersion": KUBELET_VERSION,
        }
        return self.store.update(NODES, {**node, "spec": spec, "status": status})

    def _apply_stack(self, names: list[str]) -> None:
        """What configure would have applied, applied for real with gpucert's field manager (``_stack.py``)."""
        assert self._remote is not None
        nodes = [self.store.get(NODES, None, n) for n in names]
        objects, labels = preconfigured_stack(
            [n for n in nodes if n is not None], namespace=_STACK_NAMESPACE, label_prefix=self.label_prefix
        )
        for obj in objects:
            resource = by_kind(str(obj["apiVersion"]), str(obj["kind"]))
            assert resource is not None, obj["kind"]
            meta = obj["metadata"]
            path = resource.path(meta.get("namespace") if resource.namespaced else None, meta["name"])
            self._remote.json(
                "PATCH",
                path,
                body=obj,
                content_type="application/apply-patch+yaml",
                query={"fieldManager": FIELD_MANAGER, "force": "true"},
            )
        now = dt.datetime.now(dt.UTC)
        for name, extra in labels.items():
            self._remote.json(
                "PATCH",
                f"/api/v1/nodes/{name}",
                body={"metadata": {"labels": extra}},
                content_type="application/merge-patch+json",
                query={"fieldManager": FIELD_MANAGER},
            )
            # configure gives each node it takes on the GpuCertified condition Unknown (never certified).
            node = self.store.get(NODES, None, name)
            unknown = never_certified_patch(node or {}, now=now)
            if unknown is not None:
                self._remote.json(
                    "PATCH",
                    f"/api/v1/nodes/{name}/status",
                    body=unknown,
                    content_type="application/strategic-merge-patch+json",
                    query={"fieldManager": FIELD_MANAGER},
                )

    # --- the loop: controllers, the kubelet endpoint, the exporters -----------------------------------

    def _serve(self, ready: threading.Event, failure: list[BaseException]) -> None:
        run_loop(self._listen, ready, failure, self._set_loop)

    def _set_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    async def _listen(self, loop: asyncio.AbstractEventLoop) -> None:
        kubelet = web.Application()
        kubelet.router.add_get("/containerLogs/{namespace}/{pod}/{container}", self._container_logs)
        kubelet.router.add_get("/healthz", self._healthz)
        self.kubelet_port = await self._site(kubelet, self._tls())
        metrics = web.Application()
        for method, path, handler in [*dcgm_routes(self.dcgm), *training_routes(self.training)]:
            metrics.router.add_route(method, path, handler)
        self.metrics_port = await self._site(metrics, None)
        runtime = Runtime(self.store, loop)
        runtime.add(
            node_kubelets(
                runtime,
                lambda: self.fleet,
                self.gpu_faults,
                seed=self.seed,
                label_prefix=self.label_prefix,
                timing=self.timing,
                training=self.training,
                rendezvous=True,
            )
        )
        self.dcgm.driver = loaded_driver(runtime)  # the exporters report the driver each node runs
        runtime.add(DevicePlugin(runtime, self.fleet.gpus_per_node))
        self.store.subscribe(self._on_local_event)
        runtime.start()
        self.runtime = runtime

    async def _site(self, app: web.Application, context: ssl.SSLContext | None) -> int:
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5, handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, _HOST, 0, ssl_context=context).start()
        self._runners.append(runner)
        return int(runner.addresses[0][1])

    def _tls(self) -> ssl.SSLContext:
        """A self-signed serving certificate: the API server does not check a kubelet's unless it is given
        ``--kubelet-certificate-authority``, as most test clusters are not."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        self._tmp = tempfile.TemporaryDirectory(prefix="gpucert-sim-kubelets-")
        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpucert-sim-kubelet")])
        now = dt.datetime.now(dt.UTC)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=30))
            .sign(key, hashes.SHA256())
        )
        folder = Path(self._tmp.name)
        (folder / "kubelet.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (folder / "kubelet.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(folder / "kubelet.crt", folder / "kubelet.key")
        return context

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _container_logs(self, request: web.Request) -> web.Response:
        namespace, pod, container = (request.match_info[k] for k in ("namespace", "pod", "container"))
        found = self.store.get(PODS, namespace, pod)
        if found is None:
            return web.Response(status=404, text=f"pod {namespace}/{pod} is not on this node\n")
        refusal = log_refusal(found, container)
        if refusal is not None:
            return web.Response(status=400, text=refusal)
        text = self.store.get_log(namespace, pod, container)
        tail = request.query.get("tailLines")
        if tail is not None and tail.isdigit():
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail) :]) if int(tail) else ""
        limit = request.query.get("limitBytes")
        if limit is not None and limit.isdigit():
            text = text.encode()[: int(limit)].decode(errors="ignore")
        return web.Response(text=text, content_type="text/plain")

    # --- local writes go to the real server ----------------------------------------------------------

    def _as_mirror(self) -> Any:
        """Writes made inside this block come from the real server: they are not sent back to it."""
        attached = self

        class _Block:
            def __enter__(self) -> None:
                attached._mirroring.active = True

            def __exit__(self, *exc: object) -> None:
                attached._mirroring.active = False

        return _Block()

    def _on_local_event(self, event: WatchEvent) -> None:
        # Called under the store's lock by whichever thread wrote; the push thread does the sending.
        if getattr(self._mirroring, "active", False) or event.type == "DELETED":
            return
        if event.resource in (PODS.key, NODES.key):
            old_status = (event.old or {}).get("status") if event.old is not None else None
            if event.type == "MODIFIED" and old_status == event.obj.get("status"):
                return
            meta = event.obj["metadata"]
            with self._pending_lock:
                self._pending[(event.resource, meta.get("namespace") or "", meta["name"])] = None
                self._pending_lock.notify()
        elif event.type == "ADDED" and str(event.obj.get("kind")) == "Event":
            resource = by_kind(str(event.obj.get("apiVersion")), "Event")
            if resource is not None:
                self._outbox.put((resource, event.obj))
                with self._pending_lock:
                    self._pending_lock.notify()

    def _push_loop(self, _: str) -> None:
        while not self._stop.is_set():
            with self._pending_lock:
                while not self._pending and self._outbox.empty() and not self._stop.is_set():
                    self._pending_lock.wait(1.0)
                batch, self._pending = list(self._pending), {}
            for key in batch:
                resource = PODS if key[0] == PODS.key else NODES
                with self.store.lock:
                    obj = self.store.get(resource, key[1] or None, key[2])
                if obj is not None and not self._push_status(resource, obj):
                    # The server is away (restarting, say): the latest state goes when it is back.
                    with self._pending_lock:
                        self._pending.setdefault(key, None)
                    self._stop.wait(_RETRY_S)
            while not self._outbox.empty():
                resource, obj = self._outbox.get_nowait()
                self._push_event(resource, obj)

    def _push_status(self, resource: ResourceType, obj: Obj) -> bool:
        """Patch ``obj``'s status onto the real object; False when the server could not be reached (try
        again), True when it was written or cannot be (gone, or refused: recorded)."""
        assert self._remote is not None
        meta = obj["metadata"]
        path = resource.path(meta.get("namespace") if resource.namespaced else None, meta["name"]) + "/status"
        try:
            self._remote.json(
                "PATCH",
                path,
                body={"status": obj.get("status") or {}},
                content_type="application/merge-patch+json",
                query={"fieldManager": "kubelet"},
            )
        except Exception as exc:
            if _transient(exc):
                return False
            if getattr(exc, "status", None) != 404:  # gone meanwhile: nothing to report on
                self._failed(f"status of {resource.kind} {meta.get('namespace', '')}/{meta['name']}", exc)
        return True

    def _push_event(self, resource: ResourceType, obj: Obj) -> None:
        assert self._remote is not None
        meta = obj["metadata"]
        body = {
            **obj,
            "metadata": {k: v for k, v in meta.items() if k in ("name", "namespace", "labels", "annotations")},
        }
        try:
            self._remote.json("POST", resource.path(meta.get("namespace")), body=body)
        except Exception as exc:
            if getattr(exc, "status", None) not in (404, 409):
                self._failed(f"event {meta.get('name')}", exc)

    def _finalize(self, pod: Obj) -> None:
        """Confirm a pod's deletion as its kubelet does: grace period 0, this pod's uid as precondition."""
        assert self._remote is not None
        meta = pod["metadata"]
        body = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "gracePeriodSeconds": 0,
            "preconditions": {"uid": meta["uid"]},
        }
        try:
            self._remote.json("DELETE", PODS.path(meta["namespace"], meta["name"]), body=body)
        except Exception as exc:
            if getattr(exc, "status", None) not in (404, 409):
                self._failed(f"deleting pod {meta['namespace']}/{meta['name']}", exc)

    def _failed(self, what: str, exc: BaseException) -> None:
        """A request the real server refused: logged and kept in :attr:`errors`. An outage is not one (a
        kubelet rides out its API server's restart), nor anything during stop."""
        if self._stop.is_set() or _transient(exc):
            _LOG.info("sim kubelets: %s: %s", what, _reason(exc))
            return
        message = f"{what}: {_reason(exc)}"
        _LOG.warning("sim kubelets: %s", message)
        self.errors.append(message)

    # --- the real server's state comes to the mirror -----------------------------------------------

    def _mirror_loop(self, which: str) -> None:
        resource = {"nodes": NODES, "pods": PODS, "daemonsets": DAEMONSETS}[which]
        while not self._stop.is_set():
            try:
                version = self._relist(resource)
                while not self._stop.is_set():
                    version = self._watch(resource, version)
            except _Gone:
                continue
            except Exception as exc:
                if self._stop.is_set():
                    return
                _LOG.info("sim kubelets: %s watch lost (%s); listing again", which, _reason(exc))
                self._stop.wait(_RETRY_S)

    def _query(self, resource: ResourceType) -> dict[str, Any]:
        # The pods of these nodes only; a pod not yet bound is the scheduler's, not a kubelet's.
        return {"fieldSelector": "spec.nodeName!="} if resource is PODS else {}

    def _relist(self, resource: ResourceType) -> str:
        assert self._remote is not None
        listing = self._remote.json("GET", resource.path(), query=self._query(resource))
        seen: set[tuple[str, str]] = set()
        for item in listing.get("items") or ():
            obj = {"apiVersion": resource.api_version, "kind": resource.kind, **item}
            meta = obj["metadata"]
            seen.add((meta.get("namespace") or "", meta["name"]))
            self._mirror(resource, "MODIFIED", obj)
        with self.store.lock:
            stale = [
                o
                for o in self.store.list(resource)[0]
                if (o["metadata"].get("namespace") or "", o["metadata"]["name"]) not in seen
            ]
        for obj in stale:
            self._mirror(resource, "DELETED", obj)
        return str(listing["metadata"]["resourceVersion"])

    def _watch(self, resource: ResourceType, version: str) -> str:
        assert self._remote is not None
        query = {
            **self._query(resource),
            "watch": "1",
            "resourceVersion": version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": _WATCH_TIMEOUT_S,
        }
        answer = self._remote.call("GET", resource.path(), query=query, timeout=(10, _WATCH_TIMEOUT_S + 30))
        self._watches[resource.key] = answer.response
        try:
            for line in _lines(answer):
                if self._stop.is_set():
                    break
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone
                    raise RuntimeError(obj.get("message") or "watch error")
                version = str((obj.get("metadata") or {}).get("resourceVersion") or version)
                if kind != "BOOKMARK":
                    self._mirror(resource, str(kind), obj)
        finally:
            self._watches.pop(resource.key, None)
            answer.response.release_conn()
        return version

    def _mirror(self, resource: ResourceType, kind: str, remote: Obj) -> None:
        """Bring one real object into the local store: metadata and spec from it, status kept where local."""
        meta = remote.get("metadata") or {}
        namespace, name = meta.get("namespace"), meta["name"]
        if resource is NODES and name not in self.fleet.node_index:
            return  # another kubelet's node
        if resource is PODS:
            node = (remote.get("spec") or {}).get("nodeName")
            if node not in self.fleet.node_index:
                return
        with self.store.lock, self._as_mirror():
            local = self.store.get(resource, namespace, name)
            if kind == "DELETED":
                if local is not None and (local["metadata"].get("uid") == meta.get("uid") or resource is not PODS):
                    self.store.delete(resource, namespace, name, propagation="Orphan")
                return
            if resource is PODS and local is not None and local["metadata"].get("uid") != meta.get("uid"):
                self.store.delete(resource, namespace, name, propagation="Orphan")  # same name, a new pod
                local = None
            view = _mirror_view(remote)
            if namespace and not self.store.namespace_exists(namespace):
                self.store.create(NAMESPACES, {"metadata": {"name": namespace}, "status": {"phase": "Active"}})
            if local is None:
                self.store.create(resource, view, uid=str(meta.get("uid") or "") or None)
            else:
                kept = {**view, "status": local.get("status")} if resource in (PODS, NODES) else view
                self.store.update(resource, kept)
        if resource is PODS and deleting(remote):
            self._finalize(remote)

    # --- node leases ---------------------------------------------------------------------------------

    def _lease_loop(self, _: str) -> None:
        while not self._stop.wait(LEASE_RENEW_S):
            for name in list(self.fleet.node_names):
                if name in self._not_ready or self._stop.is_set():
                    continue
                try:
                    self._renew_lease(name)
                except Exception as exc:
                    self._failed(f"lease of {name}", exc)

    def _renew_lease(self, name: str) -> None:
        assert self._remote is not None
        path = LEASES.path("kube-node-lease", name)
        patch = {
            "spec": {"holderIdentity": name, "leaseDurationSeconds": _LEASE_DURATION_S, "renewTime": _micro_time()}
        }
        try:
            self._remote.json("PATCH", path, body=patch, content_type="application/merge-patch+json")
        except Exception as exc:
            if getattr(exc, "status", None) != 404:
                raise
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": name, "namespace": "kube-node-lease"},
                **patch,
            }
            self._remote.json("POST", LEASES.path("kube-node-lease"), body=body)


class _Refused(Exception):
    """The real server answered a request with an error status."""

    def __init__(self, status: int, body: bytes) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status
        self.body = body


class _Gone(Exception):
    """The watch's resourceVersion is compacted away (410): list again."""


def _transient(exc: BaseException) -> bool:
    """An error of the server being away or busy (no answer, 5xx, 429), not a refusal of the request. A
    restarted server answers 401/403 for a moment while its RBAC cache loads: that is one too."""
    status = getattr(exc, "status", None)
    return status is None or status >= 500 or status in (401, 403, 429)


def _lines(answer: Any) -> Iterator[bytes]:
    buffer = b""
    for chunk in answer.response.stream(64 * 1024, decode_content=True):
        buffer += chunk
        *complete, buffer = buffer.split(b"\n")
        yield from (line for line in complete if line.strip())
    if buffer.strip():
        yield buffer


def _reason(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    body = getattr(exc, "body", None)
    if status is not None:
        try:
            message = json.loads(body or b"{}").get("message") or exc.__class__.__name__
        except ValueError:
            message = str(body or "")[:200]
        return f"HTTP {status}: {message}"
    return f"{type(exc).__name__}: {exc}"


def run_kubelets(
    *,
    kubeconfig: str | None,
    nodes: int,
    gpus: int,
    model: str,
    seed: int = 0,
    preconfigured: bool = False,
    stop: Callable[[], bool] | None = None,
) -> int:
    """``gpucert sim kubelets``: attach until SIGINT or SIGTERM; returns the exit status. Without
    ``kubeconfig``, the API server is the one ``$KUBECONFIG`` (else ``~/.kube/config``) names."""
    import signal

    from gpucert.kube import kubeconfig_file

    kubeconfig = str(kubeconfig_file(kubeconfig))

    stopping = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stopping.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        with AttachedKubelets(
            kubeconfig, nodes=nodes, gpus=gpus, model=model, seed=seed, preconfigured=preconfigured
        ) as attached:
            print(
                f"gpucert sim kubelets: {counted(nodes, 'node')} × {gpus} {model} attached to {attached.server}; "
                f"kubelet endpoint {_HOST}:{attached.kubelet_port}, exporters at {attached.metrics_url}",
                flush=True,
            )
            while not stopping.wait(0.5) and not (stop and stop()):
                pass
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
