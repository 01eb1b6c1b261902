"""``WebhookTickets``: each ticket change POSTed as JSON, Slack-compatible (``text`` plus ``blocks``).

A webhook keeps no state, so the tickets live in a :class:`LocalTickets` file and every change is announced
inside its transaction: a POST that fails (after the retries of :mod:`gpucert._retry`) rolls the change back
for the next reconcile to try again, so no change is stored unannounced.

Values from a cluster or a results file are data, never markup: Slack's mrkdwn reads ``<…>`` as a link or a
mention (``<!channel>``), so every text has its ``&``, ``<`` and ``>`` escaped (:func:`mrkdwn`). The URL (a
Slack webhook URL *is* its secret), header values and the signing secret are ``SecretStr``, the endpoint
named ``scheme://host/…`` only. With a signing secret each request carries ``X-Gpucert-Signature:
sha256=<HMAC-SHA256 of the body sent>``. A redirect is not followed: it would carry the signed body and the
headers to a place the configuration never named.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
from collections.abc import Mapping
from typing import Any, NoReturn
from urllib.parse import urlsplit

import httpx
from pydantic import SecretStr

from .._deadline import TIMEOUT_ENV, Deadline
from .._retry import RetryPolicy, retry_after_s
from .._secrets import redact_url, reveal, scrub
from ._local import LocalTickets
from ._model import TicketConfigError, TicketError, TicketEvent

__all__ = ["WebhookTickets", "mrkdwn", "slack_payload"]

log = logging.getLogger("gpucert.tickets")

_ICON = {
    "opened": ":rotating_light:",
    "reopened": ":repeat:",
    "escalated": ":warning:",
    "updated": ":arrows_counterclockwise:",
    "resolved": ":white_check_mark:",
    "remediated": ":wrench:",
}


#: The webhook URLs whose requests httpx logs (see :func:`_redact_secret_urls`).
_SECRET_URLS: set[str] = set()


def _redact_secret_urls(record: logging.LogRecord) -> bool:
    """httpx logs every request's full URL at INFO (``HTTP Request: POST https://…``): a webhook's URL is
    its secret, so those of :data:`_SECRET_URLS` are logged as ``scheme://host/…``."""
    if isinstance(record.args, tuple) and _SECRET_URLS:
        record.args = tuple(
            redact_url(str(arg)) if isinstance(arg, httpx.URL) and str(arg) in _SECRET_URLS else arg
            for arg in record.args
        )
    return True


logging.getLogger("httpx").addFilter(_redact_secret_urls)

#: Slack's limits: a section's text, a header's text, a field's text.
_SECTION, _HEADER, _FIELD = 3000, 150, 2000


def slack_payload(event: TicketEvent, *, structured: bool = True) -> dict[str, Any]:
    """The JSON body announcing ``event``: Slack's ``text`` (the notification line) and ``blocks`` (the
    message), plus ``gpucert`` (the event and ticket as data) when ``structured``."""
    t = event.ticket
    text = f"{_ICON[event.kind]} gpucert {event.kind}: {mrkdwn(t.title or t.fingerprint.key)}"
    facts = [
        ("Node", t.node),
        ("GPU", f"{t.gpu if t.gpu is not None else '-'} {t.gpu_uuid}".strip() if t.gpu_uuid else "node-level"),
        ("Cause", t.cause),
        ("Action", t.action or "none"),
        ("Kind", t.kind),
        ("State", t.state),
        ("Occurrences", str(t.occurrences)),
        ("Remediations", ", ".join(r.action for r in t.remediations[-5:]) or "none"),
    ]
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": f"{event.kind}: ticket {t.id} {t.kind}"[:_HEADER]}},
        {
            "type": "section",
            "text": {"type": "mrkdwn", "text": _cut(f"*{mrkdwn(t.title)}*\n{mrkdwn(event.detail)}", _SECTION)},
        },
        {
            "type": "section",
            "fields": [{"type": "mrkdwn", "text": _cut(f"*{k}*\n{mrkdwn(v)}", _FIELD)} for k, v in facts],
        },
    ]
    if t.escalation:
        blocks.append(
            {
                "type": "section",
                "text": {"type": "mrkdwn", "text": _cut(f"*Escalated:* {mrkdwn(t.escalation)}", _SECTION)},
            }
        )
    if t.evidence:
        last = t.evidence[-1]
        context = [f"run {mrkdwn(last.run_id)}"]
        if last.report:
            link = last.report
            context.append(
                f"<{_link(link)}|report>" if link.startswith(("http://", "https://")) else f"report {mrkdwn(link)}"
            )
        blocks.append({"type": "context", "elements": [{"type": "mrkdwn", "text": " · ".join(context)}]})
    payload: dict[str, Any] = {"text": text, "blocks": blocks}
    if structured:
        payload["gpucert"] = event.as_dict()
    return payload


def mrkdwn(text: str) -> str:
    """``text`` as Slack mrkdwn that shows itself: ``&``, ``<`` and ``>`` escaped, the three characters
    Slack decodes (so no ``<!channel>``, ``<@U…>`` or ``<url|label>`` can be smuggled in)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _link(url: str) -> str:
    """A URL inside ``<url|label>``: escaped as text, and a ``|`` (which would end the URL) percent-encoded."""
    return mrkdwn(url).replace("|", "%7C")


def _cut(text: str, limit: int) -> str:
    """``text`` within Slack's ``limit``, never cut inside an escape (``&amp;`` half-kept would show)."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    amp = cut.rfind("&", max(0, limit - 5))
    return cut[:amp] if amp >= 0 and ";" not in cut[amp:] else cut


