"""The commands that run a lifecycle flow once, locally: the command line's one door to Prefect.

Prefect is imported only here and only once a command was parsed, so ``gpucert compare`` and the rest start
without it. Without ``PREFECT_API_URL`` Prefect runs the flow against a temporary local server; with it, the
run shows up in that server's UI like a deployment's.

Every input is checked, and every endpoint asked once (the API server's ``/version``, an ``s3://`` store's
listing, one ``--prometheus`` query, each within :data:`REACH_S`), before anything starts: a typo is one
line and exit 2, an endpoint down or hung fails in seconds (exit 1, naming it), never a temporary Prefect
server started for nothing, a task's retries run out or a half-done run.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from ._names import check_run_id, dns_subdomain_ok
from .cli import EXIT_INCIDENT, EXIT_UNJUDGED
from .errors import GpucertError, InputError

#: How long a command waits for an endpoint to answer its first question before giving up (the call
#: deadline when that is shorter): a server that is down or hung fails the command in seconds.
REACH_S = 8.0

if TYPE_CHECKING:
    from gpucert._prometheus_cli import PrometheusOptions
    from gpucert.blocks.cluster import GpuCluster
    from gpucert.blocks.policy import CertificationPolicy
    from gpucert.blocks.store import StoreLocation
    from gpucert.blocks.ticketing import Ticketing

    B = TypeVar("B", GpuCluster, CertificationPolicy, StoreLocation, Ticketing)

__all__ = [
    "FlowInputs",
    "NamedBlocks",
    "certify_command",
    "configure_command",
    "onboard_command",
    "operate_command",
    "parse_versions",
    "release_command",
    "setup_command",
    "tickets_command",
    "watch_nodes_command",
]


def _prepare_prefect() -> None:
    """Settings for a one-off local run, each only where the user set nothing.

    Prefect's temporary server must migrate its database on first use, which takes longer than the
    default 20 s on a small machine; anonymous usage reporting is off for a command-line tool.
    """
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    os.environ.setdefault("GPUCERT_TRIGGER", "cli")  # the audit trail's "what started it"
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logging.getLogger(name).addFilter(_no_traceback_for_gpucert_errors)


def _no_traceback_for_gpucert_errors(record: logging.LogRecord) -> bool:
    """Keep Prefect's log line for an expected failure but drop its traceback: the message says it all,
    and a user of the command line never gets a traceback (set GPUCERT_DEBUG=1 to keep them)."""
    if record.exc_info and isinstance(record.exc_info[1], GpucertError) and not os.environ.get("GPUCERT_DEBUG"):
        record.exc_info = None
        record.exc_text = None
    return True


def parse_versions(pairs: Sequence[str]) -> dict[str, str]:
    """``["driver=570.195.03", …]`` → ``{"driver": "570.195.03"}``; raises :class:`InputError` on a bad pair."""
    out: dict[str, str] = {}
    for pair in pairs:
        component, sep, version = pair.partition("=")
        if not sep or not component.strip() or not version.strip():
            raise InputError(f"--set {pair!r}: write COMPONENT=VERSION, e.g. driver=570.195.03")
        out[component.strip()] = version.strip()
    return out


def check_nodes(nodes: Sequence[str]) -> None:
    """Raise :class:`InputError` naming the first of ``nodes`` that is not a node name (a DNS subdomain)."""
    for node in nodes:
        if not dns_subdomain_ok(node):
            raise InputError(f"node {node!r} is not a node name (lower-case a-z, 0-9, '-' and '.', at most 253)")


@dataclass(frozen=True)
class NamedBlocks:
    """What a certifying command takes from saved blocks, or the GpuCluster fields it gives instead: the
    same cluster, storage location, store and policy a deployment run names (prefect.yaml)."""

    cluster_block: str | None = None
    store_block: str | None = None
    policy_block: str | None = None
    storage_claim: str | None = None
    storage_host_path: str | None = None
    namespace: str | None = None

    @classmethod
    def of(cls, args: argparse.Namespace) -> NamedBlocks:
        """The fields from parsed arguments (those a command does not have: None)."""
        return cls(**{name: getattr(args, name, None) for name in cls.__dataclass_fields__})


_CLUSTER_DEFAULTS = {"--label-prefix": "gpucert.io", "--selector": "nvidia.com/gpu.present=true"}


@dataclass(frozen=True)
class FlowInputs:
    """The blocks a flow command passes, built and checked before any flow starts."""

    cluster: GpuCluster
    store: StoreLocation | None = None
    policy: CertificationPolicy | None = None
    ticketing: Ticketing | None = None

    def blocks(self) -> dict[str, Any]:
        """The blocks, as a certifying flow's keyword arguments."""
        return {"cluster": self.cluster, "store": self.store, "policy": self.policy, "ticketing": self.ticketing}


