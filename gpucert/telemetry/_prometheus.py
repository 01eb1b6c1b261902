"""Passive telemetry from Prometheus' HTTP API: what the DCGM exporters reported over a window.

Every signal is reduced inside Prometheus by one instant query at the window's end, so a fleet costs a few dozen
small answers, never the raw samples; subqueries run in blocks (``[block:step]`` inside ``[window:block]``) so
that no query holds more than a few hundred points per series and ``--query.max-samples`` stays far away. With
``host_label=None`` each series is read by whichever host label it carries, so a fleet caught mid upgrade of the
exporter (NVIDIA/dcgm-exporter#655) reads whole. XIDs: the exporter's 5-minute ``DCGM_EXP_XID_ERRORS_COUNT`` is
read at instants 5 minutes apart and summed; without it, changes of the last-XID gauge to a non-zero value are
the events (blind to a repeat of one XID). NIC series carry no DCGM host label: their node is their ``node``
label, else their ``instance`` without its port.

Secrets (``headers``, ``basic_auth``) stay ``SecretStr``, never in a message or a ``repr``; redirects are not
followed, so that credentials never travel to an address nobody configured. A range query's points are cut
straight from the answer's bytes into arrays (:meth:`PrometheusSource.query_range_arrays`).
"""

from __future__ import annotations

import base64
import functools
import json
import math
import os
import re
import ssl
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np
import orjson
import pandas as pd
from pydantic import SecretStr

from .._deadline import call_deadline_s
from .._secrets import reveal, scrub
from ..errors import InputError, PrometheusAuthError
from ._common import (
    CLOCK_EVENT_BITS,
    NIC_SERIES,
    PRESENCE,
    SIGNALS,
    XID_COUNT,
    XID_LAST,
    Problems,
    Signal,
    Telemetry,
    TelemetryError,
    empty_events,
    empty_readings,
    host_of,
    missing_nodes,
    to_results,
    transport_reason,
    utc,
    worst_of,
)

__all__ = ["PromSeries", "PrometheusAuthError", "PrometheusSource"]

_USER_AGENT = "gpucert-telemetry"
#: Prometheus answers at most 11,000 points per series of a range query.
_MAX_POINTS = 11_000
#: How many series of the last-XID gauge one range query names (a regex of UUIDs).
_UUID_CHUNK = 100
#: An HTTP header name (RFC 9110 token); http.client would otherwise refuse it with the value in its message.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: Authorization schemes a message may name: the word before the credentials, never the credentials.
_AUTH_SCHEMES = {"basic": "Basic", "bearer": "Bearer", "token": "Token", "apikey": "ApiKey"}


@dataclass(frozen=True)
class PromSeries:
    """One series of a query's answer: its labels and its (unix seconds, value) points (one for an
    instant query)."""

    labels: dict[str, str]
    values: list[tuple[float, float]]  # (unix seconds, value); one pair for an instant vector


