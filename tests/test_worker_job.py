"""In the cluster (issue 17, item 5): the kubernetes work pool's base job template
(``templates/worker/kubernetes-pool.json``), the deployments moved onto it as ``prefect.yaml`` says, and the
image they run (``Containerfile``).

The flow run's Job is rendered the way prefect-kubernetes' worker renders it — its own
``KubernetesWorkerJobConfiguration.from_template_and_values`` and ``prepare_for_flow_run`` on a real
``FlowRun``, and on a real Prefect server ``resolve_for_flow_run``, the call the worker makes — validated
against the Kubernetes schemas of every version the compatibility matrix supports, and created on
``gpucert sim`` with the worker's own client (``kubernetes_asyncio``), where its pod runs. The template's
ServiceAccounts are gpucert's two roles as ``templates/stack/rbac.yaml.j2`` renders them. The image cannot
be built here (no container engine), so its statements are checked against the repository.
"""

from __future__ import annotations

import asyncio
import copy
import fnmatch
import itertools
import json
import os
import re
import subprocess
import sys
import tomllib
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import kubernetes
import kubernetes_asyncio
import kubernetes_validate
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from prefect.client.orchestration import PrefectClient, get_client
from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId, WorkPoolFilter, WorkPoolFilterName
from prefect.client.schemas.objects import Flow, FlowRun
from prefect.client.schemas.responses import DeploymentResponse
from prefect.exceptions import PrefectHTTPStatusError
from prefect.server.schemas.actions import validate_base_job_template
from prefect.utilities.schema_tools import ValidationError, is_valid_schema
from prefect.utilities.schema_tools import validate as validate_variables
from prefect_kubernetes.worker import KubernetesWorker, KubernetesWorkerJobConfiguration

from gpucert.kube import connect
from gpucert.stack import StackRequest, load_matrix, node_info, plan_stack, render_stack
from gpucert_sim import STACK_NAMESPACE, SimCluster, kubeconfig_text
from gpucert_sim._rbac import DISCOVERY_RULES, grants_of

from .conftest import eventually

ROOT = Path(__file__).resolve().parent.parent
TEMPLATE = ROOT / "templates" / "worker" / "kubernetes-pool.json"
CONTAINERFILE = ROOT / "Containerfile"
PREFECT = str(Path(sys.executable).with_name("prefect"))
POOL = "gpucert-k8s"
#: Who runs as whom (tests/test_least_privilege.py): configure and onboard-node install the stack.
CONFIGURE_DEPLOYMENTS = frozenset({"configure", "onboard-node"})
#: What prefect-kubernetes requires in the pod spec although they are Job fields (its
#: ``_validate_job_manifest`` refuses a template without them). The API server drops unknown fields with a
#: warning (``fieldValidation`` defaults to Warn); the template also sets both where they belong, in the
#: Job's spec. Only these are removed before the strict schema check.
POD_SPEC_QUIRKS = ("completions", "parallelism")
#: What the image must hold: the package (its links gpucert/flows, … point at the top-level folders) and what
#: installs it.
IMAGE_CONTENTS = ("gpucert", "flows", "tasks", "blocks", "templates", "requirements.lock", "pyproject.toml")
#: The parameters a run needs where its flow has required ones (the rest run on their defaults).
PARAMETERS: dict[str, dict[str, Any]] = {
    "certify-shard": {"run_id": "k8s-1", "day": "2026-12-04", "index": 0, "nodes": {"gpu-node-00000": 8}},
    "onboard-node": {"node": "gpu-node-00000"},
    "release": {"nodes": ["gpu-node-00000"]},
}


def _template() -> dict[str, Any]:
    """The base job template, as ``prefect work-pool create --base-job-template`` reads it (JSON)."""
    return dict(json.loads(TEMPLATE.read_text()))


def _version() -> str:
    """gpucert's version, from pyproject.toml: what the image is tagged with."""
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def _prefect_yaml() -> dict[str, Any]:
    """prefect.yaml with its anchors and merge keys resolved."""
    return dict(yaml.safe_load((ROOT / "prefect.yaml").read_text()))


