"""The Prefect blocks: Prefect's standard block checks, and each block reaching what it describes."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import certifi
import pytest
from prefect.blocks.core import Block
from prefect.testing.standard_test_suites import BlockStandardTestSuite
from prefect_aws import AwsCredentials
from prefect_kubernetes.credentials import KubernetesClusterConfig, KubernetesCredentials
from pydantic import SecretStr, ValidationError

from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.prometheus import Prometheus
from gpucert.blocks.store import StoreLocation
from gpucert.blocks.ticketing import Ticketing
from gpucert.errors import InputError, PolicyError
from gpucert.store import StoreNotFound, StoreURIError
from gpucert.telemetry import PrometheusAuthError, PrometheusSource
from gpucert_sim import SimCluster

from .s3servers import ACCESS_KEY, REGION, SECRET_KEY, moto_server, s3_client
from .test_telemetry_prometheus import bearer_server


class TestGpuClusterStandard(BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return GpuCluster


@pytest.fixture(scope="module")
def sim() -> Iterator[SimCluster]:
    with SimCluster(nodes=2, controllers=False) as cluster:
        yield cluster


def test_gpu_cluster_reaches_the_cluster_through_a_kubeconfig_file(sim: SimCluster) -> None:
    kube = GpuCluster(kubeconfig=str(sim.kubeconfig_path)).kube()
    assert len(kube.nodes("nvidia.com/gpu.present=true")) == 2


def test_gpu_cluster_reaches_the_cluster_through_prefect_kubernetes_credentials(sim: SimCluster) -> None:
    config = KubernetesClusterConfig.from_file(sim.kubeconfig_path)
    cluster = GpuCluster(credentials=KubernetesCredentials(cluster_config=config), kubeconfig="/nonexistent")
    assert len(cluster.kube().nodes()) == 2  # the credentials win over the kubeconfig path


def test_gpu_cluster_refuses_a_bad_label_prefix_and_names_a_missing_kubeconfig() -> None:
    with pytest.raises(ValidationError, match="label prefix"):
        GpuCluster(label_prefix="Not A Prefix/")
    with pytest.raises(InputError, match="no such file"):
        GpuCluster(kubeconfig="/nonexistent/kubeconfig").kube()


@pytest.mark.usefixtures("prefect_harness")
def test_gpu_cluster_saves_and_loads(sim: SimCluster) -> None:
    GpuCluster(kubeconfig=str(sim.kubeconfig_path), label_prefix="example.com").save("sim", overwrite=True)
    loaded = GpuCluster.load("sim")
    assert loaded.label_prefix == "example.com"
    assert len(loaded.kube().nodes()) == 2


# --- Prometheus ---------------------------------------------------------------------------------------
# Imported here rather than at the top, so that this section stands apart from the store's.


class TestPrometheusStandard(BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return Prometheus


def test_prometheus_source_carries_the_credentials_and_the_tls_choice() -> None:
    basic = Prometheus(
        url="https://prometheus.example:9090/",
        username="gpucert",
        password=SecretStr("hunter22"),
        headers={"X-Scope-OrgID": SecretStr("team-a")},
        ca_file=certifi.where(),
        timeout_s=5,
        host_label="hostname",
    )
    assert basic.source() == PrometheusSource(
        "https://prometheus.example:9090",
        "hostname",
        headers={"X-Scope-OrgID": "team-a"},
        basic_auth=("gpucert", "hunter22"),
        verify=certifi.where(),
        timeout_s=5,
    )
    bearer = Prometheus(url="http://prometheus:9090", token=SecretStr("s3cret-token"))
    assert bearer.source() == PrometheusSource(
        "http://prometheus:9090", headers={"Authorization": "Bearer s3cret-token"}
    )
    assert bearer.source().verify is True
    unchecked = Prometheus(url="https://prometheus:9090", verify_tls=False, ca_file="/only/on/the/worker.pem")
    assert unchecked.source().verify is False
    for block in (basic, bearer):
        shown = f"{block} {block!r} {block.source()!r}"
        assert "hunter22" not in shown
        assert "s3cret-token" not in shown


def test_prometheus_refuses_what_cannot_work_and_echoes_no_secret() -> None:
    for fields, why in (
        ({"url": "ftp://prometheus:9090"}, "http:// or https://"),
        ({"url": "http://gpucert:hunter22@prometheus:9090"}, "holds credentials"),
        ({"url": "http://p:9090", "username": "gpucert"}, "both a username and a password"),
        ({"url": "http://p:9090", "token": "hunter22", "username": "u", "password": "p"}, "not both"),
        ({"url": "http://p:9090", "token": "hunter22", "headers": {"authorization": "x"}}, "not both"),
        ({"url": "http://p:9090", "headers": {"X-Token": "hunter22\nX-Evil: 1"}}, "line break"),
    ):
        with pytest.raises(ValidationError, match=why) as refused:
            Prometheus(**fields)
        assert "hunter22" not in str(refused.value)
    # The CA file need only exist where the block is used: saved anywhere, refused when it is read.
    elsewhere = Prometheus(url="https://p:9090", ca_file="/nonexistent/ca.pem")
    with pytest.raises(InputError, match="does not exist"):
        elsewhere.source()


def test_prometheus_reaches_a_server_with_its_token_and_headers() -> None:
    with bearer_server("s3cret-token") as (url, seen):
        block = Prometheus(url=url, token=SecretStr("s3cret-token"), headers={"X-Scope-OrgID": SecretStr("team-a")})
        assert [s.labels for s in block.source().query("up", time.time())] == [{"__name__": "up"}]
        assert (seen[-1]["authorization"], seen[-1]["x-scope-orgid"]) == ("Bearer s3cret-token", "team-a")
        with pytest.raises(PrometheusAuthError, match=r"\(an Authorization header \(Bearer\), the header X-Scope"):
            Prometheus(url=url, token=SecretStr("wrong"), headers={"X-Scope-OrgID": SecretStr("a")}).source().query(
                "up", time.time()
            )


@pytest.mark.usefixtures("prefect_harness")
def test_prometheus_saves_and_loads_with_its_secrets() -> None:
    block = Prometheus(
        url="https://prometheus:9090",
        token=SecretStr("s3cret-token"),
        headers={"X-Scope-OrgID": SecretStr("team-a")},
        ca_file=certifi.where(),
        host_label="Hostname",
    )
    block.save("prometheus", overwrite=True)
    loaded = Prometheus.load("prometheus")
    assert isinstance(loaded, Prometheus)  # load is sync-compatible: typed as a coroutine too
    assert loaded.source() == block.source()


# --- the StoreLocation block -----------------------------------------------------------------------
# Imported here rather than at the top, so that this section stands apart from the others.


class TestStoreLocationStandard(BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return StoreLocation


def test_baseline_store_opens_for_reading_only_a_store_that_exists(tmp_path: Path) -> None:
    block = StoreLocation(uri=(tmp_path / "store").as_uri())
    with pytest.raises(StoreNotFound, match=str(tmp_path / "store")) as caught:
        block.open(create=False)
    assert isinstance(caught.value, InputError)
    assert not (tmp_path / "store").exists()
    writer = block.open()  # a writer (the certify flow) may start the store
    key = writer.write_run_file("run-1", date(2026, 12, 1), "report.html", b"<html>")
    assert block.open(create=False).list_runs() == [(date(2026, 12, 1), "run-1")]
    assert writer.link(key) == (tmp_path / "store" / key).as_uri()


def test_baseline_store_passes_its_public_url_down_and_refuses_a_bad_one(tmp_path: Path) -> None:
    block = StoreLocation(uri=tmp_path.as_uri(), public_url="https://reports.example.com/gpucert/")
    key = "runs/date=2026-12-01/run=run-1/report.html"
    assert block.open().link(key) == f"https://reports.example.com/gpucert/{key}"
    with pytest.raises(ValidationError, match="public URL"):
        StoreLocation(uri=tmp_path.as_uri(), public_url="reports.example.com")
    with pytest.raises(StoreURIError, match="gs://bucket"):
        StoreLocation(uri="gs://bucket/gpucert").open()


def test_baseline_store_reaches_s3_with_prefect_aws_credentials_and_links_to_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("moto.server", reason="moto[server] is not installed (the test extra)")
    for name in ("AWS_PROFILE", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "GPUCERT_S3_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    with moto_server() as endpoint:
        s3_client(endpoint).create_bucket(Bucket="gpucert-blocks")
        # As the block is saved from the UI: plain values, validated (the secret becomes a SecretStr).
        credentials = AwsCredentials.model_validate(
            {"aws_access_key_id": ACCESS_KEY, "aws_secret_access_key": SECRET_KEY, "region_name": REGION}
        )
        block = StoreLocation(uri="s3://gpucert-blocks/fleet", credentials=credentials, endpoint_url=endpoint)
        with pytest.raises(StoreNotFound, match="s3://gpucert-blocks/fleet"):
            block.open(create=False)
        key = block.open().write_run_file("run-1", date(2026, 12, 1), "report.html", b"<html>run-1</html>")
        url = block.open(create=False).link(key, expires_s=600)
        assert url.startswith(f"{endpoint}/gpucert-blocks/fleet/runs/")
        with urllib.request.urlopen(url, timeout=30) as answer:
            assert answer.read() == b"<html>run-1</html>"


# --- CertificationPolicy ---------------------------------------------------------------------------------


class TestCertificationPolicyStandard(BlockStandardTestSuite):
    @pytest.fixture
    def block(self) -> type[Block]:
        return CertificationPolicy


def test_a_policy_file_becomes_the_block_and_its_fields_win(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(
        "blast_radius:\n  min_nodes: 5\n  fraction: 0.2\nmetrics:\n  gemm_bf16_tflops:\n    warn_drop_pct: 4.0\n"
    )
    policy = CertificationPolicy.from_file(path, blast_radius_fraction=0.05, repeats=5, escalation={"resets": 3})
    rules = policy.rules()
    assert rules.policy.metrics["gemm_bf16_tflops"].warn_drop_pct == 4.0  # from the file
    assert rules.policy.blast_radius.min_nodes == 5  # the file's, where no field is set
    assert rules.policy.blast_radius.fraction == 0.05  # the field wins over the file
    assert (rules.repeats, rules.escalation.resets, rules.observe_only) == (5, 3, False)
    assert CertificationPolicy(observe_only=True).rules().observe_only


def test_a_bad_policy_names_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("peers:\n  min_nodes: zero\n")
    with pytest.raises(PolicyError, match=r"bad\.yaml: invalid policy: peers\.min_nodes"):
        CertificationPolicy.from_file(path)
    with pytest.raises(PolicyError, match=r"escalation\.resets"):
        CertificationPolicy(escalation={"resets": 0}).rules()


@pytest.mark.usefixtures("prefect_harness")
def test_a_policy_with_its_ticketing_saves_and_loads() -> None:
    policy = CertificationPolicy(
        policy={"observe_only": True},
        max_reruns=1,
        ticketing=Ticketing(backend="jira", server="https://jira.example.com", project="OPS", token="secret-token"),
    )
    policy.save("fleet-policy", overwrite=True)
    loaded = CertificationPolicy.load("fleet-policy")
    assert loaded.rules().observe_only
    assert loaded.rules().max_reruns == 1
    assert loaded.ticketing is not None
    assert loaded.ticketing.token is not None
    assert loaded.ticketing.token.get_secret_value() == "secret-token"


# --- registration -----------------------------------------------------------------------------------------


@pytest.mark.usefixtures("prefect_harness")
def test_prefect_block_register_m_blocks_registers_every_gpucert_block_type() -> None:
    """`prefect block register -m gpucert.blocks` registers all five types, not none (docs/design/operate.md)."""
    import os
    import subprocess
    import sys

    import httpx
    from prefect.settings import PREFECT_API_URL

    api = str(PREFECT_API_URL.value()).rstrip("/")
    env = {**os.environ, "PREFECT_API_URL": api}
    done = subprocess.run(
        [str(Path(sys.executable).with_name("prefect")), "block", "register", "-m", "gpucert.blocks"],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Successfully registered 5 blocks" in " ".join(done.stdout.split()), done.stdout
    for block in (GpuCluster, StoreLocation, Ticketing, CertificationPolicy, Prometheus):
        answer = httpx.get(f"{api}/block_types/slug/{block.get_block_type_slug()}", timeout=10)
        assert answer.status_code == 200, block.__name__
        schemas = httpx.post(
            f"{api}/block_schemas/filter",
            timeout=10,
            json={"block_schema_filter": {"block_type_id": {"any_": [answer.json()["id"]]}}},
        )
        assert schemas.json(), f"{block.__name__}: no schema registered"


def test_the_ticketing_block_takes_the_incident_kind() -> None:
    """An incident ticket has its own Jira issue type and priority: the block must accept the kind, and its
    defaults name every kind gpucert opens."""
    block = Ticketing(
        backend="jira",
        server="https://jira.example.test",
        project="OPS",
        token="t",
        issue_types={"incident": "Incident"},
        priorities={"incident": "Highest"},
    )
    assert block.issue_types == {"incident": "Incident"}
    assert set(Ticketing(backend="local").priorities) == {"remediation", "replacement", "incident"}
    with pytest.raises(ValueError, match="unknown ticket kind"):
        Ticketing(backend="jira", server="https://j.test", project="OPS", token="t", priorities={"outage": "High"})
