"""Helpers for API tests: the real app on a test server over the per-test database, and a
client that checks every response against the OpenAPI document."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import asyncpg
import jsonschema
from aiohttp.test_utils import TestClient, TestServer
from aiohttp.web_runner import BaseRunner
from multidict import CIMultiDictProxy

from promptsched.api import app as api_app
from promptsched.api import openapi, protocol
from promptsched.clock import Clock
from promptsched.console import routes as console_routes
from promptsched.metrics import Metrics
from promptsched.web import auth

DOCUMENT = openapi.document(api_app.OPERATIONS)
SCHEDULE = {"name": "daily digest", "cron": "0 9 * * *", "prompt": "Summarize {{ date }}"}


def _route(method: str, path: str) -> tuple[str, dict[str, Any]]:
    for template, item in DOCUMENT["paths"].items():
        pattern = "^" + re.sub(r"\{[^}]+\}", "[^/]+", template) + "$"
        if re.match(pattern, path) and method.lower() in item:
            return template, item[method.lower()]
    raise AssertionError(f"{method} {path} is not documented")


def check_response(method: str, path: str, status: int, content_type: str, body: Any) -> None:
    """The response is documented for the operation, and its body matches the schema."""
    template, operation = _route(method, path)
    documented = operation["responses"]
    key = str(status) if str(status) in documented else f"{str(status)[0]}XX"
    assert key in documented, f"{method} {template} answered undocumented {status}: {body}"
    content = documented[key].get("content")
    if content is None:
        assert body in (None, ""), f"{method} {template} {status} should have no body"
        return
    media, spec = next(iter(content.items()))
    assert content_type == media, f"{method} {template} {status}: {content_type} != {media}"
    schema = {**spec["schema"], "components": DOCUMENT["components"]}
    if media == "text/event-stream":  # each event of the stream matches the schema
        for event in _events(body):
            jsonschema.validate(event, schema, cls=jsonschema.Draft202012Validator)
        return
    jsonschema.validate(body, schema, cls=jsonschema.Draft202012Validator)


def _events(stream: str) -> list[dict[str, Any]]:
    """The events of a text/event-stream body (comment lines and the retry field skipped)."""
    events = []
    for block in stream.split("\n\n"):
        fields = {}
        for line in block.splitlines():
            name, sep, value = line.partition(":")
            if sep and name in ("event", "data", "id"):
                fields[name] = value.removeprefix(" ")
        if fields:
            events.append(fields)
    return events


@dataclass
class Reply:
    status: int
    body: Any
    headers: CIMultiDictProxy[str]


class Api:
    """Requests against the app; every reply is checked against the OpenAPI document."""

    def __init__(self, client: TestClient[Any, Any], pool: asyncpg.Pool[Any]) -> None:
        self.client = client
        self.pool = pool

    async def token(self, owner: str, *, admin: bool = False) -> dict[str, str]:
        return await bearer(self.pool, owner, admin=admin)

    async def request(
        self, method: str, path: str, who: dict[str, str] | None = None, **kwargs: Any
    ) -> Reply:
        headers = {**(who or {}), **kwargs.pop("headers", {})}
        async with self.client.request(method, path, headers=headers, **kwargs) as response:
            text = await response.text()
            media = response.content_type
            body: Any = await response.json() if media == "application/json" else text
            check_response(
                method, path.split("?")[0], response.status, media, body if text else None
            )
            return Reply(response.status, body, response.headers)

    async def get(self, path: str, who: dict[str, str] | None = None, **kw: Any) -> Reply:
        return await self.request("GET", path, who, **kw)

    async def post(self, path: str, who: dict[str, str] | None = None, **kw: Any) -> Reply:
        return await self.request("POST", path, who, **kw)

    async def patch(self, path: str, who: dict[str, str] | None = None, **kw: Any) -> Reply:
        return await self.request("PATCH", path, who, **kw)

    async def put(self, path: str, who: dict[str, str] | None = None, **kw: Any) -> Reply:
        return await self.request("PUT", path, who, **kw)

    async def delete(self, path: str, who: dict[str, str] | None = None, **kw: Any) -> Reply:
        return await self.request("DELETE", path, who, **kw)


class Server(TestServer):
    """The test server on the production connection class and parser limits."""

    async def _make_runner(self, **kwargs: Any) -> BaseRunner:
        return protocol.Runner(self.app, **{**api_app.RUNNER_OPTIONS, **kwargs})


@asynccontextmanager
async def client(
    pool: asyncpg.Pool[Any],
    *,
    clock: Clock | None = None,
    providers: tuple[str, ...] = ("echo",),
    provider_kinds: dict[str, str] | None = None,
    retention: timedelta | None = None,
) -> AsyncIterator[Api]:
    app = api_app.build(
        pool, Metrics(), lambda: True, clock=clock, providers=providers,
        provider_kinds=provider_kinds, retention=retention,mounts=(console_routes.mount,)
    )  # fmt: skip
    async with TestClient(Server(app)) as test_client:
        yield Api(test_client, pool)


async def bearer(pool: asyncpg.Pool[Any], owner: str, *, admin: bool = False) -> dict[str, str]:
    """Authorization headers for a fresh token of ``owner``."""
    token, _ = await auth.create_token(pool, owner=owner, admin=admin, name=f"test {owner}")
    return {"Authorization": f"Bearer {token}"}


async def snapshot(pool: asyncpg.Pool[Any]) -> list[Any]:
    """Everything a request could change, to show that a rejected one changed nothing."""
    tables = ("schedules", "runs", "run_attempts", "schedule_changes", "outbox", "owner_budgets")
    return [
        [dict(row) for row in await pool.fetch(f"SELECT * FROM {table} ORDER BY 1")]
        for table in tables
    ]
