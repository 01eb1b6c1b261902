"""The controller runtime: one task on the simulator's event loop that runs the simulated controllers.

A real cluster's controllers are level-triggered reconcilers fed by watches; so are these, fed by a
store listener instead of HTTP watches (the same events, with no serialisation and never a step behind
the store). The listener, called under the store's lock with every stored event, keeps a pod index
up to date and marks the keys each controller must look at again; the runtime task then reconciles the
marked keys, each reading the store's current state. A reconcile that finds nothing to change writes
nothing, so the cluster settles. Timers (a pod's run time, a Job's deadline, a TTL) mark a key again
when they fire; nothing is polled.

Controllers run on the loop that serves the API, so a reconcile must be quick; the task yields between
batches, so requests are answered while a rollout is under way. Keys marked many times before the task
gets to them are reconciled once (1,000 pods of a DaemonSet starting cost one DaemonSet reconcile per
batch, not 1,000).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from ._objects import PODS, Key, controller_ref, key_of
from ._store import Obj, Store, WatchEvent

__all__ = ["Controller", "PodIndex", "Runtime", "SimTiming"]

_LOG = logging.getLogger("gpucert_sim")


@dataclass(frozen=True)
class SimTiming:
    """How long simulated things take, in seconds of wall time (all near zero by default, for tests).

    ``pod_ready_s`` applies per pod, so for a DaemonSet it is the rollout time of each node.
    A pod can set its own run time with the annotation ``sim.gpucert.io/run-seconds``.
    """

    #: From bound to a node to Running (image pull, container start).
    pod_start_s: float = 0.0
    #: From Running to Ready.
    pod_ready_s: float = 0.0
    #: From Running to Succeeded/Failed, for pods that end (restartPolicy Never or OnFailure).
    pod_run_s: float = 0.0

    def __post_init__(self) -> None:
        if min(self.pod_start_s, self.pod_ready_s, self.pod_run_s) < 0:
            raise ValueError("simulated times must be >= 0")


class Controller(Protocol):
    """One simulated controller: which keys an event concerns, and how to bring one key in line."""

    def resync(self) -> Iterable[Key]:
        """Every key to look at when the runtime starts (objects stored before it ran)."""
        ...

    def keys(self, event: WatchEvent) -> Iterable[Key]:
        """Keys to reconcile after ``event``; called under the store's lock, so it must be quick."""
        ...

    def reconcile(self, key: Key) -> None:
        """Read the current state of ``key`` and write what is missing; called under the store's lock."""
        ...


class PodIndex:
    """Pods by node and by controlling owner's uid, kept exactly in step with the store by its listener."""

    def __init__(self) -> None:
        self._by_node: dict[str, dict[Key, Obj]] = {}
        self._by_owner: dict[str, dict[Key, Obj]] = {}
        self._where: dict[Key, tuple[str | None, str | None]] = {}

    def on_node(self, node: str) -> list[Obj]:
        return list(self._by_node.get(node, {}).values())

    def owned_by(self, uid: str) -> list[Obj]:
        return list(self._by_owner.get(uid, {}).values())

    def rebuild(self, pods: Iterable[Obj]) -> None:
        self._by_node.clear()
        self._by_owner.clear()
        self._where.clear()
        for pod in pods:
            self._add(pod)

    def apply(self, event: WatchEvent) -> None:
        if event.resource != PODS.key:
            return
        self._remove(key_of(event.obj))
        if event.type != "DELETED":
            self._add(event.obj)

    def _add(self, pod: Obj) -> None:
        key = key_of(pod)
        node = (pod.get("spec") or {}).get("nodeName") or None
        ref = controller_ref(pod)
        owner = str(ref["uid"]) if ref and ref.get("uid") else None
        if node:
            self._by_node.setdefault(node, {})[key] = pod
        if owner:
            self._by_owner.setdefault(owner, {})[key] = pod
        self._where[key] = (node, owner)

    def _remove(self, key: Key) -> None:
        node, owner = self._where.pop(key, (None, None))
        for table, at in ((self._by_node, node), (self._by_owner, owner)):
            if at is not None and at in table:
                table[at].pop(key, None)
                if not table[at]:
                    del table[at]


