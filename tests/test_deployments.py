"""prefect.yaml's deployments as shipped: each names the saved blocks ``gpucert setup`` saves, by parameters
its flow takes, so a run started with no parameter (the schedule, an event, the UI's "Quick run") works on the
team's cluster, store and policy. Against a real Prefect server, worker, S3 and Jira:
tests/test_production_path.py (one module-scoped set of servers for the deployments' whole day one)."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpucert._flowcli import NamedBlocks, flow_inputs
from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.store import StoreLocation
from gpucert.cli import _parser, main
from gpucert.errors import InputError
from gpucert_sim import SimCluster

ROOT = Path(__file__).resolve().parent.parent
#: Each parameter that names a saved block, and the block it stands for (a parameter of the flow too).
NAMED = {
    "cluster_block": ("cluster", GpuCluster),
    "store_block": ("store", StoreLocation),
    "policy_block": ("policy", CertificationPolicy),
}


def _deployments() -> list[dict[str, Any]]:
    return list(yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"])


def _flow_of(entrypoint: str) -> Any:
    module, _, name = entrypoint.rpartition(".")  # a module path: gpucert.flows.certify.certify
    return getattr(importlib.import_module(module), name)


def test_every_deployment_names_the_saved_cluster_and_store() -> None:
    for deployment in _deployments():
        parameters = deployment.get("parameters") or {}
        assert parameters.get("cluster_block") == "gpucert", deployment["name"]
        assert parameters.get("store_block") == "gpucert", deployment["name"]


def test_each_named_block_is_a_parameter_of_the_flow_beside_the_block_it_names() -> None:
    """enforce_parameter_schema refuses a parameter the flow does not take: each name must be one, and the
    flow must take the block itself too (a run may pass it, which wins over the name)."""
    for deployment in _deployments():
        signature = inspect.signature(_flow_of(deployment["entrypoint"]).fn)
        for name in deployment.get("parameters") or {}:
            assert name in signature.parameters, (deployment["name"], name)
            block, block_type = NAMED[name]
            assert block_type.__name__ in str(signature.parameters[block].annotation), (deployment["name"], block)
            assert signature.parameters[name].default is None  # called in-process, a flow needs no saved block


# --- the command line measures what the deployment does ----------------------------------------------------


@pytest.mark.parametrize("command", ["certify", "operate", "onboard", "release"])
def test_every_certifying_command_takes_the_blocks_or_the_cluster_blocks_fields(command: str) -> None:
    target = ["n1"] if command in ("onboard", "release") else []
    args = _parser().parse_args(
        [
            command,
            *target,
            "--cluster-block",
            "c",
            "--store-block",
            "s",
            "--policy-block",
            "p",
            "--storage-claim",
            "datasets",
            "--storage-host-path",
            "/data",
        ]
    )
    named = NamedBlocks.of(args)
    assert (named.cluster_block, named.store_block, named.policy_block) == ("c", "s", "p")
    assert (named.storage_claim, named.storage_host_path) == ("datasets", "/data")


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ([], "give --store or --store-block NAME"),
        (["--store", "file:///tmp/x", "--store-block", "team"], "--store-block team: give it or --store, not both"),
        (
            ["--store", "file:///tmp/x", "--policy", "p.yaml", "--policy-block", "team"],
            "--policy-block team: give it or --policy, not both",
        ),
        (
            ["--store", "file:///tmp/x", "--cluster-block", "team", "--kubeconfig", "k", "--storage-claim", "d"],
            "--cluster-block team: the block says how to reach the cluster and what to measure; drop --kubeconfig, "
            "--storage-claim",
        ),
    ],
)
def test_a_command_given_a_block_and_what_it_stands_for_is_refused(
    options: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["certify", *options]) == 2
    assert capsys.readouterr().err.strip() == f"gpucert: {says}"


def test_the_storage_location_given_as_options_is_the_clusters(tmp_path: Path) -> None:
    """Without the block, its fields as options: a command certifies storage as the deployment does."""
    with SimCluster(nodes=1, controllers=False) as sim:
        inputs = flow_inputs(
            kubeconfig=str(sim.kubeconfig_path),
            context=None,
            label_prefix="gpucert.io",
            selector="nvidia.com/gpu.present=true",
            store=tmp_path.as_uri(),
            needs_store=True,
            blocks=NamedBlocks(storage_claim="datasets", namespace="gpu-ops"),
        )
    assert inputs.cluster.storage_claim == "datasets"
    assert inputs.cluster.stack_namespace == "gpu-ops"


# --- gpucert setup: its input, checked before anything is saved ------------------------------------------


def test_a_team_file_with_a_wrong_field_is_named_before_anything_is_saved(tmp_path: Path) -> None:
    from gpucert.flows.teamsetup import build_blocks, read_team_file

    team = tmp_path / "team.yaml"
    team.write_text("cluster:\n  kubeconfg: /k\nstore:\n  uri: file:///tmp/s\n")
    with pytest.raises(InputError, match=rf"--file {team}: cluster.kubeconfg: Extra inputs are not permitted"):
        read_team_file(str(team), {})
    with pytest.raises(InputError, match=r"setup: no store: give --store URI"):
        build_blocks(read_team_file(None, {}))
    bad_prefix = read_team_file(None, {"store": {"uri": "file:///tmp/s"}, "cluster": {"label_prefix": "Not A/"}})
    with pytest.raises(InputError, match=r"setup: cluster.label_prefix: "):
        build_blocks(bad_prefix)
    # The options win over the file, field by field.
    team.write_text("store:\n  uri: file:///tmp/s\n  public_url: https://files.example.com\n")
    merged = read_team_file(str(team), {"store": {"uri": "s3://b/p", "public_url": None}})
    assert merged.store is not None
    assert (merged.store.uri, merged.store.public_url) == ("s3://b/p", "https://files.example.com")
