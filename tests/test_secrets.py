"""Secrets never leave the places they are for: a full run is given every kind of secret, and every output
it makes is searched for each of them — as written, base64-encoded (also as the ``user:token`` of a basic
``Authorization`` header) and URL-encoded.

The run: ``gpucert certify`` on a simulated cluster reached through a kubeconfig with a bearer token, an S3
store (SeaweedFS, SigV4 with a secret access key from boto3's environment), a fault on one node, tickets
to Jira (the fake speaking REST v2; a token) and then to a webhook (a local receiver; the URL's path, a
header and a signing secret are secrets). What is searched: stdout and stderr, every Python log record at
DEBUG, every object written to the store, every file written under the run's folder, the Jira issues and
comments, the webhook bodies, and what the Prefect server keeps of the runs (their parameters, logs and
artifacts). Then calls made to fail — Jira answering 401, S3 answering 403, a webhook answering 500 or
refusing, an API server that is not there — raise errors whose message, ``repr`` and whole traceback
(causes and contexts included) hold none of the secrets either.

What is not searched, and why: the kubeconfig and the saved Ticketing blocks (where the user keeps the
secrets), the servers' own side (the fake Jira's request log, the simulator's request log), and the S3
*access key id*, which AWS documents as no secret: SigV4 sends it in every request, and a presigned report
link carries it in ``X-Amz-Credential``; it is searched for everywhere else.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import traceback
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from aiohttp import web
from pydantic import SecretStr

from gpucert.blocks.ticketing import Ticketing
from gpucert.cli import main
from gpucert.errors import GpucertError
from gpucert.kube import connect
from gpucert.store import open_store
from gpucert.tickets import JiraTickets, TicketError, WebhookTickets
from gpucert_sim import SimCluster
from gpucert_sim._server import kubeconfig_text
from gpucert_sim.fleet import Fault

from . import s3servers
from .fakejira import AppThread, FakeJira
from .unavailable import unavailable

pytestmark = pytest.mark.usefixtures("prefect_harness")

BUCKET = "gpucert-secrets"
JIRA_USER = "gpucert-bot@example.com"
JIRA_TOKEN = "jira-T0ken/Zq9+xW="
HOOK_PATH = "T0SECRET/B0SECRET/aZ9xHookPath"
HOOK_HEADER = "hook-H3ader+T0ken/9"
HOOK_SIGNING = "whsec-S1gning/K3y+Q="
S3_ACCESS = "GPUCERTAKIASECRETS9"
S3_SECRET = "s3-S3cret/Acc3ss+Key=9q"
KUBE_TOKEN = "kube-B3arer.T0ken-x7Q"
#: Every secret given to the run, by name.
SECRETS = {
    "the Jira token": JIRA_TOKEN,
    "the webhook URL's path": HOOK_PATH,
    "the webhook header": HOOK_HEADER,
    "the webhook signing secret": HOOK_SIGNING,
    "the S3 secret access key": S3_SECRET,
    "the kubeconfig bearer token": KUBE_TOKEN,
}


def spellings(secret: str) -> set[str]:
    """The ways a secret can show: as is, base64 (standard, URL-safe, unpadded), URL-encoded."""
    raw = secret.encode()
    b64 = {base64.b64encode(raw).decode(), base64.urlsafe_b64encode(raw).decode()}
    return (
        {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}
        | b64
        | {b.rstrip("=") for b in b64}
    )


#: Each spelling of each secret, with the secret's name; the basic-auth header's value too.
NEEDLES = {s: name for name, secret in SECRETS.items() for s in spellings(secret)} | {
    base64.b64encode(f"{JIRA_USER}:{JIRA_TOKEN}".encode()).decode(): "the Jira basic-auth header"
}


def leaks(where: str, text: str | bytes, *, access_key_id: bool = True) -> list[str]:
    """``where: <secret name>`` for every secret spelled in ``text``; with ``access_key_id``, the S3
    access key id too, outside a presigned URL's ``X-Amz-Credential``."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    found = [f"{where}: {name}" for name in dict.fromkeys(name for needle, name in NEEDLES.items() if needle in text)]
    if access_key_id:
        rest = text.replace(f"X-Amz-Credential={S3_ACCESS}%2F", "").replace(f"X-Amz-Credential={S3_ACCESS}/", "")
        if S3_ACCESS in rest:
            found.append(f"{where}: the S3 access key id (outside a presigned link)")
    return found


@dataclass
class Hook:
    """A webhook receiver: every body and header set it was sent; answers ``status``."""

    bodies: list[bytes] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    status: int = 200

    def app(self) -> web.Application:
        async def receive(request: web.Request) -> web.Response:
            self.bodies.append(await request.read())
            self.headers.append(dict(request.headers))
            return web.Response(status=self.status, text="ok")

        app = web.Application()
        app.router.add_post("/hooks/{tail:.*}", receive)
        return app


