"""The configure flow end to end: the official client over HTTP against ``gpucert sim``, under a real
(temporary) Prefect server. The issue's bars: 64 nodes configured with 8 GPUs each, a second run that
moves no resourceVersion, an incompatible request refused before the first write, a node that never
gets ready named in the failure, injected 500s and 429s ridden out."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucert.blocks.cluster import GpuCluster
from gpucert.cli import main
from gpucert.flows.configure import configure
from gpucert.kube import Kube, connect
from gpucert.stack import ConfigureOutcome, StackConflict, StackNotReady, load_matrix
from gpucert_sim import ApiFaults, SimCluster

from .conftest import eventually

pytestmark = pytest.mark.usefixtures("prefect_harness")

_KINDS = [
    ("v1", "Namespace"),
    ("v1", "ServiceAccount"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("apps/v1", "DaemonSet"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("rbac.authorization.k8s.io/v1", "Role"),
    ("rbac.authorization.k8s.io/v1", "RoleBinding"),
    ("v1", "Node"),
]


def _versions(kube: Kube) -> dict[tuple[str, str, str], str]:
    """Every object configure may touch → its resourceVersion."""
    out = {}
    for api_version, kind in _KINDS:
        for obj in kube.list_objects(api_version, kind):
            meta = obj["metadata"]
            out[(kind, meta.get("namespace") or "", meta["name"])] = meta["resourceVersion"]
    return out


def _store_version(kube: Kube) -> str:
    """The API server's current resourceVersion: it moves on any write anywhere."""
    return str(kube.request("GET", "/api/v1/namespaces", doing="list namespaces")["metadata"]["resourceVersion"])


def _cluster(sim: SimCluster) -> GpuCluster:
    return GpuCluster(kubeconfig=str(sim.kubeconfig_path))


@pytest.fixture(scope="module")
def sim64() -> Iterator[SimCluster]:
    with SimCluster(nodes=64) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def configured(sim64: SimCluster) -> ConfigureOutcome:
    return configure(cluster=_cluster(sim64), rollout_timeout_s=60)


def test_64_nodes_configured_with_8_gpus_each(sim64: SimCluster, configured: ConfigureOutcome) -> None:
    kube = connect(sim64.kubeconfig_path)
    nodes = kube.nodes()
    assert len(nodes) == 64
    assert {n["status"]["allocatable"].get("nvidia.com/gpu") for n in nodes} == {"8"}
    assert isinstance(configured, ConfigureOutcome)
    assert configured.gpus_verified == 64 * 8
    assert configured.drift == ()
    assert configured.reused == ()
    stack = next(iter(configured.stack.values()))
    for node in nodes:
        labels = node["metadata"]["labels"]
        assert labels["gpucert.io/stack"] == "managed"
        assert labels["gpucert.io/stack.release"] == configured.release
        for component, version in stack.items():
            assert labels[f"gpucert.io/stack.{component}"] == version
    daemonsets = kube.list_objects("apps/v1", "DaemonSet", "gpucert-system")
    assert {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in daemonsets} == {
        "driver",
        "container-toolkit",
        "device-plugin",
        "dcgm-exporter",
        "gpu-feature-discovery",
    }
    assert all(d["status"]["numberReady"] == 64 for d in daemonsets)
    managers = {f["manager"] for d in daemonsets for f in d["metadata"].get("managedFields") or ()}
    assert "gpucert" in managers


def test_a_second_run_changes_nothing(sim64: SimCluster, configured: ConfigureOutcome) -> None:
    kube = connect(sim64.kubeconfig_path)
    before, store_before = _versions(kube), _store_version(kube)
    again = configure(cluster=_cluster(sim64), rollout_timeout_s=60)
    assert again.labelled_nodes == ()
    assert _versions(kube) == before
    assert _store_version(kube) == store_before


def test_an_incompatible_request_fails_before_the_first_write() -> None:
    with SimCluster(nodes=4) as sim:
        kube = connect(sim.kubeconfig_path)
        before = _store_version(kube)
        with pytest.raises(StackConflict, match="driver"):
            configure(cluster=_cluster(sim), versions={"driver": "390.157"})
        assert _store_version(kube) == before


