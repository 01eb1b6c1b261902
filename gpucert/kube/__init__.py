"""Kubernetes access for gpucert: one dict-based facade over the official client.

* :class:`Kube` — get, list (paged), server-side apply (field manager ``gpucert``), create, merge
  patch, delete, node labels, pod logs; every failure a :class:`KubeError` naming the call;
* :func:`connect` — a :class:`Kube` from a kubeconfig (file or data) or the in-cluster account;
* :class:`RetryPolicy` — transient failures (5xx, 429 after ``Retry-After``, no answer) retried
  with capped, jittered back-off inside each call.

The error hierarchy is drawn in :mod:`gpucert.kube._errors`. Nothing here imports Prefect.
"""

from ._client import FIELD_MANAGER, KINDS, Kube, Resource, describe, resource_of
from ._connect import connect
from ._errors import (
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeRequestError,
    KubeServerError,
    KubeThrottled,
    KubeUnavailable,
    KubeUnreachable,
)
from ._retry import NO_RETRY, RetryPolicy

__all__ = [
    "FIELD_MANAGER",
    "KINDS",
    "NO_RETRY",
    "Kube",
    "KubeConflict",
    "KubeError",
    "KubeForbidden",
    "KubeInvalid",
    "KubeNotFound",
    "KubeRequestError",
    "KubeServerError",
    "KubeThrottled",
    "KubeUnavailable",
    "KubeUnreachable",
    "Resource",
    "RetryPolicy",
    "connect",
    "describe",
    "resource_of",
]