class Runtime:
    """Runs controllers on one event loop; see the module docstring."""

    def __init__(self, store: Store, loop: asyncio.AbstractEventLoop) -> None:
        self.store = store
        self.loop = loop
        self.pods = PodIndex()
        #: Reconcile failures (a bug of the simulator), kept for tests to assert there were none.
        self.errors: list[str] = []
        self._controllers: list[Controller] = []
        self._dirty: list[dict[Key, None]] = []
        self._timers: dict[tuple[int, Key], tuple[float, asyncio.TimerHandle]] = {}
        self._wake = asyncio.Event()
        self._wake_pending = False
        self._task: asyncio.Task[None] | None = None

    def add(self, controller: Controller) -> None:
        self._controllers.append(controller)
        self._dirty.append({})

    def now(self) -> float:
        """Monotonic seconds: what simulated durations are measured in."""
        return self.loop.time()

    # --- life ---------------------------------------------------------------------------------------

    def start(self) -> None:
        """Index what is stored, subscribe, and reconcile everything once; call on the runtime's loop."""
        with self.store.lock:
            self.pods.rebuild(self.store.list(PODS)[0])
            self.store.subscribe(self._on_event)
            for index, controller in enumerate(self._controllers):
                self._dirty[index].update(dict.fromkeys(controller.resync()))
            self._poke()
        self._task = self.loop.create_task(self._run(), name="gpucert-sim-controllers")

    async def stop(self) -> None:
        self.store.unsubscribe(self._on_event)
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # --- marking ------------------------------------------------------------------------------------

    def mark(self, controller: Controller, key: Key) -> None:
        with self.store.lock:
            self._dirty[self._index(controller)][key] = None
            self._poke()

    def after(self, delay_s: float, controller: Controller, key: Key) -> None:
        """Reconcile ``key`` again in ``delay_s`` seconds (an earlier pending timer for it wins)."""
        slot = (self._index(controller), key)
        due = self.now() + max(0.0, delay_s)
        pending = self._timers.get(slot)
        if pending is not None:
            if pending[0] <= due + 1e-3:
                return
            pending[1].cancel()
        handle = self.loop.call_at(due, self._fire, slot)
        self._timers[slot] = (due, handle)

    def _fire(self, slot: tuple[int, Key]) -> None:
        self._timers.pop(slot, None)
        with self.store.lock:
            self._dirty[slot[0]][slot[1]] = None
            self._poke()

    def _index(self, controller: Controller) -> int:
        for index, known in enumerate(self._controllers):
            if known is controller:
                return index
        raise ValueError("controller not added to this runtime")

    def _on_event(self, event: WatchEvent) -> None:
        # Runs in whichever thread wrote, under the store's lock (see Store.subscribe).
        self.pods.apply(event)
        marked = False
        for index, controller in enumerate(self._controllers):
            for key in controller.keys(event):
                self._dirty[index][key] = None
                marked = True
        if marked:
            self._poke()

    def _poke(self) -> None:
        if not self._wake_pending:
            self._wake_pending = True
            with contextlib.suppress(RuntimeError):  # the loop closed under us: nobody left to wake
                self.loop.call_soon_threadsafe(self._wake.set)

    # --- running ------------------------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while True:
                with self.store.lock:
                    self._wake_pending = False
                    batch = [(c, key) for c, dirty in zip(self._controllers, self._dirty, strict=True) for key in dirty]
                    for dirty in self._dirty:
                        dirty.clear()
                if not batch:
                    break
                for controller, key in batch:
                    with self.store.lock:
                        try:
                            controller.reconcile(key)
                        except Exception as exc:
                            _LOG.exception("simulated %s: reconcile of %s failed", type(controller).__name__, key)
                            self.errors.append(f"{type(controller).__name__} {key}: {exc!r}")
                # Let the API server answer requests between batches.
                await asyncio.sleep(0)