@dataclass(frozen=True, repr=False)
class PrometheusSource:
    """A Prometheus server gpucert reads the DCGM signals from, and how (see the module docstring): a frozen value,
    safe to pass to a task, whose :meth:`read` does the reading.

    ``url``: the server's base URL (``http://prometheus.monitoring:9090``; a path prefix is kept), http or https,
    without credentials, query or fragment. ``host_label``: ``hostname``, ``Hostname``, or None to read either per
    series. ``headers`` (their values are secrets: a tenant's ``X-Scope-OrgID``, an ``Authorization: Bearer …``)
    and ``basic_auth`` (user, password) go with every request. ``verify``: check the server's TLS certificate
    against the system's CAs (True), not at all (False), or against a CA file or directory (its path).
    ``timeout_s``: per request, also Prometheus' query timeout; cut to the call deadline (``gpucert --timeout``,
    ``$GPUCERT_TIMEOUT``, 20 s by default) when that is shorter. ``step_s``: the resolution of subqueries; shorter
    sees shorter events and costs Prometheus more. ``workers``: queries in flight at once.

    Raises :class:`gpucert.errors.InputError` for a URL that is not http(s), an unknown host label, a non-positive
    duration, a header Python cannot send, an ``Authorization`` header beside ``basic_auth``, or a CA file that
    cannot be read; no message holds a secret.
    """

    url: str
    host_label: str | None = None
    _: KW_ONLY
    headers: Mapping[str, SecretStr | str] = field(default_factory=dict)
    basic_auth: tuple[str, SecretStr | str] | None = None
    verify: bool | str = True
    timeout_s: float = 60.0
    step_s: float = 30.0
    rate_window_s: float = 300.0
    share_window_s: float = 600.0
    xid_window_s: float = 300.0
    workers: int = 4

    def __post_init__(self) -> None:
        # Frozen: the normalised values are set once, here (idempotent, as dataclasses.replace runs it again).
        object.__setattr__(self, "url", _check_url(self.url))
        if self.host_label is not None and self.host_label not in ("hostname", "Hostname"):
            raise InputError(f"host_label is 'hostname', 'Hostname' or None, not {self.host_label!r}")
        for name in ("step_s", "rate_window_s", "share_window_s", "xid_window_s", "timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise InputError(f"{name} must be positive, not {value!r}")
        if self.workers < 1:
            raise InputError(f"workers must be at least 1, not {self.workers!r}")
        headers = {name: _secret(value) for name, value in self.headers.items()}
        for name, secret in headers.items():
            _check_header(name, secret.get_secret_value())
        object.__setattr__(self, "headers", headers)
        if self.basic_auth is not None:
            user, password = self.basic_auth
            if not user or ":" in user:
                raise InputError("the basic-auth user must be non-empty and hold no ':' (RFC 7617)")
            if any(name.lower() == "authorization" for name in headers):
                raise InputError("give basic_auth or an Authorization header, not both")
            object.__setattr__(self, "basic_auth", (user, _secret(password)))
        if isinstance(self.verify, str):
            _tls_context(self.verify)  # a CA file that cannot be read fails here, not at the first query

    def __repr__(self) -> str:
        shown = f"{self.url!r}, host_label={self.host_label!r}, credentials={self.credentials_summary!r}"
        return f"PrometheusSource({shown})"

    def __hash__(self) -> int:
        # The generated hash would fail on the headers dict; equal sources (secrets included) hash alike.
        return hash((self.url, self.host_label, tuple(sorted(self._plain_headers().items())), self.verify))

    @property
    def credentials_summary(self) -> str:
        """What kind of credentials every request carries, in words that hold no secret (``none`` for none)."""
        kinds: list[str] = []
        if self.basic_auth is not None:
            kinds.append(f"basic auth as user {self.basic_auth[0]!r}")
        for name, value in self._plain_headers().items():
            if name.lower() == "authorization":
                scheme = _AUTH_SCHEMES.get(value.split(" ", 1)[0].lower()) if " " in value else None
                kinds.append(f"an Authorization header ({scheme})" if scheme else "an Authorization header")
        others = sorted(name for name in self.headers if name.lower() != "authorization")
        if others:
            kinds.append(f"the header{'s' if len(others) > 1 else ''} {', '.join(others)}")
        return ", ".join(kinds) or "none"

    # --- the public call -----------------------------------------------------------------------------

    def read(
        self,
        start: datetime,
        end: datetime | None = None,
        *,
        run_id: str,
        expected_gpus: Mapping[str, int] | None = None,
        nodes: Iterable[str] = (),
    ) -> Telemetry:
        """The :class:`Telemetry` of the window (``start``, ``end``] (``end`` defaults to now; naive times are
        UTC), each signal reduced as :data:`gpucert.telemetry.SIGNALS` says; ``run_id`` labels the rows. A node
        of ``nodes`` or ``expected_gpus`` (the GPU nodes in scope) with no series at all is a problem.

        Raises :class:`PrometheusAuthError` when Prometheus refuses the credentials (or their absence),
        :class:`TelemetryError` naming the query when it refuses, redirects or does not answer one,
        and ``ValueError`` for an empty window.
        """
        end_utc = utc(end) if end is not None else datetime.now(UTC)
        start_utc = utc(start)
        window = math.floor((end_utc - start_utc).total_seconds())
        if window < 1:
            raise ValueError(f"the window {start_utc.isoformat()} .. {end_utc.isoformat()} is empty")
        at = end_utc.timestamp()
        problems = Problems()
        notes: list[str] = []

        jobs: dict[str, Callable[[], list[PromSeries]]] = {}
        for signal in SIGNALS:
            for i, expr in enumerate(self._signal_queries(signal, window)):
                jobs[f"{signal.metric}#{i}"] = functools.partial(self.query, expr, at, notes)
        jobs["presence"] = functools.partial(self.query, self._sel(PRESENCE), at, notes)
        jobs["xid_count"] = functools.partial(self._xid_counts, window, at, notes)
        changed_expr = f"changes({self._sel(XID_LAST)}[{window}s]) > 0"
        jobs["xid_changed"] = functools.partial(self.query, changed_expr, at, notes)
        for metric, expr in _nic_queries(window).items():
            jobs[f"nic:{metric}"] = functools.partial(self.query, expr, at, notes)
        failed = threading.Event()

        def guarded(job: Callable[[], list[PromSeries]]) -> list[PromSeries]:
            # Once one query failed the read has: the queries not yet sent are not, or a server that does
            # not answer would cost a timeout per query, in rounds of `workers`.
            if failed.is_set():
                raise TelemetryError(f"Prometheus {self.url}: not asked, an earlier query failed")
            try:
                return job()
            except BaseException:
                failed.set()
                raise

        with ThreadPoolExecutor(max_workers=self.workers, thread_name_prefix="gpucert-prom") as pool:
            futures = {name: pool.submit(guarded, job) for name, job in jobs.items()}
            # In submission order: a query that failed was sent before any the failure kept from being sent.
            answers = {name: future.result() for name, future in futures.items()}

        skipped: dict[str, int] = {}
        readings = _readings(
            [(name.split("#")[0], answers[name]) for name in jobs if "#" in name], self.host_label, skipped
        )
        present = _identities(answers["presence"], self.host_label, skipped)
        events = _count_events(answers["xid_count"], self.host_label, skipped)
        changed = [s for s in answers["xid_changed"] if s.labels.get("UUID") not in set(events["gpu_uuid"])]
        if changed:
            events = pd.concat(
                [events, self._xid_changes(changed, start_utc.timestamp(), at, notes, skipped)], ignore_index=True
            )
        for name, count in sorted(skipped.items()):
            label = self.host_label or "hostname or Hostname"
            notes.append(f"{count} series of {name} carry no {label} or gpu label: not read")
        nics = _nic_readings({name[4:]: answers[name] for name in jobs if name.startswith("nic:")})

        results = to_results(
            readings,
            events,
            run_id=run_id,
            ts=end_utc,
            present=present,
            expected_gpus=expected_gpus,
            problems=problems,
            source=f"Prometheus {self.url}",
            node_readings=nics,
        )
        unmatched = sorted(set(nics["node"]) - set(results["node"].astype(str)))
        if unmatched:
            shown = ", ".join(unmatched[:5]) + (f" and {len(unmatched) - 5} more" if len(unmatched) > 5 else "")
            notes.append(
                f"node-exporter's infiniband series of {len(unmatched)} node(s) with no DCGM series ({shown}): "
                "their NIC telemetry is not read (is their node or instance label the node's name?)"
            )
        between = f"between {start_utc:%Y-%m-%d %H:%M:%S} and {end_utc:%Y-%m-%d %H:%M:%S} UTC"
        for node in missing_nodes({*(expected_gpus or {}), *nodes}, results["node"].astype(str).unique()):
            problems.add(
                node,
                f"no DCGM series in Prometheus for this node {between} (exporter not scraped, or the node was down)",
            )
        absent = f"no DCGM series in Prometheus {self.url} {between} (is it scraping the DCGM exporters?)"
        return Telemetry(
            results=results,
            problems=problems.as_dict(),
            notes=tuple(dict.fromkeys(notes)),
            start=start_utc,
            end=end_utc,
            source=f"Prometheus {self.url}",
            absent=absent if results.empty else None,
        )

    # --- PromQL --------------------------------------------------------------------------------------

    def _sel(self, name: str) -> str:
        """A selector of ``name``, restricted to series carrying the host label when one is named."""
        return f'{name}{{{self.host_label}!=""}}' if self.host_label else name

    def _signal_queries(self, signal: Signal, window: int) -> list[str]:
        """The instant queries (evaluated at the window's end) that read ``signal``."""
        w = f"{window}s"
        step = f"{max(1, round(self.step_s))}s"
        first = self._sel(signal.sources[0])
        if signal.reduce in ("max", "min", "last"):
            exprs = [f"{signal.reduce}_over_time({self._sel(name)}[{w}])" for name in signal.sources]
            return [" or ".join(exprs)]
        if signal.reduce == "increase":
            return [f"increase({first}[{w}])"]
        if signal.reduce == "peak_rate_per_min":
            rate = min(window, round(self.rate_window_s))
            if rate >= window:
                return [f"rate({first}[{w}]) * 60"]
            return [f"max_over_time(rate({first}[{rate}s])[{w}:{rate}s]) * 60"]
        block = min(window, round(self.share_window_s))
        if signal.reduce == "bits_or":
            terms = [
                f"max_over_time(max_over_time((floor({first} / {bit}) % 2)[{block}s:{step}])[{w}:{block}s]) * {bit}"
                for bit in CLOCK_EVENT_BITS
            ]
            return [" + ".join(terms)]
        # hw_share: the thermal-violation counter (ns per s of wall time) and the share of samples with a
        # hardware-slowdown bit (0x08, or 0x40/0x80: floor(x/64) % 4 is non-zero), each the worst block.
        thermal, bits = (self._sel(name) for name in signal.sources)
        hw_bit = f"clamp_max(floor({bits} / 64) % 4 + floor({bits} / 8) % 2, 1)"
        return [
            f"clamp(max_over_time(rate({thermal}[{block}s])[{w}:{block}s]) / 1e9, 0, 1)",
            f"max_over_time(avg_over_time(({hw_bit})[{block}s:{step}])[{w}:{block}s])",
        ]

    def _xid_counts(self, window: int, at: float, notes: list[str]) -> list[PromSeries]:
        """The exporter's XID counts at instants ``xid_window_s`` apart, the last at ``at``."""
        span = self.xid_window_s
        steps = max(1, math.ceil(window / span))
        if steps > _MAX_POINTS:
            raise TelemetryError(
                f"a window of {window} s holds more than {_MAX_POINTS} XID windows of {span:g} s: read it in parts"
            )
        return self.query_range(f"{self._sel(XID_COUNT)} > 0", at - (steps - 1) * span, at, span, notes)

    def _xid_changes(
        self, changed: Sequence[PromSeries], start: float, at: float, notes: list[str], skipped: dict[str, int]
    ) -> pd.DataFrame:
        """XID events of GPUs without the exporter's counter: changes of the last-XID gauge to non-zero."""
        uuids = sorted({s.labels["UUID"] for s in changed if s.labels.get("UUID")})
        step = max(self.step_s, (at - start) / (_MAX_POINTS - 2))
        frames = []
        for i in range(0, len(uuids), _UUID_CHUNK):
            regex = "|".join(_regex_escape(u) for u in uuids[i : i + _UUID_CHUNK])
            matchers = f'UUID=~"{regex}"' + (f',{self.host_label}!=""' if self.host_label else "")
            series = self.query_range(f"{XID_LAST}{{{matchers}}}", start - step, at, step, notes)
            frames.append(_change_events(series, self.host_label, skipped))
        return pd.concat(frames, ignore_index=True) if frames else empty_events()

    # --- HTTP ----------------------------------------------------------------------------------------

    def query(self, expr: str, at: float, notes: list[str] | None = None) -> list[PromSeries]:
        """An instant query at unix time ``at``: each series of the vector with its one value. Raises
        :class:`PrometheusAuthError` when Prometheus refuses the credentials, :class:`TelemetryError` naming the
        query when it refuses, redirects or does not answer it."""
        params = {"query": expr, "time": f"{at:.3f}"}
        data = self._result(self._post("/api/v1/query", params, expr), expr, notes, "vector")
        return [PromSeries(dict(r.get("metric") or {}), [_point(r["value"])]) for r in data]

    def query_range(
        self, expr: str, start: float, end: float, step: float, notes: list[str] | None = None
    ) -> list[PromSeries]:
        """A range query: each series with its (time, value) points. Raises as :meth:`query` does."""
        data = self._result(self._post_range(expr, start, end, step), expr, notes, "matrix")
        return [PromSeries(dict(r.get("metric") or {}), [_point(v) for v in r.get("values") or ()]) for r in data]

    def _plain_headers(self) -> dict[str, str]:
        return {name: reveal(value) for name, value in self.headers.items()}

    def _request_headers(self) -> dict[str, str]:
        """The headers every request carries: the configured ones and, with ``basic_auth``, Authorization."""
        headers = self._plain_headers()
        if self.basic_auth is not None:
            user, password = self.basic_auth[0], reveal(self.basic_auth[1])
            # Sent up front: Prometheus answers 401 without a challenge worth a second round trip.
            token = base64.b64encode(f"{user}:{password}".encode()).decode("ascii")
            headers["Authorization"] = f"Basic {token}"
        return headers

    def _scrub(self, text: str) -> str:
        """``text`` with every secret of this source (as sent, or encoded as sent) replaced by ``***``."""
        secrets = set(self._request_headers().values())
        if self.basic_auth is not None:
            secrets.add(reveal(self.basic_auth[1]))
        secrets |= {value.split(" ", 1)[1] for value in list(secrets) if " " in value}
        return scrub(text, secrets)

    def query_range_arrays(
        self, expr: str, start: float, end: float, step: float, notes: list[str] | None = None
    ) -> list[dict[str, Any]]:
        """:meth:`query_range_matrix` with each series' points as two arrays — ``{"metric": labels, "values":
        (unix seconds, values)}`` — cut straight from the answer's bytes: no Python object per point, so a
        fleet's millions of points cost what the bytes do. Raises as :meth:`query` does."""
        raw = self._post_range(expr, start, end, step)
        fast = _matrix_arrays(raw)
        if fast is not None:
            return fast
        out = []
        for r in self._result(raw, expr, notes, "matrix"):  # warnings, an error, another shape: the careful way
            values = r.get("values") or ()
            pairs = np.asarray([[p[0], p[1]] for p in values], dtype=np.float64).reshape(-1, 2)
            out.append({"metric": dict(r.get("metric") or {}), "values": (pairs[:, 0].copy(), pairs[:, 1].copy())})
        return out

    def _post_range(self, expr: str, start: float, end: float, step: float) -> bytes:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}"}
        return self._post("/api/v1/query_range", params, expr)

    def _post(self, path: str, params: Mapping[str, str], expr: str) -> bytes:
        """The answer's bytes of one API call (HTTP 2xx); raises as :meth:`query` does."""
        # One request, no retry: its timeout is the whole call's, at most the call deadline.
        timeout_s = min(self.timeout_s, call_deadline_s())
        # POST with a form body: a long query (a regex of UUIDs) never meets a URL length limit.
        form = {**params, "timeout": f"{timeout_s:g}s"}
        headers = {"Accept": "application/json", "User-Agent": _USER_AGENT, **self._request_headers()}
        where = f"Prometheus {self.url}"
        try:
            response = _client(self.verify).post(self.url + path, data=form, headers=headers, timeout=timeout_s)
        except httpx.TimeoutException:
            raise TelemetryError(
                f"{where} did not answer the query {expr!r}: timed out after {timeout_s:g} s"
            ) from None
        except httpx.HTTPError as exc:
            raise TelemetryError(
                f"{where} did not answer the query {expr!r}: {self._scrub(transport_reason(exc))}"
            ) from None
        status = response.status_code
        if status in (401, 403):
            raise PrometheusAuthError(self.url, status, self.credentials_summary)
        if 300 <= status < 400:
            to = _shown_url(response.headers.get("location") or "", base=self.url + path)
            raise TelemetryError(
                f"{where} redirected the query {expr!r} to {to} (HTTP {status}): gpucert follows no "
                "redirect, so that credentials go nowhere unconfigured; give the URL it redirects to"
            )
        raw = response.content
        if status >= 400:
            detail = self._scrub(_error_detail(raw))
            raise TelemetryError(
                f"{where} refused the query {expr!r}: HTTP {status}: {detail or response.reason_phrase}"
            )
        return raw

    def _result(self, raw: bytes, expr: str, notes: list[str] | None, kind: str) -> list[dict[str, Any]]:
        """The series of an answer of result type ``kind``; raises as :meth:`query` does."""
        data = self._parse(raw, expr, notes)
        if data.get("resultType") != kind:
            raise TelemetryError(f"Prometheus {self.url} answered the query {expr!r} with a {data.get('resultType')}")
        return list(data.get("result") or ())

    def _parse(self, raw: bytes, expr: str, notes: list[str] | None) -> dict[str, Any]:
        where = f"Prometheus {self.url}"
        try:
            answer = orjson.loads(raw)  # millions of points in a fleet's answer: the fast parser
        except ValueError:
            raise TelemetryError(f"{where} answered the query {expr!r} with something other than JSON") from None
        if not isinstance(answer, dict) or answer.get("status") != "success":
            detail = self._scrub(_error_detail(raw))
            raise TelemetryError(f"{where} failed the query {expr!r}: {detail or 'no success status'}")
        if notes is not None:
            notes.extend(f"Prometheus warned on {expr!r}: {w}" for w in answer.get("warnings") or ())
        data = answer.get("data")
        if not isinstance(data, dict):
            raise TelemetryError(f"{where} answered the query {expr!r} without data")
        return data


