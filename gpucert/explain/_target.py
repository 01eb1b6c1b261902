"""Finding the job: its pods, their nodes, the GPUs each pod holds, and the window to explain.

A job is named ``NAMESPACE/NAME`` and found by what its controller stamps on its pods (:data:`JOB_LABELS`): a
``batch/v1`` Job by its UID first (``batch.kubernetes.io/controller-uid``, ``controller-uid`` before Kubernetes
1.27), so a Job deleted and created again under the same name is not mixed with its predecessor's pods; then a
JobSet's or a Kubeflow PyTorchJob's or MPIJob's label. Only pods are read, never the JobSet or PyTorchJob objects
themselves: what matters (nodes, GPUs, start and end) is on the pods, and reading pods needs no permission on
those custom resources. ``--selector`` takes any set of pods instead (in one namespace, or in all).

Which GPUs a pod holds: the pod labels dcgm-exporter puts on each GPU's series (:func:`assign_gpus`), else the
device plugin's allocation (a pod that requests every ``nvidia.com/gpu`` of its node holds them all); otherwise
they are unknown and the notes say so — never a guess.

The window: ``since``/``until`` when given (RFC 3339 / ISO 8601, UTC when no zone is written, or a duration ago:
``90m``, ``6h``, ``2d``), else the job's lifetime: from the earliest pod start to the last container's end, or to
now while any pod has not finished.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from .._names import check_label_selector, dns_label_ok, dns_subdomain_ok
from ..errors import InputError
from ..kube import Kube, KubeError, KubeNotFound
from ._grid import utc

__all__ = [
    "JOB_LABELS",
    "LABEL_PRESETS",
    "JobTarget",
    "LabelMap",
    "TargetPod",
    "assign_gpus",
    "holders_at",
    "parse_job",
    "parse_moment",
    "parse_time",
    "resolve_target",
    "workload_of",
]

GPU_RESOURCE = "nvidia.com/gpu"
#: (kind, pod label naming the job), tried in order after a batch/v1 Job of the name.
JOB_LABELS: tuple[tuple[str, str], ...] = (
    ("Job", "batch.kubernetes.io/job-name"),
    ("Job", "job-name"),
    ("JobSet", "jobset.sigs.k8s.io/jobset-name"),
    ("PyTorchJob/MPIJob", "training.kubeflow.org/job-name"),
)
_UID_LABELS = ("batch.kubernetes.io/controller-uid", "controller-uid")
#: training-operator's operator-name label → the kind it runs.
_KUBEFLOW_KINDS = {"pytorchjob-controller": "PyTorchJob", "mpijob-controller": "MPIJob"}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h|d|w)\s*$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DONE = ("Succeeded", "Failed")


@dataclass(frozen=True)
class TargetPod:
    """One pod of the job, as the API server reports it."""

    namespace: str
    name: str
    uid: str
    #: The node it was bound to; None for a pod never scheduled.
    node: str | None
    phase: str
    #: ``status.reason`` (``Evicted``, ``Preempted`` …), ``""`` when none.
    reason: str
    #: ``nvidia.com/gpu`` the pod requests (its containers' limits, else requests).
    gpus: int
    #: ``nvidia.com/gpu`` its node advertises (allocatable, else capacity); 0 when unknown.
    node_gpus: int
    started: pd.Timestamp | None
    ended: pd.Timestamp | None
    containers: tuple[str, ...] = ()
    #: Container terminations its status still shows (the last of each container, and a restarted one's
    #: previous): (reason, when, container), e.g. ``("OOMKilled", …, "train")``.
    terminations: tuple[tuple[str, pd.Timestamp, str], ...] = ()

    @property
    def holds_node(self) -> bool:
        """Whether the device plugin must have given it every GPU of its node (it asked for all of them)."""
        return self.node is not None and self.gpus > 0 and 0 < self.node_gpus <= self.gpus


@dataclass(frozen=True)
class JobTarget:
    """The job to explain: its pods and the window, and what could not be told about them."""

    #: ``namespace/name``, or ``selector <S>`` for a set of pods.
    job: str
    #: ``Job``, ``JobSet``, ``PyTorchJob``, ``MPIJob``, ``PyTorchJob/MPIJob`` or ``pods`` (a selector).
    kind: str
    namespace: str | None
    #: The label selector its pods were listed by.
    selector: str
    pods: tuple[TargetPod, ...]
    window: tuple[pd.Timestamp, pd.Timestamp]
    notes: tuple[str, ...] = ()

    @property
    def nodes(self) -> list[str]:
        """The nodes its pods ran on, sorted."""
        return sorted({p.node for p in self.pods if p.node})


# --- input ----------------------------------------------------------------------------------------------


def parse_job(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` → (namespace, name); raises :class:`InputError` naming what is wrong."""
    namespace, slash, name = text.strip().partition("/")
    if not slash or not namespace or not name or "/" in name:
        raise InputError(f"job {text!r}: write NAMESPACE/NAME, e.g. team-a/llama-pretrain")
    if not dns_label_ok(namespace):
        raise InputError(f"job {text!r}: {namespace!r} is not a namespace name (a DNS label)")
    if not dns_subdomain_ok(name):
        raise InputError(f"job {text!r}: {name!r} is not an object name (a DNS subdomain)")
    return namespace, name


