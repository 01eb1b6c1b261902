"""``JiraTickets``: one Jira issue per fingerprint, through the ``jira`` client (REST API v2; on Jira Cloud
the client speaks v3 by itself).

The issue is the ticket: its labels say what it is (``gpucert``, ``gpucert-open`` while open,
``gpucert-fp-<hash>``, ``gpucert-node-<node>``, ``gpucert-<kind>``, ``gpucert-cause-<cause>``), its priority
follows its kind, its description is the ticket in words then gpucert's record (the ticket as JSON), each
change adds a comment, and resolving and reopening are workflow transitions. Jira's own status wins over
the record: an issue a person closed is a resolved ticket, one they reopened an open ticket.

Values read from a cluster or a results file never act as Jira markup (:func:`inert`), and the record is
found by a delimiter no JSON string can contain (a raw line break), so no value can forge or hide it.
Jira offers no transaction: two processes reconciling one fault at once may both create an issue, so run
one reconcile at a time per project (the certify flow does). Each call, its retries included (the policy
of :mod:`gpucert._retry`), ends within the call deadline (``gpucert --timeout``, ``$GPUCERT_TIMEOUT``).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

from pydantic import SecretStr

from .._deadline import CONNECT_TIMEOUT_S, TIMEOUT_ENV, Deadline, call_deadline_s
from .._retry import RetryPolicy, retry_after_s
from .._secrets import redact_url, reveal, scrub
from ._model import Change, Fingerprint, State, Ticket, TicketConfigError, TicketError, TicketEvent, TicketNotFound

if TYPE_CHECKING:
    from jira import JIRA

__all__ = ["JiraTickets"]

BASE_LABEL = "gpucert"
OPEN_LABEL = "gpucert-open"
#: What the client fetches of an issue: all a ticket is made of, not ``*all``.
_FIELDS = ("summary", "description", "labels", "status", "priority", "created", "updated", "resolutiondate")
#: Jira's limit on a text field is 32,767 characters; the record leaves some room for the words above it.
_MAX_DESCRIPTION = 32_000
_RECORD_HEAD = "gpucert record (kept by gpucert: edits to it are overwritten):"
#: Where the record starts: the head on a line of its own, then the block. The record is JSON, which holds
#: no raw line break, so a value inside it (a GPU model spelling the head) cannot fake this delimiter.
_RECORD_START = f"\n{_RECORD_HEAD}\n{{noformat}}\n"
_RECORD = re.compile(r"\{noformat\}\n(\{.*?\})\n\{noformat\}", re.S)
#: Characters that make Jira wiki markup more than emphasis: links and mentions, macros, tables, images,
#: escapes and line breaks. A text holding one is shown verbatim instead.
_MARKUP = re.compile(r"[\[\]{}|!\\]")
_NOFORMAT = re.compile(r"\{noformat", re.I)
#: Jira's limit on one label.
_MAX_LABEL = 255
_DONE_NAMES = frozenset({"done", "closed", "resolved"})


#: The deadline of the Jira call under way in this thread (set by ``JiraTickets._calling``).
_DEADLINE: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar("gpucert_jira_deadline", default=None)


#: What a Jira request answered that is worth another try: throttled, or unavailable for a while.
_TRANSIENT_STATUS = frozenset({429, 503})


def _mount_deadline(session: Any, retry: RetryPolicy) -> None:
    """Send each request of ``session`` (the jira client's, its own retries off) with ``retry``: a refused or
    dropped connection, a 429 and a 503 retried, each timeout cut to what is left of the Jira call's deadline,
    nothing sent once it has passed. A request that failed every try returns its last answer, which the
    client turns into its ``JIRAError``."""
    import requests.adapters

    class OutOfTime(requests.exceptions.ReadTimeout):
        """Not sent: the deadline had passed (not a ConnectionError, which would be retried)."""

    class Transient(Exception):
        """A 429 or 503 answer, raised for the policy to retry and returned when it gives up."""

        def __init__(self, response: requests.Response) -> None:
            super().__init__(f"HTTP {response.status_code}")
            self.response = response

    def retry_after(error: BaseException) -> float | None:
        return retry_after_s(error.response.headers.get("Retry-After")) if isinstance(error, Transient) else None

    class DeadlineAdapter(requests.adapters.HTTPAdapter):
        def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
            deadline = _DEADLINE.get() or retry.start()

            def attempt() -> Any:
                if deadline.remaining() <= 0:
                    raise OutOfTime(f"not sent: the deadline of {deadline.seconds:g} s has passed", request=request)
                timeout = kwargs.get("timeout")
                connect, read = timeout if isinstance(timeout, tuple) else (timeout, timeout)
                kwargs["timeout"] = (deadline.cap(connect or CONNECT_TIMEOUT_S), deadline.cap(read or deadline.seconds))
                response = super(DeadlineAdapter, self).send(request, *args, **kwargs)
                if response.status_code in _TRANSIENT_STATUS:
                    raise Transient(response)
                return response

            try:
                return retry.run(
                    attempt,
                    retryable=lambda exc: isinstance(exc, (Transient, requests.ConnectionError)),
                    retry_after=retry_after,
                    deadline=deadline,
                )
            except Transient as last:
                return last.response

    adapter = DeadlineAdapter()
    session.mount("https://", adapter)
    session.mount("http://", adapter)


def fingerprint_label(fingerprint: Fingerprint) -> str:
    """The label that finds a fingerprint's issue."""
    return f"gpucert-fp-{fingerprint.digest}"


def node_label(node: str) -> str:
    """The label that finds a node's issues: ``gpucert-node-<node>`` (Kubernetes node names are valid Jira
    labels), cut and completed by a hash of the name where that would pass Jira's 255 characters."""
    label = f"gpucert-node-{'_'.join(node.split())}"
    if len(label) <= _MAX_LABEL:
        return label
    digest = hashlib.sha256(node.encode()).hexdigest()[:16]
    return f"{label[: _MAX_LABEL - len(digest) - 1]}-{digest}"


def inert(text: str) -> str:
    """``text`` as Jira wiki text that renders as itself: unchanged when it holds no markup that could link,
    embed, run a macro or escape (:data:`_MARKUP`), else in a ``{noformat}`` block, where nothing but the
    block's own end is markup (defused: ``{ noformat``)."""
    if not _MARKUP.search(text):
        return text
    return "{noformat}\n" + _NOFORMAT.sub("{ noformat", text) + "\n{noformat}"


class JiraTickets:
    """Tickets as issues of one Jira project.

    ``user`` and ``token`` authenticate (basic auth: a Jira Cloud e-mail and API token, or a Server user and
    password); with no ``user`` the token is a personal access token (bearer). ``issue_types`` and
    ``priorities`` map each kind to a name in the project (an empty ``priorities`` sets none, for projects
    whose screens have no priority). ``client`` is an already built ``jira.JIRA`` (tests, custom auth).
    """

    def __init__(
        self,
        server: str,
        user: str,
        token: SecretStr | str,
        project: str,
        *,
        issue_types: Mapping[str, str] | None = None,
        priorities: Mapping[str, str] | None = None,
        labels: Sequence[str] = (),
        done_transition: str = "Done",
        reopen_transition: str = "Reopen",
        timeout_s: float = 30.0,
        max_retries: int = 3,
        client: JIRA | None = None,
    ) -> None:
        try:
            parts = urlsplit(server)
            parts.port  # noqa: B018 - parsing the port is what raises
        except ValueError as exc:
            raise TicketConfigError(f"the Jira server {redact_url(server)} cannot be used: {exc}") from None
        if parts.scheme not in ("http", "https"):
            raise TicketConfigError(f"the Jira server must be an http(s) URL, not {redact_url(server)}")
        if not project.strip():
            raise TicketConfigError("Jira tickets need a project key")
        unknown = (set(issue_types or {}) | set(priorities or {})) - {"remediation", "replacement", "incident"}
        if unknown:
            raise TicketConfigError(f"unknown ticket kind(s) {sorted(unknown)}: use remediation, replacement, incident")
        self.server = server.rstrip("/")
        self.user = user
        self.project = project.strip()
        self.issue_types = {"remediation": "Task", "replacement": "Task", "incident": "Task"}
        self.issue_types.update(issue_types or {})
        defaults = {"remediation": "High", "replacement": "Highest", "incident": "Highest"}
        self.priorities = defaults if priorities is None else dict(priorities)
        self.labels = tuple(labels)
        self.done_transition = done_transition
        self.reopen_transition = reopen_transition
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self._token = token if isinstance(token, SecretStr) else SecretStr(token)
        self._jira = client
        self._where = redact_url(self.server, keep_path=True)

    def __repr__(self) -> str:
        return f"JiraTickets(server={self._where!r}, project={self.project!r}, user={self.user!r})"

    # --- the TicketBackend protocol ---------------------------------------------------------------------

    def change(self, fingerprint: Fingerprint, change: Change) -> TicketEvent | None:
        """See :meth:`TicketBackend.change`: read the issue by its fingerprint label, change, write it back
        (create, or update and comment; transition on resolve and reopen). Not atomic (see the module)."""
        label = fingerprint_label(fingerprint)
        found = self._search(f'labels = "{_quote(label)}"', f"find the ticket of {fingerprint}")
        issue = _pick(found)
        current = _parse(issue) if issue is not None else None
        if issue is not None and current is None:
            raise TicketError(f"Jira issue {issue.get('key')} carries {label} but no gpucert record")
        others = [
            t
            for raw in self._search(
                f'labels = "{_quote(node_label(fingerprint.node))}"', f"read {fingerprint.node}'s tickets"
            )
            if label not in _labels(raw) and (t := _parse(raw)) is not None
        ]
        event = change(current, others)
        if event is None:
            return None
        ticket = event.ticket
        if issue is None or current is None:
            key = self._create(ticket)
        else:
            key = str(issue["key"])
            if (
                current.state == "resolved"
                and ticket.state == "open"
                and not self._transition(key, self.reopen_transition)
            ):
                # The workflow cannot reopen: the fault carries on in a new issue, the old one points to it.
                old, key = key, self._create(ticket)
                self._comment(old, f"{event.detail}\n\ngpucert continues this ticket in {key}.")
            else:
                self._update(key, ticket)
                self._comment(key, event.detail)
                if (
                    ticket.state == "resolved"
                    and current.state == "open"
                    and not self._transition(key, self.done_transition)
                ):
                    raise TicketError(
                        f"Jira {self._where}: {key} has no transition named {self.done_transition!r}; "
                        "set the Ticketing block's done transition"
                    )
        return replace(event, ticket=ticket.model_copy(update={"id": key, "external_key": key}))

    def get(self, ticket_id: str) -> Ticket:
        """See :meth:`TicketBackend.get`; ``ticket_id`` is the issue key."""
        jira = self._client()
        with self._calling(f"read {ticket_id}", missing=TicketNotFound):
            issue = jira.issue(ticket_id, fields=",".join(_FIELDS))
        ticket = _parse(issue.raw)
        if ticket is None:
            raise TicketNotFound(f"Jira issue {ticket_id} is not a gpucert ticket")
        return ticket

    def tickets(self, *, state: State | None = None, nodes: Iterable[str] | None = None) -> list[Ticket]:
        """See :meth:`TicketBackend.tickets`; open tickets are found by their ``gpucert-open`` label, then
        checked against the issue's status."""
        label = OPEN_LABEL if state == "open" else BASE_LABEL
        wanted = set(nodes) if nodes is not None else None
        found = [t for raw in self._search(f'labels = "{_quote(label)}"', "list tickets") if (t := _parse(raw))]
        return sorted(
            (t for t in found if (state is None or t.state == state) and (wanted is None or t.node in wanted)),
            key=lambda t: (t.created, t.id),
        )

    # --- Jira calls -------------------------------------------------------------------------------------

    def _client(self) -> JIRA:
        if self._jira is None:
            from jira import JIRA

            token = reveal(self._token)
            # The constructor asks for the server's info before the deadline's transport can be mounted:
            # that one request gets no retry and timeouts that add up to the deadline.
            seconds = call_deadline_s()
            connect = min(CONNECT_TIMEOUT_S, seconds / 4)
            first = (connect, min(self.timeout_s, seconds - connect))
            auth: dict[str, Any] = {"basic_auth": (self.user, token)} if self.user else {"token_auth": token}
            with self._calling("connect"):
                jira = JIRA(self.server, options={"check_update": False}, timeout=first, max_retries=0, **auth)
            # The client keeps its session private; it is the one place to set its transport and retries.
            session = jira._session
            session.timeout = (CONNECT_TIMEOUT_S, self.timeout_s)
            session.max_retries = 0  # the retries are the shared policy's, in the deadline's transport
            retry = RetryPolicy(attempts=self.max_retries + 1, base_delay_s=0.5, max_delay_s=10.0)
            _mount_deadline(session, retry)
            self._jira = jira
        return self._jira

    @contextlib.contextmanager
    def _calling(self, what: str, *, missing: type[TicketError] = TicketError) -> Iterator[None]:
        """Turn the client's errors into :class:`TicketError` (``missing`` for a 404).

        ``from None``: a ``JIRAError`` prints the request's headers, Authorization included, so it must
        not ride along as the cause of what gpucert raises (and logs).
        """
        import requests
        from jira.exceptions import JIRAError

        secrets = [reveal(self._token)]
        deadline = Deadline.start()
        token = _DEADLINE.set(deadline)
        try:
            yield
        except JIRAError as exc:
            text = scrub(str(exc.text or "")[:300], secrets)
            if exc.status_code == 404:
                raise missing(f"Jira {self._where}: {what} failed: HTTP 404 (not found): {text}") from None
            raise TicketError(f"Jira {self._where}: {what} failed: HTTP {exc.status_code}: {text}") from None
        except requests.Timeout:
            raise TicketError(
                f"Jira {self._where}: {what} failed: no answer within {deadline.elapsed():.1f} s (the deadline "
                f"of a call is {deadline.seconds:g} s: gpucert --timeout or ${TIMEOUT_ENV})"
            ) from None
        except requests.RequestException as exc:
            raise TicketError(f"Jira {self._where}: {what} failed: {type(exc).__name__}") from None
        except (ValueError, KeyError, TypeError) as exc:
            detail = scrub(str(exc)[:200], secrets)
            raise TicketError(f"Jira {self._where}: {what}: unexpected answer ({detail})") from None
        finally:
            _DEADLINE.reset(token)

    def _search(self, where: str, what: str) -> list[dict[str, Any]]:
        jira = self._client()
        jql = f'project = "{_quote(self.project)}" AND {where}'
        with self._calling(what):
            found = jira.search_issues(jql, maxResults=False, fields=list(_FIELDS))
        return [cast(dict[str, Any], issue.raw) for issue in cast(Iterable[Any], found)]

    def _fields(self, ticket: Ticket) -> dict[str, Any]:
        labels = [
            BASE_LABEL,
            *self.labels,
            fingerprint_label(ticket.fingerprint),
            node_label(ticket.node),
            f"gpucert-{ticket.kind}",
            f"gpucert-cause-{ticket.cause}",
        ]
        if ticket.state == "open":
            labels.append(OPEN_LABEL)
        fields: dict[str, Any] = {
            "summary": " ".join(ticket.title.split())[:250],  # one line: Jira refuses a line break
            "description": _description(ticket),
            "labels": list(dict.fromkeys(labels)),
        }
        if self.priorities.get(ticket.kind):
            fields["priority"] = {"name": self.priorities[ticket.kind]}
        return fields

    def _create(self, ticket: Ticket) -> str:
        jira = self._client()
        fields = self._fields(ticket)
        fields["project"] = self.project  # the client resolves the key to the project's id
        fields["issuetype"] = {"name": self.issue_types.get(ticket.kind, "Task")}
        with self._calling(f"create the ticket of {ticket.fingerprint}"):
            issue = jira.create_issue(fields=fields, prefetch=False)
        return str(issue.key)

    def _update(self, key: str, ticket: Ticket) -> None:
        jira = self._client()
        with self._calling(f"update {key}"):
            jira.issue(key, fields="labels").update(fields=self._fields(ticket))

    def _comment(self, key: str, text: str) -> None:
        jira = self._client()
        with self._calling(f"comment on {key}"):
            jira.add_comment(key, inert(text))

    def _transition(self, key: str, name: str) -> bool:
        """Move ``key`` through the transition called ``name``; returns False when it has none by that name."""
        jira = self._client()
        with self._calling(f"transition {key} ({name})"):
            for transition in jira.transitions(key):
                if str(transition.get("name", "")).lower() == name.lower():
                    jira.transition_issue(key, str(transition["id"]))
                    return True
        return False


def _quote(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _labels(raw: Mapping[str, Any]) -> list[str]:
    return list((raw.get("fields") or {}).get("labels") or [])


def _is_done(raw: Mapping[str, Any]) -> bool:
    status = (raw.get("fields") or {}).get("status") or {}
    category = (status.get("statusCategory") or {}).get("key")
    return category == "done" or str(status.get("name", "")).lower() in _DONE_NAMES


def _pick(issues: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The issue that is the fingerprint's ticket: the open one, else the newest."""
    if not issues:
        return None
    ordered = sorted(issues, key=lambda raw: int(raw.get("id") or 0))
    live = [raw for raw in ordered if not _is_done(raw)]
    return (live or ordered)[-1]


def _record_json(ticket: Ticket) -> str:
    # "{noformat}" ends the block; inside a JSON string it can be written with an escaped brace instead.
    return ticket.model_dump_json(exclude={"id", "external_key"}).replace("{noformat}", "\\u007bnoformat}")


def _description(ticket: Ticket) -> str:
    """The issue description: the ticket in words, then the record (oldest evidence dropped to fit)."""
    body = inert(ticket.body())
    for keep in range(len(ticket.evidence), -1, -1):
        trimmed = ticket.model_copy(update={"evidence": ticket.evidence[len(ticket.evidence) - keep :]})
        text = f"{body}\n\n----{_RECORD_START}{_record_json(trimmed)}\n{{noformat}}"
        if len(text) <= _MAX_DESCRIPTION:
            return text
    raise TicketError(f"the ticket of {ticket.fingerprint} does not fit a Jira description")


def _parse(raw: Mapping[str, Any]) -> Ticket | None:
    """The ticket an issue holds (Jira's status deciding its state), or None for an issue without a record."""
    fields = raw.get("fields") or {}
    description = str(fields.get("description") or "")
    head = description.rfind(_RECORD_START)
    if head < 0:
        return None
    found = _RECORD.match(description, head + len(_RECORD_START) - len("{noformat}\n"))
    if found is None:
        return None
    try:
        ticket = Ticket.model_validate_json(found.group(1))
    except ValueError:
        return None
    key = str(raw.get("key", ""))
    update: dict[str, Any] = {"id": key, "external_key": key}
    done = _is_done(raw)
    if done and ticket.state == "open":  # closed by a person
        closed = _jira_time(fields.get("resolutiondate")) or _jira_time(fields.get("updated")) or ticket.updated
        update |= {"state": "resolved", "resolved": closed}
    elif not done and ticket.state == "resolved":  # reopened by a person
        update |= {"state": "open", "resolved": None}
    return ticket.model_copy(update=update)


def _jira_time(value: object) -> datetime | None:
    """A Jira timestamp (``2026-11-21T02:00:00.000+0000``), or None."""
    if not isinstance(value, str) or not value:
        return None
    for pattern in ("%Y-%m-%dT%H:%M:%S.%f%z", "%Y-%m-%dT%H:%M:%S%z"):
        with contextlib.suppress(ValueError):
            return datetime.strptime(value, pattern)
    return None
