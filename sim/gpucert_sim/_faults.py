"""API faults: the misbehaviour of a loaded or flaky API server, injected on purpose.

gpucert's flows must survive a 429 with ``Retry-After``, a 500, a slow server, a watch cut mid-stream and
a watch whose resourceVersion was compacted away, because real control planes do all of these under load;
and a restarted API server answers 403 for a moment while its RBAC authorizer loads the roles.
The policy is one immutable value swapped atomically on the running server, from Python
(:meth:`FaultInjector.set`) or over HTTP (``POST /gpucert/faults``), so a test can turn faults on for
one step and off again. The injector counts what it did (:attr:`FaultInjector.served`), so a test can
tell a fault that was ridden out from one that never fired.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from threading import Lock
from typing import Any

from gpucert.errors import InputError

__all__ = ["ApiFaults", "FaultDecision", "FaultInjector"]


@dataclass(frozen=True)
class ApiFaults:
    """What share of Kubernetes API requests fail, how slow they are, when watches are cut."""

    #: Share of requests answered 500 InternalError.
    error_rate: float = 0.0
    #: Share of requests answered 429 TooManyRequests with ``Retry-After``.
    throttle_rate: float = 0.0
    retry_after_s: int = 1
    #: Added before every request is handled.
    latency_s: float = 0.0
    #: A watch is cut (connection closed without an end) this long after it starts; None: never.
    drop_watch_after_s: float | None = None
    #: Share of watches resumed from a resourceVersion answered with an in-stream 410 Expired (an ERROR event
    #: under HTTP 200), as after an etcd compaction the client did not see: it must re-list.
    watch_expired_rate: float = 0.0
    #: Share of resource requests (``/api/v1/…``, ``/apis/<group>/<version>/…``) answered 403 Forbidden, as
    #: while a restarted API server's RBAC authorizer is still loading its roles; 1 is an identity that may do
    #: nothing. Discovery and ``/version``, which every user may read, are never refused.
    forbidden_rate: float = 0.0
    #: Seed of the draws, for repeatable runs; None draws from the OS.
    seed: int | None = None

    def __post_init__(self) -> None:
        for name in ("error_rate", "throttle_rate", "forbidden_rate", "watch_expired_rate"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise InputError(f"API faults: {name} must be within [0, 1], got {value}")
        if self.error_rate + self.throttle_rate + self.forbidden_rate > 1.0:
            raise InputError("API faults: error_rate + throttle_rate + forbidden_rate must not exceed 1")
        if self.latency_s < 0 or self.retry_after_s < 0:
            raise InputError("API faults: latency_s and retry_after_s must be >= 0")
        if self.drop_watch_after_s is not None and self.drop_watch_after_s <= 0:
            raise InputError("API faults: drop_watch_after_s must be > 0 (or null for never)")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ApiFaults:
        """From a YAML/JSON mapping; unknown keys and wrong types are an :class:`InputError`."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(f"API faults: unknown keys {unknown}; known: {sorted(known)}")
        try:
            values: dict[str, Any] = {k: (None if v is None else _coerce(k, v)) for k, v in data.items()}
            return cls(**values)
        except (TypeError, ValueError) as exc:
            raise InputError(f"API faults: {exc}") from exc

    def to_mapping(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def active(self) -> bool:
        return bool(
            self.error_rate
            or self.throttle_rate
            or self.forbidden_rate
            or self.latency_s
            or self.drop_watch_after_s
            or self.watch_expired_rate
        )


def _coerce(name: str, value: Any) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number, got {value!r}")
    return int(value) if name in ("retry_after_s", "seed") else float(value)


@dataclass(frozen=True)
class FaultDecision:
    """What the injector decided for one request."""

    latency_s: float = 0.0
    status: int | None = None
    retry_after_s: int = 0


class FaultInjector:
    """The server's current policy and its random stream."""

    def __init__(self, policy: ApiFaults | None = None) -> None:
        self._lock = Lock()
        self._served: Counter[str] = Counter()
        self.set(policy or ApiFaults())

    @property
    def policy(self) -> ApiFaults:
        return self._policy

    def set(self, policy: ApiFaults) -> None:
        with self._lock:
            self._policy = policy
            self._rng = random.Random(policy.seed)

    def clear(self) -> None:
        self.set(ApiFaults())

    @property
    def served(self) -> dict[str, int]:
        """How many faults were served since the server started, by kind: ``500``, ``429``, ``403``, ``slow``
        (a request delayed by ``latency_s``) and ``expired`` (a watch answered 410); kinds never served are
        absent. Setting a new policy does not reset the counts."""
        with self._lock:
            return dict(self._served)

    def decide(self, *, resource_request: bool = True) -> FaultDecision:
        """The fault of one request; ``resource_request``: not discovery or ``/version`` (never a 403)."""
        policy = self._policy
        if not policy.active:
            return FaultDecision()
        status = None
        with self._lock:
            draw = self._rng.random()
            if draw < policy.error_rate:
                status = 500
            elif draw < policy.error_rate + policy.throttle_rate:
                status = 429
            elif draw < policy.error_rate + policy.throttle_rate + policy.forbidden_rate and resource_request:
                status = 403
            if status is not None:
                self._served[str(status)] += 1
            if policy.latency_s:
                self._served["slow"] += 1
        return FaultDecision(policy.latency_s, status, policy.retry_after_s)

    def expire_watch(self) -> bool:
        """Whether a watch resumed from a resourceVersion is to be answered 410 Expired (``watch_expired_rate``)."""
        policy = self._policy
        if not policy.watch_expired_rate:
            return False
        with self._lock:
            expired = self._rng.random() < policy.watch_expired_rate
            if expired:
                self._served["expired"] += 1
            return expired
