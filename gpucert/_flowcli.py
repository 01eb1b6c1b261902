"""The commands that run a lifecycle flow once, locally: the command line's one door to Prefect.

Prefect is imported only here and only once a command was parsed, so ``gpucert compare`` and the
rest start without it. Without ``PREFECT_API_URL`` Prefect runs the flow against a temporary local
server; with it, the run shows up in that server's UI like a deployment's.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from .errors import GpucertError, InputError

__all__ = ["certify_command", "configure_command", "parse_versions", "release_command", "watch_nodes_command"]


def _prepare_prefect() -> None:
    """Settings for a one-off local run, each only where the user set nothing.

    Prefect's temporary server must migrate its database on first use, which takes longer than the
    default 20 s on a small machine; anonymous usage reporting is off for a command-line tool.
    """
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
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
    _prepare_prefect()
    from blocks.cluster import GpuCluster
    from flows.configure import configure

    try:
        cluster = GpuCluster(
            kubeconfig=kubeconfig,
            context=context,
            stack_namespace=namespace,
            label_prefix=label_prefix,
            gpu_node_selector=selector,
        )
    except ValueError as exc:  # pydantic's ValidationError names the field
        raise InputError(str(exc)) from exc
    result: dict[str, Any] = configure(
        cluster=cluster,
        release=release,
        versions=pinned,
        registry=registry,
        nodes=list(nodes) or None,
        dry_run_dir=dry_run,
        gpus_per_node=gpus_per_node,
        rollout_timeout_s=timeout_s,
    )
    if as_json:
        json.dump(result, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        from .stack import ConfigureOutcome

        sys.stdout.write(ConfigureOutcome.from_dict(result).markdown())
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
    observe_only: bool,
    max_parallel: int,
    label_prefix: str,
    selector: str,
    as_json: bool,
) -> int:
    """Run the certify flow once; prints what it found and did. Returns 0: a run that found faults did its job
    (they are in the labels, taints, report and the printed summary)."""
    _prepare_prefect()
    import asyncio

    from blocks.cluster import GpuCluster
    from blocks.store import BaselineStore
    from flows.certify import certify

    from .policy import load_policy

    load_policy(policy_file)  # a bad policy fails here, before any Job is started
    try:
        cluster = GpuCluster(kubeconfig=kubeconfig, context=context, label_prefix=label_prefix,
                             gpu_node_selector=selector)  # fmt: skip
    except ValueError as exc:
        raise InputError(str(exc)) from exc
    result: dict[str, Any] = asyncio.run(
        certify(
            cluster=cluster,
            store=BaselineStore(uri=store),
            nodes=list(nodes) or None,
            include_busy=include_busy,
            run_id=run_id,
            image=image,
            policy_file=policy_file,
            observe_only=observe_only or None,
            max_parallel=max_parallel,
        )
    )
    if as_json:
        json.dump(result, sys.stdout, indent=2, default=str)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(_certify_text(result))
    return 0


def _certify_text(result: dict[str, Any]) -> str:
    states = ", ".join(f"{n} {state}" for state, n in sorted(result["states"].items()))
    lines = [f"certify {result['run_id']}: {len(result['nodes'])} nodes benchmarked: {states}"]
    if result["skipped"]:
        lines.append(f"skipped: {', '.join(f'{n} ({why})' for n, why in sorted(result['skipped'].items()))}")
    for node, why in result["inconclusive"].items():
        lines.append(f"inconclusive {node}: {why}")
    for node, done in sorted(result["actions"].items()):
        if "tainted" in done or "failed" in done or "degraded" in done:
            lines.append(f"{node}: {done}")
    if result["unconfirmed"]:
        lines.append(
            f"failed once, not confirmed by a re-run (not tainted): {', '.join(result['unconfirmed'])}"
        )
    if result["incident"]:
        lines.append(f"INCIDENT: {result['incident']}")
    if result["observe_only"]:
        lines.append("observe-only: nothing was tainted or untainted")
    lines.append(f"baseline version: {result['baseline_version']}; report: {result['report']}")
    return "\n".join(lines) + "\n"


def watch_nodes_command(*, kubeconfig: str | None, context: str | None, label_prefix: str, once: bool) -> int:
    """Emit ``gpucert.node.joined`` for every node that carries ``<prefix>/uncertified`` (those present at
    start and those that join), once per node UID; runs until interrupted (``once``: only the present)."""
    _prepare_prefect()
    from prefect.events import emit_event

    from .kube import connect
    from .kube._watch import joined_nodes

    kube = connect(kubeconfig, context=context)
    for node, uid in joined_nodes(kube, taint=f"{label_prefix}/uncertified", follow=not once):
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
    return 0


def release_command(
    *,
    nodes: Sequence[str],
    kubeconfig: str | None,
    context: str | None,
    store: str,
    label_prefix: str,
    selector: str,
    action: str | None,
    note: str,
) -> int:
    """``gpucert release``: record the repair on the nodes' open tickets, re-certify them; 0 when every one
    passed (its taint lifted), 3 when one did not."""
    _prepare_prefect()
    import asyncio
    from datetime import UTC, datetime

    from blocks.cluster import GpuCluster
    from blocks.store import BaselineStore
    from flows.certify import certify

    from .tickets import open_backend, record_repairs

    now = datetime.now(UTC)
    if store.startswith("file://"):
        for event in record_repairs(
            open_backend(store), nodes, now, action=action, note=note, by="gpucert release"
        ):
            sys.stdout.write(f"{event.ticket.id}: {event.detail}\n")
    cluster = GpuCluster(
        kubeconfig=kubeconfig, context=context, label_prefix=label_prefix, gpu_node_selector=selector
    )
    result: dict[str, Any] = asyncio.run(
        certify(cluster=cluster, store=BaselineStore(uri=store), nodes=list(nodes), include_busy=True)
    )
    sys.stdout.write(_certify_text(result))
    released = result["states"].get("certified", 0) == len(nodes)
    return 0 if released else 3
