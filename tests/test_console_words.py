"""The console says what is true: the status page tells a non-admin the command that makes an
admin token, a schedule's runs table shows a monitor's notify decision as the CLI does, a dead
run that used tokens says how many, a model's line breaks stay line breaks (the console and the
HTML mail), and a column of slots reads in one format."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from promptsched.delivery.email_html import html as email_html
from tests import factories
from tests.console_support import Console, console
from tests.test_email_html import note

LINES = "up: 3\ndown: 1\nslow: 2"


@pytest.fixture
async def ui(pool: asyncpg.Pool[Any]) -> AsyncIterator[Console]:
    async with console(pool) as running:
        yield running


async def _finished(
    pool: asyncpg.Pool[Any], sid: int, slot: datetime, status: str, **fields: Any
) -> int:
    rid = await factories.pending_run(pool, sid, slot)
    names = ", ".join(f"{name} = ${i + 3}" for i, name in enumerate(fields))
    await pool.execute(
        f"UPDATE runs SET status = $2, finished_at = now(), {names} WHERE id = $1",
        rid, status, *fields.values(),
    )  # fmt: skip
    return rid


async def test_the_status_page_names_the_command_that_makes_an_admin_token(ui: Console) -> None:
    await ui.login_as("alice")
    page = await ui.get("/status")
    assert page.status == 403
    assert "promptsched tokens create --owner NAME --admin" in page.text


async def test_a_dead_run_that_used_tokens_says_how_many(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    sid = await factories.schedule(pool)
    rid = await _finished(pool, sid, factories.EPOCH, "dead", attempts=1, tokens=60,
                          error="openai: HTTP 500")  # fmt: skip
    await ui.login_as("default", admin=True)
    page = await ui.get(f"/runs/{rid}")
    assert re.search(r"Usage</dt>\s*<dd[^>]*>60 tokens over 1 attempt\(s\)", page.text), page.text


async def test_the_runs_table_shows_the_notify_decision_and_one_slot_format(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    sid = await factories.schedule(pool)
    first = await _finished(pool, sid, factories.EPOCH, "succeeded", output="same")
    decision = {"notify": False, "reason": f"output unchanged since run {first}",
                "when": "changed", "since": first}  # fmt: skip
    await _finished(pool, sid, factories.EPOCH + timedelta(seconds=10), "succeeded",
                    output="same", notify_decision=decision)  # fmt: skip
    await ui.login_as("default", admin=True)
    page = await ui.get(f"/schedules/{sid}")
    assert f"not notified: output unchanged since run {first}" in page.text
    table = page.text[page.text.index('class="grid runs"') :]
    assert "09:00:00 UTC" in table and "09:00:10 UTC" in table, table
    assert not re.search(r"09:00 UTC", table), table


async def test_line_breaks_stay_in_the_console_and_the_html_mail(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    sid = await factories.schedule(pool)
    rid = await _finished(pool, sid, factories.EPOCH, "succeeded", output=LINES)
    await ui.login_as("default", admin=True)
    page = await ui.get(f"/runs/{rid}")
    assert "up: 3<br>\ndown: 1<br>\nslow: 2" in page.text, page.text
    mail = email_html(note(output=LINES, finished_at=datetime(2026, 3, 2, tzinfo=UTC)), None)
    assert "up: 3<br>" in mail and "down: 1<br>" in mail, mail
