"""The console's pages over the real app and database: login and logout, every page for its
owner, 404 for another owner's, security headers everywhere, and the form's validation."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from http.cookies import SimpleCookie
from typing import Any

import asyncpg
import pytest

from promptsched.clock import Clock
from tests import api_support, factories
from tests.api_support import SCHEDULE
from tests.console_support import Console, assert_secure_headers, console

FORM = {
    "name": "morning brief", "kind": "auto", "expression": "30 7 * * 1-5",
    "timezone": "Europe/Paris", "prompt": "Summarize {{ date }}", "provider": "echo",
    "model": "", "params": "", "misfire": "run_once", "overlap": "skip",
    "max_attempts": "3", "timeout": "5m",
}  # fmt: skip


@pytest.fixture
async def ui(pool: asyncpg.Pool[Any]) -> AsyncIterator[Console]:
    async with console(pool) as client:
        yield client


async def _schedule(pool: asyncpg.Pool[Any], owner: str, **fields: Any) -> int:
    async with api_support.client(pool) as api:
        who = await api.token(owner)
        reply = await api.post("/v1/schedules", who, json={**SCHEDULE, **fields})
        assert reply.status == 201, reply.body
        return int(reply.body["id"])


async def _run(pool: asyncpg.Pool[Any], owner: str, sid: int) -> int:
    async with api_support.client(pool) as api:
        reply = await api.post(f"/v1/schedules/{sid}/trigger", await api.token(owner))
        assert reply.status == 201, reply.body
    await factories.worker_pool(pool, Clock()).run_once()
    return int(reply.body["id"])


def _cookie(page: Any, name: str) -> Any:
    jar: SimpleCookie = SimpleCookie()
    for header in page.headers.getall("Set-Cookie"):
        jar.load(header)
    return jar[name]


async def test_login_sets_a_strict_http_only_cookie_and_logout_clears_it(ui: Console) -> None:
    login = await ui.get("/login")
    assert login.status == 200 and 'name="token"' in login.text
    assert_secure_headers(login)
    token = await ui.login_as("alice")
    page = await ui.get("/")
    assert page.status == 200 and "alice" in page.text
    assert token not in page.text  # the token itself is never put in a page
    ui.logout_cookies()
    again = await ui.login(token)
    assert again.status == 303 and again.headers["Location"] == "/"
    cookie = _cookie(again, "promptsched_session")
    # The session's own secret, never the token: logging out makes it worthless.
    assert cookie.value.startswith("pss_") and token not in cookie.value
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/"
    assert not cookie["secure"]  # plain http here; https sets Secure
    out = await ui.post("/logout", {})
    assert out.status == 303 and out.headers["Location"] == "/login"
    cleared = _cookie(out, "promptsched_session")
    assert cleared.value == "" and cleared["max-age"] == "0"
    assert (await ui.get("/")).status == 303
    # The logged-out session's cookie, kept (copied, stolen), no longer gets in.
    ui.client.session.cookie_jar.update_cookies({"promptsched_session": cookie.value})
    assert (await ui.get("/")).status == 303


async def test_a_bad_token_or_none_never_gets_in(ui: Console) -> None:
    bad = await ui.login("pst_" + "x" * 43)
    assert bad.status == 401 and "unknown, revoked or mistyped" in bad.text
    assert "promptsched_session" not in bad.headers.get("Set-Cookie", "")
    for path in ("/", "/dead", "/schedules/new", "/schedules/1", "/runs/1", "/preview"):
        page = await ui.get(path)
        assert (page.status, page.headers["Location"]) == (303, "/login"), path
        assert_secure_headers(page)
    ui.client.session.cookie_jar.update_cookies({"promptsched_session": "pst_" + "y" * 43})
    assert (await ui.get("/")).status == 303
    api = await ui.get("/healthz")  # the API's own responses keep their headers
    assert api.status == 200 and "Content-Security-Policy" not in api.headers


async def test_every_page_renders_for_its_owner_with_security_headers(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    sid = await _schedule(pool, "alice", timezone="Europe/Paris")
    dead_sid = await _schedule(pool, "alice", name="flaky", max_attempts=1,
                               params={"fail_attempts": 5})  # fmt: skip
    ok_run = await _run(pool, "alice", sid)
    dead_run = await _run(pool, "alice", dead_sid)
    skipped = await factories.pending_run(pool, sid)
    await pool.execute(
        "UPDATE runs SET status = 'skipped', skip_reason = 'overlap', missed_slots = 3, "
        "finished_at = now() WHERE id = $1",
        skipped,
    )
    await ui.login_as("alice")
    pages = {
        "/": ["daily digest", "every day at 09:00", "Europe/Paris", "succeeded", "flaky"],
        f"/schedules/{sid}": ["Next fire times", "Change history", "Summarize {{ date }}",
                              "CET", "Trigger now", "Pause", "skipped: an earlier run was still "
                              "unfinished (overlap policy); stands for 3 missed slot(s) "
                              "(coalesced)"],
        f"/schedules/{sid}?at=2026-03-02T09:00": ["verdict", "before created"],
        f"/schedules/{sid}/edit": ["Save changes", 'value="0 9 * * *"'],
        "/schedules/new": ["Create schedule", "Next fire times"],
        f"/runs/{ok_run}": ["Attempts", "echo: Summarize", "test-worker", "succeeded"],
        f"/runs/{dead_run}": ["injected failure", "Replay"],
        "/dead": ["Dead runs", "Dead notifications", f"#{dead_run}", "flaky"],
    }  # fmt: skip
    for path, expected in pages.items():
        page = await ui.get(path)
        assert page.status == 200, (path, page.text)
        assert page.headers["Content-Type"].startswith("text/html")
        assert_secure_headers(page)
        for text in expected:
            assert text in page.text, (path, text)
        assert "<script>" not in page.text and " style=" not in page.text  # CSP: no inline
    for name in ("console.css", "console.js"):
        static = await ui.get(f"/static/{name}")
        assert static.status == 200 and static.text
        assert_secure_headers(static)
    assert (await ui.get("/static/nothing.js")).status == 404
    preview = await ui.get("/preview?expression=0+9+*+*+1-5&timezone=Europe/Paris")
    assert preview.status == 200 and '"description": "at 09:00 on weekdays' in preview.text


async def test_another_owner_sees_nothing_of_it_and_cannot_change_it(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    sid = await _schedule(pool, "alice", name="alice only")
    rid = await _run(pool, "alice", sid)
    await ui.login_as("bob")
    before = await api_support.snapshot(pool)
    hidden = (f"/schedules/{sid}", f"/schedules/{sid}/edit", f"/runs/{rid}",
              f"/schedules/{sid}?at=2026-03-02T09:00Z", "/schedules/x1", "/nothing")  # fmt: skip
    for path in hidden:
        page = await ui.get(path)
        assert page.status == 404, path
        assert "alice only" not in page.text
        assert_secure_headers(page)
    for path in (f"/schedules/{sid}/pause", f"/schedules/{sid}/resume",
                 f"/schedules/{sid}/trigger", f"/runs/{rid}/cancel", f"/runs/{rid}/replay",
                 f"/schedules/{sid}/edit", "/notifications/1/replay"):  # fmt: skip
        page = await ui.post(path, {**FORM, "confirmed": "1", "version": "1"})
        assert page.status == 404, (path, page.text)
    assert await api_support.snapshot(pool) == before
    listing = await ui.get("/")
    assert "alice only" not in listing.text and "No schedules yet" in listing.text
    assert f"#{rid}" not in (await ui.get("/dead")).text


async def test_an_admin_sees_every_owner(ui: Console, pool: asyncpg.Pool[Any]) -> None:
    sid = await _schedule(pool, "alice", name="alice only")
    await ui.login_as("root", admin=True)
    await _schedule(pool, "bob", name="bob only")
    listing = await ui.get("/")
    assert "alice only" in listing.text and "root (admin)" in listing.text
    assert "bob only" in listing.text and "<th>Owner</th>" in listing.text
    assert 'name="owner"' in listing.text
    assert (await ui.get(f"/schedules/{sid}")).status == 200
    alice = await ui.get("/?owner=alice")
    assert "alice only" in alice.text and "bob only" not in alice.text
    assert 'value="alice"' in alice.text


async def test_the_owner_filter_does_not_widen_a_plain_token(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    await _schedule(pool, "alice", name="alice only")
    await _schedule(pool, "bob", name="bob only")
    await ui.login_as("bob")
    listing = await ui.get("/?owner=alice")
    assert "alice only" not in listing.text and "bob only" in listing.text
    assert 'name="owner"' not in listing.text and "<th>Owner</th>" not in listing.text


async def test_the_form_creates_a_schedule_or_names_the_wrong_field(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    await ui.login_as("alice")
    before = await api_support.snapshot(pool)
    wrong = await ui.post("/schedules/new", {**FORM, "timezone": "Europe/Pariss"})
    assert wrong.status == 422
    assert "did you mean &#x27;Europe/Paris&#x27;?" in wrong.text
    assert 'class="field invalid">\n<label for="f-timezone">' in wrong.text
    assert 'value="morning brief"' in wrong.text  # what was typed is kept
    bad_params = await ui.post("/schedules/new", {**FORM, "params": "[1]"})
    assert bad_params.status == 422 and "must be a JSON object" in bad_params.text
    bad_cron = await ui.post("/schedules/new", {**FORM, "expression": "61 * * * *"})
    assert bad_cron.status == 422 and 'id="m-expression"' in bad_cron.text
    assert await api_support.snapshot(pool) == before
    preview = await ui.post("/schedules/new", {**FORM, "op": "preview"})
    assert preview.status == 200 and "at 07:30 on weekdays" in preview.text
    assert len(re.findall(r"<li><time", preview.text)) == 5
    assert await api_support.snapshot(pool) == before
    created = await ui.post("/schedules/new", {**FORM, "params": '{"latency": "1s"}'})
    assert created.status == 303, created.text
    row = await pool.fetchrow("SELECT * FROM schedules")
    assert row is not None
    assert [row["name"], row["owner"], row["timezone"]] == [
        "morning brief",
        "alice",
        "Europe/Paris",
    ]
    assert row["params"] == {"latency": "1s"}
    assert created.headers["Location"] == f"/schedules/{row['id']}?done=created"
    shown = await ui.get(created.headers["Location"])
    assert "Schedule created." in shown.text
    assert "at 07:30 on weekdays (Monday to Friday)" in shown.text


async def test_the_edit_form_saves_under_optimistic_concurrency(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    sid = await _schedule(pool, "alice")
    await ui.login_as("alice")
    saved = await ui.post(f"/schedules/{sid}/edit", {**FORM, "expression": "0 10 * * *",
                                                      "version": "1"})  # fmt: skip
    assert saved.status == 303, saved.text
    row = await pool.fetchrow("SELECT * FROM schedules WHERE id = $1", sid)
    assert row is not None
    assert (row["expression"], row["version"]) == ("0 10 * * *", 2)
    stale = await ui.post(f"/schedules/{sid}/edit", {**FORM, "name": "late", "version": "1"})
    assert stale.status == 409 and "changed meanwhile" in stale.text
    assert await pool.fetchval("SELECT name FROM schedules WHERE id = $1", sid) != "late"
    history = await ui.get(f"/schedules/{sid}")
    assert "expression: 0 9 * * * → 0 10 * * *" in history.text


TIMING = {
    "misfire": "run_all", "misfire_grace": "5m", "misfire_cap": "7", "catchup_window": "2h",
    "jitter": "30s", "dst_gap": "skip", "dst_fold": "both", "pause_after_failures": "4",
}  # fmt: skip


async def test_the_form_sets_every_timing_option_and_shows_them_in_words(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    await ui.login_as("alice")
    before = await api_support.snapshot(pool)
    for field, bad in (
        ("jitter", "soon"),
        ("misfire_cap", "0"),
        ("dst_gap", "never"),
        ("pause_after_failures", "-1"),
        ("catchup_window", "1 fortnight"),
    ):
        wrong = await ui.post("/schedules/new", {**FORM, **TIMING, field: bad})
        assert wrong.status == 422, (field, wrong.status)
        assert f'class="field invalid">\n<label for="f-{field}">' in wrong.text, field
    assert await api_support.snapshot(pool) == before
    created = await ui.post("/schedules/new", {**FORM, **TIMING})
    assert created.status == 303, created.text
    sid = int(created.headers["Location"].split("/")[2].split("?")[0])
    async with api_support.client(pool) as api:
        shown = await api.get(f"/v1/schedules/{sid}", await api.token("alice"))
    got = shown.body
    assert (got["misfire"], got["misfire_grace"], got["misfire_cap"]) == ("run_all", "5m", 7)
    assert (got["catchup_window"], got["jitter"]) == ("2h", "30s")
    assert (got["dst_gap"], got["dst_fold"], got["pause_after_failures"]) == ("skip", "both", 4)
    page = (await ui.get(f"/schedules/{sid}")).text
    assert "run every missed slot" in page and "catch-up window 2h" in page
    assert "skip that day&#x27;s slot" in page and "fire at both" in page
    assert "after 4 dead runs in a row" in page
    # The edit form shows the stored values, and clearing an optional one clears it.
    edit = (await ui.get(f"/schedules/{sid}/edit")).text
    for field, value in TIMING.items():
        if field in ("misfire", "dst_gap", "dst_fold"):
            assert f'<option value="{value}" selected>' in edit, field
        else:
            assert f'id="f-{field}" name="{field}" type="text" value="{value}"' in edit, field
    cleared = {**FORM, **TIMING, "jitter": "", "pause_after_failures": "", "version": "1"}
    saved = await ui.post(f"/schedules/{sid}/edit", cleared)
    assert saved.status == 303, saved.text
    row = await pool.fetchrow("SELECT jitter, pause_after_failures, misfire_cap FROM schedules")
    assert row is not None and (row["jitter"], row["pause_after_failures"]) == (None, None)
    assert row["misfire_cap"] == 7


async def test_preview_names_the_wrong_field(ui: Console) -> None:
    await ui.login_as("alice")
    page = await ui.get("/preview?expression=every+0s")
    assert page.status == 422 and '"field": "expression"' in page.text
    zone = await ui.get("/preview?expression=@daily&timezone=Mars/Olympus")
    assert zone.status == 422 and '"field": "timezone"' in zone.text
    kind = await ui.get("/preview?expression=@daily&kind=sometimes")
    assert kind.status == 422 and '"field": "kind"' in kind.text


async def test_a_dead_notification_is_listed_and_replayed(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    sid = await _schedule(pool, "alice")
    rid = await _run(pool, "alice", sid)
    nid = await pool.fetchval(
        "INSERT INTO outbox (run_id, schedule_id, channel, target, event, status, attempts, "
        "last_error, idempotency_key) VALUES ($1, $2, 'webhook', $3::jsonb, 'succeeded', "
        "'dead', 5, 'HTTP 500 from the hook', 'key-1') RETURNING id",
        rid,
        sid,
        {"url": "https://hooks.example.com/x"},
    )
    await ui.login_as("alice")
    dead = await ui.get("/dead")
    assert "HTTP 500 from the hook" in dead.text and f"/notifications/{nid}/replay" in dead.text
    replayed = await ui.post(f"/notifications/{nid}/replay", {"confirmed": "1"})
    assert (replayed.status, replayed.headers["Location"]) == (
        303,
        "/dead?done=notification_replayed",
    )
    assert await pool.fetchval("SELECT status FROM outbox WHERE id = $1", nid) == "pending"
    again = await ui.post(f"/notifications/{nid}/replay", {"confirmed": "1"})
    assert again.status == 409 and "only dead notifications can be replayed" in again.text


async def test_a_provider_cooling_down_is_shown_on_the_schedules_page(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    await ui.login_as("alice")
    assert "cooling down" not in (await ui.get("/")).text
    await pool.execute(
        "INSERT INTO provider_buckets (provider, open_until, failures, reason) "
        "VALUES ('llm', now() + interval '2 minutes', 1, 'rate limited (429)'), "
        "('old', now() - interval '1 minute', 0, 'rate limited (429)')"
    )
    page = (await ui.get("/")).text
    assert "Provider <b>llm</b> is cooling down until" in page
    assert "rate limited (429)" in page and "in 1 min" in page
    assert "<b>old</b>" not in page  # its cool-down is over


async def test_replay_links_name_the_run_they_lead_to(ui: Console, pool: asyncpg.Pool[Any]) -> None:
    sid = await _schedule(pool, "alice", name="flaky", max_attempts=1,
                          params={"fail_attempts": 1})  # fmt: skip
    dead = await _run(pool, "alice", sid)
    async with api_support.client(pool) as api:
        replay = await api.post(f"/v1/runs/{dead}/replay", await api.token("alice"))
        assert replay.status == 201, replay.body
    again = replay.body["id"]
    await ui.login_as("alice")
    page = await ui.get(f"/runs/{dead}")
    assert f'replayed as <a href="/runs/{again}">run #{again}</a>' in page.text
    page = await ui.get(f"/runs/{again}")
    assert f'replay of <a href="/runs/{dead}">run #{dead}</a>' in page.text
    dead_letters = await ui.get("/dead")
    assert f'replayed as <a href="/runs/{again}">run #{again}</a>' in dead_letters.text
