"""In a real headless Chromium: an admin's schedules list fits a 1280 px screen, its owner
column included (no sideways scroll, no column cut); screenshots of the pages this round's
words changed."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import asyncpg
import pytest

from promptsched.web import auth
from tests import factories
from tests.browser_support import screenshot
from tests.test_console_reads_browser import _at_width, _by, _create, _login, browser, service

pytestmark = pytest.mark.browser
__all__ = ["browser", "service"]  # the fixtures, shared with the other console browser tests

OWNERS = ("platform-observability", "customer-success-emea", "default")
_OVERFLOW = """
const scroll = document.querySelector(".table-scroll");
const table = scroll.querySelector("table");
const heads = [...table.querySelectorAll("thead th")];
const owner = heads[heads.length - 1].getBoundingClientRect();
return {scroll: scroll.scrollWidth - scroll.clientWidth,
        ownerRight: owner.right, view: document.documentElement.clientWidth,
        head: heads[heads.length - 1].textContent};
"""


async def test_the_admin_list_fits_1280_px_with_its_owner_column(
    browser: Any, service: tuple[str, Any], pool: asyncpg.Pool[Any]
) -> None:
    base, _ = service
    token, _ = await auth.create_token(pool, owner="ops", admin=True)
    shapes: list[dict[str, Any]] = [
        {"cron": "*/5 9-17 * * 1-5", "timezone": "America/Argentina/Buenos_Aires"},
        {"cron": "*/25 * * * *", "timezone": "Europe/Paris"},
        {"rrule": "FREQ=WEEKLY;BYDAY=MO,WE;BYHOUR=9;BYMINUTE=30", "timezone": "Asia/Kolkata"},
        {"every": "90m", "timezone": "UTC"},
    ]
    for i, shape in enumerate(shapes * 3):
        await _create(pool, OWNERS[i % len(OWNERS)],
                      name=f"quarterly revenue report for EMEA {i}", **shape)  # fmt: skip
    _at_width(browser, 1280)
    _login(browser, base, token)
    browser.get(f"{base}/")
    found = browser.execute_script(_OVERFLOW)
    screenshot(browser, "admin-schedules-1280")
    assert found["head"].strip().lower() == "owner", found
    assert found["scroll"] <= 0, f"the list scrolls sideways by {found['scroll']} px at 1280"
    assert found["ownerRight"] <= found["view"], found
    cells = browser.find_elements(*_by("table.schedules tbody td:last-child"))
    assert {c.text for c in cells} == set(OWNERS)


async def test_screenshots_of_the_pages_whose_words_changed(
    browser: Any, service: tuple[str, Any], pool: asyncpg.Pool[Any]
) -> None:
    """Not an assertion of looks: the pictures the review reads (build/screenshots/)."""
    base, _ = service
    sid = await _create(pool, "default", name="tides", cron="*/25 * * * *")
    rid = await factories.pending_run(pool, sid, factories.EPOCH)
    await pool.execute(
        "UPDATE runs SET status = 'succeeded', finished_at = now(), output = $2 WHERE id = $1",
        rid, "up: 3\ndown: 1\nslow: 2",
    )  # fmt: skip
    dead = await factories.pending_run(pool, sid, factories.EPOCH.replace(second=10))
    await pool.execute(
        "UPDATE runs SET status = 'dead', finished_at = now(), tokens = 60, attempts = 1, "
        "error = 'openai: HTTP 500' WHERE id = $1",
        dead,
    )
    # right after a restart: the run that lost its attempt, and a slot skipped meanwhile
    t = factories.EPOCH
    await pool.execute(
        "UPDATE runs SET created_at = $2, started_at = $2, finished_at = $3 WHERE id = $1",
        rid, t, t + timedelta(seconds=70),
    )  # fmt: skip
    await pool.execute(
        "INSERT INTO ended_attempts (attempt_id, run_id, number, worker_id, status, started_at) "
        "VALUES (gen_random_uuid(), $1, 1, 'before-restart', 'lost', $2)",
        rid, t,
    )  # fmt: skip
    skip = await factories.pending_run(pool, sid, t + timedelta(seconds=20))
    await pool.execute(
        "UPDATE runs SET status = 'skipped', skip_reason = 'overlap', created_at = $2, "
        "finished_at = $2 WHERE id = $1",
        skip, t + timedelta(seconds=20),
    )  # fmt: skip
    token, _ = await auth.create_token(pool, owner="default")
    _at_width(browser, 1280)
    _login(browser, base, token)
    pages = [(f"/schedules/{sid}", "words-schedule"), (f"/runs/{rid}", "words-run"),
             (f"/runs/{dead}", "words-dead-run"), ("/status", "words-status")]  # fmt: skip
    for path, name in pages:
        browser.get(f"{base}{path}")
        assert "Traceback" not in browser.page_source
        screenshot(browser, name)
