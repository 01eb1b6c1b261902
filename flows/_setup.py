"""What every lifecycle flow resolves first, the same way: the cluster, the store, the rules, the tickets.

certify, operate, onboard-node and release each take ``cluster``, ``store``, ``policy`` and
``ticketing`` parameters and hand the resolved :class:`Setup` on, so a nightly operate, an onboarding
started through the API and a certify from the UI judge, taint and ticket alike.

Each block may instead be named: ``cluster_block``, ``store_block``, ``policy_block`` and
``ticketing_block`` name saved blocks, loaded when the run starts (a block given whole wins over its
name). prefect.yaml's deployments name the blocks ``gpucert setup`` saves (all called ``gpucert``), so a
deployed run, a scheduled night and an event-started onboarding need no parameter at all, and a block
edited in the UI takes effect at the next run. A deployed run never guesses: with no cluster (nor
``$KUBECONFIG`` in the worker's environment) or no store (nor ``$GPUCERT_STORE``) it fails at once naming
the parameter — never a file store in the worker's working folder, never the worker's in-cluster account
by accident (a GpuCluster block without a kubeconfig says that on purpose). A name that is not saved
fails the same way.

Ticketing, in order: the ``ticketing`` parameter, else the policy's ``Ticketing`` block, else — the
embedded default — local tickets in a ``file://`` store's folder; an S3 store with none of these has no
ticket backend, and runs record the tickets they would open in the store instead (the next run with a
backend opens them).
"""

import os
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from gpucert._memory import return_arrow_memory
from gpucert.audit import AuditLog, AuditRecorder
from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.policy import CertificationPolicy
from gpucert.blocks.store import StoreLocation
from gpucert.blocks.ticketing import Ticketing
from gpucert.certify import BenchmarkSettings, CertificationRules, policy_payload_args
from gpucert.errors import InputError, RunAttemptsExhausted, SetupMissing
from gpucert.kube import Kube
from gpucert.store import BaselineStore as Store
from gpucert.tickets import TicketBackend

__all__ = [
    "MAX_RUN_ATTEMPTS_ENV",
    "RunAttemptsExhausted",
    "Setup",
    "apublish_audit",
    "audit_key",
    "benchmark_settings",
    "certify_run_id",
    "check_attempts",
    "cluster_of",
    "load_named",
    "publish_audit",
    "resolve",
    "run_trigger",
    "store_of",
]


BlockT = TypeVar("BlockT", GpuCluster, StoreLocation, CertificationPolicy, Ticketing)


@dataclass(frozen=True)
class Setup:
    """The resolved parameters of a lifecycle flow."""

    cluster: GpuCluster
    kube: Kube
    store: Store
    #: The blocks as given (or defaulted), to pass on to a sub-flow unchanged.
    store_block: StoreLocation
    policy: CertificationPolicy
    ticketing: Ticketing | None
    rules: CertificationRules
    tickets: TicketBackend | None
    #: Records every change the flow makes (Kubernetes writes, baselines; tickets when told) in the store's
    #: audit trail and as Events; the flow flushes it after each step that changes something.
    audit: AuditRecorder

    @property
    def ticketing_name(self) -> str:
        """The ticket backend in a word (``jira``, ``local``, ``webhook``) or ``not configured``."""
        return self.ticketing.backend if self.ticketing is not None else "not configured"


#: How many times one flow run may start: its first attempt and the re-runs that automations.yaml
#: schedules after a crash (a run whose process dies every time, OOM-killed say, must stop coming back).
MAX_RUN_ATTEMPTS_ENV = "GPUCERT_MAX_RUN_ATTEMPTS"
DEFAULT_MAX_RUN_ATTEMPTS = 3


