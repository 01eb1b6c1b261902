"""The deadline of one outbound call, shared by every layer that calls out: Kubernetes, the S3 store, Jira,
webhooks, Prometheus.

Every call — its attempts and the waits between them together — takes at most :func:`call_deadline_s`
seconds (``gpucert --timeout`` or ``$GPUCERT_TIMEOUT``; 20 s when neither is set), so an endpoint that
accepts connections and never answers fails a command within half a minute.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from .errors import InputError

__all__ = ["CONNECT_TIMEOUT_S", "DEFAULT_TIMEOUT_S", "TIMEOUT_ENV", "Deadline", "call_deadline_s"]

#: The environment variable holding the deadline of one outbound call, in seconds; ``gpucert --timeout``
#: sets it for the command it runs, a Prefect worker's environment sets it for deployments.
TIMEOUT_ENV = "GPUCERT_TIMEOUT"
#: The deadline when none is set: a call to an endpoint that never answers fails within it, so a command
#: (a second or two of start-up first) fails within 30 s.
DEFAULT_TIMEOUT_S = 20.0
#: The longest one attempt waits for a TCP connection: a server that is down or filtered fails fast,
#: and more attempts fit in the deadline than one long connect would leave.
CONNECT_TIMEOUT_S = 5.0


def call_deadline_s() -> float:
    """Seconds one outbound call may take, retries included: ``$GPUCERT_TIMEOUT``, else 20.

    Raises :class:`InputError` naming the variable when it is set to anything but a positive number.
    """
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"{TIMEOUT_ENV}={raw!r}: give the seconds a call may take, e.g. 20") from None
    if not 0 < value < float("inf"):
        raise InputError(f"{TIMEOUT_ENV}={raw!r}: must be a positive number of seconds")
    return value


@dataclass(frozen=True)
class Deadline:
    """The moment one call must be done by: ``seconds`` after it started (monotonic clock)."""

    seconds: float
    started: float = field(default_factory=time.monotonic)

    @classmethod
    def start(cls, seconds: float | None = None) -> Deadline:
        """A deadline ``seconds`` from now (None: :func:`call_deadline_s`)."""
        return cls(call_deadline_s() if seconds is None else seconds)

    def elapsed(self) -> float:
        """Seconds since the call started."""
        return time.monotonic() - self.started

    def remaining(self) -> float:
        """Seconds left; 0 or less once the deadline has passed."""
        return self.seconds - self.elapsed()

    def cap(self, seconds: float) -> float:
        """``seconds``, cut to what is left (never quite 0: a socket timeout of 0 means non-blocking)."""
        return max(0.001, min(seconds, self.remaining()))
