"""Helpers for console tests: the real app on a test server, and a browser-like client that
keeps the session cookie and sends the CSRF token the pages carry."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import asyncpg
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDictProxy

from promptsched.api import app as api_app
from promptsched.clock import Clock
from promptsched.console import routes
from promptsched.metrics import Metrics
from promptsched.web import auth

_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class Page:
    status: int
    text: str
    headers: CIMultiDictProxy[str]

    @property
    def csrf(self) -> str:
        match = _CSRF.search(self.text)
        assert match is not None, "the page has no form with a CSRF token"
        return match.group(1)


class Console:
    """Requests as a browser makes them: cookies kept, redirects not followed."""

    def __init__(self, client: TestClient[Any, Any], pool: asyncpg.Pool[Any]) -> None:
        self.client = client
        self.pool = pool

    async def get(self, path: str) -> Page:
        async with self.client.get(path, allow_redirects=False) as response:
            return Page(response.status, await response.text(), response.headers)

    async def post(self, path: str, data: dict[str, str], *, csrf: str | None = "page") -> Page:
        """POST a form; ``csrf="page"`` takes the token from the page at ``/``."""
        form = dict(data)
        if csrf == "page":
            form["csrf"] = (await self.get("/")).csrf
        elif csrf is not None:
            form["csrf"] = csrf
        async with self.client.post(path, data=form, allow_redirects=False) as response:
            return Page(response.status, await response.text(), response.headers)

    async def login(self, token: str) -> Page:
        form = await self.get("/login")
        return await self.post("/login", {"token": token}, csrf=form.csrf)

    async def login_as(self, owner: str, *, admin: bool = False) -> str:
        token, _ = await auth.create_token(self.pool, owner=owner, admin=admin)
        page = await self.login(token)
        assert page.status == 303, page.text
        return token

    def logout_cookies(self) -> None:
        self.client.session.cookie_jar.clear()


def assert_secure_headers(page: Page) -> None:
    for name, value in routes.SECURITY_HEADERS.items():
        assert page.headers.get(name) == value, (name, page.headers.get(name))


@asynccontextmanager
async def console(pool: asyncpg.Pool[Any], *, clock: Clock | None = None) -> AsyncIterator[Console]:
    app = api_app.build(
        pool, Metrics(), lambda: True, clock=clock, providers=("echo",), mounts=(routes.mount,)
    )
    async with TestClient(TestServer(app)) as test_client:
        yield Console(test_client, pool)