def check_attempts() -> int:
    """This flow run's attempt: 1 for its first start, more when a crash brought it back (the same flow
    run, so the same run id: it adopts what the last attempt left). Raises :class:`RunAttemptsExhausted`
    past the limit, and ``InputError`` for a limit that is not a positive integer."""
    from prefect.runtime import flow_run

    raw = os.environ.get(MAX_RUN_ATTEMPTS_ENV, "").strip() or str(DEFAULT_MAX_RUN_ATTEMPTS)
    if not raw.isdigit() or int(raw) < 1:
        raise InputError(f"${MAX_RUN_ATTEMPTS_ENV}: {raw!r} is not a positive whole number")
    attempt = max(int(flow_run.run_count or 1), 1)
    if attempt > int(raw):
        raise RunAttemptsExhausted(
            f"flow run {flow_run.name or flow_run.id}: attempt {attempt} of at most {raw} "
            f"(${MAX_RUN_ATTEMPTS_ENV}); it crashed every time — see the earlier attempts' logs"
        )
    return attempt


def resolve(
    cluster: GpuCluster | None,
    store: StoreLocation | None,
    policy: CertificationPolicy | None,
    ticketing: Ticketing | None,
    *,
    observe_only: bool | None = None,
    cluster_block: str | None = None,
    store_block: str | None = None,
    policy_block: str | None = None,
    ticketing_block: str | None = None,
) -> Setup:
    """Resolve a flow's parameters (see the module docstring); ``observe_only`` overrides the policy's;
    ``*_block`` name saved blocks, loaded where the block itself is not given.

    Raises :class:`~gpucert.errors.SetupMissing` for a named block that is not saved and for a deployed
    run with no cluster or store, ``InputError`` for a kubeconfig, store or policy that cannot be used, and
    :class:`RunAttemptsExhausted` for a run that crashed too often (:func:`check_attempts`).
    """
    check_attempts()
    return_arrow_memory()  # a flow process parses a fleet's tables step after step: give their pages back
    cluster = cluster_of(cluster, cluster_block)
    given_store = store_of(store, store_block)
    if policy is None:
        policy = load_named(CertificationPolicy, policy_block, "policy_block") if policy_block else None
    policy = policy or CertificationPolicy()
    if ticketing is None and ticketing_block:
        ticketing = load_named(Ticketing, ticketing_block, "ticketing_block")
    if observe_only is not None:
        policy = policy.model_copy(update={"observe_only": observe_only})
    rules = policy.rules()
    opened = given_store.open(create=True)
    opened.objects.root_exists()  # a missing S3 bucket is an input error now, before any Job starts
    chosen = ticketing or policy.ticketing
    if chosen is None and opened.uri.startswith("file://"):
        chosen = Ticketing(backend="local", path=opened.uri)
    kube = cluster.kube()
    audit = AuditRecorder(AuditLog(opened.objects), run_id=None, trigger=run_trigger()).watch(kube, opened)
    return Setup(
        cluster=cluster,
        kube=kube,
        store=opened,
        store_block=given_store,
        policy=policy,
        ticketing=chosen,
        rules=rules,
        tickets=chosen.open() if chosen is not None else None,
        audit=audit,
    )


def cluster_of(cluster: GpuCluster | None, name: str | None) -> GpuCluster:
    """``cluster``, else the saved GpuCluster block ``name``, else — outside a deployment, or with
    ``$KUBECONFIG`` set in the worker's environment — the default chain. Raises
    :class:`~gpucert.errors.SetupMissing` for a deployed run with none of these (never the worker's
    in-cluster service account by accident) and for a name that is not saved."""
    if cluster is not None:
        return cluster
    if name:
        return load_named(GpuCluster, name, "cluster_block")
    if _deployed() and not os.environ.get("KUBECONFIG"):
        raise SetupMissing(
            "no cluster: a deployed run takes it from the cluster parameter or cluster_block, the name of a "
            "saved GpuCluster block (prefect.yaml names 'gpucert', which `gpucert setup` saves); it never "
            "falls back to the worker's in-cluster service account"
        )
    return GpuCluster()


