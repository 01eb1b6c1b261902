"""The object store: server-set metadata, optimistic concurrency, the watch history, finalizers and GC.

It is the one place state changes, so every write (from an HTTP handler, a simulated controller or a test
seeding objects from Python) gets the same treatment: a fresh ``resourceVersion`` from one counter, an
event in the history that watches replay from, and a push to live watchers. Objects are never mutated
in place once stored, so readers may hold them without copying (a 1,000-node list is served straight
from the stored dicts).

Thread-safety: writes may come from the server's event-loop thread and from the test thread; one
re-entrant lock serialises them, and watchers are woken through their loop's ``call_soon_threadsafe``.

Listeners (:meth:`Store.subscribe`) are the simulated controllers' hook: they are called synchronously,
under the lock, with every event as it is stored, so an index a controller keeps from them is never a
step behind the objects it reads. They must be quick and must not write to the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from threading import RLock
from typing import Any

from ._resources import RESOURCES, ResourceType, lookup
from ._status import ApiError, conflict, invalid, not_found

__all__ = ["DEFAULT_HISTORY", "Listener", "Obj", "Store", "WatchEvent", "Watcher", "now_rfc3339"]

Obj = dict[str, Any]

#: Events a watch can be resumed from; older resourceVersions get 410 Gone, like etcd after compaction.
DEFAULT_HISTORY = 100_000
_NAMESPACES = lookup("", "v1", "namespaces")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apiserver's: no vowels, no look-alikes


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class WatchEvent:
    """One change, as stored in the history. ``old`` lets a selector watch see objects leave it."""

    rv: int
    type: str
    resource: str
    obj: Obj
    old: Obj | None = None


@dataclass(eq=False)
class Watcher:
    """A live watch: events of one resource, queued onto the watching request's event loop."""

    resource: str
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[WatchEvent] = field(default_factory=asyncio.Queue)

    def push(self, event: WatchEvent) -> None:
        # A closed loop means the watch ended under us: there is nobody left to deliver to.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


#: Called with each stored event, under the store's lock (see the module docstring).
Listener = Callable[[WatchEvent], None]


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


