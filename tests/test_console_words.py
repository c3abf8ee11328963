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
    fields = {"finished_at": datetime.now(UTC), **fields}
    names = ", ".join(f"{name} = ${i + 3}" for i, name in enumerate(fields))
    await pool.execute(
        f"UPDATE runs SET status = $2, {names} WHERE id = $1",
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


async def test_overlap_skips_right_after_a_restart_name_the_run_they_waited_for(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    """A 10-second schedule restarted mid-run: its run lost its attempt with the old process
    and ran again; the slots skipped meanwhile say which run they waited for, and that it had
    started before the restart (not a hang). A skip behind a run with no restart says so too."""
    sid = await factories.schedule(pool, expression="*/10 * * * * *")
    t = factories.EPOCH
    old = await _finished(pool, sid, t, "succeeded", created_at=t, started_at=t,
                          finished_at=t + timedelta(seconds=70), attempts=2)  # fmt: skip
    await pool.execute(
        "INSERT INTO ended_attempts (attempt_id, run_id, number, worker_id, status, started_at) "
        "VALUES (gen_random_uuid(), $1, 1, 'before-restart', 'lost', $2)",
        old, t,
    )  # fmt: skip
    for i in range(1, 7):
        at = t + timedelta(seconds=10 * i)
        await _finished(pool, sid, at, "skipped", skip_reason="overlap", created_at=at)
    calm = t + timedelta(seconds=80)
    plain = await _finished(pool, sid, calm, "succeeded", created_at=calm, started_at=calm,
                            finished_at=calm + timedelta(seconds=15))  # fmt: skip
    await _finished(pool, sid, calm + timedelta(seconds=10), "skipped", skip_reason="overlap",
                    created_at=calm + timedelta(seconds=10))  # fmt: skip
    await ui.login_as("default", admin=True)
    page = await ui.get(f"/schedules/{sid}")
    said = f"skipped while run {old}, started before the restart, finished"
    assert page.text.count(said) == 6, page.text
    assert f"skipped while run {plain} was still unfinished (overlap policy)" in page.text
    assert "an earlier run was still unfinished" not in page.text
