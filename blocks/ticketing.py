"""The ``Ticketing`` block: where gpucert's remediation and replacement tickets go, secrets as ``SecretStr``."""

from __future__ import annotations

from typing import Literal, get_args

from prefect.blocks.core import Block
from pydantic import ConfigDict, Field, SecretStr, model_validator

from gpucert.blocks._schema import block_schema_extra
from gpucert.tickets import (
    DEFAULT_TICKETS,
    JiraTickets,
    Kind,
    TicketBackend,
    TicketConfigError,
    WebhookTickets,
    local_path,
    open_backend,
)

__all__ = ["Ticketing"]

#: Every ticket kind gpucert opens; each may have its own Jira issue type and priority.
TICKET_KINDS: tuple[str, ...] = get_args(Kind)


class Ticketing(Block):
    """gpucert's tickets: one per fault (node, GPU, cause), opened, updated, escalated and resolved by
    each certification run.

    ``backend`` chooses where they go: ``local`` (a SQLite file at ``path``, the embedded default; a store
    root holds ``tickets.sqlite``), ``jira`` (one issue per fault in ``project`` on ``server``) or
    ``webhook`` (each change POSTed as Slack-compatible JSON to ``url``, the state kept at ``path``).
    The Jira token, the webhook URL, its headers and its signing secret are secrets: never shown, never
    logged.

    Example:
        ```python
        from gpucert.blocks.ticketing import Ticketing
        tickets = Ticketing.load("BLOCK_NAME").open()
        for ticket in tickets.tickets(state="open"):
            print(ticket.title)
        ```
    """

    _block_type_name = "gpucert Ticketing"
    _block_type_slug = "gpucert-ticketing"
    _documentation_url = "https://github.com/gpucert/gpucert#readme"  # type: ignore[assignment]
    _description = "Where gpucert opens remediation and replacement tickets: a local file, Jira or a webhook."

    # A validation error would otherwise echo its input, a token or webhook URL given as a plain string too.
    model_config = ConfigDict(hide_input_in_errors=True, json_schema_extra=block_schema_extra)

    backend: Literal["local", "jira", "webhook"] = Field(
        default="local", description="Where tickets go: local (a SQLite file), jira or webhook."
    )
    path: str = Field(
        default=DEFAULT_TICKETS,
        description=(
            "The local ticket file (.sqlite) or a store root holding tickets.sqlite; the webhook backend "
            "keeps its ticket state there too."
        ),
    )
    server: str | None = Field(default=None, description="Jira: the server URL, e.g. https://jira.example.com.")
    user: str | None = Field(
        default=None, description="Jira: the user (a Cloud e-mail); empty to use the token as a bearer token."
    )
    token: SecretStr | None = Field(default=None, description="Jira: the API token or password.")
    project: str | None = Field(default=None, description="Jira: the project key tickets are created in.")
    issue_types: dict[str, str] = Field(
        default_factory=lambda: {"remediation": "Task", "replacement": "Task", "incident": "Task"},
        description="Jira: the issue type of each ticket kind (remediation, replacement, incident).",
    )
    priorities: dict[str, str] = Field(
        default_factory=lambda: {"remediation": "High", "replacement": "Highest", "incident": "Highest"},
        description="Jira: the priority of each ticket kind; empty to set none.",
    )
    done_transition: str = Field(default="Done", description="Jira: the transition that resolves an issue.")
    reopen_transition: str = Field(default="Reopen", description="Jira: the transition that reopens an issue.")
    url: SecretStr | None = Field(
        default=None, description="Webhook: the URL changes are POSTed to (a Slack incoming webhook works)."
    )
    headers: dict[str, SecretStr] = Field(
        default_factory=dict, description="Webhook: extra request headers, e.g. Authorization."
    )
    signing_secret: SecretStr | None = Field(
        default=None, description="Webhook: signs each body as X-Gpucert-Signature (HMAC-SHA256)."
    )

    @model_validator(mode="after")
    def _complete(self) -> Ticketing:
        # After validation, so that a message can never echo a raw secret from the input.
        if self.backend == "jira":
            missing = [n for n in ("server", "project", "token") if not getattr(self, n)]
            if missing:
                raise ValueError(f"the jira backend needs {', '.join(missing)}")
            unknown = (set(self.issue_types) | set(self.priorities)) - set(TICKET_KINDS)
            if unknown:
                raise ValueError(f"unknown ticket kind(s) {sorted(unknown)}: use {', '.join(TICKET_KINDS)}")
        if self.backend == "webhook" and self.url is None:
            raise ValueError("the webhook backend needs a url")
        return self

    def open(self) -> TicketBackend:
        """The configured backend; raises ``gpucert.tickets.TicketConfigError`` for a bad path or a Jira
        server or webhook URL that is not http(s)."""
        if self.backend == "jira":
            if not (self.server and self.project and self.token):  # the validator says so; mypy does not know
                raise TicketConfigError("the jira backend needs server, project and token")
            return JiraTickets(
                self.server,
                self.user or "",
                self.token,
                self.project,
                issue_types=self.issue_types,
                priorities=self.priorities,
                done_transition=self.done_transition,
                reopen_transition=self.reopen_transition,
            )
        if self.backend == "webhook":
            if self.url is None:
                raise TicketConfigError("the webhook backend needs a url")
            return WebhookTickets(
                self.url, local_path(self.path), headers=self.headers, signing_secret=self.signing_secret
            )
        return open_backend(self.path)