def test_a_node_that_never_gets_ready_fails_the_flow_by_name() -> None:
    with SimCluster(nodes=4) as sim:
        stuck = sim.fleet.node_names[2]
        sim.set_node_ready(stuck, False)
        with pytest.raises(StackNotReady, match=stuck) as caught:
            configure(cluster=_cluster(sim), rollout_timeout_s=1.5)
        assert list(caught.value.nodes) == [stuck]
        assert "driver not ready after 1.5 s on 1 of 4 nodes" in str(caught.value)


def test_api_500s_and_429s_are_ridden_out() -> None:
    with SimCluster(nodes=16, faults=ApiFaults(error_rate=0.1, throttle_rate=0.03, retry_after_s=1, seed=3)) as sim:
        result = configure(cluster=_cluster(sim), rollout_timeout_s=60)
        assert result.gpus_verified == 16 * 8
        sim.set_faults(None)
        nodes = connect(sim.kubeconfig_path).nodes()
        assert {n["status"]["allocatable"]["nvidia.com/gpu"] for n in nodes} == {"8"}


def test_a_host_driver_node_gets_no_driver_pod_and_is_reported(tmp_path: Path) -> None:
    with SimCluster(nodes=3) as sim:
        kube = connect(sim.kubeconfig_path)
        host = sim.fleet.node_names[0]
        kube.label_node(
            host, {"nvidia.com/gpu.deploy.driver": "pre-installed", "nvidia.com/cuda.driver-version.full": "570.195.03"}
        )
        result = configure(cluster=_cluster(sim), rollout_timeout_s=30)
        drivers = kube.list_objects("v1", "Pod", "gpucert-system", label_selector="app.kubernetes.io/component=driver")
        assert host not in {p["spec"]["nodeName"] for p in drivers}
        assert len(drivers) == 2
        labels = kube.get("v1", "Node", host)["metadata"]["labels"]
        assert labels["gpucert.io/stack.driver"] == "570.195.03"
        assert "gpucert.io/driver" not in labels
        chosen = result.stack["NVIDIA H200"]["driver"]
        if chosen != "570.195.03":
            assert [d.node for d in result.drift] == [host]


def test_dry_run_renders_everything_and_writes_nothing(tmp_path: Path) -> None:
    with SimCluster(nodes=2) as sim:
        kube = connect(sim.kubeconfig_path)
        before = _store_version(kube)
        result = configure(cluster=_cluster(sim), dry_run_dir=str(tmp_path / "out"))
        assert _store_version(kube) == before
        files = sorted((tmp_path / "out").iterdir())
        assert [f.name for f in files] == sorted(Path(f).name for f in result.dry_run_files)
        kinds = {doc["kind"] for f in files for doc in yaml.safe_load_all(f.read_text()) if doc}
        assert {"Namespace", "DaemonSet", "Service", "ConfigMap", "ClusterRole"} <= kinds
        # The path it takes, said plainly: nothing else runs the stack, so gpucert's own manifests.
        assert result.installer == "gpucert"
        assert result.found[0] == "no NVIDIA GPU Operator (no ClusterPolicy, no operand DaemonSet)"
        assert "Installer: **gpucert**" in result.markdown()


def test_the_gpu_operator_path_is_refused_where_no_operator_runs(capsys: pytest.CaptureFixture[str]) -> None:
    """``--installer gpu-operator`` on a cluster without the operator (the simulator serves no ClusterPolicy
    API at all): exit 2, nothing written; ``--installer gpucert`` installs gpucert's own stack."""
    with SimCluster(nodes=2) as sim:
        kubeconfig = str(sim.kubeconfig_path)
        kube = connect(sim.kubeconfig_path)
        before = _store_version(kube)
        assert main(["configure", "--kubeconfig", kubeconfig, "--installer", "gpu-operator"]) == 2
        assert "--installer gpu-operator refused: no GPU Operator runs the GPU stack" in capsys.readouterr().err
        assert _store_version(kube) == before
        assert main(["configure", "--kubeconfig", kubeconfig, "--installer", "gpucert", "--timeout", "30"]) == 0
        assert "Installer: **gpucert**" in capsys.readouterr().out


