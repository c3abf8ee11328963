"""Revocation ends everything at once, and admins reach everything: an event stream opened
before its token is revoked (API) or its console session logs out ends within seconds, on
whichever replica serves it; a logged-out session's cookie is worthless; an admin token reads,
lists and cancels another owner's follow-ups with ``?owner=``."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import asyncpg
from yarl import URL

from promptsched.clock import Clock
from promptsched.store import pool as pools
from promptsched.store import queries
from promptsched.web import auth
from tests import factories
from tests.api_support import Api
from tests.console_support import console
from tests.helpers import Service, run_cli

ENDS_WITHIN = 5.0  # seconds, as the issue asks


async def _read_to_end(response: Any, deadline: float) -> str:
    """Everything the stream sends until it ends; fails when it is still open at ``deadline``
    (monotonic seconds)."""
    seen: list[str] = []
    with anyio.fail_after(max(0.1, deadline - time.monotonic())):
        async for line in response.content:
            seen.append(line.decode())
    return "".join(seen)


async def _pending_run(pool: asyncpg.Pool[Any], owner: str = "alice") -> int:
    """A run no worker takes (none runs here): its stream stays open until something ends it."""
    sid = await factories.schedule(pool)
    await pool.execute("UPDATE schedules SET owner = $2 WHERE id = $1", sid, owner)
    return await factories.pending_run(pool, sid)


async def test_an_api_stream_ends_within_seconds_of_its_tokens_revocation(
    api: Api, pool: asyncpg.Pool[Any]
) -> None:
    token, row = await auth.create_token(pool, owner="alice")
    other, _ = await auth.create_token(pool, owner="alice")
    run_id = await _pending_run(pool)
    headers = {"Authorization": f"Bearer {token}"}
    kept = {"Authorization": f"Bearer {other}"}
    path = f"/v1/runs/{run_id}/events"
    async with (
        api.client.get(path, headers=headers) as doomed,
        api.client.get(path, headers=kept) as untouched,
    ):
        assert (doomed.status, untouched.status) == (200, 200)
        first = await doomed.content.readline()  # the stream is open and flowing
        assert first.startswith(b"retry:")
        assert await queries.token_revoke(pool, row["id"], None) is not None  # as the CLI does
        text = await _read_to_end(doomed, time.monotonic() + ENDS_WITHIN)
        assert "event: revoked" in text and "event: done" not in text
        # Another token's stream of the same run goes on.
        with anyio.move_on_after(1.5):
            await untouched.content.read()
        assert not untouched.content.at_eof()
    again = await api.get(path, headers)
    assert again.status == 401


async def test_a_console_stream_ends_at_logout_and_the_old_cookie_is_worthless(
    pool: asyncpg.Pool[Any],
) -> None:
    run_id = await _pending_run(pool)
    async with console(pool) as ui:
        await ui.login_as("alice")
        cookie = ui.client.session.cookie_jar.filter_cookies(ui.client.make_url("/"))
        secret = cookie["promptsched_session"].value
        csrf = (await ui.get("/")).csrf
        async with ui.client.get(f"/runs/{run_id}/events") as stream:
            assert stream.status == 200
            assert (await stream.content.readline()).startswith(b"retry:")
            out = await ui.post("/logout", {}, csrf=csrf)
            assert out.status == 303
            text = await _read_to_end(stream, time.monotonic() + ENDS_WITHIN)
            assert "event: revoked" in text
        ui.client.session.cookie_jar.update_cookies({"promptsched_session": secret})
        assert (await ui.get(f"/runs/{run_id}/events")).status == 303  # to the login page


async def test_revoking_a_token_ends_its_console_sessions_too(pool: asyncpg.Pool[Any]) -> None:
    async with console(pool) as ui:
        token = await ui.login_as("alice")
        assert (await ui.get("/")).status == 200
        found = await auth.authenticate_token(token, pool, Clock())
        assert found is not None
        await queries.token_revoke(pool, found.token_id, None)
        assert (await ui.get("/")).status == 303


# --- two real replicas ------------------------------------------------------------------------


@asynccontextmanager
async def _replicas(dsn: str, tmp_path: Path) -> AsyncIterator[tuple[Service, Service]]:
    env = {"PROMPTSCHED_WORKERS": "0"}  # nothing runs the run: its streams stay open
    first = Service(dsn, tmp_path / "a.log", env=env)
    second = Service(dsn, tmp_path / "b.log", env=env)
    try:
        await first.ready()
        await second.ready()
        yield first, second
    finally:
        first.stop()
        second.stop()


def _base(service: Service) -> str:
    return f"http://127.0.0.1:{service.has_event('api.listening')['port']}"  # type: ignore[index]


async def _login(session: aiohttp.ClientSession, base: str, token: str) -> None:
    async with session.get(f"{base}/login") as form:
        csrf = re.search(r'name="csrf" value="([^"]+)"', await form.text())
    assert csrf is not None
    data = {"token": token, "csrf": csrf.group(1)}
    async with session.post(f"{base}/login", data=data, allow_redirects=False) as reply:
        assert reply.status == 303


async def test_streams_on_one_replica_end_when_revoked_or_logged_out_through_another(
    dsn: str, tmp_path: Path
) -> None:
    async with _replicas(dsn, tmp_path) as (a, b):
        pool = await pools.create_pool(dsn, max_size=2)
        try:
            api_token, api_row = await auth.create_token(pool, owner="alice")
            web_token, _ = await auth.create_token(pool, owner="alice")
            run_id = await _pending_run(pool)
        finally:
            await pool.close()
        path = f"/v1/runs/{run_id}/events"
        # The console session starts on b; its cookie opens a stream on a.
        jar = aiohttp.CookieJar(unsafe=True)
        async with aiohttp.ClientSession(cookie_jar=jar) as browser, aiohttp.ClientSession() as cli:
            await _login(browser, _base(b), web_token)
            secret = jar.filter_cookies(URL(_base(b)))["promptsched_session"].value
            cookies = {"promptsched_session": secret}
            headers = {"Authorization": f"Bearer {api_token}"}
            async with (
                cli.get(f"{_base(a)}{path}", headers=headers) as api_stream,
                cli.get(f"{_base(a)}/runs/{run_id}/events", cookies=cookies) as page_stream,
            ):
                assert (api_stream.status, page_stream.status) == (200, 200)
                # The token is revoked with the CLI (the database): a's stream ends.
                revoked = run_cli("tokens", "revoke", str(api_row["id"]), dsn=dsn)
                assert revoked.returncode == 0, revoked.stderr
                text = await _read_to_end(api_stream, time.monotonic() + ENDS_WITHIN)
                assert "event: revoked" in text
                assert not page_stream.content.at_eof()  # the other session's goes on
                # Logging out on b ends the session's stream on a.
                async with browser.get(f"{_base(b)}/") as page:
                    csrf = re.search(r'name="csrf" value="([^"]+)"', await page.text())
                assert csrf is not None
                async with browser.post(
                    f"{_base(b)}/logout", data={"csrf": csrf.group(1)}, allow_redirects=False
                ) as out:
                    assert out.status == 303
                text = await _read_to_end(page_stream, time.monotonic() + ENDS_WITHIN)
                assert "event: revoked" in text


# --- admins and follow-ups ------------------------------------------------------------------


async def test_an_admin_reads_lists_and_cancels_another_owners_followup_by_key(api: Api) -> None:
    alice, bob = await api.token("alice"), await api.token("bob")
    root = await api.token("root", admin=True)
    body = {"key": "order-4711", "in": "1h", "prompt": "has order 4711 shipped?"}
    assert (await api.post("/v1/followups", alice, json=body)).status == 201
    path = "/v1/followups/order-4711"
    assert (await api.get(path, root)).status == 404  # the admin's own owner has no such key
    shown = await api.get(f"{path}?owner=alice", root)
    assert shown.status == 200 and shown.body["owner"] == "alice"
    assert (await api.get(f"{path}/runs?owner=alice", root)).status == 200
    assert (await api.get(f"{path}?owner=alice", bob)).status == 404  # not an admin
    assert (await api.delete(f"{path}?owner=alice", bob)).status == 404
    listed = await api.get("/v1/followups?owner=alice", root)
    assert [(f["key"], f["owner"]) for f in listed.body["items"]] == [("order-4711", "alice")]
    everyone = await api.get("/v1/followups", root)
    assert [f["owner"] for f in everyone.body["items"]] == ["alice"]
    assert (await api.get("/v1/followups?owner=alice", bob)).body["items"] == []
    assert (await api.delete(f"{path}?owner=alice", root)).status == 204
    assert (await api.delete(f"{path}?owner=alice", root)).status == 204  # again: no change
    after = await api.get(path, alice)
    assert after.body["state"] == "cancelled" and after.body["cancelled_by"] == "root"


async def test_an_admin_session_lists_opens_and_cancels_another_owners_followup(
    pool: asyncpg.Pool[Any],
) -> None:
    async with console(pool) as ui:
        alice = await auth.create_token(pool, owner="alice")
        body = {"key": "order-4711", "in": "1h", "prompt": "has order 4711 shipped?"}
        async with ui.client.post(
            "/v1/followups", json=body, headers={"Authorization": f"Bearer {alice[0]}"}
        ) as created:
            assert created.status == 201
        await ui.login_as("root", admin=True)
        listed = await ui.get("/followups")
        assert "order-4711" in listed.text and "alice" in listed.text
        assert "/followups/order-4711?owner=alice" in listed.text
        assert (await ui.get("/followups/order-4711")).status == 404  # root's own: none
        page = await ui.get("/followups/order-4711?owner=alice")
        assert page.status == 200 and "Cancel follow-up" in page.text
        done = await ui.post("/followups/order-4711/cancel?owner=alice", {"confirmed": "1"})
        assert done.status == 303 and "owner=alice" in done.headers["Location"]
        state = await pool.fetchval("SELECT state FROM followups WHERE key = 'order-4711'")
        assert state == "cancelled"
