"""Headers and cookies as a browser expects, over HTTP against a real ``promptsched run``:
``X-Content-Type-Options: nosniff`` and ``Server: promptsched`` on every response; ``Secure``
cookies and ``Strict-Transport-Security`` only when a trusted proxy says https (a peer that is
not one is never believed); failed logins from one client slow down, counted per client as
trusted proxies name it. Plus the pure parts: the backoff's schedule, and libraries that never
log at debug when promptsched does."""

from __future__ import annotations

import json
import logging
import re
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
import structlog

from promptsched import config as configuration
from promptsched import logs, markup
from promptsched.console import session
from promptsched.ops import fleet
from promptsched.web import auth, logins
from tests.helpers import Service, wait_until

PROXY = "127.0.0.2"  # the trusted proxy: the tests connect from it, or from 127.0.0.1
_CSRF = re.compile(r'name="csrf" value="([^"]+)"')


@dataclass
class Answer:
    status: int
    headers: Any  # CIMultiDictProxy: several Set-Cookie lines
    body: bytes

    def cookie(self, name: str) -> str | None:
        """The Set-Cookie line for ``name`` (lower-cased), if any."""
        for line in self.headers.getall("Set-Cookie", ()):
            if line.startswith(f"{name}="):
                return str(line).lower()
        return None


class Client:
    """Plain HTTP from a chosen source address, cookies handled by hand (none kept)."""

    def __init__(self, base: str, source: str) -> None:
        self.base, self.source = base, source
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(local_addr=(source, 0), force_close=True),
            cookie_jar=aiohttp.DummyCookieJar(),
        )

    async def call(self, method: str, path: str, **kw: Any) -> Answer:
        async with self.session.request(
            method, self.base + path, allow_redirects=False, **kw
        ) as response:
            return Answer(response.status, response.headers, await response.read())

    async def login(self, token: str, headers: dict[str, str] | None = None) -> Answer:
        """The login form, then its POST with the form's CSRF cookie and field."""
        form = await self.call("GET", "/login", headers=headers)
        match = _CSRF.search(form.body.decode())
        assert match, form.body[:300]
        csrf = match.group(1)
        cookie = {"Cookie": f"{session.LOGIN_COOKIE}={csrf}", **(headers or {})}
        return await self.call("POST", "/login", data={"csrf": csrf, "token": token},
                               headers=cookie)  # fmt: skip


@pytest.fixture
async def served(dsn: str, tmp_path: Path) -> AsyncIterator[str]:
    service = Service(
        dsn, tmp_path / "service.log", env={"PROMPTSCHED_TRUSTED_PROXIES": f"{PROXY}/32"}
    )
    try:
        await service.ready()
        yield f"http://127.0.0.1:{(await service.wait_event('api.listening'))['port']}"
    finally:
        service.stop()


@pytest.fixture
async def direct(served: str) -> AsyncIterator[Client]:
    client = Client(served, "127.0.0.1")
    yield client
    await client.session.close()


@pytest.fixture
async def proxied(served: str) -> AsyncIterator[Client]:
    client = Client(served, PROXY)
    yield client
    await client.session.close()


def assert_edge_headers(answer: Answer, what: str) -> None:
    assert answer.headers.get("X-Content-Type-Options") == "nosniff", what
    assert answer.headers.get("Server") == "promptsched", (what, answer.headers.get("Server"))


def raw(base: str, request: bytes) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        data = bytearray()
        while chunk := sock.recv(65536):
            data += chunk
    return bytes(data)


