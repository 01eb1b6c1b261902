"""The slot of the benchmarks' global concurrency limit that every benchmark Job (a node's, a pair's) holds."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable

from prefect.concurrency.asyncio import concurrency

__all__ = ["CONCURRENCY_LIMIT", "benchmark_slot"]

#: The Prefect global concurrency limit every benchmark Job holds a slot of while it runs; create it
#: (``prefect gcl create gpucert-benchmarks --limit N``) to bound Jobs across concurrent certify runs.
CONCURRENCY_LIMIT = "gpucert-benchmarks"

Slot = Callable[[], contextlib.AbstractAsyncContextManager[None]]


async def _limit_exists() -> bool:
    """Whether the global concurrency limit was created (else Prefect would warn once per Job)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    async with get_client() as client:
        try:
            await client.read_global_concurrency_limit_by_name(CONCURRENCY_LIMIT)
        except ObjectNotFound:
            return False
    return True


@contextlib.asynccontextmanager
async def _slot() -> AsyncIterator[None]:
    async with concurrency(CONCURRENCY_LIMIT, occupy=1, strict=False):
        yield


async def benchmark_slot() -> Slot | None:
    """What a wave enters around each Job: a slot of :data:`CONCURRENCY_LIMIT`, or None when the limit
    was not created."""
    return _slot if await _limit_exists() else None
