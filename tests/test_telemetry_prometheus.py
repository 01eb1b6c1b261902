"""PrometheusSource against a real Prometheus (Debian's 2.42 package), started by these tests.

History is backfilled: OpenMetrics text with timestamps (``# EOF`` terminated) goes through ``promtool tsdb
create-blocks-from openmetrics`` into a data directory Prometheus then starts on, so a window in the past
holds a PCIe link trained down, an XID 79 after which the GPU's series vanish, a thermal-slowdown spell,
a replay burst, a DBE with a remap pending, a power cap and application XIDs seen only through the
last-XID gauge, for both spellings of the host label. A last test lets Prometheus scrape the simulated
cluster's exporters live (the first sample lands 5–6 s after start, docs/design/testing.md). A secured Prometheus
(``--web.config.file``: TLS from a private CA, basic auth with a bcrypt hash) shows refused credentials as
one clear error and the right ones reading the same window; a bearer token, extra headers and redirects
are shown against a tiny local server, since Prometheus itself knows no bearer tokens.

The binaries come from ``PATH``, else from a cache of Debian's package (``apt-get download prometheus``
and ``dpkg -x``, no root needed); the tests are skipped, saying why, when neither works.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import ipaddress
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from pydantic import SecretStr

from gpucert.errors import InputError
from gpucert.results import parse_results
from gpucert.store import empty_baseline
from gpucert.telemetry import PrometheusAuthError, PrometheusSource, TelemetryError
from gpucert.verdict import judge
from gpucert_sim import SimCluster
from gpucert_sim.fleet import Fault

STEP = 15  # the backfill's scrape interval, seconds
MODEL = "NVIDIA H200"


# --- the binaries ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PromBins:
    prometheus: Path
    promtool: Path


def _cache_dir() -> Path:
    root = os.environ.get("GPUCERT_TEST_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpucert-tests"
    )
    return Path(root) / "prometheus-deb"


def _extract_debian_package(cache: Path) -> str | None:
    """Download Debian's prometheus package and unpack it into ``cache``; None, or why it failed."""
    if shutil.which("apt-get") is None or shutil.which("dpkg") is None:
        return "neither prometheus on PATH nor apt-get and dpkg to fetch Debian's package"
    with tempfile.TemporaryDirectory(prefix="gpucert-prom-") as work:
        try:
            download = subprocess.run(
                ["apt-get", "download", "prometheus"],
                check=False,
                cwd=work,
                capture_output=True,
                text=True,
                timeout=300,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"apt-get download prometheus failed: {exc}"
        debs = sorted(Path(work).glob("prometheus_*.deb"))
        if download.returncode != 0 or not debs:
            return f"apt-get download prometheus failed: {download.stderr.strip()[-300:]}"
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=cache.parent))
        try:
            unpack = subprocess.run(
                ["dpkg", "-x", str(debs[0]), str(staging)], check=False, capture_output=True, text=True
            )
            if unpack.returncode != 0:
                return f"dpkg -x failed: {unpack.stderr.strip()[-300:]}"
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(cache)
            staging.rename(cache)  # atomic: a half-unpacked cache is never seen
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return None


@pytest.fixture(scope="session")
def prom_bins() -> PromBins:
    found = shutil.which("prometheus"), shutil.which("promtool")
    if found[0] and found[1]:
        return PromBins(Path(found[0]), Path(found[1]))
    cache = _cache_dir()
    bins = PromBins(cache / "usr/bin/prometheus", cache / "usr/bin/promtool")
    if not (bins.prometheus.is_file() and bins.promtool.is_file()):
        cache.parent.mkdir(parents=True, exist_ok=True)
        why = _extract_debian_package(cache)
        if why is not None:
            _unavailable(f"no Prometheus for the telemetry tests: {why}")
    version = subprocess.run([str(bins.prometheus), "--version"], check=False, capture_output=True, text=True)
    if version.returncode != 0:
        _unavailable(f"the Prometheus binary does not run here: {version.stderr.strip()[-200:]}")
    return bins


