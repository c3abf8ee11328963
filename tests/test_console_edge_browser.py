"""The console's cookies and every response's headers as real Chromium sees them, against real
``promptsched run`` processes: with an https ``PROMPTSCHED_PUBLIC_URL`` the session and login
cookies are ``Secure`` and responses carry ``Strict-Transport-Security``; behind a trusted
proxy the same holds exactly when it says ``X-Forwarded-Proto: https``; every response (the
console, ``/v1``, ``/healthz``, ``/metrics``) says ``nosniff`` and ``Server: promptsched``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from promptsched.console import session
from promptsched.web import auth
from tests.browser_support import chromium, wait
from tests.helpers import Service

pytestmark = pytest.mark.browser

# What the page's own script reads of each response (same origin: every header but Set-Cookie).
FETCH = """
const done = arguments[arguments.length - 1];
Promise.all(arguments[0].map(path => fetch(path, {credentials: 'same-origin'}).then(r => ({
  path, status: r.status,
  nosniff: r.headers.get('x-content-type-options'),
  server: r.headers.get('server'),
  hsts: r.headers.get('strict-transport-security'),
})))).then(done, e => done(String(e)));
"""
PATHS = ["/", "/login", "/healthz", "/metrics", "/v1/schedules", "/v1/nowhere",
         "/static/console.js"]  # fmt: skip


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@asynccontextmanager
async def serving(dsn: str, log: Path, env: dict[str, str]) -> AsyncIterator[str]:
    service = Service(dsn, log, env=env)
    try:
        await service.ready()
        yield f"http://localhost:{(await service.wait_event('api.listening'))['port']}"
    finally:
        service.stop()


def forwarded_proto(driver: Any, value: str | None) -> None:
    """Every request the browser sends carries ``X-Forwarded-Proto: value`` (None: none), as a
    TLS-terminating proxy in front of the service would add it."""
    driver.execute_cdp_cmd("Network.enable", {})
    headers = {} if value is None else {"X-Forwarded-Proto": value}
    driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": headers})


def log_in(driver: Any, base: str, token: str) -> dict[str, dict[str, Any]]:
    """Log in through the form; the cookies the browser keeps afterwards (and the login
    form's, read before it is cleared), by name."""
    driver.delete_all_cookies()
    driver.get(f"{base}/login")
    seen = {c["name"]: c for c in driver.get_cookies()}
    driver.find_element("css selector", "#token").send_keys(token)
    driver.find_element("css selector", "form button[type=submit]").click()
    wait(driver, lambda d: d.current_url == f"{base}/", what="the schedules page")
    seen.update({c["name"]: c for c in driver.get_cookies()})
    return seen


def headers_seen(driver: Any) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = driver.execute_async_script(FETCH, PATHS)
    assert isinstance(seen, list), seen
    return seen


def check(
    driver: Any, base: str, token: str, *, secure: bool, say: Callable[[], None] = lambda: None
) -> None:
    say()
    cookies = log_in(driver, base, token)
    for name in (session.LOGIN_COOKIE, session.SESSION_COOKIE):
        assert cookies[name]["secure"] is secure, (name, cookies[name])
        assert cookies[name]["httpOnly"] and cookies[name]["sameSite"] == "Strict"
    for answer in headers_seen(driver):
        assert answer["nosniff"] == "nosniff", answer
        assert answer["server"] == "promptsched", answer
        assert (answer["hsts"] == "max-age=31536000") is secure, answer


async def test_https_public_url_makes_cookies_secure(
    browser: Any, dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    token, _ = await auth.create_token(pool, owner="alice")
    forwarded_proto(browser, None)
    env = {"PROMPTSCHED_PUBLIC_URL": "https://sched.example.test"}
    async with serving(dsn, tmp_path / "public.log", env) as base:
        check(browser, base, token, secure=True)


async def test_a_trusted_proxy_saying_https_makes_cookies_secure(
    browser: Any, dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    token, _ = await auth.create_token(pool, owner="alice")
    env = {"PROMPTSCHED_TRUSTED_PROXIES": "127.0.0.1,::1"}
    try:
        async with serving(dsn, tmp_path / "proxied.log", env) as base:
            check(browser, base, token, secure=False, say=lambda: forwarded_proto(browser, None))
            check(browser, base, token, secure=True,
                  say=lambda: forwarded_proto(browser, "https"))  # fmt: skip
        # A peer that is not a trusted proxy is never believed.
        env = {"PROMPTSCHED_TRUSTED_PROXIES": "10.0.0.0/8"}
        async with serving(dsn, tmp_path / "untrusted.log", env) as base:
            check(browser, base, token, secure=False,
                  say=lambda: forwarded_proto(browser, "https"))  # fmt: skip
    finally:
        forwarded_proto(browser, None)
