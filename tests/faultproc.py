"""A certify run in a process of its own, so that a test can kill it: the fault matrix's killed-run rows.

The processes come from a fork server that imported this module (and with it ``flows.certify`` and
Prefect) once, so each killed run starts in a fraction of a second instead of paying seconds of imports.
A child runs the real flow against the test's Prefect server and simulated cluster; it dies by SIGKILL,
from the test or from :func:`gpucert._crashpoints.crashpoint` at the step ``crash_at`` names.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
from collections.abc import Mapping
from multiprocessing.context import ForkServerContext
from typing import Any

from gpucert._crashpoints import CRASH_ENV
from gpucert.blocks.cluster import GpuCluster
from gpucert.blocks.store import StoreLocation
from gpucert.flows.certify import certify

__all__ = ["certify_in_child", "fork_server"]


def fork_server() -> ForkServerContext:
    """The fork-server context whose server has this module (so Prefect and the flows) imported."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def certify_in_child(
    api_url: str, kubeconfig: str, store_uri: str, run_id: str, crash_at: str | None, kwargs: Mapping[str, Any]
) -> None:
    """Run certify (``run_id``, more flow parameters in ``kwargs``) against the Prefect server ``api_url``;
    ``crash_at`` names the crash point to die at (None: none)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    if crash_at:
        os.environ[CRASH_ENV] = crash_at
    with temporary_settings(updates={PREFECT_API_URL: api_url, PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        asyncio.run(
            certify(
                cluster=GpuCluster(kubeconfig=kubeconfig), store=StoreLocation(uri=store_uri), run_id=run_id, **kwargs
            )
        )
