"""The kubelets: run the pods bound to each node, write their status and their logs.

gpucert watches pod phases and reads logs; DaemonSet rollouts wait for Ready. So a bound pod goes
through what a real kubelet reports: Pending → Running (``startTime``, ``podIP``, ``hostIP``,
``containerStatuses`` with ``state.running``, conditions Initialized/ContainersReady/Ready/
PodScheduled) → Ready after :attr:`SimTiming.pod_ready_s` → for a pod that ends (``restartPolicy``
Never or OnFailure) Succeeded or Failed after its run time, with ``state.terminated`` (exit code,
reason ``Completed``/``Error``). A pod with ``restartPolicy: Always`` (the default; DaemonSet pods)
runs until deleted, as a restarted container would. Pods are started only on a Ready node, and a node
that is not Ready moves none of its pods on (its kubelet is down: a running pod stays Running, as the API
server last heard, until the node is Ready again or the pod is deleted — by a Job's deadline, say).

Annotations let a test or a rehearsal shape one pod: ``sim.gpucert.io/run-seconds`` (its run time,
instead of :attr:`SimTiming.pod_run_s`), ``sim.gpucert.io/exit-code`` (how its container exits;
default 0, as gpucert's payload exits even when a GPU fails) and ``sim.gpucert.io/terminated-reason``
(the ``state.terminated.reason`` of a container that exits non-zero, e.g. ``OOMKilled`` with exit code
137; default ``Error``). Logs come from :class:`PodLogs`. The same annotations on a *Node* shape every pod
that ends (a Job's, not a DaemonSet's) started there, over the pod's own: a condition of that node — its
registry mirror down, its memory short, its benchmarks slow — among healthy ones, in a run whose pods are
all made alike.

An image that cannot be pulled: a container whose image reference contains ``does-not-exist``, or a pod
annotated ``sim.gpucert.io/image-pull-error`` (value ``ErrImagePull``, ``ImagePullBackOff`` or
``InvalidImageName``; anything else reads as ``ErrImagePull``), never starts. The pod stays Pending, bound,
its GPUs held, with ``Initialized=True``, ``Ready=False`` and the container ``waiting`` with that reason
(no back-off cycle between ``ErrImagePull`` and ``ImagePullBackOff``), until it is deleted — as by the
Job's deadline.

A training pod (annotated ``sim.gpucert.io/training``) is run by the training model (``_training.py``):
its status says it started when its job began (compressed time), its log gains the job's steps as they
happen, and it ends when its job's time is up (``restartPolicy`` Never or OnFailure; Always trains until
deleted) or when the model evicts it.

Times are measured on the loop's monotonic clock, remembered per pod uid (a pod seeded already Running
counts from when the kubelet first sees it); the timestamps written are wall-clock RFC 3339.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ._benchlogs import PodLogs, node_driver
from ._controllers import Runtime, SimTiming
from ._objects import (
    NODES,
    PODS,
    Key,
    controller_ref,
    deleting,
    key_of,
    node_ready,
    phase,
    pod_ready,
    set_condition,
    terminal,
)
from ._resources import by_kind
from ._store import Obj, WatchEvent, now_rfc3339

if TYPE_CHECKING:
    from ._gpufaults import GpuFaults
    from ._training import TrainingModel
    from .fleet import Fleet

__all__ = [
    "EXIT_CODE_ANNOTATION",
    "IMAGE_PULL_ERROR_ANNOTATION",
    "RUN_SECONDS_ANNOTATION",
    "TERMINATED_REASON_ANNOTATION",
    "UNPULLABLE_IMAGE",
    "Kubelets",
    "log_refusal",
    "node_kubelets",
]

RUN_SECONDS_ANNOTATION = "sim.gpucert.io/run-seconds"
EXIT_CODE_ANNOTATION = "sim.gpucert.io/exit-code"
TERMINATED_REASON_ANNOTATION = "sim.gpucert.io/terminated-reason"
IMAGE_PULL_ERROR_ANNOTATION = "sim.gpucert.io/image-pull-error"
#: An image reference containing this cannot be pulled.
UNPULLABLE_IMAGE = "does-not-exist"
_PULL_REASONS = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName")
#: The annotations that shape a pod, from the pod itself or (for a pod that ends, and first) from its node.
_SHAPING = (RUN_SECONDS_ANNOTATION, EXIT_CODE_ANNOTATION, TERMINATED_REASON_ANNOTATION, IMAGE_PULL_ERROR_ANNOTATION)


def _shaping(pod: Mapping[str, Any], node: Mapping[str, Any] | None) -> dict[str, Any]:
    """The shaping annotations in force for ``pod``: its own, and for a pod that ends its node's over them."""
    own = dict((pod.get("metadata") or {}).get("annotations") or {})
    if node is None or (pod.get("spec") or {}).get("restartPolicy", "Always") == "Always":
        return own
    inherited = ((node.get("metadata") or {}).get("annotations") or {}).items()
    return {**own, **{k: v for k, v in inherited if k in _SHAPING}}


