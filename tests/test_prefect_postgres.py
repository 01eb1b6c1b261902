"""The Prefect server for real on PostgreSQL (Debian's package), as production runs it: a flow run of
configure recorded there. PostgreSQL is started by the test (initdb, pg_ctl) and stopped after it."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpucert.blocks.cluster import GpuCluster
from gpucert.flows.configure import configure
from gpucert_sim import SimCluster

from .conftest import eventually
from .unavailable import unavailable


def _pg_bin() -> Path | None:
    for base in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (base / "initdb").exists():
            return base
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(args: list[str]) -> list[str]:
    # initdb refuses to run as root (docs/design/testing.md): as root, run it as the postgres user.
    return ["runuser", "-u", "postgres", "--", *args] if os.geteuid() == 0 else args


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    pg = _pg_bin()
    if pg is None:
        unavailable("PostgreSQL is not installed (apt-get install postgresql-15)")
    root = Path(tempfile.mkdtemp(prefix="gpucert-pg-"))
    if os.geteuid() == 0:
        shutil.chown(root, "postgres", "postgres")
    root.chmod(0o700)
    port = _free_port()
    data = root / "data"
    subprocess.run(
        _as_postgres(
            [str(pg / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"]
        ),
        check=True,
        capture_output=True,
    )
    options = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off"
    subprocess.run(
        _as_postgres([str(pg / "pg_ctl"), "-D", str(data), "-l", str(root / "log"), "-w", "-o", options, "start"]),
        check=True,
        capture_output=True,
    )
    try:
        subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "-c", "create database prefect"],
            check=True,
            capture_output=True,
        )
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/prefect"
    finally:
        subprocess.run(
            _as_postgres([str(pg / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
            capture_output=True,
            check=False,
        )
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def prefect_on_postgres(postgres: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = _free_port()
    home = tmp_path_factory.mktemp("prefect-home")
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_DATABASE_CONNECTION_URL": postgres,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
    }
    env.pop("PREFECT_API_URL", None)
    log = (home / "server.log").open("wb")
    server = subprocess.Popen(
        [str(Path(sys.executable).with_name("prefect")), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert server.poll() is None, (home / "server.log").read_text()[-2000:]
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, 15)
        server.wait(timeout=20)
        log.close()


@contextlib.contextmanager
def _event_and_log_workers_of_their_own() -> Iterator[None]:
    """Prefect's event and log workers started inside the block, ended (their queues delivered) with it.

    Each is one per process and reads ``PREFECT_API_URL`` once, when it starts: one started while this
    test points at its own server would send the events and logs of every later test in this pytest
    worker to that server after it stopped, and the harness's teardown drains them without a timeout,
    each send waiting on a dead server (the whole run hung in session teardown when this test happened
    to run first on its worker). So the workers bound to the harness are drained and dropped before the
    block, and those started in it after it.
    """
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    def drained() -> None:
        for service in (EventsWorker, APILogWorker):
            service.drain_all(timeout=30, at_exit=False)

    drained()
    try:
        yield
    finally:
        drained()


@pytest.mark.usefixtures("prefect_harness")  # the server every other test of this process uses
def test_a_flow_run_is_recorded_by_a_prefect_server_on_postgresql(prefect_on_postgres: str) -> None:
    from prefect.events import emit_event
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    with (
        SimCluster(nodes=2) as sim,
        temporary_settings(updates={PREFECT_API_URL: prefect_on_postgres, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
        _event_and_log_workers_of_their_own(),
    ):
        result = configure(cluster=GpuCluster(kubeconfig=str(sim.kubeconfig_path)), rollout_timeout_s=60)
    assert result.gpus_verified == 16
    runs = httpx.post(f"{prefect_on_postgres}/flow_runs/filter", json={}, timeout=10).json()
    assert [(r["name"] != "", r["state"]["type"]) for r in runs] == [(True, "COMPLETED")]
    artifacts = httpx.post(f"{prefect_on_postgres}/artifacts/filter", json={}, timeout=10).json()
    assert "configure-summary" in {a["key"] for a in artifacts}

    # Nothing bound to this test's server is left in the process: the next event reaches the harness's.
    harness, name = str(PREFECT_API_URL.value()).rstrip("/"), "gpucert.test.after-postgresql"
    assert harness != prefect_on_postgres.rstrip("/")
    emit_event(name, resource={"prefect.resource.id": "gpucert.test"})
    eventually(
        lambda: httpx.post(f"{harness}/events/filter", json={"filter": {"event": {"name": [name]}}}, timeout=10).json()[
            "events"
        ],
        timeout_s=30,
    )
