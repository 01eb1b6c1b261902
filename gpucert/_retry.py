"""One retry policy for every HTTP client of gpucert's own: Kubernetes, Jira and webhooks (the S3 store keeps
botocore's own retries, cut to the same deadline).

The loop is tenacity's; what this module decides is the same for every caller: capped exponential back-off
with full jitter by default (AWS's recommendation: many clients do not retry in step), a server's
``Retry-After`` honoured as the least wait but cut to ``max_retry_after_s`` (a server asking for minutes
is a failure), and a stop when the attempts run out or the next wait would pass the call's deadline
(:mod:`gpucert._deadline`). The caller says which errors are worth another attempt, what is logged before
a wait and what is raised when it gives up.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception

from ._deadline import TIMEOUT_ENV, Deadline

__all__ = ["RetryPolicy", "deadline_note", "retry_after_s"]

T = TypeVar("T")


def _no_retry_after(error: BaseException) -> float | None:
    return None


def retry_after_s(header: str | None) -> float | None:
    """A ``Retry-After`` header in seconds; None when absent or not a number (an HTTP date is not honoured)."""
    try:
        return max(0.0, float(header)) if header else None
    except ValueError:
        return None


def deadline_note(attempt: int, deadline: Deadline) -> str:
    """Why a call stopped before its attempts ran out, in words: the deadline, and which knob moves it."""
    return (
        f"gave up after {attempt} attempt{'s' if attempt > 1 else ''} in {deadline.elapsed():.1f} s; the "
        f"call's deadline: {deadline.seconds:g} s, see gpucert --timeout or ${TIMEOUT_ENV}"
    )


def _reraise(error: BaseException, attempt: int, deadline: Deadline, out_of_time: bool) -> NoReturn:
    """The default end: the last error, the deadline said in its message when the deadline ended it."""
    if out_of_time:
        error.args = (f"{error} ({deadline_note(attempt, deadline)})",)
    raise error


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a call is retried."""

    #: Attempts in all, the first included.
    attempts: int = 8
    #: The first back-off; each next one doubles, up to ``max_delay_s``.
    base_delay_s: float = 0.1
    max_delay_s: float = 5.0
    #: A ``Retry-After`` longer than this is cut to it.
    max_retry_after_s: float = 30.0
    #: The most one call may take, every attempt and wait included; None: :func:`call_deadline_s`,
    #: read when each call starts.
    deadline_s: float | None = None
    #: Full jitter: each back-off drawn uniformly between 0 and its cap.
    jitter: bool = True

    def wait_s(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait before attempt ``attempt + 1`` (1-based), the server having asked ``retry_after``."""
        cap = min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1))
        backoff = rng.uniform(0, cap) if self.jitter else cap
        if retry_after is None:
            return backoff
        return max(backoff, min(max(0.0, retry_after), self.max_retry_after_s))

    def start(self) -> Deadline:
        """The deadline of a call starting now. Raises :class:`InputError` for a bad ``$GPUCERT_TIMEOUT``."""
        return Deadline.start(self.deadline_s)

    def run(
        self,
        fn: Callable[[], T],
        *,
        retryable: Callable[[BaseException], bool],
        retry_after: Callable[[BaseException], float | None] = _no_retry_after,
        on_retry: Callable[[BaseException, int, float], None] | None = None,
        gave_up: Callable[[BaseException, int, Deadline, bool], NoReturn] = _reraise,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
        deadline: Deadline | None = None,
    ) -> T:
        """``fn()``, retried on each error ``retryable`` accepts while attempts and time remain.

        An error ``retryable`` refuses is raised as it is. When the retries end, ``gave_up(error, attempts
        made, deadline, whether the deadline ended them)`` raises (default: the last error, the deadline
        said in its message when it was the deadline). ``on_retry(error, attempt, wait)`` runs before
        each wait (to log it).
        """
        limit = deadline or self.start()
        draws: list[random.Random] = [rng] if rng is not None else []

        def wait(state: RetryCallState) -> float:
            if not draws:  # made at the first retry: seeding from os.urandom on every call of a fleet adds up
                draws.append(random.Random())
            return self.wait_s(state.attempt_number, retry_after(_error(state)), draws[0])

        def stop(state: RetryCallState) -> bool:
            return state.attempt_number >= self.attempts or state.upcoming_sleep >= limit.remaining()

        def before_sleep(state: RetryCallState) -> None:
            if on_retry is not None:
                on_retry(_error(state), state.attempt_number, state.upcoming_sleep)

        def end(state: RetryCallState) -> NoReturn:
            attempt = state.attempt_number
            gave_up(_error(state), attempt, limit, attempt < self.attempts)

        retrying = Retrying(
            retry=retry_if_exception(retryable),
            wait=wait,
            stop=stop,
            sleep=sleep,
            before_sleep=before_sleep,
            retry_error_callback=end,
        )
        return retrying(fn)


def _error(state: RetryCallState) -> BaseException:
    """The error that ended the attempt ``state`` describes (only errors are ever retried)."""
    assert state.outcome is not None
    error = state.outcome.exception()
    assert error is not None
    return error