def _annotation_number(notes: Mapping[str, Any], name: str) -> float | None:
    raw = notes.get(name)
    if raw is None:
        return None
    try:
        return float(raw)
    except ValueError:
        return None


def _annotation(notes: Mapping[str, Any], name: str) -> str | None:
    raw = notes.get(name)
    return None if raw is None else str(raw)


def _pull_error(pod: Mapping[str, Any], notes: Mapping[str, Any]) -> tuple[str, str] | None:
    """(waiting reason, image) when the pod's image cannot be pulled (``notes``: its shaping annotations),
    else None."""
    containers = (pod.get("spec") or {}).get("containers") or ()
    first = str((containers[0] if containers else {}).get("image") or "")
    asked = _annotation(notes, IMAGE_PULL_ERROR_ANNOTATION)
    if asked is not None:
        return (asked if asked in _PULL_REASONS else "ErrImagePull"), first
    for c in containers:
        image = str(c.get("image") or "")
        if UNPULLABLE_IMAGE in image:
            return "ErrImagePull", image
    return None


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()


def _container_id(pod: Obj, name: str) -> str:
    return "containerd://" + _digest(pod["metadata"]["uid"], name)


def _image_id(image: str) -> str:
    return f"{image.split(':', maxsplit=1)[0]}@sha256:{_digest(image)}"


def loaded_driver(runtime: Runtime) -> Callable[[str], str | None]:
    """node → the NVIDIA driver version loaded there (:func:`node_driver`: its running driver pod, else the
    host's pre-installed one), as its benchmark pods and its DCGM exporter read it; None: no driver."""
    store = runtime.store

    def driver(node: str) -> str | None:
        return node_driver(store.get(NODES, None, node), runtime.pods.on_node(node))

    return driver


def node_kubelets(
    runtime: Runtime,
    fleet: Callable[[], Fleet],
    faults: GpuFaults,
    *,
    seed: int,
    label_prefix: str,
    timing: SimTiming,
    training: TrainingModel,
    rendezvous: bool = False,
) -> Kubelets:
    """The kubelets of every node, to add to ``runtime``: their benchmark pods' logs from the fleet model and
    the GPU faults in force (with the driver each node runs), their training pods from ``training``, looked
    at again whenever its faults change."""
    store = runtime.store
    driver = loaded_driver(runtime)

    def node_up(node: str) -> bool:
        return node_ready(store.get(NODES, None, node))

    logs = PodLogs(fleet, faults, seed=seed, driver=driver, label_prefix=label_prefix, node_up=node_up)
    kubelets = Kubelets(runtime, timing, logs, training, rendezvous=rendezvous)

    def look_again() -> None:  # training faults changed: the training pods' next state may be due now
        for key in training.training_pods():
            runtime.mark(kubelets, key)

    training.on_change = look_again
    return kubelets


