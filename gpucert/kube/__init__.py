"""Kubernetes access for gpucert: one dict-based facade over the official client.

* :class:`Kube` — get, list (paged), server-side apply (field manager ``gpucert``), create, merge
  patch, delete, node labels, pod logs; every failure a :class:`KubeError` naming the call;
* :func:`connect` — a :class:`Kube` from a kubeconfig (file or data) or the in-cluster account;
* :func:`announce_joined_nodes` — each node waiting to be onboarded announced once, across restarts
  (its own and the API server's: :class:`Reconnect`);
* :class:`NodeLeases` — one run per node at a time: a ``coordination.k8s.io`` Lease per node, taken,
  renewed and released by its run, and the ``<prefix>/testing`` taint of a node under test;
* :class:`RetryPolicy` — transient failures (5xx, 429 after ``Retry-After``, no answer) retried
  with capped, jittered back-off inside each call.

The error hierarchy is drawn in :mod:`gpucert.errors`. Nothing here imports Prefect.
"""

from ._client import FIELD_MANAGER, KINDS, Kube, KubeChange, Resource, describe, resource_of
from ._connect import connect, kubeconfig_file
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
from ._lease import (
    DEFAULT_LEASE_S,
    LEASE,
    LEASE_PREFIX,
    Claim,
    LeaseLost,
    NodeLease,
    NodeLeases,
    lease_name,
    lift_testing_taint,
    taint_testing,
    testing_taint,
)
from ._nodes import (
    CERTIFIED_CONDITION,
    condition,
    has_taint,
    mark_never_certified,
    never_certified_patch,
    node_name,
    node_ready,
    taint_keys,
    uncertified_taint,
    unhealthy_taint,
)
from ._retry import NO_RETRY, RetryPolicy
from ._watch import ANNOUNCED_ANNOTATION, Reconnect, announce_joined_nodes

__all__ = [
    "ANNOUNCED_ANNOTATION",
    "CERTIFIED_CONDITION",
    "DEFAULT_LEASE_S",
    "FIELD_MANAGER",
    "KINDS",
    "LEASE",
    "LEASE_PREFIX",
    "NO_RETRY",
    "Claim",
    "Kube",
    "KubeChange",
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
    "LeaseLost",
    "NodeLease",
    "NodeLeases",
    "Reconnect",
    "Resource",
    "RetryPolicy",
    "announce_joined_nodes",
    "condition",
    "connect",
    "describe",
    "has_taint",
    "kubeconfig_file",
    "lease_name",
    "lift_testing_taint",
    "mark_never_certified",
    "never_certified_patch",
    "node_name",
    "node_ready",
    "resource_of",
    "taint_keys",
    "taint_testing",
    "testing_taint",
    "uncertified_taint",
    "unhealthy_taint",
]
