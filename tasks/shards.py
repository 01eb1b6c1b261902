"""A large certify's benchmarks spread over Prefect workers: one ``certify-shard`` flow run per shard.

The parent run cuts its nodes into shards (``gpucert.certify.plan_shards``), starts one child flow run of
the ``certify-shard`` deployment for each — any worker on the pool takes them — waits for all, and joins
their files into the run's results (``gpucert.certify.read_shards``); judging, settling and acting stay the
parent's, over the whole fleet. Prefect is the scheduler here: nothing of this module picks a machine.

Each child run is created with the idempotency key ``<run id>-shard-<k>``, so a parent that crashed and was
brought back (automations.yaml) finds the shards it had started instead of starting them again; a shard
that crashed is brought back the same way and adopts its Jobs (they carry the run's id). A shard in
CRASHED is given :data:`CRASH_GRACE_S` to come back before the parent gives up on it.

Where the deployment is not there (a run from the command line, the demo) or a block the shards need is
not saved (a worker loads blocks by reference), the shards run here as sub-flows,
:data:`LOCAL_SHARDS_AT_ONCE` at a time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from uuid import UUID

from prefect import get_run_logger
from prefect.blocks.core import Block
from prefect.client.schemas.objects import FlowRun

from gpucert._memory import release_freed_memory
from gpucert.certify import CertificationRun, ShardParts, read_shards
from gpucert.errors import ShardFailed

__all__ = ["CRASH_GRACE_S", "LOCAL_SHARDS_AT_ONCE", "SHARD_DEPLOYMENT", "ShardFailed", "run_shards"]

SHARD_DEPLOYMENT = "certify-shard/certify-shard"
#: Shards run at once in this process when no worker runs them: each holds its nodes' Jobs and logs, so the
#: process's memory grows with it (about 0.4 GB a shard of 1,000 nodes), while waves are what parallelise.
LOCAL_SHARDS_AT_ONCE = 2
#: How long a crashed shard may stay CRASHED before the parent stops waiting for automations.yaml's rule.
CRASH_GRACE_S = 300.0
_POLL_S = 2.0

#: Runs shard ``index`` over ``nodes`` in this process (the ``certify-shard`` flow called as a sub-flow).
LocalShard = Callable[[int, dict[str, int]], Awaitable[Any]]


async def _deployment_id() -> UUID | None:
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    async with get_client() as client:
        try:
            return (await client.read_deployment_by_name(SHARD_DEPLOYMENT)).id
        except ObjectNotFound:
            return None


def _by_reference(parameters: Mapping[str, Any]) -> dict[str, Any]:
    """``parameters`` with each saved block as a ``$ref`` the shard's flow loads: a block sent whole would
    have its secrets masked on the way (``SecretStr`` dumps as asterisks)."""
    return {
        name: {"$ref": {"block_document_id": str(value._block_document_id)}} if isinstance(value, Block) else value
        for name, value in parameters.items()
    }


def _unsaved(blocks: Mapping[str, Any]) -> list[str]:
    return [name for name, block in blocks.items() if isinstance(block, Block) and block._block_document_id is None]


async def run_shards(
    run: CertificationRun,
    shards: Sequence[dict[str, int]],
    parameters: Mapping[str, Any],
    *,
    local: LocalShard,
    wait_s: float,
) -> ShardParts:
    """Benchmark ``shards`` of ``run`` — on the pool's workers through the ``certify-shard`` deployment, else
    here through ``local`` — and join what they left. ``parameters`` are the shard flow's other parameters
    (blocks among them go by reference). Waits at most ``wait_s`` for the last shard.

    Returns the joined :class:`~gpucert.certify.ShardParts`; raises :class:`ShardFailed` for a shard that
    did not complete and :class:`~gpucert.errors.StoreError` for one whose files are missing."""
    log = get_run_logger()
    unsaved = _unsaved(parameters)
    deployment = await _deployment_id() if not unsaved else None
    if deployment is None:
        why = f"{', '.join(unsaved)} not saved blocks" if unsaved else f"no {SHARD_DEPLOYMENT} deployment"
        log.info(
            "%s: %d shards run in this process, %d at a time (%s)", run.run_id, len(shards), LOCAL_SHARDS_AT_ONCE, why
        )
        slots = asyncio.Semaphore(LOCAL_SHARDS_AT_ONCE)

        async def in_turn(index: int, nodes: dict[str, int]) -> None:
            async with slots:
                await local(index, nodes)
                release_freed_memory()  # the shard's logs and frames, before the next shard's come on top

        await asyncio.gather(*(in_turn(i, nodes) for i, nodes in enumerate(shards)))
    else:
        await _on_workers(run, shards, parameters, wait_s=wait_s)
    parts = read_shards(run, shards)
    log.info(
        "%s: %d shards joined, %d result rows, %d Jobs failed", run.run_id, len(shards), parts.rows, len(parts.failed)
    )
    return parts


async def _on_workers(
    run: CertificationRun, shards: Sequence[dict[str, int]], parameters: Mapping[str, Any], *, wait_s: float
) -> None:
    from prefect.deployments import run_deployment

    started, sent = [], _by_reference(parameters)
    for index, nodes in enumerate(shards):
        flow_run: FlowRun = await run_deployment(  # type: ignore[misc]  # sync-or-async: awaited in a flow
            SHARD_DEPLOYMENT,
            parameters={**sent, "index": index, "nodes": nodes},
            timeout=0,
            as_subflow=True,
            idempotency_key=f"{run.run_id}-shard-{index}",
        )
        started.append(flow_run.id)
    get_run_logger().info("%s: %d shards started on the pool (%s)", run.run_id, len(shards), SHARD_DEPLOYMENT)
    await _wait(run, shards, started, wait_s=wait_s)


async def _wait(run: CertificationRun, shards: Sequence[dict[str, int]], ids: Sequence[UUID], *, wait_s: float) -> None:
    """Poll the shards' flow runs until every one COMPLETED; raises :class:`ShardFailed` otherwise."""
    from prefect.client.orchestration import get_client

    deadline, crashed_since = time.monotonic() + wait_s, dict[int, float]()
    pending = dict(enumerate(ids))
    async with get_client() as client:
        while pending:
            for index, flow_run_id in list(pending.items()):
                flow_run = await client.read_flow_run(flow_run_id)
                state = flow_run.state.type.value if flow_run.state else "SCHEDULED"
                where = (
                    f"{run.run_id}: shard {index} ({len(shards[index])} nodes from {min(shards[index])}, "
                    f"flow run {flow_run.name})"
                )
                if state == "COMPLETED":
                    del pending[index]
                elif state in ("FAILED", "CANCELLED"):
                    raise ShardFailed(f"{where} ended {state}: {flow_run.state.message if flow_run.state else ''}")
                elif state == "CRASHED":
                    since = crashed_since.setdefault(index, time.monotonic())
                    if time.monotonic() - since > CRASH_GRACE_S:
                        raise ShardFailed(
                            f"{where} crashed and was not brought back in {CRASH_GRACE_S:.0f} s "
                            "(are automations.yaml's automations created?)"
                        )
                else:
                    crashed_since.pop(index, None)
            if pending and time.monotonic() > deadline:
                late = ", ".join(str(i) for i in sorted(pending))
                raise ShardFailed(
                    f"{run.run_id}: shards {late} not done in {wait_s:.0f} s (is a worker serving "
                    f"the pool of {SHARD_DEPLOYMENT}?)"
                )
            if pending:
                await asyncio.sleep(_POLL_S)