# --- the connection ------------------------------------------------------------------------------------


#: One HTTP client per TLS setting, shared by every source and thread (httpx's client is thread-safe): its
#: connections are kept alive across the dozens of queries of one read. Redirects are never followed.
_CLIENTS: dict[tuple[bool | str, int], httpx.Client] = {}
_CLIENTS_LOCK = threading.Lock()


def _client(verify: bool | str) -> httpx.Client:
    context = _tls_context(verify)
    key = (verify, id(context))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            limits = httpx.Limits(max_connections=32, max_keepalive_connections=16)
            client = httpx.Client(verify=context, follow_redirects=False, trust_env=False, limits=limits)
            _CLIENTS[key] = client
        return client


def _secret(value: SecretStr | str) -> SecretStr:
    return value if isinstance(value, SecretStr) else SecretStr(value)


def _shown_url(url: str, *, base: str = "") -> str:
    """``scheme://host[:port]/path`` of ``url`` (relative to ``base``): never a user, password or query."""
    try:
        parts = urllib.parse.urlsplit(urllib.parse.urljoin(base, url))
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "a malformed URL"
    if not parts.hostname:
        return "a URL without a host"
    return f"{parts.scheme}://{parts.hostname}{port}{parts.path}"


def _check_url(url: str) -> str:
    """The base URL without its trailing slashes; raises :class:`InputError` (showing no credentials)."""
    try:
        parts = urllib.parse.urlsplit(url.strip())
        _ = parts.port  # a port that is not a number raises here
    except ValueError:
        raise InputError(f"the Prometheus URL is malformed: {_shown_url(url)}") from None
    if "@" in parts.netloc:
        raise InputError(
            f"the Prometheus URL {_shown_url(url)} holds credentials (user:password@): give them as "
            "basic_auth, never in the URL (it is shown in messages and logs)"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        # A scheme-less "user:secret@host" parses as scheme "user": show nothing that may hold a secret.
        shown = repr(url) if "@" not in url else "(not shown: it holds an '@')"
        raise InputError(f"the Prometheus URL must be http:// or https:// and name a host, not {shown}")
    if parts.query or parts.fragment:
        raise InputError(f"the Prometheus URL {_shown_url(url)} must have no query or fragment")
    return urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


def _check_header(name: str, value: str) -> None:
    # http.client would refuse these at the first query, with the value in its message.
    if not _HEADER_NAME.fullmatch(name):
        raise InputError(f"{name!r} is not an HTTP header name")
    if any(c in value for c in "\r\n\0"):
        raise InputError(f"the value of the header {name} holds a line break or NUL")
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        raise InputError(f"the value of the header {name} is not Latin-1 text (HTTP cannot carry it)") from None


def _tls_context(verify: bool | str) -> ssl.SSLContext:
    """The TLS context of ``verify`` (see :class:`PrometheusSource`). Raises :class:`InputError` for a CA
    file or directory that cannot be read."""
    if isinstance(verify, str):
        if not verify:
            raise InputError("verify is True, False or the path of a CA file or directory, not ''")
        try:
            stamp = os.stat(verify).st_mtime_ns
        except FileNotFoundError:
            raise InputError(f"the CA file {verify} does not exist") from None
        except OSError as exc:
            raise InputError(f"the CA file {verify} cannot be read: {exc.strerror}") from None
        return _made_context(verify, stamp)
    return _made_context(verify, 0)


@functools.lru_cache(maxsize=16)
def _made_context(verify: bool | str, stamp: int) -> ssl.SSLContext:
    # Made once per CA file version (``stamp``, its mtime: a renewed CA is read again): loading the CAs
    # costs milliseconds, and a read makes dozens of requests.
    if isinstance(verify, bool):
        context = ssl.create_default_context()
        if not verify:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        return context
    try:
        if os.path.isdir(verify):
            return ssl.create_default_context(capath=verify)
        return ssl.create_default_context(cafile=verify)
    except (OSError, ssl.SSLError) as exc:
        raise InputError(f"the CA file {verify} cannot be used: {exc}") from None


# --- answers into frames -------------------------------------------------------------------------------


def _point(pair: Sequence[Any]) -> tuple[float, float]:
    # Prometheus writes values as strings ("1", "NaN", "+Inf"); float() reads them all.
    return float(pair[0]), float(pair[1])


_MATRIX_HEAD = b'{"status":"success","data":{"resultType":"matrix","result":['
_SERIES_START = b'{"metric":'
_VALUES_START = b'},"values":[['
_NOT_NUMBERS = b'[]"'


def _matrix_arrays(raw: bytes) -> list[dict[str, Any]] | None:
    """The series of a range query's answer, their points as arrays, cut from the bytes (Prometheus writes
    its JSON in one fixed layout: ``{"metric":{…},"values":[[t,"v"],…]}`` per series); None for any other
    layout (warnings, another result type), which the JSON parser then reads. A label value cannot hold the
    markers: its quotes are escaped."""
    if not raw.startswith(_MATRIX_HEAD):
        return None
    end = raw.rfind(b"]}}")
    if end < 0 or raw[end + 3 :].strip() or b'"warnings"' in raw[end:] or b'"infos"' in raw[end:]:
        return None
    out: list[dict[str, Any]] = []
    at = len(_MATRIX_HEAD)
    while at < end:
        if not raw.startswith(_SERIES_START, at):
            return None
        split = raw.find(_VALUES_START, at)
        close = raw.find(b"]]}", split)
        following = raw.find(_SERIES_START, at + 1)
        if split < 0 or close < 0 or 0 <= following < split:
            return None  # a series without "values" (a native histogram's "histograms"): not this layout
        labels = orjson.loads(raw[at + len(_SERIES_START) : split + 1])
        body = raw[split + len(_VALUES_START) - 1 : close + 1].translate(None, _NOT_NUMBERS)
        numbers = np.array(body.split(b","), dtype=np.float64) if body else np.empty(0)
        pairs = numbers.reshape(-1, 2)
        out.append({"metric": labels, "values": (pairs[:, 0].copy(), pairs[:, 1].copy())})
        at = close + 3
        if at < end and raw[at : at + 1] == b",":
            at += 1
    return out


def _error_detail(raw: bytes) -> str:
    try:
        answer = json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace").strip()[:300]
    if isinstance(answer, dict):
        kind, error = answer.get("errorType"), answer.get("error")
        return f"{kind}: {error}" if kind else str(error or "")
    return ""


def _regex_escape(text: str) -> str:
    # RE2 inside a PromQL double-quoted string: escape regex metacharacters, then the backslashes.
    special = set(r".^$*+?()[]{}|\\")
    escaped = "".join("\\" + c if c in special else c for c in text)
    return escaped.replace("\\", "\\\\").replace('"', '\\"')


#: The NIC series reduce to one value per node in Prometheus, by these labels: one of them names the node.
_NIC_BY = "node, instance"
#: One series per port, the largest where two jobs scrape one exporter.
_PORT_BY = "node, instance, device, port"
#: Where two series name one node (two scrape jobs with different instance labels), the worse stands: the
#: fewer active ports and the slower slowest port, else the more (ports, errors) and the faster fastest port.
_NIC_LOWER_WINS = frozenset({"ib_ports_active", "ib_rate_min_gbps"})


def _nic_queries(window: int) -> dict[str, str]:
    """The instant queries (at the window's end) of the node-level NIC metrics, each by (node, instance)."""
    w = f"{window}s"

    def port(name: str, fn: str = "last_over_time") -> str:
        return f"max by ({_PORT_BY}) ({fn}({NIC_SERIES[name]}[{w}]))"

    state = port("state")
    active_rate = f"({port('rate')} * 8 / 1e9) and on ({_PORT_BY}) ({state} == 4)"
    queries = {
        "ib_ports": f"count by ({_NIC_BY}) ({state})",
        "ib_ports_active": f"count by ({_NIC_BY}) ({state} == 4)",
        "ib_rate_min_gbps": f"min by ({_NIC_BY}) ({active_rate})",
        "ib_rate_max_gbps": f"max by ({_NIC_BY}) ({active_rate})",
    }
    for metric in ("ib_symbol_errors", "ib_link_downed", "ib_rcv_errors"):
        queries[metric] = f"sum by ({_NIC_BY}) ({port(metric, 'increase')})"
    return queries


def _nic_node(labels: Mapping[str, str]) -> str:
    """A node-exporter series' node: its ``node`` label, else its ``instance`` without the port."""
    node = labels.get("node") or ""
    if node:
        return node
    instance = labels.get("instance") or ""
    host, sep, port = instance.rpartition(":")
    return host if sep and port.isdigit() else instance


def _nic_readings(answers: Mapping[str, Sequence[PromSeries]]) -> pd.DataFrame:
    """node, metric, value of the NIC answers; a node with ports but no ACTIVE one has 0 active ports."""
    rows = [
        (_nic_node(s.labels), metric, s.values[0][1])
        for metric, series in answers.items()
        for s in series
        if s.values and math.isfinite(s.values[0][1])
    ]
    frame = pd.DataFrame(rows, columns=["node", "metric", "value"])
    frame = frame[frame["node"] != ""]
    if frame.empty:
        return frame.astype({"value": np.float64})
    # Counters' increases are extrapolated to the window's edges by Prometheus: whole counts again.
    counted = frame["metric"].isin(["ib_symbol_errors", "ib_link_downed", "ib_rcv_errors"])
    frame.loc[counted, "value"] = np.round(frame.loc[counted, "value"].to_numpy(dtype=np.float64))
    # count() of no series is no series: a node whose ports are all down has no "active" answer.
    ported = frame.loc[frame["metric"] == "ib_ports", "node"].unique()
    active = set(frame.loc[frame["metric"] == "ib_ports_active", "node"])
    none_active = [n for n in ported if n not in active]
    if none_active:
        zeros = pd.DataFrame({"node": none_active, "metric": "ib_ports_active", "value": 0.0})
        frame = pd.concat([frame, zeros], ignore_index=True)
    return worst_of(frame, ["node", "metric"], _NIC_LOWER_WINS)


def _gpu_identity(labels: Mapping[str, str], host_label: str | None) -> tuple[str, int, str, str] | None:
    node = host_of(labels, host_label)
    gpu, uuid = labels.get("gpu"), labels.get("UUID")
    if node is None or gpu is None or not gpu.isdigit() or not uuid:
        return None
    return node, int(gpu), uuid, labels.get("modelName") or "unknown"


def _identified(
    series: Iterable[PromSeries], host_label: str | None, skipped: dict[str, int], name: str
) -> Iterator[tuple[tuple[str, int, str, str], PromSeries]]:
    """Each series that names its GPU, with that identity (node, index, UUID, model); the others counted in
    ``skipped`` under ``name``."""
    for s in series:
        ident = _gpu_identity(s.labels, host_label)
        if ident is None:
            skipped[name] = skipped.get(name, 0) + 1
        else:
            yield ident, s


def _readings(
    answers: Sequence[tuple[str, list[PromSeries]]], host_label: str | None, skipped: dict[str, int]
) -> pd.DataFrame:
    rows = [
        (*ident, metric, s.values[0][1])
        for metric, series in answers
        for ident, s in _identified(series, host_label, skipped, metric)
        if math.isfinite(s.values[0][1])
    ]
    columns = ["node", "gpu", "gpu_uuid", "gpu_model", "metric", "value"]
    return pd.DataFrame(rows, columns=columns) if rows else empty_readings()


def _identities(series: Sequence[PromSeries], host_label: str | None, skipped: dict[str, int]) -> pd.DataFrame:
    rows = [ident[:3] for ident, _ in _identified(series, host_label, skipped, PRESENCE)]
    return pd.DataFrame(rows, columns=["node", "gpu", "gpu_uuid"]).astype({"gpu": np.int64})


def _count_events(series: Sequence[PromSeries], host_label: str | None, skipped: dict[str, int]) -> pd.DataFrame:
    """XID events from the exporter's windowed counts: per (GPU, XID) the sum over disjoint windows."""
    rows = []
    for ident, s in _identified(series, host_label, skipped, XID_COUNT):
        xid = s.labels.get("xid", "")
        if not xid.isdigit():
            skipped[XID_COUNT] = skipped.get(XID_COUNT, 0) + 1
            continue
        counts = [(t, v) for t, v in s.values if math.isfinite(v) and v > 0]
        if counts:
            total = round(sum(v for _, v in counts))
            rows.append((*ident, int(xid), total, pd.Timestamp(counts[0][0], unit="s", tz="UTC")))
    if not rows:
        return empty_events()
    frame = pd.DataFrame(rows, columns=["node", "gpu", "gpu_uuid", "gpu_model", "xid", "count", "ts"])
    # Two series of one GPU and XID (two jobs scraping one exporter) saw the same events: keep the larger.
    frame = frame.sort_values("count", ascending=False, kind="stable")
    return frame.drop_duplicates(["node", "gpu", "gpu_uuid", "xid"]).reset_index(drop=True)


def _change_events(series: Sequence[PromSeries], host_label: str | None, skipped: dict[str, int]) -> pd.DataFrame:
    """XID events from the last-XID gauge: each change to a non-zero value (a first sample is no change)."""
    rows = []
    seen: set[tuple[str, int, str, str]] = set()
    for ident, s in _identified(series, host_label, skipped, XID_LAST):
        if ident in seen:
            continue  # a second series of the same GPU (two jobs scraping one exporter) saw the same changes
        seen.add(ident)
        values = np.array([v for _, v in s.values])
        times = np.array([t for t, _ in s.values])
        if len(values) < 2:
            continue
        change = np.flatnonzero((values[1:] != values[:-1]) & (values[1:] > 0)) + 1
        for i in change:
            if float(values[i]).is_integer():
                rows.append((*ident, int(values[i]), 1, pd.Timestamp(times[i], unit="s", tz="UTC")))
    if not rows:
        return empty_events()
    frame = pd.DataFrame(rows, columns=["node", "gpu", "gpu_uuid", "gpu_model", "xid", "count", "ts"])
    # Several events of one XID on one GPU: one row with their count, stamped with the first.
    return (
        frame.groupby(["node", "gpu", "gpu_uuid", "gpu_model", "xid"], as_index=False)
        .agg(count=("count", "sum"), ts=("ts", "min"))
        .reset_index(drop=True)
    )
