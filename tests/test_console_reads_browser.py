"""The console with real data in headless Chromium against real ``promptsched run``
processes: an agent run's page shows its steps live while a slow fake model thinks, then the
transcript and the output rendered from Markdown; the schedule list with 55 schedules and the
pages of a schedule and a run at 1400 px and 800 px, with no header or cell broken inside a
word. Screenshots go to build/screenshots/."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest

from promptsched.clock import Clock
from promptsched.ops import inputs
from promptsched.ops import schedules as schedule_ops
from promptsched.web import auth
from tests.browser_support import chromium, screenshot, wait
from tests.fakes import openai_server as fake_server
from tests.fakes import pages as site
from tests.helpers import Service
from tests.test_providers_integration import PROVIDER, provider_env

pytestmark = pytest.mark.browser

WIDTHS = (1400, 800)
ANSWER = """# Harbour report

**Sunny**, high tide at *09:12*.

| time  | tide |
|-------|------|
| 09:12 | high |
| 15:30 | low  |

<script>window.__xss = 1</script>
"""
# Every word of every header and cell must sit on one line: a word whose characters span two
# line boxes was broken inside it.
_BROKEN_WORDS = """
const broken = [];
for (const cell of document.querySelectorAll("table th, table td")) {
  const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const parent = node.parentElement;
    if (!parent || parent.offsetParent === null) continue;  // not displayed
    const re = /\\S+/g;
    let m;
    while ((m = re.exec(node.data)) !== null) {
      const range = document.createRange();
      range.setStart(node, m.index);
      range.setEnd(node, m.index + m[0].length);
      const tops = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
      if (tops.size > 1) broken.push(m[0]);
    }
  }
}
return broken;
"""


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as driver:
        yield driver


@pytest.fixture
async def service(
    dsn: str, tmp_path: Path, fake: fake_server.FakeOpenAI
) -> AsyncIterator[tuple[str, Service]]:
    env = {
        **provider_env(fake.base_url, timeout="30s"),
        "PROMPTSCHED_TOOLS_ALLOW": "127.0.0.1/32",  # the loopback pages
    }
    running = Service(dsn, tmp_path / "service.log", env=env)
    try:
        await running.ready()
        port = (await running.wait_event("api.listening"))["port"]
        yield f"http://127.0.0.1:{port}", running
    finally:
        running.stop()


def _by(css: str) -> tuple[str, str]:
    return ("css selector", css)


def _login(driver: Any, base: str, token: str) -> None:
    driver.delete_all_cookies()
    driver.get(f"{base}/login")
    driver.find_element(*_by("#token")).send_keys(token)
    driver.find_element(*_by("form button[type=submit]")).click()
    wait(driver, lambda d: d.current_url == f"{base}/", what="the schedules page")


def _at_width(driver: Any, width: int) -> None:
    driver.set_window_size(width, 900)


def _broken_words(driver: Any) -> list[str]:
    return list(driver.execute_script(_BROKEN_WORDS))


async def _create(pool: asyncpg.Pool[Any], owner: str, **raw: Any) -> int:
    values = inputs.validate(
        {"prompt": "Summarize {{ date }}", **raw},
        providers=["echo", PROVIDER], provider_kinds={"echo": "echo", PROVIDER: "openai"},
    )  # fmt: skip
    async with pool.acquire() as conn, conn.transaction():
        return (await schedule_ops.create_schedule(conn, Clock(), values, owner=owner)).id


async def test_a_running_agent_run_shows_its_steps_live_then_its_transcript(
    browser: Any,
    service: tuple[str, Service],
    pool: asyncpg.Pool[Any],
    fake: fake_server.FakeOpenAI,
    pages: site.Pages,
) -> None:
    base, _ = service
    look = fake_server.tool_calls(("http_get", {"url": pages.url("/page")}))
    # The model is slow on purpose: it answers its second and third calls only when the test
    # says so, so the page is watched while the run is certainly still running.
    second, third = asyncio.Event(), asyncio.Event()
    fake.script(
        look, fake_server.gated(second, look), fake_server.gated(third, fake_server.ok(ANSWER))
    )
    token, _ = await auth.create_token(pool, owner="a")
    sid = await _create(
        pool, "a", name="harbour agent", cron="0 0 1 1 *", provider=PROVIDER,
        params={"tools": ["http_get"], "max_steps": 4}, timeout="30s",
    )  # fmt: skip
    _at_width(browser, WIDTHS[0])
    _login(browser, base, token)
    async with pool.acquire() as conn:
        run = await schedule_ops.trigger_schedule(conn, Clock(), sid, owner=None, actor="test")
    rid = run["id"]
    await fake.wait_until(lambda f: len(f.requests) == 2)  # held at the second model call
    browser.get(f"{base}/runs/{rid}")
    # The steps so far come with the page: start, model (a tool call), tool_call, tool_result.
    rendered = [e.text for e in browser.find_elements(*_by("#live-steps .badge.kind"))]
    assert rendered == ["start", "model", "tool_call", "tool_result"]
    wait(browser, lambda d: d.execute_script("return window.__liveOpen === true"),
         what="the event stream to open")  # fmt: skip
    second.set()  # the next three steps happen now, while the page watches
    # (Selenium blocks; it waits in a thread so the fake model, on this loop, can answer.)
    await anyio.to_thread.run_sync(lambda: wait(
        browser, lambda d: len(d.find_elements(*_by("#live-steps li.live-step"))) == 3,
        timeout=15, what="three steps arriving live",
    ))  # fmt: skip
    live = [e.text for e in browser.find_elements(*_by("#live-steps li.live-step .badge.kind"))]
    assert live == ["model", "tool_call", "tool_result"]
    assert await pool.fetchval("SELECT status FROM runs WHERE id = $1", rid) == "running"
    assert "3 steps so far, live." in browser.find_element(*_by("#live-state")).text
    screenshot(browser, "run-live-1400")
    third.set()  # the answer: the run finishes and the page reloads with the result
    await anyio.to_thread.run_sync(lambda: wait(
        browser, lambda d: d.find_elements(*_by(".output.md table")), timeout=20,
        what="the rendered output",
    ))  # fmt: skip
    assert not browser.find_elements(*_by("#live"))
    assert browser.find_element(*_by(".output.md h1")).text == "Harbour report"
    assert browser.find_element(*_by(".output.md strong")).text == "Sunny"
    assert browser.execute_script("return window.__xss") is None
    assert not browser.find_elements(*_by(".output.md script"))
    steps = [e.text for e in browser.find_elements(*_by("ol.steps .badge.kind"))]
    assert steps == ["start", "model", "tool_call", "tool_result", "model", "tool_call",
                     "tool_result", "model"]  # fmt: skip
    assert "tokens" in browser.find_element(*_by("main")).text
    for width in WIDTHS:
        _at_width(browser, width)
        browser.refresh()
        assert _broken_words(browser) == []
        screenshot(browser, f"run-transcript-{width}")


async def test_fifty_five_schedules_read_well_at_desktop_and_narrow_widths(
    browser: Any, service: tuple[str, Service], pool: asyncpg.Pool[Any]
) -> None:
    base, _ = service
    token, _ = await auth.create_token(pool, owner="a")
    zones = ("Europe/Paris", "America/Argentina/Buenos_Aires", "Asia/Kolkata", "UTC")
    shapes: list[dict[str, Any]] = [
        {"cron": "30 7 * * 1-5"}, {"cron": "*/15 * * * *"}, {"every": "90m"},
        {"rrule": "FREQ=WEEKLY;BYDAY=MO,WE;BYHOUR=9;BYMINUTE=30"},
        {"rrule": "FREQ=MINUTELY;BYMONTH=2;BYMONTHDAY=29;BYDAY=MO;BYHOUR=0;BYMINUTE=0"},
        {"at": "2030-06-01T09:00:00+00:00"}, {"cron": "0 9,17 * * *"},
    ]  # fmt: skip
    names = ("weekly cadence review", "Replay digest", "quarterly revenue report for EMEA",
             "tide", "on-call handover summary and escalations")  # fmt: skip
    ids = [
        await _create(pool, "a", name=f"{names[i % len(names)]} {i}",
                      timezone=zones[i % len(zones)], **shapes[i % len(shapes)])
        for i in range(55)
    ]  # fmt: skip
    _at_width(browser, WIDTHS[0])
    _login(browser, base, token)
    for width in WIDTHS:
        _at_width(browser, width)
        browser.get(f"{base}/")
        rows = browser.find_elements(*_by("table.schedules tbody tr"))
        assert len(rows) == 50  # one page
        assert _broken_words(browser) == []
        # Compact: a row is at most three lines of text high.
        line = browser.execute_script(
            "return parseFloat(getComputedStyle(document.body).lineHeight)"
        )
        heights = [r.size["height"] for r in rows]
        assert max(heights) <= 4 * line + 16, (width, max(heights), line)
        screenshot(browser, f"schedules-{width}")
        browser.get(f"{base}/schedules/{ids[4]}")  # the sparse RRULE, shown as written
        main = browser.find_element(*_by("main")).text
        assert "every minute" not in main and "FREQ=MINUTELY;BYMONTH=2" in main
        assert _broken_words(browser) == []
        screenshot(browser, f"schedule-{width}")
