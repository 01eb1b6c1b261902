"""The object store: server-set metadata, optimistic concurrency, the watch history, finalizers and GC.

It is the one place state changes, so every write (from an HTTP handler, a simulated controller or a test
seeding objects from Python) gets the same treatment: a fresh ``resourceVersion`` from one counter, an
event in the history that watches replay from, and a push to live watchers. Objects are never mutated
in place once stored, so readers may hold them without copying (a 1,000-node list is served straight
from the stored dicts).

Thread-safety: writes may come from the server's event-loop thread and from the test thread; one
re-entrant lock serialises them. A watcher is handed an event directly when the write happens on its
loop's thread (the controllers and the API handlers write there) and through ``call_soon_threadsafe``
otherwise; a watcher with a filter (its namespace, name and selectors) is handed only what passes it.

Indexes, so that reads cost what they return at 10,000 nodes and 100,000 pods: the keys of each
resource are kept sorted (a list, or a page after a ``continue`` key, is a bisection and a slice, not a
sort), and each (label key, value) maps to the keys of the objects carrying it (a list by
``controller-uid=…`` reads the one pod it names; see :meth:`Store.page`).

Events are kept once, as a real server keeps them: ``events.k8s.io/v1`` is served from the core Events'
storage, each object converted on its way in and out (``_events.py``), so an Event written through either
API is read, listed (with either API's field selectors), watched and deleted through both.

Pod logs are kept as a kubelet keeps them: with their pod, gone when it is deleted (``pods/log`` of a
deleted pod is 404 anyway). A finished container's log is kept compressed when its writer asks: a
benchmark pod's is 95 KB of JSON lines (381 rows, 6 KB through zlib's level 1), and a 10,000-node
certify leaves 10,000 of them (and its pairs') for the Jobs' time to live: ~1 GB as text.

Listeners (:meth:`Store.subscribe`) are the simulated controllers' hook: they are called synchronously,
under the lock, with every event as it is stored, so an index a controller keeps from them is never a
step behind the objects it reads. They must be quick and must not write to the store.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import secrets
import threading
import uuid
import zlib
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from threading import RLock
from typing import Any, NamedTuple

from ._events import to_core, to_events_v1
from ._resources import RESOURCES, ResourceType, lookup
from ._selectors import Selector
from ._status import ApiError, conflict, invalid, not_found

__all__ = ["DEFAULT_HISTORY", "Listener", "Obj", "Page", "Store", "WatchEvent", "Watcher", "now_rfc3339"]

Obj = dict[str, Any]
#: (namespace, name); cluster-scoped objects have namespace "".
_Key = tuple[str, str]
_Keys = list[_Key]  # spelled here: inside Store, ``list`` is its method

#: Events a watch can be resumed from; older resourceVersions get 410 Gone, like etcd after compaction.
DEFAULT_HISTORY = 100_000
_NAMESPACES = lookup("", "v1", "namespaces")
_PODS = lookup("", "v1", "pods")
_EVENTS = lookup("", "v1", "events")
_EVENTS_V1 = lookup("events.k8s.io", "v1", "events")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # apiserver's: no vowels, no look-alikes


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Page(NamedTuple):
    """One page of a list: its objects in key order, the list's RV, whether more match after the last
    one, and how many objects remain after the page (None when a selector makes that unknown, as the
    API server leaves ``remainingItemCount`` out then)."""

    items: list[Obj]
    rv: int
    more: bool
    remaining: int | None


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
    """A live watch: events of one resource (those ``accept`` passes, when given), queued onto the
    watching request's event loop; ``thread`` is that loop's thread (the one that registered it)."""

    resource: str
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[WatchEvent] = field(default_factory=asyncio.Queue)
    accept: Callable[[WatchEvent], bool] | None = None
    thread: int = field(default_factory=threading.get_ident)
    #: A watch of a view (events.k8s.io Events): the stored event in the view's shape.
    convert: Callable[[WatchEvent], WatchEvent] | None = None

    def push(self, event: WatchEvent) -> None:
        if self.convert is not None:
            event = self.convert(event)
        if self.accept is not None and not self.accept(event):
            return
        if threading.get_ident() == self.thread:
            # Written on the watch's own loop (a controller, an API handler): no wake-up through the
            # loop's self-pipe is needed, which at a burst of 10,000 writes was most of their cost.
            self.queue.put_nowait(event)
            return
        # A closed loop means the watch ended under us: there is nobody left to deliver to.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)


#: Called with each stored event, under the store's lock (see the module docstring).
Listener = Callable[[WatchEvent], None]
Convert = Callable[[Mapping[str, Any]], Obj]


class _View(NamedTuple):
    """A resource served from another's storage: that resource, and the conversions into its shape
    (a write) and out of it (a read)."""

    stored: ResourceType
    into: Convert
    out: Convert


assert _EVENTS is not None
assert _EVENTS_V1 is not None
_VIEWS: dict[str, _View] = {_EVENTS_V1.key: _View(_EVENTS, to_core, to_events_v1)}
#: The resources that have a storage of their own.
_STORED = tuple(r for r in RESOURCES if r.key not in _VIEWS)


def _served(event: WatchEvent, resource: ResourceType, view: _View) -> WatchEvent:
    """``event`` of a stored object as a watch of ``resource`` (served through ``view``) sees it."""
    old = view.out(event.old) if event.old is not None else None
    return WatchEvent(event.rv, event.type, resource.key, view.out(event.obj), old)


def _converter(resource: ResourceType, view: _View) -> Callable[[WatchEvent], WatchEvent]:
    return lambda event: _served(event, resource, view)


def _storage(resource: ResourceType) -> tuple[ResourceType, _View | None]:
    """The resource whose storage holds ``resource``'s objects, and the view that converts them (None
    when that is ``resource`` itself)."""
    view = _VIEWS.get(resource.key)
    return (view.stored, view) if view is not None else (resource, None)


@contextlib.contextmanager
def _named_as(resource: ResourceType, stored: ResourceType) -> Iterator[None]:
    """A write through a view fails naming the view's resource (``events.events.k8s.io "x" not found``),
    as the API server names the resource of the request."""
    try:
        yield
    except ApiError as exc:
        details = exc.details or {}
        if details.get("group") != stored.group or details.get("kind") != stored.plural:
            raise  # not about the object (its namespace is missing, say)
        what = f"{resource.plural}.{resource.group}" if resource.group else resource.plural
        raise ApiError(
            exc.code,
            exc.message.replace(f'{stored.plural} "', f'{what} "', 1),
            reason=exc.reason,
            details={**details, "group": resource.group},
            headers=exc.headers,
        ) from None


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


_NO_LABELS: dict[str, Any] = {}
_ABSENT = object()


def _labels(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    labels = _meta(obj).get("labels")
    return labels if isinstance(labels, dict) else _NO_LABELS


def _owners(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """The uids ``obj``'s ownerReferences name (what garbage collection follows)."""
    refs = _meta(obj).get("ownerReferences")
    if not refs:
        return ()
    return tuple(str(r["uid"]) for r in refs if isinstance(r, Mapping) and r.get("uid"))


