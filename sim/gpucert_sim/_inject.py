"""Fault injection into a simulated cluster: one document shape, from a file, over HTTP or the CLI.

Rehearsing operate means breaking things on purpose while it runs: a GPU's PCIe link trains down, a
node's kubelet stops, a node is deleted, new nodes join, the API server gets flaky. One document says
what to break, and the same parser reads it wherever it comes from: ``gpucert sim up --faults FILE`` at
start, ``POST /gpucert/inject`` (YAML or JSON) at run time, and ``gpucert sim inject``, which posts it.
Every entry is checked before anything is applied, so a bad document changes nothing, and its error
names where it came from and which entry is wrong (``--faults f.yaml: gpu[1]: …``)::

    api:                      # API faults (ApiFaults): replaces the server's policy
      throttle_rate: 0.1
      latency_s: 0.05
    gpu:                      # GPU and node faults of the fleet model's catalog (gpucert_sim.fleet.FAULTS)
      - {kind: pcie_gen4, node: gpu-node-00003, gpu: 2}
      - {kind: hw_thermal, node: gpu-node-00001, gpu: 0, params: {duty: 0.5}}
      - {kind: power_cap, node: gpu-node-00002}          # a node-wide kind: no gpu
      - {kind: nic_half_rate, node: gpu-node-00006}      # every pair of the node at half, its port at 200 Gb/s
      - {kind: slow_uplink, params: {leaf_a: leaf-00, leaf_b: leaf-01, factor: 0.5}}   # the fabric: no node
    nodes:                    # node events, applied in order
      - {event: not_ready, node: gpu-node-00004}
      - {event: ready, node: gpu-node-00004}             # the kubelet is back
      - {event: delete, node: gpu-node-00005}
      - {event: join, count: 2}                          # with the gpucert.io/uncertified taint
      - {event: join, count: 1, uncertified_taint: false}
    training:                 # faults of training jobs (``_training.py``), minutes from the job's start
      - {kind: gpu_throttle, job: team-a/llm, node: gpu-node-00003, gpu: 2, from_minute: 30,
         params: {clock_frac: 0.5}}
      - {kind: nic_half_rate, job: team-a/llm, node: gpu-node-00005, from_minute: 90, params: {flapping: true}}
      - {kind: evict, job: team-a/llm, node: gpu-node-00007, at_minute: 120, params: {gap_minutes: 5}}
      - {kind: slow_input, job: team-a/llm, from_minute: 200, until_minute: 260, params: {factor: 1.6}}

Node events do what the control plane shows when it happens for real. ``not_ready``: the Node's Ready
condition turns False with reason ``KubeletNotReady`` and the node lifecycle controller's
``node.kubernetes.io/not-ready`` taints (NoSchedule, NoExecute) appear; nothing new is scheduled there,
pods bound there do not start and running ones move on no more (its kubelet is down: a benchmark stays
Running until its Job's deadline); its DCGM exporter stops answering.
``ready`` reverses it. ``delete``: the Node object is deleted and so are the pods bound to it (pod GC);
the fleet keeps the node's GPUs, but nothing reaches them. ``join``: new nodes of the fleet register,
with ``<label prefix>/uncertified:NoSchedule`` unless ``uncertified_taint: false`` (or another taint key
as a string); the DaemonSets follow on their own. Nodes are applied before GPU faults, but GPU faults
are checked against the fleet as it was: fault a joining node in a second document.

``DELETE /gpucert/inject`` lifts every GPU and training fault, brings NotReady nodes back and turns API faults
off; ``DELETE /gpucert/inject?node=N`` lifts the GPU and training faults of node N and brings it back if NotReady.
``GET /gpucert/inject`` shows what is in force.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import orjson
import yaml
from aiohttp import web

from gpucert._yaml import UniqueKeyLoader, read_yaml_mapping
from gpucert.errors import InputError

from ._faults import ApiFaults
from ._objects import NODES, PODS, ready_condition, set_condition
from ._store import now_rfc3339
from ._training import TrainingFault, parse_training_fault
from .fleet import FAULTS, Fault

if TYPE_CHECKING:
    from ._server import SimCluster

__all__ = ["INJECT_PATH", "FaultPlan", "NodeEvent", "load_fault_plan", "parse_fault_plan"]

INJECT_PATH = "/gpucert/inject"
_SECTIONS = ("api", "gpu", "nodes", "training")
_EVENTS = ("not_ready", "ready", "delete", "join")
_NOT_READY_TAINTS = ("NoSchedule", "NoExecute")
_NOT_READY_KEY = "node.kubernetes.io/not-ready"


@dataclass(frozen=True)
class NodeEvent:
    """One node event: ``not_ready``/``ready``/``delete`` of ``node``, or ``join`` of ``count`` nodes."""

    event: str
    node: str | None = None
    count: int = 1
    #: For ``join``: True (the default ``<prefix>/uncertified`` taint), False (none) or a taint key.
    uncertified_taint: bool | str = True


@dataclass(frozen=True)
class FaultPlan:
    """What one fault document asks for; see the module docstring."""

    api: ApiFaults | None = None
    gpu: tuple[Fault, ...] = ()
    nodes: tuple[NodeEvent, ...] = field(default_factory=tuple)
    training: tuple[TrainingFault, ...] = ()


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InputError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _keys(entry: Mapping[str, Any], where: str, allowed: Sequence[str]) -> None:
    unknown = sorted(set(map(str, entry)) - set(allowed))
    if unknown:
        raise InputError(f"{where}: unknown keys {unknown}; known: {list(allowed)}")


def _text(entry: Mapping[str, Any], key: str, where: str) -> str:
    value = entry.get(key)
    if not isinstance(value, str) or not value:
        raise InputError(f"{where}: '{key}' must be a non-empty string, got {value!r}")
    return value


def _gpu_fault(raw: Any, where: str) -> Fault:
    entry = _mapping(raw, where)
    _keys(entry, where, ("kind", "node", "gpu", "params"))
    kind = _text(entry, "kind", where)
    if kind not in FAULTS:
        raise InputError(f"{where}: unknown fault kind {kind!r}; the catalog has {sorted(FAULTS)}")
    gpu = entry.get("gpu")
    if gpu is not None and (isinstance(gpu, bool) or not isinstance(gpu, int)):
        raise InputError(f"{where}: 'gpu' must be a GPU index (an integer), got {gpu!r}")
    params = {str(k): v for k, v in _mapping(entry.get("params") or {}, f"{where}.params").items()}
    fabric = FAULTS[kind].scope == "fabric"
    if fabric:
        # A fabric fault's leaves by name (the leaf label's value) or by number.
        params.update({k: _leaf(params[k], f"{where}.params.{k}") for k in FAULTS[kind].needs if k in params})
    bad = {k: v for k, v in params.items() if isinstance(v, bool) or not isinstance(v, int | float)}
    if bad:
        raise InputError(f"{where}.params: values must be numbers, got {bad}")
    if fabric and entry.get("node"):
        raise InputError(f"{where}: {kind!r} is a fault of the fabric between two leaves: it names no node")
    node = "" if fabric else _text(entry, "node", where)
    return Fault(kind, node, gpu, {k: float(v) for k, v in params.items()})


def _leaf(value: Any, where: str) -> Any:
    """A leaf label's value (``leaf-03``) as its number; anything else as it is, for the number check."""
    if isinstance(value, str):
        match = re.fullmatch(r"leaf-(\d+)", value.strip())
        if match is None:
            raise InputError(f"{where}: {value!r} is neither a leaf name (leaf-00, leaf-01, …) nor a leaf number")
        return int(match.group(1))
    return value


