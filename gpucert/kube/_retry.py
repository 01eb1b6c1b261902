"""Retrying Kubernetes calls that failed for a passing reason, within one deadline per call.

A loaded control plane answers 429 with ``Retry-After`` and the odd 500, and a connection drops now
and then; a flow step that applies tens of objects and labels hundreds of nodes must ride that out per
call, or one bad answer out of a thousand fails the step. Only :class:`KubeUnavailable` is retried:
capped exponential back-off with full jitter (AWS's recommendation, which keeps many clients from
retrying in step), and a 429's ``Retry-After`` when the server gave one. A 4xx is never retried. The
policy is the one Jira and webhooks share (:mod:`gpucert._retry`, on tenacity); what is retried here is
Kubernetes'.

The deadline: every outbound call gpucert makes — to the API server, the S3 store, Jira, a webhook,
Prometheus — takes at most :func:`call_deadline_s` seconds, its attempts and the waits between them
together (``gpucert --timeout`` or ``$GPUCERT_TIMEOUT``; 20 s when neither is set). An endpoint that
accepts connections and never answers then fails a command within half a minute instead of the
attempts × timeouts (minutes) it would take otherwise. The deadline itself is
:mod:`gpucert._deadline`'s, shared with the store, ticket and telemetry layers.

A caller that knows more than one call does may widen what is retried (``retry_if``): ``watch-nodes``
rides out an API server restart — refused connections for a minute, then 403s while its RBAC loads — with
the same back-off, unbounded attempts and deadline, and its own rule for how long a 403 may last.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from .._deadline import CONNECT_TIMEOUT_S, DEFAULT_TIMEOUT_S, TIMEOUT_ENV, Deadline, call_deadline_s
from .._retry import RetryPolicy as _SharedPolicy
from ._errors import KubeError, KubeThrottled, KubeUnavailable

__all__ = ["CONNECT_TIMEOUT_S", "DEFAULT_TIMEOUT_S", "TIMEOUT_ENV", "Deadline", "RetryPolicy", "call_deadline_s"]

T = TypeVar("T")


class RetryPolicy(_SharedPolicy):
    """How often and how patiently a Kubernetes call is retried (the shared policy, Kubernetes' errors)."""

    def delay(self, attempt: int, error: KubeError, rng: random.Random) -> float:
        """Seconds to wait before attempt ``attempt + 1`` after ``error`` ended attempt ``attempt`` (1-based)."""
        return self.wait_s(attempt, _retry_after(error), rng)

    def call(
        self,
        fn: Callable[[], T],
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        deadline: Deadline | None = None,
        retry_if: Callable[[KubeError], bool] | None = None,
    ) -> T:
        """``fn()``, retried on :class:`KubeUnavailable` (or each :class:`KubeError` that ``retry_if``
        accepts) while attempts and time remain.

        ``deadline`` (default: :meth:`start`) is the one ``fn`` should cut its own timeouts to. Raises the
        last error when the attempts run out or ``retry_if`` refuses it, and the last error with the
        deadline said in its message when the next wait would pass the deadline.
        """
        transient = retry_if or (lambda exc: isinstance(exc, KubeUnavailable))
        return self.run(
            fn,
            retryable=lambda exc: isinstance(exc, KubeError) and transient(exc),
            retry_after=_retry_after,
            sleep=sleep,
            rng=rng,
            deadline=deadline,
        )


def _retry_after(error: BaseException) -> float | None:
    """A 429's ``Retry-After``, when the server gave one."""
    return error.retry_after if isinstance(error, KubeThrottled) else None


NO_RETRY = RetryPolicy(attempts=1)
