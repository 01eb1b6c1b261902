"""Keeping secrets out of messages: a URL without its secret parts, a text scrubbed of known secrets, and a
text scrubbed of whatever looks like a credential (the command line's last line of defence, for an
unexpected error's message: :func:`redact_credentials`)."""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from typing import Final
from urllib.parse import urlsplit

from pydantic import SecretStr

__all__ = ["redact_credentials", "redact_url", "reveal", "scrub"]


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


#: What a credential looks like inside an error message a library wrote: an ``Authorization`` header's
#: scheme and value, a URL's user-info, a presigned URL's signature, a ``token=``/``password=``/``secret=``
#: pair. Each pattern's two groups (the name, what separates it from the value) are kept; the value is not.
_CREDENTIALS: Final = (
    re.compile(r"(?i)\b(bearer|basic|aws4-hmac-sha256)(\s+)[^\s'\",]+"),
    re.compile(r"(?i)(://[^/\s:@]*:)()[^/\s@]+(?=@)"),
    re.compile(r"(?i)\b(x-amz-signature|x-amz-security-token|signature)(=)[^&\s'\"]+"),
    re.compile(r"(?i)\b(token|password|passwd|secret|api[_-]?key)([\"']?\s*[=:]\s*[\"']?)[^\s'\",&]+"),
)
#: The environment variables whose values are credentials wherever they show.
_SECRET_ENV: Final = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def redact_credentials(text: str) -> str:
    """``text`` with every value that looks like a credential (see :data:`_CREDENTIALS`) and every value of
    a credential variable of the environment replaced by ``***``: for messages gpucert did not write (an
    unexpected error), where no list of the secrets involved is at hand."""
    text = scrub(text, (os.environ.get(name, "") for name in _SECRET_ENV))
    for pattern in _CREDENTIALS:
        text = pattern.sub(lambda m: f"{m.group(1)}{m.group(2)}***", text)
    return text