class Store:
    """All objects of the simulated cluster, by resource, namespace and name."""

    def __init__(self, *, history: int = DEFAULT_HISTORY) -> None:
        self.lock = RLock()
        self._objects: dict[str, dict[_Key, Obj]] = {r.key: {} for r in _STORED}
        self._keys: dict[str, list[_Key]] = {r.key: [] for r in _STORED}  # sorted
        self._by_label: dict[str, dict[tuple[str, str], set[_Key]]] = {r.key: {} for r in _STORED}
        self._owned: dict[str, set[tuple[str, _Key]]] = {}  # owner uid → (resource, key) of dependents
        self._rv = 0
        self._history: deque[WatchEvent] = deque()
        self._history_limit = history
        self._compacted = 0  # every event with rv > this is still in the history
        self._watchers: dict[str, set[Watcher]] = {r.key: set() for r in _STORED}
        # (namespace, pod) → container ("" for the pod's own) → the log, as text or zlib-compressed
        self._logs: dict[tuple[str, str], dict[str, str | bytes]] = {}
        self._listeners: list[Listener] = []

    # --- reading ------------------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def get(self, resource: ResourceType, namespace: str | None, name: str) -> Obj | None:
        view = _VIEWS.get(resource.key)
        if view is None:
            return self._objects[resource.key].get((namespace or "", name))
        found = self._objects[view.stored.key].get((namespace or "", name))
        return view.out(found) if found is not None else None

    def list(self, resource: ResourceType, namespace: str | None = None) -> tuple[list[Obj], int]:
        """Objects sorted by namespace and name (stable pages for ``continue``), and the list's RV."""
        with self.lock:
            stored, view = _storage(resource)
            items = self._objects[stored.key]
            found = [items[k] for k in self._range(stored, namespace)]
            return ([view.out(o) for o in found] if view else found), self._rv

    def page(
        self,
        resource: ResourceType,
        namespace: str | None = None,
        *,
        selector: Selector | None = None,
        after: _Key | None = None,
        limit: int | None = None,
    ) -> Page:
        """The objects (of ``namespace``, matching ``selector``) whose key sorts after ``after``, at most
        ``limit`` of them; label values and a name the selector pins are read from the indexes."""
        with self.lock:
            stored, view = _storage(resource)
            items = self._objects[stored.key]
            candidates = self._candidates(stored, selector) if selector else None
            if candidates is not None:
                keys = sorted(
                    k for k in candidates if (namespace is None or k[0] == namespace) and (after is None or k > after)
                )
            else:
                keys = self._range(stored, namespace, after)
            if not selector:
                more = bool(limit) and len(keys) > (limit or 0)
                chosen = keys[:limit] if limit else keys
                remaining = len(keys) - len(chosen)
                page = [items[k] for k in chosen]
                return Page([view.out(o) for o in page] if view else page, self._rv, more, remaining)
            found: list[Obj] = []
            for key in keys:
                # A view's selector names its own fields (regarding.kind …): matched in its shape.
                obj = view.out(items[key]) if view else items[key]
                if selector.matches(obj):
                    if limit and len(found) == limit:
                        return Page(found, self._rv, True, None)
                    found.append(obj)
            return Page(found, self._rv, False, None)

    def labelled(self, resource: ResourceType, label: str, value: str) -> set[tuple[str, str]]:
        """The keys of the objects whose label ``label`` is ``value`` (a copy, from the index)."""
        with self.lock:
            return set(self._by_label[_storage(resource)[0].key].get((label, value), ()))

    def namespace_exists(self, namespace: str) -> bool:
        assert _NAMESPACES is not None
        return ("", namespace) in self._objects[_NAMESPACES.key]

    # --- writing ------------------------------------------------------------------------------------

    def create(self, resource: ResourceType, obj: Mapping[str, Any], *, uid: str | None = None) -> Obj:
        """Store a new object; fills name from generateName and the metadata only a server sets (``uid``: the
        one it has elsewhere, for a mirror of another server's object)."""
        stored_as, view = _storage(resource)
        if view is not None:
            with _named_as(resource, stored_as):
                return view.out(self.create(stored_as, view.into(obj), uid=uid))
        with self.lock:
            meta = dict(_meta(obj))
            namespace = meta.get("namespace") if resource.namespaced else None
            if resource.namespaced and not (namespace and self.namespace_exists(namespace)):
                raise not_found("", "namespaces", namespace or "")
            if not meta.get("name") and meta.get("generateName"):
                meta["name"] = self._generate_name(resource, namespace, meta["generateName"])
            name = meta.get("name")
            if not name:
                raise invalid(
                    resource.kind,
                    resource.group,
                    "",
                    "metadata.name",
                    "FieldValueRequired",
                    "Required value: name or generateName is required",
                )
            if (namespace or "", name) in self._objects[resource.key]:
                raise conflict(resource.group, resource.plural, name, "already exists", reason="AlreadyExists")
            self._rv += 1
            meta.update(uid=uid or str(uuid.uuid4()), resourceVersion=str(self._rv), creationTimestamp=now_rfc3339())
            meta.pop("deletionTimestamp", None)
            if resource.generation_tracks:
                meta["generation"] = 1
            stored = {"apiVersion": resource.api_version, "kind": resource.kind, **obj, "metadata": meta}
            self._put(resource, (namespace or "", name), stored, None)
            self._emit(resource, "ADDED", stored)
            return stored

    def update(self, resource: ResourceType, obj: Mapping[str, Any], *, expect_rv: str | None = None) -> Obj:
        """Replace a stored object; 409 when ``expect_rv`` is stale; no write (nor new RV) if unchanged."""
        stored_as, view = _storage(resource)
        if view is not None:
            with _named_as(resource, stored_as):
                return view.out(self.update(stored_as, view.into(obj), expect_rv=expect_rv))
        with self.lock:
            meta = _meta(obj)
            namespace = meta.get("namespace") if resource.namespaced else None
            name = meta.get("name", "")
            current = self.get(resource, namespace, name)
            if current is None:
                raise not_found(resource.group, resource.plural, name)
            cur_meta = current["metadata"]
            if expect_rv and expect_rv != cur_meta["resourceVersion"]:
                raise conflict(
                    resource.group,
                    resource.plural,
                    name,
                    "the object has been modified; please apply your changes to the latest version and try again",
                )
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
            self._put(resource, (namespace or "", name), new, current)
            self._emit(resource, "MODIFIED", new, current)
            return new

    def delete(
        self,
        resource: ResourceType,
        namespace: str | None,
        name: str,
        *,
        propagation: str = "Background",
        expect_uid: str | None = None,
        expect_rv: str | None = None,
    ) -> tuple[Obj, bool]:
        """Delete now, or mark for deletion while finalizers remain; returns (object, still pending)."""
        stored_as, view = _storage(resource)
        if view is not None:
            with _named_as(resource, stored_as):
                gone, pending = self.delete(
                    stored_as, namespace, name, propagation=propagation, expect_uid=expect_uid, expect_rv=expect_rv
                )
            return view.out(gone), pending
        with self.lock:
            current = self.get(resource, namespace, name)
            if current is None:
                raise not_found(resource.group, resource.plural, name)
            meta = current["metadata"]
            if (expect_uid and expect_uid != meta["uid"]) or (expect_rv and expect_rv != meta["resourceVersion"]):
                raise conflict(
                    resource.group,
                    resource.plural,
                    name,
                    "Precondition failed: UID or ResourceVersion in precondition does not match",
                )
            if meta.get("finalizers"):
                if meta.get("deletionTimestamp"):
                    return current, True
                marked = {
                    **current,
                    "metadata": {**meta, "deletionTimestamp": now_rfc3339(), "deletionGracePeriodSeconds": 0},
                }
                self._rv += 1
                marked["metadata"]["resourceVersion"] = str(self._rv)
                self._put(resource, (namespace or "", name), marked, current)
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

    def set_log(
        self, namespace: str, pod: str, text: str, container: str | None = None, *, compress: bool = False
    ) -> None:
        """What ``pods/log`` answers for this pod (and container, when given) while the pod exists; nothing
        is kept for a pod that is not there (deleted while its kubelet was writing). ``compress`` for a log
        that is final and that only the store holds (a finished container's): it costs a decompression
        at each read, so not for one that is read back and rewritten as it grows (a training pod's)."""
        assert _PODS is not None
        kept: str | bytes = zlib.compress(text.encode(), 1) if compress else text
        with self.lock:
            if (namespace, pod) in self._objects[_PODS.key]:
                self._logs.setdefault((namespace, pod), {})[container or ""] = kept

    def get_log(self, namespace: str, pod: str, container: str | None) -> str:
        """The log of this pod (of ``container`` when it has one of its own), "" when none was set."""
        with self.lock:
            logs = self._logs.get((namespace, pod), {})
            kept = logs[container] if container and container in logs else logs.get("", "")
        return zlib.decompress(kept).decode() if isinstance(kept, bytes) else kept

    # --- watching -----------------------------------------------------------------------------------

    def watch(
        self,
        resource: ResourceType,
        since: int | None,
        loop: asyncio.AbstractEventLoop,
        *,
        accept: Callable[[WatchEvent], bool] | None = None,
    ) -> tuple[Sequence[WatchEvent], Watcher]:
        """The events to replay and a registered watcher for the rest (only the events ``accept`` passes,
        when given; called under the lock by the writer), taken atomically. Call on ``loop``'s thread."""
        stored, view = _storage(resource)
        with self.lock:
            if since is None:
                replay = [
                    WatchEvent(int(o["metadata"]["resourceVersion"]), "ADDED", resource.key, o)
                    for o in self.list(resource)[0]
                ]
            elif since < self._compacted:
                raise ApiError(410, f"too old resource version: {since} ({self._compacted + 1})", reason="Expired")
            else:
                replay = [e for e in self._history if e.rv > since and e.resource == stored.key]
                if view is not None:
                    replay = [_served(e, resource, view) for e in replay]
            # A view's watcher waits on the stored resource's events and sees them in the view's shape.
            convert = _converter(resource, view) if view is not None else None
            watcher = Watcher(stored.key, loop, accept=accept, convert=convert)
            self._watchers[stored.key].add(watcher)
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

    def _range(self, resource: ResourceType, namespace: str | None, after: _Key | None = None) -> _Keys:
        """The sorted keys of ``namespace`` (all when None) that sort after ``after``."""
        keys = self._keys[resource.key]
        lo, hi = 0, len(keys)
        if namespace is not None:
            # (ns, name) for every name lies between (ns,) and (ns + "\0",): see tuple ordering.
            lo = bisect.bisect_left(keys, (namespace,))
            hi = bisect.bisect_left(keys, (namespace + "\0",), lo)
        if after is not None:
            lo = max(lo, bisect.bisect_right(keys, after, lo, hi))
        return keys[lo:hi]

    def _candidates(self, resource: ResourceType, selector: Selector) -> set[_Key] | None:
        """A superset of the keys ``selector`` can match, from the indexes; None when they say nothing."""
        objects = self._objects[resource.key]
        best: set[_Key] | None = None
        if selector.name is not None and not resource.namespaced:
            best = {("", selector.name)} if ("", selector.name) in objects else set()
        index = self._by_label[resource.key]
        for label, values in selector.pinned:
            found: set[_Key] = set()
            for value in values:
                found |= index.get((label, value), set())
            if best is None or len(found) < len(best):
                best = found
            if not best:
                break
        return best

    def _put(self, resource: ResourceType, key: _Key, new: Obj, old: Obj | None) -> None:
        """Store ``new`` under ``key`` (replacing ``old``, or a new key when None), indexes included."""
        self._objects[resource.key][key] = new
        if old is None:
            bisect.insort(self._keys[resource.key], key)
        self._index(resource, key, _labels(old) if old is not None else _NO_LABELS, _labels(new))
        self._own(resource, key, _owners(old) if old is not None else (), _owners(new))

    def _drop(self, resource: ResourceType, key: _Key) -> Obj:
        old = self._objects[resource.key].pop(key)
        keys = self._keys[resource.key]
        at = bisect.bisect_left(keys, key)
        if at < len(keys) and keys[at] == key:
            del keys[at]
        self._index(resource, key, _labels(old), _NO_LABELS)
        self._own(resource, key, _owners(old), ())
        return old

    def _own(self, resource: ResourceType, key: _Key, before: tuple[str, ...], after: tuple[str, ...]) -> None:
        if before == after:
            return
        entry = (resource.key, key)
        for uid in before:
            if uid not in after and uid in self._owned:
                self._owned[uid].discard(entry)
                if not self._owned[uid]:
                    del self._owned[uid]
        for uid in after:
            self._owned.setdefault(uid, set()).add(entry)

    def _index(self, resource: ResourceType, key: _Key, before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
        if before is after:
            return
        index = self._by_label[resource.key]
        for label, value in before.items():
            if after.get(label, _ABSENT) != value:
                entry = (label, str(value))
                keys = index.get(entry)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[entry]
        for label, value in after.items():
            if before.get(label, _ABSENT) != value:
                index.setdefault((label, str(value)), set()).add(key)

    def _generate_name(self, resource: ResourceType, namespace: str | None, prefix: str) -> str:
        while True:
            name = prefix + "".join(secrets.choice(_GENERATE_ALPHABET) for _ in range(5))
            if (namespace or "", name) not in self._objects[resource.key]:
                return name

    def _remove(self, resource: ResourceType, obj: Obj) -> Obj:
        meta = obj["metadata"]
        self._drop(resource, (meta.get("namespace", "") if resource.namespaced else "", meta["name"]))
        if resource is _PODS:
            self._logs.pop((meta.get("namespace", ""), meta["name"]), None)
        self._rv += 1
        gone = {**obj, "metadata": {**meta, "resourceVersion": str(self._rv)}}
        self._emit(resource, "DELETED", gone)
        if resource is _NAMESPACES:
            self._delete_namespace_content(meta["name"])
        return gone

    def _dependents(self, owner_uid: str) -> Iterator[tuple[ResourceType, Obj]]:
        owned = self._owned.get(owner_uid)
        if not owned:
            return
        for r in _STORED:
            for key in sorted(k for rk, k in owned if rk == r.key):
                yield r, self._objects[r.key][key]

    def _collect(self, resource: ResourceType, owner: Obj) -> None:
        """Simple garbage collection: delete what the owner owned (and, recursively, what that owned)."""
        for r, obj in list(self._dependents(owner["metadata"]["uid"])):
            meta = obj["metadata"]
            if self.get(r, meta.get("namespace"), meta["name"]) is not None:
                self.delete(r, meta.get("namespace"), meta["name"])

    def _delete_namespace_content(self, namespace: str) -> None:
        for r in _STORED:
            if r.namespaced:
                for key in self._range(r, namespace):
                    self._remove(r, self._objects[r.key][key])

    def _emit(self, resource: ResourceType, kind: str, obj: Obj, old: Obj | None = None) -> None:
        event = WatchEvent(self._rv, kind, resource.key, obj, old)
        self._history.append(event)
        while len(self._history) > self._history_limit:
            self._compacted = self._history.popleft().rv
        for watcher in self._watchers[resource.key]:
            watcher.push(event)
        for listener in self._listeners:
            listener(event)