def _is_pair_pod(pod: Mapping[str, Any]) -> bool:
    """A pod of gpucert's pair benchmark: its container's arguments start with ``pair`` (``_benchlogs.py``)."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    return list(containers[0].get("args") or ())[:1] == ["pair"]


#: How a kubelet words a container that is not running yet, by its waiting reason (pkg/kubelet/kubelet_pods.go).
_WAITING_WORDS = {"ErrImagePull": "trying and failing to pull image", "ImagePullBackOff": "image can't be pulled"}


def log_refusal(pod: Mapping[str, Any], container: str | None) -> str | None:
    """Why a kubelet refuses (400) the log of ``container`` (the pod's first when None): it has not started.
    None when there is a log to serve."""
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    name = container or str(containers[0].get("name"))
    statuses = {s.get("name"): s for s in (pod.get("status") or {}).get("containerStatuses") or ()}
    status = statuses.get(name)
    waiting = ((status or {}).get("state") or {}).get("waiting") if status is not None else {}
    if waiting is None or (status or {}).get("lastState", {}).get("terminated"):
        return None
    reason = str(waiting.get("reason") or "ContainerCreating")
    pod_name = (pod.get("metadata") or {}).get("name")
    return f'container "{name}" in pod "{pod_name}" is waiting to start: {_WAITING_WORDS.get(reason, reason)}'


class Kubelets:
    """The kubelet of every node; see the module docstring."""

    def __init__(
        self,
        runtime: Runtime,
        timing: SimTiming,
        logs: PodLogs,
        training: TrainingModel | None = None,
        *,
        rendezvous: bool = False,
    ) -> None:
        self.rt = runtime
        self.store = runtime.store
        self.timing = timing
        self.logs = logs
        self.training = training
        #: A pair pod ends only once its peer has started, as the payload waits at its rendezvous. Needed
        #: under a real scheduler, which binds the pair's pods one after the other and, once the first has
        #: ended, no longer counts it against the second (anti-affinity ignores finished pods); the
        #: simulator's scheduler binds both in one batch.
        self.rendezvous = rendezvous
        self._bound: dict[str, float] = {}  # pod uid → when first seen bound (monotonic)
        self._started: dict[str, tuple[float, datetime]] = {}  # pod uid → container start (mono, wall)
        self._next_ip: dict[str, int] = {}

    def resync(self) -> Iterable[Key]:
        return [key_of(p) for p in self.store.list(PODS)[0] if (p.get("spec") or {}).get("nodeName")]

    def keys(self, event: WatchEvent) -> Iterable[Key]:
        if event.resource == NODES.key:
            if event.type == "DELETED":
                return ()
            # A node coming back Ready brings its pods on: its kubelet moved none of them while down.
            return [key_of(p) for p in self.rt.pods.on_node(event.obj["metadata"]["name"]) if not terminal(p)]
        if event.resource != PODS.key:
            return ()
        if event.type == "DELETED":
            uid = event.obj["metadata"].get("uid", "")
            self._bound.pop(uid, None)
            self._started.pop(uid, None)
            if self.training is not None:
                self.training.forget(uid)
            return ()
        if not (event.obj.get("spec") or {}).get("nodeName"):
            return ()
        if self.rendezvous and _is_pair_pod(event.obj):
            # Its peer waits at the rendezvous for it: a pod of the pair starting lets the other end.
            return [key_of(p) for p in self._pair_of(event.obj)]
        return (key_of(event.obj),)

    def reconcile(self, key: Key) -> None:
        pod = self.store.get(PODS, key[0], key[1])
        if pod is None or deleting(pod) or terminal(pod):
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if not node:
            return
        uid, now = pod["metadata"]["uid"], self.rt.now()
        node_obj = self.store.get(NODES, None, node)
        if not node_ready(node_obj):
            return  # the kubelet is down; a node event brings the pod back here when the node is Ready
        notes = _shaping(pod, node_obj)
        if phase(pod) == "Pending":
            due = self._bound.setdefault(uid, now) + self.timing.pod_start_s
            if now < due:
                self.rt.after(due - now, self, key)
                return
            pulling = _pull_error(pod, notes)
            if pulling is not None:
                self._pull_failed(pod, *pulling)
                return
            pod = self._start(pod, node)
        started, started_wall = self._started.setdefault(uid, (now, datetime.now(UTC)))
        ready_at = started + self.timing.pod_ready_s
        if self.training is not None and self.training.is_training(pod):
            if not pod_ready(pod) and now >= ready_at:
                self._set_ready(pod)
                pod = self.store.get(PODS, key[0], key[1]) or pod
            elif not pod_ready(pod):
                self.rt.after(ready_at - now, self, key)
            self._train(pod, node, key)
            return
        ends = (pod.get("spec") or {}).get("restartPolicy", "Always") != "Always"
        run_s = _annotation_number(notes, RUN_SECONDS_ANNOTATION)
        end_at = started + (self.timing.pod_run_s if run_s is None else max(0.0, run_s))
        if ends and self.rendezvous and _is_pair_pod(pod) and not self._pair_started(pod):
            return  # the payload waits at its rendezvous until its peer runs (marked again when it does)
        if ends and now >= end_at:
            self._finish(pod, node, started_wall, notes)
            return
        if not pod_ready(pod):
            if now >= ready_at:
                self._set_ready(pod)
            else:
                self.rt.after(ready_at - now, self, key)
        if ends:
            self.rt.after(end_at - now, self, key)

    # --- transitions --------------------------------------------------------------------------------

    def _train(self, pod: Obj, node: str, key: Key) -> None:
        """What the training model says of ``pod`` now: its log, status and Events, and when to look again."""
        assert self.training is not None
        tick = self.training.tick(pod, node)
        if tick.log is not None and tick.log != self.store.get_log(key[0], key[1], None):
            self.store.set_log(key[0], key[1], tick.log)  # the log first: a terminal phase finds it whole
        for event in tick.events:
            resource = by_kind(str(event["apiVersion"]), str(event["kind"]))
            if resource is not None:
                self.store.create(resource, event)
        if tick.status is not None:
            self.store.update(PODS, {**pod, "status": tick.status})
        if tick.wake_s is not None:
            self.rt.after(tick.wake_s, self, key)

    def _start(self, pod: Obj, node_name: str) -> Obj:
        node = self.store.get(NODES, None, node_name) or {}
        now = now_rfc3339()
        host_ip = next(
            (a["address"] for a in (node.get("status") or {}).get("addresses") or () if a.get("type") == "InternalIP"),
            "10.0.0.1",
        )
        pod_ip = self._pod_ip(node, node_name)
        ready = self.timing.pod_ready_s <= 0
        status = dict(pod.get("status") or {})
        conditions = status.get("conditions")
        for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled"):
            up = ready or kind in ("PodReadyToStartContainers", "Initialized", "PodScheduled")
            cond: dict[str, Any] = {
                "type": kind,
                "status": "True" if up else "False",
                "lastProbeTime": None,
                "lastTransitionTime": now,
            }
            if not up:
                cond.update(
                    reason="ContainersNotReady",
                    message="containers with unready status: "
                    f"[{' '.join(c['name'] for c in pod['spec'].get('containers') or ())}]",
                )
            conditions = set_condition(conditions, cond)
        status.update(
            phase="Running",
            conditions=conditions,
            hostIP=host_ip,
            hostIPs=[{"ip": host_ip}],
            podIP=pod_ip,
            podIPs=[{"ip": pod_ip}],
            startTime=now,
            qosClass=status.get("qosClass") or "BestEffort",
            containerStatuses=[
                self._container(pod, c, {"running": {"startedAt": now}}, ready=ready)
                for c in pod["spec"].get("containers") or ()
            ],
        )
        self.store.set_log(
            pod["metadata"].get("namespace", ""), pod["metadata"]["name"], self.logs.started(pod, node_name)
        )
        self._started[pod["metadata"]["uid"]] = (self.rt.now(), datetime.now(UTC))
        return self.store.update(PODS, {**pod, "status": status})

    def _pull_failed(self, pod: Obj, reason: str, image: str) -> None:
        """The container never starts: Pending, waiting on ``reason``. Written once (a write would
        bring the pod back here)."""
        status = dict(pod.get("status") or {})
        waiting = [
            ((c.get("state") or {}).get("waiting") or {}).get("reason") for c in status.get("containerStatuses") or ()
        ]
        if waiting and all(w == reason for w in waiting):
            return
        now = now_rfc3339()
        names = " ".join(str(c.get("name")) for c in pod["spec"].get("containers") or ())
        conditions = status.get("conditions")
        for kind in ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready", "PodScheduled"):
            up = kind in ("PodReadyToStartContainers", "Initialized", "PodScheduled")
            cond: dict[str, Any] = {
                "type": kind,
                "status": "True" if up else "False",
                "lastProbeTime": None,
                "lastTransitionTime": now,
            }
            if not up:
                cond.update(reason="ContainersNotReady", message=f"containers with unready status: [{names}]")
            conditions = set_condition(conditions, cond)
        message = (
            f'Back-off pulling image "{image}"'
            if reason == "ImagePullBackOff"
            else f'failed to pull and unpack image "{image}": not found'
            if reason == "ErrImagePull"
            else f'Failed to apply default image tag "{image}": invalid reference format'
        )
        statuses = []
        for c in pod["spec"].get("containers") or ():
            entry = self._container(pod, c, {"waiting": {"reason": reason, "message": message}}, ready=False)
            entry["imageID"] = ""  # nothing pulled, no container: as a kubelet reports it
            entry.pop("containerID")
            statuses.append(entry)
        status.update(
            phase="Pending", conditions=conditions, startTime=status.get("startTime") or now, containerStatuses=statuses
        )
        self.store.update(PODS, {**pod, "status": status})

    def _set_ready(self, pod: Obj) -> None:
        now = now_rfc3339()
        status = dict(pod.get("status") or {})
        conditions = status.get("conditions")
        for kind in ("ContainersReady", "Ready"):
            conditions = set_condition(
                conditions, {"type": kind, "status": "True", "lastProbeTime": None, "lastTransitionTime": now}
            )
        status["conditions"] = conditions
        status["containerStatuses"] = [{**c, "ready": True} for c in status.get("containerStatuses") or ()]
        self.store.update(PODS, {**pod, "status": status})

    def _finish(self, pod: Obj, node: str, started_wall: datetime, notes: Mapping[str, Any]) -> None:
        code = int(_annotation_number(notes, EXIT_CODE_ANNOTATION) or 0)
        meta = pod["metadata"]
        namespace = meta.get("namespace", "")
        # What the container printed at start stays its head (the stack it read then, not now).
        head = self.store.get_log(namespace, meta["name"], None)
        # The log first: whoever sees the terminal phase must find the whole log.
        self.store.set_log(
            namespace, meta["name"], self.logs.finished(pod, node, started_wall, code, head), compress=True
        )
        now = now_rfc3339()
        started_at = started_wall.strftime("%Y-%m-%dT%H:%M:%SZ")
        reason = "Completed" if code == 0 else (_annotation(notes, TERMINATED_REASON_ANNOTATION) or "Error")
        status = dict(pod.get("status") or {})
        conditions = status.get("conditions")
        for kind in ("ContainersReady", "Ready"):
            conditions = set_condition(
                conditions,
                {
                    "type": kind,
                    "status": "False",
                    "reason": "PodCompleted" if code == 0 else "PodFailed",
                    "lastProbeTime": None,
                    "lastTransitionTime": now,
                },
            )
        terminated = {
            "terminated": {
                "exitCode": code,
                "reason": reason,
                "startedAt": started_at,
                "finishedAt": now,
                "containerID": "",
            }
        }
        statuses = []
        for c in pod["spec"].get("containers") or ():
            entry = self._container(pod, c, terminated, ready=False)
            entry["state"]["terminated"]["containerID"] = entry["containerID"]
            entry["started"] = False
            statuses.append(entry)
        status.update(phase="Succeeded" if code == 0 else "Failed", conditions=conditions, containerStatuses=statuses)
        self.store.update(PODS, {**pod, "status": status})

    # --- details ------------------------------------------------------------------------------------

    def _pair_of(self, pod: Obj) -> list[Obj]:
        """The pods of ``pod``'s pair Job (``pod`` among them)."""
        ref = controller_ref(pod)
        return self.rt.pods.owned_by(str(ref["uid"])) if ref and ref.get("uid") else [pod]

    def _pair_started(self, pod: Obj) -> bool:
        """Both pods of the pair have started: the two sides met at the rendezvous."""
        return sum(1 for p in self._pair_of(pod) if phase(p) != "Pending" and not deleting(p)) >= 2

    def _container(
        self, pod: Obj, container: Mapping[str, Any], state: dict[str, Any], *, ready: bool
    ) -> dict[str, Any]:
        image = str(container.get("image") or "")
        return {
            "name": container.get("name"),
            "image": image,
            "imageID": _image_id(image),
            "containerID": _container_id(pod, str(container.get("name"))),
            "ready": ready,
            "started": "running" in state,
            "restartCount": 0,
            "state": {k: dict(v) for k, v in state.items()},
            "lastState": {},
        }

    def _pod_ip(self, node: Mapping[str, Any], name: str) -> str:
        cidr = str((node.get("spec") or {}).get("podCIDR") or "10.244.0.0/24")
        base = cidr.split("/", maxsplit=1)[0].rsplit(".", 1)[0]
        n = self._next_ip.get(name, 0)
        self._next_ip[name] = n + 1
        return f"{base}.{n % 250 + 2}"
