"""Nothing hangs: every outbound call ends within its deadline, whatever the endpoint does.

An endpoint that accepts connections and never answers (the worst case: no error ever comes), one that
never completes the TCP handshake, and one that refuses: every command that reaches it fails within 30 s
with the default deadline, in one line that names the endpoint, exit 1 and no traceback; ``gpucert
--timeout`` and ``$GPUCERT_TIMEOUT`` move the deadline. Every server here is a real socket on 127.0.0.1.

The default-deadline cases wait ~20 s each, so they run side by side in threads (each through the same
dispatch the command line uses); the one-line, exit-status checks run each command through ``main`` with
a short ``--timeout``. Module imports are done first: the bound is on the calls, not on importing Prefect.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import SecretStr

from gpucert._deadline import Deadline
from gpucert.cli import _dispatch, _parser, main
from gpucert.errors import GpucertError, InputError
from gpucert.kube import KubeUnreachable, RetryPolicy
from gpucert.tickets import JiraTickets, TicketError, WebhookTickets, reconcile
from gpucert_sim import SimCluster

from .test_tickets import THERMAL, verdicts

#: What the issue asks of every command against a hung endpoint, with the default deadline.
BOUND_S = 30.0
#: The deadline of the fast cases, and the slack a loaded test machine gets on top of it (less than the
#: default deadline would take: 8 s to reach an API server, 10 s for S3).
SHORT_S, SLACK_S = 2.0, 4.0
BUCKET = "gpucert-hung"


# --- endpoints that never answer -----------------------------------------------------------------------


@dataclass
class Hung:
    """A TCP listener that accepts every connection and never sends a byte (nor reads one)."""

    port: int
    stop: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@contextlib.contextmanager
def hung_server() -> Iterator[Hung]:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    hung = Hung(listener.getsockname()[1])
    held: list[socket.socket] = []

    def accept() -> None:
        while not hung.stop.is_set():
            if select.select([listener], [], [], 0.1)[0]:
                held.append(listener.accept()[0])  # kept open, never answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield hung
    finally:
        hung.stop.set()
        thread.join(5)
        for conn in held:
            conn.close()
        listener.close()


@contextlib.contextmanager
def filtered_port() -> Iterator[int]:
    """A port whose SYNs go unanswered: a listener with a full accept queue that never accepts (Linux
    drops the handshake then), as a firewall that drops packets would."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    filler = socket.create_connection(("127.0.0.1", port), timeout=2)
    try:
        yield port
    finally:
        filler.close()
        listener.close()


def refused_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def kubeconfig(path: Path, server: str) -> str:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return str(path)


class HalfHungJira(BaseHTTPRequestHandler):
    """Answers the client's server-info request, then hangs (``mode`` "hang") or throttles ("429") the rest."""

    mode = "hang"
    stop: threading.Event

    def do_GET(self) -> None:
        if self.path.endswith("/serverInfo"):
            body = json.dumps({"versionNumbers": [9, 12, 0], "version": "9.12.0", "deploymentType": "Server"})
            self._answer(200, body.encode())
        elif self.mode == "429":
            self._answer(429, b'{"errorMessages": ["slow down"]}')
        else:
            self.stop.wait(60)

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def half_hung_jira(mode: str) -> Iterator[str]:
    stop = threading.Event()
    handler = type("Handler", (HalfHungJira,), {"mode": mode, "stop": stop})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        stop.set()
        server.shutdown()
        server.server_close()


# --- fixtures --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module", autouse=True)
def imported() -> None:
    """Import what the commands import lazily (Prefect's blocks, the flows' helpers), so that what is timed
    is the calls, not a first import (tens of seconds on a loaded 2-core machine)."""
    import gpucert.blocks.cluster
    import gpucert.blocks.policy
    import gpucert.blocks.prometheus
    import gpucert.blocks.store
    import gpucert.commands
    import gpucert.stack._render
    import gpucert.store._s3  # noqa: F401


@pytest.fixture(scope="module")
def hung() -> Iterator[Hung]:
    with hung_server() as server:
        yield server


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=2, preconfigured=True, seed=3) as cluster:
        yield cluster


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch, hung: Hung) -> None:
    """S3 pointed at the hung endpoint with made-up credentials; no deadline set."""
    monkeypatch.delenv("GPUCERT_TIMEOUT", raising=False)
    monkeypatch.setenv("GPUCERT_S3_ENDPOINT", hung.url)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "gpucert-test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "gpucert-test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory, hung: Hung) -> Path:
    root = tmp_path_factory.mktemp("hung")
    kubeconfig(root / "hung.yaml", hung.url)
    row = {
        "run_id": "r1",
        "node": "n1",
        "gpu": 0,
        "gpu_uuid": "GPU-1",
        "gpu_model": "NVIDIA H200",
        "metric": "gemm_bf16_tflops",
        "value": 700.0,
        "repeat": 0,
        "peer": None,
        "ts": "2026-11-01T02:00:00Z",
    }
    (root / "results.jsonl").write_text(json.dumps(row) + "\n")
    return root


