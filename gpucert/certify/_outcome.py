"""What became of a benchmark Job: a :class:`JobOutcome`, read from the Job and its pods.

A benchmark that could not run says nothing about the GPUs, so every way a Job fails outside the payload is
named here as a ``reason`` and the node recorded ``inconclusive`` for it, never a GPU verdict (a payload that ran
exits 0 even when a GPU failed: it reports ``error`` rows, which the verdict engine judges).

``state`` is ``succeeded`` (Complete, its pod there to read), ``failed`` (failed, or vanished), ``running`` or
``pending`` (no container started yet). ``reason`` is None for a Job going well, else one of :data:`Reason`:

* ``image_pull`` — a container waits with ``ErrImagePull``, ``ImagePullBackOff``, ``InvalidImageName``,
  ``ErrImageNeverPull`` or ``RegistryUnavailable``;
* ``unschedulable`` — ``PodScheduled=False`` with reason ``Unschedulable``, or the kubelet refused the pod at
  admission (``OutOf<resource>``, ``NodeAffinity``, ``UnexpectedAdmissionError``: the device plugin could not
  hand out the GPUs);
* ``oom`` — terminated ``OOMKilled``, or exit code 137 (SIGKILL: the OOM killer, as far as a pod can tell);
* ``deadline`` — the Job (or its pod) failed with ``DeadlineExceeded``;
* ``error`` — any other failure: a non-zero exit, an eviction, a container that cannot be created, a Job
  failure without a pod to explain it;
* ``vanished`` — the Job is gone (deleted, or collected by its TTL before anyone read it), or Complete without
  its pod, and so its log.

A pod stuck on an image pull or unschedulable makes the Job ``pending`` with that reason long before its
deadline, so the caller can give up early (:func:`abandon`); when the deadline then hits, the pod's reason is
kept (``image_pull`` says more than ``deadline``) while the pod is there to see.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal

from ..kube import Kube
from ._names import DEFAULT_LABEL_PREFIX

State = Literal["succeeded", "failed", "running", "pending"]
Reason = Literal["image_pull", "unschedulable", "oom", "deadline", "error", "vanished"]

_IMAGE_PULL: Final = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable"}
)
_CANNOT_START: Final = frozenset(
    {
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "PreCreateHookError",
        "PreStartHookError",
    }
)
_ADMISSION: Final = frozenset({"NodeAffinity", "UnexpectedAdmissionError", "NodeLost"})
_MESSAGE_LIMIT = 400


@dataclass(frozen=True)
class JobOutcome:
    """Where one node's benchmark Job stands.

    ``pod`` is the pod the outcome is about (the succeeded one to read, or the one that failed), None
    when there is none; ``run_id`` comes from the Job's ``<prefix>/run-id`` label.
    """

    node: str
    job: str
    state: State
    reason: Reason | None = None
    message: str = ""
    namespace: str = ""
    pod: str | None = None
    run_id: str | None = None

    @property
    def finished(self) -> bool:
        """Succeeded or failed: nothing more will happen."""
        return self.state in ("succeeded", "failed")

    @property
    def stuck(self) -> bool:
        """Not finished, yet already known not to run as it should (a pull error, no room to schedule):
        the caller may give up now rather than wait for the deadline."""
        return not self.finished and self.reason is not None


# --- reading objects ------------------------------------------------------------------------------------


def _conditions(obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in (obj.get("status") or {}).get("conditions") or () if isinstance(c, Mapping)]


def _true(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in _conditions(obj) if c.get("type") == kind and c.get("status") == "True"), None)


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _short(text: Any) -> str:
    one = " ".join(str(text or "").split())
    return one if len(one) <= _MESSAGE_LIMIT else one[: _MESSAGE_LIMIT - 1] + "…"


def _statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = pod.get("status") or {}
    return [
        s
        for key in ("initContainerStatuses", "containerStatuses")
        for s in status.get(key) or ()
        if isinstance(s, Mapping)
    ]


def _latest(pods: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The newest pod (RFC 3339 timestamps sort as text), its name breaking ties."""
    if not pods:
        return None
    return max(pods, key=lambda p: (str((p.get("metadata") or {}).get("creationTimestamp") or ""), _name(p)))


