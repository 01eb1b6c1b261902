"""The Jira backend: the real ``jira`` client against a local fake of the REST v2 calls it makes."""

from __future__ import annotations

import base64
import datetime as dt
import logging
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from gpucert.blocks.ticketing import Ticketing
from gpucert.tickets import (
    JiraTickets,
    RunEvidence,
    TicketConfigError,
    TicketError,
    TicketNotFound,
    reconcile,
    record_remediation,
    tickets_list,
)

from .fakejira import AppThread, FakeJira
from .test_tickets import THERMAL, verdicts

T0 = dt.datetime(2026, 11, 1, 2, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
USER, TOKEN = "gpucert-bot@example.com", "jira-token-Zq8x1"
#: What the client may call: the subset the fake serves (docs/design/testing.md).
ENDPOINTS = ("/serverInfo", "/field", "/project/", "/issue", "/search")


@pytest.fixture
def fake() -> Iterator[FakeJira]:
    jira = FakeJira(user=USER, token=TOKEN)
    with AppThread(jira.app()) as http:
        jira.base = http.url
        yield jira


def backend(fake: FakeJira, **kwargs: Any) -> JiraTickets:
    return JiraTickets(fake.base, USER, SecretStr(TOKEN), "OPS", **kwargs)


def night(tickets: JiraTickets, day: int, flagged: list[dict[str, Any]], **kwargs: Any) -> list[Any]:
    table = verdicts(f"night-{day}", flagged)
    return reconcile(tickets, table, run_id=f"night-{day}", now=T0 + day * DAY, **kwargs)


def fields(fake: FakeJira, key: str) -> dict[str, Any]:
    return fake.issues[key]["fields"]


def comments(fake: FakeJira, key: str) -> list[str]:
    return [c["body"] for c in fake.comments[key]]


def test_a_ticket_lives_as_one_issue_from_open_to_done(fake: FakeJira) -> None:
    tickets = backend(fake)
    evidence = RunEvidence(report="https://reports.example.com/night-1.html", stacks={"n1": {"driver": "570.86"}})
    [opened] = night(tickets, 1, [THERMAL], evidence=evidence)
    key = opened.ticket.id
    assert (key, opened.ticket.external_key) == ("OPS-1", "OPS-1")
    issue = fields(fake, key)
    assert issue["summary"] == "[remediation] n1 GPU 2 thermal: check_cooling"
    assert (issue["issuetype"]["name"], issue["priority"]["name"], issue["project"]["key"]) == ("Task", "High", "OPS")
    assert set(issue["labels"]) == {
        "gpucert",
        "gpucert-open",
        f"gpucert-fp-{opened.ticket.fingerprint.digest}",
        "gpucert-node-n1",
        "gpucert-remediation",
        "gpucert-cause-thermal",
    }
    assert "report: https://reports.example.com/night-1.html" in issue["description"]
    assert "stack: driver=570.86" in issue["description"]

    [updated] = night(tickets, 2, [THERMAL])
    assert (updated.kind, updated.ticket.id, updated.ticket.occurrences) == ("updated", key, 2)
    assert comments(fake, key) == [
        "recurred: fail in run night-2 (occurrence 2): HW thermal slowdown 31 % of the benchmark"
    ]

    # Remediations read and write through Jira too; two resets then a recurrence is hardware.
    record_remediation(tickets, key, "reset_gpu", T0 + 2.5 * DAY)
    record_remediation(tickets, key, "reboot_node", T0 + 3.5 * DAY)
    [escalated] = night(tickets, 4, [THERMAL])
    assert (escalated.kind, escalated.ticket.kind) == ("escalated", "replacement")
    issue = fields(fake, key)
    assert issue["priority"]["name"] == "Highest"
    assert "gpucert-replacement" in issue["labels"]
    assert "gpucert-remediation" not in issue["labels"]
    assert issue["summary"].startswith("[replacement]")

    [resolved] = night(tickets, 5, [])
    assert (resolved.kind, resolved.ticket.state) == ("resolved", "resolved")
    assert fields(fake, key)["status"]["name"] == "Done"
    assert "gpucert-open" not in fields(fake, key)["labels"]
    assert comments(fake, key)[-1].startswith("resolved by run night-5")
    assert len(fake.issues) == 1

    ticket = tickets.get(key)
    assert (ticket.state, ticket.occurrences, [r.action for r in ticket.remediations]) == (
        "resolved",
        3,
        ["reset_gpu", "reboot_node"],
    )
    assert tickets.tickets(state="open") == []
    assert [t.id for t in tickets.tickets(state="resolved", nodes=["n1"])] == [key]
    assert "OPS-1  resolved  replacement" in tickets_list(tickets)

    # Only the documented subset of the API was used.
    paths = {path.split("?")[0].removeprefix("/rest/api/2") for _, path, _ in fake.requests}
    assert all(p.startswith(ENDPOINTS) for p in paths), paths


def test_a_recurrence_after_resolution_reopens_the_issue(fake: FakeJira) -> None:
    tickets = backend(fake)
    key = night(tickets, 1, [THERMAL])[0].ticket.id
    night(tickets, 2, [])
    [reopened] = night(tickets, 3, [THERMAL])
    assert (reopened.kind, reopened.ticket.id, reopened.ticket.state) == ("reopened", key, "open")
    assert fields(fake, key)["status"]["name"] == "Open"
    assert "gpucert-open" in fields(fake, key)["labels"]


def test_a_workflow_without_reopen_continues_in_a_new_issue(fake: FakeJira) -> None:
    fake.reopen = False
    tickets = backend(fake)
    night(tickets, 1, [THERMAL])
    night(tickets, 2, [])
    [reopened] = night(tickets, 3, [THERMAL])
    assert reopened.ticket.id == "OPS-2"
    assert "gpucert continues this ticket in OPS-2" in comments(fake, "OPS-1")[-1]
    # The fingerprint's ticket is now the new issue, carrying the whole history.
    [again] = night(tickets, 4, [THERMAL])
    assert (again.ticket.id, again.ticket.occurrences) == ("OPS-2", 3)


def test_jira_status_wins_over_the_record_when_a_person_closes_the_issue(fake: FakeJira) -> None:
    tickets = backend(fake)
    key = night(tickets, 1, [THERMAL])[0].ticket.id
    fake.close(key)
    ticket = tickets.get(key)
    assert ticket.state == "resolved"
    assert ticket.resolved is not None
    [event] = night(tickets, 2, [THERMAL])
    assert (event.kind, event.ticket.id) == ("reopened", key)


def test_a_replacement_row_opens_a_replacement_issue_with_its_own_type(fake: FakeJira) -> None:
    tickets = backend(fake, issue_types={"replacement": "Bug"})
    remap = {"node": "n2", "gpu": 1, "cause": "row_remap", "ticket": "replacement", "action": "run_field_diag"}
    [event] = night(tickets, 1, [remap])
    issue = fields(fake, event.ticket.id)
    assert (issue["issuetype"]["name"], issue["priority"]["name"]) == ("Bug", "Highest")


def test_a_personal_access_token_is_sent_as_a_bearer_token(fake: FakeJira) -> None:
    tickets = JiraTickets(fake.base, "", SecretStr(TOKEN), "OPS", priorities={})
    [event] = night(tickets, 1, [THERMAL])
    assert "priority" not in fields(fake, event.ticket.id)
    assert fake.requests[-1][2]["Authorization"] == f"Bearer {TOKEN}"


def test_errors_name_the_call_and_never_carry_the_token(fake: FakeJira, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    encoded = base64.b64encode(f"{USER}:{TOKEN}".encode()).decode()

    def leaks(exc: BaseException) -> bool:
        text = "".join(traceback.format_exception(exc)) + caplog.text + repr(exc)
        return TOKEN in text or encoded in text

    wrong = JiraTickets(fake.base, USER, SecretStr("not-the-token"), "OPS")
    with pytest.raises(TicketError, match="connect failed: HTTP 401") as refused:
        wrong.tickets()
    assert not leaks(refused.value)

    tickets = backend(fake)
    tickets.tickets()  # connected
    fake.fail_next = [500]
    with pytest.raises(TicketError, match=r"find the ticket of n1/GPU-n1-2/thermal failed: HTTP 500") as failed:
        night(tickets, 1, [THERMAL])
    assert not leaks(failed.value)
    assert TOKEN not in repr(tickets)

    with pytest.raises(TicketNotFound, match="OPS-404"):
        tickets.get("OPS-404")
    with pytest.raises(TicketError, match="connect failed: ConnectionError"):
        JiraTickets("http://127.0.0.1:9", USER, TOKEN, "OPS", max_retries=0, timeout_s=2).tickets()


def test_throttled_and_unavailable_answers_are_retried_within_the_call(fake: FakeJira) -> None:
    # The shared retry policy, not the client's session: a 503 without Retry-After is worth a try too.
    tickets = backend(fake)
    tickets.tickets()  # connected
    fake.fail_next = [429, 503]
    [event] = night(tickets, 1, [THERMAL])
    assert event.kind == "opened"
    assert fake.fail_next == []


def test_an_unknown_project_or_done_transition_is_a_ticket_error(fake: FakeJira) -> None:
    with pytest.raises(TicketConfigError, match="must be an http"):
        JiraTickets("jira.example.com", USER, TOKEN, "OPS")
    with pytest.raises(TicketError, match="create the ticket of n1/GPU-n1-2/thermal failed: HTTP 404"):
        night(JiraTickets(fake.base, USER, TOKEN, "NOPE"), 1, [THERMAL])
    tickets = backend(fake, done_transition="Close")
    night(tickets, 1, [THERMAL])
    with pytest.raises(TicketError, match="no transition named 'Close'"):
        night(tickets, 2, [])


def test_many_tickets_page_through_search(fake: FakeJira) -> None:
    fake.max_page = 2  # the server caps a page, as Jira does; the client pages on
    tickets = backend(fake)
    flagged = [{"node": n, "gpu": g, "cause": "xid", "action": "reset_gpu"} for n in ("n1", "n2") for g in range(3)]
    assert len(night(tickets, 1, flagged)) == 6
    fake.requests.clear()
    assert len(tickets.tickets(state="open")) == 6
    assert sum(path.startswith("/rest/api/2/search") for _, path, _ in fake.requests) == 3


def test_the_ticketing_block_opens_jira_and_checks_its_fields(fake: FakeJira) -> None:
    block = Ticketing(backend="jira", server=fake.base, user=USER, token=SecretStr(TOKEN), project="OPS")
    tickets = block.open()
    assert isinstance(tickets, JiraTickets)
    [event] = night(tickets, 1, [THERMAL])
    assert event.ticket.id == "OPS-1"
    assert TOKEN not in repr(block)
    with pytest.raises(ValueError, match="needs server, project, token") as missing:
        Ticketing(backend="jira")
    assert TOKEN not in str(missing.value)
    with pytest.raises(ValueError, match="unknown ticket kind") as unknown:
        Ticketing(backend="jira", server=fake.base, token=SecretStr(TOKEN), project="OPS", priorities={"rma": "High"})
    assert TOKEN not in str(unknown.value)
