"""Starting and stopping a simulated cluster: a background event loop, a kubeconfig, a client.

The server runs its own asyncio loop in a daemon thread so a synchronous test, the synchronous official
client and the blocking ``gpucert sim up`` can all use it; it binds to 127.0.0.1 only (no auth, no TLS:
it must never be reachable from elsewhere). The kubeconfig is written only once the port answers, so a
reader that sees the file can connect.

By default the simulated kubelets, scheduler, Job and DaemonSet controllers and device plugin run on
the same loop (:mod:`._controllers`), so pods run, Jobs finish and nodes advertise GPUs;
``controllers=False`` serves the bare API, where objects stay exactly as written (the API tests).
The cluster holds one fleet model matching its nodes (same names, same seed) and the GPU faults in force
on it (:meth:`SimCluster.inject_fault`), which its benchmark pods measure and its DCGM exporters report
(``GET /dcgm/<node>/metrics``, ``_dcgm.py``; found through the exporter Service's Endpoints,
``_endpoints.py``). Faults of every sort come in one document shape (``_inject.py``): from
``--faults FILE`` at start, ``POST /gpucert/inject`` or :meth:`SimCluster.inject` at run time.
Training jobs (pods annotated ``sim.gpucert.io/training``) follow the training model (``_training.py``,
:attr:`SimCluster.training`), which also serves each job's metrics and every node's infiniband counters, and
gives a job's history for a Prometheus backfill (:meth:`SimCluster.training_history`).

With ``preconfigured`` the cluster starts as if configure had run: GPUs advertised, and in the stack's
namespace (:data:`STACK_NAMESPACE`) the stack's DaemonSets (``_stack.py``) and a selector-less
``dcgm-exporter`` Service whose Endpoints list every node, since the exporters are taken to run on the
hosts.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

import yaml
from aiohttp import web

from gpucert._text import counted
from gpucert.errors import InputError
from gpucert.kube import FIELD_MANAGER, never_certified_patch

from ._api import build_app
from ._controllers import Runtime, SimTiming
from ._daemonsets import DaemonSetController
from ._dcgm import DcgmExporters
from ._dcgm import routes as dcgm_routes
from ._deviceplugin import DevicePlugin
from ._endpoints import DcgmEndpoints
from ._faults import ApiFaults, FaultInjector
from ._fields import managed_fields_entry
from ._gpufaults import GpuFaults
from ._inject import FaultPlan, InjectRoutes, apply_plan, check_plan, delete_node, load_fault_plan, parse_fault_plan
from ._inject import set_node_ready as _set_node_ready
from ._jobs import JobController
from ._kubelet import loaded_driver, node_kubelets
from ._loop import run_loop
from ._nodes import register_nodes
from ._requests import ApiRequest, RequestLog
from ._resources import by_kind, lookup
from ._scheduler import Scheduler
from ._stack import preconfigured_stack
from ._store import DEFAULT_HISTORY, Obj, Store
from ._training import TrainingModel
from ._training import routes as training_routes
from .fleet import Fault, Fleet

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

__all__ = ["STACK_NAMESPACE", "SimCluster", "serve"]

#: The namespace of the GPU stack a preconfigured cluster starts with.
STACK_NAMESPACE = "gpucert-system"

_HOST = "127.0.0.1"
_SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
_START_TIMEOUT_S = 30.0


def kubeconfig_text(url: str, namespace: str = "default", *, user: str | None = None) -> str:
    """A kubeconfig for ``url`` with no credentials (the simulator has no auth); with ``user``, a bearer
    token naming that user, which the request log records as who asked (``_requests.py``)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "gpucert-sim", "cluster": {"server": url}}],
        "users": [{"name": "gpucert-sim", "user": {} if user is None else {"token": user}}],
        "contexts": [
            {
                "name": "gpucert-sim",
                "context": {"cluster": "gpucert-sim", "user": "gpucert-sim", "namespace": namespace},
            }
        ],
        "current-context": "gpucert-sim",
        "preferences": {},
    }
    return yaml.safe_dump(config, sort_keys=False)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


