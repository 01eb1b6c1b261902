"""A local fake of the Jira REST v2 calls gpucert makes, and a helper that serves an aiohttp app in a thread.

The subset docs/design/testing.md ("Notes on the components") describes: ``serverInfo``, ``field``,
``project/{key}``, ``issue`` POST/GET/PUT, comments, ``transitions`` GET/POST and ``search`` with a tiny JQL
(``a = b AND …`` over ``project``, ``labels``, ``status`` and ``key``). It checks basic or bearer auth,
validates issue types, priorities and transitions as Jira does, records every request, and can answer the next
requests with injected errors. It proves the encoded wire contract the real ``jira`` client speaks, not Jira's
behaviour beyond it.
"""

from __future__ import annotations

import asyncio
import base64
import re
import threading
from datetime import UTC, datetime
from types import TracebackType
from typing import Any

from aiohttp import web

__all__ = ["AppThread", "FakeJira"]

_API = "/rest/api/2"
_OPEN = {"name": "Open", "statusCategory": {"key": "new", "name": "To Do"}}
_DONE = {"name": "Done", "statusCategory": {"key": "done", "name": "Done"}}
_PRIORITIES = {"Highest", "High", "Medium", "Low", "Lowest"}
_ISSUE_TYPES = [{"id": "3", "name": "Task"}, {"id": "1", "name": "Bug"}]
_CLAUSE = re.compile(r'^\s*(\w+)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|(\S+))\s*$')


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000+0000")


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"errorMessages": [message], "errors": {}}, status=status)


