"""Monitors in the console: the schedule form's output schema is checked as you type (headless
Chromium against a real service) and saved with the notify condition; the schedule page shows
both; a run page says whether it notified and why, what changed since the run it was compared
with, and its structured answer; a bad schema posted without the script is refused naming the
field and changes nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from promptsched.clock import FrozenClock
from promptsched.web import auth
from tests import console_support, factories
from tests.browser_support import chromium, screenshot, wait
from tests.factories import EPOCH
from tests.test_console_browser import _by, base, fill_form, login, see, text  # noqa: F401
from tests.test_monitor_answers import _run
from tests.test_monitor_rules import STATUS


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.mark.browser
async def test_the_schema_is_checked_as_you_type_and_saved(
    browser: Any,
    base: str,  # noqa: F811
    pool: asyncpg.Pool[Any],
) -> None:
    token, _ = await auth.create_token(pool, owner="a")
    login(browser, base, token)
    browser.get(f"{base}/schedules/new")
    wait(browser, lambda d: d.find_element(*_by("#schedule-form")).get_attribute(
        "data-live-schema") == "on", what="the live check")  # fmt: skip
    bad = '{"type": "object", "properties": {"up": {"type": "bool"}}}'
    fill_form(browser, name="status page", expression="every 1h", prompt="Read the page",
              output_schema=bad)  # fmt: skip
    wait(browser, lambda d: "at /properties/up/type" in text(d, "#schema-check"),
         what="the schema's error as typed")  # fmt: skip
    assert "output_schema: is not a valid JSON Schema" in text(browser, "#schema-check")
    fill_form(browser, output_schema='{"type": "object", "properties": {"degraded": '
                                     '{"type": "boolean"}}')  # fmt: skip
    wait(browser, lambda d: "is not JSON" in text(d, "#schema-check"), what="unfinished JSON")
    browser.find_element(*_by("#f-output_schema")).send_keys("}")
    accepted = "A valid JSON Schema: a JSON object with degraded."
    wait(browser, lambda d: text(d, "#schema-check") == accepted, what="the schema accepted")
    fill_form(browser, notify_when="/degraded ==")
    wait(browser, lambda d: "notify_when:" in text(d, "#schema-check"), what="the condition")
    fill_form(browser, notify_when="/degraded")
    wait(browser, lambda d: text(d, "#schema-check").startswith("A valid JSON Schema"),
         what="the condition accepted")  # fmt: skip
    screenshot(browser, "monitor-form")
    browser.find_element(*_by("button[value=save]")).click()
    see(browser, "Schedule created.")
    see(browser, "/degraded")
    see(browser, '"degraded"')
    row = await pool.fetchrow("SELECT output_schema, notify_when FROM schedules")
    assert row["notify_when"] == "/degraded"
    assert row["output_schema"]["properties"] == {"degraded": {"type": "boolean"}}


async def test_pages_show_the_decision_what_changed_and_the_answer(
    pool: asyncpg.Pool[Any],
) -> None:
    sid = await factories.schedule(pool, output_schema=STATUS, notify_when="changed")
    first = await _run(pool, sid, 0, '{"status": "ok", "degraded": false}')
    same = await _run(pool, sid, 1, '{"status": "ok", "degraded": false}')
    changed = await _run(pool, sid, 2, '{"status": "degraded", "degraded": true}')
    await pool.execute("UPDATE schedules SET owner = 'a'")
    async with console_support.console(pool, clock=FrozenClock(EPOCH + timedelta(days=1))) as c:
        await c.login_as("a")
        quiet = (await c.get(f"/runs/{same}")).text
        assert f"not notified: output unchanged since run {first}" in quiet
        assert f'href="/runs/{first}"' in quiet and "What changed" not in quiet
        loud = (await c.get(f"/runs/{changed}")).text
        assert f"notified: output changed since run {first}" in loud
        assert "/status: &quot;ok&quot; → &quot;degraded&quot;" in loud
        assert "&quot;degraded&quot;: true" in loud  # the structured answer, as JSON
        page = (await c.get(f"/schedules/{sid}")).text
        assert "Notify when" in page and "<code>changed</code>" in page
        assert "&quot;additionalProperties&quot;: false" in page
        # Without the script: a bad schema is refused naming the field, nothing changes.
        before = await pool.fetchrow("SELECT * FROM schedules WHERE id = $1", sid)
        form = await c.get(f"/schedules/{sid}/edit")
        assert "&quot;degraded&quot;" in form.text  # the schema, shown to edit
        fields = {"name": "test", "kind": "auto", "expression": "0 9 * * *", "timezone": "UTC",
                  "prompt": "p", "provider": "echo", "misfire": "run_once", "overlap": "skip",
                  "max_attempts": "3", "timeout": "5m", "misfire_grace": "1m",
                  "misfire_cap": "100", "dst_gap": "shift", "dst_fold": "first",
                  "notify_when": "changed", "output_schema": '{"type": "array"}',
                  "version": str(before["version"]), "action": "save"}  # fmt: skip
        refused = await c.post(f"/schedules/{sid}/edit", fields, csrf=form.csrf)
        assert refused.status == 422 and 'id="m-output_schema"' in refused.text
        after = await pool.fetchrow("SELECT * FROM schedules WHERE id = $1", sid)
        assert dict(after) == dict(before)
        typed = {"output_schema": json.dumps(STATUS), "notify_when": "/status"}
        check = await c.post("/schema-check", typed, csrf=form.csrf)
        assert json.loads(check.text)["ok"] is True
