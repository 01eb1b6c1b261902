"""One run per node at a time: a ``coordination.k8s.io/v1`` Lease per node, and the taint of a node under test.

Why and how: docs/decisions/012-lease-and-testing-taint.md. Leases are taken the way client-go's leader
election does (a takeover and a release conditioned on the ``resourceVersion`` read, so of two runs racing
one gets 409); expiry is judged on the reader's clock against the writer's ``renewTime``, which the
two-minute default puts far beyond NTP's skew. Taints are written with a merge patch carrying the node's
``resourceVersion`` (409 → recomputed), so another writer's taints in between are never lost.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from .._names import check_run_id, dns_subdomain_ok
from ..errors import KubeConflict, KubeNotFound, LeaseLost
from ._client import FIELD_MANAGER, Kube, Resource

__all__ = [
    "DEFAULT_LEASE_S",
    "LEASE",
    "LEASE_PREFIX",
    "Claim",
    "NodeLease",
    "NodeLeases",
    "lease_name",
    "lift_testing_taint",
    "taint_testing",
    "testing_taint",
]

#: Where Leases live in the API.
LEASE = Resource("coordination.k8s.io/v1", "Lease", "leases", True)
#: The start of every node Lease's name.
LEASE_PREFIX = "gpucert-node-"
#: ``leaseDurationSeconds``: how long a Lease holds without renewal, so how long a crashed run's nodes
#: wait before another run takes them over. Renewal comes every few seconds to every quarter of it.
DEFAULT_LEASE_S = 120
#: ``MicroTime``: what the API server writes and the official client parses.
_MICRO = "%Y-%m-%dT%H:%M:%S.%fZ"
_LABELS = {"app.kubernetes.io/managed-by": "gpucert", "app.kubernetes.io/part-of": "gpucert"}
_HASH = 8
#: Rounds of read-and-write before a Lease or a node that keeps changing under us is an error.
_ATTEMPTS = 5
_METHODS = {"get": "GET", "create": "POST", "update": "PUT", "renew": "PATCH", "delete": "DELETE"}


def lease_name(node: str) -> str:
    """The name of ``node``'s Lease: ``gpucert-node-<node>``, a DNS subdomain of at most 253 characters.

    A node name that would not fit (or holds characters a name may not) is cut and ends in 8 hex digits
    of a hash of the whole name, so two nodes never share a Lease. Raises ``ValueError`` for an empty node.
    """
    if not node:
        raise ValueError("node name is empty")
    plain = f"{LEASE_PREFIX}{node}"
    if dns_subdomain_ok(plain):
        return plain
    digest = hashlib.sha256(node.encode()).hexdigest()[:_HASH]
    # Dots too become '-': one label, so no cut can leave an empty one ("..", ".-") behind.
    head = re.sub(r"[^a-z0-9-]+", "-", plain.lower())[: 253 - 1 - _HASH].rstrip("-")
    return f"{head}-{digest}"


def _micro(at: datetime) -> str:
    return at.astimezone(UTC).strftime(_MICRO)


def _parse_time(value: Any) -> datetime | None:
    """A ``MicroTime`` (or RFC 3339) as an aware datetime; None when absent or unreadable."""
    try:
        parsed = datetime.fromisoformat(value)
    except (TypeError, ValueError):
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class NodeLease:
    """One node's Lease as stored: who holds it and since when. ``holder`` None: nobody does."""

    node: str
    name: str
    namespace: str
    holder: str | None
    duration_s: int
    renewed: datetime | None
    acquired: datetime | None
    transitions: int
    resource_version: str

    @property
    def expires(self) -> datetime | None:
        """When the Lease lapses unless renewed; None when it never held (no renewTime)."""
        return self.renewed + timedelta(seconds=self.duration_s) if self.renewed is not None else None

    def live(self, now: datetime) -> bool:
        """Whether a holder holds it at ``now``: named, and renewed less than its duration ago."""
        expires = self.expires
        return bool(self.holder) and expires is not None and now < expires

    @classmethod
    def of(cls, node: str, obj: Mapping[str, Any]) -> NodeLease:
        """The Lease object ``obj`` (a dict from the API) of ``node``."""
        meta, spec = obj.get("metadata") or {}, obj.get("spec") or {}
        duration = spec.get("leaseDurationSeconds")
        transitions = spec.get("leaseTransitions")
        return cls(
            node=node,
            name=str(meta.get("name") or lease_name(node)),
            namespace=str(meta.get("namespace") or ""),
            holder=str(spec["holderIdentity"]) if spec.get("holderIdentity") else None,
            duration_s=duration if isinstance(duration, int) and duration > 0 else 0,
            renewed=_parse_time(spec.get("renewTime")),
            acquired=_parse_time(spec.get("acquireTime")),
            transitions=transitions if isinstance(transitions, int) and transitions >= 0 else 0,
            resource_version=str(meta.get("resourceVersion") or ""),
        )