@pytest.fixture(scope="module")
def s3() -> Iterator[str]:
    # SeaweedFS enforces SigV4 for the credentials it starts with: these, distinctive ones.
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(s3servers, "ACCESS_KEY", S3_ACCESS)
        patch.setattr(s3servers, "SECRET_KEY", S3_SECRET)
        server = s3servers.SeaweedFS(BUCKET)
        try:
            endpoint = server.start()
        except s3servers.ServerDidNotStart as exc:
            unavailable(f"SeaweedFS could not start: {exc}")
    try:
        yield endpoint
    finally:
        server.stop()


@pytest.fixture(scope="module")
def jira() -> Iterator[FakeJira]:
    fake = FakeJira(user=JIRA_USER, token=JIRA_TOKEN)
    with AppThread(fake.app()) as http:
        fake.base = http.url
        yield fake


@pytest.fixture(scope="module")
def hook() -> Iterator[tuple[Hook, str]]:
    receiver = Hook()
    with AppThread(receiver.app()) as http:
        yield receiver, f"{http.url}/hooks/{HOOK_PATH}"


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, s3: str) -> str:
    """boto3's environment for the S3 server, nothing from the host's ~/.aws."""
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_SESSION_TOKEN", "GPUCERT_S3_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in (
        ("AWS_CONFIG_FILE", str(tmp_path / "no-aws")),
        ("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws")),
        ("AWS_ACCESS_KEY_ID", S3_ACCESS),
        ("AWS_SECRET_ACCESS_KEY", S3_SECRET),
        ("AWS_DEFAULT_REGION", s3servers.REGION),
        ("AWS_ENDPOINT_URL_S3", s3),
        ("AWS_EC2_METADATA_DISABLED", "true"),
    ):
        monkeypatch.setenv(name, value)
    return s3


