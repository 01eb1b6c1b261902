"""The webhook backend against a local receiver, and the Ticketing block (Prefect's checks, its secrets)."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import json
import logging
import traceback
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from pydantic import SecretStr

from gpucert.blocks.ticketing import Ticketing
from gpucert.tickets import TicketBackend, TicketConfigError, TicketError, WebhookTickets, reconcile, record_remediation

from .fakejira import AppThread
from .test_tickets import THERMAL, verdicts

T0 = dt.datetime(2026, 11, 1, 2, tzinfo=dt.UTC)
DAY = dt.timedelta(days=1)
#: The secret part of a Slack webhook URL is its path.
HOOK = "/services/T0000/B0000/XxSecretPathXx"
HEADER_SECRET, SIGNING = "Bearer hdr-secret-77", "signing-secret-42"


@dataclass
class Receiver:
    """Records every POST; answers with ``statuses`` in turn (200 once they run out)."""

    statuses: list[int] = field(default_factory=list)
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.received.append((dict(request.headers), await request.read()))
        status = self.statuses.pop(0) if self.statuses else 200
        headers = {"Retry-After": "0"} if status == 429 else {}
        if 300 <= status < 400:
            headers = {"Location": "/moved"}
        return web.Response(status=status, text="ok" if status == 200 else "no", headers=headers)

    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(body) for _, body in self.received]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    hook = Receiver()
    app = web.Application()
    app.router.add_post(HOOK, hook.handle)
    app.router.add_route("*", "/moved", hook.handle)  # where a redirect points: 200 when reached
    with AppThread(app) as http:
        hook.url = http.url + HOOK
        yield hook


def webhook(receiver: Receiver, tmp_path: Path, **kwargs: Any) -> WebhookTickets:
    kwargs.setdefault("backoff_s", 0.01)
    return WebhookTickets(SecretStr(receiver.url), tmp_path / "state.sqlite", **kwargs)


def night(tickets: TicketBackend, day: int, flagged: list[dict[str, Any]]) -> list[Any]:
    return reconcile(tickets, verdicts(f"night-{day}", flagged), run_id=f"night-{day}", now=T0 + day * DAY)


def test_each_change_is_posted_as_a_slack_compatible_message(receiver: Receiver, tmp_path: Path) -> None:
    tickets = webhook(receiver, tmp_path, headers={"Authorization": SecretStr(HEADER_SECRET)})
    key = night(tickets, 1, [THERMAL])[0].ticket.id
    record_remediation(tickets, key, "reset_gpu", T0 + 1.5 * DAY)
    night(tickets, 2, [THERMAL])
    record_remediation(tickets, key, "reboot_node", T0 + 2.5 * DAY)
    night(tickets, 3, [THERMAL])
    night(tickets, 4, [])

    bodies = receiver.bodies()
    assert [b["gpucert"]["event"] for b in bodies] == [
        "opened",
        "remediated",
        "updated",
        "remediated",
        "escalated",
        "resolved",
    ]
    opened = bodies[0]
    assert opened["text"] == ":rotating_light: gpucert opened: [remediation] n1 GPU 2 thermal: check_cooling"
    assert [b["type"] for b in opened["blocks"]] == ["header", "section", "section", "context"]
    assert all(len(b["text"]["text"]) <= 150 for b in opened["blocks"] if b["type"] == "header")
    facts = {f["text"].split("\n")[0]: f["text"].split("\n")[1] for f in opened["blocks"][2]["fields"]}
    assert (facts["*Node*"], facts["*Cause*"], facts["*GPU*"]) == ("n1", "thermal", "2 GPU-n1-2")
    assert opened["gpucert"]["ticket"]["gpu_uuid"] == "GPU-n1-2"
    assert opened["gpucert"]["ticket"]["evidence"][0]["run_id"] == "night-1"
    escalated = bodies[4]
    assert escalated["gpucert"]["ticket"]["kind"] == "replacement"
    assert any("*Escalated:*" in b.get("text", {}).get("text", "") for b in escalated["blocks"])
    headers = receiver.received[0][0]
    assert headers["Authorization"] == HEADER_SECRET
    assert headers["Content-Type"] == "application/json"
    assert tickets.get(key).state == "resolved"


def test_a_signing_secret_signs_each_body(receiver: Receiver, tmp_path: Path) -> None:
    tickets = webhook(receiver, tmp_path, signing_secret=SecretStr(SIGNING), structured=False)
    night(tickets, 1, [THERMAL])
    [(headers, body)] = receiver.received
    expected = hmac.new(SIGNING.encode(), body, hashlib.sha256).hexdigest()
    assert headers["X-Gpucert-Signature"] == f"sha256={expected}"
    assert set(json.loads(body)) == {"text", "blocks"}  # plain Slack, nothing else


def test_server_errors_and_rate_limits_are_retried_with_backoff(receiver: Receiver, tmp_path: Path) -> None:
    receiver.statuses = [503, 502, 429]
    tickets = webhook(receiver, tmp_path)
    [event] = night(tickets, 1, [THERMAL])
    assert len(receiver.received) == 4
    assert tickets.get(event.ticket.id).occurrences == 1


def test_a_refused_post_is_not_retried_and_stores_nothing(receiver: Receiver, tmp_path: Path) -> None:
    receiver.statuses = [400]
    tickets = webhook(receiver, tmp_path)
    with pytest.raises(TicketError, match="HTTP 400; the ticket change was not stored"):
        night(tickets, 1, [THERMAL])
    assert len(receiver.received) == 1
    assert tickets.tickets() == []
    [event] = night(tickets, 1, [THERMAL])  # the next reconcile of the run does it
    assert event.kind == "opened"


def test_a_redirect_is_not_followed(receiver: Receiver, tmp_path: Path) -> None:
    # Following it would carry the signed body and the headers somewhere the configuration never named.
    receiver.statuses = [302]
    tickets = webhook(receiver, tmp_path, headers={"Authorization": SecretStr(HEADER_SECRET)})
    with pytest.raises(TicketError, match="HTTP 302; the ticket change was not stored"):
        night(tickets, 1, [THERMAL])
    assert len(receiver.received) == 1
    assert tickets.tickets() == []


def test_a_webhook_that_keeps_failing_leaks_no_secret_anywhere(
    receiver: Receiver, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    secrets = (HOOK, "XxSecretPathXx", HEADER_SECRET, SIGNING)
    block = Ticketing(
        backend="webhook",
        url=SecretStr(receiver.url),
        path=str(tmp_path),
        headers={"Authorization": SecretStr(HEADER_SECRET)},
        signing_secret=SecretStr(SIGNING),
    )
    tickets = block.open()
    assert isinstance(tickets, WebhookTickets)
    tickets.backoff_s = 0.01
    receiver.statuses = [500] * 10
    with pytest.raises(TicketError, match=r"webhook http://127\.0\.0\.1:\d+/…: HTTP 500 after 5 attempts") as failed:
        night(tickets, 1, [THERMAL])
    assert len(receiver.received) == 5
    assert len([r for r in caplog.records if "retry" in r.getMessage()]) == 4
    shown = "".join(traceback.format_exception(failed.value)) + caplog.text + repr(block) + str(block) + repr(tickets)
    shown += str(block.model_dump()) + block.model_dump_json()
    assert not [s for s in secrets if s in shown]
    assert tickets.tickets() == []  # rolled back: nothing stored unannounced

    # The receiver gone altogether: a connection error, retried, and still no secret.
    dead = WebhookTickets(SecretStr("http://127.0.0.1:9" + HOOK), tmp_path / "s.sqlite", retries=1, backoff_s=0.01)
    with pytest.raises(TicketError, match="ConnectError") as refused:
        night(dead, 1, [THERMAL])
    shown = "".join(traceback.format_exception(refused.value)) + caplog.text
    assert not [s for s in secrets if s in shown]


def test_the_block_refuses_an_incomplete_webhook_without_echoing_secrets(tmp_path: Path) -> None:
    # Secrets given as plain strings, as a user typing them would: the error must not echo its input.
    with pytest.raises(ValueError, match="needs a url") as incomplete:
        Ticketing(backend="webhook", headers={"Authorization": HEADER_SECRET}, signing_secret=SIGNING)
    assert HEADER_SECRET not in str(incomplete.value)
    assert SIGNING not in str(incomplete.value)
    with pytest.raises(ValueError, match="valid string") as wrong:
        Ticketing(backend="webhook", url="http://x" + HOOK, headers={"Authorization": 5})  # type: ignore[dict-item]
    assert HOOK not in str(wrong.value)
    with pytest.raises(TicketConfigError, match="must be http") as bad:
        Ticketing(backend="webhook", url=SecretStr("ftp://host" + HOOK), path=str(tmp_path)).open()
    assert HOOK not in str(bad.value)


class TestTicketingStandard(BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return Ticketing


@pytest.mark.usefixtures("prefect_harness")
def test_the_block_saves_and_loads_with_its_secrets(receiver: Receiver, tmp_path: Path) -> None:
    Ticketing(backend="webhook", url=SecretStr(receiver.url), path=str(tmp_path)).save("hook", overwrite=True)
    loaded = Ticketing.load("hook")
    assert loaded.url is not None
    assert loaded.url.get_secret_value() == receiver.url
    assert receiver.url not in repr(loaded)
    night(loaded.open(), 1, [THERMAL])
    assert len(receiver.received) == 1
