"""Console security: markup in names, prompts and outputs renders as text; a state change
without the session's CSRF token is refused and changes nothing; every action asks first."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from promptsched.clock import Clock
from promptsched.console import html, session
from tests import api_support, factories
from tests.api_support import SCHEDULE
from tests.console_support import Console, console

EVIL = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>"
ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#x27;&gt;&lt;img src=x onerror=alert(2)&gt;"


@pytest.fixture
async def ui(pool: asyncpg.Pool[Any]) -> AsyncIterator[Console]:
    async with console(pool) as client:
        yield client


async def _world(pool: asyncpg.Pool[Any]) -> tuple[int, int]:
    """Alice's schedule and a finished run of it."""
    async with api_support.client(pool) as api:
        who = await api.token("alice")
        made = await api.post("/v1/schedules", who, json={**SCHEDULE, "name": "nightly"})
        sid = int(made.body["id"])
        run = await api.post(f"/v1/schedules/{sid}/trigger", who)
    await factories.worker_pool(pool, Clock()).run_once()
    return sid, int(run.body["id"])


def test_the_template_helper_escapes_by_construction() -> None:
    page = html.Template('<p title="$t">$body</p>')(t=EVIL, body=EVIL)
    assert page == f'<p title="{ESCAPED}">{ESCAPED}</p>'
    assert html.esc(html.esc(EVIL)) == ESCAPED  # Markup is not escaped twice
    assert html.Markup("<b>") + EVIL == "<b>" + ESCAPED  # adding text escapes it
    assert EVIL + html.Markup("<b>") == ESCAPED + "<b>"
    assert html.join([html.Markup("<br>"), "<i>"], "<sep>") == "<br>&lt;sep&gt;&lt;i&gt;"
    assert html.attrs(data_x='"q"', hidden=True, no=False) == ' data-x="&quot;q&quot;" hidden'


async def test_markup_in_name_prompt_and_output_renders_as_text(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    async with api_support.client(pool) as api:
        who = await api.token("alice")
        fields = {**SCHEDULE, "name": EVIL, "prompt": f"say {EVIL}", "timezone": "UTC"}
        made = await api.post("/v1/schedules", who, json=fields)
        assert made.status == 201, made.body
        sid = int(made.body["id"])
        run = await api.post(f"/v1/schedules/{sid}/trigger", who)
        rid = int(run.body["id"])
        await factories.worker_pool(pool, Clock()).run_once()
        await api.post(f"/v1/schedules/{sid}/pause", who, json={"reason": EVIL})
    assert EVIL in await pool.fetchval("SELECT output FROM runs WHERE id = $1", rid)
    await ui.login_as("alice")
    for path in ("/", f"/schedules/{sid}", f"/schedules/{sid}/edit", f"/runs/{rid}"):
        page = await ui.get(path)
        assert page.status == 200, path
        assert "<script>alert" not in page.text and "<img src=x" not in page.text, path
        assert ESCAPED in page.text, path
    confirm = await ui.post(f"/schedules/{sid}/trigger", {})
    assert "<script>alert" not in confirm.text and "alert(1)" in confirm.text


@pytest.mark.parametrize(
    "csrf", [None, "", "0" * 64, "forged"], ids=["none", "empty", "zeros", "x"]
)
async def test_a_state_change_without_the_csrf_token_is_refused(
    ui: Console, pool: asyncpg.Pool[Any], csrf: str | None
) -> None:
    sid, rid = await _world(pool)
    await ui.login_as("alice")
    before = await api_support.snapshot(pool)
    for path in (f"/schedules/{sid}/pause", f"/schedules/{sid}/resume",
                 f"/schedules/{sid}/trigger", f"/runs/{rid}/cancel", f"/runs/{rid}/replay",
                 f"/schedules/{sid}/edit", "/schedules/new", "/notifications/1/replay",
                 "/logout"):  # fmt: skip
        page = await ui.post(path, {"confirmed": "1", "name": "x", "version": "1"}, csrf=csrf)
        assert page.status == 403, (path, page.text)
        assert "CSRF" in page.text
    assert await api_support.snapshot(pool) == before
    assert (await ui.get("/")).status == 200  # still logged in: the refused logout did nothing


async def test_the_csrf_token_of_another_session_is_refused(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    sid, _ = await _world(pool)
    await ui.login_as("alice")
    other = session.csrf_token("pst_" + "z" * 43)
    page = await ui.post(f"/schedules/{sid}/trigger", {"confirmed": "1"}, csrf=other)
    assert page.status == 403


async def test_the_login_form_needs_its_own_csrf_cookie(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    from promptsched.web import auth

    token, _ = await auth.create_token(pool, owner="alice")
    refused = await ui.post("/login", {"token": token}, csrf="made-up")
    assert refused.status == 403
    assert "promptsched_session" not in refused.headers.get("Set-Cookie", "")
    ui.client.session.cookie_jar.clear()
    no_cookie = await ui.post("/login", {"token": token}, csrf="made-up")
    assert no_cookie.status == 403


async def test_every_action_asks_first_then_acts(ui: Console, pool: asyncpg.Pool[Any]) -> None:
    sid, _ = await _world(pool)
    await ui.login_as("alice")
    before = await api_support.snapshot(pool)
    asked = await ui.post(f"/schedules/{sid}/pause", {"until": "2099-01-01T00:00", "reason": "x"})
    assert asked.status == 200 and "Yes, pause" in asked.text
    assert 'name="confirmed" value="1"' in asked.text and 'value="2099-01-01T00:00"' in asked.text
    assert await api_support.snapshot(pool) == before
    form = {"until": "2099-01-01T00:00", "reason": "x", "confirmed": "1"}
    paused = await ui.post(f"/schedules/{sid}/pause", form)
    assert paused.status == 303 and paused.headers["Location"].endswith("?done=paused")
    row = await pool.fetchrow("SELECT enabled, paused_until, pause_reason FROM schedules")
    assert row is not None
    assert not row["enabled"] and row["paused_until"].year == 2099 and row["pause_reason"] == "x"
    page = await ui.get(paused.headers["Location"])
    assert "Schedule paused." in page.text and "paused until" in page.text
    past = await ui.post(f"/schedules/{sid}/pause", {"until": "2001-01-01T00:00Z"})
    assert past.status == 422 and "must be in the future" in past.text
    resumed = await ui.post(f"/schedules/{sid}/resume", {"confirmed": "1"})
    assert resumed.status == 303
    assert await pool.fetchval("SELECT enabled FROM schedules")
    triggered = await ui.post(f"/schedules/{sid}/trigger", {"confirmed": "1"})
    assert triggered.status == 303
    [pending] = await pool.fetch("SELECT id FROM runs WHERE status = 'pending'")
    cancelled = await ui.post(f"/runs/{pending['id']}/cancel", {"confirmed": "1"})
    assert cancelled.status == 303
    assert (
        await pool.fetchval("SELECT status FROM runs WHERE id = $1", pending["id"]) == "cancelled"
    )
    again = await ui.post(f"/runs/{pending['id']}/replay", {"confirmed": "1"})
    assert again.status == 409 and "only a dead run can be replayed" in again.text
