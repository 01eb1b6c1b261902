"""Keeping secrets out of messages: a URL shown without its secret parts, a text scrubbed of known secrets.

Shared by every layer that holds a credential: the ticket backends and the Prometheus reader.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit

from pydantic import SecretStr

__all__ = ["redact_url", "reveal", "scrub"]


def reveal(value: SecretStr | str | None) -> str:
    """The plain text of a secret (or of a plain string); ``""`` for None."""
    if value is None:
        return ""
    return value.get_secret_value() if isinstance(value, SecretStr) else value


def redact_url(url: str, *, keep_path: bool = False) -> str:
    """``scheme://host[:port]`` of a URL, with ``/…`` where a path was, and never its user, password,
    query or fragment; the path too is kept when ``keep_path`` (a Jira context path is no secret, a Slack
    webhook path is the secret itself)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<a malformed URL>"
    if not parts.scheme or not host:
        return "<a URL without a host>"
    path = parts.path.rstrip("/")
    shown = path if keep_path else ("/…" if path else "")
    return f"{parts.scheme}://{host}{port}{shown}"


def scrub(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret (of four or more characters) replaced by ``***``."""
    for secret in sorted({s for s in secrets if len(s) >= 4}, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text