def store_of(store: StoreLocation | None, name: str | None) -> StoreLocation:
    """``store``, else the saved StoreLocation block ``name``, else — outside a deployment, or with
    ``$GPUCERT_STORE`` set in the worker's environment — :meth:`StoreLocation.default`. Raises
    :class:`~gpucert.errors.SetupMissing` for a deployed run with none of these (never a file store in the
    worker's working folder) and for a name that is not saved."""
    if store is not None:
        return store
    if name:
        return load_named(StoreLocation, name, "store_block")
    if _deployed() and not os.environ.get("GPUCERT_STORE"):
        raise SetupMissing(
            "no store: a deployed run takes it from the store parameter or store_block, the name of a saved "
            "StoreLocation block (prefect.yaml names 'gpucert', which `gpucert setup` saves); it never "
            "writes a file store into the worker's working folder"
        )
    return StoreLocation.default()


def load_named(block_type: type[BlockT], name: str, parameter: str) -> BlockT:
    """The saved ``block_type`` block ``name``; raises :class:`~gpucert.errors.SetupMissing` naming
    ``parameter`` when the Prefect server has none of that name (or it no longer validates)."""
    from prefect.exceptions import ObjectNotFound
    from pydantic import ValidationError

    kind = block_type.get_block_type_name()
    try:
        loaded = block_type.load(name, _sync=True)  # type: ignore[call-arg]  # inside async flows too
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "value"
        raise SetupMissing(
            f"{parameter} {name!r}: the saved {kind} block is not valid: {where}: {first['msg']}"
        ) from None
    except (ObjectNotFound, ValueError):
        raise SetupMissing(
            f"{parameter} {name!r}: no {kind} block of that name is saved on the Prefect server "
            "(`gpucert setup` saves them; or name another)"
        ) from None
    if not isinstance(loaded, block_type):
        raise SetupMissing(f"{parameter} {name!r}: the saved block is a {type(loaded).__name__}, not a {kind}")
    return loaded


def _deployed() -> bool:
    """Whether this flow runs for a deployment (a sub-flow of a deployed run too)."""
    from prefect.runtime import deployment

    return deployment.id is not None


def run_trigger() -> str:
    """What started this flow run, for the audit trail: ``cli`` (the command line sets
    ``$GPUCERT_TRIGGER``), ``schedule`` (a deployment's schedule), ``event`` (an automation: a node's
    join event), ``api`` (the REST API or the UI, which Prefect's open-source server does not tell apart),
    or ``python`` (a flow called in-process, as the demo does). A sub-flow reports its root run's."""
    given = os.environ.get("GPUCERT_TRIGGER", "").strip()
    if given:
        return given
    from prefect.runtime import flow_run

    root = flow_run.root_flow_run_id or flow_run.id
    if not root:
        return "python"
    try:
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as client:
            run = client.read_flow_run(root)
    except Exception:  # the trail must not fail a run over a label: say it is not known
        return "unknown"
    if run.deployment_id is None:
        return "python"
    if run.auto_scheduled:
        return "schedule"
    if run.created_by is not None and run.created_by.type == "AUTOMATION":
        return "event"
    return "api"


def certify_run_id() -> str:
    """The certify run's id: its ``run_id`` parameter, else ``cert-<start, UTC>-<6 hex of the flow run
    id>`` — the same for the flow run's name and inside the flow, and again when a crashed run is retried
    (so it adopts its own Jobs)."""
    from prefect.runtime import flow_run

    given = (flow_run.parameters or {}).get("run_id")
    if given:
        return str(given)
    start = flow_run.scheduled_start_time or datetime.now(UTC)
    suffix = str(flow_run.id or "").replace("-", "")[:6] or secrets.token_hex(3)
    return f"cert-{start.astimezone(UTC):%Y%m%d-%H%M%S}-{suffix}"