def test_command_line_configure(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with SimCluster(nodes=2) as sim:
        kubeconfig = str(sim.kubeconfig_path)
        assert main(["configure", "--kubeconfig", kubeconfig, "--set", "driver"]) == 2
        assert "COMPONENT=VERSION" in capsys.readouterr().err
        assert main(["configure", "--kubeconfig", kubeconfig, "--set", "driver=390.157"]) == 2
        assert "390.157" in capsys.readouterr().err
        assert main(["configure", "--kubeconfig", kubeconfig, "--timeout", "30"]) == 0
        out = capsys.readouterr().out
        assert "# configure: release" in out
        assert "No drift" in out


def test_configure_on_a_preconfigured_cluster_changes_nothing() -> None:
    """``gpucert sim --preconfigured`` seeds exactly what configure applies: a run finds nothing to do."""
    with SimCluster(nodes=6, preconfigured=True) as sim:
        kube = connect(sim.kubeconfig_path)
        settled = eventually(lambda: _settled(kube, ready=6))
        before = _versions(kube)
        result = configure(cluster=_cluster(sim), rollout_timeout_s=30)
        assert result.labelled_nodes == ()
        assert result.drift == ()
        assert _versions(kube) == before
        assert _store_version(kube) == settled


def _settled(kube: Kube, ready: int) -> str | None:
    """The store's version once every stack DaemonSet is Ready on ``ready`` nodes and nothing moves."""
    daemonsets = kube.list_objects("apps/v1", "DaemonSet", "gpucert-system")
    if not daemonsets or any((d.get("status") or {}).get("numberReady") != ready for d in daemonsets):
        return None
    first = _store_version(kube)
    time.sleep(0.3)
    return first if _store_version(kube) == first else None


# --- a run for some nodes follows what the last full configure recorded ---------------------------------

MIRROR = "registry.local:5000/mirror"
#: Not the newest release, a driver the release would not choose, and an operand of another release.
OLDER = "25.10.0"
PINS = {"driver": "570.195.03", "device-plugin": "v0.18.1"}


def _templates(kube: Kube) -> dict[str, tuple[int, list[str]]]:
    """Stack DaemonSet → (generation, its pods' images): a changed template moves the generation."""
    return {
        d["metadata"]["name"]: (
            d["metadata"]["generation"],
            [c["image"] for c in d["spec"]["template"]["spec"]["containers"]],
        )
        for d in kube.list_objects("apps/v1", "DaemonSet", "gpucert-system")
    }


def _images_on(kube: Kube, node: str) -> dict[str, set[str]]:
    """Component → the images its Ready pods run on ``node``."""
    out: dict[str, set[str]] = {}
    for pod in kube.list_objects("v1", "Pod", "gpucert-system"):
        if pod["spec"].get("nodeName") == node:
            component = pod["metadata"]["labels"]["app.kubernetes.io/component"]
            out.setdefault(component, set()).update(c["image"] for c in pod["spec"]["containers"])
    return out


def _run_name(state: Any) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        return client.read_flow_run(state.state_details.flow_run_id).name


def test_a_joined_node_gets_the_fleets_release_registry_and_pins() -> None:
    assert load_matrix().newest_release().name != OLDER
    with SimCluster(nodes=3) as sim:
        kube = connect(sim.kubeconfig_path)
        first = configure(cluster=_cluster(sim), release=OLDER, versions=PINS, registry=MIRROR, rollout_timeout_s=30)
        assert "ConfigMap gpucert-system/gpucert-stack" in first.objects
        record = kube.get("v1", "ConfigMap", "gpucert-stack", "gpucert-system")
        assert record["data"]["release"] == OLDER
        assert record["data"]["registry"] == MIRROR
        assert {k: v for k, v in record["data"].items() if k.startswith("pinned.")} == {
            f"pinned.{c}": v for c, v in PINS.items()
        }
        templates = _templates(kube)
        old_node = sim.fleet.node_names[0]

        [new] = sim.add_nodes(1, uncertified_taint="gpucert.io/uncertified")
        state = configure(cluster=_cluster(sim), nodes=[new], rollout_timeout_s=30, return_state=True)
        joined: ConfigureOutcome = state.result()

        assert joined.reused == ("release", "versions", "registry")
        assert (joined.release, joined.registry, joined.pinned) == (OLDER, MIRROR, PINS)
        assert joined.stack == first.stack
        assert joined.nodes == (new,)
        assert joined.drift == ()
        assert "ConfigMap gpucert-system/gpucert-stack" not in joined.objects  # a node run records nothing
        assert _templates(kube) == templates  # no DaemonSet rolled: the fleet kept its stack
        assert _images_on(kube, new) == _images_on(kube, old_node)
        assert all(i.startswith(MIRROR + "/") for images in _images_on(kube, new).values() for i in images)
        assert kube.get("v1", "ConfigMap", "gpucert-stack", "gpucert-system") == record
        labels = kube.get("v1", "Node", new)["metadata"]["labels"]
        assert labels["gpucert.io/stack.release"] == OLDER
        assert labels["gpucert.io/stack.driver"] == PINS["driver"]
        assert labels["gpucert.io/stack.device-plugin"] == PINS["device-plugin"]
        assert _run_name(state) == f"configure-{new}"
        assert "Taken from the fleet's record (ConfigMap gpucert-stack): release, versions, registry" in (
            joined.markdown()
        )


def test_explicit_arguments_win_over_the_record(tmp_path: Path) -> None:
    with SimCluster(nodes=2) as sim:
        kube = connect(sim.kubeconfig_path)
        configure(cluster=_cluster(sim), release=OLDER, versions=PINS, registry=MIRROR, rollout_timeout_s=30)
        node = sim.fleet.node_names[1]
        before = _store_version(kube)
        other = configure(cluster=_cluster(sim), nodes=[node], registry="mirror.example.com", dry_run_dir=str(tmp_path))
        assert _store_version(kube) == before
        assert other.reused == ("release", "versions")
        assert (other.release, other.registry, other.pinned) == (OLDER, "mirror.example.com", PINS)
        images = [
            c["image"]
            for f in other.dry_run_files
            for doc in yaml.safe_load_all(Path(f).read_text())
            if doc and doc["kind"] == "DaemonSet"
            for c in doc["spec"]["template"]["spec"]["containers"]
        ]
        assert images
        assert all(i.startswith("mirror.example.com/") for i in images)
        assert "gpucert-stack" not in (tmp_path / "01-namespace.yaml").read_text()
        pinned = configure(
            cluster=_cluster(sim), nodes=[node], versions={"driver": "570.211.01"}, dry_run_dir=str(tmp_path)
        )
        assert pinned.reused == ("release", "registry")
        assert pinned.pinned == {"driver": "570.211.01"}  # explicit pins replace the recorded ones whole


def test_a_node_run_with_nothing_recorded_behaves_as_before(tmp_path: Path) -> None:
    with SimCluster(nodes=2) as sim:
        node = sim.fleet.node_names[0]
        state = configure(cluster=_cluster(sim), nodes=[node], dry_run_dir=str(tmp_path), return_state=True)
        result: ConfigureOutcome = state.result()
        assert result.reused == ()
        assert result.release == load_matrix().newest_release().name
        assert (result.registry, result.pinned) == (None, {})
        assert _run_name(state) == f"configure-{node}"
        full = configure(cluster=_cluster(sim), dry_run_dir=str(tmp_path / "full"), return_state=True)
        assert _run_name(full) == "configure-all"
        text = (tmp_path / "full" / "01-namespace.yaml").read_text()
        record = [d for d in yaml.safe_load_all(text) if d and d["kind"] == "ConfigMap"]
        assert [d["metadata"]["name"] for d in record] == ["gpucert-stack"]  # kubectl apply -f DIR records


def test_the_outcome_round_trips_as_json(configured: ConfigureOutcome) -> None:
    # What Prefect persists and `gpucert configure --json` prints.
    assert ConfigureOutcome.model_validate_json(configured.model_dump_json()) == configured
    assert ConfigureOutcome.model_validate(configured.model_dump(mode="json")) == configured
