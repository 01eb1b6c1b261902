"""Kubernetes ``Status`` errors: what every failed request of the simulator answers.

A real API server never answers a bad request with a bare text or a 500; clients (the official Python
client's ``ApiException``, kubectl's error printer, retry logic keyed on ``reason``) read the ``Status``
body. Raising :class:`ApiError` anywhere in a handler yields exactly that body and code.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ApiError", "bad_request", "conflict", "invalid", "not_found", "status_body"]

# The reason a real server puts next to each code (k8s.io/apimachinery metav1.StatusReason).
_REASONS = {
    400: "BadRequest",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    409: "Conflict",
    410: "Expired",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
}


class ApiError(Exception):
    """A request the simulated API server refuses; it becomes a ``Status`` body with ``code``."""

    def __init__(
        self,
        code: int,
        message: str,
        *,
        reason: str | None = None,
        details: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason or _REASONS.get(code, "Unknown")
        self.details = details
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return status_body(self.code, self.reason, self.message, self.details)


def status_body(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A ``metav1.Status`` of a failure, as the API server encodes it."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details is not None:
        body["details"] = details
    return body


def not_found(group: str, plural: str, name: str) -> ApiError:
    what = f"{plural}.{group}" if group else plural
    return ApiError(404, f'{what} "{name}" not found', details={"name": name, "group": group, "kind": plural})


def conflict(group: str, plural: str, name: str, message: str, *, reason: str = "Conflict") -> ApiError:
    what = f"{plural}.{group}" if group else plural
    return ApiError(
        409,
        f'Operation cannot be fulfilled on {what} "{name}": {message}'
        if reason == "Conflict"
        else f'{what} "{name}" {message}',
        reason=reason,
        details={"name": name, "group": group, "kind": plural},
    )


def invalid(kind: str, group: str, name: str, field: str, cause_reason: str, message: str) -> ApiError:
    """422 Invalid with one ``details.causes`` entry, as field validation reports it."""
    return ApiError(
        422,
        f'{kind} "{name}" is invalid: {field}: {message}',
        details={
            "name": name,
            "group": group,
            "kind": kind,
            "causes": [{"reason": cause_reason, "message": message, "field": field}],
        },
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)
