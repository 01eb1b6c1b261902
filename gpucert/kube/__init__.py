"""Kubernetes access for gpucert: one dict-based facade over the official client.

* :class:`Kube` — get, list (paged), server-side apply (field manager ``gpucert``), create, merge
  patch, delete, node labels, pod logs; every failure a :class:`KubeError` naming the call;
* :func:`connect` — a :class:`Kube` from a kubeconfig (file or data) or the in-cluster account;
* :func:`announce_joined_nodes` — each node waiting to be onboarded announced once, across restarts;
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
from ._nodes import (
    condition,
    has_taint,
    node_name,
    node_ready,
    taint_keys,
    uncertified_taint,
    unhealthy_taint,
)
from ._retry import NO_RETRY, RetryPolicy
from ._watch import ANNOUNCED_ANNOTATION, announce_joined_nodes

__all__ = [
    "ANNOUNCED_ANNOTATION",
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
    "announce_joined_nodes",
    "condition",
    "connect",
    "describe",
    "has_taint",
    "node_name",
    "node_ready",
    "resource_of",
    "taint_keys",
    "uncertified_taint",
    "unhealthy_taint",
]