def _node_event(raw: Any, where: str) -> NodeEvent:
    entry = _mapping(raw, where)
    event = _text(entry, "event", where)
    if event not in _EVENTS:
        raise InputError(f"{where}: unknown node event {event!r}; known: {list(_EVENTS)}")
    if event != "join":
        _keys(entry, where, ("event", "node"))
        return NodeEvent(event, _text(entry, "node", where))
    _keys(entry, where, ("event", "count", "uncertified_taint"))
    count = entry.get("count", 1)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise InputError(f"{where}: 'count' must be an integer >= 1, got {count!r}")
    taint = entry.get("uncertified_taint", True)
    if not isinstance(taint, bool | str) or taint == "":
        raise InputError(f"{where}: 'uncertified_taint' is true, false or a taint key, got {taint!r}")
    return NodeEvent("join", None, count, taint)


def _entries(data: Mapping[str, Any], section: str, where: str) -> list[Any]:
    value = data.get(section)
    if value is None:
        return []
    if not isinstance(value, list):
        raise InputError(f"{where}: '{section}' must be a list, got {type(value).__name__}")
    return value


def parse_fault_plan(data: Any, source: str) -> FaultPlan:
    """A :class:`FaultPlan` from a decoded document; errors name ``source`` and the entry."""
    if data is None:
        return FaultPlan()
    doc = _mapping(data, source)
    _keys(doc, source, _SECTIONS)
    api = None
    if doc.get("api") is not None:
        try:
            api = ApiFaults.from_mapping(_mapping(doc["api"], f"{source}: api"))
        except InputError as exc:
            raise InputError(f"{source}: api: {exc}") from exc
    gpu = tuple(_gpu_fault(e, f"{source}: gpu[{i}]") for i, e in enumerate(_entries(doc, "gpu", source)))
    nodes = tuple(_node_event(e, f"{source}: nodes[{i}]") for i, e in enumerate(_entries(doc, "nodes", source)))
    training = tuple(
        parse_training_fault(e, f"{source}: training[{i}]") for i, e in enumerate(_entries(doc, "training", source))
    )
    return FaultPlan(api, gpu, nodes, training)