async def test_every_response_says_nosniff_and_names_no_versions(
    direct: Client, pool: asyncpg.Pool[Any]
) -> None:
    token, _ = await auth.create_token(pool, owner="alice")
    bearer = {"Authorization": f"Bearer {token}"}
    calls = [
        ("GET", "/healthz", {}), ("GET", "/readyz", {}), ("GET", "/metrics", {}),
        ("GET", "/v1/schedules", {}), ("GET", "/v1/schedules", {"headers": bearer}),
        ("GET", "/v1/openapi.json", {}), ("GET", "/v1/nowhere", {"headers": bearer}),
        ("POST", "/v1/schedules", {"headers": bearer, "data": b"{"}),
        ("GET", "/login", {}), ("GET", "/", {}), ("GET", "/static/console.css", {}),
        ("GET", "/no-such-page", {}),
    ]  # fmt: skip
    statuses = []
    for method, path, kw in calls:
        answer = await direct.call(method, path, **kw)
        statuses.append(answer.status)
        assert_edge_headers(answer, f"{method} {path} {answer.status}")
        assert "Strict-Transport-Security" not in answer.headers  # plain http, no proxy
    assert statuses == [200, 200, 200, 401, 200, 200, 404, 400, 200, 303, 200, 404]
    # A request the HTTP parser refuses never reaches the application: the same headers.
    refused = raw(direct.base, b"GET / HTTP/1.1\r\nHost: t\r\nBad Header\r\n\r\n")
    head = refused.split(b"\r\n\r\n", 1)[0].decode().lower()
    assert " 400 " in head.split("\r\n")[0] and "server: promptsched" in head, head
    assert "x-content-type-options: nosniff" in head


async def test_cookies_are_secure_only_when_a_trusted_proxy_says_https(
    direct: Client, proxied: Client, pool: asyncpg.Pool[Any]
) -> None:
    token, _ = await auth.create_token(pool, owner="alice")
    https = {"X-Forwarded-Proto": "https"}
    cases = [
        (proxied, https, True),  # the trusted proxy says https
        (proxied, {}, False),  # it says nothing
        (proxied, {"X-Forwarded-Proto": "https, http"}, False),  # the nearest one said http
        (direct, https, False),  # anyone else saying it is not believed
    ]
    for client, headers, secure in cases:
        what = (client.source, headers)
        form = await client.call("GET", "/login", headers=headers)
        login_cookie = form.cookie(session.LOGIN_COOKIE)
        assert login_cookie is not None and "httponly" in login_cookie
        assert ("; secure" in login_cookie) is secure, (what, login_cookie)
        assert ("Strict-Transport-Security" in form.headers) is secure, what
        if secure:
            assert form.headers["Strict-Transport-Security"] == "max-age=31536000"
        answer = await client.login(token, headers)
        assert answer.status == 303, (what, answer.body[:300])
        cookie = answer.cookie(session.SESSION_COOKIE)
        assert cookie is not None and "samesite=strict" in cookie and "httponly" in cookie
        assert ("; secure" in cookie) is secure, (what, cookie)
        health = await client.call("GET", "/healthz", headers=headers)
        assert ("Strict-Transport-Security" in health.headers) is secure, what


async def test_failed_logins_from_one_client_slow_down(
    direct: Client, proxied: Client, pool: asyncpg.Pool[Any]
) -> None:
    token, _ = await auth.create_token(pool, owner="alice")
    # From a peer that is no proxy, a forged X-Forwarded-For changes nothing: one client.
    for attempt in range(logins.FREE + 1):
        forged = {"X-Forwarded-For": f"198.51.100.{attempt}"}
        answer = await direct.login("pst_wrong", forged)
        assert answer.status == 401, attempt
    refused = await direct.login(token, {"X-Forwarded-For": "198.51.100.99"})
    assert refused.status == 429, refused.body[:300]
    assert refused.headers["Retry-After"] == "1"
    assert b"Too many failed logins" in refused.body
    assert refused.cookie(session.SESSION_COOKIE) is None  # the right token, not even looked at

    # Behind the trusted proxy, each forwarded client counts alone.
    first = {"X-Forwarded-For": "203.0.113.7"}
    for attempt in range(logins.FREE + 1):
        assert (await proxied.login("pst_wrong", first)).status == 401, attempt
    assert (await proxied.login(token, first)).status == 429
    other = {"X-Forwarded-For": "203.0.113.7, 203.0.113.8"}  # the proxy appended .8: .8 asks
    assert (await proxied.login(token, other)).status == 303

    # Once the wait is over, the right token logs in, and the slate is clean.
    async def let_in() -> Answer | None:
        answer = await direct.login(token)
        return answer if answer.status != 429 else None

    answer = await wait_until(let_in, timeout=5, interval=0.2, what="the wait to end")
    assert answer.status == 303 and answer.cookie(session.SESSION_COOKIE) is not None
    assert (await direct.login("pst_wrong")).status == 401


