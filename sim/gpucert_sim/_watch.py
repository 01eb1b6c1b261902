"""Watch streams: JSON lines of ``{"type", "object"}``, resumable from a resourceVersion.

Semantics of a real API server that clients rely on: no resourceVersion (or ``0``) starts with an ADDED
per existing object; a remembered resourceVersion replays only what came after it; a forgotten one is
answered with an ERROR event carrying a 410 Gone ``Status`` (HTTP 200, as the real server does, so the
client's watch loop sees it and re-lists); ``timeoutSeconds`` ends the stream cleanly; selectors turn an
object leaving the selection into DELETED and one entering it into ADDED. The fault policy's
``watch_expired_rate`` answers a resumed watch the same way a forgotten version is answered, on demand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from aiohttp import web

from ._faults import FaultInjector
from ._selectors import Selector, parse_selectors
from ._status import ApiError, bad_request
from ._store import Store, WatchEvent
from ._verbs import Target

__all__ = ["serve_watch"]

#: A real server's watch without timeoutSeconds lasts a random 30–60 min (--min-request-timeout).
_DEFAULT_TIMEOUT_S = 1800.0
#: The most events sent in one write (one chunk).
_BATCH = 512


def _since(query: Mapping[str, str]) -> int | None:
    raw = query.get("resourceVersion")
    if raw in (None, "", "0"):
        return None
    try:
        return int(raw)
    except ValueError as exc:
        raise bad_request(f"invalid resource version: {raw!r}") from exc


def _timeout(query: Mapping[str, str]) -> float:
    raw = query.get("timeoutSeconds")
    if raw in (None, ""):
        return _DEFAULT_TIMEOUT_S
    try:
        return max(0.0, float(raw))
    except ValueError as exc:
        raise bad_request(f"invalid timeoutSeconds: {raw!r}") from exc


def _visible(event: WatchEvent, target: Target, selector: Selector) -> str | None:
    """The event type this watch sees for ``event``, or None when it is outside the watch."""
    if target.namespace is not None and event.obj["metadata"].get("namespace") != target.namespace:
        return None
    if target.name is not None and event.obj["metadata"].get("name") != target.name:
        return None
    if not selector or event.type != "MODIFIED":
        return event.type if selector.matches(event.obj) else None
    now, before = selector.matches(event.obj), selector.matches(event.old)
    if now:
        return "MODIFIED" if before else "ADDED"
    return "DELETED" if before else None


def _line(kind: str, obj: Any) -> bytes:
    return orjson.dumps({"type": kind, "object": obj}) + b"\n"


async def _write(
    response: web.StreamResponse, events: Sequence[WatchEvent], target: Target, selector: Selector
) -> None:
    """Send the events of ``events`` this watch sees, as one chunk of JSON lines."""
    lines = [_line(kind, e.obj) for e in events if (kind := _visible(e, target, selector))]
    if lines:
        await response.write(b"".join(lines))


async def serve_watch(
    request: web.Request, target: Target, store: Store, faults: FaultInjector, *, bookmark_interval_s: float
) -> web.StreamResponse:
    query = request.query
    since, timeout = _since(query), _timeout(query)
    selector = parse_selectors(query.get("labelSelector"), query.get("fieldSelector"), target.resource)
    bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    response.enable_chunked_encoding()
    loop = asyncio.get_running_loop()
    try:
        if since is not None and faults.expire_watch():
            raise ApiError(410, f"too old resource version: {since} ({store.resource_version})", reason="Expired")
        replay, watcher = store.watch(
            target.resource, since, loop, accept=lambda event: _visible(event, target, selector) is not None
        )
    except ApiError as exc:
        await response.prepare(request)
        await response.write(_line("ERROR", exc.body()))
        await response.write_eof()
        return response
    await response.prepare(request)
    start = loop.time()
    deadline = start + timeout
    drop_after = faults.policy.drop_watch_after_s
    drop_at = start + drop_after if drop_after is not None else None
    next_bookmark = start + bookmark_interval_s
    try:
        for at in range(0, len(replay), _BATCH):
            await _write(response, replay[at : at + _BATCH], target, selector)
        if bookmarks and query.get("sendInitialEvents") in ("true", "1"):
            # The state as of now is sent: a bookmark so annotated says so (a streaming list's end, KEP-3157).
            end = _bookmark(target, store)
            end["metadata"]["annotations"] = {"k8s.io/initial-events-end": "true"}
            await response.write(_line("BOOKMARK", end))
        queue = watcher.queue
        while True:
            now = loop.time()
            if drop_at is not None and now >= drop_at:
                # Cut the connection without the chunked terminator: the client sees a broken stream.
                if request.transport is not None:
                    request.transport.close()
                return response
            if now >= deadline:
                break
            batch: list[WatchEvent] = []
            if queue.empty():
                wake = min(t for t in (deadline, drop_at, next_bookmark if bookmarks else None) if t is not None)
                try:
                    batch.append(await asyncio.wait_for(queue.get(), max(0.0, wake - now)))
                except TimeoutError:
                    if bookmarks and loop.time() >= next_bookmark:
                        next_bookmark = loop.time() + bookmark_interval_s
                        await response.write(_line("BOOKMARK", _bookmark(target, store)))
                    continue
            # What else is queued goes out in the same write: a burst of 10,000 events is a few
            # writes, not 10,000 round trips through the loop.
            while len(batch) < _BATCH and not queue.empty():
                batch.append(queue.get_nowait())
            await _write(response, batch, target, selector)
    except ConnectionResetError:  # the client went away; nothing left to tell it
        return response
    finally:
        store.unwatch(watcher)
    await response.write_eof()
    return response


def _bookmark(target: Target, store: Store) -> dict[str, Any]:
    return {
        "kind": target.resource.kind,
        "apiVersion": target.resource.api_version,
        "metadata": {"resourceVersion": str(store.resource_version)},
    }
