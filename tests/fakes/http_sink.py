"""A real HTTP server (aiohttp) on 127.0.0.1 that records every request (method, path, headers,
raw body) and answers with scripted statuses, for webhook delivery tests."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from tests.fakes import serve


@dataclass(frozen=True)
class SinkRequest:
    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes
    status: int = 0  # what the sink answered

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Reply:
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: str = "ok"


@dataclass
class HttpSink:
    base_url: str = ""
    requests: list[SinkRequest] = field(default_factory=list)
    default: Reply = field(default_factory=Reply)
    # Chooses the reply of each request not scripted (e.g. random failures); else ``default``.
    responder: Callable[[], Reply] | None = None
    _script: deque[Reply] = field(default_factory=deque)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def url(self) -> str:
        return self.base_url + "/hook"

    def script(self, *replies: Reply) -> None:
        """Answer the next requests with these replies, in order, then the default."""
        self._script.extend(replies)

    def header_values(self, name: str) -> list[str]:
        return [request.headers.get(name, "") for request in self.requests]

    async def wait_for(self, predicate: Callable[[HttpSink], bool]) -> None:
        while not predicate(self):
            changed = self._changed
            await changed.wait()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if self._script:
            reply = self._script.popleft()
        else:
            reply = self.responder() if self.responder is not None else self.default
        self.requests.append(
            SinkRequest(request.method, request.path, dict(request.headers), body, reply.status)
        )
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()
        return web.Response(status=reply.status, headers=dict(reply.headers), text=reply.body)


@asynccontextmanager
async def start_http_sink() -> AsyncIterator[HttpSink]:
    sink = HttpSink()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", sink.handle)
    async with serve(app) as base_url:
        sink.base_url = base_url
        yield sink