def parse_moment(text: str, *, now: datetime, what: str = "time") -> pd.Timestamp:
    """An RFC 3339 / ISO 8601 time (UTC when it names no zone) or a duration ago (``90m``, ``6h``, ``2d``,
    ``1w``), as a UTC timestamp; raises :class:`InputError` naming ``what``."""
    duration = _DURATION.match(text)
    if duration:
        seconds = float(duration.group(1)) * _UNIT_S[duration.group(2)]
        return pd.Timestamp(now - timedelta(seconds=seconds)).tz_convert(UTC)
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise InputError(
            f"{what} {text!r}: write an ISO 8601 time (2026-11-02T10:00:00Z) or a duration ago (90m, 6h, 2d)"
        ) from None
    return utc(pd.Timestamp(moment))


# --- resolution -----------------------------------------------------------------------------------------


def resolve_target(
    kube: Kube,
    job: str | None = None,
    *,
    selector: str | None = None,
    since: str | datetime | None = None,
    until: str | datetime | None = None,
    now: datetime | None = None,
) -> JobTarget:
    """The job ``NAMESPACE/NAME`` (or the pods of ``selector``, within the job's namespace when both are
    given, else in every namespace; ``job`` may then be just ``NAMESPACE``) with its window (see the module
    docstring).

    Raises :class:`InputError` for a malformed name, selector or time, a window that ends before it
    starts, a job no pod belongs to (``unknown job``) or whose pods are all gone; the
    :class:`~gpucert.kube.KubeError` of a cluster that does not answer.
    """
    now = now or datetime.now(UTC)
    notes: list[str] = []
    if selector is not None:
        check_label_selector(selector)
        namespace = None
        if job:
            namespace = job.strip().rstrip("/") if "/" not in job.strip().rstrip("/") else parse_job(job)[0]
            if not dns_label_ok(namespace):
                raise InputError(f"job {job!r}: {namespace!r} is not a namespace name (a DNS label)")
        label = job.strip() if job and "/" in job.strip().rstrip("/") else f"selector {selector}"
        raw = _list_pods(kube, namespace, selector)
        if not raw:
            where = f"namespace {namespace}" if namespace else "any namespace"
            raise InputError(f"no pods match the selector {selector!r} in {where}")
        kind, used = "pods", selector
    else:
        if not job:
            raise InputError("name the job as NAMESPACE/NAME, or give --selector")
        namespace, name = parse_job(job)
        label = f"{namespace}/{name}"
        kind, used, raw = _find_job(kube, namespace, name)

    nodes = _node_gpus(kube, {str(node) for p in raw if (node := (p.get("spec") or {}).get("nodeName"))})
    pods = tuple(sorted((_pod(p, nodes) for p in raw), key=lambda p: (p.namespace, p.name)))
    unscheduled = [p.name for p in pods if p.node is None]
    if unscheduled:
        notes.append(f"{len(unscheduled)} pod(s) never scheduled (no node to read): {_few(unscheduled)}")
    if not any(p.node for p in pods):
        raise InputError(f"{label}: none of its {len(pods)} pod(s) was ever scheduled on a node")
    window = _window(pods, since=since, until=until, now=now)
    return JobTarget(
        job=label, kind=kind, namespace=namespace, selector=used, pods=pods, window=window, notes=tuple(notes)
    )


