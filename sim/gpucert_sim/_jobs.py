"""The Job controller: a benchmark Job creates its pod, and its status follows the pod to an end.

gpucert runs every benchmark as a Job (docs/design/certify-runbook.md, "Benchmark Jobs": ``backoffLimit: 0``, a
deadline, ``ttlSecondsAfterFinished``) and waits on the Job's conditions, so these fields behave as in
kube-controller-manager:

* pods from ``spec.template``: ``generateName: <job>-``, a controller ownerReference to the Job, labels
  ``batch.kubernetes.io/controller-uid``, ``batch.kubernetes.io/job-name``, ``controller-uid`` and
  ``job-name``; ``parallelism`` pods at a time until ``completions`` succeeded (both default 1);
* ``backoffLimit`` (default 6): more failed pods than that fail the Job (``BackoffLimitExceeded``);
  a failed pod is replaced at once while the limit allows (no exponential back-off delay);
* ``completionMode: Indexed`` (how gpucert's pair benchmark runs its two pods, one per node): pod ``i``
  of ``completions`` is named ``<job>-<i>-<5 random characters>`` and carries the label and annotation
  ``batch.kubernetes.io/job-completion-index: "<i>"``, ``spec.hostname: <job>-<i>`` (its ``subdomain``
  stays the template's, so a headless Service of that name resolves it) and the environment variable
  ``JOB_COMPLETION_INDEX`` from that annotation in every container that does not set it; up to
  ``parallelism`` indexes run at once, an index whose pod failed gets a new pod while the back-off limit
  allows, and the Job completes once every index has a succeeded pod (``status.completedIndexes``, as
  ``0-1``);
* ``activeDeadlineSeconds``: counted from ``startTime``; once passed, the active pods are deleted and the
  Job fails with reason ``DeadlineExceeded``;
* ``ttlSecondsAfterFinished``: that long after it finished, the Job is deleted and its pods with it;
* status ``startTime``, ``active``, ``ready``, ``succeeded``, ``failed`` (zeros left out, as the API
  server's ``omitempty`` does), ``completionTime`` and a ``Complete`` or ``Failed`` condition;
  ``suspend: true`` is honoured by creating nothing.

Pods that ended are remembered by uid, so a failure still counts after its pod is deleted (the real
controller tracks this with a pod finalizer). ``restartPolicy: OnFailure`` is treated as Never (a failed
container fails its pod rather than restarting in place).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from ._controllers import Runtime
from ._objects import (
    JOBS,
    PODS,
    Key,
    controlling_owner,
    delete_owned_pod,
    deleting,
    key_of,
    owner_ref,
    phase,
    pod_ready,
    record_event,
)
from ._store import Obj, WatchEvent, now_rfc3339

__all__ = ["JobController"]

_COMPONENT = "job-controller"
#: The label and annotation an Indexed Job's pod carries its index in, and the variable it reaches it by.
INDEX_KEY = "batch.kubernetes.io/job-completion-index"
_INDEX_ENV = "JOB_COMPLETION_INDEX"


#: The interim condition the real Job controller sets before each terminal one.
_TARGET_OF = {"Complete": "SuccessCriteriaMet", "Failed": "FailureTarget"}


def _finished(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for cond in (job.get("status") or {}).get("conditions") or ():
        if cond.get("type") in ("Complete", "Failed") and cond.get("status") == "True":
            return dict(cond)
    return None


def _seconds_since(stamp: str | None) -> float | None:
    if not stamp:
        return None
    try:
        then = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None
    return (datetime.now(UTC) - then).total_seconds()


class JobController:
    """Runs Jobs; see the module docstring."""

    def __init__(self, runtime: Runtime) -> None:
        self.rt = runtime
        self.store = runtime.store
        self._started: dict[str, float] = {}  # job uid → startTime (monotonic), for exact deadlines
        self._finished: dict[str, float] = {}  # job uid → finish time (monotonic), for exact TTLs
        self._ended: dict[str, dict[str, tuple[str, int]]] = {}  # job uid → pod uid → (final phase, index)

    def resync(self) -> Iterable[Key]:
        return [key_of(j) for j in self.store.list(JOBS)[0]]

    def keys(self, event: WatchEvent) -> Iterable[Key]:
        if event.resource == JOBS.key:
            if event.type == "DELETED":
                uid = event.obj["metadata"].get("uid", "")
                for memory in (self._started, self._finished, self._ended):
                    memory.pop(uid, None)
                return ()
            return (key_of(event.obj),)
        if event.resource == PODS.key:
            owner = controlling_owner(event.obj, "Job", "batch/v1")
            return (owner,) if owner is not None else ()
        return ()

    def reconcile(self, key: Key) -> None:
        job = self.store.get(JOBS, key[0], key[1])
        if job is None or deleting(job):
            return
        uid = job["metadata"]["uid"]
        spec, status = job.get("spec") or {}, dict(job.get("status") or {})
        done = _finished(job)
        if done is not None:
            self._expire(job, done)
            return
        if spec.get("suspend"):
            return
        now = self.rt.now()
        if not status.get("startTime"):
            status["startTime"] = now_rfc3339()
            self._started[uid] = now
        elapsed = now - self._started.setdefault(uid, now - (_seconds_since(status["startTime"]) or 0.0))

        ended = self._ended.setdefault(uid, {})
        pods = [p for p in self.rt.pods.owned_by(uid) if not deleting(p)]
        for pod in pods:
            if phase(pod) in ("Succeeded", "Failed"):
                ended[pod["metadata"]["uid"]] = (phase(pod), pod_index(pod))
        active = [p for p in pods if phase(p) not in ("Succeeded", "Failed")]
        succeeded = sum(1 for v, _ in ended.values() if v == "Succeeded")
        failed = sum(1 for v, _ in ended.values() if v == "Failed")
        if spec.get("completionMode") == "Indexed":
            self._indexed(job, status, ended, active, failed, elapsed)
            return
        completions = spec.get("completions")
        parallelism = spec.get("parallelism", 1)
        parallelism = 1 if parallelism is None else int(parallelism)
        if self._failed(job, status, active, succeeded, failed, elapsed):
            return

        complete = succeeded >= int(completions) if completions is not None else succeeded >= 1 and not active
        if complete and not active:
            status["completionTime"] = now_rfc3339()
            self._write(
                job, status, active=0, ready=0, succeeded=succeeded, failed=failed, condition=("Complete", None, None)
            )
            record_event(self.store, job, "Normal", "Completed", "Job completed", _COMPONENT)
            return

        wanted = parallelism if completions is None else min(parallelism, int(completions) - succeeded)
        if completions is None and succeeded:
            wanted = 0  # a non-indexed Job without completions is done once one pod succeeded
        for _ in range(max(0, wanted - len(active))):
            active.append(self._create_pod(job))
        ready = sum(1 for p in active if pod_ready(p))
        self._write(job, status, active=len(active), ready=ready, succeeded=succeeded, failed=failed)
        self._wake_at_deadline(job, elapsed)

    def _indexed(
        self,
        job: Obj,
        status: dict[str, Any],
        ended: Mapping[str, tuple[str, int]],
        active: list[Obj],
        failed: int,
        elapsed: float,
    ) -> None:
        """One reconcile of an Indexed Job: a pod per index not yet succeeded, up to ``parallelism``."""
        spec = job.get("spec") or {}
        completions = int(spec.get("completions") or 1)
        parallelism = spec.get("parallelism")
        parallelism = 1 if parallelism is None else int(parallelism)  # the API's default, as for any Job
        done = sorted({i for v, i in ended.values() if v == "Succeeded" and 0 <= i < completions})
        status["completedIndexes"] = _index_ranges(done)
        if not status["completedIndexes"]:
            status.pop("completedIndexes")
        if self._failed(job, status, active, len(done), failed, elapsed):
            return
        if len(done) == completions and not active:
            status["completionTime"] = now_rfc3339()
            self._write(
                job, status, active=0, ready=0, succeeded=len(done), failed=failed, condition=("Complete", None, None)
            )
            record_event(self.store, job, "Normal", "Completed", "Job completed", _COMPONENT)
            return
        running = {pod_index(p) for p in active}
        wanted = [i for i in range(completions) if i not in running and i not in done]
        for index in wanted[: max(0, parallelism - len(active))]:
            active.append(self._create_pod(job, index))
        ready = sum(1 for p in active if pod_ready(p))
        self._write(job, status, active=len(active), ready=ready, succeeded=len(done), failed=failed)
        self._wake_at_deadline(job, elapsed)

    def _failed(
        self, job: Obj, status: dict[str, Any], active: list[Obj], succeeded: int, failed: int, elapsed: float
    ) -> bool:
        """Fail the Job past its deadline or back-off limit (its active pods deleted); whether it did."""
        spec = job.get("spec") or {}
        backoff_limit = int(spec.get("backoffLimit", 6) if spec.get("backoffLimit") is not None else 6)
        deadline = spec.get("activeDeadlineSeconds")
        failure: tuple[str, str] | None = None
        if deadline is not None and elapsed >= float(deadline):
            failure = ("DeadlineExceeded", "Job was active longer than specified deadline")
        elif failed > backoff_limit:
            failure = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        if failure is None:
            return False
        for pod in active:
            self._delete_pod(job, pod)
        self._write(
            job,
            status,
            active=0,
            ready=0,
            succeeded=succeeded,
            failed=failed + len(active),
            condition=("Failed", *failure),
        )
        record_event(self.store, job, "Warning", failure[0], failure[1], _COMPONENT)
        return True

    def _wake_at_deadline(self, job: Obj, elapsed: float) -> None:
        deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
        if deadline is not None:
            self.rt.after(float(deadline) - elapsed, self, key_of(job))

    # --- writes -------------------------------------------------------------------------------------

    def _create_pod(self, job: Obj, index: int | None = None) -> Obj:
        """A pod of ``job``'s template; with ``index``, pod ``index`` of an Indexed Job (module docstring)."""
        meta, template = job["metadata"], copy.deepcopy((job.get("spec") or {}).get("template") or {})
        tmeta = template.get("metadata") or {}
        labels = {
            **(tmeta.get("labels") or {}),
            "batch.kubernetes.io/controller-uid": meta["uid"],
            "batch.kubernetes.io/job-name": meta["name"],
            "controller-uid": meta["uid"],
            "job-name": meta["name"],
        }
        annotations = dict(tmeta.get("annotations") or {})
        spec = dict(template.get("spec") or {})
        stem = meta["name"]
        if index is not None:
            stem = f"{meta['name']}-{index}"
            labels[INDEX_KEY] = annotations[INDEX_KEY] = str(index)
            spec.setdefault("hostname", stem)
            for field in ("initContainers", "containers"):
                if spec.get(field):
                    spec[field] = [_with_index_env(c) for c in spec[field]]
        pod_meta: dict[str, Any] = {
            "generateName": f"{stem}-",
            "namespace": meta.get("namespace"),
            "labels": labels,
            "ownerReferences": [owner_ref(job)],
        }
        if annotations:
            pod_meta["annotations"] = annotations
        pod = self.store.create(
            PODS,
            {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta, "spec": spec, "status": {"phase": "Pending"}},
        )
        record_event(
            self.store, job, "Normal", "SuccessfulCreate", f"Created pod: {pod['metadata']['name']}", _COMPONENT
        )
        return pod

    def _delete_pod(self, job: Obj, pod: Obj) -> None:
        delete_owned_pod(self.store, job, pod, _COMPONENT)

    def _write(
        self,
        job: Obj,
        status: dict[str, Any],
        *,
        active: int,
        ready: int,
        succeeded: int,
        failed: int,
        condition: tuple[str, str | None, str | None] | None = None,
    ) -> None:
        new = dict(status)
        for name, value in (("active", active), ("succeeded", succeeded), ("failed", failed)):
            if value:
                new[name] = value
            else:
                new.pop(name, None)
        new["ready"] = ready
        new.setdefault("uncountedTerminatedPods", {})
        if condition is not None:
            kind, reason, message = condition
            now = now_rfc3339()
            cond: dict[str, Any] = {"type": kind, "status": "True", "lastProbeTime": now, "lastTransitionTime": now}
            if reason:
                cond.update(reason=reason, message=message)
            # Since v1.31 the Job controller first records the target it reached (SuccessCriteriaMet or
            # FailureTarget, with the same reason) and then the terminal condition, as the real one does.
            first = _TARGET_OF.get(kind)
            if first is not None:
                target = {**cond, "type": first}
                if kind == "Complete":
                    target.update(reason="CompletionsReached", message="Reached expected number of succeeded pods")
                    cond.update(reason="CompletionsReached", message="Reached expected number of succeeded pods")
                new["conditions"] = [*(new.get("conditions") or ()), target]
            new["conditions"] = [*(new.get("conditions") or ()), cond]
            self._finished[job["metadata"]["uid"]] = self.rt.now()
        self.store.update(JOBS, {**job, "status": new})

    def _expire(self, job: Obj, done: Mapping[str, Any]) -> None:
        """ttlSecondsAfterFinished: delete the finished Job (and, by GC, its pods) when its time is up."""
        ttl = (job.get("spec") or {}).get("ttlSecondsAfterFinished")
        if ttl is None:
            return
        uid, now = job["metadata"]["uid"], self.rt.now()
        since = _seconds_since(str(done.get("lastTransitionTime") or "")) or 0.0
        due = self._finished.setdefault(uid, now - since) + float(ttl)
        if now >= due:
            self.store.delete(JOBS, job["metadata"].get("namespace"), job["metadata"]["name"], propagation="Background")
        else:
            self.rt.after(due - now, self, key_of(job))


def pod_index(pod: Mapping[str, Any]) -> int:
    """The completion index of an Indexed Job's pod (its annotation, else its label); -1 for none."""
    meta = pod.get("metadata") or {}
    raw = (meta.get("annotations") or {}).get(INDEX_KEY, (meta.get("labels") or {}).get(INDEX_KEY))
    try:
        return int(str(raw))
    except ValueError:
        return -1


def _with_index_env(container: Mapping[str, Any]) -> dict[str, Any]:
    """``container`` with ``JOB_COMPLETION_INDEX`` from the pod's index annotation, unless it sets it."""
    env = list(container.get("env") or ())
    if any(e.get("name") == _INDEX_ENV for e in env):
        return dict(container)
    ref = {"fieldRef": {"fieldPath": f"metadata.annotations['{INDEX_KEY}']"}}
    return {**container, "env": [*env, {"name": _INDEX_ENV, "valueFrom": ref}]}


def _index_ranges(indexes: list[int]) -> str:
    """Sorted indexes as the API writes ``completedIndexes``: runs as ``a-b``, joined by commas."""
    runs: list[list[int]] = []
    for i in indexes:
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