def _node_of(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], label_prefix: str) -> str:
    meta = job.get("metadata") or {}
    key = f"{label_prefix}/node"
    for source in (meta.get("annotations") or {}, meta.get("labels") or {}):
        if source.get(key):
            return str(source[key])
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName"):
            return str(pod["spec"]["nodeName"])
    return ""


# --- what a pod says ------------------------------------------------------------------------------------


def _pod_problem(pod: Mapping[str, Any]) -> tuple[Reason, str] | None:
    """Why this pod is not running as it should, or None when nothing says it is in trouble."""
    name = _name(pod)
    status = pod.get("status") or {}
    scheduled = next((c for c in _conditions(pod) if c.get("type") == "PodScheduled"), None)
    if scheduled is not None and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return "unschedulable", f"pod {name} cannot be scheduled: {_short(scheduled.get('message'))}"
    pod_reason = str(status.get("reason") or "")
    pod_message = _short(status.get("message"))
    if pod_reason.startswith("OutOf") or pod_reason in _ADMISSION:
        return "unschedulable", f"pod {name} was refused by the node: {pod_reason}: {pod_message}"
    if pod_reason == "DeadlineExceeded":
        return "deadline", f"pod {name} ran past its deadline: {pod_message}"
    for cs in _statuses(pod):
        for state in (cs.get("state") or {}, cs.get("lastState") or {}):
            waiting = state.get("waiting") or {}
            why = str(waiting.get("reason") or "")
            if why in _IMAGE_PULL:
                image = cs.get("image") or "the image"
                return ("image_pull", f"pod {name} cannot pull {image}: {why}: {_short(waiting.get('message'))}")
            if why in _CANNOT_START:
                said = _short(waiting.get("message"))
                return "error", f"pod {name}: container {cs.get('name')} cannot start: {why}: {said}"
            ended = state.get("terminated") or {}
            code = ended.get("exitCode")
            if not ended or code in (0, None):
                continue
            detail = f"container {cs.get('name')} exited {code} ({ended.get('reason') or 'Error'})"
            tail = _short(ended.get("message"))
            if ended.get("reason") == "OOMKilled" or code == 137:
                return "oom", f"pod {name}: {detail}: out of memory" + (f": {tail}" if tail else "")
            return "error", f"pod {name}: {detail}" + (f": {tail}" if tail else "")
    if _phase(pod) == "Failed":
        return "error", f"pod {name} failed: {pod_reason or 'no reason given'}" + (
            f": {pod_message}" if pod_message else ""
        )
    return None


# --- the classification ---------------------------------------------------------------------------------