def _kubernetes_versions() -> list[str]:
    """Every Kubernetes minor the compatibility matrix supports ("1.29", …): the Job must be valid on each."""
    minors: set[int] = set()
    for release in load_matrix().releases:
        low, high = (int(v.split(".")[1]) for v in (release.kubernetes.min, release.kubernetes.max))
        minors.update(range(low, high + 1))
    return [f"1.{minor}" for minor in sorted(minors)]


def _validate(manifest: Mapping[str, Any], version: str) -> None:
    """Validate the Job strictly (no unknown field) for ``version``; raises kubernetes_validate.ValidationError."""
    job = copy.deepcopy(dict(manifest))
    pod_spec = job["spec"]["template"]["spec"]
    # Removed only as prefect-kubernetes puts them there; anything else unknown fails.
    assert all(pod_spec.pop(key) == 1 for key in POD_SPEC_QUIRKS)
    kubernetes_validate.validate(job, version, strict=True)


def _container(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The Job's one container (the worker's ``prefect-job``)."""
    [container] = manifest["spec"]["template"]["spec"]["containers"]
    return dict(container)


def _env(manifest: Mapping[str, Any]) -> dict[str, str]:
    """The flow container's environment, name → value (the worker writes plain values only)."""
    return {item["name"]: item["value"] for item in _container(manifest)["env"]}


def _k8s_pool(deployment: str, definitions: Mapping[str, Any]) -> dict[str, Any]:
    """The work pool prefect.yaml's comment says ``deployment`` switches to."""
    key = "k8s_configure_work_pool" if deployment in CONFIGURE_DEPLOYMENTS else "k8s_work_pool"
    return copy.deepcopy(dict(definitions[key]))


async def _render(values: Mapping[str, Any], deployment: str = "certify") -> tuple[dict[str, Any], FlowRun]:
    """The Job the worker makes for a new run of ``deployment`` whose job variables are ``values``.

    Returns the manifest and the flow run. The client is never called: the template names no block and no
    Prefect variable, the only things ``from_template_and_values`` would resolve through it.
    """
    flow = Flow(name=deployment, labels={})
    deployment_id = uuid.uuid4()
    run = FlowRun(name="quiet-otter", flow_id=flow.id, deployment_id=deployment_id)
    response = DeploymentResponse(
        id=deployment_id, name=deployment, flow_id=flow.id, job_variables=dict(values), labels={}
    )
    configuration = await KubernetesWorkerJobConfiguration.from_template_and_values(
        _template(), dict(values), client=PrefectClient("http://127.0.0.1:9/api")
    )
    configuration.prepare_for_flow_run(run, response, flow)
    return configuration.job_manifest, run


async def _create_as_the_worker(kubeconfig: Path, manifest: Mapping[str, Any]) -> str:
    """Create the Job as prefect-kubernetes' worker does (``kubernetes_asyncio``); returns its name."""
    configuration = kubernetes_asyncio.client.Configuration()
    await kubernetes_asyncio.config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    async with kubernetes_asyncio.client.ApiClient(configuration) as api:
        # The worker passes the manifest as a dict, as here (the stubs say V1Job).
        job = await kubernetes_asyncio.client.BatchV1Api(api).create_namespaced_job(
            manifest["metadata"]["namespace"],
            dict(manifest),  # type: ignore[arg-type]
        )
        return str(job.metadata.name)


@pytest.fixture(scope="module")
def rendered() -> tuple[dict[str, Any], FlowRun]:
    """certify's run on the pool, with the job variables prefect.yaml's ``k8s_pool`` gives it."""
    values = _k8s_pool("certify", _prefect_yaml()["definitions"])["job_variables"]
    return asyncio.run(_render(values))


@pytest.fixture(scope="module")
def rbac() -> list[dict[str, Any]]:
    """gpucert's ServiceAccounts and RBAC objects, rendered as configure renders them."""
    with SimCluster(nodes=1, controllers=False) as sim:
        nodes = connect(sim.kubeconfig_path).nodes()
    matrix = load_matrix()
    plan = plan_stack(
        [node_info(n, matrix.gpu_models) for n in nodes],
        StackRequest(),
        matrix,
        namespace=STACK_NAMESPACE,
        label_prefix="gpucert.io",
    )
    return [dict(m.obj) for m in render_stack(plan) if m.step == "rbac"]


