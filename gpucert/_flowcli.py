"""The commands that run a lifecycle flow once, locally: the command line's one door to Prefect.

Prefect is imported only here and only once a command was parsed, so ``gpucert compare`` and the
rest start without it. Without ``PREFECT_API_URL`` Prefect runs the flow against a temporary local
server; with it, the run shows up in that server's UI like a deployment's.

Every input is checked before anything starts — the kubeconfig, the store, the policy file, the run id,
node names, a saved block's name, configure's ``--dry-run`` folder — so a typo is one line and exit 2, never
a temporary Prefect server started for nothing or a half-done run. The endpoints are asked first too: the
API server (its ``/version``, within :data:`REACH_S`), an ``s3://`` store (one listing) and
``--prometheus`` (one query, within :data:`REACH_S`), each within the call deadline (``gpucert --timeout``)
too, so an endpoint that is down, or that accepts connections and never answers, fails the command in
seconds (exit 1, naming it) instead of after a Prefect server started and a task's retries ran out.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ._names import check_run_id, dns_subdomain_ok
from .cli import EXIT_UNJUDGED
from .errors import GpucertError, InputError

#: How long a command waits for an endpoint to answer its first question before giving up (the call
#: deadline when that is shorter): a server that is down or hung fails the command in seconds.
REACH_S = 8.0

if TYPE_CHECKING:
    from blocks.cluster import GpuCluster
    from blocks.policy import CertificationPolicy
    from blocks.store import BaselineStore
    from blocks.ticketing import Ticketing

__all__ = [
    "FlowInputs",
    "certify_command",
    "configure_command",
    "onboard_command",
    "operate_command",
    "parse_versions",
    "release_command",
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
    if (
        record.exc_info
        and isinstance(record.exc_info[1], GpucertError)
        and not os.environ.get("GPUCERT_DEBUG")
    ):
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


def check_nodes(nodes: Sequence[str], *, what: str = "node") -> list[str]:
    """``nodes`` when each is a valid node name (a DNS subdomain); raises :class:`InputError` naming one."""
    for node in nodes:
        if not dns_subdomain_ok(node):
            raise InputError(
                f"{what} {node!r} is not a node name (lower-case a-z, 0-9, '-' and '.', at most 253)"
            )
    return list(nodes)


@dataclass(frozen=True)
class FlowInputs:
    """The blocks a flow command passes, built and checked before any flow starts."""

    cluster: GpuCluster
    store: BaselineStore | None = None
    policy: CertificationPolicy | None = None
    ticketing: Ticketing | None = None


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
) -> FlowInputs:
    """Check and build a flow's inputs; raises :class:`InputError` naming the one that is wrong.

    The kubeconfig is read, the API server asked for its version and the nodes asked for looked up, the policy
    file fully validated, the store opened (a missing ``file://`` root is created: certify starts a store) and
    reached, a saved ``Ticketing`` block loaded. Raises the :class:`~gpucert.kube.KubeError` or
    :class:`~gpucert.errors.StoreError` of an endpoint that did not answer in time.
    """
    from blocks.cluster import GpuCluster
    from blocks.policy import CertificationPolicy
    from blocks.store import BaselineStore

    fields: dict[str, Any] = {"kubeconfig": kubeconfig, "context": context, "label_prefix": label_prefix,
                              "gpu_node_selector": selector}  # fmt: skip
    if namespace is not None:
        fields["stack_namespace"] = namespace
    try:
        cluster = GpuCluster(**fields)
    except ValueError as exc:  # pydantic's ValidationError names the field
        raise InputError(_first_error(exc)) from None
    kube = cluster.kube()  # a kubeconfig that cannot be read fails here
    check_nodes(nodes)
    policy = CertificationPolicy.from_file(policy_file) if policy_file else None
    store_block = BaselineStore(uri=store) if store is not None else None
    opened = store_block.open(create=True) if store_block is not None else None  # a bad URI fails here
    # The local checks done, the endpoints: a server that is down or never answers fails here, in seconds.
    kube.version(within_s=REACH_S)
    missing = [n for n in nodes if kube.find("v1", "Node", n) is None]
    if missing:
        raise InputError(f"no node named {', '.join(missing)} in the cluster")
    if opened is not None:
        opened.objects.root_exists()  # one listing (a stat on file://), within the store's call deadline
    return FlowInputs(cluster=cluster, store=store_block, policy=policy, ticketing=_saved_ticketing(ticketing))


def _first_error(exc: ValueError) -> str:
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"]) or "value"
        return f"{where}: {err['msg']}"
    return str(exc)


def _saved_ticketing(name: str | None) -> Ticketing | None:
    """The saved ``Ticketing`` block ``name``; None for no name. Raises :class:`InputError` when no Prefect
    server is configured (a temporary one holds no blocks) or it has no such block."""
    if not name:
        return None
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise InputError(
            f"--ticketing {name}: a saved Ticketing block lives on a Prefect server; set PREFECT_API_URL to it"
        )
    from prefect.exceptions import ObjectNotFound

    from blocks.ticketing import Ticketing

    try:
        loaded = Ticketing.load(name)
    except (ObjectNotFound, ValueError) as exc:
        raise InputError(f"--ticketing {name}: no such Ticketing block ({type(exc).__name__})") from None
    assert isinstance(loaded, Ticketing)
    return loaded


def _print(outcome: Any, as_json: bool) -> None:
    if as_json:
        sys.stdout.write(outcome.model_dump_json(indent=2) + "\n")
    else:
        text = outcome.markdown() if hasattr(outcome, "markdown") else outcome.text()
        sys.stdout.write(text)


def configure_command(
    *,
    kubeconfig: str | None,
    context: str | None,
    release: str | None,
    versions: Sequence[str],
    registry: str | None,
    nodes: Sequence[str],
    dry_run: str | None,
    namespace: str,
    label_prefix: str,
    selector: str,
    gpus_per_node: int,
    timeout_s: float,
    as_json: bool,
) -> int:
    """Run the configure flow once; prints its summary (or its result as JSON) and returns 0."""
    pinned = parse_versions(versions)
    check_nodes(nodes)
    if dry_run is not None:
        from pathlib import Path

        from .stack._render import check_output_dir

        check_output_dir(Path(dry_run))  # a file there, or a folder that cannot be written: exit 2 now
    inputs = flow_inputs(kubeconfig=kubeconfig, context=context, label_prefix=label_prefix, selector=selector,
                         namespace=namespace)  # fmt: skip
    _prepare_prefect()
    from flows.configure import configure

    outcome = configure(cluster=inputs.cluster, release=release, versions=pinned, registry=registry,
                        nodes=list(nodes) or None, dry_run_dir=dry_run, gpus_per_node=gpus_per_node,
                        rollout_timeout_s=timeout_s)  # fmt: skip
    _print(outcome, as_json)
    return 0


def certify_command(
    *,
    kubeconfig: str | None,
    context: str | None,
    store: str,
    nodes: Sequence[str],
    include_busy: bool,
    run_id: str | None,
    image: str | None,
    policy_file: str | None,
    ticketing: str | None,
    observe_only: bool,
    max_parallel: int,
    payload_args: Sequence[str],
    label_prefix: str,
    selector: str,
    as_json: bool,
) -> int:
    """Run the certify flow once; prints what it found and did. Returns 0: a run that found faults did its job
    (they are in the labels, taints, report and the printed summary)."""
    if run_id is not None:
        check_run_id(run_id, what="--run-id")
    inputs = flow_inputs(kubeconfig=kubeconfig, context=context, label_prefix=label_prefix, selector=selector,
                         store=store, policy_file=policy_file, ticketing=ticketing, nodes=nodes)  # fmt: skip
    _check_payload_args(payload_args)
    _prepare_prefect()
    from flows.certify import certify

    outcome = asyncio.run(
        certify(cluster=inputs.cluster, store=inputs.store, nodes=list(nodes) or None, include_busy=include_busy,
                run_id=run_id, image=image, policy=inputs.policy, ticketing=inputs.ticketing,
                observe_only=observe_only or None, max_parallel=max_parallel,
                payload_args=list(payload_args) or None)
    )  # fmt: skip
    _print(outcome, as_json)
    return 0


def _check_payload_args(args: Sequence[str]) -> None:
    """Raise :class:`InputError` unless the benchmark payload accepts ``args`` (checked as the Job would be)."""
    if args:
        from .certify import check_payload_args

        check_payload_args(tuple(args))


def operate_command(
    *,
    kubeconfig: str | None,
    context: str | None,
    store: str,
    policy_file: str | None,
    ticketing: str | None,
    observe_only: bool,
    prometheus_url: str | None,
    rotation_days: float | None,
    max_nodes: int | None,
    scrape_interval_s: float,
    label_prefix: str,
    selector: str,
    namespace: str,
    as_json: bool,
) -> int:
    """Run one night of operate; prints the fleet report (or the outcome as JSON) and returns 0, or 4 (the
    run completed but could not judge) with one line on stderr when the night read no telemetry at all: no
    DCGM exporter found, or no GPU node's telemetry readable. Some nodes unread is 0: those read were judged,
    and the unread are named in the report."""
    inputs = flow_inputs(kubeconfig=kubeconfig, context=context, label_prefix=label_prefix, selector=selector,
                         store=store, policy_file=policy_file, ticketing=ticketing, namespace=namespace)  # fmt: skip
    prometheus = _prometheus(prometheus_url)
    _prepare_prefect()
    from flows.operate import operate

    outcome = asyncio.run(
        operate(cluster=inputs.cluster, store=inputs.store, policy=inputs.policy, ticketing=inputs.ticketing,
                prometheus=prometheus, observe_only=observe_only or None, rotation_days=rotation_days,
                max_nodes=max_nodes, scrape_interval_s=scrape_interval_s)
    )  # fmt: skip
    _print(outcome, as_json)
    if outcome.telemetry_missing:
        # Not a clean night: nothing asked for re-certification for want of numbers, not of faults.
        sys.stderr.write(f"gpucert: operate: {outcome.telemetry_missing}\n")
        return EXIT_UNJUDGED
    return 0


def _prometheus(url: str | None) -> Any:
    """A ``Prometheus`` block for ``url`` (None for none), its server asked one query first. Raises
    :class:`InputError` for a bad URL and the ``TelemetryError`` of a server that refuses or does not answer
    within :data:`REACH_S` (or the call deadline when shorter)."""
    if url is None:
        return None
    import dataclasses
    import time

    from blocks.prometheus import Prometheus

    try:
        block = Prometheus(url=url)
        source = block.source()
    except ValueError as exc:
        raise InputError(f"--prometheus: {_first_error(exc)}") from None
    dataclasses.replace(source, timeout_s=min(source.timeout_s, REACH_S)).query("vector(1)", time.time())
    return block


def onboard_command(
    *,
    node: str,
    uid: str | None,
    kubeconfig: str | None,
    context: str | None,
    store: str,
    policy_file: str | None,
    ticketing: str | None,
    ready_timeout_s: float,
    label_prefix: str,
    selector: str,
    as_json: bool,
) -> int:
    """Onboard ``node`` once (configure, certify, admit); returns 0 when it was admitted, 3 when kept out."""
    check_nodes([node])  # it may not have joined yet: the flow waits for it
    inputs = flow_inputs(kubeconfig=kubeconfig, context=context, label_prefix=label_prefix, selector=selector,
                         store=store, policy_file=policy_file, ticketing=ticketing)  # fmt: skip
    _prepare_prefect()
    from flows.onboard import onboard

    outcome = asyncio.run(
        onboard(node=node, uid=uid, cluster=inputs.cluster, store=inputs.store, policy=inputs.policy,
                ticketing=inputs.ticketing, ready_timeout_s=ready_timeout_s)
    )  # fmt: skip
    _print(outcome, as_json)
    return 0 if outcome.admitted else 3


def release_command(
    *,
    nodes: Sequence[str],
    kubeconfig: str | None,
    context: str | None,
    store: str,
    policy_file: str | None,
    ticketing: str | None,
    label_prefix: str,
    selector: str,
    action: str | None,
    note: str,
    as_json: bool = False,
) -> int:
    """``gpucert release``: record the repair on the nodes' open tickets, re-certify them; 0 when every one
    passed (its taint lifted), 3 when one did not."""
    inputs = flow_inputs(kubeconfig=kubeconfig, context=context, label_prefix=label_prefix, selector=selector,
                         store=store, policy_file=policy_file, ticketing=ticketing, nodes=nodes)  # fmt: skip
    _prepare_prefect()
    from flows.release import release

    outcome = asyncio.run(
        release(nodes=list(nodes), cluster=inputs.cluster, store=inputs.store, policy=inputs.policy,
                ticketing=inputs.ticketing, action=action, note=note)
    )  # fmt: skip
    _print(outcome, as_json)
    return 0 if set(outcome.released) == set(nodes) else 3


def watch_nodes_command(
    *, kubeconfig: str | None, context: str | None, label_prefix: str, selector: str, once: bool
) -> int:
    """Emit ``gpucert.node.joined`` for every node that carries ``<prefix>/uncertified`` (those present at
    start and those that join), once per node UID, even across restarts; runs until interrupted
    (``once``: only the present).

    Once it has listed the nodes it rides out the API server going away, for as long as it takes, and
    announces what joined meanwhile (:mod:`gpucert.kube._watch`); each outage is said on stderr when it
    starts and when it ends. Raises :class:`InputError` (exit 2) when the kubeconfig's identity is refused
    (401/403) past the bounded wait — at start, or during the run after it had permission — and the
    :class:`~gpucert.kube.KubeError` of a server that does not answer at start (exit 1).
    """
    inputs = flow_inputs(kubeconfig=kubeconfig, context=context, label_prefix=label_prefix, selector=selector)
    _prepare_prefect()
    from prefect.events import emit_event

    from .kube import KubeForbidden, announce_joined_nodes

    def emit(node: str, uid: str) -> None:
        emit_event(
            event="gpucert.node.joined",
            resource={"prefect.resource.id": f"gpucert.node.{uid}", "prefect.resource.name": node,
                      "gpucert.node.uid": uid},
        )  # fmt: skip
        sys.stdout.write(f"gpucert.node.joined {node} {uid}\n")
        sys.stdout.flush()

    def log(message: str) -> None:
        sys.stderr.write(f"gpucert: watch-nodes: {message}\n")
        sys.stderr.flush()

    try:
        announce_joined_nodes(inputs.cluster.kube(), prefix=label_prefix, selector=selector, emit=emit,
                              follow=not once, log=log)  # fmt: skip
    except KubeForbidden as exc:
        # Not a passing state any more but the identity's permissions: something for a person to fix.
        raise InputError(
            f"{exc}; the kubeconfig's identity must be allowed to list, watch and patch nodes "
            "(the gpucert-runtime ClusterRole, templates/stack/rbac.yaml.j2)"
        ) from None
    return 0
