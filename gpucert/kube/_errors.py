"""Every failure of a Kubernetes call mapped once onto the :class:`KubeError` branch of :mod:`gpucert.errors`.

The official client raises ``ApiException`` for an HTTP answer and urllib3's errors for none. Callers care
whether it is worth retrying and whether it is the object's absence or a conflict: no answer →
:class:`KubeUnreachable`, 5xx → :class:`KubeServerError`, 429 → :class:`KubeThrottled` (with
``Retry-After``), 404 → :class:`KubeNotFound`, 409 → :class:`KubeConflict`, 401/403 → :class:`KubeForbidden`,
400/422 → :class:`KubeInvalid`, any other 4xx → :class:`KubeRequestError`. Following kopf, the message keeps
the server's ``Status`` message, which is what a person needs.
"""

from __future__ import annotations

import json
from typing import Any

from .._retry import retry_after_s
from ..errors import (
    KubeConflict,
    KubeError,
    KubeForbidden,
    KubeInvalid,
    KubeNotFound,
    KubeRequestError,
    KubeServerError,
    KubeThrottled,
    KubeUnreachable,
)

__all__ = ["from_api_exception", "from_response"]

_KINDS: dict[int, type[KubeRequestError]] = {
    404: KubeNotFound,
    409: KubeConflict,
    401: KubeForbidden,
    403: KubeForbidden,
    400: KubeInvalid,
    422: KubeInvalid,
}


def _server_message(body: Any) -> str:
    """The ``message`` of a Kubernetes ``Status`` body, or the body's text."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not body:
        return ""
    try:
        status = json.loads(body)
    except (TypeError, ValueError):
        status = None
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    return str(body)[:300]


def from_api_exception(exc: Any, doing: str) -> KubeError:
    """The :class:`KubeError` for an ``ApiException`` raised while ``doing`` (e.g. ``patch Node n1``)."""
    status = int(getattr(exc, "status", 0) or 0)
    if status == 0:
        reason = " ".join(str(getattr(exc, "reason", None) or exc).split())  # one line: an SSLError has two
        return KubeUnreachable(f"{doing}: no answer: {reason}")
    return from_response(status, getattr(exc, "body", None), getattr(exc, "headers", None), doing)


def from_response(status: int, body: Any, headers: Any, doing: str) -> KubeError:
    """The :class:`KubeError` for an HTTP answer ``status`` (not 2xx) to ``doing``."""
    detail = _server_message(body)
    message = f"{doing}: HTTP {status}" + (f": {detail}" if detail else "")
    if status == 429:
        # An HTTP-date Retry-After is not honoured: the back-off schedule applies instead.
        return KubeThrottled(message, retry_after=retry_after_s(headers.get("Retry-After") if headers else None))
    if status >= 500:
        return KubeServerError(message, status=status)
    return _KINDS.get(status, KubeRequestError)(message, status=status)
