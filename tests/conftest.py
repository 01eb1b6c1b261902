"""Shared fixtures: a generated fleet with baselines built the way ``gpucert baseline build`` builds them.

Building baselines judges five waves, so it is done once per session and shared read-only.
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import pandas as pd
import pytest
from kubernetes import client

from gpucert.baseline import build_baseline
from gpucert.policy import default_policy
from gpucert.store import empty_baseline
from gpucert.verdict import judge
from gpucert_sim.fleet import Fault, Fleet, Wave

T0 = dt.datetime(2026, 11, 1, 2, tzinfo=dt.UTC)


@dataclass(frozen=True)
class Seeded:
    """A fleet and the baseline its first five passing waves built."""

    fleet: Fleet
    baseline: pd.DataFrame

    def night(
        self, faults: Sequence[Fault] = (), *, seed: int = 1000, fleet: Fleet | None = None, **kwargs: object
    ) -> Wave:
        return (fleet or self.fleet).run(
            f"night-{seed}", ts=T0 + dt.timedelta(days=20), seed=seed, faults=list(faults), **kwargs
        )  # type: ignore[arg-type]

    def judge(self, wave: Wave, baseline: pd.DataFrame | None = None, **kwargs: object) -> pd.DataFrame:
        return judge(wave.results, self.baseline if baseline is None else baseline, **kwargs)  # type: ignore[arg-type]


def seed_waves(fleet: Fleet, count: int = 5, *, seed: int = 100) -> pd.DataFrame:
    waves = [fleet.run(f"seed-{i}", ts=T0 + dt.timedelta(days=i), seed=seed + i).results for i in range(count)]
    return pd.concat(waves, ignore_index=True)


@pytest.fixture(scope="session")
def seeded() -> Seeded:
    fleet = Fleet.generate(nodes=24, seed=11)
    baseline, _ = build_baseline(empty_baseline(), seed_waves(fleet), policy=default_policy())
    return Seeded(fleet, baseline)


@pytest.fixture(autouse=True, scope="session")
def default_store_outside_the_checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Flows given no store (configure's audit trail, say) use ``$GPUCERT_STORE``, else ``./gpucert-store``:
    in the tests, a temp dir, never a store in the checkout. A test that sets its own wins."""
    if os.environ.get("GPUCERT_STORE"):
        yield
        return
    os.environ["GPUCERT_STORE"] = str(tmp_path_factory.mktemp("default-store"))
    try:
        yield
    finally:
        os.environ.pop("GPUCERT_STORE", None)


def row(verdicts: pd.DataFrame, node: str, gpu: int | None = None) -> pd.Series:
    """The verdict row of one GPU, or of a node (gpu None)."""
    if gpu is None:
        hit = verdicts[(verdicts["node"] == node) & verdicts["gpu"].isna() & verdicts["peer"].isna()]
    else:
        hit = verdicts[(verdicts["node"] == node) & (verdicts["gpu"] == gpu)]
    assert len(hit) == 1, f"expected one verdict row for {node} {gpu}, got {len(hit)}"
    return hit.iloc[0]


def flagged(verdicts: pd.DataFrame) -> pd.DataFrame:
    entity = verdicts[verdicts["reference_kind"] != "fleet"]
    return entity[entity["verdict"] != "pass"]


def unexpected(verdicts: pd.DataFrame) -> pd.DataFrame:
    """Flagged rows other than UNSTABLE warns.

    The fleet model draws transient bad repeats at the rate of docs/reference/reference-values.md, "Noise
    model", so a night of a few hundred GPUs now and then has two on one result; the engine rightly warns
    "unstable, re-run" there. Rule tests that ask "is anything else flagged?" look past those and only those.
    """
    rows = flagged(verdicts)
    unstable_only = (
        (rows["verdict"] == "warn") & rows["reasons"].str.contains("unstable") & (rows["action"] == "retest")
    )
    return rows[~unstable_only]


T = TypeVar("T")


def stop_process(process: subprocess.Popen[bytes], grace_s: float = 60.0) -> None:
    """SIGTERM ``process`` and wait ``grace_s`` for it (a loaded machine stops a Prefect worker slowly),
    then SIGKILL it: a test's teardown never fails, nor leaves it running, for its slowness."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=grace_s)


def eventually(probe: Callable[[], T | None], timeout_s: float = 5.0) -> T:
    """The first truthy answer of ``probe``, polled; fails the test after ``timeout_s``.

    For the simulated cluster, whose controllers act on their own loop: a test waits for what a real
    cluster would eventually show rather than sleeping a fixed time.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        found = probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s} s: {probe}")
        time.sleep(0.01)


# --- the simulated cluster: client fixtures over a module's own ``sim`` fixture ------------------------
_namespaces = itertools.count()


@pytest.fixture(scope="module")
def api(sim: Any) -> client.ApiClient:
    """The official client, configured for the module's simulated cluster (its ``sim`` fixture)."""
    return sim.api_client()