def decode(raw: bytes | str, source: str) -> Any:
    """YAML (JSON is YAML) into Python data; an :class:`InputError` naming ``source`` when it is neither,
    repeats a key in one mapping (YAML keys are unique; PyYAML would keep the last) or nests too deeply."""
    try:
        return yaml.load(raw, Loader=UniqueKeyLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise InputError(f"{source}: not valid YAML or JSON: {_one_line(exc)}") from None
    except RecursionError:
        raise InputError(f"{source}: not valid YAML or JSON: nested too deeply") from None
    except TypeError:  # the duplicate-key check meets a list or mapping as a key
        raise InputError(f"{source}: not valid YAML or JSON: a mapping key is a list or a mapping") from None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def load_fault_plan(path: str | Path) -> FaultPlan:
    """The fault document in file ``path`` (``--faults``)."""
    source = f"--faults {path}"
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{source}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise InputError(f"{source}: {exc.strerror or exc}") from exc
    return parse_fault_plan(decode(raw, source), source)


# --- applying ------------------------------------------------------------------------------------------


def check_plan(sim: SimCluster, plan: FaultPlan, source: str) -> None:
    """Check a plan against the cluster as it is, before anything is applied."""
    for i, fault in enumerate(plan.gpu):
        try:
            sim.gpu_faults.check(fault)
        except InputError as exc:
            raise InputError(f"{source}: gpu[{i}]: {exc}") from exc
    deleted: set[str] = set()
    for i, event in enumerate(plan.nodes):
        if event.node is None:
            continue
        if event.node in deleted or sim.store.get(NODES, None, event.node) is None:
            raise InputError(f"{source}: nodes[{i}]: no node {event.node!r} in the cluster")
        if event.event == "delete":
            deleted.add(event.node)
    for i, training in enumerate(plan.training):
        try:
            sim.training.check(training)
        except InputError as exc:
            raise InputError(f"{source}: training[{i}]: {exc}") from exc


def apply_plan(sim: SimCluster, plan: FaultPlan, source: str) -> dict[str, Any]:
    """Check, then apply ``plan``: API faults, node events in order, then GPU faults. Returns a summary."""
    check_plan(sim, plan, source)
    summary: dict[str, Any] = {"api": None, "gpu": [], "nodes": [], "training": []}
    if plan.api is not None:
        sim.set_faults(plan.api)
        summary["api"] = plan.api.to_mapping()
    for event in plan.nodes:
        if event.event == "join":
            taint = event.uncertified_taint
            key = f"{sim.label_prefix}/uncertified" if taint is True else (taint or None)
            names = sim.add_nodes(event.count, uncertified_taint=key)
            summary["nodes"].append({"event": "join", "nodes": names})
        else:
            assert event.node is not None
            if event.event == "delete":
                delete_node(sim, event.node)
            else:
                set_node_ready(sim, event.node, event.event == "ready")
            summary["nodes"].append({"event": event.event, "node": event.node})
    for fault in plan.gpu:
        sim.inject_fault(fault)
        summary["gpu"].append(fault_mapping(fault))
    for training in plan.training:
        sim.training.inject(training)
        summary["training"].append(training.to_mapping())
    return summary


def fault_mapping(fault: Fault) -> dict[str, Any]:
    return {"kind": fault.kind, "node": fault.node or None, "gpu": fault.gpu, "params": dict(fault.params)}


def event_mapping(event: NodeEvent) -> dict[str, Any]:
    if event.event == "join":
        return {"event": "join", "count": event.count, "uncertified_taint": event.uncertified_taint}
    return {"event": event.event, "node": event.node}


def set_node_ready(sim: SimCluster, name: str, ready: bool) -> None:
    """The kubelet of ``name`` stops (or resumes) posting Ready; see the module docstring."""
    with sim.store.lock:
        node = sim.store.get(NODES, None, name)
        if node is None:
            raise InputError(f"sim: no node {name!r} in the cluster")
        now = now_rfc3339()
        status = dict(node.get("status") or {})
        status["conditions"] = set_condition(status.get("conditions"), ready_condition(ready, now))
        spec = dict(node.get("spec") or {})
        taints = [t for t in spec.get("taints") or () if t.get("key") != _NOT_READY_KEY]
        if not ready:
            taints += [
                {"key": _NOT_READY_KEY, "effect": e, **({"timeAdded": now} if e == "NoExecute" else {})}
                for e in _NOT_READY_TAINTS
            ]
        if taints:
            spec["taints"] = taints
        else:
            spec.pop("taints", None)
        sim.store.update(NODES, {**node, "spec": spec, "status": status})


def delete_node(sim: SimCluster, name: str) -> None:
    """Delete the Node ``name`` and the pods bound to it, as pod GC does after a node is gone."""
    with sim.store.lock:
        if sim.store.get(NODES, None, name) is None:
            raise InputError(f"sim: no node {name!r} in the cluster")
        sim.store.delete(NODES, None, name)
        for pod in sim.store.list(PODS)[0]:
            if (pod.get("spec") or {}).get("nodeName") == name:
                meta = pod["metadata"]
                if sim.store.get(PODS, meta.get("namespace"), meta["name"]) is not None:
                    sim.store.delete(PODS, meta.get("namespace"), meta["name"])


def not_ready_nodes(sim: SimCluster) -> list[str]:
    return [
        n["metadata"]["name"]
        for n in sim.store.list(NODES)[0]
        if any(t.get("key") == _NOT_READY_KEY for t in (n.get("spec") or {}).get("taints") or ())
    ]


def clear(sim: SimCluster, node: str | None) -> dict[str, Any]:
    """Lift GPU faults and NotReady (of ``node``, or everywhere plus the API faults); returns a summary."""
    lifted = sim.clear_faults(node)
    lifted_training = sim.training.clear(node)
    back = [n for n in not_ready_nodes(sim) if node is None or n == node]
    for name in back:
        set_node_ready(sim, name, True)
    if node is None:
        sim.set_faults(None)
    return {
        "cleared_gpu_faults": lifted,
        "cleared_training_faults": lifted_training,
        "ready_again": back,
        "api_faults_off": node is None,
    }


def state(sim: SimCluster) -> dict[str, Any]:
    return {
        "api": sim.faults.policy.to_mapping(),
        "gpu": [fault_mapping(f) for f in sim.gpu_faults.all()],
        "not_ready": not_ready_nodes(sim),
        "training": [f.to_mapping() for f in sim.training.faults()],
    }


# --- HTTP -------------------------------------------------------------------------------------------


def _json(body: Any, code: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=code, content_type="application/json")


def _problem(message: str, code: int = 400) -> web.Response:
    return _json({"error": message}, code)


class InjectRoutes:
    """``/gpucert/inject``: the run-time face of this module."""

    def __init__(self, sim: SimCluster) -> None:
        self.sim = sim

    async def get(self, request: web.Request) -> web.Response:
        return _json(state(self.sim))

    async def post(self, request: web.Request) -> web.Response:
        source = f"POST {INJECT_PATH}"
        try:
            plan = parse_fault_plan(decode(await request.read(), source), source)
            return _json(apply_plan(self.sim, plan, source))
        except InputError as exc:
            return _problem(str(exc))

    async def delete(self, request: web.Request) -> web.Response:
        node = request.query.get("node") or None
        if node is not None and node not in self.sim.fleet.node_index:
            return _problem(f"DELETE {INJECT_PATH}: no node {node!r} in the fleet", 404)
        return _json(clear(self.sim, node))

    def routes(self) -> list[tuple[str, str, Any]]:
        return [("GET", INJECT_PATH, self.get), ("POST", INJECT_PATH, self.post), ("DELETE", INJECT_PATH, self.delete)]


# --- the command line ------------------------------------------------------------------------------


def server_url(kubeconfig: str | Path) -> str:
    """The API server URL of the current context of ``kubeconfig``."""
    where = f"--kubeconfig {kubeconfig}"
    config = read_yaml_mapping(kubeconfig, where, what="a kubeconfig (a mapping)")
    try:
        contexts = {c["name"]: c["context"] for c in config.get("contexts") or ()}
        clusters = {c["name"]: c["cluster"] for c in config.get("clusters") or ()}
        context = contexts[config["current-context"]]
        url = str(clusters[context["cluster"]]["server"]).rstrip("/")
    except (KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{where}: no server URL for the current context ({exc!r} missing)") from exc
    try:
        # The request would fail on such a URL as if the simulator were down: say what is wrong instead.
        urlsplit(url).port  # noqa: B018 - parsing the port is what raises
    except ValueError as exc:
        raise InputError(f"{where}: the cluster's server {url!r} (clusters[].cluster.server): {exc}") from None
    return url


def gpu_option(tokens: Sequence[str]) -> dict[str, Any]:
    """``--gpu KIND NODE [GPU] [NAME=VALUE …]`` as a ``gpu:`` entry; a fabric kind takes no NODE
    (``--gpu slow_uplink leaf_a=leaf-00 leaf_b=leaf-01``)."""
    where = f"--gpu {' '.join(tokens)}"
    fabric = len(tokens) >= 1 and tokens[0] in FAULTS and FAULTS[tokens[0]].scope == "fabric"
    if len(tokens) < (1 if fabric else 2):
        raise InputError(f"{where}: give KIND NODE [GPU] [NAME=VALUE …]")
    entry: dict[str, Any] = {"kind": tokens[0]} if fabric else {"kind": tokens[0], "node": tokens[1]}
    params: dict[str, float | str] = {}
    for token in tokens[1 if fabric else 2 :]:
        name, eq, value = token.partition("=")
        try:
            if eq and fabric and name in FAULTS[tokens[0]].needs and value.startswith("leaf-"):
                params[name] = value  # a leaf by name; the document's parser reads it
            elif eq:
                params[name] = float(value)
            elif "gpu" in entry:
                raise ValueError(token)
            else:
                entry["gpu"] = int(token)
        except ValueError as exc:
            raise InputError(f"{where}: {token!r} is neither a GPU index nor NAME=NUMBER") from exc
    if params:
        entry["params"] = params
    return entry


def post(url: str, method: str, body: bytes | None = None, timeout_s: float = 30.0) -> tuple[int, Any]:
    """One request to the simulator's control endpoint; (status, decoded JSON body)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(
        url, data=body, method=method, headers={"Content-Type": "application/json"} if body is not None else {}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, orjson.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, orjson.loads(raw)
        except orjson.JSONDecodeError:
            return exc.code, {"error": raw.decode(errors="replace").strip()}


def inject_command(
    *,
    kubeconfig: str | None,
    files: Sequence[str] = (),
    gpu: Sequence[Sequence[str]] = (),
    not_ready: Sequence[str] = (),
    ready: Sequence[str] = (),
    delete: Sequence[str] = (),
    join: int = 0,
    join_untainted: bool = False,
    clear: bool = False,
    clear_node: str | None = None,
) -> int:
    """``gpucert sim inject``: post one fault document to a running simulator; returns the exit status.

    The files and options merge into one document (files first, then ``--gpu``, then node events in
    the order not-ready, ready, delete, join), checked here before it is sent and again by the server,
    which applies all of it or nothing. ``--clear``/``--clear-node`` lift faults first. Without
    ``kubeconfig``, the simulator is the one ``$KUBECONFIG`` (else ``~/.kube/config``) names, as for kubectl.
    """
    from gpucert.kube import kubeconfig_file

    url = server_url(kubeconfig_file(kubeconfig)) + INJECT_PATH
    doc: dict[str, Any] = {"gpu": [], "nodes": [], "training": []}
    for path in files:
        source = f"gpucert sim inject {path}"
        try:
            raw = Path(path).read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{source}: not UTF-8 text (byte {exc.start})") from None
        except OSError as exc:
            raise InputError(f"{source}: {exc.strerror or exc}") from exc
        data = decode(raw, source)
        plan = parse_fault_plan(data, source)  # the whole file checked before anything is sent
        if plan.api is not None:
            doc["api"] = plan.api.to_mapping()
        doc["gpu"] += [fault_mapping(f) for f in plan.gpu]
        doc["nodes"] += [event_mapping(e) for e in plan.nodes]
        doc["training"] += [f.to_mapping() for f in plan.training]
    doc["gpu"] += [gpu_option(tokens) for tokens in gpu]
    doc["nodes"] += [{"event": "not_ready", "node": n} for n in not_ready]
    doc["nodes"] += [{"event": "ready", "node": n} for n in ready]
    doc["nodes"] += [{"event": "delete", "node": n} for n in delete]
    if join:
        doc["nodes"].append({"event": "join", "count": join, "uncertified_taint": not join_untainted})
    parse_fault_plan(doc, "gpucert sim inject")
    if clear or clear_node:
        query = f"?node={clear_node}" if clear_node and not clear else ""
        code, body = _send(url + query, "DELETE", None)
        if code != 200:
            raise InputError(f"gpucert sim inject: the simulator refused to clear: {_message(body)}")
        print(f"cleared: {orjson.dumps(body).decode()}")
    if not doc["gpu"] and not doc["nodes"] and not doc["training"] and "api" not in doc:
        if clear or clear_node:
            return 0
        raise InputError(
            "gpucert sim inject: nothing to inject; give a FILE, --gpu, --not-ready, --ready, "
            "--delete-node, --join or --clear"
        )
    code, body = _send(url, "POST", orjson.dumps(doc))
    if code == 400:
        raise InputError(_message(body))
    if code != 200:
        from gpucert.errors import GpucertError

        raise GpucertError(f"gpucert sim inject: the simulator answered {code}: {_message(body)}")
    print(f"injected: {orjson.dumps(body).decode()}")
    return 0


def _send(url: str, method: str, body: bytes | None) -> tuple[int, Any]:
    import urllib.error

    try:
        return post(url, method, body)
    except (urllib.error.URLError, OSError) as exc:
        from gpucert.errors import GpucertError

        raise GpucertError(f"gpucert sim inject: cannot reach the simulator at {url}: {exc}") from exc


def _message(body: Any) -> str:
    return str(body.get("error", body)) if isinstance(body, dict) else str(body)