def _find_job(kube: Kube, namespace: str, name: str) -> tuple[str, str, list[dict[str, Any]]]:
    """(kind, selector, raw pods) of the job; raises :class:`InputError` when nothing is found."""
    job_obj = kube.find("batch/v1", "Job", name, namespace)
    if job_obj is not None:
        uid = str((job_obj.get("metadata") or {}).get("uid") or "")
        for key in _UID_LABELS if uid else ():
            found = _list_pods(kube, namespace, f"{key}={uid}")
            if found:
                return "Job", f"{key}={uid}", found
    for kind, key in JOB_LABELS:
        found = _list_pods(kube, namespace, f"{key}={name}")
        if found:
            named = kind
            if kind == "PyTorchJob/MPIJob":
                operators = {_labels(p).get("training.kubeflow.org/operator-name") for p in found}
                kinds = {_KUBEFLOW_KINDS[o] for o in operators if o in _KUBEFLOW_KINDS}
                named = kinds.pop() if len(kinds) == 1 else kind
            return named, f"{key}={name}", found
    if job_obj is not None:
        raise InputError(
            f"Job {namespace}/{name} has no pods left (deleted, or removed by ttlSecondsAfterFinished): "
            "nothing to explain"
        )
    raise InputError(
        f"unknown job {namespace}/{name}: no Job of that name and no pod labelled as a Job, JobSet, "
        "PyTorchJob or MPIJob of it (give --selector for another set of pods)"
    )


def _list_pods(kube: Kube, namespace: str | None, selector: str) -> list[dict[str, Any]]:
    try:
        return kube.list_objects("v1", "Pod", namespace, label_selector=selector)
    except KubeError as exc:
        if getattr(exc, "status", None) == 400:
            raise InputError(f"label selector {selector!r}: the API server refused it: {exc}") from None
        raise


