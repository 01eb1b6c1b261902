"""A fault-injecting reverse proxy in front of a real kube-apiserver: ``gpucert sim``'s API faults, for real.

The fault matrix's API rows promise that a flow rides out what a loaded control plane does — 500s, 429s
with ``Retry-After``, a slow server, a watch cut mid-stream, a resumed watch answered 410 Expired. The
simulator injects these itself (:class:`gpucert_sim.ApiFaults`); a real API server cannot be asked to, so
this proxy stands in front of it and injects the same faults with the same policy object and the same
decision logic (:class:`gpucert_sim._faults.FaultInjector`: one draw per request for 500/429/403, the same
latency, ``expire_watch`` for a resumed watch) and the same answers (the simulator's ``Status`` bodies, the
``Retry-After`` header, the in-stream ``ERROR`` event under HTTP 200, a watch cut by closing the connection
without the chunked terminator). It counts what it served (:attr:`ApiFaultProxy.faults` ``.served``) and
logs every request in RBAC's terms (:attr:`ApiFaultProxy.requests`), as the simulator does, so a row whose
fault never fired fails on either server.

How it authenticates (kept simple): the proxy terminates TLS with a serving certificate the plane's CA
issued (SAN 127.0.0.1), so the official client verifies it against the same ``ca.crt``; the kubeconfig it
writes (:attr:`ApiFaultProxy.kubeconfig_path`) carries a bearer token made for this proxy, which the
proxy checks (401 otherwise) and strips; every request is then forwarded to kube-apiserver over TLS with
the plane's admin client certificate (``system:masters``). So whoever holds the proxy's kubeconfig acts as
the admin — the same identity as the plane's ``admin.kubeconfig``, which is what the flows use in the
tests. ``Impersonate-*`` headers pass through (the admin may impersonate).

Responses are streamed through as they come (a watch's events reach the client when the server sends
them); bodies and their ``Content-Encoding`` pass untouched. Protocol upgrades (exec, port-forward) are
not supported: nothing of gpucert's uses them.

Everything listens on 127.0.0.1 and talks to the plane on 127.0.0.1; the proxy runs its own asyncio loop
in a daemon thread (aiohttp server and client).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import ssl
import threading
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from yarl import URL

from gpucert_sim._faults import ApiFaults, FaultInjector
from gpucert_sim._loop import run_loop
from gpucert_sim._requests import ApiRequest, RequestLog, request_info
from gpucert_sim._status import status_body

from .controlplane import ControlPlane, kubeconfig_text

__all__ = ["ApiFaultProxy"]

_HOST = "127.0.0.1"
#: Headers of one hop, never forwarded (RFC 9110 §7.6.1), plus what the client library sets itself.
_HOP = frozenset(
    h.lower()
    for h in (
        "Connection",
        "Keep-Alive",
        "Proxy-Authenticate",
        "Proxy-Authorization",
        "TE",
        "Trailer",
        "Transfer-Encoding",
        "Upgrade",
        "Host",
        "Content-Length",
    )
)


def _status(
    code: int,
    reason: str,
    message: str,
    *,
    details: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    body = json.dumps(status_body(code, reason, message, details)).encode()
    return web.Response(body=body, status=code, content_type="application/json", headers=headers)


def _line(kind: str, obj: Any) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


class ApiFaultProxy:
    """A TLS reverse proxy on 127.0.0.1 in front of ``upstream`` (kube-apiserver) injecting :class:`ApiFaults`.

    ``ca`` verifies the upstream and is what the proxy's own ``serving`` certificate (cert, key) chains to;
    ``client`` (cert, key) is the identity every request is forwarded as, ``user`` its name (for the
    request log and a 403's message). A context manager; :meth:`start` returns once it listens.
    """

    def __init__(
        self,
        upstream: str,
        *,
        ca: Path,
        serving: tuple[Path, Path],
        client: tuple[Path, Path],
        folder: Path,
        user: str = "",
        faults: ApiFaults | None = None,
    ) -> None:
        self.upstream = upstream.rstrip("/")
        self.ca, self.serving, self.client, self.user = ca, serving, client, user
        self.folder = folder
        #: The policy in force and what was served, as :attr:`gpucert_sim.SimCluster.faults`.
        self.faults = FaultInjector(faults)
        self.request_log = RequestLog()
        #: Watches this proxy cut (``drop_watch_after_s``); those answered 410 are ``faults.served["expired"]``.
        self.cut = 0
        self.kubeconfig_path = folder / "apifaults-proxy.kubeconfig"
        self.port = 0
        self._token = secrets.token_urlsafe(32)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def for_plane(cls, plane: ControlPlane, *, faults: ApiFaults | None = None) -> ApiFaultProxy:
        """A proxy in front of ``plane``'s API server, forwarding as its admin, serving a certificate of its CA."""
        folder: Path | None = plane.folder
        assert plane.pki is not None, "the control plane is not started"
        assert folder is not None
        serving = plane.pki.issue("apifaults-proxy", "gpucert-apifaults-proxy", server=True)
        return cls(
            plane.url,
            ca=plane.pki.ca,
            serving=(serving.cert, serving.key),
            client=(folder / "admin.crt", folder / "admin.key"),
            folder=folder,
            user="gpucert-test-admin",
            faults=faults,
        )

    # --- life ---------------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://{_HOST}:{self.port}"

    def start(self) -> ApiFaultProxy:
        ready = threading.Event()
        failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, args=(ready, failure), name="apifaults-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(30) or failure:
            self.stop()
            raise RuntimeError(f"the API fault proxy did not start: {failure[0] if failure else 'timeout'}")
        self.kubeconfig_path.write_text(kubeconfig_text(self.url, self.ca, token=self._token))
        return self

    def stop(self) -> None:
        loop, thread = self._loop, self._thread
        if loop is not None and loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._close(), loop).result(timeout=10)
            loop.call_soon_threadsafe(loop.stop)
        if thread is not None:
            thread.join(timeout=10)
        self._loop = self._thread = None

    def __enter__(self) -> ApiFaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- what a test does -----------------------------------------------------------------------------

    def set_faults(self, faults: ApiFaults | None) -> None:
        """Change the fault policy; None turns faults off (the counts stay)."""
        self.faults.set(faults or ApiFaults())

    @property
    def requests(self) -> list[ApiRequest]:
        """The requests the proxy received (faulted ones included), oldest first, in RBAC's terms."""
        return self.request_log.entries()

    def clear_requests(self) -> None:
        self.request_log.clear()

    # --- serving --------------------------------------------------------------------------------------

    def _run(self, ready: threading.Event, failure: list[BaseException]) -> None:
        run_loop(lambda loop: self._listen(), ready, failure, self._set_loop, catch=(BaseException,))

    def _set_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop

    async def _listen(self) -> None:
        upstream_tls = ssl.create_default_context(cafile=str(self.ca))
        upstream_tls.load_cert_chain(str(self.client[0]), str(self.client[1]))
        # No connection limit (every watch holds one), no total timeout (a watch lasts its timeoutSeconds);
        # bodies pass as they are, compressed or not.
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=upstream_tls, limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
        )
        serving_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        serving_tls.load_cert_chain(str(self.serving[0]), str(self.serving[1]))
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5, handler_cancellation=True)
        await self._runner.setup()
        await web.TCPSite(self._runner, _HOST, 0, ssl_context=serving_tls).start()
        self.port = int(self._runner.addresses[0][1])

    async def _close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self._token}":
            return _status(401, "Unauthorized", "Unauthorized")
        info = request_info(request.method, request.path, request.query, self.user)
        self.request_log.add(info)  # on arrival, as the simulator records it: a faulted request counts
        refused = await self._fault(info)
        if refused is not None:
            return refused
        watch = info.verb == "watch"
        since = request.query.get("resourceVersion")
        if watch and since not in (None, "", "0") and self.faults.expire_watch():
            # As after a compaction the client did not see: HTTP 200, one ERROR event, the stream's end.
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            response.enable_chunked_encoding()
            await response.prepare(request)
            await response.write(
                _line(
                    "ERROR",
                    status_body(410, "Expired", f"too old resource version: {since} (injected by the API fault proxy)"),
                )
            )
            await response.write_eof()
            return response
        return await self._forward(request, drop_after_s=self.faults.policy.drop_watch_after_s if watch else None)

    async def _fault(self, info: ApiRequest) -> web.Response | None:
        """The simulator's fault middleware (sim/gpucert_sim/_api.py), answer for answer."""
        if not self.faults.policy.active:
            return None
        decision = self.faults.decide(resource_request=info.resource_request)
        if decision.latency_s:
            await asyncio.sleep(decision.latency_s)
        if decision.status == 429:
            return _status(
                429,
                "TooManyRequests",
                "Too many requests, please try again later.",
                details={"retryAfterSeconds": decision.retry_after_s},
                headers={"Retry-After": str(decision.retry_after_s)},
            )
        if decision.status == 500:
            return _status(500, "InternalError", "Internal error occurred: injected by the API fault proxy")
        if decision.status == 403:
            scope = f'in the namespace "{info.namespace}"' if info.namespace else "at the cluster scope"
            return _status(
                403,
                "Forbidden",
                f'{info.combined_resource} is forbidden: User "{info.user or "system:anonymous"}" '
                f'cannot {info.verb} resource "{info.combined_resource}" in API group '
                f'"{info.group}" {scope}: injected by the API fault proxy',
            )
        return None

    async def _forward(self, request: web.Request, *, drop_after_s: float | None) -> web.StreamResponse:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP and k.lower() != "authorization"}
        body = await request.read()
        loop = asyncio.get_running_loop()
        drop_at = loop.time() + drop_after_s if drop_after_s is not None else None
        try:
            upstream = await self._session.request(
                request.method,
                URL(self.upstream + request.raw_path, encoded=True),
                headers=headers,
                data=body or None,
                allow_redirects=False,
            )
        except (aiohttp.ClientError, OSError) as exc:
            # The API server is away (restarting): what a client sees from a proxy then.
            return _status(503, "ServiceUnavailable", f"the API fault proxy cannot reach kube-apiserver: {exc}")
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        try:
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP:
                    response.headers.add(key, value)
            if upstream.content_length is not None and drop_at is None:
                response.content_length = upstream.content_length
            else:
                response.enable_chunked_encoding()
            await response.prepare(request)
            while True:
                if drop_at is None:
                    chunk = await upstream.content.readany()
                else:
                    try:
                        chunk = await asyncio.wait_for(upstream.content.readany(), max(0.0, drop_at - loop.time()))
                    except TimeoutError:
                        # Cut without the chunked terminator: the client sees a broken stream, as when a
                        # load balancer drops a long request.
                        self.cut += 1
                        if request.transport is not None:
                            request.transport.close()
                        return response
                if not chunk:
                    break
                await response.write(chunk)
            await response.write_eof()
            return response
        except (ConnectionResetError, aiohttp.ClientError):  # the client or the server went away mid-stream
            if request.transport is not None:
                request.transport.close()
            return response
        finally:
            upstream.close()
