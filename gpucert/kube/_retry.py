"""Retrying Kubernetes calls that failed for a passing reason, within one deadline per call.

The policy is the one Jira and webhooks share (:mod:`gpucert._retry`, on tenacity); what is retried here is
Kubernetes': only :class:`KubeUnavailable` (no answer, 5xx, 429 after its ``Retry-After``), never a 4xx. A
flow step that applies tens of objects and labels hundreds of nodes must ride out the odd 429 or dropped
connection per call, or one bad answer in a thousand fails the step. Every attempt and wait of a call fit
in :func:`~gpucert._deadline.call_deadline_s` (``gpucert --timeout``).

A caller that knows more than one call does may widen what is retried (``retry_if``): ``watch-nodes`` rides
out an API server restart (refused connections, then 403s while its RBAC loads) with its own rule.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from .._deadline import Deadline
from .._retry import RetryPolicy as _SharedPolicy
from ..errors import KubeError, KubeThrottled, KubeUnavailable

__all__ = ["RetryPolicy"]

T = TypeVar("T")


class RetryPolicy(_SharedPolicy):
    """How often and how patiently a Kubernetes call is retried (the shared policy, Kubernetes' errors)."""

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
        accepts) while attempts and ``deadline`` (which ``fn`` should cut its own timeouts to) allow; raises the
        last error, with the deadline said in its message when the deadline ended the retries."""
        transient = retry_if or (lambda exc: isinstance(exc, KubeUnavailable))
        return self.run(
            fn,
            retryable=lambda exc: isinstance(exc, KubeError) and transient(exc),
            # A 429's Retry-After, when the server gave one.
            retry_after=lambda exc: exc.retry_after if isinstance(exc, KubeThrottled) else None,
            sleep=sleep,
            rng=rng,
            deadline=deadline,
        )