def classify(
    job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], *, label_prefix: str = DEFAULT_LABEL_PREFIX
) -> JobOutcome:
    """The :class:`JobOutcome` of a benchmark Job, from the Job and the pods it owns (any order).

    The node is the Job's ``<prefix>/node`` annotation (or label), else where a pod was bound. Never
    raises for an odd object: what cannot be read counts as absent.
    """
    meta = job.get("metadata") or {}
    name = str(meta.get("name") or "")
    run_id = (meta.get("labels") or {}).get(f"{label_prefix}/run-id")
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")] or list(pods)

    def outcome(state: State, reason: Reason | None, message: str, pod: Mapping[str, Any] | None) -> JobOutcome:
        return JobOutcome(
            node=_node_of(job, pods, label_prefix),
            job=name,
            state=state,
            reason=reason,
            message=message,
            namespace=str(meta.get("namespace") or ""),
            pod=_name(pod) if pod is not None else None,
            run_id=str(run_id) if run_id else None,
        )

    if _true(job, "Complete") or _true(job, "SuccessCriteriaMet"):
        done = _latest([p for p in pods if _phase(p) == "Succeeded"])
        if done is None:
            return outcome(
                "failed",
                "vanished",
                f"Job {name} completed but its pod is gone (deleted, or collected with the Job): "
                "its results cannot be read",
                None,
            )
        return outcome("succeeded", None, f"Job {name} completed", done)

    failed = _true(job, "Failed") or _true(job, "FailureTarget")
    if failed is not None:
        why = str(failed.get("reason") or "")
        said = _short(failed.get("message")) or why or "failed"
        # The pods that ended (or are being deleted) say more than the Job's condition.
        candidates = [p for p in pods if _phase(p) == "Failed"] or list(pods)
        pod = _latest(candidates)
        problem = _pod_problem(pod) if pod is not None else None
        if why == "DeadlineExceeded":
            if problem is not None and problem[0] in ("image_pull", "unschedulable"):
                reason, message = problem
                return outcome("failed", reason, f"{message} (then the Job's deadline passed)", pod)
            return outcome("failed", "deadline", f"Job {name} ran past its deadline: {said}", pod)
        if problem is not None:
            return outcome("failed", problem[0], problem[1], pod)
        return outcome("failed", "error", f"Job {name} failed: {why or 'no reason given'}: {said}", pod)

    pod = _latest(live)
    if pod is None:
        return outcome("pending", None, f"Job {name}: no pod yet", None)
    problem = _pod_problem(pod)
    phase = _phase(pod)
    if phase == "Failed":
        # With backoffLimit 0 a failed pod is the end, even before the Job controller says so.
        spec = job.get("spec") or {}
        limit = spec.get("backoffLimit")
        failures = max(int((job.get("status") or {}).get("failed") or 0), sum(1 for p in pods if _phase(p) == "Failed"))
        if failures > int(6 if limit is None else limit):
            reason, message = problem or ("error", f"pod {_name(pod)} failed")
            return outcome("failed", reason, message, pod)
        return outcome("running", None, f"pod {_name(pod)} failed; the Job tries again", pod)
    if phase == "Succeeded":
        return outcome("running", None, f"pod {_name(pod)} succeeded; the Job is completing", pod)
    if phase == "Running":
        return outcome("running", None, f"pod {_name(pod)} is running", pod)
    if problem is not None:
        return outcome("pending", problem[0], problem[1], pod)
    return outcome("pending", None, f"pod {_name(pod)} is pending", pod)


# --- through the API ------------------------------------------------------------------------------------


def job_pods(kube: Kube, job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The pods a Job owns, found by its ``controller-uid`` label: a pod of an earlier Job of the same
    name never counts. Raises :class:`~gpucert.kube.KubeError` when the API call fails."""
    meta = job.get("metadata") or {}
    uid = meta.get("uid")
    if not uid:
        return []
    return kube.list_objects(
        "v1", "Pod", meta.get("namespace"), label_selector=f"batch.kubernetes.io/controller-uid={uid}"
    )


def observe(
    kube: Kube, namespace: str, name: str, *, node: str = "", label_prefix: str = DEFAULT_LABEL_PREFIX
) -> JobOutcome:
    """Read the Job ``namespace/name`` and its pods and :func:`classify` them; a Job that is not there
    is ``failed``/``vanished`` for ``node``. Raises :class:`~gpucert.kube.KubeError` when the API fails."""
    job = kube.find("batch/v1", "Job", name, namespace)
    if job is None:
        return JobOutcome(
            node=node,
            job=name,
            state="failed",
            reason="vanished",
            message=f"Job {namespace}/{name} is gone (deleted, or collected after ttlSecondsAfterFinished)",
            namespace=namespace,
        )
    found = classify(job, job_pods(kube, job), label_prefix=label_prefix)
    return replace(found, node=found.node or node)


def abandon(kube: Kube, outcome: JobOutcome) -> JobOutcome:
    """Give up on a Job (one that is :attr:`~JobOutcome.stuck`, say): delete it and its pods, and return
    the outcome as ``failed`` with the same reason (``error`` when it had none). Raises
    :class:`~gpucert.kube.KubeError` when the delete fails; a Job already gone is no error."""
    kube.delete("batch/v1", "Job", outcome.job, outcome.namespace, propagation="Background")
    if outcome.state == "failed":
        return outcome
    reason: Reason = outcome.reason or "error"
    return replace(outcome, state="failed", reason=reason, message=f"{outcome.message} (gave up; Job deleted)")