class Store:
    """All objects of the simulated cluster, by resource, namespace and name."""

    def __init__(self, *, history: int = DEFAULT_HISTORY) -> None:
        self.lock = RLock()
        self._objects: dict[str, dict[tuple[str, str], Obj]] = {r.key: {} for r in RESOURCES}
        self._rv = 0
        self._history: deque[WatchEvent] = deque()
        self._history_limit = history
        self._compacted = 0  # every event with rv > this is still in the history
        self._watchers: dict[str, set[Watcher]] = {r.key: set() for r in RESOURCES}
        self._logs: dict[tuple[str, str], str] = {}
        self._listeners: list[Listener] = []

    # --- reading ------------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def get(self, resource: ResourceType, namespace: str | None, name: str) -> Obj | None:
        return self._objects[resource.key].get((namespace or "", name))

    def list(self, resource: ResourceType, namespace: str | None = None) -> tuple[list[Obj], int]:
        """Objects sorted by namespace and name (stable pages for ``continue``), and the list's RV."""
        with self.lock:
            items = self._objects[resource.key]
            keys = sorted(k for k in items if namespace is None or k[0] == namespace)
            return [items[k] for k in keys], self._rv

    def namespace_exists(self, namespace: str) -> bool:
        assert _NAMESPACES is not None
        return ("", namespace) in self._objects[_NAMESPACES.key]

    # --- writing ------------------------------------------------------------------------------------

    def create(self, resource: ResourceType, obj: Mapping[str, Any]) -> Obj:
        """Store a new object; fills name from generateName and the metadata only a server sets."""
        with self.lock:
            meta = dict(_meta(obj))
            namespace = meta.get("namespace") if resource.namespaced else None
            if resource.namespaced and not (namespace and self.namespace_exists(namespace)):
                raise not_found("", "namespaces", namespace or "")
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(resource, namespace, meta["generateName"])
            name = meta.get("name")
            if not name:
                raise invalid(resource.kind, resource.group, "", "metadata.name", "FieldValueRequired",
                              "Required value: name or generateName is required")
            if (namespace or "", name) in self._objects[resource.key]:
                raise conflict(resource.group, resource.plural, name, "already exists", reason="AlreadyExists")
            self._rv += 1
            meta.update(uid=str(uuid.uuid4()), resourceVersion=str(self._rv),
                        creationTimestamp=now_rfc3339())
            meta.pop("deletionTimestamp", None)
            if resource.generation_tracks:
                meta["generation"] = 1
            stored = {"apiVersion": resource.api_version, "kind": resource.kind, **obj, "metadata": meta}
            self._objects[resource.key][(namespace or "", name)] = stored
            self._emit(resource, "ADDED", stored)
            return stored

    def update(self, resource: ResourceType, obj: Mapping[str, Any], *, expect_rv: str | None = None) -> Obj:
        """Replace a stored object; 409 when ``expect_rv`` is stale; no write (nor new RV) if unchanged."""
        with self.lock:
            meta = _meta(obj)
            namespace = meta.get("namespace") if resource.namespaced else None
            name = meta.get("name", "")
            current = self.get(resource, namespace, name)
            if current is None:
                raise not_found(resource.group, resource.plural, name)
            cur_meta = current["metadata"]
            if expect_rv and expect_rv != cur_meta["resourceVersion"]:
                raise conflict(resource.group, resource.plural, name,
                               "the object has been modified; please apply your changes to the latest "
                               "version and try again")
            new_meta = {**meta, **{k: cur_meta[k] for k in ("uid", "creationTimestamp", "resourceVersion")}}
            for k in ("deletionTimestamp", "generation"):
                if k in cur_meta:
                    new_meta[k] = cur_meta[k]
            tracked = resource.generation_tracks
            if tracked and obj.get(tracked) != current.get(tracked):
                new_meta["generation"] = int(cur_meta.get("generation", 0)) + 1
            new = {**obj, "apiVersion": resource.api_version, "kind": resource.kind, "metadata": new_meta}
            if new == current:
                return current
            if new_meta.get("deletionTimestamp") and not new_meta.get("finalizers"):
                return self._remove(resource, new)
            self._rv += 1
            new_meta["resourceVersion"] = str(self._rv)
            self._objects[resource.key][(namespace or "", name)] = new
            self._emit(resource, "MODIFIED", new, current)
            return new

    def delete(self, resource: ResourceType, namespace: str | None, name: str, *,
               propagation: str = "Background", expect_uid: str | None = None,
               expect_rv: str | None = None) -> tuple[Obj, bool]:
        """Delete now, or mark for deletion while finalizers remain; returns (object, still pending)."""
        with self.lock:
            current = self.get(resource, namespace, name)
            if current is None:
                raise not_found(resource.group, resource.plural, name)
            meta = current["metadata"]
            if (expect_uid and expect_uid != meta["uid"]) or (expect_rv and expect_rv != meta["resourceVersion"]):
                raise conflict(resource.group, resource.plural, name,
                               "Precondition failed: UID or ResourceVersion in precondition does not match")
            if meta.get("finalizers"):
                if meta.get("deletionTimestamp"):
                    return current, True
                marked = {**current, "metadata": {**meta, "deletionTimestamp": now_rfc3339(),
                                                  "deletionGracePeriodSeconds": 0}}
                self._rv += 1
                marked["metadata"]["resourceVersion"] = str(self._rv)
                self._objects[resource.key][(namespace or "", name)] = marked
                self._emit(resource, "MODIFIED", marked, current)
                return marked, True
            gone = self._remove(resource, current)
            if propagation != "Orphan":
                self._collect(resource, gone)
            return gone, False

    def compact(self) -> None:
        """Forget the history, as etcd compaction does: older resourceVersions now get 410 Gone."""
        with self.lock:
            self._history.clear()
            self._compacted = self._rv

    # --- logs ---------------------------------------------------------------------------------------

    def set_log(self, namespace: str, pod: str, text: str, container: str | None = None) -> None:
        """What ``pods/log`` answers for this pod (and container, when given)."""
        with self.lock:
            self._logs[(namespace, f"{pod}/{container or ''}")] = text

    def get_log(self, namespace: str, pod: str, container: str | None) -> str:
        with self.lock:
            if container and (namespace, f"{pod}/{container}") in self._logs:
                return self._logs[(namespace, f"{pod}/{container}")]
            return self._logs.get((namespace, f"{pod}/"), "")

    # --- watching -----------------------------------------------------------------------------------

    def watch(self, resource: ResourceType, since: int | None,
              loop: asyncio.AbstractEventLoop) -> tuple[Sequence[WatchEvent], Watcher]:
        """The events to replay and a registered watcher for the rest, taken atomically."""
        with self.lock:
            if since is None:
                replay = [WatchEvent(int(o["metadata"]["resourceVersion"]), "ADDED", resource.key, o)
                          for o in self.list(resource)[0]]
            elif since < self._compacted:
                raise ApiError(410, f"too old resource version: {since} ({self._compacted + 1})",
                               reason="Expired")
            else:
                replay = [e for e in self._history if e.rv > since and e.resource == resource.key]
            watcher = Watcher(resource.key, loop)
            self._watchers[resource.key].add(watcher)
            return replay, watcher

    def unwatch(self, watcher: Watcher) -> None:
        with self.lock:
            self._watchers[watcher.resource].discard(watcher)

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener`` with every event from now on, synchronously and under the lock."""
        with self.lock:
            self._listeners.append(listener)

    def unsubscribe(self, listener: Listener) -> None:
        with self.lock:
            if listener in self._listeners:
                self._listeners.remove(listener)

    # --- internals ----------------------------------------------------------------------------------

    def _generate_name(self, resource: ResourceType, namespace: str | None, prefix: str) -> str:
        while True:
            name = prefix + "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
            if (namespace or "", name) not in self._objects[resource.key]:
                return name

    def _remove(self, resource: ResourceType, obj: Obj) -> Obj:
        meta = obj["metadata"]
        self._objects[resource.key].pop((meta.get("namespace", "") if resource.namespaced else "", meta["name"]))
        self._rv += 1
        gone = {**obj, "metadata": {**meta, "resourceVersion": str(self._rv)}}
        self._emit(resource, "DELETED", gone)
        if resource is _NAMESPACES:
            self._delete_namespace_content(meta["name"])
        return gone

    def _dependents(self, owner_uid: str) -> Iterator[tuple[ResourceType, Obj]]:
        for r in RESOURCES:
            for obj in list(self._objects[r.key].values()):
                if any(ref.get("uid") == owner_uid for ref in obj["metadata"].get("ownerReferences") or ()):
                    yield r, obj

    def _collect(self, resource: ResourceType, owner: Obj) -> None:
        """Simple garbage collection: delete what the owner owned (and, recursively, what that owned)."""
        for r, obj in list(self._dependents(owner["metadata"]["uid"])):
            meta = obj["metadata"]
            if self.get(r, meta.get("namespace"), meta["name"]) is not None:
                self.delete(r, meta.get("namespace"), meta["name"])

    def _delete_namespace_content(self, namespace: str) -> None:
        for r in RESOURCES:
            if r.namespaced:
                for ns, name in [k for k in self._objects[r.key] if k[0] == namespace]:
                    self._remove(r, self._objects[r.key][(ns, name)])

    def _emit(self, resource: ResourceType, kind: str, obj: Obj, old: Obj | None = None) -> None:
        event = WatchEvent(self._rv, kind, resource.key, obj, old)
        self._history.append(event)
        while len(self._history) > self._history_limit:
            self._compacted = self._history.popleft().rv
        for watcher in self._watchers[resource.key]:
            watcher.push(event)
        for listener in self._listeners:
            listener(event)