def _unavailable(why: str) -> None:
    """A real Prometheus that cannot run: a failure in CI (its tests must run there), a skip elsewhere."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{why} (CI needs the real Prometheus)")
    pytest.skip(why)


# --- running Prometheus ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(
    url: str, headers: Mapping[str, str] | None = None, context: ssl.SSLContext | None = None
) -> tuple[int, bytes]:
    try:
        request = urllib.request.Request(url, headers=dict(headers or {}))
        with urllib.request.urlopen(request, timeout=2, context=context) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


@contextlib.contextmanager
def running_prometheus(
    bins: PromBins,
    workdir: Path,
    config: Mapping[str, object],
    *,
    web_config: Mapping[str, object] | None = None,
    probe_headers: Mapping[str, str] | None = None,
    probe_context: ssl.SSLContext | None = None,
) -> Iterator[str]:
    """Prometheus on 127.0.0.1 (a free port) over ``workdir/data``; yields its URL, stops it (SIGTERM).

    ``web_config`` is Prometheus' ``--web.config.file`` (TLS, basic auth; https with TLS); readiness is
    then probed with ``probe_headers`` and ``probe_context``."""
    (workdir / "prometheus.yml").write_text(yaml.safe_dump(dict(config)), encoding="utf-8")
    flags = []
    if web_config is not None:
        (workdir / "web.yml").write_text(yaml.safe_dump(dict(web_config)), encoding="utf-8")
        flags.append(f"--web.config.file={workdir / 'web.yml'}")
    scheme = "https" if web_config and "tls_server_config" in web_config else "http"

    def ready(url: str) -> bool:
        return _get(f"{url}/-/ready", probe_headers, probe_context)[0] == 200

    for _attempt in range(3):  # a free port can be taken between choosing and binding it
        port = _free_port()
        log = (workdir / "prometheus.log").open("wb")
        process = subprocess.Popen(
            [
                str(bins.prometheus),
                f"--config.file={workdir / 'prometheus.yml'}",
                f"--storage.tsdb.path={workdir / 'data'}",
                # Long enough that the backfilled past is never cut away.
                "--storage.tsdb.retention.time=10y",
                f"--web.listen-address=127.0.0.1:{port}",
                *flags,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        url = f"{scheme}://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while process.poll() is None and time.monotonic() < deadline:
            if ready(url):
                break
            time.sleep(0.1)
        if process.poll() is None and ready(url):
            try:
                yield url
            finally:
                process.terminate()
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
                log.close()
            return
        process.kill()
        process.wait()
        log.close()
        text = (workdir / "prometheus.log").read_text(errors="replace")
        if "address already in use" not in text:
            break
    pytest.fail(f"Prometheus did not get ready:\n{(workdir / 'prometheus.log').read_text(errors='replace')[-2000:]}")


# --- the backfilled history -----------------------------------------------------------------------------

#: name → (labels, [(t, value), …]) per series, written family by family.
History = dict[str, list[tuple[dict[str, str], list[tuple[int, float]]]]]


def openmetrics(history: History) -> str:
    """OpenMetrics text with timestamps in seconds, ending in ``# EOF``. Every family is a gauge: an
    OpenMetrics counter must be named ``…_total``, DCGM's are not, and PromQL's ``rate()`` does not care."""
    lines: list[str] = []
    for name, series in history.items():
        lines.append(f"# TYPE {name} gauge")
        for labels, points in series:
            text = ",".join(f'{k}="{v}"' for k, v in labels.items())
            lines += [f"{name}{{{text}}} {value:g} {t}" for t, value in points]
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Scenario:
    end: datetime
    xid79_at: datetime
    uuids: dict[tuple[str, int], str]


def build_history(host_label: str, end: int) -> tuple[History, Scenario]:
    """Two nodes of four GPUs, 2 h at 15 s up to ``end``; the faults of the module docstring.

    node-a: gpu 0 12 SBEs (steady); gpu 1 PCIe Gen4 of Gen5 throughout; gpu 2 XID 79 40 min before the
    end, its series gone 5 min later; gpu 3 a DBE 50 min before the end and a remap pending since.
    node-b: gpu 0 20 PCIe replays/min over the last 30 min; gpu 1 XIDs 13 then 31 seen only by the
    last-XID gauge; gpu 2 power capped at 500 of 700 W, XID 48 100 min before the end (outside a 1 h
    window); gpu 3 HW thermal slowdown a quarter of the time from 60 to 40 min before the end.
    """
    times = list(range(end - 2 * 3600, end + 1, STEP))
    history: History = {}
    uuids: dict[tuple[str, int], str] = {}
    for n, node in enumerate(("node-a", "node-b")):
        for gpu in range(4):
            uuid = f"GPU-{n:02d}{gpu:02d}aaaa-0000-4000-8000-00000000{n}{gpu}"
            uuids[node, gpu] = uuid
            labels = {
                "gpu": str(gpu),
                "UUID": uuid,
                "pci_bus_id": f"00000000:{0x18 + gpu:02X}:00.0",
                "device": f"nvidia{gpu}",
                "modelName": MODEL,
                host_label: node,
                "DCGM_FI_DRIVER_VERSION": "550.90.07",
            }
            for name, extra, fn in gpu_series((node, gpu), end, times):
                points = [(t, v) for t in times if (v := fn(t)) is not None]
                history.setdefault(name, []).append(({**labels, **extra}, points))
    scenario = Scenario(
        end=datetime.fromtimestamp(end, UTC), xid79_at=datetime.fromtimestamp(end - 40 * 60, UTC), uuids=uuids
    )
    return history, scenario


Fn = Callable[[int], "float | None"]


def gpu_series(me: tuple[str, int], end: int, times: list[int]) -> list[tuple[str, dict[str, str], Fn]]:
    """One GPU's DCGM series: (name, extra labels, value at time t or None when the series is absent)."""
    t79, t_dbe, t_replay = end - 40 * 60, end - 50 * 60, end - 30 * 60
    t13, t31, t48 = end - 30 * 60, end - 20 * 60, end - 100 * 60
    hot_from, hot_to = end - 60 * 60, end - 40 * 60
    lost = me == ("node-a", 2)  # XID 79: fallen off the bus, its series end 5 minutes later

    def alive(fn: Callable[[int], float]) -> Fn:
        return lambda t: None if lost and t > t79 + 300 else fn(t)

    def when(fault: tuple[str, int], yes: float, no: float, since: int = 0) -> Fn:
        return alive(lambda t: yes if me == fault and t >= since else no)

    def is_hot(t: int) -> bool:
        # The first sample of every minute in the spell: a quarter of the 15 s samples.
        return me == ("node-b", 3) and hot_from <= t < hot_to and t % 60 == 0

    hot_samples = [t for t in times if is_hot(t)]

    def xid_last(t: int) -> float:
        if lost:
            return 79.0 if t >= t79 else 0.0
        if me == ("node-b", 1):
            return 31.0 if t >= t31 else 13.0 if t >= t13 else 0.0
        if me == ("node-b", 2):
            return 48.0 if t >= t48 else 0.0
        return 0.0

    series: list[tuple[str, dict[str, str], Fn]] = [
        ("DCGM_FI_DEV_GPU_TEMP", {}, alive(lambda t: 88.0 if is_hot(t) else 62.0 + me[1])),
        ("DCGM_FI_DEV_SLOWDOWN_TEMP", {}, alive(lambda t: 90.0)),
        ("DCGM_FI_DEV_PCIE_LINK_GEN", {}, when(("node-a", 1), 4.0, 5.0)),
        ("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", {}, alive(lambda t: 5.0)),
        ("DCGM_FI_DEV_PCIE_LINK_WIDTH", {}, alive(lambda t: 16.0)),
        ("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", {}, alive(lambda t: 16.0)),
        (
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            {},
            alive(lambda t: 3.0 + (max(0, t - t_replay) // STEP * 5 if me == ("node-b", 0) else 0)),
        ),
        ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", {}, when(("node-a", 0), 12.0, 0.0)),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", {}, when(("node-a", 3), 1.0, 0.0, since=t_dbe)),
        ("DCGM_FI_DEV_ROW_REMAP_PENDING", {}, when(("node-a", 3), 1.0, 0.0, since=t_dbe)),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", {}, alive(lambda t: 0.0)),
        ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", {}, alive(lambda t: 0.0)),
        ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", {}, alive(lambda t: float(0x48 | 0x04) if is_hot(t) else 4.0)),
        # Each hot sample stands for 15 s of thermal violation, in nanoseconds.
        ("DCGM_FI_DEV_THERMAL_VIOLATION", {}, alive(lambda t: sum(s <= t for s in hot_samples) * STEP * 1e9)),
        ("DCGM_FI_DEV_POWER_VIOLATION", {}, alive(lambda t: 0.0)),
        ("DCGM_FI_DEV_ENFORCED_POWER_LIMIT", {}, when(("node-b", 2), 500.0, 700.0)),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT", {}, when(("node-b", 2), 500.0, 700.0)),
        ("DCGM_FI_DEV_POWER_MGMT_LIMIT_DEF", {}, alive(lambda t: 700.0)),
        ("DCGM_FI_DEV_XID_ERRORS", {}, alive(xid_last)),
    ]
    if lost:
        # The exporter's count of the last 5 minutes, switched on for this GPU only: node-b's XIDs must come
        # from the last-XID gauge. After its window the count reads 0 (a live Prometheus would mark the
        # series stale; a backfill has no staleness markers).
        window = {"xid": "79", "window_size_in_ms": "300000"}
        series.append(("DCGM_EXP_XID_ERRORS_COUNT", window, alive(lambda t: 1.0 if t79 <= t < t79 + 300 else 0.0)))
    return series


@dataclass(frozen=True)
class Backfilled:
    url: str
    host_label: str
    scenario: Scenario


#: A Prometheus that scrapes nothing: it serves the backfilled history only.
IDLE_CONFIG = {"global": {"scrape_interval": "15s"}, "scrape_configs": []}


def backfill(bins: PromBins, workdir: Path, host_label: str) -> Scenario:
    """The history of :func:`build_history`, ending ten minutes ago, written into ``workdir/data``."""
    end = (int(time.time()) - 600) // 60 * 60  # ten minutes ago, on a minute
    history, scenario = build_history(host_label, end)
    (workdir / "backfill.om").write_text(openmetrics(history), encoding="utf-8")
    made = subprocess.run(
        [str(bins.promtool), "tsdb", "create-blocks-from", "openmetrics", "backfill.om", "data"],
        check=False,
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    return scenario


@pytest.fixture(scope="module", params=["hostname", "Hostname"])
def backfilled(
    request: pytest.FixtureRequest, prom_bins: PromBins, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backfilled]:
    host_label = str(request.param)
    workdir = tmp_path_factory.mktemp(f"prom-{host_label}")
    scenario = backfill(prom_bins, workdir, host_label)
    with running_prometheus(prom_bins, workdir, IDLE_CONFIG) as url:
        yield Backfilled(url, host_label, scenario)


# --- a secured Prometheus -------------------------------------------------------------------------------

USER, PASSWORD = "gpucert", "gpucert-test-password"
#: bcrypt of PASSWORD, cost 4 (the lowest there is: every request is checked), made with libxcrypt:
#: ``crypt.crypt(PASSWORD, "$2y$04$" + salt)``; the ``bcrypt`` package is no dependency of the tests.
PASSWORD_HASH = "$2y$04$8tj0eVc/Gvt6THP9ji51p.ljlEt0nB/btQ2OMg85Ve60jYpIL06j6"


def make_tls(workdir: Path) -> Path:
    """A private CA and a server certificate it signed for 127.0.0.1 (``server.pem``, ``server.key``)
    in ``workdir``; returns the CA's file."""
    now = datetime.now(UTC)

    def cert(
        subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name | None, signer: ec.EllipticCurvePrivateKey
    ) -> x509.CertificateBuilder:
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
        return (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(issuer or name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=1))
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False)
        )

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca = (
        cert("gpucert test CA", ca_key, None, ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server = (
        cert("127.0.0.1", key, ca.subject, ca_key)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (workdir / "ca.pem").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (workdir / "server.pem").write_bytes(server.public_bytes(serialization.Encoding.PEM))
    (workdir / "server.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return workdir / "ca.pem"


@dataclass(frozen=True)
class Secured:
    url: str
    ca_file: str
    scenario: Scenario


@pytest.fixture(scope="module")
def secured(prom_bins: PromBins, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    """The backfilled history behind TLS (a private CA) and basic auth (USER, PASSWORD)."""
    workdir = tmp_path_factory.mktemp("prom-secured")
    scenario = backfill(prom_bins, workdir, "hostname")
    ca = make_tls(workdir)
    web = {
        "tls_server_config": {"cert_file": str(workdir / "server.pem"), "key_file": str(workdir / "server.key")},
        "basic_auth_users": {USER: PASSWORD_HASH},
    }
    basic = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    probe = ssl.create_default_context(cafile=str(ca))
    with running_prometheus(
        prom_bins,
        workdir,
        IDLE_CONFIG,
        web_config=web,
        probe_headers={"Authorization": f"Basic {basic}"},
        probe_context=probe,
    ) as url:
        yield Secured(url, str(ca), scenario)


# --- a tiny server that checks the Authorization header -------------------------------------------------

#: What the tiny server answers a query it accepts: one series, Prometheus' JSON.
TINY_ANSWER: dict[str, object] = {
    "status": "success",
    "data": {"resultType": "vector", "result": [{"metric": {"__name__": "up"}, "value": [0, "1"]}]},
}


@contextlib.contextmanager
def bearer_server(token: str) -> Iterator[tuple[str, list[dict[str, str]]]]:
    """A Prometheus look-alike on 127.0.0.1 that accepts ``Authorization: Bearer <token>`` only (401
    otherwise; 403 for the tenant ``X-Scope-OrgID: other``), answering every query with
    :data:`TINY_ANSWER`; under ``/moved`` it redirects to another host, under ``/echo`` it fails with the
    request's Authorization header in its answer. Yields its URL and the headers (lower-case names) of
    every request it got."""
    seen: list[dict[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            headers = {k.lower(): v for k, v in self.headers.items()}
            seen.append(headers)
            self.rfile.read(int(headers.get("content-length", "0")))
            if self.path.startswith("/moved/"):
                self.send_response(307)
                self.send_header("Location", "http://elsewhere.invalid/api/v1/query?token=leaked")
                self.end_headers()
                return
            body: Mapping[str, object]
            if headers.get("authorization") != f"Bearer {token}":
                status, body = 401, {"status": "error", "error": "Unauthorized"}
            elif headers.get("x-scope-orgid") == "other":
                status, body = 403, {"status": "error", "error": "Forbidden"}
            elif self.path.startswith("/echo/"):
                status, body = (400, {"status": "error", "errorType": "bad_data", "error": headers["authorization"]})
            else:
                status, body = 200, TINY_ANSWER
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, format: str, *args: object) -> None:  # quiet: the test output is the point
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def value(results: pd.DataFrame, node: str, gpu: int | None, metric: str) -> float:
    if gpu is None:
        hit = results[(results["node"] == node) & results["gpu"].isna() & (results["metric"] == metric)]
    else:
        hit = results[(results["node"] == node) & (results["gpu"] == gpu) & (results["metric"] == metric)]
    assert len(hit) == 1, f"{node} {gpu} {metric}: {len(hit)} rows"
    return float(hit["value"].iloc[0])


def xids(results: pd.DataFrame, node: str, gpu: int) -> list[int]:
    hit = results[(results["node"] == node) & (results["gpu"] == gpu) & (results["metric"] == "xid")]
    return sorted(int(v) for v in hit["value"])


# --- the tests ------------------------------------------------------------------------------------------


def read_the_window(source: PrometheusSource, sc: Scenario) -> None:
    """Read the last hour of the backfilled history through ``source`` and check every signal of it."""
    seen = source.read(
        sc.end - timedelta(hours=1), sc.end, run_id="operate-1", expected_gpus={"node-a": 4, "node-b": 4, "node-c": 8}
    )
    r = seen.results
    assert parse_results(r, "again") is not None
    assert set(r["run_id"]) == {"operate-1"}
    assert (r["ts"][r["metric"] != "xid"] == pd.Timestamp(sc.end)).all()

    # PCIe: node-a gpu 1 never reached Gen5; the others did.
    assert value(r, "node-a", 1, "pcie_gen") == 4
    assert value(r, "node-a", 1, "pcie_gen_max") == 5
    assert value(r, "node-a", 0, "pcie_gen") == 5
    assert value(r, "node-a", 1, "pcie_width") == value(r, "node-a", 1, "pcie_width_max") == 16
    # XID 79 once, from the exporter's counter, stamped when it was counted; then the GPU's series vanished.
    assert xids(r, "node-a", 2) == [79]
    stamp = r[(r["metric"] == "xid") & (r["node"] == "node-a")]["ts"].iloc[0]
    assert abs(stamp - pd.Timestamp(sc.xid79_at)) <= pd.Timedelta(minutes=5)
    assert value(r, "node-a", None, "gpu_count") == 3
    assert value(r, "node-a", None, "gpu_count_expected") == 4
    assert value(r, "node-b", None, "gpu_count") == 4
    # XIDs seen only through the last-XID gauge: each change is an event; 48 came before the window.
    assert xids(r, "node-b", 1) == [13, 31]
    assert xids(r, "node-b", 2) == []
    # A quarter of the time thermally slowed, from the violation counter and the HW bits alike.
    assert value(r, "node-b", 3, "hw_slowdown_frac") == pytest.approx(0.25, abs=0.03)
    assert int(value(r, "node-b", 3, "clocks_event_reasons")) & 0x48 == 0x48
    assert value(r, "node-b", 3, "temp_max_c") == 88
    assert value(r, "node-b", 2, "hw_slowdown_frac") == 0
    assert int(value(r, "node-b", 2, "clocks_event_reasons")) == 0x04
    # Counters: the worst 5-minute replay rate; ECC counts since the last reset; CRC increase.
    assert value(r, "node-b", 0, "pcie_replays_per_min") == pytest.approx(20, rel=0.1)
    assert value(r, "node-b", 1, "pcie_replays_per_min") == 0
    assert value(r, "node-a", 0, "ecc_sbe_volatile") == 12
    assert value(r, "node-a", 3, "ecc_dbe_volatile") == 1
    assert value(r, "node-a", 3, "remapped_rows_pending") == 1
    assert value(r, "node-a", 3, "nvlink_crc_errors") == 0
    # Limits at the end of the window, the default only where the exporter has the field.
    assert value(r, "node-b", 2, "power_limit_w") == 500
    assert value(r, "node-b", 2, "power_limit_default_w") == 700
    assert value(r, "node-b", 2, "temp_slowdown_c") == 90
    assert set(r["gpu_model"]) == {MODEL}
    assert seen.problems == {"node-c": seen.problems["node-c"]}
    assert "no DCGM series" in seen.problems["node-c"]

    # The verdict engine's gates judge the window as they judge a certification's telemetry.
    verdicts = judge(r, empty_baseline())
    failed = verdicts[verdicts["verdict"] == "fail"]
    by_gpu = {
        (n, int(g)): m for n, g, m in zip(failed["node"], failed["gpu"], failed["metric"], strict=True) if pd.notna(g)
    }
    assert by_gpu == {
        ("node-a", 1): "pcie_gen",
        ("node-a", 2): "xid",
        ("node-a", 3): "ecc_dbe_volatile",
        ("node-b", 0): "pcie_replays_per_min",
        ("node-b", 2): "power_limit_w",
        ("node-b", 3): "hw_slowdown_frac",
    }


def test_the_window_reads_every_signal_for_either_host_label(backfilled: Backfilled) -> None:
    read_the_window(PrometheusSource(backfilled.url, step_s=STEP), backfilled.scenario)


def test_a_named_host_label_reads_only_series_that_carry_it(backfilled: Backfilled) -> None:
    sc = backfilled.scenario
    other = "Hostname" if backfilled.host_label == "hostname" else "hostname"
    start = sc.end - timedelta(hours=1)
    named = PrometheusSource(backfilled.url, backfilled.host_label, step_s=STEP).read(start, sc.end, run_id="op-2")
    either = PrometheusSource(backfilled.url, step_s=STEP).read(start, sc.end, run_id="op-2")
    pd.testing.assert_frame_equal(named.results, either.results)
    wrong = PrometheusSource(backfilled.url, other, step_s=STEP).read(
        start, sc.end, run_id="op-2", expected_gpus={"node-a": 4}, nodes=["node-b"]
    )
    assert wrong.results.empty
    assert sorted(wrong.problems) == ["node-a", "node-b"]  # the GPU nodes in scope, each named
    assert "no DCGM series in Prometheus for this node" in wrong.problems["node-b"]
    assert wrong.absent is not None
    assert wrong.absent.startswith(f"no DCGM series in Prometheus {backfilled.url} between ")
    assert either.absent is None


def test_a_short_window_and_an_empty_one(backfilled: Backfilled) -> None:
    sc = backfilled.scenario
    source = PrometheusSource(backfilled.url, step_s=STEP)
    short = source.read(sc.end - timedelta(minutes=2), sc.end, run_id="op-3").results
    assert value(short, "node-a", 1, "pcie_gen") == 4  # windows shorter than the rate and share blocks work
    assert value(short, "node-b", 0, "pcie_replays_per_min") == pytest.approx(20, rel=0.1)
    assert xids(short, "node-a", 2) == []
    with pytest.raises(ValueError, match="empty"):
        source.read(sc.end, sc.end, run_id="op-3")


def test_a_refused_query_and_a_silent_server_are_telemetry_errors_naming_the_query(backfilled: Backfilled) -> None:
    source = PrometheusSource(backfilled.url)
    with pytest.raises(TelemetryError, match=r"refused the query 'sum\(': HTTP 400: bad_data"):
        source.query("sum(", time.time())
    dead = PrometheusSource(f"http://127.0.0.1:{_free_port()}", timeout_s=2)
    with pytest.raises(
        TelemetryError,
        match=r"did not answer the query 'max_over_time\(DCGM_FI_DEV_PCIE_LINK_GEN\[3600s\]\)': connection refused",
    ):
        dead.read(datetime.now(UTC) - timedelta(hours=1), run_id="op-4")


def test_a_secured_prometheus_refuses_missing_and_wrong_credentials_with_one_clear_error(secured: Secured) -> None:
    start = secured.scenario.end - timedelta(hours=1)
    anonymous = PrometheusSource(secured.url, verify=secured.ca_file)
    server = re.escape(secured.url)
    with pytest.raises(
        PrometheusAuthError, match=rf"^Prometheus {server} refused the credentials \(none\): HTTP 401 Unauthorized;"
    ):
        anonymous.read(start, secured.scenario.end, run_id="op-5")
    wrong = PrometheusSource(secured.url, basic_auth=(USER, "not-the-password"), verify=secured.ca_file)
    with pytest.raises(
        PrometheusAuthError,
        match=rf"^Prometheus {server} refused the credentials \(basic auth as user 'gpucert'\): HTTP 401",
    ) as refused:
        wrong.read(start, secured.scenario.end, run_id="op-5")
    assert (refused.value.url, refused.value.status) == (secured.url, 401)
    assert isinstance(refused.value, TelemetryError)  # what operate already reports as unreadable telemetry
    assert "not-the-password" not in f"{refused.value} {wrong!r} {wrong}"


def test_the_right_credentials_read_the_secured_window_as_an_open_server_does(secured: Secured) -> None:
    source = PrometheusSource(secured.url, basic_auth=(USER, PASSWORD), verify=secured.ca_file, step_s=STEP)
    read_the_window(source, secured.scenario)


def test_tls_is_checked_against_the_system_cas_a_ca_file_or_not_at_all(secured: Secured, tmp_path: Path) -> None:
    basic = (USER, PASSWORD)
    with pytest.raises(TelemetryError, match=r"did not answer the query 'vector\(1\)': TLS certificate not trusted"):
        PrometheusSource(secured.url, basic_auth=basic).query("vector(1)", time.time())
    for verify in (secured.ca_file, False):
        answer = PrometheusSource(secured.url, basic_auth=basic, verify=verify).query("vector(1)", time.time())
        assert [s.values[0][1] for s in answer] == [1.0]
    with pytest.raises(InputError, match="does not exist"):
        PrometheusSource(secured.url, verify=str(tmp_path / "missing.pem"))
    (tmp_path / "not-a-ca.pem").write_text("not a certificate\n", encoding="utf-8")
    with pytest.raises(InputError, match="cannot be used"):
        PrometheusSource(secured.url, verify=str(tmp_path / "not-a-ca.pem"))


def test_a_bearer_token_and_extra_headers_go_with_every_request_and_never_into_a_message() -> None:
    with bearer_server("s3cret-token") as (url, seen):
        tenant = {"Authorization": "Bearer s3cret-token", "X-Scope-OrgID": "team-a"}
        answer = PrometheusSource(url, headers=tenant).query("up", time.time())
        assert [s.labels for s in answer] == [{"__name__": "up"}]
        assert (seen[-1]["authorization"], seen[-1]["x-scope-orgid"]) == ("Bearer s3cret-token", "team-a")

        wrong = PrometheusSource(url, headers={"Authorization": SecretStr("Bearer wrong-token")})
        with pytest.raises(
            PrometheusAuthError,
            match=r"refused the credentials \(an Authorization header \(Bearer\)\): HTTP 401 Unauthorized",
        ) as refused:
            wrong.read(datetime.now(UTC) - timedelta(hours=1), run_id="op-6")
        other = PrometheusSource(url, headers={**tenant, "X-Scope-OrgID": "other"})
        with pytest.raises(PrometheusAuthError, match=r"the header X-Scope-OrgID\): HTTP 403 Forbidden"):
            other.query("up", time.time())
        # A server that echoes the credentials: scrubbed from the message; a redirect is not followed.
        with pytest.raises(TelemetryError, match=r"HTTP 400: bad_data: \*\*\*$") as echoed:
            PrometheusSource(f"{url}/echo", headers=tenant).query("up", time.time())
        asked = len(seen)
        with pytest.raises(
            TelemetryError, match=r"redirected the query 'up' to http://elsewhere.invalid/api/v1/query \(HTTP 307\)"
        ) as moved:
            PrometheusSource(f"{url}/moved", headers=tenant).query("up", time.time())
        assert len(seen) == asked + 1
    shown = f"{refused.value} {echoed.value} {moved.value} {wrong!r}"
    for secret in ("wrong-token", "s3cret-token", "leaked"):
        assert secret not in shown


def test_what_cannot_be_read_is_an_input_error_that_shows_no_secret(tmp_path: Path) -> None:
    for url in (
        "ftp://prometheus:9090",
        "prometheus:9090",
        "http://",
        "http://prometheus:port",
        "http://gpucert:hunter22@prometheus:9090",
        "gpucert:hunter22@prometheus:9090",
        "https://prometheus:9090/?token=hunter22",
    ):
        with pytest.raises(InputError, match="the Prometheus URL") as bad:
            PrometheusSource(url)
        assert "hunter22" not in str(bad.value), url
    assert PrometheusSource("https://Prometheus.example/prom/").url == "https://Prometheus.example/prom"
    for headers, why in (
        ({"X-Token": "hunter22\r\nX-Evil: 1"}, "line break"),
        ({"X-Token": "hunter22\u2019"}, "Latin-1"),
        ({"Bad Name": "hunter22"}, "not an HTTP header name"),
    ):
        with pytest.raises(InputError, match=why) as bad:
            PrometheusSource("http://p:9090", headers=headers)
        assert "hunter22" not in str(bad.value)
    with pytest.raises(InputError, match="not both"):
        PrometheusSource("http://p:9090", headers={"authorization": "Bearer x"}, basic_auth=(USER, PASSWORD))
    with pytest.raises(InputError, match="RFC 7617"):
        PrometheusSource("http://p:9090", basic_auth=("a:b", PASSWORD))
    with pytest.raises(InputError, match="host_label"):
        PrometheusSource("http://p:9090", "host")
    with pytest.raises(InputError, match="timeout_s must be positive"):
        PrometheusSource("http://p:9090", timeout_s=0)

    # A frozen value: plain and SecretStr secrets are equal, never shown; Prefect's copies keep them.
    source = PrometheusSource("http://p:9090", basic_auth=(USER, PASSWORD), headers={"X-Scope-OrgID": "team-a"})
    same = PrometheusSource(
        "http://p:9090/", basic_auth=(USER, SecretStr(PASSWORD)), headers={"X-Scope-OrgID": SecretStr("team-a")}
    )
    assert source == same
    assert hash(source) == hash(same)
    assert source != dataclasses.replace(source, basic_auth=(USER, "other"))
    assert dataclasses.replace(source, timeout_s=5) == PrometheusSource(
        "http://p:9090", basic_auth=(USER, PASSWORD), headers={"X-Scope-OrgID": "team-a"}, timeout_s=5
    )
    assert repr(source) == (
        "PrometheusSource('http://p:9090', host_label=None, "
        "credentials=\"basic auth as user 'gpucert', the header X-Scope-OrgID\")"
    )
    assert PASSWORD not in f"{source} {source!r}"
    assert "team-a" not in repr(source)


def test_prometheus_scraping_the_simulated_exporters_live(prom_bins: PromBins, tmp_path: Path) -> None:
    with SimCluster(nodes=3, gpus=8, preconfigured=True, seed=9) as sim:
        sim.inject_fault(Fault("pcie_gen4", "gpu-node-00001", gpu=6))
        nodes = list(sim.fleet.node_names)
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": "dcgm",
                    # One target group per node: same address, the node's path (as the exporter
                    # Endpoints' annotation gives it).
                    "static_configs": [
                        {"targets": [f"127.0.0.1:{sim.port}"], "labels": {"__metrics_path__": f"/dcgm/{n}/metrics"}}
                        for n in nodes
                    ],
                }
            ],
        }
        with running_prometheus(prom_bins, tmp_path, config) as url:
            started = datetime.now(UTC)
            source = PrometheusSource(url, step_s=1)

            def gpus_seen() -> int:
                series = source.query("DCGM_FI_DEV_GPU_TEMP", time.time())
                return len({(s.labels.get("hostname"), s.labels.get("gpu")) for s in series})

            # The first sample lands 5–6 s after start (target updates are throttled to 5 s): poll.
            deadline = time.monotonic() + 20
            while gpus_seen() < 24:
                assert time.monotonic() < deadline, "Prometheus never scraped every simulated exporter"
                time.sleep(0.25)
            time.sleep(2.5)  # a few more scrapes, so that counters have a rate
            seen = source.read(
                started - timedelta(seconds=5), run_id="operate-live", expected_gpus=dict.fromkeys(nodes, 8)
            )
    r = seen.results
    assert seen.problems == {}
    assert r[r["metric"] == "pcie_gen"]["gpu_uuid"].nunique() == 24
    assert value(r, "gpu-node-00001", 6, "pcie_gen") == 4
    assert value(r, "gpu-node-00001", 6, "pcie_gen_max") == 5
    assert value(r, "gpu-node-00000", 6, "pcie_gen") == 5
    for node in nodes:
        assert value(r, node, None, "gpu_count") == 8
    uuids = set(r["gpu_uuid"].dropna().astype(str))
    assert uuids == {str(u) for u in sim.fleet.uuids[:24]}
    assert set(r[r["metric"] == "pcie_replays_per_min"]["node"]) == set(nodes)
    verdicts = judge(r, empty_baseline())
    failed = verdicts[verdicts["verdict"] == "fail"]
    assert [(n, int(g)) for n, g in zip(failed["node"], failed["gpu"], strict=True)] == [("gpu-node-00001", 6)]


def test_the_backfill_file_is_openmetrics() -> None:
    text = openmetrics({"DCGM_FI_DEV_GPU_TEMP": [({"gpu": "0", "hostname": "n"}, [(10, 60.0), (25, 61.5)])]})
    assert text.splitlines() == [
        "# TYPE DCGM_FI_DEV_GPU_TEMP gauge",
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",hostname="n"} 60 10',
        'DCGM_FI_DEV_GPU_TEMP{gpu="0",hostname="n"} 61.5 25',
        "# EOF",
    ]


# --- --prometheus on the command line: a URL with its credentials, or a saved block ---------------------


def _cli_options(argv: list[str]) -> Any:
    from gpucert._prometheus_cli import prometheus_options
    from gpucert.cli import _parser

    return prometheus_options(_parser().parse_args(["explain", "ml/train", *argv]))


def test_the_command_line_reads_a_secured_prometheus_with_basic_auth_and_its_ca(
    secured: Secured, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--prometheus-user`` / ``--prometheus-password-file`` / ``--prometheus-ca-file`` against the real
    Prometheus behind TLS and basic auth; the password from the environment too; a wrong one is refused."""
    from gpucert._flowcli import _prometheus

    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n", encoding="utf-8")
    options = _cli_options(
        [
            "--prometheus",
            secured.url,
            "--prometheus-user",
            USER,
            "--prometheus-password-file",
            str(password),
            "--prometheus-ca-file",
            secured.ca_file,
        ]
    )
    block = _prometheus(options)
    assert block.source().query("vector(1)", time.time())[0].values[0][1] == 1.0
    monkeypatch.setenv("GPUCERT_PROMETHEUS_PASSWORD", PASSWORD)
    from_env = _cli_options(
        ["--prometheus", secured.url, "--prometheus-user", USER, "--prometheus-ca-file", secured.ca_file]
    )
    assert _prometheus(from_env).source().query("vector(1)", time.time())
    password.write_text("wrong", encoding="utf-8")
    with pytest.raises(PrometheusAuthError, match=r"basic auth as user 'gpucert'\): HTTP 401"):
        _prometheus(options)
    insecure = _cli_options(["--prometheus", secured.url, "--prometheus-user", USER, "--prometheus-insecure"])
    assert _prometheus(insecure).source().query("vector(1)", time.time())  # TLS unchecked, auth still sent
    with pytest.raises(TelemetryError, match="TLS certificate not trusted"):
        _prometheus(_cli_options(["--prometheus", secured.url, "--prometheus-user", USER]))


def test_the_command_line_sends_a_bearer_token_from_a_file_and_extra_headers(tmp_path: Path) -> None:
    from gpucert._flowcli import _prometheus

    token = tmp_path / "token"
    token.write_text("tok-123\n", encoding="utf-8")
    with bearer_server("tok-123") as (url, seen):
        block = _prometheus(
            _cli_options(
                [
                    "--prometheus",
                    url,
                    "--prometheus-token-file",
                    str(token),
                    "--prometheus-header",
                    "X-Scope-OrgID: team-a",
                ]
            )
        )
        assert seen[-1]["authorization"] == "Bearer tok-123"
        assert seen[-1]["x-scope-orgid"] == "team-a"
        assert "tok-123" not in repr(block.source())
        with pytest.raises(PrometheusAuthError, match="HTTP 403"):
            _prometheus(
                _cli_options(
                    [
                        "--prometheus",
                        url,
                        "--prometheus-token-file",
                        str(token),
                        "--prometheus-header",
                        "X-Scope-OrgID: other",
                    ]
                )
            )


def test_bad_prometheus_options_are_one_clear_input_error(tmp_path: Path) -> None:
    from gpucert._flowcli import _prometheus
    from gpucert.cli import main

    token = tmp_path / "token"
    token.write_text("t", encoding="utf-8")
    cases = {
        ("--prometheus-user", "u"): "--prometheus-user needs a password",
        ("--prometheus-token-file", str(tmp_path / "missing")): "--prometheus-token-file .*missing: cannot be read",
        ("--prometheus-header", "no-separator"): "--prometheus-header no-separator: write 'NAME: VALUE'",
        ("--prometheus-ca-file", str(tmp_path / "ca.pem")): "--prometheus-ca-file .*ca.pem: no such file",
    }
    for extra, message in cases.items():
        with pytest.raises(InputError, match=message):
            _prometheus(_cli_options(["--prometheus", "http://127.0.0.1:9", *extra]))
    with pytest.raises(InputError, match="names a saved block: its credentials and CA are the block's"):
        _prometheus(_cli_options(["--prometheus", "team-prom", "--prometheus-token-file", str(token)]))
    # Without --prometheus the companions are refused by the command line itself (exit 2, one line).
    assert main(["operate", "--prometheus-token-file", str(token)]) == 2


def test_range_answers_cut_from_the_bytes_read_as_the_json_parser_does() -> None:
    """``query_range_arrays`` reads the points straight from Prometheus' bytes; a label value that holds the
    markers (escaped), NaN and infinities read alike, and any other layout (warnings, a histogram series)
    is left to the JSON parser."""
    from gpucert.telemetry._prometheus import _matrix_arrays

    series: list[dict[str, Any]] = [
        {
            "metric": {"__name__": "m", "pod": 'odd},"values":[["x', "gpu": "0"},
            "values": [[1700000000, "1.5"], [1700000015.5, "NaN"], [1700000030, "+Inf"]],
        },
        {"metric": {}, "values": [[1700000000, "-Inf"]]},
    ]
    answer = {"status": "success", "data": {"resultType": "matrix", "result": series}}
    raw = json.dumps(answer, separators=(",", ":")).encode()
    got = _matrix_arrays(raw)
    assert got is not None
    assert [g["metric"] for g in got] == [s["metric"] for s in series]
    times, values = got[0]["values"]
    assert times.tolist() == [1700000000, 1700000015.5, 1700000030]
    assert values[0] == 1.5
    assert np.isnan(values[1])
    assert values[2] == np.inf
    assert got[1]["values"][1].tolist() == [-np.inf]
    empty = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": []}}, separators=(",", ":"))
    assert _matrix_arrays(empty.encode()) == []
    warned = {**answer, "warnings": ["PromQL info: metric might not be a counter"]}
    assert _matrix_arrays(json.dumps(warned, separators=(",", ":")).encode()) is None
    histogram = {
        "status": "success",
        "data": {
            "resultType": "matrix",
            "result": [{"metric": {"a": "1"}, "histograms": [[1, {"count": "1"}]]}, series[1]],
        },
    }
    assert _matrix_arrays(json.dumps(histogram, separators=(",", ":")).encode()) is None
