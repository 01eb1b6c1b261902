"""A real Kubernetes control plane for the tests: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

The simulator (``gpucert sim``) is our model of the API; this is the thing itself, the oracle the model and
gpucert's Kubernetes paths are checked against. The binaries come from a folder named by
``$KUBEBUILDER_ASSETS`` (controller-runtime's envtest convention; ``.ci/run`` unpacks the ``k8s/`` folder of
the tests' assets, :data:`tests.assets.ASSETS`, into a cache and sets it). Without it, :func:`assets` tries
that cache and then that ``k8s/`` folder itself (unpacking once, ~3 s); a test whose control plane cannot
start fails in CI (``CI=true``) and is skipped with the reason elsewhere.

Everything listens on loopback ports picked free at start; every process is stopped by its PID. The API
server runs with RBAC (``--authorization-mode=Node,RBAC``) and an audit log of every request (user, verb,
resource, response code) that :meth:`ControlPlane.audit` reads back. Certificates are made fresh for each
plane (EC P-256, a second): one CA signs the serving certificate, the admin's (``system:masters``), the
controllers' and the scheduler's client certificates, and the client certificate the API server shows
kubelets.

Nothing here runs a kubelet: :mod:`gpucert_sim` attaches its simulated kubelets to this API server
(``gpucert sim kubelets``), which keep the GPU nodes Ready and run their pods.
"""

from __future__ import annotations

import datetime as dt
import json
import lzma
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from .assets import ASSETS
from .s3servers import free_ports

__all__ = ["ASSETS_ENV", "BINARIES", "ControlPlane", "ControlPlaneUnavailable", "assets"]