#: (case id, argv: {kc} the hung kubeconfig, {sim} the simulator's, {d} the files folder, {prom} the hung
#: endpoint's URL; s3:// stores go to the hung endpoint through $GPUCERT_S3_ENDPOINT)
COMMANDS = [
    ("certify", ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store"]),
    ("certify-node", ["certify", "--kubeconfig", "{kc}", "--store", "file://{d}/store", "--node", "n1"]),
    ("operate", ["operate", "--kubeconfig", "{kc}", "--store", "file://{d}/store"]),
    ("configure", ["configure", "--kubeconfig", "{kc}"]),
    ("configure-dry-run", ["configure", "--kubeconfig", "{kc}", "--dry-run", "{d}/manifests"]),
    ("onboard", ["onboard", "n1", "--kubeconfig", "{kc}", "--store", "file://{d}/store"]),
    ("release", ["release", "n1", "--kubeconfig", "{kc}", "--store", "file://{d}/store"]),
    ("watch-nodes", ["watch-nodes", "--kubeconfig", "{kc}", "--once"]),
    ("certify-s3", ["certify", "--kubeconfig", "{sim}", "--store", f"s3://{BUCKET}/p"]),
    ("release-s3", ["release", "{n0}", "--kubeconfig", "{sim}", "--store", f"s3://{BUCKET}/p"]),
    (
        "operate-prometheus",
        ["operate", "--kubeconfig", "{sim}", "--store", "file://{d}/store", "--prometheus", "{prom}"],
    ),
    ("compare-s3", ["compare", "{d}/results.jsonl", "--baselines", f"s3://{BUCKET}/p", "--out", "{d}/v.csv"]),
    ("baseline-list-s3", ["baseline", "list", "--store", f"s3://{BUCKET}/p"]),
    ("baseline-build-s3", ["baseline", "build", "{d}/results.jsonl", "--store", f"s3://{BUCKET}/p"]),
    ("baseline-rollback-s3", ["baseline", "rollback", "v1", "--store", f"s3://{BUCKET}/p"]),
    ("baseline-rebuild-s3", ["baseline", "rebuild", "n1", "--store", f"s3://{BUCKET}/p"]),
]


def _argv(argv: list[str], files: Path, sim: SimCluster, hung: Hung) -> list[str]:
    return [
        a.format(kc=files / "hung.yaml", sim=sim.kubeconfig_path, d=files, prom=hung.url, n0=sim.fleet.node_names[0])
        for a in argv
    ]


@dataclass(frozen=True)
class Ended:
    """How one call ended: what it raised (None: it returned) and after how long."""

    error: BaseException | None
    seconds: float


def _timed(fn: Callable[[], object]) -> Ended:
    start = time.monotonic()
    try:
        fn()
    except BaseException as exc:
        return Ended(exc, time.monotonic() - start)
    return Ended(None, time.monotonic() - start)


# --- the default deadline: every command within 30 s ---------------------------------------------------


@pytest.mark.usefixtures("env")
def test_every_command_fails_within_30_s_by_default(files: Path, sim: SimCluster, hung: Hung, tmp_path: Path) -> None:
    def command(argv: list[str]) -> Callable[[], object]:
        return lambda: _dispatch(_parser().parse_args(_argv(argv, files, sim, hung)))

    jobs = {name: command(argv) for name, argv in COMMANDS}
    jobs["jira"] = JiraTickets(hung.url, "u", "t", "OPS").tickets
    webhook = WebhookTickets(SecretStr(hung.url + "/hook"), tmp_path / "tickets.sqlite")
    day = dt.datetime(2026, 11, 2, 2, tzinfo=dt.UTC)
    jobs["webhook"] = lambda: reconcile(webhook, verdicts("night-1", [THERMAL]), run_id="night-1", now=day)
    with half_hung_jira("hang") as jira, ThreadPoolExecutor(max_workers=len(jobs) + 1) as pool:
        # A Jira that answers the client's first request and hangs on the search: the deadline's transport.
        hangs_later = pool.submit(_timed, JiraTickets(jira, "u", "t", "OPS").tickets)
        futures = {name: pool.submit(_timed, job) for name, job in jobs.items()}
        ended = {name: future.result() for name, future in futures.items()}
        later = hangs_later.result()
    report = {name: (round(e.seconds, 1), type(e.error).__name__) for name, e in ended.items()}
    report["jira-after-connect"] = (round(later.seconds, 1), type(later.error).__name__)
    print("seconds to fail, per command:", report)  # what the issue asked to measure
    for name, e in ended.items():
        assert isinstance(e.error, GpucertError), (name, e.error)
        assert not isinstance(e.error, InputError), (name, e.error)  # the endpoint failed, not the input
        assert e.seconds < BOUND_S, report
        assert f"127.0.0.1:{hung.port}" in str(e.error), (name, str(e.error))
    assert isinstance(later.error, TicketError)
    assert "list tickets failed: no answer within" in str(later.error)
    assert later.seconds < BOUND_S, report


def test_a_jira_that_keeps_throttling_is_cut_to_the_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    # The client waits 10 × 2ⁿ s (up to a minute) between tries of a 429: cut to what the deadline leaves.
    monkeypatch.setenv("GPUCERT_TIMEOUT", str(SHORT_S))
    with half_hung_jira("429") as server:
        ended = _timed(JiraTickets(server, "u", "t", "OPS").tickets)
    assert isinstance(ended.error, TicketError), ended.error
    assert "list tickets failed" in str(ended.error)
    assert ended.seconds < SHORT_S + SLACK_S


# --- on the command line: one line, exit 1, within --timeout -------------------------------------------


@pytest.mark.usefixtures("env")
@pytest.mark.parametrize("argv", [pytest.param(a, id=i) for i, a in COMMANDS])
def test_a_hung_endpoint_is_one_line_exit_1_within_the_timeout(
    argv: list[str], files: Path, sim: SimCluster, hung: Hung, capsys: pytest.CaptureFixture[str]
) -> None:
    start = time.monotonic()
    code = main(["--timeout", str(SHORT_S), *_argv(argv, files, sim, hung)])
    seconds = time.monotonic() - start
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, err
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert "internal error" not in err
    assert f"127.0.0.1:{hung.port}" in lines[0]
    assert seconds < SHORT_S + SLACK_S, (seconds, lines[0])


def test_the_timeout_option_is_the_deadline_and_the_environment_its_default(
    files: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["certify", "--kubeconfig", str(files / "hung.yaml"), "--store", f"file://{files}/store"]
    monkeypatch.setenv("GPUCERT_TIMEOUT", "1.5")
    start = time.monotonic()
    assert main(argv) == 1
    assert time.monotonic() - start < 1.5 + SLACK_S
    assert "deadline: 1.5 s" in capsys.readouterr().err
    start = time.monotonic()
    assert main(["--timeout", "1", *argv]) == 1  # the option wins over the environment
    assert time.monotonic() - start < 1 + SLACK_S
    assert "deadline: 1 s" in capsys.readouterr().err
    assert os.environ["GPUCERT_TIMEOUT"] == "1.5", "restored after the command"


@pytest.mark.parametrize(("value", "words"), [("soon", "GPUCERT_TIMEOUT='soon'"), ("-3", "positive")])
def test_a_bad_deadline_in_the_environment_is_exit_2(
    value: str, words: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUCERT_TIMEOUT", value)
    assert main(["baseline", "list", "--store", "file:///nonexistent-gpucert-store"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert words in line


# --- a server that is not there: within 10 s -------------------------------------------------------------


@pytest.mark.parametrize("kind", ["refused", "filtered"])
def test_an_unreachable_api_server_fails_within_10_s(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GPUCERT_TIMEOUT", raising=False)
    with contextlib.ExitStack() as stack:
        port = refused_port() if kind == "refused" else stack.enter_context(filtered_port())
        config = kubeconfig(tmp_path / "k.yaml", f"http://127.0.0.1:{port}")
        start = time.monotonic()
        code = main(["watch-nodes", "--kubeconfig", config, "--once"])
        seconds = time.monotonic() - start
    [line] = capsys.readouterr().err.splitlines()
    assert code == 1
    assert seconds <= 10.0, (seconds, line)
    assert f"no answer from the API server http://127.0.0.1:{port}" in line
    # A kernel set to reset a full accept queue (tcp_abort_on_overflow) refuses instead of dropping.
    assert ("cannot connect" if kind == "refused" else "connect") in line


# --- the retry policy's own deadline ---------------------------------------------------------------------


def test_retries_stop_at_the_deadline_not_at_the_attempts() -> None:
    calls = []

    def refused() -> None:
        calls.append(time.monotonic())
        raise KubeUnreachable("get Node n1: no answer from the API server http://x: refused")

    policy = RetryPolicy(attempts=1000, base_delay_s=0.05, max_delay_s=0.05, deadline_s=0.5)
    start = time.monotonic()
    with pytest.raises(KubeUnreachable, match=r"gave up after \d+ attempts in 0\.\d s; the call's deadline: 0\.5 s"):
        policy.call(refused)
    assert time.monotonic() - start < 0.5 + 0.1
    assert 2 < len(calls) < 1000


def test_a_deadline_cuts_a_timeout_to_what_is_left() -> None:
    deadline = Deadline(10.0, time.monotonic() - 8.0)
    assert 1.9 < deadline.cap(30.0) <= 2.0
    assert deadline.cap(1.0) == 1.0
    assert Deadline(1.0, time.monotonic() - 5).cap(30.0) == 0.001  # never 0: that is a non-blocking socket