class WebhookTickets(LocalTickets):
    """Tickets kept in a SQLite file at ``state``, every change POSTed to ``url`` (a change whose POST
    fails is not stored).

    ``headers`` are sent with each request (``Authorization`` and the like); ``retries`` more attempts
    follow a 5xx, a 429 or a connection error, ``backoff_s`` × 2ⁿ apart (a 429's ``Retry-After`` when
    longer), at most ``max_backoff_s``; ``structured`` adds the ``gpucert`` object to the body. One
    announcement takes at most the call deadline (``gpucert --timeout``, ``$GPUCERT_TIMEOUT``, 20 s by
    default), every attempt and wait included: each attempt waits at most ``timeout_s`` and what is left.
    """

    def __init__(
        self,
        url: SecretStr | str,
        state: str | os.PathLike[str],
        *,
        headers: Mapping[str, SecretStr | str] | None = None,
        signing_secret: SecretStr | str | None = None,
        structured: bool = True,
        timeout_s: float = 10.0,
        retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
    ) -> None:
        self._url = url if isinstance(url, SecretStr) else SecretStr(url)
        plain = reveal(self._url)
        try:
            parts = urlsplit(plain)
            parts.port  # noqa: B018 - parsing the port is what raises
        except ValueError as exc:
            raise TicketConfigError(f"the webhook URL {redact_url(plain)} cannot be used: {exc}") from None
        if parts.scheme not in ("http", "https"):
            raise TicketConfigError(f"the webhook URL must be http(s), not {redact_url(plain)}")
        self._headers = {k: v if isinstance(v, SecretStr) else SecretStr(v) for k, v in (headers or {}).items()}
        self._signing = (
            signing_secret
            if isinstance(signing_secret, SecretStr) or signing_secret is None
            else SecretStr(signing_secret)
        )
        self.structured = structured
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.where = redact_url(plain)
        _SECRET_URLS.add(str(httpx.URL(plain)))
        super().__init__(state, on_event=self.announce)

    def __repr__(self) -> str:
        return f"WebhookTickets(url={self.where!r}, state={str(self.path)!r})"

    # --- the POST ---------------------------------------------------------------------------------------

    def announce(self, event: TicketEvent) -> None:
        """POST ``event``; raises :class:`TicketError` when every attempt failed or the receiver refused it."""
        body = json.dumps(slack_payload(event, structured=self.structured)).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "gpucert"}
        headers |= {k: reveal(v) for k, v in self._headers.items()}
        if self._signing is not None:
            digest = hmac.new(reveal(self._signing).encode(), body, hashlib.sha256).hexdigest()
            headers["X-Gpucert-Signature"] = f"sha256={digest}"
        deadline = Deadline.start()
        policy = RetryPolicy(
            attempts=self.retries + 1,
            base_delay_s=self.backoff_s,
            max_delay_s=self.max_backoff_s,
            max_retry_after_s=self.max_backoff_s,
            jitter=False,
        )

        def log_retry(error: BaseException, attempt: int, wait_s: float) -> None:
            log.warning("webhook %s: %s; retry %d of %d in %.2f s", self.where, error, attempt, self.retries, wait_s)

        def gave_up(error: BaseException, attempt: int, limit: Deadline, out_of_time: bool) -> NoReturn:
            if out_of_time:
                raise TicketError(
                    f"webhook {self.where}: {error}; gave up after {attempt} attempt(s) in {limit.elapsed():.1f} s, "
                    f"the deadline of a call being {limit.seconds:g} s (gpucert --timeout or ${TIMEOUT_ENV}); "
                    "the ticket change was not stored"
                )
            raise TicketError(
                f"webhook {self.where}: {error} after {attempt} attempts; the ticket change was not stored"
            )

        with httpx.Client(follow_redirects=False) as client:
            try:
                policy.run(
                    lambda: self._post(client, body, headers, deadline),
                    retryable=lambda exc: isinstance(exc, _NotAccepted) and exc.retryable,
                    retry_after=lambda exc: exc.retry_after if isinstance(exc, _NotAccepted) else None,
                    on_retry=log_retry,
                    gave_up=gave_up,
                    deadline=deadline,
                )
            except _NotAccepted as refused:
                raise TicketError(f"webhook {self.where}: {refused}; the ticket change was not stored") from None

    def _post(self, client: httpx.Client, body: bytes, headers: dict[str, str], deadline: Deadline) -> None:
        """One POST, each of its waits cut to ``timeout_s`` and what is left of ``deadline``; raises
        :class:`_NotAccepted` when it was not accepted."""
        timeout = httpx.Timeout(deadline.cap(self.timeout_s))
        try:
            response = client.post(reveal(self._url), content=body, headers=headers, timeout=timeout)
        except httpx.TransportError as exc:
            # The reason may name the host; never the path (the secret part) or a header.
            raise _NotAccepted(self._scrub(f"{type(exc).__name__}: {exc}"), retryable=True) from None
        if response.is_success:
            return
        status = response.status_code
        raise _NotAccepted(
            f"HTTP {status}",
            retryable=status >= 500 or status == 429,
            retry_after=retry_after_s(response.headers.get("Retry-After")),
        )

    def _scrub(self, text: str) -> str:
        url = reveal(self._url)
        parts = urlsplit(url)
        secrets = [url, parts.path, parts.query, parts.password or "", *(reveal(v) for v in self._headers.values())]
        if self._signing is not None:
            secrets.append(reveal(self._signing))
        return scrub(text, secrets)


class _NotAccepted(Exception):
    """One POST the receiver did not accept: what happened in words (no secret), whether it is worth
    another attempt, and the ``Retry-After`` it asked for."""

    def __init__(self, what: str, *, retryable: bool, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.retryable = retryable
        self.retry_after = retry_after