ASSETS_ENV = "KUBEBUILDER_ASSETS"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
#: The packed binaries among the tests' assets (tests/assets.py), and where they are unpacked once.
SHARED = ASSETS / "k8s"
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpucert" / "k8s-v1.36.2"
_HOST = "127.0.0.1"
_START_TIMEOUT_S = 90.0
#: Every request, its user, verb, resource and response code; no bodies (the log stays small).
_AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
"""


class ControlPlaneUnavailable(RuntimeError):
    """The binaries are missing or a component did not come up; the message says which and why."""


def assets() -> Path:
    """The folder of the four binaries: ``$KUBEBUILDER_ASSETS``, else the cache, else :data:`SHARED`
    unpacked into the cache. Raises :class:`ControlPlaneUnavailable` naming what is missing."""
    named = os.environ.get(ASSETS_ENV)
    if named:
        folder = Path(named)
        missing = [b for b in BINARIES if not os.access(folder / b, os.X_OK)]
        if missing:
            raise ControlPlaneUnavailable(f"${ASSETS_ENV}={folder}: no executable {', '.join(missing)}")
        return folder
    if all(os.access(CACHE / b, os.X_OK) for b in BINARIES):
        return CACHE
    if not all((SHARED / f"{b}.xz").is_file() for b in BINARIES):
        raise ControlPlaneUnavailable(f"no ${ASSETS_ENV}, no {CACHE} and no {SHARED}/*.xz")
    CACHE.mkdir(parents=True, exist_ok=True)
    for binary in BINARIES:
        if os.access(CACHE / binary, os.X_OK):
            continue
        # Unpacked beside, then renamed: a concurrent test process never runs a half-written binary.
        part = CACHE / f".{binary}.{os.getpid()}"
        with lzma.open(SHARED / f"{binary}.xz") as src, part.open("wb") as dst:
            shutil.copyfileobj(src, dst, length=1 << 20)
        part.chmod(0o755)
        part.replace(CACHE / binary)
    return CACHE


# --- certificates -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Pair:
    cert: Path
    key: Path


class _Pki:
    """One CA and the certificates it signs, written under ``folder``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpucert-test-ca")])
        now = dt.datetime.now(dt.UTC)
        self._ca = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    key_cert_sign=True,
                    crl_sign=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(self._key, hashes.SHA256())
        )
        self.ca = folder / "ca.crt"
        self.ca.write_bytes(self._ca.public_bytes(serialization.Encoding.PEM))

    def issue(self, name: str, common_name: str, *, groups: Sequence[str] = (), server: bool = False) -> _Pair:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
        subject += [x509.NameAttribute(NameOID.ORGANIZATION_NAME, g) for g in groups]
        now = dt.datetime.now(dt.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(subject))
            .issuer_name(self._ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(hours=1))
            .not_valid_after(now + dt.timedelta(days=2))
            .add_extension(
                x509.ExtendedKeyUsage(
                    [x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            import ipaddress

            names: list[x509.GeneralName] = [
                x509.DNSName(n)
                for n in (
                    "localhost",
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                )
            ]
            names += [x509.IPAddress(ipaddress.ip_address(a)) for a in (_HOST, "10.0.0.1")]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        cert = builder.sign(self._key, hashes.SHA256())
        pair = _Pair(self.folder / f"{name}.crt", self.folder / f"{name}.key")
        pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        pair.key.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return pair


def _service_account_keys(folder: Path) -> _Pair:
    key = ec.generate_private_key(ec.SECP256R1())
    pair = _Pair(folder / "sa.pub", folder / "sa.key")
    pair.key.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    pair.cert.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pair


def kubeconfig_text(
    server: str,
    ca: Path,
    *,
    cert: Path | None = None,
    key: Path | None = None,
    token: str | None = None,
    namespace: str = "default",
) -> str:
    """A kubeconfig for ``server``: a client certificate, or a bearer token."""
    user: dict[str, Any] = {"token": token} if token else {"client-certificate": str(cert), "client-key": str(key)}
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "current-context": "real",
            "clusters": [{"name": "real", "cluster": {"server": server, "certificate-authority": str(ca)}}],
            "users": [{"name": "real", "user": user}],
            "contexts": [{"name": "real", "context": {"cluster": "real", "user": "real", "namespace": namespace}}],
        },
        indent=2,
    )


# --- the plane ----------------------------------------------------------------------------------------


class ControlPlane:
    """etcd, kube-apiserver, kube-controller-manager and kube-scheduler on loopback; a context manager.

    ``admin_kubeconfig`` is ``system:masters``; :meth:`kubeconfig_for` writes one for a ServiceAccount
    (a TokenRequest token). ``audit_log`` holds one JSON event per request.
    """

    def __init__(self, folder: Path | None = None, *, binaries: Path | None = None) -> None:
        self._own_tmp = tempfile.TemporaryDirectory(prefix="gpucert-k8s-") if folder is None else None
        self.folder = Path(self._own_tmp.name) if self._own_tmp else folder  # type: ignore[assignment]
        self.binaries = binaries
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._argv: dict[str, list[str]] = {}
        self.port = 0
        self.url = ""
        self.audit_log = self.folder / "audit.log"
        self.admin_kubeconfig = self.folder / "admin.kubeconfig"
        self.pki: _Pki | None = None
        self.started_s = 0.0

    # --- life ---------------------------------------------------------------------------------------

    def start(self) -> ControlPlane:
        began = time.monotonic()
        bins = self.binaries or assets()
        try:
            self._start(bins)
        except BaseException:
            self.stop()
            raise
        self.started_s = time.monotonic() - began
        return self

    def _start(self, bins: Path) -> None:
        f = self.folder
        pki = self.pki = _Pki(f)
        serving = pki.issue("apiserver", "kube-apiserver", server=True)
        admin = pki.issue("admin", "gpucert-test-admin", groups=["system:masters"])
        kcm = pki.issue("controller-manager", "system:kube-controller-manager")
        scheduler = pki.issue("scheduler", "system:kube-scheduler")
        kubelet_client = pki.issue(
            "apiserver-kubelet-client", "kube-apiserver-kubelet-client", groups=["kubeadm:cluster-admins"]
        )
        sa = _service_account_keys(f)
        (f / "audit-policy.yaml").write_text(_AUDIT_POLICY)

        # Held open together until all three are chosen: three different ports.
        etcd_port, peer_port, self.port = free_ports(3)
        self.url = f"https://{_HOST}:{self.port}"
        self._spawn(
            "etcd",
            [
                str(bins / "etcd"),
                "--data-dir",
                str(f / "etcd"),
                "--name",
                "gpucert-test",
                "--listen-client-urls",
                f"http://{_HOST}:{etcd_port}",
                "--listen-peer-urls",
                f"http://{_HOST}:{peer_port}",
                "--unsafe-no-fsync",
                "--log-level",
                "error",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                "--etcd-servers",
                f"http://{_HOST}:{etcd_port}",
                "--bind-address",
                _HOST,
                "--advertise-address",
                _HOST,
                "--secure-port",
                str(self.port),
                "--tls-cert-file",
                str(serving.cert),
                "--tls-private-key-file",
                str(serving.key),
                "--client-ca-file",
                str(pki.ca),
                "--service-account-key-file",
                str(sa.cert),
                "--service-account-signing-key-file",
                str(sa.key),
                "--service-account-issuer",
                "https://kubernetes.default.svc.cluster.local",
                "--authorization-mode",
                "Node,RBAC",
                "--service-cluster-ip-range",
                "10.0.0.0/24",
                "--kubelet-client-certificate",
                str(kubelet_client.cert),
                "--kubelet-client-key",
                str(kubelet_client.key),
                "--kubelet-preferred-address-types",
                "InternalIP",
                "--audit-policy-file",
                str(f / "audit-policy.yaml"),
                "--audit-log-path",
                str(self.audit_log),
                "--audit-log-mode",
                "blocking",
                "--audit-log-format",
                "json",
                # The one API server of the plane answers on loopback: no Endpoints of it to reconcile.
                "--endpoint-reconciler-type",
                "none",
                "--allow-privileged",
                "--profiling=false",
                "--v",
                "1",
            ],
        )
        self._write_kubeconfig(self.admin_kubeconfig, cert=admin.cert, key=admin.key)
        self._wait_ready()
        kcm_config = f / "controller-manager.kubeconfig"
        self._write_kubeconfig(kcm_config, cert=kcm.cert, key=kcm.key)
        self._spawn(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                "--kubeconfig",
                str(kcm_config),
                "--authentication-kubeconfig",
                str(kcm_config),
                "--authorization-kubeconfig",
                str(kcm_config),
                "--use-service-account-credentials",
                "--service-account-private-key-file",
                str(sa.key),
                "--root-ca-file",
                str(pki.ca),
                "--leader-elect=false",
                "--secure-port",
                "0",
                "--controllers",
                "*,-nodeipam,-route,-service,-cloud-node-lifecycle",
                "--v",
                "1",
            ],
        )
        scheduler_config = f / "scheduler.kubeconfig"
        self._write_kubeconfig(scheduler_config, cert=scheduler.cert, key=scheduler.key)
        self._spawn(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                "--kubeconfig",
                str(scheduler_config),
                "--authentication-kubeconfig",
                str(scheduler_config),
                "--authorization-kubeconfig",
                str(scheduler_config),
                "--leader-elect=false",
                "--secure-port",
                "0",
                "--v",
                "1",
            ],
        )
        self._wait_for_default_service_account()

    def stop(self) -> None:
        """Stop every process by its PID (SIGTERM, then SIGKILL after 5 s), the API server's clients first."""
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.terminate()
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=5)
        if self._own_tmp is not None:
            self._own_tmp.cleanup()

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- use ----------------------------------------------------------------------------------------

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(
            config_file=str(kubeconfig or self.admin_kubeconfig),  # type: ignore[no-untyped-call]
            client_configuration=configuration,
        )
        return client.ApiClient(configuration)

    def kubeconfig_for(self, namespace: str, service_account: str, path: Path, *, expiration_s: int = 3600) -> Path:
        """A kubeconfig authenticating as ServiceAccount ``namespace/service_account`` with a token from the
        TokenRequest API (the ServiceAccount must exist)."""
        from kubernetes import client

        with self.api_client() as api:
            answer = client.CoreV1Api(api).create_namespaced_service_account_token(
                service_account, namespace, {"spec": {"audiences": [], "expirationSeconds": expiration_s}}
            )
        assert self.pki is not None
        path.write_text(kubeconfig_text(self.url, self.pki.ca, token=answer.status.token, namespace=namespace))
        return path

    def audit(self) -> list[dict[str, Any]]:
        """Every audit event written so far (ResponseComplete and Panic stages), oldest first."""
        if not self.audit_log.exists():
            return []
        return [json.loads(line) for line in self.audit_log.read_text().splitlines() if line.strip()]

    def alive(self) -> dict[str, bool]:
        return {name: p.poll() is None for name, p in self.processes.items()}

    # --- details ------------------------------------------------------------------------------------

    def restart_apiserver(self, down_s: float = 0.0) -> None:
        """Stop kube-apiserver (SIGTERM, as a rolling restart does), keep it down ``down_s`` seconds (its port
        refusing connections), start it again with the same flags and wait until it is ready; etcd, and so
        every object, stays."""
        process = self.processes.pop("kube-apiserver")
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:  # open watches can hold a graceful stop; a kubelet's grace ends too
            process.kill()
            process.wait(timeout=10)
        time.sleep(down_s)
        self._spawn("kube-apiserver", self._argv["kube-apiserver"])
        self._wait_ready()

    def _spawn(self, name: str, argv: list[str]) -> None:
        self._argv[name] = argv
        log = (self.folder / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=self.folder
        )

    def _write_kubeconfig(self, path: Path, *, cert: Path, key: Path) -> None:
        assert self.pki is not None
        path.write_text(kubeconfig_text(self.url, self.pki.ca, cert=cert, key=key))

    def _context(self) -> ssl.SSLContext:
        assert self.pki is not None
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(str(self.folder / "admin.crt"), str(self.folder / "admin.key"))
        return context

    def _get(self, path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(self.url + path, context=self._context(), timeout=5) as answer:
                return int(answer.status), answer.read()
        except urllib.error.HTTPError as exc:
            return int(exc.code), exc.read()

    def _wait(self, what: str, probe: Any) -> None:
        deadline = time.monotonic() + _START_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            dead = [n for n, p in self.processes.items() if p.poll() is not None]
            if dead:
                tail = (self.folder / f"{dead[0]}.log").read_text(errors="replace")[-2000:]
                raise ControlPlaneUnavailable(f"{dead[0]} exited ({self.processes[dead[0]].returncode}):\n{tail}")
            try:
                if probe():
                    return
            except OSError as exc:
                last = str(exc)
            time.sleep(0.1)
        raise ControlPlaneUnavailable(f"{what} not within {_START_TIMEOUT_S:.0f} s ({last})")

    def _wait_ready(self) -> None:
        self._wait("kube-apiserver /readyz", lambda: self._get("/readyz")[0] == 200)

    def _wait_for_default_service_account(self) -> None:
        # The ServiceAccount admission plugin refuses pods in a namespace before the controller-manager has
        # made its "default" ServiceAccount: wait for it, so the first test's Job is not refused.
        self._wait(
            "the default ServiceAccount",
            lambda: self._get("/api/v1/namespaces/default/serviceaccounts/default")[0] == 200,
        )