class SimCluster:
    """A simulated Kubernetes cluster of GPU nodes, served over HTTP while started.

    Use as a context manager::

        with SimCluster(nodes=4, gpus=8, model="NVIDIA H200") as sim:
            core = kubernetes.client.CoreV1Api(sim.api_client())
            core.list_node(label_selector="nvidia.com/gpu.product=NVIDIA-H200")

    The simulated kubelets and controllers run unless ``controllers=False`` (pods run, Jobs finish,
    DaemonSets roll out, the device plugin advertises GPUs), with durations from ``timing``; ``label_prefix`` is
    the prefix of gpucert's labels (``<prefix>/run-id`` marks a benchmark pod, see ``_benchlogs.py``).
    Nodes are labelled with their zone and leaf (``_nodes.py``), ``nodes_per_leaf`` to a leaf (four
    leaves to a zone); nodes that join fill the last leaf, then new ones.
    """

    def __init__(
        self,
        *,
        nodes: int = 0,
        gpus: int = 8,
        model: str = "NVIDIA H200",
        preconfigured: bool = False,
        seed: int = 0,
        port: int = 0,
        kubeconfig: str | os.PathLike[str] | None = None,
        faults: ApiFaults | None = None,
        history: int = DEFAULT_HISTORY,
        bookmark_interval_s: float = 5.0,
        controllers: bool = True,
        timing: SimTiming | None = None,
        label_prefix: str = "gpucert.io",
        dcgm_host_label: str = "hostname",
        nodes_per_leaf: int = 8,
    ) -> None:
        try:
            self.fleet = Fleet.generate(
                nodes=nodes, gpus_per_node=gpus, model=model, seed=seed, nodes_per_leaf=nodes_per_leaf
            )
        except ValueError as exc:
            raise InputError(f"sim: {exc}") from exc
        self.preconfigured = preconfigured
        self.seed = seed
        self.timing = timing or SimTiming()
        self.label_prefix = label_prefix
        self.gpu_faults = GpuFaults(lambda: self.fleet)
        self._controllers_on = controllers
        #: The controller runtime while started with controllers (its ``errors`` list is for tests).
        self.runtime: Runtime | None = None
        self.store = Store(history=history)
        try:
            #: The nodes' DCGM exporters; ``dcgm_host_label`` is ``hostname`` (exporter ≥ #655) or ``Hostname``.
            self.dcgm = DcgmExporters(
                self.store,
                lambda: self.fleet,
                self.gpu_faults,
                seed=seed,
                started_at=time.monotonic(),
                host_label=dcgm_host_label,
            )
        except ValueError as exc:
            raise InputError(f"sim: {exc}") from exc
        #: The training jobs' model (``_training.py``): their pods' logs and status, their GPUs' series.
        self.training = TrainingModel(self.store, lambda: self.fleet, self.dcgm.readings, seed=seed)
        self.dcgm.training = self.training.gpus_now
        self.faults = FaultInjector(faults)
        #: Every API request served (``_requests.py``); also at ``GET /gpucert/requests``.
        self.request_log = RequestLog()
        self._port = port
        self._kubeconfig = Path(kubeconfig) if kubeconfig is not None else None
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        self._bookmark_interval_s = bookmark_interval_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._bootstrap()

    # --- state --------------------------------------------------------------------------------------

    def _bootstrap(self) -> None:
        namespaces = lookup("", "v1", "namespaces")
        assert namespaces is not None
        for name in _SYSTEM_NAMESPACES:
            self.store.create(
                namespaces,
                {"metadata": {"name": name}, "spec": {"finalizers": ["kubernetes"]}, "status": {"phase": "Active"}},
            )
        register_nodes(self.store, self.fleet, preconfigured=self.preconfigured, label_prefix=self.label_prefix)
        if self.preconfigured:
            self._seed_stack()

    def _seed_stack(self) -> None:
        """The objects and node labels configure would have written (``_stack.py``)."""
        nodes_type = lookup("", "v1", "nodes")
        assert nodes_type is not None
        nodes = self.store.list(nodes_type)[0]
        objects, labels = preconfigured_stack(nodes, namespace=STACK_NAMESPACE, label_prefix=self.label_prefix)
        for obj in objects:
            resource = by_kind(str(obj["apiVersion"]), str(obj["kind"]))
            assert resource is not None, obj["kind"]
            meta = {**obj["metadata"], "managedFields": [managed_fields_entry(FIELD_MANAGER, resource, obj)]}
            seeded: dict[str, Any] = {**obj, "metadata": meta}
            if resource.kind == "Namespace":
                seeded["status"] = {"phase": "Active"}
            self.store.create(resource, seeded)
        now = datetime.now(UTC)
        for node in nodes:
            meta = node["metadata"]
            merged = {**meta["labels"], **labels[meta["name"]]}
            # configure gives each node it takes on the GpuCertified condition Unknown (never certified).
            unknown = never_certified_patch(node, now=now)
            status = dict(node.get("status") or {})
            if unknown is not None:
                status["conditions"] = [*(status.get("conditions") or ()), *unknown["status"]["conditions"]]
            self.store.update(nodes_type, {**node, "metadata": {**meta, "labels": merged}, "status": status})

    def create(self, obj: Mapping[str, Any]) -> Obj:
        """Seed an object straight into the store (test set-up; no HTTP, no validation)."""
        resource = by_kind(str(obj.get("apiVersion")), str(obj.get("kind")))
        if resource is None:
            raise InputError(f"sim: no served resource for {obj.get('apiVersion')}/{obj.get('kind')}")
        return self.store.create(resource, obj)

    def set_faults(self, faults: ApiFaults | None) -> None:
        """Change the API fault policy of the running server; None turns faults off."""
        self.faults.set(faults or ApiFaults())

    def inject_fault(self, fault: Fault) -> None:
        """Put a GPU or node fault of the fleet model's catalog in force; benchmark pods measure it."""
        self.gpu_faults.inject(fault)

    def clear_faults(self, node: str | None = None) -> int:
        """Lift the GPU faults of ``node`` (of every node when None), as a repair; returns how many."""
        return self.gpu_faults.clear(node)

    def inject(self, document: FaultPlan | Mapping[str, Any], *, source: str = "SimCluster.inject") -> dict[str, Any]:
        """Apply a fault document (``_inject.py``: ``api``, ``gpu``, ``nodes``); all checked before any applies.

        Returns what was applied; a bad document is an :class:`InputError` naming ``source`` and the entry.
        """
        plan = document if isinstance(document, FaultPlan) else parse_fault_plan(document, source)
        return apply_plan(self, plan, source)

    def set_node_ready(self, node: str, ready: bool) -> None:
        """Node ``node``'s kubelet stops (False) or resumes (True) posting Ready."""
        _set_node_ready(self, node, ready)

    def delete_node(self, node: str) -> None:
        """Delete the Node ``node`` and its pods, as when a machine is removed from the cluster."""
        delete_node(self, node)

    def add_nodes(self, count: int = 1, *, uncertified_taint: str | None = None) -> list[str]:
        """New GPU nodes joining: the fleet grows by ``count`` nodes and their Node objects register.

        docs/reference/labels-taints-conditions.md expects joining nodes to carry the
        ``gpucert.io/uncertified`` taint: pass it as ``uncertified_taint``. A joining node is bare even in a
        preconfigured cluster — no stack labels, no GPUs advertised — until configure (or onboarding) installs
        the stack there, as on a real cluster. Returns the new nodes' names.
        """
        with self.store.lock:
            before = self.fleet.n_nodes
            self.fleet = self.fleet.add_nodes(count, seed=self.seed * 1_000_003 + before)
            return register_nodes(
                self.store,
                self.fleet,
                uncertified_taint=uncertified_taint,
                names=self.fleet.node_names[before:],
                label_prefix=self.label_prefix,
            )

    def training_history(self, job: str, start: datetime | float, end: datetime | float, step_s: float = 15.0) -> str:
        """OpenMetrics text with timestamps (``# EOF`` terminated) of training job ``job`` (``namespace/name``)
        over [start, end], clipped to now, one sample per series every ``step_s``: its GPUs' DCGM series (with
        this cluster's DCGM host label), its step gauge and NCCL Inspector's series, its nodes' infiniband
        counters; for ``promtool tsdb create-blocks-from openmetrics``. Raises :class:`InputError` for a job
        none of whose pods has started, or an empty window."""
        return self.training.history(job, start, end, step_s=step_s, host_label=self.dcgm.host_label)

    def write_training_history(
        self,
        job: str,
        path: str | os.PathLike[str],
        start: datetime | float,
        end: datetime | float,
        step_s: float = 15.0,
    ) -> int:
        """:meth:`training_history` written to ``path`` without holding it all in memory; returns its bytes."""
        return self.training.write_history(job, Path(path), start, end, step_s=step_s, host_label=self.dcgm.host_label)

    def training_frames(
        self, job: str, start: datetime | float, end: datetime | float, step_s: float = 15.0
    ) -> dict[str, Any]:
        """The frames ``gpucert explain`` would gather for ``job`` over the window (``telemetry``, ``nic``,
        ``steps``, ``collectives``, ``events``), straight from the training model, without Prometheus."""
        return dict(self.training.frames(job, start, end, step_s=step_s))

    @property
    def requests(self) -> list[ApiRequest]:
        """The API requests served so far (since :meth:`clear_requests`), oldest first, in RBAC's terms."""
        return self.request_log.entries()

    def clear_requests(self) -> None:
        """Empty the request log."""
        self.request_log.clear()

    # --- serving ------------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._runner is None:
            raise RuntimeError("the simulated cluster is not started")
        return self._port

    @property
    def url(self) -> str:
        return f"http://{_HOST}:{self.port}"

    @property
    def kubeconfig_path(self) -> Path:
        if self._kubeconfig is None:
            raise RuntimeError("the simulated cluster is not started")
        return self._kubeconfig

    def api_client(self) -> ApiClient:
        """An official-client ``ApiClient`` configured from the kubeconfig this cluster wrote."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(
            config_file=str(self.kubeconfig_path),  # type: ignore[no-untyped-call]
            client_configuration=configuration,
        )
        return client.ApiClient(configuration)

    def start(self) -> SimCluster:
        if self._thread is not None:
            raise RuntimeError("the simulated cluster is already started")
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, failure), name="gpucert-sim", daemon=True)
        self._thread.start()
        if not ready.wait(_START_TIMEOUT_S):
            raise RuntimeError("gpucert sim: the API server did not start in time")
        if failure:
            self._thread.join()
            self._thread = None
            raise InputError(f"sim: cannot serve on {_HOST}:{self._port}: {failure[0]}") from failure[0]
        if self._kubeconfig is None:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="gpucert-sim-")
            self._kubeconfig = Path(self._tmpdir.name) / "kubeconfig"
        _write_atomically(self._kubeconfig, kubeconfig_text(self.url))
        return self

    def stop(self) -> None:
        loop, runner, thread = self._loop, self._runner, self._thread
        if loop is None or runner is None or thread is None:
            return
        if self.runtime is not None:
            asyncio.run_coroutine_threadsafe(self.runtime.stop(), loop).result(timeout=_START_TIMEOUT_S)
            self.runtime = None
            self.training.on_change = None
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=_START_TIMEOUT_S)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=_START_TIMEOUT_S)
        self._loop = self._runner = self._thread = None
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
            self._kubeconfig = None

    def __enter__(self) -> SimCluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        run_loop(lambda loop: self._listen(), ready, failure, self._set_loop, catch=(OSError,))

    def _set_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    async def _listen(self) -> None:
        app = build_app(
            self.store,
            self.faults,
            bookmark_interval_s=self._bookmark_interval_s,
            extra_routes=[*dcgm_routes(self.dcgm), *InjectRoutes(self).routes(), *training_routes(self.training)],
            request_log=self.request_log,
        )
        # A short shutdown timeout: open watches must not hold up stop() for their full timeout.
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, _HOST, self._port)
        try:
            await site.start()
        except OSError:
            await runner.cleanup()
            raise
        self._port = int(runner.addresses[0][1])
        self._runner = runner
        if self._controllers_on:
            self.runtime = self._start_controllers(asyncio.get_running_loop())

    def _start_controllers(self, loop: asyncio.AbstractEventLoop) -> Runtime:
        runtime = Runtime(self.store, loop)
        # Order within a batch: bind, run, then the controllers that react to what pods did.
        runtime.add(Scheduler(runtime))
        runtime.add(
            node_kubelets(
                runtime,
                lambda: self.fleet,
                self.gpu_faults,
                seed=self.seed,
                label_prefix=self.label_prefix,
                timing=self.timing,
                training=self.training,
            )
        )
        self.dcgm.driver = loaded_driver(runtime)  # the exporters report the driver each node runs
        runtime.add(JobController(runtime))
        runtime.add(DaemonSetController(runtime))
        runtime.add(DevicePlugin(runtime, self.fleet.gpus_per_node))
        runtime.add(DcgmEndpoints(runtime, lambda: self._port))
        runtime.start()
        return runtime


def serve(
    *,
    nodes: int,
    gpus: int,
    model: str,
    kubeconfig: str,
    preconfigured: bool = False,
    port: int = 0,
    faults_file: str | None = None,
    seed: int = 0,
    dcgm_host_label: str = "hostname",
    nodes_per_leaf: int = 8,
) -> int:
    """``gpucert sim up``: serve until SIGINT or SIGTERM, then stop cleanly; returns the exit status.

    The ``--faults`` document is checked in full before the server starts (a bad one serves nothing)
    and applied before the first request.
    """
    plan = load_fault_plan(faults_file) if faults_file else FaultPlan()
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        sim = SimCluster(
            nodes=nodes,
            gpus=gpus,
            model=model,
            preconfigured=preconfigured,
            port=port,
            kubeconfig=kubeconfig,
            faults=plan.api,
            seed=seed,
            controllers=True,
            dcgm_host_label=dcgm_host_label,
            nodes_per_leaf=nodes_per_leaf,
        )
        source = f"--faults {faults_file}"
        check_plan(sim, plan, source)
        apply_plan(sim, FaultPlan(None, plan.gpu, plan.nodes, plan.training), source)
        with sim:
            print(f"gpucert sim: serving {counted(nodes, 'node')} × {gpus} {model} at {sim.url}", flush=True)
            print(f"gpucert sim: kubeconfig written to {sim.kubeconfig_path}", flush=True)
            while not stop.wait(0.5):
                pass
        print("gpucert sim: stopped", file=sys.stderr, flush=True)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
