"""What can go wrong talking to the Kubernetes API, as gpucert's own exceptions.

The official client raises ``ApiException`` (and its per-status subclasses) for an HTTP answer and
urllib3's errors for no answer at all. Callers care about two things — is it worth retrying, and is it
the object's absence or a conflict — so every failure is mapped once, here, onto the :class:`KubeError`
branch of the tree drawn in :mod:`gpucert.errors` (where the classes live; they are re-exported here):
no answer → :class:`KubeUnreachable`, 5xx → :class:`KubeServerError`, 429 → :class:`KubeThrottled`
(with ``Retry-After``), 404 → :class:`KubeNotFound`, 409 → :class:`KubeConflict`, 401/403 →
:class:`KubeForbidden`, 400/422 → :class:`KubeInvalid`, any other 4xx → :class:`KubeRequestError`.

Following kopf, the mapping keeps the server's ``Status`` message, which is what a person needs.
"""

from __future__ import annotations

import json
from typing import Any

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
)

__all__ = [
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
    "from_api_exception",
    "from_response",
]


def _server_message(body: Any) -> str:
    """The ``message`` of a Kubernetes ``Status`` body, or the body's text."""
    if isinstance(body, bytes):
        body = body.decode("utf-8", "replace")
    if not body:
        return ""
    try:
        status = json.loads(body)
    except (TypeError, ValueError):
        return str(body)[:300]
    if isinstance(status, dict) and status.get("message"):
        return str(status["message"])
    return str(body)[:300]


def _retry_after(headers: Any) -> float | None:
    raw = headers.get("Retry-After") if headers is not None else None
    try:
        return max(0.0, float(raw)) if raw is not None else None
    except (TypeError, ValueError):
        return None  # an HTTP-date form; the back-off schedule applies instead


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
        return KubeThrottled(message, retry_after=_retry_after(headers))
    if status >= 500:
        return KubeServerError(message, status=status)
    kinds: dict[int, type[KubeRequestError]] = {
        404: KubeNotFound,
        409: KubeConflict,
        401: KubeForbidden,
        403: KubeForbidden,
        400: KubeInvalid,
        422: KubeInvalid,
    }
    return kinds.get(status, KubeRequestError)(message, status=status)