def test_the_backoff_doubles_to_a_minute_and_forgets() -> None:
    now = [1000.0]
    backoff = logins.LoginBackoff(clock=lambda: now[0])
    for _ in range(logins.FREE):
        backoff.failed("192.0.2.1")
        assert backoff.retry_after("192.0.2.1") == 0
    waits = []
    for _ in range(9):
        backoff.failed("192.0.2.1")
        waits.append(backoff.retry_after("192.0.2.1"))
        now[0] += waits[-1]
    assert waits == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert backoff.retry_after("192.0.2.2") == 0  # another client
    # An IPv6 client is its /64.
    for _ in range(logins.FREE + 1):
        backoff.failed("2001:db8::1")
    assert backoff.retry_after("2001:db8::ffff") == 1 and backoff.retry_after("2001:db9::1") == 0
    # Quiet for FORGET: a fresh start; a success forgets at once.
    backoff.failed("192.0.2.1")
    now[0] += logins.FORGET + 1
    backoff.failed("192.0.2.1")
    assert backoff.retry_after("192.0.2.1") == 0
    backoff.succeeded("2001:db8::1")
    assert backoff.retry_after("2001:db8::1") == 0


def test_the_backoff_remembers_a_bounded_number_of_clients() -> None:
    backoff = logins.LoginBackoff(clock=lambda: 0.0)
    for _ in range(logins.FREE + 1):
        backoff.failed("192.0.2.1")
    for n in range(logins.CLIENTS):
        backoff.failed(f"10.{n >> 16 & 255}.{n >> 8 & 255}.{n & 255}")
    assert len(backoff._records) == logins.CLIENTS
    assert backoff.retry_after("192.0.2.1") == 0  # the oldest went first


def test_libraries_never_log_at_debug(capfd: pytest.CaptureFixture[str]) -> None:
    with logs.configured("debug", "json"):
        markup.render_markdown("# Title\n\n> quoted\n\n```\ncode\n```\n\n[x]: https://e.test\n")
        logging.getLogger("asyncpg").debug("a library's debug line")
        logging.getLogger("aiohttp.server").info("a library's info line")
        structlog.get_logger("promptsched").debug("ours.debug")
    lines = [json.loads(line) for line in capfd.readouterr().err.splitlines() if line]
    assert [line.get("event") for line in lines] == ["a library's info line", "ours.debug"]


def test_replicas_that_trust_other_proxies_or_bound_connections_otherwise_drift() -> None:
    """What decides Secure cookies and the connection limits is published with the fleet's
    configuration, so a replica set up otherwise shows as drift, naming the setting."""

    def shared(**env: str) -> dict[str, Any]:
        config = configuration.load({"HOME": "/nonexistent", **env})
        return fleet.shared(config, {})

    one = shared(PROMPTSCHED_TRUSTED_PROXIES="10.0.0.0/8")
    assert one["trusted_proxies"] == ["10.0.0.0/8"]
    assert one["http"] == {"idle_timeout": "75s", "header_timeout": "10s",
                           "body_timeout": "1m", "max_connections": 4096}  # fmt: skip
    other = shared(PROMPTSCHED_TRUSTED_PROXIES="10.0.0.1", PROMPTSCHED_HTTP_IDLE_TIMEOUT="30s")
    assert fleet.fingerprint(one) != fleet.fingerprint(other)
    assert fleet.differences(other, one) == [
        'http.idle_timeout: "30s" (fleet: "75s")',
        'trusted_proxies: ["10.0.0.1/32"] (fleet: ["10.0.0.0/8"])',
    ]