def flow_inputs(
    *,
    kubeconfig: str | None,
    context: str | None,
    label_prefix: str,
    selector: str,
    store: str | None = None,
    policy_file: str | None = None,
    ticketing: str | None = None,
    namespace: str | None = None,
    nodes: Sequence[str] = (),
    blocks: NamedBlocks | None = None,
    needs_store: bool = False,
) -> FlowInputs:
    """Check and build a flow's inputs (the kubeconfig read and its API server asked, the nodes looked up, the
    policy validated, the store opened — a missing ``file://`` root is created: certify starts a store — and
    reached, a saved ``Ticketing`` block loaded); raises :class:`InputError` naming the one that is wrong,
    or the :class:`~gpucert.kube.KubeError` or :class:`~gpucert.errors.StoreError` of an endpoint that did
    not answer in time.

    ``blocks`` names saved blocks, each instead of the options it stands for (both given: exit 2), or gives
    the cluster's storage location and stack namespace; ``needs_store``: ``store`` or ``--store-block``.
    """
    from gpucert.blocks.policy import CertificationPolicy
    from gpucert.blocks.store import StoreLocation

    named = blocks or NamedBlocks()
    namespace = namespace or named.namespace
    _one_of("--store", store, "--store-block", named.store_block, required=needs_store)
    _one_of("--policy", policy_file, "--policy-block", named.policy_block, required=False)
    cluster = _cluster(
        named, kubeconfig=kubeconfig, context=context, label_prefix=label_prefix, selector=selector, namespace=namespace
    )
    kube = cluster.kube()  # a kubeconfig that cannot be read fails here
    check_nodes(nodes)
    policy = CertificationPolicy.from_file(policy_file) if policy_file else None
    if named.policy_block:
        policy = _saved(CertificationPolicy, named.policy_block, "--policy-block")
        policy.rules()  # a saved policy that no longer validates: named now, exit 2
    store_block = StoreLocation(uri=store) if store is not None else None
    if named.store_block:
        store_block = _saved(StoreLocation, named.store_block, "--store-block")
    opened = store_block.open(create=True) if store_block is not None else None  # a bad URI fails here
    # The local checks done, the endpoints: a server that is down or never answers fails here, in seconds.
    kube.version(within_s=REACH_S)
    missing = [n for n in nodes if kube.find("v1", "Node", n) is None]
    if missing:
        raise InputError(f"no node named {', '.join(missing)} in the cluster")
    if opened is not None:
        opened.objects.root_exists()  # one listing (a stat on file://), within the store's call deadline
    return FlowInputs(cluster=cluster, store=store_block, policy=policy, ticketing=_saved_ticketing(ticketing))


def _one_of(flag: str, value: str | None, block_flag: str, block: str | None, *, required: bool) -> None:
    """Raise :class:`InputError` when both ``flag`` and ``block_flag`` are given, or neither where one is
    ``required``."""
    if value is not None and block:
        raise InputError(f"{block_flag} {block}: give it or {flag}, not both")
    if required and value is None and not block:
        raise InputError(f"give {flag} or {block_flag} NAME")


def _cluster(
    named: NamedBlocks,
    *,
    kubeconfig: str | None,
    context: str | None,
    label_prefix: str,
    selector: str,
    namespace: str | None,
) -> GpuCluster:
    """The saved GpuCluster ``--cluster-block`` (no cluster option beside it), else one of the options."""
    from gpucert.blocks.cluster import GpuCluster

    options = {
        "--kubeconfig": kubeconfig,
        "--context": context,
        "--namespace": namespace,
        "--storage-claim": named.storage_claim,
        "--storage-host-path": named.storage_host_path,
        "--label-prefix": label_prefix,
        "--selector": selector,
    }
    if named.cluster_block:
        beside = [flag for flag, value in options.items() if value is not None and value != _CLUSTER_DEFAULTS.get(flag)]
        if beside:
            raise InputError(
                f"--cluster-block {named.cluster_block}: the block says how to reach the cluster and "
                f"what to measure; drop {', '.join(beside)}"
            )
        return _saved(GpuCluster, named.cluster_block, "--cluster-block")
    fields: dict[str, Any] = {
        "kubeconfig": kubeconfig,
        "context": context,
        "label_prefix": label_prefix,
        "gpu_node_selector": selector,
        "storage_claim": named.storage_claim,
        "storage_host_path": named.storage_host_path,
    }
    if namespace is not None:
        fields["stack_namespace"] = namespace
    try:
        return GpuCluster(**fields)
    except ValueError as exc:  # pydantic's ValidationError names the field
        raise InputError(_first_error(exc)) from None


