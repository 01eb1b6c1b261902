"""The Job controller: a benchmark Job creates its pod, and its status follows the pod to an end.

gpucert runs every benchmark as a Job (DESIGN.md "Kubernetes conventions": ``backoffLimit: 0``, a
deadline, ``ttlSecondsAfterFinished``) and waits on the Job's conditions, so these fields behave as in
kube-controller-manager:

* pods from ``spec.template``: ``generateName: <job>-``, a controller ownerReference to the Job, labels
  ``batch.kubernetes.io/controller-uid``, ``batch.kubernetes.io/job-name``, ``controller-uid`` and
  ``job-name``; ``parallelism`` pods at a time until ``completions`` succeeded (both default 1);
* ``backoffLimit`` (default 6): more failed pods than that fail the Job (``BackoffLimitExceeded``);
  a failed pod is replaced at once while the limit allows (no exponential back-off delay);
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
        self._ended: dict[str, dict[str, str]] = {}  # job uid → pod uid → final phase

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
                ended[pod["metadata"]["uid"]] = phase(pod)
        active = [p for p in pods if phase(p) not in ("Succeeded", "Failed")]
        succeeded = sum(1 for v in ended.values() if v == "Succeeded")
        failed = sum(1 for v in ended.values() if v == "Failed")
        completions = spec.get("completions")
        parallelism = spec.get("parallelism", 1)
        parallelism = 1 if parallelism is None else int(parallelism)
        backoff_limit = int(spec.get("backoffLimit", 6) if spec.get("backoffLimit") is not None else 6)
        deadline = spec.get("activeDeadlineSeconds")

        failure: tuple[str, str] | None = None
        if deadline is not None and elapsed >= float(deadline):
            failure = ("DeadlineExceeded", "Job was active longer than specified deadline")
        elif failed > backoff_limit:
            failure = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
        if failure is not None:
            for pod in active:
                self._delete_pod(job, pod)
            failed += len(active)
            self._write(
                job,
                status,
                active=0,
                ready=0,
                succeeded=succeeded,
                failed=failed,
                condition=("Failed", *failure),
            )
            record_event(self.store, job, "Warning", failure[0], failure[1], _COMPONENT)
            return

        complete = succeeded >= int(completions) if completions is not None else succeeded >= 1 and not active
        if complete and not active:
            status["completionTime"] = now_rfc3339()
            self._write(
                job,
                status,
                active=0,
                ready=0,
                succeeded=succeeded,
                failed=failed,
                condition=("Complete", None, None),
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
        if deadline is not None:
            self.rt.after(float(deadline) - elapsed, self, key)

    # --- writes -------------------------------------------------------------------------------------

    def _create_pod(self, job: Obj) -> Obj:
        meta, template = job["metadata"], copy.deepcopy((job.get("spec") or {}).get("template") or {})
        tmeta = template.get("metadata") or {}
        labels = {
            **(tmeta.get("labels") or {}),
            "batch.kubernetes.io/controller-uid": meta["uid"],
            "batch.kubernetes.io/job-name": meta["name"],
            "controller-uid": meta["uid"],
            "job-name": meta["name"],
        }
        pod_meta: dict[str, Any] = {
            "generateName": f"{meta['name']}-",
            "namespace": meta.get("namespace"),
            "labels": labels,
            "ownerReferences": [owner_ref(job)],
        }
        if tmeta.get("annotations"):
            pod_meta["annotations"] = dict(tmeta["annotations"])
        pod = self.store.create(
            PODS,
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": pod_meta,
                "spec": template.get("spec") or {},
                "status": {"phase": "Pending"},
            },
        )
        record_event(
            self.store,
            job,
            "Normal",
            "SuccessfulCreate",
            f"Created pod: {pod['metadata']['name']}",
            _COMPONENT,
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
            cond: dict[str, Any] = {
                "type": kind,
                "status": "True",
                "lastProbeTime": now,
                "lastTransitionTime": now,
            }
            if reason:
                cond.update(reason=reason, message=message)
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
            self.store.delete(
                JOBS, job["metadata"].get("namespace"), job["metadata"]["name"], propagation="Background"
            )
        else:
            self.rt.after(due - now, self, key_of(job))