def _prefect_records(run_ids: list[str]) -> list[tuple[str, str]]:
    """What the Prefect server keeps of the flow runs named ``run_ids``: (what, text) for each run's
    parameters, every log line of the runs and their tasks, and every artifact."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName, LogFilter, LogFilterFlowRunId

    async def read() -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        async with get_client() as client:
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=run_ids)))
            assert {r.name for r in runs} == set(run_ids)
            for run in runs:
                out.append((f"flow run {run.name} parameters", json.dumps(run.parameters, default=str)))
                logs = await client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run.id])))
                out += [(f"flow run {run.name} log", log.message) for log in logs]
            for artifact in await client.read_artifacts():
                out.append((f"artifact {artifact.key}", json.dumps(artifact.data, default=str)))
                out.append((f"artifact {artifact.key} description", str(artifact.description or "")))
        return out

    return asyncio.run(read())


def test_a_full_run_leaks_no_secret_anywhere(
    aws: str,
    jira: FakeJira,
    hook: tuple[Hook, str],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    receiver, hook_url = hook
    folder = tmp_path / "run"
    folder.mkdir()
    Ticketing(backend="jira", server=jira.base, user=JIRA_USER, token=SecretStr(JIRA_TOKEN), project="OPS").save(
        "secrets-jira", overwrite=True
    )
    Ticketing(
        backend="webhook",
        url=SecretStr(hook_url),
        headers={"Authorization": SecretStr(HOOK_HEADER)},
        signing_secret=SecretStr(HOOK_SIGNING),
        path=str(folder / "hook.sqlite"),
    ).save("secrets-hook", overwrite=True)
    # Prefect configures logging when it is imported (replacing the root logger's handlers) and again when its
    # main module is (resetting the root level): done first, so that the capture stays on for the whole run.
    import prefect.main  # noqa: F401
    from prefect.logging.configuration import ensure_logging_setup

    ensure_logging_setup()
    root = logging.getLogger()
    root.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG)
    # Every layer at DEBUG for this run, whatever an earlier test in this process left: kubernetes_asyncio's
    # Configuration (prefect-kubernetes makes one) sets urllib3's logger to WARNING, and it stays so.
    for layer in ("urllib3", "botocore", "httpx", "httpcore"):
        caplog.set_level(logging.DEBUG, logger=layer)
    # The console shows what it shows by default (Prefect's INFO, others' WARNING), not the DEBUG captured.
    console = [h for h in root.handlers if h is not caplog.handler]
    for handler in console:
        handler.addFilter(_default_console)
    outputs: list[tuple[str, str | bytes]] = []
    try:
        with SimCluster(nodes=3, preconfigured=True, seed=5) as sim:
            kubeconfig = tmp_path / "kubeconfig.yaml"  # the user's file, which holds the token: not searched
            kubeconfig.write_text(kubeconfig_text(sim.url, user=KUBE_TOKEN))
            bad = sim.fleet.node_names[1]
            sim.inject_fault(Fault("remap_failure", bad, 3))  # a hard gate: failed, tainted, a ticket
            store = f"s3://{BUCKET}/fleet"
            base = ["certify", "--kubeconfig", str(kubeconfig), "--store", store]
            assert main([*base, "--ticketing", "secrets-jira", "--run-id", "secrets-jira"]) == 0
            assert main([*base, "--ticketing", "secrets-hook", "--run-id", "secrets-hook"]) == 0
            captured = capsys.readouterr()
            outputs += [("stdout", captured.out), ("stderr", captured.err)]
            assert "secrets-jira" in captured.out
            assert "secrets-hook" in captured.out
            assert {r.user for r in sim.requests} == {KUBE_TOKEN}, "the cluster was reached with the token"
    finally:
        root.removeHandler(caplog.handler)
        for handler in console:
            handler.removeFilter(_default_console)
    names = {r.name.split(".")[0] for r in caplog.records}
    assert {"prefect", "botocore", "urllib3"} <= names, f"every layer's records were captured: {names}"

    # The run did what it was given the secrets for.
    issues = [i for i in jira.issues.values() if f"gpucert-node-{bad}" in i["fields"]["labels"]]
    assert issues, "a Jira issue was opened"
    assert receiver.bodies, "the webhook was called"
    assert all(h.get("X-Gpucert-Signature", "").startswith("sha256=") for h in receiver.headers)
    assert all(h.get("Authorization") == HOOK_HEADER for h in receiver.headers)

    # botocore's DEBUG trace prints each request's SigV4 Authorization header, which names the access key id.
    outputs += [(f"log record {r.name} {r.levelname}", _record_text(r)) for r in caplog.records]
    aws_trace = {f"log record {r.name} DEBUG" for r in caplog.records if r.name.startswith("botocore")}
    objects = open_store(store, create=False).objects
    keys = objects.list("")
    assert {"report.html", "results.parquet", "verdicts.parquet", "decisions.parquet"} <= {
        k.rsplit("/", 1)[-1] for k in keys
    }, keys
    outputs += [(f"store object {k}", blob.data) for k in keys if (blob := objects.get(k)) is not None]
    outputs += [(f"file {p.relative_to(tmp_path)}", p.read_bytes()) for p in sorted(folder.rglob("*")) if p.is_file()]
    for issue in jira.issues.values():
        outputs.append((f"Jira issue {issue['key']}", json.dumps(issue)))
        outputs += [(f"Jira comment on {issue['key']}", c["body"]) for c in jira.comments[issue["key"]]]
    outputs += [(f"webhook body {i}", body) for i, body in enumerate(receiver.bodies)]
    outputs += _prefect_records(["secrets-jira", "secrets-hook"])

    found = [hit for where, text in outputs for hit in leaks(where, text, access_key_id=where not in aws_trace)]
    assert found == [], "\n".join(found)
    assert len(outputs) > 50, "every output was searched"


def _default_console(record: logging.LogRecord) -> bool:
    return record.levelno >= (logging.INFO if record.name.startswith("prefect") else logging.WARNING)


def _record_text(record: logging.LogRecord) -> str:
    text = record.getMessage()
    if record.exc_info:
        text += "".join(traceback.format_exception(*record.exc_info))
    return text


# --- calls made to fail: what their errors say -------------------------------------------------------------


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception behind it, a suppressed context too (a tool may still show it)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        current = todo.pop()
        if current is None or id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        todo += [current.__cause__, current.__context__]


def error_leaks(exc: BaseException, *secrets: str) -> list[str]:
    """What of ``secrets`` (and of the run's) the error shows: its message, repr, traceback, and each of
    its causes' and contexts' message and repr."""
    texts = ["".join(traceback.format_exception(exc))]
    texts += [f"{type(e).__name__}: {e} {e!r} {getattr(e, 'args', '')}" for e in _chain(exc)]
    extra = {s: "a secret given to this call" for secret in secrets for s in spellings(secret)}
    return [
        f"{type(exc).__name__}: {name}"
        for text in texts
        for needle, name in (NEEDLES | extra).items()
        if needle in text
    ]


WRONG_JIRA = "wrong-Jira/T0ken+Q="
WRONG_S3 = "wrong-S3/S3cret+Key="


def test_jira_answering_401_says_so_without_a_token(jira: FakeJira) -> None:
    for user in (JIRA_USER, ""):  # basic auth, and a personal access token (bearer)
        with pytest.raises(TicketError, match="HTTP 401") as caught:
            JiraTickets(jira.base, user, SecretStr(WRONG_JIRA), "OPS").tickets(state="open")
        assert error_leaks(caught.value, WRONG_JIRA, f"{user}:{WRONG_JIRA}") == []


def test_s3_answering_403_says_so_without_a_key(aws: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", WRONG_S3)
    with pytest.raises(GpucertError) as caught:
        open_store(f"s3://{BUCKET}/fleet", create=False).read()
    assert "403" in str(caught.value) or "SignatureDoesNotMatch" in str(caught.value), caught.value
    assert error_leaks(caught.value, WRONG_S3) == []


def test_a_webhook_answering_500_or_not_there_says_so_without_its_secrets(
    hook: tuple[Hook, str], tmp_path: Path
) -> None:
    from .test_tickets import THERMAL, verdicts

    receiver, url = hook
    receiver.status = 500
    closed = f"http://127.0.0.1:{s3servers.free_ports(1)[0]}/hooks/{HOOK_PATH}"
    try:
        for where in (url, closed):
            tickets = WebhookTickets(
                SecretStr(where),
                tmp_path / f"{len(receiver.bodies)}.sqlite",
                headers={"Authorization": SecretStr(HOOK_HEADER)},
                signing_secret=SecretStr(HOOK_SIGNING),
                retries=1,
                backoff_s=0.01,
            )
            from gpucert.tickets import reconcile

            with pytest.raises(TicketError, match="not stored") as caught:
                reconcile(tickets, verdicts("night-1", [THERMAL]), run_id="night-1", now=datetime.now(UTC))
            assert error_leaks(caught.value) == []
            assert "127.0.0.1" in str(caught.value)
    finally:
        receiver.status = 200


def test_an_api_server_refusing_or_not_there_says_so_without_the_token(jira: FakeJira, tmp_path: Path) -> None:
    # The fake Jira answers 401 to a bearer token it does not know: an API server refusing the kubeconfig's.
    for server in (jira.base, f"http://127.0.0.1:{s3servers.free_ports(1)[0]}"):
        config = tmp_path / "kubeconfig.yaml"
        config.write_text(kubeconfig_text(server, user=KUBE_TOKEN))
        with pytest.raises(GpucertError) as caught:
            connect(config).version(within_s=3)
        assert error_leaks(caught.value) == [], caught.value


def test_the_command_line_says_s3_refused_without_a_key(
    aws: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", WRONG_S3)
    code = main(["--timeout", "5", "baseline", "list", "--store", f"s3://{BUCKET}/fleet"])
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert code == 1, captured.err  # the store refused: not the user's input, the credentials
    assert len(lines) == 1, captured.err
    assert "Traceback" not in captured.err
    assert "internal error" not in captured.err
    extra = set(spellings(WRONG_S3))
    assert leaks("stderr", captured.err) == []
    assert not any(s in captured.err + captured.out for s in extra)


@pytest.mark.parametrize("name", list(SECRETS))
def test_the_search_finds_every_spelling_of_a_secret(name: str) -> None:
    secret = SECRETS[name]
    for spelled in (secret, base64.b64encode(secret.encode()).decode(), urllib.parse.quote(secret, safe="")):
        assert leaks("x", f"... {spelled} ...", access_key_id=False) == [f"x: {name}"]
    assert leaks("x", f"Authorization: Basic {base64.b64encode(f'{JIRA_USER}:{JIRA_TOKEN}'.encode()).decode()}")
    assert leaks("x", f"?X-Amz-Credential={S3_ACCESS}%2F20261101") == []
    assert leaks("x", f"Credential={S3_ACCESS}/20261101") != []


@pytest.mark.parametrize(
    ("message", "secret"),
    [
        # What http.client says of a header value with a line break, quoting the header.
        (f"Invalid header value b'Bearer {KUBE_TOKEN}\\r\\nX-Injected: 1'", KUBE_TOKEN),
        (
            f"HTTPSConnectionPool: https://bot:{urllib.parse.quote(JIRA_TOKEN, safe='')}@jira.example.com/rest",
            urllib.parse.quote(JIRA_TOKEN, safe=""),
        ),
        (f"GET /r.html?X-Amz-Signature={HOOK_SIGNING}&X-Amz-Expires=3600", HOOK_SIGNING),
        (
            f"sent {{'Authorization': 'Basic {base64.b64encode(JIRA_TOKEN.encode()).decode()}'}}",
            base64.b64encode(JIRA_TOKEN.encode()).decode(),
        ),
        (f"config: token={HOOK_HEADER} password: {S3_SECRET}", HOOK_HEADER),
    ],
)
def test_an_unexpected_error_is_shown_without_what_looks_like_a_credential(message: str, secret: str, aws: str) -> None:
    from gpucert._secrets import redact_credentials

    shown = redact_credentials(message)
    assert secret not in shown
    assert S3_SECRET not in shown, "the environment's secret access key, wherever it shows"
    assert "***" in shown
    assert redact_credentials("node gpu-node-1: token (users[].user.token) is empty") == (
        "node gpu-node-1: token (users[].user.token) is empty"
    ), "words around no credential stay"