def _first_error(exc: ValueError) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "value"
        return f"{where}: {err['msg']}"
    return str(exc)


def _saved_ticketing(name: str | None) -> Ticketing | None:
    """The saved ``Ticketing`` block ``name``; None for no name (see :func:`_saved`)."""
    if not name:
        return None
    from gpucert.blocks.ticketing import Ticketing

    return _saved(Ticketing, name, "--ticketing")


def _saved(block_type: type[B], name: str, flag: str) -> B:
    """The saved ``block_type`` block ``name``. Raises :class:`InputError` when no Prefect server is
    configured (a temporary one holds no blocks) or it has no such block."""
    from prefect.settings import PREFECT_API_URL

    kind = block_type.__name__
    if not PREFECT_API_URL.value():
        raise InputError(f"{flag} {name}: a saved {kind} block lives on a Prefect server; set PREFECT_API_URL to it")
    from prefect.exceptions import ObjectNotFound

    try:
        loaded = block_type.load(name)
    except (ObjectNotFound, ValueError) as exc:
        raise InputError(f"{flag} {name}: no such {kind} block ({type(exc).__name__})") from None
    if not isinstance(loaded, block_type):
        raise InputError(f"{flag} {name}: the saved block is a {type(loaded).__name__}, not a {kind}")
    return loaded


def _inputs_of(args: argparse.Namespace, *, nodes: Sequence[str] = (), needs_store: bool = True) -> FlowInputs:
    """:func:`flow_inputs` of a command's parsed arguments (those it does not have: None)."""
    return flow_inputs(
        kubeconfig=args.kubeconfig,
        context=args.context,
        label_prefix=args.label_prefix,
        selector=args.selector,
        store=getattr(args, "store", None),
        policy_file=getattr(args, "policy", None),
        ticketing=getattr(args, "ticketing", None),
        nodes=nodes,
        blocks=NamedBlocks.of(args),
        needs_store=needs_store,
    )