@pytest.fixture
def core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


@pytest.fixture
def ns(core: client.CoreV1Api) -> Iterator[str]:
    """A fresh namespace for one test, deleted after it."""
    name = f"t{next(_namespaces)}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


# --- Prefect: one test server for the whole run, flow heartbeats off (docs/design/testing.md) ---

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """A temporary Prefect server (SQLite) for flow tests; request it with ``usefixtures``.

    Heartbeats are turned off in code (the setting cannot be None from the environment): each one
    joins a thread on exit and adds about a second to every flow call.
    """
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, PREFECT_SERVER_DATABASE_TIMEOUT, temporary_settings
    from prefect.testing.utilities import prefect_test_harness

    # The server is SQLite: on a loaded 2-core machine a write can wait on another past the default 10 s
    # and fail with "database is locked" (a 500 to a flow). The server takes its settings from here.
    with (
        temporary_settings(updates={PREFECT_SERVER_DATABASE_TIMEOUT: 60.0}),
        prefect_test_harness(server_startup_timeout=60),
        temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}),
    ):
        yield


# --- the two tiers: `make check` runs the tests that need no server, `make test` and CI run them all ---------

#: Modules whose tests start a real part: the Kubernetes control plane, S3 (SeaweedFS, moto's server),
#: Prometheus, PostgreSQL, chromium, kubectl, the GPU Operator, processes of the benchmark payload (torch, gloo,
#: MPI stand-ins), a Prefect server for the demo, or whose point is a deadline measured in seconds. Beyond
#: these, a test that asks for a Prefect server (``prefect_harness``) or a simulated cluster (a ``sim``
#: fixture) is end-to-end wherever it lives.
END_TO_END_MODULES = frozenset(
    {
        "test_audit",
        "test_baseline",
        "test_bench",
        "test_certificate",
        "test_conformance",
        "test_deadlines",
        "test_demo_lifecycle",
        "test_explain_act",
        "test_explain_e2e",
        "test_explain_job_signals",
        "test_explain_labels",
        "test_explain_target",
        "test_exporter_sources",
        "test_fault_matrix",
        "test_gpu_operator",
        "test_hostile_input",
        "test_kube_watch",
        "test_least_privilege",
        "test_leases",
        "test_pair_bench",
        "test_prefect_postgres",
        "test_production_path",
        "test_real_control_plane",
        "test_report_browser",
        "test_secrets",
        "test_sim_attach",
        "test_sim_inject",
        "test_sim_kubectl",
        "test_sim_training",
        "test_stack_operator",
        "test_store_contract",
        "test_store_s3",
        "test_telemetry_prometheus",
        "test_tickets_production",
    }
)
#: Fixtures that start a server for the test that asks for them.
END_TO_END_FIXTURES = frozenset({"prefect_harness", "sim"})


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.module.__name__.rsplit(".", 1)[-1] if isinstance(item, pytest.Function) else ""
        fixtures = set(getattr(item, "fixturenames", ()))
        if module in END_TO_END_MODULES or fixtures & END_TO_END_FIXTURES:
            item.add_marker(pytest.mark.e2e)
    items[:] = _longest_first(items, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))


def _longest_first(items: list[pytest.Item], workers: int) -> list[pytest.Item]:
    """The end-to-end tests before the quick ones (a stable sort: each module's order kept), and each of the
    few :data:`LONGEST` tests at the head of a worker's share: pytest-xdist's worksteal hands each worker a
    contiguous share and steals from its tail, so a long test at a share's head starts at once and never
    runs alone at the end while the other workers are idle."""
    longest = [i for i in items if i.nodeid.startswith(LONGEST)]
    ordered = sorted(
        (i for i in items if not i.nodeid.startswith(LONGEST)), key=lambda i: not i.get_closest_marker("e2e")
    )
    share = len(items) // max(workers, 1)
    heads = (
        sorted(((k % workers) * share + k // workers, item) for k, item in enumerate(longest)) if workers > 1 else []
    )
    for position, item in heads or enumerate(longest):
        ordered.insert(position, item)
    return ordered


#: The slowest tests (over 30 s each on 2 cores), from the `--durations` of CI logs: a stale entry only orders
#: worse.
LONGEST = (
    "tests/test_fault_matrix.py::test_a_killed_workers_run_is_brought_back_by_prefect",
    "tests/test_least_privilege.py::test_each_flow_asks_only_what_its_role_grants_and_uses_all_it_grants[real]",
    "tests/test_real_control_plane.py::test_a_join_through_a_restart_is_onboarded_and_a_repair_released_on_both",
    "tests/test_production_path.py::test_nightly_operate_on_s3_and_jira_opens_escalates_and_resolves_tickets",
    "tests/test_demo_lifecycle.py::test_the_lifecycle_demo_runs_and_catches_every_injected_fault",
)
