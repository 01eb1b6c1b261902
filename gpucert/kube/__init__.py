"""Kubernetes access for gpucert: one dict-based facade over the official client.

:class:`Kube` (get, paged lists, server-side apply with field manager ``gpucert``, merge patches, deletes,
pod logs; every failure a :class:`KubeError` naming the call, a transient one retried by :class:`RetryPolicy`),
:func:`connect` (from a kubeconfig or the in-cluster account), :func:`announce_joined_nodes` (each node
waiting to be onboarded announced once, across restarts: :class:`Reconnect`) and :class:`NodeLeases` (one
run per node at a time, and the ``<prefix>/testing`` taint). The errors are drawn in :mod:`gpucert.errors`.
"""

from ..errors import (
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
    LeaseLost,
)
from ._client import FIELD_MANAGER, KINDS, Kube, KubeChange, describe
from ._connect import connect, kubeconfig_file
from ._lease import (
    DEFAULT_LEASE_S,
    LEASE,
    Claim,
    NodeLeases,
    lease_name,
    lift_testing_taint,
    taint_testing,
    testing_taint,
)
from ._nodes import (
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
from ._retry import RetryPolicy
from ._watch import ANNOUNCED_ANNOTATION, Reconnect, announce_joined_nodes

__all__ = [
    "ANNOUNCED_ANNOTATION",
    "DEFAULT_LEASE_S",
    "FIELD_MANAGER",
    "KINDS",
    "LEASE",
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
    "NodeLeases",
    "Reconnect",
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
    "taint_keys",
    "taint_testing",
    "testing_taint",
    "uncertified_taint",
    "unhealthy_taint",
]