@dataclass(frozen=True)
class Claim:
    """What :meth:`NodeLeases.acquire` got for one node: the Lease, ``held`` by us or by another holder;
    ``previous``: the holder whose lapsed Lease we took over (a crashed run)."""

    node: str
    held: bool
    lease: NodeLease
    previous: str | None = None

    @property
    def holder(self) -> str | None:
        """Who holds the node's Lease: us when :attr:`held`, else the other run (None: nobody)."""
        return self.lease.holder

    @property
    def reason(self) -> str:
        """Why the node is not ours, in words (``""`` when it is): ``benchmarked by run X …``."""
        if self.held:
            return ""
        lease, expires = self.lease, self.lease.expires
        until = f", held until {expires:%Y-%m-%dT%H:%M:%SZ} unless renewed" if expires is not None else ""
        return f"benchmarked by run {lease.holder} (Lease {lease.namespace}/{lease.name}{until})"


class NodeLeases:
    """The node Leases of one holder (a run id) in ``namespace``; every method may raise a KubeError.
    ``clock`` gives the time written into and judged against the Leases (UTC, aware)."""

    def __init__(
        self,
        kube: Kube,
        holder: str,
        *,
        namespace: str,
        duration_s: int = DEFAULT_LEASE_S,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        check_run_id(holder, what="lease holder (a run id)")
        if isinstance(duration_s, bool) or not isinstance(duration_s, int) or duration_s < 1:
            raise ValueError(f"a lease lasts at least 1 second, not {duration_s!r}")
        self.kube, self.holder, self.namespace = kube, holder, namespace
        self.duration_s, self.clock = duration_s, clock

    # --- reading --------------------------------------------------------------------------------------

    def read(self, node: str) -> NodeLease | None:
        """``node``'s Lease as stored, or None when there is none."""
        try:
            return NodeLease.of(node, self._request("get", node))
        except KubeNotFound:
            return None

    def live_holder(self, node: str) -> str | None:
        """Who holds ``node`` now (a live Lease's holder), or None when nobody does."""
        lease = self.read(node)
        return lease.holder if lease is not None and lease.live(self.clock()) else None

    # --- acquire, renew, release ------------------------------------------------------------------------

    def acquire(self, node: str) -> Claim:
        """Take ``node``'s Lease; returns the :class:`Claim`, held or not. Raises
        :class:`~gpucert.kube.KubeConflict` when the Lease kept changing under us."""
        name = lease_name(node)
        for _ in range(_ATTEMPTS):
            now = self.clock()
            body = self._body(node, self._spec(now, now, 0))
            try:
                stored = self._request("create", node, body)
                return Claim(node, True, NodeLease.of(node, stored))
            except KubeConflict:
                pass  # it exists: whose is it, and is it live?
            current = self.read(node)
            if current is None:
                continue  # released between our create and our read: create again
            if current.holder != self.holder and current.live(now):
                return Claim(node, False, current)
            mine = current.holder == self.holder  # a run started again with its own id: still ours
            spec = self._spec(
                (current.acquired or now) if mine else now,
                now,
                current.transitions if mine else current.transitions + 1,
            )
            try:
                stored = self._request("update", node, self._body(node, spec, current.resource_version))
            except (KubeConflict, KubeNotFound):
                continue  # another run wrote it first: read again (it won the race, or let go)
            return Claim(node, True, NodeLease.of(node, stored), previous=None if mine else current.holder)
        raise KubeConflict(f"acquire Lease {self.namespace}/{name}: it kept changing under us", status=409)

    def renew(self, claim: Claim) -> Claim:
        """Write ``renewTime`` = now on a Lease we hold; returns the claim as renewed. Raises
        :class:`LeaseLost` when another holder has it now or it is gone."""
        if not claim.held:
            raise ValueError(f"the Lease of {claim.node} is not ours to renew: {claim.reason}")
        lease = claim.lease
        for _ in range(_ATTEMPTS):
            spec = self._spec(lease.acquired or self.clock(), self.clock(), lease.transitions)
            try:
                # A merge patch, not a PUT: the API server creates a Lease that a PUT names and that is gone
                # (Leases allow create-on-update), which would bring back a Lease someone deleted to take
                # the node from us. A patch of a missing object is a 404, and its resourceVersion a 409.
                stored = self._request("renew", claim.node, self._body(claim.node, spec, lease.resource_version))
                return replace(claim, lease=NodeLease.of(claim.node, stored))
            except (KubeConflict, KubeNotFound):
                pass
            # A retried write of ours that went through, or a takeover: the Lease as it is says which.
            current = self.read(claim.node)
            if current is None:
                raise LeaseLost(f"renew Lease {self.namespace}/{lease.name}: it was deleted", status=404)
            if current.holder != self.holder:
                raise LeaseLost(
                    f"renew Lease {self.namespace}/{lease.name}: node {claim.node} is now held by "
                    f"run {current.holder} (ours lapsed)",
                    status=409,
                )
            lease = current
        raise KubeConflict(f"renew Lease {self.namespace}/{lease.name}: it kept changing under us", status=409)

    def release(self, node: str) -> bool:
        """Delete ``node``'s Lease if we hold it; True when it was deleted, False when it was gone or
        another holder's (never deleted under them)."""
        name = lease_name(node)
        for _ in range(_ATTEMPTS):
            current = self.read(node)
            if current is None or current.holder != self.holder:
                return False
            preconditions = {"resourceVersion": current.resource_version}
            options = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": preconditions}
            try:
                self._request("delete", node, options)
            except KubeNotFound:
                return False
            except KubeConflict:
                continue  # it changed since the read (renewed, or taken over): read again
            return True
        raise KubeConflict(f"release Lease {self.namespace}/{name}: it kept changing under us", status=409)

    # --- the objects ------------------------------------------------------------------------------------

    def _spec(self, acquired: datetime, renewed: datetime, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.holder,
            "leaseDurationSeconds": self.duration_s,
            "acquireTime": _micro(acquired),
            "renewTime": _micro(renewed),
            "leaseTransitions": transitions,
        }

    def _body(self, node: str, spec: Mapping[str, Any], resource_version: str | None = None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": lease_name(node), "namespace": self.namespace, "labels": dict(_LABELS)}
        if resource_version:
            meta["resourceVersion"] = resource_version  # the update holds only if nobody wrote in between
        return {"apiVersion": LEASE.api_version, "kind": LEASE.kind, "metadata": meta, "spec": dict(spec)}

    def _request(self, verb: str, node: str, body: Any = None) -> dict[str, Any]:
        """One call on ``node``'s Lease: ``get``, ``create``, ``update`` (a PUT), ``renew`` (a merge patch) or
        ``delete``."""
        name, method = lease_name(node), _METHODS[verb]
        path = LEASE.path(self.namespace, None if verb == "create" else name)
        query = {"fieldManager": FIELD_MANAGER} if method in ("POST", "PUT", "PATCH") else None
        content_type = "application/merge-patch+json" if method == "PATCH" else None
        doing = f"{verb} Lease {self.namespace}/{name}"
        return dict(
            self.kube.request(method, path, doing=doing, body=body, query=query, content_type=content_type) or {}
        )


# --- the testing taint ---------------------------------------------------------------------------------


def testing_taint(prefix: str) -> str:
    """The key of the taint on a node under test: ``<prefix>/testing`` (value: the run id)."""
    return f"{prefix}/testing"


def _edit_taints(
    kube: Kube, node: str, edit: Callable[[list[dict[str, Any]]], list[dict[str, Any]]], *, why: str
) -> bool:
    """Write ``edit(taints)`` to ``node`` unless it leaves them as they are, conditioned on the node's
    ``resourceVersion`` and recomputed on 409; True when something was written. ``why`` goes to the audit
    trail with the write."""
    for _ in range(_ATTEMPTS):
        current = kube.get("v1", "Node", node)
        meta = current.get("metadata") or {}
        taints = [dict(t) for t in (current.get("spec") or {}).get("taints") or ()]
        wanted = edit(taints)
        if wanted == taints:
            return False
        patch = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "spec": {"taints": wanted}}
        try:
            kube.merge_patch("v1", "Node", node, patch, before=current, why=why)
        except KubeConflict:
            continue  # the node changed since the read (another writer's label or taint): read it again
        return True
    raise KubeConflict(f"patch the taints of Node {node}: it kept changing under us", status=409)


def taint_testing(kube: Kube, node: str, *, prefix: str, run_id: str) -> bool:
    """Put ``<prefix>/testing=<run_id>:NoSchedule`` on ``node`` (in place of another run's, a crashed
    run's leftover); True when the node changed. Raises :class:`~gpucert.kube.KubeNotFound` for a node
    that is gone."""
    key = testing_taint(prefix)
    mine = {"key": key, "value": run_id, "effect": "NoSchedule"}
    why = f"run {run_id} benchmarks the node: no new workload lands on it until its benchmark ends"

    def edit(taints: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return taints if mine in taints else [*(t for t in taints if t.get("key") != key), mine]

    return _edit_taints(kube, node, edit, why=why)


def lift_testing_taint(kube: Kube, node: str, *, prefix: str) -> bool:
    """Take ``<prefix>/testing`` off ``node``; True when it was there. A node that is gone has none."""
    key = testing_taint(prefix)
    why = "the node's benchmark ended (done, failed or stopped): it takes workloads again"
    try:
        return _edit_taints(kube, node, lambda taints: [t for t in taints if t.get("key") != key], why=why)
    except KubeNotFound:
        return False
