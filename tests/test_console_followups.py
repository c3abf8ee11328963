"""Follow-ups in the console: the form places one by key (a bad field is named next to it and
nothing is stored; the same key again changes nothing), the list and the page show it with its
ledger of checks in words, another owner cannot see it, and Cancel records who and when."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from tests import api_support
from tests.console_support import Console, console

FORM = {
    "key": "order-4711", "in": "24h", "prompt": "Has order {{ order_id }} shipped?",
    "provider": "echo", "vars": '{"order_id": "4711"}', "max_checks": "4", "horizon": "",
    "escalate_email": "boss@example.com", "escalate_after": "2",
}  # fmt: skip


@pytest.fixture
async def ui(pool: asyncpg.Pool[Any]) -> AsyncIterator[Console]:
    async with console(pool) as client:
        yield client


async def test_place_see_and_cancel_a_followup(ui: Console, pool: asyncpg.Pool[Any]) -> None:
    await ui.login_as("alice")
    assert "Place follow-up" in (await ui.get("/followups/new")).text
    before = await api_support.snapshot(pool)
    for field, bad, marked in (
        ("vars", "", "vars"),  # {{ order_id }} is not given
        ("vars", "[1]", "vars"),
        ("key", "has space", "key"),
        ("in", "soon", "in"),
        ("escalate_after", "9", "escalate_after"),
    ):
        wrong = await ui.post("/followups/new", {**FORM, field: bad})
        assert wrong.status == 422, (field, wrong.status)
        assert f'class="field invalid">\n<label for="f-{marked}">' in wrong.text, field
    assert await api_support.snapshot(pool) == before
    assert await pool.fetchval("SELECT count(*) FROM followups") == 0

    placed = await ui.post("/followups/new", FORM)
    assert placed.status == 303, placed.text
    assert placed.headers["Location"] == "/followups/order-4711?done=followup_created"
    again = await ui.post("/followups/new", FORM)
    assert again.headers["Location"] == "/followups/order-4711?done=followup_exists"
    other = await ui.post("/followups/new", {**FORM, "in": "1h"})
    assert other.status == 409 and "in differs" in other.text
    row = await pool.fetchrow("SELECT * FROM followups")
    assert row is not None and (row["owner"], row["key"], row["max_checks"]) == (
        "alice",
        "order-4711",
        4,
    )

    listed = await ui.get("/followups")
    assert listed.status == 200 and "order-4711" in listed.text and "0 of 4" in listed.text
    # A finished check as the worker's finish records it, shown in words.
    run = await pool.fetchval(
        "INSERT INTO runs (schedule_id, slot, origin, provider, max_attempts, status) "
        "VALUES ($1, now(), 'cadence', 'echo', 3, 'succeeded') RETURNING id",
        row["schedule_id"],
    )
    await pool.execute(
        "INSERT INTO followup_checks (schedule_id, run_id, number, status, decision, outcome, "
        "next_at, escalated, at) VALUES ($1, $2, 1, 'succeeded', '{\"recheck_in\": 21600}', "
        "'recheck', now() + interval '6 hours', '{0}', now())",
        row["schedule_id"], run,
    )  # fmt: skip
    # ... and a final one that asked for nothing: resolved, not "no decision".
    await pool.execute(
        "INSERT INTO followup_checks (schedule_id, run_id, number, status, decision, outcome, "
        "at) VALUES ($1, NULL, 2, 'succeeded', NULL, 'done', now())", row["schedule_id"],
    )  # fmt: skip
    await pool.execute(
        'UPDATE schedules SET notify = \'{"email": ["ops@example.com"]}\' WHERE id = $1',
        row["schedule_id"],
    )
    page = await ui.get("/followups/order-4711?done=followup_created")
    assert page.status == 200
    for text in ("Follow-up created.", "check again in 6 h", "not resolved: checked again",
                 f"#{run}", "step 1", "resolved (no recheck asked)",
                 "<dt>Notify</dt><dd>email ops@example.com on success and failure</dd>",
                 "<dt>Escalation</dt><dd>after 2 unresolved checks: email boss@example.com</dd>",
                 "Has order {{ order_id }} shipped?", "Cancel follow-up"):  # fmt: skip
        assert text in page.text, text
    assert "no decision" not in page.text
    # Another owner sees nothing of it.
    ui.logout_cookies()
    await ui.login_as("bob")
    assert (await ui.get("/followups/order-4711")).status == 404
    assert "order-4711" not in (await ui.get("/followups")).text
    assert (await ui.post("/followups/order-4711/cancel", {})).status == 404
    ui.logout_cookies()
    await ui.login_as("alice")
    done = await ui.post("/followups/order-4711/cancel", {})
    assert done.status == 303
    page = await ui.get(done.headers["Location"])
    assert "Follow-up cancelled: no further check starts." in page.text
    assert "Cancelled by alice at" in page.text
    assert "Cancel follow-up" not in page.text
    assert await pool.fetchval("SELECT state FROM followups") == "cancelled"
    assert "order-4711" in (await ui.get("/followups?state=cancelled")).text
