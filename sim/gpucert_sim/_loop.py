"""An asyncio loop of its own in a thread: how each simulated server runs beside synchronous callers.

The simulated API server, the kubelets attached to a real one and the tests' fault proxy each serve from a
daemon thread: the thread sets up (binds its ports) on a new loop, says it is ready — or why it could not
start — and runs the loop until it is stopped.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

__all__ = ["run_loop"]


def run_loop(
    setup: Callable[[asyncio.AbstractEventLoop], Awaitable[None]],
    ready: threading.Event,
    failure: list[BaseException],
    started: Callable[[asyncio.AbstractEventLoop], None],
    *,
    catch: tuple[type[BaseException], ...] = (Exception,),
) -> None:
    """Run ``setup(loop)`` on a new loop in this thread; if it raises one of ``catch``, put the error in
    ``failure`` and set ``ready``; else call ``started(loop)``, set ``ready`` and run the loop until stopped
    (``loop.stop()`` from another thread)."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        loop.run_until_complete(setup(loop))
    except catch as exc:
        failure.append(exc)
        ready.set()
        loop.close()
        return
    started(loop)
    ready.set()
    try:
        loop.run_forever()
    finally:
        loop.close()