def _labels(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _node_gpus(kube: Kube, names: Iterable[str]) -> dict[str, int]:
    """Node → ``nvidia.com/gpu`` it advertises (allocatable, else capacity); a node gone reads 0."""
    out: dict[str, int] = {}
    for name in sorted(names):
        try:
            node = kube.get("v1", "Node", name)
        except KubeNotFound:
            out[name] = 0
            continue
        status = node.get("status") or {}
        amount = (status.get("allocatable") or {}).get(GPU_RESOURCE) or (status.get("capacity") or {}).get(GPU_RESOURCE)
        out[name] = _count(amount)
    return out


def _count(amount: object) -> int:
    try:
        return int(str(amount)) if amount not in (None, "") else 0
    except ValueError:
        return 0


def _gpu_request(spec: Mapping[str, Any]) -> int:
    """``nvidia.com/gpu`` of the pod: its containers' limits (where extended resources go), else requests."""
    total = 0
    for container in spec.get("containers") or ():
        resources = container.get("resources") or {}
        amount = (resources.get("limits") or {}).get(GPU_RESOURCE)
        if amount is None:
            amount = (resources.get("requests") or {}).get(GPU_RESOURCE)
        total += _count(amount)
    return total


def parse_time(value: object) -> pd.Timestamp | None:
    """An API server's timestamp (RFC 3339) in UTC; None when empty or not a time."""
    if not value:
        return None
    try:
        return utc(pd.Timestamp(str(value)))
    except ValueError:
        return None


def _pod(raw: Mapping[str, Any], node_gpus: Mapping[str, int]) -> TargetPod:
    meta, spec, status = raw.get("metadata") or {}, raw.get("spec") or {}, raw.get("status") or {}
    node = spec.get("nodeName") or None
    phase = str(status.get("phase") or "Unknown")
    ends = []
    terminations = []
    for cs in status.get("containerStatuses") or []:
        finished = parse_time(((cs.get("state") or {}).get("terminated") or {}).get("finishedAt"))
        if finished is not None:
            ends.append(finished)
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            done = state.get("terminated") or {}
            when = parse_time(done.get("finishedAt"))
            if when is not None and done.get("reason") not in (None, "", "Completed"):
                terminations.append((str(done["reason"]), when, str(cs.get("name") or "")))
    ended = max(ends) if ends and phase in _DONE else None
    if phase in _DONE and ended is None:
        # An evicted pod has no terminated container state: its end is the last condition change.
        changes = [parse_time(c.get("lastTransitionTime")) for c in status.get("conditions") or ()]
        ended = max((c for c in changes if c is not None), default=None)
    return TargetPod(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        node=str(node) if node else None,
        phase=phase,
        reason=str(status.get("reason") or ""),
        gpus=_gpu_request(spec),
        node_gpus=node_gpus.get(str(node), 0) if node else 0,
        started=parse_time(status.get("startTime")),
        ended=ended,
        containers=tuple(str(c.get("name")) for c in spec.get("containers") or () if c.get("name")),
        terminations=tuple(sorted(set(terminations), key=lambda t: t[1])),
    )


def _window(
    pods: Sequence[TargetPod], *, since: str | datetime | None, until: str | datetime | None, now: datetime
) -> tuple[pd.Timestamp, pd.Timestamp]:
    """(start, end) of the window: as given, else the pods' lifetime (see the module docstring)."""
    now_ts = pd.Timestamp(now).tz_convert(UTC)
    starts = [p.started for p in pods if p.started is not None]
    running = any(p.phase not in _DONE for p in pods if p.node)
    ends = [p.ended for p in pods if p.ended is not None]
    default_end = now_ts if running or not ends else min(max(ends), now_ts)
    end = _given(until, now, "--until") if until is not None else default_end
    if since is not None:
        start = _given(since, now, "--since")
    elif starts:
        start = min(starts)
    else:
        raise InputError("none of the job's pods has started yet (no start time): give --since")
    if start >= end:
        raise InputError(
            f"the window {start:%Y-%m-%d %H:%M:%S} .. {end:%Y-%m-%d %H:%M:%S} UTC is empty: "
            "--since must come before --until (and before the job's end)"
        )
    if start > now_ts:
        raise InputError(f"--since {start:%Y-%m-%d %H:%M:%S} UTC lies in the future")
    return start, min(end, now_ts)


def _given(value: str | datetime, now: datetime, what: str) -> pd.Timestamp:
    if isinstance(value, datetime):
        return utc(pd.Timestamp(value))
    return parse_moment(value, now=now, what=what)


def _few(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


# --- which GPUs each pod holds ----------------------------------------------------------------------------

#: Where the workload's pod is named on a DCGM (or any scraped) series, most specific first. Behind a
#: ServiceMonitor or PodMonitor with ``honorLabels: false`` (the GPU Operator's default) the exporter's own
#: ``pod``/``namespace``/``container`` are the target's, and dcgm-exporter's are renamed ``exported_*``.
_WORKLOAD_LABELS = (("exported_namespace", "exported_pod"), ("namespace", "pod"))


def workload_of(
    labels: Mapping[str, str], pairs: Sequence[tuple[str, str]] = _WORKLOAD_LABELS
) -> tuple[str, str | None]:
    """(namespace, pod) of the workload a series names: by the first (namespace label, pod label) of ``pairs``
    whose pod label is set — by default ``exported_pod`` where the scrape renamed dcgm-exporter's labels, else
    ``pod``; (``""``, None) when it names none."""
    for namespace_label, pod_label in pairs:
        pod = labels.get(pod_label)
        if pod:
            return labels.get(namespace_label) or "", pod
    return "", None


#: ``--labels`` presets: the GPU Operator's ServiceMonitor (``honorLabels: false``: only ``exported_*`` name the
#: workload, ``pod`` is the exporter's own) and a plain scrape honouring dcgm-exporter's labels.
LABEL_PRESETS: Mapping[str, tuple[tuple[str, str], ...]] = {
    "operator": (("exported_namespace", "exported_pod"),),
    "plain": (("namespace", "pod"),),
}
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


@dataclass(frozen=True)
class LabelMap:
    """Which labels of the scraped series name the workload's pod and namespace, and the node, where
    explain's own detection cannot tell (``--labels``, :meth:`parse`; docs/design/explain.md).

    ``workload``: the (namespace label, pod label) pairs read on dcgm-exporter's series, first set wins;
    ``node``: the one label naming the Kubernetes node on every source (None: detected).
    """

    workload: tuple[tuple[str, str], ...] = _WORKLOAD_LABELS
    node: str | None = None

    @property
    def job_workload(self) -> tuple[tuple[str, str], ...]:
        """The pairs the job's own series are read by: the told ones, then the defaults."""
        return tuple(dict.fromkeys([*self.workload, *_WORKLOAD_LABELS]))

    @classmethod
    def parse(cls, text: str | None) -> LabelMap:
        """``operator``, ``plain``, or ``pod=LABEL,namespace=LABEL`` and/or ``node=LABEL`` (a preset may be
        followed by ``,node=LABEL``); None or empty: detect. Raises :class:`InputError` naming the bad part."""
        if not text or not text.strip():
            return cls()
        workload: tuple[tuple[str, str], ...] | None = None
        told: dict[str, str] = {}
        for part in (p.strip() for p in text.split(",")):
            key, eq, value = part.partition("=")
            if not eq and part in LABEL_PRESETS and workload is None:
                workload = LABEL_PRESETS[part]
                continue
            if not eq or key not in ("pod", "namespace", "node") or key in told or not _LABEL_NAME.match(value):
                raise InputError(
                    f"--labels {text!r}: {part!r} is not one of operator, plain, pod=LABEL, "
                    "namespace=LABEL, node=LABEL (each once, Prometheus label names)"
                )
            told[key] = value
        if ("pod" in told) != ("namespace" in told) or (workload is not None and "pod" in told):
            raise InputError(
                f"--labels {text!r}: give pod=LABEL and namespace=LABEL together, or a preset "
                f"({', '.join(LABEL_PRESETS)})"
            )
        if "pod" in told:
            workload = ((told["namespace"], told["pod"]),)
        return cls(workload=workload or _WORKLOAD_LABELS, node=told.get("node"))


def assign_gpus(
    target: JobTarget, series_labels: Iterable[tuple[str, int, Mapping[str, str]]], labels: LabelMap | None = None
) -> tuple[dict[str, tuple[TargetPod, ...]], list[str]]:
    """How the GPUs of the job's nodes map to its pods where the DCGM series do not say; returns node → the
    pods that held all of its GPUs (the device plugin's allocation), earliest start first, and notes.

    ``series_labels`` are (node, gpu index, labels) of the DCGM series read on the job's nodes; a node whose
    series name a pod of the job needs no fallback. On any other node, the pods that requested every GPU of
    the node held them all, one after the other (a replacement after an eviction: :func:`holder_at`). The
    notes name the pods whose GPUs cannot be told and the nodes with no series at all.
    """
    job_pods = {(p.namespace, p.name) for p in target.pods}
    labelled: set[str] = set()
    seen: set[str] = set()
    pairs = (labels or LabelMap()).workload
    for node, _gpu, series in series_labels:
        seen.add(node)
        if workload_of(series, pairs) in job_pods:
            labelled.add(node)
    whole: dict[str, tuple[TargetPod, ...]] = {}
    unknown: list[str] = []
    silent: list[str] = []
    by_node: dict[str, list[TargetPod]] = {}
    for p in target.pods:
        if p.node:
            by_node.setdefault(p.node, []).append(p)
    for node, pods in sorted(by_node.items()):
        if node not in seen:
            silent.append(node)
        if node in labelled:
            continue
        holders = [p for p in pods if p.holds_node]
        if holders:
            whole[node] = tuple(sorted(holders, key=lambda p: (p.started or _EPOCH, p.name)))
        unknown += [p.name for p in pods if not p.holds_node]
    notes = []
    if silent:
        how = (
            ""
            if labels is not None and labels.node
            else (" (if its series name the node by another label, tell explain which: --labels node=LABEL)")
        )
        notes.append(f"no DCGM series in Prometheus for {len(silent)} node(s) of the job: {_few(silent)}{how}")
    if unknown:
        notes.append(
            f"which GPUs {len(unknown)} pod(s) hold is unknown (no pod labels on the DCGM series: turn on "
            f"dcgm-exporter's Kubernetes mode; and they do not request every GPU of their node): {_few(unknown)}"
        )
    return whole, notes


_EPOCH = pd.Timestamp(0, tz=UTC)


def holders_at(holders: Sequence[TargetPod], unix_s: npt.NDArray[np.float64]) -> npt.NDArray[np.intp]:
    """Of the pods that held a whole node one after the other (earliest first), the index of the one holding it
    at each of the moments ``unix_s``: the last to have started by then (the first, before any started)."""
    starts = np.array([(h.started or _EPOCH).timestamp() for h in holders])
    return np.clip(np.searchsorted(starts, unix_s, side="right") - 1, 0, len(holders) - 1)
