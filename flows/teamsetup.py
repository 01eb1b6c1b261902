"""``gpucert setup``: a team's Prefect server made ready for gpucert in one go, and again without harm.

The steps, each idempotent:

1. **check** the team file and flags (every field validated as its block would, a bad one named), the
   store (its root reached: a missing bucket fails here) and the cluster (its API server asked);
2. **register** every gpucert block type (``prefect block register -m gpucert.blocks`` does the same);
3. **save** the blocks prefect.yaml's deployments name (``gpucert``, or ``--name``): the GpuCluster (its
   kubeconfig's contents in a prefect-kubernetes ``KubernetesCredentials`` block, so a worker on another
   machine reaches the cluster), the StoreLocation (S3 keys in a prefect-aws ``AwsCredentials`` block),
   the Ticketing when the team has one, and the CertificationPolicy that names it; each overwritten;
4. **create** the deployments' work pools (process pools) where missing;
5. **deploy**: ``prefect deploy --all`` in the project folder (the one holding prefect.yaml);
6. **automate**: automations.yaml's automations, each replacing the one of its name.

This module lives outside ``gpucert/`` because it talks to Prefect throughout; the command line reaches it
through ``gpucert._flowcli`` as it reaches the flows, once its arguments are parsed.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from gpucert._yaml import read_yaml_mapping
from gpucert.blocks import CertificationPolicy, GpuCluster, Prometheus, StoreLocation, Ticketing
from gpucert.errors import InputError

__all__ = ["DEFAULT_NAME", "SetupReport", "TeamFile", "setup_team"]

#: The name prefect.yaml's deployments give every block (``cluster_block: gpucert``, …).
DEFAULT_NAME = "gpucert"
BLOCK_TYPES = (GpuCluster, StoreLocation, Ticketing, CertificationPolicy, Prometheus)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", hide_input_in_errors=True)


class ClusterSection(_Strict):
    """How to reach the cluster (``kubeconfig``, read now and saved in the block) and its conventions."""

    kubeconfig: str | None = None
    context: str | None = None
    label_prefix: str | None = None
    gpu_node_selector: str | None = None
    stack_namespace: str | None = None
    storage_claim: str | None = None
    storage_host_path: str | None = None


class StoreSection(_Strict):
    """The store root, its S3 endpoint and keys (none: boto3's own chain on the worker)."""

    uri: str
    endpoint_url: str | None = None
    public_url: str | None = None
    aws_access_key_id: str | None = None
    aws_secret_access_key: SecretStr | None = None
    region_name: str | None = None


class PolicySection(_Strict):
    """A policy file merged over the defaults, and any of the CertificationPolicy block's fields."""

    model_config = ConfigDict(extra="allow")
    file: str | None = None


class TeamFile(_Strict):
    """The team file ``gpucert setup --file`` reads (every section optional but ``store``; flags win)."""

    name: str = DEFAULT_NAME
    cluster: ClusterSection = Field(default_factory=ClusterSection)
    store: StoreSection | None = None
    ticketing: dict[str, Any] | None = None
    policy: PolicySection = Field(default_factory=PolicySection)


@dataclass
class SetupReport:
    """What ``setup_team`` did, a line a step."""

    lines: list[str] = field(default_factory=list)
    #: Where each line goes as it is said too (the command line prints them as the steps go).
    echo: Callable[[str], None] | None = None

    def say(self, line: str) -> None:
        self.lines.append(line)
        if self.echo is not None:
            self.echo(line)


def read_team_file(path: str | None, overrides: Mapping[str, Mapping[str, Any]]) -> TeamFile:
    """The team file at ``path`` (None: none) with ``overrides`` (section → field → value, None values left
    out) on top; raises ``InputError`` naming the file and field that is wrong."""
    raw: dict[str, Any] = read_yaml_mapping(path, f"--file {path}") if path else {}
    for section, values in overrides.items():
        given = {k: v for k, v in values.items() if v is not None}
        if not given:
            continue
        if section == "name":
            raw["name"] = given["name"]
            continue
        current = raw.get(section)
        raw[section] = {**(current if isinstance(current, dict) else {}), **given}
    where = f"--file {path}" if path else "setup"
    try:
        return TeamFile.model_validate(raw)
    except ValidationError as exc:
        raise InputError(f"{where}: {_first_error(exc)}") from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "value"
    return f"{where}: {err['msg']}"


@dataclass(frozen=True)
class _Blocks:
    """The blocks to save, built and checked before anything is written to the server."""

    cluster: GpuCluster
    store: StoreLocation
    ticketing: Ticketing | None
    policy: CertificationPolicy
    kube_credentials: Any = None
    aws_credentials: Any = None


def build_blocks(team: TeamFile) -> _Blocks:
    """Every block of ``team``, validated; raises ``InputError`` naming the section and field."""
    if team.store is None:
        raise InputError("setup: no store: give --store URI (or a store: section in the team file)")
    cluster_fields = team.cluster.model_dump(exclude_none=True, exclude={"kubeconfig"})
    kube_credentials = None
    if team.cluster.kubeconfig:
        kube_credentials = _kube_credentials(team.cluster.kubeconfig, team.cluster.context)
    aws = None
    if team.store.aws_access_key_id or team.store.aws_secret_access_key:
        from prefect_aws import AwsCredentials

        aws = AwsCredentials(
            aws_access_key_id=team.store.aws_access_key_id,
            aws_secret_access_key=team.store.aws_secret_access_key,
            region_name=team.store.region_name,
        )
    policy_fields = team.policy.model_dump(exclude_none=True, exclude={"file"})
    try:
        cluster = GpuCluster(credentials=kube_credentials, **cluster_fields)
    except ValidationError as exc:
        raise InputError(f"setup: cluster.{_first_error(exc)}") from None
    try:
        store = StoreLocation(
            uri=team.store.uri, credentials=aws, endpoint_url=team.store.endpoint_url, public_url=team.store.public_url
        )
    except ValidationError as exc:
        raise InputError(f"setup: store.{_first_error(exc)}") from None
    try:
        ticketing = Ticketing(**team.ticketing) if team.ticketing else None
    except ValidationError as exc:
        raise InputError(f"setup: ticketing.{_first_error(exc)}") from None
    try:
        policy = CertificationPolicy.from_file(team.policy.file, **policy_fields)
    except ValidationError as exc:
        raise InputError(f"setup: policy.{_first_error(exc)}") from None
    policy.rules()  # a bad key fails now, naming it
    return _Blocks(
        cluster=cluster,
        store=store,
        ticketing=ticketing,
        policy=policy,
        kube_credentials=kube_credentials,
        aws_credentials=aws,
    )


def _kube_credentials(path: str, context: str | None) -> Any:
    """prefect-kubernetes credentials holding the kubeconfig at ``path`` (its ``context``)."""
    from prefect_kubernetes.credentials import KubernetesClusterConfig, KubernetesCredentials

    expanded = Path(path).expanduser()
    read_yaml_mapping(expanded, f"cluster.kubeconfig {path}")  # unreadable or not YAML: named, exit 2
    try:
        config = KubernetesClusterConfig.from_file(expanded, context_name=context)
    except (KeyError, ValueError, TypeError) as exc:
        raise InputError(f"cluster.kubeconfig {path}: not a usable kubeconfig ({exc})") from None
    return KubernetesCredentials(cluster_config=config)


def check_reachable(blocks: _Blocks, *, reach_s: float) -> None:
    """The store's root reached (a missing S3 bucket fails here) and, with a kubeconfig, the cluster's API
    server asked its version; raises the ``InputError``/``StoreError``/``KubeError`` that says which."""
    blocks.store.open(create=True).objects.root_exists()
    if blocks.kube_credentials is not None:
        blocks.cluster.kube().version(within_s=reach_s)


def save_blocks(blocks: _Blocks, name: str, report: SetupReport) -> None:
    """Register every gpucert block type and save ``blocks`` under ``name``, overwriting what is there."""
    for block_type in BLOCK_TYPES:
        block_type.register_type_and_schema()
    report.say(f"registered block types: {', '.join(b.get_block_type_name() for b in BLOCK_TYPES)}")
    if blocks.kube_credentials is not None:
        blocks.kube_credentials.save(name, overwrite=True)  # the cluster names it: saved first, by reference
    if blocks.aws_credentials is not None:
        blocks.aws_credentials.save(name, overwrite=True)
    blocks.cluster.save(name, overwrite=True)
    report.say(f"saved GpuCluster {name!r}: {_described(blocks.cluster.describe())}")
    blocks.store.save(name, overwrite=True)
    report.say(f"saved StoreLocation {name!r}: {blocks.store.uri}")
    policy = blocks.policy
    if blocks.ticketing is not None:
        blocks.ticketing.save(name, overwrite=True)
        report.say(f"saved Ticketing {name!r}: {blocks.ticketing.backend}")
        policy = policy.model_copy(update={"ticketing": blocks.ticketing})
    policy.save(name, overwrite=True)
    tickets = f"tickets to Ticketing {name!r}" if blocks.ticketing is not None else "no ticketing block"
    report.say(f"saved CertificationPolicy {name!r}: {policy.source or 'the shipped defaults'}; {tickets}")


def _described(fields: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in fields.items() if v is not None)


def _project_file(project: Path, name: str) -> dict[str, Any]:
    return read_yaml_mapping(project / name, f"{project / name}")


def pool_names(project: Path) -> list[str]:
    """The work pools prefect.yaml's deployments use, in order of first use."""
    names: list[str] = []
    for deployment in _project_file(project, "prefect.yaml").get("deployments") or []:
        pool = (deployment.get("work_pool") or {}).get("name") if isinstance(deployment, dict) else None
        if pool and pool not in names:
            names.append(str(pool))
    return names


async def ensure_pools(names: list[str], report: SetupReport) -> None:
    """Each work pool in ``names`` created as a process pool where the server has none of that name."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound
    from prefect.workers.process import ProcessWorker

    async with get_client() as client:
        for name in names:
            try:
                pool = await client.read_work_pool(name)
                report.say(f"work pool {name!r}: there already ({pool.type})")
            except ObjectNotFound:
                template = ProcessWorker.get_default_base_job_template()
                await client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template))
                report.say(f"work pool {name!r}: created (process)")


def deploy_all(project: Path, report: SetupReport, *, prefect: str) -> None:
    """``prefect deploy --all`` in ``project``; raises ``InputError`` with its last lines when it fails."""
    done = subprocess.run(
        [prefect, "--no-prompt", "deploy", "--all"],
        cwd=project,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PREFECT_CLI_PROMPT": "false"},
    )
    if done.returncode != 0:
        tail = " | ".join(line.strip() for line in (done.stdout + done.stderr).splitlines()[-6:] if line.strip())
        raise InputError(f"setup: `prefect deploy --all` in {project} failed (exit {done.returncode}): {tail}")
    count = len(_project_file(project, "prefect.yaml").get("deployments") or [])
    report.say(f"deployed {count} deployments from {project / 'prefect.yaml'}")


async def replace_automations(project: Path, report: SetupReport) -> None:
    """automations.yaml's automations created, each replacing any of its name (so a re-run keeps one)."""
    from prefect.client.orchestration import get_client
    from prefect.events.schemas.automations import AutomationCore

    items = _project_file(project, "automations.yaml").get("automations") or []
    try:
        wanted = [AutomationCore.model_validate(item) for item in items]
    except ValidationError as exc:
        raise InputError(f"{project / 'automations.yaml'}: {_first_error(exc)}") from None
    replaced = 0
    async with get_client() as client:
        for automation in wanted:
            for old in await client.read_automations_by_name(automation.name):
                await client.delete_automation(old.id)
                replaced += 1
            await client.create_automation(automation)
    report.say(f"automations: {len(wanted)} from automations.yaml ({replaced} of the same names replaced)")


def _prefect_program() -> str:
    """The ``prefect`` program of this environment (beside this Python), else the one on ``$PATH``."""
    beside = Path(sys.executable).with_name("prefect")
    return str(beside) if beside.is_file() else shutil.which("prefect") or "prefect"


def setup_team(
    team: TeamFile,
    *,
    project: Path,
    deploy: bool = True,
    reach_s: float = 8.0,
    say: Callable[[str], None] | None = None,
) -> SetupReport:
    """Set the team up (see the module docstring); returns what was done. Raises ``InputError`` for a team
    file, flag or project folder that is wrong, before anything is saved."""
    report = SetupReport(echo=say)
    if not (project / "prefect.yaml").is_file():
        raise InputError(f"--project {project}: no prefect.yaml there (the folder of gpucert's checkout or image)")
    blocks = build_blocks(team)
    check_reachable(blocks, reach_s=reach_s)
    save_blocks(blocks, team.name, report)
    if team.name != DEFAULT_NAME:
        report.say(
            f"note: prefect.yaml's deployments name {DEFAULT_NAME!r}; runs must pass "
            f"cluster_block/store_block/policy_block {team.name!r}"
        )
    if deploy:
        asyncio.run(ensure_pools(pool_names(project), report))
        deploy_all(project, report, prefect=_prefect_program())
        asyncio.run(replace_automations(project, report))
    return report
