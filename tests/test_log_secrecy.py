"""No token reaches any log line of a real service logging at debug level: not through the
HTTP parser's errors (oversized or malformed headers), not through any failed
authentication (missing, malformed, unknown, revoked token; a failed console login); and the
process exports its event-loop lag."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import asyncpg
import pytest

from promptsched.store import queries
from promptsched.web import auth
from tests.helpers import Service, wait_until

pytestmark = pytest.mark.slow


async def _raw(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        with anyio.fail_after(10):
            return await reader.read()  # the server answers and closes
    finally:
        writer.close()


def _attacks(token: str) -> list[bytes]:
    """Requests that carry ``token`` where the HTTP parser refuses them."""
    t = token.encode()
    get = b"GET /v1/schedules HTTP/1.1\r\nHost: test\r\n"
    return [
        get + b"Authorization: Bearer " + t + b"A" * 9000 + b"\r\n\r\n",
        get + b"Cookie: promptsched_session=" + t + b"; pad=" + b"c" * 9000 + b"\r\n\r\n",
        b"GET /v1/schedules?token=" + t + b"&x=" + b"x" * 70_000 + b" HTTP/1.1\r\n\r\n",
        get + b"Authorization : Bearer " + t + b"\r\n\r\n",
        get + b"Authorization: Bearer " + t + b"\x01\r\n\r\n",
    ]


async def _login(session: aiohttp.ClientSession, base: str, token: str) -> int:
    async with session.get(f"{base}/login") as page:
        html = await page.text()
    csrf = re.search(r'name="csrf" value="([^"]+)"', html)
    assert csrf is not None
    form = {"csrf": csrf.group(1), "token": token}
    async with session.post(f"{base}/login", data=form, allow_redirects=False) as reply:
        return reply.status


async def test_no_token_reaches_any_log_line(
    dsn: str, pool: asyncpg.Pool[Any], tmp_path: Path
) -> None:
    valid, _ = await auth.create_token(pool, owner="alice")
    revoked, row = await auth.create_token(pool, owner="bob")
    await queries.token_revoke(pool, row["id"], None)
    unknown = auth.new_token()  # well formed, never stored
    malformed = "pst_" + auth.new_token()[4:] + "!*"  # refused by its shape, without a query
    tokens = [valid, revoked, unknown, malformed]

    service = Service(dsn, tmp_path / "service.log", env={"PROMPTSCHED_LOG_LEVEL": "debug"})
    try:
        await service.ready()
        port = service.has_event("api.listening")["port"]  # type: ignore[index]
        base = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{base}/v1/schedules") as missing:
                assert missing.status == 401
            for token in tokens:
                for header in (f"Bearer {token}", token, f"Basic {token}"):
                    headers = {"Authorization": header}
                    async with session.get(f"{base}/v1/schedules", headers=headers) as reply:
                        ok = token == valid and header.startswith("Bearer")
                        assert reply.status == (200 if ok else 401), header
                        assert token not in await reply.text()
                cookies = {"promptsched_session": token}
                async with session.get(f"{base}/", cookies=cookies, allow_redirects=False) as page:
                    assert page.status in (200, 303)
                jar = aiohttp.CookieJar(unsafe=True)  # keeps the login cookie of 127.0.0.1
                async with aiohttp.ClientSession(cookie_jar=jar) as fresh:
                    status = await _login(fresh, base, token)
                    assert status == (303 if token == valid else 401)
                for attack in _attacks(token):
                    reply = await _raw(port, attack)
                    assert reply.startswith(b"HTTP/1.") and b" 4" in reply[:13], reply[:200]
                    assert token.encode() not in reply

            async def probed() -> bool:  # the probe wakes every 0.25s from the start
                async with session.get(f"{base}/metrics") as metrics:
                    text = await metrics.text()
                count = re.search(r"^promptsched_event_loop_lag_seconds_count (\S+)$", text, re.M)
                assert count is not None, "the event-loop lag is not exported"
                return float(count.group(1)) > 0

            await wait_until(probed, timeout=10, what="an event-loop probe")
    finally:
        assert service.stop() == 0

    log = service.log_path.read_text(errors="replace")
    assert "api.bad_http_request" in log  # the parser's refusals were logged, by us
    for token in tokens:
        secret = token.removeprefix("pst_")
        assert token not in log and secret[:16] not in log, token
    errors = [e for e in service.events() if e.get("level") in ("error", "critical")]
    assert errors == []
    assert "LineTooLong" not in log or '"problem": "LineTooLong"' in log