def _print(outcome: Any, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(outcome.model_dump_json(indent=2) + "\n")
    else:
        text = outcome.markdown() if hasattr(outcome, "markdown") else outcome.text()
        sys.stdout.write(text)


def configure_command(args: argparse.Namespace) -> int:
    """Run the configure flow once; prints its summary (or its result as JSON) and returns 0."""
    pinned = parse_versions(args.versions)
    check_nodes(args.nodes)
    if args.dry_run is not None:
        from pathlib import Path

        from .stack import check_output_dir

        check_output_dir(Path(args.dry_run))  # a file there, or a folder that cannot be written: exit 2 now
    inputs = _inputs_of(args, needs_store=False)
    _prepare_prefect()
    from gpucert.flows.configure import configure

    outcome = configure(
        cluster=inputs.cluster,
        release=args.release,
        versions=pinned,
        registry=args.registry,
        nodes=list(args.nodes) or None,
        dry_run_dir=args.dry_run,
        gpus_per_node=args.gpus_per_node,
        rollout_timeout_s=args.timeout,
        installer=args.installer,
        certify_changed=args.certify_changed,
    )
    _print(outcome, args.json)
    return 0


def certify_command(args: argparse.Namespace) -> int:
    """Run the certify flow once; prints what it found and did. Returns 0: a run that found faults did its job
    (they are in the labels, taints, report and the printed summary) — or 5 when it hit the blast radius
    (an incident: nothing tainted, one incident ticket, a page)."""
    if args.run_id is not None:
        check_run_id(args.run_id, what="--run-id")
    inputs = _inputs_of(args, nodes=args.nodes)
    if args.payload_args:  # checked as the Job would be
        from .certify import check_payload_args

        check_payload_args(tuple(args.payload_args))
    _prepare_prefect()
    from gpucert.flows.certify import certify

    outcome = asyncio.run(
        certify(
            **inputs.blocks(),
            nodes=list(args.nodes) or None,
            include_busy=args.include_busy,
            run_id=args.run_id,
            image=args.image,
            observe_only=args.observe_only or None,
            max_parallel=args.max_parallel,
            payload_args=list(args.payload_args) or None,
        )
    )
    _print(outcome, args.json)
    return _incident_exit(outcome) or 0


def operate_command(args: argparse.Namespace) -> int:
    """Run one night of operate; prints the fleet report (or the outcome as JSON) and returns 0, or 4 (the
    run completed but could not judge) with one line on stderr when the night read no telemetry at all: no
    DCGM exporter found, or no GPU node's telemetry readable. Some nodes unread is 0: those read were judged,
    and the unread are named in the report."""
    from ._prometheus_cli import prometheus_options

    given = prometheus_options(args)
    inputs = _inputs_of(args)
    prometheus = _prometheus(given)
    _prepare_prefect()
    from gpucert.flows.operate import operate

    outcome = asyncio.run(
        operate(
            **inputs.blocks(),
            prometheus=prometheus,
            observe_only=args.observe_only or None,
            rotation_days=args.rotation_days,
            max_nodes=args.max_nodes,
            scrape_interval_s=args.scrape_interval,
        )
    )
    _print(outcome, args.json)
    if outcome.telemetry_missing:
        # Not a clean night: nothing asked for re-certification for want of numbers, not of faults.
        sys.stderr.write(f"gpucert: operate: {outcome.telemetry_missing}\n")
        return EXIT_UNJUDGED
    return _incident_exit(outcome.certify) or 0


def _incident_exit(outcome: Any) -> int | None:
    """:data:`~gpucert.cli.EXIT_INCIDENT`, with one line on stderr, when the certification hit the blast
    radius; None otherwise."""
    if outcome is None or not outcome.incident:
        return None
    ticket = outcome.incident_ticket or "recorded in the store"
    sys.stderr.write(f"gpucert: incident (ticket {ticket}): {outcome.incident}\n")
    return EXIT_INCIDENT


def _prometheus(given: PrometheusOptions | str | None) -> Any:
    """A ``Prometheus`` block for ``--prometheus`` and its companions (a URL with credentials, or a saved
    block's name; see :mod:`gpucert._prometheus_cli`; None for none), its server asked one query first.
    Raises :class:`InputError` for bad options and the ``TelemetryError`` of a server that refuses or does not
    answer within :data:`REACH_S` (or the call deadline when shorter)."""
    if given is None:
        return None
    import dataclasses
    import time

    from ._prometheus_cli import PrometheusOptions, prometheus_block

    options = PrometheusOptions(given) if isinstance(given, str) else given
    block = prometheus_block(options)
    try:
        source = block.source()
    except ValueError as exc:
        raise InputError(f"--prometheus: {_first_error(exc)}") from None
    dataclasses.replace(source, timeout_s=min(source.timeout_s, REACH_S)).query("vector(1)", time.time())
    return block


def onboard_command(args: argparse.Namespace) -> int:
    """Onboard the node once (configure, certify, admit); returns 0 when it was admitted, 3 when kept out."""
    check_nodes([args.node])  # it may not have joined yet: the flow waits for it
    inputs = _inputs_of(args)
    _prepare_prefect()
    from gpucert.flows.onboard import onboard

    outcome = asyncio.run(onboard(node=args.node, uid=args.uid, **inputs.blocks(), ready_timeout_s=args.ready_timeout))
    _print(outcome, args.json)
    return _incident_exit(outcome.certify) or (0 if outcome.admitted else 3)


def release_command(args: argparse.Namespace) -> int:
    """``gpucert release``: record the repair on the nodes' open tickets, re-certify them; 0 when every one
    passed (its taint lifted), 3 when one did not."""
    inputs = _inputs_of(args, nodes=args.nodes)
    _prepare_prefect()
    from gpucert.flows.release import release

    outcome = asyncio.run(release(nodes=list(args.nodes), **inputs.blocks(), action=args.action, note=args.note))
    _print(outcome, args.json)
    return _incident_exit(outcome.certify) or (0 if set(outcome.released) == set(args.nodes) else 3)


def setup_command(args: argparse.Namespace) -> int:
    """``gpucert setup`` (``flows/teamsetup.py`` does the work); prints each step, returns 0. Raises
    :class:`InputError` for no Prefect server, a bad team file or option, an unreachable store or cluster."""
    from pathlib import Path

    token = _from_env("--jira-token-env", args.jira_token_env)
    secret_key = _from_env("--s3-secret-key-env", args.s3_secret_key_env)
    _prepare_prefect()
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise InputError("setup: set PREFECT_API_URL to the team's Prefect server (a temporary one keeps nothing)")
    from gpucert.flows.teamsetup import read_team_file, setup_team

    overrides = {
        "name": {"name": args.name},
        "cluster": {
            "kubeconfig": args.kubeconfig,
            "context": args.context,
            "label_prefix": args.label_prefix,
            "gpu_node_selector": args.selector,
            "stack_namespace": args.namespace,
            "storage_claim": args.storage_claim,
            "storage_host_path": args.storage_host_path,
        },
        "store": {
            "uri": args.store,
            "endpoint_url": args.s3_endpoint,
            "public_url": args.public_url,
            "aws_access_key_id": args.s3_access_key_id,
            "aws_secret_access_key": secret_key,
            "region_name": args.s3_region,
        },
        "ticketing": {
            "backend": "jira" if args.jira_url else None,
            "server": args.jira_url,
            "user": args.jira_user,
            "project": args.jira_project,
            "token": token,
        },
        "policy": {"file": args.policy},
    }
    team = read_team_file(args.team_file, overrides)
    project = Path(args.project).resolve()
    setup_team(team, project=project, deploy=not args.no_deploy, reach_s=REACH_S, say=partial(print, flush=True))
    return 0


def _from_env(flag: str, variable: str | None) -> str | None:
    """The secret in the environment variable ``variable`` (None: not asked for); raises :class:`InputError`
    when it is not set: a secret is never taken from the command line, where every process sees it."""
    if not variable:
        return None
    value = os.environ.get(variable)
    if not value:
        raise InputError(f"{flag} {variable}: that variable is not set")
    return value


def watch_nodes_command(args: argparse.Namespace) -> int:
    """Emit ``gpucert.node.joined`` for every node that carries ``<prefix>/uncertified`` (present at start, and
    each that joins: ``--once``, only the present), once per node UID, even across restarts; runs until
    interrupted, riding out the API server going away (each outage said on stderr) and announcing what joined
    meanwhile (:mod:`gpucert.kube._watch`). Raises :class:`InputError` (exit 2) when the identity is refused
    (401/403) past the bounded wait, and the :class:`~gpucert.kube.KubeError` of a server that does not answer
    at start (exit 1).
    """
    inputs = _inputs_of(args, needs_store=False)
    _prepare_prefect()
    from prefect.events import emit_event

    from .kube import KubeForbidden, announce_joined_nodes

    def emit(node: str, uid: str) -> None:
        emit_event(
            event="gpucert.node.joined",
            resource={
                "prefect.resource.id": f"gpucert.node.{uid}",
                "prefect.resource.name": node,
                "gpucert.node.uid": uid,
            },
        )
        sys.stdout.write(f"gpucert.node.joined {node} {uid}\n")
        sys.stdout.flush()

    def log(message: str) -> None:
        sys.stderr.write(f"gpucert: watch-nodes: {message}\n")
        sys.stderr.flush()

    try:
        announce_joined_nodes(
            inputs.cluster.kube(),
            prefix=args.label_prefix,
            selector=args.selector,
            emit=emit,
            follow=not args.once,
            log=log,
        )
    except KubeForbidden as exc:
        # Not a passing state any more but the identity's permissions: something for a person to fix.
        raise InputError(
            f"{exc}; the kubeconfig's identity must be allowed to list, watch and patch nodes "
            "(the gpucert-runtime ClusterRole, templates/stack/rbac.yaml.j2)"
        ) from None
    return 0


def tickets_command(args: argparse.Namespace) -> int:
    """``gpucert tickets list``: prints the tickets of every backend — a saved ``Ticketing`` block's (Jira, a
    webhook's file), else the local ticket file (``--tickets``, a ``file://`` store's, or the default) —
    followed by those runs without ticketing recorded in ``--store`` and no run opened yet (an ``s3://``
    store has only these). Raises :class:`InputError` for a location or block that is not there."""
    from .tickets import DEFAULT_TICKETS, format_tickets, tickets_list

    store, state, nodes = args.store, args.state, args.nodes or None
    parts: list[str] = []
    s3 = store is not None and store.strip().lower().startswith("s3://")
    backend = _saved_ticketing(args.ticketing)
    if backend is not None:
        parts.append(tickets_list(backend.open(), state, nodes=nodes))
    elif args.tickets is not None or not s3:
        parts.append(tickets_list(args.tickets or store or DEFAULT_TICKETS, state, nodes=nodes))
    if store is not None and state != "resolved":
        from .certify import recorded_tickets
        from .store import open_store

        recorded = recorded_tickets(open_store(store, create=False))
        wanted = [t for t in recorded if nodes is None or t.node in nodes]
        if wanted or s3:
            head = f"recorded in {store} by runs without ticketing (opened by the first run that has it):"
            parts.append(head + "\n" + (format_tickets(wanted) if wanted else "no recorded tickets"))
    print("\n\n".join(parts))
    return 0


#: Each command that goes through Prefect (or a saved block) → what runs it, given the parsed arguments.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "configure": configure_command,
    "certify": certify_command,
    "operate": operate_command,
    "onboard": onboard_command,
    "release": release_command,
    "setup": setup_command,
    "watch-nodes": watch_nodes_command,
    "tickets": tickets_command,
}
