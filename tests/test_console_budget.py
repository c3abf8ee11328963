"""Budgets in the console: the schedule form sets a schedule's limits (a bad one is named next
to its field, and nothing is stored), the schedule page shows spend against them, and the
Budget page sets the owner's limits and shows the owner's spend against them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from promptsched.clock import Clock
from tests import api_support, factories
from tests.console_support import Console, console
from tests.test_console_pages import FORM


@pytest.fixture
async def ui(pool: asyncpg.Pool[Any]) -> AsyncIterator[Console]:
    async with console(pool) as client:
        yield client


async def test_the_form_and_the_budget_page_set_limits_and_show_spend(
    ui: Console, pool: asyncpg.Pool[Any]
) -> None:
    await ui.login_as("alice")
    before = await api_support.snapshot(pool)
    for field, bad in (
        ("budget_tokens_per_day", "lots"),
        ("budget_tokens_per_day", "2.5"),
        ("budget_cost_per_month", "-4"),
    ):
        wrong = await ui.post("/schedules/new", {**FORM, field: bad})
        assert wrong.status == 422, (field, wrong.status)
        assert f'class="field invalid">\n<label for="f-{field}">' in wrong.text, field
    assert await api_support.snapshot(pool) == before
    limits = {"budget_tokens_per_day": "1,000", "budget_cost_per_month": "2.5"}
    created = await ui.post("/schedules/new", {**FORM, "prompt": "one two", **limits})
    assert created.status == 303, created.text
    sid = int(created.headers["Location"].split("/")[2].split("?")[0])
    stored = await pool.fetchval("SELECT budget FROM schedules WHERE id = $1", sid)
    assert stored == {"tokens_per_day": 1000, "cost_per_month": 2.5}
    rid = await factories.pending_run(pool, sid, await pool.fetchval("SELECT now()"), "manual")
    await factories.worker_pool(pool, Clock()).run_once()  # "one two" + "echo: one two": 5
    assert (await factories.run_row(pool, rid))["tokens"] == 5
    page = (await ui.get(f"/schedules/{sid}")).text
    assert "1,000 tokens a day, 2.50 a month" in page
    assert "today 5 tokens, cost 0.00; this month 5 tokens, cost 0.00 (UTC)" in page
    assert "5 tokens of 1,000 tokens a day (0%)" in page
    # The edit form shows the stored limits; emptying one removes it.
    edit = (await ui.get(f"/schedules/{sid}/edit")).text
    assert (
        'id="f-budget_tokens_per_day" name="budget_tokens_per_day" type="text" value="1000"' in edit
    )
    saved = await ui.post(f"/schedules/{sid}/edit", {**FORM, "prompt": "one two", "version": "1",
                                                     "budget_cost_per_month": "2.5"})  # fmt: skip
    assert saved.status == 303, saved.text
    stored = await pool.fetchval("SELECT budget FROM schedules WHERE id = $1", sid)
    assert stored == {"cost_per_month": 2.5}

    # The owner's page: set 4 tokens a day, then the spend so far (5) has reached it.
    page = await ui.get("/budget")
    assert page.status == 200 and "no budget" in page.text
    bad = await ui.post("/budget", {"budget_cost_per_day": "free"})
    assert bad.status == 422
    assert 'class="field invalid">\n<label for="f-budget_cost_per_day">' in bad.text
    assert await pool.fetchval("SELECT count(*) FROM owner_budgets") == 0
    done = await ui.post("/budget", {"budget_tokens_per_day": "4"})
    assert done.status == 303 and done.headers["Location"] == "/budget?done=budget_saved"
    page = await ui.get("/budget?done=budget_saved")
    assert "Budget saved." in page.text and "4 tokens a day" in page.text
    assert "5 tokens of 4 tokens a day (reached: runs are skipped)" in page.text
    assert await pool.fetchval("SELECT budget FROM owner_budgets WHERE owner = 'alice'") == {
        "tokens_per_day": 4
    }
    # So alice's next run is skipped for the owner's budget, and the run page says why.
    rid = await factories.pending_run(pool, sid, await pool.fetchval("SELECT now()"), "manual")
    await factories.worker_pool(pool, Clock()).run_once()
    row = await factories.run_row(pool, rid)
    assert (row["status"], row["skip_reason"]) == ("skipped", "budget")
    run_page = (await ui.get(f"/runs/{rid}")).text
    assert "the owner&#x27;s daily budget of 4 tokens is reached" in run_page
    # Emptying every field removes the owner's budget.
    assert (await ui.post("/budget", {})).status == 303
    assert await pool.fetchval("SELECT count(*) FROM owner_budgets") == 0