def benchmark_settings(
    setup: Setup,
    *,
    image: str | None,
    deadline_s: int,
    pod_annotations: dict[str, str] | None,
    payload_args: list[str] | None,
) -> BenchmarkSettings:
    """The benchmark Job's settings for a flow: the policy's repeats and repeat rule, the cluster's label
    prefix and storage location, the rest as given. Raises ``InputError`` for a value the Job cannot take
    (an unknown payload option, say)."""
    fields: dict[str, Any] = {
        "label_prefix": setup.cluster.label_prefix,
        "repeats": setup.rules.repeats,
        "policy_args": policy_payload_args(setup.rules.policy),
        "deadline_s": deadline_s,
        "pod_annotations": pod_annotations or {},
        "storage_claim": setup.cluster.storage_claim,
        "storage_host_path": setup.cluster.storage_host_path,
        "taint_under_test": not setup.policy.observe_only,
    }
    if image:
        fields["image"] = image
    if payload_args:
        fields["payload_args"] = tuple(payload_args)
    try:
        return BenchmarkSettings(**fields)
    except ValueError as exc:
        raise InputError(f"benchmark settings: {exc}") from None


_AUDIT_ROWS = 500


def audit_key(flow_name: str | None) -> str:
    """The audit artifact's key: one per flow (``gpucert-audit-certify``), the same every run, so that the
    artifact catalogue holds one entry a flow, each run a version of it, not a new key every run."""
    name = "".join(c if c.isalnum() else "-" for c in (flow_name or "run").lower())
    return f"gpucert-audit-{name}"[:100]


def _audit_table(audit: AuditRecorder) -> dict[str, Any]:
    """Flush ``audit``; the table artifact of the run's changes (key :func:`audit_key`, the run named in its
    description), with the trail's head hash, so that the trail can be checked against a record kept
    outside the store."""
    from prefect.runtime import flow_run

    audit.flush()
    rows = [
        {
            "#": e["seq"],
            "action": e["action"],
            "object": f"{e['object']['kind']} {e['object']['name']}",
            "why": str(e.get("why") or "")[:200],
            "hash": str(e["hash"])[:16],
        }
        for e in audit.entries[:_AUDIT_ROWS]
    ]
    last = audit.entries[-1]["hash"] if audit.entries else "none"
    shown = "" if len(audit.entries) <= _AUDIT_ROWS else f" (the first {_AUDIT_ROWS}: `gpucert audit show` has all)"
    return {
        "key": audit_key(flow_run.flow_name),
        "table": rows or [{"#": "", "action": "no changes"}],
        "description": f"run {audit.run_id or flow_run.name or 'unnamed'}: {len(audit.entries)} changes "
        f"recorded{shown}; the trail's head after them: {last}; "
        f"{audit.event_failures} Events not delivered",
    }


def publish_audit(audit: AuditRecorder) -> None:
    """Flush ``audit`` and publish the run's changes as a Prefect table artifact (a sync flow's). The trail
    is in the store by then: a Prefect API that does not answer (a server restart) costs only the artifact."""
    import httpx
    from prefect.artifacts import create_table_artifact

    table = _audit_table(audit)
    try:
        create_table_artifact(**table)
    except (httpx.TransportError, OSError) as exc:
        _artifact_lost(table, exc)


async def apublish_audit(audit: AuditRecorder) -> None:
    """:func:`publish_audit` for an async flow."""
    import httpx
    from prefect.artifacts import acreate_table_artifact

    table = _audit_table(audit)
    try:
        await acreate_table_artifact(**table)
    except (httpx.TransportError, OSError) as exc:
        _artifact_lost(table, exc)


def _artifact_lost(table: dict[str, Any], exc: BaseException) -> None:
    from prefect import get_run_logger

    get_run_logger().warning(
        "the audit artifact %s was not published (the Prefect API did not answer: %s); the trail is in the store: %s",
        table["key"],
        exc,
        table["description"],
    )
