"""Retrying Kubernetes calls that failed for a passing reason.

A loaded control plane answers 429 with ``Retry-After`` and the odd 500, and a connection drops now
and then; a flow step that applies tens of objects and labels hundreds of nodes must ride that out per
call, or one bad answer out of a thousand fails the step. Only :class:`KubeUnavailable` is retried:
capped exponential back-off with full jitter (AWS's recommendation, which keeps many clients from
retrying in step), and a 429's ``Retry-After`` when the server gave one. A 4xx is never retried.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from ._errors import KubeThrottled, KubeUnavailable

__all__ = ["RetryPolicy"]

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a call is retried."""

    #: Attempts in all, the first included.
    attempts: int = 8
    #: The first back-off; each next one doubles, up to ``max_delay_s``.
    base_delay_s: float = 0.1
    max_delay_s: float = 5.0
    #: A ``Retry-After`` longer than this is cut to it (a server asking for minutes is a failure).
    max_retry_after_s: float = 30.0

    def delay(self, attempt: int, error: KubeUnavailable, rng: random.Random) -> float:
        """Seconds to wait before attempt ``attempt + 1`` after ``error`` ended attempt ``attempt`` (1-based)."""
        if isinstance(error, KubeThrottled) and error.retry_after is not None:
            return min(error.retry_after, self.max_retry_after_s)
        return rng.uniform(0, min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1)))

    def call(
        self,
        fn: Callable[[], T],
        *,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> T:
        """``fn()``, retried on :class:`KubeUnavailable`; the last one is raised when attempts run out."""
        draws = rng or random.Random()
        attempt = 1
        while True:
            try:
                return fn()
            except KubeUnavailable as exc:
                if attempt >= self.attempts:
                    raise
                sleep(self.delay(attempt, exc, draws))
                attempt += 1


NO_RETRY = RetryPolicy(attempts=1)
