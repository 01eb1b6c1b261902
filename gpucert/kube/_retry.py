"""Retrying Kubernetes calls that failed for a passing reason, within one deadline per call.

A loaded control plane answers 429 with ``Retry-After`` and the odd 500, and a connection drops now
and then; a flow step that applies tens of objects and labels hundreds of nodes must ride that out per
call, or one bad answer out of a thousand fails the step. Only :class:`KubeUnavailable` is retried:
capped exponential back-off with full jitter (AWS's recommendation, which keeps many clients from
retrying in step), and a 429's ``Retry-After`` when the server gave one. A 4xx is never retried. The loop
is tenacity's (:class:`tenacity.Retrying`); what is retried, how long to wait and when to stop are ours.

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
from dataclasses import dataclass
from typing import NoReturn, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception

from .._deadline import CONNECT_TIMEOUT_S, DEFAULT_TIMEOUT_S, TIMEOUT_ENV, Deadline, call_deadline_s
from ._errors import KubeError, KubeThrottled, KubeUnavailable

__all__ = [
    "CONNECT_TIMEOUT_S",
    "DEFAULT_TIMEOUT_S",
    "TIMEOUT_ENV",
    "Deadline",
    "RetryPolicy",
    "call_deadline_s",
]

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
    #: The most one call may take, every attempt and wait included; None: :func:`call_deadline_s`,
    #: read when each call starts.
    deadline_s: float | None = None

    def delay(self, attempt: int, error: KubeError, rng: random.Random) -> float:
        """Seconds to wait before attempt ``attempt + 1`` after ``error`` ended attempt ``attempt`` (1-based)."""
        if isinstance(error, KubeThrottled) and error.retry_after is not None:
            return min(error.retry_after, self.max_retry_after_s)
        return rng.uniform(0, min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1)))

    def start(self) -> Deadline:
        """The deadline of a call starting now. Raises :class:`InputError` for a bad ``$GPUCERT_TIMEOUT``."""
        return Deadline.start(self.deadline_s)

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
        limit = deadline or self.start()
        transient = retry_if or (lambda exc: isinstance(exc, KubeUnavailable))
        draws: list[random.Random] = [rng] if rng is not None else []

        def wait(state: RetryCallState) -> float:
            if not draws:  # made at the first retry: seeding from os.urandom on every call of a fleet adds up
                draws.append(random.Random())
            return self.delay(state.attempt_number, _error(state), draws[0])

        def out_of_time(state: RetryCallState) -> bool:
            return state.attempt_number >= self.attempts or state.upcoming_sleep >= limit.remaining()

        def give_up(state: RetryCallState) -> NoReturn:
            exc, attempt = _error(state), state.attempt_number
            if attempt < self.attempts:
                # Said in the message (what the command line prints): the deadline, not the attempts,
                # ended it, and which knob moves it.
                exc.args = (
                    f"{exc} (gave up after {attempt} attempt{'s' if attempt > 1 else ''} in "
                    f"{limit.elapsed():.1f} s; the call's deadline: {limit.seconds:g} s, see gpucert "
                    f"--timeout or ${TIMEOUT_ENV})",
                )
            raise exc

        retrying = Retrying(
            retry=retry_if_exception(lambda exc: isinstance(exc, KubeError) and transient(exc)),
            wait=wait,
            stop=out_of_time,
            sleep=sleep,
            retry_error_callback=give_up,
        )
        return retrying(fn)


def _error(state: RetryCallState) -> KubeError:
    """The error that ended the attempt ``state`` describes (only a KubeError is ever retried)."""
    assert state.outcome is not None
    error = state.outcome.exception()
    assert isinstance(error, KubeError)
    return error


NO_RETRY = RetryPolicy(attempts=1)