class FakeJira:
    """One Jira project's issues in memory; ``app()`` serves them."""

    def __init__(self, *, user: str, token: str, project: str = "OPS", reopen: bool = True) -> None:
        self.user, self.token, self.project = user, token, project
        self.reopen = reopen
        self.issues: dict[str, dict[str, Any]] = {}  # key → issue JSON (without "self")
        self.comments: dict[str, list[dict[str, Any]]] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.fail_next: list[int] = []  # statuses for the next authenticated requests
        self.max_page = 1000  # the most issues one search answer holds, whatever was asked
        self._ids = iter(range(10001, 1_000_000))
        self.base = ""

    # --- helpers for tests --------------------------------------------------------------------------------

    def close(self, key: str) -> None:
        """A person closes an issue."""
        self.issues[key]["fields"]["status"] = dict(_DONE)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware])
        app.router.add_get(f"{_API}/serverInfo", self._server_info)
        app.router.add_get(f"{_API}/field", self._fields)
        app.router.add_get(f"{_API}/project/{{key}}", self._project)
        app.router.add_post(f"{_API}/issue", self._create)
        app.router.add_get(f"{_API}/issue/{{id}}", self._get)
        app.router.add_put(f"{_API}/issue/{{id}}", self._put)
        app.router.add_get(f"{_API}/issue/{{id}}/comment", self._list_comments)
        app.router.add_post(f"{_API}/issue/{{id}}/comment", self._comment)
        app.router.add_get(f"{_API}/issue/{{id}}/transitions", self._transitions)
        app.router.add_post(f"{_API}/issue/{{id}}/transitions", self._transition)
        app.router.add_get(f"{_API}/search", self._search)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests.append((request.method, request.path_qs, dict(request.headers)))
        basic = "Basic " + base64.b64encode(f"{self.user}:{self.token}".encode()).decode()
        if request.headers.get("Authorization") not in (basic, f"Bearer {self.token}"):
            return _error(401, "You are not authenticated.")
        if self.fail_next:
            return _error(self.fail_next.pop(0), "injected failure")
        response: web.StreamResponse = await handler(request)
        return response

    def _issue(self, request: web.Request) -> dict[str, Any] | None:
        wanted = request.match_info["id"]
        return next((i for i in self.issues.values() if wanted in (i["id"], i["key"])), None)

    def _view(self, issue: dict[str, Any]) -> dict[str, Any]:
        return {**issue, "self": f"{self.base}{_API}/issue/{issue['id']}"}

    # --- the API ------------------------------------------------------------------------------------------

    async def _server_info(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "baseUrl": self.base,
                "version": "9.12.0",
                "versionNumbers": [9, 12, 0],
                "deploymentType": "Server",
                "serverTitle": "fake Jira",
            }
        )

    async def _fields(self, request: web.Request) -> web.Response:
        names = [
            "summary",
            "description",
            "labels",
            "status",
            "priority",
            "issuetype",
            "project",
            "created",
            "updated",
            "resolutiondate",
        ]
        return web.json_response([{"id": n, "name": n.title(), "custom": False, "clauseNames": [n]} for n in names])

    async def _project(self, request: web.Request) -> web.Response:
        if request.match_info["key"] not in (self.project, "10000"):
            return _error(404, f"No project could be found with key '{request.match_info['key']}'.")
        return web.json_response(
            {
                "id": "10000",
                "key": self.project,
                "name": "Operations",
                "self": f"{self.base}{_API}/project/10000",
                "issueTypes": _ISSUE_TYPES,
            }
        )

    async def _create(self, request: web.Request) -> web.Response:
        fields = dict((await request.json())["fields"])
        if fields.get("project") not in ({"id": "10000"}, {"key": self.project}):
            return web.json_response({"errorMessages": [], "errors": {"project": "project is required"}}, status=400)
        kind = next((t for t in _ISSUE_TYPES if t["name"] == (fields.get("issuetype") or {}).get("name")), None)
        if kind is None:
            return web.json_response({"errorMessages": [], "errors": {"issuetype": "invalid issue type"}}, status=400)
        problem = self._check(fields)
        if problem:
            return problem
        number = next(self._ids)
        key = f"{self.project}-{len(self.issues) + 1}"
        fields |= {
            "project": {"id": "10000", "key": self.project},
            "issuetype": kind,
            "status": dict(_OPEN),
            "created": _now(),
            "updated": _now(),
            "resolutiondate": None,
        }
        self.issues[key] = {"id": str(number), "key": key, "fields": fields}
        self.comments[key] = []
        return web.json_response(
            {"id": str(number), "key": key, "self": f"{self.base}{_API}/issue/{number}"}, status=201
        )

    def _check(self, fields: dict[str, Any]) -> web.Response | None:
        if not str(fields.get("summary") or "").strip() or "\n" in str(fields.get("summary")):
            return web.json_response({"errorMessages": [], "errors": {"summary": "invalid summary"}}, status=400)
        if "priority" in fields and (fields["priority"] or {}).get("name") not in _PRIORITIES:
            return web.json_response({"errorMessages": [], "errors": {"priority": "invalid priority"}}, status=400)
        labels = fields.get("labels", [])
        if not isinstance(labels, list) or any(" " in str(label) or len(str(label)) > 255 for label in labels):
            return web.json_response({"errorMessages": [], "errors": {"labels": "invalid label"}}, status=400)
        if len(str(fields.get("description") or "")) > 32767:
            return web.json_response({"errorMessages": [], "errors": {"description": "too long"}}, status=400)
        return None

    async def _get(self, request: web.Request) -> web.Response:
        issue = self._issue(request)
        if issue is None:
            return _error(404, "Issue Does Not Exist")
        return web.json_response(self._view(issue))

    async def _put(self, request: web.Request) -> web.Response:
        issue = self._issue(request)
        if issue is None:
            return _error(404, "Issue Does Not Exist")
        fields = dict((await request.json()).get("fields") or {})
        problem = self._check({"summary": issue["fields"]["summary"], **fields})
        if problem:
            return problem
        issue["fields"] |= fields | {"updated": _now()}
        return web.Response(status=204)

    async def _list_comments(self, request: web.Request) -> web.Response:
        issue = self._issue(request)
        if issue is None:
            return _error(404, "Issue Does Not Exist")
        found = self.comments[issue["key"]]
        return web.json_response({"startAt": 0, "maxResults": len(found), "total": len(found), "comments": found})

    async def _comment(self, request: web.Request) -> web.Response:
        issue = self._issue(request)
        if issue is None:
            return _error(404, "Issue Does Not Exist")
        body = (await request.json())["body"]
        number = str(next(self._ids))
        comment = {
            "id": number,
            "body": body,
            "created": _now(),
            "self": f"{self.base}{_API}/issue/{issue['id']}/comment/{number}",
        }
        self.comments[issue["key"]].append(comment)
        return web.json_response(comment, status=201)

    def _available(self, issue: dict[str, Any]) -> list[dict[str, Any]]:
        if issue["fields"]["status"]["statusCategory"]["key"] == "done":
            return [{"id": "41", "name": "Reopen", "to": _OPEN}] if self.reopen else []
        return [{"id": "31", "name": "Done", "to": _DONE}]

    async def _transitions(self, request: web.Request) -> web.Response:
        issue = self._issue(request)
        if issue is None:
            return _error(404, "Issue Does Not Exist")
        return web.json_response({"expand": "transitions", "transitions": self._available(issue)})

    async def _transition(self, request: web.Request) -> web.Response:
        issue = self._issue(request)
        if issue is None:
            return _error(404, "Issue Does Not Exist")
        wanted = str((await request.json())["transition"]["id"])
        chosen = next((t for t in self._available(issue) if t["id"] == wanted), None)
        if chosen is None:
            return _error(400, f"Transition id '{wanted}' is not valid for this issue.")
        done = chosen["to"]["statusCategory"]["key"] == "done"
        issue["fields"] |= {"status": dict(chosen["to"]), "updated": _now(), "resolutiondate": _now() if done else None}
        return web.Response(status=204)

    async def _search(self, request: web.Request) -> web.Response:
        clauses = []
        for part in re.split(r"\s+AND\s+", request.query.get("jql", ""), flags=re.I):
            found = _CLAUSE.match(part)
            if found is None or found.group(1) not in ("project", "labels", "status", "key"):
                return _error(400, f"Error in the JQL Query: cannot parse {part!r}")
            value = found.group(2) if found.group(2) is not None else found.group(3)
            clauses.append((found.group(1), re.sub(r"\\(.)", r"\1", value)))
        hits = [i for i in self.issues.values() if all(self._matches(i, f, v) for f, v in clauses)]
        start = int(request.query.get("startAt", 0))
        size = min(int(request.query.get("maxResults", 50)), self.max_page)
        page = hits[start : start + size]
        return web.json_response(
            {"startAt": start, "maxResults": size, "total": len(hits), "issues": [self._view(i) for i in page]}
        )

    def _matches(self, issue: dict[str, Any], field: str, value: str) -> bool:
        fields = issue["fields"]
        if field == "project":
            return value in (self.project, "10000")
        if field == "labels":
            return value in (fields.get("labels") or [])
        if field == "status":
            return bool(fields["status"]["name"].lower() == value.lower())
        return bool(issue["key"] == value)


class AppThread:
    """Serve an aiohttp app on 127.0.0.1 (a free port) from a thread; ``url`` once entered."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._runner = web.AppRunner(app, access_log=None)
        self._thread = threading.Thread(target=self._loop.run_forever, name="test-http", daemon=True)

    def __enter__(self) -> AppThread:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=10)
        return self

    async def _start(self) -> None:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