# --- the template -------------------------------------------------------------------------------------------


def test_the_template_is_prefect_kubernetes_own_with_gpucert_defaults() -> None:
    template = _template()
    default = KubernetesWorker.get_default_base_job_template()
    # Every setting the worker reads is templated, and every placeholder is a declared variable (the
    # server's own check, which `prefect work-pool create` meets).
    assert set(template["job_configuration"]) == set(default["job_configuration"])
    assert validate_base_job_template(template) == template
    variables = template["variables"]
    is_valid_schema(variables)
    defaults = {name: spec["default"] for name, spec in variables["properties"].items() if "default" in spec}
    validate_variables(defaults, variables, raise_on_error=True)
    assert defaults["image"] == f"ghcr.io/gpucert/gpucert:{_version()}"
    assert defaults["namespace"] == STACK_NAMESPACE
    assert defaults["service_account_name"] == "gpucert-runtime"
    assert defaults["env"] == {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": "30"}
    resources = {key: defaults[key] for key in ("cpu_request", "cpu_limit", "memory_request", "memory_limit")}
    assert resources == {"cpu_request": "500m", "cpu_limit": None, "memory_request": "1Gi", "memory_limit": "2Gi"}
    # Fixed, not a variable: Prefect retries a run, never a second pod of its Job.
    assert "backoff_limit" not in variables["properties"]
    assert template["job_configuration"]["job_manifest"]["spec"]["backoffLimit"] == 0


def _server_check(job_variables: Mapping[str, Any]) -> None:
    """Check a deployment's job variables as the Prefect server does when it is created (the pool's
    defaults under them, required keys ignored, None allowed where a default exists); raises
    prefect's ValidationError."""
    variables = _template()["variables"]
    defaults = {name: spec["default"] for name, spec in variables["properties"].items() if "default" in spec}
    validate_variables(
        {**defaults, **job_variables},
        variables,
        raise_on_error=True,
        ignore_required=True,
        allow_none_with_default=True,
    )


def test_prefect_yamls_pools_pass_and_an_account_outside_gpucerts_roles_is_refused() -> None:
    definitions = _prefect_yaml()["definitions"]
    for key in ("k8s_work_pool", "k8s_configure_work_pool"):
        _server_check(definitions[key]["job_variables"])
    for wrong in ({"service_account_name": "default"}, {"finished_job_ttl": -1}, {"cpu_request": 1}):
        with pytest.raises(ValidationError):
            _server_check(wrong)


def test_the_pools_service_accounts_are_gpucerts_two_roles(rbac: list[dict[str, Any]]) -> None:
    """Least privilege: a flow run may only be one of the accounts bound to gpucert's roles, in its namespace."""
    accounts = {o["metadata"]["name"]: o for o in rbac if o["kind"] == "ServiceAccount"}
    bound = {
        (s["name"], s["namespace"])
        for o in rbac
        if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
        for s in o["subjects"]
        if s["kind"] == "ServiceAccount"
    }
    variables = _template()["variables"]["properties"]
    allowed = variables["service_account_name"]["enum"]
    assert {(name, variables["namespace"]["default"]) for name in allowed} == bound
    for name in allowed:
        # The flow reaches the API server with this account's token (the in-cluster GpuCluster).
        assert accounts[name].get("automountServiceAccountToken", True) is True
    definitions = _prefect_yaml()["definitions"]
    assert _k8s_pool("configure", definitions)["job_variables"]["service_account_name"] == "gpucert-configure"
    assert "service_account_name" not in _k8s_pool("certify", definitions)["job_variables"]


# --- the Job of a flow run ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", _kubernetes_versions())
def test_the_flow_runs_job_is_valid_kubernetes(rendered: tuple[dict[str, Any], FlowRun], version: str) -> None:
    _validate(rendered[0], version)


def test_the_schema_check_catches_a_bad_job(rendered: tuple[dict[str, Any], FlowRun]) -> None:
    """The check is strict: a misspelt field fails it (the API server would drop it with a warning)."""
    job = copy.deepcopy(rendered[0])
    job["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFS"] = True
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate(job, "1.33")


def test_the_job_runs_the_flow_as_the_pool_says(rendered: tuple[dict[str, Any], FlowRun]) -> None:
    job, run = rendered
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    container = _container(job)
    assert job["metadata"]["namespace"] == STACK_NAMESPACE
    assert (spec["backoffLimit"], spec["ttlSecondsAfterFinished"]) == (0, 86400)
    assert pod["serviceAccountName"] == "gpucert-runtime"
    assert pod["restartPolicy"] == "Never"
    assert container["image"] == f"ghcr.io/gpucert/gpucert:{_version()}"
    assert container["args"] == ["prefect", "flow-run", "execute"]
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
    env = _env(job)
    assert env["PREFECT__FLOW_RUN_ID"] == str(run.id)
    assert env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30"
    # backoffLimit 0 tells the run to reschedule itself when its pod is evicted.
    assert env["PREFECT_FLOW_RUN_EXECUTE_SIGTERM_BEHAVIOR"] == "reschedule"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    # The one writable place, an emptyDir (the image puts PREFECT_HOME there).
    assert container["volumeMounts"] == [{"name": "tmp", "mountPath": "/tmp"}]
    assert pod["volumes"] == [{"name": "tmp", "emptyDir": {"sizeLimit": "1Gi"}}]
    # Never on a node being benchmarked, never holding a GPU (that would make its node busy), and not one of
    # certify's benchmark Jobs, which it lists and deletes by managed-by=gpucert.
    assert "tolerations" not in pod
    assert not any("nvidia.com/gpu" in part for part in container["resources"].values())
    for labels in (job["metadata"]["labels"], job["spec"]["template"]["metadata"]["labels"]):
        assert labels["prefect.io/flow-run-id"] == str(run.id)
        assert labels["app.kubernetes.io/managed-by"] == "prefect"


def test_a_deployments_job_variables_override_the_pools() -> None:
    values = {
        **_k8s_pool("configure", _prefect_yaml()["definitions"])["job_variables"],
        "env": {"GPUCERT_TIMEOUT": "30"},
        "memory_limit": "4Gi",
        "image": "registry.example/gpucert:9",
    }
    job, _ = asyncio.run(_render(values, "configure"))
    container = _container(job)
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "gpucert-configure"
    assert container["image"] == "registry.example/gpucert:9"
    assert container["resources"]["limits"] == {"memory": "4Gi"}
    # A deployment's env is merged over the pool's: the heartbeats stay.
    env = _env(job)
    assert (env["GPUCERT_TIMEOUT"], env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"]) == ("30", "30")


def _as_dict(api: kubernetes.client.ApiClient, obj: Any) -> dict[str, Any]:
    """An official-client model as the API's JSON (camelCase keys), as it was read."""
    return dict(api.sanitize_for_serialization(obj))  # type: ignore[no-untyped-call]


def test_the_worker_creates_the_job_on_the_simulated_cluster_and_its_pod_runs(
    rendered: tuple[dict[str, Any], FlowRun],
) -> None:
    job, run = rendered
    with SimCluster(nodes=1, preconfigured=True) as sim:
        name = asyncio.run(_create_as_the_worker(sim.kubeconfig_path, job))
        api = sim.api_client()
        batch, core = kubernetes.client.BatchV1Api(api), kubernetes.client.CoreV1Api(api)
        back = _as_dict(api, batch.read_namespaced_job(name, STACK_NAMESPACE))
        assert back["metadata"]["name"].startswith("quiet-otter-")
        assert (back["spec"]["backoffLimit"], back["spec"]["ttlSecondsAfterFinished"]) == (0, 86400)
        assert back["spec"]["template"]["spec"]["serviceAccountName"] == "gpucert-runtime"
        assert _container(back)["image"] == f"ghcr.io/gpucert/gpucert:{_version()}"
        assert _container(back)["securityContext"] == _container(job)["securityContext"]

        def finished() -> list[dict[str, Any]] | None:
            pods = core.list_namespaced_pod(STACK_NAMESPACE, label_selector=f"job-name={name}").items
            found = [_as_dict(api, p) for p in pods]
            return found if found and found[0]["status"]["phase"] == "Succeeded" else None

        [pod] = eventually(finished, timeout_s=20)
        assert pod["spec"]["serviceAccountName"] == "gpucert-runtime"
        assert pod["spec"]["securityContext"] == job["spec"]["template"]["spec"]["securityContext"]
        assert pod["metadata"]["labels"]["prefect.io/flow-run-id"] == str(run.id)
        succeeded = eventually(
            lambda: _as_dict(api, batch.read_namespaced_job(name, STACK_NAMESPACE))["status"].get("succeeded")
        )
        assert succeeded == 1


WORKER_RBAC = ROOT / "templates" / "worker" / "worker-rbac.yaml"
WORKER = f"system:serviceaccount:{STACK_NAMESPACE}:prefect-worker"
#: prefect-helm's charts/prefect-worker/templates/role.yaml: what the chart's worker account may do.
HELM_CHART_ROLE = [
    {"apiGroups": [""], "resources": ["pods", "pods/log", "pods/status"], "verbs": ["get", "watch", "list"]},
    {
        "apiGroups": ["batch"],
        "resources": ["jobs"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
]


def test_the_workers_own_account_is_valid_and_no_wider_than_the_prefect_worker_chart_plus_kopfs_events() -> None:
    objects = list(yaml.safe_load_all(WORKER_RBAC.read_text()))
    assert [o["kind"] for o in objects] == ["ServiceAccount", "Role", "RoleBinding"]
    for obj in objects:
        kubernetes_validate.validate(obj, "1.33", strict=True)
        assert obj["metadata"]["namespace"] == STACK_NAMESPACE
    [role] = [o for o in objects if o["kind"] == "Role"]
    for rule in role["rules"]:
        for group, resource, verb in itertools.product(rule["apiGroups"], rule["resources"], rule["verbs"]):
            chart = any(
                group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in HELM_CHART_ROLE
            )
            assert chart or (resource, verb) in {("events", "create"), ("events", "patch")}, (group, resource, verb)


def test_the_worker_creates_and_follows_its_job_as_its_own_account_with_nothing_refused(
    rendered: tuple[dict[str, Any], FlowRun], tmp_path: Path
) -> None:
    job, _ = rendered
    objects = list(yaml.safe_load_all(WORKER_RBAC.read_text()))
    with SimCluster(nodes=1, preconfigured=True) as sim:
        admin = connect(sim.kubeconfig_path)
        for obj in objects:
            admin.apply(obj)
        as_worker = tmp_path / "worker.kubeconfig"
        as_worker.write_text(kubeconfig_text(sim.url, STACK_NAMESPACE, user=WORKER))
        sim.clear_requests()
        name = asyncio.run(_create_as_the_worker(as_worker, job))
        worker = connect(as_worker)
        # What the worker and its observer do next: watch the Job, find its pod, read its status and log.
        pod = eventually(
            lambda: next(
                iter(worker.list_objects("v1", "Pod", namespace=STACK_NAMESPACE, label_selector=f"job-name={name}")),
                None,
            )
        )
        worker.get("batch/v1", "Job", name, namespace=STACK_NAMESPACE)
        worker.pod_log(pod["metadata"]["name"], namespace=STACK_NAMESPACE)
        asked = [r for r in sim.requests if r.user == WORKER]
        assert {(r.verb, r.resource, r.subresource) for r in asked} >= {
            ("create", "jobs", ""),
            ("list", "pods", ""),
            ("get", "jobs", ""),
            ("get", "pods", "log"),
        }
        grants = grants_of(objects, WORKER, extra_cluster_rules=DISCOVERY_RULES)
        refused = [r for r in asked if not grants.allows(r)]
        assert refused == []


# --- the pool and the switched deployments on a real Prefect server -------------------------------------------


def _switched(folder: Path) -> Path:
    """prefect.yaml with every deployment moved to the kubernetes pool as its comment says, each renamed
    ``<name>-k8s``; returns the file written.

    Schedules and triggers are left out: on the session's shared server a second onboard-node trigger would
    start a second onboarding in another test.
    """
    document = _prefect_yaml()
    definitions = document.pop("definitions")
    deployments = []
    for deployment in document["deployments"]:
        pool = _k8s_pool(deployment["name"], definitions)
        pool["work_queue_name"] = deployment["work_pool"]["work_queue_name"]
        switched = {key: value for key, value in deployment.items() if key not in ("schedules", "triggers")}
        switched.update(name=f"{deployment['name']}-k8s", work_pool=pool, pull=definitions["in_image"])
        deployments.append(switched)
    path = folder / "prefect.yaml"
    path.write_text(yaml.safe_dump({**document, "deployments": deployments}, sort_keys=False))
    return path


def _prefect(*args: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PREFECT, "--no-prompt", *args], env=dict(env), cwd=ROOT, capture_output=True, text=True, check=False
    )


@pytest.fixture
def api_env() -> dict[str, str]:
    """The environment of a prefect command against the session's test server."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    assert url, "the Prefect test harness sets PREFECT_API_URL"
    return {**os.environ, "PREFECT_API_URL": str(url), "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1"}


async def _on_the_pool(client: PrefectClient) -> dict[str, DeploymentResponse]:
    """The deployments of the kubernetes pool, by the name prefect.yaml gives them (``-k8s`` dropped)."""
    found = await client.read_deployments(work_pool_filter=WorkPoolFilter(name=WorkPoolFilterName(any_=[POOL])))
    return {d.name.removesuffix("-k8s"): d for d in found}


async def _resolve_every_run() -> dict[str, tuple[DeploymentResponse, KubernetesWorkerJobConfiguration, FlowRun]]:
    """For each deployment on the pool: the deployment as the server holds it, and a new run of it with the
    job configuration the worker makes for that run."""
    answers = {}
    async with get_client() as client:
        pool = await client.read_work_pool(POOL)
        assert pool.type == "kubernetes"
        assert pool.base_job_template == _template()
        for name, deployment in (await _on_the_pool(client)).items():
            run = await client.create_flow_run_from_deployment(deployment.id, parameters=PARAMETERS.get(name, {}))
            # What the worker does with each run it picks up (BaseWorker._submit_run_and_capture_errors).
            configuration = await KubernetesWorkerJobConfiguration.resolve_for_flow_run(
                run, client=client, work_pool=pool, worker_name="in-cluster-worker"
            )
            answers[name] = (deployment, configuration, run)
    return answers


async def _refused_status(job_variables: dict[str, Any]) -> int:
    """The HTTP status with which the server refuses a deployment on the pool with these job variables."""
    async with get_client() as client:
        flow_id = next(iter((await _on_the_pool(client)).values())).flow_id
        with pytest.raises(PrefectHTTPStatusError) as refused:
            await client.create_deployment(flow_id, "wrong-k8s", work_pool_name=POOL, job_variables=job_variables)
        return refused.value.response.status_code


async def _clean_up() -> None:
    """Delete the pool's deployments, their runs and the pool: the session's server is shared."""
    async with get_client() as client:
        for deployment in (await _on_the_pool(client)).values():
            runs = await client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id]))
            )
            for run in runs:
                await client.delete_flow_run(run.id)
            await client.delete_deployment(deployment.id)
        await client.delete_work_pool(POOL)


@pytest.mark.usefixtures("prefect_harness")
def test_every_deployment_moved_to_the_pool_runs_as_its_role_in_the_image(
    api_env: dict[str, str], tmp_path: Path
) -> None:
    created = _prefect(
        "work-pool",
        "create",
        POOL,
        "--type",
        "kubernetes",
        "--base-job-template",
        str(TEMPLATE),
        "--overwrite",
        env=api_env,
    )
    assert created.returncode == 0, created.stdout + created.stderr
    path = _switched(tmp_path)
    try:
        deployed = _prefect("deploy", "--all", "--prefect-file", str(path), env=api_env)
        assert deployed.returncode == 0, deployed.stdout + deployed.stderr
        answers = asyncio.run(_resolve_every_run())
        assert set(answers) == {
            "configure",
            "certify",
            "certify-shard",
            "operate",
            "onboard-node",
            "release",
            "explain-job",
        }
        for name, (deployment, configuration, run) in answers.items():
            job = configuration.job_manifest
            account = "gpucert-configure" if name in CONFIGURE_DEPLOYMENTS else "gpucert-runtime"
            assert job["spec"]["template"]["spec"]["serviceAccountName"] == account, name
            assert _container(job)["image"] == f"ghcr.io/gpucert/gpucert:{_version()}"
            env = _env(job)
            assert env["PREFECT__FLOW_RUN_ID"] == str(run.id)
            assert env["PREFECT_FLOWS_HEARTBEAT_FREQUENCY"] == "30"
            assert configuration.namespace == STACK_NAMESPACE
            _validate(job, "1.33")
            # The run starts in the image's working directory; its entrypoint is a module of the package.
            assert deployment.pull_steps == _prefect_yaml()["definitions"]["in_image"]
            assert _entrypoint_file(str(deployment.entrypoint)).is_file()
        assert answers["certify-shard"][0].work_queue_name == "shards"
        assert asyncio.run(_refused_status({"service_account_name": "default"})) == 422
    finally:
        asyncio.run(_clean_up())


# --- the image --------------------------------------------------------------------------------------------------


def _instructions(text: str) -> list[tuple[str, str]]:
    """A Containerfile's instructions, (KEYWORD, arguments), continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip()) for line in joined.splitlines() if line.strip()
    ]


def _ignored(path: str, patterns: list[str]) -> bool:
    """Whether .dockerignore keeps ``path`` out of the build context: the last pattern matching it or one of
    its parents wins, ``!`` re-including (moby's patternmatcher, as far as these patterns need)."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.lstrip("!").strip("/")
        if any(fnmatch.fnmatchcase(c, glob) or fnmatch.fnmatchcase(c, glob.removeprefix("**/")) for c in candidates):
            ignored = not negated
    return ignored


def test_the_containerfile_builds_what_the_pool_runs(rendered: tuple[dict[str, Any], FlowRun]) -> None:
    steps = _instructions(CONTAINERFILE.read_text())
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # The base image: the tests' Python at a fixed patch release (a digest may follow), in every stage.
    [(_, arg)] = [s for s in steps if s[0] == "ARG" and s[1].startswith("PYTHON_IMAGE=")]
    image = arg.split("=", 1)[1]
    python = rf"{sys.version_info.major}\.{sys.version_info.minor}\.\d+"
    assert re.fullmatch(rf"python:{python}-slim-\w+(@sha256:[0-9a-f]{{64}})?", image), image
    froms = [s[1] for s in steps if s[0] == "FROM"]
    assert [f.split()[0] for f in froms] == ["${PYTHON_IMAGE}"] * 2
    final = steps[max(i for i, s in enumerate(steps) if s[0] == "FROM") :]
    # Every file it copies from the context exists and the context keeps it; the flows' code is among them.
    copied = set()
    for keyword, args in steps:
        if keyword == "COPY" and not args.startswith("--from"):
            *sources, _ = args.split()
            for source in sources:
                assert (ROOT / source).exists(), source
                assert not _ignored(source, patterns), f"{source} is left out by .dockerignore"
                copied.add(source.rstrip("/"))
    assert set(IMAGE_CONTENTS) <= copied
    assert all(_ignored(path, patterns) for path in (".venv/bin/python", "gpucert/__pycache__/x.pyc"))
    # Pinned dependencies: uv at a version, the lock, and nothing else resolved.
    runs = " ".join(args for keyword, args in steps if keyword == "RUN")
    assert re.search(r"uv==\d+\.\d+\.\d+", runs)
    assert "--requirement requirements.lock" in runs
    assert "--no-deps ." in runs
    # The user the pool's securityContext runs as, and the directory its pull step names.
    pod = rendered[0]["spec"]["template"]["spec"]
    [(_, user)] = [s for s in final if s[0] == "USER"]
    assert user == f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}"
    [(_, workdir)] = [s for s in final if s[0] == "WORKDIR"]
    [step] = _prefect_yaml()["definitions"]["in_image"]
    assert workdir == step["prefect.deployments.steps.set_working_directory"]["directory"]
    # Prefect's home is on the emptyDir, the root filesystem being read-only.
    [(_, env)] = [s for s in final if s[0] == "ENV"]
    assert "PREFECT_HOME=/tmp/prefect" in env.split()
    assert "/tmp" in {m["mountPath"] for m in _container(rendered[0])["volumeMounts"]}
    # Its default command is the one the worker gives the pod.
    [(_, cmd)] = [s for s in final if s[0] == "CMD"]
    assert json.loads(cmd) == _container(rendered[0])["args"]
    assert all(_entrypoint_file(d["entrypoint"]).is_file() for d in _prefect_yaml()["deployments"])


def test_the_lock_pins_every_dependency_of_gpucert() -> None:
    lines = [
        line
        for line in (ROOT / "requirements.lock").read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    pins = {}
    for line in lines:
        name, sep, version = line.partition("==")
        assert re.fullmatch(r"[\w.+!-]+", version) if sep else False, f"not an exact pin: {line!r}"
        pins[canonicalize_name(name)] = version
    for text in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not in requirements.lock"
        assert requirement.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} vs {text}"
    # The image's Python: the lock was resolved for the patch release the Containerfile builds on.
    header = (ROOT / "requirements.lock").read_text().splitlines()[1]
    [(_, arg)] = [s for s in _instructions(CONTAINERFILE.read_text()) if s[0] == "ARG"]
    assert f"--python-version {arg.split(':', 1)[1].split('-')[0]}" in header


def test_the_image_and_the_wheel_leave_the_simulator_out() -> None:
    """The simulator is its own distribution (gpucert-sim, sim/): gpucert's wheel finds none of it, the
    product's dependencies are not the simulator's, and the image's context never holds it."""
    from setuptools import find_packages

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = find_packages(str(ROOT), **setuptools["packages"]["find"])
    assert "gpucert" in packages
    # Only gpucert's own packages, none of them the simulator's (its old homes were gpucert's sim and fleet).
    assert all(p == "gpucert" or p.startswith("gpucert.") for p in packages), packages
    assert not [p for p in packages if p.split(".")[-1] in ("sim", "fleet")]
    product = {
        canonicalize_name(Requirement(text).name)
        for text in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    simulator = tomllib.loads((ROOT / "sim" / "pyproject.toml").read_text())["project"]
    assert simulator["name"] == "gpucert-sim"
    own = {canonicalize_name(Requirement(text).name) for text in simulator["dependencies"]} - {"gpucert"}
    assert own == {"aiohttp", "jsonpatch"}
    assert not own & product
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert _ignored("sim/gpucert_sim/__init__.py", patterns)
    assert not (ROOT / "gpucert" / "sim").exists()
    assert not (ROOT / "gpucert" / "fleet").exists()
    assert not (ROOT / "gpucert" / "demo.py").exists()


def _entrypoint_file(entrypoint: str) -> Path:
    """The file of a module-path entrypoint (``gpucert.flows.certify.certify``) in the checkout."""
    module = entrypoint.rpartition(".")[0]
    return ROOT / (module.replace(".", "/") + ".py")


def test_every_template_file_ships_in_the_wheel() -> None:
    """pyproject's package data covers every file of ``templates/`` (the image installs the wheel's copy)."""
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = package_data["gpucert.templates"]
    folder = ROOT / "templates"
    shipped = {p for pattern in globs for p in folder.glob(pattern) if p.is_file()}
    present = {p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    assert sorted(str(p.relative_to(folder)) for p in present - shipped) == []
